"""Plain-data summaries and hex annotations of descriptors and blobs, for ``dump``.

Everything here returns JSON-ready dicts and lists; the CLI decides how to print them.
The JSON shape is ``schemas/dump.schema.json``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hurray_wire import blob as blob_codec
from hurray_wire import codecs
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

__all__ = [
    "describe_descriptor",
    "describe_header",
    "describe_tensor",
    "describe_blob_envelope",
    "annotate_descriptor",
    "annotate_blob",
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
    view = memoryview(data).cast("B")
    fields = blob_codec._HEADER.struct.unpack_from(view, 0)
    count = fields[6]
    sections = []
    for number in range(count):
        entry = blob_codec._ENTRY.struct.unpack_from(view, 32 + 48 * number)
        kind = wire.SECTION_KINDS.get(entry[0], f"unknown_0x{entry[0]:02X}")
        sections.append(
            {
                "kind": kind,
                "index": entry[4],
                "required": bool(entry[1] & wire.FLAG_REQUIRED),
                "codec": codecs.registry.name_or_id(entry[2]),
                "codec_param": entry[3],
                "offset": entry[5],
                "stored_size": entry[6],
                "raw_size": entry[7],
                "alignment": entry[9],
                "checksum": f"0x{entry[8]:016x}" if fields[7] else None,
            }
        )
    return {
        "version": f"{fields[1]}.{fields[2]}",
        "total_length": fields[4],
        "header_length": fields[5],
        "checksum_type": "xxh3_64" if fields[7] == wire.CHECKSUM_XXH3_64 else "none",
        "checksums_verified": verified and fields[7] == wire.CHECKSUM_XXH3_64,
        "sections": sections,
    }


# -- annotated hex --------------------------------------------------------------------------
Annotation = tuple[int, int, str, str]  # offset, size, field name, value text

_DESCRIPTOR_FIELDS: list[tuple[int, int, str]] = [
    (0, 4, "magic"),
    (4, 1, "version_major"),
    (5, 1, "version_minor"),
    (6, 4, "descriptor_length"),
    (10, 4, "flags"),
    (14, 1, "type_tag"),
    (15, 1, "layout_tag"),
    (16, 4, "rank"),
    (20, 8, "shape[0] total_tokens"),
    (28, 8, "shape[1] num_heads"),
    (36, 8, "shape[2] head_dim"),
    (44, 8, "byte_offset"),
    (52, 4, "page_size"),
    (56, 8, "num_pages"),
    (64, 4, "paged_axis"),
    (68, 4, "num_seqs"),
    (72, 1, "kv_role"),
    (73, 4, "layer_index"),
    (77, 1, "block_table_index_type"),
    (78, 6, "_reserved"),
    (84, 1, "buffer_count"),
]
_HANDLE_FIELDS = [
    (0, 8, "byte_size"),
    (8, 4, "alignment"),
    (12, 1, "device_tag"),
    (13, 1, "sync_mode"),
    (14, 1, "memory_class"),
    (15, 1, "_reserved"),
]


def _value(raw: bytes, name: str) -> str:
    if name == "magic":
        return repr(raw.decode("latin-1"))
    if name.startswith("_reserved"):
        return "zero" if not any(raw) else "NON-ZERO"
    number = int.from_bytes(raw, "little")
    if name == "layer_index" and number == 0xFFFFFFFF:
        return LAYER_NONE_TEXT
    if name == "kv_role":
        return {0: "key", 1: "value", 2: "fused"}.get(number, str(number))
    if name == "block_table_index_type":
        return {0: "uint32", 1: "uint64"}.get(number, str(number))
    if name in ("flags", "type_tag", "layout_tag"):
        return f"0x{number:0{2 * len(raw)}X}"
    return str(number)


def annotate_descriptor(raw: bytes, base: int = 0) -> list[Annotation]:
    """Named fields of a block-paged descriptor, for an annotated hex dump."""
    out: list[Annotation] = []
    for offset, size, name in _DESCRIPTOR_FIELDS:
        out.append((base + offset, size, name, _value(raw[offset : offset + size], name)))
    count = raw[84] if len(raw) > 84 else 0
    for index in range(count):
        start = 85 + 16 * index
        for offset, size, name in _HANDLE_FIELDS:
            piece = raw[start + offset : start + offset + size]
            out.append(
                (base + start + offset, size, f"buffers[{index}].{name}", _value(piece, name))
            )
    end = 85 + 16 * count
    if end < len(raw):
        out.append((base + end, len(raw) - end, "optional sections", f"{len(raw) - end} bytes"))
    return out


_BLOB_FIELDS = [
    (0, 4, "magic"),
    (4, 1, "version_major"),
    (5, 1, "version_minor"),
    (6, 2, "header_flags"),
    (8, 8, "total_length"),
    (16, 4, "header_length"),
    (20, 2, "section_count"),
    (22, 1, "checksum_type"),
    (23, 1, "_reserved"),
    (24, 4, "descriptor_length"),
    (28, 4, "_reserved"),
]
_ENTRY_FIELDS = [
    (0, 1, "kind"),
    (1, 1, "section_flags"),
    (2, 1, "codec"),
    (3, 1, "codec_param"),
    (4, 4, "index"),
    (8, 8, "offset"),
    (16, 8, "stored_size"),
    (24, 8, "raw_size"),
    (32, 8, "checksum"),
    (40, 4, "alignment"),
    (44, 4, "_reserved"),
]


def annotate_blob(data: Any) -> list[Annotation]:
    """Named fields of a blob's header, section table, descriptor and payload extents."""
    view = bytes(memoryview(data).cast("B")[: blob_codec.blob_length(data)])
    out: list[Annotation] = []
    for offset, size, name in _BLOB_FIELDS:
        value = _value(view[offset : offset + size], name)
        if name == "checksum_type":
            value = {"0": "none", "1": "xxh3_64"}.get(value, value)
        out.append((offset, size, f"header.{name}", value))
    count = int.from_bytes(view[20:22], "little")
    header_length = int.from_bytes(view[16:20], "little")
    for number in range(count):
        start = 32 + 48 * number
        for offset, size, name in _ENTRY_FIELDS:
            piece = view[start + offset : start + offset + size]
            value = _value(piece, name)
            if name == "kind":
                value = wire.SECTION_KINDS.get(piece[0], f"unknown 0x{piece[0]:02X}")
            elif name == "codec":
                value = codecs.registry.name_or_id(piece[0])
            elif name == "checksum":
                value = f"0x{int.from_bytes(piece, 'little'):016x}"
            out.append((start + offset, size, f"section[{number}].{name}", value))
    desc_start = 32 + 48 * count
    out.extend(annotate_descriptor(view[desc_start:header_length], desc_start))
    checksum = int.from_bytes(view[header_length : header_length + 8], "little")
    out.append((header_length, 8, "header_checksum", f"0x{checksum:016x}"))
    cursor = header_length + 8
    for number in range(count):
        start = 32 + 48 * number
        offset = int.from_bytes(view[start + 8 : start + 16], "little")
        stored = int.from_bytes(view[start + 16 : start + 24], "little")
        kind = wire.SECTION_KINDS.get(view[start], "unknown")
        if offset > cursor:
            out.append((cursor, offset - cursor, "padding", "zero"))
        if view[start + 2] == codecs.CODEC_CHUNKED:
            out.extend(_annotate_chunk_table(view, offset, stored, f"section[{number}]", kind))
        else:
            out.append((offset, stored, f"section[{number}] payload", f"{kind}, {stored} bytes"))
        cursor = offset + stored
    if len(view) > cursor:
        out.append((cursor, len(view) - cursor, "padding", "zero"))
    return out


def _annotate_chunk_table(
    view: bytes, offset: int, stored: int, name: str, kind: str
) -> list[Annotation]:
    """The chunk table of a chunked-shuffle-zstd payload, field by field, then its frames."""
    if stored < 8:
        return [(offset, stored, f"{name} payload", f"{kind}, {stored} bytes")]
    chunk_size = int.from_bytes(view[offset : offset + 4], "little")
    count = int.from_bytes(view[offset + 4 : offset + 8], "little")
    out: list[Annotation] = [
        (offset, 4, f"{name}.chunk_size", str(chunk_size)),
        (offset + 4, 4, f"{name}.chunk_count", str(count)),
    ]
    table_end = 8 + 4 * count
    if table_end > stored:
        out.append((offset + 8, stored - 8, f"{name} payload", f"{kind}, rest of the table"))
        return out
    for i in range(count):
        at = offset + 8 + 4 * i
        size = int.from_bytes(view[at : at + 4], "little")
        out.append((at, 4, f"{name}.frame_size[{i}]", str(size)))
    frames = stored - table_end
    out.append(
        (offset + table_end, frames, f"{name} frames", f"{count} zstd frames, {frames} bytes")
    )
    return out
