"""Helpers on any tensor: sequences, select, dequantize, compact, prefix sharing, repage,
head re-sharding, kv_scale; each against a loop reference on random inputs."""

from __future__ import annotations

import struct
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import hurray_wire as hw
from tests.adapter_reference import (
    random_batch,
    random_values,
    ref_dequantize,
    ref_sequences,
    ref_tensor_sequences,
)


def same(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is None and b is None
    a, b = np.asarray(a), np.asarray(b)
    if a.size == 0 and b.size == 0:
        return True
    return a.shape == b.shape and bool(np.array_equal(a.view(np.uint8), b.view(np.uint8)))


def tensor_of(seed: int, **kw: Any) -> hw.BlockPagedTensor:
    b = random_batch(np.random.default_rng(seed), **kw)
    return hw.BlockPagedTensor.from_arrays(
        b.pool,
        b.block_table(),
        b.seq_ptr(),
        seq_lens=b.lens,
        kv_role="value",
        layer_index=5,
        metadata={"model": "m"},
    )


def sharing_pairs(tensor: hw.BlockPagedTensor) -> set[tuple[int, int]]:
    bt = tensor.block_table.tolist()
    return {(i, j) for i in range(len(bt)) for j in range(len(bt)) if bt[i] == bt[j]}


def quantized(
    seed: int,
    scheme: str,
    storage: Any = np.int8,
    scale_type: Any = hw.float32,
    asym: bool = True,
    page_size: int = 16,
) -> hw.BlockPagedTensor:
    rng = np.random.default_rng(seed)
    b = random_batch(rng, num_pages=10, page_size=page_size, heads=4, head_dim=8, dtype=storage)
    common: dict[str, Any] = {"seq_lens": b.lens, "layer_index": 1}
    pages = b.pool.shape[0] * page_size
    if scheme == "tensor":
        q: Any = hw.PerTensorAffine(0.125, 3 if asym else 0)
        extra: dict[str, Any] = {}
    elif scheme.startswith("channel"):
        axis = int(scheme[-1])
        n = int(b.pool.shape[1 + axis])
        q = hw.PerChannelAffine(axis, 3, 4 if asym else None)
        extra = {"scales": rng.uniform(0.01, 2, n).astype(np.float32)}
        if asym:
            extra["zero_points"] = rng.integers(-5, 5, n).astype(np.int32)
    else:
        q = hw.PerBlockAffine(0, page_size, 3, scale_type, 3 if asym else None)
        extra = {"scales": rng.uniform(0.01, 2, pages).astype(scale_type.numpy_dtype)}
        if asym:
            extra["zero_points"] = rng.integers(-5, 5, pages).astype(np.int32)
    return hw.BlockPagedTensor.from_arrays(
        b.pool, b.block_table(), b.seq_ptr(), quantization=q, element_type=None, **common, **extra
    )


SCHEMES = ["tensor", "channel1", "channel2", "block"]


# -- sequence / sequences / select ------------------------------------------------------------
@pytest.mark.parametrize("seed", range(6))
def test_sequences_match_the_loop_reference(seed: int) -> None:
    t = tensor_of(seed, page_size=[4, 16, 32][seed % 3], heads=2, head_dim=64)
    expected = ref_tensor_sequences(t)
    assert all(same(a, b) for a, b in zip(t.sequences(), expected, strict=True))
    for s in range(t.num_seqs):
        assert same(t.sequence(s), expected[s])
        assert same(t.sequence(np.int64(s)), expected[s])


def test_sequence_refuses() -> None:
    t = tensor_of(0)
    for bad in (True, "0", 0.0, None, [0]):
        with pytest.raises(hw.errors.ArgumentTypeError):
            t.sequence(bad)  # type: ignore[arg-type]
    for bad in (-1, t.num_seqs, 2**70):
        with pytest.raises(hw.errors.InvalidTensorError):
            t.sequence(bad)
    with pytest.raises(hw.errors.ArgumentTypeError):
        t.sequence(0, dequantize=1)  # type: ignore[arg-type]
    bare = hw.BlockPagedTensor.from_arrays(t.page_pool, t.block_table, t.seq_ptr)
    with pytest.raises(hw.errors.InvalidTensorError, match="seq_lens"):
        bare.sequence(0)
    with pytest.raises(hw.errors.InvalidTensorError, match="seq_lens"):
        bare.sequences()


@pytest.mark.parametrize("ids", [[2, 0], [1], [], [3, 3, 0], np.array([1, 2], np.uint8)])
def test_select(ids: Any) -> None:
    t = tensor_of(3, num_seqs=4)
    sub = t.select(ids)
    assert sub.num_seqs == len(ids) and np.shares_memory(sub.page_pool, t.page_pool)
    full = ref_tensor_sequences(t)
    assert all(same(a, full[i]) for a, i in zip(sub.sequences(), list(ids), strict=True))
    assert (sub.kv_role, sub.layer_index, sub.metadata) == ("value", 5, {"model": "m"})


def test_select_refuses() -> None:
    t = tensor_of(3, num_seqs=4)
    for bad in (1, "01", [True], [0.5], np.array([0.0]), np.zeros((1, 1), int), [None]):
        with pytest.raises(hw.errors.ArgumentTypeError):
            t.select(bad)
    for bad_ids in ([4], [-1], [0, 9]):
        with pytest.raises(hw.errors.InvalidTensorError):
            t.select(bad_ids)


# -- dequantize -------------------------------------------------------------------------------
@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("asym", [True, False])
def test_dequantize_matches_the_spec_formulas(scheme: str, asym: bool) -> None:
    t = quantized(7, scheme, asym=asym)
    expected = ref_dequantize(t)
    assert same(t.dequantize(), expected)
    assert same(t.dequantize(np.float64), expected.astype(np.float64))
    lens = t.seq_lens.tolist() if t.seq_lens is not None else []
    pages = [t.block_table[t.seq_ptr[s] : t.seq_ptr[s + 1]].tolist() for s in range(t.num_seqs)]
    for s, want in enumerate(ref_sequences(expected, pages, lens)):
        assert same(t.sequence(s, dequantize=True), want)
        assert same(t.sequences(dequantize=True)[s], want)


@pytest.mark.parametrize("scale_type", [hw.float16, hw.bfloat16, hw.float32])
@pytest.mark.parametrize("storage", [np.int8, np.uint8, ml_dtypes.int4, ml_dtypes.uint4])
def test_dequantize_per_block_scale_types_and_storage(scale_type: Any, storage: Any) -> None:
    t = quantized(8, "block", storage=storage, scale_type=scale_type, page_size=8)
    assert same(t.dequantize(), ref_dequantize(t))


def test_dequantize_fp8_with_kv_scale_and_plain() -> None:
    rng = np.random.default_rng(2)
    pool = random_values(rng, (3, 16, 2, 64), ml_dtypes.float8_e4m3fn)
    t = hw.BlockPagedTensor.from_arrays(pool, [2, 0], [0, 2], seq_lens=[20], kv_scale=0.0625)
    assert t.kv_scale == 0.0625 and t.metadata["hurray.k_scale"] == 0.0625
    assert same(t.dequantize(), pool.astype(np.float32) * np.float32(0.0625))
    assert same(t.dequantize(), ref_dequantize(t))
    plain = hw.BlockPagedTensor.from_arrays(pool.astype(np.float16), [2, 0], [0, 2])
    assert plain.kv_scale is None and same(plain.dequantize(), pool.astype(np.float32))
    for bad in (np.int32, "float8", object, None):
        with pytest.raises(hw.errors.ArgumentTypeError):
            t.dequantize(bad)
    cplx = hw.BlockPagedTensor.from_arrays(np.zeros((1, 2, 1, 1), np.complex64), [0], [0, 1])
    with pytest.raises(hw.errors.InvalidTensorError):
        cplx.dequantize()


# -- kv_scale ---------------------------------------------------------------------------------
def test_kv_scale_is_validated_on_construction_and_decode() -> None:
    pool = np.zeros((2, 4, 1, 8), ml_dtypes.float8_e5m2)
    v = hw.BlockPagedTensor.from_arrays(pool, [1], [0, 1], kv_role="value", kv_scale=2)
    assert v.kv_scale == 2.0 and v.metadata == {"hurray.v_scale": 2.0}
    assert hw.decode(hw.encode(v)).kv_scale == 2.0
    for bad, error in (
        (0.0, hw.errors.InvalidMetadataError),
        (-1.0, hw.errors.InvalidMetadataError),
        (float("nan"), hw.errors.InvalidMetadataError),
        (float("inf"), hw.errors.InvalidMetadataError),
        (True, hw.errors.ArgumentTypeError),
        ("0.5", hw.errors.ArgumentTypeError),
    ):
        with pytest.raises(error):
            hw.BlockPagedTensor.from_arrays(pool, [1], [0, 1], kv_scale=bad)  # type: ignore[arg-type]
    for meta in (
        {"hurray.k_scale": 1},
        {"hurray.k_scale": "1"},
        {"hurray.v_scale": 0.5},
        {"hurray.k_scale": -0.5},
    ):
        with pytest.raises(hw.errors.InvalidMetadataError):
            hw.BlockPagedTensor.from_arrays(pool, [1], [0, 1], metadata=meta)
    with pytest.raises(hw.errors.InvalidMetadataError):
        hw.BlockPagedTensor.from_arrays(
            pool, [1], [0, 1], kv_scale=0.5, metadata={"hurray.k_scale": 0.25}
        )
    key = hw.BlockPagedTensor.from_arrays(pool, [1], [0, 1], kv_scale=0.5)
    blob = bytes(hw.encode(key, checksum=False))
    good = struct.pack("<d", 0.5)
    assert blob.count(good) == 1
    for value in (-0.5, 0.0, float("nan")):
        with pytest.raises(hw.errors.InvalidMetadataError):
            hw.decode(blob.replace(good, struct.pack("<d", value)))


# -- compact / prefix sharing -------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(8))
def test_compact(seed: int) -> None:
    t = tensor_of(seed, num_pages=40, num_seqs=5)
    c = t.compact()
    assert c.layout.num_pages == len(set(t.block_table.tolist()))
    assert all(same(a, b) for a, b in zip(c.sequences(), t.sequences(), strict=True))
    assert sharing_pairs(c) == sharing_pairs(t)
    seen: list[int] = []  # first-reference order: new ids appear as 0, 1, 2, ...
    for page in c.block_table.tolist():
        if page not in seen:
            seen.append(page)
    assert seen == list(range(len(seen)))
    assert same(c.compact().page_pool, c.page_pool) and same(c.compact().block_table, c.block_table)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_compact_carries_scales(scheme: str) -> None:
    t = quantized(4, scheme)
    c = t.compact()
    for a, b in zip(c.sequences(dequantize=True), t.sequences(dequantize=True), strict=True):
        assert same(a, b)
    assert c.quantization == t.quantization


def test_prefix_sharing_matches_a_loop() -> None:
    for seed in range(10):
        t = tensor_of(seed, num_seqs=6)
        bt, sp = t.block_table.tolist(), t.seq_ptr.tolist()
        expected: dict[int, set[int]] = {}
        for page in set(bt):
            if bt.count(page) >= 2:
                expected[page] = {s for s in range(t.num_seqs) if page in bt[sp[s] : sp[s + 1]]}
        got = t.prefix_sharing()
        assert {p: set(s) for p, s in got.items()} == expected
        assert all(list(s) == sorted(s) for s in got.values())
    same_seq = hw.BlockPagedTensor.from_arrays(np.zeros((2, 1, 1, 1)), [1, 1], [0, 2])
    assert same_seq.prefix_sharing() == {1: (0,)}
    empty = hw.BlockPagedTensor.from_arrays(np.zeros((2, 1, 1, 1)), [], [0])
    assert empty.prefix_sharing() == {}
    wide = hw.BlockPagedTensor.from_arrays(  # uint64 seq_ptr: NumPy refused its diff as counts
        np.zeros((2, 1, 1, 1)), [1, 1, 0], [0, 1, 3], block_table_index_type="uint64"
    )
    assert wide.prefix_sharing() == {1: (0, 1)}


# -- repage -----------------------------------------------------------------------------------
def shared_new_pages_expected(t: hw.BlockPagedTensor, size: int) -> list[tuple[int, int, int, int]]:
    """(s, j, s2, j2) of new pages wholly covered by the same source slots: must be shared."""
    lens = (
        t.seq_lens.tolist()
        if t.seq_lens is not None
        else [
            (int(t.seq_ptr[s + 1]) - int(t.seq_ptr[s])) * t.layout.page_size
            for s in range(t.num_seqs)
        ]
    )
    p = t.layout.page_size
    slot_lists = {}
    for s in range(t.num_seqs):
        row = t.block_table[t.seq_ptr[s] : t.seq_ptr[s + 1]].tolist()
        for j in range(-(-lens[s] // size)):
            toks = range(j * size, min((j + 1) * size, lens[s]))
            slot_lists[(s, j)] = (len(toks), tuple(row[x // p] * p + x % p for x in toks))
    keys = list(slot_lists)
    return [
        (a[0], a[1], b[0], b[1])
        for a in keys
        for b in keys
        if a < b and slot_lists[a] == slot_lists[b] and slot_lists[a][0] == size
    ]


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    src=st.sampled_from([1, 2, 4, 16, 32]),
    dst=st.sampled_from([1, 3, 4, 8, 16, 32, 64, 5]),
    full=st.booleans(),
)
def test_repage_keeps_tokens_and_sharing(seed: int, src: int, dst: int, full: bool) -> None:
    t = tensor_of(seed, page_size=src, num_pages=20, heads=2, head_dim=4, num_seqs=5)
    if full:  # no seq_lens: every page counts as full
        t = hw.BlockPagedTensor.from_arrays(t.page_pool, t.block_table, t.seq_ptr)
    r = t.repage(dst)
    assert r.layout.page_size == dst
    assert all(
        same(a, b) for a, b in zip(ref_tensor_sequences(r), ref_tensor_sequences(t), strict=True)
    )
    new_bt, new_sp = r.block_table.tolist(), r.seq_ptr.tolist()
    for s, j, s2, j2 in shared_new_pages_expected(t, dst):
        assert new_bt[new_sp[s] + j] == new_bt[new_sp[s2] + j2]
    back = r.repage(src)
    assert all(
        same(a, b) for a, b in zip(ref_tensor_sequences(back), ref_tensor_sequences(t), strict=True)
    )


def test_repage_32_16_round_trip_keeps_shared_prefix() -> None:
    rng = np.random.default_rng(0)
    pool = random_values(rng, (8, 16, 8, 128), np.float16)
    t = hw.BlockPagedTensor.from_arrays(pool, [0, 1, 2, 0, 1, 3, 4], [0, 3, 7], seq_lens=[40, 60])
    r = t.repage(32)
    assert r.block_table.tolist()[0] == r.block_table.tolist()[2]  # pages 0+1 shared -> one page
    back = r.repage(16)
    assert all(same(a, b) for a, b in zip(back.sequences(), t.sequences(), strict=True))
    assert back.block_table[0] == back.block_table[3] and back.block_table[1] == back.block_table[4]
    assert t.repage(16).layout.num_pages == 5


def test_repage_keeps_a_partial_page_that_another_sequence_fills_shared() -> None:
    pool = random_values(np.random.default_rng(3), (4, 16, 1, 8), np.float16)
    t = hw.BlockPagedTensor.from_arrays(pool, [0, 1, 0, 1, 2], [0, 2, 5], seq_lens=[20, 40])
    r = t.repage(32)
    assert r.block_table.tolist() == [0, 0, 1] and r.prefix_sharing() == {0: (0, 1)}
    assert all(same(a, b) for a, b in zip(r.sequences(), t.sequences(), strict=True))
    assert not r.page_pool[1, 16:].any()  # past seq 1's source capacity: zero
    assert r.repage(16).block_table.tolist() == [0, 1, 0, 1, 2]


@pytest.mark.parametrize("asym", [True, False])
def test_repage_per_block_scales_move_with_their_tokens(asym: bool) -> None:
    t = quantized(5, "block", asym=asym, page_size=16)
    for size in (4, 32, 64):
        r = t.repage(size)
        assert isinstance(r.quantization, hw.PerBlockAffine)
        assert r.quantization.block_size == size
        for a, b in zip(r.sequences(dequantize=True), t.sequences(dequantize=True), strict=True):
            assert same(a, b)
    for bad in (3, 1, 24):
        with pytest.raises(hw.errors.InvalidTensorError):
            t.repage(bad)
    for scheme in ("tensor", "channel1"):
        q = quantized(5, scheme)
        for a, b in zip(
            q.repage(5).sequences(dequantize=True), q.sequences(dequantize=True), strict=True
        ):
            assert same(a, b)


def test_repage_refuses() -> None:
    t = tensor_of(1)
    for bad in (0, -4):
        with pytest.raises(hw.errors.InvalidTensorError):
            t.repage(bad)
    for bad_type in (True, 2.0, "8", None):
        with pytest.raises(hw.errors.ArgumentTypeError):
            t.repage(bad_type)  # type: ignore[arg-type]


# -- heads ------------------------------------------------------------------------------------
@pytest.mark.parametrize(("heads", "n"), [(8, 1), (8, 2), (8, 4), (8, 8), (2, 4), (1, 8), (4, 8)])
def test_split_and_merge_heads(heads: int, n: int) -> None:
    t = tensor_of(heads * n, heads=heads, head_dim=16, page_size=16)
    shards = t.split_heads(n)
    assert len(shards) == n
    for r, shard in enumerate(shards):
        if n <= heads:
            want = list(range(r * heads // n, (r + 1) * heads // n))
        else:
            want = [r // (n // heads)]
        for a, b in zip(shard.sequences(), ref_tensor_sequences(t), strict=True):
            assert same(a, b[:, want])
        assert same(shard.block_table, t.block_table) and shard.metadata == t.metadata
    merged = hw.merge_heads(shards, num_heads=heads)
    assert same(merged.page_pool, t.page_pool) and merged.descriptor == t.descriptor
    if n <= heads:
        assert hw.merge_heads(shards).descriptor == t.descriptor


@pytest.mark.parametrize("scheme", SCHEMES)
def test_split_heads_keeps_scales_per_slice(scheme: str) -> None:
    t = quantized(9, scheme)
    shards = t.split_heads(2)
    full = t.sequences(dequantize=True)
    for r, shard in enumerate(shards):
        for a, b in zip(shard.sequences(dequantize=True), full, strict=True):
            assert same(a, b[:, r * 2 : r * 2 + 2])
    merged = hw.merge_heads(shards)
    assert merged.descriptor == t.descriptor and same(merged.scales, t.scales)
    rep = t.split_heads(8)
    assert hw.merge_heads(rep, num_heads=4).descriptor == t.descriptor


def test_split_and_merge_refuse() -> None:
    t = tensor_of(2, heads=4, head_dim=8)
    for bad in (3, 6, 0):
        with pytest.raises(hw.errors.InvalidTensorError):
            t.split_heads(bad)
    for bad_type in (True, 2.0):
        with pytest.raises(hw.errors.ArgumentTypeError):
            t.split_heads(bad_type)  # type: ignore[arg-type]
    a, b = t.split_heads(2)
    other = tensor_of(3, heads=2, head_dim=8)
    with pytest.raises(hw.errors.InvalidTensorError):
        hw.merge_heads([a, other])
    with pytest.raises(hw.errors.InvalidTensorError):
        hw.merge_heads([])
    with pytest.raises(hw.errors.ArgumentTypeError):
        hw.merge_heads(a)  # type: ignore[arg-type]
    with pytest.raises(hw.errors.ArgumentTypeError):
        hw.merge_heads([a, "b"])  # type: ignore[type-var]
    with pytest.raises(hw.errors.InvalidTensorError):
        hw.merge_heads([a, b], num_heads=1)  # two-head shards are not replicas
    r0, r1, r2, r3 = t.split_heads(1)[0].split_heads(4)
    one = t.split_heads(8)
    with pytest.raises(hw.errors.InvalidTensorError, match="replicate"):
        hw.merge_heads([one[0], one[2], one[2], one[4]], num_heads=2)
    with pytest.raises(hw.errors.InvalidTensorError):
        hw.merge_heads(one, num_heads=3)
    meta = hw.BlockPagedTensor.from_arrays(
        b.page_pool,
        b.block_table,
        b.seq_ptr,
        seq_lens=b.seq_lens,
        kv_role="value",
        layer_index=5,
        metadata={"model": "other"},
    )
    with pytest.raises(hw.errors.InvalidTensorError, match="metadata"):
        hw.merge_heads([a, meta])
    assert r0.shape[1] == 1 and r3.shape[1] == 1 and r1 is not r2


def test_encode_compact_keyword_on_every_encoder() -> None:
    t = tensor_of(4, num_pages=40)
    want = bytes(hw.encode(t.compact()))
    assert bytes(hw.encode(t, compact=True)) == want
    assert b"".join(hw.encode_parts(t, compact=True)) == want
    out = bytearray(len(want))
    assert hw.encode_into(t, out, compact=True) == len(want) and bytes(out) == want
    assert len(hw.encode(t)) > len(want)


# -- properties over quantized tensors of every scheme and sub-byte storage ---------------------
STORAGE = [hw.int8, hw.uint8, hw.int4, hw.uint4, hw.int2, hw.uint2, hw.int16]


@st.composite
def quantized_tensors(draw: st.DrawFn) -> hw.BlockPagedTensor:
    """Random integer pools with any scheme the spec admits on block-paged, shared pages,
    partial last pages and empty sequences."""
    from hurray_wire.testing import strategies as hs

    etype = draw(st.sampled_from(STORAGE))
    page_size = draw(st.sampled_from([2, 4, 8]))
    pages, heads, dim = draw(st.integers(1, 6)), draw(st.sampled_from([1, 2, 4])), 3
    seed = draw(st.integers(0, 2**31))
    rng = np.random.default_rng(seed)
    b = random_batch(
        rng,
        num_pages=pages,
        page_size=page_size,
        heads=heads,
        head_dim=dim,
        dtype=etype.numpy_dtype,
        num_seqs=draw(st.integers(0, 4)),
    )
    kinds = ["none", "tensor", "channel"] + (["block"] if etype in STORAGE[:6] else [])
    kind = draw(st.sampled_from(kinds))
    extra: dict[str, Any] = {}
    quant: Any = None
    if kind == "tensor":
        quant = draw(hs.per_tensor_affine(etype))
    elif kind in ("channel", "block"):
        quant = draw(
            hs.per_channel_affine() if kind == "channel" else hs.per_block_affine(page_size)
        )
        n = pages * page_size if kind == "block" else (heads, dim)[quant.axis - 1]
        scale_dtype = quant.scale_type.numpy_dtype
        extra["scales"] = rng.uniform(0.05, 4, n).astype(scale_dtype)
        if quant.zero_point_buffer_index is not None:
            extra["zero_points"] = rng.integers(-3, 3, n).astype(np.int32)
    return hw.BlockPagedTensor.from_arrays(
        b.pool,
        b.block_table(),
        b.seq_ptr(),
        seq_lens=b.lens,
        quantization=quant,
        element_type=etype,
        **extra,
    )


def real_sequences(t: hw.BlockPagedTensor) -> list[Any]:
    return t.sequences(dequantize=True)


@settings(max_examples=60, deadline=None)
@given(t=quantized_tensors())
def test_transforms_keep_real_values_and_encode(t: hw.BlockPagedTensor) -> None:
    want = real_sequences(t)
    full = ref_dequantize(t)
    assert same(t.dequantize(), full)
    size = t.layout.page_size
    for out in (
        t.compact(),
        t.repage(size * 2).repage(size),
        t.repage(size // 2 if size > 2 else 4),
        t.select(list(range(t.num_seqs))[::-1]).select(list(range(t.num_seqs))[::-1]),
    ):
        got = real_sequences(out)
        assert len(got) == len(want)
        assert all(same(a, b) for a, b in zip(got, want, strict=True))
        decoded = hw.decode(hw.encode(out))
        assert decoded.descriptor == out.descriptor
        assert all(same(a, b) for a, b in zip(real_sequences(decoded), want, strict=True))
    for n in (1, 2, 4, 8):
        if t.shape[1] % n == 0 or n % t.shape[1] == 0:
            merged = hw.merge_heads(t.split_heads(n), num_heads=t.shape[1])
            assert merged.descriptor == t.descriptor
            assert same(merged.page_pool, t.page_pool) and same(merged.scales, t.scales)
            assert same(merged.zero_points, t.zero_points)
