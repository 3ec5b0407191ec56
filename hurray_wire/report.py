"""Plain-data summaries and hex annotations of descriptors and blobs, for ``dump``.

Everything here returns JSON-ready dicts and lists; the CLI decides how to print them.
The JSON shape is ``schemas/dump.schema.json``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hurray_wire import blob as blob_codec
from hurray_wire import codecs
from hurray_wire.buffers import byte_view
from hurray_wire.dtypes import element_type_from_tag
from hurray_wire.errors import HurrayWireError
from hurray_wire.model.descriptor import (
    DEVICE_NAMES,
    MEMORY_CLASS_NAMES,
    SYNC_MODE_NAMES,
    BufferHandle,
    Statistics,
    TensorDescriptor,
)
from hurray_wire.model.descriptor_codec import DescriptorHeader
from hurray_wire.model.quantization import Quantization
from hurray_wire.tensor import BlockPagedTensor
from hurray_wire.wire import blob as wire
from hurray_wire.wire import descriptor as wd
from hurray_wire.wire import stream as ws
from hurray_wire.wire.fast import derive

__all__ = [
    "annotate_blob",
    "annotate_chunk_table",
    "annotate_descriptor",
    "annotate_end_record",
    "annotate_stream",
    "annotate_stream_header",
    "describe_blob_envelope",
    "describe_descriptor",
    "describe_header",
    "describe_tensor",
]

LAYER_NONE_TEXT = "none (0xFFFFFFFF)"


def _handle(handle: BufferHandle, name: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {} if name is None else {"name": name}
    out.update(
        byte_size=handle.byte_size,
        alignment=handle.alignment,
        device=DEVICE_NAMES.get(handle.device_tag, f"private_0x{handle.device_tag:02X}"),
        device_tag=handle.device_tag,
        sync_mode=SYNC_MODE_NAMES[handle.sync_mode],
        memory_class=MEMORY_CLASS_NAMES.get(
            handle.memory_class, f"private_0x{handle.memory_class:02X}"
        ),
    )
    return out


def _quantization(quant: Quantization | None) -> dict[str, Any] | None:
    if quant is None:
        return None
    fields: dict[str, Any] = {"scheme": quant.name, "scheme_tag": quant.scheme_tag}
    for key, value in vars(quant).items():
        fields[key] = getattr(value, "name", value)
    scale_type = getattr(quant, "scale_type", None)
    if scale_type is not None:
        fields["scale_type"] = scale_type.name
    return fields


def _statistics(stats: Statistics | None) -> dict[str, Any] | None:
    if stats is None:
        return None
    return {k: (v if not isinstance(v, float) or v == v else "nan") for k, v in vars(stats).items()}


def describe_descriptor(desc: TensorDescriptor) -> dict[str, Any]:
    """Every field of a block-paged descriptor by its spec name."""
    layout = desc.layout
    return {
        "version": f"{desc.version[0]}.{desc.version[1]}",
        "descriptor_length": desc.descriptor_length,
        "flags": f"0x{desc.flags:08X}",
        "element_type": desc.element_type.name,
        "type_tag": f"0x{desc.element_type.tag:02X}",
        "shape": list(desc.shape),
        "byte_offset": 0,
        "layout": {
            "name": "block_paged",
            "tag": "0x0A",
            "page_size": layout.page_size,
            "num_pages": layout.num_pages,
            "paged_axis": layout.paged_axis,
            "num_seqs": layout.num_seqs,
            "kv_role": layout.kv_role,
            "layer_index": LAYER_NONE_TEXT if layout.layer_index is None else layout.layer_index,
            "block_table_index_type": layout.block_table_index_type,
        },
        "buffers": [_handle(h, n) for h, n in zip(desc.buffers, desc.buffer_names, strict=True)],
        "quantization": _quantization(desc.quantization),
        "statistics": _statistics(desc.statistics),
        "composite_member": desc.composite_member,
        "unknown_trailing_bytes": len(desc.unknown_trailing),
    }


def describe_header(header: DescriptorHeader) -> dict[str, Any]:
    """The common header of a descriptor of any layout."""
    return {
        "version": f"{header.version_major}.{header.version_minor}",
        "descriptor_length": header.descriptor_length,
        "flags": f"0x{header.flags:08X}",
        "element_type": None if header.element_type is None else header.element_type.name,
        "type_tag": f"0x{header.type_tag:02X}",
        "shape": list(header.shape),
        "byte_offset": header.byte_offset,
        "layout": {
            "name": header.layout_name,
            "tag": f"0x{header.layout_tag:02X}",
            **{k: v for k, v in header.layout_fields.items() if isinstance(v, (int, str, list))},
        },
        "buffers": [_handle(h) for h in header.buffers],
        "quantization": _quantization(header.quantization),
        "statistics": _statistics(header.statistics),
        "composite_member": header.composite_member,
        "has_shard": header.has_shard,
        "unknown_trailing_bytes": len(header.unknown_trailing),
    }


def describe_tensor(tensor: BlockPagedTensor) -> dict[str, Any]:
    """What the index buffers say: sequences, pages per sequence, sharing, occupancy."""
    seq_ptr = tensor.seq_ptr.astype(np.int64)
    pages = np.diff(seq_ptr) if len(seq_ptr) > 1 else np.zeros(0, np.int64)
    table = tensor.block_table.astype(np.int64)
    num_pages = tensor.layout.num_pages
    referenced = np.unique(table)
    shared = 0
    if len(table) and tensor.num_seqs:
        seq_of_entry = np.repeat(np.arange(tensor.num_seqs), pages)
        pairs = np.unique(np.stack([table, seq_of_entry]), axis=1)
        _, counts = np.unique(pairs[0], return_counts=True)
        shared = int((counts > 1).sum())
    out: dict[str, Any] = {
        "sequences": tensor.num_seqs,
        "logical_pages": len(table),
        "pages_per_sequence": _spread(pages),
        "tokens_per_sequence": None,
        "shared_pages": shared,
        "pool_pages_referenced": len(referenced),
        "pool_occupancy": (len(referenced) / num_pages) if num_pages else 0.0,
    }
    if tensor.seq_lens is not None:
        out["tokens_per_sequence"] = _spread(tensor.seq_lens.astype(np.int64))
    return out


def _spread(values: np.ndarray) -> dict[str, float | int] | None:
    if len(values) == 0:
        return None
    return {
        "min": int(values.min()),
        "median": float(np.median(values)),
        "max": int(values.max()),
    }


def describe_blob_envelope(data: Any, verified: bool) -> dict[str, Any]:
    """The blob's own header and section table (assumes ``data`` was decoded already)."""
    view = byte_view(data)
    head = _BLOB_HEADER.unpack_dict(view, 0)
    checksummed = head["checksum_type"] == wire.CHECKSUM_XXH3_64
    sections = []
    for number in range(head["section_count"]):
        entry = _ENTRY.unpack_dict(view, _entry_at(number))
        kind = wire.SECTION_KINDS.get(entry["kind"], f"unknown_0x{entry['kind']:02X}")
        sections.append(
            {
                "kind": kind,
                "index": entry["index"],
                "required": bool(entry["section_flags"] & wire.FLAG_REQUIRED),
                "codec": codecs.registry.name_or_id(entry["codec"]),
                "codec_param": entry["codec_param"],
                "offset": entry["offset"],
                "stored_size": entry["stored_size"],
                "raw_size": entry["raw_size"],
                "alignment": entry["alignment"],
                "checksum": f"0x{entry['checksum']:016x}" if head["checksum_type"] else None,
            }
        )
    return {
        "version": f"{head['version_major']}.{head['version_minor']}",
        "total_length": head["total_length"],
        "header_length": head["header_length"],
        "checksum_type": _CHECKSUM_NAMES.get(head["checksum_type"], "none"),
        "checksums_verified": verified and checksummed,
        "sections": sections,
    }


