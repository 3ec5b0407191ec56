"""construct structs of the Hurray Tensor Descriptor (descriptor.md §§ 1-9): bytes only, as
strict as construct can be (``Const``, ``Mapping``, ``default=Error``), rules in the model.
The codec reads and writes the ``struct.Struct`` formats derived from them at the end of this
module, construct only for another layout's payload (``LAYOUT_PREFIX``); ``DESCRIPTOR`` is the
whole, for tests."""

from __future__ import annotations

from struct import Struct
from typing import Any

import construct as c

from hurray_wire.wire.fast import array_struct, derive, item_struct

MAGIC = b"HRRY"
LAYER_NONE = 0xFFFFFFFF  # layer_index sentinel: "not layer-scoped"

# § 2 flags: which optional sections follow the buffer table (in this order but for the
# extension type, which follows statistics). Any other bit set => reject.
FLAG_HAS_QUANTIZATION = 0x01
FLAG_HAS_SHARD = 0x02
FLAG_HAS_EXTENSION_TYPE = 0x04
FLAG_HAS_STATISTICS = 0x08
FLAG_HAS_COMPOSITE_MEMBER = 0x10
FLAGS_KNOWN = 0x1F
PRIVATE_TYPE_TAGS = range(0xF0, 0xFF)  # element type tags of private extension types

KV_ROLES = {"key": 0, "value": 1, "fused": 2}  # the one role map (streams, transfer records)
#: The same map read the other way (a wire code to its role name); nothing else inverts it.
KV_ROLE_BY_CODE = {code: name for name, code in KV_ROLES.items()}
INDEX_TYPES = {"uint32": 0, "uint64": 1}
#: The element of block_table / seq_ptr for each index type.
INDEX_ITEMS = {"uint32": c.Int32ul, "uint64": c.Int64ul}

_LAYOUTS = "row_major column_major strided tiled morton coo csr csc csf block_paged composite_head"
LAYOUT_NAMES = {**dict(enumerate(_LAYOUTS.split(), 1)), 0x40: "hilbert"}  # tags 0x01-0x0B, 0x40


class _LayerIndex(c.Adapter):  # type: ignore[misc]
    """u32 layer_index whose 0xFFFFFFFF is None in Python (and only None)."""

    def _decode(self, obj: int, context: Any, path: str) -> int | None:
        return None if obj == LAYER_NONE else obj

    def _encode(self, obj: int | None, context: Any, path: str) -> int:
        if obj is None:
            return LAYER_NONE
        if obj == LAYER_NONE:
            raise c.MappingError("layer_index 0xFFFFFFFF is the None sentinel", path=path)
        return obj


def reserved(n: int) -> c.Construct:
    """Reserved bytes that must read back as zero: ``Const``, because ``Padding`` never checks."""
    return c.Const(bytes(n))


# § 2: the 20-byte fixed header. The first 10 bytes alone frame a descriptor in a stream.
FIXED_HEADER = c.Struct(
    "magic" / c.Const(MAGIC),
    "version_major" / c.Int8ul,
    "version_minor" / c.Int8ul,
    "descriptor_length" / c.Int32ul,
    "flags" / c.Int32ul,
    "type_tag" / c.Int8ul,
    "layout_tag" / c.Int8ul,
    "rank" / c.Int32ul,
)

# § 6.1: the 32-byte block-paged payload (layout tag 0x0A), right after byte_offset.
BLOCK_PAGED_PAYLOAD = c.Struct(
    "page_size" / c.Int32ul,
    "num_pages" / c.Int64ul,
    "paged_axis" / c.Int32ul,
    "num_seqs" / c.Int32ul,
    "kv_role" / c.Mapping(c.Int8ul, KV_ROLES),
    "layer_index" / _LayerIndex(c.Int32ul),
    "block_table_index_type" / c.Mapping(c.Int8ul, INDEX_TYPES),
    "_reserved" / reserved(6),
)

