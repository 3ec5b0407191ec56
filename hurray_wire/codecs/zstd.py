"""Codecs 1 and 2, zstd and shuffle-zstd: one zstd frame (RFC 8878) of the raw bytes,
byte-shuffled first by shuffle-zstd's parameter width so that float exponents compress
together (docs/wire-format.md § 6); and the frames the chunked codec shares. Writing one:
cached contexts, plane-aligned blocks, a tiny hash table for a low-entropy top plane
(docs/compression.md); each declares its content size, which the decoders' fast path
uses. Reading one of untrusted bytes: it declares the raw size (or none), ends where its
stored bytes end and decodes to exactly that size, checked before zstd allocates
anything; each error carries the codec's name."""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np
import zstandard

from hurray_wire.buffers import U8Array
from hurray_wire.codecs import byteshuffle
from hurray_wire.codecs.base import Codec, Progress, Settings, bytes_view, local, output, scratch
from hurray_wire.errors import DecompressionError, LimitExceededError

__all__ = [
    "CODEC_SHUFFLE_ZSTD",
    "CODEC_ZSTD",
    "SHUFFLE_WIDTHS",
    "SHUFFLE_ZSTD",
    "ZSTD",
    "FrameHeader",
    "ShuffleZstd",
    "Zstd",
    "compress_frame",
    "decode_frame",
    "entropy_bits",
    "frame_header",
    "frame_threads",
]

CODEC_ZSTD = 1
CODEC_SHUFFLE_ZSTD = 2
#: Element widths the shuffle codec may name in its codec parameter. Writers shuffle
#: elements of these widths only: a shuffle of 1-byte or odd-width elements gains nothing.
SHUFFLE_WIDTHS: frozenset[int] = frozenset({2, 4, 8})

# -- writing a frame -------------------------------------------------------------------

#: Is a byte plane better left to Huffman? A top plane below LOW_ENTROPY_BITS of order-0
#: entropy (bf16 exponents) gets zstd a tiny hash table.
LOW_ENTROPY_BITS = 4.5
LOW_ENTROPY_HASH_LOG = 6
_SAMPLE = 1 << 10
_C_LOG2_C = np.zeros(_SAMPLE + 1)  # c * log2(c), for entropy from counts
_C_LOG2_C[1:] = np.arange(1, _SAMPLE + 1) * np.log2(np.arange(1, _SAMPLE + 1))


