"""Hypothesis strategies of valid block-paged descriptors, shipped (as zarr's are) for
users' property tests; imports ``hypothesis`` (``hurray-wire[test]``). Each descriptor is
built by the model (``TensorDescriptor.block_paged``), so a failure to build is the
model's bug; sizes stay small but ``num_pages``, which is only a number, is sometimes huge.
"""

from __future__ import annotations

import dataclasses
import functools

from hypothesis import strategies as st

from hurray_wire import dtypes
from hurray_wire.dtypes import ElementType
from hurray_wire.model.descriptor import BufferHandle, Statistics, TensorDescriptor
from hurray_wire.model.layout import INDEX_TYPE_NAMES, KV_ROLE_NAMES, BlockPagedLayout
from hurray_wire.model.quantization import (
    PerBlockAffine,
    PerChannelAffine,
    PerTensorAffine,
    Quantization,
)

__all__ = [
    "block_paged_descriptors",
    "block_paged_layouts",
    "buffer_placements",
    "element_types",
    "layer_indices",
    "per_block_affine",
    "per_channel_affine",
    "per_tensor_affine",
    "statistics",
]

U32_MAX = 0xFFFFFFFF

# Storage types each scheme admits (descriptor.md § 8; per-block affine: no float8, [A12]).
AFFINE_STORAGE: tuple[ElementType, ...] = (
    dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32, dtypes.uint32,
    dtypes.int4, dtypes.uint4, dtypes.int2, dtypes.uint2,
)  # fmt: skip
PER_BLOCK_STORAGE: tuple[ElementType, ...] = (
    dtypes.int8, dtypes.uint8, dtypes.int4, dtypes.uint4, dtypes.int2, dtypes.uint2,
)  # fmt: skip
PER_BLOCK_SCALE_TYPES: tuple[ElementType, ...] = (dtypes.float16, dtypes.bfloat16, dtypes.float32)

# Valid (device, memory class) pairs (descriptor.md § 7.1): device tag -> memory classes.
_STANDARD_DEVICES = (0x00, 0x03, 0x06, 0x08)  # CPU, Metal, Hexagon, OpenCL
_PEER_DEVICES = (0x01, 0x02, 0x04, 0x07)  # CUDA, ROCm, Vulkan, Level Zero
_WEBGPU = 0x05


def element_types() -> st.SearchStrategy[ElementType]:
    """Any of the 26 element types (an unquantized block-paged pool may hold any of them)."""
    return _ELEMENT_TYPES


def layer_indices() -> st.SearchStrategy[int | None]:
    """None (wire 0xFFFFFFFF), the edge layers 0 and 0xFFFFFFFE, or any layer in between."""
    return _LAYERS


@st.composite
def block_paged_layouts(
    draw: st.DrawFn,
    *,
    page_sizes: st.SearchStrategy[int] | None = None,
    num_seqs: st.SearchStrategy[int] | None = None,
    huge_pools: bool = True,
) -> BlockPagedLayout:
    """Valid ``BlockPagedLayout`` values; uint64 indices when the pool needs them."""
    index_type = draw(_INDEX_TYPES)
    num_pages = draw(_SMALL_POOLS)
    if huge_pools and draw(_RARELY):
        num_pages = draw(_HUGE_POOLS[index_type])
    return BlockPagedLayout(
        page_size=draw(_PAGE_SIZES if page_sizes is None else page_sizes),
        num_pages=num_pages,
        paged_axis=0,
        num_seqs=draw(_NUM_SEQS if num_seqs is None else num_seqs),
        kv_role=draw(_KV_ROLES),
        layer_index=draw(_LAYERS),
        block_table_index_type=index_type,
    )


@functools.cache
def per_tensor_affine(storage: ElementType) -> st.SearchStrategy[PerTensorAffine]:
    """A finite non-zero f32 scale and an int32 zero point inside ``storage``'s range."""
    bits, signed = storage.bit_width, not storage.name.startswith("u")
    low = -(2 ** (bits - 1)) if signed else 0
    high = min(2 ** (bits - signed) - 1, 2**31 - 1)  # the wire field is i32 (not 2**32-1)
    return st.builds(
        PerTensorAffine,
        scale=_F32_SCALES,
        zero_point=st.integers(min_value=low, max_value=high),
        scheme_version=_SCHEME_VERSIONS,
    )


