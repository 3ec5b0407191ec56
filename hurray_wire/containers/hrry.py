"""``.hrry`` files (containers.md Part B): ``HrryFile``, a lazy, memory-mapped reader (opening
runs § B.8 steps 1-5, ``parse_*``; a tensor's step 6 runs only when it is asked for), and
``write_file``, byte for byte as the reference ``FileWriter`` writes (§ B.3-B.7).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from hurray_wire.buffers import align, byte_view
from hurray_wire.containers.atomic import atomic_output
from hurray_wire.containers.io import ClosesOnExit, MemorySource, check_limit, open_memory
from hurray_wire.containers.reference_stream import (
    DEFAULT_MAX_DESCRIPTOR_BYTES,
    METADATA_KEY_PREFIX,
    MIN_DESCRIPTOR_LENGTH,
    RESERVED_PREFIXES,
    SEQ_LENS_KEY_PREFIX,
    container_error,
    tensor_pieces,
)
from hurray_wire.crc32c import crc32c
from hurray_wire.errors import (
    ArgumentTypeError,
    ContainerTruncatedError,
    HurrayWireError,
    InvalidContainerError,
    InvalidMetadataError,
    MissingTensorError,
    flag,
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
    peek_descriptor_length,
)
from hurray_wire.tensor import SEQ_LENS, BlockPagedTensor, assemble
from hurray_wire.wire import containers as wc, descriptor as wd, records as wr

_T = TypeVar("_T")

_HEADER = wr.HRRY_HEADER.raising(InvalidContainerError, ContainerTruncatedError)
_TRAILER = wr.HRRY_TRAILER.raising(InvalidContainerError, ContainerTruncatedError)
HEADER = _HEADER.head
TRAILER = _TRAILER.head
COUNT = wc.FAST_HRRY_INDEX_COUNT  # entry_count
ENTRY_FIXED = wc.FAST_HRRY_INDEX_ENTRY_FIXED
NAME_LENGTH = wc.FAST_HRRY_NAME_LENGTH
_MIN_ENTRY = NAME_LENGTH.size + 1 + ENTRY_FIXED.size  # a one-byte name
#: The header's magic, major version and reserved bytes, checked in this order.
_HEADER_FIXED = (
    ("magic", wc.FILE_MAGIC, "bad file magic"),
    ("container_version_major", 1, "unsupported container major version"),
    *((HEADER.names[at], zero, "reserved header bytes must be zero")
      for at, zero in HEADER.consts if at),
)  # fmt: skip
#: The trailer's magic first (a cut file or no .hrry file), then its reserved bytes.
_TRAILER_FIXED = tuple(
    (name, value, "bad trailer magic (file truncated or not a .hrry file)" if name == "magic"
     else "reserved trailer bytes must be zero")
    for name, value in sorted(((TRAILER.names[at], v) for at, v in TRAILER.consts),
                              key=lambda f: f[0] != "magic")
)  # fmt: skip


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


def _invalid(
    message: str, section: str, field: str | None, at: int | None = None, **kw: Any
) -> InvalidContainerError:
    return InvalidContainerError(message, section=section, field=field, offset=at, **kw)


def check_alignment(value: object, offset: int | None = None) -> None:
    """§ B.2: data_buffer_alignment is a power of two in 4096 .. 2 MiB."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or not wc.MIN_DATA_BUFFER_ALIGNMENT <= value <= wc.MAX_DATA_BUFFER_ALIGNMENT
        or value & (value - 1)
    ):
        raise InvalidContainerError(
            "data_buffer_alignment must be a power of two in 4096..2 MiB",
            section="header",
            field="data_buffer_alignment",
            offset=offset,
            found=repr(value),
        )


