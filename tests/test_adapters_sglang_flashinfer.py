"""SGLang and FlashInfer adapters in the main venv (no engine): loop references written from
the engines' code, every error path, and memory (views, copies, read-only). The engines' own
code is the oracle in engine_tests/oracle_sglang."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import hurray_wire as hw
from hurray_wire import errors as hwe
from tests.adapter_reference import random_batch, random_values, ref_sglang_sequences

DTYPES = [np.float16, ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2]


def same(a: Any, b: Any) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype.kind in "iu" and b.dtype.kind in "iu":
        return a.shape == b.shape and bool(np.array_equal(a, b))
    return bool(a.shape == b.shape and a.tobytes() == b.tobytes())


# -- SGLang ----------------------------------------------------------------------------------
def sglang_pool(page_size: int, dtype: Any, seed: int, layout: str = "nhd") -> dict[str, Any]:
    """An SGLang-style pool: page 0 padding, requests in rows 3, 1 (never 0), a shared first
    page, partial last pages, slots page-aligned as SGLang's allocator places them."""
    rng = np.random.default_rng(seed)
    num_pages, heads, dim = 9, 2, 8
    slots = num_pages * page_size + (3 if layout == "nhd" and page_size > 1 else 0)
    k = random_values(rng, (slots, heads, dim), dtype)
    v = random_values(rng, (slots, heads, dim), dtype)
    req = np.zeros((5, 256), np.int32)
    lens = [2 * page_size + 1, page_size + 1]
    pages = {3: [4, 2, 7], 1: [4, 5]}  # request 1 shares page 4 (its first, whole page)
    for row, n in zip((3, 1), lens, strict=True):
        for t in range(n):
            req[row, t] = pages[row][t // page_size] * page_size + t % page_size
    out: dict[str, Any] = {"k": k, "v": v, "req": req, "rows": [3, 1], "lens": lens}
    if layout == "hnd":
        for name in ("k", "v"):
            paged = out[name][: num_pages * page_size].reshape(num_pages, page_size, heads, dim)
            out[name + "_hnd"] = np.ascontiguousarray(paged.transpose(0, 2, 1, 3))
    return out


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("page_size", [1, 16, 64])
@pytest.mark.parametrize("layout", ["nhd", "hnd"])
def test_sglang_reads_rows_of_req_pool_indices(dtype: Any, page_size: int, layout: str) -> None:
    p = sglang_pool(page_size, dtype, page_size, layout)
    kb, vb = (p["k"], p["v"]) if layout == "nhd" else (p["k_hnd"], p["v_hnd"])
    key, value = hw.from_sglang(kb, vb, p["req"], p["rows"], p["lens"], page_size=page_size,
                                kv_cache_layout=layout, layer_index=2)  # fmt: skip
    for tensor, buf in ((key, p["k"]), (value, p["v"])):
        for got, want in zip(
            tensor.sequences(), ref_sglang_sequences(buf, p["req"], p["rows"], p["lens"]),
            strict=True,
        ):  # fmt: skip
            assert same(got, want)
    assert len(key.prefix_sharing()) == 1  # page 4, shared by both requests
    if layout == "nhd":
        assert np.shares_memory(key.page_pool, p["k"])  # a view of SGLang's buffer
        assert key.block_table.tolist() == [4, 2, 7, 4, 5]  # SGLang's page ids kept
    elif page_size > 1:  # HND of page size 1 is contiguous as NHD too: then a view
        assert not np.shares_memory(key.page_pool, p["k_hnd"])
        assert key.layout.num_pages == 4  # only the 4 referenced pages were copied
    # to_sglang: rows 1..n, row 0 never written, what SGLang reads is the same
    out = hw.to_sglang((key, value), kv_cache_layout=layout, max_context_len=256)
    kb2, vb2, req2, rows2, lens2 = out
    assert rows2.tolist() == [1, 2] and not req2[0].any() and lens2.tolist() == p["lens"]
    assert int(req2[1:][req2[1:] > 0].min()) >= page_size  # the padding page is never used
    back = hw.from_sglang(kb2, vb2, req2, rows2, lens2, page_size=page_size,
                          kv_cache_layout=layout)  # fmt: skip
    for a, b in zip(back, (key, value), strict=True):
        assert all(same(x, y) for x, y in zip(a.sequences(), b.sequences(), strict=True))
    chosen = hw.to_sglang((key, value), req_pool_indices=[4, 2])
    assert chosen[2].shape[0] == 5 and chosen[3].tolist() == [4, 2] and not chosen[2][0].any()
    assert same(chosen[2][4, : p["lens"][0]], req2[1, : p["lens"][0]])


def test_sglang_fp8_travels_as_float8_with_its_scales() -> None:
    p = sglang_pool(16, ml_dtypes.float8_e4m3fn, 5)
    raw_k, raw_v = p["k"].view(np.uint8), p["v"].view(np.uint8)  # as SGLang stores fp8
    args = (p["req"], p["rows"], p["lens"])
    with pytest.raises(hwe.InvalidTensorError) as info:
        hw.from_sglang(raw_k, raw_v, *args, page_size=16)
    assert info.value.field == "dtype" and "dtype=" in str(info.value)
    for dtype in ("float8_e4m3fn", "fp8_e4m3", np.dtype(ml_dtypes.float8_e4m3fn)):
        key, value = hw.from_sglang(raw_k, raw_v, *args, page_size=16, dtype=dtype,
                                    k_scale=np.float32(0.5), v_scale=np.array(0.25))  # fmt: skip
        assert key.element_type == hw.float8_e4m3 and (key.kv_scale, value.kv_scale) == (0.5, 0.25)
        assert np.shares_memory(key.page_pool, raw_k)  # viewed, not converted
        want = ref_sglang_sequences(p["k"], p["req"], p["rows"], p["lens"])[0]
        assert same(key.sequence(0), want)
        real = want.astype(np.float32) * np.float32(0.5)
        assert np.array_equal(key.sequence(0, dequantize=True), real)
    e5 = hw.from_sglang(raw_k, raw_v, *args, page_size=16, dtype="fp8_e5m2")[0]
    assert e5.element_type == hw.float8_e5m2
    bad: list[tuple[dict[str, Any], type[hw.HurrayWireError], str]] = [
        ({"dtype": "int4"}, hwe.ArgumentTypeError, "dtype"),
        ({"dtype": "bfloat16"}, hwe.InvalidTensorError, "k_buffer"),  # uint8 is not bf16
        ({"dtype": "fp8", "k_scale": np.ones(2)}, hwe.InvalidTensorError, "k_scale"),
        ({"dtype": "fp8", "v_scale": "1"}, hwe.ArgumentTypeError, "v_scale"),
        ({"dtype": "fp8", "k_scale": True}, hwe.ArgumentTypeError, "k_scale"),
        ({"dtype": "fp8", "k_scale": -1.0}, hwe.InvalidMetadataError, "kv_scale"),
    ]
    for kw, error, field in bad:
        with pytest.raises(error) as caught:
            hw.from_sglang(raw_k, raw_v, *args, page_size=16, **kw)
        assert caught.value.field == field, kw


def test_sglang_mla_is_one_fused_tensor() -> None:
    rng = np.random.default_rng(3)
    kv = random_values(rng, (5 * 16, 1, 576), ml_dtypes.bfloat16)
    req = np.zeros((3, 40), np.int32)
    req[2, :20] = np.r_[32:48, 64:68]
    fused = hw.from_sglang_mla(kv, req, [2], [20], page_size=16, layer_index=0)
    assert (fused.kv_role, fused.shape) == ("fused", (20, 1, 576))
    assert same(fused.sequence(0), kv[req[2, :20]])
    out_kv, out_req, rows, _lens = hw.to_sglang_mla(fused)
    assert rows.tolist() == [1] and same(out_kv[out_req[1, :20]], kv[req[2, :20]])
    with pytest.raises(hwe.InvalidTensorError, match=r"MLATokenToKVPool.*from_sglang_mla"):
        hw.from_sglang(kv, kv[..., :512], req, [2], [20], page_size=16)
    # two buffers of an MHA pool with v_head_dim < head_dim: not MLA, not supported
    with pytest.raises(
        hwe.InvalidTensorError, match=r"v_head_dim != head_dim .*not supported"
    ) as info:
        hw.from_sglang(kv, kv[..., :512].copy(), req, [2], [20], page_size=16)
    assert "from_sglang_mla" not in str(info.value)
    for bad in (hw.BlockPagedTensor.from_arrays(np.zeros((2, 4, 2, 8), np.float16), [1], [0, 1]),
                "x"):  # fmt: skip
        with pytest.raises(hw.HurrayWireError):
            hw.to_sglang_mla(bad)  # type: ignore[arg-type]
    with pytest.raises(hwe.InvalidTensorError):
        hw.from_sglang_mla(np.zeros((32, 2, 576), np.float16), req, [2], [20], page_size=16)


def test_sglang_refuses() -> None:
    buf = np.zeros((12, 1, 8), np.float16)
    good = np.zeros((3, 6), np.int32)
    good[2] = [4, 5, 6, 7, 8, 9]
    hw.from_sglang(buf, buf, good, [2], [6], page_size=4)

    def req(*row: int) -> Any:
        table = np.zeros((3, 6), np.int32)
        table[2, : len(row)] = row
        return table

    cases: list[tuple[Any, Any, Any, Any, Any, dict[str, Any], type[hw.HurrayWireError], str]] = [
        (buf, buf, good, None, [6], {}, hwe.ArgumentTypeError, "req_pool_indices"),
        (buf, buf, good, [2], None, {}, hwe.ArgumentTypeError, "seq_lens"),
        (buf, buf, good, [0], [6], {}, hwe.IndexBufferError, "req_pool_indices"),  # padding row
        (buf, buf, good, [3], [6], {}, hwe.IndexBufferError, "req_pool_indices"),
        (buf, buf, good, [2, 1], [6], {}, hwe.IndexBufferError, "seq_lens"),
        (buf, buf, good, [2], [7], {}, hwe.IndexBufferError, "seq_lens"),  # > max_context_len
        (buf, buf, good, [-1], [6], {}, hwe.IndexBufferError, "req_pool_indices"),
        (buf, buf, req(4, 6, 5, 7), [2], [4], {}, hwe.IndexBufferError, "req_to_token"),
        (buf, buf, req(5, 6, 7, 8), [2], [4], {}, hwe.IndexBufferError, "req_to_token"),
        (buf, buf, req(0, 1), [2], [2], {}, hwe.IndexBufferError, "req_to_token"),  # padding page
        (buf, buf, req(12, 13), [2], [2], {}, hwe.IndexBufferError, "req_to_token"),
        (buf, buf, np.zeros((3, 6), np.float32), [2], [6], {}, hwe.IndexBufferError,
         "req_to_token"),
        (buf, buf, [[4, 5]], [2], [6], {}, hwe.IndexBufferError, "req_to_token"),
        (buf, buf[:8], good, [2], [6], {}, hwe.InvalidTensorError, "v_buffer"),
        (buf[:3], buf[:3], good, [2], [6], {}, hwe.InvalidTensorError, "k_buffer"),
        (buf[0], buf[0], good, [2], [6], {}, hwe.InvalidTensorError, "k_buffer"),
        (buf[None], buf[None], good, [2], [6], {}, hwe.InvalidTensorError, "k_buffer"),  # HND?
        (buf, buf, good, [2], [6], {"kv_cache_layout": "hnd"}, hwe.InvalidTensorError, "k_buffer"),
        (buf, buf, good, [2], [6], {"kv_cache_layout": "NDH"}, hwe.ArgumentTypeError,
         "kv_cache_layout"),
        (buf, buf, good, [2], [6], {"page_size": 0}, hwe.InvalidTensorError, "page_size"),
        (buf, buf, good, [2], [6], {"page_size": True}, hwe.ArgumentTypeError, "page_size"),
        ([1], buf, good, [2], [6], {}, hwe.ArgumentTypeError, "k_buffer"),
        (buf.astype(np.int16), buf.astype(np.int16), good, [2], [6], {}, hwe.InvalidTensorError,
         "k_buffer"),
    ]  # fmt: skip
    for k, v, table, rows, lens, kw, error, field in cases:
        args: dict[str, Any] = {"page_size": 4, **kw}
        with pytest.raises(error) as info:
            hw.from_sglang(k, v, table, rows, lens, **args)
        assert info.value.field == field, (field, info.value)
    key, value = hw.from_sglang(buf, buf, good, [2], [6], page_size=4)
    refusals: list[tuple[dict[str, Any], type[hw.HurrayWireError]]] = [
        ({"max_context_len": 5}, hwe.InvalidTensorError),
        ({"req_pool_indices": [0]}, hwe.IndexBufferError),
        ({"req_pool_indices": [1, 2]}, hwe.IndexBufferError),
        ({"kv_cache_layout": "x"}, hwe.ArgumentTypeError),
        ({"as_torch": 1}, hwe.ArgumentTypeError),
    ]
    for options, refusal in refusals:
        with pytest.raises(refusal):
            hw.to_sglang((key, value), **options)
    with pytest.raises(hwe.ArgumentTypeError):
        hw.to_sglang(key)  # type: ignore[arg-type]


def test_to_sglang_adds_a_padding_page_when_page_0_is_used() -> None:
    pool = random_values(np.random.default_rng(0), (2, 4, 1, 8), np.float16)
    key = hw.BlockPagedTensor.from_arrays(pool, [0, 1], [0, 2], seq_lens=[6])
    value = hw.BlockPagedTensor.from_arrays(pool, [0, 1], [0, 2], seq_lens=[6], kv_role="value")
    kb, vb, req, rows, lens = hw.to_sglang((key, value))
    assert kb.shape == (12, 1, 8) and not kb[:4].any() and not np.shares_memory(kb, pool)
    back, _ = hw.from_sglang(kb, vb, req, rows, lens, page_size=4)
    assert same(back.sequence(0), key.sequence(0))


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31), block=st.sampled_from([1, 4, 16]),
       layout=st.sampled_from(["nhd", "hnd"]), dtype=st.sampled_from(DTYPES))  # fmt: skip
