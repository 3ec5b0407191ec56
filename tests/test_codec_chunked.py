"""The chunked-shuffle-zstd codec (codec 3; docs/wire-format.md section 6): its table, its
frames, its threads, and every way its stored bytes can be wrong."""

from __future__ import annotations

import struct
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import zstandard

from hurray_wire.codecs import (
    CODEC_CHUNKED,
    CODEC_ZSTD,
    CodecConfigError,
    Compression,
    compress,
    decode_section,
    decompress,
    decompress_into,
)
from hurray_wire.errors import ArgumentTypeError, DecompressionError, LimitExceededError
from tests.blob_reference import shuffle as reference_shuffle

U8 = np.uint8
CHUNK = 4096


def kv(count: int, dtype: Any = np.float16, seed: int = 0) -> np.ndarray:
    values = np.random.default_rng(seed).normal(0, 1.5, count).astype(np.float32)
    return values.astype(dtype).view(U8)


def chunked(
    raw: Any, width: int = 2, chunk: int = CHUNK, threads: int = 0, level: int = 1
) -> bytes:
    codec, param, stored = compress(
        raw, Compression(CODEC_CHUNKED, level=level, threads=threads, chunk_size=chunk), width
    )
    assert codec == CODEC_CHUNKED
    assert param == (width if width in (2, 4, 8) else 1)
    assert isinstance(stored, bytes)
    return stored


def table(stored: bytes) -> tuple[int, int, list[int]]:
    chunk, count = struct.unpack_from("<II", stored)
    return chunk, count, list(struct.unpack_from(f"<{count}I", stored, 8))


def build(chunk: int, frames: list[bytes], count: int | None = None) -> bytes:
    head = struct.pack("<II", chunk, len(frames) if count is None else count)
    return head + b"".join(struct.pack("<I", len(f)) for f in frames) + b"".join(frames)


def decode(stored: Any, size: int, param: int = 2, threads: int = -1) -> np.ndarray:
    out = np.empty(size, U8)
    decompress_into(CODEC_CHUNKED, param, stored, out, threads=threads)
    return out


def rejected(stored: bytes, size: int, param: int = 2, threads: int = -1) -> DecompressionError:
    with pytest.raises(DecompressionError) as info:
        decode(stored, size, param, threads)
    return info.value


# -- layout --------------------------------------------------------------------------------


@pytest.mark.parametrize("width", [1, 2, 3, 4, 8])
def test_layout_is_the_documented_one(width: int) -> None:
    """Table, then per chunk one zstd frame of that chunk alone, shuffled on its own."""
    raw = kv(5003 * 3).tobytes()[: 3 * CHUNK + 1001]  # 4 chunks, a short last one
    stored = chunked(raw, width)
    chunk, count, sizes = table(stored)
    assert (chunk, count) == (CHUNK, 4)
    assert 8 + 4 * count + sum(sizes) == len(stored)
    at = 8 + 4 * count
    shuffle_width = width if width in (2, 4, 8) else 1
    for i, size in enumerate(sizes):
        frame = stored[at : at + size]
        piece = raw[i * CHUNK : (i + 1) * CHUNK]
        assert zstandard.get_frame_parameters(frame).content_size == len(piece)
        plain = zstandard.ZstdDecompressor().decompress(frame)
        assert plain == (reference_shuffle(piece, shuffle_width) if shuffle_width > 1 else piece)
        at += size
    assert decode(stored, len(raw), shuffle_width).tobytes() == raw


