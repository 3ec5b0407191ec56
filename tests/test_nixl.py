"""hurray-wire over NIXL (hurray_wire.transport.nixl): two processes on one machine.

The sender is tests/nixl_peer.py in a child process; this process is the receiver. The big
run moves 8 layers x {key, value} of 16 MiB (256 MiB) with every combination of READ/WRITE
and zero-copy/staged, half of the page pools landing straight in "engine" arrays, and
checks every value. Then the faults: a flipped byte (reported with its layer and role), a
killed sender and an abort (both a clean TransportError, bounded by the deadline), and, in
one process, a sender that lies about a blob's length. Skipped where NIXL cannot load.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import hurray_wire as hw
from hurray_wire.integrity import EnginePoolStore
from hurray_wire.transport import records

try:
    from hurray_wire.transport import nixl as hwnixl
except hw.errors.TransportError as exc:  # NIXL not installed or its libraries do not load
    pytest.skip(f"NIXL cannot load here: {exc}", allow_module_level=True)

__all__ = ["hwnixl", "peer"]  # shared with test_nixl_pages.py

HELPER = Path(__file__).resolve().parent / "nixl_peer.py"
_spec = importlib.util.spec_from_file_location("nixl_peer", HELPER)
assert _spec is not None and _spec.loader is not None
peer = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(peer)


class Sender:
    """The helper process, with the metadata exchange done over two pipes."""

    def __init__(self, receiver: Any, *extra: str, layers: int = 8, pages: int = 1024) -> None:
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        fds = ["--in-fd", str(to_child_r), "--out-fd", str(from_child_w)]
        size = ["--layers", str(layers), "--pages", str(pages)]
        argv = [sys.executable, str(HELPER), *fds, *size, *extra]
        self.process = subprocess.Popen(
            argv, pass_fds=(to_child_r, from_child_w), stdout=subprocess.DEVNULL
        )
        os.close(to_child_r)
        os.close(from_child_w)
        receiver.add_peer(peer.recv_bytes(from_child_r))
        peer.send_bytes(to_child_w, receiver.metadata())
        os.close(from_child_r)
        os.close(to_child_w)

    def finish(self) -> int:
        try:
            return self.process.wait(timeout=30)
        finally:
            if self.process.poll() is None:
                self.process.kill()


@pytest.fixture
def receiver() -> Iterator[Any]:
    r = hwnixl.NixlReceiver(  # WRITE blobs are copied out of the write region whole
        "nixl-test-receiver", ucx_error_handling_mode="none", arena_bytes=224 << 20,
        write_arena_bytes=64 << 20,
    )  # fmt: skip
    yield r
    r.close()


def test_multi_layer_cache_every_value(receiver: Any) -> None:
    layers, pages = 8, 1024
    engine = {}
    for layer in range(layers // 2):  # these layers land in the engine's own page pools
        for role in peer.ROLES:
            engine[layer, role] = np.zeros((pages, *peer.PAGE_SHAPE), np.float16)
            receiver.register(engine[layer, role])
    sender = Sender(receiver, layers=layers, pages=pages)
    for (layer, role), pool in engine.items():
        receiver.expect(layer, role, hw.IntoArray(pool))
    seen = []
    for tensor in receiver.receive(2 * layers, deadline=60):
        key = (tensor.layer_index, tensor.kv_role)
        seen.append(key)
        expected = peer.cache_pool(*key, pages)
        assert tensor.page_pool.view(np.uint16).tobytes() == expected.view(np.uint16).tobytes()
        np.testing.assert_array_equal(tensor.block_table, np.arange(pages)[::-1])
        np.testing.assert_array_equal(tensor.seq_ptr, [0, pages // 3, pages])
        if key in engine:
            assert np.shares_memory(tensor.page_pool, engine[key])
    assert sorted(seen) == sorted((layer, role) for layer in range(layers) for role in peer.ROLES)
    assert sender.finish() == 0


def test_corrupted_byte_names_layer_and_role(receiver: Any) -> None:
    sender = Sender(receiver, "--corrupt", "2:value", layers=3, pages=64)
    got = []
    with pytest.raises(hw.errors.TransportError) as info:
        for tensor in receiver.receive(6, deadline=20):
            got.append((tensor.layer_index, tensor.kv_role))
    assert (info.value.layer, info.value.role) == (2, "value")
    assert isinstance(info.value.__cause__, hw.errors.ChecksumError)
    assert "buffer[0]" in str(info.value)
    assert (2, "value") not in got
    sender.finish()


def test_corrupted_byte_in_engine_array(receiver: Any) -> None:
    pool = np.zeros((64, *peer.PAGE_SHAPE), np.float16)
    receiver.register(pool)
    sender = Sender(receiver, "--corrupt", "0:key", layers=1, pages=64)
    receiver.expect(0, "key", hw.IntoArray(pool))
    with pytest.raises(hw.errors.TransportError) as info:
        list(receiver.receive(2, deadline=20))
    assert (info.value.layer, info.value.role) == (0, "key")
    assert isinstance(info.value.__cause__, hw.errors.ChecksumError)
    sender.finish()


def test_killed_sender_is_a_clean_error_within_the_deadline(receiver: Any) -> None:
    sender = Sender(receiver, "--die-after", "3", layers=4, pages=64)
    got = []
    start = time.monotonic()
    with pytest.raises(hw.errors.TransportError, match="deadline passed"):
        for tensor in receiver.receive(8, deadline=4):
            got.append(tensor.layer_index)
    assert time.monotonic() - start < 15
    assert len(got) == 3
    assert sender.finish() == -9


def test_abort_ends_the_transfer_at_once(receiver: Any) -> None:
    sender = Sender(receiver, "--abort-at", "2", layers=4, pages=64)
    start = time.monotonic()
    with pytest.raises(hw.errors.TransportError, match="the sender aborted: test abort after 2"):
        list(receiver.receive(8, deadline=30))
    assert time.monotonic() - start < 10
    assert sender.finish() == 0


# -- in one process: two agents, the sender driven from a thread ---------------------------
def _quietly(wait: Any) -> None:
    """Drive a sender whose peer is about to abort (the abort is the test's subject)."""
    with contextlib.suppress(hw.errors.TransportError):
        wait(deadline=10)


def _pair() -> tuple[Any, Any]:
    s = hwnixl.NixlSender("one-sender", ucx_error_handling_mode="none", arena_bytes=8 << 20)
    r = hwnixl.NixlReceiver("one-receiver", ucx_error_handling_mode="none", arena_bytes=8 << 20,
                            write_arena_bytes=8 << 20)  # fmt: skip
    return s, r


def test_lying_offer_length_is_a_typed_error(monkeypatch: pytest.MonkeyPatch) -> None:
    s, r = _pair()
    s.add_peer(r.metadata())
    r.add_peer(s.metadata())
    real = s._send

    def lying(record: Any) -> None:
        if record.kind == "offer":  # 64 bytes more than the blob, still inside the arena
            last = record.segments[-1]
            longer = records.Segment(last.blob_offset, last.length + 64, last.address)
            record = records.TransferRecord(
                "offer", record.session, record.layer, record.role, ready=record.ready,
                total_length=record.total_length + 64, segments=(*record.segments[:-1], longer),
            )  # fmt: skip
        real(record)

    monkeypatch.setattr(s, "_send", lying)
    tensor = peer.cache_tensor(peer.cache_pool(0, "key", 8), 0, "key")
    s.publish(tensor, mode="staged")
    errors: list[BaseException] = []

    def drive() -> None:
        """The sender is done once the receiver has read the blob (its memory is free
        again); the receiver's abort after validating reaches it if it is still waiting."""
        try:
            s.wait(deadline=10)
        except hw.errors.TransportError as exc:
            errors.append(exc)

    thread = threading.Thread(target=drive)
    thread.start()
    with pytest.raises(hw.errors.TransportError, match="total_length is not the blob's") as info:
        list(r.receive(1, deadline=10))
    thread.join()
    assert (info.value.layer, info.value.role) == (0, "key")
    assert all("the receiver aborted" in str(e) for e in errors)
    s.close()
    r.close()


def test_arguments_are_checked() -> None:
    s, r = _pair()
    with pytest.raises(hw.errors.TransportError, match="no peer"):
        s.publish(peer.cache_tensor(peer.cache_pool(0, "key", 2), 0, "key"))
    with pytest.raises(hw.errors.ArgumentTypeError, match="op is"):
        s.publish(peer.cache_tensor(peer.cache_pool(0, "key", 2), 0, "key"), op="PUT")
    with pytest.raises(hw.errors.ArgumentTypeError):
        hwnixl.NixlSender("x", ucx_error_handling_mode="rdma")
    pool = np.zeros((2, *peer.PAGE_SHAPE), np.float16)
    with pytest.raises(hw.errors.TransportError, match="one_pass=True, page_pool is in registered"):
        r.expect(0, "key", hw.IntoArray(pool, one_pass=True))
    r.expect(0, "key", hw.IntoArray(pool))  # staged, then copied
    with pytest.raises(hw.errors.ArgumentTypeError, match="one_pass"):
        r.expect(0, "key", hw.IntoArray(pool, one_pass=1))  # type: ignore[arg-type]
    in_place = hw.InPlace(EnginePoolStore(np.zeros((4, *peer.PAGE_SHAPE), np.float16)), [0])
    with pytest.raises(hw.errors.ArgumentTypeError, match="already expected in a page_pool"):
        r.expect(0, "key", in_place)
    r.expect(1, "key", in_place)
    with pytest.raises(hw.errors.ArgumentTypeError, match="already expected in place"):
        r.expect(1, "key", hw.IntoArray(np.zeros_like(pool)))

    class Landing:  # lands (decode would take it) but is none of the receiver's targets
        def land(self) -> None: ...

    for wrong, found in [(pool, "ndarray"), (None, "NoneType"), (Landing(), "Landing")]:
        with pytest.raises(hw.errors.ArgumentTypeError, match="landing target") as info:
            r.expect(2, "key", wrong)
        assert (info.value.field, info.value.found) == ("into", found)
    s.metadata()
    with pytest.raises(hw.errors.TransportError, match="before taking metadata"):
        s.register(np.zeros(64, np.uint8))
    r.metadata()
    r.register(np.zeros(64, np.uint8))  # a receiver's metadata names none of its memory
    with pytest.raises(hw.errors.ArgumentTypeError, match="deadline"):
        next(iter(r.receive(1, deadline=0)))
    s.close()
    r.close()


def test_importing_hurray_wire_does_not_import_nixl() -> None:
    code = "import sys, hurray_wire, hurray_wire.transport; print('nixl_cu12' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False"


def test_the_guide_runs_as_written() -> None:
    """Every ```python block of docs/nixl.md, run in a fresh interpreter."""
    text = (Path(__file__).resolve().parent.parent / "docs" / "nixl.md").read_text()
    blocks = [b.split("```", 1)[0] for b in text.split("```python\n")[1:]]
    assert blocks
    for code in blocks:
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 0, out.stderr[-2000:]


def test_peer_error_handling_mode_over_tcp() -> None:
    """UCX's default error handling ("peer": RMA emulated over TCP loopback), all four plans."""
    r = hwnixl.NixlReceiver("tcp-receiver", ucx_error_handling_mode="peer", arena_bytes=16 << 20,
                            write_arena_bytes=4 << 20)  # fmt: skip
    try:
        sender = Sender(r, "--ucx", "peer", layers=4, pages=32)
        got = {(t.layer_index, t.kv_role): t for t in r.receive(8, deadline=30)}
        for (layer, role), tensor in got.items():
            expected = peer.cache_pool(layer, role, 32)
            assert tensor.page_pool.view(np.uint16).tobytes() == expected.view(np.uint16).tobytes()
        assert len(got) == 8
        assert sender.finish() == 0
    finally:
        r.close()


def test_failed_write_aborts_the_receiver_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    s, r = _pair()
    s.add_peer(r.metadata())
    r.add_peer(s.metadata())

    def failing(op: str, *args: Any) -> Any:
        raise hw.errors.TransportError(f"NIXL {op} failed to post (simulated)")

    monkeypatch.setattr(s, "_post", failing)
    s.publish(peer.cache_tensor(peer.cache_pool(1, "value", 8), 1, "value"), op="WRITE")
    errors: list[hw.errors.TransportError] = []

    def drive() -> None:
        try:
            s.wait(deadline=10)
        except hw.errors.TransportError as exc:
            errors.append(exc)

    thread = threading.Thread(target=drive)
    thread.start()
    start = time.monotonic()
    with pytest.raises(hw.errors.TransportError, match="the sender aborted") as info:
        list(r.receive(1, deadline=10))
    assert time.monotonic() - start < 5
    thread.join()
    assert (info.value.layer, info.value.role) == (1, "value")
    assert errors and (errors[0].layer, errors[0].role) == (1, "value")
    s.close()
    r.close()


def test_compressed_staged_blob_into_an_engine_array() -> None:
    """A compressed pool cannot land apart: it is decoded, then copied into the engine's
    array, so that the contract of expect() holds."""
    s, r = _pair()
    engine = np.zeros((16, *peer.PAGE_SHAPE), np.float16)
    r.register(engine)
    s.add_peer(r.metadata())
    r.add_peer(s.metadata())
    pool = np.zeros((16, *peer.PAGE_SHAPE), np.float16)
    pool[::3] = 1.5  # compressible
    r.expect(4, "key", hw.IntoArray(engine))
    s.publish(peer.cache_tensor(pool, 4, "key"), mode="staged", compression="zstd")
    s.publish(peer.cache_tensor(pool, 4, "value"), mode="staged", compression="zstd", op="WRITE")
    thread = threading.Thread(target=s.wait, kwargs={"deadline": 10})
    thread.start()
    got = {t.kv_role: t for t in r.receive(2, deadline=10)}
    thread.join()
    for tensor in got.values():
        np.testing.assert_array_equal(tensor.page_pool, pool)
    assert np.shares_memory(got["key"].page_pool, engine)
    with pytest.raises(hw.errors.ArgumentTypeError, match="compression needs mode='staged'"):
        s.publish(peer.cache_tensor(pool, 5, "key"), compression="zstd")
    with pytest.raises(hw.errors.ArgumentTypeError, match="unknown kv_role"):
        r.expect(0, "query", hw.IntoArray(engine))
    s.close()
    r.close()


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_a_staged_blob_is_planned_once(
    compression: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """mode="staged" lays the blob out once: that plan's size is reserved in the arena and
    the same plan is written there (issue 20: it was planned for its size, then again by
    encode_into); the receiver gets the sender's pool."""
    from hurray_wire.blob import encoder

    plans: list[int] = []
    real_plan = encoder.Encoder._plan

    def counted(*args: Any, **kwargs: Any) -> Any:
        plans.append(1)
        return real_plan(*args, **kwargs)

    monkeypatch.setattr(encoder.Encoder, "_plan", counted)
    s, r = _pair()
    s.add_peer(r.metadata())
    r.add_peer(s.metadata())
    pool = np.zeros((16, *peer.PAGE_SHAPE), np.float16)
    pool[::3] = 1.5
    s.publish(peer.cache_tensor(pool, 2, "key"), mode="staged", compression=compression)
    assert len(plans) == 1
    thread = threading.Thread(target=s.wait, kwargs={"deadline": 10})
    thread.start()
    (got,) = r.receive(1, deadline=10)
    thread.join()
    np.testing.assert_array_equal(got.page_pool, pool)
    assert len(plans) == 1
    s.close()
    r.close()


def test_nixl_errors_are_wrapped_with_the_original_as_cause(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An offer pointing outside the sender's registered memory: NIXL refuses the READ."""
    s, r = _pair()
    s.add_peer(r.metadata())
    r.add_peer(s.metadata())
    real = s._send

    def lying(record: Any) -> None:
        if record.kind == "offer":
            moved = tuple(
                records.Segment(g.blob_offset, g.length, 1 << 40) for g in record.segments
            )
            record = records.TransferRecord(
                "offer", record.session, record.layer, record.role, ready=record.ready,
                total_length=record.total_length, segments=moved,
            )  # fmt: skip
        real(record)

    monkeypatch.setattr(s, "_send", lying)
    s.publish(peer.cache_tensor(peer.cache_pool(0, "value", 4), 0, "value"), mode="staged")
    thread = threading.Thread(target=_quietly, args=(s.wait,))
    thread.start()
    with pytest.raises(hw.errors.TransportError, match="NIXL") as info:
        list(r.receive(1, deadline=10))
    thread.join()
    assert (info.value.layer, info.value.role) == (0, "value")
    assert type(info.value.__cause__).__module__.startswith("nixl")
    s.close()
    r.close()


def test_delta_transfer_with_known_pages_and_fingerprint() -> None:
    """Issue 14 over NIXL: the receiver sends the digests its store holds before the sender
    publishes; the sender sends those pages as references; the receiver fills them from its
    store and checks the engine fingerprint."""
    from hurray_wire.integrity import (
        EngineFingerprint,
        MemoryPageStore,
        fingerprint_to_metadata,
        store_pages,
    )

    fp = EngineFingerprint("m", "vllm", "1", "NHD", "float16", 16, 0, 1)
    s = hwnixl.NixlSender("delta-sender", ucx_error_handling_mode="none", arena_bytes=8 << 20)
    store = MemoryPageStore(64 << 20)
    r = hwnixl.NixlReceiver(
        "delta-receiver", ucx_error_handling_mode="none", arena_bytes=8 << 20,
        page_store=store, expect_fingerprint=fp,
    )  # fmt: skip
    s.add_peer(r.metadata())
    r.add_peer(s.metadata())
    earlier = peer.cache_pool(0, "key", 32)
    now = earlier.copy()
    now.view(np.uint16)[28:] ^= 1  # 4 of 32 pages are new
    meta = fingerprint_to_metadata(fp)
    old = peer.cache_tensor(earlier, 0, "key")
    store_pages(store, old, range(32))
    tensor = hw.BlockPagedTensor.from_arrays(
        now, old.block_table, old.seq_ptr, layer_index=0, kv_role="key", metadata=meta
    )
    with pytest.raises(hw.errors.ArgumentTypeError, match="mode='staged'"):
        s.publish(tensor, known_pages=store.digests())
    seen: list[Any] = []

    def send() -> None:  # the sender waits for the record, then publishes against it
        known = s.known_pages(deadline=10)
        seen.append(known)
        s.publish(tensor, mode="staged", known_pages=known, page_digests=True)
        s.wait(deadline=10)

    thread = threading.Thread(target=send)
    thread.start()
    r.send_known_pages(store.digests())
    (got,) = r.receive(1, deadline=10)  # receive's polling also moves the record out
    thread.join()
    assert seen[0].size == 32
    np.testing.assert_array_equal(got.page_pool, now)
    assert len(hw.encode(tensor, known_pages=seen[0])) < len(hw.encode(tensor)) // 4
    with pytest.raises(hw.errors.TransportError, match="known-pages"):
        r._on_known_pages(b"")  # a receiver never takes a known-pages record
    s.close()
    r.close()


def test_fingerprint_mismatch_is_refused_with_the_blob_named() -> None:
    from hurray_wire.errors import IncompatibleFingerprintError
    from hurray_wire.integrity import EngineFingerprint, fingerprint_to_metadata

    ours = EngineFingerprint("m", "vllm", "1", "NHD", "float16", 16, 0, 1)
    theirs = EngineFingerprint("m", "vllm", "1", "HND", "float16", 16, 0, 1)
    s = hwnixl.NixlSender("fp-sender", ucx_error_handling_mode="none", arena_bytes=8 << 20)
    r = hwnixl.NixlReceiver(
        "fp-receiver", ucx_error_handling_mode="none", arena_bytes=8 << 20,
        expect_fingerprint=ours,
    )  # fmt: skip
    s.add_peer(r.metadata())
    r.add_peer(s.metadata())
    t = peer.cache_tensor(peer.cache_pool(2, "key", 8), 2, "key")
    odd = hw.BlockPagedTensor.from_arrays(
        t.page_pool, t.block_table, t.seq_ptr, layer_index=2, kv_role="key",
        metadata=fingerprint_to_metadata(theirs),
    )  # fmt: skip
    s.publish(odd, mode="staged")
    thread = threading.Thread(target=_quietly, args=(s.wait,))
    thread.start()
    with pytest.raises(hw.errors.TransportError, match="kv_cache_layout") as info:
        list(r.receive(1, deadline=10))
    thread.join()
    assert (info.value.layer, info.value.role) == (2, "key")
    assert isinstance(info.value.__cause__, IncompatibleFingerprintError)
    s.close()
    r.close()


def test_arena_is_a_ring_of_pieces_given_back_one_by_one() -> None:
    """The receiver's write and staging regions and the sender's arena: a piece given
    back makes room once the pieces before it are given back too; nothing overlaps."""
    from hurray_wire.transport.nixl_endpoint import _Arena

    arena = _Arena(1024)
    a, b, c = arena.take(256), arena.take(256), arena.take(256)
    assert (a, b, c) == (0, 256, 512)
    assert arena.take(512) is None  # 256 left at the end, none at the front yet
    arena.give(256)  # a middle piece: its room waits for the oldest one
    assert arena.take(300) is None
    arena.give(0)  # the oldest two are back: wrap round to the front
    assert arena.take(500) == 0
    assert arena.take(100) is None  # up to the oldest live piece (512) only: 512 - 512
    arena.give(512)
    assert arena.take(100) == 512  # after the newest, the wrapped one at 0..500
    assert arena.take(2048) is None
    arena.shrink(512, 10)
    assert arena.take(64) == 576
    arena.clear()
    assert arena.take(1024) == 0


@pytest.mark.parametrize(
    ("tamper", "match"),
    [
        (lambda h: h + bytes(64), "ready record's header is not the offer's header segment"),
        (lambda h: h[:100] + bytes([h[100] ^ 1]) + h[101:], "checksum"),
        (lambda h: bytes(len(h)), "magic"),
    ],
    ids=["longer", "one flipped bit", "zeros"],
)
def test_the_header_in_the_ready_record_is_checked(
    tamper: Any, match: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Version 2 carries the blob header in the ready record: its length must be the
    offer's header segment, and the decode pipeline frames and checks it as any header."""
    s, r = _pair()
    s.add_peer(r.metadata())
    r.add_peer(s.metadata())
    real = s._send

    def lying(record: Any) -> None:
        if record.kind == "ready":
            record = records.TransferRecord("ready", record.session, record.layer,
                                            record.role, header=tamper(record.header))  # fmt: skip
        real(record)

    monkeypatch.setattr(s, "_send", lying)
    tensor = peer.cache_tensor(peer.cache_pool(0, "key", 8), 0, "key")
    s.publish(tensor)  # zero-copy, checksums: the header follows in the ready record
    thread = threading.Thread(target=_quietly, args=(s.wait,))
    thread.start()
    with pytest.raises(hw.errors.TransportError, match=match) as info:
        list(r.receive(1, deadline=10))
    thread.join()
    assert (info.value.layer, info.value.role) == (0, "key")
    s.close()
    r.close()


def test_an_offer_whose_header_segment_overlaps_its_pool_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The ready record's header lands in front of the rest: an offer whose header segment
    reaches into the page pool (which would write past the header's room) is refused
    before any READ."""
    s, r = _pair()
    s.add_peer(r.metadata())
    r.add_peer(s.metadata())
    real = s._send

    def lying(record: Any) -> None:
        if record.kind == "offer":
            whole = records.Segment(0, record.total_length, record.segments[0].address)
            record = records.TransferRecord(
                "offer", record.session, record.layer, record.role,
                total_length=record.total_length, pool_offset=record.pool_offset,
                pool_length=record.pool_length, segments=(whole,),
            )  # fmt: skip
        real(record)

    monkeypatch.setattr(s, "_send", lying)
    engine = np.full((8, *peer.PAGE_SHAPE), 7, np.float16)
    r.expect(0, "key", hw.IntoArray(engine))
    s.publish(peer.cache_tensor(peer.cache_pool(0, "key", 8), 0, "key"))
    thread = threading.Thread(target=_quietly, args=(s.wait,))
    thread.start()
    with pytest.raises(hw.errors.TransportError, match="header segment overlaps its page pool"):
        list(r.receive(1, deadline=10))
    thread.join()
    assert (engine == 7).all()
    s.close()
    r.close()
