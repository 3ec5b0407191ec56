"""Plain-data summaries and hex annotations of descriptors and blobs, for ``dump``.

Everything here returns JSON-ready dicts and lists; the CLI decides how to print them.
The JSON shape is ``hurray_wire/schemas/dump.schema.json``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

import numpy as np

from hurray_wire import blob as blob_codec, codecs
from hurray_wire.blob.envelope import entry_at
from hurray_wire.buffers import byte_view
from hurray_wire.containers import HrryFile, StreamFile, StreamHeader
from hurray_wire.dtypes import element_type_from_tag
from hurray_wire.errors import HurrayWireError, UnsupportedLayoutError
from hurray_wire.integrity import MemoryPageStore, logical_positions
from hurray_wire.model.descriptor import (
    MEMORY_CLASS_NAMES,
    SYNC_MODE_NAMES,
    BufferHandle,
    Statistics,
    TensorDescriptor,
    device_name,
)
from hurray_wire.model.descriptor_codec import (
    DescriptorHeader,
    decode_descriptor,
    decode_header,
    encode_descriptor,
)
from hurray_wire.model.quantization import Quantization
from hurray_wire.tensor import BlockPagedTensor
from hurray_wire.transforms.compact import prefix_sharing
from hurray_wire.wire import (
    blob as wire,
    descriptor as wd,
    records as wr,
    stream as ws,
)
from hurray_wire.wire.descriptor import FIXED as _DESCRIPTOR, HANDLE as _HANDLE

__all__ = [
    "Framing",
    "Item",
    "annotate_blob",
    "annotate_chunk_table",
    "annotate_descriptor",
    "annotate_hrry",
    "annotate_stream",
    "bare_descriptor",
    "check_blob",
    "describe_arrays",
    "describe_blob_envelope",
    "describe_container",
    "describe_descriptor",
    "describe_header",
    "describe_pages",
    "describe_tensor",
    "dump_item",
    "framing",
]

LAYER_NONE_TEXT = "none (0xFFFFFFFF)"


def _handle(handle: BufferHandle) -> dict[str, Any]:
    return {
        **asdict(handle),  # byte_size, alignment, device_tag as they are; the codes named:
        "device": device_name(handle.device_tag),
        "sync_mode": SYNC_MODE_NAMES[handle.sync_mode],
        "memory_class": MEMORY_CLASS_NAMES.get(
            handle.memory_class, f"private_0x{handle.memory_class:02X}"
        ),
    }


def _quantization(quant: Quantization | None) -> dict[str, Any] | None:
    if quant is None:
        return None
    fields = {"scheme": quant.name, "scheme_tag": quant.scheme_tag, **vars(quant)}
    if (scale_type := getattr(quant, "scale_type", None)) is not None:  # a property, not in vars
        fields["scale_type"] = scale_type
    return {k: getattr(v, "name", v) for k, v in fields.items()}  # element types by name


def _statistics(stats: Statistics | None) -> dict[str, Any] | None:
    if stats is None:
        return None
    return {k: (v if not isinstance(v, float) or v == v else "nan") for k, v in vars(stats).items()}


def describe_descriptor(desc: TensorDescriptor) -> dict[str, Any]:
    """Every field of a block-paged descriptor by its spec name: its header's description
    (as of any layout), the buffers named."""
    out = describe_header(decode_header(encode_descriptor(desc)))
    del out["has_shard"]  # never set on block-paged
    out["buffers"] = [
        {"name": name, **fields}
        for fields, name in zip(out["buffers"], desc.buffer_names, strict=True)
    ]
    return out


def describe_header(header: DescriptorHeader) -> dict[str, Any]:
    """The common header of a descriptor of any layout."""
    layout = dict(header.layout_fields)
    if "layer_index" in layout and layout["layer_index"] is None:
        layout["layer_index"] = LAYER_NONE_TEXT  # block-paged, not layer-scoped
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
            **{k: v for k, v in layout.items() if isinstance(v, (int, str, list))},
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
    shared = sum(len(seqs) > 1 for seqs in prefix_sharing(tensor).values())
    seq_lens = tensor.seq_lens
    return {
        "sequences": tensor.num_seqs,
        "logical_pages": len(table),
        "pages_per_sequence": _spread(pages),
        "tokens_per_sequence": None if seq_lens is None else _spread(seq_lens.astype(np.int64)),
        "shared_pages": shared,
        "pool_pages_referenced": len(referenced),
        "pool_occupancy": (len(referenced) / num_pages) if num_pages else 0.0,
    }


def describe_arrays(tensor: BlockPagedTensor) -> dict[str, list[int] | None]:
    """The index arrays themselves (``dump --index``): block_table, seq_ptr, seq_lens."""
    arrays = {name: getattr(tensor, name) for name in ("block_table", "seq_ptr", "seq_lens")}
    return {k: None if a is None else a.astype(np.int64).tolist() for k, a in arrays.items()}


def check_blob(data: Any, verify: bool) -> tuple[BlockPagedTensor, dict[str, Any]]:
    """Decode one blob for ``dump`` / ``validate``: the tensor and its pages (those failing
    their digest named by id and place, those held by reference listed and left zero)."""
    store = MemoryPageStore(0)  # holds nothing: a delta blob read without its receiver's store
    report = blob_codec.decode_report(data, verify=verify, page_store=store)
    return report.tensor, describe_pages(report)


def describe_pages(report: Any) -> dict[str, Any]:
    """A ``DecodeReport`` as data: bad pages (digest mismatch) by physical id and logical
    ``[sequence, page_in_sequence]``, and the pages held by reference."""
    bad = np.union1d(report.digest_mismatch, report.corrupt).astype(np.int64)
    _, seqs, at = logical_positions(report.tensor.block_table, report.tensor.seq_ptr, bad)
    return {
        "digests": bool(report.has_digests),
        "bad_pages": bad.tolist(),
        "bad_positions": [list(p) for p in zip(seqs.tolist(), at.tolist(), strict=True)],
        "by_reference": report.missing.astype(np.int64).tolist(),
    }


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
        entry = _ENTRY.unpack_dict(view, entry_at(number))  # every field but these, as stored
        kind, flags, _ = entry.pop("kind"), entry.pop("section_flags"), entry.pop("_reserved")
        entry.update(
            kind=wire.SECTION_KINDS.get(kind, f"unknown_0x{kind:02X}"),
            required=bool(flags & wire.FLAG_REQUIRED),
            codec=codecs.registry.name_or_id(entry["codec"]),
            checksum=f"0x{entry['checksum']:016x}" if head["checksum_type"] else None,
        )
        sections.append(entry)
    return {
        "version": f"{head['version_major']}.{head['version_minor']}",
        "total_length": head["total_length"],
        "header_length": head["header_length"],
        "checksum_type": _CHECKSUM_NAMES.get(head["checksum_type"], "none"),
        "checksums_verified": verified and checksummed,
        "sections": sections,
    }


# -- what dump shows of an input ------------------------------------------------------------
@dataclass
class Item:
    """One thing found in an input: a tensor (with its blob bytes) or a descriptor;
    ``pages`` is what the blob's page sections said (``check_blob``)."""

    label: str
    kind: str
    tensor: BlockPagedTensor | None = None
    blob: Any = None
    descriptor_bytes: bytes | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    pages: dict[str, Any] | None = None


