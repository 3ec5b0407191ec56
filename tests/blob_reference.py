"""An independent reader and writer of the hurray-wire blob, from docs/wire-format.md only.

This module is the proof that the page is enough to implement the format in another
language: it uses ``struct``, ``xxhash`` and ``zstandard`` (for zstd frames, as any reader
would use libzstd) and nothing of ``hurray_wire`` apart from what the tests hand it
(descriptor bytes come from ``hurray_wire.encode_descriptor``; this reader parses only the
descriptor fields the envelope rules need, from descriptor.md § 1.1).

The writer has knobs for every field, so that a test can produce one precise violation of
a rule and still reach the check (``patch`` re-computes the header checksum).

Where the page is silent or wrong, the choices made here are marked ``DOC:``.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import xxhash
import zstandard

MAGIC = b"HRWB"
HEADER = struct.Struct("<4sBBHQIHBBI4s")  # § 1: 32 bytes
ENTRY = struct.Struct("<BBBBIQQQQI4s")  # § 2: 48 bytes
U64 = struct.Struct("<Q")
HEADER_SIZE = HEADER.size
ENTRY_SIZE = ENTRY.size
BLOB_ALIGNMENT = 64

KIND_BUFFER = 1
KIND_SEQ_LENS = 2
KIND_METADATA = 3
KIND_PAGE_DIGESTS = 4  # wire-format.md § 4, integrity.md § 4
KIND_PAGE_REFS = 5  # wire-format.md § 4, integrity.md § 6
KNOWN_KINDS = (KIND_BUFFER, KIND_SEQ_LENS, KIND_METADATA, KIND_PAGE_DIGESTS, KIND_PAGE_REFS)
#: the kinds of a 1.0 reader that predates the page sections (``read_blob(legacy=True)``)
LEGACY_KINDS = (KIND_BUFFER, KIND_SEQ_LENS, KIND_METADATA)
REQUIRED = 0x01

CODEC_RAW = 0
CODEC_ZSTD = 1
CODEC_SHUFFLE_ZSTD = 2
CODEC_CHUNKED = 3
SHUFFLE_WIDTHS = (2, 4, 8)
CHUNKED_WIDTHS = (1, 2, 4, 8)

# descriptor.md § 4: bits per element of each assigned type tag
TYPE_BITS = {
    0x01: 16, 0x02: 16, 0x03: 32, 0x04: 64, 0x10: 8, 0x11: 8, 0x12: 16, 0x13: 16, 0x14: 32,
    0x15: 32, 0x16: 64, 0x17: 64, 0x20: 1, 0x40: 8, 0x41: 8, 0x42: 8, 0x43: 4, 0x44: 6,
    0x45: 6, 0x46: 128, 0x48: 4, 0x49: 4, 0x4A: 2, 0x4B: 2, 0x50: 64, 0x51: 128,
}  # fmt: skip
SCALE_BYTES = {1: 2, 2: 2, 3: 4}  # descriptor.md § 7, per-block affine scale_type_tag
PER_BLOCK_AFFINE = 0x03

CHECKSUM_NONE = 0
CHECKSUM_XXH3 = 1

# Offsets of the fields of the fixed header (§ 1) and of a section entry (§ 2).
HEADER_FIELDS = {
    "magic": (0, "4s"),
    "version_major": (4, "B"),
    "version_minor": (5, "B"),
    "header_flags": (6, "H"),
    "total_length": (8, "Q"),
    "header_length": (16, "I"),
    "section_count": (20, "H"),
    "checksum_type": (22, "B"),
    "reserved23": (23, "B"),
    "descriptor_length": (24, "I"),
    "reserved28": (28, "4s"),
}
ENTRY_FIELDS = {
    "kind": (0, "B"),
    "section_flags": (1, "B"),
    "codec": (2, "B"),
    "codec_param": (3, "B"),
    "index": (4, "I"),
    "offset": (8, "Q"),
    "stored_size": (16, "Q"),
    "raw_size": (24, "Q"),
    "checksum": (32, "Q"),
    "alignment": (40, "I"),
    "reserved": (44, "4s"),
}


def align(value: int, alignment: int) -> int:
    """Round up to a multiple of ``alignment`` (a bad alignment <= 0 leaves the value)."""
    return value if alignment <= 0 else -(-value // alignment) * alignment


def xxh3(data: Any) -> int:
    return int(xxhash.xxh3_64_intdigest(bytes(data)))


# -- codecs (§ 6) ---------------------------------------------------------------------------
def shuffle(data: bytes, width: int) -> bytes:
    """Output byte j*k + i is input byte i*w + j; the len % w tail is appended unchanged."""
    k = len(data) // width
    body = data[: k * width]
    return b"".join(body[j::width] for j in range(width)) + data[k * width :]


def unshuffle(data: bytes, width: int) -> bytes:
    k = len(data) // width
    out = bytearray(len(data))
    for j in range(width):
        out[j : k * width : width] = data[j * k : (j + 1) * k]
    out[k * width :] = data[k * width :]
    return bytes(out)


def compress(
    raw: bytes, codec: int, width: int = 0, level: int = 3, chunk_size: int = 1 << 20
) -> bytes:
    """One zstd frame (with its content size) of the raw or shuffled bytes; for the chunked
    codec, the chunk table and one such frame per shuffled chunk."""
    if codec == CODEC_RAW:
        return raw
    if codec == CODEC_CHUNKED:
        chunks = [raw[a : a + chunk_size] for a in range(0, len(raw), chunk_size)]
        frames = [compress(c, CODEC_SHUFFLE_ZSTD if width > 1 else CODEC_ZSTD, width, level)
                  for c in chunks]  # fmt: skip
        table = struct.pack("<II", chunk_size, len(frames))
        table += b"".join(struct.pack("<I", len(f)) for f in frames)
        return table + b"".join(frames)
    data = shuffle(raw, width) if codec == CODEC_SHUFFLE_ZSTD else raw
    return bytes(zstandard.ZstdCompressor(level=level).compress(data))


# -- metadata (§ 4, kind 3: containers.md § B.4) ---------------------------------------------
def _meta_scalar(value: Any) -> tuple[int, bytes]:
    if isinstance(value, bool):
        return 5, bytes([value])
    if isinstance(value, int):
        if -(1 << 63) <= value < (1 << 63):
            return 2, struct.pack("<q", value)
        return 3, struct.pack("<Q", value)
    if isinstance(value, float):
        return 4, struct.pack("<d", value)
    if isinstance(value, str):
        text = value.encode()
        return 1, struct.pack("<I", len(text)) + text
    if isinstance(value, (bytes, bytearray)):
        return 6, struct.pack("<I", len(value)) + bytes(value)
    raise TypeError(f"no metadata encoding for {type(value).__name__}")


def encode_metadata(entries: dict[str, Any]) -> bytes:
    """u32 count, then per entry u16 key_length, key, u8 tag, payload (arrays of one tag)."""
    out = [struct.pack("<I", len(entries))]
    for key, value in entries.items():
        name = key.encode()
        out.append(struct.pack("<H", len(name)) + name)
        if isinstance(value, (list, tuple)):
            items = [_meta_scalar(v) for v in value]
            tag = items[0][0]
            out.append(bytes([7, tag]) + struct.pack("<I", len(items)))
            out.extend(payload for _, payload in items)
        else:
            tag, payload = _meta_scalar(value)
            out.append(bytes([tag]) + payload)
    return b"".join(out)


def decode_metadata(data: bytes) -> dict[str, Any]:
    pos = 0

    def take(n: int) -> bytes:
        nonlocal pos
        if pos + n > len(data):
            raise ReferenceError("metadata", pos, "entry runs past the section")
        chunk = data[pos : pos + n]
        pos += n
        return chunk

    def scalar(tag: int) -> Any:
        if tag in (1, 6):
            raw = take(struct.unpack("<I", take(4))[0])
            return raw.decode() if tag == 1 else raw
        if tag in (2, 3, 4):
            return struct.unpack({2: "<q", 3: "<Q", 4: "<d"}[tag], take(8))[0]
        if tag == 5:
            b = take(1)[0]
            if b > 1:
                raise ReferenceError("metadata", pos - 1, "bool must be 0 or 1")
            return bool(b)
        raise ReferenceError("metadata", pos - 1, f"unknown value tag {tag}")

    result: dict[str, Any] = {}
    (count,) = struct.unpack("<I", take(4))
    for _ in range(count):
        key_length = struct.unpack("<H", take(2))[0]
        if key_length == 0:
            raise ReferenceError("metadata", pos - 2, "empty key")
        key = take(key_length).decode()
        if key in result:
            raise ReferenceError("metadata", pos - key_length, "duplicated key")
        tag = take(1)[0]
        if tag == 7:
            element = take(1)[0]
            if not 1 <= element <= 6:
                raise ReferenceError("metadata", pos - 1, "bad array element tag")
            n = struct.unpack("<I", take(4))[0]
            result[key] = [scalar(element) for _ in range(n)]
        else:
            result[key] = scalar(tag)
    if pos != len(data):
        raise ReferenceError("metadata", pos, "bytes after the last entry")
    return result


# -- writer ----------------------------------------------------------------------------------
@dataclass
class Section:
    """One section to write. ``None`` fields are derived the way the page says."""

    kind: int
    stored: bytes
    raw_size: int | None = None  # None: len(stored) for raw, else required
    index: int = 0
    flags: int | None = None  # None: REQUIRED for buffer and seq_lens, 0 otherwise
    codec: int = CODEC_RAW
    codec_param: int = 0
    alignment: int = 64
    offset: int | None = None  # None: align(previous end, alignment) + extra_padding
    extra_padding: int = 0  # bytes of padding beyond the minimum (a violation when > 0)
    padding_fill: int = 0  # value of the padding bytes before this section
    checksum: int | None = None  # None: xxh3_64 of the stored bytes (0 without checksums)
    reserved: bytes = bytes(4)


def section(
    kind: int,
    raw: bytes,
    *,
    index: int = 0,
    alignment: int = 64,
    codec: int = CODEC_RAW,
    width: int = 0,
    level: int = 3,
) -> Section:
    """A section holding ``raw`` stored with ``codec`` (shuffle ``width`` for codecs 2, 3)."""
    raw = bytes(raw)
    return Section(
        kind,
        compress(raw, codec, width, level),
        raw_size=len(raw),
        index=index,
        codec=codec,
        codec_param=width if codec in (CODEC_SHUFFLE_ZSTD, CODEC_CHUNKED) else 0,
        alignment=alignment,
    )


def write_blob(
    descriptor: bytes,
    sections: Sequence[Section],
    *,
    checksum_type: int = CHECKSUM_XXH3,
    magic: bytes = MAGIC,
    version_major: int = 1,
    version_minor: int = 0,
    header_flags: int = 0,
    total_length: int | None = None,
    header_length: int | None = None,
    section_count: int | None = None,
    descriptor_length: int | None = None,
    reserved23: int = 0,
    reserved28: bytes = bytes(4),
    header_checksum: int | None = None,
    extra_trailing: int = 0,
    trailing_fill: int = 0,
) -> bytes:
    """A blob of ``descriptor`` and ``sections``; every field can be forced to a bad value."""
    descriptor = bytes(descriptor)
    true_header_length = HEADER_SIZE + ENTRY_SIZE * len(sections) + len(descriptor)
    cursor = true_header_length + 8
    placed: list[tuple[Section, int]] = []
    for s in sections:
        offset = align(cursor, s.alignment) + s.extra_padding if s.offset is None else s.offset
        placed.append((s, offset))
        cursor = offset + len(s.stored)
    end = max([true_header_length + 8] + [o + len(s.stored) for s, o in placed])
    true_total = align(end, BLOB_ALIGNMENT) + extra_trailing
    out = bytearray(true_total)
    # padding fills: the bytes before each section (from the previous end) and the tail
    cursor = true_header_length + 8
    for s, offset in placed:
        if s.padding_fill and offset > cursor:
            out[cursor:offset] = bytes([s.padding_fill]) * (offset - cursor)
        cursor = offset + len(s.stored)
    if trailing_fill and true_total > cursor:
        out[cursor:true_total] = bytes([trailing_fill]) * (true_total - cursor)
    for s, offset in placed:
        out[offset : offset + len(s.stored)] = s.stored
    entries = []
    for s, offset in placed:
        if s.checksum is not None:
            checksum = s.checksum
        else:
            checksum = xxh3(s.stored) if checksum_type == CHECKSUM_XXH3 else 0
        flags = s.flags
        if flags is None:
            flags = REQUIRED if s.kind in (KIND_BUFFER, KIND_SEQ_LENS) else 0
        entries.append(
            ENTRY.pack(
                s.kind,
                flags,
                s.codec,
                s.codec_param,
                s.index,
                offset,
                len(s.stored),
                len(s.stored) if s.raw_size is None else s.raw_size,
                checksum,
                s.alignment,
                s.reserved,
            )
        )
    head = HEADER.pack(
        magic,
        version_major,
        version_minor,
        header_flags,
        true_total if total_length is None else total_length,
        true_header_length if header_length is None else header_length,
        len(sections) if section_count is None else section_count,
        checksum_type,
        reserved23,
        len(descriptor) if descriptor_length is None else descriptor_length,
        reserved28,
    )
    head += b"".join(entries) + descriptor
    out[: len(head)] = head
    digest = xxh3(head) if header_checksum is None else header_checksum
    out[len(head) : len(head) + 8] = U64.pack(digest)
    return bytes(out)


def write_tensor_blob(
    descriptor: bytes,
    buffers: Sequence[bytes],
    alignments: Sequence[int],
    *,
    seq_lens: Sequence[int] | None = None,
    metadata: dict[str, Any] | None = None,
    checksum: bool = True,
    codecs: Sequence[tuple[int, int]] | None = None,
    level: int = 3,
) -> bytes:
    """The blob a writer following the page emits: buffers in table order, then seq_lens,
    then metadata. ``alignments`` are the descriptor handles' alignments (the section uses
    ``max(64, alignment)``); ``codecs`` gives ``(codec, shuffle width)`` per buffer."""
    sections = []
    for index, raw in enumerate(buffers):
        codec, width = (CODEC_RAW, 0) if codecs is None else codecs[index]
        if not raw:  # DOC: the page shows zero-length buffers raw; a frame would not shrink
            codec, width = CODEC_RAW, 0
        sections.append(
            section(
                KIND_BUFFER,
                raw,
                index=index,
                alignment=max(64, alignments[index]),
                codec=codec,
                width=width,
                level=level,
            )
        )
    if seq_lens is not None:
        sections.append(section(KIND_SEQ_LENS, struct.pack(f"<{len(seq_lens)}Q", *seq_lens)))
    if metadata:
        sections.append(section(KIND_METADATA, encode_metadata(metadata)))
    return write_blob(
        descriptor, sections, checksum_type=CHECKSUM_XXH3 if checksum else CHECKSUM_NONE
    )


# -- in-place edits of an existing blob ------------------------------------------------------
def header_length_of(blob: bytes | bytearray) -> int:
    return int(struct.unpack_from("<I", blob, 16)[0])


def rehash_header(blob: bytes | bytearray) -> bytes:
    """The blob with its header checksum recomputed over [0, header_length)."""
    out = bytearray(blob)
    hl = header_length_of(out)
    out[hl : hl + 8] = U64.pack(xxh3(out[:hl]))
    return bytes(out)


def entry_offset(number: int) -> int:
    return HEADER_SIZE + ENTRY_SIZE * number


def patch_header(blob: bytes, name: str, value: Any, *, rehash: bool = True) -> bytes:
    off, fmt = HEADER_FIELDS[name]
    out = bytearray(blob)
    struct.pack_into("<" + fmt, out, off, value)
    return rehash_header(out) if rehash else bytes(out)


def patch_entry(blob: bytes, number: int, name: str, value: Any, *, rehash: bool = True) -> bytes:
    off, fmt = ENTRY_FIELDS[name]
    out = bytearray(blob)
    struct.pack_into("<" + fmt, out, entry_offset(number) + off, value)
    return rehash_header(out) if rehash else bytes(out)


def entry(blob: bytes, number: int) -> dict[str, Any]:
    values = ENTRY.unpack_from(blob, entry_offset(number))
    return dict(zip(ENTRY_FIELDS, values, strict=True))


def patch_payload(blob: bytes, number: int, position: int, data: bytes) -> bytes:
    """Overwrite stored bytes of section ``number`` and keep its checksum (and header) valid."""
    e = entry(blob, number)
    out = bytearray(blob)
    start = e["offset"] + position
    out[start : start + len(data)] = data
    if e["checksum"]:
        stored = out[e["offset"] : e["offset"] + e["stored_size"]]
        struct.pack_into("<Q", out, entry_offset(number) + 32, xxh3(stored))
    return rehash_header(out)


# -- reader ----------------------------------------------------------------------------------
class ReferenceError(ValueError):
    """A rule of the page that a blob breaks: where (section, byte offset) and which."""

    def __init__(self, where: str, offset: int | None, rule: str) -> None:
        self.where = where
        self.offset = offset
        self.rule = rule
        super().__init__(f"{where} @ {offset}: {rule}")


@dataclass
class DescriptorFields:
    """The few descriptor fields the envelope needs (descriptor.md § 1.1)."""

    length: int
    type_tag: int
    shape: tuple[int, ...]
    page_size: int
    num_pages: int
    num_seqs: int
    index_width: int
    buffer_sizes: tuple[int, ...]
    buffer_alignments: tuple[int, ...]
    #: per-block affine quantization (descriptor.md § 7): (scale buffer, zero-point buffer
    #: or None when SYMMETRIC, scale bytes); None for any other pool
    per_block: tuple[int, int | None, int] | None = None

    @property
    def page_nbytes(self) -> int | None:
        """Bytes of one page of the pool when pages end on a byte boundary, else None
        (wire-format.md § 4 kind 4; an unknown type tag: None too)."""
        bits = TYPE_BITS.get(self.type_tag)
        if bits is None:
            return None
        page_bits = self.page_size * self.shape[1] * self.shape[2] * bits
        return None if page_bits % 8 else page_bits // 8

    def segments(self) -> list[tuple[int, int]] | None:
        """The parts of a page's record (integrity.md § 2), in record order, as (buffer,
        bytes per page): the pool, then the per-block affine scales, then the zero points
        (a shared buffer holds every scale, then every zero point). None when pages do not
        end on a byte boundary."""
        if self.page_nbytes is None:
            return None
        parts = [(0, self.page_nbytes)]
        if self.per_block is not None:
            scales, zero_points, scale_bytes = self.per_block
            parts.append((scales, self.page_size * scale_bytes))
            if zero_points is not None:
                parts.append((zero_points, self.page_size * 4))
        return parts

    def row_bytes(self, buffer: int) -> int | None:
        """Bytes per page of a page-row buffer (all its segments), None for other buffers."""
        parts = [n for b, n in self.segments() or () if b == buffer]
        return sum(parts) if parts else None  # 0 for a pool of 0-byte pages


@dataclass
class ParsedSection:
    kind: int
    flags: int
    codec: int
    codec_param: int
    index: int
    offset: int
    stored_size: int
    raw_size: int
    checksum: int
    alignment: int
    raw: bytes = b""


@dataclass
class ParsedBlob:
    version_minor: int
    total_length: int
    header_length: int
    checksum_type: int
    descriptor: bytes
    fields: DescriptorFields
    sections: list[ParsedSection]
    buffers: list[bytes] = field(default_factory=list)
    seq_lens: list[int] | None = None
    page_digests: list[int] | None = None
    page_refs: list[tuple[int, int]] | None = None  # (physical page id, record digest)
    metadata: dict[str, Any] | None = None
    seq_ptr: list[int] = field(default_factory=list)
    block_table: list[int] = field(default_factory=list)


def parse_descriptor_fields(desc: bytes, base: int) -> DescriptorFields:
    def need(n: int, what: str) -> None:
        if len(desc) < n:
            raise ReferenceError("descriptor", base + len(desc), f"too short for {what}")

    need(85, "a block-paged descriptor")
    if desc[:4] != b"HRRY":
        raise ReferenceError("descriptor", base, "descriptor magic is not HRRY")
    if desc[15] != 0x0A:
        raise ReferenceError("descriptor", base + 15, "layout tag is not block-paged (0x0A)")
    rank = struct.unpack_from("<I", desc, 16)[0]
    if rank != 3:
        raise ReferenceError("descriptor", base + 16, "rank is not 3")
    shape = struct.unpack_from("<3Q", desc, 20)
    page_size, num_pages, _axis, num_seqs = struct.unpack_from("<IQII", desc, 52)
    index_type = desc[77]
    if index_type not in (0, 1):
        raise ReferenceError("descriptor", base + 77, "bad block_table_index_type")
    count = desc[84]
    need(85 + 16 * count, "its buffer table")
    sizes, aligns = [], []
    for i in range(count):
        size, alignment = struct.unpack_from("<QI", desc, 85 + 16 * i)
        sizes.append(size)
        aligns.append(alignment)
    per_block = None
    quant = 85 + 16 * count  # descriptor.md § 1.1: u32 quantization_length, then the scheme
    quantized = struct.unpack_from("<I", desc, 10)[0] & 1 and len(desc) >= quant + 4 + 21
    if quantized and desc[quant + 4] == PER_BLOCK_AFFINE:
        scales, zero_points = struct.unpack_from("<II", desc, quant + 4 + 12)
        scale_bytes = SCALE_BYTES.get(desc[quant + 4 + 20], 0)
        per_block = (scales, None if zero_points == 0xFFFFFFFF else zero_points, scale_bytes)
    return DescriptorFields(
        len(desc),
        desc[14],
        tuple(shape),
        page_size,
        num_pages,
        num_seqs,
        4 if index_type == 0 else 8,
        tuple(sizes),
        tuple(aligns),
        per_block,
    )


def _decode_chunked(s: ParsedSection, stored: bytes, where: str) -> bytes:
    """§ 6, codec 3: check the chunk table, then decode every frame as its own section."""
    if len(stored) < 8:
        raise ReferenceError(where, s.offset, "chunked section shorter than its table header")
    chunk_size, count = struct.unpack_from("<II", stored)
    if not 4096 <= chunk_size <= 1 << 30 or chunk_size & (chunk_size - 1):
        raise ReferenceError(where, s.offset, "chunk_size not a power of two in 4096..2^30")
    if count != -(-s.raw_size // chunk_size):
        raise ReferenceError(where, s.offset + 4, "chunk_count != ceil(raw_size / chunk_size)")
    at = 8 + 4 * count
    if at > len(stored):
        raise ReferenceError(where, s.offset + 8, "chunk table runs past the stored bytes")
    sizes = struct.unpack_from(f"<{count}I", stored, 8)
    if at + sum(sizes) != len(stored):
        raise ReferenceError(where, s.offset + 8, "frame sizes do not fill the stored bytes")
    out = []
    for i, size in enumerate(sizes):
        length = min(chunk_size, s.raw_size - i * chunk_size)
        chunk = ParsedSection(s.kind, s.flags, CODEC_SHUFFLE_ZSTD if s.codec_param > 1
                              else CODEC_ZSTD, s.codec_param, s.index, s.offset + at, size,
                              length, 0, s.alignment)  # fmt: skip
        out.append(_decode_stored(chunk, stored[at : at + size], where))
        at += size
    return b"".join(out)


def _decode_stored(s: ParsedSection, stored: bytes, where: str) -> bytes:
    if s.codec == CODEC_RAW:
        return stored
    if s.codec == CODEC_CHUNKED:
        return _decode_chunked(s, stored, where)
    try:
        # DOC: the page does not say whether the frame must declare its content size; a
        # reader that bounds its output by raw_size + 1 works either way.
        dobj = zstandard.ZstdDecompressor().decompressobj()
        raw = dobj.decompress(stored)
    except zstandard.ZstdError as exc:
        raise ReferenceError(where, s.offset, f"corrupt zstd frame: {exc}") from None
    if not dobj.eof or dobj.unused_data:
        raise ReferenceError(where, s.offset, "stored bytes are not exactly one zstd frame")
    if len(raw) != s.raw_size:
        raise ReferenceError(where, s.offset, "frame does not decompress to raw_size bytes")
    if s.codec == CODEC_SHUFFLE_ZSTD:
        raw = unshuffle(raw, s.codec_param)
    return bytes(raw)


def _page_head(raw: bytes, where: str, offset: int) -> int:
    """integrity.md § 4 / § 6: version 1, algorithm 1, reserved 0, then u32 count."""
    if len(raw) < 8:
        raise ReferenceError(where, offset, "shorter than its 8-byte head")
    version, algorithm, reserved, count = struct.unpack_from("<BBHI", raw)
    if version != 1 or algorithm != 1 or reserved:
        raise ReferenceError(where, offset, "version, algorithm or reserved bytes")
    return int(count)


def _refs_count(data: bytes, count: int, fields: DescriptorFields) -> int:
    """R from the page_refs entry's raw_size (8 + 16 R, R <= num_pages), read before the
    buffers are checked (wire-format.md § 4 kind 5); 0 without a page_refs entry."""
    for number in range(count):
        at = entry_offset(number)
        if data[at] == KIND_PAGE_REFS:
            raw = U64.unpack_from(data, at + 24)[0]
            refs, rest = divmod(raw - 8, 16)
            if raw < 8 or rest or refs > fields.num_pages:
                raise ReferenceError("page_refs", at + 24, "raw_size != 8 + 16 R, R <= pages")
            return int(refs)
    return 0


def _record_rows(fields: DescriptorFields, pages: int) -> list[tuple[int, int, int]]:
    """(buffer, start, bytes per page) of each record segment in buffers of ``pages`` pages:
    page p's part of a segment is ``buffer[start + p * n : start + (p + 1) * n]``."""
    out, used = [], dict.fromkeys(range(256), 0)
    for b, n in fields.segments() or ():
        out.append((b, used[b], n))
        used[b] += pages * n
    return out


