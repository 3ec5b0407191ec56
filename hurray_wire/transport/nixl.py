"""hurray-wire over NIXL: move blobs between two NIXL agents, validated, layer by layer.

docs/nixl.md is the guide. In short: each side creates one endpoint (``NixlSender`` /
``NixlReceiver``), registers its long-lived memory (the engine's KV pools, and the
endpoint's own arena or landing region, which it registers itself), then the two exchange
NIXL agent metadata (``metadata()`` / ``add_peer()``; metadata taken before registration
is stale, so ``register`` refuses once it has been taken). Per blob the sender
``publish``es a tensor and the receiver ``receive``s it; hurray-wire's own control records
(``hurray_wire.transport.records``, sent as NIXL notifications) say what lies where.

Importing this module loads NIXL (``nixl_cu12``, else the ``nixl`` package's ``nixl._api``)
and raises ``TransportError`` if neither loads. Every wait takes a ``deadline`` in seconds
(default ``DEFAULT_DEADLINE``); every NIXL exception comes out as a ``TransportError`` whose
``__cause__`` is the original.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import secrets
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt
import xxhash

from hurray_wire import blob
from hurray_wire.blob import DecodeLimits, blob_length, decode, encode_parts
from hurray_wire.errors import ArgumentTypeError, ChecksumError, HurrayWireError, TransportError
from hurray_wire.integrity import (
    EngineFingerprint,
    PageStore,
    decode_known_pages,
    encode_known_pages,
)
from hurray_wire.tensor import BlockPagedTensor
from hurray_wire.transport.records import (
    ROLE_CODES,
    Segment,
    TransferRecord,
    decode_record,
    encode_record,
)
from hurray_wire.wire import blob as wb
from hurray_wire.wire import integrity as wi
from hurray_wire.wire.fast import offset_of

try:
    import nixl_cu12 as _nixl
except Exception as _first:  # ImportError, or OSError from a shared library
    try:
        from nixl import _api as _nixl  # type: ignore[no-redef,unused-ignore]
    except Exception:
        raise TransportError(
            "NIXL cannot be loaded: install it with "
            "'pip install --no-deps nixl-cu12==1.5.1' (the extra hurray-wire[nixl]; "
            f"--no-deps keeps torch and CUDA out on CPU machines); import failed with {_first!r}"
        ) from _first

# NIXL's Python logger prints INFO lines (one per agent and backend) to stdout, which is the
# application's: keep it to warnings unless the user asked for a level with NIXL_LOG_LEVEL.
if not os.environ.get("NIXL_LOG_LEVEL"):
    logging.getLogger("nixl").setLevel(logging.WARNING)

__all__ = [
    "DEFAULT_DEADLINE",
    "NixlReceiver",
    "NixlSender",
]

#: Most digests a sender accepts in one known-pages record from its peer (8 bytes each).
MAX_KNOWN_PAGES = 1 << 20
#: Seconds any wait (publish for arena space, wait, receive) may take unless told otherwise.
DEFAULT_DEADLINE = 30.0
#: Seconds a sender naps between polls while only the peer's READs are moving.
PEER_READ_NAP = 0.00005
_ZERO_COPY_MIN = 4096  # smaller parts are copied into the arena: one segment instead of many
_HEADER = wb.BLOB_HEADER.sizeof()
_ENTRY = wb.SECTION_ENTRY.sizeof()
_CHECKSUM_TYPE_AT = offset_of(wb.BLOB_HEADER, "checksum_type")
_U8 = npt.NDArray[np.uint8]
T = TypeVar("T")


def _call(what: str, fn: Callable[..., T], *args: Any, **kw: Any) -> T:
    """Call NIXL; its exceptions become TransportError (layer/role added by the caller)."""
    try:
        return fn(*args, **kw)
    except HurrayWireError:
        raise
    except Exception as exc:
        raise TransportError(f"NIXL {what} failed: {type(exc).__name__}: {exc}") from exc


def _address(buffer: Any) -> tuple[int, int]:
    """(address, length) of a C-contiguous buffer, for registration and descriptors."""
    try:
        array = np.frombuffer(buffer, np.uint8)
    except (TypeError, ValueError):
        array = np.asarray(buffer)
        if not array.flags.c_contiguous:
            raise ArgumentTypeError("memory must be C-contiguous", found="strided array") from None
        array = array.reshape(-1).view(np.uint8)
    return int(array.ctypes.data), int(array.nbytes)


def _bytes_of(array: Any, what: str) -> _U8:
    """A writable C-contiguous array as flat bytes (a view, never a copy)."""
    if not isinstance(array, np.ndarray):
        raise ArgumentTypeError(f"{what} must be a NumPy array", found=type(array).__name__)
    if not array.flags.c_contiguous or not array.flags.writeable:
        raise ArgumentTypeError(f"{what} must be C-contiguous and writable", field=what)
    return array.reshape(-1).view(np.uint8)


def _deadline(seconds: float) -> float:
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not seconds > 0:
        raise ArgumentTypeError("deadline is a positive number of seconds", found=repr(seconds))
    return time.monotonic() + float(seconds)


def _pool_section(head: Any) -> tuple[int, int, bool, bool]:
    """(offset, stored_size, is_raw, has_checksums) of buffer[0] from a blob's header bytes
    (decoded with the wire structs: the section table follows the 32-byte header)."""
    header = wb.BLOB_HEADER.parse(bytes(head[:_HEADER]))
    entry = wb.SECTION_ENTRY.parse(bytes(head[_HEADER : _HEADER + _ENTRY]))
    raw = entry.codec == 0 and entry.stored_size == entry.raw_size
    return entry.offset, entry.stored_size, raw, header.checksum_type == wb.CHECKSUM_XXH3_64


def _named(exc: HurrayWireError, layer: int | None, role: str | None) -> TransportError:
    """``exc`` as a TransportError naming the blob (itself if it names one already)."""
    if isinstance(exc, TransportError):
        if exc.layer is not None:
            return exc
        return TransportError(exc.message, layer=layer, role=role)
    return TransportError(f"{type(exc).__name__}: {exc}", layer=layer, role=role)


def _origin(exc: HurrayWireError) -> BaseException:
    """The error to chain as ``__cause__``: NIXL's own, when ``exc`` merely wraps it."""
    if isinstance(exc, TransportError) and exc.layer is None and exc.__cause__ is not None:
        return exc.__cause__
    return exc


