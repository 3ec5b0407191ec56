"""The reference's Python ``Tensor(pool, dtype, shape, aux_buffers=[block_table, seq_ptr,
params...], layout=...)`` for block-paged data: buffer sizes checked against the derived
descriptor, converted through ``assemble``, so it refuses what the blob decoder refuses.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from hurray_wire.buffers import byte_view
from hurray_wire.dtypes import ElementType, element_type_of
from hurray_wire.errors import ArgumentTypeError, InvalidTensorError
from hurray_wire.model._checks import U64_MAX
from hurray_wire.model.descriptor import TensorDescriptor
from hurray_wire.model.layout import BlockPagedLayout, _as_index_array
from hurray_wire.model.quantization import Quantization
from hurray_wire.tensor import SEQ_LENS, BlockPagedTensor, assemble
from hurray_wire.tensor_core import DescriptorViews

__all__ = ["Tensor"]


class Tensor(DescriptorViews):
    """Raw buffers and their block-paged layout, for code written against ``hurray.Tensor``;
    the rest of hurray-wire takes ``BlockPagedTensor`` (``to_block_paged()`` /
    ``from_block_paged``)."""

    __slots__ = ("aux_buffers", "data", "descriptor", "seq_lens")

    def __init__(
        self,
        data: Any,
        element_type: ElementType | str | Any,
        shape: Sequence[int],
        *,
        aux_buffers: Sequence[Any] = (),
        layout: BlockPagedLayout,
        quantization: Quantization | None = None,
        seq_lens: Any = None,
    ) -> None:
        if not isinstance(layout, BlockPagedLayout):
            raise ArgumentTypeError(
                "layout must be a BlockPagedLayout", field="layout", found=type(layout).__name__
            )
        if isinstance(aux_buffers, (bytes, bytearray, memoryview)) or not isinstance(
            aux_buffers, Sequence
        ):
            raise ArgumentTypeError(
                "aux_buffers must be a list of buffers",
                field="aux_buffers",
                found=type(aux_buffers).__name__,
            )
        self.data = byte_view(data, "data")
        self.aux_buffers = tuple(
            byte_view(b, f"aux_buffers[{i}]") for i, b in enumerate(aux_buffers)
        )
        if len(self.aux_buffers) < 2:
            raise InvalidTensorError(
                "a block-paged tensor needs block_table and seq_ptr buffers",
                field="aux_buffers",
                found=len(self.aux_buffers),
                expected=">= 2",
            )
        layout.validate_against_shape(shape)
        etype = element_type_of(element_type)
        width = layout.index_dtype.itemsize
        table = self.aux_buffers[0]
        if len(table) % width:
            raise InvalidTensorError(
                f"block_table bytes are not a multiple of {width}",
                field="aux_buffers[0]",
                found=len(table),
            )
        self.descriptor = TensorDescriptor.block_paged(
            layout, shape, etype, num_logical_pages=len(table) // width, quantization=quantization
        )
        handles = self.descriptor.buffers
        if len(handles) != 1 + len(self.aux_buffers):
            raise InvalidTensorError(
                "buffer count does not match the descriptor",
                field="aux_buffers",
                found=1 + len(self.aux_buffers),
                expected=len(handles),
            )
        for index, (handle, buffer) in enumerate(zip(handles, self.buffers, strict=True)):
            if handle.byte_size != len(buffer):
                name = "data" if index == 0 else f"aux_buffers[{index - 1}]"
                raise InvalidTensorError(
                    "buffer size does not match the descriptor",
                    field=name,
                    found=len(buffer),
                    expected=handle.byte_size,
                )
        self.seq_lens = seq_lens

    @property
    def buffers(self) -> tuple[memoryview, ...]:
        """Every buffer in descriptor order: data, block_table, seq_ptr, parameters."""
        return (self.data, *self.aux_buffers)

    @property
    def buffer_count(self) -> int:
        return len(self.descriptor.buffers)

    def to_block_paged(self) -> BlockPagedTensor:
        """The validated ``BlockPagedTensor`` over these buffers (views, no copy)."""
        lens = None
        if self.seq_lens is not None:  # checked as from_arrays checks it
            lens = np.ascontiguousarray(
                _as_index_array(self.seq_lens, "seq_lens", U64_MAX), SEQ_LENS
            )
        arrays = [np.frombuffer(b, np.uint8) for b in self.buffers]
        return assemble(self.descriptor, arrays, lens)

    @classmethod
    def from_block_paged(cls, tensor: BlockPagedTensor) -> Tensor:
        """The reference form of a ``BlockPagedTensor`` (its buffers, no copy)."""
        parts = [np.concatenate(p) if len(p) > 1 else p[0] for p in tensor.buffer_arrays()]
        return cls(
            parts[0],
            tensor.element_type,
            tensor.shape,
            aux_buffers=parts[1:],
            layout=tensor.layout,
            quantization=tensor.quantization,
            seq_lens=tensor.seq_lens,
        )

    def __repr__(self) -> str:
        return f"Tensor({self.element_type.name}, shape={list(self.shape)}, layout={self.layout!r})"
