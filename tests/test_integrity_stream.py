"""Issue 14 on streams: the fingerprint in the stream header, delta blobs read with the
receiver's page store, the known-pages record sent first over the same connection."""

from __future__ import annotations

import io
import socket
import threading
from pathlib import Path

import numpy as np
import pytest

import hurray_wire as hw
from hurray_wire import errors as hwe
from hurray_wire.containers import StreamFile, StreamHeader, StreamReader, StreamWriter
from hurray_wire.containers.records import decode_stream_header, encode_stream_header
from hurray_wire.integrity import (
    EngineFingerprint,
    MemoryPageStore,
    decode_known_pages,
    encode_known_pages,
    fingerprint_to_metadata,
    page_digests,
    store_pages,
)

FP = EngineFingerprint("llama-3-8b", "vllm", "0.9.1", "NHD", "float16", 16, 0, 2)
OTHER = EngineFingerprint("llama-3-8b", "vllm", "0.9.2", "NHD", "bfloat16", 16, 0, 2)


def layer(index: int, seed: int = 0) -> hw.BlockPagedTensor:
    rng = np.random.default_rng(seed + index)
    pool = rng.standard_normal((8, 4, 2, 8)).astype(np.float16)
    return hw.BlockPagedTensor.from_arrays(
        pool, [0, 1, 2, 0, 3, 4], [0, 3, 6], layer_index=index, kv_role="key"
    )


def stream_bytes(header: StreamHeader | None, tensors: list[hw.BlockPagedTensor]) -> bytes:
    sink = io.BytesIO()
    with StreamWriter(sink, header) as writer:
        for t in tensors:
            writer.write(t, pages="all")
    return sink.getvalue()


def test_header_fingerprint_round_trip() -> None:
    header = StreamHeader(model="m", fingerprint=FP, metadata={"a": 1})
    back = decode_stream_header(encode_stream_header(header))
    assert back == header and back.fingerprint == FP and dict(back.metadata) == {"a": 1}
    via_metadata = StreamHeader(metadata={**fingerprint_to_metadata(FP), "a": 1})
    assert via_metadata.fingerprint == FP and dict(via_metadata.metadata) == {"a": 1}
    with pytest.raises(hwe.InvalidStreamError, match="disagrees"):
        StreamHeader(fingerprint=OTHER, metadata=fingerprint_to_metadata(FP))
    with pytest.raises(hwe.ArgumentTypeError):
        StreamHeader(fingerprint="fp")  # type: ignore[arg-type]
    with pytest.raises(hwe.InvalidMetadataError):
        StreamHeader(metadata={"hurray.engine_fingerprint": b"nope"})


def test_reader_refuses_a_mismatching_or_missing_fingerprint() -> None:
    data = stream_bytes(StreamHeader(fingerprint=FP), [layer(0), layer(1)])
    assert len(list(StreamReader(data, expect_fingerprint=FP))) == 2
    with pytest.raises(hwe.IncompatibleFingerprintError) as info:
        next(iter(StreamReader(data, expect_fingerprint=OTHER)))
    assert set(info.value.differences) == {"engine_version", "cache_dtype"}
    for header in (StreamHeader(), None):
        with pytest.raises(hwe.IncompatibleFingerprintError, match="no engine fingerprint"):
            next(iter(StreamReader(stream_bytes(header, [layer(0)]), expect_fingerprint=FP)))
    assert len(list(StreamReader(stream_bytes(None, [layer(0)])))) == 1  # not asked: fine


def test_reader_refuses_a_blob_with_a_different_fingerprint() -> None:
    t = layer(0)
    odd = hw.BlockPagedTensor.from_arrays(
        t.page_pool, t.block_table, t.seq_ptr, metadata=fingerprint_to_metadata(OTHER)
    )
    data = stream_bytes(StreamHeader(fingerprint=FP), [t, odd])
    reader = StreamReader(data, expect_fingerprint=FP)
    next(reader)
    with pytest.raises(hwe.IncompatibleFingerprintError):
        next(reader)


