"""The reference containers: hurray-io stream records and the ``.hrry`` file (containers.md).

Both are byte-compatible with the Rust reference (``hurray-io``): ``write_stream`` and
``write_file`` emit exactly what its ``StreamWriter`` / ``FileWriter`` emit for the same
tensors, and the readers accept everything the reference writes plus the spec's variants
([A17], [A18]), while enforcing the rules the reference skips ([A22], containers.md § B.8).

Neither container has a place for a ``BlockPagedTensor``'s ``seq_lens`` or ``metadata``: a
stream record drops them; a ``.hrry`` file keeps them in its KV metadata under the reserved
keys ``hurray.seq_lens.<name>`` (uint64 array) and ``hurray.metadata.<name>`` (bytes holding
a KV section). docs/reference-containers.md states what a round trip keeps and loses.

Readers raise ``InvalidContainerError`` / ``ContainerTruncatedError`` for any bad input (a
descriptor, index-buffer or KV error is chained as ``__cause__``), ``UnsupportedLayoutError``
for a valid tensor of another layout, and allocate nothing the input does not contain.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import secrets
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from hurray_wire.buffers import align, byte_view
from hurray_wire.crc32c import crc32c
from hurray_wire.errors import (
    ArgumentTypeError,
    ClosedContainerError,
    ContainerTruncatedError,
    HurrayWireError,
    InvalidContainerError,
    InvalidMetadataError,
    InvalidTensorError,
    MissingTensorError,
    UnsupportedLayoutError,
)
from hurray_wire.metadata import (
    MetadataInput,
    MetadataValue,
    UInt64,
    decode_metadata,
    encode_metadata,
)
from hurray_wire.model._checks import U16_MAX
from hurray_wire.model.descriptor import TensorDescriptor
from hurray_wire.model.descriptor_codec import (
    DescriptorHeader,
    decode_descriptor,
    decode_header,
    encode_descriptor,
    peek_descriptor_length,
)
from hurray_wire.tensor import BlockPagedTensor, assemble, check_seq_lens
from hurray_wire.wire import containers as wc
from hurray_wire.wire.fast import derive

__all__ = [
    "DEFAULT_MAX_DESCRIPTOR_BYTES",
    "SEQ_LENS_KEY_PREFIX",
    "METADATA_KEY_PREFIX",
    "write_stream",
    "read_stream",
    "write_file",
    "read_file",
    "read_file_metadata",
    "HrryFile",
    "FileHeader",
    "FileTrailer",
    "IndexEntry",
]

Array = npt.NDArray[Any]

DEFAULT_MAX_DESCRIPTOR_BYTES = 16 << 20  # hurray-io DEFAULT_MAX_DESCRIPTOR_BYTES
SEQ_LENS_KEY_PREFIX = "hurray.seq_lens."  # + tensor name: uint64 array, one per sequence
METADATA_KEY_PREFIX = "hurray.metadata."  # + tensor name: bytes, a KV section (§ B.4)
_RESERVED_PREFIXES = (SEQ_LENS_KEY_PREFIX, METADATA_KEY_PREFIX)

_PREFIX_LEN = 10  # magic, version, descriptor_length: what framing needs (A.2 step 2)
_MIN_DESCRIPTOR = 20
_EAGER_READ = 64 << 20  # buffers up to this size are allocated at once when read from a stream
_MIN_ALIGNMENT = 4096
_MAX_ALIGNMENT = 2 << 20
_HEADER = derive(wc.HrryHeader)
_TRAILER = derive(wc.HrryTrailer)
_U16 = struct.Struct("<H")
_U64 = struct.Struct("<Q")
_ENTRY_FIXED = struct.Struct("<QIQQI")  # after name_length and name
_MIN_ENTRY = 2 + 1 + _ENTRY_FIXED.size  # a one-byte name
_ZEROS = bytes(1 << 16)


def _check_limit(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ArgumentTypeError(f"{name} must be an int >= {minimum}", found=repr(value))


# -- shared: descriptor + buffers -> tensor ---------------------------------------------------
def _tensor_pieces(tensor: BlockPagedTensor) -> tuple[bytes, list[list[memoryview]]]:
    """The encoded descriptor and, per buffer in table order, views of its bytes (no copy)."""
    if not isinstance(tensor, BlockPagedTensor):
        raise ArgumentTypeError("expected a BlockPagedTensor", found=type(tensor).__name__)
    buffers = []
    for index, (arrays, handle) in enumerate(
        zip(tensor.buffer_arrays(), tensor.descriptor.buffers, strict=True)
    ):
        size = sum(a.nbytes for a in arrays)
        if size != handle.byte_size:  # StreamWriter::write_tensor's check
            raise InvalidTensorError(
                "buffer length disagrees with its handle's byte_size",
                field=f"buffers[{index}]",
                expected=handle.byte_size,
                found=size,
            )
        buffers.append([a.data.cast("B") for a in arrays if a.nbytes])
    return encode_descriptor(tensor.descriptor), buffers


def _check_cross_machine(descriptor: TensorDescriptor, **where: Any) -> None:
    for index, handle in enumerate(descriptor.buffers):
        if handle.sync_mode != 0:
            raise InvalidContainerError(
                "cross-machine transfer needs producer-synced buffers (sync_mode 0)",
                field=f"buffers[{index}].sync_mode",
                expected=0,
                found=handle.sync_mode,
                **where,
            )


def _wrap(exc: HurrayWireError, section: str, offset: int | None) -> HurrayWireError:
    """A descriptor / index / KV error as a container error at a place in the container.

    ``UnsupportedLayoutError`` (a valid tensor of another layout) keeps its type.
    """
    if isinstance(exc, UnsupportedLayoutError):
        return exc.relocated(section=section, offset=offset)
    inner = f"{type(exc).__name__}: {exc}"
    return InvalidContainerError(inner, section=section, field=exc.field, offset=offset)


# -- streams (containers.md Part A) -----------------------------------------------------------
def _sink_writer(sink: Any) -> Callable[[memoryview], None]:
    """A function that writes all of one piece: ``sendall`` for sockets, looped ``write``."""
    sendall = getattr(sink, "sendall", None)
    if callable(sendall):
        return sendall  # type: ignore[no-any-return]
    write = getattr(sink, "write", None)
    if not callable(write):
        raise ArgumentTypeError(
            "sink must have .write (binary file-like) or .sendall (socket)",
            found=type(sink).__name__,
        )

    def write_all(piece: memoryview) -> None:
        while len(piece):
            written = write(piece)
            if written is None:  # a file-like that returns nothing took it all
                return
            if not isinstance(written, int) or written <= 0:
                raise ArgumentTypeError("sink.write made no progress", found=repr(written))
            piece = piece[written:]

    return write_all


def write_stream(
    sink: Any,
    tensors: Iterable[BlockPagedTensor] | BlockPagedTensor,
    *,
    cross_machine: bool = False,
) -> int:
    """Write one reference stream record per tensor (descriptor, then its buffers); bytes written.

    Exactly what ``hurray-io``'s ``StreamWriter::write_tensor`` emits: no framing, padding or
    names. ``seq_lens`` and ``metadata`` are not written (a record has no place for them).
    With ``cross_machine`` every handle must have ``sync_mode = 0`` (A.2 step 6).
    """
    write = _sink_writer(sink)
    if isinstance(tensors, BlockPagedTensor):
        tensors = (tensors,)
    total = 0
    for number, tensor in enumerate(tensors):
        descriptor, buffers = _tensor_pieces(tensor)
        if cross_machine:
            _check_cross_machine(tensor.descriptor, section=f"record {number}")
        for piece in [memoryview(descriptor)] + [p for pieces in buffers for p in pieces]:
            write(piece)
            total += len(piece)
    return total


class _Source:
    """Exact reads from a file-like or socket, counting the absolute stream offset."""

    def __init__(self, source: Any) -> None:
        self.offset = 0
        self._readinto = getattr(source, "readinto", None) or getattr(source, "recv_into", None)
        self._read = getattr(source, "read", None)
        if not callable(self._readinto) and not callable(self._read):
            raise ArgumentTypeError(
                "source must be bytes-like or have .readinto / .read / .recv_into",
                found=type(source).__name__,
            )

    def fill(self, out: memoryview) -> int:
        """Read into ``out`` until it is full or the input ends; the bytes read."""
        filled = 0
        size = len(out)
        while filled < size:
            if callable(self._readinto):
                got = self._readinto(out[filled:])
            else:
                assert callable(self._read)
                chunk = self._read(size - filled)
                if isinstance(chunk, str):
                    raise ArgumentTypeError("source must be opened in binary mode")
                got = None if chunk is None else len(chunk)
                if got:
                    out[filled : filled + got] = chunk
            if got is None:
                raise ArgumentTypeError("source is non-blocking and has no data ready")
            if got == 0:
                break
            filled += got
        self.offset += filled
        return filled

    def read_array(self, size: int) -> tuple[Array, int]:
        """Up to ``size`` bytes as a uint8 array and how many arrived.

        Memory grows with the bytes that actually arrive (doubling past 64 MiB), so a
        record that declares a huge buffer and then ends allocates little.
        """
        capacity = min(size, _EAGER_READ)
        out = np.empty(capacity, np.uint8)
        filled = self.fill(out.data)
        while filled == capacity < size:
            capacity = min(size, capacity * 2)
            grown = np.empty(capacity, np.uint8)
            grown[:filled] = out[:filled]
            out = grown
            filled += self.fill(out.data[filled:])
        return out, filled


def _truncated(number: int, what: str, at: int, needed: int, got: int) -> ContainerTruncatedError:
    return ContainerTruncatedError(
        f"stream ends inside record {number} ({what})",
        section=f"record {number}",
        field=what,
        offset=at,
        expected=f"{needed} bytes",
        found=f"{got} bytes",
    )


def _check_prefix(prefix: memoryview, number: int, start: int, max_length: int) -> int:
    """descriptor_length of a record from its first 10 bytes, within the limits (A.2 step 3)."""
    try:
        length = peek_descriptor_length(prefix)
    except HurrayWireError as exc:
        raise _wrap(exc, f"record {number}", start + (exc.offset or 0)) from exc
    if length > max_length:
        raise InvalidContainerError(
            "descriptor_length above the limit",
            section=f"record {number}",
            field="descriptor_length",
            offset=start + 6,
            expected=f"<= {max_length}",
            found=length,
        )
    return length


def _decode_record_descriptor(
    raw: Any, number: int, start: int, max_buffer_size: int | None, cross_machine: bool
) -> TensorDescriptor:
    try:
        descriptor = decode_descriptor(raw)
    except HurrayWireError as exc:
        offset = None if exc.offset is None else start + exc.offset
        raise _wrap(exc, f"record {number}", offset) from exc
    where = f"record {number}"
    if max_buffer_size is not None:
        for index, handle in enumerate(descriptor.buffers):
            if handle.byte_size > max_buffer_size:
                raise InvalidContainerError(
                    "buffer byte_size above the limit",
                    section=where,
                    field=f"buffers[{index}].byte_size",
                    offset=start + 85 + 16 * index,
                    expected=f"<= {max_buffer_size}",
                    found=handle.byte_size,
                )
    if cross_machine:
        _check_cross_machine(descriptor, section=where)
    return descriptor


def _finish_record(
    descriptor: TensorDescriptor, buffers: list[Array], number: int, start: int
) -> BlockPagedTensor:
    try:
        return assemble(descriptor, buffers)
    except HurrayWireError as exc:
        raise _wrap(exc, f"record {number}", start) from exc


def read_stream(
    source: Any,
    *,
    max_descriptor_length: int = DEFAULT_MAX_DESCRIPTOR_BYTES,
    max_buffer_size: int | None = None,
    cross_machine: bool = False,
) -> Iterator[BlockPagedTensor]:
    """Iterate over the records of a reference stream, one validated tensor each.

    ``source`` is bytes-like (arrays are then views of it) or a binary file-like / socket,
    read one record at a time: the 10-byte prefix, the rest of the descriptor, then each
    buffer exactly. The stream may end only at a record boundary; anything less raises
    ``ContainerTruncatedError`` naming the record and the offset where the input ended.
    Each record's descriptor, buffer sizes and index buffers are checked like the blob
    decoder checks them. Records carry no ``seq_lens`` / ``metadata``: tensors come back
    without them. ``max_buffer_size`` (default: no limit, as the reference) caps each buffer.
    """
    _check_limit("max_descriptor_length", max_descriptor_length, _MIN_DESCRIPTOR)
    if max_buffer_size is not None:
        _check_limit("max_buffer_size", max_buffer_size, 0)
    if isinstance(source, (bytes, bytearray, memoryview, mmap.mmap, np.ndarray)) or not (
        hasattr(source, "readinto") or hasattr(source, "read") or hasattr(source, "recv_into")
    ):
        view = byte_view(source, "source")
        return _read_stream_view(view, max_descriptor_length, max_buffer_size, cross_machine)
    return _read_stream_file(_Source(source), max_descriptor_length, max_buffer_size, cross_machine)


def _read_stream_view(
    view: memoryview, max_length: int, max_buffer: int | None, cross_machine: bool
) -> Iterator[BlockPagedTensor]:
    end = len(view)
    pos = 0
    number = 0
    while pos < end:
        start = pos
        if end - pos < _PREFIX_LEN:
            raise _truncated(number, "descriptor prefix", end, _PREFIX_LEN, end - pos)
        length = _check_prefix(view[pos : pos + _PREFIX_LEN], number, start, max_length)
        if end - pos < length:
            raise _truncated(number, "descriptor", end, length, end - pos)
        descriptor = _decode_record_descriptor(
            view[pos : pos + length], number, start, max_buffer, cross_machine
        )
        pos += length
        buffers = []
        for index, handle in enumerate(descriptor.buffers):
            size = handle.byte_size
            if end - pos < size:
                raise _truncated(number, f"buffers[{index}]", end, size, end - pos)
            buffers.append(np.frombuffer(view, np.uint8, size, pos))
            pos += size
        yield _finish_record(descriptor, buffers, number, start)
        number += 1


def _read_stream_file(
    src: _Source, max_length: int, max_buffer: int | None, cross_machine: bool
) -> Iterator[BlockPagedTensor]:
    number = 0
    while True:
        start = src.offset
        prefix = bytearray(_PREFIX_LEN)
        got = src.fill(memoryview(prefix))
        if got == 0:
            return  # clean end of stream, at a record boundary
        if got < _PREFIX_LEN:
            raise _truncated(number, "descriptor prefix", src.offset, _PREFIX_LEN, got)
        length = _check_prefix(memoryview(prefix), number, start, max_length)
        body, got = src.read_array(length - _PREFIX_LEN)
        if got < length - _PREFIX_LEN:
            raise _truncated(number, "descriptor", src.offset, length, _PREFIX_LEN + got)
        raw = bytes(prefix) + body.tobytes()
        descriptor = _decode_record_descriptor(raw, number, start, max_buffer, cross_machine)
        buffers = []
        for index, handle in enumerate(descriptor.buffers):
            array, got = src.read_array(handle.byte_size)
            if got < handle.byte_size:
                raise _truncated(number, f"buffers[{index}]", src.offset, handle.byte_size, got)
            buffers.append(array)
        yield _finish_record(descriptor, buffers, number, start)
        number += 1


# -- .hrry files (containers.md Part B) -------------------------------------------------------
@dataclass(frozen=True)
class FileHeader:
    """The checked 64-byte header (§ B.2)."""

    version: tuple[int, int]
    file_flags: int
    data_buffer_alignment: int
    first_descriptor_offset: int
    tensor_count_hint: int  # never trusted

    @property
    def has_kv_metadata_flag(self) -> bool:
        return bool(self.file_flags & wc.FILE_FLAG_HAS_KV_METADATA)

    @property
    def sorted_index(self) -> bool:
        return bool(self.file_flags & wc.FILE_FLAG_SORTED_INDEX)

    @property
    def has_index_crc32c(self) -> bool:
        return bool(self.file_flags & wc.FILE_FLAG_HAS_INDEX_CRC32C)


@dataclass(frozen=True)
class FileTrailer:
    """The checked 40-byte trailer (§ B.6)."""

    index_offset: int
    index_length: int
    kv_offset: int
    kv_length: int
    index_crc32c: int


@dataclass(frozen=True)
class IndexEntry:
    """One index entry (§ B.5): where a tensor's descriptor and data are."""

    name: str
    descriptor_offset: int
    descriptor_length: int
    data_offset: int
    data_length: int


