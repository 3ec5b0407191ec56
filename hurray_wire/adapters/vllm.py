"""vLLM per-layer KV caches <-> BlockPagedTensor, read the way vLLM's attention reads them.

The same tensor holds other bytes under another ``backend`` or ``vllm_version``, so both are
inputs, never guessed (``_vllm_forms`` cites the vLLM code, docs/adapters.md tabulates it);
``kv_cache_layout`` is checked against the strides, never used to reinterpret the axes.
Block 0 is vLLM's null block (vllm/v1/core/block_pool.py), never a request's data.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, TypedDict, overload

import numpy as np

from hurray_wire._interop import first_reference_order, gather_many
from hurray_wire.adapters import _vllm_forms as forms
from hurray_wire.adapters._common import (
    Array,
    Pair as Pair,  # vllm_landing imports it from here
    array,
    check_choice,
    check_pair,
    from_table,
    int_vector,
    lens_of,
    padded_rows,
    refuse_first,
    role_tensors,
)
from hurray_wire.dtypes import element_type_from_name
from hurray_wire.errors import ArgumentTypeError, IndexBufferError, InvalidTensorError
from hurray_wire.tensor import BlockPagedTensor
from hurray_wire.transforms._common import check_int

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["from_vllm", "to_vllm"]

SKIPPED_TOKENS_KEY = "vllm.skipped_tokens"
# Axis of the one-role view [blocks, tokens, heads, dim] for each per-layer logical axis
# (blocks, heads, tokens, content).
_ROLE_AXIS = {0: 0, 1: 2, 2: 1, 3: 3}


def fp8_view(cache: Array, kv_cache_dtype: object) -> Array:
    """``cache`` with vLLM's uint8 fp8 storage viewed as its float8 type (no copy)."""
    forms.check_cache_dtype(kv_cache_dtype)
    if cache.dtype == np.uint8:
        return cache.view(element_type_from_name(forms.float8_name(kv_cache_dtype)).numpy_dtype)
    if cache.dtype.kind in "iub":
        raise InvalidTensorError(
            "vLLM's integer caches (int8 / int4 per-token-head) keep their scales inside "
            "the pages: not supported",
            field="kv_cache",
            found=str(cache.dtype),
        )
    if kv_cache_dtype is not None and kv_cache_dtype not in ("auto", "float16", "bfloat16"):
        name = forms.float8_name(kv_cache_dtype)
        if cache.dtype != element_type_from_name(name).numpy_dtype:
            raise InvalidTensorError(
                f"kv_cache_dtype {kv_cache_dtype!r} does not match the cache's dtype",
                field="kv_cache_dtype",
                found=str(cache.dtype),
            )
    return cache


def _role_order(layout: str) -> tuple[int, ...]:
    """``layout``'s memory order of the one-role view's axes (blocks, tokens, heads, dim)."""
    return tuple(_ROLE_AXIS[a] for a in forms.LAYOUTS[layout])


def _check_layout(cache: Array, kv_cache_layout: object, era: int | None, role: bool) -> None:
    name = forms.layout_name(kv_cache_layout)
    if name is None:
        return
    if era is not None and era < forms.ERA_LAYER_VIEWS:
        # [.., block_size, H, D]: NHD (LBNHC) or HND (LBHNC), the leading axes outermost
        _old_layout(name, kv_cache_layout)
        lead = tuple(range(cache.ndim - 3))
        physical = lead + tuple(len(lead) - 1 + a for a in _role_order(name)[1:])
    else:
        physical = _role_order(name) if role else forms.LAYOUTS[name]
    forms.check_strides(cache, physical, name)


def _old_layout(name: str, kv_cache_layout: object) -> None:
    """Before 0.26 only NHD and HND exist (the stride order of ``[.., block_size, H, D]``)."""
    if name not in forms.LAYOUT_ALIASES.values():
        raise ArgumentTypeError(
            "vLLM before 0.26 has the NHD and HND layouts only",
            field="kv_cache_layout",
            found=repr(kv_cache_layout),
            expected=("NHD", "HND"),
        )


def _shape_error(message: str, cache: Array) -> InvalidTensorError:
    return InvalidTensorError(message, field="kv_cache", found=f"shape {cache.shape}")