def dump_item(item: Item, verify: bool, arrays: bool = False) -> dict[str, Any]:
    """One item as the JSON of ``dump --json`` (``arrays``: the index arrays too)."""
    out: dict[str, Any] = {"item": item.label, "kind": item.kind}
    if item.descriptor_bytes is not None:
        out["descriptor"] = bare_descriptor(item.descriptor_bytes)[0]
        return out
    if "header" in item.extra:
        out["descriptor"] = describe_header(item.extra["header"])
        return out
    tensor = item.tensor
    assert tensor is not None
    if item.blob is not None:
        out["envelope"] = describe_blob_envelope(item.blob, verify)
    out["descriptor"] = describe_descriptor(tensor.descriptor)
    out["index"] = describe_tensor(tensor)
    out["seq_lens_present"] = tensor.seq_lens is not None
    if item.pages is not None:
        out["pages"] = item.pages
    if arrays:
        out["arrays"] = describe_arrays(tensor)
    out["metadata"] = {k: _jsonable(v) for k, v in tensor.metadata.items()}
    return out


def bare_descriptor(data: Any) -> tuple[dict[str, Any], str]:
    """A bare descriptor, checked: its report and what it is in a few words. A descriptor of
    another layout is valid Hurray: its common header is what can be checked."""
    try:
        desc = decode_descriptor(data)
    except UnsupportedLayoutError as exc:
        checked = describe_header(decode_header(data))
        return checked, f"{exc.layout_name} layout, common header checked"
    what = f"block_paged {desc.element_type.name} {list(desc.shape)}"
    return describe_descriptor(desc), what


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    return value


