"""Quantization schemes (descriptor.md § 8, quantization.md): immutable values checked on
construction; rules that need the descriptor live there, the block-paged admission in
``check_block_paged_compatibility``."""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import ClassVar, Union

from hurray_wire import dtypes
from hurray_wire.dtypes import ElementType
from hurray_wire.errors import InvalidDescriptorError, QuantizationNotDefinedError
from hurray_wire.model._checks import I32_MAX, I32_MIN, U32_MAX, check_uint, is_power_of_two

NO_BUFFER = 0xFFFFFFFF  # zero_point_buffer_index of a symmetric scheme
SYMMETRIC = 0x0001  # scheme flag bit 0 of per-channel and per-block affine


def _tags(names: str) -> frozenset[int]:
    return frozenset(dtypes.element_type_from_name(name).tag for name in names.split())


_INTEGER_STORAGE = _tags("int8 uint8 int16 uint16 int32 uint32 int4 uint4 int2 uint2")
_BLOCK_STORAGE = _tags("int8 uint8 int4 uint4 int2 uint2")
_BLOCK_SCALE_TYPES = (dtypes.float16, dtypes.bfloat16, dtypes.float32)


def _check_version(version: object) -> int:
    value = check_uint(version, "scheme_version", 0xFF)
    if value > 1:
        raise InvalidDescriptorError(
            "newer scheme_version than supported", field="scheme_version", found=value, expected=1
        )
    return value


def _check_param_index(value: object, name: str) -> int:
    index = check_uint(value, name, U32_MAX)
    if index == NO_BUFFER:
        raise InvalidDescriptorError("0xFFFFFFFF means 'no buffer' here", field=name, found=index)
    return index


_set = object.__setattr__  # frozen dataclasses: a checked value replaces the given one


@dataclass(frozen=True)
class PerTensorAffine:
    """One f32 scale and one int32 zero point for the whole tensor: no parameter buffers."""

    scale: float
    zero_point: int = 0
    scheme_version: int = 1

    scheme_tag: ClassVar[int] = 0x01
    name: ClassVar[str] = "per_tensor_affine"
    allowed_storage: ClassVar[frozenset[int]] = _INTEGER_STORAGE
    flags: ClassVar[int] = 0
    parameter_buffers: ClassVar[tuple[int, ...]] = ()

    def __post_init__(self) -> None:
        if isinstance(self.scale, bool):
            raise InvalidDescriptorError("scale must be a float", field="scale", found=self.scale)
        try:
            scale32 = struct.unpack("<f", struct.pack("<f", self.scale))[0]
        except (struct.error, TypeError, OverflowError):
            raise InvalidDescriptorError(
                "scale must be a finite float32", field="scale", found=repr(self.scale)
            ) from None
        if not math.isfinite(scale32) or scale32 == 0.0:
            raise InvalidDescriptorError(
                "scale must be finite and non-zero", field="scale", found=self.scale
            )
        _set(self, "scale", scale32)
        zero_point = check_uint(self.zero_point, "zero_point", I32_MAX, minimum=I32_MIN)
        _set(self, "zero_point", zero_point)
        _set(self, "scheme_version", _check_version(self.scheme_version))

    @classmethod
    def symmetric(cls, scale: float) -> PerTensorAffine:
        """x = scale * q."""
        return cls(scale, 0)

    @classmethod
    def asymmetric(cls, scale: float, zero_point: int) -> PerTensorAffine:
        """x = scale * (q - zero_point)."""
        return cls(scale, zero_point)

    @property
    def symmetric_flag(self) -> bool:
        return self.zero_point == 0


