"""``HurrayConnector``: vLLM's ``KVConnectorBase_V1`` over hurray-wire (docs/vllm.md).

The scheduler side picks the requests that save (``do_remote_decode``) and load
(``do_remote_prefill``) and hands the decode side the transfer's identity. The prefill worker
copies each saving request's blocks as every layer is computed and serves them once
(``transfer``); the decode worker pulls on a thread, checks everything (``receive``) and lands
on the engine's thread in ``get_finished``; a failure goes to vLLM's ``kv_load_failure_policy``
through ``get_block_ids_with_load_errors``.
"""

from __future__ import annotations

import logging
import socket
import uuid
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats

from hurray_wire.errors import ArgumentTypeError, InvalidTensorError
from hurray_wire.fingerprint import EngineFingerprint
from hurray_wire.vllm.backends import (
    PAIR,
    CacheForm,
    kernel_ids,
    land_layers,
    layer_scales,
    learn,
    scales_digest,
)
from hurray_wire.vllm.device import Staged, gather, needs_staging, side_stream
from hurray_wire.vllm.held import HeldPages
from hurray_wire.vllm.metrics import COUNTERS, TIMES, HurrayConnectorStats, HurrayPromMetrics
from hurray_wire.vllm.model_digest import engine_model_digest
from hurray_wire.vllm.net import Deadline, endpoint, listen
from hurray_wire.vllm.params import refusal, request_kind
from hurray_wire.vllm.peers import NixlPeers
from hurray_wire.vllm.pulls import Pulls, failure
from hurray_wire.vllm.receive import LoadResult, PulledPages, pull
from hurray_wire.vllm.transfer import TransferParams, TransferServer, TransferStore, prompt_digest

if TYPE_CHECKING:
    import torch
    from vllm.config import VllmConfig
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorPromMetrics
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

__all__ = ["HurrayConnector", "HurrayConnectorMetadata", "HurrayConnectorStats"]

logger = logging.getLogger("hurray_wire.vllm")

#: ``kv_connector_extra_config`` keys and their defaults (docs/vllm.md § options).
OPTIONS: dict[str, Any] = {
    "transport": "socket",
    "host": "127.0.0.1",
    "port": 14579,
    "model_id": None,
    "transfer_ttl": 120.0,
    "timeout": 30.0,
    "bind_host": None,  # the listen address; None: ``host`` (the one handed to decode)
    "max_connections": 32,
    "nixl_max_peers": 32,  # unless set: max_connections (peers.py)
    "tls_cert": None,
    "tls_key": None,
    "tls_ca": None,
    "model_digest": "weights",  # or "config" (docs/vllm.md § model)
}


@dataclass
class SaveSpec:
    request_id: str
    transfer_id: str
    block_ids: list[int]
    num_tokens: int
    digest: str


@dataclass
class LoadSpec:
    request_id: str
    params: dict[str, Any]
    block_ids: list[int]
    first_block: int
    digest: str  # of the decode request's own prompt: a transfer for another is refused
    refused: str | None = None  # why its params were refused (the load fails at once)


@dataclass
class HurrayConnectorMetadata(KVConnectorMetadata):  # type: ignore[misc]
    """One step's work for the workers: requests whose prompt completes this step (save)
    and requests whose blocks were just allocated for a pull (load)."""

    saves: list[SaveSpec] = field(default_factory=list)
    loads: list[LoadSpec] = field(default_factory=list)


def _option(extra: dict[str, Any], name: str) -> Any:
    """An option of its default's type (str where the default is None; an int for a float)."""
    value, default = extra.get(name, OPTIONS[name]), OPTIONS[name]
    kind = str if default is None else type(default)
    if value is None or type(value) is kind:
        return value
    if kind is float and type(value) is int:
        return float(value)
    raise ArgumentTypeError(f"kv_connector_extra_config[{name!r}] must be a {kind.__name__}",
                            field=name, found=repr(value))  # fmt: skip


