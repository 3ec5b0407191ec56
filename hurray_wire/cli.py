"""The ``hurray-wire`` command: dump, validate and convert. The only module that prints.

It parses arguments, asks the library (``containers.identify`` decides what bytes are,
the containers read and write them, ``report`` describes them) and prints. Every failure
is one line on stderr, ``hurray-wire: PATH: problem``, and an exit code from ``EXIT_CODES``;
never a traceback. Files are written only through ``containers.atomic.atomic_output``, so a
failed or interrupted command leaves no partial output and never writes onto its input.
"""

from __future__ import annotations

import argparse
import io
import json
import mmap
import os
import stat
import struct
import sys
import textwrap
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext, suppress
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import IO, Any, BinaryIO

from tqdm import tqdm  # type: ignore[import-untyped]

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
from hurray_wire.containers.atomic import atomic_output, check_not_input, reading
from hurray_wire.dtypes import element_type_from_name
from hurray_wire.errors import (
    CodecConfigError,
    FileAccessError,
    HurrayWireError,
    UnsupportedLayoutError,
)
from hurray_wire.model.descriptor_codec import decode_descriptor, decode_header
from hurray_wire.tensor import BlockPagedTensor
from hurray_wire.wire.blob import BLOB_MAGIC

__all__ = ["EXIT_CODES", "build_parser", "identify", "main"]

EXIT_OK, EXIT_INVALID, EXIT_USAGE, EXIT_FILE, EXIT_INTERNAL = 0, 1, 2, 3, 4
EXIT_INTERRUPTED = 130
EXIT_CODES = {
    EXIT_OK: "ok: every input valid, the output written",
    EXIT_INVALID: "invalid input: an input is not valid hurray-wire (validation failed)",
    EXIT_USAGE: "usage: bad arguments or options",
    EXIT_FILE: "file access: an input cannot be read or the output cannot be written "
    "(missing, a directory, no permission, or the output is an input)",
    EXIT_INTERNAL: "internal error: a bug in hurray-wire, reported on one line (please "
    "report it with the command and the input)",
    EXIT_INTERRUPTED: "interrupted (Ctrl-C): no output file is left behind",
}
STDIO = "-"
STREAM_KEY = "stream."  # .hrry file metadata keys that carry a blob stream header's fields


class CliError(Exception):
    """A problem with an input, reported on one line with exit code 1."""


class UsageError(CliError):
    """Arguments the command cannot act on (exit code 2), found after argparse."""


# -- reading inputs --------------------------------------------------------------------------
def _read(path: str) -> Any:
    """The bytes of ``path`` (``-``: all of stdin); files are memory-mapped, not read."""
    if path == STDIO:
        return sys.stdin.buffer.read()
    with reading(path), open(path, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):  # a named pipe, /dev/stdin: read, cannot be mapped
            return handle.read()
        if info.st_size == 0:
            return b""
        return mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)


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
    """Every record of ``data`` in order, each checked as it comes.

    A lazy generator on purpose: a record that is cut or corrupt raises only after every
    record before it was handed out, so ``dump`` shows the intact part of a cut stream.
    """
    view = memoryview(data)
    if kind == "descriptor":
        yield Item("descriptor", kind, descriptor_bytes=bytes(view))
    elif kind == "blob":
        yield Item("blob", kind, tensor=decode(view, verify=verify), blob=view)
    elif kind == "blob-stream":
        # The strict reader: header, every blob, the end record and nothing after it.
        reader = StreamReader(view, verify=verify)
        reader.header  # noqa: B018 - reads the stream header: position is the first blob
        for number in range(sys.maxsize):
            start = reader.position
            tensor = next(reader, None)
            if tensor is None:
                return
            piece = view[start : reader.position]
            yield Item(f"blob {number} @ {start}", "blob", tensor=tensor, blob=piece)
    elif kind == "reference-stream":
        for number, tensor in enumerate(read_stream(view)):
            yield Item(f"record {number}", kind, tensor=tensor)
    else:
        reader_file = HrryFile.from_buffer(view)
        for name in reader_file.names:
            try:
                yield Item(name, kind, tensor=reader_file.tensor(name), extra={"name": name})
            except UnsupportedLayoutError:
                header = reader_file.descriptor_header(name)
                yield Item(name, kind, extra={"name": name, "header": header})


