"""The containers' one I/O layer (``hurray_wire.containers.io``) and format sniffing.

Both stream kinds write through the same sink and read through the same source, so every
edge case is checked for both: sinks that make no progress, short writes, text-mode files,
closed and released inputs, non-contiguous buffers, wrong types, and connections that break
or time out while reading. Also ``identify`` and the wire helpers the containers derive
their byte positions from.
"""

from __future__ import annotations

import io
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import hurray_wire as hw
from hurray_wire import containers as hc
from hurray_wire.errors import (
    ArgumentTypeError,
    ClosedContainerError,
    ContainerTruncatedError,
    HurrayWireError,
    StreamTruncatedError,
)
from hurray_wire.wire import containers as wc, descriptor as wd, stream as ws
from hurray_wire.wire.fast import derive, offset_of
from tests.conftest import BLOCK_PAGED

LAYER0 = BLOCK_PAGED / "files" / "layer0_kv.hrry"
MULTI = BLOCK_PAGED / "streams" / "multi_record.hrrs"


def _tensor(layer: int = 0, role: str = "key") -> hw.BlockPagedTensor:
    rng = np.random.default_rng(layer)
    pool = rng.integers(0, 1 << 16, size=(3, 4, 2, 8), dtype=np.uint16).view(np.float16)
    return hw.BlockPagedTensor.from_arrays(
        pool, [0, 1, 2], [0, 2, 3], kv_role=role, layer_index=layer
    )


TENSORS = [_tensor(0, "key"), _tensor(0, "value"), _tensor(1, "key")]


def _blob_stream_bytes() -> bytes:
    sink = io.BytesIO()
    with hc.StreamWriter(sink) as writer:
        for tensor in TENSORS:
            writer.write(tensor)
    return sink.getvalue()


def _reference_stream_bytes() -> bytes:
    sink = io.BytesIO()
    hc.write_stream(sink, TENSORS)
    return sink.getvalue()


def _write_blob_stream(sink: Any) -> None:
    with hc.StreamWriter(sink) as writer:
        for tensor in TENSORS:
            writer.write(tensor)


def _write_reference_stream(sink: Any) -> None:
    hc.write_stream(sink, TENSORS)


WRITERS = {"blob-stream": _write_blob_stream, "reference-stream": _write_reference_stream}
EXPECTED = {"blob-stream": _blob_stream_bytes, "reference-stream": _reference_stream_bytes}


def _finishes(fn: Callable[[], None], seconds: float = 10.0) -> BaseException | None:
    """Run ``fn`` in a thread; fail the test if it hangs, else return what it raised."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            fn()
        except BaseException as exc:
            outcome.append(exc)
        else:
            outcome.append(None)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "the writer spins on a sink that makes no progress"
    return outcome[0]


# -- sinks -----------------------------------------------------------------------------------
class _ZeroSink:
    """A sink whose write() accepts nothing and says so (0 bytes): it must not spin."""

    def __init__(self) -> None:
        self.calls = 0

    def write(self, piece: Any) -> int:
        self.calls += 1
        return 0


class _ZeroSocket:
    def sendmsg(self, buffers: list[memoryview]) -> int:
        return 0


class _Dribble:
    """A sink that takes one to three bytes per call."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.calls = 0

    def write(self, piece: Any) -> int:
        self.calls += 1
        chunk = bytes(memoryview(piece)[: 1 + self.calls % 3])
        self.data += chunk
        return len(chunk)


class _DribbleSocket:
    def __init__(self) -> None:
        self.data = bytearray()

    def sendmsg(self, buffers: list[memoryview]) -> int:
        chunk = b"".join(bytes(b) for b in buffers)[:5]
        self.data += chunk
        return len(chunk)


@pytest.mark.parametrize("kind", WRITERS)
@pytest.mark.parametrize("sink", [_ZeroSink, _ZeroSocket], ids=["write", "sendmsg"])
def test_a_sink_that_makes_no_progress_raises_in_both_writers(kind: str, sink: type) -> None:
    error = _finishes(lambda: WRITERS[kind](sink()))
    assert isinstance(error, ArgumentTypeError) and "no progress" in str(error)


