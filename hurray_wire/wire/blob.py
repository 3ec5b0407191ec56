"""construct structs of the hurray-wire blob envelope (docs/wire-format.md): bytes only."""

from __future__ import annotations

import construct as c

from hurray_wire.wire.fast import derive

BLOB_MAGIC = b"HRWB"
BLOB_ALIGNMENT = 64  # total_length and every section offset are multiples of at least this

KIND_BUFFER = 0x01  # one buffer of the descriptor's buffer table
KIND_SEQ_LENS = 0x02  # u64 tokens per sequence, num_seqs entries (SEQ_LENS_ITEM)
KIND_METADATA = 0x03  # user key/value metadata, .hrry KV-section encoding
KIND_PAGE_DIGESTS = 0x04  # one u64 digest per physical page (docs/integrity.md § 4); optional
KIND_PAGE_REFS = 0x05  # pages taken from the receiver's store (docs/integrity.md § 6); REQUIRED
SECTION_KINDS = dict(enumerate(("buffer", "seq_lens", "metadata", "page_digests", "page_refs"), 1))
FLAG_REQUIRED = 0x01  # a reader that does not know the section's kind must refuse the blob

CHECKSUM_NONE = 0
CHECKSUM_XXH3_64 = 1

# The 32-byte fixed header at offset 0.
BLOB_HEADER = c.Struct(
    "magic" / c.Const(BLOB_MAGIC),
    "version_major" / c.Int8ul,
    "version_minor" / c.Int8ul,
    "header_flags" / c.Int16ul,
    "total_length" / c.Int64ul,
    "header_length" / c.Int32ul,
    "section_count" / c.Int16ul,
    "checksum_type" / c.Int8ul,
    "_reserved0" / c.Const(b"\0"),
    "descriptor_length" / c.Int32ul,
    "_reserved1" / c.Const(bytes(4)),
)

# One 48-byte entry of the section table, right after the fixed header.
SECTION_ENTRY = c.Struct(
    "kind" / c.Int8ul,
    "section_flags" / c.Int8ul,
    "codec" / c.Int8ul,
    "codec_param" / c.Int8ul,
    "index" / c.Int32ul,
    "offset" / c.Int64ul,
    "stored_size" / c.Int64ul,
    "raw_size" / c.Int64ul,
    "checksum" / c.Int64ul,
    "alignment" / c.Int32ul,
    "_reserved" / c.Const(bytes(4)),
)

# The payload of a chunked-shuffle-zstd section (codec 3): this table head, chunk_count
# CHUNK_FRAME_SIZE entries, then the chunks' zstd frames back to back.
CHUNK_TABLE_HEADER = c.Struct("chunk_size" / c.Int32ul, "chunk_count" / c.Int32ul)
CHUNK_FRAME_SIZE = c.Int32ul  # stored bytes of one chunk's frame

# One entry of the seq_lens section: the tokens of one sequence.
SEQ_LENS_ITEM = c.Int64ul

# xxh3_64 of bytes [0, header_length): fixed header, section table and descriptor.
HEADER_CHECKSUM = c.Struct("header_checksum" / c.Int64ul)


FAST_BLOB_HEADER = derive(BLOB_HEADER)
FAST_SECTION_ENTRY = derive(SECTION_ENTRY)
FAST_HEADER_CHECKSUM = derive(HEADER_CHECKSUM)
FAST_CHUNK_TABLE_HEADER = derive(CHUNK_TABLE_HEADER)
