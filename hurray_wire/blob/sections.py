"""The section table's rules (docs/wire-format.md § 2), one small method per rule group.

``check_entries`` walks the table once, in order; each entry goes through the framing
rules (reserved bits, alignment, placement, bounds), the rules of its kind (buffer,
extension, unknown), the checksum-type rule and its codec's rules (parameter, decompressed
size under the limits). Every error names the section and the byte offset of the field.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hurray_wire.blob.envelope import AT, CHECKSUM, ENTRY, ENTRY_AT, entry_at
from hurray_wire.blob.limits import DecodeLimits
from hurray_wire.blob.pages import paged_buffers, sent_sizes
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
from hurray_wire.wire.records import DIGEST_SECTION, PAGE_REFS

__all__ = ["Entry", "check_entries"]

_ENTRY_FIELDS = ("kind", "index", "codec", "codec_param", "offset", "stored_size", "raw_size")
_SEQ_LEN_BYTES = 8  # seq_lens are u64 (docs/wire-format.md § 3)
#: The most bytes one page record (a pool row, a page's scales) may have: what NumPy can
#: address as one row. A pool of 0 pages holds any geometry, so nothing else bounds it (F12).
MAX_PAGE_RECORD_BYTES = (1 << 63) - 1


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


def check_entries(
    header: bytes,
    head: dict[str, Any],
    descriptor: TensorDescriptor,
    total: int,
    limits: DecodeLimits,
) -> tuple[tuple[Entry, ...], int]:
    """Check every entry of ``header`` (``head``: its fixed fields) against the rules and
    the descriptor: (entries, end of the last section)."""
    count = head["section_count"]
    start = len(header) + CHECKSUM.size  # where the first section may begin
    walk = _Walk(descriptor, total, head["checksum_type"], limits, start)
    table = header[entry_at(0) : entry_at(count)]
    rows = [dict(zip(ENTRY.names, f, strict=True)) for f in ENTRY.struct.iter_unpack(table)]
    walk.sizes = walk.buffer_sizes(rows)
    entries = []
    for number, e in enumerate(rows):
        walk.enter(number, e)
        walk.check_framing(e)
        if e["kind"] == w.KIND_BUFFER:
            walk.check_buffer(e, number)
        elif e["kind"] in w.SECTION_KINDS:
            walk.check_extension(e)
        else:
            walk.check_unknown(e)
        if walk.checksum_type == w.CHECKSUM_NONE and e["checksum"]:
            raise walk.refused(
                "checksum", "checksum set although checksum_type is none", found=e["checksum"]
            )
        walk.check_codec(e)
        fields = {name: e[name] for name in _ENTRY_FIELDS}
        entries.append(
            Entry(**fields, entry_offset=walk.at, pad_start=walk.cursor, where=walk.where)
        )
        walk.cursor = e["offset"] + e["stored_size"]
    walk.check_complete()
    return tuple(entries), walk.cursor


@dataclass
class _Walk:
    """What the walk has seen so far (the rules that depend on earlier entries), and the
    entry it is at: ``at`` its byte offset, ``where`` its name in errors."""

    descriptor: TensorDescriptor
    total: int
    checksum_type: int
    limits: DecodeLimits
    cursor: int
    next_buffer: int = 0
    decompressed: int = 0
    seen: set[int] = field(default_factory=set)
    sizes: tuple[int, ...] = ()  # raw_size of each buffer section (fewer pages with refs)
    at: int = 0
    where: str = ""

    def enter(self, number: int, e: dict[str, Any]) -> None:
        self.at = entry_at(number)
        kind_name = w.SECTION_KINDS.get(e["kind"], f"kind 0x{e['kind']:02X}")
        self.where = f"{kind_name}[{e['index']}]"

    def refused(
        self, name: str, message: str, error: type[HurrayWireError] = SectionError, **details: Any
    ) -> HurrayWireError:
        """The error for field ``name`` of the current entry, placed there."""
        return error(
            message, section=self.where, field=name, offset=self.at + ENTRY_AT[name], **details
        )

    def buffer_sizes(self, rows: list[dict[str, Any]]) -> tuple[int, ...]:
        """raw_size of every buffer section: the descriptor's byte_size, except that with a
        page-refs section of R refs (its raw_size is 8 + 16 R) the page-row buffers (pool,
        per-block scales / zero points) hold only the num_pages - R sent pages (which the
        blob must pay for: at most ``max_empty_pages`` of 0 bytes)."""
        descriptor = self.descriptor
        for number, e in enumerate(rows):
            if e["kind"] != w.KIND_PAGE_REFS:
                continue
            self.enter(number, e)
            self.check_pages_geometry()
            num_pages = descriptor.layout.num_pages
            refs = PAGE_REFS.count_of(e["raw_size"])
            if refs is None or refs > num_pages:
                raise self.refused(
                    "raw_size",
                    "page_refs needs 8 + 16 bytes per ref, at most one ref per page",
                    expected=f"8 + 16 * R, R <= num_pages {num_pages}",
                    found=e["raw_size"],
                )
            sizes = sent_sizes(descriptor, num_pages - refs)
            most = self.limits.max_empty_pages
            if num_pages - refs > most and sizes == sent_sizes(descriptor, 0):
                raise self.refused(
                    "raw_size",
                    "pages of 0 bytes cost the blob nothing: their count is capped",
                    LimitExceededError,
                    expected=f"<= max_empty_pages {most} sent pages",
                    found=f"{num_pages - refs} sent pages of 0 bytes",
                )
            return sizes
        return tuple(h.byte_size for h in descriptor.buffers)

    def check_pages_geometry(self) -> None:
        paged = paged_buffers(self.descriptor)
        if paged.page_nbytes is None:
            raise self.refused(
                "kind",
                "page sections need pages that end on a byte boundary",
                expected="page_size * num_heads * head_dim * bit_width % 8 == 0",
            )
        widest = max([paged.page_nbytes, *(sum(widths) for _, widths in paged.params)])
        if widest > MAX_PAGE_RECORD_BYTES:
            raise self.refused(
                "kind",
                "page sections need pages of at most 2**63 - 1 bytes",
                expected=f"<= {MAX_PAGE_RECORD_BYTES} bytes per page record",
                found=f"{widest} bytes",
            )

    def check_framing(self, e: dict[str, Any]) -> None:
        """Reserved bits, a power-of-two alignment, the next aligned offset, within the blob."""
        if (
            e["_reserved"] != bytes(ENTRY.sizes["_reserved"])
            or e["section_flags"] & ~w.FLAG_REQUIRED
        ):
            raise SectionError(
                "reserved section bits or bytes set", section=self.where, offset=self.at
            )
        alignment = e["alignment"]
        if alignment < w.BLOB_ALIGNMENT or alignment & (alignment - 1):
            raise self.refused(
                "alignment",
                f"section alignment must be a power of two >= {w.BLOB_ALIGNMENT}",
                found=alignment,
            )
        expected = align(self.cursor, alignment)
        if e["offset"] != expected:
            raise self.refused(
                "offset",
                "section is not at the next aligned offset after the previous one",
                expected=expected,
                found=e["offset"],
            )
        if e["offset"] + e["stored_size"] > self.total:
            raise self.refused(
                "stored_size",
                "section extends past total_length",
                BlobTruncatedError,
                expected=f"<= {self.total - e['offset']}",
                found=e["stored_size"],
            )

    def check_buffer(self, e: dict[str, Any], number: int) -> None:
        """Buffer sections come first, in table order, sized and aligned as their handles."""
        buffers = self.descriptor.buffers
        index = e["index"]
        if index != self.next_buffer or number != index:
            raise self.refused(
                "index",
                "buffer sections must come first, in buffer-table order",
                expected=self.next_buffer,
                found=index,
            )
        if index >= len(buffers):
            raise self.refused(
                "index",
                "buffer index beyond the descriptor's buffer table",
                expected=f"< {len(buffers)}",
                found=index,
            )
        handle = buffers[index]
        if e["raw_size"] != self.sizes[index]:
            fewer = " (fewer pages: page_refs)" if self.sizes[index] != handle.byte_size else ""
            raise self.refused(
                "raw_size",
                "raw_size disagrees with the descriptor's byte_size" + fewer,
                expected=self.sizes[index],
                found=e["raw_size"],
            )
        if e["alignment"] < handle.alignment:
            raise self.refused(
                "alignment",
                "section alignment below the descriptor's alignment",
                expected=f">= {handle.alignment}",
                found=e["alignment"],
            )
        if not e["section_flags"] & w.FLAG_REQUIRED:
            raise self.refused(
                "section_flags",
                "buffer sections must be flagged required",
                found=e["section_flags"],
            )
        self.next_buffer += 1

    def check_extension(self, e: dict[str, Any]) -> None:
        """seq_lens, metadata, page_digests, page_refs: once each, index 0, after every buffer;
        seq_lens and page_refs flagged required (a reader that skipped page_refs would take a
        short pool for the whole), page_digests not (skipping it loses only the page check);
        sizes from the descriptor (page_refs' checked with the buffers); metadata within the
        limits."""
        kind, flags, size = e["kind"], e["section_flags"], e["raw_size"]
        if e["index"] != 0 or kind in self.seen:
            raise self.refused(
                "index", "extension section duplicated or with a non-zero index", found=e["index"]
            )
        if self.next_buffer != len(self.descriptor.buffers):
            raise SectionError(
                "extension sections follow all buffer sections", section=self.where, offset=self.at
            )
        self.seen.add(kind)
        if kind == w.KIND_METADATA:
            if size > self.limits.max_metadata_bytes:
                raise self.refused(
                    "raw_size",
                    "metadata section above the limit",
                    LimitExceededError,
                    found=size,
                    expected=f"<= {self.limits.max_metadata_bytes}",
                )
            return
        required = kind != w.KIND_PAGE_DIGESTS
        if bool(flags & w.FLAG_REQUIRED) != required:
            must = "must " if required else "must not "
            raise self.refused(
                "section_flags",
                f"a {w.SECTION_KINDS[kind]} section {must}be flagged required",
                found=flags,
            )
        layout = self.descriptor.layout
        if kind == w.KIND_SEQ_LENS:
            expected = _SEQ_LEN_BYTES * layout.num_seqs
            what = f"{_SEQ_LEN_BYTES} bytes per sequence"
        elif kind == w.KIND_PAGE_DIGESTS:
            self.check_pages_geometry()
            expected = DIGEST_SECTION.item_at(layout.num_pages, 1)  # head, digests
            what = "an 8-byte head and 8 bytes per page"
        else:
            return
        if size != expected:
            raise self.refused(
                "raw_size", f"{w.SECTION_KINDS[kind]} needs {what}", expected=expected, found=size
            )

    def check_unknown(self, e: dict[str, Any]) -> None:
        """A kind this reader does not know may be skipped only when it is not required."""
        if e["section_flags"] & w.FLAG_REQUIRED or e["kind"] == 0:
            raise self.refused("kind", "unknown section kind flagged required", found=e["kind"])
        if e["index"] != 0:
            raise self.refused(
                "index", "a section that is not a buffer has index 0", found=e["index"]
            )

    def check_codec(self, e: dict[str, Any]) -> None:
        """A registered codec with a valid parameter; compressed known sections count towards
        the decompressed-bytes limit."""
        codec = e["codec"]
        if codec == CODEC_RAW:
            if e["stored_size"] != e["raw_size"] or e["codec_param"]:
                raise self.refused(
                    "stored_size",
                    "a raw section has stored_size == raw_size and no codec parameter",
                    expected=e["raw_size"],
                    found=e["stored_size"],
                )
            return
        found = registry.find(codec)
        if found is None:
            raise self.refused("codec", "unknown codec", found=codec)
        if not found.valid_param(e["codec_param"]):
            raise self.refused(
                "codec_param",
                "codec_param must be 0 for zstd, a shuffle width of 2, 4 or 8 "
                "for shuffle-zstd and of 1, 2, 4 or 8 for chunked-shuffle-zstd",
                found=e["codec_param"],
            )
        if e["kind"] in w.SECTION_KINDS:
            self.decompressed += e["raw_size"]
            most = self.limits.max_decompressed_bytes
            if self.decompressed > most:
                raise self.refused(
                    "raw_size",
                    "decompressed size above the limit",
                    LimitExceededError,
                    found=e["raw_size"],
                    expected=f"<= {most} in all",
                )

    def check_complete(self) -> None:
        """Every buffer has its section, and total_length ends right after the last one."""
        buffers = self.descriptor.buffers
        if self.next_buffer != len(buffers):
            raise SectionError(
                "a descriptor buffer has no section",
                section="section table",
                expected=len(buffers),
                found=self.next_buffer,
            )
        expected = align(self.cursor, w.BLOB_ALIGNMENT)
        if self.total != expected:
            raise InvalidBlobError(
                f"total_length must be the end of the last section rounded up to "
                f"{w.BLOB_ALIGNMENT}",
                section="header",
                field="total_length",
                offset=AT["total_length"],
                expected=expected,
                found=self.total,
            )
