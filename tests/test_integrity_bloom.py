"""The Bloom form of known pages, with exact confirmation: never a wrong reference."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import hurray_wire as hw
from hurray_wire.errors import (
    ArgumentTypeError,
    IntegrityRecordTruncatedError,
    InvalidIntegrityRecordError,
)
from hurray_wire.integrity import (
    MemoryPageStore,
    bloom_candidates,
    confirm_known,
    decode_known_pages,
    decode_known_pages_bloom,
    encode_known_pages_bloom,
    fill_from_store,
    gather_sent,
    page_digests,
    place_sent_pages,
    plan_delta,
    store_pages,
)

GOLDEN = (
    b"HWKP\x01\x01\x01\x00"  # magic, version 1, form 1 (Bloom), xxh3_64, reserved
    b"\x02\x00\x00\x00\x00\x00\x00\x00"  # 2 digests inserted
    b"\x10\x06\x00\x00\x00\x00\x00\x00"  # 16 hashes, 2**6 bits
    b"\xfe\xff\x03\x00\x00\x00\x00\x00"  # the 64-bit filter of {1, 2}
    b"V\x1cz_o\xf4k\xc1"  # xxh3_64 of the 32 bytes before
)


def test_golden() -> None:
    assert encode_known_pages_bloom(np.array([2, 1, 2], np.uint64)) == GOLDEN
    bloom = decode_known_pages_bloom(GOLDEN, max_bytes=8)
    assert (bloom.num_hashes, bloom.log2_bits, bloom.count) == (16, 6, 2)
    assert bloom.might_contain(np.array([1, 2], np.uint64)).all()


def test_no_false_negatives_and_few_false_positives() -> None:
    rng = np.random.default_rng(0)
    held = rng.integers(0, 2**63, 20_000, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
    record = encode_known_pages_bloom(held)
    assert len(record) < 8 * held.size / 4  # ~16 bits per entry after rounding up
    bloom = decode_known_pages_bloom(record, max_bytes=1 << 20)
    assert bloom.might_contain(held).all()
    absent = rng.integers(0, 2**63, 100_000, dtype=np.uint64) * np.uint64(2)
    assert bloom.might_contain(absent).mean() < 0.02


def test_sorted_decoder_points_at_the_bloom_decoder() -> None:
    with pytest.raises(InvalidIntegrityRecordError, match="decode_known_pages_bloom"):
        decode_known_pages(GOLDEN, max_entries=10)


@pytest.mark.parametrize("cut", range(len(GOLDEN)))
def test_truncated_at_every_byte(cut: int) -> None:
    with pytest.raises(IntegrityRecordTruncatedError):
        decode_known_pages_bloom(GOLDEN[:cut], max_bytes=8)


@pytest.mark.parametrize("at", range(len(GOLDEN)))
def test_flipped_byte(at: int) -> None:
    data = bytearray(GOLDEN)
    data[at] ^= 0x20
    with pytest.raises(InvalidIntegrityRecordError):
        decode_known_pages_bloom(bytes(data), max_bytes=1 << 40)


def test_limits_before_reading() -> None:
    huge = GOLDEN[:16] + b"\x04\x20\x00\x00\x00\x00\x00\x00"  # 2**32 bits, no bit set sent
    with pytest.raises(InvalidIntegrityRecordError, match="max_bytes") as info:
        decode_known_pages_bloom(huge, max_bytes=1 << 20)
    assert info.value.offset == 17
    for params, field in ((b"\x00\x06", "num_hashes"), (b"\x11\x06", "num_hashes"),
                          (b"\x04\x05", "log2_bits"), (b"\x04\x21", "log2_bits")):  # fmt: skip
        with pytest.raises(InvalidIntegrityRecordError) as info:
            decode_known_pages_bloom(GOLDEN[:16] + params + GOLDEN[18:], max_bytes=8)
        assert info.value.field == field
    with pytest.raises(ArgumentTypeError):
        decode_known_pages_bloom(GOLDEN, max_bytes=-1)
    with pytest.raises(ArgumentTypeError):
        encode_known_pages_bloom(np.array([1], np.uint64), bits_per_entry=0)
    with pytest.raises(ArgumentTypeError):
        bloom_candidates(np.array([1], np.uint64), "bloom")  # type: ignore[arg-type]
    with pytest.raises(ArgumentTypeError):
        confirm_known({}, np.array([1], np.uint64))  # type: ignore[arg-type]


def test_protocol_with_confirmation_never_refers_to_an_absent_page() -> None:
    rng = np.random.default_rng(1)
    pool = rng.standard_normal((64, 4, 2, 8)).astype(np.float16)
    t = hw.BlockPagedTensor.from_arrays(pool, np.arange(64), [0, 64])
    store = MemoryPageStore(1 << 20)
    store_pages(store, t, range(0, 64, 2))
    # A deliberately tiny filter: many false positives.
    bloom = decode_known_pages_bloom(
        encode_known_pages_bloom(store.digests(), bits_per_entry=1), max_bytes=1 << 10
    )
    digests = page_digests(t)
    candidates = bloom_candidates(digests, bloom)
    assert set(store.digests().tolist()) <= set(candidates.tolist())
    confirmed = decode_known_pages(confirm_known(store, candidates), max_entries=64)
    assert confirmed.tolist() == store.digests().tolist()
    plan = plan_delta(t, confirmed, digests=digests)
    assert plan.refs.pages.tolist() == list(range(0, 64, 2))
    out = np.zeros_like(pool)
    place_sent_pages(plan.refs, gather_sent(t, plan), out)
    assert fill_from_store(plan, store, out).ok
    assert np.array_equal(out.view(np.uint16), pool.view(np.uint16))


@settings(max_examples=40, deadline=None)
@given(st.sets(st.integers(0, 2**64 - 1), max_size=200), st.integers(1, 20))
def test_round_trip_has_no_false_negatives(values: set[int], bits: int) -> None:
    held = np.array(sorted(values), np.uint64)
    bloom = decode_known_pages_bloom(
        encode_known_pages_bloom(held, bits_per_entry=bits), max_bytes=1 << 20
    )
    assert bloom.count == held.size
    assert bloom.might_contain(held).all()
