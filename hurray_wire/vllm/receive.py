"""The HurrayConnector's transfers, decode side, without vLLM: a pull from the prefill
ranks a decode rank needs, and every check before a page may land (docs/vllm.md).

Nothing is written into the engine here: ``pull`` returns validated pages in the decode
engine's block size and TP shard (``tp.convert_heads``, ``repage``), or the first block
position that cannot be used, for the connector to report through
``get_block_ids_with_load_errors``.
"""

from __future__ import annotations

import base64
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from hurray_wire.containers import DEFAULT_MAX_BLOB_BYTES, StreamReader
from hurray_wire.errors import (
    ArgumentTypeError,
    HurrayWireError,
    IncompatibleFingerprintError,
    TransferRefusedError,
    TransportError,
)
from hurray_wire.fingerprint import EngineFingerprint, differences, fingerprint_from_metadata
from hurray_wire.integrity.delta import encode_known_pages
from hurray_wire.integrity.page_store import PageStore
from hurray_wire.tensor import BlockPagedTensor
from hurray_wire.transforms.heads import head_ranges
from hurray_wire.transforms.repage import repage
from hurray_wire.vllm.backends import roles_of_layout
from hurray_wire.vllm.held import HeldPages
from hurray_wire.vllm.net import Deadline, Tls, connect
from hurray_wire.vllm.params import TransferParams, identity, one_sequence, sequence_pages
from hurray_wire.vllm.peers import NixlPeers
from hurray_wire.vllm.tp import check_convertible, convert_heads, refuse_differences, sources
from hurray_wire.vllm.transfer import _read_line, _send_line

__all__ = ["CONVERTIBLE", "LoadResult", "PulledPages", "pull"]

#: Fingerprint fields the decode side converts instead of refusing (the converted pages'
#: fingerprint is then checked to equal the decode rank's own, ``tp.convert_heads``). Pages
#: travel backend-free (``backends``), so the backend, layout and kernel block
#: (``kv_cache_layout``) convert too; MLA against key/value pages does not (its roles).
CONVERTIBLE = ("tp_rank", "tp_size", "block_size", "kv_cache_layout")


@dataclass
class PulledPages:
    """Validated pages for the decode worker's blocks: per layer, key and value
    ``[pages, block_size, heads, head_dim]`` in the decode engine's block size, page ``i``
    for the request's block ``first_block + i``. ``repaired``: held blocks (before the
    request's first block to load) whose pages differed from the transfer's and are
    overwritten with them."""

    first_block: int
    layers: list[tuple[npt.NDArray[Any], ...]]  # per layer, one array per role
    num_tokens: int  # the tokens these pages hold (the last page may be partial)
    wire_bytes: int
    converted: tuple[str, ...] = ()
    repaired: int = 0


@dataclass
class LoadResult:
    """What a pull ended with: the pages, or the request's block positions that failed (from
    ``failed_from`` on: vLLM recomputes from the first failed block anyway) and why."""

    pages: PulledPages | None
    failed_from: int | None = None
    error: HurrayWireError | None = None


@dataclass(frozen=True)
class _Ask:
    """One pull from one prefill rank: what is asked and what the answer must be."""

    params: TransferParams
    ours: EngineFingerprint
    num_layers: int
    rank: int  # the prefill rank pulled (its port: params.port + rank)
    first_page: int  # pages before it are not sent
    held: int  # pages before it travel as references (first_page is then 0)
    deadline: Deadline  # the whole pull's (every rank's connection)
    num_kv_heads: int | None = None  # the model's: the heads each rank's pages must hold
    head_dim: int | None = None
    tls: Tls | None = None

    @property
    def roles(self) -> tuple[str, ...]:
        return roles_of_layout(self.ours.kv_cache_layout)

    @property
    def pages(self) -> int:
        return len(self.params.block_ids) - self.first_page

    @property
    def tokens(self) -> int:
        return self.params.num_tokens - self.first_page * self.params.block_size


