"""One prefill -> decode handoff between two HurrayConnector workers, built the way vLLM 0.33
builds them, on CPU, without a forward pass (docs/vllm.md § compatibility).

* Block ids, the save plan, ``request_finished``'s ``kv_transfer_params`` and the decode
  side's load plan come from vLLM's own v1 ``Scheduler`` driving the scheduler-side
  connectors (once per pair of block sizes: they do not depend on the backend).
* Each worker's caches come from vLLM's ``allocate_kv_cache`` over a ``KVCacheConfig``
  planned by vLLM (``engine_tests/oracle_vllm/vllm_code.py``), in the kernel block size
  vLLM's ``select_common_block_size`` picks for the backend
  (vllm/v1/worker/utils.py ~515; prepare_kernel_block_sizes keeps packed layouts whole).
* Attention layers report the backend class: vLLM's own where its module imports on CPU;
  for the backends whose module imports a GPU library (FlashInfer, CUTLASS, the FA MLA
  kernels) a class stating the name, kernel block sizes and cache dtypes their source
  declares (``STATED``; ``test_stated_backends_are_vllms`` checks the source still says so).
* The handoff is the connector's real worker path: ``register_kv_caches``,
  ``save_kv_layer`` per layer, ``wait_for_save``, the pull over the socket transport,
  ``start_load_kv``, ``get_finished``, ``get_block_ids_with_load_errors``.
* ``token_values`` reads a layer's cache with the backend's own view expression
  (``vllm_code.VIEWS``) through vLLM's kernel block table mapping, independently of
  hurray-wire's adapters.
"""

from __future__ import annotations

import contextlib
import functools
import os
import socket
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from vllm.v1.kv_cache_interface import FullAttentionSpec, MLAAttentionSpec
from vllm.v1.kv_cache_layout import KVCacheLayout
from vllm.v1.worker.utils import allocate_kv_cache, select_common_block_size

from engine_tests.oracle_vllm import vllm_code as vc

ROOT = Path(__file__).resolve().parents[2]
PROMPT = [(i * 37) % 500 + 3 for i in range(150)]
LAYERS = vc.LAYERS  # the tiny Llama's two attention layers
HEADS, HEAD_SIZE, MLA_SIZE = 2, 32, 576
NUM_BLOCKS = 24
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "fp8": torch.uint8,
          "int8": torch.int8}  # fmt: skip

#: Backends whose module needs a GPU library to import, as their source declares them:
#: (file, kernel block sizes, cache dtypes).
STATED: dict[str, tuple[str, list[int | None], list[str]]] = {
    "FLASHINFER": ("vllm/v1/attention/backends/flashinfer.py", [16, 32, 64],
                   ["auto", "float16", "bfloat16", "fp8"]),
    "FLASH_ATTN_MLA": ("vllm/v1/attention/backends/mla/flashattn_mla.py", [None],
                       ["auto", "float16", "bfloat16"]),
    "CUTLASS_MLA": ("vllm/v1/attention/backends/mla/cutlass_mla.py", [128],
                    ["auto", "float16", "bfloat16"]),
    "FLASHINFER_MLA": ("vllm/v1/attention/backends/mla/flashinfer_mla.py", [32, 64],
                       ["auto", "float16", "bfloat16"]),
}  # fmt: skip


class StatedBackend:
    """A backend class as vLLM's code declares it (None in the sizes: ``MultipleOf(16)``)."""

    def __init__(self, name: str) -> None:
        from vllm.v1.attention.backend import MultipleOf

        self.name = name
        _, sizes, self.supported_kv_cache_dtypes = STATED[name]
        self.sizes = [MultipleOf(16) if s is None else s for s in sizes]

    def get_name(self) -> str:
        return self.name

    def get_supported_kernel_block_sizes(self, spec: Any = None) -> list[Any]:
        return list(self.sizes)

    def supported_kv_cache_layouts(self) -> None:
        return None  # off Blackwell: any layout (flashinfer.py ~729)


@functools.cache
def backend_class(name: str) -> Any:
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    if name in STATED:
        return StatedBackend(name)
    return AttentionBackendEnum[name].get_class()


def is_mla(backend: str) -> bool:
    return "MLA" in backend


def layouts_of(backend: str) -> list[str]:
    """The layouts vLLM lets the backend run with (``supported_kv_cache_layouts``)."""
    declared = backend_class(backend).supported_kv_cache_layouts()
    return [m.name for m in declared] if declared else [m.name for m in KVCacheLayout]