def _count(data: Any, kind: str) -> int | None:
    """How many records ``data`` holds, from its framing alone (for a progress bar)."""
    if kind in ("descriptor", "blob"):
        return 1
    try:
        if kind == "blob-stream":
            with StreamFile(memoryview(data), verify=False) as stream:
                return len(stream.entries)
        if kind == "hrry-file":
            return len(HrryFile.from_buffer(data).names)
    except HurrayWireError:
        return None  # the checking pass will say what is wrong
    return None  # a reference stream is not indexed: walked, not counted


# -- progress --------------------------------------------------------------------------------
def _bar(args: argparse.Namespace, total: int | None, desc: str, unit: str) -> Any:
    """A tqdm bar on stderr: shown when stderr is a terminal (or ``--progress``), never with
    ``--quiet``; a disabled bar costs nothing and prints nothing."""
    terminal = sys.stderr.isatty()
    shown = not args.quiet and (args.progress or terminal)
    # On a terminal the bar is erased when done; into a log (--progress) its last state stays.
    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, disable=not shown,
                leave=not terminal, dynamic_ncols=True)  # fmt: skip


def _emit(text: str, out: IO[str], bar: Any) -> None:
    """Print ``text`` to stdout without tearing a progress bar drawn on the same terminal."""
    if not text:
        return
    if bar is not None and not bar.disable:
        bar.clear()
        out.write(text)
        out.flush()
        bar.refresh()
    else:
        out.write(text)


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
        with StreamFile(memoryview(data), verify=False) as stream:
            header, complete = stream.header, stream.complete
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
        return {"stream_header": described, "stream_complete": complete}
    if kind == "hrry-file":
        reader = HrryFile.from_buffer(data)
        return {"metadata": {k: _jsonable(v) for k, v in reader.user_metadata.items()}}
    return {}


def _print_head(path: str, kind: str, size: int, context: dict[str, Any], out: IO[str]) -> None:
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


def _print_item(item: dict[str, Any], out: IO[str]) -> None:
    print(f"  [{item['item']}]", file=out)
    envelope = item.get("envelope")
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
            line += f"  @ {section['offset']}  {section['codec']} stored {section['stored_size']}"
            if section["checksum"]:
                line += f"  checksum {section['checksum']}"
        print(line, file=out)
    for section in [s for s in (envelope or {}).get("sections", []) if s["kind"] != "buffer"]:
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
        _print_index(stats, layout["num_pages"], out)
    if item.get("metadata"):
        print(f"    metadata: {json.dumps(item['metadata'], sort_keys=True)}", file=out)


def _print_index(stats: dict[str, Any], num_pages: int, out: IO[str]) -> None:
    pages = stats["pages_per_sequence"]
    tokens = stats["tokens_per_sequence"]
    print(f"    sequences: {stats['sequences']}, logical pages {stats['logical_pages']}", file=out)
    if pages:
        print(f"    pages per sequence: min {pages['min']} / median {pages['median']} / "
              f"max {pages['max']}", file=out)  # fmt: skip
    if tokens:
        print(f"    tokens per sequence: min {tokens['min']} / median {tokens['median']} / "
              f"max {tokens['max']}", file=out)  # fmt: skip
    else:
        print("    tokens per sequence: unknown (no seq_lens)", file=out)
    print(f"    shared pages: {stats['shared_pages']}", file=out)
    print(f"    pool occupancy: {stats['pool_pages_referenced']} of {num_pages} pages "
          f"referenced ({stats['pool_occupancy']:.1%})", file=out)  # fmt: skip


def _print_hex(data: Any, kind: str, out: IO[str]) -> None:
    if kind == "descriptor":
        notes = summary.annotate_descriptor(bytes(memoryview(data)))
    elif kind == "blob":
        notes = summary.annotate_blob(data)
    elif kind == "blob-stream":
        notes = summary.annotate_stream(data)
    else:
        raise CliError(f"--hex is available for descriptors, blobs and blob streams, not {kind}")
    raw = memoryview(data)
    for offset, size, name, value in notes:
        shown = bytes(raw[offset : offset + min(size, 16)]).hex(" ")
        more = " .." if size > 16 else ""
        print(f"{offset:08x}  {shown + more:<51}  {name} = {value}", file=out)


