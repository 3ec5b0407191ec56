"""PyTorch: tensors in and out through DLPack (``_interop``), torch imported only inside the
calls. CPU tensors are shared; read-only memory (a tensor decoded from ``bytes`` or a mapped
file) is copied going out, as torch has no read-only tensors.
"""

from __future__ import annotations

from typing import Any

from hurray_wire._interop import tensor_to_torch
from hurray_wire.errors import instance
from hurray_wire.tensor import BlockPagedTensor

__all__ = ["from_torch", "to_torch"]


def from_torch(page_pool: Any, block_table: Any, seq_ptr: Any, **kwargs: Any) -> BlockPagedTensor:
    """``BlockPagedTensor.from_arrays`` for torch tensors (which it accepts anyway)."""
    return BlockPagedTensor.from_arrays(page_pool, block_table, seq_ptr, **kwargs)


def to_torch(tensor: BlockPagedTensor) -> dict[str, Any]:
    """The tensor's arrays as CPU torch tensors by array name (``page_pool``, ``block_table``,
    ``seq_ptr``, and ``scales``, ``zero_points``, ``seq_lens`` when present); a packed pool
    (bool, int4, ...) is unpacked first, one element per byte."""
    return tensor_to_torch(instance(tensor, BlockPagedTensor, "tensor"))