class _Arena:
    """A registered byte region handed out front to back and reset when nothing is in it."""

    def __init__(self, size: int) -> None:
        self.buf = np.zeros(size, np.uint8)
        self.top = 0
        self.live = 0

    def take(self, size: int) -> int | None:
        start = (self.top + 63) & ~63
        if start + size > len(self.buf):
            if self.live or size > len(self.buf):
                return None
            start = 0
        self.top = start + size
        self.live += 1
        return start

    def shrink(self, start: int, taken: int, used: int) -> None:
        """Give back the unused end of a piece, if it is still the last one taken."""
        if self.top == start + taken:
            self.top = start + used

    def give(self) -> None:
        self.live -= 1
        if self.live == 0:
            self.top = 0


def _pieces(
    local: tuple[Segment, ...], remote: tuple[Segment, ...], lo: int, hi: int
) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.uint64]]:
    """Matched (address, length, device) rows of the local and remote memory holding blob
    bytes [lo, hi): both segment lists tile the blob, with different boundaries."""
    cuts = sorted(
        {lo, hi}
        | {s.blob_offset for s in local + remote if lo < s.blob_offset < hi}
        | {s.blob_offset + s.length for s in local + remote if lo < s.blob_offset + s.length < hi}
    )

    def rows(segments: tuple[Segment, ...]) -> npt.NDArray[np.uint64]:
        out = np.zeros((len(cuts) - 1, 3), np.uint64)
        k = 0
        for i, (a, b) in enumerate(itertools.pairwise(cuts)):
            while segments[k].blob_offset + segments[k].length <= a:
                k += 1
            s = segments[k]
            out[i] = (s.address + a - s.blob_offset, b - a, s.device_id)
        return out

    return rows(local), rows(remote)


