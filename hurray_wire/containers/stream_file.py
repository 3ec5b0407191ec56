"""StreamFile: random access to a blob stream held in a file (mapped) or in memory
(docs/streaming.md § 5)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import numpy.typing as npt

from hurray_wire.blob import DecodeLimits, blob_length
from hurray_wire.blob.decoder import decode_options, landing_target, run
from hurray_wire.blob.limits import check_limits_argument
from hurray_wire.buffers import byte_view
from hurray_wire.containers.blob_stream import RecordReader
from hurray_wire.containers.io import ClosesOnExit, MemorySource, check_limit, open_memory
from hurray_wire.containers.records import (
    DEFAULT_MAX_BLOB_BYTES,
    END_RECORD_MIN,
    STREAM_HEADER_MIN,
    StreamEntry,
    StreamHeader,
    check_blob,
    check_header_fingerprint,
    decode_end_rows,
    empty_input_error,
    entries_of,
    locate,
)
from hurray_wire.containers.sniff import identify
from hurray_wire.errors import (
    ArgumentTypeError,
    HurrayWireError,
    InvalidStreamError,
    MissingTensorError,
    StreamTruncatedError,
    flag,
)
from hurray_wire.integrity import EngineFingerprint, PageStore, check_integrity_arguments
from hurray_wire.tensor import BlockPagedTensor
from hurray_wire.wire import blob as wb, stream as ws
from hurray_wire.wire.descriptor import KV_ROLES, LAYER_NONE

__all__ = ["StreamFile"]

_END_FOOTER = ws.FAST_END_FOOTER  # wire.records.END_RECORD's tail
_MAGIC_SIZE = len(wb.BLOB_MAGIC)


_OTHER_READERS = {
    "blob": "a single blob: use hurray_wire.decode",
    "descriptor": "a bare descriptor: use hurray_wire.decode_descriptor",
    "reference-stream": "a reference stream: use hurray_wire.containers.read_stream",
    "hrry-file": "a .hrry file: use HrryFile or read_file",
}


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
        self._limits = check_limits_argument(limits)
        self._options = decode_options(verify, self._limits, -1, page_store)
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
        self._entries: tuple[StreamEntry, ...] | None = None
        if self._rows is None:
            self._entries = self._walk(records)
        self._keyed: dict[tuple[int | None, str], StreamEntry] | None = None

    @property
    def entries(self) -> tuple[StreamEntry, ...]:
        """Every blob found, in stream order (the last one wins for a repeated key)."""
        if self._entries is None:
            assert self._rows is not None
            self._entries = entries_of(self._rows)
        return self._entries

    @property
    def _by_key(self) -> dict[tuple[int | None, str], StreamEntry]:
        if self._keyed is None:
            self._keyed = {(e.layer_index, e.kv_role): e for e in self.entries}
        return self._keyed

    @property
    def buffer(self) -> memoryview:
        """The whole stream, read-only (the mapping for a file)."""
        self._check_open()
        return self._view

    def __len__(self) -> int:
        return (
            len(self._rows)
            if self._entries is None and self._rows is not None
            else len(self.entries)
        )

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
        if self._keyed is not None or self._rows is None:
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
