"""What ``dump`` and ``validate`` print (text and JSON, from ``report``'s data), to the
stream it is handed: with ``cli.py``, the only modules that print."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import IO, Any, NamedTuple

from hurray_wire import report as summary
from hurray_wire.containers import HrryFile, StreamFile, StreamHeader
from hurray_wire.errors import UnsupportedLayoutError
from hurray_wire.model.descriptor_codec import decode_descriptor, decode_header
from hurray_wire.tensor import BlockPagedTensor

__all__ = [
    "HEX_KINDS",
    "Framing",
    "Item",
    "context",
    "descriptor",
    "dump_item",
    "framing",
    "print_head",
    "print_hex",
    "print_item",
]


@dataclass
class Item:
    """One thing found in an input: a tensor (with its blob bytes) or a descriptor;
    ``pages`` is what the blob's page sections said (``report.check_blob``)."""

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
        out["descriptor"] = descriptor(item.descriptor_bytes)[0]
        return out
    if "header" in item.extra:
        out["descriptor"] = summary.describe_header(item.extra["header"])
        return out
    tensor = item.tensor
    assert tensor is not None
    if item.blob is not None:
        out["envelope"] = summary.describe_blob_envelope(item.blob, verify)
    out["descriptor"] = summary.describe_descriptor(tensor.descriptor)
    out["index"] = summary.describe_tensor(tensor)
    out["seq_lens_present"] = tensor.seq_lens is not None
    if item.pages is not None:
        out["pages"] = item.pages
    if arrays:
        out["arrays"] = summary.describe_arrays(tensor)
    out["metadata"] = {k: _jsonable(v) for k, v in tensor.metadata.items()}
    return out


def descriptor(data: Any) -> tuple[dict[str, Any], str]:
    """A bare descriptor, checked: its report and what it is in a few words. A descriptor of
    another layout is valid Hurray: its common header is what can be checked."""
    try:
        desc = decode_descriptor(data)
    except UnsupportedLayoutError as exc:
        checked = summary.describe_header(decode_header(data))
        return checked, f"{exc.layout_name} layout, common header checked"
    what = f"block_paged {desc.element_type.name} {list(desc.shape)}"
    return summary.describe_descriptor(desc), what


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


def context(kind: str, frame: Framing) -> dict[str, Any]:
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


def print_head(path: str, kind: str, size: int, context: dict[str, Any], out: IO[str]) -> None:
    print(f"{path}: {kind}, {size} bytes", file=out)
    if "stream_header" in context:
        header = context["stream_header"]
        if header is None:
            print("  stream header: none (bare concatenated blobs)", file=out)
        else:
            print(f"  stream header: model {header['model']!r}, num_layers "
                  f"{header['num_layers']}, kv_roles {header['kv_roles']}, element_type "
                  f"{header['element_type']}", file=out)  # fmt: skip
            if header["metadata"]:
                print(f"    metadata: {json.dumps(header['metadata'], sort_keys=True)}", file=out)
        print(f"  end record: {'yes' if context['stream_complete'] else 'no'}", file=out)
    if context.get("metadata"):
        print(f"  file metadata: {json.dumps(context['metadata'], sort_keys=True)}", file=out)


