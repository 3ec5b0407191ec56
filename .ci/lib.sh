# shellcheck shell=bash
# Sourced by .ci/run and the venv scripts: the CI's steps and summary, and torch's CPU build.
#
#   step NAME "banner" CMD...   run CMD (a command, or a function run under set -e) as one
#                               step, in a subshell: a banner line
#                               first, its output as it comes, then its result, seconds and
#                               pytest's counts (from pytest's closing line, when it printed
#                               one) kept for the table. A failing step does not stop the run.
#                               "budget N min" in the banner is the step's share of the 45
#                               minutes; the table marks a step that took longer.
#                               HURRAY_CI_DRY=1: banners and commands only, nothing run.
#   finish                      the table of every step, then the closing line
#                               `ci: N passed, N failed, N skipped`; returns 1 if any failed.
#   cpu_torch PYTHON            install torch's CPU build into PYTHON's venv, after checking
#                               (check_cpu_torch: pip's metadata only, no download) that pip
#                               would not fetch the CUDA build; else stop with the advice.

TORCH_PIN="torch==2.13.0"

_ci_names=() _ci_results=() _ci_passed=() _ci_failed=() _ci_skipped=() _ci_seconds=()
_ci_budgets=() _ci_exits=()
_ci_start=${EPOCHREALTIME/./}
_ci_logs=""

_ci_clock() {  # minutes:seconds since the run began
    local s=$(((${EPOCHREALTIME/./} - _ci_start) / 1000000))
    printf '%d:%02d' $((s / 60)) $((s % 60))
}

_ci_count() {  # _ci_count WORD LINE: the number before WORD in pytest's closing line, or 0
    local found
    found=$(grep -oE "[0-9]+ $1" <<<"$2" | head -n 1)
    found=${found%% *}
    echo "${found:-0}"
}

step() {
    local name=$1 banner=$2 log start status line budget=""
    shift 2
    if [ -z "$_ci_logs" ]; then  # each step's output, kept for its counts until the run ends
        _ci_logs=$(mktemp -d)
        trap 'rm -rf "$_ci_logs"' EXIT
    fi
    log="$_ci_logs/${#_ci_names[@]}.log"
    printf '\n==> [%s] %s: %s\n' "$(_ci_clock)" "$name" "$banner"
    start=${EPOCHREALTIME/./}
    if [ -n "${HURRAY_CI_DRY:-}" ]; then  # list the steps: banners and commands, none run
        { printf '   '; printf ' %q' "$@"; echo; } | tee "$log"
    else
        (set -euo pipefail; "$@") 2>&1 | tee "$log"  # a function step stops at its first error
    fi
    status=${PIPESTATUS[0]}
    line=$(grep -E '^(=+ )?(no tests ran|[0-9]+ [a-z]+.*) in [0-9.]+s' "$log" | tail -n 1)
    [[ $banner =~ budget\ ([0-9]+)\ min ]] && budget=$((BASH_REMATCH[1] * 60))
    local passed=0 failed=0 skipped=0
    if [ -n "$line" ]; then
        passed=$(_ci_count passed "$line")
        failed=$(($(_ci_count failed "$line") + $(_ci_count "errors?" "$line")))
        skipped=$(_ci_count skipped "$line")
    fi
    # A step that failed without a failed test (pytest's exit 5 for no tests, a crash, a
    # linter, a venv build) counts as one failure.
    if [ "$status" -ne 0 ] && [ "$failed" -eq 0 ]; then
        failed=1
    fi
    _ci_names+=("$name")
    _ci_results+=("$([ "$status" -eq 0 ] && echo ok || echo FAILED)")
    _ci_passed+=("${passed:-0}") _ci_failed+=("$failed") _ci_skipped+=("${skipped:-0}")
    _ci_seconds+=($(((${EPOCHREALTIME/./} - start) / 1000000)))
    _ci_budgets+=("$budget") _ci_exits+=("$status")
    printf '<== %s: %s, exit %s, %ss\n' "$name" "${_ci_results[-1]}" "$status" "${_ci_seconds[-1]}"
}

finish() {
    local i over passed=0 failed=0 skipped=0 bad=0 budget=0
    printf '\n%-22s %-7s %8s %7s %8s %8s %7s %5s\n' \
        step result passed failed skipped seconds budget exit
    for i in "${!_ci_names[@]}"; do
        over=""
        if [ -n "${_ci_budgets[i]}" ] && [ "${_ci_seconds[i]}" -gt "${_ci_budgets[i]}" ]; then
            over=" over budget"
        fi
        printf '%-22s %-7s %8s %7s %8s %8s %7s %5s%s\n' "${_ci_names[i]}" "${_ci_results[i]}" \
            "${_ci_passed[i]}" "${_ci_failed[i]}" "${_ci_skipped[i]}" "${_ci_seconds[i]}" \
            "${_ci_budgets[i]:--}" "${_ci_exits[i]}" "$over"
        passed=$((passed + _ci_passed[i])) failed=$((failed + _ci_failed[i]))
        skipped=$((skipped + _ci_skipped[i])) budget=$((budget + ${_ci_budgets[i]:-0}))
        [ "${_ci_exits[i]}" -eq 0 ] || bad=$((bad + 1))
    done
    printf '%-22s %-7s %8s %7s %8s %8s %7s\n' total "$([ "$bad" -eq 0 ] && echo ok || echo FAILED)" \
        "$passed" "$failed" "$skipped" "$(((${EPOCHREALTIME/./} - _ci_start) / 1000000))" "$budget"
    printf '\nci: %d passed, %d failed, %d skipped\n' "$passed" "$failed" "$skipped"
    [ "$bad" -eq 0 ]
}

cpu_torch() {
    check_cpu_torch "$1" && "$1" -m pip install -q "$TORCH_PIN"
}

check_cpu_torch() {  # pip's choice for TORCH_PIN, from metadata alone: the +cpu build or advice
    local py=$1 found
    found=$("$py" -m pip install --dry-run --ignore-installed --no-deps --quiet --report - \
        "$TORCH_PIN" | "$py" -c 'import json, sys
item = json.load(sys.stdin)["install"][0]
print(item["metadata"]["version"], item["download_info"]["url"])') || {
        echo "cpu_torch: pip could not resolve $TORCH_PIN (see above)" >&2
        return 1
    }
    case ${found%% *} in
    *+cpu) ;;
    *)
        cat >&2 <<EOF
cpu_torch: pip would install torch ${found%% *} from ${found#* }:
that is not the CPU build (+cpu) but the CUDA one, several GB with NVIDIA's wheels, which the
CPU-only venvs here cannot use. Point pip at PyTorch's CPU-only wheel index and run again:

    export PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu

(on machines of this project's kind, pip's configuration already finds torch-2.13.0+cpu).
EOF
        return 1
        ;;
    esac
}
