"""Issue 22: sizes that cost nothing to claim. With ``num_heads`` or ``head_dim`` 0 a page
is 0 bytes, so a tensor or a delta blob can claim 2^33 pages for nothing; the per-page work
(a digest, a row of every per-page array) is capped by ``DecodeLimits.max_empty_pages``
(``integrity.digests.MAX_EMPTY_PAGES`` for tensors), a typed error before any of it."""

from __future__ import annotations

import struct
import sys
from pathlib import Path

import numpy as np
import pytest

import hurray_wire as hw
from hurray_wire.containers import StreamReader
from hurray_wire.errors import InvalidIntegrityRecordError, LimitExceededError
from hurray_wire.integrity import (
    EnginePoolStore,
    MemoryPageStore,
    page_digests,
    page_records,
    plan_delta,
    store_pages,
)
from hurray_wire.integrity.digests import MAX_EMPTY_PAGES
from tests.work import refused_within

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
import fuzz_blob

HUGE = 1 << 33
_MARK = 0x1234  # a page count whose u64 bytes occur once in the blob


def _empty_pages(num_pages: int, head_dim: int = 64) -> hw.BlockPagedTensor:
    pool = np.zeros((num_pages, 16, 0, head_dim), np.float16)  # 0 bytes, whatever num_pages
    return hw.BlockPagedTensor.from_arrays(
        pool, np.array([0, 1]), np.array([0, 2]), block_table_index_type="uint64"
    )


def _claiming(num_pages: int, *, delta: bool = True) -> bytes:
    """A (delta) blob of 0-byte pages whose descriptor claims ``num_pages`` pages: the
    descriptor's page count patched in, the checksums recomputed."""
    tensor = _empty_pages(_MARK)
    known = np.array([1], np.uint64) if delta else None  # matches nothing: 0 refs
    blob = bytes(hw.encode(tensor, known_pages=known))
    old = struct.pack("<Q", _MARK)
    assert blob.count(old) == 1
    return fuzz_blob.fix_checksums(blob.replace(old, struct.pack("<Q", num_pages)))


def test_the_patched_blob_is_small_and_valid_below_the_cap() -> None:
    blob = _claiming(MAX_EMPTY_PAGES)
    assert len(blob) < 1024
    store = MemoryPageStore(1 << 20)
    store_pages(store, _empty_pages(4), pages=[0])
    tensor = hw.decode(blob, page_store=store)
    assert tensor.layout.num_pages == MAX_EMPTY_PAGES


@pytest.mark.parametrize("num_pages", [MAX_EMPTY_PAGES + 2, HUGE], ids=["cap+1", "2^33"])
def test_a_delta_blob_claiming_free_pages_is_refused_fast(num_pages: int) -> None:
    blob = _claiming(num_pages)
    store = MemoryPageStore(1 << 20)
    error = refused_within(lambda: hw.decode(blob, page_store=store), LimitExceededError, 5_000)
    assert "max_empty_pages" in str(error) and error.field == "raw_size"  # nothing per page
    with pytest.raises(LimitExceededError, match="max_empty_pages"):
        hw.decode_report(blob, page_store=store)
    engine = EnginePoolStore(np.zeros((4, 16, 0, 64), np.float16))
    with pytest.raises(LimitExceededError, match="max_empty_pages"):
        hw.decode(blob, into=hw.InPlace(engine, [0, 1, 2, 3]))
    with pytest.raises(hw.HurrayWireError) as streamed:  # a stream of one bare blob
        list(StreamReader(blob, page_store=store))
    assert isinstance(streamed.value.__cause__ or streamed.value, LimitExceededError)


def test_the_cap_is_a_decode_limit() -> None:
    blob = _claiming(MAX_EMPTY_PAGES + 2)
    store = MemoryPageStore(1 << 20)
    store_pages(store, _empty_pages(4), pages=[0])
    limits = hw.DecodeLimits(max_empty_pages=MAX_EMPTY_PAGES + 2)
    assert hw.decode(blob, page_store=store, limits=limits).layout.num_pages == MAX_EMPTY_PAGES + 2
    with pytest.raises(LimitExceededError):
        hw.decode(_claiming(8), page_store=store, limits=hw.DecodeLimits(max_empty_pages=7))
    assert hw.decode(_claiming(8), page_store=store, limits=hw.DecodeLimits(max_empty_pages=8))


def test_a_plain_blob_claiming_free_pages_builds_nothing_per_page() -> None:
    # No page refs and no digests: nothing per page is built, so the claim costs nothing.
    assert hw.decode(_claiming(HUGE, delta=False)).layout.num_pages == HUGE


@pytest.mark.parametrize(
    "call",
    [
        lambda t: page_digests(t),
        lambda t: page_records(t),
        lambda t: hw.encode(t, page_digests=True),
        lambda t: hw.encode(t, known_pages=np.zeros(0, np.uint64)),
        lambda t: plan_delta(t, np.zeros(0, np.uint64)),
        lambda t: store_pages(MemoryPageStore(1 << 20), t),
    ],
    ids=[
        "page_digests",
        "page_records",
        "encode-digests",
        "encode-delta",
        "plan_delta",
        "store_pages",
    ],
)
def test_per_page_work_on_a_tensor_of_free_pages_is_refused(call: object) -> None:
    tensor = _empty_pages(HUGE)
    error = refused_within(lambda: call(tensor), InvalidIntegrityRecordError, 5_000)  # type: ignore[operator]
    assert "0 bytes" in str(error) and error.field == "num_pages"
    assert page_digests(_empty_pages(MAX_EMPTY_PAGES)).size == MAX_EMPTY_PAGES  # the cap


def test_the_integrity_harness_replays_its_seeds_and_mutations() -> None:
    """tools/fuzz_integrity.py's target (run by atheris in the campaign) on its generated
    seeds and seeded byte mutations of them: only typed errors, right answers."""
    import random

    import fuzz_integrity

    seeds = list(fuzz_integrity.generated_seeds().values())
    rng = random.Random(22)
    for data in seeds:
        fuzz_integrity.check_integrity(data)
    for _ in range(1500):
        mutated = bytearray(rng.choice(seeds))
        for _ in range(rng.randint(1, 4)):
            at = rng.randrange(1, len(mutated)) if len(mutated) > 1 else 0
            mutated[at] = rng.randrange(256)
        fuzz_integrity.check_integrity(bytes(mutated))