class _Endpoint:
    """One NIXL agent with a UCX backend, its registrations and its one peer."""

    def __init__(
        self, name: str, *, ucx_error_handling_mode: str, arena_bytes: int, progress_thread: bool
    ) -> None:
        if not isinstance(name, str) or not name:
            raise ArgumentTypeError("name must be a non-empty str", found=repr(name))
        if ucx_error_handling_mode not in ("none", "peer"):
            raise ArgumentTypeError(
                "ucx_error_handling_mode is 'none' (shared memory on one machine) or 'peer'",
                found=repr(ucx_error_handling_mode),
            )
        if isinstance(arena_bytes, bool) or not isinstance(arena_bytes, int) or arena_bytes < 64:
            raise ArgumentTypeError("arena_bytes must be an int >= 64", found=repr(arena_bytes))
        self.name = name
        config = _nixl.nixl_agent_config(enable_prog_thread=bool(progress_thread), backends=[])
        self._agent = _call("agent creation", _nixl.nixl_agent, name, config)
        params = dict(_call("get_plugin_params", self._agent.get_plugin_params, "UCX"))
        if not params:
            raise TransportError("NIXL has no UCX plugin on this machine")
        params["ucx_error_handling_mode"] = ucx_error_handling_mode
        _call("create_backend(UCX)", self._agent.create_backend, "UCX", params)
        self._regions: list[tuple[int, int, Any, Any]] = []  # (start, end, array, reg list)
        self._published = False
        self._peer: str | None = None
        self._arena = _Arena(arena_bytes)
        self.register(self._arena.buf)

    # -- memory and peers ------------------------------------------------------------------
    def register(self, array: Any) -> None:
        """Register long-lived memory (an engine's KV pool) with NIXL. Only before
        ``metadata()``: metadata taken earlier would not know it (NIXL: "no potential
        backend found")."""
        if self._published:
            raise TransportError(
                "register memory before taking metadata(): the peer's copy would be stale"
            )
        start, size = _address(array)
        if size == 0:
            raise ArgumentTypeError("cannot register an empty buffer")
        reg = _call("register_memory", self._agent.register_memory, [(start, size, 0, "")], "DRAM")
        self._regions.append((start, start + size, array, reg))

    def _registered(self, start: int, size: int) -> bool:
        return any(a <= start and start + size <= b for a, b, _, _ in self._regions)

    def metadata(self) -> bytes:
        """This agent's NIXL metadata, for the peer's ``add_peer`` (NIXL's own encoding,
        parsed by NIXL, never by pickle). Take it after every ``register``."""
        self._published = True
        return bytes(_call("get_agent_metadata", self._agent.get_agent_metadata))

    def add_peer(self, metadata: bytes) -> str:
        """Load the peer's metadata; returns its agent name. One peer per endpoint."""
        if not isinstance(metadata, (bytes, bytearray)):
            raise ArgumentTypeError("metadata must be bytes", found=type(metadata).__name__)
        if self._peer is not None:
            raise TransportError("this endpoint already has a peer", found=self._peer)
        name = _call("add_remote_agent", self._agent.add_remote_agent, bytes(metadata))
        self._peer = name.decode() if isinstance(name, bytes) else str(name)
        return self._peer

    @property
    def agent(self) -> Any:
        """The NIXL agent itself (``nixl_agent``), for moving other data to the same peer."""
        return self._agent

    @property
    def peer(self) -> str | None:
        """The peer's agent name, once ``add_peer`` has loaded it."""
        return self._peer

    def _peer_name(self) -> str:
        if self._peer is None:
            raise TransportError("no peer: call add_peer(peer_metadata) first")
        return self._peer

    def close(self) -> None:
        """Deregister memory and forget the peer (best effort: for shutdown paths)."""
        for _, _, _, reg in self._regions:
            with contextlib.suppress(Exception):  # shutdown must not raise for a stale handle
                self._agent.deregister_memory(reg)
        self._regions.clear()
        if self._peer is not None:
            with contextlib.suppress(Exception):
                self._agent.remove_remote_agent(self._peer)
            self._peer = None

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- control records -------------------------------------------------------------------
    def _send(self, record: TransferRecord) -> None:
        _call("send_notif", self._agent.send_notif, self._peer_name(), encode_record(record))

    def _records(self) -> list[TransferRecord]:
        """New records from the peer, validated; anything else is an error."""
        found = _call("get_new_notifs", self._agent.get_new_notifs)
        out: list[TransferRecord] = []
        for agent, messages in found.items():
            sender = agent.decode() if isinstance(agent, bytes) else str(agent)
            if sender != self._peer:
                raise TransportError("notification from an agent that is not the peer",
                                     found=sender)  # fmt: skip
            for m in messages:
                if bytes(m[: len(wi.KNOWN_PAGES_MAGIC)]) == wi.KNOWN_PAGES_MAGIC:
                    self._on_known_pages(bytes(m))
                else:
                    out.append(decode_record(m))
        return out

    def _on_known_pages(self, data: bytes) -> None:
        """A known-pages record (docs/integrity.md § 5.1): only a sender takes one."""
        raise TransportError("unexpected known-pages record from the peer")

    def _post(self, op: str, local: Any, remote: Any, notif: bytes = b"") -> Any:
        """Create and post one transfer; its handle."""
        peer = self._peer_name()
        local_descs = _call("get_xfer_descs", self._agent.get_xfer_descs, local, "DRAM")
        remote_descs = _call("get_xfer_descs", self._agent.get_xfer_descs, remote, "DRAM")
        handle = _call(
            "initialize_xfer", self._agent.initialize_xfer, op, local_descs, remote_descs,
            peer, notif,
        )  # fmt: skip
        if _call("transfer", self._agent.transfer, handle) == "ERR":
            raise TransportError(f"NIXL {op} failed to post")
        return handle

    def _state(self, handle: Any) -> str:
        state: str = _call("check_xfer_state", self._agent.check_xfer_state, handle)
        if state == "ERR":
            raise TransportError("NIXL transfer ended in error")
        return state

    def _abort_peer(self, session: int, reason: str, layer: int | None, role: str | None) -> None:
        """Tell the peer we stopped (best effort: the peer may be gone)."""
        with contextlib.suppress(Exception):
            self._send(TransferRecord("abort", session, layer, role, reason=reason[:1000]))


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