def _role_pools(
    cache: Array, backend: str, era: int | None, kv_role: str | None, isa: object = None
) -> tuple[str, list[tuple[str, Array]]]:
    """``(kind, [(role, view)])``: each role's pages as the backend reads them, views of
    ``cache`` ``[blocks, block_size, H, D]`` (CPU_ATTN: ``forms.cpu_role_views``). Reading
    (``from_vllm``) and writing (``to_vllm``, ``into_vllm``) go through these views."""
    if backend == forms.CPU_BACKEND:  # from_vllm and to_vllm refuse it before 0.26
        if kv_role is not None:
            raise InvalidTensorError(
                "a CPU_ATTN cache holds both roles in each slab: pass the layer's cache "
                "without kv_role",
                field="kv_role",
                found=repr(kv_role),
            )
        chosen = forms.check_isa(isa)
        if cache.ndim != 4 or cache.shape[3] % 2:
            raise _shape_error(
                "a CPU_ATTN cache is [num_blocks, H, block_size, 2 * head_size]", cache
            )
        _, _, block_size, width = cache.shape
        forms.check_cpu_geometry(chosen, block_size, width // 2)
        item = cache.dtype.itemsize  # the kernel's kv_cache.view(N, H, 2 * block_size, -1)
        if cache.strides[3] != item or (block_size > 1 and cache.strides[2] != width * item):
            raise InvalidTensorError(
                "a CPU_ATTN cache keeps each (block, head) slab contiguous (kv_cache_layout "
                "LBHNC, the one CPUAttentionBackend.supported_kv_cache_layouts allows)",
                field="kv_cache",
                found=f"strides {cache.strides}",
            )
        return "cpu", list(zip(("key", "value"), forms.cpu_role_views(cache, chosen), strict=True))
    if backend in forms.MLA_BACKENDS:
        if kv_role not in (None, "fused"):
            raise InvalidTensorError(
                "an MLA cache holds one fused latent per token",
                field="kv_role",
                found=repr(kv_role),
                expected="fused",
            )
        if cache.ndim == 4 and cache.shape[1] == 1 and era in (None, forms.ERA_LAYER_VIEWS):
            return "mla", [("fused", forms.page_views(cache, mla=True)[0])]
        if cache.ndim == 3 and era is not None and era < forms.ERA_LAYER_VIEWS:
            return "mla", [("fused", cache[:, :, None, :])]
        raise _shape_error(
            "an MLA cache is [num_blocks, 1, block_size, dim] (vLLM >= 0.26) or "
            "[num_blocks, block_size, dim] (before 0.26, pass vllm_version)",
            cache,
        )
    if kv_role is not None:
        check_choice(kv_role, "kv_role", ("key", "value"))
        if cache.ndim != 4:
            raise _shape_error("a one-role cache is [num_blocks, block_size, H, head_size]", cache)
        return "role", [(kv_role, cache)]
    if cache.ndim == 4:
        if era is not None and era < forms.ERA_LAYER_VIEWS:
            raise _shape_error(
                "before vLLM 0.26 a 4-D cache is one role's [num_blocks, block_size, H, "
                "head_size]: pass kv_role",
                cache,
            )
        width = cache.shape[3]
        if width % 2:
            raise _shape_error(
                "[num_blocks, H, block_size, 2 * head_size] needs an even last axis (a "
                "one-role [num_blocks, block_size, H, head_size] cache needs kv_role)",
                cache,
            )
        # a layer view's K|V rows are whole and packed (create_kv_cache_views: the content
        # axis innermost, the next one, the block axis too under LHBNC with one-token
        # blocks, C elements apart); one role's split leaves the other half between rows
        item = cache.dtype.itemsize
        near = min((abs(cache.strides[a]) for a in (0, 1, 2) if cache.shape[a] > 1), default=None)
        if cache.strides[3] != item or near not in (None, width * item):
            raise _shape_error(
                "not a whole layer view [num_blocks, H, block_size, 2 * head_size] (its rows "
                "leave gaps): one role's view [num_blocks, block_size, H, head_size] needs "
                "kv_role",
                cache,
            )
        return "layer", list(zip(("key", "value"), forms.page_views(cache, mla=False), strict=True))
    if cache.ndim == 5:
        if era is None:
            raise ArgumentTypeError(
                "the vLLM version decides what this cache shape means: pass vllm_version= "
                "(0.20-0.22 allocate [2, num_blocks, ...], 0.23-0.25 [num_blocks, 2, ...], "
                ">= 0.26 one [num_blocks, H, block_size, 2 * head_size] view per layer)",
                field="vllm_version",
                found=f"shape {cache.shape}",
            )
        if era >= forms.ERA_LAYER_VIEWS:
            raise _shape_error(
                "vLLM >= 0.26 hands one 4-D view per layer; a 5-D tensor is a cross-layer "
                "buffer [.., num_layers, ..]: pass one layer's view",
                cache,
            )
        axis = forms.stacked_axis(backend, era)
        if cache.shape[axis] == 2:
            roles = np.moveaxis(cache, axis, 0)
            return "old", [("key", roles[0]), ("value", roles[1])]  # views
        pair = "2, num_blocks" if axis == 0 else "num_blocks, 2"
        raise _shape_error(
            f"{backend} in this vLLM version allocates [{pair}, block_size, H, head_size]", cache
        )
    raise _shape_error(
        "a vLLM cache is 4-D (one layer, or one role with kv_role) or 5-D (before 0.26)", cache
    )


def _check_ids(ids: Array, num_blocks: int, name: str) -> None:
    refuse_first(
        ids >= num_blocks,
        ids,
        "block id out of range at used entry {}",
        name,
        expected=f"< {num_blocks}",
    )


def kernel_ratio(
    block_size: object, kernel_block_size: int, num_blocks: int | None, layout: object = None
) -> int:
    """Kernel blocks per scheduler (manager) block, 1 without ``block_size``: vLLM 0.33
    allocates kernel blocks when a backend cannot take the block size (vllm/v1/worker/utils.py
    ``select_common_block_size``) while the scheduler's ids stay in manager blocks."""
    if block_size is None:
        return 1
    size = check_int(block_size, "block_size", minimum=1)
    if size % kernel_block_size:
        raise InvalidTensorError(
            f"block_size {size} (vLLM's scheduler block size, cache_config.block_size) is "
            f"not a multiple of the cache's kernel block size {kernel_block_size} (its own "
            "block axis)",
            field="block_size",
            found=size,
            expected=f"a multiple of {kernel_block_size}",
        )
    ratio = size // kernel_block_size
    name = forms.layout_name(layout)
    if ratio > 1 and name not in (None, *forms.SPLIT_LAYOUTS):
        raise InvalidTensorError(
            f"vLLM splits blocks into kernel blocks only under {forms.SPLIT_LAYOUTS} "
            "(vllm/v1/kv_cache_interface.py create_kv_cache_views refuses other layouts; "
            "vllm/v1/worker/utils.py prepare_kernel_block_sizes never splits "
            "block-outermost ones)",
            field="block_size",
            found=f"block_size {size}, kernel block size {kernel_block_size}, {name}",
        )
    if num_blocks is not None and num_blocks % ratio:
        raise InvalidTensorError(
            f"a cache split into kernel blocks of {kernel_block_size} tokens holds "
            f"num_blocks * {ratio} of them (block_size {size}); this one has {num_blocks}",
            field="kv_cache",
            found=num_blocks,
            expected=f"a multiple of {ratio}",
        )
    return ratio


def kernel_ids(block_ids: Any, ratio: int) -> Array:
    """Scheduler block ids as the kernel blocks that hold them, block ``b`` kernel blocks
    ``b * ratio + j`` (vllm/v1/worker/utils.py ``map_to_kernel_block_table``)."""
    ids = np.asarray(block_ids, np.int64)
    return (ids[:, None] * ratio + np.arange(ratio, dtype=np.int64)).reshape(-1)


def kernel_table(
    table: Array, seq_ptr: Array, lens: Array, ratio: int, kernel_shape: tuple[int, int], name: str
) -> tuple[Array, Array]:
    """Manager block ids -> the kernel blocks ``b * ratio + j`` the attention reads (vllm/v1/
    worker/utils.py ``map_to_kernel_block_table``), each sequence keeping the ones its tokens
    fill. ``kernel_shape``: the cache's ``(num_blocks, kernel_block_size)``."""
    if ratio == 1:
        return table, seq_ptr
    num_blocks, kernel_block_size = kernel_shape
    _check_ids(table, num_blocks // ratio, name)
    counts = np.diff(seq_ptr)
    expanded = kernel_ids(table, ratio)
    need = -(-lens // kernel_block_size)
    position = np.arange(expanded.size) - np.repeat(seq_ptr[:-1] * ratio, counts * ratio)
    keep = position < np.repeat(need, counts * ratio)
    return expanded[keep], np.concatenate(([0], np.cumsum(need))).astype(np.int64)


def _window(
    table: Array, seq_ptr: Array, lens: Array, block_size: int, sliding_window: object
) -> tuple[Array, Array, Array, list[int] | None]:
    """Drop each row's leading null blocks (sliding window); refuse any other block 0."""
    if sliding_window is None:
        null = (
            "block 0 is vLLM's null block, never a request's data (a sliding-window layer's "
            "table has it for blocks outside the window: pass sliding_window)"
        )
        refuse_first(table == 0, table, null, "block_table")
        return table, seq_ptr, lens, None
    window = check_int(sliding_window, "sliding_window")
    if window < 1:
        raise ArgumentTypeError("sliding_window must be >= 1", field="sliding_window", found=window)
    rows, new_lens, skipped = [], lens.copy(), []
    for s in range(len(lens)):
        row = table[seq_ptr[s] : seq_ptr[s + 1]]
        nulls = int(np.argmax(row != 0)) if (row != 0).any() else len(row)
        if (row[nulls:] == 0).any() or nulls * block_size > max(0, int(lens[s]) - window + 1):
            raise IndexBufferError(
                f"sequence {s}'s null blocks reach into its sliding window of {window} "
                "tokens (vLLM nulls only leading blocks the window has left)",
                position=s,
                field="block_table",
                found=row.tolist(),
            )
        rows.append(row[nulls:])
        new_lens[s] -= nulls * block_size
        skipped.append(nulls * block_size)
    counts = np.array([len(r) for r in rows], np.int64)
    new_ptr = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
    flat = np.concatenate(rows) if rows else np.zeros(0, np.int64)
    return flat.astype(np.int64), new_ptr, new_lens, skipped


class _Options(TypedDict, total=False):
    """``from_vllm``'s keywords that do not decide what it returns."""

    vllm_version: str | None
    kv_cache_layout: Any
    layer_index: int | None
    k_scale: Any
    v_scale: Any
    kv_cache_dtype: str | None
    sliding_window: int | None
    isa: str | None
    block_size: int | None


@overload
def from_vllm(
    kv_cache: Any,
    block_table: Any,
    seq_lens: Any,
    *,
    backend: Any,
    kv_role: Literal["key", "value"],
    **options: Unpack[_Options],
) -> BlockPagedTensor: ...
@overload
def from_vllm(
    kv_cache: Any,
    block_table: Any,
    seq_lens: Any,
    *,
    backend: forms.MlaBackend,
    kv_role: None = None,
    **options: Unpack[_Options],
) -> BlockPagedTensor: ...
@overload
def from_vllm(
    kv_cache: Any,
    block_table: Any,
    seq_lens: Any,
    *,
    backend: forms.PairBackend,
    kv_role: None = None,
    **options: Unpack[_Options],
) -> Pair: ...
@overload
def from_vllm(
    kv_cache: Any,
    block_table: Any,
    seq_lens: Any,
    *,
    backend: Any = None,
    kv_role: str | None = None,
    **options: Unpack[_Options],
) -> BlockPagedTensor | Pair: ...


def from_vllm(
    kv_cache: Any,
    block_table: Any,
    seq_lens: Any,
    *,
    backend: Any = None,
    vllm_version: str | None = None,
    kv_cache_layout: Any = None,
    kv_role: str | None = None,
    layer_index: int | None = None,
    k_scale: Any = None,
    v_scale: Any = None,
    kv_cache_dtype: str | None = None,
    sliding_window: int | None = None,
    isa: str | None = None,
    block_size: int | None = None,
) -> BlockPagedTensor | Pair:
    """One layer's cache as a ``(key, value)`` pair, one role (``kv_role``) or MLA ``fused``.

    ``backend`` is required: the same shape holds other bytes under CPU_ATTN and FLASH_ATTN;
    ``vllm_version`` where the shape's meaning depends on it; ``block_size`` (vLLM's
    ``cache_config.block_size``) reads each id as kernel blocks (docs/adapters.md § vLLM).
    """
    name = forms.backend_name(backend)
    cache = fp8_view(array(kv_cache, "kv_cache"), kv_cache_dtype)
    era = forms.era_of(vllm_version)
    key_scale = forms.scale_value(k_scale, "k_scale")
    scales = {"key": key_scale, "fused": key_scale, "value": forms.scale_value(v_scale, "v_scale")}
    lens = int_vector(seq_lens, "seq_lens")
    if name == forms.CPU_BACKEND and era is not None and era < forms.ERA_LAYER_VIEWS:
        raise InvalidTensorError(
            "CPU_ATTN caches before vLLM 0.26 are not supported",
            field="vllm_version",
            found=vllm_version,
        )
    kind, pools = _role_pools(cache, name, era, kv_role, isa)
    _check_layout(cache, kv_cache_layout, era, role=kind == "role")
    kernel = (cache.shape[0], cache.shape[2]) if kind == "cpu" else pools[0][1].shape[:2]
    if kernel[1] < 1:
        raise _shape_error("block_size must be >= 1", cache)
    forms.check_kernel_block(name, kernel[1], era)
    ratio = kernel_ratio(block_size, kernel[1], kernel[0], kv_cache_layout)
    manager = kernel[1] * ratio
    table, seq_ptr = from_table(block_table, lens, manager)
    table, seq_ptr, lens, skipped = _window(table, seq_ptr, lens, manager, sliding_window)
    table, seq_ptr = kernel_table(table, seq_ptr, lens, ratio, kernel, "block_table")
    _check_ids(table, kernel[0], "block_table")
    if kind in ("cpu", "layer"):
        # K and V rows interleave: both roles gathered in one pass over the cache
        # (``gather_many``), numbered in first-reference order (a sequence's pages in
        # order: no re-gather)
        used, table = first_reference_order(table)
        gathered = gather_many([pool for _, pool in pools], used)
        page = (kernel[1], cache.shape[1], cache.shape[3] // 2)  # [block_size, H, D]
        pools = [(role, p.reshape(len(p), *page).view(cache.dtype))
                 for (role, _), p in zip(pools, gathered, strict=True)]  # fmt: skip
    metadata = {SKIPPED_TOKENS_KEY: skipped} if skipped else None
    return role_tensors(pools, table, seq_ptr, lens, layer_index, scales, metadata)


def _default_layout(name: str, era: int, kv_cache_layout: Any) -> str:
    """vLLM's layout for ``name``: the given one, else the backend's or vLLM's default."""
    chosen = forms.layout_name(kv_cache_layout)
    allowed = forms.BACKEND_LAYOUTS.get(name) if era >= forms.ERA_LAYER_VIEWS else None
    if chosen is None:
        if name == "FLASHINFER":
            raise ArgumentTypeError(
                "FLASHINFER's layout depends on the GPU (LBHNC on compute capability 10, "
                "else LBNHC; vllm/v1/attention/backends/flashinfer.py "
                "supported_kv_cache_layouts): pass kv_cache_layout",
                field="kv_cache_layout",
                found=None,
            )
        chosen = allowed[0] if allowed else "LBNHC"
    if era < forms.ERA_LAYER_VIEWS:
        _old_layout(chosen, kv_cache_layout)
    if allowed and chosen not in allowed:
        raise InvalidTensorError(
            f"{name} supports only the layouts {allowed}",
            field="kv_cache_layout",
            found=chosen,
            expected=allowed,
        )
    return chosen


def _tensors(tensor_or_pair: Any, name: str) -> tuple[BlockPagedTensor, ...]:
    if isinstance(tensor_or_pair, BlockPagedTensor):
        role = tensor_or_pair.kv_role
        if (name in forms.MLA_BACKENDS) != (role == "fused"):
            raise InvalidTensorError(
                f"{name} takes " + ("a fused tensor" if role != "fused" else "a (key, value) pair"),
                field="tensor_or_pair",
                found=role,
            )
        return (tensor_or_pair,)
    if name in forms.MLA_BACKENDS:
        raise InvalidTensorError(
            f"{name} takes one fused tensor", field="tensor_or_pair", found="a pair"
        )
    return check_pair(tensor_or_pair, "tensor_or_pair")


def _split_pages(
    tensor: BlockPagedTensor, pools: list[Array], ratio: int
) -> tuple[list[Array], Array, Array]:
    """``(pools, manager ids, seq_ptr)`` of a kernel-block allocation: each sequence in fresh
    manager blocks ``1..``, page ``i`` in kernel block ``first_s * ratio + i``; pool entry
    ``k - 1`` is kernel block ``k`` (kernel blocks ``0 .. ratio - 1``: the null block)."""
    sp = tensor.seq_ptr.astype(np.int64)
    counts = np.diff(sp)
    managers = -(-counts // ratio)
    manager_ptr = np.concatenate(([0], np.cumsum(managers))).astype(np.int64)
    total = 1 + int(manager_ptr[-1])
    slot = np.repeat((1 + manager_ptr[:-1]) * ratio - sp[:-1], counts) + np.arange(sp[-1])
    pages = tensor.block_table.astype(np.int64)
    split = []
    for pool in pools:
        new = np.zeros((total * ratio - 1, *pool.shape[1:]), pool.dtype)
        new[slot - 1] = pool[pages]
        split.append(new)
    return split, np.arange(1, total, dtype=np.int64), manager_ptr


def to_vllm(
    tensor_or_pair: BlockPagedTensor | Pair,
    *,
    backend: Any = None,
    vllm_version: str | None = None,
    kv_cache_layout: Any = None,
    isa: str | None = None,
    max_blocks: int | None = None,
    block_size: int | None = None,
) -> tuple[Array, Array, Array]:
    """``(kv_cache, block_table, seq_lens)`` as vLLM allocates them for ``backend``: a new
    cache whose block 0 is vLLM's null block (page ``p`` in block ``p + 1``), shape and
    strides as vLLM's for the era and layout, fp8 as uint8, the table int32 zero padded;
    ``block_size``: vLLM's kernel-block allocation (docs/adapters.md § vLLM)."""
    name = forms.backend_name(backend)
    era = forms.era_of(vllm_version)
    if era is None:
        raise ArgumentTypeError(
            "vLLM's allocation differs by version: pass vllm_version",
            field="vllm_version",
            found=None,
        )
    one = tensor_or_pair if isinstance(tensor_or_pair, BlockPagedTensor) else None
    single_role = one is not None and one.kv_role != "fused"
    tensors = (one,) if one is not None and single_role else _tensors(tensor_or_pair, name)
    layout = _default_layout(name, era, kv_cache_layout)
    pools = [t.unpacked_page_pool() for t in tensors]
    # vLLM stores fp8 caches as uint8 (vllm/utils/torch_utils.py)
    pools = [p.view(np.uint8) if p.dtype.name.startswith("float8") else p for p in pools]
    tensor = tensors[0]
    ratio = kernel_ratio(block_size, pools[0].shape[1], None, layout)
    if ratio > 1:
        pools, managers, manager_ptr = _split_pages(tensor, pools, ratio)
    pages, page_size, heads, dim = pools[0].shape
    forms.check_kernel_block(name, page_size, era)
    blocks = pages + 1
    order = _role_order(layout)
    shape: tuple[int, ...]
    physical: tuple[int, ...]
    # vLLM's allocation for the backend and era: (logical shape, memory order of its axes)
    if name == forms.CPU_BACKEND and (era < forms.ERA_LAYER_VIEWS or single_role):
        raise InvalidTensorError(
            "CPU_ATTN is supported for vLLM >= 0.26 and a (key, value) pair",
            field="tensor_or_pair",
            found=vllm_version,
        )
    if single_role:
        shape, physical = (blocks, page_size, heads, dim), order
    elif name in forms.MLA_BACKENDS:  # one head: [pages, page_size, 1, dim] reshapes freely
        early = era < forms.ERA_LAYER_VIEWS
        shape = (blocks, page_size, dim) if early else (blocks, 1, page_size, dim)
        physical = tuple(range(len(shape)))
    elif era >= forms.ERA_LAYER_VIEWS:  # CPU_ATTN too: its one layout, LBHNC
        shape, physical = (blocks, heads, page_size, 2 * dim), forms.LAYOUTS[layout]
    else:  # the 2 roles before or after the blocks, then [block_size, H, D] in NHD or HND
        pair = (2, blocks) if forms.stacked_axis(name, era) == 0 else (blocks, 2)
        shape, physical = (*pair, page_size, heads, dim), (0, *(1 + a for a in order))
    # zeros of the logical shape whose memory runs in vLLM's physical axis order
    memory = np.zeros(tuple(shape[a] for a in physical), pools[0].dtype)
    cache = memory.transpose([physical.index(a) for a in range(len(shape))])
    # written through the views from_vllm reads (their checks too): one route both ways
    _, views = _role_pools(cache, name, era, tensor.kv_role if single_role else None, isa)
    for (_, view), pool in zip(views, pools, strict=True):
        view[1:] = pool.view(view.dtype).reshape(pages, *view.shape[1:])
    width = None if max_blocks is None else check_int(max_blocks, "max_blocks")
    if ratio == 1:  # page p in block p + 1
        managers, manager_ptr = tensor.block_table.astype(np.int64) + 1, tensor.seq_ptr
    return cache, padded_rows(managers, manager_ptr, width), lens_of(tensor)
