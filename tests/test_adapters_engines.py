"""Engine adapters: exact round trips engine -> hurray-wire -> engine against loop references.

SGLang and FlashInfer: tests/test_adapters_sglang_flashinfer.py (and their own code as the
oracle in engine_tests/oracle_sglang)."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hurray_wire as hw
from tests.adapter_reference import (
    Batch,
    random_batch,
    random_values,
    ref_tensor_sequences,
    ref_vllm_sequences,
)

DTYPES = [np.float16, ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, np.int8]
SHAPES = [(16, 8, 128), (32, 2, 64), (64, 4, 128), (16, 1, 576)]  # block, kv heads, head dim


def same(a: Any, b: Any) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    if a.size == 0 and b.size == 0:
        return True
    if a.dtype.kind in "iu" and b.dtype.kind in "iu":
        return a.shape == b.shape and bool(np.array_equal(a, b))
    return a.shape == b.shape and bool(np.array_equal(a.view(np.uint8), b.view(np.uint8)))


def pair(
    got: hw.BlockPagedTensor | tuple[hw.BlockPagedTensor, hw.BlockPagedTensor],
) -> tuple[hw.BlockPagedTensor, hw.BlockPagedTensor]:
    """A reading that must be a ``(key, value)`` pair (``from_vllm`` of a two-role cache)."""
    assert isinstance(got, tuple)
    return got


def check_sequences(tensor: hw.BlockPagedTensor, expected: list[Any]) -> None:
    got = tensor.sequences()
    assert len(got) == len(expected)
    for a, b in zip(got, expected, strict=True):
        assert same(a, b)
    for a, b in zip(ref_tensor_sequences(tensor), expected, strict=True):
        assert same(a, b)


def batch(seed: int, block: int, heads: int, dim: int, dtype: Any, **kw: Any) -> Batch:
    return random_batch(
        np.random.default_rng(seed),
        num_pages=12,
        page_size=block,
        heads=heads,
        head_dim=dim,
        dtype=dtype,
        **kw,
    )


# -- vLLM ------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("form", ["2NBHD", "N2BHD", "packed"])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_vllm_pair_round_trip(
    dtype: Any, shape: tuple[int, int, int], form: str, layout: str
) -> None:
    block, heads, dim = shape
    seed = hash((form, layout, shape, np.dtype(dtype).name)) % 2**32
    k = batch(seed, block, heads, dim, dtype)
    v = random_values(np.random.default_rng(seed + 1), k.pool.shape, dtype)
    kk, vv = k.pool, v
    if layout == "HND":
        kk, vv = kk.transpose(0, 2, 1, 3), vv.transpose(0, 2, 1, 3)
    if form == "2NBHD":
        cache = np.ascontiguousarray(np.stack((kk, vv)))
    elif form == "N2BHD":
        cache = np.ascontiguousarray(np.stack((kk, vv), axis=1))
    else:
        cache = np.ascontiguousarray(np.concatenate((kk, vv), axis=3))
    table = k.padded(width=max(len(r) for r in k.pages) + 2)
    lens = np.array(k.lens, np.int32)
    before = cache.copy()
    key, value = pair(
        hw.from_vllm(
            cache,
            table,
            lens,
            kv_cache_layout=layout,
            layer_index=7,
            combined=form if block == 2 else None,
        )
    )
    assert same(cache, before)  # the caller's arrays are untouched
    assert (key.kv_role, value.kv_role, key.layer_index) == ("key", "value", 7)
    check_sequences(key, ref_vllm_sequences(cache, table, k.lens, form, layout, 0))
    check_sequences(value, ref_vllm_sequences(cache, table, k.lens, form, layout, 1))
    out, out_table, out_lens = hw.to_vllm(
        (key, value), kv_cache_layout=layout, combined=form, max_blocks=table.shape[1]
    )
    assert out_table.dtype == np.int32 and out_lens.dtype == np.int32 and same(out_lens, lens)
    if np.shares_memory(key.page_pool, cache):  # a contiguous role: a view, ids kept
        assert same(out, cache) and same(out_table, table)
    again = pair(hw.from_vllm(out, out_table, out_lens, kv_cache_layout=layout,
                              combined=form if form != "packed" else None))  # fmt: skip
    for got, want in zip(again, (key, value), strict=True):  # strided: referenced pages only
        assert all(same(a, b) for a, b in zip(got.sequences(), want.sequences(), strict=True))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("role", ["key", "value"])
def test_vllm_one_role_round_trip(dtype: Any, layout: str, role: str) -> None:
    k = batch(3, 16, 8, 128, dtype)
    cache = k.pool if layout == "NHD" else np.ascontiguousarray(k.pool.transpose(0, 2, 1, 3))
    tensor = hw.from_vllm(cache, k.pages, k.lens, kv_cache_layout=layout, kv_role=role)
    assert isinstance(tensor, hw.BlockPagedTensor) and tensor.kv_role == role
    check_sequences(tensor, ref_vllm_sequences(cache, k.pages, k.lens, "one", layout, 0))
    out, table, lens = hw.to_vllm(tensor, kv_cache_layout=layout)
    assert same(lens, np.array(k.lens, np.int32))
    if layout == "NHD":
        assert same(out, cache) and same(
            table, k.padded()
        )  # one NHD role: the cache *is* the pool, both ways
        assert np.shares_memory(tensor.page_pool, cache) and np.shares_memory(out, cache)


def test_vllm_mla_fused() -> None:
    k = batch(5, 64, 1, 576, np.float16)
    cache = np.ascontiguousarray(k.pool[:, :, 0, :])  # [num_blocks, block, 576]
    tensor = hw.from_vllm(cache, k.padded(), k.lens, layer_index=0)
    assert isinstance(tensor, hw.BlockPagedTensor)
    assert (tensor.kv_role, tensor.shape[1:]) == ("fused", (1, 576))
    check_sequences(tensor, ref_tensor_sequences(tensor))
    for got, row, n in zip(tensor.sequences(), k.pages, k.lens, strict=True):
        assert same(got[:, 0], np.array([cache[row[t // 64], t % 64] for t in range(n)]))
    out, table, lens = hw.to_vllm(tensor)
    assert same(out, cache) and same(table, k.padded()) and same(lens, np.array(k.lens, np.int32))


def test_vllm_strided_cross_layer_view() -> None:
    """A per-layer view of a cross-layer buffer [layers, 2, N, B, H, D] is accepted."""
    rng = np.random.default_rng(9)
    big = random_values(rng, (12, 3, 2, 16, 4, 32), np.float16)  # [N, layers, 2, B, H, D]
    layer = big[:, 1]  # [N, 2, B, H, D], strided
    assert not layer.flags.c_contiguous
    k = batch(9, 16, 4, 32, np.float16)
    key, value = pair(hw.from_vllm(layer, k.padded(), k.lens, layer_index=1))
    for tensor, role in ((key, 0), (value, 1)):  # only the referenced blocks were read
        assert tensor.layout.num_pages == len(set(k.block_table()))
        for s, (row, n) in enumerate(zip(k.pages, k.lens, strict=True)):
            want = [layer[row[t // 16], role, t % 16] for t in range(n)]
            assert same(tensor.sequence(s), np.array(want).reshape(n, 4, 32))


def test_vllm_padded_table_padding_is_ignored() -> None:
    k = batch(11, 16, 2, 64, np.float16)
    table = k.padded(width=8, pad=-1)  # garbage past each row's used length
    key = hw.from_vllm(k.pool, table, k.lens, kv_role="key")
    assert isinstance(key, hw.BlockPagedTensor)
    assert same(key.block_table, k.block_table())


def test_vllm_blob_round_trip() -> None:
    k = batch(13, 16, 8, 128, ml_dtypes.bfloat16)
    cache = np.stack((k.pool, k.pool[::-1]))
    pair = hw.from_vllm(cache, k.padded(), k.lens, layer_index=2)
    assert isinstance(pair, tuple)
    received = tuple(hw.decode(hw.encode(t, compression="default")) for t in pair)
    out, table, lens = hw.to_vllm((received[0], received[1]))
    assert same(out, cache) and same(table, k.padded()) and same(lens, np.array(k.lens, np.int32))
    compacted = tuple(hw.decode(hw.encode(t, compact=True)) for t in pair)
    for a, b in zip(compacted, pair, strict=True):
        for x, y in zip(a.sequences(), b.sequences(), strict=True):
            assert same(x, y)


@pytest.mark.parametrize(
    ("args", "kw", "error"),
    [
        ((np.zeros((2, 2, 2, 2, 2), np.float16), [[0]], [1]), {}, hw.InvalidTensorError),
        ((np.zeros((4, 3, 2, 2, 2), np.float16), [[0]], [1]), {}, hw.InvalidTensorError),
        ((np.zeros((4, 2, 2, 3), np.float16), [[0]], [1]), {}, hw.InvalidTensorError),
        ((np.zeros((4, 2, 2), np.float16), [[0]], [1]), {"kv_role": "key"}, hw.InvalidTensorError),
        (
            (np.zeros((4, 2, 2), np.float16), [[0]], [1]),
            {"kv_cache_layout": "HND"},
            hw.InvalidTensorError,
        ),
        (
            (np.zeros((4, 2, 2, 2), np.float16), [[0]], [1]),
            {"kv_cache_layout": "NDH"},
            hw.ArgumentTypeError,
        ),
        (
            (np.zeros((4, 2, 2, 2), np.float16), [[0]], [1]),
            {"kv_role": "keys"},
            hw.ArgumentTypeError,
        ),
        (
            (np.zeros((2, 4, 2, 2, 2), np.float16), [[0]], [1]),
            {"kv_role": "key"},
            hw.InvalidTensorError,
        ),
        (
            (np.zeros((2, 4, 2, 2, 2), np.float16), [[0]], [1]),
            {"combined": "N2BHD"},
            hw.InvalidTensorError,
        ),
        (
            (np.zeros((2, 4, 2, 2, 2), np.float16), [[0]], [1]),
            {"combined": "2NBHD:"},
            hw.ArgumentTypeError,
        ),
        ((np.zeros((2,), np.float16), [[0]], [1]), {}, hw.InvalidTensorError),
        (("cache", [[0]], [1]), {}, hw.ArgumentTypeError),
        (
            (np.zeros((4, 2, 2, 2), np.float16), [[0]], [3]),
            {"kv_role": "key"},
            hw.IndexBufferError,
        ),  # 3 tokens need 2 blocks, the row has 1
        (
            (np.zeros((4, 2, 2, 2), np.float16), np.zeros((1, 1), np.int32), [3]),
            {"kv_role": "key"},
            hw.IndexBufferError,
        ),
        (
            (np.zeros((4, 2, 2, 2), np.float16), np.zeros((2, 1), np.int32), [1]),
            {"kv_role": "key"},
            hw.IndexBufferError,
        ),
        ((np.zeros((4, 2, 2, 2), np.float16), [[9]], [1]), {"kv_role": "key"}, hw.IndexBufferError),
        (
            (np.zeros((4, 2, 2, 2), np.float16), [[-1]], [1]),
            {"kv_role": "key"},
            hw.IndexBufferError,
        ),
        (
            (np.zeros((4, 2, 2, 2), np.float16), [[0]], [-1]),
            {"kv_role": "key"},
            hw.IndexBufferError,
        ),
        (
            (np.zeros((4, 2, 2, 2), np.float16), [[0]], [1.5]),
            {"kv_role": "key"},
            hw.IndexBufferError,
        ),
        ((np.zeros((4, 2, 2, 2), np.float16), 5, [1]), {"kv_role": "key"}, hw.ArgumentTypeError),
        (
            (np.zeros((4, 2, 2, 2), np.float16), np.zeros((1, 1), np.float32), [1]),
            {"kv_role": "key"},
            hw.IndexBufferError,
        ),
        (
            (np.zeros((4, 0, 2, 2), np.float16), [[]], [0]),
            {"kv_role": "key"},
            hw.InvalidTensorError,
        ),
    ],
)
def test_vllm_refuses(args: tuple[Any, ...], kw: dict[str, Any], error: type) -> None:
    with pytest.raises(error):
        hw.from_vllm(*args, **kw)


def test_vllm_ambiguous_shape_needs_combined() -> None:
    cache = random_values(np.random.default_rng(1), (2, 2, 4, 1, 8), np.float16)
    with pytest.raises(hw.InvalidTensorError, match="combined"):
        hw.from_vllm(cache, [[0]], [3])
    k, _ = pair(hw.from_vllm(cache, [[1]], [3], combined="2NBHD"))
    assert same(k.sequence(0), cache[0, 1, :3])
    k, _ = pair(hw.from_vllm(cache, [[1]], [3], combined="N2BHD"))
    assert same(k.sequence(0), cache[1, 0, :3])


def test_to_vllm_refuses() -> None:
    k = batch(2, 16, 2, 64, np.float16)
    key = hw.from_vllm(k.pool, k.pages, k.lens, kv_role="key")
    value = hw.from_vllm(k.pool, k.pages, k.lens, kv_role="value")
    other = hw.from_vllm(k.pool[:, :, :1], k.pages, k.lens, kv_role="value")
    assert isinstance(key, hw.BlockPagedTensor) and isinstance(value, hw.BlockPagedTensor)
    assert isinstance(other, hw.BlockPagedTensor)
    with pytest.raises(hw.InvalidTensorError):
        hw.to_vllm((value, key))
    with pytest.raises(hw.InvalidTensorError):
        hw.to_vllm((key, other))
    with pytest.raises(hw.ArgumentTypeError):
        hw.to_vllm((key,))  # type: ignore[arg-type]
    with pytest.raises(hw.ArgumentTypeError):
        hw.to_vllm((key, value), combined="stacked")
    with pytest.raises(hw.InvalidTensorError):
        hw.to_vllm(key, max_blocks=0)
    with pytest.raises(hw.ArgumentTypeError):
        hw.to_vllm(key, max_blocks=True)
    shorter = hw.from_vllm(
        k.pool, [r[:1] for r in k.pages], [min(n, 16) for n in k.lens], kv_role="value"
    )
    assert isinstance(shorter, hw.BlockPagedTensor)
    with pytest.raises(hw.InvalidTensorError):
        hw.to_vllm((key, shorter))


# -- hurray-wire -> engine -> hurray-wire, on random tensors ------------------------------------
def pair_of(seed: int, block: int, dtype: Any) -> tuple[hw.BlockPagedTensor, hw.BlockPagedTensor]:
    b = batch(seed, block, 2, 8, dtype)
    v = random_values(np.random.default_rng(seed + 7), b.pool.shape, dtype)
    args = (b.block_table(), b.seq_ptr())
    key = hw.BlockPagedTensor.from_arrays(b.pool, *args, seq_lens=b.lens, layer_index=3)
    value = hw.BlockPagedTensor.from_arrays(
        v, *args, seq_lens=b.lens, kv_role="value", layer_index=3
    )
    return key, value


def same_tensor(a: hw.BlockPagedTensor, b: hw.BlockPagedTensor) -> None:
    assert a.descriptor == b.descriptor
    for name in ("page_pool", "block_table", "seq_ptr", "seq_lens"):
        assert same(getattr(a, name), getattr(b, name)), name


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**31),
    block=st.sampled_from([1, 4, 16, 32]),
    form=st.sampled_from(["2NBHD", "N2BHD", "packed"]),
    layout=st.sampled_from(["NHD", "HND"]),
    dtype=st.sampled_from(DTYPES),
)
def test_tensor_vllm_tensor(seed: int, block: int, form: str, layout: str, dtype: Any) -> None:
    key, value = pair_of(seed, block, dtype)
    cache, table, lens = hw.to_vllm((key, value), kv_cache_layout=layout, combined=form)
    back = hw.from_vllm(cache, table, lens, kv_cache_layout=layout, layer_index=3, combined=form)
    assert isinstance(back, tuple)
    for got, want in zip(back, (key, value), strict=True):  # strided forms: referenced pages
        assert all(same(a, b) for a, b in zip(got.sequences(), want.sequences(), strict=True))
        if np.shares_memory(got.page_pool, cache):  # a view: the same tensor
            same_tensor(got, want)


def test_vllm_fp8_scales() -> None:
    k = batch(17, 16, 2, 64, ml_dtypes.float8_e4m3fn)
    cache = np.stack((k.pool, k.pool))
    key, value = pair(hw.from_vllm(cache, k.padded(), k.lens, k_scale=0.5, v_scale=0.25))
    assert (key.kv_scale, value.kv_scale) == (0.5, 0.25)
    assert value.metadata == {"hurray.v_scale": 0.25}
    mla = hw.from_vllm(cache[0, :, :, 0], k.padded(), k.lens, k_scale=2.0)
    assert isinstance(mla, hw.BlockPagedTensor) and mla.kv_scale == 2.0
    assert same(
        mla.sequence(0, dequantize=True), mla.sequence(0).astype(np.float32) * np.float32(2.0)
    )
    with pytest.raises(hw.InvalidMetadataError):
        hw.from_vllm(cache, k.padded(), k.lens, k_scale=-1.0)