def _check_header(
    theirs: EngineFingerprint | None, meta: Mapping[str, Any], ask: _Ask
) -> EngineFingerprint:
    """The sender's fingerprint against ours and the transfer's identity against the
    params (the TP degree and block size are converted, so they must be the params')."""
    ours, params = ask.ours, ask.params
    if theirs is None:
        raise IncompatibleFingerprintError(
            "the transfer carries no engine fingerprint", differences={"fingerprint": (ours, None)}
        )
    diff = differences(ours, theirs, ignore=CONVERTIBLE)
    if roles_of_layout(theirs.kv_cache_layout) != ask.roles:
        diff["kv_cache_layout"] = (ours.kv_cache_layout, theirs.kv_cache_layout)
    if diff:
        raise refuse_differences("the prefill engine's cache does not mean the same here", diff)
    expect = identity(params.transfer_id, params.request_id, params.prompt_digest,
                      ask.first_page, ask.held, params.num_tokens)  # fmt: skip
    asked = "the stream is not the transfer asked for"
    rows = [(key, value, meta.get(key), asked) for key, value in expect.items()]
    rank = "the transfer comes from another TP rank than the one asked"
    rows += [
        ("tp_rank", ask.rank, theirs.tp_rank, rank),
        ("tp_size", params.tp_size, theirs.tp_size, rank),
        (
            "block_size",
            params.block_size,
            theirs.block_size,
            "the transfer comes from another block size than the params'",
        ),
    ]
    for name, value, found, message in rows:
        if found != value:
            raise TransferRefusedError(
                message, reason="stale_content", field=name, expected=value, found=found
            )
    return theirs


def _expect(
    tensor: BlockPagedTensor, layer: int, role: str, theirs: EngineFingerprint, ask: _Ask
) -> None:
    """The next layer/role of this transfer, of the dtype and head shape the fingerprint
    checked names, refused at pull time (not later, at landing): ``[pages, block_size, heads
    of the sending rank, head_dim]`` of ``theirs.cache_dtype`` (fp8 caches stored as uint8)."""
    pool = tensor.page_pool
    ok = (
        tensor.layer_index == layer
        and tensor.kv_role == role
        and pool.shape[0] == ask.pages
        and np.array_equal(tensor.block_table, np.arange(ask.pages))
        and tensor.seq_lens is not None
        and tensor.seq_lens.tolist() == [ask.tokens]
    )
    if not ok:
        raise TransferRefusedError(
            "a blob that is not the next layer/role of this transfer",
            reason="stale_content",
            layer=layer,
            role=role,
        )
    name = tensor.descriptor.element_type.name  # the wire's name (float8_e4m3, not e4m3fn)
    same = name == theirs.cache_dtype or (
        theirs.cache_dtype == "uint8" and name.startswith("float8")
    )
    shape: tuple[int | None, ...] = (theirs.block_size, None, ask.head_dim)
    if ask.num_kv_heads is not None:
        first, stop = head_ranges(ask.num_kv_heads, theirs.tp_size)[theirs.tp_rank]
        shape = (theirs.block_size, stop - first, ask.head_dim)
    found = tuple(pool.shape[1:])
    fits = len(found) == 3 and all(e is None or e == f for e, f in zip(shape, found, strict=True))
    if not same or not fits:
        raise TransferRefusedError(
            "pages of another dtype or head shape than the fingerprint checked",
            reason="geometry", layer=layer, role=role,
            expected=f"{theirs.cache_dtype} [pages, {', '.join(map(str, shape))}]",
            found=f"{name} {list(pool.shape)}",
        )  # fmt: skip


Blobs = dict[tuple[int, str], BlockPagedTensor]


