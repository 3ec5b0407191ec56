"""MLA caches, the allocation eras before 0.26, and sliding-window null blocks.

MLA: vLLM allocates ``[num_blocks, 1, block_size, 576]`` (``MLAAttentionSpec``,
``head_size_v = 0``) and every MLA backend reads ``kv_cache.squeeze(1)``
(vllm/model_executor/layers/attention/mla_attention.py). The eras before 0.26 are not in
the 0.33 wheel: ``old_cache`` restates their allocation from the source of those versions
(vllm/v1/worker/gpu_model_runner.py ``_reshape_kv_cache_tensors``: the raw buffer viewed in
``get_kv_cache_stride_order()`` order, then permuted back to ``get_kv_cache_shape()``;
FlashAttention ``(2, num_blocks, block_size, H, D)`` read with ``kv_cache.unbind(0)`` until
vllm-project/vllm#42095 made every backend ``(num_blocks, 2, ...)``, read with
``unbind(1)``; FlashInfer and Triton were already blocks-first, vllm-project/vllm#28282).
Sliding window: vLLM's own ``SlidingWindowManager`` over a ``BlockPool`` frees the blocks
the window has left and puts the null block (id 0) in their place.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
from vllm.v1.kv_cache_interface import SlidingWindowSpec
from vllm.v1.kv_cache_layout import KVCacheLayout

import hurray_wire as hw
from engine_tests.oracle_vllm import vllm_code as vc
from engine_tests.oracle_vllm.test_kernel_blocks import kernel_rows
from engine_tests.oracle_vllm.test_oracle_vllm import (
    bits,
    equal,
    expected,
    same_sequences,
    torched,
)


@pytest.mark.parametrize(
    "backend",
    ["FLASHMLA", "FLASH_ATTN_MLA", "TRITON_MLA", "CUTLASS_MLA", "FLASHINFER_MLA", "CPU_MLA"],
)
@pytest.mark.parametrize(
    ("block", "dtype", "setting"),
    [(16, torch.bfloat16, "auto"), (64, torch.float16, "auto"), (128, torch.uint8, "fp8")],
)
def test_mla(backend: str, block: int, dtype: Any, setting: str) -> None:
    """Every MLA backend at the kernel block size vLLM picks for it (test_kernel_blocks.py
    covers the splits in depth); a block size no kernel block divides is vLLM's refusal."""
    spec = vc.mla_spec(block, dtype)
    try:
        kernel = vc.kernel_block_size(backend, spec)
    except ValueError as exc:  # e.g. FLASHMLA takes 64 only: vLLM refuses 16 at start
        assert "No common block size" in str(exc)
        return
    ratio = block // kernel
    caches = vc.allocate(spec, KVCacheLayout.LBNHC, num_blocks=12, kernel_block_size=kernel)
    for i, name in enumerate(vc.LAYERS):
        vc.fill(caches[name], seed=11 + i)
    layer = caches[vc.LAYERS[1]]
    assert tuple(layer.shape) == (12 * ratio, 1, kernel, 576)
    lens = [block + 7, 2 * block, 5]
    reqs = vc.Requests(12, block, lens, share=1)
    kw: dict[str, Any] = {"backend": backend, "block_size": block}
    if setting != "auto":
        kw["kv_cache_dtype"] = setting
    latent = hw.from_vllm(layer, reqs.table(), lens, k_scale=0.5, **kw)
    assert isinstance(latent, hw.BlockPagedTensor) and latent.kv_role == "fused"
    view = layer.squeeze(1)  # mla_attention.py: self.kv_cache = kv_cache.squeeze(1)
    if setting != "auto":
        view = view.view(torch.float8_e4m3fn)
    rows = kernel_rows(backend, spec, kernel, reqs.table(), lens)
    want = expected(view[:, :, None, :], rows, lens)
    assert same_sequences(latent, want)
    poisoned = hw.from_vllm(caches[vc.LAYERS[0]], reqs.table(), lens, **kw)
    assert isinstance(poisoned, hw.BlockPagedTensor)
    assert not same_sequences(poisoned, want)
    target = vc.allocate(spec, KVCacheLayout.LBNHC, 12, kernel)[vc.LAYERS[0]]
    ids = vc.Requests(12, block, [block, *lens], share=0).table()[1:]
    hw.into_vllm(hw.decode(hw.encode(latent)), target, ids, **kw)
    there = target.squeeze(1)
    if setting != "auto":
        there = there.view(torch.float8_e4m3fn)
    assert equal(
        expected(there[:, :, None, :], kernel_rows(backend, spec, kernel, ids, lens), lens), want
    )