def entropy_bits(plane: U8Array) -> float:
    """Order-0 entropy (bits per byte) of 1 KiB of ``plane``, every k-th byte (the plane
    was just written, so the strided reads hit cache). On the kv_sample data this reads
    fp16 top planes at 5.0-5.7 bits and bf16 ones at 2.3-2.9 (threshold 4.5)."""
    if plane.size > _SAMPLE:
        plane = plane[:: plane.size // _SAMPLE][:_SAMPLE]
    if plane.size == 0:
        return 8.0
    counts = np.bincount(plane, minlength=256)
    return math.log2(plane.size) - float(_C_LOG2_C[counts].sum()) / plane.size


_MAX_CACHED_COMPRESSORS = 16
# Below this size the planes go through zstd's streaming API with a block flush between
# them, so no zstd block mixes two planes (+2-5% ratio on 400 KB sections); above it the
# single mixed block costs <0.5% and one-shot compression is ~20% faster.
_PLANE_FLUSH_MAX = 1 << 20
_ZSTD_BLOCK = 128 << 10  # zstd's largest block: one-shot compression cuts blocks at its multiples
# zstd's multi-threaded mode only pays once there is more than one job of work.
_THREADS_MIN_SIZE = 1 << 20


def frame_threads(config: Settings, size: int) -> int:
    """zstd's own worker count for one frame of ``size`` bytes under ``config``."""
    return config.threads if size >= _THREADS_MIN_SIZE else 0


def _compressor(level: int, size: int, threads: int, hash_log: int | None) -> Any:
    """A zstd compressor for this level and input size, cached per thread by them: a context
    costs ~30 us, ten times compressing a 4 KiB section."""
    cache: dict[tuple[int, int, int, int | None], Any] | None = getattr(local, "by_args", None)
    if cache is None:
        cache = local.by_args = {}
    args = (level, size, threads, hash_log)
    cctx = cache.get(args)
    if cctx is None:
        overrides: dict[str, int] = {}
        if hash_log is not None:
            base = zstandard.ZstdCompressionParameters.from_level(level, source_size=size)
            overrides["hash_log"] = min(base.hash_log, hash_log)
        params = zstandard.ZstdCompressionParameters.from_level(
            level, source_size=size, threads=threads, **overrides
        )
        if len(cache) >= _MAX_CACHED_COMPRESSORS:
            cache.pop(next(iter(cache)))
        cctx = cache[args] = zstandard.ZstdCompressor(compression_params=params)
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


def compress_frame(src: U8Array, level: int, width: int, threads: int) -> list[bytes]:
    """One zstd frame of ``src``, byte-shuffled first when ``width`` > 1, as pieces."""
    size = src.size
    if width == 1:
        return [_compressor(level, size, threads, None).compress(src)]
    shuffled = scratch(size)
    byteshuffle.shuffle_into(src, width, shuffled)
    plane_size = size // width
    hash_log = None
    if level == 1:
        top = shuffled[(width - 1) * plane_size : width * plane_size]
        if entropy_bits(top) < LOW_ENTROPY_BITS:
            hash_log = LOW_ENTROPY_HASH_LOG
    cctx = _compressor(level, size, threads, hash_log)
    # One-shot compression cuts blocks at multiples of 128 KiB: when the planes end on
    # such a multiple (1 MiB chunks), no block straddles two planes anyway, and one-shot
    # is ~15% faster than the streaming API.
    if size <= _PLANE_FLUSH_MAX and plane_size % _ZSTD_BLOCK:
        return _compress_planes(cctx, shuffled, plane_size, width)
    return [cctx.compress(shuffled)]


# -- reading a frame -------------------------------------------------------------------

_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
# zstd's own layout (RFC 8878 § 3.1.1), not hurray-wire's: the 3-byte block header
# (last_block bit, 2-bit type, 21-bit size) and the optional 4-byte content checksum.
_BLOCK_HEAD = 3
_CONTENT_CHECKSUM = 4
# zstd allocates a window only when a frame does not declare its content size; such a
# frame may ask for at most max(raw size, this) bytes of window.
_UNKNOWN_SIZE_WINDOW_LIMIT = 8 << 20


def _decompressor() -> Any:
    dctx = getattr(local, "decompressor", None)
    if dctx is None:
        dctx = local.decompressor = zstandard.ZstdDecompressor()
    return dctx


class FrameHeader(NamedTuple):
    """What decoding needs from a checked zstd frame header (a tuple: built per chunk)."""

    size: int
    content_size: int  # zstandard.CONTENTSIZE_UNKNOWN when the frame does not say
    has_checksum: bool


def frame_header(src: U8Array, raw_size: int, codec_name: str) -> FrameHeader:
    """Check the frame header of ``src`` against ``raw_size`` before zstd allocates: another
    content size, a dictionary or a window beyond the output is refused."""
    n = src.size
    if n < len(_ZSTD_MAGIC) or src[: len(_ZSTD_MAGIC)].tobytes() != _ZSTD_MAGIC:
        raise DecompressionError(
            f"{codec_name} section is not a zstd frame",
            field="stored",
            offset=0,
            expected=f"magic {_ZSTD_MAGIC.hex()}",
            found=src[: len(_ZSTD_MAGIC)].tobytes().hex() if n else "no bytes",
        )
    view = bytes_view(src)
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
    return FrameHeader(header_size, content_size, params.has_checksum)


# The Python walk over block headers costs ~270 ns a block: it walks at most this many
# (128 MiB of full 128 KiB blocks, far beyond one chunk of a chunked section). A frame with
# more blocks (a flood of empty ones is legal zstd) is decoded by libzstd incrementally
# instead, which finds the frame's end itself at ~10 ns a block.
_WALK_LIMIT = 1024
# Input fed to libzstd per call in the incremental decode. A frame that declares its
# content size cannot make libzstd write past it; one that does not could expand 32768x
# (4-byte RLE blocks of 128 KiB), so it gets small steps: at most 32 MiB of output per step
# before the size check refuses it.
_STEP_KNOWN_SIZE = 4 << 20
_STEP_UNKNOWN_SIZE = 1 << 10
#: The output reported at a time when a caller checks it as it comes (in L2 with its source).
_PROGRESS_STEP = 1 << 20


def _walk_blocks(
    src: U8Array, header: FrameHeader, codec_name: str, limit: int = _WALK_LIMIT
) -> bool:
    """Check that the blocks make exactly one frame ending where ``src`` ends, naming a cut
    block (python-zstandard cannot find a frame's end). False, nothing proven, past
    ``limit`` blocks: ``_decode_incrementally`` checks those at C speed."""
    view = bytes_view(src)
    n = src.size
    pos = header.size
    for _ in range(limit):
        if pos + _BLOCK_HEAD > n:
            raise DecompressionError(
                f"{codec_name} section ends inside a zstd block header",
                field="stored",
                offset=pos,
                expected=f">= {pos + _BLOCK_HEAD} stored bytes",
                found=n,
            )
        block = int.from_bytes(view[pos : pos + _BLOCK_HEAD], "little")
        block_type = (block >> 1) & 3
        if block_type == 3:
            raise DecompressionError(
                f"{codec_name} frame has a reserved zstd block type", field="stored", offset=pos
            )
        body = 1 if block_type == 1 else block >> 3  # an RLE block stores one byte
        if pos + _BLOCK_HEAD + body > n:
            raise DecompressionError(
                f"{codec_name} section ends inside a zstd block",
                field="stored",
                offset=pos,
                expected=f">= {pos + _BLOCK_HEAD + body} stored bytes",
                found=n,
            )
        pos += _BLOCK_HEAD + body
        if block & 1:
            break
    else:
        return False
    end = pos + _CONTENT_CHECKSUM if header.has_checksum else pos
    if end != n:
        raise DecompressionError(
            f"{codec_name} section "
            f"{'ends inside the checksum of' if end > n else 'has bytes after'} its zstd frame",
            field="stored",
            offset=min(end, n),
            expected=f"{end} stored bytes",
            found=n,
        )
    return True


def _decode_incrementally(
    src: U8Array, dst: U8Array, header: FrameHeader, codec_name: str, progress: Progress | None
) -> None:
    """Decode a frame of many blocks into ``dst``, libzstd finding its end: exactly
    ``dst.size`` bytes from one frame ending where ``src`` ends, or an error; linear at C
    speed, each step's output bounded by ``dst``."""
    known = header.content_size != zstandard.CONTENTSIZE_UNKNOWN
    step = _STEP_KNOWN_SIZE if known else _STEP_UNKNOWN_SIZE
    view = bytes_view(src)
    out = bytes_view(dst)
    n = src.size
    dobj = zstandard.ZstdDecompressor().decompressobj()
    got = 0
    fed = 0
    try:
        while fed < n and not dobj.eof:
            chunk = dobj.decompress(view[fed : fed + step])
            fed = min(n, fed + step)
            if got + len(chunk) > dst.size:
                _check_decoded_size(dst.size + 1, dst.size, codec_name)
            out[got : got + len(chunk)] = chunk
            got += len(chunk)
            if progress is not None and chunk:
                progress(got)
    except zstandard.ZstdError as exc:
        raise _corrupt(src, scratch(dst.size), codec_name, exc) from None
    if not dobj.eof:
        raise DecompressionError(
            f"{codec_name} section ends inside its zstd frame",
            field="stored",
            offset=n,
            found=f"{n} stored bytes",
        )
    trailing = len(dobj.unused_data) + (n - fed)
    if trailing:
        raise DecompressionError(
            f"{codec_name} section has bytes after its zstd frame",
            field="stored",
            offset=n - trailing,
            expected=f"{n - trailing} stored bytes",
            found=n,
        )
    _check_decoded_size(got, dst.size, codec_name)


def _read_frame(
    dctx: Any, src: U8Array, dst: U8Array, progress: Progress | None = None
) -> tuple[int, bytes]:
    """Stream one frame into ``dst``: (bytes written, whatever the frame had beyond);
    with ``progress``, in steps of ``_PROGRESS_STEP`` bytes, each reported."""
    got = 0
    step = dst.size if progress is None else _PROGRESS_STEP
    with dctx.stream_reader(bytes_view(src), read_across_frames=False) as reader:
        view = bytes_view(dst)
        while got < dst.size:
            k = reader.readinto(view[got : got + step])
            if not k:
                break
            got += k
            if progress is not None:
                progress(got)
        extra = reader.read(1)
    return got, extra


def decode_frame(
    src: U8Array, dst: U8Array, width: int, codec_name: str, header: FrameHeader,
    progress: Progress | None = None,
) -> None:  # fmt: skip
    """Decompress one frame, its header checked, into ``dst`` (unshuffled when ``width`` >
    1): exactly ``dst.size`` bytes or a DecompressionError. A sized shuffled frame is one
    zstd call (the block walk only names a refusal); others are walked, then streamed."""
    # (not for an empty frame: python-zstandard returns b"" for a declared size of 0 without
    # reading the blocks, so bytes after the frame would pass)
    if width > 1 and header.content_size == dst.size > 0:
        try:
            plain = _decompressor().decompress(bytes_view(src), allow_extra_data=False)
        except zstandard.ZstdError as exc:
            _walk_blocks(src, header, codec_name)
            raise _corrupt(src, scratch(dst.size), codec_name, exc) from None
        _check_decoded_size(len(plain), dst.size, codec_name)
        byteshuffle.unshuffle_into(plain, width, dst)
        if progress is not None:  # the byte planes end together: the whole output at once
            progress(dst.size)
        return
    target, streamed = (dst, progress) if width == 1 else (scratch(dst.size), None)
    if not _walk_blocks(src, header, codec_name):  # more blocks than the walk takes
        _decode_incrementally(src, target, header, codec_name, streamed)
    else:
        try:
            got, extra = _read_frame(_decompressor(), src, target, streamed)
        except zstandard.ZstdError as exc:
            raise _corrupt(src, target, codec_name, exc) from None
        _check_decoded_size(got if not extra else dst.size + 1, dst.size, codec_name)
    if width > 1:
        byteshuffle.unshuffle_into(target, width, dst)
        if progress is not None:
            progress(dst.size)


def _corrupt(
    src: U8Array, target: U8Array, codec_name: str, exc: zstandard.ZstdError
) -> DecompressionError:
    return DecompressionError(
        f"{codec_name} section is corrupt: {fresh_reason(src, target) or exc}",
        field="stored",
        found=f"{src.size} stored bytes for {target.size} raw bytes",
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


def fresh_reason(src: U8Array, dst: U8Array) -> str | None:
    """libzstd's reason for refusing ``src`` from a new context: a reused one words the
    same fault by what it decoded before; this gives one answer on every thread."""
    try:
        _read_frame(zstandard.ZstdDecompressor(), src, dst)
    except zstandard.ZstdError as exc:
        return str(exc)
    return None


# -- the codecs ------------------------------------------------------------------------


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


ZSTD = Zstd()
SHUFFLE_ZSTD = ShuffleZstd()