# -- § B.8 step 1: the header ----------------------------------------------------------------
def parse_header(buf: Any, size: int) -> FileHeader:
    """Room for a header and a trailer, then the 64-byte header, every field checked (★
    rules included)."""
    if size < wc.MIN_FILE_SIZE:
        raise ContainerTruncatedError(
            "empty input (0 bytes)" if size == 0 else "file shorter than a header and a trailer",
            section="file",
            offset=size,
            expected=f">= {wc.MIN_FILE_SIZE} bytes",
            found=f"{size} bytes",
        )
    fields = _HEADER.read_head(buf, _HEADER_FIXED)
    flags, first = fields["file_flags"], fields["first_descriptor_offset"]
    if flags & ~wc.FILE_FLAGS_KNOWN:
        raise _HEADER.error("file_flags", "reserved file_flags bits set", found=f"0x{flags:08X}")
    check_alignment(fields["data_buffer_alignment"], HEADER.offsets["data_buffer_alignment"])
    if first < wc.HEADER_SIZE or first % wc.SECTION_ALIGNMENT or first > size - wc.TRAILER_SIZE:
        raise _HEADER.error(
            "first_descriptor_offset",
            "first_descriptor_offset must be >= 64, 8-aligned and inside the file",
            found=first,
        )
    return FileHeader(
        (fields["container_version_major"], fields["container_version_minor"]),
        flags,
        fields["data_buffer_alignment"],
        first,
        fields["tensor_count_hint"],
    )


# -- § B.8 steps 2-3: the trailer ------------------------------------------------------------
def parse_trailer(buf: Any, size: int, header: FileHeader) -> FileTrailer:
    """The trailer (magic checked before any field is trusted), its bounds, the index CRC."""
    at = size - wc.TRAILER_SIZE
    fields = _TRAILER.read_head(buf, _TRAILER_FIXED, at=at)
    names = ("index_offset", "index_length", "kv_offset", "kv_length", "index_crc32c")
    index_offset, index_length, kv_offset, kv_length, crc = map(fields.__getitem__, names)
    refuse = functools.partial(_TRAILER.error, base=at)  # naming a trailer field
    index = f"offset {index_offset}, length {index_length}"
    kv = f"offset {kv_offset}, length {kv_length}"
    if (
        index_offset < wc.HEADER_SIZE
        or index_length < COUNT.size
        or index_offset + index_length > at
    ):
        bounds = f"{wc.HEADER_SIZE} <= index_offset, {COUNT.size} <= index_length, end <= {at}"
        raise refuse("index_offset", "index outside the file body", expected=bounds, found=index)
    has_kv = header.has_kv_metadata_flag
    if (kv_offset == 0) != (kv_length == 0) or (has_kv and kv_length == 0):
        message = "kv_offset and kv_length must both be 0 (no KV section) or both be set"
        message += ", and HAS_KV_METADATA needs a section" if has_kv else ""
        raise refuse("kv_offset", message, found=kv)
    if kv_length and (kv_offset < wc.HEADER_SIZE or kv_offset + kv_length > at):
        bounds = f"{wc.HEADER_SIZE} <= kv_offset, end <= {at}"
        raise refuse("kv_offset", "KV section outside the file body", expected=bounds, found=kv)
    if header.has_index_crc32c:
        computed = crc32c(np.frombuffer(buf, np.uint8, index_length, index_offset))
        if computed != crc:
            expected, found = f"0x{computed:08X}", f"0x{crc:08X}"
            raise refuse("index_crc32c", "index CRC-32C mismatch", expected=expected, found=found)
    elif crc != 0:
        message = "index_crc32c must be 0 when HAS_INDEX_CRC32C is clear ([A21])"
        raise refuse("index_crc32c", message, found=f"0x{crc:08X}")
    return FileTrailer(index_offset, index_length, kv_offset, kv_length, crc)


