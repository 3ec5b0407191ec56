"""Delta decode in place into an engine's own pool (docs/integrity.md § 5.3): the
EnginePoolStore, decode(into=InPlace) / decode_report(into=InPlace), the stream reader's in_place
option, and encode(known_pages=DeltaPlan) for cached digests."""

from __future__ import annotations

import io
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import hurray_wire as hw
from hurray_wire.blob import InPlaceReport, peek_in_place
from hurray_wire.containers import StreamReader, StreamWriter
from hurray_wire.errors import (
    ArgumentTypeError,
    ChecksumError,
    HurrayWireError,
    InvalidIntegrityRecordError,
    InvalidTensorError,
    PageDigestError,
    PageStoreError,
    PageStoreMissError,
)
from hurray_wire.integrity import (
    EnginePoolStore,
    MemoryPageStore,
    PageStore,
    page_digests,
    page_records,
    plan_delta,
    record_digest,
)
from tests import blob_reference as ref

PS, H, D = 4, 2, 8
CAPACITY = 40


def _in_place_report(blob: Any, store: EnginePoolStore, free: Any, **kw: Any) -> InPlaceReport:
    """``decode_report(into=InPlace(...))``, whose report is an ``InPlaceReport``."""
    report = hw.decode_report(blob, into=hw.InPlace(store, free), **kw)
    assert isinstance(report, InPlaceReport)
    return report


def random_pages(rng: np.random.Generator, count: int) -> np.ndarray:
    return rng.standard_normal((count, PS, H, D)).astype(np.float16)


@dataclass
class Scene:
    """An engine pool holding an earlier request's pages at scattered ids (indexed), and a
    new request (the sender's tensor) sharing ``held`` of its pages with it."""

    engine: np.ndarray
    store: EnginePoolStore
    tensor: hw.BlockPagedTensor
    held_at: dict[int, int]  # sender page -> engine page holding the same bytes
    free: np.ndarray
    scales: np.ndarray | None = None
    zero_points: np.ndarray | None = None


def scene(
    seed: int = 0, held: tuple[int, ...] = tuple(range(9)), pages: int = 10, quantized: bool = False
) -> Scene:
    rng = np.random.default_rng(seed)
    places = rng.permutation(CAPACITY)
    engine_ids = places[: len(held)]
    free = places[len(held) :].copy()
    e_scales: np.ndarray | None
    e_zps: np.ndarray | None
    if quantized:
        pool = rng.integers(-128, 127, (pages, PS, H, D), dtype=np.int8)
        engine = rng.integers(-128, 127, (CAPACITY, PS, H, D), dtype=np.int8)
        scales = rng.uniform(0.1, 1, pages * PS).astype(np.float16)
        zps = rng.integers(-5, 5, pages * PS).astype(np.int32)
        e_scales = rng.uniform(0.1, 1, CAPACITY * PS).astype(np.float16)
        e_zps = rng.integers(-5, 5, CAPACITY * PS).astype(np.int32)
        for page, at in zip(held, engine_ids.tolist(), strict=True):
            engine[at] = pool[page]
            e_scales[at * PS : (at + 1) * PS] = scales[page * PS : (page + 1) * PS]
            e_zps[at * PS : (at + 1) * PS] = zps[page * PS : (page + 1) * PS]
        extra: dict[str, Any] = {
            "quantization": hw.PerBlockAffine(0, PS, 3, hw.float16, 4),
            "scales": scales,
            "zero_points": zps,
        }
        store = EnginePoolStore(engine, scales=e_scales, zero_points=e_zps)
    else:
        pool = random_pages(rng, pages)
        engine = random_pages(rng, CAPACITY)
        for page, at in zip(held, engine_ids.tolist(), strict=True):
            engine[at] = pool[page]
        extra = {}
        e_scales = e_zps = None
        store = EnginePoolStore(engine)
    store.index(engine_ids)
    # two sequences sharing a prefix page, in scrambled order, with partial last pages
    order = rng.permutation(pages)
    table = np.concatenate([order[:3], order[:1], order[3:]])
    lens = [3 * PS - 1, (len(table) - 3) * PS - 2]
    tensor = hw.BlockPagedTensor.from_arrays(
        pool, table, [0, 3, len(table)], seq_lens=lens, layer_index=1, kv_role="value",
        metadata={"request": "r-1"}, **extra,
    )  # fmt: skip
    held_at = dict(zip(held, engine_ids.tolist(), strict=True))
    return Scene(engine, store, tensor, held_at, free, e_scales, e_zps)