def per_channel_affine() -> st.SearchStrategy[PerChannelAffine]:
    """Axis 1 (heads) or 2 (head_dim); symmetric, separate zero points, or one shared buffer."""
    return _PER_CHANNEL


@functools.cache
def per_block_affine(page_size: int) -> st.SearchStrategy[PerBlockAffine]:
    """Axis 0, block_size == page_size, f16/bf16/f32 scales, symmetric or not, shared or not."""
    return st.builds(
        PerBlockAffine,
        axis=st.just(0),
        block_size=st.just(page_size),
        scale_buffer_index=st.just(3),
        scale_type=st.sampled_from(PER_BLOCK_SCALE_TYPES),
        zero_point_buffer_index=_ZERO_POINT_INDICES,
        scheme_version=_SCHEME_VERSIONS,
    )


def statistics() -> st.SearchStrategy[Statistics]:
    """Any statistics section: it is advisory, so every float (NaN included) is valid."""
    return _STATISTICS


@st.composite
def buffer_placements(draw: st.DrawFn) -> tuple[int, int, tuple[int, ...]]:
    """A valid (device_tag, memory_class, sync modes to pick from) for a tensor's buffers
    (sync_mode may differ between handles, but for the CPU's 0)."""
    device, memory = draw(_PLACEMENTS)
    if device == _PRIVATE:
        device = draw(_PRIVATE_TAGS)
        memory = draw(_PRIVATE_MEMORY)
    syncs = (0,) if device == 0 else (0, 1, 2)
    return device, memory, syncs


@st.composite
def _handles(draw: st.DrawFn, sizes: tuple[int, ...]) -> tuple[BufferHandle, ...]:
    """One handle per size, colocated, each with its own alignment and sync mode."""
    device, memory, syncs = draw(buffer_placements())
    handles = []
    for size in sizes:
        exponent = draw(_ALIGNMENT_EXPONENTS)
        if size and exponent < 6:  # a non-empty buffer needs alignment >= 64
            exponent += 6
        sync = syncs[draw(_SYNC_PICK) % len(syncs)]
        handles.append(BufferHandle(size, 1 << exponent, device, sync, memory))
    return tuple(handles)


@functools.cache
def _quantizations(element_type: ElementType, page_size: int) -> st.SearchStrategy[Quantization]:
    """Every scheme the element type and page size admit on block-paged."""
    options: list[st.SearchStrategy[Quantization]] = []
    if element_type in AFFINE_STORAGE:
        options += [per_tensor_affine(element_type), _PER_CHANNEL]
    if element_type in PER_BLOCK_STORAGE and page_size >= 2 and page_size & (page_size - 1) == 0:
        options.append(per_block_affine(page_size))
    return st.one_of(options)


@st.composite
def block_paged_descriptors(draw: st.DrawFn) -> TensorDescriptor:
    """Random valid block-paged ``TensorDescriptor`` objects covering every optional part:
    quantizations with writer padding, statistics, composite member, 1.x trailing bytes,
    the empty batch, huge pools, every device / memory class / sync mode."""
    quantized = draw(_QUANTIZED)
    if quantized == "per_block":
        layout = draw(_PER_BLOCK_LAYOUTS)
        element_type = draw(_PER_BLOCK_STORAGE)
    elif quantized == "any":
        layout = draw(_ANY_LAYOUTS)
        element_type = draw(_AFFINE_STORAGE)
    else:
        layout = draw(_ANY_LAYOUTS)
        element_type = draw(_ELEMENT_TYPES)
    quantization = (
        None if quantized == "none" else draw(_quantizations(element_type, layout.page_size))
    )
    num_heads = draw(_NUM_HEADS)
    head_dim = draw(_HEAD_DIM)
    if layout.num_seqs == 0:
        logical_pages, total_tokens = 0, 0
    else:  # dependent bounds by modulo: no new strategy object per example (fast)
        logical_pages = draw(_SMALL_INTS) % (3 * layout.num_seqs + 1)
        total_tokens = draw(_SMALL_INTS) % (logical_pages * layout.page_size + 1)
    provisional = TensorDescriptor.block_paged(
        layout,
        (total_tokens, num_heads, head_dim),
        element_type,
        num_logical_pages=logical_pages,
        quantization=quantization,
        statistics=draw(_MAYBE_STATISTICS),
    )
    sizes = tuple(handle.byte_size for handle in provisional.buffers)
    minor = draw(_MINORS)
    return dataclasses.replace(
        provisional,
        buffers=draw(_handles(sizes)),
        version=(1, minor),
        composite_member=draw(_MEMBER_ROLES),
        quantization_padding=draw(_PADDING) if quantization is not None else b"",
        unknown_trailing=draw(_TRAILING) if minor else b"",
    )