def test_delta_stream_over_a_socket() -> None:
    """The receiver sends its known-pages record first; the sender skips those pages."""
    earlier = [layer(i) for i in range(4)]
    now = []
    for t in earlier:  # the new request shares pages 0..3 of each layer, 4..7 are new
        pool = t.page_pool.copy()
        pool[4:] += 1
        now.append(hw.BlockPagedTensor.from_arrays(pool, t.block_table, t.seq_ptr,
                                                   layer_index=t.layer_index))  # fmt: skip
    store = MemoryPageStore(1 << 24)
    for t in earlier:
        store_pages(store, t, range(8))
    a, b = socket.socketpair()
    sent: list[int] = []

    def sender() -> None:
        with a:
            record = bytearray()
            head = a.recv(16, socket.MSG_WAITALL)
            count = int.from_bytes(head[8:12], "little")
            record += head + a.recv(8 * count + 8, socket.MSG_WAITALL)
            known = decode_known_pages(bytes(record), max_entries=1 << 16)
            with StreamWriter(a, StreamHeader(fingerprint=FP, num_layers=4)) as writer:
                for t in now:
                    sent.append(writer.write(t, known_pages=known, page_digests=True, pages="all"))

    thread = threading.Thread(target=sender)
    thread.start()
    with b:
        b.sendall(encode_known_pages(store.digests()))
        got = list(StreamReader(b, page_store=store, expect_fingerprint=FP))
    thread.join()
    assert len(got) == 4
    for x, y in zip(got, now, strict=True):
        assert np.array_equal(x.page_pool, y.page_pool)
    full = len(hw.encode(now[0]))
    assert all(s < full for s in sent)


def test_delta_stream_without_a_store_is_refused() -> None:
    t = layer(0)
    sink = io.BytesIO()
    with StreamWriter(sink) as writer:
        writer.write(t, known_pages=np.sort(page_digests(t)[[0, 1]]), pages="all")
    with pytest.raises(hwe.PageStoreMissError, match="page_store"):
        list(StreamReader(sink.getvalue()))
    store = MemoryPageStore(1 << 20)
    store_pages(store, t)
    (back,) = StreamReader(sink.getvalue(), page_store=store)
    assert np.array_equal(back.page_pool, t.page_pool)


def test_reader_argument_types() -> None:
    with pytest.raises(hwe.ArgumentTypeError, match="page_store"):
        StreamReader(b"", page_store=object())  # type: ignore[arg-type]
    with pytest.raises(hwe.ArgumentTypeError, match="expect_fingerprint"):
        StreamReader(b"", expect_fingerprint=object())  # type: ignore[arg-type]


def _file(tmp_path: Path, data: bytes) -> Path:
    path = tmp_path / "cache.hrws"
    path.write_bytes(data)
    return path


def test_stream_file_refuses_a_mismatching_or_missing_fingerprint(tmp_path: Path) -> None:
    good = _file(tmp_path, stream_bytes(StreamHeader(fingerprint=FP), [layer(0), layer(1)]))
    with StreamFile(good, expect_fingerprint=FP) as f:
        assert len(list(f)) == 2
    with pytest.raises(hwe.IncompatibleFingerprintError) as info:
        StreamFile(good, expect_fingerprint=OTHER)
    assert set(info.value.differences) == {"engine_version", "cache_dtype"}
    bare = _file(tmp_path, stream_bytes(StreamHeader(), [layer(0)]))
    with pytest.raises(hwe.IncompatibleFingerprintError, match="no engine fingerprint"):
        StreamFile(bare, expect_fingerprint=FP)
    t = layer(0)
    odd = hw.BlockPagedTensor.from_arrays(
        t.page_pool, t.block_table, t.seq_ptr, metadata=fingerprint_to_metadata(OTHER),
        layer_index=1,
    )  # fmt: skip
    mixed = _file(tmp_path, stream_bytes(StreamHeader(fingerprint=FP), [t, odd]))
    with StreamFile(mixed, expect_fingerprint=FP) as f:
        assert f.tensor(0).layer_index == 0
        with pytest.raises(hwe.IncompatibleFingerprintError):
            f.tensor(1)


def test_stream_file_fills_delta_blobs_from_the_store(tmp_path: Path) -> None:
    t = layer(0)
    sink = io.BytesIO()
    with StreamWriter(sink) as writer:
        writer.write(t, known_pages=np.sort(page_digests(t)[[0, 1]]), pages="all")
    path = _file(tmp_path, sink.getvalue())
    with StreamFile(path) as f, pytest.raises(hwe.PageStoreMissError, match="page_store"):
        list(f)
    store = MemoryPageStore(1 << 20)
    store_pages(store, t)
    with StreamFile(path, page_store=store) as f:
        (back,) = list(f)
        assert np.array_equal(back.page_pool, t.page_pool)
    with pytest.raises(hwe.ArgumentTypeError, match="page_store"):
        StreamFile(path, page_store=object())  # type: ignore[arg-type]