class Framing(NamedTuple):
    """What an input's framing says before any record is decoded."""

    records: int | None  # how many (None: a reference stream is walked, not indexed)
    header: StreamHeader | None = None  # a blob stream's header
    complete: bool = False  # the blob stream ends with its end record
    metadata: Mapping[str, Any] = {}  # a .hrry file's user metadata


def framing(data: Any, kind: str) -> Framing:
    if kind == "blob-stream":
        with StreamFile(memoryview(data), verify=False) as stream:
            return Framing(len(stream.entries), stream.header, stream.complete)
    if kind == "hrry-file":
        reader = HrryFile.from_buffer(data)
        return Framing(len(reader.names), metadata=dict(reader.user_metadata))
    return Framing(None if kind == "reference-stream" else 1)


def describe_container(kind: str, frame: Framing) -> dict[str, Any]:
    """What a container says about itself: the stream header, the .hrry file metadata."""
    if kind == "hrry-file":
        return {"metadata": {k: _jsonable(v) for k, v in frame.metadata.items()}}
    if kind != "blob-stream":
        return {}
    header = frame.header
    described: dict[str, Any] | None = None
    if header is not None:
        described = {
            "model": header.model,
            "num_layers": header.num_layers,
            "kv_roles": list(header.kv_roles),
            "element_type": None if header.element_type is None else header.element_type.name,
            "end_record": header.end_record,
            "metadata": {k: _jsonable(v) for k, v in header.metadata.items()},
        }
    return {"stream_header": described, "stream_complete": frame.complete}


# -- annotated hex --------------------------------------------------------------------------
Annotation = tuple[int, int, str, str]  # offset, size, field name, value text

_BLOB_HEADER = wr.BLOB.head  # each part of a record as the record places it (wire/records.py)
_ENTRY = wire.FAST_SECTION_ENTRY
_CHECKSUM = wire.FAST_HEADER_CHECKSUM  # the blob record's seal
_CHUNK_HEAD = wire.FAST_CHUNK_TABLE_HEADER
_CHECKSUM_NAMES = {wire.CHECKSUM_NONE: "none", wire.CHECKSUM_XXH3_64: "xxh3_64"}
_CODE_NAMES = {  # fields whose codes have names
    "kv_role": wd.KV_ROLE_BY_CODE,
    "block_table_index_type": {code: name for name, code in wd.INDEX_TYPES.items()},
    "checksum_type": _CHECKSUM_NAMES,
}
_AXES = ("total_tokens", "num_heads", "head_dim")  # what each block-paged shape axis counts
_SHAPE_LABELS = {f"shape[{i}]": f"shape[{i}] {axis}" for i, axis in enumerate(_AXES)}