def slots(t: hw.BlockPagedTensor, values: np.ndarray) -> np.ndarray:
    """Per-page-slot parameters of every block-table entry."""
    return values.reshape(-1, PS)[t.block_table]


def same_logical(got: hw.BlockPagedTensor, want: hw.BlockPagedTensor) -> None:
    """The same tensor as the engine will read it: every page through its block table."""
    assert np.array_equal(got.seq_ptr, want.seq_ptr)
    assert got.seq_lens is not None and want.seq_lens is not None
    assert np.array_equal(got.seq_lens, want.seq_lens)
    assert got.shape == want.shape and got.element_type == want.element_type
    assert (got.layer_index, got.kv_role, got.metadata) == (
        want.layer_index,
        want.kv_role,
        want.metadata,
    )
    assert np.array_equal(got.page_pool[got.block_table], want.page_pool[want.block_table])
    if want.scales is not None:
        assert got.scales is not None
        assert np.array_equal(slots(got, got.scales), slots(want, want.scales))
        if want.zero_points is not None:
            assert got.zero_points is not None
            assert np.array_equal(slots(got, got.zero_points), slots(want, want.zero_points))
    assert got.quantization == want.quantization


def delta_blob(s: Scene, **kw: Any) -> Any:
    return hw.encode(s.tensor, known_pages=s.store.digests(), page_digests=True, **kw)


def snapshot(s: Scene) -> list[bytes]:
    arrays = [s.engine, s.scales, s.zero_points]
    return [a.tobytes() for a in arrays if a is not None]


def rows_changed(before: np.ndarray, after: np.ndarray) -> set[int]:
    differs = before.reshape(CAPACITY, -1) != after.reshape(CAPACITY, -1)
    return set(np.flatnonzero(differs.any(axis=1)).tolist())


# -- round trips ---------------------------------------------------------------------------


@pytest.mark.parametrize("quantized", [False, True])
def test_round_trip_with_90_percent_held(quantized: bool) -> None:
    s = scene(quantized=quantized)
    blob = delta_blob(s)
    assert peek_in_place(blob) == (s.tensor.descriptor, 1)
    before = s.engine.copy()
    got = hw.decode(blob, into=hw.InPlace(s.store, s.free))
    same_logical(got, s.tensor)
    assert got.page_pool is s.engine and np.shares_memory(got.page_pool, s.engine)
    if quantized:
        assert s.scales is not None and got.scales is not None
        assert np.shares_memory(got.scales, s.scales)
    # referenced pages are the engine's own, the one sent page went into free_pages[0]
    for entry, page in enumerate(s.tensor.block_table.tolist()):
        expected = s.held_at.get(page, int(s.free[0]))
        assert int(got.block_table[entry]) == expected
    assert rows_changed(before, s.engine) <= {int(s.free[0])}
    untouched = [p for p in range(CAPACITY) if p != int(s.free[0])]
    assert s.engine[untouched].tobytes() == before[untouched].tobytes()  # byte for byte
    assert hw.decode(hw.encode(got)).layout.num_pages == CAPACITY  # a valid tensor


def test_full_blob_and_digests_only_blob_go_into_free_pages() -> None:
    s = scene()
    for blob in (hw.encode(s.tensor), hw.encode(s.tensor, page_digests=True)):
        assert peek_in_place(blob)[1] == 10
        before = s.engine.copy()
        report = _in_place_report(blob, s.store, s.free)
        same_logical(report.tensor, s.tensor)
        assert report.ok and report.written.tolist() == s.free[:10].tolist()
        assert rows_changed(before, s.engine) <= set(s.free[:10].tolist())
        assert set(report.tensor.block_table.tolist()) <= set(s.free[:10].tolist())