# -- § B.8 step 4: the index -----------------------------------------------------------------
def parse_index(buf: Any, header: FileHeader, trailer: FileTrailer) -> tuple[IndexEntry, ...]:
    """Every index entry, no bytes left over, sorted if SORTED_INDEX says so."""
    start = trailer.index_offset
    end = start + trailer.index_length

    def refuse(message: str, field: str | None, at: int, **kw: Any) -> InvalidContainerError:
        return InvalidContainerError(message, section="index", field=field, offset=at, **kw)

    count = COUNT.struct.unpack_from(buf, start)[0]
    room = (end - start - COUNT.size) // _MIN_ENTRY
    if count > room:
        message = "entry_count larger than the index can hold"
        raise refuse(message, "entry_count", start, expected=f"<= {room}", found=count)
    pos = start + COUNT.size
    entries: list[IndexEntry] = []
    names: dict[bytes, None] = {}  # the raw names, in index order
    for number in range(count):
        where = f"entries[{number}]"
        at_name = pos + NAME_LENGTH.size
        name_length = NAME_LENGTH.struct.unpack_from(buf, pos)[0] if at_name <= end else -1
        if name_length == 0:
            raise refuse("empty tensor name", f"{where}.name_length", pos)
        fixed = at_name + name_length
        if name_length < 0 or fixed + ENTRY_FIXED.size > end:
            short = "index_length ends inside an entry"
            raise refuse(short, where, pos, expected="a whole entry", found=f"{end - pos} bytes")
        raw = bytes(buf[at_name:fixed])
        try:
            name = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            message = "tensor name is not valid UTF-8"
            raise refuse(message, f"{where}.name", at_name + exc.start) from None
        if raw in names:
            raise refuse("duplicate tensor name", f"{where}.name", at_name, found=repr(name))
        names[raw] = None
        d_off, d_len, data_off, data_len, flags = ENTRY_FIXED.struct.unpack_from(buf, fixed)
        if flags:
            at_flags = fixed + ENTRY_FIXED.offsets["flags"]
            raise refuse("index entry flags must be 0", f"{where}.flags", at_flags, found=flags)
        entries.append(IndexEntry(name, d_off, d_len, data_off, data_len))
        pos = fixed + ENTRY_FIXED.size
    if pos != end:
        message = "bytes left over after the last index entry"
        raise refuse(message, None, pos, expected=f"index end at {end}", found=f"{end - pos} bytes")
    if header.sorted_index and list(names) != sorted(names):
        message = "SORTED_INDEX is set but the entries are not sorted by name bytes"
        raise refuse(message, None, start)
    return tuple(entries)


# -- § B.8 step 5: the KV section ------------------------------------------------------------
def parse_kv(buf: Any, trailer: FileTrailer) -> dict[str, MetadataValue]:
    """The KV metadata section, if the trailer locates one."""
    if not trailer.kv_length:
        return {}
    raw = bytes(buf[trailer.kv_offset : trailer.kv_offset + trailer.kv_length])
    try:
        return decode_metadata(raw, base_offset=trailer.kv_offset)
    except HurrayWireError as exc:
        raise container_error(exc, "kv_metadata", exc.offset) from exc


