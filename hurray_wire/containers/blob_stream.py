"""The blob stream (docs/streaming.md): many blobs over one byte stream, written and read in
order (``StreamWriter``, ``StreamReader``) or read at random from a file (``StreamFile``)."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterable, Iterator
from functools import cached_property
from typing import Any

import numpy as np
import numpy.typing as npt

from hurray_wire.blob import BLOB_PREFIX_SIZE, DecodeLimits, DecodeReport, blob_length, encode_parts
from hurray_wire.blob.decoder import decode_options, landing_target
from hurray_wire.blob.landing import peek_in_place
from hurray_wire.blob.pipeline import run
from hurray_wire.buffers import byte_view
from hurray_wire.codecs import Compression
from hurray_wire.containers.io import (
    DEFAULT_RECORD_DEADLINE,
    ClosesOnExit,
    MemorySource,
    Source,
    check_limit,
    open_memory,
    open_sink,
    open_source,
)
from hurray_wire.containers.records import (
    DEFAULT_MAX_BLOB_BYTES,
    END_RECORD_MIN,
    STREAM_HEADER_MIN,
    StreamEntry,
    StreamHeader,
    check_blob,
    check_end_record,
    check_header_fingerprint,
    check_record_size,
    decode_end_rows,
    decode_stream_header,
    empty_input_error,
    encode_end_record,
    encode_stream_header,
    entries_of,
    frame_record,
    locate,
    record_kind,
)
from hurray_wire.containers.sniff import identify
from hurray_wire.errors import (
    ArgumentTypeError,
    HurrayWireError,
    InvalidStreamError,
    MissingTensorError,
    StreamBlobTruncatedError,
    StreamTruncatedError,
    flag,
    instance,
)
from hurray_wire.integrity import DeltaPlan, EngineFingerprint, PageStore, check_integrity_arguments
from hurray_wire.integrity.digests import DigestArray
from hurray_wire.model.descriptor import TensorDescriptor
from hurray_wire.tensor import BlockPagedTensor
from hurray_wire.transforms.compact import referenced_pages
from hurray_wire.wire import blob as wb, stream as ws
from hurray_wire.wire.descriptor import KV_ROLES, LAYER_NONE

__all__ = ["RecordReader", "StreamFile", "StreamReader", "StreamWriter"]

#: ``StreamReader(into=...)``: (descriptor, pages the blob carries) -> where its pool lands
#: (``IntoArray``, ``IntoPages``, ``InPlace`` for those pages).
Into = Callable[[TensorDescriptor, int], object]

_MAGIC_SIZE = len(ws.STREAM_MAGIC)
_DEFAULT_HEADER = StreamHeader()  # frozen: one shared default is safe
_END_FOOTER = ws.FAST_END_FOOTER  # wire.records.END_RECORD's tail
_OTHER_READERS = {  # what StreamFile says of another format
    "blob": "a single blob: use hurray_wire.decode",
    "descriptor": "a bare descriptor: use hurray_wire.decode_descriptor",
    "reference-stream": "a reference stream: use hurray_wire.containers.read_stream",
    "hrry-file": "a .hrry file: use HrryFile or read_file",
}


# -- writer ----------------------------------------------------------------------------------
class StreamWriter(ClosesOnExit):
    """Write blobs one at a time to a socket, a binary file-like object or a file path.

    The stream header (unless ``header=None``) goes out at construction, so the reader can
    preallocate while the first layer is still being computed; each blob goes out as views
    of the tensor's own arrays (``sendmsg`` on sockets). ``close`` writes the end record
    (with the index unless ``index=False``); leaving a ``with`` block by an exception does
    not, so the reader sees a cut stream. A sink passed in is flushed, never closed; a path
    is written atomically: it appears at ``close`` and is left as it was otherwise.
    """

    def __init__(
        self, sink: Any, header: StreamHeader | None = _DEFAULT_HEADER, *, index: bool = True
    ) -> None:
        if header is not None and not isinstance(header, StreamHeader):
            raise ArgumentTypeError("header must be a StreamHeader or None", found=repr(header))
        self._sink = open_sink(sink)
        self.header = header
        self._entries: list[StreamEntry] | None = [] if index else None
        self.blob_count = 0
        self.position = 0  # bytes written so far: the stream offset of the next record
        self._closed = False
        self._failed = False
        if header is not None:
            try:
                self._emit([memoryview(encode_stream_header(header))])
            except BaseException:
                self.abort()
                raise

    def _emit(self, parts: list[memoryview]) -> None:
        try:
            written = self._sink.write(parts)
        except BaseException:
            self._failed = True  # part of a record may have gone out: the stream is cut here
            raise
        self.position += written

    def write(
        self,
        tensor: BlockPagedTensor,
        *,
        compression: Compression | str | None = None,
        checksum: bool = True,
        page_digests: bool | DigestArray = False,
        known_pages: Any = None,
        pages: str = "referenced",
    ) -> int:
        """Append one blob (options as for ``encode``); returns its length in bytes.

        ``pages="referenced"`` sends only the pages the block table names (``compact``), so
        a request's tensor over an engine's whole pool sends the request's pages; ``"all"``
        the pool as it is. ``known_pages``: the digests the receiver holds (docs/integrity.md
        § 5): those pages travel as references."""
        if self._closed or self._failed:
            raise InvalidStreamError(
                "write to a closed StreamWriter"
                if self._closed
                else "the stream is broken by an earlier failed write"
            )
        instance(tensor, BlockPagedTensor, "tensor")
        check_blob(None, self.header, tensor, f"blob {self.blob_count}")
        if not isinstance(known_pages, DeltaPlan):  # a plan is made for the tensor's pages
            tensor, _ = referenced_pages(tensor, pages)
        parts = encode_parts(
            tensor,
            compression=compression,
            checksum=checksum,
            page_digests=page_digests,
            known_pages=known_pages,
        )
        offset = self.position
        self._emit(parts)
        length = self.position - offset
        if self._entries is not None:
            self._entries.append(StreamEntry(offset, length, tensor.layer_index, tensor.kv_role))
        self.blob_count += 1
        return length

    def close(self) -> None:
        """End the stream: write the end record (if promised) and flush; idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            if not self._failed and (self.header is None or self.header.end_record):
                self._emit([memoryview(encode_end_record(self._entries, self.blob_count))])
        except BaseException:
            self._sink.close(abort=True)
            raise
        self._sink.close(abort=self._failed)  # a path is not left holding a cut stream

    def abort(self) -> None:
        """Stop without an end record: a reader of a sink will see the stream as cut, not
        complete; a path is removed (it never held a finished stream)."""
        self._closed = True
        self._sink.close(abort=True)

    def __del__(self) -> None:
        """A writer dropped unclosed wrote no end record (a path: no file at all): say so."""
        if vars(self).get("_closed", True):  # not set: the constructor refused
            return
        warnings.warn("StreamWriter was never closed: no end record was written, and a path "
                      "was left as it was (call close() or use `with`)", ResourceWarning,
                      stacklevel=2)  # fmt: skip
        with contextlib.suppress(Exception):
            self.abort()

    def __exit__(self, *exc_info: object) -> None:
        if exc_info[0] is None:
            self.close()
        else:
            self.abort()


