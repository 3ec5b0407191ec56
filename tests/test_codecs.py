"""Storage codecs and checksums (hurray_wire.codecs; docs/wire-format.md section 6)."""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, cast

import ml_dtypes
import numpy as np
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings, strategies as st

from hurray_wire import codecs
from hurray_wire.codecs import (
    CODEC_CHUNKED,
    CODEC_NAMES,
    CODEC_RAW,
    CODEC_SHUFFLE_ZSTD,
    CODEC_ZSTD,
    DEFAULT_COMPRESSION,
    CodecConfigError,
    Compression,
    byteshuffle,
    checksum,
    compress,
    decompress_into,
    shuffle_bytes,
    unshuffle_bytes,
)
from hurray_wire.errors import (
    ArgumentTypeError,
    DecompressionError,
    HurrayWireError,
    LimitExceededError,
)
from tests.blob_reference import shuffle as reference_shuffle

U8 = np.uint8


def kv_like(n: int, dtype: Any, seed: int = 0) -> np.ndarray:
    """Activations like a KV cache: normal values, stored in ``dtype``."""
    return np.random.default_rng(seed).normal(0, 1.2, n).astype(np.float32).astype(dtype)


def kv_bytes(n: int, seed: int, scale: float) -> bytes:
    values = np.random.default_rng(seed).normal(0, scale, n)
    return np.asarray(values, np.float32).astype(np.float16).tobytes()


def decode(codec: int, param: int, stored: Any, size: int) -> np.ndarray:
    out = np.empty(size, U8)
    decompress_into(codec, param, stored, out)
    return out


def zstd_frame(data: bytes, **kw: Any) -> bytes:
    return zstandard.ZstdCompressor(**kw).compress(data)


def zstd_frame_without_size(data: bytes) -> bytes:
    cobj = zstandard.ZstdCompressor().compressobj()
    return cobj.compress(data) + cobj.flush()


# -- constants ---------------------------------------------------------------------------


def test_codec_ids_and_names() -> None:
    assert (CODEC_RAW, CODEC_ZSTD, CODEC_SHUFFLE_ZSTD, CODEC_CHUNKED) == (0, 1, 2, 3)
    assert CODEC_NAMES == {0: "raw", 1: "zstd", 2: "shuffle-zstd", 3: "chunked-shuffle-zstd"}
    assert frozenset({2, 4, 8}) == codecs.SHUFFLE_WIDTHS
    assert frozenset({1, 2, 4, 8}) == codecs.CHUNKED_WIDTHS
    assert issubclass(CodecConfigError, HurrayWireError)
    assert issubclass(CodecConfigError, ValueError)


def test_default_compression() -> None:
    assert Compression(CODEC_CHUNKED, level=1, threads=-1) == DEFAULT_COMPRESSION
    assert DEFAULT_COMPRESSION.min_size == 4096
    assert DEFAULT_COMPRESSION.chunk_size == 1 << 20
    assert str(DEFAULT_COMPRESSION) == "chunked-shuffle-zstd:1"


# -- checksum ----------------------------------------------------------------------------


def test_checksum_golden() -> None:
    assert checksum(b"") == 0x2D06800538D394C2
    assert checksum(b"123456789") == 0x72DCB18B67A17DFF


def test_checksum_accepts_every_bytes_like() -> None:
    data = np.arange(24, dtype=np.float16).reshape(3, 8)
    raw = data.tobytes()
    expected = checksum(raw)
    assert checksum(bytearray(raw)) == expected
    assert checksum(memoryview(raw)) == expected
    assert checksum(memoryview(cast(Any, data))) == expected  # format "e", two dimensions
    assert checksum(data) == expected
    assert checksum(np.frombuffer(raw, U8)) == expected
    bf16 = data.astype(ml_dtypes.bfloat16)  # a dtype that cannot export a buffer
    assert checksum(bf16) == checksum(bf16.tobytes())
    assert checksum(np.zeros(0, U8)) == checksum(b"")