def test_tensor_sglang_tensor(seed: int, block: int, layout: str, dtype: Any) -> None:
    key, value = pair_of(seed, block, dtype)
    kb, vb, req, rows, lens = hw.to_sglang((key, value), kv_cache_layout=layout)
    back = hw.from_sglang(kb, vb, req, rows, lens, page_size=block, kv_cache_layout=layout)
    for got, want in zip(back, (key, value), strict=True):
        assert all(same(a, b) for a, b in zip(got.sequences(), want.sequences(), strict=True))
        assert len(got.prefix_sharing()) == len(want.prefix_sharing())


# -- FlashInfer ------------------------------------------------------------------------------
def pair_of(seed: int, block: int, dtype: Any) -> tuple[hw.BlockPagedTensor, hw.BlockPagedTensor]:
    b = random_batch(np.random.default_rng(seed), num_pages=12, page_size=block, heads=2,
                     head_dim=8, dtype=dtype)  # fmt: skip
    v = random_values(np.random.default_rng(seed + 7), b.pool.shape, dtype)
    args = (b.block_table(), b.seq_ptr())
    key = hw.BlockPagedTensor.from_arrays(b.pool, *args, seq_lens=b.lens, layer_index=3)
    value = hw.BlockPagedTensor.from_arrays(v, *args, seq_lens=b.lens, kv_role="value",
                                            layer_index=3)  # fmt: skip
    return key, value


