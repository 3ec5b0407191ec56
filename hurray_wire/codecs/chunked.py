"""Codec 3, chunked-shuffle-zstd: a chunk table, then one shuffled zstd frame per chunk, so
several cores share a section and each chunk is unshuffled in cache (docs/wire-format.md
§ 6); the table is checked against the sizes before anything is allocated."""

from __future__ import annotations

import functools
import itertools
import threading
from collections.abc import Sequence
from typing import cast

import numpy as np

from hurray_wire import parallel
from hurray_wire.buffers import U8Array
from hurray_wire.codecs.base import Codec, Progress, Settings, bytes_view, output
from hurray_wire.codecs.zstd import SHUFFLE_WIDTHS, compress_frame, decode_frame, frame_header
from hurray_wire.errors import DecompressionError, HurrayWireError
from hurray_wire.wire import chunked as wc

__all__ = [
    "CHUNKED",
    "CHUNKED_WIDTHS",
    "CHUNK_SIZE_MAX",
    "CHUNK_SIZE_MIN",
    "CODEC_CHUNKED",
    "Chunked",
    "is_chunk_size",
]

CODEC_CHUNKED = 3
#: Shuffle widths of the chunked codec: 1 is no shuffle (1-byte or odd-width elements).
CHUNKED_WIDTHS: frozenset[int] = frozenset({1, 2, 4, 8})
#: Raw bytes per chunk of the chunked codec: a power of two in this range.
CHUNK_SIZE_MIN: int = 1 << 12
CHUNK_SIZE_MAX: int = 1 << 30
_NAME = "chunked-shuffle-zstd"
_CHUNK_HEAD = wc.HEAD


def is_chunk_size(value: int) -> bool:
    """Whether ``value`` is a legal chunk size: a power of two, 4 KiB to 1 GiB."""
    return CHUNK_SIZE_MIN <= value <= CHUNK_SIZE_MAX and value & (value - 1) == 0


class Chunked(Codec):
    """Independent shuffled chunks: the default codec (docs/decisions.md)."""

    codec_id = CODEC_CHUNKED
    name = _NAME
    params = CHUNKED_WIDTHS
    spec_threads = -1  # "chunked-shuffle-zstd:L" compresses its chunks on every core
    progressive = True

    def encode(self, src: U8Array, config: Settings, width: int) -> tuple[int, list[bytes]]:
        """The chunk table, then each chunk's frame, shuffled by ``width`` (1 when the
        shuffle is the identity); chunks compress on ``config.threads``."""
        param = width if width in SHUFFLE_WIDTHS else 1  # inline: once per section
        chunk, level = config.chunk_size, config.level
        if src.size <= chunk:  # one chunk, on the caller: no task list (~5% of a 384 KiB one)
            frames = [compress_frame(src, level, param, 0)]
        else:
            tasks = [
                functools.partial(compress_frame, src[a : a + chunk], level, param, 0)
                for a in range(0, src.size, chunk)
            ]
            frames = parallel.run_tasks(tasks, config.threads)
        table = wc.pack_table(chunk, [sum(map(len, f)) for f in frames])
        return param, [table, *(piece for frame in frames for piece in frame)]

    def decode_into(
        self, param: int, stored: U8Array, raw_size: int, out: U8Array | None, threads: int,
        progress: Progress | None = None,
    ) -> U8Array:  # fmt: skip
        """Check the chunk table, then decode each chunk into its slice of the output
        (``progress``: told of each finished prefix, under a lock, in order)."""
        chunk_size, bounds = _chunk_table(stored, raw_size)
        dst = output(out, raw_size)
        count = len(bounds) - 1
        if count == 1:  # on the caller, without the pool's bookkeeping
            _decode_chunk(stored, dst, param, 0, bounds[0], bounds[1], progress)
            return dst
        finished, lock, prefix = bytearray(count), threading.Lock(), [0]

        def chunk(i: int) -> None:
            piece = dst[i * chunk_size : (i + 1) * chunk_size]
            _decode_chunk(stored, piece, param, i, int(bounds[i]), int(bounds[i + 1]))
            if progress is not None:
                with lock:  # the chunks finished in order so far, each reported once
                    finished[i] = 1
                    k = prefix[0]
                    while k < count and finished[k]:
                        k += 1
                    if k > prefix[0]:
                        prefix[0] = k
                        progress(min(k * chunk_size, dst.size))

        parallel.for_each(count, chunk, threads)
        return dst


def _chunk_table(src: U8Array, raw_size: int) -> tuple[int, Sequence[int]]:
    """Check the chunked codec's table against the stored and raw sizes; return the
    chunk size and each frame's start (plus the end), before anything is allocated."""
    name = _NAME
    n = src.size
    if n < _CHUNK_HEAD.size:
        raise DecompressionError(
            f"{name} section ends inside its chunk table header",
            field="stored",
            offset=0,
            expected=f">= {_CHUNK_HEAD.size} stored bytes",
            found=n,
        )
    view = bytes_view(src)
    chunk_size, count = _CHUNK_HEAD.struct.unpack_from(view)
    if not is_chunk_size(chunk_size):
        raise DecompressionError(
            f"{name} chunk_size must be a power of two",
            field="chunk_size",
            offset=_CHUNK_HEAD.offsets["chunk_size"],
            expected=f"{CHUNK_SIZE_MIN}..{CHUNK_SIZE_MAX}",
            found=chunk_size,
        )
    expected_count = -(-raw_size // chunk_size)
    if count != expected_count:
        raise DecompressionError(
            f"{name} chunk_count must be ceil(raw size / chunk_size)",
            field="chunk_count",
            offset=_CHUNK_HEAD.offsets["chunk_count"],
            expected=expected_count,
            found=count,
        )
    table_end = wc.table_size(count)
    if table_end > n:
        raise DecompressionError(
            f"{name} section ends inside its chunk table",
            field="frame_sizes",
            offset=_CHUNK_HEAD.size,
            expected=f">= {table_end} stored bytes",
            found=n,
        )
    bounds: Sequence[int]
    if count <= wc.SMALL_TABLE:  # a struct unpack beats NumPy's fixed costs here
        bounds = list(itertools.accumulate(wc.unpack_sizes(view, count), initial=table_end))
    else:  # an array: a big table costs 8 bytes per chunk, not a Python int each
        starts = np.empty(count + 1, np.int64)
        starts[0] = 0
        np.cumsum(
            src[_CHUNK_HEAD.size : table_end].view(wc.FRAME_SIZES), dtype=np.int64, out=starts[1:]
        )
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


def _decode_chunk(
    src: U8Array, piece: U8Array, width: int, i: int, begin: int, end: int,
    progress: Progress | None = None,
) -> None:  # fmt: skip
    """Decode chunk ``i`` (``src[begin:end]``) into ``piece``; errors name the chunk."""
    frame = src[begin:end]
    try:
        header = frame_header(frame, piece.size, _NAME)
        decode_frame(frame, piece, width, _NAME, header, progress)
    except HurrayWireError as exc:
        inside = exc.offset if exc.offset is not None else 0
        raise exc.relocated(field=f"chunk {i}", offset=begin + inside) from None


CHUNKED = Chunked()
