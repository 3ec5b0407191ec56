"""Streams of blobs (docs/streaming.md): writer, sequential reader, mapped random access.

Golden bytes for the stream header and end record; round trips over BytesIO, pipes and
sockets; a cut at every byte offset; corruption; hostile lengths; the mmap path is zero-copy
and lazy.
"""

from __future__ import annotations

import contextlib
import gc
import io
import itertools
import mmap
import os
import random
import socket
import struct
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import construct as c
import numpy as np
import pytest
import xxhash

import hurray_wire as hw
from hurray_wire.containers import (
    StreamEntry,
    StreamFile,
    StreamHeader,
    StreamReader,
    StreamWriter,
    decode_end_record,
    decode_stream_header,
    encode_end_record,
    encode_stream_header,
)
from hurray_wire.errors import (
    ArgumentTypeError,
    BlobTruncatedError,
    ChecksumError,
    HurrayWireError,
    InvalidBlobError,
    InvalidMetadataError,
    InvalidStreamError,
    LimitExceededError,
    StreamBlobTruncatedError,
    StreamTruncatedError,
    TruncatedError,
)
from hurray_wire.wire import stream as ws
from hurray_wire.wire.fast import derive

# -- helpers ---------------------------------------------------------------------------------


def make_tensor(
    layer: int | None, role: str = "key", *, pages: int = 5, heads: int = 2, dim: int = 8
) -> hw.BlockPagedTensor:
    """A small tensor whose every value depends on (layer, role): mix-ups cannot hide."""
    seed = (0 if layer is None else layer + 1) * 7 + hw.wire.descriptor.KV_ROLES[role]
    rng = np.random.default_rng(seed)
    bits = rng.integers(0, 1 << 16, size=(pages, 4, heads, dim), dtype=np.uint16)
    pool = bits.view(np.float16)
    return hw.BlockPagedTensor.from_arrays(
        pool,
        [0, 1, 4, 3],
        [0, 2, 4],
        seq_lens=[6, 7],
        kv_role=role,
        layer_index=layer,
        metadata={"request": "r-1"},
    )


def assert_same(got: hw.BlockPagedTensor, want: hw.BlockPagedTensor) -> None:
    assert (got.layer_index, got.kv_role) == (want.layer_index, want.kv_role)
    assert got.descriptor == want.descriptor
    assert np.array_equal(got.page_pool.view(np.uint16), want.page_pool.view(np.uint16))
    assert np.array_equal(got.block_table, want.block_table)
    assert np.array_equal(got.seq_ptr, want.seq_ptr)
    assert got.seq_lens is not None and want.seq_lens is not None
    assert np.array_equal(got.seq_lens, want.seq_lens)
    assert got.metadata == want.metadata


HEADER = StreamHeader(
    model="test-model", num_layers=3, kv_roles=("key", "value"), element_type=hw.float16
)
TENSORS = [make_tensor(layer, role) for layer in range(3) for role in ("key", "value")]


def stream_bytes(
    tensors: list[hw.BlockPagedTensor] = TENSORS,
    header: StreamHeader | None = HEADER,
    **options: Any,
) -> bytes:
    sink = io.BytesIO()
    with StreamWriter(sink, header, **options) as writer:
        for tensor in tensors:
            writer.write(tensor, pages="all")
    return sink.getvalue()


def blob_offsets(data: bytes) -> list[tuple[int, int]]:
    """(offset, length) of every blob, framed from the prefixes only."""
    out = []
    pos = 0
    while pos < len(data):
        magic = data[pos : pos + 4]
        length = struct.unpack_from("<Q", data, pos + 8)[0]
        if magic == b"HRWB":
            out.append((pos, length))
        pos += length
    return out


def pool_span(data: bytes | bytearray, blob_offset: int) -> tuple[int, int]:
    """Stream offsets [start, stop) of a blob's page_pool: section 0 of its table."""
    start, size = struct.unpack_from("<QQ", data, blob_offset + 32 + 8)
    return blob_offset + start, blob_offset + start + size


def read_all(reader: StreamReader) -> tuple[list[hw.BlockPagedTensor], HurrayWireError | None]:
    got: list[hw.BlockPagedTensor] = []
    try:
        for tensor in reader:
            got.append(tensor)
    except HurrayWireError as exc:
        return got, exc
    return got, None


def with_checksum(record: bytearray, tail: int = 8) -> bytes:
    """Recompute a stream header's trailing checksum after an edit (tail=16: end record)."""
    end = len(record) - tail
    struct.pack_into("<Q", record, end, xxhash.xxh3_64_intdigest(bytes(record[:end])))
    return bytes(record)


# -- the wire structs ------------------------------------------------------------------------

GOLDEN_HEADER = bytes.fromhex(
    "4852575301000100400000000000000002000000030105000000000000000000"
    "6c6c616d610000000000000000000000000000000000000022ddd6d3a62c143c"
)
GOLDEN_END = bytes.fromhex(
    "4852574501000000800000000000000002000000000000000200000000000000"
    "4000000000000000000400000000000000000000000000004004000000000000"
    "0004000000000000ffffffff0200000000000000000000000000000000000000"
    "000000000000000000000000000000000acc31620a95b78e8000000000000000"
)


def test_stream_header_golden_bytes() -> None:
    header = StreamHeader(
        model="llama", num_layers=2, kv_roles=("value", "key"), element_type=hw.float16
    )
    assert encode_stream_header(header) == GOLDEN_HEADER
    assert decode_stream_header(GOLDEN_HEADER) == header
    assert header.kv_roles == ("key", "value")  # normalised to code order