def _dump_one(path: str, args: argparse.Namespace, results: list[dict[str, Any]]) -> None:
    """Print one input record by record; an error after some records leaves them printed."""
    verify = not args.no_verify
    data = _read(path)
    kind = identify(data)
    if args.hex:
        try:
            _print_hex(data, kind, sys.stdout)
        except (struct.error, IndexError) as exc:  # annotation of bytes that are no record
            raise CliError(f"cannot annotate: {exc}") from None
        return
    context = _context(data, kind)
    document: dict[str, Any] = {"path": path, "kind": kind, "size": len(data), **context,
                                "items": []}  # fmt: skip
    if args.json:
        results.append(document)
    else:
        _print_head(path, kind, len(data), context, sys.stdout)
    total = _count(data, kind)
    with _bar(args, total if total and total > 1 else None, path, "record") as bar:
        for item in _items(data, kind, verify):
            described = _dump_item(item, verify)
            if args.json:
                document["items"].append(described)
            else:
                text = io.StringIO()
                _print_item(described, text)
                _emit(text.getvalue(), sys.stdout, bar)
            bar.update(1)


def cmd_dump(args: argparse.Namespace) -> int:
    """Every input in turn: intact records are printed, the first bad one ends that input."""
    results: list[dict[str, Any]] = []
    code = EXIT_OK
    for path in args.paths:
        code = max(code, _guard(path, partial(_dump_one, path, args, results)))
    if args.json:
        json.dump(results, sys.stdout, indent=2, sort_keys=True)
        print()
    return code


def _validate_one(path: str, args: argparse.Namespace) -> None:
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
        return
    count = 0
    total = _count(data, kind)
    with _bar(args, total if total and total > 1 else None, path, "record") as bar:
        for _ in _items(data, kind, True):
            count += 1
            bar.update(1)
    print(f"{path}: ok ({kind}, {count} tensor{'s' if count != 1 else ''})")


def cmd_validate(args: argparse.Namespace) -> int:
    """Check every input (all of them, whatever fails): one line each, exit 1 if any failed."""
    code = EXIT_OK
    for path in args.paths:
        code = max(code, _guard(path, partial(_validate_one, path, args)))
    return code


# -- convert ---------------------------------------------------------------------------------
_EXTENSIONS = {
    ".hrwb": "blob",
    ".hrws": "blob-stream",
    ".hrrs": "reference-stream",
    ".hrry": "hrry-file",
}


def _tensor_name(tensor: BlockPagedTensor, taken: set[str]) -> str:
    """``layer{L}.{role}`` (``layer_none`` for a layer-less tensor), made unique with a
    ``#n`` suffix when the input repeats a {layer, role}."""
    layer = "none" if tensor.layer_index is None else str(tensor.layer_index)
    base = f"layer{'_' if layer == 'none' else ''}{layer}.{tensor.kv_role}"
    name, number = base, 1
    while name in taken:
        name, number = f"{base}#{number}", number + 1
    taken.add(name)
    return name


def _header_metadata(header: StreamHeader | None) -> dict[str, Any]:
    """A blob stream header as ``.hrry`` file metadata: its own metadata, then its fields
    under ``stream.`` keys (those that are stated)."""
    if header is None:
        return {}
    out: dict[str, Any] = dict(header.metadata)
    if header.model:
        out[STREAM_KEY + "model"] = header.model
    if header.num_layers is not None:
        out[STREAM_KEY + "num_layers"] = header.num_layers
    if header.kv_roles:
        out[STREAM_KEY + "kv_roles"] = list(header.kv_roles)
    if header.element_type is not None:
        out[STREAM_KEY + "element_type"] = header.element_type.name
    if not header.end_record:
        out[STREAM_KEY + "end_record"] = False
    return out


def _metadata_header(metadata: dict[str, Any]) -> StreamHeader:
    """The reverse of :func:`_header_metadata`: ``.hrry`` file metadata as a stream header."""
    rest = {k: v for k, v in metadata.items() if not k.startswith(STREAM_KEY)}
    model = metadata.get(STREAM_KEY + "model", "")
    layers = metadata.get(STREAM_KEY + "num_layers")
    roles = metadata.get(STREAM_KEY + "kv_roles", [])
    element = metadata.get(STREAM_KEY + "element_type")
    try:
        return StreamHeader(
            model=model if isinstance(model, str) else "",
            num_layers=int(layers) if isinstance(layers, int) else None,
            kv_roles=tuple(roles) if isinstance(roles, list) else (),
            element_type=element_type_from_name(element) if isinstance(element, str) else None,
            metadata=rest,
            end_record=metadata.get(STREAM_KEY + "end_record") is not False,
        )
    except HurrayWireError as exc:
        raise CliError(f"file metadata {STREAM_KEY}* is not a valid stream header: {exc}") from None


