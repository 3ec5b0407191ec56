"""What a vLLM engine's KV caches are, learned once at ``register_kv_caches`` (engine start),
and the connector's one reading and writing of them (docs/vllm.md § backends).

vLLM 0.33's own NixlConnector learns the same facts the same way
(``distributed/kv_transfer/kv_connector/v1/nixl/base_worker.py`` ~960-1085): the backend
from the attention layers (``layer.get_attn_backend()``, kv_connector/utils.py
``get_current_attn_backends``), the layout from ``cache_config.get_resolved_kv_cache_layout()``,
the kernel block size from ``select_common_block_size``; here it is read off the registered
tensors themselves, which ``allocate_kv_cache`` built in kernel blocks
(``v1/worker/gpu_model_runner.py`` ``initialize_kv_cache``, ~7020-7054), so it cannot
disagree with them. The CPU kernel's ISA is ``layer.isa`` (set by ``CPUAttentionMetadataBuilder``
before the caches are registered); fp8 caches are uint8 storage of ``cache_config.cache_dtype``
with the layer's ``_k_scale`` / ``_v_scale``.

A cache is refused here, at start, when the adapters cannot read it (another backend, an
integer cache, a layout its strides contradict), naming what is wrong.

Pages travel in the backend-free form ``[pages, block_size, H, D]`` per role (``key`` and
``value``, or MLA's ``fused`` latent) in the scheduler's block size, so engines with other
backends, layouts or kernel blocks exchange them; a decode engine lands them with its own
backend's rules (``into_vllm``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import numpy.typing as npt
import xxhash

from hurray_wire._interop import PageSink, digesting, rows_at
from hurray_wire.adapters import _vllm_forms as forms, from_vllm
from hurray_wire.adapters._common import array
from hurray_wire.adapters.vllm import fp8_view, kernel_ids
from hurray_wire.adapters.vllm_landing import checked_write
from hurray_wire.errors import HurrayWireError, InvalidTensorError
from hurray_wire.integrity.digests import DigestArray, PageRecords, page_rows
from hurray_wire.vllm.device import land_pages, needs_staging, stand_in
from hurray_wire.vllm.params import one_sequence, sequence_pages

__all__ = [
    "CacheForm",
    "kernel_ids",
    "land_layers",
    "layer_scales",
    "learn",
    "roles_of_layout",
    "scales_digest",
]

Pages = npt.NDArray[Any]
Scales = tuple[float | None, float | None]  # a layer's fp8 (k_scale, v_scale)
#: The vLLM version from which a cache is one 4-D view per layer (vllm-project/vllm#44455):
#: every cache ``learn`` accepts is read in that era.
LAYER_VIEWS = "0.26"
PAIR = ("key", "value")
FUSED = ("fused",)


def roles_of_layout(kv_cache_layout: str) -> tuple[str, ...]:
    """The roles a transfer carries per layer, from the fingerprint's ``kv_cache_layout``
    (``"<backend>/..."``): MLA's fused latent, else key and value."""
    return FUSED if kv_cache_layout.split("/", 1)[0] in forms.MLA_BACKENDS else PAIR