def test_end_record_golden_bytes() -> None:
    entries = [StreamEntry(64, 1024, 0, "key"), StreamEntry(1088, 1024, None, "fused")]
    assert encode_end_record(entries, 2) == GOLDEN_END
    assert decode_end_record(GOLDEN_END) == (2, tuple(entries))


@pytest.mark.parametrize(
    ("definition", "size"),
    [
        (ws.RECORD_PREFIX, 16),
        (ws.STREAM_HEADER, 32),
        (ws.END_RECORD, 32),
        (ws.END_ENTRY, 24),
        (ws.END_FOOTER, 16),
        (ws.RECORD_CHECKSUM, 8),
    ],
)
def test_struct_sizes_and_derived_twins(definition: Any, size: int) -> None:
    assert definition.sizeof() == size
    assert derive(definition).size == size


def test_structs_parse_and_build_the_golden_records() -> None:
    fixed = ws.STREAM_HEADER.parse(GOLDEN_HEADER[:32])
    assert (fixed.num_layers, fixed.kv_roles, fixed.element_type) == (2, 0x03, 0x01)
    assert (fixed.total_length, fixed.model_name_length, fixed.stream_flags) == (64, 5, 1)
    assert ws.STREAM_HEADER.build(fixed) == GOLDEN_HEADER[:32]
    for compiled in (ws.STREAM_HEADER.compile(), ws.END_RECORD.compile()):
        assert compiled.sizeof() == 32
    end = ws.END_RECORD.parse(GOLDEN_END[:32])
    assert (end.blob_count, end.entry_count, end.total_length) == (2, 2, 128)
    assert ws.END_RECORD.build(end) == GOLDEN_END[:32]
    entry = ws.END_ENTRY.parse(GOLDEN_END[56:80])
    assert (entry.offset, entry.length, entry.layer_index, entry.kv_role) == (1088, 1024, LN, 2)
    assert ws.END_ENTRY.build(entry) == GOLDEN_END[56:80]
    footer = ws.END_FOOTER.parse(GOLDEN_END[-16:])
    assert footer.total_length == 128
    with pytest.raises(c.ConstError):
        ws.STREAM_HEADER.parse(b"HRWB" + GOLDEN_HEADER[4:32])


LN = 0xFFFFFFFF


def test_stream_header_and_blob_are_told_apart_by_magic() -> None:
    blob = bytes(hw.encode(TENSORS[0]))
    assert GOLDEN_HEADER[:4] == b"HRWS" and blob[:4] == b"HRWB" and GOLDEN_END[:4] == b"HRWE"
    with pytest.raises(InvalidBlobError, match="magic"):
        hw.decode(GOLDEN_HEADER)
    with pytest.raises(InvalidBlobError, match="magic"):
        hw.blob_length(GOLDEN_HEADER)
    with pytest.raises(InvalidStreamError, match="magic"):
        decode_stream_header(blob)
    # the shared prefix frames all three the same way
    for record in (GOLDEN_HEADER, GOLDEN_END, blob):
        assert struct.unpack_from("<Q", record, 8)[0] == len(record)


# -- stream header ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "header",
    [
        StreamHeader(),
        StreamHeader(end_record=False),
        HEADER,
        StreamHeader(model="é" * 40, num_layers=0, kv_roles=("fused",)),
        StreamHeader(
            model="m",
            num_layers=2**32 - 2,
            kv_roles=("key", "value", "fused"),
            element_type="bfloat16",  # type: ignore[arg-type]
            metadata={"page_size": 16, "heads": [8, 8], "scale": 0.5, "raw": b"\0\1"},
        ),
    ],
)
def test_stream_header_round_trip(header: StreamHeader) -> None:
    data = encode_stream_header(header)
    assert len(data) % 64 == 0
    assert decode_stream_header(data) == header
    assert decode_stream_header(data + b"trailing bytes are the stream's") == header
    assert encode_stream_header(decode_stream_header(data)) == data  # deterministic


def test_stream_header_defaults_state_nothing() -> None:
    data = encode_stream_header(StreamHeader())
    fixed = ws.STREAM_HEADER.parse(data[:32])
    assert (fixed.num_layers, fixed.kv_roles, fixed.element_type) == (LN, 0, 0)
    assert len(data) == 64


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"num_layers": -1}, InvalidStreamError),
        ({"num_layers": 2**32 - 1}, InvalidStreamError),
        ({"num_layers": True}, InvalidStreamError),
        ({"kv_roles": ("keys",)}, InvalidStreamError),
        ({"kv_roles": "key"}, ArgumentTypeError),
        ({"model": "x" * 65536}, InvalidStreamError),
        ({"model": b"m"}, ArgumentTypeError),
        ({"element_type": "float17"}, HurrayWireError),
        ({"metadata": [1]}, ArgumentTypeError),
    ],
)
def test_stream_header_refuses_bad_fields(kwargs: dict[str, Any], error: type) -> None:
    with pytest.raises(error):
        StreamHeader(**kwargs)


def test_stream_header_refuses_bad_metadata_at_encode() -> None:
    with pytest.raises(InvalidMetadataError):
        encode_stream_header(StreamHeader(metadata={"": 1}))


def _edit(data: bytes, offset: int, value: bytes) -> bytes:
    record = bytearray(data)
    record[offset : offset + len(value)] = value
    return with_checksum(record)


