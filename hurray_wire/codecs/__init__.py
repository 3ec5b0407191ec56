"""Storage codecs and checksums of blob sections: pure functions of bytes.

A section is stored raw, as one zstd frame, as one zstd frame of its byte-shuffled bytes
(the byte planes of 2/4/8-byte elements side by side, so that exponent bytes compress
together), or cut into chunks that are shuffled and compressed independently, so that
several cores can compress and decompress one section and each chunk is unshuffled while
it is in cache. Choices below are measured in docs/compression.md.

Decoding trusts nothing: every zstd frame must declare the caller's raw size (or no
size), end where its stored bytes end, and decompress to exactly that size; a chunk table
is checked against the stored and raw sizes before anything is allocated. Every failure
is a :class:`~hurray_wire.errors.HurrayWireError`.
"""

from __future__ import annotations

import functools
import itertools
import math
import operator
import re
import struct
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Union, cast

import numpy as np
import xxhash
import zstandard

from hurray_wire import parallel
from hurray_wire.buffers import U8Array, u8_array, writable_u8
from hurray_wire.codecs import byteshuffle
from hurray_wire.errors import (
    ArgumentTypeError,
    DecompressionError,
    HurrayWireError,
    LimitExceededError,
)

__all__ = [
    "CODEC_RAW",
    "CODEC_ZSTD",
    "CODEC_SHUFFLE_ZSTD",
    "CODEC_CHUNKED",
    "CODEC_NAMES",
    "SHUFFLE_WIDTHS",
    "CHUNKED_WIDTHS",
    "CHUNK_SIZE_MIN",
    "CHUNK_SIZE_MAX",
    "valid_codec_param",
    "CodecConfigError",
    "Compression",
    "DEFAULT_COMPRESSION",
    "checksum",
    "shuffle_bytes",
    "unshuffle_bytes",
    "compress",
    "compress_parts",
    "decompress",
    "decompress_into",
    "decode_section",
]

CODEC_RAW: int = 0
CODEC_ZSTD: int = 1
CODEC_SHUFFLE_ZSTD: int = 2
CODEC_CHUNKED: int = 3
CODEC_NAMES: dict[int, str] = {
    CODEC_RAW: "raw",
    CODEC_ZSTD: "zstd",
    CODEC_SHUFFLE_ZSTD: "shuffle-zstd",
    CODEC_CHUNKED: "chunked-shuffle-zstd",
}

#: Element widths the shuffle codec may name in its codec parameter.
SHUFFLE_WIDTHS: frozenset[int] = frozenset({2, 4, 8})
#: Shuffle widths of the chunked codec: 1 is no shuffle (1-byte or odd-width elements).
CHUNKED_WIDTHS: frozenset[int] = frozenset({1, 2, 4, 8})
#: Raw bytes per chunk of the chunked codec: a power of two in this range.
CHUNK_SIZE_MIN: int = 1 << 12
CHUNK_SIZE_MAX: int = 1 << 30
_CHUNK_HEAD = struct.Struct("<II")  # chunk_size, chunk_count; then count x u32 frame sizes
_U32 = struct.Struct("<I")
_SMALL_TABLE = 64

Buffer = Union[bytes, bytearray, memoryview, "np.ndarray[Any, Any]"]

_MIN_LEVEL = 1
_MAX_LEVEL: int = zstandard.MAX_COMPRESSION_LEVEL
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
# zstd allocates a window only when a frame does not declare its content size; such a
# frame may ask for at most max(raw size, this) bytes of window.
_UNKNOWN_SIZE_WINDOW_LIMIT = 8 << 20
# Below this size the planes go through zstd's streaming API with a block flush between
# them, so no zstd block mixes two planes (+2-5% ratio on 400 KB sections); above it the
# single mixed block costs <0.5% and one-shot compression is ~20% faster.
_PLANE_FLUSH_MAX = 1 << 20
_ZSTD_BLOCK = 128 << 10  # zstd's largest block: one-shot compression cuts blocks at its multiples
# zstd's multi-threaded mode only pays once there is more than one job of work.
_THREADS_MIN_SIZE = 1 << 20
# A top byte plane with fewer bits of entropy than this is coded better by Huffman
# literals than by matches (bf16 exponents): give zstd level 1 a tiny hash table.
_LOW_ENTROPY_BITS = 4.5
_LOW_ENTROPY_HASH_LOG = 6
_ENTROPY_SAMPLE = 1 << 10
_C_LOG2_C = np.zeros(_ENTROPY_SAMPLE + 1)  # c * log2(c), for entropy from counts
_C_LOG2_C[1:] = np.arange(1, _ENTROPY_SAMPLE + 1) * np.log2(np.arange(1, _ENTROPY_SAMPLE + 1))
_SCRATCH_MAX = 8 << 20


