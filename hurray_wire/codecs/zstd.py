"""Codec 1, zstd: one zstd frame (RFC 8878) of the raw bytes (docs/wire-format.md section 6)."""

from __future__ import annotations

from hurray_wire.buffers import U8Array
from hurray_wire.codecs.base import Codec, Progress, Settings, output
from hurray_wire.codecs.compressor import compress_frame, frame_threads
from hurray_wire.codecs.frames import decode_frame, frame_header

__all__ = ["CODEC_ZSTD", "ZSTD", "Zstd"]

CODEC_ZSTD = 1


class Zstd(Codec):
    """Plain zstd: the codec for 1-byte and odd-width elements, whose shuffle is the
    identity, and for data with no float structure."""

    codec_id = CODEC_ZSTD
    name = "zstd"
    progressive = True

    def encode(self, src: U8Array, config: Settings, width: int) -> tuple[int, list[bytes]]:
        """One frame at ``config.level``; zstd's own threads for sections of 1 MiB or more."""
        return 0, compress_frame(src, config.level, 1, frame_threads(config, src.size))

    def decode_into(
        self, param: int, stored: U8Array, raw_size: int, out: U8Array | None, threads: int,
        progress: Progress | None = None,
    ) -> U8Array:  # fmt: skip
        """Check the frame header against ``raw_size``, then decode the one frame
        (unshuffled by ``param`` for shuffle-zstd, which shares this)."""
        header = frame_header(stored, raw_size, self.name)
        dst = output(out, raw_size)
        decode_frame(stored, dst, param or 1, self.name, header, progress)
        return dst


ZSTD = Zstd()