def dtypes_of(backend: str) -> list[str]:
    allowed = backend_class(backend).supported_kv_cache_dtypes
    return ["float16", "bfloat16"] + (["fp8"] if "fp8" in allowed else [])


@dataclass(frozen=True)
class Side:
    """One engine's cache: backend, layout, dtype and the scheduler's block size."""

    backend: str
    layout: str
    dtype: str
    block: int
    k_scale: float = 0.5
    v_scale: float = 0.25

    def __str__(self) -> str:
        return f"{self.backend}/{self.layout}/{self.dtype}/{self.block}"

    def spec(self) -> Any:
        dtype = DTYPES[self.dtype]
        if is_mla(self.backend):
            return MLAAttentionSpec(block_size=self.block, num_kv_heads=1, head_size=MLA_SIZE,
                                    dtype=dtype)  # fmt: skip
        return FullAttentionSpec(block_size=self.block, num_kv_heads=HEADS, head_size=HEAD_SIZE,
                                 dtype=dtype)  # fmt: skip

    def kernel_block(self) -> int | None:
        """vLLM's kernel block size for this side, None when vLLM cannot run it."""
        try:
            size = select_common_block_size(self.block, [backend_class(self.backend)],
                                            [self.spec()])  # fmt: skip
        except ValueError:
            return None
        # vLLM splits only layer-compact caches whose blocks are dense pages: packed layouts
        # are kept whole (utils.py prepare_kernel_block_sizes; their token caches cannot be
        # mapped to kernel blocks: map_kv_cache_to_kernel_blocks raises) and LHBNC is refused
        # (kv_cache_interface.py ~444, "does not store blocks as dense, unpadded pages")
        layout = KVCacheLayout[self.layout]
        splits = layout.is_block_compact and layout.is_layer_compact
        return None if size != self.block and not splits else size

    def isa(self) -> str | None:
        if self.backend != "CPU_ATTN":
            return None
        from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

        model = torch.bfloat16 if self.dtype == "fp8" else DTYPES[self.dtype]
        setting = "fp8" if self.dtype == "fp8" else "auto"
        return str(_get_attn_isa(model, self.block, HEAD_SIZE, setting))

    def caches(self, seed: int) -> tuple[Any, dict[str, torch.Tensor]]:
        """vLLM's KVCacheConfig and every layer's cache, as its worker allocates them."""
        layout = KVCacheLayout[self.layout]
        config = vc.plan(self.spec(), layout, NUM_BLOCKS)
        kernel = self.kernel_block()
        assert kernel is not None
        caches = dict(allocate_kv_cache(config, torch.device("cpu"), layout, [kernel]))
        for i, name in enumerate(LAYERS):
            vc.fill(caches[name], seed + i)
        return config, caches

    def layers(self) -> dict[str, Any]:
        """Attention layers as the connector meets them in ``static_forward_context``."""
        backend, isa = backend_class(self.backend), self.isa()
        return {name: SimpleNamespace(get_attn_backend=lambda b=backend: b, isa=isa,
                                      _k_scale=torch.tensor(self.k_scale),
                                      _v_scale=torch.tensor(self.v_scale))
                for name in LAYERS}  # fmt: skip


@functools.cache
def model_dir() -> Path:
    sys.path.insert(0, str(ROOT / "tools"))
    from make_tiny_llama import make_tiny_llama

    default = Path(tempfile.gettempdir()) / "hurray-tiny-llama"
    return Path(make_tiny_llama(Path(os.environ.get("HURRAY_TINY_LLAMA", default))))


def vllm_config(role: str, block: int, port: int) -> Any:
    from vllm.config import (
        CacheConfig,
        DeviceConfig,
        KVTransferConfig,
        ModelConfig,
        SchedulerConfig,
        VllmConfig,
    )

    model = ModelConfig(model=str(model_dir()), skip_tokenizer_init=True, max_model_len=512,
                        dtype="float16")  # fmt: skip
    config = VllmConfig(
        model_config=model,
        cache_config=CacheConfig(block_size=block),
        scheduler_config=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=2048,
                                         max_model_len=512, is_encoder_decoder=False),
        kv_transfer_config=KVTransferConfig(
            kv_connector="HurrayConnector", kv_connector_module_path="hurray_wire.vllm",
            kv_role=role, kv_load_failure_policy="fail",
            kv_connector_extra_config={"port": port, "model_id": "tiny-llama", "timeout": 20.0},
        ),
        device_config=DeviceConfig("cpu"),
    )  # fmt: skip
    config.cache_config.num_gpu_blocks = NUM_BLOCKS
    return config


