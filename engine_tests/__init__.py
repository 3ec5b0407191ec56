"""Engine suites, each run in the venv .ci/ builds for it (.ci/run says which).

No traffic off the machine: importing this package (every engine test does, and
vllm_cpu/engine_worker.py, the process an engine runs in) sets ``NO_TRAFFIC`` in the
environment, so vLLM sends no usage report, nothing asks a model hub, and engine processes
started from a test inherit both, whether CI or a person runs the tests.
"""

import os

NO_TRAFFIC = {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1"}
os.environ.update(NO_TRAFFIC)
