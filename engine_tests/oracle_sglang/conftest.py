"""The SGLang / FlashInfer oracle suite runs only in the venv .ci/venv_oracle_sglang.sh builds
(sglang 0.5.23 and flashinfer-python 0.7.2.post1 on torch 2.13.0 CPU), with PYTHONPATH at the
clone: `python -m pytest engine_tests/oracle_sglang`."""

import warnings

warnings.filterwarnings("ignore", category=UserWarning)
