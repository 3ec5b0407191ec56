"""Reading sequences out of the pool and selecting a subset of the batch."""

from __future__ import annotations

from typing import Any

import numpy as np

from hurray_wire.errors import ArgumentTypeError, InvalidTensorError
from hurray_wire.tensor_core import TensorCore, TensorT, check_int
from hurray_wire.transforms._common import (
    Array,
    check_tensor,
    flat_pool,
    rebuild,
    token_counts,
    token_slots,
)

__all__ = ["select", "sequence", "sequences"]


def _values(tensor: TensorCore, slots: Array, dequantize: bool) -> Array:
    if not isinstance(dequantize, bool):
        raise ArgumentTypeError(
            "dequantize must be a bool", field="dequantize", found=repr(dequantize)
        )
    values = flat_pool(tensor)[slots]
    if dequantize:
        from hurray_wire.transforms.dequantize import dequantize_slots

        return dequantize_slots(tensor, values, slots, np.dtype(np.float32))
    return values


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