def _value(raw: bytes, name: str) -> str:
    """A field's value as a dump shows it: enumerations, sentinels and bit sets by name."""
    if name == "magic":
        return repr(raw.decode("latin-1"))
    if name.startswith("_reserved"):
        return "zero" if not any(raw) else "NON-ZERO"
    number = int.from_bytes(raw, "little")
    hexed = f"0x{number:0{2 * len(raw)}X}"
    if name in _CODE_NAMES:
        return _CODE_NAMES[name].get(number, str(number))
    if name in ("flags", "type_tag", "layout_tag", "stream_flags", "end_flags"):
        return hexed
    if name == "layer_index" and number == wd.LAYER_NONE:
        return LAYER_NONE_TEXT
    if name == "num_layers" and number == ws.NUM_LAYERS_UNKNOWN:
        return "unknown (0xFFFFFFFF)"
    if name == "kv_roles":
        roles = [role for role, bit in ws.ROLE_BITS.items() if number & bit]
        return f"{hexed} ({', '.join(roles) or 'unstated'})"
    if name == "element_type":
        if number == ws.ELEMENT_TYPE_UNKNOWN:
            return "unstated (0x00)"
        try:
            return f"{element_type_from_tag(number).name} ({hexed})"
        except HurrayWireError:
            return hexed
    if name == "kind":
        return wire.SECTION_KINDS.get(number, f"unknown 0x{number:02X}")
    if name == "codec":
        return codecs.registry.name_or_id(number)
    if name in ("checksum", "header_checksum"):
        return f"0x{number:016x}"
    return str(number)


def _fields(fast: Any, view: Any, at: int = 0, prefix: str = "", base: int = 0) -> list[Annotation]:
    """Every field of the struct ``fast`` at ``view[at]``, as ``prefix`` + its label, at
    offset ``base + at`` + its own (reserved fields all ``_reserved``)."""
    out: list[Annotation] = []
    for offset, size, name in fast.fields:
        label = "_reserved" if name.startswith("_reserved") else _SHAPE_LABELS.get(name, name)
        piece = bytes(view[at + offset : at + offset + size])
        out.append((base + at + offset, size, prefix + label, _value(piece, label)))
    return out


def annotate_descriptor(raw: bytes, base: int = 0) -> list[Annotation]:
    """Named fields of a block-paged descriptor, for an annotated hex dump."""
    out = _fields(_DESCRIPTOR, raw, base=base)
    at_count = _DESCRIPTOR.offsets["buffer_count"]
    count = raw[at_count] if len(raw) > at_count else 0
    for index in range(count):
        start = _DESCRIPTOR.size + _HANDLE.size * index
        out += _fields(_HANDLE, raw, start, f"buffers[{index}].", base)
    end = _DESCRIPTOR.size + _HANDLE.size * count
    if end < len(raw):
        out.append((base + end, len(raw) - end, "optional sections", f"{len(raw) - end} bytes"))
    return out


def annotate_blob(data: Any) -> list[Annotation]:
    """Named fields of a blob's header, section table, descriptor and payload extents."""
    declared = blob_codec.blob_length(data)
    view = bytes(memoryview(data).cast("B")[:declared])
    out = _fields(_BLOB_HEADER, view, prefix="header.")
    head = _BLOB_HEADER.unpack_dict(view, 0)
    count = head["section_count"]
    header_length = head["header_length"]
    entries = [_ENTRY.unpack_dict(view, entry_at(number)) for number in range(count)]
    for number in range(count):
        out += _fields(_ENTRY, view, entry_at(number), f"section[{number}].")
    desc_start = entry_at(count)
    out.extend(annotate_descriptor(view[desc_start:header_length], desc_start))
    out += _fields(_CHECKSUM, view, header_length)
    cursor = header_length + _CHECKSUM.size
    for number, entry in enumerate(entries):
        offset, stored = entry["offset"], entry["stored_size"]
        kind = wire.SECTION_KINDS.get(entry["kind"], "unknown")
        if offset > cursor:
            out.append(_padding(view, cursor, offset))
        if offset + stored > len(view):  # a cut blob: what is there, then where it ends
            present = max(0, len(view) - offset)
            out.append((offset, present, f"section[{number}] payload",
                        f"{kind}, CUT: {present} of {stored} bytes present"))  # fmt: skip
            cursor = len(view)
            break
        if entry["codec"] == codecs.CODEC_CHUNKED:
            out.extend(annotate_chunk_table(view, offset, stored, f"section[{number}]", kind))
        else:
            out.append((offset, stored, f"section[{number}] payload", f"{kind}, {stored} bytes"))
        cursor = offset + stored
    if declared > len(view):
        out.append((len(view), 0, "cut record",
                    f"blob: {declared} bytes declared, {len(view)} present"))  # fmt: skip
    elif len(view) > cursor:
        out.append(_padding(view, cursor, len(view)))
    return out


