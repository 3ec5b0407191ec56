"""StreamWriter / StreamReader / StreamFile: many blobs over one byte stream.

The format is docs/streaming.md: ``[stream header] blob* [end record]``, every record framed
by the blob's 16-byte prefix and told apart by magic. A blob knows nothing of the stream it
sits in: the stream adds what a reader needs before and after the blobs (what to preallocate,
where the stream ends, where each blob is), never the identity of a blob, which always comes
from its own descriptor.

Reading is bounded and typed: a record's length is checked against ``max_blob_bytes`` before
anything is allocated, each blob gets its own buffer (so every tensor handed out stays valid
whatever happens later), and every failure, including a broken connection, is a
``HurrayWireError``.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import socket
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType, TracebackType
from typing import Any

import numpy as np
import xxhash

from hurray_wire.blob import (
    BLOB_PREFIX_SIZE,
    DecodeLimits,
    blob_length,
    decode,
    encode_parts,
    peek_descriptor,
)
from hurray_wire.buffers import align, byte_view, check_zero
from hurray_wire.codecs import Compression
from hurray_wire.dtypes import ElementType, element_type_from_tag, element_type_of
from hurray_wire.errors import (
    ArgumentTypeError,
    BlobTruncatedError,
    HurrayWireError,
    InvalidStreamError,
    LimitExceededError,
    MissingTensorError,
    StreamBlobTruncatedError,
    StreamTruncatedError,
)
from hurray_wire.metadata import decode_metadata, encode_metadata
from hurray_wire.model.layout import KV_ROLE_NAMES
from hurray_wire.tensor import BlockPagedTensor
from hurray_wire.wire import blob as wb
from hurray_wire.wire import stream as ws
from hurray_wire.wire.descriptor import KV_ROLES, LAYER_NONE
from hurray_wire.wire.fast import derive

__all__ = [
    "DEFAULT_MAX_BLOB_BYTES",
    "InvalidStreamError",
    "StreamBlobTruncatedError",
    "StreamEntry",
    "StreamFile",
    "StreamHeader",
    "StreamReader",
    "StreamTruncatedError",
    "StreamWriter",
    "decode_stream_header",
    "encode_stream_header",
]

DEFAULT_MAX_BLOB_BYTES = 4 << 30  # largest record a reader accepts unless told otherwise

_PREFIX = derive(ws.RECORD_PREFIX)
_SHEADER = derive(ws.STREAM_HEADER)
_END = derive(ws.END_RECORD)
_ENTRY = derive(ws.END_ENTRY)
_FOOTER = derive(ws.END_FOOTER)
_BLOB_HEADER = derive(wb.BLOB_HEADER)
_SECTION_ENTRY_SIZE = derive(wb.SECTION_ENTRY).size
_U64 = struct.Struct("<Q")
_SHEADER_MIN = 64  # align(32 + 8, 64)
_END_MIN = 64  # align(32 + 16, 64)
_ROLE_BY_CODE = {code: name for name, code in KV_ROLES.items()}
_MAGICS = {wb.BLOB_MAGIC: "blob", ws.STREAM_MAGIC: "stream header", ws.END_MAGIC: "end record"}
_IOV_MAX = 1024
_READ_CHUNK = 1 << 20  # for sources that only have read(): bounds the temporary copy


# -- errors ----------------------------------------------------------------------------------
# -- model -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class StreamHeader:
    """What a stream carries, stated before the first blob so a reader can preallocate.

    Every field may be left unstated (``""``, ``None``, ``()``). A reader checks each blob
    against what is stated; which layer and role a blob holds still comes from the blob's
    own descriptor. ``end_record`` is the writer's promise to end the stream with an end
    record, which lets a reader tell a finished stream from one cut at a blob boundary.
    """

    model: str = ""
    num_layers: int | None = None
    kv_roles: tuple[str, ...] = ()
    element_type: ElementType | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict, hash=False)
    end_record: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.model, str):
            raise ArgumentTypeError("model must be a str", field="model", found=repr(self.model))
        try:
            name_length = len(self.model.encode("utf-8"))
        except UnicodeEncodeError:
            raise InvalidStreamError("model is not encodable as UTF-8", field="model") from None
        if name_length > 0xFFFF:
            raise InvalidStreamError(
                "model name too long", field="model", expected="<= 65535 bytes", found=name_length
            )
        layers = self.num_layers
        if layers is not None and (
            isinstance(layers, bool)
            or not isinstance(layers, int)
            or not 0 <= layers < ws.NUM_LAYERS_UNKNOWN
        ):
            raise InvalidStreamError(
                "num_layers must be None or an int in [0, 2**32 - 2]",
                field="num_layers",
                found=repr(layers),
            )
        if isinstance(self.kv_roles, str):
            raise ArgumentTypeError(
                "kv_roles must be a sequence of role names", field="kv_roles", found=self.kv_roles
            )
        roles = tuple(self.kv_roles)
        for role in roles:
            if role not in KV_ROLE_NAMES:
                raise InvalidStreamError(
                    "unknown kv_role", field="kv_roles", found=repr(role), expected=KV_ROLE_NAMES
                )
        object.__setattr__(self, "kv_roles", tuple(r for r in KV_ROLE_NAMES if r in roles))
        if self.element_type is not None:
            object.__setattr__(self, "element_type", element_type_of(self.element_type))
        if not isinstance(self.metadata, Mapping):
            raise ArgumentTypeError(
                "metadata must be a mapping", field="metadata", found=type(self.metadata).__name__
            )
        object.__setattr__(self, "metadata", MappingProxyType(dict(self.metadata)))
        object.__setattr__(self, "end_record", bool(self.end_record))


@dataclass(frozen=True)
class StreamEntry:
    """Where one blob sits in a stream, and which ``{kv_role, layer}`` its descriptor names."""

    offset: int  # from the first byte of the stream
    length: int  # the blob's total_length
    layer_index: int | None
    kv_role: str


# -- records ---------------------------------------------------------------------------------
def encode_stream_header(header: StreamHeader) -> bytes:
    """The stream header record for ``header`` (docs/streaming.md § 2)."""
    if not isinstance(header, StreamHeader):
        raise ArgumentTypeError("expected a StreamHeader", found=type(header).__name__)
    name = header.model.encode("utf-8")
    meta = encode_metadata(header.metadata) if header.metadata else b""
    if len(meta) > 0xFFFF_FFFF:
        raise InvalidStreamError("stream metadata too long", field="metadata", found=len(meta))
    body = _SHEADER.size + len(name) + len(meta)
    total = align(body + 8, ws.RECORD_ALIGNMENT)
    roles = 0
    for role in header.kv_roles:
        roles |= ws.ROLE_BITS[role]
    fixed = _SHEADER.struct.pack(
        ws.STREAM_MAGIC,
        1,
        0,
        ws.STREAM_FLAG_END_RECORD if header.end_record else 0,
        total,
        ws.NUM_LAYERS_UNKNOWN if header.num_layers is None else header.num_layers,
        roles,
        ws.ELEMENT_TYPE_UNKNOWN if header.element_type is None else header.element_type.tag,
        len(name),
        len(meta),
        bytes(4),
    )
    head = b"".join((fixed, name, meta, bytes(total - 8 - body)))
    return head + _U64.pack(xxhash.xxh3_64_intdigest(head))


def _record_length(prefix: Any, magic: bytes, what: str, minimum: int) -> int:
    """total_length of a stream header or end record from its 16-byte prefix, checked."""
    view = byte_view(prefix)
    if len(view) < BLOB_PREFIX_SIZE:
        raise StreamTruncatedError(
            f"input ends inside the {what} prefix",
            section=what,
            offset=len(view),
            expected=BLOB_PREFIX_SIZE,
            found=len(view),
        )
    found_magic, major, _minor, _flags, total = _PREFIX.struct.unpack_from(view, 0)
    if found_magic != magic:
        raise InvalidStreamError(
            f"bad {what} magic",
            section=what,
            field="magic",
            offset=0,
            expected=magic.hex(" "),
            found=found_magic.hex(" "),
        )
    if major != 1:
        raise InvalidStreamError(
            f"unsupported {what} major version",
            section=what,
            field="version_major",
            offset=4,
            expected=1,
            found=major,
        )
    if total < minimum or total % ws.RECORD_ALIGNMENT:
        raise InvalidStreamError(
            f"total_length is not a valid {what} length",
            section=what,
            field="total_length",
            offset=8,
            expected=f"a multiple of 64, >= {minimum}",
            found=total,
        )
    return int(total)


def _whole_record(view: memoryview, total: int, what: str) -> None:
    if len(view) < total:
        raise StreamTruncatedError(
            f"input ends inside the {what}",
            section=what,
            offset=len(view),
            expected=total,
            found=len(view),
        )


def _check_checksum(view: memoryview, start: int, stored: int, what: str) -> None:
    computed = xxhash.xxh3_64_intdigest(view[:start])
    if computed != stored:
        raise InvalidStreamError(
            f"{what} checksum mismatch",
            section=what,
            field="checksum",
            offset=start,
            expected=f"0x{computed:016x}",
            found=f"0x{stored:016x}",
        )


def decode_stream_header(data: Any) -> StreamHeader:
    """Validate the stream header at the start of ``data`` (what follows it is ignored)."""
    what = "stream header"
    view = byte_view(data)
    total = _record_length(view, ws.STREAM_MAGIC, what, _SHEADER_MIN)
    _whole_record(view, total, what)
    view = view[:total]
    (_, _, minor, flags, _, layers, roles, tag, name_length, meta_length, reserved) = (
        _SHEADER.struct.unpack_from(view, 0)
    )
    _check_checksum(view, total - 8, _U64.unpack_from(view, total - 8)[0], what)
    if flags & ~ws.STREAM_FLAGS_KNOWN:
        raise InvalidStreamError(
            "unknown stream flags set", section=what, field="stream_flags", offset=6, found=flags
        )
    if reserved != bytes(4):
        raise InvalidStreamError("reserved bytes set", section=what, field="_reserved", offset=28)
    if roles & ~0x07:
        raise InvalidStreamError(
            "unknown kv_roles bits set", section=what, field="kv_roles", offset=20, found=roles
        )
    body = _SHEADER.size + name_length + meta_length
    if body + 8 > total:
        raise InvalidStreamError(
            "model name and metadata extend past total_length",
            section=what,
            field="metadata_length",
            offset=24,
            expected=f"<= {total - 8 - _SHEADER.size - name_length}",
            found=meta_length,
        )
    if minor == 0:  # a newer minor may append fields here; 1.0 has only padding
        check_zero(view, body, total - 8, error=InvalidStreamError, section=what)
    try:
        model = bytes(view[_SHEADER.size : _SHEADER.size + name_length]).decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidStreamError(
            "model name is not valid UTF-8", section=what, field="model_name", offset=32
        ) from None
    meta_start = _SHEADER.size + name_length
    metadata: dict[str, Any] = {}
    if meta_length:
        metadata = dict(decode_metadata(view[meta_start:body], base_offset=meta_start))
    element_type = None
    if tag != ws.ELEMENT_TYPE_UNKNOWN:
        try:
            element_type = element_type_from_tag(tag)
        except HurrayWireError as exc:
            raise exc.relocated(section=what, field="element_type", offset=21) from None
    return StreamHeader(
        model=model,
        num_layers=None if layers == ws.NUM_LAYERS_UNKNOWN else layers,
        kv_roles=tuple(name for name, bit in ws.ROLE_BITS.items() if roles & bit),
        element_type=element_type,
        metadata=metadata,
        end_record=bool(flags & ws.STREAM_FLAG_END_RECORD),
    )


def _encode_end(entries: list[StreamEntry] | None, blob_count: int) -> bytes:
    """The end record: end-of-stream marker, blob count and (optionally) the index."""
    rows = entries if entries is not None and len(entries) <= 0xFFFF_FFFF else []
    body = _END.size + _ENTRY.size * len(rows)
    total = align(body + _FOOTER.size, ws.RECORD_ALIGNMENT)
    pieces = [_END.struct.pack(ws.END_MAGIC, 1, 0, 0, total, blob_count, len(rows), bytes(4))]
    for e in rows:
        layer = LAYER_NONE if e.layer_index is None else e.layer_index
        pieces.append(_ENTRY.struct.pack(e.offset, e.length, layer, KV_ROLES[e.kv_role], b"\0" * 3))
    pieces.append(bytes(total - _FOOTER.size - body))
    head = b"".join(pieces)
    return head + _FOOTER.struct.pack(xxhash.xxh3_64_intdigest(head), total)


def _decode_end(data: Any) -> tuple[int, tuple[StreamEntry, ...] | None]:
    """(blob_count, index entries or None) of the end record at the start of ``data``."""
    what = "end record"
    view = byte_view(data)
    total = _record_length(view, ws.END_MAGIC, what, _END_MIN)
    _whole_record(view, total, what)
    view = view[:total]
    _, _, minor, flags, _, blob_count, count, reserved = _END.struct.unpack_from(view, 0)
    stored, again = _FOOTER.struct.unpack_from(view, total - _FOOTER.size)
    if again != total:
        raise InvalidStreamError(
            "the footer's total_length disagrees with the prefix",
            section=what,
            field="footer.total_length",
            offset=total - 8,
            expected=total,
            found=again,
        )
    _check_checksum(view, total - _FOOTER.size, stored, what)
    if flags:
        raise InvalidStreamError(
            "unknown end record flags set", section=what, field="end_flags", offset=6, found=flags
        )
    if reserved != bytes(4):
        raise InvalidStreamError("reserved bytes set", section=what, field="_reserved", offset=28)
    body = _END.size + _ENTRY.size * count
    if body + _FOOTER.size > total:
        raise InvalidStreamError(
            "index entries extend past total_length",
            section=what,
            field="entry_count",
            offset=24,
            found=count,
        )
    if count and count != blob_count:
        raise InvalidStreamError(
            "the index must list every blob or none",
            section=what,
            field="entry_count",
            offset=24,
            expected=blob_count,
            found=count,
        )
    if minor == 0:
        check_zero(view, body, total - _FOOTER.size, error=InvalidStreamError, section=what)
    entries = []
    for number, row in enumerate(_ENTRY.struct.iter_unpack(view[_END.size : body])):
        offset, length, layer, role, pad = row
        at = _END.size + _ENTRY.size * number
        if role not in _ROLE_BY_CODE or pad != bytes(3):
            raise InvalidStreamError(
                "bad kv_role or reserved bytes in an index entry",
                section=what,
                field=f"entries[{number}]",
                offset=at + 20,
                found=role,
            )
        entries.append(
            StreamEntry(offset, length, None if layer == LAYER_NONE else layer, _ROLE_BY_CODE[role])
        )
    return blob_count, (tuple(entries) if count or not blob_count else None)


def _check_against_header(header: StreamHeader | None, tensor: BlockPagedTensor, at: str) -> None:
    """A blob must be what the stream header says the stream holds."""
    if header is None:
        return
    layer = tensor.layer_index
    if header.num_layers is not None and (layer is None or layer >= header.num_layers):
        raise InvalidStreamError(
            "blob layer_index outside the stream header's num_layers",
            section=at,
            field="layer_index",
            expected=f"< {header.num_layers}",
            found=layer,
        )
    if header.kv_roles and tensor.kv_role not in header.kv_roles:
        raise InvalidStreamError(
            "blob kv_role not among the stream header's kv_roles",
            section=at,
            field="kv_role",
            expected=header.kv_roles,
            found=tensor.kv_role,
        )
    if header.element_type is not None and tensor.element_type != header.element_type:
        raise InvalidStreamError(
            "blob element type differs from the stream header's",
            section=at,
            field="element_type",
            expected=header.element_type.name,
            found=tensor.element_type.name,
        )


def _check_max(max_blob_bytes: int) -> int:
    if isinstance(max_blob_bytes, bool) or not isinstance(max_blob_bytes, int):
        raise ArgumentTypeError("max_blob_bytes must be an int", found=repr(max_blob_bytes))
    if max_blob_bytes < _SHEADER_MIN:
        raise ArgumentTypeError("max_blob_bytes must be at least 64", found=max_blob_bytes)
    return max_blob_bytes


def _check_size(total: int, limit: int, what: str, offset: int) -> None:
    if total > limit:
        raise LimitExceededError(
            f"{what} larger than max_blob_bytes",
            section=what,
            field="total_length",
            offset=offset + 8,
            expected=f"<= {limit}",
            found=total,
        )


def _note(exc: HurrayWireError, text: str) -> None:
    add_note = getattr(exc, "add_note", None)  # Python >= 3.11
    if add_note is not None:
        add_note(text)


# -- writer ----------------------------------------------------------------------------------
def _sender(sink: Any) -> Callable[[list[memoryview]], None]:
    """A function that writes every byte of a list of pieces to ``sink``."""
    if hasattr(sink, "sendmsg") or hasattr(sink, "sendall"):
        return _socket_sender(sink)
    write = getattr(sink, "write", None)
    if write is None:
        raise ArgumentTypeError(
            "sink must be a path, a socket or a binary file-like object",
            found=type(sink).__name__,
        )

    def send(parts: list[memoryview]) -> None:
        for part in parts:
            while len(part):
                written = write(part)
                if written is None or written >= len(part):
                    break
                part = part[written:]

    return send


def _socket_sender(sock: Any) -> Callable[[list[memoryview]], None]:
    sendmsg = getattr(sock, "sendmsg", None)
    if sendmsg is None:

        def send_each(parts: list[memoryview]) -> None:
            for part in parts:
                sock.sendall(part)

        return send_each

    def send(parts: list[memoryview]) -> None:
        pending = [p for p in parts if len(p)]
        first = 0
        while first < len(pending):
            sent = sendmsg(pending[first : first + _IOV_MAX])
            while sent:  # a partial send ends anywhere: drop what went, trim the next piece
                size = len(pending[first])
                if sent >= size:
                    sent -= size
                    first += 1
                else:
                    pending[first] = pending[first][sent:]
                    sent = 0

    return send


class StreamWriter:
    """Write blobs one at a time to a socket, a binary file-like object or a file path.

    The stream header (unless ``header=None``) goes out at construction, so the reader can
    preallocate while the first layer is still being computed. ``write`` sends each blob
    from ``encode_parts`` (views of the tensor's own arrays, ``sendmsg`` on sockets) and
    flushes. ``close`` ends the stream with the end record (with the index unless
    ``index=False``); leaving a ``with`` block by an exception does not, so the reader sees
    a cut stream rather than a complete one. A sink passed in is flushed but not closed;
    a path is opened, and closed by ``close``.
    """

    def __init__(
        self, sink: Any, header: StreamHeader | None = StreamHeader(), *, index: bool = True
    ) -> None:
        self._file: Any = None
        if isinstance(sink, (str, os.PathLike)):
            self._file = sink = open(sink, "wb")  # noqa: SIM115 - owned, closed by close()
        try:
            self._send = _sender(sink)
        except HurrayWireError:
            self._close_file()
            raise
        self._flush: Callable[[], Any] | None = getattr(sink, "flush", None)
        if header is not None and not isinstance(header, StreamHeader):
            self._close_file()
            raise ArgumentTypeError("header must be a StreamHeader or None", found=repr(header))
        self._header = header
        self._entries: list[StreamEntry] | None = [] if index else None
        self._count = 0
        self._position = 0
        self._closed = False
        self._failed = False
        if header is not None:
            try:
                self._emit([memoryview(encode_stream_header(header))])
            except BaseException:
                self._close_file()
                raise

    @property
    def header(self) -> StreamHeader | None:
        return self._header

    @property
    def position(self) -> int:
        """Bytes written so far: the stream offset of the next record."""
        return self._position

    @property
    def blob_count(self) -> int:
        return self._count

    @property
    def closed(self) -> bool:
        return self._closed

    def _emit(self, parts: list[memoryview]) -> None:
        try:
            self._send(parts)
            if self._flush is not None:
                self._flush()
        except BaseException:
            self._failed = True  # part of a record may have gone out: the stream is cut here
            raise
        self._position += sum(len(p) for p in parts)

    def write(
        self,
        tensor: BlockPagedTensor,
        *,
        compression: Compression | str | None = None,
        checksum: bool = True,
    ) -> int:
        """Append one blob (options as for ``encode``); returns its length in bytes."""
        if self._closed or self._failed:
            raise InvalidStreamError(
                "write to a closed StreamWriter"
                if self._closed
                else "the stream is broken by an earlier failed write"
            )
        if not isinstance(tensor, BlockPagedTensor):
            raise ArgumentTypeError("expected a BlockPagedTensor", found=type(tensor).__name__)
        _check_against_header(self._header, tensor, f"blob {self._count}")
        parts = encode_parts(tensor, compression=compression, checksum=checksum)
        offset = self._position
        self._emit(parts)
        length = self._position - offset
        if self._entries is not None:
            self._entries.append(StreamEntry(offset, length, tensor.layer_index, tensor.kv_role))
        self._count += 1
        return length

    def close(self) -> None:
        """End the stream: write the end record (if promised) and flush; idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            if not self._failed and (self._header is None or self._header.end_record):
                self._emit([memoryview(_encode_end(self._entries, self._count))])
        finally:
            self._close_file()

    def abort(self) -> None:
        """Stop without an end record: a reader will see the stream as cut, not complete."""
        self._closed = True
        self._close_file()

    def _close_file(self) -> None:
        if self._file is not None:
            file, self._file = self._file, None
            file.close()

    def __enter__(self) -> StreamWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


# -- sources ---------------------------------------------------------------------------------
def _map(source: Any) -> tuple[memoryview, mmap.mmap | None]:
    """A read-only view of a file (mapped, never read) or of a bytes-like object."""
    if isinstance(source, (str, os.PathLike)):
        with open(source, "rb") as handle:
            if os.fstat(handle.fileno()).st_size == 0:
                return memoryview(b""), None
            mapping = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        return memoryview(mapping), mapping
    if isinstance(source, mmap.mmap):
        return byte_view(source), None
    return byte_view(source, "source"), None


def _will_need(mapping: mmap.mmap | None, start: int, length: int) -> None:
    """Ask the kernel to read a blob's pages ahead: it is about to be checked in full."""
    advice = getattr(mmap, "MADV_WILLNEED", None)
    if mapping is None or advice is None or length <= 0:
        return
    page = mmap.PAGESIZE
    first = start - start % page
    with contextlib.suppress(OSError, ValueError):  # advice only
        mapping.madvise(advice, first, min(length + start - first, len(mapping) - first))


class _MemorySource:
    """Records are slices of one read-only view (a mapped file): nothing is copied."""

    def __init__(self, view: memoryview, mapping: mmap.mmap | None) -> None:
        self.view = view
        self.mapping = mapping
        self.pos = 0

    def read(self, count: int) -> tuple[memoryview, BaseException | None]:
        chunk = self.view[self.pos : self.pos + count]
        self.pos += len(chunk)
        return chunk, None

    def read_record(self, prefix: memoryview, total: int) -> tuple[Any, int, BaseException | None]:
        start = self.pos - len(prefix)
        stop = min(start + total, len(self.view))
        _will_need(self.mapping, start, stop - start)
        self.pos = stop
        return self.view[start:stop], stop - start, None

    def close(self) -> None:
        self.view.release()
        if self.mapping is not None:
            with contextlib.suppress(BufferError):  # tensors still view it: unmapped later
                self.mapping.close()


class _IOSource:
    """Records are read into a new buffer each, exactly as long as the record."""

    def __init__(self, read_into: Callable[[memoryview], int | None]) -> None:
        self.read_into = read_into

    def _fill(self, view: memoryview) -> tuple[int, BaseException | None]:
        got = 0
        while got < len(view):
            try:
                count = self.read_into(view[got:])
            except (OSError, ValueError) as exc:  # reset, timeout, closed file: a cut
                return got, exc
            if count is None:
                raise ArgumentTypeError("non-blocking sources are not supported (no data ready)")
            if count == 0:
                break
            got += count
        return got, None

    def read(self, count: int) -> tuple[memoryview, BaseException | None]:
        buffer = memoryview(bytearray(count))
        got, cause = self._fill(buffer)
        return buffer[:got], cause

    def read_record(self, prefix: memoryview, total: int) -> tuple[Any, int, BaseException | None]:
        try:
            buffer = np.empty(total, np.uint8)
        except (MemoryError, ValueError):
            raise LimitExceededError("cannot allocate the record buffer", found=total) from None
        buffer[: len(prefix)] = np.frombuffer(prefix, np.uint8)
        got, cause = self._fill(memoryview(buffer.data)[len(prefix) :])  # one call per record
        return buffer, len(prefix) + got, cause

    def close(self) -> None:
        pass


def _source(source: Any) -> _MemorySource | _IOSource:
    if isinstance(source, (str, os.PathLike, mmap.mmap)):
        return _MemorySource(*_map(source))
    recv_into = getattr(source, "recv_into", None)
    if recv_into is not None:
        flags = getattr(socket, "MSG_WAITALL", 0)
        return _IOSource(lambda view: recv_into(view, len(view), flags))
    readinto = getattr(source, "readinto", None)
    if readinto is not None:
        return _IOSource(readinto)
    read = getattr(source, "read", None)
    if read is not None:

        def read_into(view: memoryview) -> int | None:
            data = read(min(len(view), _READ_CHUNK))
            if data is None:  # a non-blocking source with nothing ready
                return None
            try:
                view[: len(data)] = data
            except (TypeError, ValueError):
                raise ArgumentTypeError(
                    "source.read() must return bytes", found=type(data).__name__
                ) from None
            return len(data)

        return _IOSource(read_into)
    try:
        return _MemorySource(*_map(source))
    except ArgumentTypeError:
        raise ArgumentTypeError(
            "source must be a path, a bytes-like object, a binary file-like object or a socket",
            found=type(source).__name__,
        ) from None


# -- sequential reader -----------------------------------------------------------------------
class StreamReader:
    """Iterate the tensors of a stream as each blob arrives.

    ``source`` is a socket, a binary file-like object (file, pipe, ``BytesIO``), a path or
    a bytes-like object. Sockets and file-likes are read exactly record by record: each blob
    into a new buffer of its own (so every tensor handed out stays valid), nothing beyond
    the end record is consumed, and at most one record is in flight. Paths are mapped with
    ``mmap`` and bytes-like objects are used in place: their tensors are read-only zero-copy
    views.

    Iteration stops at the end record, or at a clean end of input on a record boundary when
    the stream did not promise an end record. Anything else raises a ``HurrayWireError``:
    a cut (``StreamTruncatedError``; inside a blob also a ``BlobTruncatedError``), a corrupt
    blob (the decoder's error), a record over ``max_blob_bytes`` (``LimitExceededError``,
    before allocating). After an error the reader raises the same error again.
    """

    def __init__(
        self,
        source: Any,
        *,
        verify: bool = True,
        limits: DecodeLimits | None = None,
        max_blob_bytes: int = DEFAULT_MAX_BLOB_BYTES,
    ) -> None:
        self._max = _check_max(max_blob_bytes)
        self._source = _source(source)
        self._verify = verify
        self._limits = limits
        self._position = 0
        self._pending: memoryview | None = None
        self._started = False
        self._header: StreamHeader | None = None
        self._seen: list[StreamEntry] = []
        self._complete = False
        self._done = False
        self._error: HurrayWireError | None = None

    # -- state -------------------------------------------------------------------------------
    @property
    def header(self) -> StreamHeader | None:
        """The stream header (read from the source on first access), or None if absent."""
        if not self._started:
            self._guarded(self._start)
        return self._header

    @property
    def complete(self) -> bool:
        """True once the end record has been read and agrees with the blobs read."""
        return self._complete

    @property
    def position(self) -> int:
        """Stream offset of the next record: bytes consumed so far."""
        return self._position

    @property
    def entries(self) -> tuple[StreamEntry, ...]:
        """Every blob read so far: where it was and what its descriptor says it is."""
        return tuple(self._seen)

    # -- iteration ---------------------------------------------------------------------------
    def __iter__(self) -> Iterator[BlockPagedTensor]:
        return self

    def __next__(self) -> BlockPagedTensor:
        if self._error is not None:
            raise self._error
        if self._done:
            raise StopIteration
        tensor: BlockPagedTensor | None = self._guarded(self._next_blob)
        if tensor is None:
            self._done = True
            raise StopIteration
        return tensor

    def _guarded(self, step: Callable[[], Any]) -> Any:
        try:
            return step()
        except HurrayWireError as exc:
            self._error = exc
            self._done = True
            raise

    def _start(self) -> None:
        self._started = True
        prefix = self._read_prefix()
        if bytes(prefix[:4]) == ws.STREAM_MAGIC:
            total = _record_length(prefix, ws.STREAM_MAGIC, "stream header", _SHEADER_MIN)
            _check_size(total, self._max, "stream header", 0)
            record = self._read_record(prefix, total, "stream header")
            self._header = decode_stream_header(record)
            self._position = total
        else:
            self._pending = prefix

    def _read_prefix(self) -> memoryview:
        """The next record's 16-byte prefix; empty at a clean end of input."""
        data, cause = self._source.read(BLOB_PREFIX_SIZE)
        if len(data) == BLOB_PREFIX_SIZE:
            return data
        at = self._position + len(data)
        if not data and cause is None:
            return data
        if not data:
            raise StreamTruncatedError(
                f"connection lost at a record boundary: {cause!r}", section="stream", offset=at
            ) from cause
        head = bytes(data[:4])
        kinds = [k for m, k in _MAGICS.items() if m.startswith(head)]
        kind = kinds[0] if len(kinds) == 1 else "record"
        if not kinds:
            raise InvalidStreamError(
                "not a stream record", section="stream", field="magic", offset=self._position,
                found=head.hex(" "),
            )  # fmt: skip
        error = StreamBlobTruncatedError if kind == "blob" else StreamTruncatedError
        raise error(
            f"stream ends inside a {kind} prefix" + (f" ({cause!r})" if cause else ""),
            section=kind,
            offset=at,
            expected=BLOB_PREFIX_SIZE,
            found=len(data),
        ) from cause

    def _read_record(self, prefix: memoryview, total: int, what: str) -> Any:
        buffer, got, cause = self._source.read_record(prefix, total)
        if got < total:
            error = StreamBlobTruncatedError if what.startswith("blob") else StreamTruncatedError
            reason = "connection lost" if cause is not None else "stream ends"
            raise error(
                f"{reason} inside {what} starting at stream offset {self._position}"
                + (f" ({cause!r})" if cause is not None else ""),
                section=what,
                offset=self._position + got,
                expected=total,
                found=got,
            ) from cause
        return buffer

    def _next_blob(self) -> BlockPagedTensor | None:
        if not self._started:
            self._start()
        if self._pending is not None:
            prefix, self._pending = self._pending, None
        else:
            prefix = self._read_prefix()
        if not prefix:
            if self._header is not None and self._header.end_record:
                raise StreamTruncatedError(
                    "stream ended before the end record its header promised",
                    section="stream",
                    offset=self._position,
                    found=f"{len(self._seen)} blobs",
                )
            return None
        magic = bytes(prefix[:4])
        number = len(self._seen)
        if magic == wb.BLOB_MAGIC:
            what = f"blob {number}"
            try:
                total = blob_length(prefix)
            except HurrayWireError as exc:
                _note(exc, f"in {what} at stream offset {self._position}")
                raise
            _check_size(total, self._max, what, self._position)
            record = self._read_record(prefix, total, what)
            try:
                tensor = decode(record, verify=self._verify, limits=self._limits)
            except HurrayWireError as exc:
                _note(exc, f"in {what} at stream offset {self._position}")
                raise
            _check_against_header(self._header, tensor, what)
            self._seen.append(
                StreamEntry(self._position, total, tensor.layer_index, tensor.kv_role)
            )
            self._position += total
            return tensor
        if magic == ws.END_MAGIC:
            total = _record_length(prefix, ws.END_MAGIC, "end record", _END_MIN)
            _check_size(total, self._max, "end record", self._position)
            record = self._read_record(prefix, total, "end record")
            count, entries = _decode_end(record)
            if count != len(self._seen) or (entries is not None and entries != tuple(self._seen)):
                raise InvalidStreamError(
                    "the end record disagrees with the blobs read",
                    section="end record",
                    offset=self._position,
                    expected=f"{len(self._seen)} blobs",
                    found=f"{count} blobs",
                )
            self._position += total
            self._complete = True
            return None
        if magic == ws.STREAM_MAGIC:
            raise InvalidStreamError(
                "a stream header may only open the stream",
                section="stream",
                offset=self._position,
            )
        raise InvalidStreamError(
            "not a stream record",
            section="stream",
            field="magic",
            offset=self._position,
            found=magic.hex(" "),
        )

    def close(self) -> None:
        """Release a mapped file (it stays mapped while tensors view it); sockets and file
        objects passed in are left open."""
        self._done = True
        self._source.close()

    def __enter__(self) -> StreamReader:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


# -- random access ---------------------------------------------------------------------------
def _peek_blob(view: memoryview, limits: DecodeLimits) -> tuple[int | None, str]:
    """(layer_index, kv_role) from a blob's checked header, without touching its sections."""
    descriptor = peek_descriptor(view, limits=limits)
    return descriptor.layout.layer_index, descriptor.layout.kv_role


class StreamFile:
    """Random access to a stream in a file (mapped with ``mmap``) or a bytes-like object.

    Opening reads the stream header and the index: the end record's (found from the last
    8 bytes of the file), or, without one, the walk of blob prefixes and headers. Neither
    touches page data. A tensor is decoded, and its checksums verified, only when asked
    for, as a read-only zero-copy view of the mapping. A damaged tail does not hide the
    blobs before it: they are in ``entries`` and ``error`` says what stopped the walk.
    """

    def __init__(
        self,
        source: Any,
        *,
        verify: bool = True,
        limits: DecodeLimits | None = None,
        max_blob_bytes: int = DEFAULT_MAX_BLOB_BYTES,
    ) -> None:
        self._max = _check_max(max_blob_bytes)
        self._verify = verify
        self._limits = limits if limits is not None else DecodeLimits()
        self._view, self._mapping = _map(source)
        self._header: StreamHeader | None = None
        start = 0
        try:
            if bytes(self._view[:4]) == ws.STREAM_MAGIC:
                start = _record_length(self._view, ws.STREAM_MAGIC, "stream header", _SHEADER_MIN)
                _check_size(start, self._max, "stream header", 0)
                self._header = decode_stream_header(self._view)
        except BaseException:
            self.close()
            raise
        self._error: HurrayWireError | None = None
        indexed = self._index_from_end(start)
        self._complete = indexed is not None
        self._entries = indexed if indexed is not None else self._walk(start)
        self._by_key = {(e.layer_index, e.kv_role): e for e in self._entries}

    @property
    def header(self) -> StreamHeader | None:
        return self._header

    @property
    def entries(self) -> tuple[StreamEntry, ...]:
        """Every blob found, in stream order (the last one wins for a repeated key)."""
        return self._entries

    @property
    def complete(self) -> bool:
        """True if the stream ends with a valid end record that agrees with its blobs."""
        return self._complete

    @property
    def error(self) -> HurrayWireError | None:
        """Why the walk stopped before the end of the stream, if it did."""
        return self._error

    @property
    def buffer(self) -> memoryview:
        """The whole stream, read-only (the mapping for a file)."""
        return self._view

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[BlockPagedTensor]:
        for entry in self._entries:
            yield self.read(entry)
        if self._error is not None:
            raise self._error

    def keys(self) -> Iterable[tuple[int | None, str]]:
        """The ``(layer_index, kv_role)`` pairs present."""
        return self._by_key.keys()

    def tensor(self, layer_index: int | None, kv_role: str = "key") -> BlockPagedTensor:
        """The blob for ``{kv_role, layer_index}``, decoded now (and only it)."""
        entry = self._by_key.get((layer_index, kv_role))
        if entry is None:
            if self._error is not None:  # it may be in the part that could not be read
                raise self._error
            raise MissingTensorError(
                "no blob for this layer and role in the stream",
                section="stream",
                found=f"layer_index {layer_index!r}, kv_role {kv_role!r}",
            )
        return self.read(entry)

    def read(self, entry: StreamEntry) -> BlockPagedTensor:
        """Decode the blob at ``entry`` and check it is what the index says."""
        what = f"blob at stream offset {entry.offset}"
        _will_need(self._mapping, entry.offset, entry.length)
        view = self._view[entry.offset : entry.offset + entry.length]
        try:
            if blob_length(view) != entry.length:
                raise InvalidStreamError(
                    "blob total_length differs from the index", section=what, found=entry.length
                )
            tensor = decode(view, verify=self._verify, limits=self._limits)
        except HurrayWireError as exc:
            _note(exc, f"in the {what}")
            raise
        if (tensor.layer_index, tensor.kv_role) != (entry.layer_index, entry.kv_role):
            raise InvalidStreamError(
                "blob descriptor disagrees with the index",
                section=what,
                expected=(entry.layer_index, entry.kv_role),
                found=(tensor.layer_index, tensor.kv_role),
            )
        _check_against_header(self._header, tensor, what)
        return tensor

    def _index_from_end(self, start: int) -> tuple[StreamEntry, ...] | None:
        """The end record's index if the stream ends with a valid, consistent one."""
        view = self._view
        size = len(view)
        if size - start < _END_MIN:
            return None
        total = _U64.unpack_from(view, size - 8)[0]
        if total % ws.RECORD_ALIGNMENT or not _END_MIN <= total <= min(size - start, self._max):
            return None
        end = size - total
        if bytes(view[end : end + 4]) != ws.END_MAGIC:
            return None
        try:
            _count, entries = _decode_end(view[end:])
        except HurrayWireError:
            return None  # the walk will meet this record and report what is wrong
        if entries is None:
            return None
        cursor = start
        for e in entries:
            if (
                e.offset != cursor
                or e.length % ws.RECORD_ALIGNMENT
                or not 64 <= e.length <= self._max
            ):
                return None
            cursor += e.length
        return entries if cursor == end else None

    def _walk(self, start: int) -> tuple[StreamEntry, ...]:
        """Frame every record from its prefix; read only blob headers and descriptors."""
        view = self._view
        entries: list[StreamEntry] = []
        pos = start
        try:
            while pos < len(view):
                head = bytes(view[pos : pos + 4])
                what = f"blob at stream offset {pos}"
                if head == ws.END_MAGIC:
                    total = _record_length(view[pos:], ws.END_MAGIC, "end record", _END_MIN)
                    _check_size(total, self._max, "end record", pos)
                    count, index = _decode_end(view[pos:])
                    if count != len(entries) or (index is not None and index != tuple(entries)):
                        raise InvalidStreamError(
                            "the end record disagrees with the blobs found",
                            section="end record",
                            offset=pos,
                            expected=f"{len(entries)} blobs",
                            found=f"{count} blobs",
                        )
                    if pos + total != len(view):
                        raise InvalidStreamError(
                            "bytes after the end record", section="stream", offset=pos + total
                        )
                    self._complete = True
                    return tuple(entries)
                if head != wb.BLOB_MAGIC:
                    if len(head) < 4 and any(m.startswith(head) for m in _MAGICS):
                        raise StreamTruncatedError(
                            "stream ends inside a record prefix", section="stream", offset=pos
                        )
                    raise InvalidStreamError(
                        "not a stream record here",
                        section="stream",
                        field="magic",
                        offset=pos,
                        found=head.hex(" "),
                    )
                try:
                    total = blob_length(view[pos : pos + BLOB_PREFIX_SIZE])
                except BlobTruncatedError:
                    raise StreamBlobTruncatedError(
                        "stream ends inside a blob prefix", section=what, offset=len(view)
                    ) from None
                _check_size(total, self._max, what, pos)
                if pos + total > len(view):
                    raise StreamBlobTruncatedError(
                        "stream ends inside a blob",
                        section=what,
                        offset=len(view),
                        expected=total,
                        found=len(view) - pos,
                    )
                try:
                    layer, role = _peek_blob(view[pos : pos + total], self._limits)
                except HurrayWireError as exc:
                    _note(exc, f"in the {what}")
                    raise
                entries.append(StreamEntry(pos, total, layer, role))
                pos += total
            if self._header is not None and self._header.end_record:
                raise StreamTruncatedError(
                    "stream ended before the end record its header promised",
                    section="stream",
                    offset=pos,
                )
        except HurrayWireError as exc:
            self._error = exc
        return tuple(entries)

    def close(self) -> None:
        """Drop the mapping (it stays mapped while tensors view it)."""
        self._view.release()
        if self._mapping is not None:
            with contextlib.suppress(BufferError):
                self._mapping.close()

    def __enter__(self) -> StreamFile:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