def _entry_at(number: int) -> int:
    """Byte offset of section entry ``number``: the table follows the fixed header."""
    return _BLOB_HEADER.size + _ENTRY.size * number


# -- annotated hex --------------------------------------------------------------------------
Annotation = tuple[int, int, str, str]  # offset, size, field name, value text

_DESCRIPTOR = derive(wd.BLOCK_PAGED_FIXED)
_HANDLE = derive(wd.BUFFER_HANDLE)
_BLOB_HEADER = derive(wire.BLOB_HEADER)
_ENTRY = derive(wire.SECTION_ENTRY)
_CHECKSUM = derive(wire.HEADER_CHECKSUM)
_CHUNK_HEAD = derive(wire.CHUNK_TABLE_HEADER)
_CHECKSUM_NAMES = {wire.CHECKSUM_NONE: "none", wire.CHECKSUM_XXH3_64: "xxh3_64"}
_ROLE_NAMES = {code: name for name, code in wd.KV_ROLES.items()}
_INDEX_TYPE_NAMES = {code: name for name, code in wd.INDEX_TYPES.items()}
_SHAPE_LABELS = {
    "shape[0]": "shape[0] total_tokens",
    "shape[1]": "shape[1] num_heads",
    "shape[2]": "shape[2] head_dim",
}


