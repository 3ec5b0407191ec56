"""The delta protocol: known-pages and page-refs records, planning, filling from a store."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import xxhash
from hypothesis import given, settings, strategies as st

import hurray_wire as hw
from hurray_wire.errors import (
    ArgumentTypeError,
    HurrayWireError,
    IntegrityRecordTruncatedError,
    InvalidIntegrityRecordError,
    PageDigestError,
    PageStoreMissError,
)
from hurray_wire.integrity import (
    MemoryPageStore,
    PageRefs,
    PageStore,
    decode_known_pages,
    decode_page_refs,
    encode_known_pages,
    encode_page_refs,
    fill_from_store,
    gather_sent,
    page_digests,
    place_sent_pages,
    plan_delta,
    store_pages,
)
from hurray_wire.wire import integrity as w

GOLDEN_KNOWN = (
    b"HWKP\x01\x00\x01\x00"  # magic, version 1, form 0 (sorted), xxh3_64, reserved
    b"\x02\x00\x00\x00\x00\x00\x00\x00"  # count 2, reserved
    b"\x01\x00\x00\x00\x00\x00\x00\x00"
    b"\xff\xff\xff\xff\xff\xff\xff\xff"
    b" \xa9\x98*\xdf\xfa\x16\xbd"  # xxh3_64 of the 32 bytes before
)
GOLDEN_KNOWN_EMPTY = (
    b"HWKP\x01\x00\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x06g\x08\xd5\xa8\xc6^\xf7"
)
GOLDEN_REFS = (
    b"\x01\x01\x00\x00\x02\x00\x00\x00"  # version 1, xxh3_64, reserved, count 2
    b"\x01\x00\x00\x00\x00\x00\x00\x00\x04\x00\x00\x00\x00\x00\x00\x00"  # pages 1, 4
    b"\x0a\x00\x00\x00\x00\x00\x00\x00\x0b\x00\x00\x00\x00\x00\x00\x00"  # digests 10, 11
)


def u64(*values: int) -> np.ndarray:
    return np.array(values, np.uint64)


def test_struct_sizes() -> None:
    assert w.KNOWN_PAGES_HEADER.sizeof() == 16
    assert w.PAGE_REFS_HEADER.sizeof() == w.DIGEST_SECTION_HEADER.sizeof() == 8
    assert w.FINGERPRINT_HEADER.sizeof() == 24
    assert (w.KIND_PAGE_DIGESTS, w.KIND_PAGE_REFS) == (0x04, 0x05)


# -- known pages ---------------------------------------------------------------------------


def test_known_pages_golden() -> None:
    assert encode_known_pages(u64(2**64 - 1, 1, 1)) == GOLDEN_KNOWN  # sorted, deduplicated
    assert decode_known_pages(GOLDEN_KNOWN, max_entries=2).tolist() == [1, 2**64 - 1]
    assert encode_known_pages(u64()) == GOLDEN_KNOWN_EMPTY
    assert decode_known_pages(GOLDEN_KNOWN_EMPTY, max_entries=0).size == 0


def test_known_pages_result_is_owned() -> None:
    data = bytearray(GOLDEN_KNOWN)
    values = decode_known_pages(data, max_entries=2)
    data[16] = 9
    assert values.tolist() == [1, 2**64 - 1] and values.flags.writeable


@pytest.mark.parametrize("cut", range(len(GOLDEN_KNOWN)))
def test_known_pages_truncated_at_every_byte(cut: int) -> None:
    with pytest.raises(IntegrityRecordTruncatedError):
        decode_known_pages(GOLDEN_KNOWN[:cut], max_entries=10)


@pytest.mark.parametrize("at", range(len(GOLDEN_KNOWN)))
def test_known_pages_flipped_byte(at: int) -> None:
    data = bytearray(GOLDEN_KNOWN)
    data[at] ^= 0x10
    with pytest.raises(InvalidIntegrityRecordError):
        decode_known_pages(bytes(data), max_entries=10**6)


def _known_record(head_count: int, values: list[int]) -> bytes:
    body = (
        b"HWKP\x01\x00\x01\x00"
        + head_count.to_bytes(4, "little")
        + bytes(4)
        + np.array(values, "<u8").tobytes()
    )
    return body + xxhash.xxh3_64_intdigest(body).to_bytes(8, "little")


@pytest.mark.parametrize("values", [[2, 1], [1, 1], [0, 5, 5, 6]])
def test_known_pages_unsorted_or_duplicate(values: list[int]) -> None:
    with pytest.raises(InvalidIntegrityRecordError, match="strictly increasing") as info:
        decode_known_pages(_known_record(len(values), values), max_entries=10)
    bad = next(i for i in range(1, len(values)) if values[i] <= values[i - 1])
    assert info.value.offset == 16 + 8 * bad


def test_known_pages_limits_before_reading() -> None:
    huge = b"HWKP\x01\x00\x01\x00\xff\xff\xff\xff\x00\x00\x00\x00"  # 4 billion, no data
    with pytest.raises(InvalidIntegrityRecordError, match="max_entries") as info:
        decode_known_pages(huge, max_entries=1000)
    assert info.value.offset == 8 and info.value.found == 2**32 - 1
    with pytest.raises(InvalidIntegrityRecordError, match="max_entries"):
        decode_known_pages(GOLDEN_KNOWN, max_entries=1)
    with pytest.raises(IntegrityRecordTruncatedError):
        decode_known_pages(huge, max_entries=2**32)


def test_known_pages_count_mismatch_and_trailing() -> None:
    with pytest.raises(InvalidIntegrityRecordError, match="trailing"):
        decode_known_pages(_known_record(1, [1, 2]), max_entries=10)
    with pytest.raises(InvalidIntegrityRecordError, match="trailing"):
        decode_known_pages(GOLDEN_KNOWN + b"\0", max_entries=10)
    with pytest.raises(IntegrityRecordTruncatedError):
        decode_known_pages(_known_record(3, [1, 2]), max_entries=10)


@pytest.mark.parametrize(
    ("at", "value", "field"),
    [
        (4, 2, "version"),
        (5, 1, "form"),
        (6, 2, "algorithm"),
        (7, 1, "_reserved0"),
        (12, 1, "_reserved1"),
        (0, ord("X"), "magic"),
    ],
)
def test_known_pages_head_fields(at: int, value: int, field: str) -> None:
    data = bytearray(GOLDEN_KNOWN)
    data[at] = value
    with pytest.raises(InvalidIntegrityRecordError) as info:
        decode_known_pages(bytes(data), max_entries=10)
    assert info.value.field == field


def test_known_pages_argument_errors() -> None:
    for bad in (-1, None, True):
        with pytest.raises(ArgumentTypeError, match="max_entries"):
            decode_known_pages(GOLDEN_KNOWN, max_entries=bad)  # type: ignore[arg-type]
    with pytest.raises(ArgumentTypeError):
        decode_known_pages("HWKP", max_entries=1)
    with pytest.raises(ArgumentTypeError):
        encode_known_pages([1, 2])


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 2**64 - 1), max_size=30))
def test_known_pages_round_trip(values: list[int]) -> None:
    data = encode_known_pages(np.array(values, np.uint64))
    assert decode_known_pages(data, max_entries=len(values)).tolist() == sorted(set(values))


# -- page refs -----------------------------------------------------------------------------


def test_page_refs_golden() -> None:
    refs = PageRefs(np.array([1, 4]), u64(10, 11))
    assert encode_page_refs(refs) == GOLDEN_REFS
    back = decode_page_refs(GOLDEN_REFS, 5)
    assert back.pages.tolist() == [1, 4] and back.digests.tolist() == [10, 11]
    assert back.sent_pages(5).tolist() == [0, 2, 3]
    assert encode_page_refs(back) == GOLDEN_REFS


@pytest.mark.parametrize("cut", range(len(GOLDEN_REFS)))
def test_page_refs_truncated_at_every_byte(cut: int) -> None:
    with pytest.raises(IntegrityRecordTruncatedError) as info:
        decode_page_refs(GOLDEN_REFS[:cut], 5, base_offset=512)
    assert info.value.offset == 512 + cut


def test_page_refs_rejections() -> None:
    with pytest.raises(InvalidIntegrityRecordError, match="more page refs"):
        decode_page_refs(GOLDEN_REFS, 1)
    with pytest.raises(InvalidIntegrityRecordError, match="out of range") as info:
        decode_page_refs(GOLDEN_REFS, 4, base_offset=64)
    assert info.value.offset == 64 + 16
    swapped = GOLDEN_REFS[:8] + GOLDEN_REFS[16:24] + GOLDEN_REFS[8:16] + GOLDEN_REFS[24:]
    with pytest.raises(InvalidIntegrityRecordError, match="increasing"):
        decode_page_refs(swapped, 5)
    with pytest.raises(InvalidIntegrityRecordError, match="trailing"):
        decode_page_refs(GOLDEN_REFS + bytes(8), 5)
    with pytest.raises(InvalidIntegrityRecordError, match="version"):
        decode_page_refs(b"\x02" + GOLDEN_REFS[1:], 5)
    with pytest.raises(ArgumentTypeError):
        encode_page_refs((1, 2))  # type: ignore[arg-type]
    with pytest.raises(InvalidIntegrityRecordError):
        encode_page_refs(PageRefs(np.array([1, 2]), u64(1)))


@pytest.mark.parametrize(
    ("pages", "digests", "error"),
    [
        (np.array([2, 1]), u64(1, 2), InvalidIntegrityRecordError),
        (np.array([1, 1]), u64(1, 2), InvalidIntegrityRecordError),
        (np.array([-1, 1]), u64(1, 2), InvalidIntegrityRecordError),
        (np.array([1.0]), u64(1), ArgumentTypeError),
        ([1], u64(1), ArgumentTypeError),
        (np.array([1]), np.array([1], np.int64), ArgumentTypeError),
    ],
)
def test_page_refs_validate_on_construction(pages: Any, digests: Any, error: type) -> None:
    with pytest.raises(error, match="refs"):
        PageRefs(pages, digests)


# -- plan, send, fill ----------------------------------------------------------------------


def tensor(pool: np.ndarray, **kw: Any) -> hw.BlockPagedTensor:
    return hw.BlockPagedTensor.from_arrays(pool, [0, 1, 0, 2, 3], [0, 2, 5], seq_lens=[8, 10], **kw)


def pool_of(seed: int, pages: int = 5) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((pages, 4, 2, 8)).astype(np.float16)


def quantized(seed: int) -> hw.BlockPagedTensor:
    rng = np.random.default_rng(seed)
    pool = rng.integers(-100, 100, (5, 4, 2, 8), dtype=np.int8)
    return tensor(
        pool,
        quantization=hw.PerBlockAffine(0, 4, 3, hw.float16, 4),
        scales=rng.uniform(0.1, 1, 20).astype(np.float16),
        zero_points=rng.integers(-3, 3, 20).astype(np.int32),
    )


def transfer(t: hw.BlockPagedTensor, store: PageStore) -> tuple[np.ndarray, Any, Any]:
    """Sender plans against the receiver's store; receiver rebuilds the pool and params."""
    known = decode_known_pages(encode_known_pages(store.digests()), max_entries=1000)
    plan = plan_delta(t, known)
    refs = decode_page_refs(encode_page_refs(plan.refs), t.layout.num_pages)
    sent = gather_sent(t, plan)
    pool = np.full_like(t.page_pool, 0)
    scales = None if t.scales is None else np.zeros_like(t.scales)
    zps = None if t.zero_points is None else np.zeros_like(t.zero_points)
    place_sent_pages(refs, sent, pool, out_scales=scales, out_zero_points=zps)
    fill_from_store(refs, store, pool, out_scales=scales, out_zero_points=zps)
    return pool, scales, zps