@pytest.mark.parametrize(
    ("offset", "value", "error", "match"),
    [
        (0, b"HRWX", InvalidStreamError, "magic"),
        (4, b"\x02", InvalidStreamError, "major"),
        (6, b"\x02\x00", InvalidStreamError, "flags"),
        (8, struct.pack("<Q", 65), InvalidStreamError, "total_length"),
        (8, struct.pack("<Q", 0), InvalidStreamError, "total_length"),
        (20, b"\x08", InvalidStreamError, "kv_roles"),
        (21, b"\x47", HurrayWireError, "element type"),
        (22, struct.pack("<H", 30), InvalidStreamError, "past total_length"),
        (24, struct.pack("<I", 1), InvalidMetadataError, None),
        (28, b"\x01", InvalidStreamError, "reserved"),
        (32, b"\xff", InvalidStreamError, "UTF-8"),
        (40, b"\x01", InvalidStreamError, "padding"),
    ],
)
def test_stream_header_rejections(
    offset: int, value: bytes, error: type, match: str | None
) -> None:
    with pytest.raises(error, match=match):
        decode_stream_header(_edit(GOLDEN_HEADER, offset, value))


def test_stream_header_minor_version_may_use_the_padding() -> None:
    newer = _edit(_edit(GOLDEN_HEADER, 5, b"\x01"), 40, b"\x07")
    assert decode_stream_header(newer).model == "llama"


def test_stream_header_every_flipped_bit_is_caught() -> None:
    for offset in range(len(GOLDEN_HEADER)):
        for bit in (0x01, 0x80):
            data = bytearray(GOLDEN_HEADER)
            data[offset] ^= bit
            with pytest.raises(HurrayWireError):
                decode_stream_header(bytes(data))


def test_stream_header_truncated_at_every_length() -> None:
    for cut in range(len(GOLDEN_HEADER)):
        with pytest.raises(HurrayWireError) as info:
            decode_stream_header(GOLDEN_HEADER[:cut])
        if cut >= 4:  # from the magic on it is a stream header that ends early
            assert isinstance(info.value, StreamTruncatedError)


# -- end record ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("offset", "value", "match"),
    [
        (6, b"\x01", "flags"),
        (24, struct.pack("<I", 1), "every blob or none"),
        (24, struct.pack("<I", 200), "past total_length"),
        (28, b"\x01", "reserved"),
        (52, b"\x03", "kv_role"),
        (53, b"\x01", "kv_role"),
        (90, b"\x01", "padding"),
    ],
)
def test_end_record_rejections(offset: int, value: bytes, match: str) -> None:
    record = bytearray(GOLDEN_END)
    record[offset : offset + len(value)] = value
    with pytest.raises(InvalidStreamError, match=match):
        decode_end_record(with_checksum(record, 16))


def test_end_record_footer_and_checksum() -> None:
    record = bytearray(GOLDEN_END)
    record[-8] ^= 0x40
    with pytest.raises(InvalidStreamError, match="footer"):
        decode_end_record(bytes(record))
    record = bytearray(GOLDEN_END)
    record[33] ^= 1
    with pytest.raises(InvalidStreamError, match="checksum"):
        decode_end_record(bytes(record))


def test_end_record_without_index() -> None:
    data = encode_end_record(None, 5)
    assert len(data) == 64
    assert decode_end_record(data) == (5, None)
    assert decode_end_record(encode_end_record([], 0)) == (0, ())


# -- round trips -----------------------------------------------------------------------------


def test_round_trip_bytesio_with_header_and_index() -> None:
    data = stream_bytes()
    reader = StreamReader(io.BytesIO(data))
    assert reader.header == HEADER
    got = list(reader)
    assert len(got) == len(TENSORS)
    for tensor, want in zip(got, TENSORS, strict=True):
        assert_same(tensor, want)
        assert tensor.page_pool.flags.writeable  # its own buffer, not a shared one
    assert reader.complete
    assert reader.position == len(data)
    assert [(e.layer_index, e.kv_role) for e in reader.entries] == [
        (t.layer_index, t.kv_role) for t in TENSORS
    ]
    assert list(reader) == []  # exhausted, stays exhausted
    for a, b in itertools.pairwise(got):
        assert not np.shares_memory(a.page_pool, b.page_pool)


def test_round_trip_is_deterministic_and_matches_encode() -> None:
    data = stream_bytes()
    assert data == stream_bytes()
    blobs = [data[o : o + n] for o, n in blob_offsets(data)]
    assert blobs == [bytes(hw.encode(t)) for t in TENSORS]


def test_concatenated_blobs_without_header_or_end() -> None:
    data = b"".join(bytes(hw.encode(t)) for t in TENSORS[:3])
    reader = StreamReader(io.BytesIO(data))
    assert reader.header is None
    got = list(reader)
    assert [t.layer_index for t in got] == [0, 0, 1]
    for tensor, want in zip(got, TENSORS, strict=False):
        assert_same(tensor, want)
    assert not reader.complete


def test_empty_input_is_not_a_stream() -> None:  # decided in issue 11 (docs/streaming.md)
    reader = StreamReader(io.BytesIO(b""))
    assert reader.header is None
    with pytest.raises(StreamTruncatedError, match="empty input"):
        list(reader)


def test_header_only_stream_with_end_record() -> None:
    data = stream_bytes([])
    reader = StreamReader(io.BytesIO(data))
    assert list(reader) == []
    assert reader.complete


def test_bytes_after_the_end_record_are_left_unread() -> None:
    data = stream_bytes()
    source = io.BytesIO(data + b"next protocol message")
    assert len(list(StreamReader(source))) == len(TENSORS)
    assert source.read() == b"next protocol message"


def test_compression_and_no_checksum_options_pass_through() -> None:
    sink = io.BytesIO()
    with StreamWriter(sink, HEADER) as writer:
        writer.write(TENSORS[0], compression="zstd", pages="all")
        writer.write(TENSORS[1], checksum=False, pages="all")
    got = list(StreamReader(io.BytesIO(sink.getvalue())))
    assert_same(got[0], TENSORS[0])
    assert_same(got[1], TENSORS[1])


