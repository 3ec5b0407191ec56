"""Codec 0, raw: the stored bytes are the raw bytes (docs/wire-format.md section 6)."""

from __future__ import annotations

import numpy as np

from hurray_wire.buffers import U8Array
from hurray_wire.codecs.base import Codec, Settings, output
from hurray_wire.errors import DecompressionError

__all__ = ["CODEC_RAW", "RAW", "Raw"]

CODEC_RAW = 0


class Raw(Codec):
    """No compression. No :class:`Compression` selects it (that is None); encoders store
    a section raw when it is small or compression would not shrink it."""

    codec_id = CODEC_RAW
    name = "raw"
    compresses = False

    def encode(self, src: U8Array, config: Settings, width: int) -> tuple[int, list[bytes]]:
        """The raw bytes themselves, as one piece (a copy: blob encoders never call this,
        a raw section is written from the tensor's own arrays)."""
        return 0, [src.tobytes()]

    def decode_into(
        self, param: int, stored: U8Array, raw_size: int, out: U8Array | None, threads: int
    ) -> U8Array:
        """Copy ``stored``, which must be exactly ``raw_size`` bytes."""
        if stored.size != raw_size:
            raise DecompressionError(
                "raw section's stored size differs from its raw size",
                field="stored",
                expected=raw_size,
                found=stored.size,
            )
        dst = output(out, raw_size)
        np.copyto(dst, stored)
        return dst


RAW = Raw()