@pytest.mark.parametrize(
    "bad",
    ["text", 123, None, np.arange(10)[::2], memoryview(b"abcdef")[::2], np.array([b"x"], object)],
)
def test_checksum_rejects_non_bytes(bad: Any) -> None:
    with pytest.raises(ArgumentTypeError):
        checksum(bad)


# -- byte shuffle ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("width", "data", "shuffled"),
    [
        (2, bytes(range(10)), bytes([0, 2, 4, 6, 8, 1, 3, 5, 7, 9])),
        (2, bytes(range(7)), bytes([0, 2, 4, 1, 3, 5, 6])),
        (4, bytes(range(10)), bytes([0, 4, 1, 5, 2, 6, 3, 7, 8, 9])),
        (
            8,
            bytes(range(19)),
            bytes([0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15, 16, 17, 18]),
        ),
        (3, bytes(range(7)), bytes([0, 3, 1, 4, 2, 5, 6])),
        (1, b"abc", b"abc"),
        (4, b"abc", b"abc"),
        (2, b"", b""),
    ],
)
def test_shuffle_golden(width: int, data: bytes, shuffled: bytes) -> None:
    assert shuffle_bytes(data, width).tobytes() == shuffled
    assert unshuffle_bytes(shuffled, width).tobytes() == data


