"""The arrays of a block-paged tensor and the views of its descriptor: ``BlockPagedTensor``'s
base, below ``transforms/`` (which read tensors and build new ones through
``type(tensor).from_arrays``) and ``tensor.py`` (whose helper methods call them)."""

from __future__ import annotations

from abc import abstractmethod
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from hurray_wire.dtypes import ElementType
from hurray_wire.errors import ArgumentTypeError, InvalidTensorError
from hurray_wire.kv_scale import kv_scale_of
from hurray_wire.model import packing
from hurray_wire.model.descriptor import TensorDescriptor
from hurray_wire.model.layout import BlockPagedLayout
from hurray_wire.model.quantization import Quantization, parameter_fields

__all__ = ["Array", "DescriptorViews", "TensorCore", "TensorT", "check_int"]

Array = npt.NDArray[Any]
TensorT = TypeVar("TensorT", bound="TensorCore")


class DescriptorViews:
    """What a tensor's descriptor says, as properties (``TensorCore``, ``reference_api.Tensor``)."""

    __slots__ = ()
    descriptor: TensorDescriptor

    @property
    def layout(self) -> BlockPagedLayout:
        return self.descriptor.layout

    @property
    def element_type(self) -> ElementType:
        return self.descriptor.element_type

    @property
    def shape(self) -> tuple[int, int, int]:
        """Logical shape ``(total_tokens, num_heads, head_dim)``."""
        return self.descriptor.shape

    @property
    def kv_role(self) -> str:
        return self.descriptor.layout.kv_role

    @property
    def layer_index(self) -> int | None:
        return self.descriptor.layout.layer_index

    @property
    def quantization(self) -> Quantization | None:
        return self.descriptor.quantization

    @property
    def num_seqs(self) -> int:
        return self.descriptor.layout.num_seqs


class TensorCore(DescriptorViews):
    """A descriptor and its arrays; the one concrete kind is ``BlockPagedTensor``."""

    __slots__ = (
        "block_table",
        "descriptor",
        "metadata",
        "page_pool",
        "scales",
        "seq_lens",
        "seq_ptr",
        "zero_points",
    )

    descriptor: TensorDescriptor
    page_pool: Array
    block_table: Array
    seq_ptr: Array
    scales: Array | None
    zero_points: Array | None
    seq_lens: Array | None
    metadata: dict[str, Any]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise ArgumentTypeError("build a BlockPagedTensor with BlockPagedTensor.from_arrays(...)")

    @classmethod
    def _trusted(
        cls: type[TensorT],
        descriptor: TensorDescriptor,
        page_pool: Array,
        block_table: Array,
        seq_ptr: Array,
        scales: Array | None = None,
        zero_points: Array | None = None,
        seq_lens: Array | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> TensorT:
        """Assemble from parts already validated (by ``from_arrays`` or the decoder)."""
        self = object.__new__(cls)
        self.descriptor = descriptor
        self.page_pool = page_pool
        self.block_table = block_table
        self.seq_ptr = seq_ptr
        self.scales = scales
        self.zero_points = zero_points
        self.seq_lens = seq_lens
        self.metadata = {} if metadata is None else metadata
        return self

    @classmethod
    @abstractmethod  # for mypy (no ABCMeta: isinstance on the hot paths stays a type check)
    def from_arrays(cls: type[TensorT], *args: Any, **kwargs: Any) -> TensorT:
        """Build and validate a tensor (``BlockPagedTensor.from_arrays``)."""

    @property
    def nbytes(self) -> int:
        """Bytes of all buffers together."""
        return sum(h.byte_size for h in self.descriptor.buffers)

    def buffer_arrays(self) -> tuple[tuple[Array, ...], ...]:
        """The arrays of each descriptor buffer, in table order, as 1-D uint8 views (scales
        and zero points sharing one index: two parts)."""
        parts: list[tuple[Array, ...]] = [
            (_bytes_view(a),) for a in (self.page_pool, self.block_table, self.seq_ptr)
        ]
        quant = self.descriptor.quantization
        by_index: dict[int, list[Array]] = {}
        for name, index in parameter_fields(quant) if quant is not None else ():
            array = self.scales if name == "scale_buffer_index" else self.zero_points
            assert array is not None
            by_index.setdefault(index, []).append(_bytes_view(array))
        return (*parts, *(tuple(by_index[index]) for index in sorted(by_index)))

    def unpacked_page_pool(self) -> Array:
        """The pool as ``[num_pages, page_size, num_heads, head_dim]`` of the element dtype
        (packed sub-byte types unpacked: a copy)."""
        etype = self.element_type
        if not etype.is_packed:
            return self.page_pool
        layout = self.layout
        shape = (layout.num_pages, layout.page_size, self.shape[1], self.shape[2])
        count = int(np.prod(shape, dtype=np.uint64))
        return packing.unpack(self.page_pool, etype, count).reshape(shape)

    def sequence_pages(self, seq: int) -> Array:
        """Physical page ids of sequence ``seq``, in logical order."""
        seq = check_int(seq, "seq", 0, self.num_seqs - 1)
        return self.block_table[int(self.seq_ptr[seq]) : int(self.seq_ptr[seq + 1])]

    def gather_sequence(self, seq: int) -> Array:
        """Tokens of sequence ``seq`` as a new ``[tokens, num_heads, head_dim]`` array (without
        ``seq_lens``: every slot of its pages, [A14])."""
        pages = self.sequence_pages(seq)
        pool = self.unpacked_page_pool()
        tokens = pool[pages].reshape(-1, pool.shape[2], pool.shape[3])
        if self.seq_lens is not None:
            tokens = tokens[: int(self.seq_lens[seq])]
        return tokens

    @property
    def kv_scale(self) -> float | None:
        """The engine's fp8 scalar (vLLM ``k_scale`` / ``v_scale``), or None."""
        return kv_scale_of(self.metadata, self.kv_role)

    def __repr__(self) -> str:
        d = self.descriptor
        return (
            f"BlockPagedTensor({d.element_type.name}, shape={d.shape}, kv_role={self.kv_role!r}, "
            f"layer_index={self.layer_index!r}, num_pages={d.layout.num_pages}, "
            f"page_size={d.layout.page_size}, num_seqs={d.layout.num_seqs}, "
            f"quantization={None if d.quantization is None else d.quantization.name})"
        )


def check_int(value: object, name: str, minimum: int = 0, maximum: int | None = None) -> int:
    """A Python or NumPy integer (not a bool: ``True`` is not sequence 1) in
    ``minimum..maximum``; a str or float would otherwise fail inside a comparison with a
    foreign ``TypeError`` or index by accident."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ArgumentTypeError(f"{name} must be an int", field=name, found=repr(value))
    number = int(value)
    if number < minimum or (maximum is not None and number > maximum):
        expected = f">= {minimum}" if maximum is None else f"{minimum}..{maximum}"
        raise InvalidTensorError(
            f"{name} out of range", field=name, found=number, expected=expected
        )
    return number


def _bytes_view(array: Array) -> Array:
    """A 1-D uint8 view of a C-contiguous array (no copy)."""
    return array.reshape(-1).view(np.uint8)
