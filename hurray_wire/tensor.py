"""BlockPagedTensor: ``from_arrays`` derives the descriptor from the arrays and checks them
as the blob decoder does, so a tensor that exists encodes and decodes cleanly."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hurray_wire._interop import as_numpy, is_strided_pool, is_torch, referenced_pages
from hurray_wire.dtypes import ElementType, element_type_of
from hurray_wire.errors import ArgumentTypeError, IndexBufferError, InvalidTensorError, PaddingError
from hurray_wire.fingerprint import fingerprint_from_metadata
from hurray_wire.kv_scale import check_reserved_metadata, with_kv_scale
from hurray_wire.memo import BoundedMemo, weight
from hurray_wire.metadata import encode_metadata
from hurray_wire.model import packing
from hurray_wire.model._checks import U32_MAX, U64_MAX
from hurray_wire.model.descriptor import TensorDescriptor
from hurray_wire.model.layout import (
    BlockPagedLayout,
    _as_index_array,
    check_indexes,
    check_seq_lens,
)
from hurray_wire.model.quantization import PerBlockAffine, PerChannelAffine, Quantization
from hurray_wire.tensor_core import Array, TensorCore
from hurray_wire.wire.blob import SEQ_LENS_ITEM
from hurray_wire.wire.descriptor import ZERO_POINT_ITEM
from hurray_wire.wire.fast import item_dtype

__all__ = [
    "SEQ_LENS",
    "ZERO_POINTS",
    "BlockPagedTensor",
    "assemble",
    "check_padding_bits",
    "check_seq_lens",
    "checked_indexes",
    "pool_form",
    "pool_typing",
    "typed_params",
]

#: The dtypes of zero points and seq_lens (the wire's items).
ZERO_POINTS: np.dtype[Any] = np.dtype(item_dtype(ZERO_POINT_ITEM))
SEQ_LENS: np.dtype[Any] = np.dtype(item_dtype(SEQ_LENS_ITEM))


@dataclass(frozen=True)
class _Geometry:
    """What from_arrays decided from dtypes, shapes and scalars alone (equal for equal
    keys), with the descriptors of at most ``_TOKENS_PER_GEOMETRY`` ``total_tokens``."""

    etype: ElementType
    dims: tuple[int, int, int, int]
    layout: BlockPagedLayout
    ranged: tuple[str, ...]
    descriptors: dict[tuple[type, Any], TensorDescriptor]


# Building a layout and a descriptor validates every field (~50 us): from_arrays reuses the
# ones built for an equal geometry key of arrays (and, for descriptors, total_tokens), so
# the 100+ tensors of one request validate their geometry once. Each entry weighed by the
# bytes it keeps alive (tests/test_codec_objects.py measures it).
_BUILT: BoundedMemo[_Geometry] = BoundedMemo(512, 16 << 20)
_DESCRIPTOR_BYTES = 256  # a block-paged descriptor's wire bytes, with its quantization
_TOKENS_PER_GEOMETRY = 8
#: A geometry: the key's dtypes, shapes and scalars, a layout, and its descriptors.
_GEOMETRY_WEIGHT = weight(256) + _TOKENS_PER_GEOMETRY * weight(_DESCRIPTOR_BYTES)

_ARRAY_ARGUMENTS = ("page_pool", "block_table", "seq_ptr", "seq_lens", "scales", "zero_points")


class BlockPagedTensor(TensorCore):
    """The library's tensor: ``descriptor`` and its arrays. ``page_pool`` is
    ``[num_pages, page_size, num_heads, head_dim]`` of the element dtype (packed sub-byte
    types: 1-D uint8 wire bytes); ``scales`` / ``zero_points`` flat. ``hurray_wire.Tensor``
    is the reference's raw-buffer class; ``Tensor.to_block_paged()`` converts."""

    __slots__ = ()

    @classmethod
    def from_arrays(
        cls,
        page_pool: Any,
        block_table: Any,
        seq_ptr: Any,
        *,
        seq_lens: Any = None,
        total_tokens: int | None = None,
        kv_role: str = "key",
        layer_index: int | None = None,
        quantization: Quantization | None = None,
        scales: Any = None,
        zero_points: Any = None,
        block_table_index_type: str | None = None,
        element_type: ElementType | str | None = None,
        metadata: Mapping[str, Any] | None = None,
        alignment: int = 64,
        kv_scale: float | None = None,
    ) -> BlockPagedTensor:
        """Build a tensor from NumPy arrays, torch tensors or index lists, deriving its
        descriptor, the caller's arrays never modified: a C-contiguous host pool is shared; of
        a strided or device pool only the referenced pages are gathered (as ``compact()``).

        ``total_tokens`` defaults to ``sum(seq_lens)``, else the block table's capacity;
        ``kv_scale`` (an fp8 scalar) goes to the role's reserved metadata key."""
        if is_strided_pool(page_pool) if type(page_pool) is np.ndarray else is_torch(page_pool):
            page_pool, block_table, scales, zero_points = referenced_pages(
                page_pool, block_table, isinstance(quantization, PerBlockAffine), scales,
                zero_points)  # fmt: skip
        plain = type(page_pool) is np.ndarray and type(block_table) is np.ndarray
        plain = plain and type(seq_ptr) is np.ndarray and scales is None and zero_points is None
        if not (plain and (seq_lens is None or type(seq_lens) is np.ndarray)):
            arrays = (page_pool, block_table, seq_ptr, seq_lens, scales, zero_points)
            if any(type(a) is not np.ndarray and is_torch(a) for a in arrays):
                page_pool, block_table, seq_ptr, seq_lens, scales, zero_points = (
                    as_numpy(a, n) for a, n in zip(arrays, _ARRAY_ARGUMENTS, strict=True)
                )
        pool = page_pool if type(page_pool) is np.ndarray else _pool_array(page_pool, element_type)
        bt_any = _as_index_array(block_table, "block_table", U64_MAX)
        sp_any = _as_index_array(seq_ptr, "seq_ptr", U64_MAX)
        # All that the checks below decide from but the values: the arrays' dtypes and shapes
        # and the scalar arguments with their types (True is not 1, np.int64(3) is not 3).
        key: tuple[Any, ...] | None = (
            pool.dtype, pool.shape, bt_any.dtype, bt_any.shape, sp_any.dtype, sp_any.shape,
            element_type, kv_role, layer_index, block_table_index_type, quantization, alignment,
            type(element_type), type(kv_role), type(layer_index), type(block_table_index_type),
            type(quantization), type(alignment),
        )  # fmt: skip
        try:
            known = _BUILT.get(key)
        except TypeError:  # an unhashable argument: judged below, nothing memoised
            key = known = None
        geometry = known or _geometry(pool, bt_any, sp_any, element_type, kv_role, layer_index,
                                      block_table_index_type)  # fmt: skip
        etype, layout = geometry.etype, geometry.layout
        num_pages, page_size, num_heads, head_dim = geometry.dims
        stored_pool = packing.pack(pool, etype) if etype.is_packed else np.ascontiguousarray(pool)
        for name in geometry.ranged:
            arr = bt_any if name == "block_table" else sp_any
            if arr.size and int(arr.max()) > layout.index_max:
                raise IndexBufferError(
                    f"values do not fit {layout.block_table_index_type}",
                    field=name,
                    found=int(arr.max()),
                )
        index_dtype = layout.index_dtype
        bt = np.ascontiguousarray(bt_any, dtype=index_dtype)
        sp = np.ascontiguousarray(sp_any, dtype=index_dtype)
        lens = None
        if seq_lens is not None:
            lens = np.ascontiguousarray(_as_index_array(seq_lens, "seq_lens", U64_MAX), SEQ_LENS)
            if total_tokens is None:  # uint64 arithmetic, as lens.sum(); a list is faster
                total_tokens = sum(lens.tolist()) % (1 << 64) if lens.size < 64 else int(lens.sum())
        if total_tokens is None:
            total_tokens = len(bt) * page_size
        check_indexes(sp, bt, num_pages, layout.num_seqs, lens, page_size, total_tokens)
        tokens_key = (type(total_tokens), total_tokens)
        descriptor = geometry.descriptors.get(tokens_key)
        if descriptor is None:
            descriptor = TensorDescriptor.block_paged(
                layout,
                (total_tokens, num_heads, head_dim),
                etype,
                num_logical_pages=len(bt),
                quantization=quantization,
                alignment=alignment,
            )
        scale_arr = zp_arr = None
        if quantization is not None or scales is not None or zero_points is not None:
            scale_arr, zp_arr = _quantization_arrays(descriptor, scales, zero_points)
        meta = {}
        if metadata or kv_scale is not None:
            meta = with_kv_scale(dict(metadata or {}), kv_scale, layout.kv_role)
        if meta:
            check_reserved_metadata(meta, layout.kv_role)
            fingerprint_from_metadata(meta)  # a malformed hurray.engine_fingerprint: refused
            encode_metadata(meta)  # refuse now what could not be encoded later
        if key is not None:  # every check passed: remember what the geometry decided
            if known is None:
                _BUILT.put(key, geometry, _GEOMETRY_WEIGHT)
            if tokens_key not in geometry.descriptors:
                if len(geometry.descriptors) >= _TOKENS_PER_GEOMETRY:
                    geometry.descriptors.clear()  # its weight counts this many, never more
                geometry.descriptors[tokens_key] = descriptor
        return cls._trusted(descriptor, stored_pool, bt, sp, scale_arr, zp_arr, lens, meta)

    def sequence(self, seq: int, *, dequantize: bool = False) -> Array:
        """Tokens of ``seq`` as ``[tokens, num_heads, head_dim]`` (needs ``seq_lens``)."""
        from hurray_wire.transforms.select import sequence

        return sequence(self, seq, dequantize=dequantize)

    def sequences(self, *, dequantize: bool = False) -> list[Array]:
        """Every sequence's tokens, one vectorised gather."""
        from hurray_wire.transforms.select import sequences

        return sequences(self, dequantize=dequantize)

    def select(self, seq_ids: Any) -> BlockPagedTensor:
        """A tensor of the sequences ``seq_ids`` (in that order) over the same pool."""
        from hurray_wire.transforms.select import select

        return select(self, seq_ids)

    def dequantize(self, dtype: Any = np.float32) -> Array:
        """The pool ``[num_pages, page_size, num_heads, head_dim]`` in real values."""
        from hurray_wire.transforms.select import dequantize

        return dequantize(self, dtype)

    def compact(self) -> BlockPagedTensor:
        """Only the referenced pages, renumbered in first-reference order."""
        from hurray_wire.transforms.compact import compact

        return compact(self)

    def prefix_sharing(self) -> dict[int, tuple[int, ...]]:
        """Physical pages named by 2+ block-table entries -> the sequences naming them."""
        from hurray_wire.transforms.compact import prefix_sharing

        return prefix_sharing(self)

    def repage(self, page_size: int) -> BlockPagedTensor:
        """The same tokens per sequence on pages of ``page_size`` tokens."""
        from hurray_wire.transforms.repage import repage

        return repage(self, page_size)

    def split_heads(self, n: int) -> list[BlockPagedTensor]:
        """One tensor per tensor-parallel rank (see ``hurray_wire.transforms.heads``)."""
        from hurray_wire.transforms.heads import split_heads

        return split_heads(self, n)


