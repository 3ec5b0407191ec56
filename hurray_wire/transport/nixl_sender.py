"""NixlSender: publish blobs for a peer to READ, or WRITE them into its region (docs/nixl.md)."""

from __future__ import annotations

import secrets
import time
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from hurray_wire.blob import encode_parts
from hurray_wire.blob.encoder import encode_deferred, planned_into
from hurray_wire.blob.envelope import pool_section as _pool_section
from hurray_wire.errors import ArgumentTypeError, TransportError
from hurray_wire.integrity import DeltaPlan, decode_known_pages
from hurray_wire.integrity.digests import DigestArray
from hurray_wire.tensor import BlockPagedTensor
from hurray_wire.transforms.compact import referenced_pages
from hurray_wire.transport.nixl_endpoint import (
    _ZERO_COPY_MIN,
    DEFAULT_DEADLINE,
    MAX_KNOWN_PAGES,
    PEER_READ_NAP,
    _address,
    _deadline,
    _Endpoint,
    _pieces,
)
from hurray_wire.transport.records import (
    Segment,
    TransferRecord,
    encode_record,
)

__all__ = ["NixlSender"]


@dataclass
class _Outgoing:
    """One published blob on the sender: its segments, header state and transfers."""

    tensor: BlockPagedTensor
    layer: int
    role: str
    write: bool
    arena_start: int
    future: Future[Any]
    staged: bool
    total: int = 0
    pool_offset: int = 0
    pool_length: int = 0
    segments: tuple[Segment, ...] = ()
    offered: bool = False
    ready: bool = False
    grant: TransferRecord | None = None
    body: Any = None
    body_done: bool = False
    head_end: int | None = None  # WRITE: the blob range [0, head_end) goes last
    head: Any = None
    done: bool = False

    def place(self, header: Any) -> None:
        """The page pool's place, from the blob's header (0, 0: not raw, so not split)."""
        offset, length, raw, _ = _pool_section(header)
        self.pool_offset, self.pool_length = (offset, length) if raw else (0, 0)


def _pages_in_place(
    parts: list[memoryview], source: BlockPagedTensor, old_ids: npt.NDArray[np.int64]
) -> list[memoryview]:
    """``parts`` of the compacted blob with its raw pool replaced by views of the source
    pool's pages, one per run of adjacent page ids (the same bytes: scattered READ)."""
    offset, length, raw, _ = _pool_section(parts[0])
    pool = source.page_pool
    if not raw or not pool.flags.c_contiguous or pool.nbytes % source.layout.num_pages:
        return parts
    page = pool.nbytes // source.layout.num_pages
    flat = pool.reshape(-1).view(np.uint8).data
    cursor = 0
    for index, part in enumerate(parts):
        if cursor == offset and len(part) == length == page * len(old_ids):
            breaks = np.flatnonzero(np.diff(old_ids) != 1) + 1
            runs = np.split(old_ids, breaks)
            views = [flat[int(r[0]) * page : (int(r[-1]) + 1) * page] for r in runs]
            return [*parts[:index], *views, *parts[index + 1 :]]
        cursor += len(part)
    return parts