# The fixed part of a rank-3 block-paged descriptor, up to and including buffer_count (85
# bytes): what the fast path reads first, and where its error offsets come from. The buffer
# table's handles follow it.
BLOCK_PAGED_FIXED = c.Struct(
    "header" / FIXED_HEADER,
    "shape" / c.Array(3, c.Int64ul),
    "byte_offset" / c.Int64ul,
    "layout" / BLOCK_PAGED_PAYLOAD,
    "buffer_count" / c.Int8ul,
)

# § 7.1: one buffer handle (buffer-protocol.md layout, [A2]).
BUFFER_HANDLE = c.Struct(
    "byte_size" / c.Int64ul,
    "alignment" / c.Int32ul,
    "device_tag" / c.Int8ul,
    "sync_mode" / c.Int8ul,
    "memory_class" / c.Int8ul,
    "_reserved" / reserved(1),
)

# § 8: quantization descriptor = 4-byte header + scheme payload (+ writer padding, [A31]).
QUANT_HEADER = c.Struct(
    "scheme_tag" / c.Int8ul,
    "scheme_version" / c.Int8ul,
    "flags" / c.Int16ul,
)
PER_TENSOR_AFFINE = c.Struct(
    "scale" / c.Float32l,
    "zero_point" / c.Int32sl,
    "_reserved" / reserved(4),
)
PER_CHANNEL_AFFINE = c.Struct(
    "axis" / c.Int32ul,
    "scale_buffer_index" / c.Int32ul,
    "zero_point_buffer_index" / c.Int32ul,
    "scale_type_tag" / c.Int8ul,
    "_reserved" / reserved(3),
)
PER_BLOCK_AFFINE = c.Struct(
    "axis" / c.Int32ul,
    "block_size" / c.Int32ul,
    "scale_buffer_index" / c.Int32ul,
    "zero_point_buffer_index" / c.Int32ul,
    "scale_type_tag" / c.Int8ul,
    "_reserved" / reserved(3),
)
NF4 = c.Struct(
    "axis" / c.Int32ul,
    "block_size" / c.Int32ul,
    "scale_buffer_index" / c.Int32ul,
)
MXFP = NF4  # the same payload as NF4 (descriptor.md § 8: axis, block_size, scale_buffer_index)
SCHEME_PAYLOADS = {
    0x01: PER_TENSOR_AFFINE,
    0x02: PER_CHANNEL_AFFINE,
    0x03: PER_BLOCK_AFFINE,
    0x04: NF4,
    0x05: MXFP,
}
QUANT_LENGTH = c.Int32ul  # quantization_length: the bytes of header + payload + padding after it
QUANTIZATION_SECTION = c.Struct(
    "quantization_length" / QUANT_LENGTH,
    "body"
    / c.FixedSized(
        c.this.quantization_length,
        c.Struct(
            "header" / QUANT_HEADER,
            "payload" / c.Switch(c.this.header.scheme_tag, SCHEME_PAYLOADS, default=c.Error),
            "padding" / c.GreedyBytes,
        ),
    ),
)

# § 9.2-9.4: the other optional sections.
STATISTICS = c.Struct(
    "computed_mask" / c.Int32ul,
    "_reserved0" / reserved(4),
    "nnz" / c.Int64ul,
    "sparsity_ratio" / c.Float64l,
    "value_min" / c.Float64l,
    "value_max" / c.Float64l,
    "value_abs_max" / c.Float64l,
    "value_mean" / c.Float64l,
    "value_stddev" / c.Float64l,
    "nm_n" / c.Int8ul,
    "nm_m" / c.Int8ul,
    "has_nan" / c.Int8ul,
    "has_inf" / c.Int8ul,
    "_reserved1" / reserved(4),
)
EXTENSION_TYPE = c.Struct(
    "bit_width" / c.Int32ul,
    "packing_factor" / c.Int8ul,
    "is_float" / c.Int8ul,
    "is_signed" / c.Int8ul,
    "sign_bits" / c.Int8ul,
    "exponent_bits" / c.Int8ul,
    "mantissa_bits" / c.Int8ul,
    "_reserved0" / reserved(2),
    "exponent_bias" / c.Int32ul,
    "has_nan" / c.Int8ul,
    "has_inf" / c.Int8ul,
    "_reserved1" / reserved(2),
)
COMPOSITE_MEMBER = c.Struct(
    "member_role" / c.Int8ul,
    "_reserved" / reserved(15),
)