def _name_bytes(name: object) -> bytes:
    if not isinstance(name, str):
        raise ArgumentTypeError("tensor names must be str", found=type(name).__name__)
    try:
        raw = name.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidContainerError(
            "tensor name is not encodable as UTF-8", section="index", found=repr(name)
        ) from None
    if not 1 <= len(raw) <= U16_MAX:
        raise InvalidContainerError(
            "tensor name must be 1..65535 UTF-8 bytes",
            section="index",
            found=f"{len(raw)} bytes",
        )
    return raw


def _file_kv(
    tensors: Mapping[str, BlockPagedTensor], metadata: Mapping[str, MetadataInput] | None
) -> dict[str, MetadataInput]:
    """The file's KV entries: the user's, in order, then each tensor's reserved keys."""
    if metadata is not None and not isinstance(metadata, Mapping):
        raise ArgumentTypeError("metadata must be a mapping", found=type(metadata).__name__)
    entries: dict[str, MetadataInput] = dict(metadata or {})
    for key in entries:
        if isinstance(key, str) and key.startswith(_RESERVED_PREFIXES):
            raise InvalidMetadataError(
                "key prefix reserved for tensor seq_lens / metadata",
                section="kv_metadata",
                field=key,
                expected=f"no key starting with {' or '.join(_RESERVED_PREFIXES)}",
            )
    for name, tensor in tensors.items():
        if tensor.seq_lens is not None and len(tensor.seq_lens):
            entries[SEQ_LENS_KEY_PREFIX + name] = [UInt64(int(v)) for v in tensor.seq_lens]
        if tensor.metadata:
            entries[METADATA_KEY_PREFIX + name] = encode_metadata(tensor.metadata)
    return entries


