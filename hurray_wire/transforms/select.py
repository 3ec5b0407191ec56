"""Reading the pool: sequences, a subset of the batch, and real values by the spec's formulas:
``x = scale * (q - zero_point)`` (integer subtraction, float32 multiply), per channel along
heads or head_dim, per block one per page slot (block-paged.md § 7); unquantized fp8 with
``kv_scale``: ``float32(q) * kv_scale``.
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np

from hurray_wire.errors import ArgumentTypeError, InvalidTensorError, flag
from hurray_wire.model.quantization import PerBlockAffine, PerChannelAffine, PerTensorAffine
from hurray_wire.tensor_core import TensorCore, TensorT, check_int
from hurray_wire.transforms._common import (
    Array,
    check_tensor,
    flat_pool,
    rebuild,
    token_counts,
    token_slots,
)

__all__ = ["dequantize", "dequantize_slots", "select", "sequence", "sequences"]

_F32 = np.dtype(np.float32)


def _values(tensor: TensorCore, slots: Array, dequantize: bool) -> Array:
    values = flat_pool(tensor)[slots]
    return (
        dequantize_slots(tensor, values, slots, _F32) if flag(dequantize, "dequantize") else values
    )


def sequence(tensor: TensorCore, seq: object, *, dequantize: bool = False) -> Array:
    """Tokens of one sequence, ``[seq_lens[seq], num_heads, head_dim]`` (a new array)."""
    index = check_int(seq, "seq", 0, check_tensor(tensor).num_seqs - 1)
    lens = token_counts(tensor, "sequence()")
    page_size = tensor.layout.page_size
    pages = tensor.sequence_pages(index).astype(np.int64)
    t = np.arange(int(lens[index]), dtype=np.int64)
    return _values(tensor, pages[t // page_size] * page_size + t % page_size, dequantize)


def sequences(tensor: TensorCore, *, dequantize: bool = False) -> list[Array]:
    """Every sequence's tokens: one gather of the whole batch, split per sequence."""
    lens = token_counts(check_tensor(tensor), "sequences()")
    values = _values(tensor, token_slots(tensor, lens), dequantize)
    return np.split(values, np.cumsum(lens)[:-1]) if len(lens) else []


def select(tensor: TensorT, seq_ids: Any) -> TensorT:
    """The sequences ``seq_ids`` (in the given order; repeats allowed) over the same pool
    and parameters: only block_table, seq_ptr and seq_lens change."""
    check_tensor(tensor)
    if isinstance(seq_ids, (str, bytes, int, np.integer)) or not hasattr(seq_ids, "__len__"):
        raise ArgumentTypeError(
            "seq_ids must be a sequence of ints", field="seq_ids", found=repr(seq_ids)
        )
    if isinstance(seq_ids, (list, tuple)):
        for s in seq_ids:
            if isinstance(s, (bool, np.bool_)) or not isinstance(s, (int, np.integer)):
                raise ArgumentTypeError("seq_ids must hold ints", field="seq_ids", found=repr(s))
    ids = np.asarray(seq_ids)
    ids = ids if ids.size else np.zeros(0, np.int64)  # an empty one of any shape: none
    if ids.ndim != 1 or ids.dtype.kind not in "iu":
        raise ArgumentTypeError(
            "seq_ids must be a 1-D sequence of ints",
            field="seq_ids",
            found=f"dtype {ids.dtype}, shape {ids.shape}",
        )
    bad = (ids < 0) | (ids >= tensor.num_seqs)
    if bad.any():
        position = int(np.argmax(bad))
        raise InvalidTensorError(
            f"sequence id at position {position} out of range",
            field="seq_ids",
            found=int(ids[position]),
            expected=f"0..{tensor.num_seqs - 1}",
        )
    ids = ids.astype(np.int64)
    sp = tensor.seq_ptr.astype(np.int64)
    counts = sp[ids + 1] - sp[ids]
    new_sp = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
    entries = np.repeat(sp[ids] - new_sp[:-1], counts) + np.arange(int(new_sp[-1]))
    lens = None if tensor.seq_lens is None else tensor.seq_lens[ids]
    return rebuild(
        tensor,
        page_pool=tensor.unpacked_page_pool(),
        block_table=tensor.block_table[entries],
        seq_ptr=new_sp,
        seq_lens=lens,
    )


def dequantize(tensor: TensorCore, dtype: Any = np.float32) -> Array:
    """The whole pool ``[num_pages, page_size, num_heads, head_dim]`` in ``dtype``."""
    out: np.dtype[Any] | None = None
    if dtype is not None:  # NumPy would read None as float64: say what is meant instead
        with contextlib.suppress(TypeError):
            out = np.dtype(dtype)
    if out is None or out.kind != "f":
        found = repr(dtype) if out is None else str(out)
        raise ArgumentTypeError("dtype must be a NumPy floating dtype", field="dtype", found=found)
    pool = check_tensor(tensor).unpacked_page_pool()
    layout = tensor.layout
    slots = np.arange(layout.page_slots, dtype=np.int64).reshape(layout.num_pages, -1)
    return dequantize_slots(tensor, pool, slots, out)


def dequantize_slots(
    tensor: TensorCore, values: Array, slots: Array, dtype: np.dtype[Any]
) -> Array:
    """Dequantize ``values`` (``slots.shape + [heads, head_dim]``) read from ``slots``."""
    if values.dtype.kind == "c":
        raise InvalidTensorError(
            "complex tensors have no real dequantized form", field="element_type"
        )
    quant = tensor.quantization
    if quant is None:
        real = values.astype(_F32)
        scale = tensor.kv_scale
        if scale is not None:
            real *= np.float32(scale)
    elif isinstance(quant, PerTensorAffine):
        shifted = values.astype(np.int64) - quant.zero_point
        real = shifted.astype(_F32) * np.float32(quant.scale)
    elif isinstance(quant, PerChannelAffine):
        assert tensor.scales is not None
        shape = (-1, 1) if quant.axis == 1 else (-1,)  # broadcast over [..., heads, head_dim]
        scales = tensor.scales.astype(_F32).reshape(shape)
        shifted = values.astype(np.int64)
        if tensor.zero_points is not None:
            shifted = shifted - tensor.zero_points.astype(np.int64).reshape(shape)
        real = shifted.astype(_F32) * scales
    elif isinstance(quant, PerBlockAffine):
        assert tensor.scales is not None
        scales = tensor.scales.astype(_F32)[slots][..., None, None]
        shifted = values.astype(np.int64)
        if tensor.zero_points is not None:
            shifted = shifted - tensor.zero_points.astype(np.int64)[slots][..., None, None]
        real = shifted.astype(_F32) * scales
    else:  # NF4 / MXFP never reach a block-paged tensor ([A11])
        raise InvalidTensorError("no dequantization for this scheme", field="quantization")
    return real.astype(dtype, copy=False)