class RecordReader:
    """The records of a blob stream framed in order (header, blobs, the end record checked
    against the blobs met): the one framing of ``StreamReader`` and ``StreamFile``."""

    def __init__(self, source: Source, max_blob_bytes: int, limits: DecodeLimits) -> None:
        self.source = source
        self.max_blob_bytes = max_blob_bytes
        self.limits = limits
        self.position = 0  # the stream offset of the next record
        self.header: StreamHeader | None = None
        self.seen: list[StreamEntry] = []  # the blobs accepted so far
        self.complete = False  # the end record was read and agrees
        self._pending: memoryview | None = None

    def read_header(self) -> StreamHeader | None:
        """The stream header, if the stream opens with one (else None)."""
        prefix = self._read_prefix()
        if bytes(prefix[:_MAGIC_SIZE]) == ws.STREAM_MAGIC:
            total = frame_record(prefix, "stream header", 0, self.max_blob_bytes, self.limits)
            record = self._read_record(prefix, total, "stream header")
            self.header = decode_stream_header(record, limits=self.limits)
            self.position = total
        else:
            self._pending = prefix
        return self.header

    def next_blob(self) -> tuple[Any, int, str] | None:
        """The next blob's bytes, its length and its name for errors; None at the end of the
        stream (after its end record, or where a stream without the promise of one ends)."""
        if self._pending is not None:
            prefix, self._pending = self._pending, None
        else:
            prefix = self._read_prefix()
        if not prefix:
            if self.position == 0 and self.header is None:
                raise empty_input_error()
            if self.header is not None and self.header.end_record:
                raise StreamTruncatedError(
                    "stream ended before the end record its header promised",
                    section="stream",
                    offset=self.position,
                    found=f"{len(self.seen)} blobs",
                )
            return None
        if record_kind(prefix, self.position) == "end record":
            total = frame_record(
                prefix, "end record", self.position, self.max_blob_bytes, self.limits
            )
            record = self._read_record(prefix, total, "end record")
            check_end_record(record, self.seen, self.position, self.limits)
            self.position += total
            self.complete = True
            return None
        what = f"blob {len(self.seen)}"
        try:
            total = blob_length(prefix)
            check_record_size(total, self.max_blob_bytes, what, self.position)
        except HurrayWireError as exc:
            locate(exc, len(self.seen), self.position, prefix)
            raise
        return self._read_record(prefix, total, what), total, what

    def accept(self, total: int, layer_index: int | None, kv_role: str) -> None:
        """The blob ``next_blob`` returned passed the reader's checks: record it."""
        self.seen.append(StreamEntry(self.position, total, layer_index, kv_role))
        self.position += total

    def _read_prefix(self) -> memoryview:
        """The next record's 16-byte prefix; empty at a clean end of input."""
        self.source.begin_record()  # its deadline covers the prefix and the rest
        data, cause = self.source.read(BLOB_PREFIX_SIZE)
        if data and len(data) < BLOB_PREFIX_SIZE:
            record_kind(data, self.position, cause)  # a prefix cut short: raises
        if not data and cause is not None:
            raise StreamTruncatedError(
                f"connection lost at a record boundary: {cause!r}",
                section="stream",
                offset=self.position,
            ) from cause
        return data

    def _read_record(self, prefix: memoryview, total: int, what: str) -> Any:
        buffer, got, cause = self.source.read_record(prefix, total)
        if got < total:
            blob = what.startswith("blob")
            error = StreamBlobTruncatedError if blob else StreamTruncatedError
            reason = "connection lost" if cause is not None else "stream ends"
            start = "" if blob else f" starting at stream offset {self.position}"  # or located
            cut = error(
                f"{reason} inside {what}{start}" + (f" ({cause!r})" if cause is not None else ""),
                section="stream" if blob else what,
                offset=self.position + got,
                expected=total,
                found=got,
            )
            if blob:  # its offset is the stream's already: the file offset of the cut
                cut.located(blob=len(self.seen), blob_offset=self.position,
                            file_offset=self.position + got)  # fmt: skip
            raise cut from cause
        return buffer