def old_cache(
    backend: str,
    version: str,
    layout: str,
    blocks: int,
    block: int,
    heads: int,
    dim: int,
    dtype: Any,
) -> tuple[torch.Tensor, int]:
    """A cache as vLLM ``version`` allocated it, and the axis its K/V pair is on."""
    minor = int(version.split(".")[1])
    kv_first = minor < 23 and backend in ("FLASH_ATTN", "FLEX_ATTENTION")
    shape = (2, blocks, block, heads, dim) if kv_first else (blocks, 2, block, heads, dim)
    order = (0, 1, 2, 3, 4) if layout == "NHD" else (0, 1, 3, 2, 4)  # HND: heads before tokens
    raw = torch.zeros(math.prod(shape), dtype=dtype)
    physical = raw.view(tuple(shape[i] for i in order))
    inverse = [order.index(i) for i in range(5)]
    return physical.permute(*inverse), 0 if kv_first else 1


@pytest.mark.parametrize(
    ("version", "backend"),
    [
        ("0.21.0", "FLASH_ATTN"),
        ("0.22.0", "FLASHINFER"),
        ("0.20.1", "TRITON_ATTN"),
        ("0.21.0", "FLEX_ATTENTION"),
        ("0.24.0", "FLASH_ATTN"),
        ("0.25.0", "FLASHINFER"),
    ],
)
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize(
    ("block", "heads", "dim", "dtype"), [(16, 4, 64, torch.float16), (32, 2, 128, torch.bfloat16)]
)
def test_older_eras(
    version: str, backend: str, layout: str, block: int, heads: int, dim: int, dtype: Any
) -> None:
    cache, axis = old_cache(backend, version, layout, 12, block, heads, dim, dtype)
    vc.fill(cache, seed=5)
    lens = [block + 3, 2 * block]
    reqs = vc.Requests(12, block, lens, share=1)
    key, value = hw.from_vllm(
        cache, reqs.table(), lens, backend=backend, vllm_version=version, kv_cache_layout=layout
    )
    k_view, v_view = cache.unbind(axis)  # the era's read: kv_cache.unbind(0) / unbind(1)
    assert same_sequences(key, expected(k_view, reqs.rows, lens))
    assert same_sequences(value, expected(v_view, reqs.rows, lens))
    out, table, out_lens = hw.to_vllm(
        (key, value), backend=backend, vllm_version=version, kv_cache_layout=layout
    )
    assert out.shape[axis] == 2 and out.ndim == 5
    rows = [[int(b) for b in r[: -(-n // block)]] for r, n in zip(table, out_lens, strict=True)]
    k_out, v_out = torched(out).unbind(axis)
    assert equal(expected(k_out, rows, lens), expected(k_view, reqs.rows, lens))
    assert equal(expected(v_out, rows, lens), expected(v_view, reqs.rows, lens))
    reference, _ = old_cache(
        backend, version, layout, out.shape[1 - axis], block, heads, dim, dtype
    )
    assert np.argsort(out.strides).tolist() == np.argsort(reference.stride()).tolist()


@pytest.mark.parametrize(
    ("block", "window", "tokens"), [(16, 20, 70), (32, 64, 200), (16, 4096, 60)]
)
def test_sliding_window_null_blocks(block: int, window: int, tokens: int) -> None:
    spec = SlidingWindowSpec(
        block_size=block, num_kv_heads=2, head_size=64, dtype=torch.float16, sliding_window=window
    )
    row = vc.window_row(spec, 32, tokens)
    nulls = next((i for i, b in enumerate(row) if b != 0), len(row))
    assert nulls == max(0, tokens - window + 1) // block  # vLLM nulls the blocks the window left
    caches = vc.allocate(
        vc.attention_spec(block, 2, 64, torch.float16), KVCacheLayout.LBNHC, num_blocks=32
    )
    layer = caches[vc.LAYERS[0]]
    vc.fill(layer, seed=9)
    key, _ = hw.from_vllm(layer, [row], [tokens], backend="FLASH_ATTN", sliding_window=window)
    skipped = nulls * block
    assert key.seq_lens is not None and int(key.seq_lens[0]) == tokens - skipped
    assert key.metadata.get("vllm.skipped_tokens", [0]) == [skipped]
    k_view, _ = vc.layer_view("FLASH_ATTN", layer, 64, KVCacheLayout.LBNHC)
    t = torch.arange(skipped, tokens)
    want = bits(k_view[torch.tensor(row)[t // block], t % block])
    assert np.array_equal(bits(key.sequence(0)), want)
    if nulls:
        with pytest.raises(hw.errors.IndexBufferError, match="null block"):
            hw.from_vllm(layer, [row], [tokens], backend="FLASH_ATTN")
