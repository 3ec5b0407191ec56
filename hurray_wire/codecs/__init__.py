"""Storage codecs of blob sections, pure functions of bytes: raw, zstd, byte-shuffled zstd,
and independent shuffled chunks that several cores (de)compress (docs/wire-format.md § 6,
docs/compression.md): raw in ``base`` beside the interface, both zstd codecs and their
frames in ``zstd``, ``chunked``; by id in ``registry``. Here, one section's stored bytes by
codec id: entry points that check a caller's arguments once (:func:`decode_section`: the
blob decoder's, whose table checked them); the codecs refuse bad stored bytes whatever the
entry."""

from __future__ import annotations

from typing import Any, Union

import numpy as np
import xxhash
import zstandard

from hurray_wire.buffers import U8Array, u8_array, writable_u8
from hurray_wire.codecs import byteshuffle, registry
from hurray_wire.codecs.base import CODEC_RAW, Codec, Progress, bytes_view
from hurray_wire.codecs.chunked import CHUNK_SIZE_MAX, CHUNK_SIZE_MIN, CHUNKED_WIDTHS, CODEC_CHUNKED
from hurray_wire.codecs.config import (
    DEFAULT_COMPRESSION,
    Compression,
    check_threads,
    int_arg,
    parse_spec,
)
from hurray_wire.codecs.registry import BY_ID, get
from hurray_wire.codecs.zstd import CODEC_SHUFFLE_ZSTD, CODEC_ZSTD, SHUFFLE_WIDTHS
from hurray_wire.errors import (
    ArgumentTypeError,
    CodecConfigError,
    DecompressionError,
    HurrayWireError,
)

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

Buffer = Union[bytes, bytearray, memoryview, "np.ndarray[Any, Any]"]


def valid_codec_param(codec: int, param: int) -> bool:
    """Whether ``param`` is a legal codec parameter for ``codec`` (0 for an unknown id,
    as the section table's rules have it for raw and zstd)."""
    found = BY_ID.get(codec)
    return param == 0 if found is None else found.valid_param(param)


def _writable_u8(out: object, size: int | None, name: str) -> U8Array:
    """A caller's output array as a flat uint8 view, of ``size`` bytes unless None."""
    flat = writable_u8(out, name)
    if size is not None and flat.size != size:
        raise CodecConfigError(
            f"{name} has the wrong size", field=name, expected=size, found=flat.size
        )
    return flat


def _check_no_overlap(a: U8Array, b: U8Array, what: str) -> None:
    if a.size and b.size and np.may_share_memory(a, b):
        raise CodecConfigError(f"{what} must not overlap")


# -- checksum --------------------------------------------------------------------------


def checksum(data: Buffer) -> int:
    """xxh3_64 of the bytes (the blob's checksum of stored bytes): ~30 GB/s."""
    if type(data) is bytes:
        return int(xxhash.xxh3_64_intdigest(data))
    return int(xxhash.xxh3_64_intdigest(bytes_view(u8_array(data, "data"))))


# -- byte shuffle ----------------------------------------------------------------------


def _width_arg(width: object, name: str = "width") -> int:
    w = int_arg(width, name)
    if w < 1:
        raise CodecConfigError(f"{name} must be at least 1", field=name, found=w)
    return w


def _shuffled(src: Buffer, width: int, out: U8Array | None, kernel: Any) -> U8Array:
    """Check the operands of shuffle_bytes / unshuffle_bytes, then run ``kernel``."""
    s = u8_array(src, "src")
    w = _width_arg(width)
    o = np.empty(s.size, np.uint8) if out is None else _writable_u8(out, s.size, "out")
    _check_no_overlap(s, o, "src and out")
    kernel(s, w, o)
    return o if out is None else out


def shuffle_bytes(src: Buffer, width: int, out: U8Array | None = None) -> U8Array:
    """Group byte j of every ``width``-byte element into plane j, a tail of
    ``len(src) % width`` bytes copied unchanged; returns ``out`` (c-blosc2's SIMD kernel
    when installed: :mod:`hurray_wire.codecs.byteshuffle`)."""
    return _shuffled(src, width, out, byteshuffle.shuffle_into)


def unshuffle_bytes(src: Buffer, width: int, out: U8Array | None = None) -> U8Array:
    """Inverse of :func:`shuffle_bytes` for the same ``width``. Returns ``out``."""
    return _shuffled(src, width, out, byteshuffle.unshuffle_into)


