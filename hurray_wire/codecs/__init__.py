"""Storage codecs and checksums of blob sections: pure functions of bytes.

A section is stored raw, as one zstd frame, as one zstd frame of its byte-shuffled bytes
(the byte planes of 2/4/8-byte elements side by side, so that exponent bytes compress
together), or cut into chunks that are shuffled and compressed independently, so that
several cores can compress and decompress one section and each chunk is unshuffled while
it is in cache (docs/wire-format.md section 6; choices measured in docs/compression.md).

Each codec is one module implementing :class:`~hurray_wire.codecs.base.Codec`, looked up
by id in :mod:`~hurray_wire.codecs.registry`; :class:`Compression` is the configuration, a
value object. Decoding trusts nothing, and every failure is a
:class:`~hurray_wire.errors.HurrayWireError`. This module only re-exports.
"""

from __future__ import annotations

from hurray_wire.codecs import byteshuffle, registry
from hurray_wire.codecs.base import Codec
from hurray_wire.codecs.chunked import CHUNK_SIZE_MAX, CHUNK_SIZE_MIN, CHUNKED_WIDTHS, CODEC_CHUNKED
from hurray_wire.codecs.config import DEFAULT_COMPRESSION, Compression, check_threads, parse_spec
from hurray_wire.codecs.raw import CODEC_RAW
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
from hurray_wire.codecs.shuffle_zstd import CODEC_SHUFFLE_ZSTD, SHUFFLE_WIDTHS
from hurray_wire.codecs.zstd import CODEC_ZSTD
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