def _per_axis(item: c.Construct) -> c.Construct:
    """An array with one ``item`` per dimension (rank lives in the descriptor's header)."""
    return c.Array(c.this._root.header.rank, item)


# § 6: layout payloads of the other layouts, so that any descriptor can be framed for dump.
def _tiled() -> Any:
    return TILED


TILED: Any = c.Struct(
    "tile_shape" / _per_axis(c.Int64ul),
    "outer_order" / c.Int8ul,
    "inner_order" / c.Int8ul,
    "_reserved" / reserved(2),
    "outer_strides" / c.If(c.this.outer_order == 3, _per_axis(c.Int64sl)),
    "inner_strides" / c.If(c.this.inner_order == 3, _per_axis(c.Int64sl)),
    "nested" / c.If(c.this.inner_order == 4, c.LazyBound(lambda: _tiled())),
)
LAYOUT_PAYLOADS = {
    0x01: c.Pass,
    0x02: c.Pass,
    0x03: c.Struct("strides" / _per_axis(c.Int64sl)),
    0x04: TILED,
    0x05: c.Struct("bits" / _per_axis(c.Int32ul)),
    0x06: c.Struct("nnz" / c.Int64ul, "is_sorted" / c.Int8ul, "_reserved" / reserved(7)),
    0x07: c.Struct("nnz" / c.Int64ul, "_reserved" / reserved(8)),
    0x08: c.Struct("nnz" / c.Int64ul, "_reserved" / reserved(8)),
    0x09: c.Struct(
        "nnz" / c.Int64ul, "mode_order" / _per_axis(c.Int32ul), "_reserved" / reserved(8)
    ),
    0x0A: BLOCK_PAGED_PAYLOAD,
    0x0B: c.Struct(
        "rule" / c.Int8ul,
        "combine_op" / c.Int8ul,
        "_reserved" / reserved(2),
        "member_count" / c.Int32ul,
    ),
    0x40: c.Struct("order" / c.Int32ul, "hilbert_rank" / c.Int32ul),
}
PRIVATE_LAYOUT = c.Struct(
    "extension_layout_id" / c.Int64ul,
    "length" / c.Int32ul,
    "data" / c.Bytes(c.this.length),
)


def _flag(bit: int) -> Any:
    return lambda this: bool(this._root.header.flags & bit)


# § 1 up to the buffer table, any layout: what the decoder reads with construct for layouts
# other than rank-3 block-paged (their payloads vary with rank and nest).
LAYOUT_PREFIX = c.Struct(
    "header" / FIXED_HEADER,
    "shape" / _per_axis(c.Int64ul),
    "byte_offset" / c.Int64ul,
    "layout"
    / c.Switch(
        lambda this: 0xF0 if 0xF0 <= this.header.layout_tag <= 0xFE else this.header.layout_tag,
        {**LAYOUT_PAYLOADS, 0xF0: PRIVATE_LAYOUT},
        default=c.Error,
    ),
    "buffer_table_offset" / c.Tell,
)
BUFFER_COUNT = c.Int8ul
SHARD = c.Struct("parent_shape" / _per_axis(c.Int64ul), "shard_offset" / _per_axis(c.Int64ul))
# § 1: the whole descriptor, sections in wire order (statistics before extension type).
DESCRIPTOR = c.Struct(
    *LAYOUT_PREFIX.subcons,
    "buffers" / c.PrefixedArray(BUFFER_COUNT, BUFFER_HANDLE),
    "quantization_offset" / c.Tell,
    "quantization" / c.If(_flag(FLAG_HAS_QUANTIZATION), QUANTIZATION_SECTION),
    "shard" / c.If(_flag(FLAG_HAS_SHARD), SHARD),
    "statistics" / c.If(_flag(FLAG_HAS_STATISTICS), STATISTICS),
    "extension_type" / c.If(_flag(FLAG_HAS_EXTENSION_TYPE), EXTENSION_TYPE),
    "composite_member" / c.If(_flag(FLAG_HAS_COMPOSITE_MEMBER), COMPOSITE_MEMBER),
    "unknown_trailing" / c.GreedyBytes,
)


