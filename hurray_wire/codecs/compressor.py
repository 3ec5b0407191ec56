"""Writing one zstd frame, byte-shuffled or not (cached contexts, plane-aligned blocks;
docs/compression.md); each declares its content size, which the decoders' fast path uses."""

from __future__ import annotations

from typing import Any

import zstandard

from hurray_wire.buffers import U8Array
from hurray_wire.codecs import byteshuffle
from hurray_wire.codecs.base import Settings, local, scratch
from hurray_wire.codecs.entropy import LOW_ENTROPY_BITS, LOW_ENTROPY_HASH_LOG, entropy_bits

__all__ = ["compress_frame", "frame_threads"]

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
    by_args: dict[tuple[int, int, int, int | None], Any] | None = getattr(local, "by_args", None)
    if by_args is None:
        by_args = local.by_args = {}
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
    cache: dict[tuple[int, ...], Any] | None = getattr(local, "compressors", None)
    if cache is None:
        cache = local.compressors = {}
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