def test_compressed_delta_blob() -> None:
    s = scene(seed=3)
    got = hw.decode(delta_blob(s, compression="zstd:1"), into=hw.InPlace(s.store, s.free))
    same_logical(got, s.tensor)


def test_nothing_held_and_everything_held() -> None:
    s = scene(held=tuple(range(10)))
    blob = delta_blob(s)
    assert peek_in_place(blob)[1] == 0
    before = s.engine.copy()
    got = hw.decode(blob, into=hw.InPlace(s.store, []))
    same_logical(got, s.tensor)
    assert s.engine.tobytes() == before.tobytes()
    s = scene(held=())
    got = hw.decode(delta_blob(s), into=hw.InPlace(s.store, s.free))
    same_logical(got, s.tensor)


def test_empty_tensor_and_empty_pool() -> None:
    empty = hw.BlockPagedTensor.from_arrays(np.zeros((0, PS, H, D), np.float16), [], [0])
    store = EnginePoolStore(np.zeros((0, PS, H, D), np.float16))
    assert store.index([]).size == 0 and store.digests().size == 0
    for blob in (hw.encode(empty), hw.encode(empty, known_pages=store.digests())):
        got = hw.decode(blob, into=hw.InPlace(store, np.zeros(0, np.int64)))
        assert got.layout.num_pages == 0 and got.block_table.size == 0
    assert page_digests(empty).size == 0
    # pages of no bytes: all equal, all referenced to the one indexed page
    t = hw.BlockPagedTensor.from_arrays(np.zeros((3, PS, H, 0), np.float16), [0, 1, 2], [0, 3])
    store = EnginePoolStore(np.zeros((8, PS, H, 0), np.float16))
    store.index([5])
    blob = hw.encode(t, known_pages=store.digests(), page_digests=True)
    assert hw.decode(blob, into=hw.InPlace(store, [1])).block_table.tolist() == [5] * 3


# -- failures: stale, missing, corrupt -------------------------------------------------------


def shared_prefix_page(s: Scene) -> int:
    """The sender page that both sequences use (block table entries 0 and 3)."""
    page = int(s.tensor.block_table[0])
    assert page in s.held_at
    return page


def test_stale_page_is_refused_at_its_logical_positions() -> None:
    s = scene()
    blob = delta_blob(s)
    page = shared_prefix_page(s)
    s.engine[s.held_at[page], 1, 0, 3] += 1  # the engine overwrote it without forget()
    before = snapshot(s)
    with pytest.raises(PageDigestError) as caught:
        hw.decode(blob, into=hw.InPlace(s.store, s.free))
    assert not isinstance(caught.value, PageStoreMissError)
    assert caught.value.pages == (page,)
    assert caught.value.positions == ((0, 0), (1, 0))
    assert str(s.held_at[page]) in str(caught.value)  # the stale engine page is named
    assert snapshot(s) == before  # nothing written, free pages included
    assert s.store.check().tolist() == [s.held_at[page]]


def test_stale_page_reported_gets_a_zeroed_free_page() -> None:
    s = scene()
    blob = delta_blob(s)
    page = shared_prefix_page(s)
    s.engine[s.held_at[page], 0, 0, 0] += 1
    indexed = s.store.indexed_pages()
    before = s.engine.copy()
    report = _in_place_report(blob, s.store, s.free)
    assert isinstance(report, InPlaceReport) and not report.ok
    spare = int(s.free[1])  # free_pages[0] took the sent page
    assert report.pages.tolist() == [spare] and report.corrupt.tolist() == [spare]
    assert report.positions == ((0, 0), (1, 0))
    assert report.stale.tolist() == [s.held_at[page]]
    assert report.written.tolist() == s.free[:2].tolist()
    t = report.tensor
    assert int(t.block_table[0]) == int(t.block_table[3]) == spare
    assert not s.engine[spare].any()  # zero-filled for the engine to recompute
    assert np.array_equal(s.engine[indexed], before[indexed])  # indexed pages untouched
    good = [i for i in range(t.block_table.size) if i not in (0, 3)]
    assert np.array_equal(
        t.page_pool[t.block_table[good]], s.tensor.page_pool[s.tensor.block_table[good]]
    )


