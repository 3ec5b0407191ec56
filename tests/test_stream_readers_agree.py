"""StreamReader and StreamFile frame a stream through one RecordReader: every cut and every
misplaced record gets the same verdict (type, message and stream offset) from both.

Before the fold, StreamFile's own walk placed an end-record cut at an offset inside the
record (58 instead of 634) and accepted a stream header padded past the decode limits that
StreamReader refused.
"""

from __future__ import annotations

import io
import struct

import numpy as np
import pytest
import xxhash

import hurray_wire as hw
from hurray_wire import containers as hwc


def _stream() -> tuple[bytes, int]:
    pool = np.zeros((2, 2, 1, 4), np.float16)
    tensor = hw.BlockPagedTensor.from_arrays(pool, [1, 0], [0, 2], kv_role="key", layer_index=0)
    out = io.BytesIO()
    with hwc.StreamWriter(out, hwc.StreamHeader(num_layers=2)) as writer:
        writer.write(tensor)
    return out.getvalue(), len(hwc.encode_stream_header(hwc.StreamHeader(num_layers=2)))


def _errors(
    data: bytes, limits: hw.DecodeLimits | None = None
) -> tuple[hw.HurrayWireError | None, hw.HurrayWireError | None]:
    """What StreamFile (at open, or where its walk stopped) and StreamReader refuse."""
    try:
        file_error = hwc.StreamFile(data, limits=limits).error
    except hw.HurrayWireError as exc:
        file_error = exc
    try:
        list(hwc.StreamReader(data, limits=limits))
    except hw.HurrayWireError as exc:
        return file_error, exc
    return file_error, None


def _same(file_error: object, reader_error: object) -> None:
    assert type(file_error) is type(reader_error)
    assert str(file_error) == str(reader_error)


@pytest.mark.parametrize(
    ("cut", "error", "offset"),
    [
        (3, hw.errors.StreamTruncatedError, 3),  # "HRW": which record is not known yet
        (10, hw.errors.StreamBlobTruncatedError, 10),  # inside the blob's prefix
        (200, hw.errors.StreamBlobTruncatedError, 200),  # inside the blob
        (-70, hw.errors.StreamTruncatedError, -70),  # inside the end record
        (-1, hw.errors.StreamTruncatedError, -1),
    ],
)
def test_a_cut_stream_gets_one_verdict(cut: int, error: type, offset: int) -> None:
    data, header = _stream()
    at = header + cut if cut > 0 else len(data) + cut
    file_error, reader_error = _errors(data[:at])
    assert reader_error is not None and isinstance(reader_error, error)
    _same(file_error, reader_error)
    assert reader_error.offset == (header + offset if offset > 0 else len(data) + offset)


def test_a_stream_header_past_the_start_gets_one_verdict() -> None:
    data, header = _stream()
    file_error, reader_error = _errors(data[:header] + hwc.encode_stream_header(hwc.StreamHeader()))
    assert isinstance(reader_error, hw.errors.InvalidStreamError)
    assert "a stream header may only open the stream" in str(reader_error)
    _same(file_error, reader_error)


def test_a_header_padded_past_the_limits_is_refused_by_both() -> None:
    data, header = _stream()
    limits = hw.DecodeLimits(max_metadata_bytes=64)
    fixed = bytearray(data[: header - 8])
    total = 65664 + 64  # the longest header these limits admit: 32 + 0xFFFF + 64 + 8, aligned
    padded = fixed + bytes(total - 8 - len(fixed))
    struct.pack_into("<Q", padded, 8, total)
    padded += struct.pack("<Q", xxhash.xxh3_64_intdigest(bytes(padded)))
    file_error, reader_error = _errors(bytes(padded) + data[header:], limits)
    assert isinstance(reader_error, hw.errors.LimitExceededError)
    assert "decode limits" in str(reader_error)
    _same(file_error, reader_error)