def write_file(
    path: str | os.PathLike[str],
    tensors: Mapping[str, BlockPagedTensor],
    metadata: Mapping[str, MetadataInput] | None = None,
    *,
    data_buffer_alignment: int = 4096,
    sorted_index: bool = False,
) -> int:
    """Write a ``.hrry`` file exactly as the reference ``FileWriter`` does; its size in bytes.

    Tensors go in mapping order (§ B.3: buffer 0 and each later buffer at the next multiple
    of ``data_buffer_alignment``, no padding after the last buffer, then 8-byte padding); the
    KV section only when there is an entry; file_flags 0x04 (+0x02 with ``sorted_index``),
    never HAS_KV_METADATA ([A17]); CRC-32C over the index; tensor_count_hint unknown.
    ``metadata`` entries come first, then ``hurray.seq_lens.<name>`` / ``hurray.metadata.<name>``
    for tensors that have them. Everything is encoded first; the image is then written
    beside ``path`` under a temporary name and renamed over it, so arrays still mapping an
    older file at ``path`` (``read_file`` -> ``write_file`` to the same path) stay valid.
    """
    if not isinstance(tensors, Mapping):
        raise ArgumentTypeError("tensors must be a mapping of name to BlockPagedTensor")
    buffer_alignment = data_buffer_alignment
    if (
        isinstance(buffer_alignment, bool)
        or not isinstance(buffer_alignment, int)
        or not _MIN_ALIGNMENT <= buffer_alignment <= _MAX_ALIGNMENT
        or buffer_alignment & (buffer_alignment - 1)
    ):
        raise InvalidContainerError(
            "data_buffer_alignment must be a power of two in 4096..2 MiB",
            section="header",
            field="data_buffer_alignment",
            found=repr(buffer_alignment),
        )
    records = []
    for name, tensor in tensors.items():
        records.append((_name_bytes(name), _tensor_pieces(tensor)))
    kv_entries = _file_kv(tensors, metadata)
    kv = encode_metadata(kv_entries) if kv_entries else b""
    flags = wc.FILE_FLAG_HAS_INDEX_CRC32C | (wc.FILE_FLAG_SORTED_INDEX if sorted_index else 0)
    header = _HEADER.struct.pack(
        wc.FILE_MAGIC,
        1,
        0,
        bytes(2),
        flags,
        buffer_alignment,
        wc.HEADER_SIZE,
        wc.TENSOR_COUNT_UNKNOWN,
        bytes(28),
    )
    target = os.fspath(path)
    temporary = f"{target}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    try:
        size = _write_image(temporary, header, records, kv, buffer_alignment, sorted_index)
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(temporary)
        raise
    return size