class CodecConfigError(HurrayWireError, ValueError):
    """A compression spec or codec argument with a bad value (not bad stored bytes)."""


def check_threads(threads: object) -> int:
    """A thread count as the codecs take it: -1 (every usable core), 0 (the caller only)
    or a count; anything else is refused."""
    value = _int_arg(threads, "threads")
    if value < -1:
        raise CodecConfigError(
            "threads must be -1 (every core), 0 (the caller only) or a thread count",
            field="threads",
            found=value,
        )
    return value


def _int_arg(value: object, name: str) -> int:
    """Return value as an int; bools and non-integers are type errors."""
    if isinstance(value, bool):
        raise ArgumentTypeError(f"{name} must be an int", field=name, found=type(value).__name__)
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise ArgumentTypeError(
            f"{name} must be an int", field=name, found=type(value).__name__
        ) from None


@dataclass(frozen=True)
class Compression:
    """How encode compresses sections; a value object, kept apart from the stored bytes.

    ``level`` is the zstd level (1-22; level 1 is the measured default and fastest).
    ``threads``: for the chunked codec, the threads that compress a section's chunks,
    the caller included; for zstd and shuffle-zstd, zstd's own worker count for sections
    of 1 MiB or more. 0 compresses on the calling thread, -1 uses every usable core.
    ``min_size``: smaller sections stay raw, because a frame header costs more than it
    saves there. ``chunk_size``: raw bytes per chunk of the chunked codec (a power of two,
    4 KiB to 1 GiB); ignored by the others.
    """

    codec: int
    level: int = 1
    threads: int = 0
    min_size: int = 4096
    chunk_size: int = 1 << 20

    def __post_init__(self) -> None:
        codec = _int_arg(self.codec, "codec")
        level = _int_arg(self.level, "level")
        threads = check_threads(self.threads)
        min_size = _int_arg(self.min_size, "min_size")
        chunk_size = _int_arg(self.chunk_size, "chunk_size")
        if codec not in (CODEC_ZSTD, CODEC_SHUFFLE_ZSTD, CODEC_CHUNKED):
            raise CodecConfigError(
                "compression codec must be zstd, shuffle-zstd or chunked-shuffle-zstd "
                "(no compression is None)",
                field="codec",
                expected=f"{CODEC_ZSTD}, {CODEC_SHUFFLE_ZSTD} or {CODEC_CHUNKED}",
                found=codec,
            )
        if not _is_chunk_size(chunk_size):
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
        return f"{CODEC_NAMES[self.codec]}:{self.level}"

    @classmethod
    def parse(cls, spec: str | Compression | None) -> Compression | None:
        """Read a CLI/config spec: None, "none", "default", or a codec name with an optional
        level: "zstd[:L]", "shuffle-zstd[:L]", "chunked-shuffle-zstd[:L]"."""
        if spec is None or isinstance(spec, Compression):
            return spec
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
        if match is None:
            raise CodecConfigError(
                "unknown compression spec",
                field="compression",
                expected='"none", "default", "zstd[:LEVEL]", "shuffle-zstd[:LEVEL]" or '
                '"chunked-shuffle-zstd[:LEVEL]"',
                found=repr(spec),
            )
        codec = _CODEC_OF_NAME[match.group(1)]
        level = 1 if match.group(2) is None else int(match.group(2))
        if codec == CODEC_CHUNKED:
            return cls(codec, level=level, threads=-1)
        return cls(codec, level=level)


_CODEC_OF_NAME = {CODEC_NAMES[c]: c for c in (CODEC_ZSTD, CODEC_SHUFFLE_ZSTD, CODEC_CHUNKED)}
_SPEC_RE = re.compile(r"(zstd|shuffle-zstd|chunked-shuffle-zstd)(?::([0-9]{1,3}))?")


def _is_chunk_size(value: int) -> bool:
    return CHUNK_SIZE_MIN <= value <= CHUNK_SIZE_MAX and value & (value - 1) == 0