class HrryFile(ClosesOnExit):
    """A lazy, memory-mapped ``.hrry`` reader: ``with HrryFile(path) as f: f.tensor(name)``.

    Opening checks the header, trailer, index and KV section and nothing else, so a file's
    other tensors are never read. Arrays are read-only views of the map (kept alive past
    ``close()``); ``tensor`` first checks (``os.fstat``) that the file still holds its bytes
    (``ContainerTruncatedError``, not SIGBUS); ``mmap=False`` reads the file into memory.
    """

    _section = "file"

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        max_descriptor_length: int = DEFAULT_MAX_DESCRIPTOR_BYTES,
        mmap: bool = True,
    ) -> None:
        check_limit("max_descriptor_length", max_descriptor_length, MIN_DESCRIPTOR_LENGTH)
        if not isinstance(path, (str, os.PathLike)):
            raise ArgumentTypeError(
                "path must be a str or os.PathLike (HrryFile.from_buffer reads bytes)",
                field="path",
                found=type(path).__name__,
            )
        flag(mmap, "mmap")
        self._init(open_memory(path, use_mmap=mmap), max_descriptor_length)

    @classmethod
    def from_buffer(
        cls, data: Any, *, max_descriptor_length: int = DEFAULT_MAX_DESCRIPTOR_BYTES
    ) -> HrryFile:
        """Read a ``.hrry`` image held in memory (arrays are then views of ``data``)."""
        check_limit("max_descriptor_length", max_descriptor_length, MIN_DESCRIPTOR_LENGTH)
        self = cls.__new__(cls)
        self._init(MemorySource(byte_view(data, "data")), max_descriptor_length)
        return self

    def _init(self, source: MemorySource, max_descriptor_length: int) -> None:
        self._source = source
        self._buf: Any = source.view[:]  # arrays view this slice: it outlives close()
        self._readonly = source.view.readonly  # arrays are read-only exactly when the input is
        self._size = size = len(source.view)
        self._max_descriptor = max_descriptor_length
        self._descriptors: dict[str, TensorDescriptor] = {}
        try:
            self.header: FileHeader = parse_header(self._buf, size)
            self.trailer: FileTrailer = parse_trailer(self._buf, size, self.header)
            self.entries: tuple[IndexEntry, ...] = parse_index(self._buf, self.header, self.trailer)
            self.metadata: dict[str, MetadataValue] = parse_kv(self._buf, self.trailer)
        except BaseException:
            self.close()
            raise
        self._by_name = {entry.name: entry for entry in self.entries}

    # -- public, per tensor -----------------------------------------------------------------
    @property
    def names(self) -> tuple[str, ...]:
        """Tensor names in index order (sorted when the index is)."""
        return tuple(entry.name for entry in self.entries)

    @property
    def user_metadata(self) -> dict[str, MetadataValue]:
        """The KV entries without the reserved ``hurray.seq_lens.`` / ``hurray.metadata.`` keys."""
        return {k: v for k, v in self.metadata.items() if not k.startswith(RESERVED_PREFIXES)}

    def entry(self, name: str) -> IndexEntry:
        self._check_open()
        try:
            return self._by_name[name]
        except (KeyError, TypeError):
            raise MissingTensorError(
                "no tensor of this name in the file", section="index", found=repr(name)
            ) from None

    def _decoded(self, name: str, decode: Callable[[bytes], _T]) -> _T:
        """``decode`` of ``name``'s descriptor after the § B.8 step-6 placement and length
        checks, its errors placed in the file."""
        entry = self.entry(name)
        offset, length = entry.descriptor_offset, entry.descriptor_length
        section, body_end = f"tensor {name!r}", self._size - wc.TRAILER_SIZE
        if offset % wc.SECTION_ALIGNMENT or offset < self.header.first_descriptor_offset:
            message = "descriptor_offset must be 8-aligned and not before first_descriptor_offset"
            raise _invalid(message, section, "descriptor_offset", found=offset)
        if not MIN_DESCRIPTOR_LENGTH <= length <= self._max_descriptor:
            limits = f"{MIN_DESCRIPTOR_LENGTH}..{self._max_descriptor}"
            message = "index descriptor_length out of range"
            raise _invalid(message, section, "descriptor_length", expected=limits, found=length)
        if offset + length > body_end:
            message, found = "descriptor extends past the file body", f"end {offset + length}"
            ends = f"end <= {body_end}"
            raise _invalid(
                message, section, "descriptor_offset", offset, expected=ends, found=found
            )
        self._source.require(offset + length, ContainerTruncatedError, "file")  # else SIGBUS
        raw = bytes(self._buf[offset : offset + length])
        try:
            own = peek_descriptor_length(raw)
            if own == length:
                return decode(raw)
        except HurrayWireError as exc:
            at = None if exc.offset is None else offset + exc.offset
            raise container_error(exc, section, at) from exc
        message = "index descriptor_length differs from the descriptor's own"
        at = offset + wd.AT["descriptor_length"]
        raise _invalid(message, section, "descriptor_length", at, expected=length, found=own)

    def descriptor_header(self, name: str) -> DescriptorHeader:
        """The common header of ``name``'s descriptor, whatever its layout (for listing)."""
        return self._decoded(name, decode_header)

    def descriptor(self, name: str) -> TensorDescriptor:
        """``name``'s block-paged descriptor (``UnsupportedLayoutError`` for another layout)."""
        self._check_open()
        cached = self._descriptors.get(name)
        if cached is None:
            cached = self._descriptors[name] = self._decoded(name, decode_descriptor)
        return cached

    def buffer_spans(self, name: str) -> tuple[tuple[int, int], ...]:
        """``(offset, byte_size)`` of each of ``name``'s buffers in the file, checked (§ B.3)."""
        entry = self.entry(name)
        descriptor = self.descriptor(name)
        section, start = f"tensor {name!r}", entry.data_offset
        alignment = self.header.data_buffer_alignment
        if start % alignment:
            message = "data_offset must be a multiple of data_buffer_alignment"
            raise _invalid(
                message, section, "data_offset", expected=f"multiple of {alignment}", found=start
            )
        descriptor_end = entry.descriptor_offset + entry.descriptor_length
        if start < descriptor_end:
            message = "tensor data must follow its descriptor"
            raise _invalid(
                message, section, "data_offset", expected=f">= {descriptor_end}", found=start
            )
        spans = []
        pos = start
        for number, handle in enumerate(descriptor.buffers):
            if number:
                pos = align(pos, alignment)
            spans.append((pos, handle.byte_size))
            pos += handle.byte_size
        if pos - start != entry.data_length:
            message = "data_length disagrees with the buffers and their alignment padding"
            raise _invalid(
                message, section, "data_length", expected=pos - start, found=entry.data_length
            )
        body_end = self._size - wc.TRAILER_SIZE
        if pos > body_end:
            raise ContainerTruncatedError(
                "tensor data extends past the file body",
                section=section,
                field="data_offset",
                offset=body_end,
                expected=f"data end {pos}",
                found=f"file body ends at {body_end}",
            )
        return tuple(spans)

    def tensor(self, name: str) -> BlockPagedTensor:
        """``name`` as a tensor viewing the file, with ``seq_lens`` and ``metadata`` from their
        reserved KV keys."""
        spans = self.buffer_spans(name)  # the file open, the tensor's entry found
        descriptor = self.descriptor(name)
        needed = max((at + size for at, size in spans), default=0)
        self._source.require(needed, ContainerTruncatedError, f"tensor {name!r}")  # else SIGBUS
        buffers = [np.frombuffer(self._buf, np.uint8, size, at) for at, size in spans]
        seq_lens = self._reserved(SEQ_LENS_KEY_PREFIX + name, "seq_lens must be an array of uint64")
        if seq_lens is not None:  # assemble checks it against the tensor
            seq_lens = np.array([int(v) for v in seq_lens], dtype=SEQ_LENS)
            seq_lens.flags.writeable = not self._readonly  # the rule of every decoded array
        packed = self._reserved(
            METADATA_KEY_PREFIX + name, "tensor metadata must be bytes holding a KV section"
        )
        try:
            metadata = {} if packed is None else dict(decode_metadata(packed))
        except HurrayWireError as exc:
            raise container_error(exc, "kv_metadata", None) from exc
        try:
            return assemble(descriptor, buffers, seq_lens, metadata)
        except HurrayWireError as exc:
            if exc.field == "seq_lens":  # the reserved KV key disagrees with the tensor
                raise container_error(exc, "kv_metadata", None) from exc
            section = f"tensor {name!r}"
            raise container_error(exc, section, self.entry(name).data_offset) from exc

    def tensors(self, names: Iterable[str] | None = None) -> dict[str, BlockPagedTensor]:
        """Several tensors by name (all, in index order, by default); a single str is refused
        (iterating it would look up each of its characters)."""
        if names is None:
            return {name: self.tensor(name) for name in self.names}
        if isinstance(names, (str, bytes)) or not isinstance(names, Iterable):
            raise ArgumentTypeError(
                "names must be a sequence of tensor names (wrap a single name in a list)",
                field="names",
                expected="a list or tuple of str",
                found=repr(names),
            )
        wanted = list(names)
        for position, name in enumerate(wanted):
            if not isinstance(name, str):
                raise ArgumentTypeError(
                    "tensor names must be str",
                    field=f"names[{position}]",
                    expected="str",
                    found=repr(name),
                )
        return {name: self.tensor(name) for name in wanted}

    def _reserved(self, key: str, message: str) -> Any:
        """A tensor's reserved KV entry, if any: seq_lens as uint64 values, metadata as bytes."""
        value = self.metadata.get(key)
        if key.startswith(SEQ_LENS_KEY_PREFIX):
            ok = isinstance(value, list) and all(isinstance(v, UInt64) for v in value)
        else:
            ok = isinstance(value, bytes)
        if value is None or ok:
            return value
        raise InvalidContainerError(
            message, section="kv_metadata", field=key, found=type(value).__name__
        )

    # -- lifetime ---------------------------------------------------------------------------
    def close(self) -> None:
        """Unmap the file; arrays still alive keep the map until they are gone."""
        if self._closed:
            return
        self._closed = True
        self._buf = None  # views still exported keep the map until the last array is gone
        self._source.close()

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
    """The tensors of a ``.hrry`` file (all, or ``names``) as zero-copy views of its map (one
    of another layout raises ``UnsupportedLayoutError`` only if it is asked for)."""
    with HrryFile(path) as hrry:
        return hrry.tensors(names)