def _page_sections(parsed: ParsedBlob, verify: bool, page_store: Any) -> None:
    """Kinds 4 and 5 (wire-format.md § 4, integrity.md § 2, 4, 6): the payloads, the pool
    rebuilt from the page store, and (with ``verify``) every page record's digest."""
    fields, pages = parsed.fields, parsed.fields.num_pages
    rows = {b: n for b in range(len(parsed.buffers)) if (n := fields.row_bytes(b)) is not None}
    if fields.page_nbytes is None:
        raise ReferenceError("page_pool", None, "pages do not end on a byte boundary")
    for s in parsed.sections:
        if s.kind == KIND_PAGE_DIGESTS:
            if s.raw_size != 8 + 8 * pages or _page_head(s.raw, "page_digests", s.offset) != pages:
                raise ReferenceError("page_digests", s.offset, "not 8 + 8 * num_pages bytes")
            parsed.page_digests = list(struct.unpack_from(f"<{pages}Q", s.raw, 8))
        elif s.kind == KIND_PAGE_REFS:
            count = _page_head(s.raw, "page_refs", s.offset)
            if s.raw_size != 8 + 16 * count:
                raise ReferenceError("page_refs", s.offset + 4, "count disagrees with raw_size")
            ids = struct.unpack_from(f"<{count}Q", s.raw, 8)
            digests = struct.unpack_from(f"<{count}Q", s.raw, 8 + 8 * count)
            if any(b <= a for a, b in itertools.pairwise(ids)) or any(p >= pages for p in ids):
                raise ReferenceError("page_refs", s.offset + 8, "ids not increasing below pages")
            parsed.page_refs = list(zip(ids, digests, strict=True))
    if parsed.page_refs is not None:
        if page_store is None:
            raise ReferenceError("page_refs", None, "a delta blob needs a page store")
        refs = dict(parsed.page_refs)
        sent = [p for p in range(pages) if p not in refs]
        full = {b: bytearray(pages * n) for b, n in rows.items()}
        pairs = zip(_record_rows(fields, len(sent)), _record_rows(fields, pages), strict=True)
        for (b, short, n), (_, start, _) in pairs:  # the sent rows, ascending page id
            for i, p in enumerate(sent):
                row = parsed.buffers[b][short + i * n : short + (i + 1) * n]
                full[b][start + p * n : start + (p + 1) * n] = row
        for p, digest in parsed.page_refs:
            record = page_store.get(digest)
            if record is None or xxh3(record) != digest:
                raise ReferenceError("page_refs", None, f"page {p}: no intact record in store")
            if parsed.page_digests is not None and parsed.page_digests[p] != digest:
                raise ReferenceError("page_refs", None, f"page {p}: digest differs from 0x04")
            if len(record) != sum(rows.values()):
                raise ReferenceError("page_refs", None, f"page {p}: record of another size")
            at = 0
            for b, start, n in _record_rows(fields, pages):
                full[b][start + p * n : start + (p + 1) * n] = record[at : at + n]
                at += n
        for b in rows:
            parsed.buffers[b] = bytes(full[b])
    if verify and parsed.page_digests is not None:
        parts = _record_rows(fields, pages)
        for p, digest in enumerate(parsed.page_digests):
            record = b"".join(parsed.buffers[b][a + p * n : a + (p + 1) * n] for b, a, n in parts)
            if xxh3(record) != digest:
                raise ReferenceError("page_digests", None, f"page {p}: digest mismatch")