# Strategies are built once: constructing (and validating) them per example would cost
# more than drawing from them.
_PRIVATE = -1
_ELEMENT_TYPES = st.sampled_from(dtypes.ELEMENT_TYPES)
_AFFINE_STORAGE = st.sampled_from(AFFINE_STORAGE)
_PER_BLOCK_STORAGE = st.sampled_from(PER_BLOCK_STORAGE)
_LAYERS: st.SearchStrategy[int | None] = st.one_of(
    st.sampled_from([None, 0, 0xFFFFFFFE]), st.integers(min_value=0, max_value=0xFFFFFFFE)
)
_PAGE_SIZES = st.integers(min_value=1, max_value=64)
_NUM_SEQS = st.integers(min_value=0, max_value=6)
_INDEX_TYPES = st.sampled_from(INDEX_TYPE_NAMES)
_KV_ROLES = st.sampled_from(KV_ROLE_NAMES)
_SMALL_POOLS = st.integers(min_value=0, max_value=12)
_HUGE_POOLS = {
    "uint32": st.integers(min_value=0, max_value=U32_MAX),
    "uint64": st.integers(min_value=0, max_value=2**33),
}
_RARELY = st.sampled_from([False, False, False, True])
_SCHEME_VERSIONS = st.sampled_from([1, 1, 1, 0])  # 0 is accepted on read and kept ([A28])
_F32_SCALES = st.floats(width=32, allow_nan=False, allow_infinity=False).filter(bool)
_ZERO_POINT_INDICES = st.sampled_from([None, 3, 4])  # symmetric, shared buffer, own buffer
_PER_CHANNEL = st.builds(
    PerChannelAffine,
    axis=st.sampled_from([1, 2]),
    scale_buffer_index=st.just(3),
    zero_point_buffer_index=_ZERO_POINT_INDICES,
    scheme_version=_SCHEME_VERSIONS,
)
_FLOATS = st.floats(allow_nan=True, allow_infinity=True)
_U8 = st.integers(min_value=0, max_value=0xFF)
_BIT = st.integers(min_value=0, max_value=1)
_STATISTICS = st.builds(
    Statistics,
    computed_mask=st.integers(min_value=0, max_value=0x3F),
    nnz=st.integers(min_value=0, max_value=2**64 - 1),
    sparsity_ratio=_FLOATS,
    value_min=_FLOATS,
    value_max=_FLOATS,
    value_abs_max=_FLOATS,
    value_mean=_FLOATS,
    value_stddev=_FLOATS,
    nm_n=_U8,
    nm_m=_U8,
    has_nan=_BIT,
    has_inf=_BIT,
)
_MAYBE_STATISTICS = st.one_of(st.none(), _STATISTICS)
_PLACEMENTS = st.sampled_from(
    [(device, memory) for device in _STANDARD_DEVICES for memory in (0, 1, 2)]
    + [(device, memory) for device in _PEER_DEVICES for memory in (0, 1, 2, 3)]
    + [(_WEBGPU, 0)] * 3
    + [(_PRIVATE, 0)] * 8
)
_PRIVATE_TAGS = st.integers(min_value=0xF0, max_value=0xFE)
_PRIVATE_MEMORY = st.one_of(st.just(0), st.integers(min_value=0xF0, max_value=0xFE))
_ALIGNMENT_EXPONENTS = st.integers(min_value=0, max_value=16)
_SYNC_PICK = st.integers(min_value=0, max_value=2)
_QUANTIZED = st.sampled_from(["none", "any", "per_block"])
_PER_BLOCK_LAYOUTS = block_paged_layouts(page_sizes=st.sampled_from([2, 4, 8, 16, 32, 64]))
_ANY_LAYOUTS = block_paged_layouts()
_NUM_HEADS = st.integers(min_value=0, max_value=8)
_HEAD_DIM = st.integers(min_value=0, max_value=16)
_SMALL_INTS = st.integers(min_value=0, max_value=2**16)
_MINORS = st.sampled_from([0, 0, 0, 1, 2, 0xFF])
_MEMBER_ROLES = st.sampled_from([None, None, 0, 1])
_PADDING = st.binary(max_size=8)
_TRAILING = st.binary(max_size=12)