def valid_codec_param(codec: int, param: int) -> bool:
    """Whether ``param`` is a legal codec parameter for ``codec`` (a known codec id)."""
    if codec == CODEC_SHUFFLE_ZSTD:
        return param in SHUFFLE_WIDTHS
    if codec == CODEC_CHUNKED:
        return param in CHUNKED_WIDTHS
    return param == 0


#: 1 MiB chunks, each byte-shuffled and compressed at zstd level 1, on every usable core:
#: smaller and faster than plain zstd-3 and than blosc2 (shuffle + zstd) on fp16 and
#: bf16 KV data (docs/compression.md).
DEFAULT_COMPRESSION = Compression(
    CODEC_CHUNKED, level=1, threads=-1, min_size=4096, chunk_size=1 << 20
)


# -- bytes-like arguments --------------------------------------------------------------


def _bytes_view(a: U8Array) -> memoryview:
    """A memoryview of a flat uint8 array (numpy's stubs do not declare the buffer protocol)."""
    return memoryview(cast(Any, a))


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
    return int(xxhash.xxh3_64_intdigest(_bytes_view(u8_array(data, "data"))))


# -- byte shuffle ----------------------------------------------------------------------


def _width_arg(width: object) -> int:
    w = _int_arg(width, "width")
    if w < 1:
        raise CodecConfigError("shuffle width must be at least 1", field="width", found=w)
    return w


def _shuffle_operands(src: Buffer, width: int, out: U8Array | None) -> tuple[U8Array, int, U8Array]:
    """Checked (source, width, output) of shuffle_bytes / unshuffle_bytes."""
    s = u8_array(src, "src")
    w = _width_arg(width)
    o = np.empty(s.size, np.uint8) if out is None else _writable_u8(out, s.size, "out")
    _check_no_overlap(s, o, "src and out")
    return s, w, o


def shuffle_bytes(src: Buffer, width: int, out: U8Array | None = None) -> U8Array:
    """Group byte j of every ``width``-byte element into plane j; a tail of
    ``len(src) % width`` bytes is copied unchanged at the end. Returns ``out`` (the same
    object when given, any C-contiguous shape of the right size). Runs c-blosc2's SIMD
    kernel when python-blosc2 is installed (:mod:`hurray_wire.codecs.byteshuffle`)."""
    s, w, o = _shuffle_operands(src, width, out)
    byteshuffle.shuffle_into(s, w, o)
    return o if out is None else out


def unshuffle_bytes(src: Buffer, width: int, out: U8Array | None = None) -> U8Array:
    """Inverse of :func:`shuffle_bytes` for the same ``width``. Returns ``out``."""
    s, w, o = _shuffle_operands(src, width, out)
    byteshuffle.unshuffle_into(s, w, o)
    return o if out is None else out


# -- compression -----------------------------------------------------------------------

_local = threading.local()
_MAX_CACHED_COMPRESSORS = 16