def test_index_false_writes_an_end_record_without_entries() -> None:
    data = stream_bytes(index=False)
    end = data[blob_offsets(data)[-1][0] + blob_offsets(data)[-1][1] :]
    assert decode_end_record(end) == (len(TENSORS), None)
    reader = StreamReader(io.BytesIO(data))
    assert len(list(reader)) == len(TENSORS) and reader.complete
    with StreamFile(data) as mapped:  # no index: found by walking
        assert mapped.complete and len(mapped) == len(TENSORS)


def test_header_none_writes_a_bare_stream_with_end_record() -> None:
    data = stream_bytes(header=None)
    assert data[:4] == b"HRWB"
    reader = StreamReader(io.BytesIO(data))
    assert len(list(reader)) == len(TENSORS) and reader.complete and reader.header is None


def test_header_without_end_record_promise() -> None:
    data = stream_bytes(header=StreamHeader(end_record=False))
    assert b"HRWE" not in data[-128:]
    reader = StreamReader(io.BytesIO(data))
    assert len(list(reader)) == len(TENSORS)
    assert not reader.complete


# -- writer ----------------------------------------------------------------------------------


class _Trickle(io.RawIOBase):
    """A raw sink that accepts at most 5 bytes per write (short writes must be retried)."""

    def __init__(self) -> None:
        self.data = bytearray()

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        chunk = bytes(memoryview(b)[:5])
        self.data += chunk
        return len(chunk)