# One zero point of an affine quantization's zero-point buffer (per channel or per page slot).
ZERO_POINT_ITEM = c.Int32sl

# The derived formats (wire/fast.py): what the descriptor codec reads and writes, with every
# field's offset.
HEADER = derive(FIXED_HEADER)
FIXED = derive(BLOCK_PAGED_FIXED)  # header .. buffer_count of a rank-3 block-paged descriptor
HANDLE = derive(BUFFER_HANDLE)
QHEADER = derive(QUANT_HEADER)
SCHEME = {tag: derive(defn) for tag, defn in SCHEME_PAYLOADS.items()}
STATS = derive(STATISTICS)
EXTENSION = derive(EXTENSION_TYPE)
MEMBER = derive(COMPOSITE_MEMBER)
U32 = item_struct(QUANT_LENGTH)  # quantization_length

AT = FIXED.offsets  # byte offset of every fixed field, e.g. AT["flags"] == 10
BUFFER_TABLE_AT = FIXED.size  # 85: the buffer handles of a rank-3 descriptor start here
COUNT_SIZE = item_struct(BUFFER_COUNT).size  # the u8 buffer_count before the handles
assert FIXED.size - AT["buffer_count"] == COUNT_SIZE
QUANT_HEADER_AT = U32.size  # a quantization section's scheme header follows its length
QUANT_PAYLOAD_AT = U32.size + QHEADER.size  # and its payload follows the header
#: Model field names that differ from the wire's.
WIRE_NAMES = {"element_type": "type_tag", "scale_type": "scale_type_tag"}


def handle_at(index: int, table: int = BUFFER_TABLE_AT) -> int:
    """Byte offset of buffer handle ``index`` in a table whose handles start at ``table``."""
    return table + HANDLE.size * index


def handle_places(table: int, count: int) -> dict[str, int]:
    """Byte offset of every handle field of a buffer table whose handles start at ``table``."""
    places = {}
    for index in range(count):
        start = handle_at(index, table)
        places[f"buffers[{index}]"] = start
        places.update({f"buffers[{index}].{n}": start + at for n, at in HANDLE.offsets.items()})
    return places


def quant_places(pos: int, scheme_tag: int) -> dict[str, int]:
    """Byte offset of every field of a quantization section at ``pos``, by wire and model
    name (``scale_type`` is ``scale_type_tag``), bare and with the ``quantization.`` prefix."""
    places = {"quantization_length": pos}
    places.update({n: pos + QUANT_HEADER_AT + at for n, at in QHEADER.offsets.items()})
    scheme = SCHEME.get(scheme_tag)
    if scheme is not None:
        places.update({n: pos + QUANT_PAYLOAD_AT + at for n, at in scheme.offsets.items()})
    places.update({m: places[w] for m, w in WIRE_NAMES.items() if w in places})
    places.update({f"quantization.{n}": at for n, at in list(places.items())})
    return places


def shard_struct(rank: int) -> Struct:
    """The shard section of a rank-``rank`` descriptor: parent_shape, then shard_offset."""
    item = SHARD.parent_shape.subcon.subcon
    return array_struct(item, len(SHARD.subcons) * rank)
