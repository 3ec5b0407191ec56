#!/usr/bin/env bash
# Build (idempotently) the venv in which SGLang's and FlashInfer's own code is the test oracle
# for hurray-wire's sglang / flashinfer adapters (engine_tests/oracle_sglang).
#
#   .ci/venv_oracle_sglang.sh <venv-path>
#
# torch 2.13.0 (the CPU wheel), the sglang 0.5.23 and flashinfer-python 0.7.2.post1 wheels
# --no-deps (their own requirements pull a CUDA torch), every other package --no-deps from the
# pinned list .ci/pins/oracle-sglang-0.5.23-cpu.txt, and a sitecustomize stub of torchvision
# (sglang.srt.configs imports it; see .ci/oracle_sitecustomize.py). The project itself is not
# installed: the tests run with PYTHONPATH at the clone. A stamp file records what was built,
# so a second run with the same inputs does nothing. Wheels are taken from $HURRAY_WHEELS
# (default /work/wheels) when present there, else from the package index.
set -euo pipefail
# shellcheck source=.ci/lib.sh
. "$(dirname "$0")/lib.sh"
venv=${1:?usage: .ci/venv_oracle_sglang.sh <venv-path>}
here="$(cd "$(dirname "$0")" && pwd)"
pins="$here/pins/oracle-sglang-0.5.23-cpu.txt"
wheels=${HURRAY_WHEELS:-/work/wheels}
engines=(sglang==0.5.23 flashinfer-python==0.7.2.post1)
stamp_want="$(cat "$pins" "$here/oracle_sitecustomize.py" | sha256sum | cut -d' ' -f1) ${engines[*]} torch==2.13.0"
if [ -f "$venv/.hurray-oracle-stamp" ] && [ "$(cat "$venv/.hurray-oracle-stamp")" = "$stamp_want" ]; then
    exit 0
fi
python3 -m venv "$venv"
py="$venv/bin/python"
"$py" -m pip install -q --upgrade pip
cpu_torch "$py"  # torch 2.13.0, the CPU build, checked before any download (lib.sh)
local_wheels=()
for pattern in "sglang-0.5.23-*.whl" "flashinfer_python-0.7.2.post1-*.whl"; do
    found=$(compgen -G "$wheels/$pattern" | head -n 1 || true)
    [ -n "$found" ] && local_wheels+=("$found")
done
if [ ${#local_wheels[@]} -eq 2 ]; then
    "$py" -m pip install -q --no-deps "${local_wheels[@]}"
else
    "$py" -m pip install -q --no-deps "${engines[@]}"
fi
"$py" -m pip install -q --no-deps -r "$pins"
site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
cp "$here/oracle_sitecustomize.py" "$site/sitecustomize.py"
"$py" - <<'PY'
import torch
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool  # noqa: F401  the oracle imports
import flashinfer.page, flashinfer.utils  # noqa: F401,E401
assert torch.__version__.startswith("2.13.0"), torch.__version__
PY
echo "$stamp_want" > "$venv/.hurray-oracle-stamp"