def _blob_bound(ask: _Ask) -> int:
    """The most bytes one blob of this transfer may declare (its pages at 8 bytes an
    element, the sending rank's heads, plus 1 MiB of records): a peer's blob cannot make
    the decode worker allocate more than the transfer it asked for."""
    if ask.num_kv_heads is None or ask.head_dim is None:
        return DEFAULT_MAX_BLOB_BYTES
    elements = max(ask.pages, 1) * ask.params.block_size * ask.num_kv_heads * ask.head_dim
    return min(DEFAULT_MAX_BLOB_BYTES, 8 * elements + (1 << 20))


def _read_stream(
    sock: socket.socket, ask: _Ask, store: PageStore | None
) -> tuple[Blobs, EngineFingerprint, int]:
    reader = StreamReader(sock, record_deadline=ask.deadline.left(), page_store=store,
                          max_blob_bytes=_blob_bound(ask))  # fmt: skip
    header = reader.header
    theirs = _check_header(
        None if header is None else header.fingerprint,
        {} if header is None else header.metadata,
        ask,
    )
    tensors: Blobs = {}
    for layer in range(ask.num_layers):
        for role in ask.roles:
            tensor = next(reader, None)
            if tensor is None:
                raise TransportError("the stream ended early", layer=layer, role=role)
            _expect(tensor, layer, role, theirs, ask)
            tensors[(layer, role)] = tensor
    if next(reader, None) is not None:
        raise TransportError("the stream carries more blobs than layers")
    return tensors, theirs, reader.position


def _receive_nixl(receiver: Any, ask: _Ask) -> tuple[Blobs, EngineFingerprint, int]:
    """Every blob of the transfer over NIXL (validated, page digests checked by the
    receiver), each carrying the fingerprint and identity in its own metadata."""
    tensors: Blobs = {}
    found: EngineFingerprint | None = None
    wire = 0
    for tensor in receiver.receive(len(ask.roles) * ask.num_layers, deadline=ask.deadline.left()):
        meta = tensor.metadata
        checked = _check_header(fingerprint_from_metadata(meta), meta, ask)
        if found is not None and checked != found:
            raise TransferRefusedError("blobs of one transfer disagree", reason="stale_content")
        found = checked
        layer, role = tensor.layer_index, tensor.kv_role
        if not isinstance(layer, int) or (layer, role) in tensors or layer >= ask.num_layers:
            raise TransferRefusedError(
                "a blob that is not one of this transfer's", reason="stale_content",
                layer=layer, role=role,
            )  # fmt: skip
        _expect(tensor, layer, role, checked, ask)
        # the receiver's landing region is reused by the next receive: keep a copy
        tensors[(layer, role)] = one_sequence(np.array(tensor.page_pool, copy=True), ask.tokens,
                                              kv_role=role, layer_index=layer)  # fmt: skip
        # the pool bytes that travelled: the held pages came as references (no bytes)
        wire += tensor.page_pool.nbytes // max(ask.pages, 1) * (ask.pages - ask.held)
    if found is None or len(tensors) != len(ask.roles) * ask.num_layers:
        raise TransportError("the NIXL transfer ended early")
    return tensors, found, wire


def _fetch(
    ask: _Ask, nixl: NixlPeers | None, store: PageStore | None
) -> tuple[Blobs, EngineFingerprint, int]:
    """One prefill rank's transfer: the ask on its control connection, then its blobs;
    over NIXL once more, paired afresh, if the prefill worker no longer holds this
    worker's pair (refused as ``agent``: it closed it, e.g. as the least recently used)."""
    try:
        return _fetch_once(ask, nixl, store)
    except TransferRefusedError as exc:
        if nixl is None or exc.reason != "agent":
            raise
    return _fetch_once(ask, nixl, store)