@pytest.mark.parametrize("size", [4096, 4097, 8191, 8192, 20_000, 1 << 16])
@pytest.mark.parametrize("threads", [0, 1, 2, -1])
def test_round_trip_and_identical_bytes_for_any_threads(size: int, threads: int) -> None:
    raw = kv(size // 2 + 1)[:size]
    stored = chunked(raw, 2, threads=threads)
    assert stored == chunked(raw, 2, threads=0)
    assert table(stored)[1] == -(-size // CHUNK)
    assert decode(stored, size, threads=threads).tobytes() == raw.tobytes()


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float32])
def test_default_chunks_real_sizes(dtype: Any) -> None:
    """Several 1 MiB chunks, the pool's threads on both sides."""
    raw = kv(1_300_000, dtype)
    width = raw.size // 1_300_000
    default = Compression.parse("default")
    assert default is not None
    codec, param, stored = compress(raw, default, width)
    assert (codec, param) == (CODEC_CHUNKED, width)
    assert table(bytes(stored))[:2] == (1 << 20, -(-raw.size // (1 << 20)))
    assert len(stored) < raw.size / 1.05
    for threads in (0, 2, -1):
        assert decode(stored, raw.size, width, threads).tobytes() == raw.tobytes()


def test_frames_from_other_writers_decode() -> None:
    """Any valid frame per chunk: other levels, no declared size, a content checksum."""
    raw = kv(6000).tobytes()  # 12000 bytes: chunks of 4096, 4096, 3808
    pieces = [raw[a : a + CHUNK] for a in range(0, len(raw), CHUNK)]
    cobj = zstandard.ZstdCompressor().compressobj()
    frames = [
        zstandard.ZstdCompressor(level=19).compress(reference_shuffle(pieces[0], 2)),
        cobj.compress(reference_shuffle(pieces[1], 2)) + cobj.flush(),
        zstandard.ZstdCompressor(write_checksum=True).compress(reference_shuffle(pieces[2], 2)),
    ]
    assert decode(build(CHUNK, frames), len(raw)).tobytes() == raw


def test_width_one_and_empty_section() -> None:
    raw = bytes(range(256)) * 40
    stored = build(CHUNK, [zstandard.ZstdCompressor().compress(raw[:CHUNK]),
                           zstandard.ZstdCompressor().compress(raw[CHUNK:2 * CHUNK]),
                           zstandard.ZstdCompressor().compress(raw[2 * CHUNK:])])  # fmt: skip
    assert decode(stored, len(raw), param=1).tobytes() == raw
    assert decode(build(CHUNK, []), 0).size == 0


# -- rejects -------------------------------------------------------------------------------


def test_too_short_for_its_table_header() -> None:
    for cut in range(8):
        error = rejected(struct.pack("<II", CHUNK, 1)[:cut], 100)
        assert error.offset == 0


@pytest.mark.parametrize("chunk", [0, 1, 2048, 4095, 4097, 3 << 12, 1 << 31, 0xFFFFFFFF])
def test_bad_chunk_size(chunk: int) -> None:
    error = rejected(build(chunk, [zstandard.ZstdCompressor().compress(b"x" * 100)]), 100)
    assert (error.field, error.found) == ("chunk_size", chunk)


@pytest.mark.parametrize(("count", "size"), [(0, 100), (2, 100), (1, 4097), (3, 8192), (1, 0)])
def test_chunk_count_must_fit_raw_size(count: int, size: int) -> None:
    stored = build(CHUNK, [b"\0" * 3] * count)
    error = rejected(stored, size)
    assert (error.field, error.found, error.offset) == ("chunk_count", count, 4)


def test_huge_chunk_count_is_refused_before_reading_a_table() -> None:
    """A count that matches a big raw size, with no table behind it: refused from the
    header, before any frame is looked at (np.empty does not touch its pages)."""
    count = 1 << 16
    stored = struct.pack("<II", CHUNK, count) + b"\0" * 16
    error = rejected(stored, CHUNK * count)
    assert (error.field, error.expected) == ("frame_sizes", f">= {8 + 4 * count} stored bytes")


def test_table_past_the_stored_bytes() -> None:
    frame = zstandard.ZstdCompressor().compress(reference_shuffle(b"ab" * 3000, 2))
    stored = build(CHUNK, [frame, frame])
    for cut in range(8, 16):
        error = rejected(stored[:cut], 8000)
        assert error.field == "frame_sizes"


@pytest.mark.parametrize("delta", [-1, 1, 100])
def test_frame_sizes_must_fill_the_stored_bytes(delta: int) -> None:
    raw = kv(3000).tobytes()
    stored = bytearray(chunked(raw))
    sizes_end = 8 + 4 * 2
    last = struct.unpack_from("<I", stored, sizes_end - 4)[0]
    struct.pack_into("<I", stored, sizes_end - 4, last + delta)
    error = rejected(bytes(stored), len(raw))
    assert error.field == "frame_sizes"


def test_bytes_after_an_empty_table() -> None:
    error = rejected(build(CHUNK, []) + b"\0", 0)
    assert error.field == "stored"


def test_a_frame_of_the_wrong_length_names_its_chunk_and_offset() -> None:
    raw = kv(5000).tobytes()  # 10000 bytes: 4096, 4096, 1808
    pieces = [raw[a : a + CHUNK] for a in range(0, len(raw), CHUNK)]
    frames = [zstandard.ZstdCompressor().compress(reference_shuffle(p, 2)) for p in pieces]
    frames[1] = zstandard.ZstdCompressor().compress(reference_shuffle(pieces[1][:-2], 2))
    error = rejected(build(CHUNK, frames), len(raw))
    assert error.field == "chunk 1"
    assert error.offset == 8 + 4 * 3 + len(frames[0])
    assert (error.expected, error.found) == (CHUNK, CHUNK - 2)


def test_a_bomb_in_one_chunk_is_refused_from_its_header() -> None:
    bomb = zstandard.ZstdCompressor().compress(b"\0" * 10_000_000)
    error = rejected(build(CHUNK, [bomb]), 100)
    assert error.found == 10_000_000


def test_the_lowest_corrupt_chunk_is_reported_whatever_the_threads() -> None:
    raw = kv(40_000).tobytes()  # 20 chunks of 4 KiB
    stored = bytearray(chunked(raw))
    _, count, sizes = table(bytes(stored))
    starts = np.cumsum([8 + 4 * count, *sizes])
    for victim in (3, 11, 17):  # wreck the block header of three frames
        header = zstandard.frame_header_size(bytes(stored[starts[victim] :]))
        stored[starts[victim] + header + 2] |= 0x06  # reserved block type
    for threads in (0, 2, -1):
        for _ in range(5):
            assert rejected(bytes(stored), len(raw), threads=threads).field == "chunk 3"


def test_bad_params_and_arguments() -> None:
    stored = chunked(kv(3000))
    for param in (0, 3, 5, 16, 255):
        assert rejected(stored, 6000, param=param).field == "codec_param"
    with pytest.raises(ArgumentTypeError):
        decompress_into(CODEC_CHUNKED, 2, stored, np.empty(6000, U8), threads="2")  # type: ignore[arg-type]
    with pytest.raises(CodecConfigError):
        Compression(CODEC_CHUNKED, chunk_size=1000)


def test_limit_on_unknown_size_window_applies_per_chunk() -> None:
    # A chunk frame with no content size asking for a 1 GiB window.
    frame = b"\x28\xb5\x2f\xfd\x00" + bytes([20 << 3]) + b"\x01\x00\x00"
    with pytest.raises(LimitExceededError):
        decode(build(CHUNK, [frame]), 100)


def test_plain_zstd_frames_are_not_chunked_sections() -> None:
    frame = zstandard.ZstdCompressor().compress(b"a" * 5000)
    assert rejected(frame, 5000).field in ("chunk_size", "chunk_count", "frame_sizes")
    out = np.empty(5000, U8)
    decompress_into(CODEC_ZSTD, 0, frame, out)
    assert out.tobytes() == b"a" * 5000


@pytest.mark.parametrize(
    ("threads", "error"),
    [
        ("2", ArgumentTypeError),
        (True, ArgumentTypeError),
        (2.0, ArgumentTypeError),
        (-2, CodecConfigError),
    ],
)
def test_decode_checks_its_thread_count(threads: Any, error: type[Exception]) -> None:
    import hurray_wire as hw

    pool = np.zeros((2, 4, 1, 8), np.float16)
    blob = bytes(hw.encode(hw.BlockPagedTensor.from_arrays(pool, [0, 1], [0, 2])))
    with pytest.raises(error):
        hw.decode(blob, threads=threads)
    for good in (-1, 0, 1, 2, np.int64(3)):
        assert hw.decode(blob, threads=good).page_pool.shape == (2, 4, 1, 8)


def test_a_bad_chunk_table_is_refused_before_the_output_is_allocated(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import hurray_wire as hw

    pool = kv(3 * CHUNK).reshape(-1, 4, 1, 8).view(np.float16)
    tensor = hw.BlockPagedTensor.from_arrays(pool, [0], [0, 1])
    spec = Compression(CODEC_CHUNKED, min_size=0, chunk_size=CHUNK)
    data = bytearray(hw.encode(tensor, compression=spec))
    start = int.from_bytes(data[32 + 8 : 32 + 16], "little")  # section 0's offset
    struct.pack_into("<I", data, start + 4, 99)  # chunk_count

    def no_memory(*args: Any, **kwargs: Any) -> Any:
        raise MemoryError

    monkeypatch.setattr(np, "empty", no_memory)
    with pytest.raises(DecompressionError) as info:
        hw.decode(bytes(data), verify=False)
    assert (info.value.field, info.value.offset) == ("chunk_count", start + 4)
    monkeypatch.undo()
    good = bytearray(data)
    struct.pack_into("<I", good, start + 4, 6)  # the right count: the allocation is reached
    monkeypatch.setattr(np, "empty", no_memory)
    with pytest.raises(LimitExceededError) as limit:
        hw.decode(bytes(good), verify=False)
    assert limit.value.section == "buffer[0]"


def test_decompress_allocates_its_output() -> None:
    from hurray_wire import codecs

    raw = kv(3 * CHUNK)
    stored = chunked(raw)
    out = codecs.decompress(CODEC_CHUNKED, 2, stored, raw.size, threads=0)
    assert out.dtype == U8 and out.tobytes() == raw.tobytes()
    frame = zstandard.ZstdCompressor().compress(raw.tobytes())
    assert codecs.decompress(CODEC_ZSTD, 0, frame, raw.size).tobytes() == raw.tobytes()
    with pytest.raises(ArgumentTypeError):
        codecs.decompress(CODEC_CHUNKED, 2, stored, float(raw.size))  # type: ignore[arg-type]
    with pytest.raises(DecompressionError):
        codecs.decompress(CODEC_CHUNKED, 2, stored, raw.size + 1)
    with pytest.raises(CodecConfigError):
        codecs.decompress(CODEC_CHUNKED, 2, build(CHUNK, []), -1)


def test_decode_section_is_decompress_without_the_argument_checks() -> None:
    """The blob decoder's entry: same bytes out, same errors for bad stored bytes."""
    raw = kv(300_000)
    codec, param, stored = compress(raw, Compression(CODEC_CHUNKED, chunk_size=CHUNK), 2)
    src = np.frombuffer(stored, U8)
    out = decode_section(codec, param, src, raw.size, 0)
    assert out.tobytes() == raw.tobytes()
    assert out.tobytes() == decompress(codec, param, stored, raw.size, threads=2).tobytes()
    count = -(-raw.size // CHUNK)
    last_size = int(src[8 + 4 * (count - 1) : 8 + 4 * count].view("<u4")[0])
    broken = src.copy()
    broken[src.size - last_size] ^= 0xFF  # the last frame's magic
    with pytest.raises(DecompressionError) as caught:
        decode_section(codec, param, broken, raw.size, 0)
    assert caught.value.field == f"chunk {count - 1}"
    assert caught.value.offset == src.size - last_size
