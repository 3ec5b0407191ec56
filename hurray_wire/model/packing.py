"""Bit packing of the sub-byte element types (descriptor.md § 4): pure array transforms.

bool: 8 per byte, LSB first. 4-bit: low nibble first. 2-bit: element j of a byte in bits
2j+1..2j. 6-bit: four elements in three bytes, as the little-endian 24-bit integer
``v0 | v1 << 6 | v2 << 12 | v3 << 18`` ([A27]). Padding bits are zero.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from hurray_wire.dtypes import ElementType
from hurray_wire.errors import InvalidTensorError


def pack(values: npt.NDArray[Any], element_type: ElementType) -> npt.NDArray[np.uint8]:
    """Pack an array of a sub-byte element type into its wire bytes (1-D uint8)."""
    if not element_type.is_packed:
        raise InvalidTensorError("not a packed element type", found=element_type.name)
    if values.dtype != element_type.numpy_dtype:
        raise InvalidTensorError(
            "array dtype does not match the element type",
            found=str(values.dtype),
            expected=str(element_type.numpy_dtype),
        )
    bits = element_type.bit_width
    if bits == 1:  # bool: its bytes are its codes
        packed: npt.NDArray[np.uint8] = np.packbits(
            values.view(np.uint8).ravel(), bitorder="little"
        )
        return packed
    flat = np.ascontiguousarray(values).ravel().view(np.uint8)  # the raw bit patterns
    codes: npt.NDArray[np.uint8] = np.bitwise_and(flat, np.uint8((1 << bits) - 1))
    count = codes.size
    if bits == 6:
        padded = np.zeros(-(-count // 4) * 4, np.uint32)
        padded[:count] = codes
        quads = padded.reshape(-1, 4)
        word = quads[:, 0] | quads[:, 1] << 6 | quads[:, 2] << 12 | quads[:, 3] << 18
        packed6: npt.NDArray[np.uint8] = word.astype("<u4").view(np.uint8)
        trimmed: npt.NDArray[np.uint8] = packed6.reshape(-1, 4)[:, :3].ravel().copy()
        return trimmed
    per_byte = 8 // bits
    padded8 = np.zeros(-(-count // per_byte) * per_byte, np.uint8)
    padded8[:count] = codes
    groups = padded8.reshape(-1, per_byte)
    out = np.zeros(groups.shape[0], np.uint8)
    for j in range(per_byte):
        out |= groups[:, j] << np.uint8(j * bits)
    return out


def unpack(data: npt.NDArray[np.uint8], element_type: ElementType, count: int) -> npt.NDArray[Any]:
    """Unpack ``count`` elements of a sub-byte type from wire bytes (1-D, element dtype)."""
    bits = element_type.bit_width
    if data.size < element_type.byte_size(count):
        raise InvalidTensorError(
            "too few bytes to unpack", found=data.size, expected=element_type.byte_size(count)
        )
    raw = np.asarray(data, np.uint8).ravel()
    if bits == 1:
        return np.unpackbits(raw, count=count, bitorder="little").view(np.bool_)
    if bits == 6:
        triples = raw[: -(-count // 4) * 3].reshape(-1, 3).astype(np.uint32)
        word = triples[:, 0] | triples[:, 1] << 8 | triples[:, 2] << 16
        codes = np.stack([(word >> (6 * j)) & 0x3F for j in range(4)], axis=1).ravel()[:count]
        return codes.astype(np.uint8).view(element_type.numpy_dtype)
    per_byte = 8 // bits
    mask = np.uint8((1 << bits) - 1)
    codes8 = np.stack([(raw >> np.uint8(j * bits)) & mask for j in range(per_byte)], axis=1)
    return np.ascontiguousarray(codes8.ravel()[:count]).view(element_type.numpy_dtype)


def first_padding_bit_byte(
    data: npt.NDArray[np.uint8], element_type: ElementType, count: int
) -> int | None:
    """The index of the first byte of ``data`` holding a set padding bit (after ``count``
    elements: descriptor.md § 4 wants them zero, so no bits hide in a pool), or None."""
    used = element_type.byte_size(count)
    if data.size > used:
        beyond = data[used:]
        if beyond.any():
            return used + int(np.argmax(beyond != 0))
    bits = element_type.bit_width
    if bits == 6:
        group = data[max(0, used - 3) : used]
        if count % 4 == 0 or group.size < 3:
            return None
        word = int(group[0]) | int(group[1]) << 8 | int(group[2]) << 16
        padding = word >> (6 * (count % 4)) << (6 * (count % 4))  # the bits after the last
        if not padding:
            return None
        lowest = (padding & -padding).bit_length() - 1
        return used - 3 + lowest // 8
    per_byte = 8 // bits
    if count % per_byte == 0 or used == 0:
        return None
    if int(data[used - 1]) >> (bits * (count % per_byte)):
        return used - 1
    return None