class StreamReader(ClosesOnExit):
    """Iterate the tensors of a stream as each blob arrives (docs/streaming.md).

    ``source``: a socket or binary file-like (read record by record, nothing past the end
    record consumed), a path (mapped and ``os.fstat``-checked, or read with ``mmap=False``)
    or a bytes-like object. A cut, a corrupt blob or a record over ``max_blob_bytes`` raises,
    and raises again after. ``into``: where each blob's pool lands, as ``decode(into=)``;
    ``page_store``, ``report`` and ``expect_fingerprint``: docs/integrity.md.
    """

    def __init__(
        self,
        source: Any,
        *,
        verify: bool = True,
        limits: DecodeLimits | None = None,
        max_blob_bytes: int = DEFAULT_MAX_BLOB_BYTES,
        page_store: PageStore | None = None,
        expect_fingerprint: EngineFingerprint | None = None,
        record_deadline: float | None = DEFAULT_RECORD_DEADLINE,
        mmap: bool = True,
        into: Into | None = None,
        report: bool = False,
    ) -> None:
        check_integrity_arguments(page_store, expect_fingerprint)
        self._report = flag(report, "report")
        #: ``report=True``: the DecodeReport of the last blob read (its failed
        #: pages by physical id and logical place, as ``decode_report``), else None.
        self.page_report: DecodeReport | None = None
        if into is not None and not callable(into):
            raise ArgumentTypeError(
                "into must be a callable (descriptor, pages) -> a landing target",
                field="into",
                found=type(into).__name__,
            )
        self._into = into
        self._expect = expect_fingerprint
        check_limit("max_blob_bytes", max_blob_bytes, STREAM_HEADER_MIN)
        self._options = decode_options(verify, limits, -1, page_store)
        flag(mmap, "mmap")
        source = open_source(source, record_deadline=record_deadline, use_mmap=mmap)
        self._records = RecordReader(source, max_blob_bytes, self._options.limits)
        self._started = False
        self._stop: BaseException | None = None  # what every later next() raises: end or error

    # -- state -------------------------------------------------------------------------------
    @property
    def header(self) -> StreamHeader | None:
        """The stream header (read from the source on first access), or None if absent."""
        if not self._started:
            self._check_open()
            self._guarded(self._start)
        return self._records.header

    @property
    def complete(self) -> bool:
        """True once the end record has been read and agrees with the blobs read."""
        return self._records.complete

    @property
    def position(self) -> int:
        """Stream offset of the next record: bytes consumed so far."""
        return self._records.position

    @property
    def entries(self) -> tuple[StreamEntry, ...]:
        """Every blob read so far: where it was and what its descriptor says it is."""
        return tuple(self._records.seen)

    # -- iteration ---------------------------------------------------------------------------
    def __iter__(self) -> Iterator[BlockPagedTensor]:
        return self

    def __next__(self) -> BlockPagedTensor:
        self._check_open()
        if self._stop is not None:
            raise self._stop
        tensor: BlockPagedTensor | None = self._guarded(self._next_blob)
        if tensor is None:
            self._stop = StopIteration()
            self._records.source.close()  # a path opened here is not held past its end
            raise StopIteration
        return tensor

    def _guarded(self, step: Callable[[], Any]) -> Any:
        try:
            return step()
        except HurrayWireError as exc:
            self._stop = exc
            self._records.source.close()  # nothing more is read: a path opened here is let go
            raise

    def _start(self) -> None:
        self._started = True
        header = self._records.read_header()
        check_header_fingerprint(self._expect, header)  # before any blob is read

    def _next_blob(self) -> BlockPagedTensor | None:
        """The next blob: framed, read whole, decoded, checked; None at the end."""
        if not self._started:
            self._start()
        framed = self._records.next_blob()
        if framed is None:
            return None
        record, total, what = framed
        header = self._records.header

        def accept(tensor: BlockPagedTensor) -> None:  # before anything lands
            check_blob(self._expect, header, tensor, what)

        try:
            view = byte_view(record)
            land: Callable[..., tuple[BlockPagedTensor, DecodeReport | None]] = run
            if self._into is not None:
                descriptor, pages = peek_in_place(view, limits=self._options.limits)
                land = landing_target(self._into(descriptor, pages)).land
            tensor, self.page_report = land(view, self._options, report=self._report, accept=accept)
        except HurrayWireError as exc:
            locate(exc, len(self._records.seen), self._records.position, record)
            raise
        self._records.accept(total, tensor.layer_index, tensor.kv_role)
        return tensor

    def close(self) -> None:
        """Release a mapped file (it stays mapped while tensors view it); sockets and file
        objects passed in are left open; idempotent."""
        self._closed = True
        self._records.source.close()