class _AffineBuffers:
    """What the two buffer-backed affine schemes say alike about their parameter buffers."""

    axis: int
    scale_buffer_index: int
    zero_point_buffer_index: int | None
    scheme_version: int

    def __post_init__(self) -> None:
        _set(self, "axis", check_uint(self.axis, "axis", U32_MAX))
        index = _check_param_index(self.scale_buffer_index, "scale_buffer_index")
        _set(self, "scale_buffer_index", index)
        if self.zero_point_buffer_index is not None:
            zp = _check_param_index(self.zero_point_buffer_index, "zero_point_buffer_index")
            _set(self, "zero_point_buffer_index", zp)
        _set(self, "scheme_version", _check_version(self.scheme_version))

    @property
    def symmetric_flag(self) -> bool:
        return self.zero_point_buffer_index is None

    @property
    def flags(self) -> int:
        return SYMMETRIC if self.zero_point_buffer_index is None else 0

    @property
    def parameter_buffers(self) -> tuple[int, ...]:
        zero_point = self.zero_point_buffer_index
        if zero_point is None or zero_point == self.scale_buffer_index:
            return (self.scale_buffer_index,)
        return (self.scale_buffer_index, zero_point)


@dataclass(frozen=True)
class PerChannelAffine(_AffineBuffers):
    """f32 scales (and int32 zero points) along ``axis``: shape[axis] entries each."""

    axis: int
    scale_buffer_index: int
    zero_point_buffer_index: int | None = None
    scheme_version: int = 1

    scheme_tag: ClassVar[int] = 0x02
    name: ClassVar[str] = "per_channel_affine"
    allowed_storage: ClassVar[frozenset[int]] = _INTEGER_STORAGE
    scale_type: ClassVar[ElementType] = dtypes.float32

    @classmethod
    def symmetric(cls, axis: int, scale_buffer_index: int) -> PerChannelAffine:
        return cls(axis, scale_buffer_index, None)

    @classmethod
    def asymmetric(
        cls, axis: int, scale_buffer_index: int, zero_point_buffer_index: int
    ) -> PerChannelAffine:
        return cls(axis, scale_buffer_index, zero_point_buffer_index)


@dataclass(frozen=True)
class PerBlockAffine(_AffineBuffers):
    """Scales (and int32 zero points) per block of ``block_size`` along ``axis`` (block-paged:
    axis 0, block_size == page_size: one per page slot)."""

    axis: int
    block_size: int
    scale_buffer_index: int
    scale_type: ElementType = dtypes.float32
    zero_point_buffer_index: int | None = None
    scheme_version: int = 1

    scheme_tag: ClassVar[int] = 0x03
    name: ClassVar[str] = "per_block_affine"
    allowed_storage: ClassVar[frozenset[int]] = _BLOCK_STORAGE

    def __post_init__(self) -> None:
        super().__post_init__()
        block = check_uint(self.block_size, "block_size", U32_MAX)
        if block < 2 or not is_power_of_two(block):
            raise InvalidDescriptorError(
                "block_size must be a power of two >= 2", field="block_size", found=block
            )
        _set(self, "block_size", block)
        try:
            scale_type = dtypes.element_type_of(self.scale_type)
        except InvalidDescriptorError as exc:
            raise exc.relocated(field="scale_type") from None
        if scale_type not in _BLOCK_SCALE_TYPES:
            raise InvalidDescriptorError(
                "scale type must be float16, bfloat16 or float32",
                field="scale_type",
                found=scale_type.name,
            )
        _set(self, "scale_type", scale_type)

    @classmethod
    def symmetric(
        cls, axis: int, block_size: int, scale_buffer_index: int, scale_type: ElementType
    ) -> PerBlockAffine:
        return cls(axis, block_size, scale_buffer_index, scale_type, None)

    @classmethod
    def asymmetric(
        cls,
        axis: int,
        block_size: int,
        scale_buffer_index: int,
        zero_point_buffer_index: int,
        scale_type: ElementType,
    ) -> PerBlockAffine:
        return cls(axis, block_size, scale_buffer_index, scale_type, zero_point_buffer_index)