@dataclass
class Plan:
    """What vLLM's schedulers decided for one request: the prefill worker's save, the
    params ``request_finished`` returned, the decode worker's load."""

    save: Any
    params: dict[str, Any]
    load: Any


def _scheduler(config: Any, block: int) -> Any:
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    spec = FullAttentionSpec(block_size=block, num_kv_heads=HEADS, head_size=HEAD_SIZE,
                             dtype=torch.float16)  # fmt: skip
    kv = KVCacheConfig(num_blocks=NUM_BLOCKS, kv_cache_tensors=[],
                       kv_cache_groups=[KVCacheGroupSpec(list(LAYERS), spec)])  # fmt: skip
    return Scheduler(config, kv, StructuredOutputManager(config), block_size=block,
                     log_stats=False)  # fmt: skip


def _request(rid: str, params: dict[str, Any]) -> Any:
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request

    sampling = SamplingParams(max_tokens=1, temperature=0.0,
                              extra_args={"kv_transfer_params": params})  # fmt: skip
    return Request(rid, list(PROMPT), sampling, None)


@functools.cache
def plan(prefill_block: int, decode_block: int, port: int) -> Plan:
    """vLLM's schedulers with the scheduler-side connectors, one request through both."""
    from vllm.v1.outputs import ModelRunnerOutput

    sched = _scheduler(vllm_config("kv_producer", prefill_block, port), prefill_block)
    sched.add_request(_request("p-1", {"do_remote_decode": True}))
    out = sched.schedule()
    (save,) = out.kv_connector_metadata.saves
    done = sched.update_from_output(out, ModelRunnerOutput(
        req_ids=["p-1"], req_id_to_index={"p-1": 0}, sampled_token_ids=[[7]]))  # fmt: skip
    (params,) = [o.kv_transfer_params for e in done.values() for o in e.outputs]
    sched = _scheduler(vllm_config("kv_consumer", decode_block, port), decode_block)
    sched.add_request(_request("d-1", dict(params)))
    (load,) = sched.schedule().kv_connector_metadata.loads
    return Plan(save, dict(params), load)


@dataclass
class Handoff:
    """A finished handoff: both sides' caches and what the decode worker reported."""

    prefill: dict[str, torch.Tensor]
    decode: dict[str, torch.Tensor]
    decode_before: dict[str, torch.Tensor]
    plan: Plan
    errors: set[int]
    finished: set[str]


def worker(config: Any, side: Side, kv_config: Any, caches: dict[str, torch.Tensor]) -> Any:
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

    from hurray_wire.vllm import HurrayConnector

    config.cache_config.block_size = side.block
    config.cache_config.cache_dtype = "fp8" if side.dtype == "fp8" else "auto"
    config.cache_config.kv_cache_layout = side.layout
    config.compilation_config.static_forward_context = side.layers()
    connector = HurrayConnector(config, KVConnectorRole.WORKER, kv_config)
    connector.register_kv_caches(caches)
    return connector


def handoff(prefill: Side, decode: Side, port: int, *, flip: bytes | None = None) -> Handoff:
    """Save on a prefill worker, pull and land on a decode worker (socket transport).
    ``flip``: bytes of a page the stream carries; the pull then goes through a relay that
    flips the first of them on the wire (a control)."""
    from hurray_wire.vllm.connector import HurrayConnectorMetadata

    p = plan(prefill.block, decode.block, port)
    p_kv, p_caches = prefill.caches(seed=1)
    d_kv, d_caches = decode.caches(seed=101)
    before = {n: c.clone() for n, c in d_caches.items()}
    producer = worker(vllm_config("kv_producer", prefill.block, port), prefill, p_kv, p_caches)
    try:
        producer.bind_connector_metadata(HurrayConnectorMetadata(saves=[p.save]))
        for name in LAYERS:
            producer.save_kv_layer(name, p_caches[name], None)
        producer.wait_for_save()
        producer.clear_connector_metadata()
        load = p.load
        if flip is not None:
            relay = Relay(port, flip)
            load = replace(load, params={**load.params, "remote_port": relay.port})
        consumer = worker(vllm_config("kv_consumer", decode.block, port), decode, d_kv, d_caches)
        try:
            consumer.bind_connector_metadata(HurrayConnectorMetadata(loads=[load]))
            consumer.start_load_kv(None)
            consumer.clear_connector_metadata()
            finished: set[str] = set()
            deadline = time.monotonic() + 60
            while not finished and time.monotonic() < deadline:
                _, received = consumer.get_finished(set())
                finished |= received or set()
                time.sleep(0.01)
            errors = consumer.get_block_ids_with_load_errors()
        finally:
            consumer.shutdown()
    finally:
        producer.shutdown()
    return Handoff(p_caches, d_caches, before, p, errors, finished)


