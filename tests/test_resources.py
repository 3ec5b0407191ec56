"""Issue 11, resource attacks: no input may cost more than a small multiple of its size.

Bounds are generous (a slow shared CI core must pass) but far below what each attack cost
before its fix; the before/after numbers are in docs/security.md, "Decisions and limits".
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import zstandard

from hurray_wire.codecs import CODEC_SHUFFLE_ZSTD, CODEC_ZSTD, decompress
from hurray_wire.errors import DecompressionError


def seconds(call: Callable[[], Any]) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def refused_or_none(call: Callable[[], Any], error: type[Exception]) -> Exception | None:
    try:
        call()
    except error as exc:
        return exc
    return None


# -- the zstd block walk ---------------------------------------------------------------------
_RAW_EMPTY = bytes(3)  # a raw block of size 0, not the last
_LAST_EMPTY = bytes.fromhex("010000")  # the last block, raw, size 0
_LAST_RLE_1 = (1 | 1 << 1 | 1 << 3).to_bytes(3, "little") + b"a"  # last, RLE, 1 byte


def _frame_of_empty_blocks(stored: int, raw_size: int) -> bytes:
    """A legal zstd frame of ~``stored`` bytes: almost all empty raw blocks (what a flood
    looks like); it decodes to ``raw_size`` (0 or 1) bytes."""
    head = zstandard.ZstdCompressor(write_content_size=True, write_checksum=False)
    header = head.compress(b"a" * raw_size)[:6]  # magic, descriptor, 1-byte content size
    last = _LAST_RLE_1 if raw_size else _LAST_EMPTY
    return header + _RAW_EMPTY * ((stored - len(header)) // 3) + last


@pytest.mark.parametrize("codec", [CODEC_ZSTD, CODEC_SHUFFLE_ZSTD])
@pytest.mark.parametrize("raw_size", [0, 1])
def test_a_flood_of_empty_zstd_blocks_costs_little(codec: int, raw_size: int) -> None:
    """64 MiB of empty blocks (22 M): the Python walk took 6.1 s; libzstd now finds the
    frame's end (~0.1 s)."""
    frame = _frame_of_empty_blocks(64 << 20, raw_size)
    param = 2 if codec == CODEC_SHUFFLE_ZSTD else 0
    if codec == CODEC_SHUFFLE_ZSTD and raw_size % 2:
        pytest.skip("a shuffled section holds whole elements")
    took = seconds(lambda: decompress(codec, param, frame, raw_size, threads=0))
    assert took < 1.0, took
    junk = frame + b"junk"  # and bytes after such a frame are still found, as fast
    start = time.perf_counter()
    with pytest.raises(DecompressionError, match="bytes after"):
        decompress(codec, param, junk, raw_size, threads=0)
    assert time.perf_counter() - start < 1.0


@pytest.mark.parametrize("extra", [b"junk", bytes(7)])
def test_bytes_after_an_empty_shuffled_frame_refused(extra: bytes) -> None:
    """python-zstandard returns b"" for a declared content size of 0 without reading on:
    the shuffled fast path no longer takes such frames."""
    empty = zstandard.ZstdCompressor(write_content_size=True).compress(b"")
    decompress(CODEC_SHUFFLE_ZSTD, 2, empty, 0, threads=0)
    with pytest.raises(DecompressionError, match="bytes after"):
        decompress(CODEC_SHUFFLE_ZSTD, 2, empty + extra, 0, threads=0)


def test_many_block_frames_still_decode_exactly() -> None:
    """A real frame of more blocks than the walk takes (2000 small flushed blocks) decodes
    through the incremental path to the same bytes; cut or padded, it is refused."""
    rng = np.random.default_rng(0)
    data = rng.integers(0, 4, 2000 * 300, dtype=np.uint8).tobytes()
    cctx = zstandard.ZstdCompressor(write_content_size=False, write_checksum=True)
    chunks = []
    writer = cctx.compressobj()
    for start in range(0, len(data), 300):
        chunks.append(writer.compress(data[start : start + 300]))
        chunks.append(writer.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK))
    chunks.append(writer.flush())
    frame = b"".join(chunks)
    assert bytes(decompress(CODEC_ZSTD, 0, frame, len(data), threads=0)) == data
    for bad in (frame[:-1], frame + b"\x00", frame[:-5]):
        assert refused_or_none(
            lambda bad=bad: decompress(CODEC_ZSTD, 0, bad, len(data), threads=0),
            DecompressionError,
        ), len(bad)
    with pytest.raises(DecompressionError):
        decompress(CODEC_ZSTD, 0, frame, len(data) - 1, threads=0)
    with pytest.raises(DecompressionError):
        decompress(CODEC_ZSTD, 0, frame, len(data) + 1, threads=0)