@dataclass
class _Source:
    """What a conversion reads: named tensors and what the container said about itself."""

    tensors: list[tuple[str, BlockPagedTensor]]
    header: StreamHeader | None = None  # a blob stream's header
    metadata: dict[str, Any] = field(default_factory=dict)  # a .hrry file's user metadata


def _load(args: argparse.Namespace, data: Any, kind: str) -> _Source:
    """Decode and check every tensor of the input (zero-copy views), one bar step each."""
    if kind == "descriptor":
        raise CliError("a bare descriptor has no buffers to convert")
    view = memoryview(data)
    source = _Source([])
    if kind == "blob-stream":
        with StreamFile(view, verify=False) as stream:
            source.header = stream.header
    elif kind == "hrry-file":
        source.metadata = dict(HrryFile.from_buffer(view).user_metadata)
    taken: set[str] = set()
    with _bar(args, _count(data, kind), "check", "tensor") as bar:
        for item in _items(data, kind, True):
            if item.tensor is None:
                raise CliError(f"{item.label}: not a block-paged tensor, cannot convert")
            name = item.extra.get("name") or _tensor_name(item.tensor, taken)
            source.tensors.append((name, item.tensor))
            bar.update(1)
    return source


def _target(args: argparse.Namespace) -> str:
    target: str | None = args.to or _EXTENSIONS.get(Path(args.output).suffix)
    if target is None:
        raise UsageError(
            f"cannot tell the output format from {args.output!r}: pass --to "
            f"({', '.join(sorted(set(_EXTENSIONS.values())))})"
        )
    if args.output == STDIO and target == "hrry-file":
        raise UsageError("a .hrry file is written to a path (its index is laid out after "
                         "the data it points to), not to - (stdout)")  # fmt: skip
    if args.compression is not None and target in ("reference-stream", "hrry-file"):
        raise UsageError(f"--compression applies to blob outputs (.hrwb, .hrws), not {target}")
    return target


def _compression(spec: str | None) -> Compression | None:
    try:
        return None if spec is None else Compression.parse(spec)  # text specs end here
    except CodecConfigError as exc:
        raise UsageError(f"--compression {spec}: {exc}") from None


def _output(path: str, inputs: list[str]) -> AbstractContextManager[BinaryIO]:
    """The output file: stdout's binary buffer for ``-``, else an atomic file at ``path``."""
    if path == STDIO:
        return nullcontext(sys.stdout.buffer)
    return atomic_output(path, inputs=inputs)


def _convert(args: argparse.Namespace) -> None:
    target = _target(args)
    compression = _compression(args.compression)
    inputs = [] if args.input == STDIO else [args.input]
    if args.output != STDIO:
        check_not_input(args.output, inputs)  # before anything is opened for writing
    data = _read(args.input)
    kind = identify(data)
    source = _load(args, data, kind)
    tensors = source.tensors
    checksum = not args.no_checksum
    if target == "blob" and len(tensors) != 1:
        raise CliError(f"a blob holds one tensor; the input has {len(tensors)} (use .hrws)")
    header = source.header
    if header is None:
        header = _metadata_header(source.metadata) if source.metadata else StreamHeader()
    bar = _bar(args, len(tensors), "write", "tensor")
    with bar:
        if target == "hrry-file":
            metadata = source.metadata or _header_metadata(source.header)
            write_file(args.output, dict(tensors), metadata, progress=lambda _: bar.update(1))
            return
        with _output(args.output, inputs) as sink:
            if target == "blob":
                sink.writelines(encode_parts(tensors[0][1], compression=compression,
                                             checksum=checksum))  # fmt: skip
                bar.update(1)
            elif target == "blob-stream":
                with StreamWriter(sink, header) as writer:
                    for _, tensor in tensors:
                        writer.write(
                            tensor, compression=compression, checksum=checksum, pages="all"
                        )  # a conversion keeps every page
                        bar.update(1)
            else:
                for _, tensor in tensors:
                    write_stream(sink, tensor)
                    bar.update(1)
            sink.flush()


