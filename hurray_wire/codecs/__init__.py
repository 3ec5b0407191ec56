"""Storage codecs of blob sections, pure functions of bytes: raw, zstd, byte-shuffled zstd,
and independent shuffled chunks that several cores (de)compress (docs/wire-format.md § 6,
docs/compression.md): raw in ``base`` beside the interface, both zstd codecs and their
frames in ``zstd``, ``chunked``; by id in ``registry``. Here, how encode compresses:
:class:`Compression`, a value object checked once when built (configuration is data, kept
apart from the bytes), and the edges' text specs (``"zstd:3"``, :func:`parse_spec`); and one
section's stored bytes by codec id: entry points that check a caller's arguments once
(:func:`decode_section`: the blob decoder's, whose table checked them); the codecs refuse
bad stored bytes whatever the entry."""

from __future__ import annotations

import operator
import re
from dataclasses import dataclass
from typing import Any, Union

import numpy as np
import xxhash
import zstandard

from hurray_wire.buffers import U8Array, u8_array, writable_u8
from hurray_wire.codecs import byteshuffle, registry
from hurray_wire.codecs.base import CODEC_RAW, Codec, Progress, bytes_view
from hurray_wire.codecs.chunked import (
    CHUNK_SIZE_MAX,
    CHUNK_SIZE_MIN,
    CHUNKED_WIDTHS,
    CODEC_CHUNKED,
    is_chunk_size,
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

_MIN_LEVEL = 1
_MAX_LEVEL: int = zstandard.MAX_COMPRESSION_LEVEL
_SPEC_RE = re.compile(r"([a-z0-9-]+)(?::([0-9]{1,3}))?")


def int_arg(value: object, name: str) -> int:
    """Return value as an int; bools and non-integers are type errors."""
    if isinstance(value, bool):
        raise ArgumentTypeError(f"{name} must be an int", field=name, found=type(value).__name__)
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise ArgumentTypeError(
            f"{name} must be an int", field=name, found=type(value).__name__
        ) from None


def check_threads(threads: object) -> int:
    """A thread count as the codecs take it: -1 (every usable core), 0 (the caller only)
    or a count; anything else is refused."""
    value = int_arg(threads, "threads")
    if value < -1:
        raise CodecConfigError(
            "threads must be -1 (every core), 0 (the caller only) or a thread count",
            field="threads",
            found=value,
        )
    return value


def _names(names: list[str]) -> str:
    """``a, b or c``, as the error messages list choices."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


@dataclass(frozen=True)
class Compression:
    """How encode compresses sections: ``codec``, a compressing codec's id; ``level``, zstd's
    (1-22); ``threads`` (0: the caller, -1: every usable core) for the chunked codec's
    chunks or zstd's workers from 1 MiB; ``min_size``, below which sections stay raw;
    ``chunk_size``, the chunked codec's (a power of two, 4 KiB to 1 GiB)."""

    codec: int
    level: int = 1
    threads: int = 0
    min_size: int = 4096
    chunk_size: int = 1 << 20

    def __post_init__(self) -> None:
        codec = int_arg(self.codec, "codec")
        level = int_arg(self.level, "level")
        threads = check_threads(self.threads)
        min_size = int_arg(self.min_size, "min_size")
        chunk_size = int_arg(self.chunk_size, "chunk_size")
        found = registry.find(codec)
        if found is None or not found.compresses:
            choices = registry.compressing()
            raise CodecConfigError(
                f"compression codec must be {_names([c.name for c in choices])} "
                "(no compression is None)",
                field="codec",
                expected=_names([str(c.codec_id) for c in choices]),
                found=codec,
            )
        if not is_chunk_size(chunk_size):
            raise CodecConfigError(
                "chunk_size must be a power of two",
                field="chunk_size",
                expected=f"{CHUNK_SIZE_MIN}..{CHUNK_SIZE_MAX}",
                found=chunk_size,
            )
        if not _MIN_LEVEL <= level <= _MAX_LEVEL:
            raise CodecConfigError(
                "zstd level out of range",
                field="level",
                expected=f"{_MIN_LEVEL}..{_MAX_LEVEL}",
                found=level,
            )
        if min_size < 0:
            raise CodecConfigError(
                "min_size must not be negative", field="min_size", found=min_size
            )
        # Normalise integer-like values (np.uint8, ...) to plain ints.
        object.__setattr__(self, "codec", codec)
        object.__setattr__(self, "level", level)
        object.__setattr__(self, "threads", threads)
        object.__setattr__(self, "min_size", min_size)
        object.__setattr__(self, "chunk_size", chunk_size)

    def __str__(self) -> str:
        return f"{registry.get(self.codec).name}:{self.level}"

    @classmethod
    def parse(cls, spec: str | Compression | None) -> Compression | None:
        """:func:`parse_spec` for a text spec; a Compression or None comes back as it is
        (for callers that hold either, such as a fixture's options)."""
        if spec is None or isinstance(spec, Compression):
            return spec
        return parse_spec(spec)


def parse_spec(spec: str) -> Compression | None:
    """Read a CLI/config spec: "none" (or "raw"), "default", or a compressing codec's
    name with an optional zstd level, such as "zstd:3" or "chunked-shuffle-zstd"."""
    if not isinstance(spec, str):
        raise ArgumentTypeError(
            "compression must be a str, a Compression or None",
            field="compression",
            found=type(spec).__name__,
        )
    text = spec.strip().lower()
    if text in ("none", "raw"):
        return None
    if text == "default":
        return DEFAULT_COMPRESSION
    match = _SPEC_RE.fullmatch(text)
    codec = None if match is None else registry.find_name(match.group(1))
    if match is None or codec is None or not codec.compresses:
        names = [f'"{c.name}[:LEVEL]"' for c in registry.compressing()]
        raise CodecConfigError(
            "unknown compression spec",
            field="compression",
            expected=_names(['"none"', '"default"', *names]),
            found=repr(spec),
        )
    level = 1 if match.group(2) is None else int(match.group(2))
    return Compression(codec.codec_id, level=level, threads=codec.spec_threads)


#: 1 MiB chunks, each byte-shuffled and compressed at zstd level 1, on every usable core:
#: smaller and faster than plain zstd-3 and than blosc2 (shuffle + zstd) on fp16 and
#: bf16 KV data (docs/compression.md).
DEFAULT_COMPRESSION = Compression(
    CODEC_CHUNKED,
    level=1,
    threads=-1,
    min_size=4096,
    chunk_size=1 << 20,
)

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
