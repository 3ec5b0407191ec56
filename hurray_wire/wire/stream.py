"""construct structs of a hurray-wire stream (docs/streaming.md): bytes only, no rules.

A stream is ``[stream header] blob* [end record]``. Every record starts with the same
16-byte prefix as a blob (magic, version_major, version_minor, flags, total_length), so a
reader frames any record from its first 16 bytes and tells the kinds apart by magic.
The rules (which values are allowed, what must agree with what) live in
``hurray_wire.containers.records``; the variable parts (model name, metadata, index entries)
are sized by fields of these fixed structs.
"""

from __future__ import annotations

import construct as c

from hurray_wire.wire.descriptor import KV_ROLES
from hurray_wire.wire.fast import derive

STREAM_MAGIC = b"HRWS"  # the stream header; a blob is "HRWB"
END_MAGIC = b"HRWE"  # the end record (end-of-stream marker and optional index)
RECORD_ALIGNMENT = 64  # every record's total_length is a multiple of this

STREAM_FLAG_END_RECORD = 0x0001  # the writer promises to finish the stream with an end record
STREAM_FLAGS_KNOWN = STREAM_FLAG_END_RECORD

ROLE_BITS = {name: 1 << code for name, code in KV_ROLES.items()}  # bit 1 << descriptor code
NUM_LAYERS_UNKNOWN = 0xFFFFFFFF
ELEMENT_TYPE_UNKNOWN = 0x00  # tag 0x00 is invalid as an element type, so free to mean "unset"

# The 16 bytes every record (stream header, blob, end record) starts with.
RECORD_PREFIX = c.Struct(
    "magic" / c.Bytes(4),
    "version_major" / c.Int8ul,
    "version_minor" / c.Int8ul,
    "flags" / c.Int16ul,
    "total_length" / c.Int64ul,
)

# Stream header, fixed part (32 bytes), followed by model_name (UTF-8), metadata (KV section),
# zero padding and, in the last 8 bytes of total_length, the RECORD_CHECKSUM.
STREAM_HEADER = c.Struct(
    "magic" / c.Const(STREAM_MAGIC),
    "version_major" / c.Int8ul,
    "version_minor" / c.Int8ul,
    "stream_flags" / c.Int16ul,
    "total_length" / c.Int64ul,
    "num_layers" / c.Int32ul,
    "kv_roles" / c.Int8ul,
    "element_type" / c.Int8ul,
    "model_name_length" / c.Int16ul,
    "metadata_length" / c.Int32ul,
    "_reserved" / c.Const(bytes(4)),
)

# xxh3_64 (seed 0) of every byte of the stream header before it.
RECORD_CHECKSUM = c.Struct("checksum" / c.Int64ul)

# End record, fixed part (32 bytes), followed by entry_count END_ENTRY, zero padding and the
# END_FOOTER in the last 16 bytes of total_length.
END_RECORD = c.Struct(
    "magic" / c.Const(END_MAGIC),
    "version_major" / c.Int8ul,
    "version_minor" / c.Int8ul,
    "end_flags" / c.Int16ul,
    "total_length" / c.Int64ul,
    "blob_count" / c.Int64ul,
    "entry_count" / c.Int32ul,
    "_reserved" / c.Const(bytes(4)),
)

# One index entry per blob, in stream order (24 bytes).
END_ENTRY = c.Struct(
    "offset" / c.Int64ul,  # from the first byte of the stream
    "length" / c.Int64ul,  # the blob's total_length
    "layer_index" / c.Int32ul,  # 0xFFFFFFFF: none
    "kv_role" / c.Int8ul,  # the descriptor's code: 0 key, 1 value, 2 fused
    "_reserved" / c.Const(bytes(3)),
)

# The last 16 bytes of the end record: found from the end of a file without any other index.
END_FOOTER = c.Struct(
    "checksum" / c.Int64ul,  # xxh3_64 of the end record's bytes before the footer
    "total_length" / c.Int64ul,  # the end record's total_length, again
)


FAST_RECORD_PREFIX = derive(RECORD_PREFIX)
FAST_STREAM_HEADER = derive(STREAM_HEADER)
FAST_RECORD_CHECKSUM = derive(RECORD_CHECKSUM)
FAST_END_RECORD = derive(END_RECORD)
FAST_END_ENTRY = derive(END_ENTRY)
FAST_END_FOOTER = derive(END_FOOTER)