def assemble(
    descriptor: TensorDescriptor,
    buffers: Sequence[Array],
    seq_lens: Array | None = None,
    metadata: dict[str, Any] | None = None,
    *,
    pool_later: bool = False,
    typing: tuple[tuple[int, ...], np.dtype[Any]] | None = None,
) -> BlockPagedTensor:
    """Every decoder's one assembly: type a decoded descriptor's raw buffers (1-D uint8, in
    table order, sizes matched), check the index invariants and seq_lens, build the tensor.
    ``pool_later``: buffer 0 lands after this (and its padding bits are checked then)."""
    etype = descriptor.element_type
    pool = buffers[0]
    if typing is not None or not etype.is_packed:
        shape, dtype = typing or pool_typing(descriptor)
        try:
            pool = np.ndarray(shape, dtype, pool)
        except (ValueError, TypeError):  # e.g. a zero-size pool of pages NumPy cannot shape
            raise InvalidTensorError(
                "page_pool shape cannot be represented as a NumPy array",
                field="page_pool",
                found=f"shape {list(shape)}",
            ) from None
    elif not pool_later:
        check_padding_bits(descriptor, pool)
    block_table, seq_ptr = checked_indexes(descriptor, buffers, seq_lens, metadata)
    scales = zero_points = None
    if descriptor.quantization is not None:
        scales, zero_points = typed_params(descriptor, buffers)
    return BlockPagedTensor._trusted(
        descriptor, pool, block_table, seq_ptr, scales, zero_points, seq_lens, metadata
    )