def test_plan_sends_only_unknown_pages() -> None:
    pool = pool_of(0)
    t = tensor(pool)
    store = MemoryPageStore(10_000)
    store_pages(store, t, [0, 2])
    plan = plan_delta(t, store.digests())
    assert plan.refs.pages.tolist() == [0, 2]
    assert plan.sent_pages.tolist() == [1, 3, 4]
    assert plan.refs.digests.tolist() == page_digests(t)[[0, 2]].tolist()
    assert plan.record_nbytes == 128
    assert (plan.bytes_sent, plan.bytes_referenced) == (384, 256)
    assert plan.sent_fraction == pytest.approx(0.6)
    assert np.array_equal(gather_sent(t, plan).pool, pool.reshape(5, -1).view(np.uint8)[[1, 3, 4]])
    same = plan_delta(t, store.digests(), digests=plan.digests)
    assert same.sent_pages.tolist() == plan.sent_pages.tolist()
    assert plan_delta(t, u64()).sent_pages.tolist() == [0, 1, 2, 3, 4]


def test_round_trip_through_a_store() -> None:
    t = tensor(pool_of(1))
    store = MemoryPageStore(10_000)
    store_pages(store, t, [1, 3])
    pool, _, _ = transfer(t, store)
    assert np.array_equal(pool.view(np.uint16), t.page_pool.view(np.uint16))


