"""Element types (descriptor.md § 4): wire tag, name, bit width, NumPy dtype; the narrow
floats from ``ml_dtypes`` (exact bit patterns), imported when first asked for (~0.5 s)."""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field

import numpy as np

from hurray_wire.errors import InvalidDescriptorError


@dataclass(frozen=True, repr=False)
class ElementType:
    """One element type: ``numpy_dtype`` holds one unpacked element."""

    tag: int
    name: str
    bit_width: int
    #: A NumPy scalar type or dtype string, or ``"ml_dtypes.NAME"`` (imported when first used).
    dtype_source: object = field(compare=False)

    @property
    def numpy_dtype(self) -> np.dtype[np.generic]:
        """The NumPy dtype of one unpacked element."""
        dtype = _NUMPY_DTYPES.get(self.tag)
        if dtype is None:
            source = self.dtype_source
            if isinstance(source, str) and source.startswith("ml_dtypes."):
                source = getattr(importlib.import_module("ml_dtypes"), source.split(".", 1)[1])
            dtype = _NUMPY_DTYPES[self.tag] = np.dtype(source)  # type: ignore[call-overload]
        return dtype

    @property
    def is_packed(self) -> bool:
        """True when several elements share a byte on the wire (bool and sub-byte types)."""
        return self.bit_width < 8

    @property
    def storage_dtype(self) -> np.dtype[np.generic]:
        """The dtype of the stored buffer: uint8 for packed types, else ``numpy_dtype``."""
        return np.dtype(np.uint8) if self.is_packed else self.numpy_dtype

    @property
    def itemsize(self) -> int:
        """Bytes per stored item (1 for packed types)."""
        return self.storage_dtype.itemsize

    def byte_size(self, count: int) -> int:
        """Bytes that ``count`` elements occupy on the wire (6-bit types per [A27])."""
        bits = self.bit_width
        if bits >= 8:
            return count * (bits // 8)
        if bits == 6:
            return -(-count // 4) * 3
        per_byte = 8 // bits
        return -(-count // per_byte)

    def __repr__(self) -> str:
        return f"hurray_wire.{self.name if self.name != 'bool' else 'bool_'}"


_NUMPY_DTYPES: dict[int, np.dtype[np.generic]] = {}


float16 = ElementType(0x01, "float16", 16, np.float16)
bfloat16 = ElementType(0x02, "bfloat16", 16, "ml_dtypes.bfloat16")
float32 = ElementType(0x03, "float32", 32, np.float32)
float64 = ElementType(0x04, "float64", 64, np.float64)
int8 = ElementType(0x10, "int8", 8, np.int8)
uint8 = ElementType(0x11, "uint8", 8, np.uint8)
int16 = ElementType(0x12, "int16", 16, np.int16)
uint16 = ElementType(0x13, "uint16", 16, np.uint16)
int32 = ElementType(0x14, "int32", 32, np.int32)
uint32 = ElementType(0x15, "uint32", 32, np.uint32)
int64 = ElementType(0x16, "int64", 64, np.int64)
uint64 = ElementType(0x17, "uint64", 64, np.uint64)
bool_ = ElementType(0x20, "bool", 1, np.bool_)
float8_e4m3 = ElementType(0x40, "float8_e4m3", 8, "ml_dtypes.float8_e4m3fn")
float8_e5m2 = ElementType(0x41, "float8_e5m2", 8, "ml_dtypes.float8_e5m2")
float8_e8m0 = ElementType(0x42, "float8_e8m0", 8, "ml_dtypes.float8_e8m0fnu")
float4_e2m1 = ElementType(0x43, "float4_e2m1", 4, "ml_dtypes.float4_e2m1fn")
float6_e2m3 = ElementType(0x44, "float6_e2m3", 6, "ml_dtypes.float6_e2m3fn")
float6_e3m2 = ElementType(0x45, "float6_e3m2", 6, "ml_dtypes.float6_e3m2fn")
# No IEEE binary128 dtype in NumPy: raw 16 bytes.
float128 = ElementType(0x46, "float128", 128, "V16")
int4 = ElementType(0x48, "int4", 4, "ml_dtypes.int4")
uint4 = ElementType(0x49, "uint4", 4, "ml_dtypes.uint4")
int2 = ElementType(0x4A, "int2", 2, "ml_dtypes.int2")
uint2 = ElementType(0x4B, "uint2", 2, "ml_dtypes.uint2")
complex64 = ElementType(0x50, "complex64", 64, np.complex64)
complex128 = ElementType(0x51, "complex128", 128, np.complex128)

#: Every element type above, in tag order.
ELEMENT_TYPES = tuple(t for t in list(globals().values()) if isinstance(t, ElementType))

__all__ = [
    "ELEMENT_TYPES",
    "ElementType",
    "element_type_from_name",
    "element_type_from_tag",
    "element_type_of",
    "preload",
    *(repr(t).removeprefix("hurray_wire.") for t in ELEMENT_TYPES),  # float16, ..., bool_
]
_BY_TAG = {t.tag: t for t in ELEMENT_TYPES}
_BY_NAME = {t.name: t for t in ELEMENT_TYPES}
_BY_DTYPE: dict[np.dtype[np.generic], ElementType] = {
    np.dtype(t.dtype_source): t  # type: ignore[call-overload]
    for t in ELEMENT_TYPES
    if not (isinstance(t.dtype_source, str) and t.dtype_source.startswith("ml_dtypes."))
    and t.tag != 0x46
}


def preload() -> None:
    """Resolve every element type's NumPy dtype now, importing ``ml_dtypes`` (about 1 s
    on a first import): call it at start-up so that the first bfloat16 / fp8 decode of a
    request does not pay it."""
    for element_type in ELEMENT_TYPES:
        element_type.numpy_dtype  # noqa: B018 - resolves and caches it


def element_type_from_tag(tag: int) -> ElementType:
    """The element type of a wire tag; invalid, reserved and unknown tags are refused."""
    try:
        return _BY_TAG[tag]
    except KeyError:
        raise InvalidDescriptorError(
            f"{_tag_class(tag)} element type tag", field="type_tag", found=f"0x{tag:02X}"
        ) from None


def _tag_class(tag: int) -> str:
    if tag in (0x00, 0xFF):
        return "invalid"
    if tag == 0x47 or 0x80 <= tag <= 0xEF:
        return "reserved"
    if 0xF0 <= tag <= 0xFE:
        return "private extension"
    return "unknown"


def element_type_from_name(name: str) -> ElementType:
    """The element type called ``name`` in the spec's table (e.g. ``"bfloat16"``)."""
    try:
        return _BY_NAME[name]
    except (KeyError, TypeError):
        raise InvalidDescriptorError(
            "unknown element type name",
            field="element_type",
            found=repr(name),
            expected=f"one of {sorted(_BY_NAME)}",
        ) from None


def element_type_of(value: object) -> ElementType:
    """Coerce an ElementType, a spec name or a NumPy dtype to an ElementType."""
    if isinstance(value, ElementType):
        return value
    if isinstance(value, str) and value in _BY_NAME:
        return _BY_NAME[value]
    if value is None:  # np.dtype(None) would silently mean float64
        raise InvalidDescriptorError(
            "an element type is required", field="element_type", found=None
        )
    try:
        dtype = np.dtype(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        raise InvalidDescriptorError(
            "not an element type", field="element_type", found=repr(value)
        ) from None
    found = _BY_DTYPE.get(dtype)
    if found is None and len(_BY_DTYPE) < len(ELEMENT_TYPES) - 1:
        # the ml_dtypes types join the table on a first miss (their dtype's holder has
        # imported ml_dtypes already)
        _BY_DTYPE.update({t.numpy_dtype: t for t in ELEMENT_TYPES if t.tag != 0x46})
        found = _BY_DTYPE.get(dtype)
    if found is None:
        raise InvalidDescriptorError(
            "NumPy dtype has no Hurray element type", field="element_type", found=str(dtype)
        )
    return found