def _fetch_once(
    ask: _Ask, nixl: NixlPeers | None, store: PageStore | None
) -> tuple[Blobs, EngineFingerprint, int]:
    """One attempt: over the socket, or through this prefill worker's leased receiver."""
    params = ask.params
    address = (params.host, params.port + ask.rank)
    if nixl is None:
        with connect(*address, ask.deadline, ask.tls) as sock:
            _ask(sock, ask, store)
            return _read_stream(sock, ask, store)
    # One NIXL pull at a time per prefill worker: its endpoint pair is leased (a failed
    # pull closes it), and an ask sent before the listener reached it would wait.
    with nixl.receiving(*address, ask.deadline) as peer:
        receiver, mine = nixl.receiver(peer)
        with connect(*address, ask.deadline, ask.tls) as sock:
            peer.used = True  # from the ask on, a failure leaves the pair in an unknown state
            try:
                answer = _ask(sock, ask, store, agent=(receiver.name, mine))
            except TransferRefusedError as exc:  # refused before any page moved: the pair
                peer.used = exc.reason == "agent"  # is as it was, unless the sender is gone
                raise
            if mine is not None:
                nixl.pair(peer, answer.get("agent_metadata"))
            receiver.page_store = store
            try:
                found = _receive_nixl(receiver, ask)
            finally:
                receiver.page_store = None
            _read_line(sock)  # the sender's "done"
            return found


def _ask(
    sock: socket.socket,
    ask: _Ask,
    store: PageStore | None,
    agent: tuple[str, str | None] | None = None,
) -> dict[str, Any]:
    """The ask on the control connection, and its answer (``agent``: a NIXL pull's
    receiver name and, while it has no peer, its metadata)."""
    params = ask.params
    line: dict[str, Any] = {
        "transfer_id": params.transfer_id,
        "request_id": params.request_id,
        "prompt_digest": params.prompt_digest,
        "block_ids": list(params.block_ids),
        "first_page": ask.first_page,
        "held_pages": ask.held,
        "decode_rank": ask.ours.tp_rank,
        "decode_tp_size": ask.ours.tp_size,
    }
    if store is not None:  # the delta protocol: what this worker holds, by digest
        line["known_pages"] = base64.b64encode(encode_known_pages(store.digests())).decode()
    if agent is not None:
        line.update(transport="nixl", agent=agent[0], agent_metadata=agent[1])
    _send_line(sock, line)
    answer = _read_line(sock)
    if answer.get("ok") is not True:
        reason = str(answer.get("reason", "refused"))
        field = answer.get("field")  # the ask's field refused, when one is
        refused = TransferRefusedError(
            f"the prefill worker refused: {answer.get('message', reason)}", reason=reason
        )
        # the field as data only: the prefill worker's message already names it
        refused.field = field[:100] if isinstance(field, str) else None
        raise refused
    return answer