# -- compression -----------------------------------------------------------------------


def compress(data: Buffer, compression: Compression, element_width: int) -> tuple[int, int, Buffer]:
    """Compress one section of ``element_width``-byte elements (shuffled when 2, 4 or 8):
    ``(codec_id, codec_param, stored_bytes)``, or ``(CODEC_RAW, 0, data)`` for a section
    below ``compression.min_size`` or one zstd cannot shrink."""
    codec, param, parts = compress_parts(data, compression, element_width)
    if codec == CODEC_RAW:
        return codec, param, data
    return codec, param, parts[0] if len(parts) == 1 else b"".join(parts)


def compress_parts(
    data: Buffer, compression: Compression, element_width: int
) -> tuple[int, int, list[bytes]]:
    """:func:`compress`, with the stored bytes as pieces to be written one after the other
    (the blob encoder copies each piece once, instead of joining them first). A raw
    result has no pieces: the section is ``data`` itself."""
    if not isinstance(compression, Compression):
        raise ArgumentTypeError(
            "compression must be a Compression (see Compression.parse)",
            field="compression",
            found=type(compression).__name__,
        )
    width = _width_arg(element_width, "element_width")
    src = u8_array(data, "data")
    size = src.size
    if size == 0 or size < compression.min_size:
        return CODEC_RAW, 0, []
    codec = BY_ID[compression.codec].for_width(width)
    try:
        param, stored = codec.encode(src, compression, width)
    except zstandard.ZstdError as exc:
        raise HurrayWireError(f"zstd compression failed: {exc}") from exc
    if sum(map(len, stored)) >= size:
        return CODEC_RAW, 0, []
    return codec.codec_id, param, stored


# -- decompression ---------------------------------------------------------------------


def decompress_into(
    codec: int, codec_param: int, stored: Buffer, out: U8Array, *, threads: int = -1
) -> None:
    """Decode a stored section into ``out`` (its raw size), never allocating more on the
    stored bytes' behalf; bad bytes, codec or width raise :class:`DecompressionError`.
    ``threads`` (-1: every usable core) decode a chunked section's chunks."""
    codec, param, threads, src = _decode_args(codec, codec_param, threads, stored)
    dst = _writable_u8(out, None, "out")
    _check_no_overlap(src, dst, "stored and out")
    BY_ID[codec].decode_into(param, src, dst.size, dst, threads)


def decompress(
    codec: int, codec_param: int, stored: Buffer, raw_size: int, *, threads: int = -1
) -> U8Array:
    """:func:`decompress_into` a new array of ``raw_size`` bytes, allocated only once the
    stored bytes' layout (chunk table, frame header) has passed its checks; an allocation
    that fails is a :class:`LimitExceededError`."""
    codec, param, threads, src = _decode_args(codec, codec_param, threads, stored)
    size = int_arg(raw_size, "raw_size")
    if size < 0:
        raise CodecConfigError("raw_size must not be negative", field="raw_size", found=size)
    return BY_ID[codec].decode_into(param, src, size, None, threads)


def decode_section(
    codec: int, codec_param: int, stored: U8Array, raw_size: int, threads: int,
    out: U8Array | None = None, progress: Progress | None = None,
) -> U8Array:  # fmt: skip
    """:func:`decompress` without the argument checks (the blob decoder's section table made
    them), never without the stored bytes' checks. ``progress(n)``: the output's first
    ``n`` bytes are final (``Codec.progressive``)."""
    found = BY_ID[codec]
    if progress is not None and found.progressive:
        return found.decode_into(codec_param, stored, raw_size, out, threads, progress)  # type: ignore[call-arg]
    dst = found.decode_into(codec_param, stored, raw_size, out, threads)
    if progress is not None:
        progress(raw_size)
    return dst


def _decode_args(
    codec: object, codec_param: object, threads: object, stored: Buffer
) -> tuple[int, int, int, U8Array]:
    """Checked (codec, parameter, threads, stored bytes as uint8) of a decode call."""
    codec_id = int_arg(codec, "codec")
    param = int_arg(codec_param, "codec_param")
    found = get(codec_id)
    if not found.valid_param(param):
        raise DecompressionError(
            f"{found.name} section has an invalid codec parameter",
            field="codec_param",
            expected=found.expected_params(),
            found=param,
        )
    return codec_id, param, check_threads(threads), u8_array(stored, "stored")