def test_round_trip_quantized_takes_params_from_the_store() -> None:
    t = quantized(2)
    store = MemoryPageStore(10_000)
    store_pages(store, t, [0, 4])
    pool, scales, zps = transfer(t, store)
    assert np.array_equal(pool, t.page_pool)
    assert t.scales is not None and t.zero_points is not None
    assert np.array_equal(scales.view(np.uint16), t.scales.view(np.uint16))
    assert np.array_equal(zps, t.zero_points)


def test_missing_page_raises_with_logical_positions_and_writes_nothing() -> None:
    t = tensor(pool_of(3))
    store = MemoryPageStore(10_000)
    store_pages(store, t, [0, 3])
    plan = plan_delta(t, store.digests())
    evict = MemoryPageStore(10_000)
    store_pages(evict, t, [3])  # page 0 (the shared prefix) is gone
    out = np.zeros_like(t.page_pool)
    with pytest.raises(PageStoreMissError) as info:
        fill_from_store(plan, evict, out, block_table=t.block_table, seq_ptr=t.seq_ptr)
    assert info.value.pages == (0,)
    assert info.value.positions == ((0, 0), (1, 0))
    assert not out.any()
    report = fill_from_store(
        plan, evict, out, block_table=t.block_table, seq_ptr=t.seq_ptr, report=True
    )
    assert not report.ok
    assert report.missing.tolist() == [0] and report.filled.tolist() == [3]
    assert report.positions == ((0, 0), (1, 0))
    assert np.array_equal(out[3].view(np.uint16), t.page_pool[3].view(np.uint16))
    assert not out[0].any()