def pull(
    params: TransferParams,
    ours: EngineFingerprint,
    num_layers: int,
    *,
    first_block: int = 0,
    expect_digest: str | None = None,
    timeout: float = 30.0,
    nixl: NixlPeers | None = None,
    num_kv_heads: int | None = None,
    held: HeldPages | None = None,
    head_dim: int | None = None,
    deadline: Deadline | None = None,
    tls: Tls | None = None,
) -> LoadResult:
    """Pull a transfer for a decode request whose blocks before ``first_block`` the decode
    worker already holds (its prefix cache). Nothing is written anywhere: the result is
    validated pages in the decode engine's block size and TP shard, or the first block
    position that cannot be used.

    ``held``: those blocks' pages as the decode worker holds them; each is checked against
    the prefill worker's page of the same position (sent as a page reference when no
    conversion is needed, in full otherwise) and the load fails from the first that
    differs. Without it the held blocks are not sent and not checked. ``num_kv_heads``:
    the model's KV heads, needed when either side runs with TP > 1 (``tp.convert_heads``).
    ``expect_digest``: the ``prompt_digest`` of the decode request's own prompt.
    ``head_dim``: the model's, checked on every page with ``num_kv_heads``.

    ``timeout`` bounds the whole pull (every connection, from its first byte to its last),
    or ``deadline`` does, which the caller may also cancel (a request aborted mid-pull):
    either way the pull's sockets are shut down and it returns a ``TransportError``.
    Nothing raises: every failure, a foreign exception included, is the result's error."""
    own = deadline is None
    deadline = Deadline(timeout) if deadline is None else deadline
    try:
        same = params.block_size == ours.block_size and params.tp_size == ours.tp_size
        held_pages = first_block if same and held is not None and first_block else 0
        first_page = first_block if same and held is None else 0
        sharded = params.tp_size != 1 or ours.tp_size != 1
        if expect_digest is not None and expect_digest != params.prompt_digest:
            raise TransferRefusedError(
                "the transfer carries another prompt's keys and values (a stale reference)",
                reason="stale_content",
                field="prompt_digest",
                expected=expect_digest,
                found=params.prompt_digest,
            )
        needed = -(-params.num_tokens // params.block_size)
        if first_page > len(params.block_ids) or needed != len(params.block_ids):
            raise TransferRefusedError(
                "remote_block_ids do not cover remote_num_tokens",
                reason="block_ids",
                field="remote_block_ids",
                expected=f"{needed} blocks",
                found=len(params.block_ids),
            )
        if sharded:
            if num_kv_heads is None:
                raise ArgumentTypeError(
                    "a TP-sharded transfer needs the model's num_kv_heads", field="num_kv_heads"
                )
            check_convertible(num_kv_heads, params.tp_size, ours.tp_size)
        fetched = []
        wire = 0
        for rank in sources(params.tp_size, ours.tp_size, ours.tp_rank):
            ask = _Ask(params, ours, num_layers, rank, first_page, held_pages,
                       deadline, num_kv_heads, head_dim, tls)  # fmt: skip
            store = held.store if held_pages and held is not None else None
            tensors, theirs, nbytes = _fetch(ask, nixl, store)
            fetched.append((tensors, theirs))
            wire += nbytes
        layers = []
        for layer in range(num_layers):
            pair = []
            for role in roles_of_layout(ours.kv_cache_layout):
                tensor = fetched[0][0][(layer, role)]
                if sharded:
                    assert num_kv_heads is not None
                    shards = [(blobs[(layer, role)], fp) for blobs, fp in fetched]
                    tensor = convert_heads(shards, ours, num_kv_heads)
                if params.block_size != ours.block_size:
                    tensor = repage(tensor, ours.block_size)
                pair.append(sequence_pages(tensor))
            layers.append(tuple(pair))
        # A held page that differs from the transfer's is overwritten with the transfer's
        # verified page, with every page after it: a stale or poisoned prefix-cache page is
        # never served. Not a load error: a held page the decode engine computed itself (another
        # TP degree or batch shape) differs in its last bits from the prefill engine's, and for
        # an async load vLLM's recompute would free the blocks and hit the same cached block
        # again (v1/core/sched/scheduler.py, _update_waiting_for_remote_kv).
        bad = held.first_mismatch(layers) if held is not None and first_block else None
        start = first_block if bad is None else bad
        if first_page == 0:
            layers = [tuple(p[start:] for p in roles) for roles in layers]
        converted = tuple(k for k in ("tp_size", "block_size")
                          if getattr(params, k) != getattr(ours, k))  # fmt: skip
        tokens = params.num_tokens - start * ours.block_size
        return LoadResult(PulledPages(start, layers, tokens, wire, converted, first_block - start))
    except OSError as exc:
        # A failed page digest leaves the later blobs unread: every block from first_block
        # on is unverified (PageDigestError.positions, named in the log, are the first).
        error = TransportError(f"connection: {exc}")
        error.__cause__ = exc
        return LoadResult(None, failed_from=first_block, error=deadline.typed(error))
    except Exception as exc:  # a foreign exception from a peer's bytes: typed here
        return LoadResult(None, failed_from=first_block, error=deadline.typed(exc))
    finally:
        if own:
            deadline.close()