def fi_tokens(k: Any, layout: str, indptr: Any, indices: Any, lens: list[int]) -> list[Any]:
    """FlashInfer's paged read of 4-D caches (k[page, slot] NHD, k[page, :, slot] HND)."""
    page_size = k.shape[1] if layout == "NHD" else k.shape[2]
    out = []
    for s, n in enumerate(lens):
        rows = []
        for t in range(n):
            page = indices[indptr[s] + t // page_size]
            rows.append(k[page, t % page_size] if layout == "NHD" else k[page, :, t % page_size])
        out.append(np.array(rows).reshape(n, *(k.shape[2:] if layout == "NHD" else
                                                (k.shape[1], k.shape[3]))))  # fmt: skip
    return out


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("form", ["combined", "tuple", "key"])
@pytest.mark.parametrize("page_size", [1, 16])
def test_flashinfer_forms(dtype: Any, layout: str, form: str, page_size: int) -> None:
    key, value = pair_of(21, page_size, dtype)
    k4, v4 = key.page_pool, value.page_pool
    if layout == "HND":
        k4, v4 = (np.ascontiguousarray(a.transpose(0, 2, 1, 3)) for a in (k4, v4))
    squeeze = 1 if layout == "NHD" else 2  # page size 1: FlashInfer's 3-D / 4-D forms
    indptr, indices = key.seq_ptr.astype(np.int32), key.block_table.astype(np.int32)
    lens = key.seq_lens.tolist()  # type: ignore[union-attr]
    counts = np.diff(indptr)
    last = np.where(counts > 0, np.array(lens) - (counts - 1) * page_size, 0).astype(np.int32)
    for small in [False, True] if page_size == 1 else [False]:
        kc, vc = (np.squeeze(a, squeeze) for a in (k4, v4)) if small else (k4, v4)
        cache: Any = {"combined": np.stack((kc, vc), axis=1), "tuple": (kc, vc), "key": kc}[form]
        got = hw.from_flashinfer(cache, indptr, indices, last, kv_layout=layout,
                                 kv_role="key" if form == "key" else None)  # fmt: skip
        tensors = (got,) if isinstance(got, hw.BlockPagedTensor) else got
        for tensor, ref in zip(tensors, (k4, v4), strict=False):
            for a, b in zip(tensor.sequences(), fi_tokens(ref, layout, indptr, indices, lens),
                            strict=True):  # fmt: skip
                assert same(a, b)
        if form == "tuple" and layout == "NHD":
            assert np.shares_memory(tensors[0].page_pool, kc)  # contiguous NHD: a view
        if form == "combined" or (layout == "HND" and page_size > 1):  # strided: gathered
            assert tensors[0].layout.num_pages == len(set(indices.tolist()))
        out = hw.to_flashinfer(got, kv_layout=layout, combined=form == "combined")
        assert same(out[1], indptr) and same(out[3], last)
        assert out[1].dtype == out[2].dtype == out[3].dtype == np.int32
        again = hw.from_flashinfer(*out, kv_layout=layout,
                                   kv_role="key" if form == "key" else None)  # fmt: skip
        again_t = (again,) if isinstance(again, hw.BlockPagedTensor) else again
        for t1, t2 in zip(again_t, tensors, strict=True):
            assert all(same(x, y) for x, y in zip(t1.sequences(), t2.sequences(), strict=True))


def test_flashinfer_lengths_follow_get_seq_lens() -> None:
    pool = random_values(np.random.default_rng(4), (3, 4, 1, 8), np.float16)
    key = hw.from_flashinfer(pool, [0, 0, 2], [2, 0], [0, 1], kv_role="key")
    assert isinstance(key, hw.BlockPagedTensor) and key.seq_lens is not None
    assert key.seq_lens.tolist() == [0, 5]
    # get_seq_lens: max(pages - 1, 0) * page_size + last; lengths the pages cannot hold refused
    for indptr, last in (([0, 0, 2], [7, 1]), ([0, 1, 2], [0, 2]), ([0, 1, 2], [5, 2])):
        with pytest.raises(hwe.IndexBufferError) as info:
            hw.from_flashinfer(pool, indptr, [0, 1], last, kv_role="key")
        assert info.value.field == "kv_last_page_len"
    wide = hw.BlockPagedTensor.from_arrays(
        pool, [2, 0], [0, 0, 2], seq_lens=[0, 5], block_table_index_type="uint64"
    )
    _, _indptr, indices, last_out = hw.to_flashinfer(wide)
    assert indices.dtype == np.int32 and indices.tolist() == [2, 0] and last_out.tolist() == [0, 1]


def test_flashinfer_refuses() -> None:
    pool = np.zeros((4, 4, 2, 8), np.float16)
    ok = ([0, 1, 2], [0, 1], [4, 2])
    hw.from_flashinfer(pool, *ok, kv_role="key")
    cases: list[tuple[Any, tuple[Any, ...], dict[str, Any], type[hw.HurrayWireError], str]] = [
        (pool, ok, {}, hwe.InvalidTensorError, "paged_kv_cache"),  # 4-D: combined page size 1
        (pool, ([0, 1, 2], [0, 1], [4]), {"kv_role": "key"}, hwe.IndexBufferError,
         "kv_last_page_len"),
        (pool, ([0, 2, 1], [0, 1], [4, 2]), {"kv_role": "key"}, hwe.IndexBufferError, "kv_indptr"),
        (pool, ([1, 1, 2], [0, 1], [4, 2]), {"kv_role": "key"}, hwe.IndexBufferError, "kv_indptr"),
        (pool, ([0, 1, 2], [0, 7], [4, 2]), {"kv_role": "key"}, hwe.IndexBufferError,
         "block_table"),
        (pool, ok, {"kv_role": "key", "kv_layout": "nhd"}, hwe.ArgumentTypeError, "kv_layout"),
        (pool, ok, {"kv_role": "fused"}, hwe.InvalidTensorError, "kv_role"),
        ((pool,), ok, {}, hwe.InvalidTensorError, "paged_kv_cache"),
        ((pool, pool[:, :2]), ok, {}, hwe.InvalidTensorError, "paged_kv_cache"),
        ((pool, pool), ok, {"kv_role": "key"}, hwe.InvalidTensorError, "paged_kv_cache"),
        (np.zeros((4, 3, 4, 2, 8), np.float16), ok, {}, hwe.InvalidTensorError, "paged_kv_cache"),
        (np.zeros((4, 2), np.float16), ok, {"kv_role": "key"}, hwe.InvalidTensorError,
         "paged_kv_cache"),
        (pool.view(np.uint16).astype(np.uint8), ok, {"kv_role": "key"}, hwe.InvalidTensorError,
         "dtype"),
        ("cache", ok, {"kv_role": "key"}, hwe.ArgumentTypeError, "paged_kv_cache"),
        (pool, ok, {"kv_role": "key", "k_scale": [1.0, 2.0]}, hwe.InvalidTensorError, "k_scale"),
    ]  # fmt: skip
    for cache, args, kw, error, field in cases:
        with pytest.raises(error) as info:
            hw.from_flashinfer(cache, *args, **kw)
        assert info.value.field == field, (field, info.value)
    key = hw.from_flashinfer(pool, *ok, kv_role="key")
    assert isinstance(key, hw.BlockPagedTensor)
    with pytest.raises(hwe.ArgumentTypeError):
        hw.to_flashinfer(key, combined=1)  # type: ignore[arg-type]
    with pytest.raises(hwe.InvalidTensorError):
        hw.to_flashinfer(key, combined=True)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31), block=st.sampled_from([1, 4, 16, 32]),
       layout=st.sampled_from(["NHD", "HND"]), combined=st.booleans(),
       dtype=st.sampled_from(DTYPES))  # fmt: skip
