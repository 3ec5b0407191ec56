"""Shared pieces of the transforms: argument checks, token -> slot maps, rebuilding."""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from hurray_wire.errors import ArgumentTypeError, InvalidTensorError
from hurray_wire.fingerprint import fingerprint_from_metadata, fingerprint_to_metadata
from hurray_wire.tensor_core import TensorCore, TensorT, check_int as check_int

Array = npt.NDArray[Any]
#: What ``rebuild`` keeps of a tensor unless told otherwise (``from_arrays``'s arguments).
_KEPT = ("block_table", "seq_ptr", "seq_lens", "scales", "zero_points", "quantization", "metadata")
_V = TypeVar("_V")


def with_fingerprint(tensor: TensorCore, **changes: Any) -> dict[str, Any]:
    """``tensor``'s metadata with its engine fingerprint's fields changed (``block_size``
    after repage, ``tp_rank`` / ``tp_size`` after a head split or merge), so that the
    fingerprint keeps describing the tensor; unchanged when it carries none."""
    metadata = dict(tensor.metadata)
    fp = fingerprint_from_metadata(metadata)
    if fp is not None:
        metadata.update(fingerprint_to_metadata(dataclasses.replace(fp, **changes)))
    return metadata


def check_tensor(value: _V, name: str = "tensor") -> _V:
    """The transforms' tensor argument: a ``BlockPagedTensor`` (``compact("x")`` is an
    ``ArgumentTypeError``, not an ``AttributeError`` from inside)."""
    if not isinstance(value, TensorCore):
        raise ArgumentTypeError(
            "expected a BlockPagedTensor", field=name, found=type(value).__name__
        )
    return value


def token_counts(tensor: TensorCore, needed_by: str | None = None) -> Array:
    """``seq_lens`` as int64; without them, every page full, or a typed error saying what
    (``needed_by``) needs them."""
    if tensor.seq_lens is not None:
        return tensor.seq_lens.astype(np.int64)
    if needed_by is not None:
        raise InvalidTensorError(
            f"{needed_by} needs seq_lens (the tensor was built without them)", field="seq_lens"
        )
    return np.diff(tensor.seq_ptr.astype(np.int64)) * tensor.layout.page_size


def token_slots(tensor: TensorCore, lens: Array) -> Array:
    """Physical page slot (page * page_size + offset) of every token of every sequence,
    sequence after sequence: the vectorised form of the spec's element lookup (§ 5)."""
    page_size = tensor.layout.page_size
    total = int(lens.sum()) if lens.size else 0
    starts = np.cumsum(lens) - lens
    seq_of = np.repeat(np.arange(len(lens), dtype=np.int64), lens)
    t = np.arange(total, dtype=np.int64) - starts[seq_of]
    entries = tensor.seq_ptr[:-1].astype(np.int64)[seq_of] + t // page_size
    slots: Array = tensor.block_table.astype(np.int64)[entries] * page_size + t % page_size
    return slots


def flat_pool(tensor: TensorCore) -> Array:
    """The unpacked pool as ``[page_slots, num_heads, head_dim]`` (a view when unpacked)."""
    pool = tensor.unpacked_page_pool()  # explicit sizes: -1 is ambiguous for 0 heads
    return pool.reshape(pool.shape[0] * pool.shape[1], pool.shape[2], pool.shape[3])


def rebuild(tensor: TensorT, *, page_pool: Any, **changes: Any) -> TensorT:
    """A new tensor like ``tensor`` with some of its ``_KEPT`` arguments changed, validated by
    from_arrays. The pool is made C-contiguous first: a transform keeps every page and its page
    ids (from_arrays would keep only the referenced pages of a strided pool)."""
    if isinstance(page_pool, np.ndarray):
        page_pool = np.ascontiguousarray(page_pool)
    kept = {name: getattr(tensor, name) for name in _KEPT} | changes
    wide = tensor.layout.block_table_index_type == "uint64"
    return type(tensor).from_arrays(
        page_pool,
        kv_role=tensor.kv_role,
        layer_index=tensor.layer_index,
        block_table_index_type="uint64" if wide else None,
        element_type=tensor.element_type,
        alignment=tensor.descriptor.buffers[0].alignment,
        **kept,
    )
