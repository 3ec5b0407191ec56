"""The fixed parts of a ``.hrry`` file (containers.md § B.2, B.5, B.6), parsed and checked.

``parse_header``, ``parse_trailer``, ``parse_index`` and ``parse_kv`` are § B.8 steps 1-5.
Byte positions come from the construct
structs in ``hurray_wire.wire.containers`` (``offset_of``), never restated here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from hurray_wire.containers.reference_common import container_error
from hurray_wire.crc32c import crc32c
from hurray_wire.errors import ContainerTruncatedError, HurrayWireError, InvalidContainerError
from hurray_wire.metadata import MetadataValue, decode_metadata
from hurray_wire.wire import containers as wc, records as wr

__all__ = [
    "FileHeader",
    "FileTrailer",
    "IndexEntry",
    "check_alignment",
    "parse_header",
    "parse_index",
    "parse_kv",
    "parse_trailer",
]

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
    if (
        index_offset < wc.HEADER_SIZE
        or index_length < COUNT.size
        or index_offset + index_length > at
    ):
        raise _TRAILER.error(
            "index_offset",
            "index outside the file body",
            base=at,
            expected=f"{wc.HEADER_SIZE} <= index_offset, {COUNT.size} <= index_length, end <= {at}",
            found=f"offset {index_offset}, length {index_length}",
        )
    has_kv = header.has_kv_metadata_flag
    if (kv_offset == 0) != (kv_length == 0) or (has_kv and kv_length == 0):
        raise _TRAILER.error(
            "kv_offset",
            "kv_offset and kv_length must both be 0 (no KV section) or both be set"
            + (", and HAS_KV_METADATA needs a section" if has_kv else ""),
            base=at,
            found=f"offset {kv_offset}, length {kv_length}",
        )
    if kv_length and (kv_offset < wc.HEADER_SIZE or kv_offset + kv_length > at):
        raise _TRAILER.error(
            "kv_offset",
            "KV section outside the file body",
            base=at,
            expected=f"{wc.HEADER_SIZE} <= kv_offset, end <= {at}",
            found=f"offset {kv_offset}, length {kv_length}",
        )
    if header.has_index_crc32c:
        computed = crc32c(np.frombuffer(buf, np.uint8, index_length, index_offset))
        if computed != crc:
            raise _TRAILER.error(
                "index_crc32c",
                "index CRC-32C mismatch",
                base=at,
                expected=f"0x{computed:08X}",
                found=f"0x{crc:08X}",
            )
    elif crc != 0:
        raise _TRAILER.error(
            "index_crc32c",
            "index_crc32c must be 0 when HAS_INDEX_CRC32C is clear ([A21])",
            base=at,
            found=f"0x{crc:08X}",
        )
    return FileTrailer(index_offset, index_length, kv_offset, kv_length, crc)


# -- § B.8 step 4: the index -----------------------------------------------------------------
def parse_index(buf: Any, header: FileHeader, trailer: FileTrailer) -> tuple[IndexEntry, ...]:
    """Every index entry, no bytes left over, sorted if SORTED_INDEX says so."""
    start = trailer.index_offset
    end = start + trailer.index_length
    count = COUNT.struct.unpack_from(buf, start)[0]
    room = (end - start - COUNT.size) // _MIN_ENTRY
    if count > room:
        raise InvalidContainerError(
            "entry_count larger than the index can hold",
            section="index",
            field="entry_count",
            offset=start,
            expected=f"<= {room}",
            found=count,
        )
    pos = start + COUNT.size
    entries: list[IndexEntry] = []
    raw_names: list[bytes] = []
    seen: set[bytes] = set()
    for number in range(count):
        entry, raw, pos = _index_entry(buf, pos, end, f"entries[{number}]", seen)
        entries.append(entry)
        raw_names.append(raw)
    if pos != end:
        raise InvalidContainerError(
            "bytes left over after the last index entry",
            section="index",
            offset=pos,
            expected=f"index end at {end}",
            found=f"{end - pos} bytes",
        )
    if header.sorted_index and raw_names != sorted(raw_names):
        raise InvalidContainerError(
            "SORTED_INDEX is set but the entries are not sorted by name bytes",
            section="index",
            offset=start,
        )
    return tuple(entries)


def _index_entry(
    buf: Any, pos: int, end: int, where: str, seen: set[bytes]
) -> tuple[IndexEntry, bytes, int]:
    """One entry at ``pos``: (the entry, its raw name, where the next one starts)."""
    if pos + NAME_LENGTH.size > end:
        raise _index_short(where, pos, end)
    name_length = NAME_LENGTH.struct.unpack_from(buf, pos)[0]
    if name_length == 0:
        raise InvalidContainerError(
            "empty tensor name", section="index", field=f"{where}.name_length", offset=pos
        )
    at_name = pos + NAME_LENGTH.size
    fixed = at_name + name_length
    if fixed + ENTRY_FIXED.size > end:
        raise _index_short(where, pos, end)
    raw = bytes(buf[at_name:fixed])
    try:
        name = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidContainerError(
            "tensor name is not valid UTF-8",
            section="index",
            field=f"{where}.name",
            offset=at_name + exc.start,
        ) from None
    if raw in seen:
        raise InvalidContainerError(
            "duplicate tensor name",
            section="index",
            field=f"{where}.name",
            offset=at_name,
            found=repr(name),
        )
    seen.add(raw)
    d_off, d_len, data_off, data_len, flags = ENTRY_FIXED.struct.unpack_from(buf, fixed)
    if flags:
        raise InvalidContainerError(
            "index entry flags must be 0",
            section="index",
            field=f"{where}.flags",
            offset=fixed + ENTRY_FIXED.offsets["flags"],
            found=flags,
        )
    entry = IndexEntry(name, d_off, d_len, data_off, data_len)
    return entry, raw, fixed + ENTRY_FIXED.size


def _index_short(where: str, pos: int, end: int) -> InvalidContainerError:
    return InvalidContainerError(
        "index_length ends inside an entry",
        section="index",
        field=where,
        offset=pos,
        expected="a whole entry",
        found=f"{end - pos} bytes",
    )


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