def test_stale_slot_scale_is_refused() -> None:
    s = scene(quantized=True)
    blob = delta_blob(s)
    page = shared_prefix_page(s)
    assert s.scales is not None
    s.scales[s.held_at[page] * PS + 2] += 1
    with pytest.raises(PageDigestError) as caught:
        hw.decode(blob, into=hw.InPlace(s.store, s.free))
    assert caught.value.positions == ((0, 0), (1, 0))


def test_page_forgotten_since_planning_is_missing() -> None:
    s = scene()
    blob = delta_blob(s)
    page = int(s.tensor.block_table[1])
    s.store.forget([s.held_at[page]])
    before = snapshot(s)
    with pytest.raises(PageStoreMissError) as caught:
        hw.decode(blob, into=hw.InPlace(s.store, s.free))
    assert caught.value.pages == (page,) and caught.value.positions == ((0, 1),)
    assert snapshot(s) == before
    report = _in_place_report(blob, s.store, s.free)
    assert report.missing.tolist() == [int(s.free[1])] and report.positions == ((0, 1),)
    assert report.stale.size == 0
    # too few free pages to report it in: raised as decode(into=InPlace) raises it
    with pytest.raises(PageStoreMissError, match="no page left"):
        _in_place_report(blob, s.store, s.free[:1])


def corrupt_sent_page(blob: Any, s: Scene, *, keep_checksum: bool) -> bytes:
    """Flip a byte of the one sent page (the only row of buffer 0)."""
    data = bytes(blob)
    if keep_checksum:
        return ref.patch_payload(data, 0, 5, bytes([data[ref.entry(data, 0)["offset"] + 5] ^ 1]))
    out = bytearray(data)
    out[ref.entry(data, 0)["offset"] + 5] ^= 1
    return bytes(out)


def test_corrupt_sent_page_is_refused_or_reported() -> None:
    s = scene()
    sent = next(p for p in range(10) if p not in s.held_at)
    entries = np.flatnonzero(s.tensor.block_table == sent).tolist()
    where = [(0, e) if e < 3 else (1, e - 3) for e in entries]
    before = snapshot(s)
    bad = corrupt_sent_page(delta_blob(s), s, keep_checksum=True)
    with pytest.raises(PageDigestError) as caught:
        hw.decode(bad, into=hw.InPlace(s.store, s.free))
    assert caught.value.field == "page_digests" and caught.value.pages == (sent,)
    assert list(caught.value.positions) == where
    assert snapshot(s) == before
    report = _in_place_report(bad, s.store, s.free)
    assert report.digest_mismatch.tolist() == [int(s.free[0])]
    assert not s.engine[int(s.free[0])].any()
    broken = corrupt_sent_page(delta_blob(s), s, keep_checksum=False)
    with pytest.raises(ChecksumError):
        hw.decode(broken, into=hw.InPlace(s.store, s.free))
    # report mode: the digests localise the damaged pool section
    assert _in_place_report(broken, s.store, s.free).pages.size == 1


def test_other_section_corruption_raises_and_writes_nothing() -> None:
    s = scene()
    blob = bytearray(delta_blob(s))
    blob[ref.entry(bytes(blob), 1)["offset"]] ^= 1  # the block table
    before = snapshot(s)
    with pytest.raises(ChecksumError):
        hw.decode(blob, into=hw.InPlace(s.store, s.free))
    assert snapshot(s) == before
    with pytest.raises(ArgumentTypeError, match="fewer pages"):  # arguments first
        hw.decode(blob, into=hw.InPlace(s.store, []))


def test_verify_false_still_rehashes_the_referenced_pages() -> None:
    s = scene()
    blob = delta_blob(s)
    s.engine[s.held_at[shared_prefix_page(s)], 0, 1, 1] += 1
    with pytest.raises(PageDigestError):
        hw.decode(blob, into=hw.InPlace(s.store, s.free), verify=False)


def test_the_pool_store_also_serves_the_copying_decode() -> None:
    s = scene(quantized=True)
    before = snapshot(s)
    got = hw.decode(delta_blob(s), page_store=s.store)  # a new pool, pages copied out
    same_logical(got, s.tensor)
    assert not np.shares_memory(got.page_pool, s.engine) and snapshot(s) == before


