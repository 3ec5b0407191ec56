"""The blob envelope (docs/wire-format.md § 1): the fixed header, its checksum, framing.

Offsets and sizes come from the wire structs (``AT`` and ``ENTRY_AT`` name every field);
each function checks one rule group and raises where the offset is known.
"""

from __future__ import annotations

from typing import Any

from hurray_wire.blob.limits import DecodeLimits
from hurray_wire.buffers import byte_view
from hurray_wire.errors import (
    BlobTruncatedError,
    ChecksumError,
    HurrayWireError,
    InvalidBlobError,
    LimitExceededError,
    PaddingError,
)
from hurray_wire.model.descriptor import TensorDescriptor
from hurray_wire.model.descriptor_codec import decode_descriptor
from hurray_wire.wire import blob as w, records as wr
from hurray_wire.wire.seal import checksum_of

__all__ = [
    "AT",
    "BLOB_PREFIX_SIZE",
    "CHECKSUM",
    "ENTRY",
    "ENTRY_AT",
    "HEADER",
    "HEADER_SIZE",
    "I_CHECKSUM_TYPE",
    "I_HEADER_LENGTH",
    "I_SECTION_COUNT",
    "I_TOTAL_LENGTH",
    "blob_length",
    "check_header_fields",
    "checked_header",
    "embedded_descriptor",
    "entry_at",
    "pool_section",
    "total_length",
    "whole_blob_header",
]

HEADER = w.FAST_BLOB_HEADER
ENTRY = w.FAST_SECTION_ENTRY
CHECKSUM = w.FAST_HEADER_CHECKSUM
AT = HEADER.offsets  # byte offset of each fixed-header field
ENTRY_AT = ENTRY.offsets  # byte offset of each field within a section entry
HEADER_SIZE = HEADER.size
#: magic, versions, flags and total_length: what frames a blob in a stream.
BLOB_PREFIX_SIZE = wr.PREFIX.size
_BLOB = wr.BLOB.raising(InvalidBlobError, BlobTruncatedError)
_MIN_TOTAL = _BLOB.minimum
_ENTRY_SIZE = ENTRY.size  # the FastStruct properties, read once for the per-call paths
_CHECKSUM_SIZE = CHECKSUM.size
#: Positions of the fixed header's fields in ``HEADER.struct.unpack``'s tuple.
I_HEADER_LENGTH = HEADER.names.index("header_length")
I_SECTION_COUNT = HEADER.names.index("section_count")
I_CHECKSUM_TYPE = HEADER.names.index("checksum_type")
I_DESCRIPTOR_LENGTH = HEADER.names.index("descriptor_length")
_I_MAGIC = HEADER.names.index("magic")
_I_VERSION_MAJOR = HEADER.names.index("version_major")
I_TOTAL_LENGTH = HEADER.names.index("total_length")


def entry_at(number: int) -> int:
    """Byte offset of section entry ``number``: the table follows the fixed header."""
    return HEADER_SIZE + _ENTRY_SIZE * number


def blob_length(data: Any) -> int:
    """total_length of the blob at the start of ``data`` (needs 16 bytes): for framing."""
    return _BLOB.frame(byte_view(data))


def total_length(view: memoryview, *, whole: bool) -> int:
    """total_length of the blob at the start of ``view`` once its fixed header is there
    (and, with ``whole``, all of it); otherwise the precise framing error."""
    total = _BLOB.frame(view)
    _BLOB.whole(view, total, HEADER_SIZE)
    if whole:
        _BLOB.whole(view, total)
    return total


def whole_blob_header(view: memoryview) -> tuple[Any, ...]:
    """The fixed header's fields (``HEADER.struct`` order) of a blob that ``view`` holds
    whole: the magic, major version and total_length checked as :func:`total_length`
    checks them, in one unpack; otherwise its precise framing error."""
    if len(view) >= HEADER_SIZE:
        head: tuple[Any, ...] = HEADER.struct.unpack_from(view, 0)
        total = head[I_TOTAL_LENGTH]
        if (
            head[_I_MAGIC] == w.BLOB_MAGIC
            and head[_I_VERSION_MAJOR] == 1
            and _MIN_TOTAL <= total <= len(view)
            and not total % w.BLOB_ALIGNMENT
        ):
            return head
    total_length(view, whole=True)  # raises the framing error
    return HEADER.struct.unpack_from(view, 0)


