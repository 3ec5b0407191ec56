"""Every public entry point that takes bytes refuses bad buffers with a HurrayWireError.

Non-contiguous views, wrong types (str, int, None, lists), released memoryviews and closed
mmaps: each is either refused with a ``HurrayWireError`` subclass (``ArgumentTypeError``
for the buffer itself) or, for the readers documented to copy a strided buffer (checksums,
metadata), decoded like its contiguous copy. Never ``BufferError``, ``TypeError`` or
``ValueError`` from the buffer protocol. (The containers' readers have the same checks in
``test_container_io.py``.)
"""

from __future__ import annotations

import mmap
import tempfile
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import hurray_wire as hw
from hurray_wire import codecs, integrity
from hurray_wire.blob import peek_descriptor
from hurray_wire.crc32c import crc32c
from hurray_wire.metadata import decode_metadata, encode_metadata
from hurray_wire.model.descriptor_codec import peek_descriptor_length
from hurray_wire.transport.records import TransferRecord, decode_record, encode_record

POOL = np.arange(5 * 4 * 2 * 8, dtype=np.float16).reshape(5, 4, 2, 8)
TENSOR = hw.BlockPagedTensor.from_arrays(POOL, [0, 1, 0], [0, 2, 3], seq_lens=[6, 3])
BLOB = bytes(hw.encode(TENSOR))
DESCRIPTOR = hw.encode_descriptor(TENSOR.descriptor)
METADATA = encode_metadata({"model": "m"})
KNOWN = integrity.encode_known_pages(np.array([1, 5, 9], np.uint64))
RECORD = encode_record(TransferRecord("done", session=1, layer=0, role="key"))

# (name, function of one bytes-like argument, a valid input, copies strided input)
READERS: list[tuple[str, Callable[[Any], Any], bytes, bool]] = [
    ("decode", hw.decode, BLOB, False),
    ("blob_length", hw.blob_length, BLOB, False),
    ("peek_descriptor", peek_descriptor, BLOB, False),
    ("decode_descriptor", hw.decode_descriptor, DESCRIPTOR, False),
    ("decode_header", hw.decode_header, DESCRIPTOR, False),
    ("peek_descriptor_length", peek_descriptor_length, DESCRIPTOR, False),
    ("decode_metadata", decode_metadata, METADATA, True),
    ("crc32c", crc32c, BLOB, True),
    ("codecs.checksum", codecs.checksum, BLOB, False),
    ("decode_known_pages", lambda d: integrity.decode_known_pages(d, max_entries=16), KNOWN,
     False),
    ("decode_record", decode_record, RECORD, False),
]  # fmt: skip
IDS = [name for name, *_ in READERS]


def _strided(data: bytes) -> memoryview:
    doubled = bytearray(len(data) * 2)
    doubled[::2] = data
    return memoryview(doubled)[::2]


@pytest.mark.parametrize(("name", "read", "valid", "copies"), READERS, ids=IDS)
@pytest.mark.parametrize("bad", ["text", 12, None, [1, 2, 3], 3.5, object()], ids=repr)
def test_wrong_types_are_refused(
    name: str, read: Callable[[Any], Any], valid: bytes, copies: bool, bad: object
) -> None:
    with pytest.raises(hw.HurrayWireError):
        read(bad)


@pytest.mark.parametrize(("name", "read", "valid", "copies"), READERS, ids=IDS)
def test_strided_buffers(name: str, read: Callable[[Any], Any], valid: bytes, copies: bool) -> None:
    doubled = np.repeat(np.frombuffer(valid, np.uint8), 2)
    for strided in (_strided(valid), doubled[::2]):
        if copies:
            assert _same(read(strided), read(valid))
        else:
            with pytest.raises(hw.errors.ArgumentTypeError, match="C-contiguous"):
                read(strided)


@pytest.mark.parametrize(("name", "read", "valid", "copies"), READERS, ids=IDS)
def test_released_memoryviews_are_refused(
    name: str, read: Callable[[Any], Any], valid: bytes, copies: bool
) -> None:
    view = memoryview(bytearray(valid))
    view.release()
    with pytest.raises(hw.errors.ArgumentTypeError):
        read(view)


@pytest.mark.parametrize(("name", "read", "valid", "copies"), READERS, ids=IDS)
def test_closed_mmaps_are_refused(
    name: str, read: Callable[[Any], Any], valid: bytes, copies: bool
) -> None:
    with tempfile.TemporaryFile() as f:
        f.write(valid or b"\0")
        f.flush()
        mapped = mmap.mmap(f.fileno(), 0)
        mapped.close()
        with pytest.raises(hw.errors.ArgumentTypeError):
            read(mapped)


def test_encode_into_refuses_read_only_strided_and_wrong_buffers() -> None:
    for bad in (bytes(len(BLOB)), memoryview(bytearray(2 * len(BLOB)))[::2], "x" * 4096, 12):
        with pytest.raises(hw.errors.ArgumentTypeError):
            hw.encode_into(TENSOR, bad)
    released = memoryview(bytearray(len(BLOB)))
    released.release()
    with pytest.raises(hw.errors.ArgumentTypeError):
        hw.encode_into(TENSOR, released)


def test_a_valid_buffer_of_every_kind_decodes_alike() -> None:
    """The same bytes as bytes, bytearray, memoryview, NumPy array and mmap."""
    with tempfile.TemporaryFile() as f:
        f.write(BLOB)
        f.flush()
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        for data in (BLOB, bytearray(BLOB), memoryview(BLOB), np.frombuffer(BLOB, np.uint8),
                     mapped):  # fmt: skip
            tensor = hw.decode(data)
            assert np.array_equal(tensor.page_pool, POOL)
            del tensor
        mapped.close()


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray):
        return bool(np.array_equal(a, b))
    return bool(a == b)
