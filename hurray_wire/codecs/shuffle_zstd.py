"""Codec 2, shuffle-zstd: one zstd frame of the raw bytes shuffled by the codec parameter's
width, so that float exponents compress together (docs/wire-format.md § 6)."""

from __future__ import annotations

from hurray_wire.buffers import U8Array
from hurray_wire.codecs.base import Codec, Settings
from hurray_wire.codecs.compressor import compress_frame, frame_threads
from hurray_wire.codecs.zstd import ZSTD, Zstd

__all__ = ["CODEC_SHUFFLE_ZSTD", "SHUFFLE_WIDTHS", "SHUFFLE_ZSTD", "ShuffleZstd"]

CODEC_SHUFFLE_ZSTD = 2
#: Element widths the shuffle codec may name in its codec parameter. Writers shuffle
#: elements of these widths only: a shuffle of 1-byte or odd-width elements gains nothing.
SHUFFLE_WIDTHS: frozenset[int] = frozenset({2, 4, 8})


class ShuffleZstd(Zstd):
    """Byte shuffle, then one zstd frame: decodes on one thread, after the whole frame."""

    codec_id = CODEC_SHUFFLE_ZSTD
    name = "shuffle-zstd"
    params = SHUFFLE_WIDTHS

    def for_width(self, width: int) -> Codec:
        """Plain zstd for elements whose shuffle is the identity (int8, fp8)."""
        return self if width in SHUFFLE_WIDTHS else ZSTD

    def encode(self, src: U8Array, config: Settings, width: int) -> tuple[int, list[bytes]]:
        """One frame of the bytes shuffled by ``width`` (2, 4 or 8: see :meth:`for_width`)."""
        return width, compress_frame(src, config.level, width, frame_threads(config, src.size))


SHUFFLE_ZSTD = ShuffleZstd()