def read_blob(
    data: Any,
    *,
    verify: bool = True,
    max_decompressed: int = 16 << 30,
    legacy: bool = False,
    page_store: Any = None,
) -> ParsedBlob:
    """Parse and check a blob at the start of ``data`` in the order of § 8.

    ``legacy``: read as a 1.0 reader that predates kinds 4 and 5 (it skips page_digests as an
    unknown optional section and refuses the REQUIRED page_refs). ``page_store``: a mapping
    digest -> page record, for a delta blob (page_refs)."""
    data = bytes(data)
    known = LEGACY_KINDS if legacy else KNOWN_KINDS
    # 1. magic, major version, total_length
    if len(data) < 16:
        raise ReferenceError("header", len(data), "input ends inside the 16-byte prefix")
    if data[:4] != MAGIC:
        raise ReferenceError("header", 0, "bad magic")
    if data[4] != 1:
        raise ReferenceError("header", 4, "version_major is not 1")
    total = U64.unpack_from(data, 8)[0]
    if total % BLOB_ALIGNMENT or total < 40:
        raise ReferenceError("header", 8, "total_length not a multiple of 64 (>= 40)")
    if total > len(data):
        raise ReferenceError("header", 8, "input shorter than total_length (truncated)")
    (_, _, minor, flags, _, header_length, count, checksum_type, r23, dlen, r28) = (
        HEADER.unpack_from(data, 0)
    )
    # 2. flags, reserved, checksum_type, header_length
    if flags:
        raise ReferenceError("header", 6, "header_flags must be 0")
    if r23 or r28 != bytes(4):
        raise ReferenceError("header", 23 if r23 else 28, "reserved bytes must be 0")
    if checksum_type not in (CHECKSUM_NONE, CHECKSUM_XXH3):
        raise ReferenceError("header", 22, "unknown checksum_type")
    if header_length != HEADER_SIZE + ENTRY_SIZE * count + dlen:
        raise ReferenceError("header", 16, "header_length != 32 + 48n + descriptor_length")
    if header_length + 8 > total:
        raise ReferenceError("header", 16, "header_length + 8 > total_length")
    # 3. header checksum
    if U64.unpack_from(data, header_length)[0] != xxh3(data[:header_length]):
        raise ReferenceError("header", header_length, "header checksum mismatch")
    # 4. descriptor
    desc_start = HEADER_SIZE + ENTRY_SIZE * count
    descriptor = data[desc_start:header_length]
    if len(descriptor) < 10 or struct.unpack_from("<I", descriptor, 6)[0] != dlen:
        raise ReferenceError("descriptor", desc_start + 6, "descriptor_length disagrees")
    fields = parse_descriptor_fields(descriptor, desc_start)
    nbuf = len(fields.buffer_sizes)
    refs = 0 if legacy else _refs_count(data, count, fields)
    expected = list(fields.buffer_sizes)
    for b in range(nbuf) if refs else ():  # the page-row buffers hold only the sent pages
        row = fields.row_bytes(b)
        if row is None and b == 0:
            raise ReferenceError("page_pool", None, "pages do not end on a byte boundary")
        if row is not None:
            expected[b] = (fields.num_pages - refs) * row
    # 5. sections
    sections: list[ParsedSection] = []
    cursor = header_length + 8
    seen: set[int] = set()
    decompressed = 0
    for number in range(count):
        at = entry_offset(number)
        kind, sflags, codec, param, index, offset, stored, raw, checksum, alignment, res = (
            ENTRY.unpack_from(data, at)
        )
        where = f"section {number} (kind {kind}, index {index})"
        if res != bytes(4) or sflags & ~REQUIRED:
            raise ReferenceError(where, at, "reserved bits or bytes set")
        if alignment < 64 or alignment & (alignment - 1):
            raise ReferenceError(where, at + 40, "alignment not a power of two >= 64")
        if offset != align(cursor, alignment):
            raise ReferenceError(where, at + 8, "offset is not align(previous end, alignment)")
        if offset + stored > total:
            raise ReferenceError(where, at + 16, "section beyond total_length")
        if any(data[cursor:offset]):
            raise ReferenceError(where, cursor, "non-zero padding before the section")
        if kind == KIND_BUFFER:
            if number != index or index >= nbuf:
                raise ReferenceError(where, at + 4, "buffer sections not in table order")
            if raw != expected[index]:
                raise ReferenceError(where, at + 24, "raw_size != descriptor byte_size")
            if alignment < fields.buffer_alignments[index]:
                raise ReferenceError(where, at + 40, "alignment below the handle's")
        elif kind in known:  # an extension section
            if kind == KIND_PAGE_DIGESTS and sflags & REQUIRED:
                raise ReferenceError(where, at + 1, "page_digests flagged REQUIRED")
            if kind == KIND_PAGE_REFS and not sflags & REQUIRED:
                raise ReferenceError(where, at + 1, "page_refs not flagged REQUIRED")
            if number < nbuf:
                raise ReferenceError(where, at, "extension section before the buffers")
            if index != 0 or kind in seen:
                raise ReferenceError(where, at + 4, "extension duplicated or index != 0")
            seen.add(kind)
        elif kind == 0 or sflags & REQUIRED:
            raise ReferenceError(where, at, "kind 0 or unknown kind flagged REQUIRED")
        elif index != 0:  # § 2: "kind 1: the buffer's index ... Other kinds: 0."
            raise ReferenceError(where, at + 4, "index of a non-buffer section must be 0")
        if codec == CODEC_RAW:
            if stored != raw or param:
                raise ReferenceError(where, at + 16, "raw section with stored != raw")
        elif codec == CODEC_ZSTD:
            if param:
                raise ReferenceError(where, at + 3, "zstd codec_param must be 0")
        elif codec == CODEC_SHUFFLE_ZSTD:
            if param not in SHUFFLE_WIDTHS:
                raise ReferenceError(where, at + 3, "shuffle width not 2, 4 or 8")
        elif codec == CODEC_CHUNKED:
            if param not in CHUNKED_WIDTHS:
                raise ReferenceError(where, at + 3, "chunked shuffle width not 1, 2, 4 or 8")
        else:
            raise ReferenceError(where, at + 2, "unknown codec")
        if codec != CODEC_RAW and kind in known:
            decompressed += raw
            if decompressed > max_decompressed:
                raise ReferenceError(where, at + 24, "decompressed bytes above the limit")
        if checksum_type == CHECKSUM_NONE and checksum:
            raise ReferenceError(where, at + 32, "checksum set with checksum_type 0")
        stored_bytes = data[offset : offset + stored]
        if verify and checksum_type == CHECKSUM_XXH3 and xxh3(stored_bytes) != checksum:
            raise ReferenceError(where, offset, "section checksum mismatch")
        s = ParsedSection(
            kind, sflags, codec, param, index, offset, stored, raw, checksum, alignment
        )
        if kind in known:
            s.raw = _decode_stored(s, stored_bytes, where)
        sections.append(s)
        cursor = offset + stored
    # 6. every buffer present, trailing padding zero
    buffers = [s.raw for s in sections if s.kind == KIND_BUFFER]
    if len(buffers) != nbuf:
        raise ReferenceError("section table", HEADER_SIZE, "a descriptor buffer has no section")
    if any(data[cursor:total]):
        raise ReferenceError("trailing padding", cursor, "non-zero trailing padding")
    # DOC: the diagram gives total_length = align(end of last section, 64) and § 2 says
    # padding is minimal (one encoding per tensor); § 8 does not list this check.
    if total != align(cursor, BLOB_ALIGNMENT):
        raise ReferenceError("header", 8, "total_length is not align(end of last section, 64)")
    # 7. index invariants, seq_lens, metadata
    width = fields.index_width
    fmt = "I" if width == 4 else "Q"
    seq_ptr = list(struct.unpack(f"<{len(buffers[2]) // width}{fmt}", buffers[2]))
    block_table = list(struct.unpack(f"<{len(buffers[1]) // width}{fmt}", buffers[1]))
    if len(seq_ptr) != fields.num_seqs + 1:
        raise ReferenceError("seq_ptr", None, "len(seq_ptr) != num_seqs + 1")
    if seq_ptr[0] != 0:
        raise ReferenceError("seq_ptr", None, "seq_ptr[0] != 0")
    if any(b < a for a, b in itertools.pairwise(seq_ptr)):
        raise ReferenceError("seq_ptr", None, "seq_ptr decreases")
    if seq_ptr[-1] != len(block_table):
        raise ReferenceError("seq_ptr", None, "seq_ptr[num_seqs] != len(block_table)")
    if any(p >= fields.num_pages for p in block_table):
        raise ReferenceError("block_table", None, "page id >= num_pages")
    parsed = ParsedBlob(
        minor,
        total,
        header_length,
        checksum_type,
        descriptor,
        fields,
        sections,
        buffers,
        seq_ptr=seq_ptr,
        block_table=block_table,
    )
    if not legacy and any(s.kind in (KIND_PAGE_DIGESTS, KIND_PAGE_REFS) for s in sections):
        _page_sections(parsed, verify, page_store)
    for s in sections:
        if s.kind == KIND_SEQ_LENS:
            if s.raw_size != 8 * fields.num_seqs:
                raise ReferenceError("seq_lens", s.offset, "raw_size != 8 * num_seqs")
            lens = list(struct.unpack(f"<{fields.num_seqs}Q", s.raw))
            if sum(lens) != fields.shape[0]:
                raise ReferenceError("seq_lens", s.offset, "sum(seq_lens) != shape[0]")
            for seq, n in enumerate(lens):
                if seq_ptr[seq + 1] - seq_ptr[seq] != -(-n // fields.page_size):
                    raise ReferenceError("seq_lens", s.offset + 8 * seq, "page count")
            parsed.seq_lens = lens
        elif s.kind == KIND_METADATA:
            try:
                parsed.metadata = decode_metadata(s.raw)
            except (UnicodeDecodeError, struct.error) as exc:
                raise ReferenceError("metadata", s.offset, str(exc)) from None
    return parsed
