"""The section table's rules (docs/wire-format.md § 2), one small function per rule group.

``check_entries`` walks the table once, in order; each entry goes through the framing
rules (reserved bits, alignment, placement, bounds), the rules of its kind (buffer,
extension, unknown), the checksum-type rule and its codec's rules (parameter, decompressed
size under the limits). Every error names the section and the byte offset of the field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeVar

from hurray_wire.blob.envelope import AT, ENTRY, ENTRY_AT, entry_at
from hurray_wire.blob.limits import DecodeLimits
from hurray_wire.blob.pages import digests_size, paged_buffers, refs_count, sent_sizes
from hurray_wire.buffers import align
from hurray_wire.codecs import CODEC_RAW, registry
from hurray_wire.errors import (
    BlobTruncatedError,
    HurrayWireError,
    InvalidBlobError,
    LimitExceededError,
    SectionError,
)
from hurray_wire.model.descriptor import TensorDescriptor
from hurray_wire.wire import blob as w

__all__ = ["Entry", "check_entries"]

E = TypeVar("E", bound=HurrayWireError)
_SEQ_LEN_BYTES = 8  # seq_lens are u64 (docs/wire-format.md § 3)


def _refused(error: type[E], message: str, where: str, at: int, field: str, **details: Any) -> E:
    """The error for field ``field`` of the section entry at byte ``at``, placed there."""
    return error(message, section=where, field=field, offset=at + ENTRY_AT[field], **details)


@dataclass(frozen=True)
class Entry:
    """One checked section entry: where its stored bytes are and how to decode them."""

    kind: int
    index: int
    codec: int
    codec_param: int
    offset: int
    stored_size: int
    raw_size: int
    entry_offset: int  # where the section's table entry is (its checksum is read per call)
    pad_start: int  # the zero padding before the section: [pad_start, offset)
    where: str


@dataclass
class _Walk:
    """What the walk has seen so far (the rules that depend on earlier entries)."""

    descriptor: TensorDescriptor
    total: int
    checksum_type: int
    limits: DecodeLimits
    cursor: int
    next_buffer: int = 0
    decompressed: int = 0
    seen: set[int] | None = None
    sizes: tuple[int, ...] = ()  # raw_size of each buffer section (fewer pages with refs)


def check_entries(
    header: bytes,
    count: int,
    descriptor: TensorDescriptor,
    start: int,
    total: int,
    checksum_type: int,
    limits: DecodeLimits,
) -> tuple[tuple[Entry, ...], int]:
    """Check every entry against the rules and the descriptor: (entries, end of the last
    section). ``start`` is where the first section may begin."""
    walk = _Walk(descriptor, total, checksum_type, limits, start, seen=set())
    entries = []
    table = header[entry_at(0) : entry_at(count)]
    rows = [dict(zip(ENTRY.names, f, strict=True)) for f in ENTRY.struct.iter_unpack(table)]
    walk.sizes = _buffer_sizes(rows, descriptor, limits)
    for number, e in enumerate(rows):
        at = entry_at(number)
        kind_name = w.SECTION_KINDS.get(e["kind"], f"kind 0x{e['kind']:02X}")
        where = f"{kind_name}[{e['index']}]"
        _check_framing(e, at, where, walk)
        if e["kind"] == w.KIND_BUFFER:
            _check_buffer(e, number, at, where, walk)
        elif e["kind"] in w.SECTION_KINDS:
            _check_extension(e, at, where, walk)
        else:
            _check_unknown(e, at, where)
        _check_checksum_field(e, at, where, walk)
        _check_codec(e, at, where, walk)
        entries.append(
            Entry(
                e["kind"],
                e["index"],
                e["codec"],
                e["codec_param"],
                e["offset"],
                e["stored_size"],
                e["raw_size"],
                at,
                walk.cursor,
                where,
            )
        )
        walk.cursor = e["offset"] + e["stored_size"]
    _check_complete(walk)
    return tuple(entries), walk.cursor


def _buffer_sizes(
    rows: list[dict[str, Any]], descriptor: TensorDescriptor, limits: DecodeLimits
) -> tuple[int, ...]:
    """raw_size of every buffer section: the descriptor's byte_size, except that with a
    page-refs section of R refs (its raw_size is 8 + 16 R) the page-row buffers (pool,
    per-block scales / zero points) hold only the num_pages - R sent pages (which the
    blob must pay for: at most ``max_empty_pages`` of 0 bytes)."""
    full = tuple(h.byte_size for h in descriptor.buffers)
    for number, e in enumerate(rows):
        if e["kind"] != w.KIND_PAGE_REFS:
            continue
        at = entry_at(number)
        where = f"page_refs[{e['index']}]"
        _check_pages_geometry(descriptor, at, where)
        num_pages = descriptor.layout.num_pages
        refs = refs_count(e["raw_size"])
        if refs is None or refs > num_pages:
            raise _refused(
                SectionError,
                "page_refs needs 8 + 16 bytes per ref, at most one ref per page",
                where,
                at,
                "raw_size",
                expected=f"8 + 16 * R, R <= num_pages {num_pages}",
                found=e["raw_size"],
            )
        sizes = sent_sizes(descriptor, num_pages - refs)
        if num_pages - refs > limits.max_empty_pages and sizes == sent_sizes(descriptor, 0):
            raise _refused(
                LimitExceededError,
                "pages of 0 bytes cost the blob nothing: their count is capped",
                where,
                at,
                "raw_size",
                expected=f"<= max_empty_pages {limits.max_empty_pages} sent pages",
                found=f"{num_pages - refs} sent pages of 0 bytes",
            )
        return sizes
    return full


#: The most bytes one page record (a pool row, a page's scales) may have: what NumPy can
#: address as one row. A pool of 0 pages holds any geometry, so nothing else bounds it (F12).
MAX_PAGE_RECORD_BYTES = (1 << 63) - 1


def _check_pages_geometry(descriptor: TensorDescriptor, at: int, where: str) -> None:
    paged = paged_buffers(descriptor)
    if paged.page_nbytes is None:
        raise _refused(
            SectionError,
            "page sections need pages that end on a byte boundary",
            where,
            at,
            "kind",
            expected="page_size * num_heads * head_dim * bit_width % 8 == 0",
        )
    widest = max([paged.page_nbytes, *(sum(widths) for _, widths in paged.params)])
    if widest > MAX_PAGE_RECORD_BYTES:
        raise _refused(
            SectionError,
            "page sections need pages of at most 2**63 - 1 bytes",
            where,
            at,
            "kind",
            expected=f"<= {MAX_PAGE_RECORD_BYTES} bytes per page record",
            found=f"{widest} bytes",
        )


def _check_framing(e: dict[str, Any], at: int, where: str, walk: _Walk) -> None:
    """Reserved bits, a power-of-two alignment, the next aligned offset, within the blob."""
    if e["_reserved"] != bytes(ENTRY.sizes["_reserved"]) or e["section_flags"] & ~w.FLAG_REQUIRED:
        raise SectionError("reserved section bits or bytes set", section=where, offset=at)
    alignment = e["alignment"]
    if alignment < w.BLOB_ALIGNMENT or alignment & (alignment - 1):
        raise _refused(
            SectionError,
            f"section alignment must be a power of two >= {w.BLOB_ALIGNMENT}",
            where,
            at,
            "alignment",
            found=alignment,
        )
    expected = align(walk.cursor, alignment)
    if e["offset"] != expected:
        raise _refused(
            SectionError,
            "section is not at the next aligned offset after the previous one",
            where,
            at,
            "offset",
            expected=expected,
            found=e["offset"],
        )
    if e["offset"] + e["stored_size"] > walk.total:
        raise _refused(
            BlobTruncatedError,
            "section extends past total_length",
            where,
            at,
            "stored_size",
            expected=f"<= {walk.total - e['offset']}",
            found=e["stored_size"],
        )


def _check_buffer(e: dict[str, Any], number: int, at: int, where: str, walk: _Walk) -> None:
    """Buffer sections come first, in table order, sized and aligned as their handles."""
    buffers = walk.descriptor.buffers
    index = e["index"]
    if index != walk.next_buffer or number != index:
        raise _refused(
            SectionError,
            "buffer sections must come first, in buffer-table order",
            where,
            at,
            "index",
            expected=walk.next_buffer,
            found=index,
        )
    if index >= len(buffers):
        raise _refused(
            SectionError,
            "buffer index beyond the descriptor's buffer table",
            where,
            at,
            "index",
            expected=f"< {len(buffers)}",
            found=index,
        )
    handle = buffers[index]
    if e["raw_size"] != walk.sizes[index]:
        raise SectionError(
            "raw_size disagrees with the descriptor's byte_size"
            + (" (fewer pages: page_refs)" if walk.sizes[index] != handle.byte_size else ""),
            section=where,
            field="raw_size",
            offset=at + ENTRY_AT["raw_size"],
            expected=walk.sizes[index],
            found=e["raw_size"],
        )
    if e["alignment"] < handle.alignment:
        raise _refused(
            SectionError,
            "section alignment below the descriptor's alignment",
            where,
            at,
            "alignment",
            expected=f">= {handle.alignment}",
            found=e["alignment"],
        )
    if not e["section_flags"] & w.FLAG_REQUIRED:
        raise _refused(
            SectionError,
            "buffer sections must be flagged required",
            where,
            at,
            "section_flags",
            found=e["section_flags"],
        )
    walk.next_buffer += 1


def _check_extension(e: dict[str, Any], at: int, where: str, walk: _Walk) -> None:
    """seq_lens, metadata, page_digests, page_refs: once each, index 0, after every buffer;
    seq_lens and page_refs flagged required, page_digests not; sizes from the descriptor;
    metadata within the limits."""
    kind = e["kind"]
    assert walk.seen is not None
    if e["index"] != 0 or kind in walk.seen:
        raise _refused(
            SectionError,
            "extension section duplicated or with a non-zero index",
            where,
            at,
            "index",
            found=e["index"],
        )
    if walk.next_buffer != len(walk.descriptor.buffers):
        raise SectionError(
            "extension sections follow all buffer sections", section=where, offset=at
        )
    if kind in (w.KIND_PAGE_DIGESTS, w.KIND_PAGE_REFS):
        _check_page_section(e, at, where, walk)
    elif kind == w.KIND_SEQ_LENS:
        if not e["section_flags"] & w.FLAG_REQUIRED:
            raise _refused(
                SectionError,
                "a seq_lens section must be flagged required",
                where,
                at,
                "section_flags",
                found=e["section_flags"],
            )
        expected = _SEQ_LEN_BYTES * walk.descriptor.layout.num_seqs
        if e["raw_size"] != expected:
            raise _refused(
                SectionError,
                f"seq_lens needs {_SEQ_LEN_BYTES} bytes per sequence",
                where,
                at,
                "raw_size",
                expected=expected,
                found=e["raw_size"],
            )
    elif e["raw_size"] > walk.limits.max_metadata_bytes:
        raise _refused(
            LimitExceededError,
            "metadata section above the limit",
            where,
            at,
            "raw_size",
            found=e["raw_size"],
            expected=f"<= {walk.limits.max_metadata_bytes}",
        )
    walk.seen.add(kind)


def _check_page_section(e: dict[str, Any], at: int, where: str, walk: _Walk) -> None:
    """page_refs is REQUIRED (a reader that skipped it would take a short pool for the
    whole); page_digests is not (skipping it loses only the page check), and holds exactly
    one digest per page. page_refs' size was checked with the buffers (_buffer_sizes)."""
    required = e["kind"] == w.KIND_PAGE_REFS
    if bool(e["section_flags"] & w.FLAG_REQUIRED) != required:
        raise SectionError(
            f"a {w.SECTION_KINDS[e['kind']]} section must "
            + ("" if required else "not ")
            + "be flagged required",
            section=where,
            field="section_flags",
            offset=at + ENTRY_AT["section_flags"],
            found=e["section_flags"],
        )
    if not required:
        _check_pages_geometry(walk.descriptor, at, where)
        expected = digests_size(walk.descriptor.layout.num_pages)
        if e["raw_size"] != expected:
            raise _refused(
                SectionError,
                "page_digests needs an 8-byte head and 8 bytes per page",
                where,
                at,
                "raw_size",
                expected=expected,
                found=e["raw_size"],
            )