def cmd_convert(args: argparse.Namespace) -> int:
    """Convert one input to one output; errors name the file they are about."""
    return _guard(args.input, lambda: _convert(args))


# -- errors ----------------------------------------------------------------------------------
def _guard(path: str, step: Callable[[], None]) -> int:
    """Run ``step`` for ``path``; print its failure as one line and return its exit code."""
    try:
        step()
    except UsageError as exc:
        print(f"hurray-wire: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except FileAccessError as exc:  # its message starts with the path it is about
        print(f"hurray-wire: {exc}", file=sys.stderr)
        return EXIT_FILE
    except (HurrayWireError, CliError) as exc:
        print(f"hurray-wire: {path}: {exc}", file=sys.stderr)
        return EXIT_INVALID
    except BrokenPipeError:
        raise
    except OSError as exc:  # a write that failed under us (disk full, ...)
        print(f"hurray-wire: {exc.filename or path}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_FILE
    except Exception as exc:  # a bug: still one line, never a traceback (the contract)
        print(f"hurray-wire: {path}: internal error: {type(exc).__name__}: {exc}",
              file=sys.stderr)  # fmt: skip
        return EXIT_INTERNAL
    return EXIT_OK


# -- entry -----------------------------------------------------------------------------------
def _epilog() -> str:
    lines = ["exit codes:"]
    for code, text in EXIT_CODES.items():
        lines += textwrap.wrap(text, 78, initial_indent=f"  {code:<4} ", subsequent_indent=" " * 7)
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the command."""
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(
        prog="hurray-wire",
        description="Inspect, validate and convert Hurray block-paged KV-cache blobs, blob "
        "streams, reference stream records and .hrry files.",
        epilog=_epilog(),
        formatter_class=formatter,
    )
    parser.add_argument("--version", action="version", version=f"hurray-wire {__version__}")
    feedback = argparse.ArgumentParser(add_help=False)
    group = feedback.add_mutually_exclusive_group()
    group.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    group.add_argument("--progress", action="store_true",
                       help="a progress bar on stderr even if it is not a terminal")  # fmt: skip
    sub = parser.add_subparsers(dest="command", required=True)

    def command(name: str, text: str) -> argparse.ArgumentParser:
        return sub.add_parser(
            name, help=text, parents=[feedback], epilog=_epilog(), formatter_class=formatter
        )

    dump = command("dump", "print a readable summary of each input")
    dump.add_argument("paths", nargs="+", metavar="PATH",
                      help="a descriptor, blob, blob stream, reference stream or .hrry file; "
                      "- reads stdin")  # fmt: skip
    shape = dump.add_mutually_exclusive_group()
    shape.add_argument("--json", action="store_true", help="JSON (schemas/dump.schema.json)")
    shape.add_argument("--hex", action="store_true",
                       help="annotated hex of a descriptor, a blob or every record of a blob "
                       "stream")  # fmt: skip
    dump.add_argument("--no-verify", action="store_true", help="skip section checksums")
    dump.set_defaults(func=cmd_dump)
    validate = command("validate", "check every input: one line each, exit 1 if any is invalid")
    validate.add_argument("paths", nargs="+", metavar="PATH",
                          help="an input of any kind; - reads stdin")  # fmt: skip
    validate.set_defaults(func=cmd_validate)
    convert = command(
        "convert", "convert between blob, blob stream, reference stream (.hrrs) and .hrry file"
    )
    convert.add_argument("input", metavar="IN", help="the input (any kind but a bare "
                         "descriptor); - reads stdin")  # fmt: skip
    convert.add_argument("output", metavar="OUT",
                         help="the output, written atomically, never onto IN; - writes stdout "
                         "(not for .hrry; needs --to)")  # fmt: skip
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
    convert.set_defaults(func=cmd_convert)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: the exit code (``EXIT_CODES``); usage errors exit 2 through argparse."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.func(args)
        return code
    except KeyboardInterrupt:
        print("hurray-wire: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # e.g. `| head`: stop quietly, and keep Python's exit flush quiet
        with suppress(OSError, ValueError), open(os.devnull, "wb") as devnull:
            os.dup2(devnull.fileno(), sys.stdout.fileno())
        return EXIT_OK


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
