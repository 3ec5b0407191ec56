"""Derived formats of the block-paged descriptor: the wire structs as ``struct.Struct``s
with every field's offset (``wire/fast.py``), shared by the decoder and the encoder."""

from __future__ import annotations

from struct import Struct

from hurray_wire.wire import descriptor as w
from hurray_wire.wire.fast import array_struct, derive, item_struct

HEADER = derive(w.FIXED_HEADER)
FIXED = derive(w.BLOCK_PAGED_FIXED)  # header .. buffer_count of a rank-3 block-paged descriptor
HANDLE = derive(w.BUFFER_HANDLE)
QHEADER = derive(w.QUANT_HEADER)
SCHEME = {tag: derive(defn) for tag, defn in w.SCHEME_PAYLOADS.items()}
STATS = derive(w.STATISTICS)
EXTENSION = derive(w.EXTENSION_TYPE)
MEMBER = derive(w.COMPOSITE_MEMBER)
U32 = item_struct(w.QUANT_LENGTH)  # quantization_length

AT = FIXED.offsets  # byte offset of every fixed field, e.g. AT["flags"] == 10
BUFFER_TABLE_AT = FIXED.size  # 85: the buffer handles of a rank-3 descriptor start here
COUNT_SIZE = item_struct(w.BUFFER_COUNT).size  # the u8 buffer_count before the handles
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
    item = w.SHARD.parent_shape.subcon.subcon
    return array_struct(item, len(w.SHARD.subcons) * rank)