# -- bad arguments -------------------------------------------------------------------------


def test_bad_free_pages() -> None:
    s = scene()
    blob = delta_blob(s)
    held = int(s.store.indexed_pages()[0])
    f0 = int(s.free[0])
    cases: list[tuple[Any, str]] = [
        ([f0, f0], "more than once"),
        ([CAPACITY], "out of range"),
        ([-1], "out of range"),
        ([held], "indexed"),
        ([], "fewer pages"),
        ("12", "sequence of page ids"),
        (np.array([1.5]), "integers"),
        (np.array([[f0]]), "integers"),
        ([True], "integers"),
        (None, "sequence of page ids"),
        (np.array([2**64 - 1], np.uint64), "out of range"),
    ]
    before = snapshot(s)
    for value, message in cases:
        with pytest.raises(ArgumentTypeError, match=message) as caught:
            hw.decode(blob, into=hw.InPlace(s.store, value))
        assert caught.value.field == "free_pages", value
        assert snapshot(s) == before


def test_pool_must_fit_the_blob() -> None:
    s = scene()
    blob = delta_blob(s)
    with pytest.raises(ArgumentTypeError, match="EnginePoolStore"):
        hw.decode(blob, into=hw.InPlace(MemoryPageStore(1 << 20), s.free))  # type: ignore[arg-type]
    wrong: list[tuple[EnginePoolStore, str]] = [
        (EnginePoolStore(np.zeros((CAPACITY, PS, H, D), np.float32)), "pool_store.page_pool"),
        (EnginePoolStore(np.zeros((CAPACITY, PS, H, 2 * D), np.float16)), "pool_store.page_pool"),
        (EnginePoolStore(np.zeros((CAPACITY, PS * H * D), np.float16)), "pool_store.page_pool"),
        (
            EnginePoolStore(
                np.zeros((CAPACITY, PS, H, D), np.float16),
                scales=np.zeros(CAPACITY * PS, np.float16),
            ),
            "pool_store.scales",
        ),
    ]
    for pool, field in wrong:
        with pytest.raises(InvalidTensorError) as caught:
            hw.decode(blob, into=hw.InPlace(pool, [0]))
        assert caught.value.field == field
        assert not pool.page_pool.any()
    q = scene(quantized=True)
    qblob = delta_blob(q)
    assert q.scales is not None
    bad_scales = [
        EnginePoolStore(q.engine.copy()),
        EnginePoolStore(q.engine.copy(), scales=q.scales.astype(np.float32)),
        EnginePoolStore(q.engine.copy(), scales=np.zeros(CAPACITY * 2, np.float16)),
        EnginePoolStore(q.engine.copy(), scales=q.scales.copy()),  # zero points missing
    ]
    for pool in bad_scales:
        with pytest.raises(InvalidTensorError):
            hw.decode(qblob, into=hw.InPlace(pool, q.free))


def test_store_construction_errors() -> None:
    pool = np.zeros((4, PS, H, D), np.float16)
    readonly = pool.copy()
    readonly.flags.writeable = False
    for value, message in [
        (pool.tolist(), "NumPy, torch or DLPack"),
        (readonly, "writable"),
        (pool[:, ::2], "C-contiguous"),
        (np.zeros(4, np.float16), "2 dimensions"),
        (np.zeros((4, 2), object), "plain data"),
    ]:
        with pytest.raises(ArgumentTypeError, match=message):
            EnginePoolStore(value)
    with pytest.raises(ArgumentTypeError, match="whole number"):
        EnginePoolStore(pool, scales=np.zeros(7, np.float16))
    with pytest.raises(ArgumentTypeError, match="zero_points without scales"):
        EnginePoolStore(pool, zero_points=np.zeros(16, np.int32))
    store = EnginePoolStore(pool)
    for bad in ([4], [-1], "0", [0.5], object()):
        with pytest.raises(ArgumentTypeError) as caught:
            store.index(bad)
        assert caught.value.field == "page_ids"
    with pytest.raises(ArgumentTypeError):
        store.get("x")  # type: ignore[arg-type]
    with pytest.raises(ArgumentTypeError):
        store.pages_for([1, 2])


