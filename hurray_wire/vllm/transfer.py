"""The HurrayConnector's transfers, without vLLM: what a prefill worker keeps, what it serves,
what a decode worker checks before a page may land (docs/vllm.md).

A transfer is one request's prompt pages, copied out of the prefill engine's pool as each
layer is computed and kept under a fresh ``transfer_id`` until the decode worker pulls it
(once) or it expires. The pull is one JSON line from the decode worker naming the transfer,
the request, the prompt digest and the prefill-side block ids it was told, answered by one
JSON line and, when accepted, a hurray-wire stream (``StreamWriter`` / ``StreamReader``):
a header carrying the engine fingerprint and the transfer's identity, then a key and a value
blob per layer with page digests. The three failures of vLLM #52234 are refused by name:
out-of-range or foreign block ids, a consumed transfer pulled again, a stale reference (a
prompt digest or request that is not the transfer's).
"""

from __future__ import annotations

import base64
import contextlib
import json
import socket
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from hurray_wire.containers import StreamHeader, StreamReader, StreamWriter
from hurray_wire.errors import (
    HurrayWireError,
    IncompatibleFingerprintError,
    TransferRefusedError,
    TransportError,
)
from hurray_wire.fingerprint import (
    EngineFingerprint,
    differences,
    fingerprint_from_metadata,
    fingerprint_to_metadata,
)
from hurray_wire.tensor import BlockPagedTensor
from hurray_wire.transforms.repage import repage
from hurray_wire.vllm.params import PARAM_KEYS, TransferParams, prompt_digest
from hurray_wire.vllm.peers import NixlPeers

__all__ = [
    "PARAM_KEYS",
    "LoadResult",
    "PulledPages",
    "TransferParams",
    "TransferServer",
    "TransferStore",
    "prompt_digest",
    "pull",
]

MAX_LINE = 1 << 16  # bytes of one control line
ROLES = ("key", "value")
# Fingerprint fields the decode side converts instead of refusing.
CONVERTIBLE = ("tp_rank", "block_size")


# -- prefill side ----------------------------------------------------------------------------
@dataclass
class _Transfer:
    key: str
    request_id: str
    block_ids: tuple[int, ...]
    num_tokens: int
    digest: str
    block_size: int
    layers: dict[int, tuple[npt.NDArray[Any], npt.NDArray[Any]]] = field(default_factory=dict)
    complete: bool = False
    created: float = field(default_factory=time.monotonic)