class HurrayConnector(KVConnectorBase_V1):  # type: ignore[misc]
    """A KV connector whose every transfer is verified before a page lands."""

    def __init__(
        self,
        vllm_config: VllmConfig,
        role: KVConnectorRole,
        kv_cache_config: KVCacheConfig | None = None,
    ) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        extra = dict(self._kv_transfer_config.kv_connector_extra_config or {})
        unknown = sorted(set(extra) - set(OPTIONS))
        if unknown:
            raise ArgumentTypeError(
                "unknown kv_connector_extra_config keys", field=unknown[0], found=unknown
            )
        self._options = {name: _option(extra, name) for name in OPTIONS}
        if self._options["transport"] not in ("socket", "nixl"):
            raise ArgumentTypeError(
                "transport must be 'socket' or 'nixl'",
                field="transport",
                found=self._options["transport"],
            )
        if "nixl_max_peers" not in extra:  # a sender per pull served at once is enough
            self._options["nixl_max_peers"] = self._options["max_connections"]
        self._bind_host, self._tls = endpoint(self._options)
        self._block_size: int = vllm_config.cache_config.block_size
        model = vllm_config.model_config
        self._model_id: str = self._options["model_id"] or str(model.model)
        self._num_layers: int = model.get_num_layers(vllm_config.parallel_config)
        self._tp_size: int = vllm_config.parallel_config.tensor_parallel_size
        self._num_kv_heads: int = model.get_total_num_kv_heads()
        self._head_dim: int = model.get_head_size()
        self._model_digest = (  # the weights are checked, not named (model_digest.py)
            engine_model_digest(vllm_config, self._options["model_digest"])
            if role == KVConnectorRole.WORKER else None
        )  # fmt: skip
        # scheduler side
        self._producing: dict[str, tuple[list[int], list[int]]] = {}  # id -> (blocks, prompt)
        self._transfers: dict[str, TransferParams] = {}
        self._local_hit: dict[str, int] = {}
        self._loads: list[LoadSpec] = []
        self._issued: set[str] = set()  # requests whose one pull is issued
        self._refused: dict[str, str] = {}  # requests whose params were refused: why
        # worker side
        self._caches: list[Any] = []
        self._layer_of: dict[str, int] = {}
        self._fingerprint: EngineFingerprint | None = None
        self._form: CacheForm | None = None  # what the caches are (register_kv_caches)
        self._scales: list[tuple[float | None, float | None]] = []  # fp8 scales per layer
        self._stream: Any = None  # the side stream of device copies (device.py)
        self._pending: list[tuple[list[SaveSpec], int, Staged]] = []  # device saves in flight
        self._store: TransferStore | None = None
        self._server: TransferServer | None = None
        self._listener: socket.socket | None = None
        self._nixl: NixlPeers | None = None
        self._pulls = Pulls(self._options["timeout"])
        self._pulling: dict[str, LoadSpec] = {}
        self._invalid: set[int] = set()
        self._stats = HurrayConnectorStats()
        self._totals: dict[str, float] = dict.fromkeys((*COUNTERS, "transfer_time_s"), 0)
        self._logged: dict[str, None] = {}  # request ids already logged, oldest first

    @classmethod
    def supports_sleep_mode(cls, kv_transfer_config: Any) -> bool:
        """vLLM 0.33's sleep mode remaps the KV caches under a connector; this one keeps the
        registered cache tensors between steps, so it opts out rather than land pages into
        memory that moved."""
        return False

    # -- scheduler side ------------------------------------------------------------------
    def on_new_request(self, request: Request) -> None:
        """Params that are not a mapping become one the scheduler side refuses
        (``params.refusal``): vLLM reads them with ``.get`` right after this call."""
        stand_in = refusal(request.kv_transfer_params)
        if stand_in is not None:
            request.kv_transfer_params = stand_in

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        rid = request.request_id
        if rid in self._issued or self._kind(request) != "load":
            return 0, False
        count = len(request.prompt_token_ids or ()) - num_computed_tokens
        if count <= 0:
            return 0, False
        self._local_hit[request.request_id] = num_computed_tokens
        return count, True

    def _kind(self, request: Request) -> str:
        """``params.request_kind``; refused params are a load that fails (``refused``):
        vLLM's ``kv_load_failure_policy`` then ends or recomputes the request."""
        try:
            return request_kind(request.kv_transfer_params)
        except ArgumentTypeError as exc:
            self._refused[request.request_id] = str(exc)
            return "load"

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        rid = request.request_id
        kind = "local" if rid in self._issued else self._kind(request)
        if kind == "save" and rid not in self._producing:
            ids = list(blocks.get_block_ids()[0])
            self._producing[rid] = (ids, list(request.prompt_token_ids or ()))
        elif kind == "load" and num_external_tokens > 0:
            hit = self._local_hit.pop(rid, 0)
            params = request.kv_transfer_params
            self._loads.append(
                LoadSpec(
                    rid,
                    dict(params) if rid not in self._refused else {},
                    list(blocks.get_block_ids()[0]),
                    hit // self._block_size,
                    prompt_digest(request.prompt_token_ids or ()),
                    self._refused.pop(rid, None),
                )
            )
            self._issued.add(rid)  # one pull per request

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        meta = HurrayConnectorMetadata(loads=self._loads)
        self._loads = []
        steps: list[tuple[str, int, list[int] | None]] = [
            (r.req_id, r.num_computed_tokens, None) for r in scheduler_output.scheduled_new_reqs
        ]
        cached = scheduler_output.scheduled_cached_reqs
        for i, rid in enumerate(cached.req_ids):
            new = cached.new_block_ids[i]
            steps.append((rid, cached.num_computed_tokens[i], list(new[0]) if new else []))
        for rid, computed, new_blocks in steps:
            if rid not in self._producing or rid in self._transfers:
                continue
            blocks, prompt = self._producing[rid]
            if new_blocks:
                blocks.extend(b for b in new_blocks if b not in blocks)
            if computed + scheduler_output.num_scheduled_tokens.get(rid, 0) < len(prompt):
                continue  # chunked prefill: the prompt completes in a later step
            needed = -(-len(prompt) // self._block_size)
            tid = TransferStore.new_id()
            digest = prompt_digest(prompt)
            self._transfers[rid] = TransferParams(
                transfer_id=tid,
                request_id=rid,
                host=self._options["host"],
                port=self._options["port"],
                block_ids=tuple(blocks[:needed]),
                num_tokens=len(prompt),
                block_size=self._block_size,
                prompt_digest=digest,
                tp_size=self._tp_size,
            )
            meta.saves.append(SaveSpec(rid, tid, blocks[:needed], len(prompt), digest))
        return meta

    def request_finished(
        self, request: Request, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        """The prefill side copied the pages while computing them: its blocks free now."""
        rid = request.request_id
        self._producing.pop(rid, None)
        self._local_hit.pop(rid, None)
        self._issued.discard(rid)
        self._refused.pop(rid, None)
        transfer = self._transfers.pop(rid, None)
        return False, None if transfer is None else transfer.to_params()

    # -- worker side ---------------------------------------------------------------------
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        from vllm.model_executor.models.utils import extract_layer_index

        names = sorted(kv_caches, key=extract_layer_index)
        self._layer_of = {name: i for i, name in enumerate(names)}
        self._caches = [kv_caches[name] for name in names]
        if len(names) != self._num_layers:
            raise InvalidTensorError(
                "one KV cache per attention layer expected",
                field="kv_caches",
                expected=self._num_layers,
                found=len(names),
            )
        # Backend, layout, kernel blocks, dtype: learned and checked now, so that a cache
        # the connector cannot move stops the engine at start, naming why (backends.py).
        layers = self._vllm_config.compilation_config.static_forward_context
        self._form = learn(self._vllm_config.cache_config, layers, {n: kv_caches[n] for n in names})
        fp8 = self._form.kv_cache_dtype is not None
        self._scales = [layer_scales(layers[n]) if fp8 else (None, None) for n in names]
        self._stream = side_stream(self._caches[0].device)
        if self._kv_transfer_config.is_kv_producer and self._listener is None:
            # Bind now: a taken port stops the engine at start, not at its first request.
            # TP rank r serves its own heads on port + r (docs/vllm.md § TP).
            self._listener = listen(self._bind_host, self._options["port"] + self._tp_rank())

    def _engine_fingerprint(self) -> EngineFingerprint:
        if self._fingerprint is None:
            import vllm

            form = self._cache_form()
            rank = self._tp_rank()
            # backend, layout and kernel block convert (receive.CONVERTIBLE); fp8 pages
            # need the same scales on both sides
            extras = {"vllm.kv_scales": scales_digest(self._scales)} if form.kv_cache_dtype else {}
            self._fingerprint = EngineFingerprint(
                model_id=self._model_id,
                engine="vllm",
                engine_version=vllm.__version__,
                kv_cache_layout=form.fingerprint_layout,
                cache_dtype=form.cache_dtype,
                block_size=self._block_size,
                tp_rank=rank,
                tp_size=self._tp_size,
                extras={"model_digest": self._model_digest or "unknown", **extras},
            )
        return self._fingerprint

    def _cache_form(self) -> CacheForm:
        if self._form is None:
            raise InvalidTensorError(
                "register_kv_caches was not called", field="kv_caches", found=None
            )
        return self._form

    def _tp_rank(self) -> int:
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

        try:
            return int(get_tensor_model_parallel_rank())
        except (AssertionError, RuntimeError):
            return 0  # no TP group (a single-rank engine built without one)

    def _producer_store(self) -> TransferStore:
        if self._store is None:
            self._store = TransferStore(
                self._engine_fingerprint(),
                self._model_id,
                self._num_layers,
                ttl=self._options["transfer_ttl"],
            )
            self._server = TransferServer(
                self._store,
                self._options["host"],
                self._options["port"],
                self._options["timeout"],
                nixl=self._nixl_peers(),
                listener=self._listener,
                max_connections=self._options["max_connections"],
                tls=self._tls,
            )
        return self._store

    def _nixl_peers(self) -> NixlPeers | None:
        if self._options["transport"] != "nixl":
            return None
        if self._nixl is None:
            self._nixl = NixlPeers(f"hurray-{uuid.uuid4().hex[:12]}",
                                   timeout=self._options["timeout"],
                                   max_peers=self._options["nixl_max_peers"])  # fmt: skip
        return self._nixl

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        assert isinstance(meta, HurrayConnectorMetadata)
        for load in meta.loads:
            self._pulling[load.request_id] = load
            if load.refused is not None:
                error = ArgumentTypeError(f"kv_transfer_params refused: {load.refused}")
                self._pulls.fail(load.request_id, error, load.first_block)
                continue
            self._pulls.start(load.request_id, partial(self._pull, load), load.first_block)

    def _pull(self, load: LoadSpec, deadline: Deadline) -> LoadResult:
        """On the pull's thread (``pulls.Pulls``: whatever this raises is its load error). The
        pages' heads and head size are checked; MLA's latent (one head, not sharded by TP) is
        as wide as the cache's row."""
        heads: int | None = self._num_kv_heads
        head_dim = self._head_dim
        if self._cache_form().roles != PAIR:
            heads, head_dim = None, int(self._caches[0].shape[-1])
        return pull(
            TransferParams.from_params(load.params),
            self._engine_fingerprint(),
            self._num_layers,
            first_block=load.first_block,
            expect_digest=load.digest,
            nixl=self._nixl_peers(),
            held=self._held(load),
            num_kv_heads=heads,
            head_dim=head_dim,
            deadline=deadline,
            tls=self._tls,
        )

    def _held(self, load: LoadSpec) -> HeldPages | None:
        """The request's blocks this worker already holds (vLLM's prefix-cache hit), read
        out of the engine's cache where they sit and hashed (held.py); cached full blocks
        are not written while the request holds them, so a thread may read them."""
        ids = load.block_ids[: load.first_block]
        if not ids:
            return None
        return HeldPages.from_pages([self._read(c, ids, i) for i, c in enumerate(self._caches)])

    def _read(self, cache: Any, block_ids: list[int], layer: int) -> tuple[Any, ...]:
        """The one reading of vLLM's cache (``CacheForm.read``, hurray_wire.adapters.vllm):
        a copy of these blocks only, one array of pages per role; a device cache's blocks
        gathered on the device first (device.py)."""
        form = self._cache_form()
        if not needs_staging(cache):
            return form.read(cache, block_ids, self._scales[layer])
        staged = gather(cache, kernel_ids([0, *block_ids], form.ratio), self._stream,
                        views=form.page_views).host()  # fmt: skip
        return form.read(staged, range(1, len(block_ids) + 1), self._scales[layer], fresh=True)

    def wait_for_layer_load(self, layer_name: str) -> None:
        """Loads are asynchronous (between steps): nothing to wait for inside a forward."""

    def save_kv_layer(
        self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any
    ) -> None:
        meta = self._get_connector_metadata()
        assert isinstance(meta, HurrayConnectorMetadata)
        if not meta.saves:
            return
        store = self._producer_store()
        layer = self._layer_of[layer_name]
        logger.debug("save_kv_layer %s -> %d", layer_name, layer)
        if needs_staging(kv_layer):
            # one gather of every saving request's blocks, copied to the host on the side
            # stream; read in wait_for_save (the forward pass does not wait for it)
            ids = [0, *(b for save in meta.saves for b in save.block_ids)]
            form = self._cache_form()  # the role split on the device: the host reads pages
            staged = gather(kv_layer, kernel_ids(ids, form.ratio), self._stream,
                            views=form.page_views)  # fmt: skip
            self._pending.append((meta.saves, layer, staged))
            return
        for save in meta.saves:
            self._save(store, save, layer, kv_layer, save.block_ids, fresh=False)

    def _save(self, store: TransferStore, save: SaveSpec, layer: int, cache: Any,
              block_ids: Any, *, fresh: bool) -> None:  # fmt: skip
        try:
            if not store.has(save.transfer_id):
                store.begin(save.transfer_id, save.request_id, save.block_ids,
                            save.num_tokens, save.digest)  # fmt: skip
            # each page digested as it is copied, while in cache; the pull sends these
            pages, digests = self._cache_form().read_digested(
                cache, block_ids, self._scales[layer], fresh=fresh
            )
            store.add_layer(save.transfer_id, layer, *pages, copy=False,  # pages are copies
                            digests=digests)  # fmt: skip
        except Exception as exc:  # nothing may leave into vLLM's forward pass
            # the transfer stays incomplete: its pull is refused, the decode side
            # applies its kv_load_failure_policy
            store.drop(save.transfer_id, "failed")
            self._log_once(save.request_id, exc, "KV save failed")
            return
        if layer == 0:
            self._count(pages_sent=len(save.block_ids))

    def wait_for_save(self) -> None:
        """Host caches are copied in ``save_kv_layer``; device caches' copies, started
        there, are waited for and read here (after the forward pass)."""
        pending, self._pending = self._pending, []
        for saves, layer, staged in pending:
            host, start = staged.host(), 1  # the gather's block 0 is the null block
            for save in saves:
                ids = range(start, start + len(save.block_ids))
                start += len(save.block_ids)
                self._save(self._producer_store(), save, layer, host, ids, fresh=True)

    def _land(self, load: LoadSpec, pages: PulledPages) -> None:
        """Every check of every layer before the first block is written (``land_layers``);
        fewer blocks than pages are refused there."""
        count = pages.layers[0][0].shape[0]
        targets = load.block_ids[pages.first_block : pages.first_block + count]
        layers = list(zip(self._caches, pages.layers, self._scales, strict=True))
        land_layers(self._cache_form(), layers, pages.num_tokens, targets, self._stream)

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        # finished requests' pulls (a client's abort) are cancelled and reported received,
        # nothing landed and no block named: vLLM frees their blocks (pulls.py)
        done, received = self._pulls.collect(finished_req_ids & set(self._pulling))
        for rid in received:
            self._pulling.pop(rid, None)
        for rid, result, seconds in done:
            load = self._pulling.pop(rid)
            received.add(rid)
            if result.pages is not None:
                try:
                    self._land(load, result.pages)
                except Exception as exc:  # a foreign one too: the request's load error
                    result = failure(exc, load.first_block)
            if result.pages is None:
                self._count(verification_failures=1)
                start = load.first_block if result.failed_from is None else result.failed_from
                self._invalid.update(load.block_ids[start:])
                self._log_once(rid, result.error)
                continue
            repaired = result.pages.repaired
            self._count(
                transfers=1, bytes_received=result.pages.wire_bytes, transfer_time_s=seconds
            )
            self._count(pages_reused=load.first_block - repaired, pages_repaired=repaired)
            self._stats.data[TIMES].append(seconds)
            if repaired:
                logger.warning("HurrayConnector: request %s: %d held prefix-cache pages differ "
                               "from the transfer's, overwritten with them", rid,
                               repaired)  # fmt: skip
        self._sync_server()
        return None, received or None

    def _sync_server(self) -> None:
        if self._server is not None:
            self._count(bytes_sent=self._server.take_sent())

    @property
    def totals(self) -> dict[str, float]:
        """Every counter since the connector started (tests and benchmarks read these)."""
        self._sync_server()
        return dict(self._totals)

    def get_block_ids_with_load_errors(self) -> set[int]:
        invalid, self._invalid = self._invalid, set()
        return invalid

    def _count(self, **amounts: float) -> None:
        for name, amount in amounts.items():
            if name in COUNTERS:
                self._stats.count(name, amount)
            self._totals[name] = self._totals.get(name, 0) + amount

    def _log_once(
        self, request_id: str, error: BaseException | None, what: str = "KV load refused"
    ) -> None:
        if request_id in self._logged:
            return
        self._logged[request_id] = None
        while len(self._logged) > 4096:  # bounded: a long-lived engine sees many requests
            del self._logged[next(iter(self._logged))]
        logger.error("HurrayConnector: request %s: %s: %s", request_id, what, error)

    def get_kv_connector_stats(self) -> KVConnectorStats | None:
        if self._stats.is_empty():
            return None
        stats, self._stats = self._stats, HurrayConnectorStats()
        return stats

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> KVConnectorStats:
        return HurrayConnectorStats(data=dict(data or {}))

    @classmethod
    def build_prom_metrics(
        cls,
        vllm_config: VllmConfig,
        metric_types: dict[type, type],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> KVConnectorPromMetrics:
        """vLLM's Prometheus logger registers the connector's metrics through this
        (``vllm:hurray_*``, hurray_wire.vllm.metrics)."""
        return HurrayPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    def shutdown(self) -> None:
        if self._server is not None:
            self._server.close()  # closes the NIXL senders too
            self._server = None
            self._nixl = None
        self._pulls.close()
        if self._nixl is not None:
            self._nixl.close()
            self._nixl = None