def _entropy_bits(plane: U8Array) -> float:
    """Order-0 entropy (bits per byte) of 1 KiB of ``plane``, every k-th byte (the plane
    was just written, so the strided reads hit cache). On the kv_sample data this reads
    fp16 top planes at 5.0-5.7 bits and bf16 ones at 2.3-2.9 (threshold 4.5)."""
    if plane.size > _ENTROPY_SAMPLE:
        plane = plane[:: plane.size // _ENTROPY_SAMPLE][:_ENTROPY_SAMPLE]
    if plane.size == 0:
        return 8.0
    counts = np.bincount(plane, minlength=256)
    return math.log2(plane.size) - float(_C_LOG2_C[counts].sum()) / plane.size


def _scratch(size: int) -> U8Array:
    """A per-thread reusable uint8 buffer for shuffled bytes.

    Fresh memory below NumPy's huge-page threshold costs a page fault per 4 KiB (a 400 KB
    section shuffled ~3x slower into fresh memory); big buffers are allocated each time,
    so a thread keeps at most _SCRATCH_MAX bytes.
    """
    if size > _SCRATCH_MAX:
        return np.empty(size, np.uint8)
    buf: U8Array | None = getattr(_local, "scratch", None)
    if buf is None or buf.size < size:
        buf = _local.scratch = np.empty(size, np.uint8)
    return buf[:size]


def _compressor(level: int, size: int, threads: int, hash_log: int | None) -> Any:
    """A zstd compressor for this level and input size, cached per thread.

    Contexts cost ~30 us to build, ten times the compression of a 4 KiB section, and
    deriving the parameters ~8 us, so the context is also looked up by these arguments
    (sections of one size, as the layers of a model are, skip both).
    """
    by_args: dict[tuple[int, int, int, int | None], Any] | None = getattr(_local, "by_args", None)
    if by_args is None:
        by_args = _local.by_args = {}
    args = (level, size, threads, hash_log)
    found = by_args.get(args)
    if found is not None:
        return found
    if len(by_args) >= _MAX_CACHED_COMPRESSORS:
        by_args.pop(next(iter(by_args)))
    by_args[args] = cctx = _compressor_for_params(level, size, threads, hash_log)
    return cctx


def _compressor_for_params(level: int, size: int, threads: int, hash_log: int | None) -> Any:
    """The cached context for the zstd parameters these arguments give."""
    overrides: dict[str, int] = {}
    if hash_log is not None:
        base = zstandard.ZstdCompressionParameters.from_level(level, source_size=size)
        overrides["hash_log"] = min(base.hash_log, hash_log)
    params = zstandard.ZstdCompressionParameters.from_level(
        level, source_size=size, threads=threads, **overrides
    )
    key = (
        params.window_log,
        params.hash_log,
        params.chain_log,
        params.search_log,
        params.min_match,
        params.target_length,
        params.strategy,
        params.threads,
    )
    cache: dict[tuple[int, ...], Any] | None = getattr(_local, "compressors", None)
    if cache is None:
        cache = _local.compressors = {}
    cctx = cache.get(key)
    if cctx is None:
        if len(cache) >= _MAX_CACHED_COMPRESSORS:
            cache.pop(next(iter(cache)))
        cctx = cache[key] = zstandard.ZstdCompressor(compression_params=params)
    return cctx


def _compress_planes(cctx: Any, data: U8Array, plane_size: int, width: int) -> list[bytes]:
    """One frame whose blocks never straddle two byte planes, as pieces to be joined."""
    cobj = cctx.compressobj(size=data.size)
    parts = []
    for j in range(width - 1):
        parts.append(cobj.compress(data[j * plane_size : (j + 1) * plane_size]))
        parts.append(cobj.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK))
    parts.append(cobj.compress(data[(width - 1) * plane_size :]))  # last plane + tail
    parts.append(cobj.flush(zstandard.COMPRESSOBJ_FLUSH_FINISH))
    return [p for p in parts if p]


def _frame(src: U8Array, level: int, width: int, threads: int) -> list[bytes]:
    """One zstd frame of ``src``, byte-shuffled first when ``width`` > 1, as pieces."""
    size = src.size
    if width == 1:
        return [_compressor(level, size, threads, None).compress(src)]
    shuffled = _scratch(size)
    byteshuffle.shuffle_into(src, width, shuffled)
    plane_size = size // width
    hash_log = None
    if level == 1:
        top = shuffled[(width - 1) * plane_size : width * plane_size]
        if _entropy_bits(top) < _LOW_ENTROPY_BITS:
            hash_log = _LOW_ENTROPY_HASH_LOG
    cctx = _compressor(level, size, threads, hash_log)
    # One-shot compression cuts blocks at multiples of 128 KiB: when the planes end on
    # such a multiple (1 MiB chunks), no block straddles two planes anyway, and one-shot
    # is ~15% faster than the streaming API.
    if size <= _PLANE_FLUSH_MAX and plane_size % _ZSTD_BLOCK:
        return _compress_planes(cctx, shuffled, plane_size, width)
    return [cctx.compress(shuffled)]


def _chunked(src: U8Array, compression: Compression, width: int) -> list[bytes]:
    """The chunked codec's stored bytes as pieces: chunk table, then each chunk's frame."""
    chunk = compression.chunk_size
    level = compression.level
    if src.size <= chunk:  # one chunk, on the caller: no task list (~5% of a 384 KiB one)
        frames = [_frame(src, level, width, 0)]
    else:
        starts = range(0, src.size, chunk)
        tasks = [functools.partial(_frame, src[a : a + chunk], level, width, 0) for a in starts]
        frames = parallel.run_tasks(tasks, compression.threads)
    sizes = [sum(map(len, f)) for f in frames]
    if len(sizes) <= _SMALL_TABLE:
        table = struct.pack(f"<II{len(sizes)}I", chunk, len(sizes), *sizes)
    else:
        table = _CHUNK_HEAD.pack(chunk, len(sizes)) + np.array(sizes, "<u4").tobytes()
    return [table, *(piece for frame in frames for piece in frame)]