def pool_section(head: Any) -> tuple[int, int, bool, bool]:
    """(offset, stored_size, is_raw, has_checksums) of buffer[0] from the first bytes of a
    blob (its fixed header and first section entry, unchecked: what a transport needs to
    place the pool before the blob is whole; the decoder checks it all later)."""
    view = memoryview(bytes(head[: HEADER_SIZE + ENTRY.size]))
    checksum_type = HEADER.struct.unpack_from(view, 0)[I_CHECKSUM_TYPE]
    entry = ENTRY.unpack_dict(view, HEADER_SIZE)
    raw = entry["codec"] == 0 and entry["stored_size"] == entry["raw_size"]
    return entry["offset"], entry["stored_size"], raw, checksum_type == w.CHECKSUM_XXH3_64


def checked_header(
    view: memoryview, fixed: tuple[Any, ...], total: int, limits: DecodeLimits
) -> bytes:
    """A copy of the header bytes ``[0, header_length)``, once its section table and
    descriptor are within ``limits`` (on the fixed header alone, before any work that grows
    with either), ``header_length`` agrees with its counts and fits in ``total`` bytes and
    the header checksum matches it.

    Everything decided from the header is decided from this copy, so a caller that mutates
    its buffer meanwhile cannot make the decoder trust bytes it did not check.
    """
    header_length, count = fixed[I_HEADER_LENGTH], fixed[I_SECTION_COUNT]
    dlen = fixed[I_DESCRIPTOR_LENGTH]
    for what, name, found, most in (
        ("too many sections", "section_count", count, limits.max_sections),
        ("descriptor too long", "descriptor_length", dlen, limits.max_descriptor_length),
    ):
        if found > most:
            raise LimitExceededError(
                what,
                section="header",
                field=name,
                offset=AT[name],
                found=found,
                expected=f"<= {most}",
            )
    expected_length = HEADER_SIZE + _ENTRY_SIZE * count + dlen  # entry_at(count) + dlen
    if header_length != expected_length or header_length + _CHECKSUM_SIZE > total:
        raise InvalidBlobError(
            "header_length disagrees with section_count and descriptor_length, or leaves no "
            "room for the header checksum within total_length",
            section="header",
            field="header_length",
            offset=AT["header_length"],
            expected=expected_length,
            found=header_length,
        )
    header = bytes(view[:header_length])
    (stored_hash,) = CHECKSUM.struct.unpack_from(view, header_length)
    computed = checksum_of(header)
    if stored_hash != computed:
        raise ChecksumError(  # which byte changed, the hash cannot say: where it looks
            f"header checksum mismatch: the xxh3_64 stored at bytes [{header_length}, "
            f"{header_length + _CHECKSUM_SIZE}) covers bytes [0, {header_length}): the fixed "
            f"header [0, {HEADER_SIZE}), the section table [{HEADER_SIZE}, {entry_at(count)}) "
            f"and the descriptor [{entry_at(count)}, {header_length}); a byte there or in the "
            "stored checksum changed",
            section="header",
            field="header_checksum",
            offset=header_length,
            expected=f"0x{stored_hash:016x}",  # the stored value
            found=f"0x{computed:016x}",
        )
    if HEADER.struct.unpack_from(header, 0) != fixed:  # pragma: no cover - a writer's race
        raise InvalidBlobError("the blob changed while it was decoded", section="header")
    return header


def check_header_fields(head: dict[str, Any]) -> None:
    """Reserved flags and bytes, and a known checksum type."""
    if head["header_flags"]:
        raise InvalidBlobError(
            "reserved header flag bits set",
            section="header",
            field="header_flags",
            offset=AT["header_flags"],
            found=f"0x{head['header_flags']:04X}",
        )
    for position, expected in HEADER.consts:
        name = HEADER.names[position]
        if name != "magic" and head[name] != expected:  # the magic was checked first
            raise PaddingError(
                "reserved header bytes must be zero", section="header", offset=AT[name]
            )
    if head["checksum_type"] not in (w.CHECKSUM_NONE, w.CHECKSUM_XXH3_64):
        raise InvalidBlobError(
            "unknown checksum_type",
            section="header",
            field="checksum_type",
            offset=AT["checksum_type"],
            found=head["checksum_type"],
        )


def embedded_descriptor(header: bytes, start: int) -> TensorDescriptor:
    """Decode the descriptor at ``[start, len(header))``; errors carry blob offsets."""
    try:
        descriptor = decode_descriptor(memoryview(header)[start:])
    except HurrayWireError as exc:
        offset = None if exc.offset is None else start + exc.offset
        raise exc.relocated(section="descriptor", offset=offset) from None
    if descriptor.descriptor_length != len(header) - start:
        raise InvalidBlobError(
            "descriptor is shorter than the header's descriptor_length",
            section="descriptor",
            offset=start,
            expected=len(header) - start,
            found=descriptor.descriptor_length,
        )
    return descriptor
