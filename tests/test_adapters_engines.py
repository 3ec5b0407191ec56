"""Engine adapters: exact round trips engine -> hurray-wire -> engine against loop references."""

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
    ref_sglang_sequences,
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
    assert same(out, cache)
    assert out_table.dtype == np.int32 and out_lens.dtype == np.int32
    assert same(out_table, table) and same(out_lens, lens)


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
    assert same(out, cache) and same(table, k.padded()) and same(lens, np.array(k.lens, np.int32))
    if layout == "NHD":  # one NHD role: the cache *is* the pool, both ways
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
    assert same(hw.to_vllm((key, value), combined="N2BHD")[0], layer)


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


# -- FlashInfer ------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("form", ["combined", "tuple", "key"])
def test_flashinfer_round_trip(dtype: Any, layout: str, form: str) -> None:
    k = batch(21, 16, 4, 128, dtype)
    v = random_values(np.random.default_rng(22), k.pool.shape, dtype)

    def lay(a: Any) -> Any:
        return a if layout == "NHD" else np.ascontiguousarray(a.transpose(0, 2, 1, 3))

    indptr = np.array(k.seq_ptr(), np.int32)
    indices = np.array(k.block_table(), np.int32)
    last = np.array(
        [0 if not r else n - (len(r) - 1) * 16 for r, n in zip(k.pages, k.lens, strict=True)],
        np.int32,
    )
    cache: Any
    if form == "combined":
        cache = np.stack((lay(k.pool), lay(v)), axis=1)
    elif form == "tuple":
        cache = (lay(k.pool), lay(v))
    else:
        cache = lay(k.pool)
    got = hw.from_flashinfer(
        cache, indptr, indices, last, kv_layout=layout, kv_role="key" if form == "key" else None
    )
    key = got if isinstance(got, hw.BlockPagedTensor) else got[0]
    check_sequences(key, [p for p in ref_tensor_sequences(key)])
    expected = [
        np.array([k.pool[r[t // 16], t % 16] for t in range(n)])
        for r, n in zip(k.pages, k.lens, strict=True)
    ]
    check_sequences(key, expected)
    out = hw.to_flashinfer(got, kv_layout=layout, combined=form == "combined")
    assert same(out[1], indptr) and same(out[2], indices) and same(out[3], last)
    assert out[1].dtype == out[2].dtype == out[3].dtype == np.int32
    assert np.shares_memory(out[2], key.block_table)  # int32 view of the uint32 table
    if form == "tuple":
        assert same(out[0][0], cache[0]) and same(out[0][1], cache[1])
        if layout == "NHD":
            assert np.shares_memory(out[0][0], key.page_pool)
    else:
        assert same(out[0], cache)


def test_flashinfer_refuses() -> None:
    pool = np.zeros((4, 4, 2, 8), np.float16)
    ok = ([0, 1, 2], [0, 1], [4, 2])
    hw.from_flashinfer(pool, *ok, kv_role="key")
    cases: list[tuple[Any, tuple[Any, ...], dict[str, Any], type]] = [
        (pool, ok, {}, hw.InvalidTensorError),  # one role without kv_role
        (pool, ([0, 1, 2], [0, 1], [5, 2]), {"kv_role": "key"}, hw.IndexBufferError),
        (pool, ([0, 1, 2], [0, 1], [0, 2]), {"kv_role": "key"}, hw.IndexBufferError),
        (pool, ([0, 1, 2], [0, 1], [4]), {"kv_role": "key"}, hw.IndexBufferError),
        (pool, ([0, 2, 1], [0, 1], [4, 2]), {"kv_role": "key"}, hw.IndexBufferError),
        (pool, ([1, 1, 2], [0, 1], [4, 2]), {"kv_role": "key"}, hw.IndexBufferError),
        (pool, ([0, 1, 2], [0, 7], [4, 2]), {"kv_role": "key"}, hw.IndexBufferError),
        (pool, ok, {"kv_role": "key", "kv_layout": "nhd"}, hw.ArgumentTypeError),
        ((pool,), ok, {}, hw.ArgumentTypeError),
        ((pool, pool[:, :2]), ok, {}, hw.InvalidTensorError),
        ((pool, pool), ok, {"kv_role": "key"}, hw.InvalidTensorError),
        (np.zeros((4, 3, 4, 2, 8)), ok, {}, hw.InvalidTensorError),
        (np.zeros((4, 2)), ok, {"kv_role": "key"}, hw.InvalidTensorError),
    ]
    for cache, args, kw, error in cases:
        with pytest.raises(error):
            hw.from_flashinfer(cache, *args, **kw)
    key = hw.from_flashinfer(pool, *ok, kv_role="key")
    with pytest.raises(hw.ArgumentTypeError):
        hw.to_flashinfer(key, combined=1)  # type: ignore[arg-type]


def test_flashinfer_empty_sequence_and_uint64_tables() -> None:
    pool = random_values(np.random.default_rng(4), (3, 4, 1, 8), np.float16)
    key = hw.from_flashinfer(pool, [0, 0, 2], [2, 0], [7, 1], kv_role="key")
    assert isinstance(key, hw.BlockPagedTensor)
    assert key.seq_lens is not None and key.seq_lens.tolist() == [0, 5]
    wide = hw.BlockPagedTensor.from_arrays(
        pool, [2, 0], [0, 0, 2], seq_lens=[0, 5], block_table_index_type="uint64"
    )
    _, _indptr, indices, last = hw.to_flashinfer(wide)
    assert indices.dtype == np.int32 and indices.tolist() == [2, 0] and last.tolist() == [0, 1]


# -- SGLang ----------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("page_size", [1, 16, 64])
def test_sglang_round_trip(dtype: Any, page_size: int) -> None:
    rng = np.random.default_rng(page_size)
    k = batch(page_size, page_size, 8, 64, dtype)
    # Page 0 is SGLang's padding page: move every page id up by one.
    pages = [[p + 1 for p in row] for row in k.pages]
    num_pages = k.pool.shape[0] + 1
    k_buf = random_values(rng, (num_pages * page_size, 8, 64), dtype)
    v_buf = random_values(rng, (num_pages * page_size, 8, 64), dtype)
    width = max(k.lens) + 3
    req = np.zeros((len(k.lens) + 2, width), np.int32)  # spare rows, as SGLang's pool has
    for s, (row, n) in enumerate(zip(pages, k.lens, strict=True)):
        for t in range(n):
            req[s, t] = row[t // page_size] * page_size + t % page_size
    lens = np.array(k.lens, np.int64)
    key, value = hw.from_sglang(k_buf, v_buf, req, lens, page_size=page_size, layer_index=4)
    check_sequences(key, ref_sglang_sequences(k_buf, req, k.lens))
    check_sequences(value, ref_sglang_sequences(v_buf, req, k.lens))
    kb, vb, table, out_lens = hw.to_sglang((key, value), max_context_len=width)
    assert same(kb, k_buf) and same(vb, v_buf) and np.shares_memory(kb, key.page_pool)
    assert same(table, req[: len(k.lens)]) and same(out_lens, lens.astype(np.int32))
    order = np.array([2, 0, 1, 3])[: len(k.lens)]
    again = hw.from_sglang(
        k_buf, v_buf, req, lens[order], page_size=page_size, req_pool_indices=order
    )
    for got, want in zip(again[0].sequences(), [key.sequences()[i] for i in order], strict=True):
        assert same(got, want)


def test_to_sglang_adds_a_padding_page_when_page_0_is_used() -> None:
    pool = random_values(np.random.default_rng(0), (2, 4, 1, 8), np.float16)
    key = hw.BlockPagedTensor.from_arrays(pool, [0, 1], [0, 2], seq_lens=[6])
    value = hw.BlockPagedTensor.from_arrays(pool, [0, 1], [0, 2], seq_lens=[6], kv_role="value")
    kb, vb, req, lens = hw.to_sglang((key, value))
    assert kb.shape == (12, 1, 8) and not kb[:4].any()
    back, _ = hw.from_sglang(kb, vb, req, lens, page_size=4)
    assert same(back.sequence(0), key.sequence(0))


def test_sglang_refuses() -> None:
    buf = np.zeros((12, 1, 8), np.float16)
    good = np.array([[4, 5, 6, 7, 8, 9]], np.int32)
    hw.from_sglang(buf, buf, good, [6], page_size=4)
    cases: list[tuple[Any, Any, Any, Any, dict[str, Any], type]] = [
        (buf, buf, [[4, 6, 5, 7]], [4], {}, hw.IndexBufferError),  # not contiguous
        (buf, buf, [[5, 6, 7, 8]], [4], {}, hw.IndexBufferError),  # not page-aligned
        (buf, buf, [[0, 1]], [2], {}, hw.IndexBufferError),  # the padding page
        (buf, buf, [[12, 13]], [2], {}, hw.IndexBufferError),  # outside the pool
        (buf, buf, good, [7], {}, hw.IndexBufferError),  # longer than the table
        (buf, buf, good, [6, 1], {}, hw.IndexBufferError),  # fewer rows than requests
        (buf, buf, good, [6], {"req_pool_indices": [3]}, hw.IndexBufferError),
        (buf, buf[:8], good, [6], {}, hw.InvalidTensorError),
        (buf[:10], buf[:10], good, [6], {}, hw.InvalidTensorError),
        (buf, buf, np.zeros((1, 6), np.float32), [6], {}, hw.IndexBufferError),
        (buf, buf, good, [6], {"page_size": 0}, hw.InvalidTensorError),
        (buf, buf, good, [6], {"page_size": True}, hw.ArgumentTypeError),
    ]
    for k, v, req, lens, kw, error in cases:
        with pytest.raises(error):
            hw.from_sglang(
                k,
                v,
                np.asarray(req, np.int32) if isinstance(req, list) else req,
                lens,
                **{"page_size": 4, **kw},
            )
    key, value = hw.from_sglang(buf, buf, good, [6], page_size=4)
    with pytest.raises(hw.InvalidTensorError):
        hw.to_sglang((key, value), max_context_len=5)
    with pytest.raises(hw.ArgumentTypeError):
        hw.to_sglang(key)  # type: ignore[arg-type]


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
    same_tensor(back[0], key)
    same_tensor(back[1], value)


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**31),
    block=st.sampled_from([1, 4, 16, 32]),
    layout=st.sampled_from(["NHD", "HND"]),
    combined=st.booleans(),
    dtype=st.sampled_from(DTYPES),
)
def test_tensor_flashinfer_tensor(
    seed: int, block: int, layout: str, combined: bool, dtype: Any
) -> None:
    key, value = pair_of(seed, block, dtype)
    out = hw.to_flashinfer((key, value), kv_layout=layout, combined=combined)
    back = hw.from_flashinfer(*out, kv_layout=layout, layer_index=3)
    assert isinstance(back, tuple)
    same_tensor(back[0], key)
    same_tensor(back[1], value)
    one = hw.to_flashinfer(value, kv_layout=layout)
    back_value = hw.from_flashinfer(*one, kv_layout=layout, kv_role="value", layer_index=3)
    assert isinstance(back_value, hw.BlockPagedTensor)
    same_tensor(back_value, value)


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**31), block=st.sampled_from([1, 4, 16, 32]), dtype=st.sampled_from(DTYPES)
)
def test_tensor_sglang_tensor(seed: int, block: int, dtype: Any) -> None:
    key, value = pair_of(seed, block, dtype)
    kb, vb, req, lens = hw.to_sglang((key, value))
    back_k, back_v = hw.from_sglang(kb, vb, req, lens, page_size=block, layer_index=3)
    for got, want in ((back_k, key), (back_v, value)):
        assert all(same(a, b) for a, b in zip(got.sequences(), want.sequences(), strict=True))
        assert got.prefix_sharing().keys() == {
            p + (key.block_table == 0).any() for p in want.prefix_sharing()
        }
    if not (key.block_table == 0).any():  # no padding page needed: exactly the same tensor
        same_tensor(back_k, key)
        same_tensor(back_v, value)


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
