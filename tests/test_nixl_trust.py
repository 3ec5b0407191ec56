"""What a NIXL peer can reach of the receiver's memory (docs/nixl.md § 3.1, issue 22).

The peer is played by the sender's own NIXL agent (``s.agent``), two agents in one process:
it posts WRITEs of its choosing, as a hostile sender's NIXL would. NIXL only checks that a
remote address lies in memory the peer's metadata describes, so what the receiver's
``metadata()`` names is what a peer can write: nothing, or the write region only.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

import numpy as np
import pytest

import hurray_wire as hw
from tests import test_nixl  # skips this module too where NIXL cannot load

hwnixl, peer = test_nixl.hwnixl, test_nixl.peer

ENGINE_PAGES = 16
SENTINEL = np.float16(-3.0)
_PAGE = int(np.prod(peer.PAGE_SHAPE)) * 2  # bytes of one float16 page


def _pair(write: int = 0, *engine: Any) -> tuple[Any, Any, np.ndarray[Any, Any]]:
    """A sender and a receiver (``write_arena_bytes=write``), and the sender's hostile
    source buffer (registered before the metadata exchange, as a peer's memory is)."""
    s = hwnixl.NixlSender("trust-sender", ucx_error_handling_mode="none", arena_bytes=8 << 20)
    r = hwnixl.NixlReceiver("trust-receiver", ucx_error_handling_mode="none",
                            arena_bytes=8 << 20, write_arena_bytes=write)  # fmt: skip
    for array in engine:
        r.register(array)
    evil = np.full(1 << 16, 0x7F, np.uint8)
    s.register(evil)
    s.add_peer(r.metadata())
    r.add_peer(s.metadata())
    return s, r, evil


def _hostile_write(s: Any, r: Any, evil: np.ndarray[Any, Any], address: int, size: int) -> str:
    """The peer WRITEs ``size`` bytes of 0x7F at the receiver's ``address``: "DONE" when it
    landed, else the refusal NIXL gave the peer."""
    agent = s.agent
    try:
        local = agent.get_xfer_descs([(int(evil.ctypes.data), size, 0)], "DRAM")
        remote = agent.get_xfer_descs([(address, size, 0)], "DRAM")
        handle = agent.initialize_xfer("WRITE", local, remote, s.peer, b"")
        state = agent.transfer(handle)
        until = time.monotonic() + 10
        while state not in ("DONE", "ERR") and time.monotonic() < until:
            state = agent.check_xfer_state(handle)
            r.agent.get_new_notifs()  # the target progresses too
        return str(state)
    except Exception as exc:  # NIXL's own refusal (nixlNotFoundError)
        return type(exc).__name__


def _move(s: Any, r: Any, count: int) -> list[hw.BlockPagedTensor]:
    thread = threading.Thread(target=lambda: _quiet(s))
    thread.start()
    try:
        return list(r.receive(count, deadline=10))
    finally:
        thread.join()


def _address(array: np.ndarray[Any, Any]) -> int:
    return int(array.ctypes.data)


@pytest.mark.parametrize("op", ["READ", "WRITE"])
def test_a_yielded_tensor_cannot_be_written_by_the_peer(op: str) -> None:
    """After validation the peer WRITEs over the tensor's block table: refused by its NIXL
    (the receiver's metadata does not name the landing region); in WRITE mode the peer's
    write region takes the bytes, but the tensor is a copy that does not live there."""
    s, r, evil = _pair(1 << 20)
    pool = peer.cache_pool(1, "key", 8)
    sent = peer.cache_tensor(pool, 1, "key")
    s.publish(sent, op=op)
    (got,) = _move(s, r, 1)
    table = got.block_table.copy()
    assert _hostile_write(s, r, evil, _address(got.block_table), got.block_table.nbytes) != "DONE"
    assert _hostile_write(s, r, evil, _address(got.page_pool), 4096) != "DONE"
    write_region = r._write.buf
    assert _hostile_write(s, r, evil, _address(write_region), 1 << 16) == "DONE"  # its own
    assert not np.shares_memory(got.block_table, write_region)
    assert not np.shares_memory(got.page_pool, write_region)
    np.testing.assert_array_equal(got.block_table, table)
    np.testing.assert_array_equal(got.gather_sequence(0), sent.gather_sequence(0))
    s.close()
    r.close()


@pytest.mark.parametrize("op", ["READ", "WRITE"])
def test_an_extra_write_at_an_engine_page_not_granted_is_refused(
    op: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """expect(IntoPages(pool, [3, 4, 9, 10])); the peer adds a WRITE descriptor for engine page 0
    to its transfer (WRITE) or posts one of its own (READ): NIXL refuses it, page 0 and
    every other page not granted keep their bytes."""
    engine = np.full((ENGINE_PAGES, *peer.PAGE_SHAPE), SENTINEL, np.float16)
    s, r, evil = _pair(1 << 20, engine)
    pool = peer.cache_pool(0, "key", 4)
    ids = [3, 4, 9, 10]
    r.expect(0, "key", hw.IntoPages(engine, ids))
    real = s._post

    def with_page_zero(kind: str, local: Any, remote: Any, notif: bytes = b"") -> Any:
        row = np.array([[_address(evil), _PAGE, 0]], np.uint64)
        zero = np.array([[_address(engine), _PAGE, 0]], np.uint64)
        return real(kind, np.vstack([local, row]), np.vstack([remote, zero]), notif)

    if op == "WRITE":
        monkeypatch.setattr(s, "_post", with_page_zero)
    s.publish(peer.cache_tensor(pool, 0, "key"), op=op)
    if op == "WRITE":
        with pytest.raises(hw.errors.TransportError, match="the sender aborted"):
            _move(s, r, 1)
    else:
        _move(s, r, 1)
        np.testing.assert_array_equal(engine[ids], pool)
        assert _hostile_write(s, r, evil, _address(engine), _PAGE) != "DONE"
    others = np.setdiff1d(np.arange(ENGINE_PAGES), ids)
    assert (engine[others] == SENTINEL).all()
    s.close()
    r.close()


def test_write_mode_lands_in_engine_pages_only_after_validation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A WRITE blob damaged in the write region (by the peer, after its done record) is
    refused, and the engine pages it was expected at were never written."""
    engine = np.full((ENGINE_PAGES, *peer.PAGE_SHAPE), SENTINEL, np.float16)
    s, r, _ = _pair(1 << 20, engine)
    pool = peer.cache_pool(2, "value", 4)
    r.expect(2, "value", hw.IntoPages(engine, [5, 6, 1, 2]))
    real = r._decode

    def damaged(item: Any) -> Any:
        r._write.buf[item.write_at + item.offer.pool_offset + 99] ^= 0x10
        return real(item)

    monkeypatch.setattr(r, "_decode", damaged)
    s.publish(peer.cache_tensor(pool, 2, "value"), op="WRITE")
    with pytest.raises(hw.errors.TransportError) as info:
        _move(s, r, 1)
    assert isinstance(info.value.__cause__, hw.errors.ChecksumError)
    assert (engine == SENTINEL).all()
    s.close()
    r.close()


@pytest.mark.parametrize("mode", ["zero-copy", "staged"])
def test_write_lands_whole_and_at_page_ids(mode: str) -> None:
    """The write region is copied out: page ids with more than 256 runs (a grant is one
    segment now), and every engine page not granted untouched."""
    pages = 300
    pool = peer.cache_pool(3, "key", pages)
    engine = np.full((2 * pages, *peer.PAGE_SHAPE), SENTINEL, np.float16)
    ids = np.arange(0, 2 * pages, 2)[::-1]
    s, r, _ = _pair(8 << 20, engine)
    r.expect(3, "key", hw.IntoPages(engine, ids))
    sent = peer.cache_tensor(pool, 3, "key")
    s.publish(sent, op="WRITE", mode=mode)
    (got,) = _move(s, r, 1)
    np.testing.assert_array_equal(engine[ids], pool)
    assert (engine[1::2] == SENTINEL).all()
    np.testing.assert_array_equal(got.block_table, ids[sent.block_table])
    assert np.shares_memory(got.page_pool, engine)
    s.close()
    r.close()


def test_a_receiver_without_a_write_region_refuses_write() -> None:
    s, r, evil = _pair()
    s.publish(peer.cache_tensor(peer.cache_pool(0, "value", 2), 0, "value"), op="WRITE")
    errors: list[hw.errors.TransportError] = []

    def drive() -> None:
        try:
            s.wait(deadline=10)
        except hw.errors.TransportError as exc:
            errors.append(exc)

    thread = threading.Thread(target=drive)
    thread.start()
    with pytest.raises(hw.errors.TransportError, match="takes no WRITE") as info:
        list(r.receive(1, deadline=10))
    thread.join()
    assert (info.value.layer, info.value.role) == (0, "value")
    assert errors and "the receiver aborted" in str(errors[0])
    assert _hostile_write(s, r, evil, _address(r._arena.buf), 4096) != "DONE"
    s.close()
    r.close()


def test_a_write_blob_larger_than_the_write_region_is_refused() -> None:
    s, r, _ = _pair(64 << 10)
    s.publish(peer.cache_tensor(peer.cache_pool(0, "key", 8), 0, "key"), op="WRITE")
    thread = threading.Thread(target=lambda: _quiet(s))
    thread.start()
    with pytest.raises(hw.errors.TransportError, match="write region") as info:
        list(r.receive(1, deadline=10))
    thread.join()
    assert "<= 65536" in str(info.value)
    s.close()
    r.close()


def _quiet(s: Any) -> None:
    with contextlib.suppress(hw.errors.TransportError):
        s.wait(deadline=10)


@pytest.mark.parametrize("value", [-1, 1, 63, 1.5, True, "64"])
def test_write_arena_bytes_is_checked(value: Any) -> None:
    with pytest.raises(hw.errors.ArgumentTypeError, match="write_arena_bytes"):
        hwnixl.NixlReceiver("x", write_arena_bytes=value)
    for staging in (value, 0):  # the staging region has no "none": 0 is refused too
        with pytest.raises(hw.errors.ArgumentTypeError, match="staging_bytes"):
            hwnixl.NixlReceiver("x", staging_bytes=staging)


def test_a_receiver_registers_after_its_metadata() -> None:
    """A receiver's metadata names none of its memory, so an engine pool registered after
    the exchange takes a READ landing at once (a sender's registration would be stale)."""
    s, r, evil = _pair()
    engine = np.full((ENGINE_PAGES, *peer.PAGE_SHAPE), SENTINEL, np.float16)
    r.register(engine)
    pool = peer.cache_pool(5, "key", 4)
    r.expect(5, "key", hw.IntoPages(engine, [12, 13, 0, 7]))
    s.publish(peer.cache_tensor(pool, 5, "key"))
    (got,) = _move(s, r, 1)
    np.testing.assert_array_equal(engine[[12, 13, 0, 7]], pool)
    assert np.shares_memory(got.page_pool, engine)
    assert _hostile_write(s, r, evil, _address(engine), _PAGE) != "DONE"
    with pytest.raises(hw.errors.TransportError, match="before taking metadata"):
        s.register(np.zeros(64, np.uint8))
    s.close()
    r.close()