def _write_image(
    path: str,
    header: bytes,
    records: list[tuple[bytes, tuple[bytes, list[list[memoryview]]]]],
    kv: bytes,
    buffer_alignment: int,
    sorted_index: bool,
) -> int:
    """Lay the file out (§ B.3-B.6) into a new file at ``path``; its size."""
    with open(path, "xb") as out:
        pos = 0

        def put(piece: bytes | memoryview) -> None:
            nonlocal pos
            out.write(piece)
            pos += len(piece)

        def pad_to(alignment: int) -> None:
            gap = align(pos, alignment) - pos
            while gap:
                step = min(gap, len(_ZEROS))
                put(memoryview(_ZEROS)[:step])
                gap -= step

        put(header)
        index: list[tuple[bytes, int, int, int, int]] = []
        for raw_name, (descriptor, buffers) in records:
            descriptor_offset = pos
            put(descriptor)
            pad_to(buffer_alignment)  # step 2, even before an empty buffer 0
            data_offset = pos
            for number, pieces in enumerate(buffers):
                if number:
                    pad_to(buffer_alignment)  # between buffers only: none after the last ([A18])
                for piece in pieces:
                    put(piece)
            index.append(
                (raw_name, descriptor_offset, len(descriptor), data_offset, pos - data_offset)
            )
            pad_to(8)
        kv_offset = kv_length = 0
        if kv:
            kv_offset, kv_length = pos, len(kv)
            put(kv)
            pad_to(8)
        if sorted_index:
            index.sort(key=lambda entry: entry[0])
        rows = [_U64.pack(len(index))]
        for raw_name, d_off, d_len, data_off, data_len in index:
            rows.append(_U16.pack(len(raw_name)))
            rows.append(raw_name)
            rows.append(_ENTRY_FIXED.pack(d_off, d_len, data_off, data_len, 0))
        index_bytes = b"".join(rows)
        index_offset = pos
        put(index_bytes)
        put(
            _TRAILER.struct.pack(
                index_offset,
                len(index_bytes),
                kv_offset,
                kv_length,
                crc32c(index_bytes),
                bytes(4),
                wc.TRAILER_MAGIC,
            )
        )
    return pos


