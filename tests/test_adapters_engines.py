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