# -- the store itself ----------------------------------------------------------------------


def test_store_index_get_put_forget() -> None:
    s = scene()
    store, engine = s.store, s.engine
    assert isinstance(store, PageStore) and len(store) == 9
    digests = store.digests()
    assert digests.dtype == np.uint64 and np.all(digests[1:] > digests[:-1])
    at = int(store.indexed_pages()[0])
    digest = int(page_records(s.tensor).digests()[next(p for p, e in s.held_at.items() if e == at)])
    assert digest in store and store.pages_for(np.array([digest], np.uint64)).tolist() == [at]
    view = store.get(digest)
    assert isinstance(view, memoryview) and np.shares_memory(np.asarray(view), engine)
    assert bytes(view) == engine[at].tobytes()
    store.put(digest, engine[at].tobytes())  # already held: accepted, nothing stored
    with pytest.raises(PageDigestError):
        store.put(digest, b"\0" * engine[at].nbytes)
    free = int(s.free[0])
    with pytest.raises(PageStoreError, match="index"):
        store.put(record_digest(engine[free].tobytes()), engine[free].tobytes())
    store.forget([at, free])  # a page that is not indexed is ignored
    assert digest not in store and store.get(digest) is None and len(store) == 8
    assert store.pages_for(np.array([digest], np.uint64)).tolist() == [-1]
    # two pages with the same bytes: forgetting one keeps the digest on the other
    other = int(store.indexed_pages()[0])
    engine[free] = engine[other]
    (twin,) = store.index([free]).tolist()
    assert len(store) == 9 and store.pages_for(np.array([twin], np.uint64)).tolist() == [other]
    store.forget([other])
    assert twin in store and store.pages_for(np.array([twin], np.uint64)).tolist() == [free]


def test_quantized_store_records_match_memory_store_records() -> None:
    s = scene(quantized=True)
    records = page_records(s.tensor)
    for page, at in s.held_at.items():
        digest = int(records.digests()[page])
        assert s.store.get(digest) == records.record(page)
        assert s.store.pages_for(np.array([digest], np.uint64)).tolist() == [at]


def test_index_again_and_check() -> None:
    s = scene()
    at = int(s.store.indexed_pages()[0])
    old = s.store.digests()
    s.engine[at] += 1
    assert s.store.check().tolist() == [at] and s.store.check([at, int(s.free[0])]).tolist() == [at]
    s.store.index([at])  # the engine vouches for the new bytes
    assert s.store.check().size == 0
    assert not np.array_equal(old, s.store.digests()) and len(s.store) == 9