class NixlSender(_Endpoint):
    """The side that holds the KV cache: publishes blobs for the peer to READ, or WRITEs them.

    ``arena_bytes`` is a registered region of the sender's own for blob headers and small
    index arrays (zero-copy) and for whole blobs (``mode="staged"``).
    """

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
        self.session = secrets.randbits(64)
        self._hasher = ThreadPoolExecutor(1, thread_name_prefix="hurray-wire-nixl")
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
        page_digests: bool = False,
        known_pages: Any = None,
    ) -> None:
        """Offer one blob to the peer and return at once (``wait`` drives it to the end).

        ``op="READ"``: the peer pulls; ``"WRITE"``: this side pushes into memory the peer
        grants. ``mode="zero-copy"``: the blob's large parts are the tensor's own arrays,
        which must lie in registered memory; the small parts are copied into the arena and
        the checksums are computed in a thread while the peer already moves the page pool.
        Parts outside registered memory are copied into the arena too (a copy, but it works).
        ``mode="staged"``: the blob is ``encode_into`` the arena (compression allowed).
        ``deadline`` bounds the wait for arena space. The tensor's arrays must not change
        until ``wait`` returns. ``page_digests`` / ``known_pages`` as for ``encode`` (a
        delta blob: pages the receiver holds go as references; ``known_pages()`` gives what
        it said it holds); both need ``mode="staged"``, and the blob is encoded here.
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
        if delta:  # the plan (a digest pass) decides the size: encode once, copy when staged
            encoded = blob.encode(tensor, compression=compression, checksum=checksum,
                                  page_digests=page_digests, known_pages=known_pages)  # fmt: skip
            size = len(encoded)
            begin = self._take(size, _deadline(deadline), layer, role)
            target = self._arena.buf[begin : begin + size]

            def stage() -> int:
                target[...] = np.frombuffer(encoded, np.uint8)
                return size

            staged: Future[Any] = self._hasher.submit(stage)
            self._out[key] = _Outgoing(tensor, layer, role, op == "WRITE", begin, staged, True,
                                       size)  # fmt: skip
            self._step()
            return
        parts = encode_parts(tensor, checksum=False)  # the layout; no hashing, no copy
        total = sum(len(p) for p in parts)
        copied = [
            k == 0 or len(p) < _ZERO_COPY_MIN or not self._registered(*_address(p))
            for k, p in enumerate(parts)
        ]
        need = (
            total
            if mode == "staged"
            else sum(len(p) for p, c in zip(parts, copied, strict=True) if c)
        )
        start = self._take(need, _deadline(deadline), layer, role)
        out = self._arena.buf
        if mode == "staged":
            view = out[start : start + need]

            def encode() -> int:
                return blob.encode_into(tensor, view, compression=compression, checksum=checksum)

            future: Future[Any] = self._hasher.submit(encode)
            self._out[key] = _Outgoing(
                tensor, layer, role, op == "WRITE", start, future, True, need
            )
            self._step()
            return
        # zero-copy: small parts into the arena, large ones where they are.
        base = int(out.ctypes.data)
        segments: list[Segment] = []
        cursor = start
        blob_offset = 0
        for part, copy in zip(parts, copied, strict=True):
            size = len(part)
            if copy:
                out[cursor : cursor + size] = np.frombuffer(part, np.uint8)
                address = base + cursor
                cursor += size
            else:
                address = _address(part)[0]
            last = segments[-1] if segments else None
            if last is not None and last.address + last.length == address and copy:
                segments[-1] = Segment(last.blob_offset, last.length + size, last.address)
            else:
                segments.append(Segment(blob_offset, size, address))
            blob_offset += size
        if segments[0].length < len(parts[0]):
            raise TransportError("internal: header segment shorter than the header")
        pool_offset, pool_length, raw, _ = _pool_section(parts[0])
        head = parts[0]

        def final_header() -> bytes:
            return bytes(encode_parts(tensor, checksum=True)[0]) if checksum else bytes(head)

        if checksum:
            future = self._hasher.submit(final_header)
        else:  # the header in the arena is final already: the offer says so
            future = Future()
            future.set_result(None)
        item = _Outgoing(tensor, layer, role, op == "WRITE", start, future, False, total)
        item.pool_offset, item.pool_length = (pool_offset, pool_length) if raw else (0, 0)
        item.segments = tuple(segments)
        item.ready = not checksum
        self._out[key] = item
        self._offer(item)
        self._step()

    def _take(self, size: int, until: float, layer: int, role: str) -> int:
        """Arena space for one blob's copied bytes, waiting for earlier blobs to finish."""
        while True:
            start = self._arena.take(size)
            if start is not None:
                return start
            if size > len(self._arena.buf):
                raise TransportError("blob does not fit the sender's arena", layer=layer,
                                     role=role, expected=f"<= {len(self._arena.buf)}",
                                     found=size)  # fmt: skip
            self._step()
            if time.monotonic() > until:
                raise TransportError("deadline passed waiting for arena space", layer=layer,
                                     role=role)  # fmt: skip
            time.sleep(self._pause(64))

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
        """Drive every published blob to the end: READ, until the peer says it has read it;
        WRITE, until this side has written it. Raises TransportError on an abort, a failed
        transfer or when ``deadline`` seconds pass."""
        until = _deadline(deadline)
        idle = 0
        while not all(o.done for o in self._out.values()):
            if self._step():
                idle = 0
            else:
                idle += 1
            if time.monotonic() > until:
                pending = [k for k, o in self._out.items() if not o.done]
                layer, role = pending[0]
                self._abort_peer(self.session, "sender deadline passed", layer, role)
                raise TransportError(f"deadline passed with {len(pending)} blobs not done",
                                     layer=layer, role=role)  # fmt: skip
            time.sleep(self._pause(idle))  # without a progress thread, we move the transfers

    def _pause(self, idle: int) -> float:
        """How long to sleep between polls. Our own transfers move only while we poll (no
        progress thread): none. The peer's READs need only our answers to its requests: a
        short nap, leaving the core to the hashing thread. Otherwise back off."""
        if idle < 64 or any(o.body is not None or o.head is not None for o in self._out.values()):
            return 0.0
        if any(item.offered and not item.done for item in self._out.values()):
            return PEER_READ_NAP
        return 0.0002

    def poll(self) -> bool:
        """One round of progress without waiting; True if anything happened. For a sender
        without a progress thread that has nothing to ``wait`` for but must serve its peer
        (UCX over TCP needs the target to progress a peer's READ)."""
        return self._step()

    def abort(self, reason: str = "aborted by the sender") -> None:
        """End the transfer: the peer's receive() raises TransportError at once."""
        self._abort_peer(self.session, reason, None, None)
        for item in self._out.values():
            if not item.done:
                item.done = True
                self._arena.give()

    def _step(self) -> bool:
        """One round of progress; True if anything happened."""
        moved = False
        for record in self._records():
            moved = True
            self._on_record(record)
        for item in self._out.values():
            if item.done:
                continue
            try:
                moved |= self._advance(item)
            except HurrayWireError as exc:
                self._fail(item, exc)
        return moved

    def _fail(self, item: _Outgoing, exc: HurrayWireError) -> None:
        self._abort_peer(self.session, str(exc), item.layer, item.role)
        raise _named(exc, item.layer, item.role) from _origin(exc)

    def _on_record(self, r: TransferRecord) -> None:
        if r.session != self.session:
            raise TransportError("record of another session", found=f"0x{r.session:016x}")
        if r.kind == "abort":
            raise TransportError(f"the receiver aborted: {r.reason}", layer=r.layer, role=r.role)
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
            self._arena.give()
        else:
            raise TransportError(f"unexpected {r.kind} record", layer=r.layer, role=r.role)

    def _advance(self, item: _Outgoing) -> bool:
        moved = False
        if not item.ready and item.future.done():
            result = item.future.result()  # re-raises an encoding error
            moved = True
            if item.staged:
                self._arena.shrink(item.arena_start, item.total, int(result))
                item.total = int(result)
                address = int(self._arena.buf.ctypes.data) + item.arena_start
                view = self._arena.buf[item.arena_start : item.arena_start + item.total]
                offset, length, raw, _ = _pool_section(view)
                item.pool_offset, item.pool_length = (offset, length) if raw else (0, 0)
                item.segments = (Segment(0, item.total, address),)
                item.ready = True
                self._offer(item)  # with the ready flag: the blob is complete
            else:
                head = np.frombuffer(result, np.uint8)
                self._arena.buf[item.arena_start : item.arena_start + len(head)] = head
                item.ready = True
                if not item.write:
                    self._send(TransferRecord("ready", self.session, item.layer, item.role))
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
            self._arena.give()
        return moved

    def close(self) -> None:
        self._hasher.shutdown(wait=True)
        super().close()