def _padding(view: bytes, start: int, stop: int, base: int = 0) -> Annotation:
    """Padding as it is: ``zero``, or how many of its bytes are not (a corrupt record)."""
    nonzero = sum(1 for b in view[start:stop] if b)
    text = f"NON-ZERO ({nonzero} bytes)" if nonzero else "zero"
    return (base + start, stop - start, "padding", text)


def annotate_chunk_table(
    view: bytes, offset: int, stored: int, name: str, kind: str
) -> list[Annotation]:
    """The chunk table of a chunked-shuffle-zstd payload, field by field, then its frames."""
    head_size = _CHUNK_HEAD.size
    if stored < head_size:
        return [(offset, stored, f"{name} payload", f"{kind}, {stored} bytes")]
    head = _CHUNK_HEAD.unpack_dict(view, offset)
    count = head["chunk_count"]
    out = _fields(_CHUNK_HEAD, view, offset, f"{name}.")
    frame_size = wire.CHUNK_FRAME_SIZE.sizeof()
    table_end = head_size + frame_size * count
    if table_end > stored:
        rest = stored - head_size
        return [*out, (offset + head_size, rest, f"{name} payload", f"{kind}, rest of the table")]
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
#: The fewest bytes that hold a stream record's head and tail (a blob's: its header's).
_MINIMUM = {r.magic: r.head.size + r.tail_size for r in (wr.STREAM_HEADER, wr.END_RECORD)}