def test_tensor_flashinfer_tensor(
    seed: int, block: int, layout: str, combined: bool, dtype: Any
) -> None:
    key, value = pair_of(seed, block, dtype)
    out = hw.to_flashinfer((key, value), kv_layout=layout, combined=combined)
    back = hw.from_flashinfer(*out, kv_layout=layout, layer_index=3)
    assert isinstance(back, tuple)
    for got, want in zip(back, (key, value), strict=True):
        assert all(same(a, b) for a, b in zip(got.sequences(), want.sequences(), strict=True))
        if layout == "NHD" and not combined:
            assert got.descriptor == want.descriptor and same(got.page_pool, want.page_pool)


# -- torch outputs and read-only memory -------------------------------------------------------
def test_engine_outputs_as_torch_keep_the_engine_dtype() -> None:
    torch = pytest.importorskip("torch")
    for dtype, want in ((ml_dtypes.bfloat16, torch.bfloat16),
                        (ml_dtypes.float8_e4m3fn, torch.float8_e4m3fn)):  # fmt: skip
        key, value = pair_of(1, 4, dtype)
        kb, _vb, req, rows, _lens = hw.to_sglang((key, value), as_torch=True)
        assert kb.dtype == want and req.dtype == torch.int32 and rows.dtype == torch.int64
        flat = key.page_pool.reshape(-1, *key.page_pool.shape[2:])
        if not (key.block_table == 0).any():  # page 0 free: the pool itself, as torch
            assert kb.data_ptr() == key.page_pool.ctypes.data
            assert np.array_equal(kb.view(torch.uint8).numpy(), flat.view(np.uint8))
        (kc, vc), indptr, indices, last = hw.to_flashinfer((key, value), as_torch=True)
        assert kc.dtype == want and indptr.dtype == torch.int32
        assert kc.data_ptr() == key.page_pool.ctypes.data  # NHD: shared, not copied
        back = hw.from_flashinfer((kc, vc), indptr, indices, last)
        assert isinstance(back, tuple) and same(back[0].sequence(0), key.sequence(0))