@pytest.mark.parametrize("kind", WRITERS)
@pytest.mark.parametrize("sink", [_Dribble, _DribbleSocket], ids=["write", "sendmsg"])
def test_partial_writes_produce_identical_bytes(kind: str, sink: type) -> None:
    out = sink()
    WRITERS[kind](out)
    assert bytes(out.data) == EXPECTED[kind]()


@pytest.mark.parametrize("kind", WRITERS)
def test_a_text_mode_file_sink_is_refused_before_writing(kind: str, tmp_path: Path) -> None:
    path = tmp_path / "out.txt"
    with open(path, "w") as text, pytest.raises(ArgumentTypeError, match="binary"):
        WRITERS[kind](text)
    assert path.read_bytes() == b""


@pytest.mark.parametrize("kind", WRITERS)
def test_a_closed_sink_is_a_closed_container_error(kind: str) -> None:
    sink = io.BytesIO()
    sink.close()
    with pytest.raises(ClosedContainerError):
        WRITERS[kind](sink)


@pytest.mark.parametrize("kind", WRITERS)
def test_a_sink_of_the_wrong_type_is_an_argument_type_error(kind: str) -> None:
    with pytest.raises(ArgumentTypeError):
        WRITERS[kind](object())


def test_a_sink_error_propagates_and_breaks_the_stream() -> None:
    class Broken:
        def write(self, piece: Any) -> int:
            raise BrokenPipeError("peer went away")

    with pytest.raises(BrokenPipeError):
        hc.write_stream(Broken(), TENSORS)
    with pytest.raises(BrokenPipeError):
        hc.StreamWriter(Broken())


# -- sources ---------------------------------------------------------------------------------
def _read_blob_stream(source: Any) -> list[hw.BlockPagedTensor]:
    return list(hc.StreamReader(source))


def _read_reference_stream(source: Any) -> list[hw.BlockPagedTensor]:
    return list(hc.read_stream(source))


READERS = {"blob-stream": _read_blob_stream, "reference-stream": _read_reference_stream}
TRUNCATED = {"blob-stream": StreamTruncatedError, "reference-stream": ContainerTruncatedError}


class _Resetting:
    """recv_into hands out the first ``cut`` bytes, then the peer resets the connection."""

    def __init__(self, data: bytes, cut: int, error: OSError) -> None:
        self.data = data[:cut]
        self.pos = 0
        self.error = error

    def recv_into(self, view: memoryview, nbytes: int = 0, flags: int = 0) -> int:
        if self.pos >= len(self.data):
            raise self.error
        chunk = self.data[self.pos : self.pos + min(len(view), 100)]
        view[: len(chunk)] = chunk
        self.pos += len(chunk)
        return len(chunk)


@pytest.mark.parametrize("kind", READERS)
@pytest.mark.parametrize(
    "error",
    [ConnectionResetError(104, "Connection reset by peer"), TimeoutError("timed out")],
    ids=["reset", "timeout"],
)
@pytest.mark.parametrize("where", ["inside", "boundary"])
def test_a_broken_connection_is_a_truncation_with_the_oserror_as_cause(
    kind: str, error: OSError, where: str
) -> None:
    data = EXPECTED[kind]()
    cut = len(data) // 2 if where == "inside" else 0
    with pytest.raises(TRUNCATED[kind]) as info:
        READERS[kind](_Resetting(data, cut, error))
    assert info.value.__cause__ is error