def check_padding_bits(descriptor: TensorDescriptor, pool: Array) -> None:
    """The padding bits of a packed pool (1-D uint8) are zero: O(1), only the last byte
    (or 3-byte group) holds any."""
    etype = descriptor.element_type
    bad = packing.first_padding_bit_byte(pool, etype, descriptor.pool_elements)
    if bad is not None:
        raise PaddingError(
            f"padding bits of the packed {etype.name} page pool must be zero "
            f"(byte {bad} of the pool)",
            field="page_pool",
            offset=bad,
            found=f"0x{int(pool[bad]):02X}",
        )


def checked_indexes(
    descriptor: TensorDescriptor,
    buffers: Sequence[Array],
    seq_lens: Array | None,
    metadata: dict[str, Any] | None,
) -> tuple[Array, Array]:
    """The block table and seq_ptr typed from their buffers, with every rule of their
    contents checked (index invariants, seq_lens, reserved metadata): what every decoder's
    assembly checks, wherever it puts the pool (``assemble``, the in-place decode)."""
    layout = descriptor.layout
    index_dtype = layout.index_dtype
    block_table = buffers[1].view(index_dtype)
    seq_ptr = buffers[2].view(index_dtype)
    check_indexes(seq_ptr, block_table, layout.num_pages, layout.num_seqs, seq_lens,
                  layout.page_size, descriptor.shape[0])  # fmt: skip
    if metadata:
        check_reserved_metadata(metadata, layout.kv_role)
    return block_table, seq_ptr