def test_torch_never_aliases_read_only_memory() -> None:
    pytest.importorskip("torch")
    key, _ = pair_of(2, 4, np.float16)
    blob = bytes(hw.encode(key))
    decoded = hw.decode(blob)  # over the immutable bytes object
    assert not decoded.page_pool.flags.writeable
    arrays = hw.to_torch(decoded)
    arrays["page_pool"].fill_(1)  # a copy: the bytes object is untouched
    assert bytes(hw.encode(key)) == blob and hw.decode(blob).page_pool.tobytes() == (
        key.page_pool.tobytes()
    )
    writable = hw.to_torch(key)["page_pool"]
    assert writable.data_ptr() == key.page_pool.ctypes.data  # writable memory: shared


def test_device_and_strided_pools_gather_only_referenced_pages() -> None:
    torch = pytest.importorskip("torch")
    pool = torch.arange(10 * 4 * 2 * 8, dtype=torch.float32).reshape(10, 2, 4, 8).to(torch.float16)
    view = pool.permute(0, 2, 1, 3)  # an HND cache read as NHD pages: strided
    t = hw.BlockPagedTensor.from_arrays(view, [7, 2, 7], [0, 2, 3], seq_lens=[6, 3])
    assert t.layout.num_pages == 2 and t.block_table.tolist() == [0, 1, 0]
    assert same(t.sequence(0), view[[7, 2]].reshape(8, 2, 8)[:6].numpy())
    meta = pool.to("meta")  # a device tensor: never brought to host whole (meta cannot be)
    with pytest.raises(hwe.IndexBufferError):
        hw.BlockPagedTensor.from_arrays(meta.permute(0, 2, 1, 3), [10], [0, 1])