@dataclass(frozen=True)
class CacheForm:
    """One engine's caches: every layer has the same backend, layout and geometry."""

    backend: str
    layout: str | None  # the KVCacheLayout member vLLM resolved (None: it does not say)
    isa: str | None  # CPU_ATTN's kernel ISA
    block_size: int  # the scheduler's (manager) block size: the block ids it hands out
    kernel_block_size: int  # the cache tensors' block size (smaller when vLLM split blocks)
    kv_cache_dtype: str | None  # vLLM's fp8 setting when the cache is uint8 storage
    cache_dtype: str  # the element type pages travel as

    @property
    def ratio(self) -> int:
        return self.block_size // self.kernel_block_size

    @property
    def roles(self) -> tuple[str, ...]:
        return roles_of_layout(self.backend)

    @property
    def fingerprint_layout(self) -> str:
        """The fingerprint's ``kv_cache_layout``: backend, layout, ISA and kernel block."""
        parts = [self.backend, self.layout or "-", f"kernel{self.kernel_block_size}"]
        return "/".join(parts + ([self.isa] if self.isa else []))

    @property
    def page_views(self) -> Callable[[Any], list[Any]] | None:
        """The backend's page views of a cache (``forms.page_views``) for a device to gather
        pages with in the wire's layout (device.py ``gather``); None for CPU_ATTN, whose
        slabs are never on a device."""
        if self.backend == forms.CPU_BACKEND:
            return None
        return partial(forms.page_views, mla=self.backend in forms.MLA_BACKENDS)

    def _kw(self, scales: Scales = (None, None)) -> dict[str, Any]:
        """The adapter's reading of this engine's caches: manager block ids translated to
        the kernel blocks the attention reads (``block_size=``), in the era of one 4-D view
        per layer (``learn`` refuses any other cache), so that no read or landing asks the
        package metadata which vLLM is installed (~0.2 ms a call where none is imported)."""
        return {"backend": self.backend, "isa": self.isa, "kv_cache_dtype": self.kv_cache_dtype,
                "block_size": self.block_size, "vllm_version": LAYER_VIEWS,
                "k_scale": scales[0], "v_scale": scales[1]}  # fmt: skip

    def read(
        self,
        cache: Any,
        block_ids: Sequence[int],
        scales: Scales = (None, None),
        *,
        fresh: bool = False,
    ) -> tuple[Pages, ...]:
        """A copy of the pages of scheduler blocks ``block_ids`` (whole blocks), one array
        per role ``[pages, block_size, H, D]``. ``cache``: the engine's, or with ``fresh``
        a gathered copy nothing else writes (its pages are then not copied again): whole
        kernel blocks, or a device's pages already in the wire's layout (a tuple per role,
        ``gather(views=page_views)``: views of it, fp8 storage as its float8 type)."""
        count = len(block_ids)
        if isinstance(cache, tuple):
            ids = kernel_ids(block_ids, self.ratio)
            rows = [fp8_view(array(role, "kv_cache"), self.kv_cache_dtype) for role in cache]
            return tuple(
                rows_at(r, ids).reshape(count, self.block_size, *r.shape[2:]) for r in rows
            )
        read = from_vllm(cache, [list(block_ids)], [count * self.block_size],
                         kv_cache_layout=self.layout, **self._kw(scales))  # fmt: skip
        source = None if fresh else array(cache, "kv_cache")
        out = []
        for t in read if isinstance(read, tuple) else (read,):
            pages = sequence_pages(t).reshape(count, self.block_size, *t.page_pool.shape[2:])
            # from_vllm shares a C-contiguous pool (MLA): the engine may overwrite it
            shared = source is not None and np.may_share_memory(pages, source)
            out.append(pages.copy() if shared else pages)
        return tuple(out)

    def read_digested(
        self,
        cache: Any,
        block_ids: Sequence[int],
        scales: Scales = (None, None),
        *,
        fresh: bool = False,
    ) -> tuple[tuple[Pages, ...], tuple[DigestArray, ...]]:
        """:meth:`read` and each role's page digests (one per wire page, as the encoder's),
        taken as each chunk of pages is copied, while in cache (``_interop.digesting``; docs/
        performance.md § issue 30); a copy the gather did not make (a device's staged pages,
        a copy of a shared pool) is digested after the read."""
        sink = PageSink(self.ratio, _row_digests)
        with digesting(sink):
            pages = self.read(cache, block_ids, scales, fresh=fresh)
        return pages, tuple(_digests_of(p, sink) for p in pages)

    def write(
        self,
        pages: Sequence[Pages],
        num_tokens: int,
        cache: Any,
        block_ids: Sequence[int],
        scales: Scales = (None, None),
    ) -> None:
        """:meth:`checked`'s write run at once: ``scales``, the layer's fp8 scales, equal
        the prefill engine's (``scales_digest`` is in both fingerprints)."""
        self.checked(pages, num_tokens, cache, block_ids, scales)()

    def checked(
        self,
        pages: Sequence[Pages],
        num_tokens: int,
        cache: Any,
        block_ids: Sequence[int],
        scales: Scales = (None, None),
        stream: Any = None,
        *,
        device: bool | None = None,
    ) -> Callable[[], None]:
        """Every check of landing ``pages`` (per role ``[pages, block_size, H, D]``,
        ``num_tokens`` valid) at scheduler blocks ``block_ids`` (``into_vllm``'s
        ``vllm_landing.checked_write``), nothing written: the write, run once every layer of
        a transfer passed. A cache on a device (``device``; None: one not in host memory,
        True: a CPU tensor, for tests and the bench) is checked through ``device.stand_in``
        (nothing read or written through it) and written by ``device.land_pages``."""
        needed = -(-num_tokens // self.kernel_block_size)  # kernel blocks holding the tokens
        kernel = [p.reshape(-1, self.kernel_block_size, *p.shape[2:])[:needed] for p in pages]
        tensors = tuple(
            one_sequence(p, num_tokens, kv_role=role, kv_scale=s)
            for p, role, s in zip(kernel, self.roles, scales, strict=False)
        )
        target = tensors[0] if len(tensors) == 1 else (tensors[0], tensors[1])
        device = needs_staging(cache) if device is None else device
        write = checked_write(target, stand_in(cache) if device else cache, [list(block_ids)],
                              **self._kw(scales))  # fmt: skip
        if not device:
            return write
        assert self.page_views is not None  # CPU_ATTN caches are never on a device
        ids = kernel_ids(block_ids, self.ratio)[:needed]
        valid = num_tokens - (needed - 1) * self.kernel_block_size
        return land_pages(cache, self.page_views, ids, kernel, valid, stream)

    def check(self, cache: Any) -> None:
        """Read nothing from ``cache`` with the adapter's rules: every refusal it would
        give later (backend, shape, dtype, layout, ISA) given now."""
        from_vllm(cache, [[]], [0], kv_cache_layout=self.layout, **self._kw())


def _row_digests(rows: npt.NDArray[np.uint8]) -> DigestArray:
    """The page digests of whole pages given as ``[pages, bytes]`` rows."""
    return PageRecords(rows).digests()


def _digests_of(pages: Pages, sink: PageSink) -> DigestArray:
    """The digests ``sink`` took of exactly these bytes (the gather's own output, page
    ``i`` the same byte range of it), else digested now. Safe to reuse: the output is the
    read's fresh memory, which nothing writes after the gather (the held copy)."""
    at = (pages.ctypes.data, pages.nbytes, len(pages))
    for out, digests in sink.outputs if pages.flags.c_contiguous else ():
        if out.flags.c_contiguous and at == (out.ctypes.data, out.nbytes, len(digests)):
            return digests
    return sink.digest(page_rows(pages, len(pages), "pages"))


def land_layers(
    form: CacheForm,
    layers: Sequence[tuple[Any, Sequence[Pages], Scales]],
    num_tokens: int,
    block_ids: Sequence[int],
    stream: Any = None,
) -> None:
    """A transfer's pages landed, transfer-atomically: ``layers`` holds per layer ``(cache,
    pages per role, fp8 scales)``; every check of every layer (``CacheForm.checked``)
    passes before the first block is written, so a refusal at the last layer leaves every
    layer's blocks as they were. ``stream``: a device's side stream (device.py)."""
    writes = [form.checked(pages, num_tokens, cache, block_ids, scales, stream)
              for cache, pages, scales in layers]  # fmt: skip
    for write in writes:
        write()


def _refuse(message: str, field: str, found: Any, **kw: Any) -> InvalidTensorError:
    return InvalidTensorError(f"HurrayConnector: {message}", field=field, found=found, **kw)


def learn(cache_config: Any, layers: Mapping[str, Any], kv_caches: Mapping[str, Any]) -> CacheForm:
    """The engine's ``CacheForm`` from its cache config, its attention layers (vLLM's
    ``static_forward_context``) and the caches it registers; refuses, naming the field,
    anything the connector cannot move (it is called from ``register_kv_caches``)."""
    if not kv_caches:
        raise _refuse("no KV caches registered", "kv_caches", 0)
    backends: set[str] = set()
    isas: set[Any] = set()
    for name in kv_caches:
        layer = layers.get(name)
        if layer is None or not hasattr(layer, "get_attn_backend"):
            message = "a KV cache without an attention layer reporting its backend"
            raise _refuse(message, "kv_caches", name)
        backends.add(str(layer.get_attn_backend().get_name()))
        isas.add(getattr(layer, "isa", None))
    if len(backends) != 1:
        message = "one attention backend for every layer is supported"
        raise _refuse(message, "backend", sorted(backends))
    backend = backends.pop()
    if backend not in forms.BACKENDS:
        message = f"the {backend} attention backend's cache is not one hurray-wire reads"
        raise _refuse(message, "backend", backend, expected=forms.BACKENDS)
    block_size = int(cache_config.block_size)
    first = next(iter(kv_caches.values()))
    if len(first.shape) != 4:
        message = f"a {backend} cache of vLLM >= 0.26 is one 4-D view per layer"
        raise _refuse(message, "kv_caches", f"shape {tuple(first.shape)}")
    kernel = int(first.shape[2])
    if kernel < 1 or block_size % kernel:
        message = "the caches' block size does not divide the scheduler's"
        raise _refuse(message, "block_size", kernel, expected=f"a divisor of {block_size}")
    fp8 = str(first.dtype) == "torch.uint8"
    setting = getattr(cache_config, "cache_dtype", None)
    dtype = forms.float8_name(setting) if fp8 else str(first.dtype).removeprefix("torch.")
    isa = isas.pop() if backend == forms.CPU_BACKEND and len(isas) == 1 else None
    resolve = getattr(cache_config, "get_resolved_kv_cache_layout", None)
    try:
        resolved = resolve() if resolve is not None else None
    except ValueError:  # not resolved (an engine built without its core)
        resolved = None
    layout = forms.layout_name(resolved)
    form = CacheForm(backend, layout, isa, block_size, kernel, str(setting) if fp8 else None, dtype)
    for name, cache in kv_caches.items():
        if tuple(cache.shape) != tuple(first.shape) or cache.dtype != first.dtype:
            found = f"{name}: {tuple(cache.shape)} {cache.dtype}"
            expected = f"{tuple(first.shape)} {first.dtype}"
            message = "every layer's cache has one shape and dtype"
            raise _refuse(message, "kv_caches", found, expected=expected)
        try:
            form.check(cache)
        except HurrayWireError as exc:
            raise _refuse(f"{name}: {exc}", "kv_caches", backend) from None
    return form


def layer_scales(layer: Any) -> Scales:
    """An fp8 layer's ``(k_scale, v_scale)``: its ``_k_scale`` / ``_v_scale`` buffers (0-d or
    one per KV head, vllm/model_executor/layers/attention/attention.py
    ``set_default_quant_scales``), read once at engine start (they are loaded with the
    weights, before the caches are allocated)."""
    k, v = (forms.scale_value(getattr(layer, f"_{r}_scale", None), f"{r}_scale") for r in "kv")
    return k, v


def scales_digest(scales: Sequence[Scales]) -> str:
    """xxh3-64 of every layer's fp8 scales (float64, 1.0 when unset): a fingerprint extra,
    so that pages quantized with other scales are refused, not dequantized wrong."""
    values = np.array([[1.0 if s is None else s for s in pair] for pair in scales], np.float64)
    return xxhash.xxh3_64_hexdigest(values.tobytes())
