"""The ``hurray-wire`` command: dump, validate and convert. The only module that prints.

Exit codes: 0 ok, 1 invalid input (one line on stderr, never a traceback), 2 usage.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from hurray_wire import report as summary
from hurray_wire._version import __version__
from hurray_wire.blob import decode, encode_parts
from hurray_wire.codecs import Compression
from hurray_wire.containers import (
    Format,
    HrryFile,
    StreamFile,
    StreamHeader,
    StreamReader,
    StreamWriter,
    read_stream,
    write_file,
    write_stream,
)
from hurray_wire.containers import identify as identify_format
from hurray_wire.errors import HurrayWireError, UnsupportedLayoutError
from hurray_wire.model.descriptor_codec import decode_descriptor, decode_header
from hurray_wire.tensor import BlockPagedTensor
from hurray_wire.wire.blob import BLOB_MAGIC

__all__ = ["main", "build_parser", "identify"]

EXIT_OK, EXIT_INVALID, EXIT_USAGE = 0, 1, 2
PROGRESS_THRESHOLD = 1 << 30  # show a progress bar for inputs above 1 GiB


class CliError(Exception):
    """A problem to report on one line with exit code 1."""


# -- reading inputs --------------------------------------------------------------------------
def _read(path: str) -> Any:
    """The bytes of ``path`` (``-`` = stdin); files are memory-mapped, not read."""
    if path == "-":
        return sys.stdin.buffer.read()
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            if size == 0:
                return b""
            return mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as exc:
        raise CliError(f"cannot read: {exc.strerror or exc}") from None


def identify(data: Any) -> str:
    """What ``data`` is (``hurray_wire.containers.identify``), or a one-line CLI error."""
    kind = identify_format(data)
    if kind is Format.UNKNOWN:
        head = bytes(memoryview(data)[: len(BLOB_MAGIC)])  # every format's magic is 4+ bytes
        raise CliError(f"unrecognised input (starts with {head.hex(' ') or 'nothing'})")
    return str(kind)


@dataclass
class Item:
    """One thing found in an input: a tensor (with its blob bytes) or a descriptor."""

    label: str
    kind: str
    tensor: BlockPagedTensor | None = None
    blob: Any = None
    descriptor_bytes: bytes | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _items(data: Any, kind: str, verify: bool) -> Iterator[Item]:
    view = memoryview(data)
    if kind == "descriptor":
        yield Item("descriptor", kind, descriptor_bytes=bytes(view))
    elif kind == "blob":
        yield Item("blob", kind, tensor=decode(view, verify=verify), blob=view)
    elif kind == "blob-stream":
        if verify:  # the strict pass: header, every blob, end record, nothing after it
            for _ in StreamReader(view):
                pass
        stream = StreamFile(view, verify=verify)
        if stream.error is not None:
            raise stream.error
        for number, entry in enumerate(stream.entries):
            piece = view[entry.offset : entry.offset + entry.length]
            yield Item(f"blob {number} @ {entry.offset}", "blob", tensor=stream.read(entry),
                       blob=piece)  # fmt: skip
    else:
        yield from _reference_items(data, kind)


def _reference_items(data: Any, kind: str) -> Iterator[Item]:
    if kind == "reference-stream":
        for number, tensor in enumerate(read_stream(data)):
            yield Item(f"record {number}", kind, tensor=tensor)
        return
    reader = HrryFile.from_buffer(data)
    for name in reader.names:
        try:
            yield Item(name, kind, tensor=reader.tensor(name), extra={"name": name})
        except UnsupportedLayoutError:
            header = reader.descriptor_header(name)
            yield Item(name, kind, extra={"name": name, "header": header})


# -- dump ------------------------------------------------------------------------------------
def _dump_item(item: Item, verify: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"item": item.label, "kind": item.kind}
    if item.descriptor_bytes is not None:
        try:
            desc = decode_descriptor(item.descriptor_bytes)
            out["descriptor"] = summary.describe_descriptor(desc)
        except UnsupportedLayoutError:
            out["descriptor"] = summary.describe_header(decode_header(item.descriptor_bytes))
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
    out["metadata"] = {k: _jsonable(v) for k, v in tensor.metadata.items()}
    return out


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    return value


def _context(data: Any, kind: str) -> dict[str, Any]:
    """What a container says about itself: the stream header, the .hrry file metadata."""
    if kind == "blob-stream":
        stream = StreamFile(memoryview(data), verify=False)
        header = stream.header
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
        return {"stream_header": described, "stream_complete": stream.complete}
    if kind == "hrry-file":
        reader = HrryFile.from_buffer(data)
        return {"metadata": {k: _jsonable(v) for k, v in reader.user_metadata.items()}}
    return {}


def _print_text(
    path: str,
    kind: str,
    size: int,
    items: list[dict[str, Any]],
    out: IO[str],
    context: dict[str, Any] | None = None,
) -> None:
    print(f"{path}: {kind}, {size} bytes", file=out)
    context = context or {}
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
    for item in items:
        print(f"  [{item['item']}]", file=out)
        envelope = item.get("envelope")
        if envelope:
            status = "verified" if envelope["checksums_verified"] else "not verified"
            print(
                f"    blob: version {envelope['version']}, total_length "
                f"{envelope['total_length']}, checksums {envelope['checksum_type']} "
                f"({status})",
                file=out,
            )
        d = item["descriptor"]
        print(
            f"    descriptor: Hurray {d['version']}, {d['descriptor_length']} bytes, "
            f"flags {d['flags']}",
            file=out,
        )
        print(f"    element_type: {d['element_type']} ({d['type_tag']})", file=out)
        print(f"    shape: {d['shape']}", file=out)
        layout = d["layout"]
        print(f"    layout: {layout['name']} ({layout['tag']})", file=out)
        for key, value in layout.items():
            if key not in ("name", "tag"):
                print(f"      {key}: {value}", file=out)
        print("    buffers:", file=out)
        sections = {
            s["index"]: s for s in (envelope or {}).get("sections", []) if s["kind"] == "buffer"
        }
        for index, buf in enumerate(d["buffers"]):
            name = buf.get("name", f"buffer {index}")
            line = (
                f"      [{index}] {name:<12} {buf['byte_size']:>12} bytes  align "
                f"{buf['alignment']}  {buf['device']}/{buf['memory_class']}/{buf['sync_mode']}"
            )
            section = sections.get(index)
            if section:
                line += (
                    f"  @ {section['offset']}  {section['codec']} stored {section['stored_size']}"
                )
                if section["checksum"]:
                    line += f"  checksum {section['checksum']}"
            print(line, file=out)
        extensions = [s for s in (envelope or {}).get("sections", []) if s["kind"] != "buffer"]
        for section in extensions:
            line = (f"    section {section['kind']}: @ {section['offset']}  {section['codec']} "
                    f"stored {section['stored_size']} raw {section['raw_size']}"
                    f"{'  required' if section['required'] else ''}")  # fmt: skip
            print(line, file=out)
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
            pages = stats["pages_per_sequence"]
            tokens = stats["tokens_per_sequence"]
            print(
                f"    sequences: {stats['sequences']}, logical pages {stats['logical_pages']}",
                file=out,
            )
            if pages:
                print(
                    f"    pages per sequence: min {pages['min']} / median {pages['median']} / "
                    f"max {pages['max']}",
                    file=out,
                )
            if tokens:
                print(
                    f"    tokens per sequence: min {tokens['min']} / median "
                    f"{tokens['median']} / max {tokens['max']}",
                    file=out,
                )
            else:
                print("    tokens per sequence: unknown (no seq_lens)", file=out)
            print(f"    shared pages: {stats['shared_pages']}", file=out)
            print(
                f"    pool occupancy: {stats['pool_pages_referenced']} of "
                f"{layout['num_pages']} pages referenced ({stats['pool_occupancy']:.1%})",
                file=out,
            )
        if item.get("metadata"):
            print(f"    metadata: {json.dumps(item['metadata'], sort_keys=True)}", file=out)


def _print_hex(data: Any, kind: str, out: IO[str]) -> None:
    if kind == "descriptor":
        notes = summary.annotate_descriptor(bytes(memoryview(data)))
    elif kind in ("blob", "blob-stream"):
        notes = summary.annotate_blob(data)
    else:
        raise CliError(f"--hex is available for descriptors and blobs, not {kind}")
    raw = memoryview(data)
    for offset, size, name, value in notes:
        shown = bytes(raw[offset : offset + min(size, 16)]).hex(" ")
        more = " .." if size > 16 else ""
        print(f"{offset:08x}  {shown + more:<51}  {name} = {value}", file=out)


def cmd_dump(args: argparse.Namespace) -> int:
    results = []
    for path in args.paths:
        data = _read(path)
        kind = identify(data)
        items = [
            _dump_item(item, not args.no_verify) for item in _items(data, kind, not args.no_verify)
        ]
        if args.hex:
            _print_hex(data, kind, sys.stdout)
            continue
        context = _context(data, kind)
        if args.json:
            results.append({"path": path, "kind": kind, "size": len(data), **context,
                            "items": items})  # fmt: skip
        else:
            _print_text(path, kind, len(data), items, sys.stdout, context)
    if args.json:
        json.dump(results, sys.stdout, indent=2, sort_keys=True)
        print()
    return EXIT_OK


def cmd_validate(args: argparse.Namespace) -> int:
    for path in args.paths:
        data = _read(path)
        kind = identify(data)
        if kind == "descriptor":
            try:
                desc = decode_descriptor(data)
                what = f"block_paged {desc.element_type.name} {list(desc.shape)}"
            except UnsupportedLayoutError as exc:
                decode_header(data)  # valid Hurray, another layout: check its common header
                what = f"{exc.layout_name} layout, common header checked"
            print(f"{path}: ok (descriptor, {what})")
            continue
        count = sum(1 for _ in _items(data, kind, True))
        print(f"{path}: ok ({kind}, {count} tensor{'s' if count != 1 else ''})")
    return EXIT_OK


# -- convert ---------------------------------------------------------------------------------
_EXTENSIONS = {
    ".hrwb": "blob",
    ".hrws": "blob-stream",
    ".hrrs": "reference-stream",
    ".hrry": "hrry-file",
}


def _progress(done: int, total: int, enabled: bool) -> None:
    if not enabled or total <= 0:
        return
    width = 30
    filled = int(width * done / total)
    sys.stderr.write(
        f"\r[{'#' * filled}{'.' * (width - filled)}] {done / 1e9:6.2f} / {total / 1e9:.2f} GB"
    )
    if done >= total:
        sys.stderr.write("\n")
    sys.stderr.flush()


def cmd_convert(args: argparse.Namespace) -> int:
    target = args.to or _EXTENSIONS.get(Path(args.output).suffix)
    if target is None:
        raise CliError(f"cannot tell the output format from {args.output!r}: pass --to")
    data = _read(args.input)
    kind = identify(data)
    if kind == "descriptor":
        raise CliError("a bare descriptor has no buffers to convert")
    show = args.progress or len(data) > PROGRESS_THRESHOLD
    tensors: list[tuple[str, BlockPagedTensor]] = []
    for number, item in enumerate(_items(data, kind, True)):
        if item.tensor is None:
            raise CliError(f"{item.label}: not a block-paged tensor, cannot convert")
        tensors.append((item.extra.get("name", f"tensor_{number}"), item.tensor))
    total = sum(t.nbytes for _, t in tensors)
    done = 0
    if target == "blob":
        if len(tensors) != 1:
            raise CliError(f"a blob holds one tensor; the input has {len(tensors)} (use .hrws)")
        with open(args.output, "wb") as sink:
            compression = Compression.parse(args.compression)  # text specs end here
            sink.writelines(encode_parts(tensors[0][1], compression=compression,
                                         checksum=not args.no_checksum))  # fmt: skip
        _progress(total, total, show)
    elif target == "blob-stream":
        with StreamWriter(args.output, StreamHeader()) as writer:
            compression = Compression.parse(args.compression)  # text specs end here
            for _, tensor in tensors:
                writer.write(tensor, compression=compression, checksum=not args.no_checksum)
                done += tensor.nbytes
                _progress(done, total, show)
    elif target == "reference-stream":
        with open(args.output, "wb") as sink:
            write_stream(sink, [t for _, t in tensors])
        _progress(total, total, show)
    elif target == "hrry-file":
        write_file(args.output, dict(tensors))
        _progress(total, total, show)
    else:
        raise CliError(f"unknown output format {target!r}")
    return EXIT_OK


# -- entry -----------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the command."""
    parser = argparse.ArgumentParser(
        prog="hurray-wire",
        description="Inspect, validate and convert Hurray block-paged KV-cache blobs, blob "
        "streams, reference stream records and .hrry files.",
    )
    parser.add_argument("--version", action="version", version=f"hurray-wire {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    dump = sub.add_parser("dump", help="print a readable summary of each input")
    dump.add_argument("paths", nargs="+", metavar="PATH", help="a file, or - for stdin")
    group = dump.add_mutually_exclusive_group()
    group.add_argument("--json", action="store_true", help="JSON (schemas/dump.schema.json)")
    group.add_argument("--hex", action="store_true", help="annotated hex dump of the envelope")
    dump.add_argument("--no-verify", action="store_true", help="skip section checksums")
    dump.set_defaults(func=cmd_dump)
    validate = sub.add_parser("validate", help="exit 0 if every input is valid, else 1")
    validate.add_argument("paths", nargs="+", metavar="PATH")
    validate.set_defaults(func=cmd_validate)
    convert = sub.add_parser(
        "convert", help="convert between blob, blob stream, reference stream (.hrrs) and .hrry file"
    )
    convert.add_argument("input", metavar="IN")
    convert.add_argument("output", metavar="OUT")
    convert.add_argument(
        "--to",
        choices=sorted(set(_EXTENSIONS.values())),
        help="output format (default: from OUT's extension)",
    )
    convert.add_argument(
        "--compression",
        default=None,
        help="blob codec: none, zstd[:LEVEL], shuffle-zstd[:LEVEL], "
        "chunked-shuffle-zstd[:LEVEL], default (chunked-shuffle-zstd:1)",
    )
    convert.add_argument("--no-checksum", action="store_true", help="blobs without checksums")
    convert.add_argument("--progress", action="store_true", help="progress bar on stderr")
    convert.set_defaults(func=cmd_convert)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: exit 0 ok, 1 invalid input, 2 usage."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.func(args)
        return code
    except (HurrayWireError, CliError) as exc:
        where = getattr(args, "paths", None) or [getattr(args, "input", "")]
        print(
            f"hurray-wire: {where[0] if len(where) == 1 else ''}{': ' if len(where) == 1 else ''}"
            f"{exc}",
            file=sys.stderr,
        )
        return EXIT_INVALID
    except BrokenPipeError:  # pragma: no cover - e.g. `| head`
        return EXIT_OK


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
