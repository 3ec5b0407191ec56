"""An independent writer of the integrity records, from docs/integrity.md's tables only
(struct and xxhash, none of the package's structs), checked byte for byte against the
library, and the page digest recomputed token by token from the spec's definition."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import xxhash
from hypothesis import given, settings, strategies as st

import hurray_wire as hw
from hurray_wire.integrity import (
    PageRefs,
    decode_known_pages,
    decode_page_refs,
    encode_digest_section,
    encode_known_pages,
    encode_known_pages_bloom,
    encode_page_refs,
    page_digests,
)

u64s = st.lists(st.integers(0, 2**64 - 1), max_size=40)


def ref_digest_section(digests: list[int]) -> bytes:  # § 4
    return struct.pack("<BBHI", 1, 1, 0, len(digests)) + struct.pack(f"<{len(digests)}Q", *digests)


def ref_known_pages(digests: list[int]) -> bytes:  # § 5.1
    values = sorted(set(digests))
    body = b"HWKP" + struct.pack("<BBBBII", 1, 0, 1, 0, len(values), 0)
    body += struct.pack(f"<{len(values)}Q", *values)
    return body + struct.pack("<Q", xxhash.xxh3_64_intdigest(body))


def ref_page_refs(pages: list[int], digests: list[int]) -> bytes:  # § 6
    n = len(pages)
    return struct.pack("<BBHI", 1, 1, 0, n) + struct.pack(f"<{n}Q{n}Q", *pages, *digests)


def ref_bloom(digests: list[int], bits_per_entry: int) -> bytes:  # § 5.2
    values = sorted(set(digests))
    m_log2 = 6
    while (1 << m_log2) < max(1, len(values) * bits_per_entry):
        m_log2 += 1
    m = 1 << m_log2
    k = min(16, max(1, round(m / max(1, len(values)) * 0.693)))
    bits = bytearray(m // 8)
    for d in values:
        for i in range(k):
            j = (d + i * ((d >> 32) | 1)) % 2**64 % m
            bits[j // 8] |= 1 << (j % 8)
    body = b"HWKP" + struct.pack("<BBBBII", 1, 1, 1, 0, len(values), 0)
    body += struct.pack("<BB6x", k, m_log2) + bytes(bits)
    return body + struct.pack("<Q", xxhash.xxh3_64_intdigest(body))


@settings(max_examples=60, deadline=None)
@given(u64s)
def test_digest_section_matches_the_doc(values: list[int]) -> None:
    assert encode_digest_section(np.array(values, np.uint64)) == ref_digest_section(values)


@settings(max_examples=60, deadline=None)
@given(u64s)
def test_known_pages_match_the_doc(values: list[int]) -> None:
    data = ref_known_pages(values)
    assert encode_known_pages(np.array(values, np.uint64)) == data
    assert decode_known_pages(data, max_entries=len(values)).tolist() == sorted(set(values))


@settings(max_examples=40, deadline=None)
@given(u64s, st.integers(1, 16))
def test_bloom_matches_the_doc(values: list[int], bits: int) -> None:
    assert encode_known_pages_bloom(np.array(values, np.uint64), bits_per_entry=bits) == (
        ref_bloom(values, bits)
    )


@settings(max_examples=60, deadline=None)
@given(st.sets(st.integers(0, 99), max_size=20), st.data())
def test_page_refs_match_the_doc(pages: set[int], data: Any) -> None:
    ids = sorted(pages)
    digests = data.draw(st.lists(st.integers(0, 2**64 - 1), min_size=len(ids), max_size=len(ids)))
    expected = ref_page_refs(ids, digests)
    assert encode_page_refs(PageRefs(np.array(ids, np.int64), np.array(digests, np.uint64))) == (
        expected
    )
    back = decode_page_refs(expected, 100)
    assert back.pages.tolist() == ids and back.digests.tolist() == digests


def test_page_digest_from_the_definition() -> None:
    """§ 2 token by token: page bytes in (slot, head, dim) order, then the page's slot
    scales, then its slot zero points, little-endian."""
    rng = np.random.default_rng(9)
    pool = rng.integers(-128, 127, (3, 4, 2, 8), dtype=np.int8)
    scales = rng.uniform(0.1, 1, 12).astype(np.float16)
    zps = rng.integers(-9, 9, 12).astype(np.int32)
    t = hw.BlockPagedTensor.from_arrays(
        pool,
        [2, 0],
        [0, 2],
        quantization=hw.PerBlockAffine(0, 4, 3, hw.float16, 4),
        scales=scales,
        zero_points=zps,
    )
    for page in range(3):
        record = b"".join(
            struct.pack("<b", int(pool[page, slot, head, dim]))
            for slot in range(4)
            for head in range(2)
            for dim in range(8)
        )
        record += b"".join(struct.pack("<e", float(scales[page * 4 + s])) for s in range(4))
        record += b"".join(struct.pack("<i", int(zps[page * 4 + s])) for s in range(4))
        assert int(page_digests(t)[page]) == xxhash.xxh3_64_intdigest(record)
