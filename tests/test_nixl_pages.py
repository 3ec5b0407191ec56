"""NixlReceiver.expect(layer, role, IntoPages(...)): blob pages land on the engine's pages."""

from __future__ import annotations

import contextlib
import threading
from typing import Any

import numpy as np
import pytest

import hurray_wire as hw
from tests import test_nixl  # skips this module too where NIXL cannot load

hwnixl, peer = test_nixl.hwnixl, test_nixl.peer

ENGINE_PAGES = 40
SENTINEL = np.float16(-3.0)


def _engine() -> np.ndarray[Any, Any]:
    return np.full((ENGINE_PAGES, *peer.PAGE_SHAPE), SENTINEL, np.float16)


def _connected(*arrays: np.ndarray[Any, Any], sender_arrays: tuple[Any, ...] = ()) -> Any:
    s = hwnixl.NixlSender("pages-sender", ucx_error_handling_mode="none", arena_bytes=8 << 20)
    r = hwnixl.NixlReceiver("pages-receiver", ucx_error_handling_mode="none",
                            arena_bytes=8 << 20, write_arena_bytes=8 << 20)  # fmt: skip
    for array in arrays:
        r.register(array)
    for array in sender_arrays:
        s.register(array)
    s.add_peer(r.metadata())
    r.add_peer(s.metadata())
    return s, r


def _move(s: Any, r: Any, count: int) -> dict[tuple[int | None, str], hw.BlockPagedTensor]:
    thread = threading.Thread(target=s.wait, kwargs={"deadline": 10})
    thread.start()
    try:
        return {(t.layer_index, t.kv_role): t for t in r.receive(count, deadline=10)}
    finally:
        thread.join()


@pytest.mark.parametrize(
    "op, mode, compression",
    [("READ", "zero-copy", None), ("WRITE", "zero-copy", None), ("READ", "staged", None),
     ("WRITE", "staged", "zstd")],
)  # fmt: skip
def test_pages_land_on_the_engine_page_ids(op: str, mode: str, compression: Any) -> None:
    pool = peer.cache_pool(3, "value", 12)
    pool[::4] = 0.5  # compressible, for the zstd case
    tensor = peer.cache_tensor(pool, 3, "value")
    engine = _engine()
    ids = np.array([7, 8, 9, 30, 2, 3, 4, 5, 39, 0, 20, 21])  # runs and single pages
    s, r = _connected(engine, sender_arrays=(pool, tensor.block_table, tensor.seq_ptr))
    r.expect(3, "value", hw.IntoPages(engine, ids))
    s.publish(tensor, op=op, mode=mode, compression=compression)
    got = _move(s, r, 1)[3, "value"]
    assert got.page_pool.shape == engine.shape and np.shares_memory(got.page_pool, engine)
    np.testing.assert_array_equal(got.block_table, ids[tensor.block_table])
    np.testing.assert_array_equal(got.seq_ptr, tensor.seq_ptr)
    # what attention reads through the block table is the sender's pages
    np.testing.assert_array_equal(got.page_pool[got.block_table], pool[tensor.block_table])
    others = np.setdiff1d(np.arange(ENGINE_PAGES), ids)
    assert (engine[others] == SENTINEL).all()  # no other engine page written
    np.testing.assert_array_equal(engine[ids], pool)
    s.close()
    r.close()