def annotate_stream_record(record: wr.Record, data: Any, base: int = 0) -> list[Annotation]:
    """Named fields of a stream header or end record (docs/streaming.md) that starts ``data``,
    at ``base`` + their offset in it: the head, its runs (model name and metadata, or the
    index entries before the footer), padding, the seal or footer."""
    view = bytes(memoryview(data).cast("B"))
    name = "stream_header." if record is wr.STREAM_HEADER else "end_record."
    head = record.head.unpack_dict(view, 0)
    total = min(head["total_length"], len(view))
    out = _fields(record.head, view, 0, name, base)
    if record is wr.STREAM_HEADER:
        runs = (("model_name", head["model_name_length"]), ("metadata", head["metadata_length"]))
        spans = record.spans(total, runs)
        start, stop = spans["model_name"]
        model = repr(view[start:stop].decode("utf-8", "replace"))
        out.append((base + start, stop - start, name + "model_name", model))
        start, stop = spans["metadata"]
        if stop > start:
            what = f"KV section, {stop - start} bytes"
            out.append((base + start, stop - start, name + "metadata", what))
    else:
        entry, cursor = ws.FAST_END_ENTRY, record.head.size
        shown = min(head["entry_count"], max(0, total - record.tail_size - cursor) // entry.size)
        for number in range(shown):  # those before the footer
            at = cursor + entry.size * number
            out += _fields(entry, view, at, f"{name}entry[{number}].", base)
        spans = record.spans(total, (("entries", entry.size * shown),))
    (start, stop), (seal, _) = spans["padding"], spans["seal"]
    out += [_padding(view, start, stop, base)] if stop > start else []
    assert record.tail is not None
    return out + _fields(record.tail, view, seal, name, base)


def annotate_stream(data: Any) -> list[Annotation]:
    """Every record of a blob stream, framed by its prefix and told apart by magic; a cut
    record or bytes that are no record end the listing with one line (``validate`` says why)."""
    view = memoryview(data).cast("B")
    out: list[Annotation] = []
    pos = number = 0
    while pos < len(view):
        rest = len(view) - pos
        if rest < wr.PREFIX.size:
            out.append((pos, rest, "cut record", f"{rest} bytes, shorter than a record prefix"))
            break
        prefix = wr.PREFIX.unpack_dict(view, pos)
        magic, total = prefix["magic"], prefix["total_length"]
        if magic not in wr.RECORDS_BY_MAGIC or total < wr.PREFIX.size:
            out.append((pos, rest, "not a record", f"magic {magic.hex(' ')}, {rest} bytes"))
            break
        cut = total > rest
        whole_header = (  # a cut blob whose header and header checksum are there
            magic == wire.BLOB_MAGIC
            and rest >= _BLOB_HEADER.size
            and _BLOB_HEADER.unpack_dict(view, pos)["header_length"] + _CHECKSUM.size <= rest
        )
        if cut and not whole_header:
            what = f"{magic.decode('latin-1')!r}: {total} bytes declared, {rest} present"
            out.append((pos, rest, "cut record", what))
            break
        minimum = _MINIMUM.get(magic, 0)
        if total < minimum:
            out.append((pos, total, "short record", f"{total} bytes, under {minimum}"))
            break
        record = view[pos : pos + total]
        if magic != wire.BLOB_MAGIC:
            out.extend(annotate_stream_record(wr.RECORDS_BY_MAGIC[magic], record, pos))
        else:  # a blob, whole or (its header whole) cut
            out.append((pos, 0, f"blob {number}", f"{total} bytes{' declared' * cut}"))
            out.extend(
                (pos + at, size, f"blob[{number}].{name}", value)
                for at, size, name, value in annotate_blob(record)
            )
            number += 1
        if cut:
            break
        pos += total
    return out


# -- annotated hex of a .hrry file -----------------------------------------------------------
_HRRY_HEADER = wr.HRRY_HEADER.head
_HRRY_TRAILER = wr.HRRY_TRAILER.head


def annotate_hrry(data: Any) -> list[Annotation]:
    """A ``.hrry`` file: its header, each tensor's descriptor and data, the KV section,
    the index and the trailer (docs/reference-containers.md)."""
    view = bytes(memoryview(data).cast("B"))
    out = _fields(_HRRY_HEADER, view, prefix="header.")
    regions: list[tuple[int, list[Annotation]]] = []
    with HrryFile.from_buffer(data) as reader:
        for name in reader.names:
            entry = reader.entry(name)
            start, length = entry.descriptor_offset, entry.descriptor_length
            notes = [(start, 0, f"tensor {name!r}", f"descriptor {length} bytes")]
            raw = view[start : start + length]
            try:
                reader.descriptor(name)  # block-paged: annotated field by field
                notes += annotate_descriptor(raw, start)
            except UnsupportedLayoutError:
                notes.append((start, length, "descriptor", f"{length} bytes"))
            notes.append((entry.data_offset, entry.data_length, f"{name} data",
                          f"{entry.data_length} bytes (no checksum)"))  # fmt: skip
            regions.append((start, notes))
        trailer = reader.trailer
    for _, notes in sorted(regions, key=lambda r: r[0]):
        out.extend(notes)
    if trailer.kv_length:
        out.append((trailer.kv_offset, trailer.kv_length, "file metadata",
                    f"KV section, {trailer.kv_length} bytes"))  # fmt: skip
    out.append((trailer.index_offset, trailer.index_length, "index",
                f"{trailer.index_length} bytes, CRC-32C protected"))  # fmt: skip
    return out + _fields(_HRRY_TRAILER, view, len(view) - _HRRY_TRAILER.size, "trailer.")
