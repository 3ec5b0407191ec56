"""What both NIXL endpoints share: NIXL, the agent, memory, records, arenas (docs/nixl.md)."""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from hurray_wire.containers.io import ClosesOnExit
from hurray_wire.errors import ArgumentTypeError, HurrayWireError, TransportError
from hurray_wire.transport.records import (
    Segment,
    TransferRecord,
    decode_record,
    encode_record,
)
from hurray_wire.wire import integrity as wi

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

__all__ = ["DEFAULT_DEADLINE", "MAX_KNOWN_PAGES"]

#: Most digests a sender accepts in one known-pages record from its peer (8 bytes each).
MAX_KNOWN_PAGES = 1 << 20
#: Seconds any wait (publish for arena space, wait, receive) may take unless told otherwise.
DEFAULT_DEADLINE = 30.0
#: Seconds a sender naps between polls while only the peer's READs are moving.
PEER_READ_NAP = 0.00005
_ZERO_COPY_MIN = 4096  # smaller parts are copied into the arena: one segment instead of many
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


def _no_descriptors() -> Any:
    """An empty NIXL registration list (partial metadata with connection information only)."""
    bind = sys.modules[_nixl.nixl_agent.__module__].nixlBind
    return bind.nixlRegDList(bind.DRAM_SEG, [])


def _region_bytes(value: object, name: str) -> int:
    """The size of a registered region: an int >= 64."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 64:
        raise ArgumentTypeError(f"{name} must be an int >= 64", field=name, found=repr(value))
    return value


def _deadline(seconds: float) -> float:
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not seconds > 0:
        raise ArgumentTypeError("deadline is a positive number of seconds", found=repr(seconds))
    return time.monotonic() + float(seconds)


class _Arena:
    """A registered byte region handed out as a ring: each piece is given back on its own
    (a blob's room once it is done with), and later pieces wrap round to the front once
    the oldest ones are given back; ``clear`` forgets every piece."""

    def __init__(self, size: int) -> None:
        self.buf = np.zeros(size, np.uint8)
        self.live: dict[int, int] = {}  # start -> end, oldest first

    def take(self, size: int) -> int | None:
        if size > len(self.buf):
            return None
        start = 0
        if self.live:
            head = next(iter(self.live))
            last, top = next(reversed(self.live.items()))
            top = (top + 63) & ~63
            if last >= head:  # after the newest piece, else wrapped round to the front
                if top + size <= len(self.buf):
                    start = top
                elif size > head:
                    return None
            elif top + size <= head:  # wrapped already: up to the oldest piece
                start = top
            else:
                return None
        self.live[start] = start + size
        return start

    def shrink(self, start: int, used: int) -> None:
        """Give back the unused end of a piece."""
        if start in self.live:
            self.live[start] = start + used

    def claim(
        self, size: int, too_big: str, layer: int | None, role: str | None, now: bool = False
    ) -> int | None:
        """Where ``size`` bytes of blob {layer, role} go; None: not yet (earlier pieces
        hold the room); ``too_big`` as a TransportError if they never could (or, ``now``,
        cannot at once)."""
        start = self.take(size)
        if start is None and (now or size > len(self.buf)):
            raise TransportError(too_big, layer=layer, role=role,
                                 expected=f"<= {len(self.buf)}", found=size)  # fmt: skip
        return start

    def give(self, start: int) -> None:
        self.live.pop(start, None)

    def clear(self) -> None:
        self.live.clear()


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


class _Endpoint(ClosesOnExit, ABC):
    """One NIXL agent with a UCX backend, its registrations and its one peer."""

    #: The transfer's id: the sender's own, the receiver's from the first offer.
    session: int | None = None
    _peer_side = "peer"  # who the peer is, in an abort's message
    _worker_name = "hurray-wire-nixl"  # the one thread that hashes (sender) or decodes

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
        _region_bytes(arena_bytes, "arena_bytes")
        self.name = name
        config = _nixl.nixl_agent_config(enable_prog_thread=bool(progress_thread), backends=[])
        self._agent = _call("agent creation", _nixl.nixl_agent, name, config)
        params = dict(_call("get_plugin_params", self._agent.get_plugin_params, "UCX"))
        if not params:
            raise TransportError("NIXL has no UCX plugin on this machine")
        params["ucx_error_handling_mode"] = ucx_error_handling_mode
        _call("create_backend(UCX)", self._agent.create_backend, "UCX", params)
        self._regions: list[tuple[int, int, Any, Any]] = []  # (start, end, array, reg list)
        self._published = False  # metadata() handed the peer our registrations
        self._peer: str | None = None
        self._arena = _Arena(arena_bytes)
        self.register(self._arena.buf)
        self._worker = ThreadPoolExecutor(1, thread_name_prefix=self._worker_name)

    # -- memory and peers ------------------------------------------------------------------
    def register(self, array: Any) -> None:
        """Register long-lived memory (an engine's KV pool) with NIXL. On a sender, only
        before ``metadata()``: metadata taken earlier would not know it (NIXL: "no potential
        backend found"); a receiver's metadata names none of its memory."""
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
        self._worker.shutdown(wait=True)
        for _, _, _, reg in self._regions:
            with contextlib.suppress(Exception):  # shutdown must not raise for a stale handle
                self._agent.deregister_memory(reg)
        self._regions.clear()
        if self._peer is not None:
            with contextlib.suppress(Exception):
                self._agent.remove_remote_agent(self._peer)
            self._peer = None

    # -- control records -------------------------------------------------------------------
    def _send(self, record: TransferRecord) -> None:
        _call("send_notif", self._agent.send_notif, self._peer_name(), encode_record(record))

    def _records(self) -> bool:
        """Handle the peer's new records, validated (anything else is an error); True if
        there were any."""
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
                    continue
                r = decode_record(m)
                if self.session is None and r.kind == "offer":
                    self.session = r.session
                if r.session != self.session:
                    raise TransportError("record of another session", found=f"0x{r.session:016x}")
                if r.kind == "abort":
                    raise TransportError(f"the {self._peer_side} aborted: {r.reason}",
                                         layer=r.layer, role=r.role)  # fmt: skip
                out.append(r)
        for r in out:
            self._on_record(r)
        return bool(out)

    @abstractmethod
    def _on_record(self, r: TransferRecord) -> None:
        """One record of this session's peer (not an abort): the sender's and the
        receiver's own protocol step."""

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

    def _abort_peer(self, reason: str, layer: int | None, role: str | None) -> None:
        """Tell the peer we stopped (best effort: the peer may be gone)."""
        with contextlib.suppress(Exception):
            abort = TransferRecord("abort", self.session or 0, layer, role, reason=reason[:1000])
            self._send(abort)

    def _guarded(self, blob: Any, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn``; any error is sent to the peer as an abort and raised as a
        TransportError naming the blob (its ``layer`` and ``role``)."""
        layer, role = blob.layer, blob.role
        try:
            return fn(*args)
        except HurrayWireError as exc:
            self._abort_peer(str(exc), layer, role)
            if not isinstance(exc, TransportError):
                name = type(exc).__name__
                raise TransportError(f"{name}: {exc}", layer=layer, role=role) from exc
            if exc.layer is not None:
                raise
            cause = exc.__cause__ or exc  # NIXL's own error, when ``exc`` merely wraps it
            raise TransportError(exc.message, layer=layer, role=role) from cause
