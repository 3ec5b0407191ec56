"""construct structs of the ``.hrry`` file container (containers.md Part B): bytes only, no rules.

One ``Struct`` per part, in file order: ``HrryHeader``, ``KvSection`` (§ B.4), ``HrryIndex``
of ``HrryIndexEntry`` (§ B.5), ``HrryTrailer`` (§ B.6); strict where construct can be
(``Const`` magic and reserved bytes, ``default=Error`` switches, ``Mapping`` bools,
``Terminated`` ends). Text stays bytes: the reader judges it and turns construct's
exceptions into ``hurray_wire.errors``. ``KvSection`` is ``hurray_wire.metadata``'s
declarative twin, kept for documentation, ``dump`` and cross-checks.
"""

from __future__ import annotations

import construct as c

from hurray_wire.wire.descriptor import reserved as _reserved
from hurray_wire.wire.fast import derive

FILE_MAGIC = b"HRRYFILE"
TRAILER_MAGIC = b"HRRY"
TENSOR_COUNT_UNKNOWN = 0xFFFF_FFFF_FFFF_FFFF  # the reference always writes it; never trust it
MIN_DATA_BUFFER_ALIGNMENT = 4096  # § B.2: data_buffer_alignment is a power of two in this range
MAX_DATA_BUFFER_ALIGNMENT = 2 << 20
SECTION_ALIGNMENT = 8  # descriptors, the KV section and the index start 8-aligned (§ B.3-B.5)

# § B.2 file_flags. The reference writer never sets HAS_KV_METADATA ([A17]).
FILE_FLAG_HAS_KV_METADATA = 0x01
FILE_FLAG_SORTED_INDEX = 0x02
FILE_FLAG_HAS_INDEX_CRC32C = 0x04
FILE_FLAGS_KNOWN = 0x07  # any other bit set => reject

# § B.4 KV value tags. 0x00, 0x08-0xEF and 0xFF are invalid; 0xF0-0xFE private (rejected).
KV_TAG_NAMES = dict(
    enumerate(("string", "int64", "uint64", "float64", "bool", "bytes", "array"), 1)
)
KV_STRING, KV_INT64, KV_UINT64, KV_FLOAT64, KV_BOOL, KV_BYTES, KV_ARRAY = KV_TAG_NAMES  # 0x01..0x07


# § B.2: the 64-byte header at offset 0.
HrryHeader = c.Struct(
    "magic" / c.Const(FILE_MAGIC),
    "container_version_major" / c.Int8ul,
    "container_version_minor" / c.Int8ul,
    "_reserved0" / _reserved(2),
    "file_flags" / c.Int32ul,
    "data_buffer_alignment" / c.Int32ul,
    "first_descriptor_offset" / c.Int64ul,
    "tensor_count_hint" / c.Int64ul,
    "_reserved1" / _reserved(28),
)

# § B.6: the trailer, always the last 40 bytes of the file (not necessarily 8-aligned).
HrryTrailer = c.Struct(
    "index_offset" / c.Int64ul,
    "index_length" / c.Int64ul,
    "kv_offset" / c.Int64ul,
    "kv_length" / c.Int32ul,
    "index_crc32c" / c.Int32ul,
    "_reserved" / _reserved(4),
    "magic" / c.Const(TRAILER_MAGIC),
)

# § B.5: the fixed 32 bytes of an index entry, after its u16 name_length and the name bytes.
HrryIndexEntryFixed = c.Struct(
    "descriptor_offset" / c.Int64ul,
    "descriptor_length" / c.Int32ul,
    "data_offset" / c.Int64ul,
    "data_length" / c.Int64ul,
    "flags" / c.Int32ul,
)

# § B.5: one index entry: 2 + name_length + 32 bytes. ``name`` is raw UTF-8 bytes.
HrryIndexEntry = c.Struct(
    "name_length" / c.Rebuild(c.Int16ul, c.len_(c.this.name)),
    "name" / c.Bytes(c.this.name_length),
    *HrryIndexEntryFixed.subcons,
)

HEADER_SIZE = HrryHeader.sizeof()  # 64
TRAILER_SIZE = HrryTrailer.sizeof()  # 40
MIN_FILE_SIZE = HEADER_SIZE + TRAILER_SIZE
INDEX_ENTRY_FIXED_SIZE = HrryIndexEntryFixed.sizeof()  # 32

# § B.5: the whole index section, exactly index_length bytes (the CRC covers all of them).
HrryIndex = c.Struct(
    "entry_count" / c.Rebuild(c.Int64ul, c.len_(c.this.entries)),
    "entries" / c.Array(c.this.entry_count, HrryIndexEntry),
    c.Terminated,
)

# § B.4: value payloads. Strings stay bytes here; their UTF-8 is checked by the codec.
KvString = c.Prefixed(c.Int32ul, c.GreedyBytes)
KvBytes = c.Prefixed(c.Int32ul, c.GreedyBytes)
KvBool = c.Mapping(c.Int8ul, {False: 0, True: 1})  # Flag would read 0x02 as True
KV_SCALAR_PAYLOADS = {
    KV_STRING: KvString,
    KV_INT64: c.Int64sl,
    KV_UINT64: c.Int64ul,
    KV_FLOAT64: c.Float64l,
    KV_BOOL: KvBool,
    KV_BYTES: KvBytes,
}
#: The fewest payload bytes of each scalar tag (a length-prefixed one: its length alone):
#: what a decoder multiplies a claimed count by before it trusts the count.
KV_LEAST_PAYLOAD = {
    tag: getattr(payload, "lengthfield", payload).sizeof()
    for tag, payload in KV_SCALAR_PAYLOADS.items()
}
# Tag 07: one element tag, a count, then untagged payloads back to back.
KvArray = c.Struct(
    "element_tag" / c.Int8ul,
    "count" / c.Rebuild(c.Int32ul, c.len_(c.this.elements)),
    "elements"
    / c.Array(
        c.this.count,
        c.Switch(c.this.element_tag, KV_SCALAR_PAYLOADS, default=c.Error),
    ),
)
KvEntry = c.Struct(
    "key_length" / c.Rebuild(c.Int16ul, c.len_(c.this.key)),
    "key" / c.Bytes(c.this.key_length),
    "value_tag" / c.Int8ul,
    "value"
    / c.Switch(
        c.this.value_tag,
        {**KV_SCALAR_PAYLOADS, KV_ARRAY: KvArray},
        default=c.Error,
    ),
)
# The section is exactly kv_length bytes (the trailer's length excludes the 8-byte padding).
KvSection = c.Struct(
    "kv_count" / c.Rebuild(c.Int32ul, c.len_(c.this.entries)),
    "entries" / c.Array(c.this.kv_count, KvEntry),
    c.Terminated,
)


FAST_HRRY_HEADER = derive(HrryHeader)
FAST_HRRY_TRAILER = derive(HrryTrailer)
FAST_HRRY_INDEX_ENTRY_FIXED = derive(HrryIndexEntryFixed)
FAST_HRRY_INDEX_COUNT = derive(c.Struct(HrryIndex.subcons[0]))  # entry_count
FAST_HRRY_NAME_LENGTH = derive(c.Struct(HrryIndexEntry.subcons[0]))