def _label(name: str) -> str:
    """The name a dump shows: reserved fields are all ``_reserved``; shape axes say what
    they count."""
    if name.startswith("_reserved"):
        return "_reserved"
    return _SHAPE_LABELS.get(name, name)


def _value(raw: bytes, name: str) -> str:
    if name == "magic":
        return repr(raw.decode("latin-1"))
    if name.startswith("_reserved"):
        return "zero" if not any(raw) else "NON-ZERO"
    number = int.from_bytes(raw, "little")
    if name == "layer_index" and number == 0xFFFFFFFF:
        return LAYER_NONE_TEXT
    if name == "kv_role":
        return _ROLE_NAMES.get(number, str(number))
    if name == "block_table_index_type":
        return _INDEX_TYPE_NAMES.get(number, str(number))
    if name in ("flags", "type_tag", "layout_tag"):
        return f"0x{number:0{2 * len(raw)}X}"
    return str(number)


def annotate_descriptor(raw: bytes, base: int = 0) -> list[Annotation]:
    """Named fields of a block-paged descriptor, for an annotated hex dump."""
    out: list[Annotation] = []
    for offset, size, name in _DESCRIPTOR.fields:
        label = _label(name)
        out.append((base + offset, size, label, _value(raw[offset : offset + size], label)))
    at_count = _DESCRIPTOR.offsets["buffer_count"]
    count = raw[at_count] if len(raw) > at_count else 0
    for index in range(count):
        start = _DESCRIPTOR.size + _HANDLE.size * index
        for offset, size, name in _HANDLE.fields:
            piece = raw[start + offset : start + offset + size]
            label = _label(name)
            out.append(
                (base + start + offset, size, f"buffers[{index}].{label}", _value(piece, label))
            )
    end = _DESCRIPTOR.size + _HANDLE.size * count
    if end < len(raw):
        out.append((base + end, len(raw) - end, "optional sections", f"{len(raw) - end} bytes"))
    return out


def annotate_blob(data: Any) -> list[Annotation]:
    """Named fields of a blob's header, section table, descriptor and payload extents."""
    view = bytes(memoryview(data).cast("B")[: blob_codec.blob_length(data)])
    out: list[Annotation] = []
    for offset, size, name in _BLOB_HEADER.fields:
        label = _label(name)
        value = _value(view[offset : offset + size], label)
        if name == "checksum_type":
            value = _CHECKSUM_NAMES.get(int(value), value)
        out.append((offset, size, f"header.{label}", value))
    head = _BLOB_HEADER.unpack_dict(view, 0)
    count = head["section_count"]
    header_length = head["header_length"]
    entries = [_ENTRY.unpack_dict(view, _entry_at(number)) for number in range(count)]
    for number in range(count):
        start = _entry_at(number)
        for offset, size, name in _ENTRY.fields:
            piece = view[start + offset : start + offset + size]
            name = _label(name)
            value = _value(piece, name)
            if name == "kind":
                value = wire.SECTION_KINDS.get(piece[0], f"unknown 0x{piece[0]:02X}")
            elif name == "codec":
                value = codecs.registry.name_or_id(piece[0])
            elif name == "checksum":
                value = f"0x{int.from_bytes(piece, 'little'):016x}"
            out.append((start + offset, size, f"section[{number}].{name}", value))
    desc_start = _entry_at(count)
    out.extend(annotate_descriptor(view[desc_start:header_length], desc_start))
    (checksum,) = _CHECKSUM.struct.unpack_from(view, header_length)
    out.append((header_length, _CHECKSUM.size, "header_checksum", f"0x{checksum:016x}"))
    cursor = header_length + _CHECKSUM.size
    for number, entry in enumerate(entries):
        offset, stored = entry["offset"], entry["stored_size"]
        kind = wire.SECTION_KINDS.get(entry["kind"], "unknown")
        if offset > cursor:
            out.append((cursor, offset - cursor, "padding", "zero"))
        if entry["codec"] == codecs.CODEC_CHUNKED:
            out.extend(annotate_chunk_table(view, offset, stored, f"section[{number}]", kind))
        else:
            out.append((offset, stored, f"section[{number}] payload", f"{kind}, {stored} bytes"))
        cursor = offset + stored
    if len(view) > cursor:
        out.append((cursor, len(view) - cursor, "padding", "zero"))
    return out