def typed_params(
    descriptor: TensorDescriptor, buffers: Sequence[Array]
) -> tuple[Array | None, Array | None]:
    """An affine quantization's scales and zero points typed from their buffers (one
    buffer holds ``[scales | zero_points]`` when both indexes agree); (None, None) else."""
    quant = descriptor.quantization
    if not isinstance(quant, (PerChannelAffine, PerBlockAffine)):
        return None, None
    scale_dtype = quant.scale_type.numpy_dtype
    payload = buffers[quant.scale_buffer_index]
    zp = quant.zero_point_buffer_index
    if zp == quant.scale_buffer_index:  # one buffer: [scales | zero_points]
        width = scale_dtype.itemsize + ZERO_POINTS.itemsize
        split = payload.nbytes // width * scale_dtype.itemsize
        return payload[:split].view(scale_dtype), payload[split:].view(ZERO_POINTS)
    return payload.view(scale_dtype), None if zp is None else buffers[zp].view(ZERO_POINTS)


def pool_typing(descriptor: TensorDescriptor) -> tuple[tuple[int, ...], np.dtype[Any]]:
    """The pool's shape and dtype for an unpacked element type, checked (a decoder's plan
    holds it, so a known header does not work it out again)."""
    layout, etype = descriptor.layout, descriptor.element_type
    page_bytes = layout.page_size * descriptor.shape[1] * descriptor.shape[2] * etype.itemsize
    if page_bytes >= 2**63:  # NumPy cannot even shape an empty pool of such pages
        raise InvalidTensorError(
            "one page of the pool would exceed 2**63 bytes",
            field="page_pool",
            found=f"page_size {layout.page_size} x shape {list(descriptor.shape[1:])}",
        )
    shape = (layout.num_pages, layout.page_size, descriptor.shape[1], descriptor.shape[2])
    return shape, etype.numpy_dtype