@dataclass(frozen=True)
class NF4:
    """4-bit NormalFloat with f32 absmax per block; not defined for block-paged ([A11])."""

    axis: int
    block_size: int
    scale_buffer_index: int
    scheme_version: int = 1

    scheme_tag: ClassVar[int] = 0x04
    name: ClassVar[str] = "nf4"
    allowed_storage: ClassVar[frozenset[int]] = _tags("uint4")
    min_block: ClassVar[int] = 8
    max_block: ClassVar[int] = U32_MAX
    flags: ClassVar[int] = 0

    def __post_init__(self) -> None:
        _set(self, "axis", check_uint(self.axis, "axis", U32_MAX))
        block = check_uint(self.block_size, "block_size", U32_MAX)
        if not (is_power_of_two(block) and self.min_block <= block <= self.max_block):
            raise InvalidDescriptorError(
                f"block_size must be a power of two in {self.min_block}..{self.max_block}",
                field="block_size",
                found=block,
            )
        _set(self, "block_size", block)
        index = check_uint(self.scale_buffer_index, "scale_buffer_index", U32_MAX)
        _set(self, "scale_buffer_index", index)
        _set(self, "scheme_version", _check_version(self.scheme_version))

    @property
    def parameter_buffers(self) -> tuple[int, ...]:
        return (self.scale_buffer_index,)


@dataclass(frozen=True)
class MXFP(NF4):
    """OCP microscaling: float8_e8m0 scale per block; not defined for block-paged ([A11])."""

    scheme_tag: ClassVar[int] = 0x05
    name: ClassVar[str] = "mxfp"
    allowed_storage: ClassVar[frozenset[int]] = _tags(
        "float8_e4m3 float8_e5m2 float4_e2m1 float6_e2m3 float6_e3m2 int8 int4"
    )
    min_block: ClassVar[int] = 16
    max_block: ClassVar[int] = 2048


Quantization = Union[PerTensorAffine, PerChannelAffine, PerBlockAffine, NF4, MXFP]  # noqa: UP007


def parameter_fields(quant: object) -> list[tuple[str, int]]:
    """(field name, buffer index) of each parameter buffer a scheme names."""
    names = ("scale_buffer_index", "zero_point_buffer_index")
    return [(name, index) for name in names if (index := getattr(quant, name, None)) is not None]


def check_block_paged_compatibility(quantization: object, page_size: int) -> None:
    """Refuse schemes block-paged does not admit (block-paged.md § 7, [A11])."""
    if quantization is None or isinstance(quantization, PerTensorAffine):
        return
    if isinstance(quantization, NF4):  # MXFP too
        raise QuantizationNotDefinedError(
            f"{quantization.name} is not defined for block-paged tensors (spec [A11])",
            field="quantization",
            found=quantization.name,
        )
    if isinstance(quantization, PerChannelAffine):
        if quantization.axis not in (1, 2):
            raise InvalidDescriptorError(
                "per-channel affine on block-paged must use axis 1 (heads) or 2 (head_dim)",
                field="quantization.axis",
                found=quantization.axis,
            )
    elif isinstance(quantization, PerBlockAffine):
        if quantization.axis != 0:
            raise InvalidDescriptorError(
                "per-block affine on block-paged must use axis 0",
                field="quantization.axis",
                found=quantization.axis,
                expected=0,
            )
        if quantization.block_size != page_size:
            raise InvalidDescriptorError(
                "per-block affine on block-paged needs block_size == page_size",
                field="quantization.block_size",
                found=quantization.block_size,
                expected=page_size,
            )
    else:
        raise InvalidDescriptorError(
            "not a quantization object (pass the object, not its scheme tag)",
            field="quantization",
            found=repr(quantization),
            expected="PerTensorAffine, PerChannelAffine, PerBlockAffine or None",
        )
    for name, index in parameter_fields(quantization):
        if index < 3:
            raise InvalidDescriptorError(
                "quantization parameter buffers of a block-paged tensor start at index 3",
                field=f"quantization.{name}",
                found=index,
            )