def test_store_is_thread_safe() -> None:
    s = scene()
    errors: list[BaseException] = []
    free = s.free[:8]

    def churn() -> None:
        try:
            for _ in range(200):
                s.store.index(free)
                s.store.digests()
                s.store.forget(free)
        except BaseException as exc:  # pragma: no cover - the failure is the assert below
            errors.append(exc)

    threads = [threading.Thread(target=churn) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(s.store) == 9


# -- cached digests on the sender ----------------------------------------------------------


def test_encode_with_a_plan_from_cached_digests() -> None:
    s = scene()
    known = s.store.digests()
    cached = page_digests(s.tensor)
    plan = plan_delta(s.tensor, known, digests=cached)
    blob = hw.encode(s.tensor, known_pages=plan, page_digests=True)
    assert bytes(blob) == bytes(hw.encode(s.tensor, known_pages=known, page_digests=True))
    same_logical(hw.decode(blob, into=hw.InPlace(s.store, s.free)), s.tensor)
    other = scene(seed=5, pages=12)
    with pytest.raises(InvalidIntegrityRecordError):
        hw.encode(other.tensor, known_pages=plan)
    with pytest.raises(ArgumentTypeError):
        plan_delta(s.tensor, known, digests=cached.astype(np.int64))
    with pytest.raises(InvalidIntegrityRecordError):
        plan_delta(s.tensor, known, digests=cached[:-1])


def test_wrong_cached_digest_of_a_sent_page_is_refused_by_the_receiver() -> None:
    s = scene()
    cached = page_digests(s.tensor).copy()
    sent = next(p for p in range(10) if p not in s.held_at)
    cached[sent] ^= 1  # the sender's cache is wrong for a page it sends
    plan = plan_delta(s.tensor, s.store.digests(), digests=cached)
    blob = hw.encode(s.tensor, known_pages=plan, page_digests=True)
    with pytest.raises(PageDigestError) as caught:
        hw.decode(blob, into=hw.InPlace(s.store, s.free))
    assert caught.value.pages == (sent,)


# -- streams -------------------------------------------------------------------------------


def test_stream_reader_decodes_in_place() -> None:
    scenes = [scene(seed=i) for i in range(3)]
    sink = io.BytesIO()
    with StreamWriter(sink) as writer:
        for sc in scenes:
            writer.write(sc.tensor, known_pages=sc.store.digests(), page_digests=True)
    asked: list[int] = []

    def target(descriptor: hw.TensorDescriptor, pages: int) -> hw.InPlace:
        asked.append(pages)
        sc = scenes[len(asked) - 1]
        assert descriptor == sc.tensor.descriptor
        return hw.InPlace(sc.store, sc.free[:pages])

    got = list(StreamReader(io.BytesIO(sink.getvalue()), into=target))
    assert asked == [1, 1, 1] and len(got) == 3
    for t, sc in zip(got, scenes, strict=True):
        same_logical(t, sc.tensor)
        assert t.page_pool is sc.engine


def test_stream_reader_in_place_arguments() -> None:
    s = scene()
    with pytest.raises(ArgumentTypeError, match="into"):
        StreamReader(io.BytesIO(b""), into=5)  # type: ignore[arg-type]
    sink = io.BytesIO()
    with StreamWriter(sink) as writer:
        writer.write(s.tensor)
    reader = StreamReader(io.BytesIO(sink.getvalue()), into=lambda d, n: (s.store, s.free))
    with pytest.raises(ArgumentTypeError, match="landing target"):
        next(reader)


# -- property ------------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(
    st.integers(0, 2**16),
    st.sets(st.integers(0, 9), max_size=10),
    st.booleans(),
    st.booleans(),
)
def test_in_place_round_trip_property(
    seed: int, held: set[int], quantized: bool, report: bool
) -> None:
    s = scene(seed, tuple(sorted(held)), quantized=quantized)
    blob = delta_blob(s)
    before = s.engine.copy()
    free = np.random.default_rng(seed).permutation(s.free)
    if report:
        r = _in_place_report(blob, s.store, free)
        assert r.ok and r.stale.size == 0
        got = r.tensor
        assert r.written.tolist() == free[: 10 - len(held)].tolist()
    else:
        got = hw.decode(blob, into=hw.InPlace(s.store, free))
    same_logical(got, s.tensor)
    assert rows_changed(before, s.engine) <= set(free[: 10 - len(held)].tolist())


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**16), st.sets(st.integers(0, 8), min_size=1, max_size=9))
def test_stale_pages_reported_at_every_position_property(seed: int, stale: set[int]) -> None:
    s = scene(seed)
    blob = delta_blob(s)
    for page in stale:  # sender pages 0..8 are held; the engine overwrites their pages
        s.engine[s.held_at[page]] += 1
    table = s.tensor.block_table
    expected = [
        (0, e) if e < 3 else (1, e - 3) for e in range(table.size) if int(table[e]) in stale
    ]
    before = snapshot(s)
    with pytest.raises(PageDigestError) as caught:
        hw.decode(blob, into=hw.InPlace(s.store, s.free))
    assert list(caught.value.positions) == expected
    assert set(caught.value.pages) == stale and snapshot(s) == before
    r = _in_place_report(blob, s.store, s.free)
    assert list(r.positions) == expected
    assert set(r.stale.tolist()) == {s.held_at[p] for p in stale}
    assert set(r.written.tolist()) == set(s.free[: 1 + len(stale)].tolist())


def test_every_error_is_a_hurray_wire_error() -> None:
    for kind in (ArgumentTypeError, InvalidTensorError, PageDigestError, PageStoreError):
        assert issubclass(kind, HurrayWireError)