@pytest.mark.parametrize("width", [656, 132 * 4, 132 * 2 + 128])
def test_sglang_dsa_fp8_mla_rows_are_refused(width: int) -> None:
    """SGLang's DSA fp8 MLA row packs fp8 values, float32 scales and bf16 rope
    (calculate_mla_kv_cache_dim): refused by name, never carried as plain float8."""
    req = np.zeros((3, 40), np.int32)
    req[2, :20] = np.r_[64:84]
    raw = np.zeros((4 * 64, 1, width), np.uint8)
    for buffer, dtype in (
        (raw, ml_dtypes.float8_e4m3fn),
        (raw.view(ml_dtypes.float8_e4m3fn), None),
    ):
        with pytest.raises(
            hwe.InvalidTensorError, match=r"DSA fp8 MLA pool .* not supported"
        ) as info:
            hw.from_sglang_mla(buffer, req, [2], [20], page_size=64, dtype=dtype)
        assert info.value.field == "kv_buffer"
    # the plain fp8 latent (kv_lora_rank + qk_rope_head_dim = 576) and a bf16 DSA row are read
    for plain, dtype in ((np.zeros((256, 1, 576), np.uint8), ml_dtypes.float8_e4m3fn),
                         (np.zeros((256, 1, width), ml_dtypes.bfloat16), None)):  # fmt: skip
        assert hw.from_sglang_mla(plain, req, [2], [20], page_size=64, dtype=dtype).shape[0] == 20
