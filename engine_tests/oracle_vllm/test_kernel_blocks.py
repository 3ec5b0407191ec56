"""Caches vLLM splits into kernel blocks, read and written where vLLM's attention reads them.

For every backend vLLM itself picks the kernel block size (vllm/v1/worker/utils.py
``select_common_block_size`` over the backend's own ``get_supported_kernel_block_sizes``),
allocates the layers in kernel blocks (``allocate_kv_cache(..., kernel_block_sizes)``), its
BlockPool hands out scheduler (manager) block ids and its ``AttentionGroup.
map_to_kernel_block_table`` turns them into the kernel blocks the attention reads. The
backend's own view there is the expectation; ``from_vllm(..., block_size=)`` must read
exactly that, ``into_vllm`` must write there, ``to_vllm`` must allocate as vLLM does, and
reading without ``block_size`` (or with another ratio) must not match.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from vllm.v1.kv_cache_interface import SlidingWindowSpec
from vllm.v1.kv_cache_layout import KVCacheLayout

import hurray_wire as hw
from engine_tests.oracle_vllm import vllm_code as vc
from engine_tests.oracle_vllm.test_oracle_vllm import (
    as_fp8,
    bits,
    equal,
    expected,
    same_sequences,
    torched,
)

SPLIT_LAYOUTS = (KVCacheLayout.LBNHC, KVCacheLayout.LBHNC)
DTYPES = {"auto16": torch.float16, "autobf16": torch.bfloat16, "fp8": torch.uint8}
# (backend, scheduler block size, the kernel block size vLLM picks, dtype, layouts)
CASES = [
    ("FLASHINFER", 128, 64, "auto16", SPLIT_LAYOUTS),
    ("FLASHINFER", 128, 64, "autobf16", SPLIT_LAYOUTS),
    ("FLASHINFER", 128, 64, "fp8", SPLIT_LAYOUTS),
    ("FLASHINFER", 256, 64, "auto16", (KVCacheLayout.LBHNC,)),
    ("FLASH_ATTN", 32, 32, "auto16", SPLIT_LAYOUTS),  # MultipleOf(16): never split
    ("TRITON_ATTN", 64, 64, "fp8", (KVCacheLayout.LBHNC,)),
    ("FLEX_ATTENTION", 16, 16, "autobf16", (KVCacheLayout.LBNHC,)),
    ("FLASHMLA", 128, 64, "autobf16", (KVCacheLayout.LBNHC,)),  # 64 only
    ("FLASHMLA", 256, 64, "fp8", (KVCacheLayout.LBNHC,)),
    ("CUTLASS_MLA", 256, 128, "auto16", (KVCacheLayout.LBNHC,)),  # 128 only
    ("FLASHINFER_MLA", 128, 64, "autobf16", (KVCacheLayout.LBNHC,)),  # 32 or 64
    ("CPU_MLA", 64, 16, "autobf16", (KVCacheLayout.LBNHC,)),  # 16 only
    ("TRITON_MLA", 32, 32, "fp8", (KVCacheLayout.LBNHC,)),
    ("FLASH_ATTN_MLA", 64, 64, "auto16", (KVCacheLayout.LBNHC,)),
]
HEADS, HEAD_SIZE = 2, 64


def cases() -> list[Any]:
    return [
        pytest.param(b, m, k, d, layout, id=f"{b}-{layout.name}-{m}to{k}-{d}")
        for b, m, k, d, layouts in CASES
        for layout in layouts
    ]


def spec_of(backend: str, block: int, dtype: str) -> Any:
    if "MLA" in backend:
        return vc.mla_spec(block, DTYPES[dtype])
    return vc.attention_spec(block, HEADS, HEAD_SIZE, DTYPES[dtype])


def views(backend: str, cache: torch.Tensor, layout: KVCacheLayout, dtype: str) -> list[Any]:
    """The backend's own read of the layer, as ``[kernel blocks, kernel_bs, H, D]`` views."""
    if "MLA" in backend:
        found = [cache.squeeze(1)[:, :, None, :]]  # mla_attention.py: kv_cache.squeeze(1)
    else:
        found = list(vc.layer_view(backend, cache, HEAD_SIZE, layout))
    return [as_fp8(v, dtype) if dtype == "fp8" else v for v in found]