def compress(data: Buffer, compression: Compression, element_width: int) -> tuple[int, int, Buffer]:
    """Compress one section; returns ``(codec_id, codec_param, stored_bytes)``.

    ``element_width`` is the byte width of the section's elements. Shuffle applies to
    widths 2, 4 and 8; other widths (int8, fp8) get plain zstd (shuffle width 1 in the
    chunked codec), since a shuffle of 1-byte elements is the identity. Sections below
    ``compression.min_size``, and sections zstd cannot shrink, come back as
    ``(CODEC_RAW, 0, data)``: the same object.
    """
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
    width = _int_arg(element_width, "element_width")
    if width < 1:
        raise CodecConfigError(
            "element_width must be at least 1", field="element_width", found=width
        )
    src = u8_array(data, "data")
    size = src.size
    if size == 0 or size < compression.min_size:
        return CODEC_RAW, 0, []
    shuffle_width = width if width in SHUFFLE_WIDTHS else 1
    threads = compression.threads if size >= _THREADS_MIN_SIZE else 0
    try:
        if compression.codec == CODEC_CHUNKED:
            codec, param = CODEC_CHUNKED, shuffle_width
            stored = _chunked(src, compression, shuffle_width)
        elif compression.codec == CODEC_SHUFFLE_ZSTD and shuffle_width > 1:
            codec, param = CODEC_SHUFFLE_ZSTD, shuffle_width
            stored = _frame(src, compression.level, shuffle_width, threads)
        else:
            codec, param = CODEC_ZSTD, 0
            stored = _frame(src, compression.level, 1, threads)
    except zstandard.ZstdError as exc:
        raise HurrayWireError(f"zstd compression failed: {exc}") from exc
    if sum(map(len, stored)) >= size:
        return CODEC_RAW, 0, []
    return codec, param, stored


# -- decompression ---------------------------------------------------------------------


def _decompressor() -> Any:
    dctx = getattr(_local, "decompressor", None)
    if dctx is None:
        dctx = _local.decompressor = zstandard.ZstdDecompressor()
    return dctx


class _FrameHeader(NamedTuple):
    """What decoding needs from a checked zstd frame header (a tuple: built per chunk)."""

    size: int
    content_size: int  # zstandard.CONTENTSIZE_UNKNOWN when the frame does not say
    has_checksum: bool


def _frame_header(src: U8Array, raw_size: int, codec_name: str) -> _FrameHeader:
    """Check the zstd frame header of ``src`` against ``raw_size``.

    Runs before zstd allocates anything: a frame that declares another content size, needs
    a dictionary, or asks for a window beyond its output is refused here.
    """
    n = src.size
    if n < 4 or src[:4].tobytes() != _ZSTD_MAGIC:
        raise DecompressionError(
            f"{codec_name} section is not a zstd frame",
            field="stored",
            offset=0,
            expected=f"magic {_ZSTD_MAGIC.hex()}",
            found=src[:4].tobytes().hex() if n else "no bytes",
        )
    view = _bytes_view(src)
    try:
        header_size = zstandard.frame_header_size(view)
        params = zstandard.get_frame_parameters(view)
    except zstandard.ZstdError as exc:
        raise DecompressionError(
            f"{codec_name} section has a bad zstd frame header: {exc}",
            field="stored",
            offset=0,
            found=f"{n} stored bytes",
        ) from None
    if header_size > n:
        raise DecompressionError(
            f"{codec_name} section ends inside the zstd frame header",
            field="stored",
            expected=f">= {header_size} bytes",
            found=n,
        )
    if params.dict_id:
        raise DecompressionError(
            f"{codec_name} frame needs a zstd dictionary, which blobs never use",
            field="stored",
            found=f"dictionary id {params.dict_id}",
        )
    content_size = params.content_size
    if content_size == zstandard.CONTENTSIZE_UNKNOWN:
        if params.window_size > max(raw_size, _UNKNOWN_SIZE_WINDOW_LIMIT):
            raise LimitExceededError(
                f"{codec_name} frame of unknown content size asks for a zstd window "
                "larger than its raw size",
                field="stored",
                expected=f"<= {max(raw_size, _UNKNOWN_SIZE_WINDOW_LIMIT)} bytes",
                found=params.window_size,
            )
    elif content_size != raw_size:
        raise DecompressionError(
            f"{codec_name} frame declares a content size other than the section's raw size",
            field="stored",
            expected=raw_size,
            found=content_size,
        )
    return _FrameHeader(header_size, content_size, params.has_checksum)


