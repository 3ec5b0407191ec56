"""NixlReceiver: blobs pulled or written into its region, decoded in place (docs/nixl.md)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from concurrent.futures import Future, wait
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hurray_wire.blob import DecodeLimits, blob_length
from hurray_wire.blob.decoder import decode_options, landing_target
from hurray_wire.blob.envelope import pool_section
from hurray_wire.blob.landing import InPlace, IntoArray, IntoPages
from hurray_wire.blob.pipeline import plan_of, run
from hurray_wire.codecs import CODEC_RAW
from hurray_wire.errors import ArgumentTypeError, HurrayWireError, TransportError, non_negative
from hurray_wire.integrity import (
    EngineFingerprint,
    PageStore,
    check_integrity_arguments,
    encode_known_pages,
)
from hurray_wire.tensor import BlockPagedTensor
from hurray_wire.transport.nixl_endpoint import (
    DEFAULT_DEADLINE,
    PEER_READ_NAP,
    _Arena,
    _call,
    _deadline,
    _Endpoint,
    _no_descriptors,
    _pieces,
    _region_bytes,
)
from hurray_wire.transport.records import (
    MAX_HEADER_BYTES,
    ROLE_CODES,
    Segment,
    TransferRecord,
)

__all__ = ["NixlReceiver"]


@dataclass
class _Incoming:
    """One offered blob on the receiver: where it lands and what is still in flight."""

    offer: TransferRecord
    landing: int  # arena offset of the bytes that are not READ apart (split)
    target: IntoArray | IntoPages | InPlace | None = None  # what expect() named
    split: bool = False  # its raw pool is READ apart: into staging, or with one_pass the target
    segments: tuple[Segment, ...] = ()
    xfers: list[Any] = field(default_factory=list)
    head_posted: bool = False  # the header is in place (whole READ, or the ready record)
    landed: bool = False
    started: bool = False  # its transfer posted (offers wait in a queue until then)
    write_at: int | None = None  # WRITE: where the peer writes it in the write region
    staged_at: int | None = None  # a split pool checked in the staging ring, then copied


class NixlReceiver(_Endpoint):
    """The side that takes the KV cache: READs offered blobs into its landing region
    (``arena_bytes``) and decodes each one, validated and zero-copy, as soon as it has landed.

    The peer gets no handle to this side's memory but the write region of
    ``write_arena_bytes`` (WRITE peers; each blob is copied out before it is checked:
    docs/nixl.md § 3.1; without it WRITE offers are refused). ``staging_bytes``: the ring
    ``expect`` READs pools into. Tensors decoded from the landing region are views of it,
    valid until the next ``receive`` call (so the blobs of one call must fit in it).
    """

    _peer_side = "sender"
    # Landed blobs are decoded and their checksums verified on one thread (xxh3 lets go
    # of the GIL), while this thread keeps the later transfers moving.
    _worker_name = "hurray-wire-nixl-decode"

    def __init__(
        self,
        name: str,
        *,
        ucx_error_handling_mode: str = "peer",
        arena_bytes: int = 256 << 20,
        progress_thread: bool = False,
        verify: bool = True,
        limits: DecodeLimits | None = None,
        page_store: PageStore | None = None,
        expect_fingerprint: EngineFingerprint | None = None,
        write_arena_bytes: int = 0,
        staging_bytes: int = 64 << 20,
    ) -> None:
        check_integrity_arguments(page_store, expect_fingerprint)
        if write_arena_bytes != 0:  # 0: no WRITE
            _region_bytes(write_arena_bytes, "write_arena_bytes")
        self._staging_bytes = _region_bytes(staging_bytes, "staging_bytes")
        super().__init__(name, ucx_error_handling_mode=ucx_error_handling_mode,
                         arena_bytes=arena_bytes, progress_thread=progress_thread)  # fmt: skip
        # The only memory a peer is told about (never read in place).
        self._write: _Arena | None = None
        self._write_reg: Any = None
        if write_arena_bytes:
            self._write = _Arena(write_arena_bytes)
            self.register(self._write.buf)
            self._write_reg = self._regions[-1][3]
        self._staging: _Arena | None = None  # registered on the first safe expect()
        self.verify = verify
        self.limits = limits
        self.page_store = page_store
        self.expect_fingerprint = expect_fingerprint
        self._targets: dict[tuple[int, str], IntoArray | IntoPages | InPlace] = {}
        self._in: dict[tuple[int, str], _Incoming] = {}
        self._decoding: list[tuple[_Incoming, Future[Any]]] = []
        self._queued: list[_Incoming] = []  # offered, their transfers not yet posted

    def metadata(self) -> bytes:
        """Connection information and the write region, nothing else: a transfer the peer
        aims at the landing region or an engine pool fails in its own NIXL ("not found")."""
        descs = self._write_reg if self._write_reg is not None else _no_descriptors()
        return bytes(_call("get_partial_agent_metadata", self._agent.get_partial_agent_metadata,
                           descs, True, ["UCX"]))  # fmt: skip

    def send_known_pages(self, digests: Any) -> None:
        """Tell the sender which pages ``page_store`` holds (docs/integrity.md § 5.1), before
        it publishes: it then sends those pages as references."""
        record = encode_known_pages(digests)
        _call("send_notif", self._agent.send_notif, self._peer_name(), record)

    def expect(self, layer: int, role: str, into: IntoArray | IntoPages | InPlace) -> None:
        """Land blob {layer, role} where ``into`` says, as ``decode(data, into=...)``
        (docs/nixl.md § 4). A pool is READ into the staging ring and copied once every
        check passed; ``one_pass=True`` READs it straight into (registered) engine memory,
        so a blob refused after its READ leaves the sent bytes there."""
        key = _checked_key(layer, role)
        landing_target(into, (IntoArray, IntoPages, InPlace))  # decode's check, these kinds
        held = self._targets.get(key)
        if held is not None and isinstance(held, InPlace) != isinstance(into, InPlace):
            where = "in place" if isinstance(held, InPlace) else "in a page_pool"
            raise ArgumentTypeError(f"this blob is already expected {where}",
                                    field="layer", found=f"{layer} {role}")  # fmt: skip
        if not isinstance(into, InPlace):
            self._check_pool(key, into)
        self._targets[key] = into

    def _check_pool(self, key: tuple[int, str], target: IntoArray | IntoPages) -> None:
        """A pool target lands in registered memory (one_pass) and on no bytes the
        receiver or another expected blob uses; the staging ring made for it."""
        layer, role = key
        flat = target.flat
        if target.one_pass and not self._registered(int(flat.ctypes.data), flat.nbytes):
            raise TransportError("with one_pass=True, page_pool is in registered memory",
                                 layer=layer, role=role)  # fmt: skip
        own = [r.buf for r in (self._arena, self._write, self._staging) if r is not None]
        others = [v for k, v in self._targets.items() if k != key and not isinstance(v, InPlace)]
        spans = [(x, y) for other in others for x, y in other.spans()]
        if any(np.may_share_memory(flat, buf) for buf in own) or any(
            x < w and v < y for x, y in target.spans() for v, w in spans
        ):
            raise ArgumentTypeError("page_pool overlaps the receiver's own memory or the "
                                    "pages another expected blob lands on", field="page_pool",
                                    found=f"layer {layer} {role}")  # fmt: skip
        if not target.one_pass and self._staging is None:
            self._staging = _Arena(self._staging_bytes)
            self.register(self._staging.buf)

    def receive(self, count: int, *, deadline: float = DEFAULT_DEADLINE) -> Iterator[Any]:
        """Yield ``count`` tensors in the order they land (each decoded and validated);
        TransportError naming the blob on any failure, or once ``deadline`` seconds pass."""
        non_negative(count, "count")
        until = _deadline(deadline)
        self._peer_name()
        if not self._in and not self._decoding:
            for arena in (self._arena, self._write, self._staging):
                if arena is not None:
                    arena.clear()
        yielded = 0
        idle = 0
        while yielded < count:
            try:
                moved = self._step()
            except TransportError as exc:
                self._abort_peer(str(exc), exc.layer, exc.role)
                raise
            for key in [k for k, item in self._in.items() if item.landed]:
                item = self._in.pop(key)
                # Checksums are hashed on the decoder thread, beside the next transfer;
                # the rest of a decode is a few microseconds, cheaper than a hand-off
                # (measured: GIL hand-offs doubled the time between transfers).
                held = self._arena.buf[item.landing :]
                if item.write_at is not None and self._write is not None:
                    held = self._write.buf[item.write_at :]
                if self.verify and pool_section(held)[3]:  # the header: sections checksummed
                    future = self._worker.submit(self._decode, item)
                else:  # a few microseconds: no thread hand-off
                    future = Future()
                    try:
                        future.set_result(self._decode(item))
                    except HurrayWireError as exc:
                        future.set_exception(exc)
                self._decoding.append((item, future))
            if self._queued:  # one transfer per turn: the blobs that landed get decoded
                item = self._queued.pop(0)
                if self._guarded(item.offer, self._start, item):  # an error aborts the peer
                    moved = True
                else:  # waiting for room in the write region or staging ring
                    self._queued.insert(0, item)
            if self._decoding and self._decoding[0][1].done():
                item, future = self._decoding.pop(0)
                for ring, at in ((self._write, item.write_at), (self._staging, item.staged_at)):
                    if ring is not None and at is not None:
                        ring.give(at)  # copied out: its room may be written again
                tensor = self._guarded(item.offer, future.result)
                yielded += 1
                idle = 0
                yield tensor
                continue
            idle = 0 if moved else idle + 1
            if time.monotonic() > until and yielded < count:
                pending = [k for k, item in self._in.items() if not item.landed]
                layer, role = pending[0] if pending else (None, None)
                self._abort_peer("receiver deadline passed", layer, role)
                message = f"deadline passed: {yielded} of {count} blobs received, "
                raise TransportError(f"{message}{len(pending)} in flight", layer=layer, role=role)
            if not moved:
                self._nap(idle)

    def _nap(self, idle: int) -> None:
        """Wait between polls without taking the core the hashing needs (measured: spinning
        cost the sender's hasher and our decoder a third of the CPU); our own READs move
        only while we poll."""
        if any(item.xfers for item in self._in.values()):
            time.sleep(0)
        elif self._decoding:
            wait([self._decoding[0][1]], timeout=PEER_READ_NAP)
        else:
            time.sleep(PEER_READ_NAP if idle < 64 else 0.0002)

    def _step(self) -> bool:
        moved = self._records()
        for item in self._in.values():
            if item.landed or item.offer.write or not item.started:
                continue
            if item.xfers:  # finished READs let go at once: item.xfers is what still moves
                states = [self._guarded(item.offer, self._state, x) for x in item.xfers]
                for x, state in zip(item.xfers, states, strict=True):
                    if state == "DONE":
                        x.release()
                item.xfers = [x for x, st in zip(item.xfers, states, strict=True) if st != "DONE"]
            if item.head_posted and not item.xfers:
                item.landed = moved = True
                r = item.offer
                self._send(TransferRecord("done", r.session, r.layer, r.role))
        return moved

    def _on_record(self, r: TransferRecord) -> None:
        assert r.layer is not None and r.role is not None  # records.py: all but abort name both
        key = (r.layer, r.role)
        item = self._in.get(key)
        if r.kind == "offer" and item is None:
            item = self._in[key] = self._land(r)
            self._queued.append(item)  # posted by receive(), one per turn
        elif r.kind == "ready" and item is not None and not item.offer.write:
            if item.head_posted or item.offer.ready:
                raise TransportError("unexpected ready record", layer=r.layer, role=r.role)
            head = item.offer.segments[0].length
            if len(r.header) != head:
                raise TransportError("the ready record's header is not the offer's header "
                                     "segment", layer=r.layer, role=r.role, expected=head,
                                     found=len(r.header))  # fmt: skip
            # The final header, placed where a READ of segment 0 would have put it (the
            # pipeline frames and checks it with the rest, once everything has landed).
            self._arena.buf[item.landing : item.landing + head] = np.frombuffer(r.header, np.uint8)
            item.head_posted = True
        elif r.kind == "done" and item is not None and item.offer.write and not item.landed:
            item.landed = True
        else:
            raise TransportError(f"unexpected {r.kind} record", layer=r.layer, role=r.role)

    def _land(self, r: TransferRecord) -> _Incoming:
        """Choose where each byte of an offered blob lands (our segments)."""
        assert r.layer is not None and r.role is not None
        target = self._targets.pop((r.layer, r.role), None)
        apart = None if isinstance(target, InPlace) else target  # a pool READ apart, or not
        if apart is not None and r.pool_length and apart.nbytes != r.pool_length:
            raise TransportError("offered page pool size differs from the engine's array"
                                 + (" pages at page_ids" if isinstance(apart, IntoPages) else ""),
                                 layer=r.layer, role=r.role, expected=apart.nbytes,
                                 found=r.pool_length)  # fmt: skip
        head = r.segments[0].length  # not ready: the header, which the ready record carries
        if not r.ready and (head > MAX_HEADER_BYTES or (r.pool_length and head > r.pool_offset)):
            raise TransportError("the offer's header segment overlaps its page pool or is "
                                 "longer than a ready record carries", layer=r.layer,
                                 role=r.role, expected=f"<= {MAX_HEADER_BYTES}, <= pool_offset",
                                 found=head)  # fmt: skip
        if r.write and self._write is None:
            raise TransportError("this receiver takes no WRITE: the peer would need write "
                                 "access to its memory; READ (the default), or "
                                 "NixlReceiver(write_arena_bytes=...)", layer=r.layer,
                                 role=r.role)  # fmt: skip
        # A WRITE blob is copied out of the write region whole, then landed as a
        # compressed pool is: checked first, then copied into the engine's memory.
        split = apart is not None and r.pool_length > 0 and not r.write
        own = r.total_length - r.pool_length if split else r.total_length
        too_big = "blob does not fit the receiver's landing region"
        start = self._arena.claim(own, too_big, r.layer, r.role, now=True)
        assert start is not None
        return _Incoming(r, start, target, split)

    def _start(self, item: _Incoming) -> bool:
        """Post an offered blob's transfer (READ) or grant (WRITE); False: not yet (no room
        in the write region or staging ring until earlier blobs are copied out)."""
        r = item.offer
        if r.write:
            assert self._write is not None  # _land refused the offer otherwise
            too_big = "blob does not fit the receiver's write region"
            at = self._write.claim(r.total_length, too_big, r.layer, r.role)
            if at is None:
                return False
            item.write_at = at
            address = int(self._write.buf.ctypes.data) + at
            self._send(TransferRecord("grant", r.session, r.layer, r.role,
                                      total_length=r.total_length, pool_offset=r.pool_offset,
                                      pool_length=r.pool_length,
                                      segments=(Segment(0, r.total_length, address),)))  # fmt: skip
            item.started = True
            return True
        base = int(self._arena.buf.ctypes.data) + item.landing
        target = item.target
        item.segments = (Segment(0, r.total_length, base),)
        if item.split:  # the pool apart: into the staging ring or (one_pass) engine memory
            assert target is not None and not isinstance(target, InPlace)
            end = r.pool_offset + r.pool_length
            segments = [Segment(0, r.pool_offset, base)]
            if not target.one_pass:
                assert self._staging is not None  # made by expect()
                at = self._staging.claim(r.pool_length, "page pool does not fit the "
                                         "receiver's staging region: NixlReceiver("
                                         "staging_bytes=...), or expect(..., IntoArray(pool, "
                                         "one_pass=True))", r.layer, r.role)  # fmt: skip
                if at is None:
                    return False
                item.staged_at = at
                address = int(self._staging.buf.ctypes.data) + at
                segments.append(Segment(r.pool_offset, r.pool_length, address))
            else:  # one NIXL descriptor per run of consecutive engine pages
                at = r.pool_offset
                for lo, hi in target.spans():
                    segments.append(Segment(at, hi - lo, lo))
                    at += hi - lo
            if end < r.total_length:
                segments.append(Segment(end, r.total_length - end, base + r.pool_offset))
            item.segments = tuple(segments)
        item.started = True
        # One READ: the whole blob when its header is final, else all but the header
        # segment, whose final bytes come in the ready record.
        head_end = 0 if r.ready else r.segments[0].length
        if head_end < r.total_length:
            local, remote = _pieces(item.segments, r.segments, head_end, r.total_length)
            item.xfers.append(self._post("READ", local, remote))
        item.head_posted |= r.ready
        return True

    def _decode(self, item: _Incoming) -> Any:
        """The landed blob validated by the pipeline, with the offer's layer and role
        checked (``accept``) before anything is copied into engine memory.

        A pool that landed apart (staging, or one_pass engine memory) is decoded in a shadow
        of the blob holding the rest, the pool's bytes taken where they landed (in blob page
        order): every check of ``decode``, checksums and page digests included."""
        r = item.offer
        land = self._arena.buf[item.landing :]
        if item.write_at is not None and self._write is not None:
            # The copy the peer holds no handle to: what is checked is what is used.
            size = r.total_length
            land[:size] = self._write.buf[item.write_at : item.write_at + size]
        if blob_length(land) != r.total_length:
            raise TransportError("the offer's total_length is not the blob's", layer=r.layer,
                                 role=r.role, expected=blob_length(land),
                                 found=r.total_length)  # fmt: skip
        opts = decode_options(self.verify, self.limits, -1, self.page_store,
                              self.expect_fingerprint)  # fmt: skip
        target = item.target

        def accept(tensor: BlockPagedTensor) -> None:
            if tensor.layer_index != r.layer or tensor.kv_role != r.role:
                raise TransportError("the blob is not the one offered", layer=r.layer,
                                     role=r.role, found=f"layer {tensor.layer_index} "
                                     f"{tensor.kv_role}")  # fmt: skip

        view = memoryview(land[: r.total_length].data)
        if target is None:
            return run(view, opts, accept=accept)[0]
        if not item.split:
            if not isinstance(target, InPlace) and target.one_pass:  # decoded here: not placed
                target = dataclasses.replace(target, one_pass=False)
            return target.land(view, opts, accept=accept)[0]
        assert isinstance(target, (IntoArray, IntoPages))
        end = r.pool_offset + r.pool_length
        # Not zeroed: its pool range is neither written nor read (np.zeros of 16 MiB cost
        # a 2.6 ms memset: glibc serves it from the heap once one has been freed).
        shadow = np.empty(r.total_length, np.uint8)
        shadow[: r.pool_offset] = land[: r.pool_offset]
        shadow[end:] = land[r.pool_offset : r.pool_offset + r.total_length - end]
        view = memoryview(shadow.data)
        e = plan_of(view, opts).buffers[0]
        if (e.offset, e.stored_size, e.codec) != (r.pool_offset, r.pool_length, CODEC_RAW):
            raise TransportError("the offer's page pool range is not the blob's", layer=r.layer,
                                 role=r.role, expected=f"{e.offset}+{e.stored_size}",
                                 found=f"{r.pool_offset}+{r.pool_length}")  # fmt: skip
        if item.staged_at is not None and self._staging is not None:
            landed = self._staging.buf[item.staged_at : item.staged_at + r.pool_length]
        else:  # one_pass: where NIXL placed it (in blob page order)
            landed = target.flat if isinstance(target, IntoArray) else target.gathered()
        return target.land(view, opts, accept=accept, pool=landed, placed=target.one_pass)[0]


def _checked_key(layer: object, role: object) -> tuple[int, str]:
    """(layer, role) of an expect call, checked."""
    if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < 0xFFFFFFFF:
        raise ArgumentTypeError("layer must be an int in [0, 2**32 - 1)", found=repr(layer))
    if role not in ROLE_CODES:
        raise ArgumentTypeError("unknown kv_role", field="role", found=repr(role),
                                expected=sorted(ROLE_CODES))  # fmt: skip
    assert isinstance(role, str)
    return layer, role