def kernel_rows(
    backend: str, spec: Any, kernel: int, table: np.ndarray, lens: list[int]
) -> list[list[int]]:
    """Per request the kernel blocks vLLM's attention reads (its own block-table mapping)."""
    mapped = vc.kernel_table(backend, spec, kernel, table)
    return [[int(b) for b in row[: -(-n // kernel)]] for row, n in zip(mapped, lens, strict=True)]


def tensors_of(got: Any) -> list[hw.BlockPagedTensor]:
    return list(got) if isinstance(got, tuple) else [got]


def matches(got: Any, want: list[list[np.ndarray]]) -> bool:
    found = tensors_of(got)
    return len(found) == len(want) and all(
        same_sequences(t, w) for t, w in zip(found, want, strict=True)
    )


@pytest.mark.parametrize(("backend", "block", "kernel", "dtype", "layout"), cases())
def test_kernel_blocks(
    backend: str, block: int, kernel: int, dtype: str, layout: KVCacheLayout
) -> None:
    spec = spec_of(backend, block, dtype)
    assert vc.kernel_block_size(backend, spec) == kernel  # vLLM's own choice
    ratio = block // kernel
    caches = vc.allocate(spec, layout, num_blocks=10, kernel_block_size=kernel)
    for i, name in enumerate(vc.LAYERS):
        vc.fill(caches[name], seed=3 + i)
    layer = caches[vc.LAYERS[1]]
    assert layer.shape[0] == 10 * ratio and layer.shape[2] == kernel
    lens = [3, kernel + 2, block + kernel + 1, 2 * block]  # short, partial, long, full
    reqs = vc.Requests(10, block, lens, share=1)
    table = reqs.table()
    kw: dict[str, Any] = {"backend": backend}
    if "MLA" not in backend:
        kw["kv_cache_layout"] = layout.name
    if dtype == "fp8":
        kw.update(kv_cache_dtype="fp8", k_scale=0.5, v_scale=0.25)
    got = hw.from_vllm(layer, table, lens, block_size=block, **kw)
    rows = kernel_rows(backend, spec, kernel, table, lens)
    want = [expected(v, rows, lens) for v in views(backend, layer, layout, dtype)]
    assert matches(got, want)
    if dtype == "fp8":
        assert tensors_of(got)[0].element_type.name == "float8_e4m3"
        assert tensors_of(got)[0].kv_scale == 0.5
    # controls: another layer; and, split, the ids read as kernel blocks or with another ratio
    other = caches[vc.LAYERS[0]]
    assert not matches(hw.from_vllm(other, table, lens, block_size=block, **kw), want)
    if ratio > 1:
        short = hw.from_vllm(layer, table[:1], lens[:1], **kw)  # silently wrong, not refused
        assert not matches(short, [w[:1] for w in want])
        for wrong in (None, 2 * block):
            try:
                misread = hw.from_vllm(layer, table, lens, block_size=wrong, **kw)
            except hw.HurrayWireError:
                continue
            assert not matches(misread, want)

    # encode -> decode -> land at other scheduler blocks of a fresh kernel-block allocation
    sent = [hw.decode(hw.encode(t)) for t in tensors_of(got)]
    target = vc.allocate(spec, layout, num_blocks=12, kernel_block_size=kernel)[vc.LAYERS[0]]
    there = vc.Requests(12, block, [block, *lens], share=0)
    ids = there.table()[1:]
    land = {k: v for k, v in kw.items() if k != "kv_cache_layout"}
    landed = sent[0] if len(sent) == 1 else (sent[0], sent[1])
    hw.into_vllm(landed, target, ids, block_size=block, **land)
    there_rows = kernel_rows(backend, spec, kernel, ids, lens)
    for view, w in zip(views(backend, target, layout, dtype), want, strict=True):
        assert equal(expected(view, there_rows, lens), w)
    written = {b for row in there_rows for b in row}
    assert not target[[b for b in range(target.shape[0]) if b not in written]].any()

    # to_vllm allocates as vLLM does for this split: kernel blocks, manager ids in the table
    allocation = {k: v for k, v in kw.items() if k in ("backend", "kv_cache_layout")}
    out, out_table, out_lens = hw.to_vllm(
        got, vllm_version="0.33.0", block_size=block, **allocation
    )
    assert out_lens.tolist() == lens
    assert out.shape[0] % ratio == 0 and out.shape[2] == kernel and not out[:ratio].any()
    reference = vc.allocate(spec, layout, out.shape[0] // ratio, kernel)[vc.LAYERS[0]]
    assert tuple(out.shape) == tuple(reference.shape)
    big = [a for a in range(out.ndim) if out.shape[a] > 1]  # a size-1 axis has any stride
    assert sorted(big, key=lambda a: out.strides[a]) == sorted(big, key=reference.stride)
    out_rows = kernel_rows(backend, spec, kernel, out_table, lens)
    for view, w in zip(views(backend, torched(out), layout, dtype), want, strict=True):
        assert equal(expected(view, out_rows, lens), w)


def test_cpu_attn_block_size_is_its_own() -> None:
    """CPU_ATTN takes any multiple of 32 (cpu_attn.py): vLLM never splits, and block_size
    equal to the cache's block changes nothing."""
    spec = vc.attention_spec(64, HEADS, HEAD_SIZE, torch.float16)
    assert vc.kernel_block_size("CPU_ATTN", spec) == 64
    layer = vc.allocate(spec, KVCacheLayout.LBHNC, 8, 64)[vc.LAYERS[0]]
    vc.fill(layer, seed=13)
    lens = [70, 5]
    table = vc.Requests(8, 64, lens, share=0).table()
    kw: dict[str, Any] = {"backend": "CPU_ATTN", "isa": "vec"}
    plain, with_size = (hw.from_vllm(layer, table, lens, block_size=b, **kw) for b in (None, 64))
    for a, b in zip(plain, with_size, strict=True):
        assert equal([bits(x) for x in a.sequences()], [bits(x) for x in b.sequences()])


@pytest.mark.parametrize(("block", "window", "tokens"), [(128, 100, 450), (128, 300, 700)])
def test_kernel_blocks_sliding_window(block: int, window: int, tokens: int) -> None:
    """vLLM's SlidingWindowManager nulls scheduler blocks (id 0, kernel blocks 0 .. ratio-1):
    dropped as whole scheduler blocks, the rest read through the kernel-block mapping."""
    spec = SlidingWindowSpec(
        block_size=block, num_kv_heads=HEADS, head_size=HEAD_SIZE, dtype=torch.float16,
        sliding_window=window,
    )  # fmt: skip
    kernel = vc.kernel_block_size("FLASHINFER", spec)
    assert kernel == 64
    row = vc.window_row(spec, 12, tokens)
    nulls = next((i for i, b in enumerate(row) if b != 0), len(row))
    assert nulls > 0
    layer = vc.allocate(spec, KVCacheLayout.LBNHC, 12, kernel)[vc.LAYERS[0]]
    vc.fill(layer, seed=17)
    kw: dict[str, Any] = {"backend": "FLASHINFER", "kv_cache_layout": "LBNHC", "block_size": block}
    key, _ = hw.from_vllm(layer, [row], [tokens], sliding_window=window, **kw)
    skipped = nulls * block
    assert key.metadata["vllm.skipped_tokens"] == [skipped]
    mapped = vc.kernel_table("FLASHINFER", spec, kernel, np.array([row], np.int32))[0]
    k_view, _ = vc.layer_view("FLASHINFER", layer, HEAD_SIZE, KVCacheLayout.LBNHC)
    t = torch.arange(skipped, tokens)
    want = bits(k_view[torch.from_numpy(mapped).long()[t // kernel], t % kernel])
    assert np.array_equal(bits(key.sequence(0)), want)
    with pytest.raises(hw.errors.IndexBufferError, match="null block"):
        hw.from_vllm(layer, [row], [tokens], **kw)


def test_no_split_under_other_layouts() -> None:
    """vLLM refuses to split blocks under LHBNC (create_kv_cache_views); so does to_vllm,
    and from_vllm refuses an LHBNC cache read with a larger block_size."""
    split = vc.attention_spec(128, HEADS, HEAD_SIZE, torch.float16)
    with pytest.raises(ValueError, match="layer-compact"):
        vc.allocate(split, KVCacheLayout.LHBNC, 8, 64)
    whole = vc.attention_spec(64, HEADS, HEAD_SIZE, torch.float16)
    layer = vc.allocate(whole, KVCacheLayout.LHBNC, 8)[vc.LAYERS[0]]
    kw: dict[str, Any] = {"backend": "FLASHINFER", "kv_cache_layout": "LHBNC"}
    with pytest.raises(hw.errors.InvalidTensorError, match="LBNHC"):
        hw.from_vllm(layer, [[1]], [3], block_size=128, **kw)
    pair = hw.from_vllm(layer, [[1]], [3], block_size=64, **kw)
    with pytest.raises(hw.errors.InvalidTensorError, match="kernel blocks only under"):
        hw.to_vllm(pair, vllm_version="0.33.0", block_size=128, **kw)