class HrryFile:
    """A lazy, memory-mapped ``.hrry`` reader: ``with HrryFile(path) as f: f.tensor(name)``.

    Opening checks the header, trailer, index (CRC-32C included) and KV section (§ B.8 1-5)
    and nothing else; ``descriptor`` / ``tensor`` check and map only the tensor asked for
    (§ B.8 6), so a file's other tensors are never read. Arrays are read-only views of the
    map; they keep it alive after ``close()``, which unmaps only once no array is left.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        max_descriptor_length: int = DEFAULT_MAX_DESCRIPTOR_BYTES,
    ) -> None:
        _check_limit("max_descriptor_length", max_descriptor_length, _MIN_DESCRIPTOR)
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            if size < wc.MIN_FILE_SIZE:
                raise ContainerTruncatedError(
                    "file shorter than a header and a trailer",
                    section="file",
                    offset=size,
                    expected=f">= {wc.MIN_FILE_SIZE} bytes",
                    found=f"{size} bytes",
                )
            source: Any = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        self._init(source, size, max_descriptor_length)

    @classmethod
    def from_buffer(
        cls, data: Any, *, max_descriptor_length: int = DEFAULT_MAX_DESCRIPTOR_BYTES
    ) -> HrryFile:
        """Read a ``.hrry`` image held in memory (arrays are then views of ``data``)."""
        _check_limit("max_descriptor_length", max_descriptor_length, _MIN_DESCRIPTOR)
        view = byte_view(data, "data")
        self = cls.__new__(cls)
        if len(view) < wc.MIN_FILE_SIZE:
            raise ContainerTruncatedError(
                "file shorter than a header and a trailer",
                section="file",
                offset=len(view),
                expected=f">= {wc.MIN_FILE_SIZE} bytes",
                found=f"{len(view)} bytes",
            )
        self._init(view, len(view), max_descriptor_length)
        return self

    def _init(self, source: Any, size: int, max_descriptor_length: int) -> None:
        self._buf: Any = source
        self._size = size
        self._max_descriptor = max_descriptor_length
        self._descriptors: dict[str, TensorDescriptor] = {}
        self._closed = False
        try:
            self.header = self._read_header()
            self.trailer = self._read_trailer()
            self.entries = self._read_index()
            self.metadata: dict[str, MetadataValue] = self._read_kv()
        except BaseException:
            self.close()
            raise
        self._by_name = {entry.name: entry for entry in self.entries}

    # -- § B.8 steps 1-5 --------------------------------------------------------------------
    def _bytes(self, start: int, stop: int) -> bytes:
        return bytes(self._buf[start:stop])

    def _read_header(self) -> FileHeader:
        values = _HEADER.struct.unpack_from(self._buf, 0)
        (magic, major, minor, reserved0, flags, align, first, hint, reserved1) = values
        if magic != wc.FILE_MAGIC:
            raise InvalidContainerError(
                "bad file magic",
                section="header",
                field="magic",
                offset=0,
                expected=wc.FILE_MAGIC.hex(" "),
                found=magic.hex(" "),
            )
        if major != 1:
            raise InvalidContainerError(
                "unsupported container major version",
                section="header",
                field="container_version_major",
                offset=8,
                expected=1,
                found=major,
            )
        if reserved0 != bytes(2) or reserved1 != bytes(28):
            at = 10 if reserved0 != bytes(2) else 36
            raise InvalidContainerError(
                "reserved header bytes must be zero", section="header", field="_reserved", offset=at
            )
        if flags & ~wc.FILE_FLAGS_KNOWN:
            raise InvalidContainerError(
                "reserved file_flags bits set",
                section="header",
                field="file_flags",
                offset=12,
                found=f"0x{flags:08X}",
            )
        if not _MIN_ALIGNMENT <= align <= _MAX_ALIGNMENT or align & (align - 1):
            raise InvalidContainerError(
                "data_buffer_alignment must be a power of two in 4096..2 MiB",
                section="header",
                field="data_buffer_alignment",
                offset=16,
                found=align,
            )
        if first < wc.HEADER_SIZE or first % 8 or first > self._size - wc.TRAILER_SIZE:
            raise InvalidContainerError(
                "first_descriptor_offset must be >= 64, 8-aligned and inside the file",
                section="header",
                field="first_descriptor_offset",
                offset=20,
                found=first,
            )
        return FileHeader((major, minor), flags, align, first, hint)

    def _read_trailer(self) -> FileTrailer:
        at = self._size - wc.TRAILER_SIZE
        values = _TRAILER.struct.unpack_from(self._buf, at)
        index_offset, index_length, kv_offset, kv_length, crc, reserved, magic = values
        if magic != wc.TRAILER_MAGIC:
            raise InvalidContainerError(
                "bad trailer magic (file truncated or not a .hrry file)",
                section="trailer",
                field="magic",
                offset=at + 36,
                expected=wc.TRAILER_MAGIC.hex(" "),
                found=magic.hex(" "),
            )
        if reserved != bytes(4):
            raise InvalidContainerError(
                "reserved trailer bytes must be zero",
                section="trailer",
                field="_reserved",
                offset=at + 32,
            )
        if index_offset < wc.HEADER_SIZE or index_length < 8 or index_offset + index_length > at:
            raise InvalidContainerError(
                "index outside the file body",
                section="trailer",
                field="index_offset",
                offset=at,
                expected=f"64 <= index_offset, 8 <= index_length, end <= {at}",
                found=f"offset {index_offset}, length {index_length}",
            )
        has_kv = self.header.has_kv_metadata_flag
        if (kv_offset == 0) != (kv_length == 0) or (has_kv and kv_length == 0):
            raise InvalidContainerError(
                "kv_offset and kv_length must both be 0 (no KV section) or both be set"
                + (", and HAS_KV_METADATA needs a section" if has_kv else ""),
                section="trailer",
                field="kv_offset",
                offset=at + 16,
                found=f"offset {kv_offset}, length {kv_length}",
            )
        if kv_length and (kv_offset < wc.HEADER_SIZE or kv_offset + kv_length > at):
            raise InvalidContainerError(
                "KV section outside the file body",
                section="trailer",
                field="kv_offset",
                offset=at + 16,
                expected=f"64 <= kv_offset, end <= {at}",
                found=f"offset {kv_offset}, length {kv_length}",
            )
        if self.header.has_index_crc32c:
            computed = crc32c(np.frombuffer(self._buf, np.uint8, index_length, index_offset))
            if computed != crc:
                raise InvalidContainerError(
                    "index CRC-32C mismatch",
                    section="trailer",
                    field="index_crc32c",
                    offset=at + 28,
                    expected=f"0x{computed:08X}",
                    found=f"0x{crc:08X}",
                )
        elif crc != 0:
            raise InvalidContainerError(
                "index_crc32c must be 0 when HAS_INDEX_CRC32C is clear ([A21])",
                section="trailer",
                field="index_crc32c",
                offset=at + 28,
                found=f"0x{crc:08X}",
            )
        return FileTrailer(index_offset, index_length, kv_offset, kv_length, crc)

    def _read_index(self) -> tuple[IndexEntry, ...]:
        start = self.trailer.index_offset
        end = start + self.trailer.index_length
        count = _U64.unpack_from(self._buf, start)[0]
        if count > (end - start - 8) // _MIN_ENTRY:
            raise InvalidContainerError(
                "entry_count larger than the index can hold",
                section="index",
                field="entry_count",
                offset=start,
                expected=f"<= {(end - start - 8) // _MIN_ENTRY}",
                found=count,
            )
        pos = start + 8
        entries: list[IndexEntry] = []
        raw_names: list[bytes] = []
        seen: set[bytes] = set()
        for number in range(count):
            where = f"entries[{number}]"
            if pos + 2 > end:
                raise self._index_short(where, pos, end)
            name_length = _U16.unpack_from(self._buf, pos)[0]
            if name_length == 0:
                raise InvalidContainerError(
                    "empty tensor name", section="index", field=f"{where}.name_length", offset=pos
                )
            if pos + 2 + name_length + _ENTRY_FIXED.size > end:
                raise self._index_short(where, pos, end)
            raw = self._bytes(pos + 2, pos + 2 + name_length)
            try:
                name = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise InvalidContainerError(
                    "tensor name is not valid UTF-8",
                    section="index",
                    field=f"{where}.name",
                    offset=pos + 2 + exc.start,
                ) from None
            if raw in seen:
                raise InvalidContainerError(
                    "duplicate tensor name",
                    section="index",
                    field=f"{where}.name",
                    offset=pos + 2,
                    found=repr(name),
                )
            seen.add(raw)
            fixed = pos + 2 + name_length
            d_off, d_len, data_off, data_len, flags = _ENTRY_FIXED.unpack_from(self._buf, fixed)
            if flags:
                raise InvalidContainerError(
                    "index entry flags must be 0",
                    section="index",
                    field=f"{where}.flags",
                    offset=fixed + 28,
                    found=flags,
                )
            entries.append(IndexEntry(name, d_off, d_len, data_off, data_len))
            raw_names.append(raw)
            pos = fixed + _ENTRY_FIXED.size
        if pos != end:
            raise InvalidContainerError(
                "bytes left over after the last index entry",
                section="index",
                offset=pos,
                expected=f"index end at {end}",
                found=f"{end - pos} bytes",
            )
        if self.header.sorted_index and raw_names != sorted(raw_names):
            raise InvalidContainerError(
                "SORTED_INDEX is set but the entries are not sorted by name bytes",
                section="index",
                offset=start,
            )
        return tuple(entries)

    @staticmethod
    def _index_short(where: str, pos: int, end: int) -> InvalidContainerError:
        return InvalidContainerError(
            "index_length ends inside an entry",
            section="index",
            field=where,
            offset=pos,
            expected="a whole entry",
            found=f"{end - pos} bytes",
        )

    def _read_kv(self) -> dict[str, MetadataValue]:
        trailer = self.trailer
        if not trailer.kv_length:
            return {}
        raw = self._bytes(trailer.kv_offset, trailer.kv_offset + trailer.kv_length)
        try:
            return decode_metadata(raw, base_offset=trailer.kv_offset)
        except HurrayWireError as exc:
            raise _wrap(exc, "kv_metadata", exc.offset) from exc

    # -- public, per tensor -----------------------------------------------------------------
    @property
    def names(self) -> tuple[str, ...]:
        """Tensor names in index order (sorted when the index is)."""
        return tuple(entry.name for entry in self.entries)

    @property
    def user_metadata(self) -> dict[str, MetadataValue]:
        """The KV entries without the reserved ``hurray.seq_lens.`` / ``hurray.metadata.`` keys."""
        return {k: v for k, v in self.metadata.items() if not k.startswith(_RESERVED_PREFIXES)}

    def entry(self, name: str) -> IndexEntry:
        self._check_open()
        try:
            return self._by_name[name]
        except (KeyError, TypeError):
            raise MissingTensorError(
                "no tensor of this name in the file", section="index", found=repr(name)
            ) from None

    def _descriptor_bytes(self, entry: IndexEntry) -> bytes:
        """The descriptor's bytes after the § B.8 step-6 placement and length checks."""
        offset, length = entry.descriptor_offset, entry.descriptor_length
        section = f"tensor {entry.name!r}"
        if offset % 8 or offset < self.header.first_descriptor_offset:
            raise InvalidContainerError(
                "descriptor_offset must be 8-aligned and not before first_descriptor_offset",
                section=section,
                field="descriptor_offset",
                found=offset,
            )
        if not _MIN_DESCRIPTOR <= length <= self._max_descriptor:
            raise InvalidContainerError(
                "index descriptor_length out of range",
                section=section,
                field="descriptor_length",
                expected=f"20..{self._max_descriptor}",
                found=length,
            )
        if offset + length > self._size - wc.TRAILER_SIZE:
            raise InvalidContainerError(
                "descriptor extends past the file body",
                section=section,
                field="descriptor_offset",
                offset=offset,
                expected=f"end <= {self._size - wc.TRAILER_SIZE}",
                found=f"end {offset + length}",
            )
        raw = self._bytes(offset, offset + length)
        try:
            own = peek_descriptor_length(raw)
        except HurrayWireError as exc:
            raise _wrap(exc, section, offset + (exc.offset or 0)) from exc
        if own != length:
            raise InvalidContainerError(
                "index descriptor_length differs from the descriptor's own",
                section=section,
                field="descriptor_length",
                offset=offset + 6,
                expected=length,
                found=own,
            )
        return raw

    def descriptor_header(self, name: str) -> DescriptorHeader:
        """The common header of ``name``'s descriptor, whatever its layout (for listing)."""
        entry = self.entry(name)
        raw = self._descriptor_bytes(entry)
        try:
            return decode_header(raw)
        except HurrayWireError as exc:
            offset = None if exc.offset is None else entry.descriptor_offset + exc.offset
            raise _wrap(exc, f"tensor {name!r}", offset) from exc

    def descriptor(self, name: str) -> TensorDescriptor:
        """``name``'s block-paged descriptor (parses only that descriptor).

        Raises ``UnsupportedLayoutError`` for a valid descriptor of another layout.
        """
        self._check_open()
        cached = self._descriptors.get(name)
        if cached is not None:
            return cached
        entry = self.entry(name)
        raw = self._descriptor_bytes(entry)
        try:
            descriptor = decode_descriptor(raw)
        except HurrayWireError as exc:
            offset = None if exc.offset is None else entry.descriptor_offset + exc.offset
            raise _wrap(exc, f"tensor {name!r}", offset) from exc
        self._descriptors[name] = descriptor
        return descriptor

    def buffer_spans(self, name: str) -> tuple[tuple[int, int], ...]:
        """``(offset, byte_size)`` of each of ``name``'s buffers in the file, checked (§ B.3)."""
        entry = self.entry(name)
        descriptor = self.descriptor(name)
        section = f"tensor {name!r}"
        buffer_alignment = self.header.data_buffer_alignment
        if entry.data_offset % buffer_alignment:
            raise InvalidContainerError(
                "data_offset must be a multiple of data_buffer_alignment",
                section=section,
                field="data_offset",
                expected=f"multiple of {buffer_alignment}",
                found=entry.data_offset,
            )
        descriptor_end = entry.descriptor_offset + entry.descriptor_length
        if entry.data_offset < descriptor_end:
            raise InvalidContainerError(
                "tensor data must follow its descriptor",
                section=section,
                field="data_offset",
                expected=f">= {descriptor_end}",
                found=entry.data_offset,
            )
        spans = []
        pos = entry.data_offset
        for number, handle in enumerate(descriptor.buffers):
            if number:
                pos = align(pos, buffer_alignment)
            spans.append((pos, handle.byte_size))
            pos += handle.byte_size
        if pos - entry.data_offset != entry.data_length:
            raise InvalidContainerError(
                "data_length disagrees with the buffers and their alignment padding",
                section=section,
                field="data_length",
                expected=pos - entry.data_offset,
                found=entry.data_length,
            )
        if pos > self._size - wc.TRAILER_SIZE:
            raise ContainerTruncatedError(
                "tensor data extends past the file body",
                section=section,
                field="data_offset",
                offset=self._size - wc.TRAILER_SIZE,
                expected=f"data end {pos}",
                found=f"file body ends at {self._size - wc.TRAILER_SIZE}",
            )
        return tuple(spans)

    def tensor(self, name: str) -> BlockPagedTensor:
        """``name`` as a tensor whose arrays are read-only views of the file (no copy).

        ``seq_lens`` and ``metadata`` come back from their reserved KV keys, checked.
        """
        self._check_open()
        spans = self.buffer_spans(name)
        descriptor = self.descriptor(name)
        buffers = [np.frombuffer(self._buf, np.uint8, size, at) for at, size in spans]
        section = f"tensor {name!r}"
        try:
            tensor = assemble(descriptor, buffers)
        except HurrayWireError as exc:
            raise _wrap(exc, section, self.entry(name).data_offset) from exc
        tensor.seq_lens = self._seq_lens(name, tensor)
        tensor.metadata = self._tensor_metadata(name)
        return tensor

    def tensors(self, names: Iterable[str] | None = None) -> dict[str, BlockPagedTensor]:
        """Several tensors by name (all, in index order, by default)."""
        return {name: self.tensor(name) for name in (self.names if names is None else names)}

    def _seq_lens(self, name: str, tensor: BlockPagedTensor) -> Array | None:
        key = SEQ_LENS_KEY_PREFIX + name
        value = self.metadata.get(key)
        if value is None:
            return None
        if not isinstance(value, list) or not all(isinstance(v, UInt64) for v in value):
            raise InvalidContainerError(
                "seq_lens must be an array of uint64",
                section="kv_metadata",
                field=key,
                found=type(value).__name__,
            )
        lens = np.array([int(v) for v in value], dtype="<u8")
        try:
            check_seq_lens(lens, tensor.seq_ptr, tensor.layout.page_size, tensor.shape[0])
        except HurrayWireError as exc:
            raise _wrap(exc, "kv_metadata", None) from exc
        return lens

    def _tensor_metadata(self, name: str) -> dict[str, Any]:
        key = METADATA_KEY_PREFIX + name
        value = self.metadata.get(key)
        if value is None:
            return {}
        if not isinstance(value, bytes):
            raise InvalidContainerError(
                "tensor metadata must be bytes holding a KV section",
                section="kv_metadata",
                field=key,
                found=type(value).__name__,
            )
        try:
            return dict(decode_metadata(value))
        except HurrayWireError as exc:
            raise _wrap(exc, "kv_metadata", None) from exc

    # -- lifetime ---------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise ClosedContainerError("I/O operation on a closed HrryFile", section="file")

    def close(self) -> None:
        """Unmap the file; arrays still alive keep the map until they are gone."""
        if self._closed:
            return
        self._closed = True
        buf = self._buf
        self._buf = None
        if isinstance(buf, mmap.mmap):
            # Views still exported: the map goes away with the last array.
            with contextlib.suppress(BufferError):
                buf.close()

    def __enter__(self) -> HrryFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def __len__(self) -> int:
        return len(self.entries)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self.entries)} tensors"
        return f"HrryFile({state}, {self._size} bytes)"


def read_file(
    path: str | os.PathLike[str], names: Iterable[str] | None = None
) -> dict[str, BlockPagedTensor]:
    """The tensors of a ``.hrry`` file (all, or ``names``) as zero-copy views of its map.

    A tensor of another layout raises ``UnsupportedLayoutError`` only if it is asked for.
    """
    with HrryFile(path) as hrry:
        return hrry.tensors(names)


def read_file_metadata(path: str | os.PathLike[str]) -> dict[str, MetadataValue]:
    """All KV metadata of a ``.hrry`` file, reserved keys included, without reading tensors."""
    with HrryFile(path) as hrry:
        return dict(hrry.metadata)
