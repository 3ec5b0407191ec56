"""Storage codecs of blob sections, pure functions of bytes (re-exports only): raw, zstd,
byte-shuffled zstd, and independent shuffled chunks that several cores (de)compress
(docs/wire-format.md § 6, docs/compression.md): raw in ``base`` beside the interface, both
zstd codecs and their frames in ``zstd``, ``chunked``; by id in ``registry``."""

from __future__ import annotations

from hurray_wire.codecs import byteshuffle, registry
from hurray_wire.codecs.base import CODEC_RAW, Codec
from hurray_wire.codecs.chunked import CHUNK_SIZE_MAX, CHUNK_SIZE_MIN, CHUNKED_WIDTHS, CODEC_CHUNKED
from hurray_wire.codecs.config import DEFAULT_COMPRESSION, Compression, check_threads, parse_spec
from hurray_wire.codecs.sections import (
    Buffer,
    checksum,
    compress,
    compress_parts,
    decode_section,
    decompress,
    decompress_into,
    shuffle_bytes,
    unshuffle_bytes,
    valid_codec_param,
)
from hurray_wire.codecs.zstd import CODEC_SHUFFLE_ZSTD, CODEC_ZSTD, SHUFFLE_WIDTHS
from hurray_wire.errors import CodecConfigError

__all__ = [
    "CHUNKED_WIDTHS",
    "CHUNK_SIZE_MAX",
    "CHUNK_SIZE_MIN",
    "CODEC_CHUNKED",
    "CODEC_NAMES",
    "CODEC_RAW",
    "CODEC_SHUFFLE_ZSTD",
    "CODEC_ZSTD",
    "DEFAULT_COMPRESSION",
    "SHUFFLE_WIDTHS",
    "Buffer",
    "Codec",
    "CodecConfigError",
    "Compression",
    "byteshuffle",
    "check_threads",
    "checksum",
    "compress",
    "compress_parts",
    "decode_section",
    "decompress",
    "decompress_into",
    "parse_spec",
    "registry",
    "shuffle_bytes",
    "unshuffle_bytes",
    "valid_codec_param",
]

#: Name of each built-in codec by id (docs/wire-format.md section 6); the registry is
#: the live table (:func:`registry.names`).
CODEC_NAMES: dict[int, str] = registry.names()