def _check_is_stream(view: memoryview) -> None:
    """Refuse at once what is no blob stream (empty, text, another format), saying what it
    is; a stream that starts well but is cut or damaged later opens, as before."""
    if not len(view):
        raise empty_input_error()
    head = bytes(view[:_MAGIC_SIZE])
    if head in (ws.STREAM_MAGIC, ws.END_MAGIC):
        return
    kind = str(identify(view))
    if head == wb.BLOB_MAGIC and kind in ("blob", "blob-stream", "unknown"):
        return  # a bare stream (header=None) starts with its first blob
    what = _OTHER_READERS.get(kind, f"no hurray-wire input (starts with {head.hex(' ')})")
    raise InvalidStreamError(f"not a blob stream: {what}", section="stream", offset=0,
                             found=kind)  # fmt: skip


class StreamFile(ClosesOnExit):
    """Random access to a stream in a file (mapped with ``mmap``) or a bytes-like object.

    Opening reads the stream header and the index (the end record's, else the walk of blob
    prefixes), never page data: a tensor is decoded and verified only when asked for. A
    damaged tail does not hide the blobs before it (``error`` says what stopped the walk).
    A mapped file is ``os.fstat``-checked before each ``read`` (a truncated one raises
    ``StreamTruncatedError``, not SIGBUS); ``mmap=False`` reads it into memory.
    """

    def __init__(
        self,
        source: Any,
        *,
        verify: bool = True,
        limits: DecodeLimits | None = None,
        max_blob_bytes: int = DEFAULT_MAX_BLOB_BYTES,
        mmap: bool = True,
        page_store: PageStore | None = None,
        expect_fingerprint: EngineFingerprint | None = None,
    ) -> None:
        check_integrity_arguments(page_store, expect_fingerprint)
        self._expect = expect_fingerprint
        check_limit("max_blob_bytes", max_blob_bytes, STREAM_HEADER_MIN)
        self._max = max_blob_bytes
        self._options = decode_options(verify, limits, -1, page_store)
        self._limits = self._options.limits
        flag(mmap, "mmap")
        self._source = open_memory(source, use_mmap=mmap)
        self._view = self._source.view
        # the walk frames the view as StreamReader does (no mapping: page data stays unread)
        records = RecordReader(MemorySource(self._view[:]), self._max, self._limits)
        try:
            _check_is_stream(self._view)
            self.header: StreamHeader | None = records.read_header()
            check_header_fingerprint(self._expect, self.header)
        except BaseException:
            self.close()
            raise
        self.error: HurrayWireError | None = None  # why the walk stopped short, if it did
        # The end record's index stays a checked structured array until entries are asked
        # for: opening a stream of a million blobs builds no object per blob, and tensor()
        # finds its blob in the array.
        self._rows = self._index_from_end(records.position)
        #: True if the stream ends with a valid end record that agrees with its blobs.
        self.complete = self._rows is not None
        if self._rows is None:
            self.entries = self._walk(records)

    @cached_property
    def entries(self) -> tuple[StreamEntry, ...]:
        """Every blob found, in stream order (the last one wins for a repeated key)."""
        assert self._rows is not None  # else the walk's entries were set at opening
        return entries_of(self._rows)

    @cached_property
    def _by_key(self) -> dict[tuple[int | None, str], StreamEntry]:
        return {(e.layer_index, e.kv_role): e for e in self.entries}

    @property
    def buffer(self) -> memoryview:
        """The whole stream, read-only (the mapping for a file)."""
        self._check_open()
        return self._view

    def __len__(self) -> int:
        return len(self.entries if self._rows is None else self._rows)

    def __iter__(self) -> Iterator[BlockPagedTensor]:
        for entry in self.entries:
            yield self.read(entry)
        if self.error is not None:
            raise self.error

    def keys(self) -> Iterable[tuple[int | None, str]]:
        """The ``(layer_index, kv_role)`` pairs present."""
        return self._by_key.keys()

    def tensor(
        self,
        layer_index: int | None,
        kv_role: str | None = None,
        *,
        into: object = None,
    ) -> BlockPagedTensor:
        """The blob for ``{kv_role, layer_index}``, decoded now, landing ``into`` as
        :meth:`read`'s; ``kv_role`` may be left out only when the layer has one role."""
        if layer_index is not None and (
            isinstance(layer_index, bool) or not isinstance(layer_index, int)
        ):
            raise ArgumentTypeError(
                "layer_index must be an int or None", field="layer_index", found=repr(layer_index)
            )
        if kv_role is None:
            roles = sorted({e.kv_role for e in self.entries if e.layer_index == layer_index})
            if len(roles) > 1:
                raise ArgumentTypeError(f"layer {layer_index} has roles {roles}: pass kv_role",
                                        field="kv_role", found=None)  # fmt: skip
            kv_role = roles[0] if roles else "key"
        if not isinstance(kv_role, str):
            raise ArgumentTypeError("kv_role must be a str", field="kv_role", found=repr(kv_role))
        entry = self._find(layer_index, kv_role)
        if entry is None:
            if self.error is not None:  # it may be in the part that could not be read
                raise self.error
            raise MissingTensorError(
                "no blob for this layer and role in the stream",
                section="stream",
                found=f"layer_index {layer_index!r}, kv_role {kv_role!r}",
            )
        return self.read(entry, into=into)

    def _find(self, layer_index: int | None, kv_role: str) -> StreamEntry | None:
        """The last blob of that key: from the dict once built, else from the index rows."""
        if "_by_key" in vars(self) or self._rows is None:
            return self._by_key.get((layer_index, kv_role))
        layer = LAYER_NONE if layer_index is None else layer_index
        role = KV_ROLES.get(kv_role)
        if role is None or not 0 <= layer <= LAYER_NONE:
            return None
        rows = self._rows
        hits = np.flatnonzero((rows["layer_index"] == layer) & (rows["kv_role"] == role))
        if not hits.size:
            return None
        return entries_of(rows[hits[-1:]])[0]

    def read(self, entry: StreamEntry, *, into: object = None) -> BlockPagedTensor:
        """Decode the blob at ``entry`` and check it is what the index says; ``into``: where
        its pool lands, as :func:`decode` lands it."""
        what = f"blob at stream offset {entry.offset}"
        self._check_open()
        self._source.require(entry.offset + entry.length, StreamTruncatedError, what)
        self._source.will_need(entry.offset, entry.length)
        view = self._view[entry.offset : entry.offset + entry.length]

        def accept(tensor: BlockPagedTensor) -> None:  # before anything lands
            check_blob(self._expect, self.header, tensor, what)
            if (tensor.layer_index, tensor.kv_role) != (entry.layer_index, entry.kv_role):
                raise InvalidStreamError(
                    "blob descriptor disagrees with the index",
                    section=what,
                    expected=(entry.layer_index, entry.kv_role),
                    found=(tensor.layer_index, tensor.kv_role),
                )

        try:
            if blob_length(view) != entry.length:
                raise InvalidStreamError(
                    "blob total_length differs from the index", section=what, found=entry.length
                )
            if into is None:
                return run(byte_view(view), self._options, accept=accept)[0]
            return landing_target(into).land(byte_view(view), self._options, accept=accept)[0]
        except HurrayWireError as exc:
            number = next((n for n, e in enumerate(self.entries) if e.offset == entry.offset), -1)
            locate(exc, number, entry.offset, layer=entry.layer_index, role=entry.kv_role)
            raise

    def _index_from_end(self, start: int) -> npt.NDArray[Any] | None:
        """The end record's index rows if the stream ends with a valid, consistent one (the
        footer's total_length finds it; a bad one is left for the walk to report)."""
        view, size = self._view, len(self._view)
        if size - start < END_RECORD_MIN:
            return None
        footer = _END_FOOTER.unpack_dict(view, size - _END_FOOTER.size)
        total = footer["total_length"]
        if not END_RECORD_MIN <= total <= min(size - start, self._max):
            return None
        end = size - total
        try:
            _count, rows = decode_end_rows(view[end:], limits=self._limits)
        except HurrayWireError:
            return None
        if rows is None:
            return None
        # the index must tile [start, end) with blobs of aligned, bounded lengths: checked
        # as arrays, so a bogus index costs no object per entry
        offsets = rows["offset"].astype(np.uint64)
        lengths = rows["length"].astype(np.uint64)
        starts = np.concatenate((np.array([start], np.uint64), offsets + lengths))
        if not (
            np.array_equal(starts, np.append(offsets, np.uint64(end)))
            and (lengths % ws.RECORD_ALIGNMENT == 0).all()
            and ((lengths >= wb.BLOB_ALIGNMENT) & (lengths <= self._max)).all()
        ):
            return None
        kept: npt.NDArray[Any] = rows.copy()  # a copy: later use never touches the mapping
        return kept

    def _walk(self, records: RecordReader) -> tuple[StreamEntry, ...]:
        """Frame every record from its prefix (reading only blob headers and descriptors) up
        to the end record or the first that cannot be framed, its reason kept in ``error``."""
        try:
            while (framed := records.next_blob()) is not None:
                record, total, _ = framed
                try:
                    layout = self._options.peek_descriptor(record).layout
                except HurrayWireError as exc:
                    locate(exc, len(records.seen), records.position, record)
                    raise
                records.accept(total, layout.layer_index, layout.kv_role)
            if records.complete and records.position != len(self._view):
                raise InvalidStreamError(
                    "bytes after the end record", section="stream", offset=records.position
                )
        except HurrayWireError as exc:
            self.error = exc
        self.complete = records.complete and self.error is None
        return tuple(records.seen)

    def close(self) -> None:
        """Drop the mapping (it stays mapped while tensors view it); idempotent."""
        self._closed = True
        self._source.close()