def annotate_chunk_table(
    view: bytes, offset: int, stored: int, name: str, kind: str
) -> list[Annotation]:
    """The chunk table of a chunked-shuffle-zstd payload, field by field, then its frames."""
    head_size = _CHUNK_HEAD.size
    if stored < head_size:
        return [(offset, stored, f"{name} payload", f"{kind}, {stored} bytes")]
    head = _CHUNK_HEAD.unpack_dict(view, offset)
    count = head["chunk_count"]
    out: list[Annotation] = [
        (offset + at, size, f"{name}.{field}", str(head[field]))
        for at, size, field in _CHUNK_HEAD.fields
    ]
    frame_size = wire.CHUNK_FRAME_SIZE.sizeof()
    table_end = head_size + frame_size * count
    if table_end > stored:
        out.append(
            (
                offset + head_size,
                stored - head_size,
                f"{name} payload",
                f"{kind}, rest of the table",
            )
        )
        return out
    for i in range(count):
        at = offset + head_size + frame_size * i
        size = int.from_bytes(view[at : at + frame_size], "little")
        out.append((at, frame_size, f"{name}.frame_size[{i}]", str(size)))
    frames = stored - table_end
    out.append(
        (offset + table_end, frames, f"{name} frames", f"{count} zstd frames, {frames} bytes")
    )
    return out


# -- annotated hex of a blob stream ---------------------------------------------------------
_PREFIX = derive(ws.RECORD_PREFIX)
_STREAM_HEADER = derive(ws.STREAM_HEADER)
_END_RECORD = derive(ws.END_RECORD)
_END_ENTRY = derive(ws.END_ENTRY)
_END_FOOTER = derive(ws.END_FOOTER)
_RECORD_CHECKSUM = derive(ws.RECORD_CHECKSUM)
_MINIMUM = {
    ws.STREAM_MAGIC: _STREAM_HEADER.size + _RECORD_CHECKSUM.size,
    ws.END_MAGIC: _END_RECORD.size + _END_FOOTER.size,
}
_ROLE_BIT_NAMES = {bit: name for name, bit in ws.ROLE_BITS.items()}


def _stream_value(raw: bytes, name: str) -> str:
    """A stream record field as a dump shows it: sentinels and bit sets by name."""
    number = int.from_bytes(raw, "little")
    if name == "num_layers" and number == ws.NUM_LAYERS_UNKNOWN:
        return "unknown (0xFFFFFFFF)"
    if name == "kv_roles":
        roles = [role for bit, role in _ROLE_BIT_NAMES.items() if number & bit]
        return f"0x{number:02X} ({', '.join(roles) or 'unstated'})"
    if name == "element_type":
        if number == ws.ELEMENT_TYPE_UNKNOWN:
            return "unstated (0x00)"
        try:
            return f"{element_type_from_tag(number).name} (0x{number:02X})"
        except HurrayWireError:
            return f"0x{number:02X}"
    if name in ("stream_flags", "end_flags"):
        return f"0x{number:04X}"
    return _value(raw, name)


def _fixed(struct: Any, view: bytes, base: int, prefix: str) -> list[Annotation]:
    out: list[Annotation] = []
    for offset, size, name in struct.fields:
        label = _label(name)
        value = _stream_value(view[offset : offset + size], label)
        out.append((base + offset, size, f"{prefix}.{label}", value))
    return out


def _tail(view: bytes, base: int, cursor: int, stop: int, out: list[Annotation]) -> None:
    if stop > cursor:
        out.append(
            (
                base + cursor,
                stop - cursor,
                "padding",
                "zero" if not any(view[cursor:stop]) else "NON-ZERO",
            )
        )


