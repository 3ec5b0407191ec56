"""The HurrayConnector's transfers, prefill side, without vLLM (docs/vllm.md); the decode
side is ``receive``. A transfer (one request's prompt pages, copied as each layer is computed)
is kept under a fresh ``transfer_id`` until each decode rank that needs it pulled it once, or
it expires. A pull is one JSON line naming the transfer, request, prompt digest and block ids,
answered by one JSON line and then a hurray-wire stream (fingerprint and identity in its
header, a blob per layer and role with page digests). vLLM #52234's three failures are refused
by name: foreign block ids, a consumed transfer, a stale reference.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import socket
import ssl
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from hurray_wire.containers import StreamHeader, StreamWriter
from hurray_wire.errors import HurrayWireError, TransferRefusedError, TransportError
from hurray_wire.fingerprint import EngineFingerprint, fingerprint_to_metadata
from hurray_wire.integrity.delta import decode_known_pages
from hurray_wire.tensor import BlockPagedTensor
from hurray_wire.vllm.backends import roles_of_layout
from hurray_wire.vllm.net import Deadline, Tls, listen
from hurray_wire.vllm.params import (
    MAX_BLOCK_ID,
    TransferParams,
    identity,
    one_sequence,
    prompt_digest,
)
from hurray_wire.vllm.peers import NixlPeers
from hurray_wire.vllm.tp import pullers

__all__ = [
    "TransferParams",
    "TransferServer",
    "TransferStore",
    "known_pages",
    "prompt_digest",
    "serve_one",
]

logger = logging.getLogger("hurray_wire.vllm")
MAX_LINE = 1 << 20  # bytes of one control line (an ask carries the held pages' digests)
MAX_TP = 1 << 16  # the most TP ranks a pull may name
ROLES = ("key", "value")


# -- prefill side ----------------------------------------------------------------------------
@dataclass
class _Transfer:
    request_id: str
    block_ids: tuple[int, ...]
    num_tokens: int
    digest: str
    block_size: int
    layers: dict[int, tuple[npt.NDArray[Any], ...]] = field(default_factory=dict)
    # per layer, each role's page digests taken at the copy (CacheForm.read_digested)
    digests: dict[int, tuple[npt.NDArray[np.uint64], ...]] = field(default_factory=dict)
    complete: bool = False
    created: float = field(default_factory=time.monotonic)
    served: set[int] = field(default_factory=set)  # decode ranks that pulled it
    decode_tp: int | None = None


@dataclass
class TransferStore:
    """Transfers a prefill worker holds until pulled once or ``ttl`` seconds pass: copies, so
    blocks the engine reuses cannot change them; consumed and expired ids are remembered
    (bounded), so a second pull is refused as ``consumed``, not ``unknown``."""

    fingerprint: EngineFingerprint
    model: str
    num_layers: int
    ttl: float = 120.0
    _live: dict[str, _Transfer] = field(default_factory=dict)
    _gone: dict[str, str] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @staticmethod
    def new_id() -> str:
        return uuid.uuid4().hex

    def begin(self, tid: str, rid: str, block_ids: Sequence[int], tokens: int, digest: str) -> None:
        with self._lock:
            self._expire()
            size = self.fingerprint.block_size
            self._live[tid] = _Transfer(rid, tuple(block_ids), tokens, digest, size)

    def has(self, transfer_id: str) -> bool:
        with self._lock:
            return transfer_id in self._live or transfer_id in self._gone

    def drop(self, transfer_id: str, reason: str) -> None:
        """Forget a transfer that cannot be served; a pull of it is refused as ``reason``."""
        with self._lock:
            self._live.pop(transfer_id, None)
            self._gone[transfer_id] = reason

    def add_layer(
        self,
        transfer_id: str,
        layer_index: int,
        *pages: npt.NDArray[Any],
        copy: bool = True,
        digests: Sequence[npt.NDArray[np.uint64]] | None = None,
    ) -> None:
        """Each role's pages ``[pages, block_size, H, D]``, copied unless ``copy=False``;
        ``digests``, taken at the copy, are sent instead of hashing again: the store's own
        memory is never written after it (docs/performance.md)."""
        with self._lock:
            transfer = self._live.get(transfer_id)
            if transfer is None:
                return
            transfer.layers[layer_index] = tuple(np.array(p, copy=copy) for p in pages)
            if digests is not None:
                transfer.digests[layer_index] = tuple(digests)
            if len(transfer.layers) == self.num_layers:
                transfer.complete = True

    def expire(self) -> None:
        """Drop the transfers whose ``ttl`` passed (their pages are freed with them)."""
        with self._lock:
            self._expire()

    def _expire(self) -> None:
        now = time.monotonic()
        for tid in [t for t, tr in self._live.items() if now - tr.created > self.ttl]:
            del self._live[tid]
            self._gone[tid] = "expired"
        while len(self._gone) > 4096:
            self._gone.pop(next(iter(self._gone)))

    def take(self, ask: Mapping[str, Any], *, commit: bool = True) -> tuple[_Transfer, int, int]:
        """``(transfer, first page to send, pages before it sent as references)``; every
        mismatch a ``TransferRefusedError`` naming it. Served once to each decode rank that
        needs this rank's heads (``tp.pullers``); ``commit=False``: only checked."""
        tid = ask.get("transfer_id")
        with self._lock:
            self._expire()
            transfer = self._live.get(tid) if isinstance(tid, str) else None
            if transfer is None:
                gone = self._gone.get(tid) if isinstance(tid, str) else None
                reason = gone or "unknown"
                raise TransferRefusedError(
                    f"transfer {tid!r} is {reason}", reason=reason, field="transfer_id"
                )
            checks = (
                ("request_id", transfer.request_id, "stale_request"),
                ("prompt_digest", transfer.digest, "stale_content"),
                ("block_ids", list(transfer.block_ids), "block_ids"),
            )
            for name, mine, reason in checks:
                if ask.get(name) != mine:
                    raise TransferRefusedError(
                        f"transfer {tid} does not carry these {name}",
                        reason=reason,
                        field=name,
                        expected=mine if name != "block_ids" else f"{len(mine)} block ids",
                        found=ask.get(name),
                    )
            first, held = ask.get("first_page", 0), ask.get("held_pages", 0)
            # pages from ``first`` on hold num_tokens - first * block_size >= 0 tokens (F11)
            pages = min(len(transfer.block_ids), transfer.num_tokens // transfer.block_size)
            for name, value in (("first_page", first), ("held_pages", held)):
                if type(value) is not int or not 0 <= value <= pages:
                    raise TransferRefusedError(
                        f"{name} out of range",
                        reason="block_ids",
                        field=name,
                        expected=f"0..{pages}",
                        found=value,
                    )
            if held and first:
                raise TransferRefusedError(
                    "held_pages needs first_page 0",
                    reason="block_ids",
                    field="held_pages",
                    found=held,
                )
            rank, size = ask.get("decode_rank", 0), ask.get("decode_tp_size", 1)
            fp = self.fingerprint
            ok = type(rank) is int and type(size) is int and 0 <= rank < size <= MAX_TP
            need = pullers(fp.tp_size, size, fp.tp_rank) if ok else set()
            if not ok or rank not in need or transfer.decode_tp not in (None, size):
                raise TransferRefusedError(
                    f"decode rank {rank!r} of {size!r} does not pull prefill rank "
                    f"{fp.tp_rank} of {fp.tp_size}", reason="tp", field="decode_rank",
                    expected=sorted(need)[:16], found=rank,
                )  # fmt: skip
            if rank in transfer.served:
                raise TransferRefusedError(f"transfer {tid} is consumed", reason="consumed",
                                           field="transfer_id")  # fmt: skip
            if not transfer.complete:
                raise TransferRefusedError(
                    f"transfer {tid} is incomplete", reason="incomplete", field="transfer_id"
                )
            if not commit:
                return transfer, first, held
            transfer.served.add(rank)
            transfer.decode_tp = size
            if transfer.served >= need:
                assert isinstance(tid, str)  # it named a live transfer
                del self._live[tid]
                self._gone[tid] = "consumed"
            return transfer, first, held


def _send_line(sock: socket.socket, obj: Mapping[str, Any]) -> None:
    sock.sendall(json.dumps(obj, separators=(",", ":")).encode() + b"\n")


def _read_line(sock: socket.socket, *, exact: bool = True) -> dict[str, Any]:
    """One JSON control line of at most ``MAX_LINE`` bytes and ``MAX_DEPTH`` levels of
    nesting. ``exact``: not a byte more is read (a stream may follow it on the socket):
    peeked, then taken up to its newline (over TLS, which cannot peek, a byte at a time;
    answer lines are short). Anything else raises ``TransportError``."""
    buf = bytearray()
    tls = isinstance(sock, ssl.SSLSocket)
    while True:
        if tls:
            chunk = sock.recv(1 if exact else MAX_LINE + 1 - len(buf))
        else:
            chunk = sock.recv(MAX_LINE + 1 - len(buf), socket.MSG_PEEK if exact else 0)
        if not chunk:
            raise TransportError("the peer closed the connection before its control line")
        end = chunk.find(b"\n")
        if exact and not tls:
            chunk = sock.recv(len(chunk) if end < 0 else end + 1)
        buf += chunk if end < 0 or exact else chunk[: end + 1]
        if len(buf) > MAX_LINE:
            raise TransportError(f"a control line over {MAX_LINE} bytes", found=len(buf))
        if end >= 0:
            break
    return parse_line(bytes(buf))


MAX_DEPTH = 4  # levels of nesting in a control line (the deepest today: a list in an object)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def parse_line(data: bytes) -> dict[str, Any]:
    """A control line's JSON object: no NaN or Infinity, ints of at most 4,300 digits,
    at most ``MAX_DEPTH`` levels; anything else raises ``TransportError`` (json's own
    RecursionError and ValueError included: a peer's line never raises anything else)."""
    try:
        obj = json.loads(data, parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as exc:
        raise TransportError(f"a control line that is not JSON: {type(exc).__name__}") from None
    if not isinstance(obj, dict):
        raise TransportError("a control line that is not a JSON object", found=type(obj).__name__)
    if _too_deep(obj, MAX_DEPTH):
        raise TransportError(f"a control line nested over {MAX_DEPTH} levels")
    return obj


def _too_deep(value: object, budget: int) -> bool:
    """Whether ``value`` nests deeper than ``budget`` levels (stops at the budget)."""
    if not isinstance(value, (dict, list)):
        return False
    if budget == 0:
        return True
    items = value.values() if isinstance(value, dict) else value
    return any(_too_deep(item, budget - 1) for item in items)


#: The fields of a pull's ask and their types; a field present with another type is
#: refused (``malformed``) before the store is asked (unknown keys are ignored;
#: ``known_pages`` is ``known_pages``'s to check).
_ASK: dict[str, type | tuple[type, ...]] = {
    "transfer_id": str,
    "request_id": str,
    "prompt_digest": str,
    "block_ids": list,
    "first_page": int,
    "held_pages": int,
    "decode_rank": int,
    "decode_tp_size": int,
    "transport": str,
    "agent": str,
    "agent_metadata": (str, type(None)),
}


def check_ask(ask: Mapping[str, Any]) -> None:
    """Every field of a pull's ask of its type (bool is not an int; ints and block ids
    bounded); raises ``TransferRefusedError`` (``malformed``) naming the first that is not."""
    for name, kind in _ASK.items():
        if name not in ask:
            continue
        value = ask[name]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        ok = type(value) in kinds
        if ok and type(value) is int:
            ok = 0 <= value <= MAX_BLOCK_ID
        elif ok and type(value) is list:
            ok = all(type(b) is int and 0 <= b <= MAX_BLOCK_ID for b in value)
        elif ok and type(value) is str and name != "agent_metadata":
            ok = len(value) <= 1024
        if not ok:
            raise TransferRefusedError(
                f"the ask's {name} is not a {'/'.join(k.__name__ for k in kinds)} in range",
                reason="malformed", field=name, found=type(value).__name__,
            )  # fmt: skip


def _tensors(
    transfer: _Transfer,
    num_layers: int,
    first: int,
    roles: tuple[str, ...],
    metadata: Mapping[str, Any] | None = None,
) -> Iterator[tuple[BlockPagedTensor, Any]]:
    """Each role of each layer, pages ``first..``, with the encoder's ``page_digests=``: those
    taken at the save (the tensor's whole pool, which ``one_sequence`` references), else True."""
    tokens = transfer.num_tokens - first * transfer.block_size
    for layer in range(num_layers):
        held = transfer.digests.get(layer) or (None,) * len(roles)
        for role, pages, digests in zip(roles, transfer.layers[layer], held, strict=True):
            tensor = one_sequence(np.ascontiguousarray(pages[first:]), tokens, kv_role=role,
                                  layer_index=layer, metadata=metadata)  # fmt: skip
            yield tensor, True if digests is None else digests[first:]


def known_pages(ask: Mapping[str, Any], transfer: _Transfer, num_layers: int) -> Any:
    """The known-pages record (docs/integrity.md § 5.1, base64 in the ask) of the digests the
    decode worker holds: those pages travel as references; a stale held page's digest matches
    nothing, so its page travels in full and the decode worker repairs it."""
    record = ask.get("known_pages")
    if record is None:
        return None
    if not isinstance(record, str):
        raise TransferRefusedError("known_pages must be base64", reason="known_pages",
                                   field="known_pages", found=type(record).__name__)  # fmt: skip
    try:
        data = base64.b64decode(record, validate=True)
        limit = 2 * num_layers * len(transfer.block_ids)
        return decode_known_pages(data, max_entries=limit)
    except (ValueError, HurrayWireError) as exc:
        raise TransferRefusedError(f"known_pages: {exc}", reason="known_pages",
                                   field="known_pages") from None  # fmt: skip


def serve_one(
    store: TransferStore,
    conn: socket.socket,
    nixl: NixlPeers | None = None,
    deadline: Deadline | None = None,
) -> int:
    """Answer one pull on ``conn``; the bytes sent (0: refused). ``"transport": "nixl"``: the
    pages as NIXL blobs through the agent's leased sender, ``conn`` carrying the control lines
    only, the NIXL send bounded by ``deadline`` (the connection's) too."""
    ask = _read_line(conn, exact=False)  # the decode worker sends nothing after its ask
    wants_nixl = ask.get("transport") == "nixl"
    with contextlib.ExitStack() as leases:
        try:
            check_ask(ask)
            peer = None
            if wants_nixl:
                if nixl is None:
                    raise TransferRefusedError(
                        "this prefill worker serves the socket transport only", reason="transport"
                    )
                if deadline is None:  # a caller's own connection: bounded all the same
                    deadline = Deadline(nixl.timeout)
                    leases.callback(deadline.close)
                # a sender only for a live transfer's ask (its id is the bearer token), and
                # before the transfer is taken: a refused agent consumes nothing
                store.take(ask, commit=False)
                peer = leases.enter_context(nixl.sending(ask, deadline))
            transfer, first, held = store.take(ask)
            known = known_pages(ask, transfer, store.num_layers)
        except TransferRefusedError as exc:
            refusal = {"ok": False, "reason": exc.reason, "message": str(exc)}
            _send_line(conn, refusal if exc.field is None else {**refusal, "field": exc.field})
            return 0
        roles = roles_of_layout(store.fingerprint.kv_cache_layout)
        claims = identity(ask["transfer_id"], transfer.request_id, transfer.digest, first, held,
                          transfer.num_tokens)  # fmt: skip
        try:
            if nixl is not None and peer is not None and deadline is not None:  # NIXL blobs
                sender, mine = nixl.sender(peer)
                _send_line(conn, {"ok": True, "agent_metadata": mine})
                meta = {**claims, **fingerprint_to_metadata(store.fingerprint)}
                total = 0
                # every wait (for arena space, for the peer's READs) within the deadline
                for tensor, digests in _tensors(transfer, store.num_layers, first, roles, meta):
                    sender.publish(tensor, mode="staged", checksum=False, page_digests=digests,
                                   known_pages=known, deadline=deadline.left())  # fmt: skip
                    total += tensor.page_pool.nbytes
                sender.wait(deadline=deadline.left())
                _send_line(conn, {"done": True})
                return total
            _send_line(conn, {"ok": True})  # the pages as a stream on conn
            header = StreamHeader(model=store.model, num_layers=store.num_layers, kv_roles=roles,
                                  fingerprint=store.fingerprint, metadata=claims)  # fmt: skip
            with StreamWriter(conn, header) as writer:  # a failure aborts it: no end record
                for tensor, digests in _tensors(transfer, store.num_layers, first, roles):
                    # StreamWriter forwards page_digests to the encoder, which takes the array
                    writer.write(tensor, checksum=False, page_digests=digests, known_pages=known)
            return writer.position
        except (OSError, HurrayWireError) as exc:
            # once per transfer (a transfer is served once), with the request it was for
            logger.error("HurrayConnector: request %s: KV send failed: %s",
                         transfer.request_id, exc)  # fmt: skip
            raise


class TransferServer:
    """The prefill worker's listener on ``host:port`` (0: a free one, read from ``port``): a
    thread per pull, at most ``max_connections`` (more are refused as ``busy``), each bounded
    by ``timeout`` (``net.Deadline``); nothing a client sends ends it or delays another."""

    def __init__(
        self,
        store: TransferStore,
        host: str,
        port: int,
        timeout: float = 30.0,
        nixl: NixlPeers | None = None,
        listener: socket.socket | None = None,
        *,
        max_connections: int = 32,
        tls: Tls | None = None,
    ):
        self.store = store
        self.nixl = nixl
        # ``listener``: a socket bound earlier (an engine binds at start, to fail there)
        self._sock = listener if listener is not None else listen(host, port)
        self._sock.settimeout(0.2)
        self._tls = None if tls is None else tls.server_context()
        self.host = host
        self.port: int = self._sock.getsockname()[1]
        self._timeout = timeout
        self._stop = threading.Event()
        self._slots = threading.BoundedSemaphore(max_connections)
        self._count = threading.Lock()
        self.sent_bytes = 0
        self.errors: list[BaseException] = []
        self._thread = threading.Thread(target=self._run, name="hurray-serve", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        swept = time.monotonic()
        while not self._stop.is_set():
            if time.monotonic() - swept > 1.0:  # expired transfers go without a new pull
                swept = time.monotonic()
                self.store.expire()
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except Exception as exc:  # EMFILE, a closed listener: nothing ends this loop
                self._error(exc)
                self._stop.wait(0.05)
                continue
            if not self._slots.acquire(blocking=False):
                self._refuse_busy(conn)
                continue
            try:
                threading.Thread(target=self._serve, args=(conn,), name="hurray-conn",
                                 daemon=True).start()  # fmt: skip
            except Exception as exc:  # no thread to be had
                self._slots.release()
                self._refuse_busy(conn)
                self._error(exc)

    def _refuse_busy(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(Exception):
            conn.setblocking(False)  # a line into an empty send buffer, or nothing
            _send_line(conn, {"ok": False, "reason": "busy", "message": "too many pulls"})

    def _serve(self, conn: socket.socket) -> None:
        deadline = Deadline(self._timeout)
        try:
            deadline.attach(conn)
            conn.settimeout(deadline.left())
            if self._tls is not None:
                conn = self._tls.wrap_socket(conn, server_side=True)
                deadline.attach(conn)
            sent = serve_one(self.store, conn, self.nixl, deadline)
            with self._count:
                self.sent_bytes += sent
        except BaseException as exc:  # the thread's top: the puller sees the cut connection
            self._error(deadline.typed(exc))
        finally:
            deadline.close()
            conn.close()
            self._slots.release()

    def _error(self, exc: BaseException) -> None:
        with self._count:
            self.errors.append(exc)
            del self.errors[:-16]

    def take_sent(self) -> int:
        """The bytes sent since the last call (the connector's ``bytes_sent`` counter)."""
        with self._count:
            sent, self.sent_bytes = self.sent_bytes, 0
        return sent

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._sock.close()
        if self.nixl is not None:
            self.nixl.close()
