"""Per-page digests: definition, logical positions of failures, the digest section record."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import xxhash
from hypothesis import given, settings, strategies as st

import hurray_wire as hw
from hurray_wire import dtypes
from hurray_wire.errors import (
    ArgumentTypeError,
    IntegrityRecordTruncatedError,
    InvalidIntegrityRecordError,
    PageDigestError,
)
from hurray_wire.integrity import (
    decode_digest_section,
    encode_digest_section,
    logical_positions,
    page_digests,
    page_records,
    record_digest,
    verify_page_digests,
)
from tests.conftest import random_pool


def spec_tensor(pool: Any = None, **kw: Any) -> hw.BlockPagedTensor:
    """The spec example: 5 pages of 4 tokens, sequences [0, 1] and [0] (page 0 shared)."""
    if pool is None:
        pool = np.arange(5 * 4 * 2 * 8, dtype=np.float16).reshape(5, 4, 2, 8)
    return hw.BlockPagedTensor.from_arrays(pool, [0, 1, 0], [0, 2, 3], seq_lens=[6, 3], **kw)


def block_quantized(asym: bool = True) -> hw.BlockPagedTensor:
    rng = np.random.default_rng(3)
    pool = rng.integers(-128, 127, (5, 4, 2, 8), dtype=np.int8)
    q = hw.PerBlockAffine(0, 4, 3, hw.float32, 4 if asym else None)
    extra: dict[str, Any] = {"scales": rng.uniform(0.1, 1, 20).astype(np.float32)}
    if asym:
        extra["zero_points"] = rng.integers(-5, 5, 20).astype(np.int32)
    return spec_tensor(pool, quantization=q, **extra)


# -- the definition ------------------------------------------------------------------------


def test_digest_is_xxh3_of_each_page() -> None:
    t = spec_tensor()
    expected = [xxhash.xxh3_64_intdigest(t.page_pool[i].tobytes()) for i in range(5)]
    got = page_digests(t)
    assert got.dtype == np.uint64 and got.tolist() == expected


def test_golden_digests() -> None:
    # Frozen: a change here changes every stored page store key and every digest section.
    assert page_digests(spec_tensor()).tolist() == [
        16360336192125858045,
        1248888621440522330,
        9964744987365465525,
        9040351173482863944,
        3577265552706834309,
    ]


@pytest.mark.parametrize("asym", [False, True])
def test_quantized_record_is_page_then_scales_then_zero_points(asym: bool) -> None:
    t = block_quantized(asym)
    for i in range(5):
        record = t.page_pool[i].tobytes() + t.scales[i * 4 : i * 4 + 4].tobytes()  # type: ignore[index]
        if asym:
            record += t.zero_points[i * 4 : i * 4 + 4].tobytes()  # type: ignore[index]
        assert page_records(t).record(i) == record
        assert int(page_digests(t)[i]) == xxhash.xxh3_64_intdigest(record) == record_digest(record)


def test_a_changed_slot_scale_changes_only_its_page() -> None:
    t = block_quantized()
    before = page_digests(t)
    scales = t.scales.copy()  # type: ignore[union-attr]
    scales[9] *= 2  # slot 1 of page 2
    t2 = spec_tensor(
        t.page_pool, quantization=t.quantization, scales=scales, zero_points=t.zero_points
    )
    changed = np.flatnonzero(page_digests(t2) != before)
    assert changed.tolist() == [2]


def test_tensor_wide_parameters_are_not_in_page_digests() -> None:
    pool = np.arange(5 * 4 * 2 * 8, dtype=np.int16).reshape(5, 4, 2, 8).astype(np.int8)
    a = spec_tensor(pool, quantization=hw.PerTensorAffine(0.5, 0))
    b = spec_tensor(pool, quantization=hw.PerTensorAffine(0.25, 1))
    assert page_digests(a).tolist() == page_digests(b).tolist()


def test_packed_pages_digest_their_packed_bytes() -> None:
    pool = random_pool(dtypes.int4, (5, 4, 2, 8))
    t = spec_tensor(pool)
    raw = t.page_pool.reshape(5, -1)  # 32 elements of 4 bits = 16 bytes per page
    assert raw.shape == (5, 32)
    assert page_digests(t).tolist() == [xxhash.xxh3_64_intdigest(r.tobytes()) for r in raw]


def test_packed_pages_off_a_byte_boundary_are_refused() -> None:
    pool = random_pool(dtypes.int4, (5, 1, 1, 3))  # 3 nibbles per page
    t = hw.BlockPagedTensor.from_arrays(pool, [0, 1], [0, 2])
    with pytest.raises(InvalidIntegrityRecordError, match="byte boundary") as info:
        page_digests(t)
    assert info.value.field == "page_pool"


def test_empty_pool() -> None:
    t = hw.BlockPagedTensor.from_arrays(np.zeros((0, 4, 2, 8), np.float16), [], [0])
    assert page_digests(t).shape == (0,)
    assert verify_page_digests(t, np.zeros(0, np.uint64)).ok


def test_not_a_tensor() -> None:
    with pytest.raises(ArgumentTypeError, match="BlockPagedTensor"):
        page_digests("nope")  # type: ignore[arg-type]


# -- verification and logical positions ----------------------------------------------------


def test_corrupt_shared_prefix_page_is_reported_for_both_sequences() -> None:
    t = spec_tensor()
    digests = page_digests(t)
    pool = t.page_pool.copy()
    pool[0, 3, 1, 7] += 1  # page 0: sequence 0 page 0 and sequence 1 page 0
    report = verify_page_digests(spec_tensor(pool), digests)
    assert not report.ok
    assert report.pages.tolist() == [0]
    assert report.expected.tolist() == [int(digests[0])]
    assert report.positions == ((0, 0), (1, 0))
    with pytest.raises(PageDigestError) as info:
        report.raise_if_failed()
    assert info.value.pages == (0,) and info.value.positions == ((0, 0), (1, 0))
    assert "page 0" in str(info.value)


def test_corrupt_unshared_and_unreferenced_pages() -> None:
    t = spec_tensor()
    digests = page_digests(t)
    pool = t.page_pool.copy()
    pool[1] = 0  # sequence 0, page 1
    pool[4, 0, 0, 0] = -1  # not referenced by the block table
    report = verify_page_digests(spec_tensor(pool), digests)
    assert report.pages.tolist() == [1, 4]
    assert report.positions == ((0, 1),)
    assert report.position_pages.tolist() == [1]


def test_clean_report() -> None:
    t = spec_tensor()
    report = verify_page_digests(t, page_digests(t))
    assert report.ok and report.positions == ()
    report.raise_if_failed()


def test_empty_sequences_do_not_shift_positions() -> None:
    pool = np.zeros((3, 2, 1, 8), np.float16)
    t = hw.BlockPagedTensor.from_arrays(pool, [2, 0, 1], [0, 0, 1, 1, 3])
    pages, seqs, in_seq = logical_positions(t.block_table, t.seq_ptr, np.array([-1, 1, 2, 9]))
    assert list(zip(pages.tolist(), seqs.tolist(), in_seq.tolist(), strict=True)) == [
        (2, 1, 0),
        (1, 3, 1),
    ]


@pytest.mark.parametrize(
    ("digests", "error"),
    [
        ([1, 2, 3, 4, 5], ArgumentTypeError),
        (np.zeros(5, np.int64), ArgumentTypeError),
        (np.zeros((5, 1), np.uint64), ArgumentTypeError),
        (np.zeros(4, np.uint64), InvalidIntegrityRecordError),
    ],
)
def test_verify_refuses_bad_digest_arrays(digests: Any, error: type[Exception]) -> None:
    with pytest.raises(error, match="digests"):
        verify_page_digests(spec_tensor(), digests)


@settings(max_examples=40, deadline=None)
@given(
    pages=st.integers(1, 6),
    lens=st.lists(st.integers(0, 12), min_size=1, max_size=4),
    seed=st.integers(0, 2**32 - 1),
    data=st.data(),
)
def test_positions_match_a_loop(pages: int, lens: list[int], seed: int, data: Any) -> None:
    rng = np.random.default_rng(seed)
    counts = [-(-n // 4) for n in lens]
    table = rng.integers(0, pages, sum(counts))
    seq_ptr = np.concatenate([[0], np.cumsum(counts)])
    pool = rng.integers(0, 255, (pages, 4, 1, 8), dtype=np.uint8)
    t = hw.BlockPagedTensor.from_arrays(pool, table, seq_ptr, seq_lens=lens)
    digests = page_digests(t)
    bad = data.draw(st.sets(st.integers(0, pages - 1)))
    corrupted = pool.copy()
    for p in bad:
        corrupted[p, 0, 0, 0] ^= 0x01
    report = verify_page_digests(
        hw.BlockPagedTensor.from_arrays(corrupted, table, seq_ptr), digests
    )
    expected = [
        (s, j)
        for s in range(len(lens))
        for j, page in enumerate(table[seq_ptr[s] : seq_ptr[s + 1]].tolist())
        if page in bad
    ]
    assert report.pages.tolist() == sorted(bad)
    assert sorted(report.positions) == sorted(expected)


# -- the digest section payload ------------------------------------------------------------

GOLDEN_SECTION = (
    b"\x01\x01\x00\x00\x02\x00\x00\x00"  # version 1, xxh3_64, reserved, count 2
    b"\x01\x00\x00\x00\x00\x00\x00\x00"  # digest of page 0: 1
    b"\xff\xff\xff\xff\xff\xff\xff\xff"  # digest of page 1: 2**64 - 1
)


def test_digest_section_golden() -> None:
    digests = np.array([1, 2**64 - 1], np.uint64)
    assert encode_digest_section(digests) == GOLDEN_SECTION
    decoded = decode_digest_section(GOLDEN_SECTION, 2)
    assert decoded.dtype == np.uint64 and decoded.tolist() == [1, 2**64 - 1]
    assert encode_digest_section(np.zeros(0, np.uint64)) == b"\x01\x01\x00\x00\x00\x00\x00\x00"
    assert decode_digest_section(b"\x01\x01\x00\x00\x00\x00\x00\x00", 0).size == 0


def test_digest_section_round_trip_of_a_tensor() -> None:
    digests = page_digests(spec_tensor())
    assert decode_digest_section(encode_digest_section(digests), 5).tolist() == digests.tolist()
    assert decode_digest_section(bytearray(encode_digest_section(digests)), 5).size == 5


@pytest.mark.parametrize("cut", range(len(GOLDEN_SECTION)))
def test_digest_section_truncated_at_every_byte(cut: int) -> None:
    with pytest.raises(IntegrityRecordTruncatedError) as info:
        decode_digest_section(GOLDEN_SECTION[:cut], 2, base_offset=1000)
    assert info.value.offset == 1000 + cut


@pytest.mark.parametrize("at", range(8))
def test_digest_section_flipped_head_byte(at: int) -> None:
    data = bytearray(GOLDEN_SECTION)
    data[at] ^= 0x40
    with pytest.raises(InvalidIntegrityRecordError) as info:
        decode_digest_section(bytes(data), 2)
    assert info.value.offset == {0: 0, 1: 1, 2: 2, 3: 2}.get(at, 4)


def test_digest_section_rejections() -> None:
    with pytest.raises(InvalidIntegrityRecordError, match="num_pages") as info:
        decode_digest_section(GOLDEN_SECTION, 3)
    assert info.value.found == 2 and info.value.expected == 3
    with pytest.raises(InvalidIntegrityRecordError, match="trailing") as info:
        decode_digest_section(GOLDEN_SECTION + b"\0", 2, base_offset=64)
    assert info.value.offset == 64 + 24
    huge = b"\x01\x01\x00\x00\xff\xff\xff\xff"
    with pytest.raises(InvalidIntegrityRecordError, match="num_pages"):
        decode_digest_section(huge, 5)
    with pytest.raises(ArgumentTypeError):
        decode_digest_section("text", 2)
    with pytest.raises(ArgumentTypeError):
        decode_digest_section(GOLDEN_SECTION, -1)
    with pytest.raises(ArgumentTypeError):
        encode_digest_section([1, 2])


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 2**64 - 1), max_size=20))
def test_digest_section_round_trip(values: list[int]) -> None:
    data = encode_digest_section(np.array(values, np.uint64))
    assert len(data) == 8 + 8 * len(values)
    assert decode_digest_section(data, len(values)).tolist() == values