def _walk_blocks(src: U8Array, header: _FrameHeader, codec_name: str) -> None:
    """Check that the blocks after a checked header make exactly one frame that ends where
    ``src`` ends. python-zstandard has no call that finds a frame's end; this walk over
    the block headers does, and names the block that is cut short."""
    view = _bytes_view(src)
    n = src.size
    pos = header.size
    while True:
        if pos + 3 > n:
            raise DecompressionError(
                f"{codec_name} section ends inside a zstd block header",
                field="stored",
                offset=pos,
                expected=f">= {pos + 3} stored bytes",
                found=n,
            )
        block = view[pos] | view[pos + 1] << 8 | view[pos + 2] << 16
        block_type = (block >> 1) & 3
        if block_type == 3:
            raise DecompressionError(
                f"{codec_name} frame has a reserved zstd block type", field="stored", offset=pos
            )
        body = 1 if block_type == 1 else block >> 3  # an RLE block stores one byte
        if pos + 3 + body > n:
            raise DecompressionError(
                f"{codec_name} section ends inside a zstd block",
                field="stored",
                offset=pos,
                expected=f">= {pos + 3 + body} stored bytes",
                found=n,
            )
        pos += 3 + body
        if block & 1:
            break
    end = pos + 4 if header.has_checksum else pos
    if end != n:
        raise DecompressionError(
            f"{codec_name} section "
            f"{'ends inside the checksum of' if end > n else 'has bytes after'} its zstd frame",
            field="stored",
            offset=min(end, n),
            expected=f"{end} stored bytes",
            found=n,
        )


def _read_frame(dctx: Any, src: U8Array, dst: U8Array) -> tuple[int, bytes]:
    """Stream one frame into ``dst``: (bytes written, whatever the frame had beyond)."""
    got = 0
    with dctx.stream_reader(_bytes_view(src), read_across_frames=False) as reader:
        view = _bytes_view(dst)
        while got < dst.size:
            k = reader.readinto(view[got:])
            if not k:
                break
            got += k
        extra = reader.read(1)
    return got, extra


def _decode_frame(
    src: U8Array, dst: U8Array, width: int, codec_name: str, header: _FrameHeader
) -> None:
    """Decompress one frame, its header checked, into ``dst`` (unshuffled when ``width`` >
    1): exactly ``dst.size`` bytes or a DecompressionError.

    A shuffled frame that declares its size is decoded in one zstd call that refuses bytes
    after the frame (as fast as streaming into a scratch buffer, without the Python block
    walk first); the walk then only runs to name what a refused frame got wrong. Other
    frames are walked first and streamed, bounded by ``dst``.
    """
    if width > 1 and header.content_size == dst.size:
        try:
            plain = _decompressor().decompress(_bytes_view(src), allow_extra_data=False)
        except zstandard.ZstdError as exc:
            _walk_blocks(src, header, codec_name)
            raise _corrupt(src, _scratch(dst.size), codec_name, exc) from None
        _check_decoded_size(len(plain), dst.size, codec_name)
        byteshuffle.unshuffle_into(plain, width, dst)
        return
    _walk_blocks(src, header, codec_name)
    target = dst if width == 1 else _scratch(dst.size)
    try:
        got, extra = _read_frame(_decompressor(), src, target)
    except zstandard.ZstdError as exc:
        raise _corrupt(src, target, codec_name, exc) from None
    _check_decoded_size(got if not extra else dst.size + 1, dst.size, codec_name)
    if width > 1:
        byteshuffle.unshuffle_into(target, width, dst)


def _corrupt(
    src: U8Array, scratch: U8Array, codec_name: str, exc: zstandard.ZstdError
) -> DecompressionError:
    return DecompressionError(
        f"{codec_name} section is corrupt: {_fresh_reason(src, scratch) or exc}",
        field="stored",
        found=f"{src.size} stored bytes for {scratch.size} raw bytes",
    )


def _check_decoded_size(got: int, raw_size: int, codec_name: str) -> None:
    if got != raw_size:
        raise DecompressionError(
            f"{codec_name} section decompresses to "
            f"{'fewer' if got < raw_size else 'more'} bytes than its raw size",
            field="stored",
            expected=raw_size,
            found=got if got < raw_size else f"more than {raw_size}",
        )


