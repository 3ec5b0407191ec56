"""Hostile bytes into every integrity decoder: only typed HurrayWireErrors come out."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import hurray_wire as hw
from hurray_wire.errors import HurrayWireError
from hurray_wire.integrity import (
    EngineFingerprint,
    MemoryPageStore,
    PageRefs,
    PageStore,
    decode_digest_section,
    decode_fingerprint,
    decode_known_pages,
    decode_known_pages_bloom,
    decode_page_refs,
    encode_digest_section,
    encode_fingerprint,
    encode_known_pages,
    encode_known_pages_bloom,
    encode_page_refs,
    fill_from_store,
    page_digests,
    plan_delta,
    store_pages,
    verify_page_digests,
)

DIGESTS = np.array([5, 7, 2**64 - 1], np.uint64)
DECODERS: dict[str, tuple[Callable[[bytes], Any], bytes]] = {
    "digest_section": (lambda b: decode_digest_section(b, 3), encode_digest_section(DIGESTS)),
    "page_refs": (
        lambda b: decode_page_refs(b, 9),
        encode_page_refs(PageRefs(np.array([0, 3, 8]), DIGESTS)),
    ),
    "known_pages": (
        lambda b: decode_known_pages(b, max_entries=64),
        encode_known_pages(DIGESTS),
    ),
    "known_bloom": (
        lambda b: decode_known_pages_bloom(b, max_bytes=1 << 12),
        encode_known_pages_bloom(DIGESTS),
    ),
    "fingerprint": (
        decode_fingerprint,
        encode_fingerprint(EngineFingerprint("m", "e", "1", "NHD", "fp16", 16, 0, 1, {"a": 1})),
    ),
}


@pytest.mark.parametrize("name", sorted(DECODERS))
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_mutated_records(name: str, data: Any) -> None:
    decode, valid = DECODERS[name]
    record = bytearray(valid)
    for _ in range(data.draw(st.integers(1, 4))):
        op = data.draw(st.sampled_from(["flip", "cut", "insert", "set"]))
        at = data.draw(st.integers(0, max(0, len(record) - 1)))
        if op == "flip" and record:
            record[at] ^= 1 << data.draw(st.integers(0, 7))
        elif op == "cut":
            del record[at:]
        elif op == "insert":
            record[at:at] = data.draw(st.binary(min_size=1, max_size=9))
        elif record:
            record[at] = data.draw(st.sampled_from([0x00, 0x01, 0x7F, 0x80, 0xFF]))
    with contextlib.suppress(HurrayWireError):
        decode(bytes(record))


@pytest.mark.parametrize("name", sorted(DECODERS))
@settings(max_examples=100, deadline=None)
@given(junk=st.binary(max_size=80))
def test_random_bytes(name: str, junk: bytes) -> None:
    decode, valid = DECODERS[name]
    for candidate in (junk, valid[:8] + junk, valid[:16] + junk, valid[:24] + junk):
        with contextlib.suppress(HurrayWireError):
            decode(candidate)


class _ListStore(PageStore):
    """An external store that hands out bytearrays and memoryviews."""

    def __init__(self) -> None:
        self.pages: dict[int, Any] = {}

    def get(self, digest: int) -> Any:
        return self.pages.get(digest)

    def put(self, digest: int, page_bytes: object) -> None:
        self.pages[digest] = memoryview(bytearray(page_bytes))  # type: ignore[call-overload]

    def __contains__(self, digest: object) -> bool:
        return digest in self.pages

    def digests(self) -> np.ndarray:
        return np.array(sorted(self.pages), np.uint64)


def test_fill_accepts_any_bytes_like_store_records() -> None:
    pool = np.random.default_rng(0).standard_normal((4, 4, 1, 8)).astype(np.float16)
    t = hw.BlockPagedTensor.from_arrays(pool, [0, 1, 2, 3], [0, 4])
    store = _ListStore()
    store_pages(store, t)
    plan = plan_delta(t, store.digests())
    out = np.zeros_like(pool)
    assert fill_from_store(plan, store, out).filled.tolist() == [0, 1, 2, 3]
    assert np.array_equal(out.view(np.uint16), pool.view(np.uint16))


def test_empty_quantized_pool() -> None:
    q = hw.PerBlockAffine(0, 4, 3, hw.float32, 4)
    t = hw.BlockPagedTensor.from_arrays(
        np.zeros((0, 4, 2, 8), np.int8),
        [],
        [0],
        quantization=q,
        scales=np.zeros(0, np.float32),
        zero_points=np.zeros(0, np.int32),
    )
    assert page_digests(t).size == 0
    assert verify_page_digests(t, np.zeros(0, np.uint64)).ok
    assert plan_delta(t, np.zeros(0, np.uint64)).sent_fraction == 1.0
    assert len(MemoryPageStore(0)) == 0