@dataclass
class TransferStore:
    """Transfers a prefill worker holds until pulled once or ``ttl`` seconds pass.

    The pages are copies (``add_layer``), so blocks the engine frees and reuses afterwards
    cannot change what a later pull receives. Consumed and expired ids are remembered
    (bounded) so that a second pull is refused as ``consumed`` rather than ``unknown``."""

    fingerprint: EngineFingerprint
    model: str
    num_layers: int
    ttl: float = 120.0
    _live: dict[str, _Transfer] = field(default_factory=dict)
    _gone: dict[str, str] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    stats: dict[str, float] = field(default_factory=dict)

    @staticmethod
    def new_id() -> str:
        return uuid.uuid4().hex

    def begin(
        self,
        transfer_id: str,
        request_id: str,
        block_ids: Sequence[int],
        num_tokens: int,
        digest: str,
    ) -> None:
        with self._lock:
            self._expire()
            self._live[transfer_id] = _Transfer(
                transfer_id,
                request_id,
                tuple(block_ids),
                num_tokens,
                digest,
                self.fingerprint.block_size,
            )

    def has(self, transfer_id: str) -> bool:
        with self._lock:
            return transfer_id in self._live or transfer_id in self._gone

    def drop(self, transfer_id: str, reason: str) -> None:
        """Forget a transfer that cannot be served; a pull of it is refused as ``reason``."""
        with self._lock:
            self._live.pop(transfer_id, None)
            self._gone[transfer_id] = reason

    def add_layer(
        self, transfer_id: str, layer_index: int, key: npt.NDArray[Any], value: npt.NDArray[Any]
    ) -> None:
        """The layer's pages ``[pages, block_size, heads, head_dim]``, copied."""
        with self._lock:
            transfer = self._live.get(transfer_id)
            if transfer is None:
                return
            transfer.layers[layer_index] = (np.array(key, copy=True), np.array(value, copy=True))
            if len(transfer.layers) == self.num_layers:
                transfer.complete = True

    def _expire(self) -> None:
        now = time.monotonic()
        for tid in [t for t, tr in self._live.items() if now - tr.created > self.ttl]:
            del self._live[tid]
            self._gone[tid] = "expired"
        while len(self._gone) > 4096:
            self._gone.pop(next(iter(self._gone)))

    def take(self, ask: Mapping[str, Any]) -> tuple[_Transfer, int]:
        """The transfer a pull names, removed (a transfer is served once), and the first page
        to send; every mismatch raises ``TransferRefusedError`` naming it."""
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
            first = ask.get("first_page", 0)
            # pages from ``first`` on hold num_tokens - first * block_size >= 0 tokens
            pages = min(len(transfer.block_ids), transfer.num_tokens // transfer.block_size)
            if type(first) is not int or not 0 <= first <= pages:
                raise TransferRefusedError(
                    "first_page out of range",
                    reason="block_ids",
                    field="first_page",
                    expected=f"0..{pages}",
                    found=first,
                )
            if not transfer.complete:
                raise TransferRefusedError(
                    f"transfer {tid} is incomplete", reason="incomplete", field="transfer_id"
                )
            del self._live[transfer.key]
            self._gone[transfer.key] = "consumed"
            return transfer, first


def _send_line(sock: socket.socket, obj: Mapping[str, Any]) -> None:
    sock.sendall(json.dumps(obj, separators=(",", ":")).encode() + b"\n")


def _read_line(sock: socket.socket) -> dict[str, Any]:
    buf = bytearray()
    while not buf.endswith(b"\n"):
        chunk = sock.recv(1)
        if not chunk:
            raise TransportError("the peer closed the connection before its control line")
        buf += chunk
        if len(buf) > MAX_LINE:
            raise TransportError("a control line over 64 KiB", found=len(buf))
    try:
        obj = json.loads(buf)
    except ValueError as exc:
        raise TransportError("a control line that is not JSON") from exc
    if not isinstance(obj, dict):
        raise TransportError("a control line that is not a JSON object", found=type(obj).__name__)
    return obj


def _identity(transfer: _Transfer, transfer_id: str, first: int) -> dict[str, Any]:
    return {
        "vllm.transfer_id": transfer_id,
        "vllm.request_id": transfer.request_id,
        "vllm.prompt_digest": transfer.digest,
        "vllm.first_page": first,
        "vllm.num_tokens": transfer.num_tokens,
    }


def _tensors(
    transfer: _Transfer, num_layers: int, first: int, metadata: Mapping[str, Any] | None = None
) -> Iterator[BlockPagedTensor]:
    """The transfer's blobs in order: key then value of each layer, pages ``first..``."""
    tokens = transfer.num_tokens - first * transfer.block_size
    table = np.arange(len(transfer.block_ids) - first, dtype=np.uint32)
    for layer in range(num_layers):
        for role, pages in zip(ROLES, transfer.layers[layer], strict=True):
            yield BlockPagedTensor.from_arrays(
                np.ascontiguousarray(pages[first:]),
                table,
                np.array([0, table.size], dtype=np.uint32),
                seq_lens=np.array([tokens], dtype=np.uint32),
                kv_role=role,
                layer_index=layer,
                metadata=metadata,
            )


def serve_one(store: TransferStore, conn: socket.socket, nixl: NixlPeers | None = None) -> int:
    """Answer one pull on ``conn``; returns the bytes sent (0 when refused). A pull asking
    for ``"transport": "nixl"`` gets the pages as NIXL blobs (``nixl`` holds the senders),
    the connection carrying only the two control lines."""
    ask = _read_line(conn)
    wants_nixl = ask.get("transport") == "nixl"
    try:
        if wants_nixl and nixl is None:
            raise TransferRefusedError(
                "this prefill worker serves the socket transport only", reason="transport"
            )
        transfer, first = store.take(ask)
    except TransferRefusedError as exc:
        _send_line(conn, {"ok": False, "reason": exc.reason, "message": str(exc)})
        return 0
    identity = _identity(transfer, ask["transfer_id"], first)
    if wants_nixl:
        assert nixl is not None
        sender, mine = nixl.sender(ask)
        _send_line(conn, {"ok": True, "agent_metadata": mine})
        meta = {**identity, **fingerprint_to_metadata(store.fingerprint)}
        total = 0
        for tensor in _tensors(transfer, store.num_layers, first, meta):
            sender.publish(tensor, mode="staged", checksum=False, page_digests=True)
            total += tensor.page_pool.nbytes
        sender.wait(deadline=nixl.timeout)
        _send_line(conn, {"done": True})
        return total
    _send_line(conn, {"ok": True})
    header = StreamHeader(
        model=store.model,
        num_layers=store.num_layers,
        kv_roles=ROLES,
        fingerprint=store.fingerprint,
        metadata=identity,
    )
    writer = StreamWriter(conn, header)
    for tensor in _tensors(transfer, store.num_layers, first):
        writer.write(tensor, checksum=False, page_digests=True)
    writer.close()
    return writer.position


class TransferServer:
    """The prefill worker's listener: one thread accepting pulls on ``host:port`` (port 0
    picks a free one, read back from ``port``), each answered in turn, bounded by
    ``timeout`` seconds per connection."""

    def __init__(
        self,
        store: TransferStore,
        host: str,
        port: int,
        timeout: float = 30.0,
        nixl: NixlPeers | None = None,
        listener: socket.socket | None = None,
    ):
        self.store = store
        self.nixl = nixl
        # ``listener``: a socket bound earlier (an engine binds at start, to fail there)
        self._sock = listener if listener is not None else socket.create_server((host, port))
        self._sock.settimeout(0.2)
        self.host = host
        self.port: int = self._sock.getsockname()[1]
        self._timeout = timeout
        self._stop = threading.Event()
        self.sent_bytes = 0
        self.refused = 0
        self.errors: list[BaseException] = []
        self._thread = threading.Thread(target=self._run, name="hurray-serve", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except (TimeoutError, OSError):
                continue
            with conn:
                conn.settimeout(self._timeout)
                try:
                    sent = serve_one(self.store, conn, self.nixl)
                except (OSError, HurrayWireError) as exc:
                    self.errors.append(exc)  # the puller sees the cut connection
                    del self.errors[:-16]
                    continue
                self.sent_bytes += sent
                self.refused += sent == 0

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._sock.close()
        if self.nixl is not None:
            self.nixl.close()


# -- decode side -----------------------------------------------------------------------------
@dataclass
class PulledPages:
    """Validated pages for the decode worker's blocks: per layer, key and value
    ``[pages, block_size, heads, head_dim]`` in the decode engine's block size, page ``i``
    for the request's block ``first_block + i``."""

    first_block: int
    layers: list[tuple[npt.NDArray[Any], npt.NDArray[Any]]]
    num_tokens: int  # the tokens these pages hold (the last page may be partial)
    wire_bytes: int
    converted: tuple[str, ...] = ()


@dataclass
class LoadResult:
    """What a pull ended with: the pages, or the request's block positions that failed (from
    ``failed_from`` on: vLLM recomputes from the first failed block anyway) and why."""

    pages: PulledPages | None
    failed_from: int | None = None
    error: HurrayWireError | None = None


def _check_header(
    theirs: EngineFingerprint | None,
    meta: Mapping[str, Any],
    ours: EngineFingerprint,
    params: TransferParams,
    first_page: int,
) -> tuple[EngineFingerprint, tuple[str, ...]]:
    """The sender's fingerprint against ours and the transfer's identity against the
    params; returns the fingerprint and the fields to convert (block size)."""
    if theirs is None:
        raise IncompatibleFingerprintError(
            "the transfer carries no engine fingerprint", differences={"fingerprint": (ours, None)}
        )
    diff = differences(ours, theirs, ignore=CONVERTIBLE)
    if diff:
        raise IncompatibleFingerprintError(
            "the prefill engine's cache does not mean the same here: "
            + ", ".join(f"{k} {a!r} here, {b!r} there" for k, (a, b) in diff.items()),
            differences=diff,
        )
    expect = {
        "vllm.transfer_id": params.transfer_id,
        "vllm.request_id": params.request_id,
        "vllm.prompt_digest": params.prompt_digest,
        "vllm.first_page": first_page,
        "vllm.num_tokens": params.num_tokens,
    }
    for key, value in expect.items():
        if meta.get(key) != value:
            raise TransferRefusedError(
                "the stream is not the transfer asked for",
                reason="stale_content",
                field=key,
                expected=value,
                found=meta.get(key),
            )
    converted = tuple(k for k in ("block_size",) if getattr(theirs, k) != getattr(ours, k))
    return theirs, converted


def _expect_tensor(
    tensor: BlockPagedTensor, layer: int, role: str, pages: int, tokens: int
) -> None:
    table = tensor.block_table
    lens = tensor.seq_lens
    ok = (
        tensor.layer_index == layer
        and tensor.kv_role == role
        and tensor.page_pool.shape[0] == pages
        and table is not None
        and np.array_equal(np.asarray(table).reshape(-1), np.arange(pages))
        and lens is not None
        and np.asarray(lens).tolist() == [tokens]
    )
    if not ok:
        raise TransferRefusedError(
            "a blob that is not the next layer/role of this transfer",
            reason="stale_content",
            layer=layer,
            role=role,
        )


def _answer(sock: socket.socket) -> dict[str, Any]:
    answer = _read_line(sock)
    if answer.get("ok") is not True:
        reason = str(answer.get("reason", "refused"))
        raise TransferRefusedError(
            f"the prefill worker refused: {answer.get('message', reason)}", reason=reason
        )
    return answer


Blobs = dict[tuple[int, str], BlockPagedTensor]


def _check_sizes(theirs: EngineFingerprint, params: TransferParams) -> None:
    if theirs.block_size != params.block_size:
        raise TransferRefusedError(
            "the transfer's block size is not the params'",
            reason="stale_content",
            field="block_size",
            expected=params.block_size,
            found=theirs.block_size,
        )


def _read_stream(
    sock: socket.socket,
    ours: EngineFingerprint,
    params: TransferParams,
    num_layers: int,
    first_page: int,
    pages: int,
    tokens: int,
    timeout: float,
) -> tuple[Blobs, EngineFingerprint, tuple[str, ...], int]:
    reader = StreamReader(sock, record_deadline=timeout)
    header = reader.header
    theirs, converted = _check_header(
        None if header is None else header.fingerprint,
        {} if header is None else header.metadata,
        ours,
        params,
        first_page,
    )
    _check_sizes(theirs, params)
    tensors: Blobs = {}
    for layer in range(num_layers):
        for role in ROLES:
            tensor = next(reader, None)
            if tensor is None:
                raise TransportError("the stream ended early", layer=layer, role=role)
            _expect_tensor(tensor, layer, role, pages, tokens)
            tensors[(layer, role)] = tensor
    if next(reader, None) is not None:
        raise TransportError("the stream carries more blobs than layers")
    return tensors, theirs, converted, reader.position


def _receive_nixl(
    receiver: Any,
    ours: EngineFingerprint,
    params: TransferParams,
    num_layers: int,
    first_page: int,
    pages: int,
    tokens: int,
    timeout: float,
) -> tuple[Blobs, EngineFingerprint, tuple[str, ...], int]:
    """Every blob of the transfer over NIXL (validated, page digests checked by the
    receiver), each carrying the fingerprint and identity in its own metadata."""
    tensors: Blobs = {}
    found: tuple[EngineFingerprint, tuple[str, ...]] | None = None
    wire = 0
    for tensor in receiver.receive(2 * num_layers, deadline=timeout):
        meta = tensor.metadata
        checked = _check_header(fingerprint_from_metadata(meta), meta, ours, params, first_page)
        if found is not None and checked != found:
            raise TransferRefusedError("blobs of one transfer disagree", reason="stale_content")
        found = checked
        layer, role = tensor.layer_index, tensor.kv_role
        if not isinstance(layer, int) or (layer, role) in tensors or layer >= num_layers:
            raise TransferRefusedError(
                "a blob that is not one of this transfer's", reason="stale_content",
                layer=layer, role=role,
            )  # fmt: skip
        _expect_tensor(tensor, layer, role, pages, tokens)
        # the receiver's landing region is reused by the next receive: keep a copy
        tensors[(layer, role)] = BlockPagedTensor.from_arrays(
            np.array(tensor.page_pool, copy=True), np.array(tensor.block_table),
            np.array(tensor.seq_ptr), seq_lens=np.array(tensor.seq_lens),
            kv_role=role, layer_index=layer,
        )  # fmt: skip
        wire += tensor.page_pool.nbytes
    if found is None or len(tensors) != 2 * num_layers:
        raise TransportError("the NIXL transfer ended early")
    _check_sizes(found[0], params)
    return tensors, found[0], found[1], wire


def pull(
    params: TransferParams,
    ours: EngineFingerprint,
    num_layers: int,
    *,
    first_block: int = 0,
    expect_digest: str | None = None,
    timeout: float = 30.0,
    nixl: NixlPeers | None = None,
) -> LoadResult:
    """Pull a transfer for a decode request whose blocks before ``first_block`` the decode
    worker already holds (its prefix cache): with equal block sizes only the pages from
    there on travel. Nothing is written anywhere: the result is validated pages in the
    decode engine's block size, or the first block position that cannot be used.
    ``expect_digest``: the ``prompt_digest`` of the decode request's own prompt."""
    same = params.block_size == ours.block_size
    first_page = first_block if same else 0
    pages = len(params.block_ids) - first_page
    tokens = params.num_tokens - first_page * params.block_size
    try:
        if expect_digest is not None and expect_digest != params.prompt_digest:
            raise TransferRefusedError(
                "the transfer carries another prompt's keys and values (a stale reference)",
                reason="stale_content",
                field="prompt_digest",
                expected=expect_digest,
                found=params.prompt_digest,
            )
        if (
            pages < 0
            or tokens < 0
            or -(-params.num_tokens // params.block_size) != len(params.block_ids)
        ):
            raise TransferRefusedError(
                "remote_block_ids do not cover remote_num_tokens",
                reason="block_ids",
                field="remote_block_ids",
                expected=f"{-(-params.num_tokens // params.block_size)} blocks",
                found=len(params.block_ids),
            )
        # One NIXL pull at a time per prefill worker: its endpoint pair and its (serial)
        # listener are shared, and an ask sent before the listener reached it would wait.
        serial = nixl.lock(params.host, params.port) if nixl else contextlib.nullcontext()
        with (
            serial,
            socket.create_connection((params.host, params.port), timeout=timeout) as sock,
        ):
            sock.settimeout(timeout)
            ask: dict[str, Any] = {
                "transfer_id": params.transfer_id,
                "request_id": params.request_id,
                "prompt_digest": params.prompt_digest,
                "block_ids": list(params.block_ids),
                "first_page": first_page,
            }
            if nixl is None:
                _send_line(sock, ask)
                _answer(sock)
                tensors, _, converted, wire = _read_stream(
                    sock, ours, params, num_layers, first_page, pages, tokens, timeout
                )
            else:
                receiver, mine = nixl.receiver(params.host, params.port)
                ask.update(transport="nixl", agent=receiver.name, agent_metadata=mine)
                _send_line(sock, ask)
                answer = _answer(sock)
                if mine is not None:
                    peer = answer.get("agent_metadata")
                    if not isinstance(peer, str):
                        raise TransportError("the prefill worker sent no NIXL metadata")
                    receiver.add_peer(base64.b64decode(peer))
                    nixl.peered(params.host, params.port)
                tensors, _, converted, wire = _receive_nixl(
                    receiver, ours, params, num_layers, first_page, pages, tokens, timeout
                )
                _read_line(sock)  # the sender's "done"
    except (HurrayWireError, OSError) as exc:
        # A failed page digest leaves the later blobs unread: every block from first_block
        # on is unverified (PageDigestError.positions, named in the log, are the first).
        err = exc if isinstance(exc, HurrayWireError) else TransportError(f"connection: {exc}")
        return LoadResult(None, failed_from=first_block, error=err)
    layers = []
    for layer in range(num_layers):
        pair = []
        for role in ROLES:
            tensor = tensors[(layer, role)]
            if converted:
                tensor = repage(tensor, ours.block_size)
            pool = np.asarray(tensor.page_pool)[np.asarray(tensor.block_table).reshape(-1)]
            pair.append(pool[first_block:] if not same else pool)
        layers.append((pair[0], pair[1]))
    held = params.num_tokens - first_block * ours.block_size
    return LoadResult(PulledPages(first_block, layers, held, wire, converted))
