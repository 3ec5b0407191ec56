#!/usr/bin/env bash
# vLLM 0.33.0's own code as the oracle of the vLLM adapter (engine_tests/oracle_vllm): a venv
# with torch 2.13.0's CPU build, the vllm 0.33.0 wheel without its dependencies (they pull
# torch 2.14 and CUDA), and the pure-Python packages vLLM's allocation, block-table and
# scheduler modules import, plus the project's own dependencies and pytest, every one pinned
# in .ci/pins/vllm-0.33.0-oracle.txt and installed --no-deps. The project itself comes from
# PYTHONPATH (.ci/run). Idempotent: a stamp of this script and the pins skips a built venv.
# Usage: .ci/venv_oracle_vllm.sh VENV_PATH
set -euo pipefail
# shellcheck source=.ci/lib.sh
. "$(dirname "$0")/lib.sh"
venv=${1:?usage: .ci/venv_oracle_vllm.sh VENV_PATH}
here=$(cd "$(dirname "$0")" && pwd)
pins="$here/pins/vllm-0.33.0-oracle.txt"
stamp="$venv/.oracle-stamp"
want=$(cat "$here/venv_oracle_vllm.sh" "$pins" | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    exit 0
fi
rm -rf "$venv"
python3 -m venv "$venv"
py="$venv/bin/python"
"$py" -m pip install -q --upgrade pip
cpu_torch "$py"  # torch 2.13.0, the CPU build, checked before any download (lib.sh)
"$py" -m pip install -q --no-deps -r "$pins"
"$py" - <<'PY'
import torch
import vllm
from vllm.v1.worker.utils import allocate_kv_cache  # noqa: F401

assert torch.__version__.startswith("2.13.0"), torch.__version__
assert not torch.cuda.is_available()
assert vllm.__version__.startswith("0.33.0"), vllm.__version__
PY
echo "$want" > "$stamp"