class _TrickleSocket:
    """A socket whose sendmsg sends at most 7 bytes, across piece boundaries."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.calls = 0

    def sendmsg(self, buffers: list[memoryview]) -> int:
        self.calls += 1
        joined = b"".join(bytes(b) for b in buffers)[:7]
        self.data += joined
        return len(joined)


def test_writer_retries_short_writes_and_partial_sendmsg() -> None:
    want = stream_bytes()
    raw = _Trickle()
    with StreamWriter(raw, HEADER) as writer:
        for tensor in TENSORS:
            writer.write(tensor, pages="all")
    assert bytes(raw.data) == want
    sock = _TrickleSocket()
    with StreamWriter(sock, HEADER) as writer:
        for tensor in TENSORS:
            writer.write(tensor, pages="all")
    assert bytes(sock.data) == want
    assert sock.calls >= len(want) // 7


def test_writer_exception_leaves_the_stream_cut() -> None:
    sink = io.BytesIO()
    with pytest.raises(RuntimeError), StreamWriter(sink, HEADER) as writer:
        writer.write(TENSORS[0], pages="all")
        raise RuntimeError("prefill crashed")
    assert writer.closed
    got, error = read_all(StreamReader(io.BytesIO(sink.getvalue())))
    assert len(got) == 1
    assert isinstance(error, StreamTruncatedError)
    assert "end record" in str(error)


def test_writer_state_and_argument_errors(tmp_path: Path) -> None:
    writer = StreamWriter(io.BytesIO())
    assert writer.position == 64 and writer.blob_count == 0
    with pytest.raises(ArgumentTypeError):
        writer.write(np.zeros(4))  # type: ignore[arg-type]
    writer.close()
    writer.close()  # idempotent
    with pytest.raises(InvalidStreamError, match="closed"):
        writer.write(TENSORS[0], pages="all")
    with pytest.raises(ArgumentTypeError):
        StreamWriter(object())
    with pytest.raises(ArgumentTypeError):
        StreamWriter(io.BytesIO(), header="llama")  # type: ignore[arg-type]
    path = tmp_path / "s.hrws"
    with StreamWriter(path, HEADER) as writer:
        writer.write(TENSORS[0], pages="all")
    assert path.read_bytes() == stream_bytes(TENSORS[:1])


class _FailingSink:
    def __init__(self, fail_after: int) -> None:
        self.data = bytearray()
        self.fail_after = fail_after

    def write(self, b: Any) -> int:
        if len(self.data) + len(b) > self.fail_after:
            raise BrokenPipeError("peer went away")
        self.data += bytes(b)
        return len(b)


def test_writer_failure_breaks_the_stream_and_close_adds_no_end_record() -> None:
    sink = _FailingSink(2000)
    writer = StreamWriter(sink, HEADER)
    with pytest.raises(BrokenPipeError):
        for tensor in TENSORS:
            writer.write(tensor, pages="all")
    with pytest.raises(InvalidStreamError, match="broken"):
        writer.write(TENSORS[0], pages="all")
    size = len(sink.data)
    writer.close()
    assert len(sink.data) == size


@pytest.mark.parametrize(
    ("header", "tensor", "match"),
    [
        (StreamHeader(num_layers=2), make_tensor(2), "num_layers"),
        (StreamHeader(num_layers=2), make_tensor(None), "num_layers"),
        (StreamHeader(kv_roles=("key",)), make_tensor(0, "value"), "kv_role"),
        (StreamHeader(element_type=hw.bfloat16), make_tensor(0), "element type"),
    ],
)
def test_blobs_must_match_the_stream_header(
    header: StreamHeader, tensor: hw.BlockPagedTensor, match: str
) -> None:
    with pytest.raises(InvalidStreamError, match=match):
        StreamWriter(io.BytesIO(), header).write(tensor, pages="all")
    # a stream built by other means is refused by the reader too
    data = encode_stream_header(header) + bytes(hw.encode(tensor))
    with pytest.raises(InvalidStreamError, match=match):
        list(StreamReader(io.BytesIO(data)))


# -- transports ------------------------------------------------------------------------------


def _write_in_thread(
    make_sink: Callable[[], Any], finish: Callable[[Any], None]
) -> threading.Thread:
    def run() -> None:
        sink = make_sink()
        try:
            with StreamWriter(sink, HEADER) as writer:
                for tensor in TENSORS:
                    writer.write(tensor, pages="all")
        finally:
            finish(sink)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_pipe_transport() -> None:
    read_fd, write_fd = os.pipe()
    thread = _write_in_thread(lambda: os.fdopen(write_fd, "wb"), lambda f: f.close())
    with os.fdopen(read_fd, "rb") as source:
        reader = StreamReader(source)
        got = list(reader)
    thread.join(10)
    assert reader.complete
    for tensor, want in zip(got, TENSORS, strict=True):
        assert_same(tensor, want)


def test_unbuffered_pipe_and_read_only_sources() -> None:
    data = stream_bytes()
    read_fd, write_fd = os.pipe()
    thread = _write_in_thread(lambda: os.fdopen(write_fd, "wb", buffering=0), lambda f: f.close())
    with os.fdopen(read_fd, "rb", buffering=0) as source:
        assert len(list(StreamReader(source))) == len(TENSORS)
    thread.join(10)

    class ReadOnly:
        def __init__(self) -> None:
            self.inner = io.BytesIO(data)

        def read(self, n: int) -> bytes:
            return self.inner.read(min(n, 3))

    reader = StreamReader(ReadOnly())
    assert len(list(reader)) == len(TENSORS) and reader.complete


def test_socketpair_transport() -> None:
    left, right = socket.socketpair()
    thread = _write_in_thread(lambda: left, lambda s: s.close())
    with right:
        reader = StreamReader(right)
        got = list(reader)
    thread.join(10)
    assert reader.complete
    for tensor, want in zip(got, TENSORS, strict=True):
        assert_same(tensor, want)


def _tcp_pair() -> tuple[socket.socket, socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname(), timeout=10)
        conn, _ = server.accept()
    conn.settimeout(10)
    return client, conn


def test_tcp_loopback_transport_with_large_blobs() -> None:
    big = [make_tensor(layer, role, pages=256, heads=8, dim=128) for layer in range(2)
           for role in ("key", "value")]  # fmt: skip
    client, conn = _tcp_pair()

    def send() -> None:
        with client, StreamWriter(client, StreamHeader(num_layers=2)) as writer:
            for tensor in big:
                writer.write(tensor, pages="all")

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    with conn:
        reader = StreamReader(conn)
        got = list(reader)
    thread.join(10)
    assert reader.complete
    for tensor, want in zip(got, big, strict=True):
        assert_same(tensor, want)


# -- cuts and corruption ---------------------------------------------------------------------

SMALL = TENSORS[:3]


@pytest.mark.parametrize("header", [HEADER, None], ids=["header+end", "bare"])
@pytest.mark.parametrize("kind", ["bytesio", "memory", "file"])
def test_truncation_at_every_byte_offset(
    header: StreamHeader | None, kind: str, tmp_path: Path
) -> None:
    if header is None:
        data = b"".join(bytes(hw.encode(t)) for t in SMALL)
    else:
        data = stream_bytes(SMALL, header)
    blobs = blob_offsets(data)
    path = tmp_path / "cut.hrws"
    cuts = range(len(data))
    if kind == "file":  # the same code as "memory" once mapped: sample, around every edge
        edges = {o + d for o, n in blobs for d in (-1, 0, 1, 3, 4, 15, 16, 17, n - 1)}
        cuts = sorted((set(range(0, len(data), 11)) | edges) & set(cuts))  # type: ignore[assignment]
    for cut in cuts:
        part = data[:cut]
        if kind == "file":
            path.write_bytes(part)
            reader = StreamReader(path)
        else:
            reader = StreamReader(io.BytesIO(part) if kind == "bytesio" else part)
        got, error = read_all(reader)
        whole = sum(1 for offset, length in blobs if offset + length <= cut)
        assert len(got) == whole, cut
        boundary = cut == 0 or any(offset + length == cut for offset, length in blobs)
        if cut and header is None and boundary:  # a bare stream cut between blobs
            assert error is None, cut
        else:
            assert isinstance(error, StreamTruncatedError), (cut, error)
            # a cut in the first 3 bytes of a record cannot tell a blob from an end record
            inside = any(offset + 4 <= cut < offset + length for offset, length in blobs)
            assert isinstance(error, BlobTruncatedError) == inside, cut
        for tensor, want in zip(got, SMALL, strict=False):  # still intact after the error
            assert_same(tensor, want)
        reader.close()


def test_truncation_every_offset_random_access() -> None:
    data = stream_bytes(SMALL)
    blobs = blob_offsets(data)
    for cut in range(64, len(data)):
        mapped = StreamFile(data[:cut])
        whole = sum(1 for offset, length in blobs if offset + length <= cut)
        assert len(mapped) == whole, cut
        assert not mapped.complete
        assert isinstance(mapped.error, TruncatedError), cut
        for entry, want in zip(mapped.entries, SMALL, strict=False):
            assert_same(mapped.read(entry), want)
        got: list[hw.BlockPagedTensor] = []
        with pytest.raises(TruncatedError):
            got.extend(mapped)
        assert len(got) == whole


def test_corrupted_middle_blob() -> None:
    data = bytearray(stream_bytes(SMALL))
    middle = blob_offsets(bytes(data))[1][0]
    data[pool_span(data, middle)[1] - 100] ^= 0x10  # inside blob 1's page data
    reader = StreamReader(io.BytesIO(bytes(data)))
    first = next(reader)
    with pytest.raises(ChecksumError) as info:
        next(reader)
    assert info.value.blob == 1 and str(info.value).startswith(
        "blob 1 (layer 0 value) at stream offset "
    )
    with pytest.raises(ChecksumError):  # the reader stays failed
        next(reader)
    assert_same(first, SMALL[0])
    # without verification the flipped bit goes through: the caller asked for that
    assert len(list(StreamReader(bytes(data), verify=False))) == 3
    # random access: only the damaged blob fails
    mapped = StreamFile(bytes(data))
    assert mapped.complete
    assert_same(mapped.tensor(0, "key"), SMALL[0])
    assert_same(mapped.tensor(1, "key"), SMALL[2])
    with pytest.raises(ChecksumError):
        mapped.tensor(0, "value")


def test_corrupted_blob_header_and_prefix() -> None:
    data = stream_bytes(SMALL)
    (_, _), (middle, _), _ = blob_offsets(data)
    cases = [
        (middle + 40, ChecksumError),
        (middle + 1, InvalidStreamError),
        (middle + 4, InvalidBlobError),
        (middle + 9, HurrayWireError),
    ]
    for offset, error in cases:
        bad = bytearray(data)
        bad[offset] ^= 0x01
        got, exc = read_all(StreamReader(io.BytesIO(bytes(bad))))
        assert len(got) == 1 and isinstance(exc, error), (offset, exc)
        assert_same(got[0], SMALL[0])


def test_random_mutations_raise_only_typed_errors() -> None:
    data = stream_bytes(SMALL)
    rng = random.Random(1234)
    for _ in range(400):
        bad = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            op = rng.random()
            at = rng.randrange(len(bad))
            if op < 0.6:
                bad[at] ^= 1 << rng.randrange(8)
            elif op < 0.8:
                del bad[at : at + rng.randint(1, 80)]
            else:
                bad[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 80)))
        for source in (io.BytesIO(bytes(bad)), bytes(bad)):
            got, _error = read_all(StreamReader(source, max_blob_bytes=1 << 20))
            assert len(got) <= 3
        try:
            mapped = StreamFile(bytes(bad), max_blob_bytes=1 << 20)
        except HurrayWireError:  # a damaged stream header: nothing to index
            continue
        for entry in mapped.entries:
            with contextlib.suppress(HurrayWireError):
                mapped.read(entry)


def test_end_record_must_agree_with_the_blobs() -> None:
    data = stream_bytes(SMALL)
    last_offset, last_length = blob_offsets(data)[-1]
    body = data[: last_offset + last_length]
    claims_more = body + encode_end_record(None, 4)
    got, error = read_all(StreamReader(io.BytesIO(claims_more)))
    assert len(got) == 3 and isinstance(error, InvalidStreamError)
    wrong_entry = body + encode_end_record(
        [StreamEntry(o, n, 7, "key") for o, n in blob_offsets(data)], 3
    )
    _, error = read_all(StreamReader(io.BytesIO(wrong_entry)))
    assert isinstance(error, InvalidStreamError) and "disagrees" in str(error)
    mapped = StreamFile(claims_more)  # no usable index -> walk, which reports the mismatch
    assert len(mapped) == 3 and isinstance(mapped.error, InvalidStreamError)


def test_header_in_the_middle_and_unknown_records() -> None:
    blob = bytes(hw.encode(TENSORS[0]))
    for middle in (encode_stream_header(HEADER), b"JUNK" + bytes(60)):
        got, error = read_all(StreamReader(io.BytesIO(blob + middle)))
        assert len(got) == 1 and isinstance(error, InvalidStreamError)
    _, error = read_all(StreamReader(io.BytesIO(b"JU")))
    assert isinstance(error, InvalidStreamError)
    _, error = read_all(StreamReader(io.BytesIO(b"HRW")))
    assert isinstance(error, StreamTruncatedError)


def test_lengths_are_capped_before_allocating() -> None:
    data = stream_bytes(SMALL)
    offset, length = blob_offsets(data)[0]
    with pytest.raises(LimitExceededError, match="max_blob_bytes"):
        list(StreamReader(io.BytesIO(data), max_blob_bytes=length - 64))
    huge = bytearray(data[offset : offset + 16])
    struct.pack_into("<Q", huge, 8, 1 << 62)
    for source in (io.BytesIO(bytes(huge)), bytes(huge)):
        with pytest.raises(LimitExceededError):
            list(StreamReader(source))
    fake_header = bytearray(encode_stream_header(StreamHeader()))
    struct.pack_into("<Q", fake_header, 8, 1 << 62)
    with pytest.raises(LimitExceededError):
        StreamReader(io.BytesIO(bytes(fake_header))).header  # noqa: B018
    with pytest.raises(ArgumentTypeError):
        StreamReader(io.BytesIO(data), max_blob_bytes=10)
    with pytest.raises(ArgumentTypeError):
        StreamReader(12345)


class _ResettingSocket:
    """recv_into hands out ``data`` in small pieces, then raises ConnectionResetError."""

    def __init__(self, data: bytes, cut: int) -> None:
        self.data = data[:cut]
        self.pos = 0

    def recv_into(self, view: memoryview, nbytes: int = 0, flags: int = 0) -> int:
        if self.pos >= len(self.data):
            raise ConnectionResetError(104, "Connection reset by peer")
        chunk = self.data[self.pos : self.pos + min(len(view), 1000)]
        view[: len(chunk)] = chunk
        self.pos += len(chunk)
        return len(chunk)


def test_connection_reset_mid_blob_and_at_a_boundary() -> None:
    data = stream_bytes(SMALL)
    blobs = blob_offsets(data)
    middle = blobs[1][0] + blobs[1][1] // 2
    got, error = read_all(StreamReader(_ResettingSocket(data, middle)))
    assert len(got) == 1
    assert isinstance(error, StreamBlobTruncatedError) and isinstance(error, BlobTruncatedError)
    assert isinstance(error.__cause__, ConnectionResetError)
    assert_same(got[0], SMALL[0])
    boundary = blobs[1][0]
    got, error = read_all(StreamReader(_ResettingSocket(data, boundary)))
    assert len(got) == 1 and type(error) is StreamTruncatedError
    assert isinstance(error.__cause__, ConnectionResetError)


def test_real_tcp_reset_mid_blob() -> None:
    data = stream_bytes(SMALL)
    blobs = blob_offsets(data)
    client, conn = _tcp_pair()
    client.sendall(data[: blobs[1][0] + blobs[1][1] // 2])
    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    client.close()  # RST, not FIN
    with conn:
        got, error = read_all(StreamReader(conn))
    assert len(got) <= 1 and isinstance(error, StreamTruncatedError)
    for tensor in got:
        assert_same(tensor, SMALL[0])


def test_socket_timeout_is_a_typed_cut() -> None:
    data = stream_bytes(SMALL)
    left, right = socket.socketpair()
    with left, right:
        left.sendall(data[:500])
        right.settimeout(0.2)
        got, error = read_all(StreamReader(right))
    assert got == [] and isinstance(error, StreamTruncatedError)
    assert isinstance(error.__cause__, TimeoutError)


# -- mapped files: zero-copy and lazy --------------------------------------------------------


def _mapping_of(array: np.ndarray[Any, Any]) -> Any:
    base: Any = array
    while isinstance(base, np.ndarray):
        base = base.base
    return base.obj if isinstance(base, memoryview) else base


def test_mapped_reader_is_zero_copy(tmp_path: Path) -> None:
    path = tmp_path / "s.hrws"
    path.write_bytes(stream_bytes())
    with StreamReader(path) as reader:
        got = list(reader)
        assert reader.complete
    for tensor, want in zip(got, TENSORS, strict=True):  # valid after close
        assert not tensor.page_pool.flags.writeable
        assert isinstance(_mapping_of(tensor.page_pool), mmap.mmap)
        assert_same(tensor, want)
    with StreamFile(path) as mapped:
        assert mapped.header == HEADER and mapped.complete and mapped.error is None
        whole = np.frombuffer(mapped.buffer, np.uint8)
        tensor = mapped.tensor(2, "value")
        assert np.shares_memory(tensor.page_pool, whole)
        assert np.shares_memory(tensor.block_table, whole)
        assert not tensor.page_pool.flags.writeable
        assert_same(tensor, TENSORS[5])
        assert set(mapped.keys()) == {(t.layer_index, t.kv_role) for t in TENSORS}
        with pytest.raises(KeyError):
            mapped.tensor(3, "key")
        assert [t.layer_index for t in mapped] == [0, 0, 1, 1, 2, 2]


def _layered_file(path: Path, layers: int, *, end: bool, pages: int = 64) -> list[StreamEntry]:
    header = StreamHeader(num_layers=layers, kv_roles=("key",), end_record=end)
    with StreamWriter(path, header) as writer:
        for layer in range(layers):
            writer.write(make_tensor(layer, pages=pages, heads=8, dim=64), pages="all")
    with StreamFile(path) as mapped:
        return list(mapped.entries)


@pytest.mark.parametrize("end", [True, False], ids=["index", "walk"])
def test_reading_layer_17_does_not_read_layers_0_to_16(tmp_path: Path, end: bool) -> None:
    path = tmp_path / "layers.hrws"
    entries = _layered_file(path, 18, end=end)
    data = bytearray(path.read_bytes())
    for entry in entries[:17]:  # ruin the page data of every earlier layer
        page_pool_end = pool_span(data, entry.offset)[1]
        data[page_pool_end - 4096 : page_pool_end] = b"\xa5" * 4096
    path.write_bytes(bytes(data))
    with StreamFile(path) as mapped:
        assert mapped.complete == end
        assert_same(mapped.tensor(17), make_tensor(17, pages=64, heads=8, dim=64))
        with pytest.raises(ChecksumError):
            mapped.tensor(3)


def _mapped_rss(path: Path) -> int:
    """Bytes of ``path`` mapped into this process (Rss in /proc/self/smaps)."""
    total = 0
    inside = False
    with open("/proc/self/smaps", encoding="utf-8") as smaps:
        for line in smaps:
            fields = line.split()
            if "-" in fields[0] and len(fields) >= 5:
                inside = fields[-1] == str(path)
            elif inside and fields[0] == "Rss:":
                total += int(fields[1]) * 1024
    return total


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="needs Linux /proc")
@pytest.mark.parametrize("end", [True, False], ids=["index", "walk"])
def test_mapped_pages_touched_are_only_the_layer_read(tmp_path: Path, end: bool) -> None:
    path = tmp_path / "rss.hrws"
    entries = _layered_file(path, 18, end=end, pages=256)  # 2 MiB per layer
    layer_bytes = entries[0].length
    with StreamFile(path) as mapped:
        opened = _mapped_rss(path)
        tensor = mapped.tensor(17)
        assert int(tensor.page_pool.view(np.uint16)[:, 0].sum()) >= 0
        after = _mapped_rss(path)
        del tensor
    # headers (and the kernel's 64 KiB fault-around) only, then one layer
    assert opened < 18 * 128 * 1024 + 4 * 65536
    assert after - opened <= layer_bytes + 2 * 65536
    assert after < 0.25 * 18 * layer_bytes


def test_mapped_file_with_damaged_end_record_falls_back_to_the_walk(tmp_path: Path) -> None:
    data = bytearray(stream_bytes())
    data[-40] ^= 0xFF  # inside the end record's zero padding / entries
    mapped = StreamFile(bytes(data))
    assert len(mapped) == len(TENSORS)
    assert not mapped.complete and isinstance(mapped.error, InvalidStreamError)
    assert_same(mapped.tensor(1, "value"), TENSORS[3])


def test_mapped_file_index_entries_are_checked_against_descriptors() -> None:
    data = stream_bytes(SMALL)
    last_offset, last_length = blob_offsets(data)[-1]
    rows = [StreamEntry(o, n, 0, "key") for o, n in blob_offsets(data)]
    lying = data[: last_offset + last_length] + encode_end_record(rows, 3)
    mapped = StreamFile(lying)
    assert mapped.complete  # the index is well formed ...
    with pytest.raises(InvalidStreamError, match="disagrees"):
        mapped.read(mapped.entries[1])  # ... but blob 1 says it is the value of layer 0


def test_empty_and_header_only_files(tmp_path: Path) -> None:
    path = tmp_path / "empty.hrws"
    path.write_bytes(b"")
    with pytest.raises(StreamTruncatedError, match="empty input"):
        list(StreamReader(path))
    with pytest.raises(StreamTruncatedError, match="empty input"):  # at open (issue 23)
        StreamFile(path)
    path.write_bytes(encode_stream_header(HEADER))
    with StreamFile(path) as mapped:
        assert isinstance(mapped.error, StreamTruncatedError)


def test_stream_file_iteration_is_lazy() -> None:
    mapped = StreamFile(stream_bytes())
    iterator: Iterator[hw.BlockPagedTensor] = iter(mapped)
    assert_same(next(iterator), TENSORS[0])


def test_every_flipped_bit_is_caught_through_the_reader() -> None:
    data = stream_bytes(SMALL[:1])
    ((start, length),) = blob_offsets(data)
    for offset in range(len(data)):
        bad = bytearray(data)
        bad[offset] ^= 0x04
        got, error = read_all(StreamReader(io.BytesIO(bytes(bad))))
        assert error is not None, offset
        assert len(got) == (offset >= start + length), offset  # a damaged end record: after


# -- docs/streaming.md -----------------------------------------------------------------------

GUIDE = Path(__file__).resolve().parent.parent / "docs" / "streaming.md"


def _guide_examples() -> list[str]:
    text = GUIDE.read_text(encoding="utf-8")
    return [block.split("```", 1)[0] for block in text.split("```python\n")[1:]]


@pytest.mark.parametrize("number", range(len(_guide_examples())))
def test_guide_examples_run(
    number: int, capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the guide's mkdtemp: gone with it
    exec(compile(_guide_examples()[number], f"{GUIDE.name}[{number}]", "exec"), {})
    if number == 0:
        assert capsys.readouterr().out.split("\n")[:2] == ["my-llm 2", "0 key 0.0"]


def test_a_request_over_an_engine_pool_sends_only_its_pages() -> None:
    """3 pages of a 4096-page pool: the stream carries 3 pages (bytes counted), renumbered
    in first-reference order; ``pages="all"`` carries the pool; every page referenced: no
    copy and no renumbering."""
    pool = np.random.default_rng(3).random((4096, 16, 2, 8)).astype(np.float16)
    page = pool[0].nbytes
    request = hw.BlockPagedTensor.from_arrays(pool, [4000, 17, 18], [0, 3], seq_lens=[40],
                                              kv_role="key", layer_index=0)  # fmt: skip
    sent, whole = io.BytesIO(), io.BytesIO()
    with hw.StreamWriter(sent) as writer:
        length = writer.write(request)
    with hw.StreamWriter(whole) as writer:
        assert writer.write(request, pages="all") > 4096 * page
    assert 3 * page < length < 3 * page + 4096
    (got,) = hw.StreamReader(sent.getvalue())
    np.testing.assert_array_equal(got.page_pool, pool[[4000, 17, 18]])
    np.testing.assert_array_equal(got.block_table, [0, 1, 2])
    np.testing.assert_array_equal(got.sequence(0), request.sequence(0))
    (full,) = hw.StreamReader(whole.getvalue())
    np.testing.assert_array_equal(full.page_pool, pool)
    everything = hw.BlockPagedTensor.from_arrays(pool[:4], [3, 1, 0, 2], [0, 4])
    with hw.StreamWriter(io.BytesIO()) as writer, pytest.raises(hw.errors.ArgumentTypeError):
        writer.write(everything, pages=True)  # type: ignore[arg-type]
    out = io.BytesIO()
    with hw.StreamWriter(out) as writer:
        writer.write(everything)
    (same,) = hw.StreamReader(out.getvalue())
    np.testing.assert_array_equal(same.block_table, [3, 1, 0, 2])


def _held(path: Path) -> int:
    """Descriptors of this process open on ``path`` (a mapping holds one of its own)."""
    fds = Path("/proc/self/fd")
    return sum(1 for fd in fds.iterdir() if os.path.realpath(fd) == str(path.resolve()))


@pytest.mark.parametrize("mmap", [True, False], ids=["mapped", "read"])
@pytest.mark.parametrize("ending", ["end record", "cut"])
def test_a_reader_lets_go_of_the_path_it_opened_when_its_stream_ends(
    tmp_path: Path, mmap: bool, ending: str
) -> None:
    """Iterated to its end or to its error without ``with``, a reader holds no descriptor
    of a path it opened itself (a mapping lives on while tensors view it); what it
    read stays readable, the error is raised again."""
    path = tmp_path / "s.hrws"
    data = stream_bytes(SMALL[:2])
    path.write_bytes(data if ending == "end record" else data[:-5])
    reader = StreamReader(path, mmap=mmap)
    assert _held(path) == (2 if mmap else 1)
    got, error = read_all(reader)
    assert len(got) == 2 and (error is None) == (ending == "end record")
    assert _held(path) == (1 if mmap else 0)  # the mapping's, while the tensors view it
    assert len(reader.entries) == 2 and reader.header is not None
    if error is not None:
        with pytest.raises(type(error)):
            next(reader)
    assert_same(got[1], SMALL[1])
    del got, reader, error
    gc.collect()
    assert _held(path) == 0