def read_file_metadata(path: str | os.PathLike[str]) -> dict[str, MetadataValue]:
    """All KV metadata of a ``.hrry`` file, reserved keys included, without reading tensors."""
    with HrryFile(path) as hrry:
        return dict(hrry.metadata)


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


def write_file(
    path: str | os.PathLike[str],
    tensors: Mapping[str, BlockPagedTensor],
    metadata: Mapping[str, MetadataInput] | None = None,
    *,
    data_buffer_alignment: int = wc.MIN_DATA_BUFFER_ALIGNMENT,
    sorted_index: bool = False,
    progress: Callable[[int], object] | None = None,
) -> int:
    """Write a ``.hrry`` file exactly as the reference ``FileWriter`` does; its size in bytes.

    ``.hrry`` has no data checksums (only an index CRC-32C): it is for exchange with the
    reference, ``save_cache`` for keeping a cache. The layout is docs/reference-containers.md's.
    Written through ``atomic_output``: arrays mapping an older file at ``path`` stay valid
    and a failure leaves it as it was. ``progress`` gets each tensor's data bytes.
    """
    if not isinstance(tensors, Mapping):
        raise ArgumentTypeError("tensors must be a mapping of name to BlockPagedTensor")
    check_alignment(data_buffer_alignment)
    records = [(_name_bytes(name), tensor_pieces(tensor)) for name, tensor in tensors.items()]
    if metadata is not None and not isinstance(metadata, Mapping):
        raise ArgumentTypeError("metadata must be a mapping", found=type(metadata).__name__)
    entries: dict[str, MetadataInput] = dict(metadata or {})  # the user's, then reserved keys
    for key in entries:
        if isinstance(key, str) and key.startswith(RESERVED_PREFIXES):
            raise InvalidMetadataError(
                "key prefix reserved for tensor seq_lens / metadata",
                section="kv_metadata",
                field=key,
                expected=f"no key starting with {' or '.join(RESERVED_PREFIXES)}",
            )
    for name, tensor in tensors.items():
        if tensor.seq_lens is not None and len(tensor.seq_lens):
            entries[SEQ_LENS_KEY_PREFIX + name] = [UInt64(int(v)) for v in tensor.seq_lens]
        if tensor.metadata:
            entries[METADATA_KEY_PREFIX + name] = encode_metadata(tensor.metadata)
    kv = encode_metadata(entries) if entries else b""
    flags = wc.FILE_FLAG_HAS_INDEX_CRC32C | (wc.FILE_FLAG_SORTED_INDEX if sorted_index else 0)
    header = HEADER.pack(
        container_version_major=1,
        container_version_minor=0,
        file_flags=flags,
        data_buffer_alignment=data_buffer_alignment,
        first_descriptor_offset=wc.HEADER_SIZE,
        tensor_count_hint=wc.TENSOR_COUNT_UNKNOWN,
    )
    with atomic_output(path) as out:  # § B.3-B.6, into a file that becomes ``path``
        pos = 0

        def put(piece: bytes | memoryview) -> None:
            nonlocal pos
            out.write(piece)
            pos += len(piece)

        def pad_to(alignment: int) -> None:
            put(bytes(align(pos, alignment) - pos))  # < 2 MiB: the largest alignment

        put(header)
        index: list[tuple[bytes, int, int, int, int]] = []
        for raw_name, (descriptor, buffers) in records:
            descriptor_offset = pos
            put(descriptor)
            pad_to(data_buffer_alignment)  # step 2, even before an empty buffer 0
            data_offset = pos
            for number, pieces in enumerate(buffers):
                if number:
                    pad_to(data_buffer_alignment)  # between buffers only, none after the last [A18]
                for piece in pieces:
                    put(piece)
            index.append(
                (raw_name, descriptor_offset, len(descriptor), data_offset, pos - data_offset)
            )
            if progress is not None:
                progress(pos - data_offset)
            pad_to(wc.SECTION_ALIGNMENT)
        kv_offset = kv_length = 0
        if kv:
            kv_offset, kv_length = pos, len(kv)
            put(kv)
            pad_to(wc.SECTION_ALIGNMENT)
        if sorted_index:
            index.sort(key=lambda entry: entry[0])
        rows = [COUNT.pack(entry_count=len(index))]  # § B.5: the entry fields in wire order
        for raw_name, *fields in index:  # descriptor offset, length; data offset, length
            rows += (NAME_LENGTH.pack(len(raw_name)), raw_name, ENTRY_FIXED.pack(*fields, 0))
        index_bytes = b"".join(rows)
        index_offset = pos
        put(index_bytes)
        put(
            TRAILER.pack(
                index_offset=index_offset,
                index_length=len(index_bytes),
                kv_offset=kv_offset,
                kv_length=kv_length,
                index_crc32c=crc32c(index_bytes),
            )
        )
    return pos