def _check_unknown(e: dict[str, Any], at: int, where: str) -> None:
    """A kind this reader does not know may be skipped only when it is not required."""
    if e["section_flags"] & w.FLAG_REQUIRED or e["kind"] == 0:
        raise _refused(
            SectionError,
            "unknown section kind flagged required",
            where,
            at,
            "kind",
            found=e["kind"],
        )
    if e["index"] != 0:
        raise _refused(
            SectionError,
            "a section that is not a buffer has index 0",
            where,
            at,
            "index",
            found=e["index"],
        )


def _check_checksum_field(e: dict[str, Any], at: int, where: str, walk: _Walk) -> None:
    if walk.checksum_type == w.CHECKSUM_NONE and e["checksum"]:
        raise _refused(
            SectionError,
            "checksum set although checksum_type is none",
            where,
            at,
            "checksum",
            found=e["checksum"],
        )


def _check_codec(e: dict[str, Any], at: int, where: str, walk: _Walk) -> None:
    """A registered codec with a valid parameter; compressed known sections count towards
    the decompressed-bytes limit."""
    codec = e["codec"]
    if codec == CODEC_RAW:
        if e["stored_size"] != e["raw_size"] or e["codec_param"]:
            raise _refused(
                SectionError,
                "a raw section has stored_size == raw_size and no codec parameter",
                where,
                at,
                "stored_size",
                expected=e["raw_size"],
                found=e["stored_size"],
            )
        return
    found = registry.find(codec)
    if found is None:
        raise _refused(SectionError, "unknown codec", where, at, "codec", found=codec)
    if not found.valid_param(e["codec_param"]):
        raise _refused(
            SectionError,
            "codec_param must be 0 for zstd, a shuffle width of 2, 4 or 8 for "
            "shuffle-zstd and of 1, 2, 4 or 8 for chunked-shuffle-zstd",
            where,
            at,
            "codec_param",
            found=e["codec_param"],
        )
    if e["kind"] in w.SECTION_KINDS:
        walk.decompressed += e["raw_size"]
        if walk.decompressed > walk.limits.max_decompressed_bytes:
            raise _refused(
                LimitExceededError,
                "decompressed size above the limit",
                where,
                at,
                "raw_size",
                found=e["raw_size"],
                expected=f"<= {walk.limits.max_decompressed_bytes} in all",
            )


def _check_complete(walk: _Walk) -> None:
    """Every buffer has its section, and total_length ends right after the last one."""
    buffers = walk.descriptor.buffers
    if walk.next_buffer != len(buffers):
        raise SectionError(
            "a descriptor buffer has no section",
            section="section table",
            expected=len(buffers),
            found=walk.next_buffer,
        )
    expected = align(walk.cursor, w.BLOB_ALIGNMENT)
    if walk.total != expected:
        raise InvalidBlobError(
            f"total_length must be the end of the last section rounded up to {w.BLOB_ALIGNMENT}",
            section="header",
            field="total_length",
            offset=AT["total_length"],
            expected=expected,
            found=walk.total,
        )