class Relay:
    """A TCP relay on 127.0.0.1 for one pull: it forwards the ask, reads the prefill worker's
    whole answer, flips one bit of the first occurrence of ``needle`` and forwards it."""

    def __init__(self, port: int, needle: bytes) -> None:
        self._server = socket.create_server(("127.0.0.1", 0))
        self._server.settimeout(30)
        self.port = self._server.getsockname()[1]
        self._target, self._needle = port, needle
        self.flipped = False
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        with self._server, contextlib.suppress(OSError):
            conn, _ = self._server.accept()
            with conn, socket.create_connection(("127.0.0.1", self._target), timeout=30) as up:
                conn.settimeout(30)
                up.sendall(conn.recv(1 << 20))  # the ask: one line, well under a read
                data = bytearray()
                for _ in range(1 << 16):  # bounded: the answer is a few MB at most
                    chunk = up.recv(1 << 20)
                    if not chunk:
                        break
                    data += chunk
                at = data.find(self._needle)
                if at >= 0:
                    data[at] ^= 0x10
                    self.flipped = True
                conn.sendall(data)


def _cpu_index(isa: str, block: int, dim: int) -> torch.Tensor:
    """``[2, block, dim]`` slab offsets of key and value of each token, found by running
    ``test_cpu_attn.write_slab`` (the kernel's loops restated) on tagged values."""
    from engine_tests.oracle_vllm.test_cpu_attn import write_slab

    slab = torch.full((2 * block * dim,), -1.0, dtype=torch.float64)
    for n in range(block):
        tags = torch.arange(dim, dtype=torch.float64) + n * dim
        write_slab(isa, slab, n, block, tags, tags + block * dim)
    where = torch.empty(2 * block * dim, dtype=torch.long)
    where[slab.long()] = torch.arange(2 * block * dim)
    return where.view(2, block, dim)


def token_values(
    backend: str, layout: str, isa: str | None, cache: torch.Tensor
) -> list[torch.Tensor]:
    """Per role, ``[kernel blocks, kernel block size, H, D]`` as the backend's own view
    expression reads the cache (``vllm_code.VIEWS``); fp8 as its uint8 bytes."""
    if is_mla(backend):
        return [cache.squeeze(1)[:, :, None, :]]  # mla_attention.py: kv_cache.squeeze(1)
    if backend == "CPU_ATTN":
        assert isa is not None
        num_blocks, heads, block, width = cache.shape
        # cpu_attn.py: kv_cache.view((num_blocks, num_kv_heads, block_size * 2, -1)) and
        # .chunk(2, dim=2): the two halves of each (block, head) slab, in the ISA's order
        halves = cache.view(num_blocks, heads, block * 2, -1).chunk(2, dim=2)
        flat = torch.cat([h.reshape(num_blocks, heads, -1) for h in halves], dim=2)
        index = _cpu_index(isa, block, width // 2)
        return [flat[:, :, index[r]].transpose(1, 2) for r in range(2)]
    return list(vc.layer_view(backend, cache, HEAD_SIZE, KVCacheLayout[layout]))


def tokens_of(
    values: list[torch.Tensor], block_ids: list[int], block: int, count: int
) -> list[torch.Tensor]:
    """Per role, the request's first ``count`` tokens ``[count, H, D]``, through vLLM's
    kernel block table (``map_to_kernel_block_table``: block b, token t is kernel block
    ``b * ratio + t // kernel``, row ``t % kernel``)."""
    kernel = values[0].shape[1]
    ratio = block // kernel
    t = torch.arange(count)
    blocks = torch.tensor(block_ids)[t // block]
    kb = blocks * ratio + (t % block) // kernel
    return [v[kb, t % kernel] for v in values]