@dataclass
class _Incoming:
    """One offered blob on the receiver: where it lands and what is still in flight."""

    offer: TransferRecord
    landing: int  # arena offset of the bytes that do not land in an engine array
    pool: _U8 | None  # the engine's page pool array (flat bytes), when it lands there
    segments: tuple[Segment, ...] = ()
    xfers: list[Any] = field(default_factory=list)
    head_posted: bool = False
    engine: _U8 | None = None  # the expected page pool array (compressed pools are copied in)
    landed: bool = False


class NixlReceiver(_Endpoint):
    """The side that takes the KV cache: READs offered blobs or is written (WRITE) into its
    landing region (``arena_bytes``, registered here) or, for a page pool the caller named
    with ``expect``, straight into the engine's own array, then decodes each one validated
    and zero-copy as soon as it has landed, while later ones are still in flight.

    Tensors decoded from the landing region are views of it and stay valid until the next
    ``receive`` call, which reuses the region (so the blobs of one call must fit in it);
    page pools that landed in engine arrays are the engine's arrays.
    """

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
    ) -> None:
        if page_store is not None and not isinstance(page_store, PageStore):
            raise ArgumentTypeError("page_store must be a PageStore or None", field="page_store",
                                    found=type(page_store).__name__)  # fmt: skip
        if expect_fingerprint is not None and not isinstance(expect_fingerprint, EngineFingerprint):
            raise ArgumentTypeError("expect_fingerprint must be an EngineFingerprint or None",
                                    field="expect_fingerprint",
                                    found=type(expect_fingerprint).__name__)  # fmt: skip
        super().__init__(name, ucx_error_handling_mode=ucx_error_handling_mode,
                         arena_bytes=arena_bytes, progress_thread=progress_thread)  # fmt: skip
        self.verify = verify
        self.limits = limits
        self.page_store = page_store
        self.expect_fingerprint = expect_fingerprint
        self.session: int | None = None
        self._pools: dict[tuple[int, str], _U8] = {}
        self._in: dict[tuple[int, str], _Incoming] = {}
        # Landed blobs are decoded and their checksums verified on one thread (xxh3 lets go
        # of the GIL), while this thread keeps the later transfers moving.
        self._decoder = ThreadPoolExecutor(1, thread_name_prefix="hurray-wire-nixl-decode")
        self._decoding: list[tuple[_Incoming, Future[Any]]] = []

    def send_known_pages(self, digests: Any) -> None:
        """Tell the sender which pages this side's store holds (the known-pages record of
        docs/integrity.md § 5.1, sent as one notification, before the sender publishes):
        it then sends those pages as references, filled from ``page_store`` on decode."""
        record = encode_known_pages(digests)
        _call("send_notif", self._agent.send_notif, self._peer_name(), record)

    def expect(self, layer: int, role: str, page_pool: npt.NDArray[Any]) -> None:
        """Land the page pool of blob {layer, role} in ``page_pool`` (registered memory of
        exactly the pool's size): the decoded tensor's page_pool then shares its memory."""
        if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < 0xFFFFFFFF:
            raise ArgumentTypeError("layer must be an int in [0, 2**32 - 1)", found=repr(layer))
        if role not in ROLE_CODES:
            raise ArgumentTypeError("unknown kv_role", field="role", found=repr(role),
                                    expected=sorted(ROLE_CODES))  # fmt: skip
        flat = _bytes_of(page_pool, "page_pool")
        if not self._registered(int(flat.ctypes.data), flat.nbytes):
            raise TransportError("page_pool is not in registered memory", layer=layer,
                                 role=role)  # fmt: skip
        self._pools[(layer, role)] = flat

    def receive(self, count: int, *, deadline: float = DEFAULT_DEADLINE) -> Iterator[Any]:
        """Yield ``count`` tensors in the order they land (each decoded and validated).

        Raises TransportError naming the layer and role on a corrupted blob (its checksum),
        a peer that lies (lengths, layer, role), an abort by the peer, a failed transfer,
        or when ``deadline`` seconds pass before all ``count`` have come.
        """
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ArgumentTypeError("count must be an int >= 0", found=repr(count))
        until = _deadline(deadline)
        self._peer_name()
        if not self._in and not self._decoding:
            self._arena.top = 0
            self._arena.live = 0
        yielded = 0
        idle = 0
        while yielded < count:
            try:  # first post the transfers of new offers, so they move while we decode
                moved = self._step()
            except TransportError as exc:
                self._abort_peer(self.session or 0, str(exc), exc.layer, exc.role)
                raise
            for key in [k for k, item in self._in.items() if item.landed]:
                item = self._in.pop(key)
                if self.verify and self._has_checksums(item):  # hashed on the decoder thread
                    future = self._decoder.submit(self._decode, item)
                else:  # a few microseconds: no thread hand-off
                    future = Future()
                    try:
                        future.set_result(self._decode(item))
                    except HurrayWireError as exc:
                        future.set_exception(exc)
                self._decoding.append((item, future))
            if self._decoding and self._decoding[0][1].done():
                item, future = self._decoding.pop(0)
                tensor = self._guarded(item, future.result)
                yielded += 1
                idle = 0
                yield tensor
                continue
            idle = 0 if moved else idle + 1
            if time.monotonic() > until and yielded < count:
                pending = [k for k, item in self._in.items() if not item.landed]
                layer, role = pending[0] if pending else (None, None)
                self._abort_peer(self.session or 0, "receiver deadline passed", layer, role)
                raise TransportError(
                    f"deadline passed: {yielded} of {count} blobs received, "
                    f"{len(pending)} in flight",
                    layer=layer,
                    role=role,
                )
            busy = any(item.xfers for item in self._in.values())
            time.sleep(0 if idle < 64 or busy else 0.0002)  # transfers move while we poll

    def _guarded(self, item: _Incoming, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn``; any error names the blob and is sent to the peer as an abort."""
        layer, role = item.offer.layer, item.offer.role
        try:
            return fn(*args)
        except HurrayWireError as exc:
            self._abort_peer(self.session or 0, str(exc), layer, role)
            raise _named(exc, layer, role) from _origin(exc)

    def _step(self) -> bool:
        moved = False
        for record in self._records():
            moved = True
            self._on_record(record)
        for item in self._in.values():
            if item.landed or item.offer.write or not item.head_posted:
                continue
            if all(self._guarded(item, self._state, x) == "DONE" for x in item.xfers):
                for x in item.xfers:
                    x.release()
                item.xfers.clear()
                item.landed = moved = True
                r = item.offer
                self._send(TransferRecord("done", r.session, r.layer, r.role))
        return moved

    def _on_record(self, r: TransferRecord) -> None:
        if self.session is None and r.kind == "offer":
            self.session = r.session
        if r.session != self.session:
            raise TransportError("record of another session", found=f"0x{r.session:016x}")
        if r.kind == "abort":
            raise TransportError(f"the sender aborted: {r.reason}", layer=r.layer, role=r.role)
        assert r.layer is not None and r.role is not None  # records.py: all but abort name both
        key = (r.layer, r.role)
        item = self._in.get(key)
        if r.kind == "offer" and item is None:
            item = self._in[key] = self._land(r)
            self._guarded(item, self._start, item)
        elif r.kind == "ready" and item is not None and not item.offer.write:
            if item.head_posted:
                raise TransportError("ready record twice", layer=r.layer, role=r.role)
            local, remote = _pieces(item.segments, item.offer.segments, 0, _head_end(item))
            item.xfers.append(self._guarded(item, self._post, "READ", local, remote))
            item.head_posted = True
        elif r.kind == "done" and item is not None and item.offer.write and not item.landed:
            item.landed = True
        else:
            raise TransportError(f"unexpected {r.kind} record", layer=r.layer, role=r.role)

    def _land(self, r: TransferRecord) -> _Incoming:
        """Choose where each byte of an offered blob lands (our segments)."""
        assert r.layer is not None and r.role is not None
        limit = len(self._arena.buf)
        pool = self._pools.pop((r.layer, r.role), None)
        if pool is not None and r.pool_length and pool.nbytes != r.pool_length:
            raise TransportError("offered page pool size differs from the engine's array",
                                 layer=r.layer, role=r.role, expected=pool.nbytes,
                                 found=r.pool_length)  # fmt: skip
        split = pool is not None and r.pool_length > 0
        own = r.total_length - r.pool_length if split else r.total_length
        start = self._arena.take(own)
        if start is None:
            raise TransportError("blob does not fit the receiver's landing region",
                                 layer=r.layer, role=r.role,
                                 expected=f"<= {limit - self._arena.top}",
                                 found=own)  # fmt: skip
        base = int(self._arena.buf.ctypes.data) + start
        if split:
            assert pool is not None
            end = r.pool_offset + r.pool_length
            segments = [Segment(0, r.pool_offset, base),
                        Segment(r.pool_offset, r.pool_length, int(pool.ctypes.data))]  # fmt: skip
            if end < r.total_length:
                segments.append(Segment(end, r.total_length - end, base + r.pool_offset))
        else:
            segments = [Segment(0, r.total_length, base)]
        return _Incoming(r, start, pool if split else None, tuple(segments), engine=pool)

    def _start(self, item: _Incoming) -> None:
        r = item.offer
        if r.write:
            self._send(TransferRecord("grant", r.session, r.layer, r.role,
                                      total_length=r.total_length, pool_offset=r.pool_offset,
                                      pool_length=r.pool_length,
                                      segments=item.segments))  # fmt: skip
            return
        if r.ready:  # the whole blob is final: one READ
            local, remote = _pieces(item.segments, r.segments, 0, r.total_length)
            item.xfers.append(self._post("READ", local, remote))
            item.head_posted = True
            return
        head_end = _head_end(item)
        if head_end < r.total_length:
            local, remote = _pieces(item.segments, r.segments, head_end, r.total_length)
            item.xfers.append(self._post("READ", local, remote))

    def _has_checksums(self, item: _Incoming) -> bool:
        """Whether the landed blob's header says its sections carry checksums."""
        head = self._arena.buf[item.landing : item.landing + _HEADER]
        return len(head) == _HEADER and int(head[_CHECKSUM_TYPE_AT]) == wb.CHECKSUM_XXH3_64

    def close(self) -> None:
        self._decoder.shutdown(wait=True)
        super().close()

    def _decode(self, item: _Incoming) -> Any:
        """Validate the landed blob and return its tensor (zero-copy)."""
        r = item.offer
        land = self._arena.buf[item.landing :]
        if blob_length(land) != r.total_length:
            raise TransportError("the offer's total_length is not the blob's", layer=r.layer,
                                 role=r.role, expected=blob_length(land),
                                 found=r.total_length)  # fmt: skip
        if item.pool is None:
            tensor = decode(land[: r.total_length], verify=self.verify, limits=self.limits,
                            page_store=self.page_store,
                            expect_fingerprint=self.expect_fingerprint)  # fmt: skip
            if item.engine is not None:  # a compressed pool: decompressed, then copied in
                pool = tensor.page_pool
                if pool.nbytes != item.engine.nbytes:
                    raise TransportError("page pool size differs from the engine's array",
                                         layer=r.layer, role=r.role,
                                         expected=item.engine.nbytes,
                                         found=pool.nbytes)  # fmt: skip
                item.engine[...] = pool.reshape(-1).view(np.uint8)
                tensor.page_pool = item.engine.view(pool.dtype).reshape(pool.shape)
        else:
            tensor = self._decode_split(item, land)
        if tensor.layer_index != r.layer or tensor.kv_role != r.role:
            raise TransportError("the blob is not the one offered", layer=r.layer, role=r.role,
                                 found=f"layer {tensor.layer_index} {tensor.kv_role}")  # fmt: skip
        return tensor

    def _decode_split(self, item: _Incoming, land: _U8) -> Any:
        """Decode a blob whose page pool landed in the engine's array and the rest here.

        ``decode`` takes one contiguous blob, so the header and the small sections are
        copied into a zero-filled shadow of the blob's size (its pool range is never written
        or read, so the OS never backs it with memory) and decoded there without section
        checksums; then each section's checksum is checked where its bytes really are, and
        the tensor's page_pool is pointed at the engine's array.
        """
        r = item.offer
        assert item.pool is not None
        end = r.pool_offset + r.pool_length
        shadow = np.zeros(r.total_length, np.uint8)
        shadow[: r.pool_offset] = land[: r.pool_offset]
        shadow[end:] = land[r.pool_offset : r.pool_offset + r.total_length - end]
        tensor = decode(shadow, verify=False, limits=self.limits,
                        expect_fingerprint=self.expect_fingerprint)  # fmt: skip
        offset, length, raw, checked = _pool_section(shadow)
        if (offset, length, raw) != (r.pool_offset, r.pool_length, True):
            raise TransportError("the offer's page pool range is not the blob's", layer=r.layer,
                                 role=r.role, expected=f"{offset}+{length}",
                                 found=f"{r.pool_offset}+{r.pool_length}")  # fmt: skip
        if self.verify and checked:
            count = wb.BLOB_HEADER.parse(bytes(shadow[:_HEADER])).section_count
            for k in range(count):
                at = _HEADER + _ENTRY * k
                e = wb.SECTION_ENTRY.parse(bytes(shadow[at : at + _ENTRY]))
                data = item.pool if k == 0 else shadow[e.offset : e.offset + e.stored_size]
                computed = xxhash.xxh3_64_intdigest(data.data)
                if computed != e.checksum:
                    name = wb.SECTION_KINDS.get(e.kind, f"kind 0x{e.kind:02X}")
                    raise ChecksumError(
                        "section checksum mismatch",
                        section=f"{name}[{e.index}]",
                        offset=e.offset,
                        expected=f"0x{computed:016x}",
                        found=f"0x{e.checksum:016x}",
                    )
        pool = tensor.page_pool
        tensor.page_pool = item.pool.view(pool.dtype).reshape(pool.shape)
        return tensor


def _head_end(item: _Incoming) -> int:
    """End of the sender's header segment (final only after its ready record)."""
    return item.offer.segments[0].length