def annotate_stream_header(data: Any, base: int = 0) -> list[Annotation]:
    """Named fields of a stream header record (docs/streaming.md) that starts ``data``.

    Offsets are ``base`` + the offset in the record: the stream offset when ``data`` is the
    record's slice of the stream.
    """
    view = bytes(memoryview(data).cast("B"))
    head = _STREAM_HEADER.unpack_dict(view, 0)
    total = min(head["total_length"], len(view))
    out = _fixed(_STREAM_HEADER, view, base, "stream_header")
    cursor = _STREAM_HEADER.size
    name_length, metadata_length = head["model_name_length"], head["metadata_length"]
    model = view[cursor : cursor + name_length]
    out.append(
        (
            base + cursor,
            name_length,
            "stream_header.model_name",
            repr(model.decode("utf-8", "replace")),
        )
    )
    cursor += name_length
    if metadata_length:
        out.append(
            (
                base + cursor,
                metadata_length,
                "stream_header.metadata",
                f"KV section, {metadata_length} bytes",
            )
        )
    cursor += metadata_length
    at_checksum = total - _RECORD_CHECKSUM.size
    _tail(view, base, cursor, at_checksum, out)
    (checksum,) = _RECORD_CHECKSUM.struct.unpack_from(view, at_checksum)
    out.append(
        (base + at_checksum, _RECORD_CHECKSUM.size, "stream_header.checksum", f"0x{checksum:016x}")
    )
    return out


def annotate_end_record(data: Any, base: int = 0) -> list[Annotation]:
    """Named fields of an end record: the fixed part, each index entry, the footer."""
    view = bytes(memoryview(data).cast("B"))
    head = _END_RECORD.unpack_dict(view, 0)
    total = min(head["total_length"], len(view))
    out = _fixed(_END_RECORD, view, base, "end_record")
    cursor = _END_RECORD.size
    footer = total - _END_FOOTER.size
    for number in range(head["entry_count"]):
        if cursor + _END_ENTRY.size > footer:
            break
        out.extend(_fixed(_END_ENTRY, view[cursor:], base + cursor, f"end_record.entry[{number}]"))
        cursor += _END_ENTRY.size
    _tail(view, base, cursor, footer, out)
    for offset, size, name in _END_FOOTER.fields:
        piece = view[footer + offset : footer + offset + size]
        value = (
            f"0x{int.from_bytes(piece, 'little'):016x}"
            if name == "checksum"
            else _value(piece, name)
        )
        out.append((base + footer + offset, size, f"end_record.{name}", value))
    return out


def annotate_stream(data: Any) -> list[Annotation]:
    """Every record of a blob stream: the stream header, each blob, the end record.

    Records are framed by their 16-byte prefix and told apart by magic; a record that the
    input cuts short, or bytes that are no record, end the listing with one line saying so
    (the dump shows what is there; ``validate`` says what is wrong).
    """
    view = memoryview(data).cast("B")
    out: list[Annotation] = []
    pos = 0
    number = 0
    while pos < len(view):
        if len(view) - pos < _PREFIX.size:
            out.append(
                (
                    pos,
                    len(view) - pos,
                    "cut record",
                    f"{len(view) - pos} bytes, shorter than a record prefix",
                )
            )
            break
        prefix = _PREFIX.unpack_dict(view, pos)
        magic, total = prefix["magic"], prefix["total_length"]
        if magic not in (ws.STREAM_MAGIC, wire.BLOB_MAGIC, ws.END_MAGIC) or total < _PREFIX.size:
            out.append(
                (
                    pos,
                    len(view) - pos,
                    "not a record",
                    f"magic {magic.hex(' ')}, {len(view) - pos} bytes",
                )
            )
            break
        if pos + total > len(view):
            out.append(
                (
                    pos,
                    len(view) - pos,
                    "cut record",
                    f"{magic.decode('latin-1')!r}: {total} bytes declared, "
                    f"{len(view) - pos} present",
                )
            )
            break
        record = view[pos : pos + total]
        minimum = _MINIMUM.get(magic, 0)
        if total < minimum:
            out.append((pos, total, "short record", f"{total} bytes, under {minimum}"))
            break
        if magic == ws.STREAM_MAGIC:
            out.extend(annotate_stream_header(record, pos))
        elif magic == ws.END_MAGIC:
            out.extend(annotate_end_record(record, pos))
        else:
            out.append((pos, 0, f"blob {number}", f"{total} bytes"))
            out.extend(
                (pos + at, size, f"blob[{number}].{name}", value)
                for at, size, name, value in annotate_blob(record)
            )
            number += 1
        pos += total
    return out