def print_item(item: dict[str, Any], out: IO[str]) -> None:
    print(f"  [{item['item']}]", file=out)
    envelope = item.get("envelope") or {}
    if envelope:
        status = "verified" if envelope["checksums_verified"] else "not verified"
        print(f"    blob: version {envelope['version']}, total_length "
              f"{envelope['total_length']}, checksums {envelope['checksum_type']} ({status})",
              file=out)  # fmt: skip
    d = item["descriptor"]
    print(f"    descriptor: Hurray {d['version']}, {d['descriptor_length']} bytes, "
          f"flags {d['flags']}", file=out)  # fmt: skip
    print(f"    element_type: {d['element_type']} ({d['type_tag']})", file=out)
    print(f"    shape: {d['shape']}", file=out)
    layout = d["layout"]
    print(f"    layout: {layout['name']} ({layout['tag']})", file=out)
    for key, value in layout.items():
        if key not in ("name", "tag"):
            print(f"      {key}: {value}", file=out)
    print("    buffers:", file=out)
    sections = {s["index"]: s for s in envelope.get("sections", []) if s["kind"] == "buffer"}
    for index, buf in enumerate(d["buffers"]):
        name = buf.get("name", f"buffer {index}")
        line = (
            f"      [{index}] {name:<12} {buf['byte_size']:>12} bytes  align "
            f"{buf['alignment']}  {buf['device']}/{buf['memory_class']}/{buf['sync_mode']}"
        )
        section = sections.get(index)
        if section:
            line += f"  @ {section['offset']}  {section['codec']} stored {section['stored_size']}"
            if section["checksum"]:
                line += f"  checksum {section['checksum']}"
        print(line, file=out)
    for section in [s for s in envelope.get("sections", []) if s["kind"] != "buffer"]:
        print(f"    section {section['kind']}: @ {section['offset']}  {section['codec']} "
              f"stored {section['stored_size']} raw {section['raw_size']}"
              f"{'  required' if section['required'] else ''}", file=out)  # fmt: skip
    quant = d["quantization"]
    if quant is None:
        print("    quantization: none", file=out)
    else:
        fields = ", ".join(f"{k}={v}" for k, v in quant.items() if k != "scheme")
        print(f"    quantization: {quant['scheme']} ({fields})", file=out)
    if d.get("statistics"):
        print(f"    statistics: {d['statistics']}", file=out)
    stats = item.get("index")
    if stats:
        print(f"    sequences: {stats['sequences']}, logical pages {stats['logical_pages']}",
              file=out)  # fmt: skip
        for unit in ("pages", "tokens"):
            spread = stats[f"{unit}_per_sequence"]
            if spread:
                print(f"    {unit} per sequence: min {spread['min']} / median "
                      f"{spread['median']} / max {spread['max']}", file=out)  # fmt: skip
            elif unit == "tokens":
                print("    tokens per sequence: unknown (no seq_lens)", file=out)
        print(f"    shared pages: {stats['shared_pages']}", file=out)
        print(f"    pool occupancy: {stats['pool_pages_referenced']} of {layout['num_pages']} "
              f"pages referenced ({stats['pool_occupancy']:.1%})", file=out)  # fmt: skip
    pages = item.get("pages")  # what the page sections said
    if pages and pages["bad_pages"]:
        places = [tuple(p) for p in pages["bad_positions"]]
        print(f"    BAD PAGES (digest mismatch): physical {pages['bad_pages']}, logical "
              f"(sequence, page) {places}", file=out)  # fmt: skip
    elif pages and pages["digests"]:
        print("    page digests: every page matches", file=out)
    if pages and pages["by_reference"]:
        print(f"    pages by reference: {pages['by_reference']} (held in the receiver's page "
              "store: not in this input, shown as zero)", file=out)  # fmt: skip
    for name, values in (item.get("arrays") or {}).items():
        print(f"    {name}: {'none' if values is None else values}", file=out)
    if item.get("metadata"):
        print(f"    metadata: {json.dumps(item['metadata'], sort_keys=True)}", file=out)


_ANNOTATE: dict[str, Callable[[Any], list[summary.Annotation]]] = {
    "descriptor": summary.annotate_descriptor,
    "blob": summary.annotate_blob,
    "blob-stream": summary.annotate_stream,
    "hrry-file": summary.annotate_hrry,
}
HEX_KINDS = tuple(_ANNOTATE)


def print_hex(data: Any, kind: str, out: IO[str]) -> None:
    """The annotated hex of ``data`` (a kind in ``HEX_KINDS``): one line per field."""
    raw = memoryview(data)
    notes = _ANNOTATE[kind](bytes(raw) if kind == "descriptor" else data)
    for offset, size, name, value in notes:
        shown = bytes(raw[offset : offset + min(size, 16)]).hex(" ")
        more = " .." if size > 16 else ""
        print(f"{offset:08x}  {shown + more:<51}  {name} = {value}", file=out)