class NixlSender(_Endpoint):
    """The side that holds the KV cache: publishes blobs for the peer to READ, or WRITEs
    them; ``arena_bytes``: its registered region for headers, small parts and staged blobs."""

    _peer_side = "receiver"

    def __init__(
        self,
        name: str,
        *,
        ucx_error_handling_mode: str = "peer",
        arena_bytes: int = 64 << 20,
        progress_thread: bool = False,
    ) -> None:
        super().__init__(name, ucx_error_handling_mode=ucx_error_handling_mode,
                         arena_bytes=arena_bytes, progress_thread=progress_thread)  # fmt: skip
        self.session: int = secrets.randbits(64)
        self._out: dict[tuple[int, str], _Outgoing] = {}
        self._known: npt.NDArray[np.uint64] | None = None

    def _on_known_pages(self, data: bytes) -> None:
        self._known = decode_known_pages(data, max_entries=MAX_KNOWN_PAGES)

    def known_pages(self, *, deadline: float = DEFAULT_DEADLINE) -> npt.NDArray[np.uint64]:
        """The digests the receiver said it holds (``NixlReceiver.send_known_pages``),
        waiting for its known-pages record if none has come yet; pass them to
        ``publish(..., known_pages=...)``. A later record replaces an earlier one."""
        until = _deadline(deadline)
        self._peer_name()
        while self._known is None:
            if not self._step():
                if time.monotonic() > until:
                    raise TransportError("deadline passed waiting for the known-pages record")
                time.sleep(PEER_READ_NAP)
        return self._known

    def publish(
        self,
        tensor: BlockPagedTensor,
        *,
        op: str = "READ",
        mode: str = "zero-copy",
        compression: Any = None,
        checksum: bool = True,
        deadline: float = DEFAULT_DEADLINE,
        page_digests: bool | DigestArray = False,
        known_pages: Any = None,
        pages: str = "referenced",
    ) -> None:
        """Offer one blob to the peer and return at once (``wait`` drives it to the end).

        ``op="READ"``: the peer pulls; ``"WRITE"``: this side pushes into memory it grants.
        ``mode="zero-copy"``: the large parts are the tensor's own (registered) arrays, the
        small ones are copied into the arena, checksums computed in a thread while the peer
        already moves the pool; ``"staged"``: the blob is encoded into the arena (compression,
        ``page_digests`` and ``known_pages`` as for ``encode``). The tensor's arrays must not
        change until ``wait`` returns; ``deadline`` bounds the wait for arena space.
        ``pages="referenced"`` sends only the pages the block table names (one segment per
        run of adjacent pages where they lie); ``"all"`` sends the pool.
        """
        if not isinstance(tensor, BlockPagedTensor):
            raise ArgumentTypeError("expected a BlockPagedTensor", found=type(tensor).__name__)
        if op not in ("READ", "WRITE"):
            raise ArgumentTypeError("op is 'READ' or 'WRITE'", field="op", found=repr(op))
        if mode not in ("zero-copy", "staged"):
            raise ArgumentTypeError("mode is 'zero-copy' or 'staged'", found=repr(mode))
        layer, role = tensor.layer_index, tensor.kv_role
        if layer is None:
            raise TransportError("a published tensor needs a layer_index", role=role)
        key = (layer, role)
        self._out = {k: o for k, o in self._out.items() if not o.done}  # let go of old tensors
        if key in self._out:
            raise TransportError("already published and not done", layer=layer, role=role)
        if mode == "zero-copy" and compression is not None:
            raise ArgumentTypeError("compression needs mode='staged'", field="compression")
        delta = known_pages is not None or page_digests is not False
        if mode == "zero-copy" and delta:
            raise ArgumentTypeError(
                "page_digests / known_pages need mode='staged'", field="known_pages"
            )
        self._peer_name()
        source = tensor
        old_ids = None
        if not isinstance(known_pages, DeltaPlan):  # a plan is made for the tensor's pages
            tensor, old_ids = referenced_pages(tensor, pages)
        if mode == "staged":  # one plan (with a delta's digest pass): its size reserved
            # now, written on the hasher
            need, write = planned_into(tensor, compression, checksum, page_digests, known_pages)
            start = self._take(need, _deadline(deadline), layer, role)
            view = self._arena.buf[start : start + need]
            future: Future[Any] = self._worker.submit(write, view)
            self._out[key] = _Outgoing(
                tensor, layer, role, op == "WRITE", start, future, True, need
            )
            self._step()
            return
        # One plan: the layout now (no hashing, no copy); the checksummed header later.
        if checksum:
            parts, final = encode_deferred(tensor)
        else:
            parts, final = encode_parts(tensor, checksum=False), None
        if old_ids is not None:  # the sent pages where they lie
            parts = _pages_in_place(parts, source, old_ids)
        total = sum(len(p) for p in parts)
        copied = [
            k == 0 or len(p) < _ZERO_COPY_MIN or not self._registered(*_address(p))
            for k, p in enumerate(parts)
        ]
        need = sum(len(p) for p, c in zip(parts, copied, strict=True) if c)
        start = cursor = self._take(need, _deadline(deadline), layer, role)
        out = self._arena.buf
        segments: list[Segment] = []
        for part, copy in zip(parts, copied, strict=True):
            size = len(part)
            address = int(out.ctypes.data) + cursor if copy else _address(part)[0]
            last = segments[-1] if segments else Segment(0, 0, 1)  # none yet: offset 0
            # Deferred checksums: the header is a segment of its own (the ready record
            # carries its final bytes; the peer READs the rest at once).
            alone = final is not None and len(segments) == 1
            if copy:
                out[cursor : cursor + size] = np.frombuffer(part, np.uint8)
                cursor += size
            if segments and last.address + last.length == address and copy and not alone:
                segments[-1] = Segment(last.blob_offset, last.length + size, last.address)
            else:
                segments.append(Segment(last.blob_offset + last.length, size, address))
        assert segments[0].length >= len(parts[0])  # the header is one segment's start
        if final is not None:
            future = self._worker.submit(final)
        else:  # the header in the arena is final already: the offer says so
            future = Future()
            future.set_result(None)
        item = _Outgoing(tensor, layer, role, op == "WRITE", start, future, False, total)
        item.place(parts[0])
        item.segments = tuple(segments)
        item.ready = not checksum
        self._out[key] = item
        self._offer(item)
        self._step()

    def _take(self, size: int, until: float, layer: int, role: str) -> int:
        """Arena space for one blob's copied bytes, waiting for earlier blobs to finish."""
        too_big = "blob does not fit the sender's arena"
        while (start := self._arena.claim(size, too_big, layer, role)) is None:
            self._step()
            if time.monotonic() > until:
                raise TransportError("deadline passed waiting for arena space", layer=layer,
                                     role=role)  # fmt: skip
            self._nap(64)
        return start

    def _offer(self, item: _Outgoing) -> None:
        self._send(
            TransferRecord(
                "offer", self.session, item.layer, item.role, write=item.write,
                ready=item.ready, total_length=item.total, pool_offset=item.pool_offset,
                pool_length=item.pool_length, segments=item.segments,
            )
        )  # fmt: skip
        item.offered = True

    def wait(self, *, deadline: float = DEFAULT_DEADLINE) -> None:
        """Drive every published blob to the end (READ: the peer said it has read it; WRITE:
        this side wrote it); TransportError on any failure, or once ``deadline`` passes."""
        until = _deadline(deadline)
        idle = 0
        while not all(o.done for o in self._out.values()):
            idle = 0 if self._step() else idle + 1
            if time.monotonic() > until:
                pending = [k for k, o in self._out.items() if not o.done]
                layer, role = pending[0]
                self._abort_peer("sender deadline passed", layer, role)
                raise TransportError(f"deadline passed with {len(pending)} blobs not done",
                                     layer=layer, role=role)  # fmt: skip
            self._nap(idle)  # without a progress thread, we move the transfers

    def _nap(self, idle: int) -> None:
        """Sleep between polls: not while our own WRITEs move (only while we poll), until a
        header's checksums are in, else a short nap that leaves the core to the hashing
        thread (measured: spinning cost the hasher a third of a core), then back off."""
        pause = 0.0002
        if any(o.body is not None or o.head is not None for o in self._out.values()):
            pause = 0.0
        elif any(item.offered and not item.done for item in self._out.values()) or idle < 64:
            pause = PEER_READ_NAP
        hashing = [o.future for o in self._out.values() if not o.ready and not o.done]
        if pause and hashing:  # wakes as soon as a header is final
            wait(hashing, timeout=pause, return_when=FIRST_COMPLETED)
        else:
            time.sleep(pause)

    def poll(self) -> bool:
        """One round of progress without waiting; True if anything happened. For a sender
        without a progress thread that has nothing to ``wait`` for but must serve its peer
        (UCX over TCP needs the target to progress a peer's READ)."""
        return self._step()

    def abort(self, reason: str = "aborted by the sender") -> None:
        """End the transfer: the peer's receive() raises TransportError at once."""
        self._abort_peer(reason, None, None)
        for item in self._out.values():
            if not item.done:
                item.done = True
                self._arena.give(item.arena_start)

    def _step(self) -> bool:
        """One round of progress; True if anything happened."""
        moved = self._records()
        for item in self._out.values():
            if item.done:
                continue
            moved |= self._guarded(item, self._advance, item)
        return moved

    def _on_record(self, r: TransferRecord) -> None:
        item = self._out.get((r.layer, r.role)) if r.layer is not None and r.role else None
        if item is None or item.done:
            raise TransportError(f"{r.kind} record for a blob not in flight", layer=r.layer,
                                 role=r.role)  # fmt: skip
        if r.kind == "grant" and item.write and item.grant is None:
            if r.total_length != item.total:
                raise TransportError("grant's total_length differs from the offer",
                                     layer=item.layer, role=item.role, expected=item.total,
                                     found=r.total_length)  # fmt: skip
            item.grant = r
        elif r.kind == "done" and not item.write and item.ready:
            item.done = True
            self._arena.give(item.arena_start)
        else:
            raise TransportError(f"unexpected {r.kind} record", layer=r.layer, role=r.role)

    def _advance(self, item: _Outgoing) -> bool:
        moved = False
        if not item.ready and item.future.done():
            result = item.future.result()  # re-raises an encoding error
            moved = True
            if item.staged:
                self._arena.shrink(item.arena_start, int(result))
                item.total = int(result)
                address = int(self._arena.buf.ctypes.data) + item.arena_start
                item.place(self._arena.buf[item.arena_start : item.arena_start + item.total])
                item.segments = (Segment(0, item.total, address),)
                item.ready = True
                self._offer(item)  # with the ready flag: the blob is complete
            else:
                head = np.frombuffer(result, np.uint8)
                self._arena.buf[item.arena_start : item.arena_start + len(head)] = head
                item.ready = True
                if not item.write:  # the final header itself: no READ of it (version 2)
                    self._send(TransferRecord("ready", self.session, item.layer, item.role,
                                              header=bytes(result)))  # fmt: skip
        if not item.write or item.grant is None:
            return moved
        if item.head_end is None:  # WRITE: split the blob once, at the grant
            # Header final already: one transfer of everything. Else the rest first, then
            # the header once its checksums are in; the last transfer carries the done record.
            item.head_end = item.total if item.ready else item.segments[0].length
            if item.head_end < item.total:
                local, remote = _pieces(item.segments, item.grant.segments, item.head_end,
                                        item.total)  # fmt: skip
                item.body = self._post("WRITE", local, remote)
            else:
                item.body_done = True
            moved = True
        if item.body is not None and self._state(item.body) == "DONE":
            item.body.release()
            item.body, item.body_done, moved = None, True, True
        if item.body_done and item.ready and item.head is None:
            local, remote = _pieces(item.segments, item.grant.segments, 0, item.head_end)
            done = encode_record(TransferRecord("done", self.session, item.layer, item.role))
            item.head = self._post("WRITE", local, remote, done)
            moved = True
        if item.head is not None and self._state(item.head) == "DONE":
            item.head.release()
            item.head, item.done, moved = None, True, True
            self._arena.give(item.arena_start)
        return moved