@pytest.mark.parametrize("kind", READERS)
def test_a_real_socket_timeout_is_a_truncation(kind: str) -> None:
    data = EXPECTED[kind]()
    left, right = socket.socketpair()
    with left, right:
        left.sendall(data[: len(data) // 2])
        right.settimeout(0.05)
        with pytest.raises(TRUNCATED[kind]) as info:
            READERS[kind](right)
    assert isinstance(info.value.__cause__, TimeoutError)


@pytest.mark.parametrize("kind", READERS)
def test_a_closed_source_is_a_closed_container_error(kind: str) -> None:
    source = io.BytesIO(EXPECTED[kind]())
    source.close()
    with pytest.raises(ClosedContainerError):
        READERS[kind](source)


@pytest.mark.parametrize("kind", READERS)
def test_a_text_mode_source_is_refused(kind: str, tmp_path: Path) -> None:
    path = tmp_path / "in.txt"
    path.write_text("HRWS")
    with open(path) as text, pytest.raises(ArgumentTypeError, match="binary"):
        READERS[kind](text)


@pytest.mark.parametrize("kind", READERS)
def test_a_non_blocking_source_with_nothing_ready_is_refused(kind: str) -> None:
    class NotReady:
        def readinto(self, view: memoryview) -> None:
            return None

    with pytest.raises(ArgumentTypeError, match="non-blocking"):
        READERS[kind](NotReady())


@pytest.mark.parametrize("kind", READERS)
def test_a_read_only_source_returning_text_is_refused(kind: str) -> None:
    class Text:
        def read(self, n: int) -> str:
            return "HRWB"

    with pytest.raises(ArgumentTypeError):
        READERS[kind](Text())


# -- every container reader: bad buffers and wrong types -------------------------------------
def _hrry_from_buffer(data: Any) -> object:
    return hc.HrryFile.from_buffer(data)


def _stream_file(data: Any) -> object:
    return hc.StreamFile(data)


def _decode_stream_header(data: Any) -> object:
    return hc.decode_stream_header(data)


def _decode_end_record(data: Any) -> object:
    return hc.decode_end_record(data)


BUFFER_READERS: dict[str, tuple[Callable[[Any], object], Callable[[], bytes]]] = {
    "StreamReader": (_read_blob_stream, _blob_stream_bytes),
    "StreamFile": (_stream_file, _blob_stream_bytes),
    "decode_stream_header": (_decode_stream_header, _blob_stream_bytes),
    "decode_end_record": (_decode_end_record, lambda: hc.encode_end_record([], 0)),
    "read_stream": (_read_reference_stream, _reference_stream_bytes),
    "HrryFile.from_buffer": (_hrry_from_buffer, LAYER0.read_bytes),
    "identify": (hc.identify, _blob_stream_bytes),
}


@pytest.mark.parametrize("reader", BUFFER_READERS)
def test_non_contiguous_views_are_typed_errors(reader: str) -> None:
    read, make = BUFFER_READERS[reader]
    data = make()
    read(data)  # the contiguous input is fine
    doubled = bytes(b for byte in data for b in (byte, 0))
    with pytest.raises(ArgumentTypeError, match="contiguous"):
        read(memoryview(doubled)[::2])
    with pytest.raises(ArgumentTypeError, match="contiguous"):
        read(np.frombuffer(doubled, np.uint8)[::2])


@pytest.mark.parametrize("reader", BUFFER_READERS)
def test_released_views_and_wrong_types_are_typed_errors(reader: str) -> None:
    read, make = BUFFER_READERS[reader]
    view = memoryview(make())
    view.release()
    with pytest.raises(ArgumentTypeError):
        read(view)
    for wrong in (12345, 1.5, None, ["HRWS"]):
        with pytest.raises(ArgumentTypeError):
            read(wrong)


def test_hrry_file_wants_a_path() -> None:
    with pytest.raises(ArgumentTypeError, match="from_buffer"):
        hc.HrryFile(LAYER0.read_bytes())  # type: ignore[arg-type]


# -- readers used after close ----------------------------------------------------------------
def test_stream_file_after_close_is_a_closed_container_error(tmp_path: Path) -> None:
    path = tmp_path / "s.hrws"
    path.write_bytes(_blob_stream_bytes())
    for source in (path, _blob_stream_bytes()):
        stream = hc.StreamFile(source)
        entry = stream.entries[0]
        kept = stream.read(entry)
        stream.close()
        stream.close()  # idempotent
        assert stream.closed
        with pytest.raises(ClosedContainerError):
            stream.read(entry)
        with pytest.raises(ClosedContainerError):
            stream.tensor(0, "key")
        with pytest.raises(ClosedContainerError):
            list(stream)
        with pytest.raises(ClosedContainerError):
            _ = stream.buffer
        assert kept.page_pool.shape == TENSORS[0].page_pool.shape  # tensors stay valid


def test_hrry_file_after_close_is_a_closed_container_error() -> None:
    for hrry in (hc.HrryFile(LAYER0), hc.HrryFile.from_buffer(LAYER0.read_bytes())):
        name = hrry.names[0]
        hrry.close()
        for use in (hrry.tensor, hrry.descriptor, hrry.entry, hrry.buffer_spans):
            with pytest.raises(ClosedContainerError):
                use(name)
        with pytest.raises(ClosedContainerError):
            hrry.descriptor_header(name)


# -- sniffing --------------------------------------------------------------------------------
def test_identify_every_format(tmp_path: Path) -> None:
    blob = bytes(hw.encode(TENSORS[0]))
    descriptor = hw.encode_descriptor(TENSORS[0].descriptor)
    cases = {
        hc.Format.BLOB: blob,
        hc.Format.BLOB_STREAM: _blob_stream_bytes(),
        hc.Format.DESCRIPTOR: descriptor,
        hc.Format.REFERENCE_STREAM: MULTI.read_bytes(),
        hc.Format.HRRY_FILE: LAYER0.read_bytes(),
        hc.Format.UNKNOWN: b"GIF89a",
    }
    for number, (want, data) in enumerate(cases.items()):
        assert hc.identify(data) is want
        assert hc.identify(memoryview(data)) is want
        path = tmp_path / f"input{number}"
        path.write_bytes(data)
        assert hc.identify(path) is want
        assert hc.identify(str(path)) == want.value
    assert hc.identify(blob + blob) is hc.Format.BLOB_STREAM  # bare concatenated blobs
    assert hc.identify(descriptor + descriptor) is hc.Format.REFERENCE_STREAM
    assert hc.identify(b"") is hc.Format.UNKNOWN
    assert str(hc.Format.HRRY_FILE) == "hrry-file"


def test_identify_raises_only_our_errors_on_a_broken_blob_prefix() -> None:
    with pytest.raises(HurrayWireError):
        hc.identify(b"HRWB" + bytes(4))


# -- the wire helpers the containers derive their positions from -----------------------------
def test_offset_of_matches_the_spec_tables() -> None:
    assert offset_of(wd.FIXED_HEADER, "descriptor_length") == 6  # containers.md A.2 step 2
    assert offset_of(wd.FIXED_HEADER, "flags") == 10
    assert offset_of(wc.HrryHeader, "data_buffer_alignment") == 16  # § B.2
    assert offset_of(wc.HrryHeader, "_reserved1") == 36
    assert offset_of(wc.HrryTrailer, "index_crc32c") == 28  # § B.6
    assert offset_of(wc.HrryTrailer, "magic") == 36
    assert offset_of(wc.HrryIndexEntryFixed, "flags") == 28  # § B.5
    assert offset_of(ws.STREAM_HEADER, "element_type") == 21
    assert offset_of(ws.END_FOOTER, "total_length") == 8
    assert (wc.HEADER_SIZE, wc.TRAILER_SIZE, wc.INDEX_ENTRY_FIXED_SIZE) == (64, 40, 32)
    with pytest.raises(KeyError):
        offset_of(wc.HrryTrailer, "nope")


def test_fast_struct_pack_fills_const_fields() -> None:
    trailer = derive(wc.HrryTrailer).pack(
        index_offset=1, index_length=2, kv_offset=3, kv_length=4, index_crc32c=5
    )
    assert trailer == wc.HrryTrailer.build(
        {"index_offset": 1, "index_length": 2, "kv_offset": 3, "kv_length": 4, "index_crc32c": 5}
    )
    assert trailer.endswith(wc.TRAILER_MAGIC)


def test_stream_reader_after_close_is_a_closed_container_error() -> None:
    for source in (_blob_stream_bytes(), io.BytesIO(_blob_stream_bytes())):
        reader = hc.StreamReader(source)
        first = next(reader)
        reader.close()
        reader.close()  # idempotent
        with pytest.raises(ClosedContainerError):
            next(reader)
        assert first.page_pool.shape == TENSORS[0].page_pool.shape  # tensors stay valid
    unstarted = hc.StreamReader(_blob_stream_bytes())
    unstarted.close()
    with pytest.raises(ClosedContainerError):
        _ = unstarted.header