def _fresh_reason(src: U8Array, dst: U8Array) -> str | None:
    """libzstd's reason for refusing ``src``, from a new context.

    The per-thread context keeps buffers sized by the frames it decoded before, and
    libzstd words the same fault differently depending on them ("Destination buffer is
    too small" or "Data corruption detected"); a new context gives one answer for the same
    bytes on every thread. Only runs on the error path.
    """
    try:
        _read_frame(zstandard.ZstdDecompressor(), src, dst)
    except zstandard.ZstdError as exc:
        return str(exc)
    return None


def _chunk_table(src: U8Array, raw_size: int) -> tuple[int, Sequence[int]]:
    """Check the chunked codec's table against the stored and raw sizes; return the
    chunk size and each frame's start (plus the end), before anything is allocated."""
    name = CODEC_NAMES[CODEC_CHUNKED]
    n = src.size
    if n < _CHUNK_HEAD.size:
        raise DecompressionError(
            f"{name} section ends inside its chunk table header",
            field="stored",
            offset=0,
            expected=f">= {_CHUNK_HEAD.size} stored bytes",
            found=n,
        )
    view = _bytes_view(src)
    chunk_size, count = _CHUNK_HEAD.unpack_from(view)
    if not _is_chunk_size(chunk_size):
        raise DecompressionError(
            f"{name} chunk_size must be a power of two",
            field="chunk_size",
            offset=0,
            expected=f"{CHUNK_SIZE_MIN}..{CHUNK_SIZE_MAX}",
            found=chunk_size,
        )
    expected_count = -(-raw_size // chunk_size)
    if count != expected_count:
        raise DecompressionError(
            f"{name} chunk_count must be ceil(raw size / chunk_size)",
            field="chunk_count",
            offset=4,
            expected=expected_count,
            found=count,
        )
    table_end = _CHUNK_HEAD.size + 4 * count
    if table_end > n:
        raise DecompressionError(
            f"{name} section ends inside its chunk table",
            field="frame_sizes",
            offset=_CHUNK_HEAD.size,
            expected=f">= {table_end} stored bytes",
            found=n,
        )
    bounds: Sequence[int]
    if count <= _SMALL_TABLE:  # a struct unpack beats NumPy's fixed costs here
        if count == 1:
            bounds = [table_end, table_end + _U32.unpack_from(view, _CHUNK_HEAD.size)[0]]
        else:
            sizes_u32 = struct.unpack_from(f"<{count}I", view, _CHUNK_HEAD.size)
            bounds = list(itertools.accumulate(sizes_u32, initial=table_end))
    else:  # an array: a big table costs 8 bytes per chunk, not a Python int each
        starts = np.empty(count + 1, np.int64)
        starts[0] = 0
        np.cumsum(src[_CHUNK_HEAD.size : table_end].view("<u4"), dtype=np.int64, out=starts[1:])
        starts += table_end
        bounds = cast("Sequence[int]", starts)
    end = int(bounds[-1])
    if count and end != n:
        raise DecompressionError(
            f"{name} frame sizes do not add up to the stored size",
            field="frame_sizes",
            offset=_CHUNK_HEAD.size,
            expected=n - table_end,
            found=end - table_end,
        )
    if not count and table_end != n:
        raise DecompressionError(
            f"{name} section has bytes after an empty chunk table",
            field="stored",
            offset=table_end,
            expected=f"{table_end} stored bytes",
            found=n,
        )
    return chunk_size, bounds


def _decode_chunks(
    src: U8Array, dst: U8Array, width: int, threads: int, chunk_size: int, bounds: Sequence[int]
) -> None:
    """Decode every chunk of a checked chunk table into its slice of ``dst``."""
    count = len(bounds) - 1
    if count == 1:  # on the caller, without the pool's bookkeeping
        _decode_chunk(src, dst, width, 0, bounds[0], bounds[1])
        return

    def chunk(i: int) -> None:
        piece = dst[i * chunk_size : (i + 1) * chunk_size]
        _decode_chunk(src, piece, width, i, int(bounds[i]), int(bounds[i + 1]))

    parallel.for_each(count, chunk, threads)


def _decode_chunk(src: U8Array, piece: U8Array, width: int, i: int, begin: int, end: int) -> None:
    """Decode chunk ``i`` (``src[begin:end]``) into ``piece``; errors name the chunk."""
    name = CODEC_NAMES[CODEC_CHUNKED]
    frame = src[begin:end]
    try:
        _decode_frame(frame, piece, width, name, _frame_header(frame, piece.size, name))
    except HurrayWireError as exc:
        inside = exc.offset if exc.offset is not None else 0
        raise exc.relocated(field=f"chunk {i}", offset=begin + inside) from None


def decompress_into(
    codec: int, codec_param: int, stored: Buffer, out: U8Array, *, threads: int = -1
) -> None:
    """Decode a stored section straight into ``out`` (its declared raw size).

    Never allocates more than ``out.size`` bytes on behalf of the stored bytes (a bomb is
    refused from its frame header, or after ``out.size + 1`` bytes when the frame does
    not say its size). Bad stored bytes, an unknown codec or a bad shuffle width raise
    :class:`DecompressionError` (:class:`LimitExceededError` for an oversized window).
    ``threads`` (the caller included, -1 = every usable core) decode the chunks of a
    chunked section.
    """
    codec, param, threads, src = _decode_args(codec, codec_param, threads, stored)
    dst = _writable_u8(out, None, "out")
    _check_no_overlap(src, dst, "stored and out")
    _decode_section(codec, param, src, dst.size, dst, threads)


def decompress(
    codec: int, codec_param: int, stored: Buffer, raw_size: int, *, threads: int = -1
) -> U8Array:
    """:func:`decompress_into` a new array of ``raw_size`` bytes, allocated only once the
    stored bytes' layout (chunk table, frame header) has passed its checks; an allocation
    that fails is a :class:`LimitExceededError`."""
    codec, param, threads, src = _decode_args(codec, codec_param, threads, stored)
    size = _int_arg(raw_size, "raw_size")
    if size < 0:
        raise CodecConfigError("raw_size must not be negative", field="raw_size", found=size)
    return _decode_section(codec, param, src, size, None, threads)


def decode_section(
    codec: int, codec_param: int, stored: U8Array, raw_size: int, threads: int
) -> U8Array:
    """:func:`decompress` for arguments the caller has checked already (the blob decoder's
    section table checks codec, parameter and size; ``decode`` checks ``threads``):
    ``stored`` a flat uint8 array. It skips the argument checks, never the checks of the
    stored bytes."""
    return _decode_section(codec, codec_param, stored, raw_size, None, threads)


def _decode_args(
    codec: object, codec_param: object, threads: object, stored: Buffer
) -> tuple[int, int, int, U8Array]:
    """Checked (codec, parameter, threads, stored bytes as uint8) of a decode call."""
    codec = _int_arg(codec, "codec")
    param = _int_arg(codec_param, "codec_param")
    if codec not in CODEC_NAMES:
        raise DecompressionError(
            "unknown codec id", field="codec", expected=sorted(CODEC_NAMES), found=codec
        )
    if not valid_codec_param(codec, param):
        raise DecompressionError(
            f"{CODEC_NAMES[codec]} section has an invalid codec parameter",
            field="codec_param",
            expected={
                CODEC_SHUFFLE_ZSTD: sorted(SHUFFLE_WIDTHS),
                CODEC_CHUNKED: sorted(CHUNKED_WIDTHS),
            }.get(codec, 0),
            found=param,
        )
    return codec, param, check_threads(threads), u8_array(stored, "stored")


def _decode_section(
    codec: int, param: int, src: U8Array, raw_size: int, out: U8Array | None, threads: int
) -> U8Array:
    """Check the stored layout, then decode into ``out`` or a new array (allocated only
    after the checks)."""
    name = CODEC_NAMES[codec]
    if codec == CODEC_RAW:
        if src.size != raw_size:
            raise DecompressionError(
                "raw section's stored size differs from its raw size",
                field="stored",
                expected=raw_size,
                found=src.size,
            )
        dst = _output(out, raw_size)
        np.copyto(dst, src)
    elif codec == CODEC_CHUNKED:
        chunk_size, bounds = _chunk_table(src, raw_size)
        dst = _output(out, raw_size)
        _decode_chunks(src, dst, param, threads, chunk_size, bounds)
    else:
        header = _frame_header(src, raw_size, name)
        dst = _output(out, raw_size)
        _decode_frame(src, dst, param if codec == CODEC_SHUFFLE_ZSTD else 1, name, header)
    return dst


def _output(out: U8Array | None, raw_size: int) -> U8Array:
    if out is not None:
        return out
    try:
        return np.empty(raw_size, np.uint8)
    except (MemoryError, ValueError):
        raise LimitExceededError(
            "cannot allocate the decompressed section", field="raw_size", found=raw_size
        ) from None