@pytest.mark.parametrize("little_endian", [True, False])
@pytest.mark.parametrize("width", [1, 2, 3, 4, 5, 8, 16])
def test_shuffle_matches_reference(
    width: int, little_endian: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NumPy's kernels (the fast wide-integer paths and the portable strided path) and,
    for the little-endian run, whichever backend is loaded."""
    if not little_endian:
        monkeypatch.setattr(byteshuffle, "_LITTLE_ENDIAN", False)
        monkeypatch.setattr(byteshuffle, "state", [None])
    rng = np.random.default_rng(width)
    for n in [*range(0, 40), 1000, 4097]:
        data = rng.integers(0, 256, n, dtype=U8).tobytes()
        shuffled = shuffle_bytes(data, width)
        assert shuffled.dtype == U8 and shuffled.shape == (n,)
        assert shuffled.tobytes() == reference_shuffle(data, width)
        assert unshuffle_bytes(shuffled, width).tobytes() == data


def test_shuffle_unaligned_and_typed_inputs() -> None:
    raw = bytes(range(41))
    view = memoryview(raw)[1:]  # an odd start: the uint16 view is unaligned
    assert shuffle_bytes(view, 2).tobytes() == reference_shuffle(raw[1:], 2)
    f16 = kv_like(33, np.float16)
    assert shuffle_bytes(f16, 2).tobytes() == reference_shuffle(f16.tobytes(), 2)
    assert unshuffle_bytes(bytearray(reference_shuffle(raw, 4)), 4).tobytes() == raw


def test_shuffle_out_argument() -> None:
    data = bytes(range(20))
    out = np.full(20, 0xAA, U8)
    assert shuffle_bytes(data, 4, out=out) is out
    assert out.tobytes() == reference_shuffle(data, 4)
    back = np.empty((4, 5), U8)  # any C-contiguous shape of the right size
    assert unshuffle_bytes(out, 4, out=back) is back
    assert back.tobytes() == data


def test_shuffle_rejects_bad_arguments() -> None:
    data = np.arange(16, dtype=U8)
    with pytest.raises(CodecConfigError):
        shuffle_bytes(data, 0)
    with pytest.raises(ArgumentTypeError):
        shuffle_bytes(data, "2")  # type: ignore[arg-type]
    with pytest.raises(ArgumentTypeError):
        shuffle_bytes(data, True)
    with pytest.raises(ArgumentTypeError):
        shuffle_bytes("text", 2)  # type: ignore[arg-type]
    with pytest.raises(CodecConfigError):
        shuffle_bytes(data, 2, out=np.empty(15, U8))
    with pytest.raises(ArgumentTypeError):
        shuffle_bytes(data, 2, out=np.empty(8, np.uint16))
    with pytest.raises(ArgumentTypeError):
        shuffle_bytes(data, 2, out=np.empty(32, U8)[::2])
    with pytest.raises(CodecConfigError):
        shuffle_bytes(data, 2, out=data)  # in place is not supported
    frozen = np.empty(16, U8)
    frozen.flags.writeable = False
    with pytest.raises(ArgumentTypeError):
        unshuffle_bytes(data, 2, out=frozen)


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=300), width=st.integers(1, 16))
def test_shuffle_round_trip_property(data: bytes, width: int) -> None:
    shuffled = shuffle_bytes(data, width)
    assert shuffled.tobytes() == reference_shuffle(data, width)
    assert unshuffle_bytes(shuffled, width).tobytes() == data


# -- compress / decompress_into round trips ----------------------------------------------

SIZES = [0, 1, 7, 4095, 4096, 4097, 65_537, 400_003, 1_200_001]
DTYPES = {1: np.int8, 2: np.float16, 4: np.float32, 8: np.float64}


def sample(width: int, nbytes: int, seed: int = 0) -> np.ndarray:
    """Compressible bytes of ``nbytes`` length made of ``width``-byte elements."""
    if width == 1:
        values = np.random.default_rng(seed).normal(0, 8, nbytes).astype(np.int8)
        return values.view(U8)
    count = -(-nbytes // width)
    return kv_like(count, DTYPES[width], seed).view(U8)[:nbytes]


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("width", [1, 2, 4, 8])
@pytest.mark.parametrize(
    "spec",
    [
        "zstd:1",
        "zstd:3",
        "shuffle-zstd:1",
        "shuffle-zstd:3",
        "chunked-shuffle-zstd:1",
        "chunked-shuffle-zstd:3",
    ],
)
def test_round_trip(spec: str, width: int, size: int) -> None:
    compression = Compression.parse(spec)
    assert compression is not None
    raw = sample(width, size)
    codec, param, stored = compress(raw, compression, width)
    if size < compression.min_size:
        assert (codec, param) == (CODEC_RAW, 0) and stored is raw
    else:
        shuffled = width in (2, 4, 8)
        if compression.codec == CODEC_CHUNKED:
            expected = (CODEC_CHUNKED, width if shuffled else 1)
        elif compression.codec == CODEC_SHUFFLE_ZSTD and shuffled:
            expected = (CODEC_SHUFFLE_ZSTD, width)
        else:
            expected = (CODEC_ZSTD, 0)
        assert (codec, param) == expected
        assert isinstance(stored, bytes) and len(stored) < size
    assert decode(codec, param, stored, size).tobytes() == raw.tobytes()


@pytest.mark.parametrize("size", [0, 1, 2, 3, 5, 17, 100])
@pytest.mark.parametrize("width", [1, 2, 4, 8])
def test_round_trip_tiny_sections_with_min_size_zero(width: int, size: int) -> None:
    raw = np.zeros(size, U8)
    codec, param, stored = compress(raw, Compression(CODEC_SHUFFLE_ZSTD, min_size=0), width)
    if codec == CODEC_RAW:
        assert stored is raw
    assert decode(codec, param, stored, size).tobytes() == raw.tobytes()


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
@pytest.mark.parametrize("size", [300_000, 2_000_000])
def test_round_trip_kv_dtypes_both_paths(dtype: Any, size: int) -> None:
    """fp16 and bf16 take different zstd parameters; small and large sections take the
    streaming (plane-aligned blocks) and the one-shot path."""
    raw = kv_like(size // 2, dtype).reshape(-1, 8)
    for compression in (
        DEFAULT_COMPRESSION,
        Compression(CODEC_SHUFFLE_ZSTD, 1),
        Compression(CODEC_SHUFFLE_ZSTD, 1, threads=2),
    ):
        codec, param, stored = compress(raw, compression, 2)
        assert (codec, param) == (compression.codec, 2)
        assert len(stored) < raw.nbytes / 1.1
        assert decode(codec, param, stored, raw.nbytes).tobytes() == raw.tobytes()


def test_bf16_is_smaller_than_plain_zstd() -> None:
    raw = kv_like(200_000, ml_dtypes.bfloat16)
    _, _, shuffled = compress(raw, DEFAULT_COMPRESSION, 2)
    _, _, plain = compress(raw, Compression(CODEC_ZSTD, level=3), 2)
    assert len(shuffled) < len(plain) * 0.95


@pytest.mark.parametrize("kind", [bytes, bytearray, memoryview])
def test_round_trip_input_types(kind: Any) -> None:
    raw = sample(2, 10_000).tobytes()
    data = kind(raw)
    codec, param, stored = compress(data, DEFAULT_COMPRESSION, 2)
    assert codec == CODEC_CHUNKED
    assert decode(codec, param, kind(stored), len(raw)).tobytes() == raw


def test_incompressible_data_is_stored_raw_without_copy() -> None:
    raw = np.random.default_rng(1).integers(0, 256, 100_000, dtype=U8)
    for spec in ("zstd:1", "shuffle-zstd:1", "shuffle-zstd:19", "chunked-shuffle-zstd:1"):
        compression = Compression.parse(spec)
        assert compression is not None
        assert compress(raw, compression, 2) == (CODEC_RAW, 0, raw)
        assert compress(raw, compression, 2)[2] is raw


def test_compression_is_deterministic() -> None:
    raw = sample(2, 1_500_000, seed=3)
    for compression in (
        DEFAULT_COMPRESSION,
        Compression(CODEC_SHUFFLE_ZSTD, 3, threads=2),
        Compression(CODEC_CHUNKED, 3, threads=2, chunk_size=1 << 16),
    ):
        assert compress(raw, compression, 2) == compress(raw.copy(), compression, 2)


def test_compress_rejects_bad_arguments() -> None:
    raw = sample(2, 10_000)
    with pytest.raises(ArgumentTypeError):
        compress(raw, "zstd", 2)  # type: ignore[arg-type]
    with pytest.raises(ArgumentTypeError):
        compress(raw, DEFAULT_COMPRESSION, 2.0)  # type: ignore[arg-type]
    with pytest.raises(CodecConfigError):
        compress(raw, DEFAULT_COMPRESSION, 0)
    with pytest.raises(ArgumentTypeError):
        compress("text", DEFAULT_COMPRESSION, 2)  # type: ignore[arg-type]
    with pytest.raises(ArgumentTypeError):
        compress(np.arange(10_000, dtype=np.float16)[::2], DEFAULT_COMPRESSION, 2)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=st.one_of(
        st.binary(max_size=5000),
        st.builds(
            kv_bytes,
            st.integers(0, 4000),
            st.integers(0, 2**32 - 1),
            st.sampled_from([0.01, 1.0, 100.0]),
        ),
    ),
    width=st.integers(1, 9),
    codec=st.sampled_from([CODEC_ZSTD, CODEC_SHUFFLE_ZSTD, CODEC_CHUNKED]),
    level=st.sampled_from([1, 2, 3, 7]),
    min_size=st.sampled_from([0, 64, 4096]),
    threads=st.sampled_from([0, 2, -1]),
)
def test_round_trip_property(
    data: bytes, width: int, codec: int, level: int, min_size: int, threads: int
) -> None:
    compression = Compression(codec, level=level, min_size=min_size, chunk_size=4096)
    if codec == CODEC_CHUNKED:
        compression = dataclasses.replace(compression, threads=threads)
    got_codec, param, stored = compress(data, compression, width)
    assert got_codec in (CODEC_RAW, codec, CODEC_ZSTD)
    if got_codec == CODEC_RAW:
        assert stored is data
    else:
        assert len(stored) < len(data)
    assert decode(got_codec, param, stored, len(data)).tobytes() == data


# -- decompress_into rejects -------------------------------------------------------------


def assert_rejected(codec: int, param: int, stored: Any, size: int) -> HurrayWireError:
    with pytest.raises(DecompressionError) as info:
        decode(codec, param, stored, size)
    return info.value


def test_raw_section_size_and_param() -> None:
    assert decode(CODEC_RAW, 0, b"abc", 3).tobytes() == b"abc"
    assert decode(CODEC_RAW, 0, b"", 0).tobytes() == b""
    assert_rejected(CODEC_RAW, 0, b"abcd", 3)
    assert_rejected(CODEC_RAW, 0, b"ab", 3)
    assert_rejected(CODEC_RAW, 2, b"abc", 3)


@pytest.mark.parametrize("codec", [4, 127, 255, -1, 1000])
def test_unknown_codec(codec: int) -> None:
    error = assert_rejected(codec, 0, zstd_frame(b"abc"), 3)
    assert error.field == "codec" and error.found == codec


@pytest.mark.parametrize("param", [0, 1, 3, 5, 16, 255])
def test_bad_shuffle_width(param: int) -> None:
    stored = zstd_frame(reference_shuffle(b"abcdef", 2))
    error = assert_rejected(CODEC_SHUFFLE_ZSTD, param, stored, 6)
    assert error.field == "codec_param"


def test_zstd_codec_param_must_be_zero() -> None:
    assert_rejected(CODEC_ZSTD, 2, zstd_frame(b"abcdef"), 6)


def test_zstd_frames_from_other_writers_decode() -> None:
    """Any single frame of the right size decodes: other levels, a content checksum, no
    declared size, RLE blocks, an empty frame."""
    raw = b"hello, hello, hello, world" * 50
    cases = [
        (zstd_frame(raw, level=19), raw),
        (zstd_frame(raw, write_checksum=True), raw),
        (zstd_frame_without_size(raw), raw),
        (zstd_frame(b"\0" * 1000), b"\0" * 1000),
        (zstd_frame(b""), b""),
    ]
    for stored, expected in cases:
        assert decode(CODEC_ZSTD, 0, stored, len(expected)).tobytes() == expected
    shuffled = zstd_frame(reference_shuffle(raw, 4))
    assert decode(CODEC_SHUFFLE_ZSTD, 4, shuffled, len(raw)).tobytes() == raw


def test_frame_declaring_another_size() -> None:
    stored = zstd_frame(b"x" * 1000)
    assert assert_rejected(CODEC_ZSTD, 0, stored, 999).found == 1000
    assert assert_rejected(CODEC_ZSTD, 0, stored, 1001).found == 1000
    assert_rejected(CODEC_SHUFFLE_ZSTD, 2, stored, 1001)


def test_bomb_is_refused_from_its_header() -> None:
    bomb = zstd_frame(b"\0" * 10_000_000)
    assert len(bomb) < 1000
    error = assert_rejected(CODEC_ZSTD, 0, bomb, 100)
    assert (error.expected, error.found) == (100, 10_000_000)
    assert_rejected(CODEC_SHUFFLE_ZSTD, 2, bomb, 100)


def test_bomb_without_declared_size_stops_after_out() -> None:
    bomb = zstd_frame_without_size(b"\0" * 10_000_000)
    assert zstandard.get_frame_parameters(bomb).content_size == zstandard.CONTENTSIZE_UNKNOWN
    assert "more" in str(assert_rejected(CODEC_ZSTD, 0, bomb, 100))
    assert "fewer" in str(assert_rejected(CODEC_ZSTD, 0, zstd_frame_without_size(b"ab"), 3))


def test_huge_declared_size_never_allocates() -> None:
    # Single-segment frame header declaring 2**60 bytes, then one empty raw last block.
    header = b"\x28\xb5\x2f\xfd" + bytes([0xE0]) + (1 << 60).to_bytes(8, "little")
    stored = header + b"\x01\x00\x00"
    error = assert_rejected(CODEC_ZSTD, 0, stored, 100)
    assert error.found == 1 << 60


def test_huge_window_without_declared_size() -> None:
    # No content size, window descriptor asking for 1 GiB, one empty raw last block.
    stored = b"\x28\xb5\x2f\xfd\x00" + bytes([20 << 3]) + b"\x01\x00\x00"
    assert zstandard.get_frame_parameters(stored).window_size == 1 << 30
    with pytest.raises(LimitExceededError):
        decode(CODEC_ZSTD, 0, stored, 100)


def test_truncated_frames() -> None:
    for stored in (
        zstd_frame(b"hello world, " * 100),
        zstd_frame(b"hello world, " * 100, write_checksum=True),
    ):
        for cut in range(len(stored)):
            assert_rejected(CODEC_ZSTD, 0, stored[:cut], 1300)


def test_trailing_bytes_and_second_frames() -> None:
    stored = zstd_frame(b"abc" * 100)
    for tail in (b"\0", b"junk", zstd_frame(b""), zstd_frame(b"more"), b"\x50\x2a\x4d\x18"):
        error = assert_rejected(CODEC_ZSTD, 0, stored + tail, 300)
        assert "after" in str(error)


@pytest.mark.parametrize(
    "stored",
    [
        b"",
        b"\x28\xb5\x2f",
        b"\x28\xb5\x2f\xfd",
        b"\x28\xb5\x2f\xfd\x20",
        b"not a zstd frame at all",
        b"\x50\x2a\x4d\x18\x00\x00\x00\x00",  # a skippable frame
        b"\x28\xb5\x2f\xfd\x20\x03\x07\x00\x00",  # reserved block type
        b"\x28\xb5\x2f\xfd\x21\x01\x03\x01\x00\x00",  # needs dictionary 1
        b"\x28\xb5\x2f\xfd\x20\x03\x18\x00\x00abc",  # a raw block that is not the last, then end
        b"\x28\xb5\x2f\xfd\x20\x03\x29\x00\x00ab",  # last raw block of 5 bytes, 2 present
    ],
)
def test_malformed_frames(stored: bytes) -> None:
    assert_rejected(CODEC_ZSTD, 0, stored, 3)


def test_corrupt_compressed_block() -> None:
    raw = sample(2, 50_000).tobytes()
    _, _, stored = compress(raw, Compression(CODEC_ZSTD), 2)
    assert isinstance(stored, bytes)
    header = zstandard.frame_header_size(stored)
    corrupt = bytearray(stored)
    corrupt[header + 3 : header + 40] = bytes(37)  # zero the entropy tables of block 1
    assert_rejected(CODEC_ZSTD, 0, bytes(corrupt), len(raw))


@settings(max_examples=300, deadline=None)
@given(
    seed_data=st.binary(min_size=1, max_size=2000),
    edits=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=4),
    cut=st.integers(0, 10_000),
    codec=st.sampled_from([CODEC_ZSTD, CODEC_SHUFFLE_ZSTD, CODEC_CHUNKED]),
    size_delta=st.sampled_from([0, 0, 0, -1, 1, 1000]),
)
def test_mutated_frames_fail_only_with_hurray_errors(
    seed_data: bytes, edits: list[tuple[int, int]], cut: int, codec: int, size_delta: int
) -> None:
    stored = bytearray(zstd_frame(seed_data * 3))
    if codec == CODEC_CHUNKED:  # one chunk of up to 6000 bytes, table first
        stored[0:0] = (8192).to_bytes(4, "little") + b"\x01\0\0\0"
        stored[8:8] = (len(stored) - 8).to_bytes(4, "little")
    for at, value in edits:
        stored[at % len(stored)] = value
    stored = stored[: max(cut, len(stored) // 2)]
    size = max(0, len(seed_data) * 3 + size_delta)
    out = np.empty(size, U8)
    with contextlib.suppress(DecompressionError, LimitExceededError):
        decompress_into(codec, 0 if codec == CODEC_ZSTD else 2, bytes(stored), out)


@settings(max_examples=200, deadline=None)
@given(stored=st.binary(max_size=64), size=st.integers(0, 200), codec=st.integers(0, 4))
def test_random_bytes_fail_only_with_hurray_errors(stored: bytes, size: int, codec: int) -> None:
    param = 2 if codec in (CODEC_SHUFFLE_ZSTD, CODEC_CHUNKED) else 0
    with contextlib.suppress(DecompressionError, LimitExceededError):
        decompress_into(codec, param, b"\x28\xb5\x2f\xfd" + stored, np.empty(size, U8))


def test_decompress_into_rejects_bad_arguments() -> None:
    stored = zstd_frame(b"abcdef")
    with pytest.raises(ArgumentTypeError):
        decompress_into(CODEC_ZSTD, 0, stored, bytearray(6))  # type: ignore[arg-type]
    with pytest.raises(ArgumentTypeError):
        decompress_into(CODEC_ZSTD, 0, stored, np.empty(3, np.uint16))
    with pytest.raises(ArgumentTypeError):
        decompress_into(CODEC_ZSTD, 0, stored, np.empty(12, U8)[::2])
    frozen = np.empty(6, U8)
    frozen.flags.writeable = False
    with pytest.raises(ArgumentTypeError):
        decompress_into(CODEC_ZSTD, 0, stored, frozen)
    with pytest.raises(ArgumentTypeError):
        decompress_into(CODEC_ZSTD, 0, "text", np.empty(6, U8))  # type: ignore[arg-type]
    with pytest.raises(ArgumentTypeError):
        decompress_into("1", 0, stored, np.empty(6, U8))  # type: ignore[arg-type]
    with pytest.raises(ArgumentTypeError):
        decompress_into(CODEC_ZSTD, None, stored, np.empty(6, U8))  # type: ignore[arg-type]
    shared = np.zeros(64, U8)
    with pytest.raises(CodecConfigError):
        decompress_into(CODEC_RAW, 0, shared[:32], shared[16:48])


def test_decompress_into_accepts_numpy_integers_and_shaped_out() -> None:
    raw = sample(2, 6000)
    codec, param, stored = compress(raw, DEFAULT_COMPRESSION, 2)
    out = np.empty((3, 2000), U8)
    decompress_into(np.uint8(codec), np.uint8(param), np.frombuffer(stored, U8), out)
    assert out.tobytes() == raw.tobytes()


# -- Compression -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (None, None),
        ("none", None),
        ("raw", None),
        ("default", DEFAULT_COMPRESSION),
        ("zstd", Compression(CODEC_ZSTD)),
        ("zstd:5", Compression(CODEC_ZSTD, level=5)),
        ("zstd:22", Compression(CODEC_ZSTD, level=22)),
        ("shuffle-zstd", Compression(CODEC_SHUFFLE_ZSTD)),
        ("shuffle-zstd:1", Compression(CODEC_SHUFFLE_ZSTD, level=1)),
        ("shuffle-zstd:03", Compression(CODEC_SHUFFLE_ZSTD, level=3)),
        (" Shuffle-ZSTD:3 ", Compression(CODEC_SHUFFLE_ZSTD, level=3)),
        ("chunked-shuffle-zstd", Compression(CODEC_CHUNKED, threads=-1)),
        ("chunked-shuffle-zstd:1", DEFAULT_COMPRESSION),
        ("chunked-shuffle-zstd:7", Compression(CODEC_CHUNKED, level=7, threads=-1)),
    ],
)
def test_parse_accepts(spec: str | None, expected: Compression | None) -> None:
    assert Compression.parse(spec) == expected


def test_parse_passes_compression_through() -> None:
    custom = Compression(CODEC_ZSTD, level=7, threads=-1, min_size=0)
    assert Compression.parse(custom) is custom


@pytest.mark.parametrize(
    "spec",
    [
        "",
        "zstd:",
        "zstd:0",
        "zstd:23",
        "zstd:-1",
        "zstd:+3",
        "zstd:1e3",
        "zstd:abc",
        "zstd:1:2",
        "zstd :3",
        "zstd:1000",
        "lz4",
        "shuffle",
        "blosc2",
        "shuffle-zstd:99",
        "chunked",
        "chunked-zstd",
        "chunked-shuffle-zstd:0",
        "defaults",
    ],
)
def test_parse_rejects_values(spec: str) -> None:
    with pytest.raises(CodecConfigError) as info:
        Compression.parse(spec)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("spec", [3, b"zstd", 1.5, ["zstd"]])
def test_parse_rejects_types(spec: Any) -> None:
    with pytest.raises(ArgumentTypeError):
        Compression.parse(spec)


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"codec": CODEC_RAW}, CodecConfigError),
        ({"codec": 4}, CodecConfigError),
        ({"codec": CODEC_CHUNKED, "chunk_size": 0}, CodecConfigError),
        ({"codec": CODEC_CHUNKED, "chunk_size": 2048}, CodecConfigError),
        ({"codec": CODEC_CHUNKED, "chunk_size": 3 << 12}, CodecConfigError),
        ({"codec": CODEC_CHUNKED, "chunk_size": 1 << 31}, CodecConfigError),
        ({"codec": CODEC_CHUNKED, "chunk_size": 4096.0}, ArgumentTypeError),
        ({"codec": CODEC_ZSTD, "level": 0}, CodecConfigError),
        ({"codec": CODEC_ZSTD, "level": 23}, CodecConfigError),
        ({"codec": CODEC_ZSTD, "threads": -2}, CodecConfigError),
        ({"codec": CODEC_ZSTD, "min_size": -1}, CodecConfigError),
        ({"codec": CODEC_ZSTD, "level": "3"}, ArgumentTypeError),
        ({"codec": CODEC_ZSTD, "level": True}, ArgumentTypeError),
        ({"codec": CODEC_ZSTD, "level": 3.0}, ArgumentTypeError),
        ({"codec": "zstd"}, ArgumentTypeError),
    ],
)
def test_compression_validates(kwargs: dict[str, Any], error: type[Exception]) -> None:
    with pytest.raises(error):
        Compression(**kwargs)


def test_compression_is_a_value_object() -> None:
    a = Compression(np.uint8(2), level=np.int64(3))
    assert type(a.codec) is int and type(a.level) is int
    assert a == Compression(CODEC_SHUFFLE_ZSTD, 3) and hash(a) == hash(Compression(2, 3))
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.level = 5  # type: ignore[misc]
    assert str(Compression(CODEC_ZSTD, level=9)) == "zstd:9"


@pytest.mark.parametrize("spec", ["zstd:1", "shuffle-zstd:1", "default"])
@pytest.mark.parametrize("size", [100, 300_000, 1 << 20, 3_000_000])
def test_compress_parts_join_to_compress(spec: str, size: int) -> None:
    compression = Compression.parse(spec)
    assert compression is not None
    raw = sample(2, size)
    codec, param, parts = codecs.compress_parts(raw, compression, 2)
    whole = compress(raw, compression, 2)
    assert (codec, param) == whole[:2]
    if codec == CODEC_RAW:
        assert parts == [] and whole[2] is raw
    else:
        assert all(isinstance(p, bytes) and p for p in parts)
        assert b"".join(parts) == whole[2]
        assert decode(codec, param, whole[2], size).tobytes() == raw.tobytes()