class _RottingStore(MemoryPageStore):
    """A store whose memory went bad after the put (or a buggy external store)."""

    def get(self, digest: int) -> bytes | None:
        found = super().get(digest)
        return None if found is None else b"\xee" + found[1:]


def test_stale_store_page_is_never_reused() -> None:
    t = tensor(pool_of(4))
    store = _RottingStore(10_000)
    store_pages(store, t, [2])
    plan = plan_delta(t, store.digests())
    out = np.zeros_like(t.page_pool)
    with pytest.raises(PageDigestError) as info:
        fill_from_store(plan, store, out, block_table=t.block_table, seq_ptr=t.seq_ptr)
    assert not isinstance(info.value, PageStoreMissError)
    assert info.value.pages == (2,) and info.value.positions == ((1, 1),)
    report = fill_from_store(plan.refs, store, out, report=True)
    assert report.corrupt.tolist() == [2] and report.failed.tolist() == [2]
    assert not out.any()


def test_fill_argument_errors() -> None:
    t = tensor(pool_of(5))
    store = MemoryPageStore(10_000)
    refs = PageRefs(np.array([4]), page_digests(t)[[4]])
    with pytest.raises(ArgumentTypeError, match="refs"):
        fill_from_store("x", store, np.zeros_like(t.page_pool))  # type: ignore[arg-type]
    with pytest.raises(ArgumentTypeError, match="store"):
        fill_from_store(refs, {}, np.zeros_like(t.page_pool))  # type: ignore[arg-type]
    with pytest.raises(ArgumentTypeError, match="out_pool"):
        fill_from_store(refs, store, t.page_pool[:, :, :, ::2])
    with pytest.raises(ArgumentTypeError, match="num_pages"):
        fill_from_store(refs, store, np.zeros(640, np.uint8))
    with pytest.raises(InvalidIntegrityRecordError, match="beyond"):
        fill_from_store(refs, store, np.zeros(512, np.uint8), num_pages=4)
    with pytest.raises(InvalidIntegrityRecordError, match="strictly increasing"):
        plan_delta(t, u64(3, 2))
    with pytest.raises(ArgumentTypeError, match="known"):
        plan_delta(t, [1])


def test_place_sent_pages_checks_shapes() -> None:
    t = quantized(6)
    plan = plan_delta(t, u64())
    sent = gather_sent(t, plan)
    out = np.zeros_like(t.page_pool)
    with pytest.raises(ArgumentTypeError, match="scales"):
        place_sent_pages(plan.refs, sent, out)  # scales sent, nowhere to put them
    short = PageRefs(np.array([0]), u64(1))
    with pytest.raises(InvalidIntegrityRecordError, match="wrong shape"):
        place_sent_pages(
            short,
            sent,
            out,
            out_scales=np.zeros_like(t.scales),
            out_zero_points=np.zeros_like(t.zero_points),
        )


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sets(st.integers(0, 4)))
def test_delta_round_trip_property(seed: int, held: set[int]) -> None:
    t = tensor(pool_of(seed))
    store = MemoryPageStore(10_000)
    store_pages(store, t, sorted(held))
    pool, _, _ = transfer(t, store)
    assert np.array_equal(pool.view(np.uint16), t.page_pool.view(np.uint16))
    plan = plan_delta(t, store.digests())
    assert set(plan.refs.pages.tolist()) >= held  # equal pages may match held digests too


def test_every_error_is_a_hurray_wire_error() -> None:
    for cls in (
        PageDigestError,
        PageStoreMissError,
        InvalidIntegrityRecordError,
        IntegrityRecordTruncatedError,
    ):
        assert issubclass(cls, HurrayWireError) and issubclass(cls, ValueError)