def _geometry(
    pool: Array,
    block_table: Array,
    seq_ptr: Array,
    element_type: ElementType | str | None,
    kv_role: str,
    layer_index: int | None,
    block_table_index_type: str | None,
) -> _Geometry:
    """What ``from_arrays`` decides from dtypes, shapes and scalars alone, checked."""
    etype = element_type_of(element_type if element_type is not None else pool.dtype)
    if pool.ndim != 4:
        raise InvalidTensorError(
            "page_pool must be 4-D [num_pages, page_size, num_heads, head_dim]",
            field="page_pool",
            found=f"shape {pool.shape}",
        )
    if pool.dtype != etype.numpy_dtype:
        raise InvalidTensorError(
            "page_pool dtype does not match the element type",
            field="page_pool",
            found=str(pool.dtype),
            expected=str(etype.numpy_dtype),
        )
    num_pages, page_size, num_heads, head_dim = (int(d) for d in pool.shape)
    if len(seq_ptr) < 1:
        raise IndexBufferError("seq_ptr needs num_seqs + 1 >= 1 entries", field="seq_ptr")
    if block_table_index_type is None:
        big = num_pages > U32_MAX or len(block_table) > U32_MAX
        block_table_index_type = "uint64" if big else "uint32"
    layout = BlockPagedLayout(page_size, num_pages, 0, len(seq_ptr) - 1, kv_role, layer_index,
                              block_table_index_type)  # fmt: skip
    index_dtype = layout.index_dtype
    ranged = tuple(
        name
        for name, arr in (("block_table", block_table), ("seq_ptr", seq_ptr))
        if arr.dtype.itemsize > index_dtype.itemsize or arr.dtype.kind != "u"
    )  # the others are unsigned and no wider than the index type: every value fits
    return _Geometry(etype, (num_pages, page_size, num_heads, head_dim), layout, ranged, {})


def _pool_array(page_pool: Any, element_type: ElementType | str | None) -> Array:
    """``page_pool`` as an array. A list or tuple has no dtype: NumPy would guess one (int64
    or float64) and the tensor would silently get an element type nobody chose, so nested
    sequences need ``element_type`` and are then converted to it."""
    if not isinstance(page_pool, (list, tuple)):
        return np.asarray(page_pool)
    if element_type is None:
        raise ArgumentTypeError(
            "page_pool given as a nested list/tuple has no element type; pass a NumPy array "
            "or element_type= (NumPy would otherwise guess int64 or float64)",
            field="page_pool",
            found=type(page_pool).__name__,
            expected="a NumPy array, or element_type=...",
        )
    dtype = element_type_of(element_type).numpy_dtype
    try:
        return np.asarray(page_pool, dtype=dtype)
    except (ValueError, TypeError, OverflowError) as exc:
        raise InvalidTensorError(
            f"page_pool cannot be converted to {dtype} ({exc})",
            field="page_pool",
            found=type(page_pool).__name__,
        ) from None


def _quantization_arrays(
    descriptor: TensorDescriptor, scales: Any, zero_points: Any
) -> tuple[Array | None, Array | None]:
    """Check and convert scales / zero points against the descriptor's quantization."""
    quant = descriptor.quantization
    if not isinstance(quant, (PerChannelAffine, PerBlockAffine)):
        if scales is not None or zero_points is not None:
            raise InvalidTensorError(
                "scales / zero_points given but the quantization has no parameter buffers",
                field="scales",
            )
        return None, None
    per_slot = isinstance(quant, PerBlockAffine)
    entries = descriptor.layout.page_slots if per_slot else descriptor.shape[quant.axis]
    scale_arr = _param_array(scales, "scales", entries, quant.scale_type.numpy_dtype)
    zp_arr = None
    if quant.zero_point_buffer_index is not None:
        zp_arr = _param_array(zero_points, "zero_points", entries, ZERO_POINTS)
    elif zero_points is not None:
        raise InvalidTensorError("a symmetric scheme has no zero points", field="zero_points")
    return scale_arr, zp_arr


def _param_array(value: Any, name: str, entries: int, dtype: np.dtype[Any]) -> Array:
    if value is None:
        raise InvalidTensorError(f"the quantization needs {name}", field=name)
    array = np.asarray(value)
    if array.size != entries:
        raise InvalidTensorError(
            f"{name} needs one entry per page slot / channel",
            field=name,
            found=array.size,
            expected=entries,
        )
    if array.dtype != dtype:
        raise InvalidTensorError(
            f"{name} has the wrong dtype", field=name, found=str(array.dtype), expected=str(dtype)
        )
    return np.ascontiguousarray(array).reshape(-1)


def pool_form(descriptor: TensorDescriptor) -> tuple[tuple[int, ...], np.dtype[Any]]:
    """The shape and dtype of the tensor's ``page_pool`` array: a packed element type's
    pool is its wire bytes, 1-D uint8."""
    if descriptor.element_type.is_packed:
        return (descriptor.buffers[0].byte_size,), np.dtype(np.uint8)
    return pool_typing(descriptor)