@pytest.mark.parametrize("one_pass", [False, True], ids=["staged", "one_pass"])
def test_a_page_damaged_where_it_landed_is_refused(
    one_pass: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pool checksum is computed over the bytes where they landed: the staging ring
    (then the engine is untouched) or, with one_pass, the engine pages themselves."""
    pool = peer.cache_pool(0, "key", 8)
    tensor = peer.cache_tensor(pool, 0, "key")
    engine = _engine()
    s, r = _connected(engine, sender_arrays=(pool, tensor.block_table, tensor.seq_ptr))
    ids = np.array([12, 13, 14, 3, 4, 30, 31, 32])
    r.expect(0, "key", hw.IntoPages(engine, ids, one_pass=one_pass))
    real = r._decode
    before = engine.tobytes()

    def damaged(item: Any) -> Any:
        if one_pass:
            engine[31].reshape(-1).view(np.uint8)[77] ^= 0x04  # blob page 6, after landing
        else:
            r._staging.buf[item.staged_at + 6 * engine[0].nbytes + 77] ^= 0x04
        return real(item)

    monkeypatch.setattr(r, "_decode", damaged)
    s.publish(tensor)
    info = _refused(s, r)
    assert (info.value.layer, info.value.role) == (0, "key")
    assert isinstance(info.value.__cause__, hw.errors.ChecksumError)
    assert "buffer[0]" in str(info.value)
    assert (engine.tobytes() == before) is not one_pass
    s.close()
    r.close()


def _refused(
    s: Any, r: Any, match: str | None = None
) -> pytest.ExceptionInfo[hw.errors.TransportError]:
    """The receiver refuses the one blob offered while the sender is driven to its end."""
    thread = threading.Thread(target=lambda: _quiet(s))
    thread.start()
    try:
        with pytest.raises(hw.errors.TransportError, match=match) as info:
            list(r.receive(1, deadline=10))
    finally:
        thread.join()
    return info


def _quiet(s: Any) -> None:
    with contextlib.suppress(hw.errors.TransportError):
        s.wait(deadline=10)


def test_page_count_that_differs_from_the_offer_is_a_typed_error() -> None:
    pool = peer.cache_pool(1, "key", 8)
    engine = _engine()
    s, r = _connected(engine)
    r.expect(1, "key", hw.IntoPages(engine, np.arange(6)))  # the blob has 8 pages
    s.publish(peer.cache_tensor(pool, 1, "key"))
    info = _refused(s, r, "page_ids")
    assert (info.value.layer, info.value.role) == (1, "key")
    s.close()
    r.close()


@pytest.mark.parametrize(
    "page_ids, field, message",
    [
        ([0, 1, 40], "page_ids", "lie in"),
        ([-1, 2], "page_ids", "lie in"),
        ([3, 4, 3], "page_ids", "distinct"),
        ([[1, 2]], "page_ids", "1-D"),
        ([1.0, 2.0], "page_ids", "integers"),
        ("12", "page_ids", "1-D"),
    ],
)
def test_bad_page_ids_are_typed_errors(page_ids: Any, field: str, message: str) -> None:
    engine = _engine()
    r = hwnixl.NixlReceiver("pages-args", ucx_error_handling_mode="none", arena_bytes=1 << 20)
    r.register(engine)
    with pytest.raises(hw.errors.ArgumentTypeError, match=message) as info:
        r.expect(0, "key", hw.IntoPages(engine, page_ids))
    assert info.value.field == field
    flat = np.zeros(1 << 16, np.uint8)
    r.register(flat)
    with pytest.raises(hw.errors.ArgumentTypeError) as info:
        r.expect(0, "key", hw.IntoPages(flat[:0], [0]))
    assert info.value.field == "page_pool"
    r.close()


def test_a_quantized_blob_is_refused_with_page_ids() -> None:
    engine = np.zeros((ENGINE_PAGES, *peer.PAGE_SHAPE), np.int8)
    s, r = _connected(engine)
    pool = np.ones((4, *peer.PAGE_SHAPE), np.int8)
    scales = np.ones(4 * peer.PAGE_SHAPE[0], np.float16)  # one per page slot
    quantization = hw.PerBlockAffine.symmetric(
        axis=0, block_size=peer.PAGE_SHAPE[0], scale_buffer_index=3, scale_type=hw.float16
    )
    tensor = hw.BlockPagedTensor.from_arrays(
        pool, [0, 1, 2, 3], [0, 4], kv_role="key", layer_index=0,
        quantization=quantization, scales=scales,
    )  # fmt: skip
    r.expect(0, "key", hw.IntoPages(engine, [5, 6, 7, 8]))
    s.publish(tensor)
    _refused(s, r, "unquantized")
    s.close()
    r.close()


def test_page_ids_in_300_runs_are_read_in_one_transfer() -> None:
    """One descriptor per run (a WRITE is granted one segment of the write region: see
    tests/test_nixl_trust.py)."""
    pages = 300
    pool = peer.cache_pool(2, "key", pages)
    engine = np.zeros((2 * pages, *peer.PAGE_SHAPE), np.float16)
    ids = np.arange(0, 2 * pages, 2)  # every other page: 300 runs of one page
    s, r = _connected(engine)
    r.expect(2, "key", hw.IntoPages(engine, ids))
    s.publish(peer.cache_tensor(pool, 2, "key"))
    got = _move(s, r, 1)[2, "key"]
    np.testing.assert_array_equal(engine[ids], pool)
    np.testing.assert_array_equal(
        got.block_table, ids[peer.cache_tensor(pool, 2, "key").block_table]
    )
    s.close()
    r.close()


def test_a_delta_decodes_in_place_into_the_engine_pool() -> None:
    """Issue 14 over NIXL, in place: the engine's pool holds the earlier request's pages
    (indexed in an EnginePoolStore), the receiver sends their digests, the sender sends only
    the new pages, which land in free engine pages; the rest are pointed at, not copied."""
    from hurray_wire.integrity import EnginePoolStore

    pages = 16
    earlier = peer.cache_pool(5, "value", pages)
    now = earlier.copy()
    now.view(np.uint16)[12:] ^= 1  # 4 of 16 pages are new
    tensor = peer.cache_tensor(now, 5, "value")
    engine = _engine()
    held = np.arange(20, 20 + pages)
    engine[held] = earlier
    store = EnginePoolStore(engine)
    store.index(held)
    before = engine.copy()
    s = hwnixl.NixlSender("inplace-sender", ucx_error_handling_mode="none", arena_bytes=8 << 20)
    r = hwnixl.NixlReceiver("inplace-receiver", ucx_error_handling_mode="none",
                            arena_bytes=8 << 20)  # fmt: skip
    s.add_peer(r.metadata())
    r.add_peer(s.metadata())
    free = np.array([3, 4, 5, 6, 7])
    r.expect(5, "value", hw.InPlace(store, free))
    with pytest.raises(hw.errors.ArgumentTypeError, match="already expected in place"):
        r.expect(5, "value", hw.IntoArray(engine))

    def send() -> None:
        known = s.known_pages(deadline=10)
        s.publish(tensor, mode="staged", known_pages=known, page_digests=True)
        s.wait(deadline=10)

    thread = threading.Thread(target=send)
    thread.start()
    r.send_known_pages(store.digests())
    (got,) = r.receive(1, deadline=10)
    thread.join()
    assert got.page_pool is engine or np.shares_memory(got.page_pool, engine)
    bits = got.page_pool.view(np.uint16)
    np.testing.assert_array_equal(bits[got.block_table], now.view(np.uint16)[tensor.block_table])
    changed = engine.view(np.uint16) != before.view(np.uint16)
    written = np.flatnonzero(changed.reshape(ENGINE_PAGES, -1).any(axis=1))
    assert set(written.tolist()) <= set(free.tolist()) and written.size == 4
    assert set(np.unique(got.block_table).tolist()) <= set(held[:12].tolist()) | set(free[:4])
    with pytest.raises(hw.errors.ArgumentTypeError, match="EnginePoolStore"):
        r.expect(6, "key", hw.InPlace(engine, free))  # type: ignore[arg-type]
    s.close()
    r.close()


@pytest.mark.parametrize("op", ["READ", "WRITE"])
def test_a_request_sends_only_its_pages_read_where_they_lie(op: str) -> None:
    """A 3-page request over a 4096-page engine pool: the offer is the 3 pages (plus a
    header), the pool pages are READ in place (segments inside the engine pool), and the
    decode side lands them on the blocks it allocated (docs/nixl.md § 7)."""
    page_shape = (16, 2, 64)  # 4 KiB of float16 per page: every page a zero-copy segment
    pool = np.random.default_rng(4).random((4096, *page_shape)).astype(np.float16)
    request = [4000, 17, 18]
    tensor = hw.BlockPagedTensor.from_arrays(pool, request, [0, 3], seq_lens=[40],
                                             kv_role="key", layer_index=0)  # fmt: skip
    engine = np.zeros((64, *page_shape), np.float16)
    s, r = _connected(engine, sender_arrays=(pool,))
    offers: list[Any] = []
    send = s._send

    def spy(record: Any) -> Any:
        offers.append(record)
        return send(record)

    s._send = spy
    r.expect(0, "key", hw.IntoPages(engine, [5, 9, 2]))
    s.publish(tensor, op=op)
    got = _move(s, r, 1)[0, "key"]
    page = pool[0].nbytes
    (offer,) = [o for o in offers if o.kind == "offer"]
    assert 3 * page < offer.total_length < 3 * page + 4096  # not 4096 pages: 3
    base = int(pool.ctypes.data)
    in_pool = sorted((g.address - base) // page for g in offer.segments
                     if base <= g.address < base + pool.nbytes)  # fmt: skip
    assert in_pool == [17, 4000]  # two runs, read where they lie: no copy
    np.testing.assert_array_equal(got.block_table, [5, 9, 2])
    np.testing.assert_array_equal(engine[[5, 9, 2]], pool[request])
    np.testing.assert_array_equal(got.seq_lens, [40])
    s.close()
    r.close()


def test_pages_all_still_sends_the_whole_pool() -> None:
    pool = peer.cache_pool(2, "key", 12)
    tensor = hw.BlockPagedTensor.from_arrays(pool, [3, 4], [0, 2], kv_role="key",
                                             layer_index=2)  # fmt: skip
    s, r = _connected(sender_arrays=(pool,))
    s.publish(tensor, pages="all")
    got = _move(s, r, 1)[2, "key"]
    np.testing.assert_array_equal(got.page_pool, pool)
    np.testing.assert_array_equal(got.block_table, [3, 4])
    with pytest.raises(hw.errors.ArgumentTypeError, match="pages"):
        s.publish(tensor, pages="some")
    s.close()
    r.close()
