"""TensorDescriptor, checked when built (descriptor.md §§ 2-9, block-paged.md §§ 2-3, 7):
an object that exists is one the decoder accepts, so the encoder never writes what it refuses.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from hurray_wire import dtypes
from hurray_wire.dtypes import ElementType
from hurray_wire.errors import InvalidDescriptorError
from hurray_wire.model._checks import U8_MAX, U32_MAX, U64_MAX, check_uint, is_power_of_two
from hurray_wire.model.layout import BlockPagedLayout
from hurray_wire.model.quantization import (
    NF4,
    PerBlockAffine,
    PerChannelAffine,
    PerTensorAffine,
    Quantization,
    parameter_fields,
)
from hurray_wire.wire import descriptor as w

_ZERO_POINT_BYTES: int = w.ZERO_POINT_ITEM.sizeof()  # int32 (descriptor.md § 8)

_DEVICES = "cpu cuda rocm metal vulkan webgpu hexagon level_zero opencl"
DEVICE_NAMES = dict(enumerate(_DEVICES.split()))  # device tags 0x00-0x08, in tag order
SYNC_MODE_NAMES = {0: "producer_synced", 1: "event", 2: "consumer_stream"}
MEMORY_CLASS_NAMES = {0: "standard", 1: "host_pinned", 2: "unified", 3: "peer"}
BUFFER_NAMES = ("page_pool", "block_table", "seq_ptr")
_PEER_CAPABLE = {0x01, 0x02, 0x04, 0x07}  # CUDA, ROCm, Vulkan, Level Zero
_WEBGPU = 0x05


def device_name(tag: int) -> str:
    """Readable name of a device tag (private tags as ``private_0xF3``)."""
    return DEVICE_NAMES.get(tag, f"private_0x{tag:02X}")


@dataclass(frozen=True)
class BufferHandle:
    """One 16-byte buffer handle (buffer-protocol.md § Buffer Handle, [A2], [A3])."""

    byte_size: int
    alignment: int = 64
    device_tag: int = 0
    sync_mode: int = 0
    memory_class: int = 0

    def __post_init__(self) -> None:
        check_uint(self.byte_size, "byte_size", U64_MAX)
        align = check_uint(self.alignment, "alignment", U32_MAX)
        if not is_power_of_two(align):
            raise InvalidDescriptorError(
                "alignment must be a power of two", field="alignment", found=align
            )
        if self.byte_size > 0 and align < 64:
            raise InvalidDescriptorError(
                "a non-empty buffer needs alignment >= 64", field="alignment", found=align
            )
        device = check_uint(self.device_tag, "device_tag", U8_MAX)
        private_device = 0xF0 <= device <= 0xFE
        if device not in DEVICE_NAMES and not private_device:
            raise InvalidDescriptorError(
                "reserved or invalid device tag", field="device_tag", found=f"0x{device:02X}"
            )
        sync = check_uint(self.sync_mode, "sync_mode", U8_MAX)
        if sync > 2:
            raise InvalidDescriptorError("unknown sync_mode", field="sync_mode", found=sync)
        if device == 0 and sync != 0:
            raise InvalidDescriptorError(
                "CPU buffers must be producer-synced (sync_mode 0)", field="sync_mode", found=sync
            )
        memory = check_uint(self.memory_class, "memory_class", U8_MAX)
        private_memory = 0xF0 <= memory <= 0xFE
        if memory not in MEMORY_CLASS_NAMES and not private_memory:
            raise InvalidDescriptorError(
                "reserved or invalid memory class", field="memory_class", found=f"0x{memory:02X}"
            )
        if private_memory and not private_device:
            ok = False
        elif private_device:
            ok = memory == 0 or private_memory
        elif device == _WEBGPU:
            ok = memory == 0
        else:
            ok = memory != 3 or device in _PEER_CAPABLE
        if not ok:
            raise InvalidDescriptorError(
                f"memory class {memory} is not valid on device {device_name(device)}",
                field="memory_class",
                found=memory,
            )


@dataclass(frozen=True)
class Statistics:
    """The advisory 72-byte statistics section (descriptor.md § 9.2)."""

    computed_mask: int = 0
    nnz: int = 0
    sparsity_ratio: float = 0.0
    value_min: float = 0.0
    value_max: float = 0.0
    value_abs_max: float = 0.0
    value_mean: float = 0.0
    value_stddev: float = 0.0
    nm_n: int = 0
    nm_m: int = 0
    has_nan: int = 0
    has_inf: int = 0

    def __post_init__(self) -> None:
        mask = check_uint(self.computed_mask, "statistics.computed_mask", U32_MAX)
        if mask & ~0x3F:
            raise InvalidDescriptorError(
                "reserved statistics mask bits", field="statistics.computed_mask", found=hex(mask)
            )
        limits = {"nnz": U64_MAX, "nm_n": U8_MAX, "nm_m": U8_MAX, "has_nan": 1, "has_inf": 1}
        for name, maximum in limits.items():  # [A30]: has_nan and has_inf round-trip 0, 1 only
            check_uint(getattr(self, name), f"statistics.{name}", maximum)
        for f in dataclasses.fields(self):  # the f64 fields
            value = getattr(self, f.name)
            if f.type == "float" and not isinstance(value, float):
                raise InvalidDescriptorError(
                    "must be a float", field=f"statistics.{f.name}", found=repr(value)
                )

    def __eq__(self, other: object) -> bool:  # NaN-aware: compare the float bits
        if not isinstance(other, Statistics):
            return NotImplemented
        return _stat_key(self) == _stat_key(other)

    def __hash__(self) -> int:
        return hash(_stat_key(self))


def _stat_key(s: Statistics) -> tuple[Any, ...]:
    """Field values with floats as their exact text (so NaN equals NaN, 0.0 differs from -0.0)."""
    return tuple(
        v.hex() if isinstance(v, float) and not math.isnan(v) else repr(v)
        for v in dataclasses.astuple(s)
    )


@dataclass(frozen=True)
class TensorDescriptor:
    """A block-paged descriptor; ``shape`` is ``(total_tokens, num_heads, head_dim)``;
    ``quantization_padding`` and ``unknown_trailing`` keep the bytes a reader tolerates
    ([A31], minor > 0), so a decoded descriptor re-encodes to its bytes."""

    element_type: ElementType
    shape: tuple[int, int, int]
    layout: BlockPagedLayout
    buffers: tuple[BufferHandle, ...]
    quantization: Quantization | None = None
    version: tuple[int, int] = (1, 0)
    statistics: Statistics | None = None
    composite_member: int | None = None
    quantization_padding: bytes = b""
    unknown_trailing: bytes = b""
    descriptor_length: int = field(init=False, compare=False)
    byte_offset: ClassVar[int] = 0
    layout_tag: ClassVar[int] = BlockPagedLayout.tag

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "element_type", dtypes.element_type_of(self.element_type))
        if not isinstance(self.layout, BlockPagedLayout):
            raise InvalidDescriptorError(
                "layout must be a BlockPagedLayout", field="layout", found=repr(self.layout)
            )
        set_(self, "shape", self.layout.validate_against_shape(self.shape))
        self._check_version()
        self._check_quantization()
        self._check_buffers()
        if self.statistics is not None and not isinstance(self.statistics, Statistics):
            raise InvalidDescriptorError(
                "must be a Statistics", field="statistics", found=repr(self.statistics)
            )
        if self.composite_member is not None:
            check_uint(self.composite_member, "composite_member.member_role", 1)
        set_(self, "descriptor_length", self._encoded_length())

    def _check_version(self) -> None:
        try:
            major, minor = self.version
        except (TypeError, ValueError):
            raise InvalidDescriptorError(
                "version must be (major, minor)", field="version", found=repr(self.version)
            ) from None
        major = check_uint(major, "version_major", U8_MAX)
        minor = check_uint(minor, "version_minor", U8_MAX)
        if major != 1:
            raise InvalidDescriptorError(
                "unsupported major version", field="version_major", found=major, expected=1
            )
        object.__setattr__(self, "version", (major, minor))
        for name in ("quantization_padding", "unknown_trailing"):
            if not isinstance(getattr(self, name), bytes):
                raise InvalidDescriptorError("must be bytes", field=name)
        if self.unknown_trailing and minor == 0:
            raise InvalidDescriptorError(
                "unknown trailing bytes need version_minor > 0",
                field="unknown_trailing",
                found=len(self.unknown_trailing),
            )

    def _check_buffers(self) -> None:
        try:
            buffers = tuple(self.buffers)
        except TypeError:
            raise InvalidDescriptorError(
                "buffers must be a sequence of BufferHandle",
                field="buffers",
                found=repr(self.buffers),
            ) from None
        object.__setattr__(self, "buffers", buffers)
        count = len(buffers)
        params = self.quantization.parameter_buffers if self.quantization is not None else ()
        expected = 3 + len(params)
        if count != expected:
            raise InvalidDescriptorError(
                "buffer_count disagrees with the layout and quantization",
                field="buffer_count",
                found=count,
                expected=expected,
            )
        for name, index in parameter_fields(self.quantization):
            if index >= count:
                raise InvalidDescriptorError(
                    "quantization parameter buffer index beyond the buffer table",
                    field=f"quantization.{name}",
                    found=index,
                    expected=f"< buffer_count = {count}",
                )
        for index, handle in enumerate(buffers):
            if not isinstance(handle, BufferHandle):
                raise InvalidDescriptorError(
                    "must be a BufferHandle", field=f"buffers[{index}]", found=repr(handle)
                )
        check_colocation(buffers)
        # Exact sizes the layout implies; block_table's is the declared one (not implied).
        table_bytes = buffers[1].byte_size
        layout, shape = self.layout, self.shape
        sizes = buffer_sizes(layout, shape, self.element_type, self.quantization, table_bytes)
        for index, (handle, size) in enumerate(zip(buffers, sizes, strict=True)):
            if index != 1 and handle.byte_size != size:
                raise InvalidDescriptorError(
                    f"{self.buffer_names[index]} byte_size disagrees with the layout",
                    field=f"buffers[{index}].byte_size",
                    found=handle.byte_size,
                    expected=size,
                )
        width = self.layout.index_dtype.itemsize
        if table_bytes % width:
            raise InvalidDescriptorError(
                f"block_table byte_size must be a multiple of {width}",
                field="buffers[1].byte_size",
                found=table_bytes,
            )
        logical_pages = table_bytes // width
        if self.layout.num_seqs == 0 and logical_pages:
            raise InvalidDescriptorError(
                "an empty batch has an empty block_table",
                field="buffers[1].byte_size",
                found=table_bytes,
                expected=0,
            )
        if self.shape[0] > logical_pages * self.layout.page_size:
            raise InvalidDescriptorError(
                "total_tokens exceeds the capacity of the block table's pages",
                field="shape[0]",
                found=self.shape[0],
                expected=f"<= {logical_pages} pages x {self.layout.page_size}",
            )

    def _check_quantization(self) -> None:
        quant = self.quantization
        if quant is None:
            if self.quantization_padding:
                raise InvalidDescriptorError(
                    "quantization padding without quantization", field="quantization_padding"
                )
            return
        self.layout.validate_quantization_compatibility(quant)
        if self.element_type.tag not in quant.allowed_storage:
            raise InvalidDescriptorError(
                f"storage type not allowed by {quant.name}",
                field="type_tag",
                found=self.element_type.name,
            )
        if isinstance(quant, PerTensorAffine):
            bits = self.element_type.bit_width  # the storage type's range
            signed = not self.element_type.name.startswith("u")
            low, high = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if signed else (0, 2**bits - 1)
            if not low <= quant.zero_point <= high:
                raise InvalidDescriptorError(
                    f"zero_point outside the {self.element_type.name} range",
                    field="quantization.zero_point",
                    found=quant.zero_point,
                    expected=f"{low}..{high}",
                )

    @property
    def total_tokens(self) -> int:
        return self.shape[0]

    @property
    def num_heads(self) -> int:
        return self.shape[1]

    @property
    def head_dim(self) -> int:
        return self.shape[2]

    @property
    def type_tag(self) -> int:
        return self.element_type.tag

    @property
    def flags(self) -> int:
        """Flag bits derived from the sections present (descriptor.md § 3)."""
        return (
            (w.FLAG_HAS_QUANTIZATION if self.quantization is not None else 0)
            | (w.FLAG_HAS_STATISTICS if self.statistics is not None else 0)
            | (w.FLAG_HAS_COMPOSITE_MEMBER if self.composite_member is not None else 0)
        )

    @property
    def num_logical_pages(self) -> int:
        """Entries of block_table (``seq_ptr[num_seqs]``), from its byte size."""
        return self.buffers[1].byte_size // self.layout.index_dtype.itemsize

    @property
    def pool_elements(self) -> int:
        """Elements in page_pool: num_pages * page_size * num_heads * head_dim."""
        return self.layout.page_slots * self.shape[1] * self.shape[2]

    @property
    def buffer_names(self) -> tuple[str, ...]:
        """Names of the buffers in table order ("scales", "zero_points", "scales_zero_points")."""
        params = _parameters(self.quantization)
        return BUFFER_NAMES + tuple(params[i][0] for i in sorted(params))

    def element_widths(self) -> tuple[int, ...]:
        """Bytes per element of each buffer, in table order: the shuffle width a codec may
        use (1 for packed pools; a shared scale + zero-point buffer counts as scales)."""
        index_width = self.layout.index_dtype.itemsize
        widths = {0: self.element_type.itemsize, 1: index_width, 2: index_width}
        widths.update({i: width for i, (_, width, _) in _parameters(self.quantization).items()})
        return tuple(widths[i] for i in range(len(self.buffers)))

    def _encoded_length(self) -> int:
        length = w.handle_at(len(self.buffers)) + len(self.unknown_trailing)
        if self.quantization is not None:
            payload = w.SCHEME[self.quantization.scheme_tag].size
            length += w.QUANT_PAYLOAD_AT + payload + len(self.quantization_padding)
        if self.statistics is not None:
            length += w.STATS.size
        if self.composite_member is not None:
            length += w.MEMBER.size
        return length

    @classmethod
    def block_paged(
        cls,
        layout: BlockPagedLayout,
        shape: Sequence[int],
        element_type: ElementType | str | Any,
        *,
        num_logical_pages: int,
        quantization: Quantization | None = None,
        alignment: int = 64,
        device_tag: int = 0,
        sync_mode: int = 0,
        memory_class: int = 0,
        statistics: Statistics | None = None,
    ) -> TensorDescriptor:
        """Derive the buffer table of a block-paged tensor and build its descriptor (per-block
        scales sized num_pages * page_size, not by the generic formula: [A7])."""
        etype = dtypes.element_type_of(element_type)
        pages = check_uint(num_logical_pages, "num_logical_pages", U64_MAX)
        if not isinstance(layout, BlockPagedLayout):
            raise InvalidDescriptorError("layout must be a BlockPagedLayout", field="layout")
        dims = layout.validate_against_shape(shape)
        layout.validate_quantization_compatibility(quantization)
        table_bytes = pages * layout.index_dtype.itemsize
        sizes = buffer_sizes(layout, dims, etype, quantization, table_bytes)
        handles = tuple(
            BufferHandle(size, alignment, device_tag, sync_mode, memory_class) for size in sizes
        )
        return cls(etype, dims, layout, handles, quantization, statistics=statistics)


def check_colocation(handles: Sequence[BufferHandle]) -> None:
    """All buffers of one tensor live on one device, in one memory class (descriptor.md § 7)."""
    for index, handle in enumerate(handles[1:], 1):
        first = handles[0]
        if handle.device_tag == first.device_tag and handle.memory_class == first.memory_class:
            continue
        for name, rule in (
            ("device_tag", "be on one device"),
            ("memory_class", "share one memory class"),
        ):
            if getattr(handle, name) != getattr(first, name):
                raise InvalidDescriptorError(
                    f"all buffers must {rule}",
                    field=f"buffers[{index}].{name}",
                    found=getattr(handle, name),
                    expected=getattr(first, name),
                )


def buffer_sizes(
    layout: BlockPagedLayout,
    shape: Sequence[int],
    element_type: ElementType,
    quantization: Quantization | None,
    block_table_bytes: int,
) -> tuple[int, ...]:
    """Byte size of every buffer of a block-paged tensor, in table order: a pure function
    of its geometry (the block table's size is the one declared, as it is not implied)."""
    pool_elements = layout.page_slots * shape[1] * shape[2]
    sizes = {
        0: element_type.byte_size(pool_elements),
        1: block_table_bytes,
        2: (layout.num_seqs + 1) * layout.index_dtype.itemsize,
    }
    if isinstance(quantization, NF4):  # pragma: no cover - refused earlier (MXFP too)
        raise InvalidDescriptorError("not defined for block-paged", field="quantization")
    entries = 0  # of each parameter buffer
    if isinstance(quantization, PerBlockAffine):  # one per page slot
        entries = layout.page_slots
    elif isinstance(quantization, PerChannelAffine) and quantization.axis < 3:
        entries = shape[quantization.axis]  # one per index of its axis
    sizes.update({i: entries * per for i, (_, _, per) in _parameters(quantization).items()})
    return tuple(sizes.get(i, 0) for i in range(max(sizes) + 1))


def _parameters(quant: Quantization | None) -> dict[int, tuple[str, int, int]]:
    """Buffer index -> (name, element width, bytes per entry) of each parameter buffer of an
    affine scheme; a buffer shared by scales and zero points holds both per entry."""
    if not isinstance(quant, (PerChannelAffine, PerBlockAffine)):
        return {}
    scale = quant.scale_type.itemsize
    out = {quant.scale_buffer_index: ("scales", scale, scale)}
    zp = quant.zero_point_buffer_index
    if zp == quant.scale_buffer_index:
        out[zp] = ("scales_zero_points", scale, scale + _ZERO_POINT_BYTES)
    elif zp is not None:
        out[zp] = ("zero_points", _ZERO_POINT_BYTES, _ZERO_POINT_BYTES)
    return out
