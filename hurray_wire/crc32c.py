"""CRC-32C (Castagnoli; ``crc32c(b"123456789") == 0xE3069283``) for the ``.hrry`` trailer
(containers.md § B.6), through google-crc32c, handed a zero-copy ``uint8`` view."""

from __future__ import annotations

from typing import Any

import google_crc32c
import numpy as np

from hurray_wire.buffers import u8_array
from hurray_wire.errors import ArgumentTypeError

__all__ = ["CRC32C_CHECK", "crc32c"]

CRC32C_CHECK = 0xE3069283  # crc32c(b"123456789"), the catalogue check value


def crc32c(data: bytes | bytearray | memoryview | np.ndarray[Any, Any], crc: int = 0) -> int:
    """CRC-32C of ``data``; pass a previous result as ``crc`` to continue over a next chunk."""
    if isinstance(crc, bool) or not isinstance(crc, int) or not 0 <= crc <= 0xFFFF_FFFF:
        raise ArgumentTypeError(
            "crc must be a previous CRC-32C value",
            field="crc",
            expected="int in [0, 2**32)",
            found=repr(crc),
        )
    value: int = google_crc32c.extend(crc, u8_array(data, "data", allow_copy=True))
    return value
