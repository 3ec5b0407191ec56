"""The ``hurray-wire`` command: dump, validate and convert; the only module that prints.
Every failure is one line on stderr and an exit code from ``EXIT_CODES``, never a traceback;
files are written through ``atomic_output`` only (no partial output, never onto an input).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import struct
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext, suppress
from functools import partial
from pathlib import Path
from typing import Any, BinaryIO

from tqdm import tqdm  # type: ignore[import-untyped]

from hurray_wire import report as summary
from hurray_wire.blob import blob_length, encode_parts
from hurray_wire.cli_parser import (
    _EXTENSIONS,
    EXIT_CODES,
    EXIT_FILE,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_INVALID,
    EXIT_OK,
    EXIT_USAGE,
    STDIO,
    build_parser,
)
from hurray_wire.codecs import Compression
from hurray_wire.containers import (
    Format,
    HrryFile,
    StreamHeader,
    StreamReader,
    StreamWriter,
    identify as identify_format,
    read_stream,
    write_file,
    write_stream,
)
from hurray_wire.containers.atomic import atomic_output, check_not_input
from hurray_wire.containers.io import DEFAULT_INPUT_IDLE, DEFAULT_MAX_INPUT_BYTES, read_input
from hurray_wire.containers.sniff import known_magic
from hurray_wire.dtypes import element_type_from_name
from hurray_wire.errors import (
    ChecksumError,
    CodecConfigError,
    FileAccessError,
    HurrayWireError,
    UnsupportedLayoutError,
)
from hurray_wire.integrity import MemoryPageStore
from hurray_wire.report import Item
from hurray_wire.tensor import BlockPagedTensor
from hurray_wire.wire.blob import BLOB_MAGIC

__all__ = [
    "EXIT_CODES",
    "EXIT_FILE",
    "EXIT_INTERNAL",
    "EXIT_INTERRUPTED",
    "EXIT_INVALID",
    "EXIT_OK",
    "EXIT_USAGE",
    "HEX_KINDS",
    "build_parser",
    "identify",
    "main",
    "run",
]

STREAM_KEY = "stream."  # .hrry file metadata keys that carry a blob stream header's fields


class CliError(Exception):
    """A problem with an input, reported on one line with exit code 1; ``details`` are its
    structured fields for ``--json`` (as ``HurrayWireError.details`` gives them)."""

    def __init__(self, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.details = details or {}


class UsageError(CliError):
    """Arguments the command cannot act on (exit code 2), found after argparse."""


# -- reading inputs --------------------------------------------------------------------------
def _read(path: str, args: argparse.Namespace) -> tuple[Any, str]:
    """The bytes of ``path`` (``-``: stdin) and what they are: regular files mapped, anything
    else read within ``--max-input-bytes`` and ``--input-timeout`` (``io.read_input``)."""
    source: Any = path
    if path == STDIO:
        source = sys.stdin.buffer
        with suppress(OSError, ValueError):  # a descriptor, unless stdin was replaced
            source = source.fileno()
    # argparse leaves them unset: the library's defaults
    limit = DEFAULT_MAX_INPUT_BYTES if args.max_input_bytes is None else int(args.max_input_bytes)
    idle = DEFAULT_INPUT_IDLE if args.input_timeout is None else args.input_timeout or None
    data = read_input(source, max_bytes=limit, idle_timeout=idle, head_ok=known_magic)
    return data, identify(data)


def identify(data: Any) -> str:
    """What ``data`` is (``hurray_wire.containers.identify``), or a one-line CLI error."""
    if not len(memoryview(data)):
        raise CliError("empty (0 bytes): not a hurray-wire input")
    kind = identify_format(data)
    if kind is Format.UNKNOWN:
        head = bytes(memoryview(data)[: len(BLOB_MAGIC)])  # every format's magic is 4+ bytes
        raise CliError(f"unrecognised input (starts with {head.hex(' ') or 'nothing'})")
    return str(kind)


NO_VERIFY_HINT = "dump --no-verify reads past it without checking checksums"


def _salvaged(
    exc: ChecksumError, salvage: bool, label: str, blob: memoryview, extra: dict[str, Any]
) -> Iterator[Item]:
    """With ``salvage``, a blob whose section checksum failed, read again without checksums
    so that ``dump`` shows its structure, then the error with the ``--no-verify`` hint; else
    (or when that fails too) the error itself."""
    if not salvage or exc.section == "header":  # nothing after a bad header can be trusted
        raise exc
    try:
        tensor, pages = summary.check_blob(blob[: blob_length(blob)], False)
    except HurrayWireError:
        raise exc from None
    yield Item(label, "blob", tensor=tensor, blob=blob, pages=pages,
               extra={**extra, "unverified": True})  # fmt: skip
    raise CliError(f"{exc}; {NO_VERIFY_HINT}", {**_details(exc), "hint": NO_VERIFY_HINT}) from None


def _items(data: Any, kind: str, verify: bool, salvage: bool = False) -> Iterator[Item]:
    """Every record of ``data``, each checked as it comes (lazily: ``dump`` shows the intact
    part of a cut stream). ``salvage``: a blob failing a section checksum is handed out
    unverified (``extra["unverified"]``), then its error raised with the ``--no-verify`` hint."""
    view = memoryview(data)
    if kind == "descriptor":
        yield Item("descriptor", kind, descriptor_bytes=bytes(view))
    elif kind == "blob":
        try:
            tensor, pages = summary.check_blob(view, verify)
        except ChecksumError as exc:
            yield from _salvaged(exc, salvage, "blob", view, {})
        yield Item("blob", kind, tensor=tensor, blob=view, pages=pages)
    elif kind == "blob-stream":
        # The strict reader: header, every blob, the end record and nothing after it.
        reader = StreamReader(view, verify=verify, page_store=MemoryPageStore(0), report=True)
        reader.header  # noqa: B018 - reads the stream header: position is the first blob
        for number in range(sys.maxsize):
            start = reader.position
            where = {"blob": number, "blob_offset": start}
            try:
                got = next(reader, None)
            except ChecksumError as exc:
                yield from _salvaged(exc, salvage, f"blob {number} @ {start}", view[start:], where)
            if got is None or reader.page_report is None:
                return
            piece = view[start : reader.position]
            pages = summary.describe_pages(reader.page_report)
            yield Item(f"blob {number} @ {start}", "blob", tensor=got, blob=piece, pages=pages,
                       extra=where)  # fmt: skip
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


def _details(exc: BaseException) -> dict[str, Any]:
    """An error's structured fields for ``--json`` (its own text as ``reason``)."""
    if isinstance(exc, CliError):
        return exc.details
    if not isinstance(exc, HurrayWireError):
        return {"type": type(exc).__name__}
    details = exc.details()
    details["reason"] = details.pop("message")
    return details


def _bad_pages(item: Item) -> CliError | None:
    """The error of an item whose pages fail their digests, naming them (and where the first
    one's row starts, in the blob and in the input, when the pool is stored raw)."""
    pages, tensor = item.pages, item.tensor
    if not pages or not pages["bad_pages"] or tensor is None:
        return None
    bad, places = pages["bad_pages"], [tuple(p) for p in pages["bad_positions"]]
    reason = (f"{len(bad)} page(s) do not match their digest: physical pages "
              f"{bad[:16]}{' ...' * (len(bad) > 16)}; logical positions (sequence, page) "
              f"{places[:16]}{' ...' * (len(places) > 16)}")  # fmt: skip
    where = {"layer": tensor.layer_index, "role": tensor.kv_role}
    where.update((k, item.extra[k]) for k in ("blob", "blob_offset") if k in item.extra)
    layer = "" if tensor.layer_index is None else f"layer {tensor.layer_index} "
    place = f"{item.label} ({layer}{tensor.kv_role})"
    sections = summary.describe_blob_envelope(item.blob, True)["sections"]
    pool = next(s for s in sections if s["kind"] == "buffer" and s["index"] == 0)
    if pool["codec"] == "raw":
        offset = pool["offset"] + bad[0] * (tensor.page_pool.nbytes // tensor.page_pool.shape[0])
        start = item.extra.get("blob_offset", 0)
        where.update(section="buffer[0]", offset=offset, file_offset=start + offset)
        place += f", page {bad[0]} at file offset {start + offset}"
    details = {"type": "PageDigestError", "reason": reason, "field": "page_digests",
               "pages": bad, "positions": [list(p) for p in places], **where}  # fmt: skip
    return CliError(f"{place}: {reason}", details)


# -- progress --------------------------------------------------------------------------------
def _bar(args: argparse.Namespace | None, total: int | None, desc: str, unit: str) -> Any:
    """A tqdm bar on stderr: shown when stderr is a terminal (or ``--progress``), never with
    ``--quiet`` or without ``args``; a disabled bar costs nothing and prints nothing."""
    terminal = sys.stderr.isatty()
    shown = args is not None and not args.quiet and (args.progress or terminal)
    # On a terminal the bar is erased when done; into a log (--progress) its last state stays.
    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, disable=not shown,
                leave=not terminal, dynamic_ncols=True, unit_scale=unit == "B")  # fmt: skip


def _advance(bar: Any, size: int) -> None:
    """Move a bar of data bytes by written bytes, never past 100% (framing is written too)."""
    bar.update(max(0, min(size, bar.total - bar.n)))


class _Counted(io.RawIOBase):
    """A binary sink that moves a bar by the bytes written, in slices of ``_SLICE``: one
    2 GiB blob moves the bar as it goes instead of in one step at the end."""

    _SLICE = 64 << 20

    def __init__(self, sink: BinaryIO, bar: Any) -> None:
        super().__init__()
        self._sink, self._bar = sink, bar

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        for start in range(0, len(view), self._SLICE):
            piece = view[start : start + self._SLICE]
            self._sink.write(piece)  # a BufferedWriter (or stdout's) writes all of it
            _advance(self._bar, len(piece))
        return len(view)

    def flush(self) -> None:
        self._sink.flush()


# -- printing --------------------------------------------------------------------------------
def _print_head(path: str, kind: str, size: int, context: dict[str, Any]) -> None:
    print(f"{path}: {kind}, {size} bytes")
    if "stream_header" in context:
        header = context["stream_header"]
        if header is None:
            print("  stream header: none (bare concatenated blobs)")
        else:
            print(f"  stream header: model {header['model']!r}, num_layers "
                  f"{header['num_layers']}, kv_roles {header['kv_roles']}, element_type "
                  f"{header['element_type']}")  # fmt: skip
            if header["metadata"]:
                print(f"    metadata: {json.dumps(header['metadata'], sort_keys=True)}")
        print(f"  end record: {'yes' if context['stream_complete'] else 'no'}")
    if context.get("metadata"):
        print(f"  file metadata: {json.dumps(context['metadata'], sort_keys=True)}")


def _print_item(item: dict[str, Any]) -> None:
    print(f"  [{item['item']}]")
    envelope = item.get("envelope") or {}
    if envelope:
        status = "verified" if envelope["checksums_verified"] else "not verified"
        print(f"    blob: version {envelope['version']}, total_length {envelope['total_length']}, "
              f"checksums {envelope['checksum_type']} ({status})")  # fmt: skip
    d = item["descriptor"]
    print(
        f"    descriptor: Hurray {d['version']}, {d['descriptor_length']} bytes, flags {d['flags']}"
    )
    print(f"    element_type: {d['element_type']} ({d['type_tag']})")
    print(f"    shape: {d['shape']}")
    layout = d["layout"]
    print(f"    layout: {layout['name']} ({layout['tag']})")
    for key, value in layout.items():
        if key not in ("name", "tag"):
            print(f"      {key}: {value}")
    print("    buffers:")
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
        print(line)
    for section in [s for s in envelope.get("sections", []) if s["kind"] != "buffer"]:
        print(f"    section {section['kind']}: @ {section['offset']}  {section['codec']} "
              f"stored {section['stored_size']} raw {section['raw_size']}"
              f"{'  required' if section['required'] else ''}")  # fmt: skip
    quant = d["quantization"]
    if quant is None:
        print("    quantization: none")
    else:
        fields = ", ".join(f"{k}={v}" for k, v in quant.items() if k != "scheme")
        print(f"    quantization: {quant['scheme']} ({fields})")
    if d.get("statistics"):
        print(f"    statistics: {d['statistics']}")
    stats = item.get("index")
    if stats:
        print(f"    sequences: {stats['sequences']}, logical pages {stats['logical_pages']}")
        for unit in ("pages", "tokens"):
            spread = stats[f"{unit}_per_sequence"]
            if spread:
                print(f"    {unit} per sequence: min {spread['min']} / median "
                      f"{spread['median']} / max {spread['max']}")  # fmt: skip
            elif unit == "tokens":
                print("    tokens per sequence: unknown (no seq_lens)")
        print(f"    shared pages: {stats['shared_pages']}")
        print(f"    pool occupancy: {stats['pool_pages_referenced']} of {layout['num_pages']} "
              f"pages referenced ({stats['pool_occupancy']:.1%})")  # fmt: skip
    pages = item.get("pages")  # what the page sections said
    if pages and pages["bad_pages"]:
        places = [tuple(p) for p in pages["bad_positions"]]
        print(f"    BAD PAGES (digest mismatch): physical {pages['bad_pages']}, logical "
              f"(sequence, page) {places}")  # fmt: skip
    elif pages and pages["digests"]:
        print("    page digests: every page matches")
    if pages and pages["by_reference"]:
        print(f"    pages by reference: {pages['by_reference']} (held in the receiver's page "
              "store: not in this input, shown as zero)")  # fmt: skip
    for name, values in (item.get("arrays") or {}).items():
        print(f"    {name}: {'none' if values is None else values}")
    if item.get("metadata"):
        print(f"    metadata: {json.dumps(item['metadata'], sort_keys=True)}")


_ANNOTATE: dict[str, Callable[[Any], list[summary.Annotation]]] = {
    "descriptor": summary.annotate_descriptor,
    "blob": summary.annotate_blob,
    "blob-stream": summary.annotate_stream,
    "hrry-file": summary.annotate_hrry,
}
HEX_KINDS = tuple(_ANNOTATE)


def _dump_one(path: str, args: argparse.Namespace, document: dict[str, Any]) -> None:
    """Print one input record by record (an error leaves those before it printed); pages
    that fail their digests are named in their blob, then reported."""
    verify = not args.no_verify
    data, kind = _read(path, args)
    document.update(kind=kind, size=len(data))
    if args.hex:
        _dump_hex(data, kind)
        return
    frame = summary.framing(data, kind)
    context = summary.describe_container(kind, frame)
    document.update(context)
    if not args.json:
        _print_head(path, kind, len(data), context)
    total = frame.records
    bad: CliError | None = None
    with _bar(args, total if total and total > 1 else None, path, "record") as bar:
        for item in _items(data, kind, verify, salvage=verify):
            checked = verify and not item.extra.get("unverified")
            described = summary.dump_item(item, checked, arrays=args.index)
            if args.json:
                document["items"].append(described)
            else:  # cleared and redrawn around the text: a bar on the same terminal stays whole
                with tqdm.external_write_mode(file=sys.stdout):
                    _print_item(described)
            bar.update(1)
            bad = bad or _bad_pages(item)
    if bad is not None:
        raise bad


def _dump_hex(data: Any, kind: str) -> None:
    """The annotated hex, then the same checks as ``validate``: a corrupt or cut input is
    shown as far as it goes and exits 1."""
    if kind not in HEX_KINDS:
        raise UsageError(f"--hex is available for {', '.join(HEX_KINDS)}, not {kind}")
    raw = memoryview(data)
    try:  # one line per field
        notes = _ANNOTATE[kind](bytes(raw) if kind == "descriptor" else data)
        for offset, size, name, value in notes:
            shown = bytes(raw[offset : offset + min(size, 16)]).hex(" ")
            more = " .." if size > 16 else ""
            print(f"{offset:08x}  {shown + more:<51}  {name} = {value}")
    except (struct.error, IndexError, HurrayWireError) as exc:  # bytes that are no record
        raise CliError(f"cannot annotate further: {exc}") from None
    finally:
        sys.stdout.flush()
    _check(data, kind)


def _each_input(args: argparse.Namespace) -> int:
    """``dump`` or ``validate`` every input, whatever fails (its result gets an ``error``);
    with ``--json`` the results as one array on stdout; the worst exit code."""
    dump = args.command == "dump"
    one = _dump_one if dump else _validate_one
    results: list[dict[str, Any]] = []
    for path in args.paths:
        fields: dict[str, Any] = {"size": None, "items": []} if dump else {"ok": False}
        results.append(result := {"path": path, "kind": None, **fields})
        args.worst = max(args.worst, _guard(path, partial(one, path, args, result), result))
    if args.json:
        json.dump(results, sys.stdout, indent=2, sort_keys=True)
        print()
    return int(args.worst)


def _check(data: Any, kind: str, args: argparse.Namespace | None = None) -> tuple[int, list[str]]:
    """Check every record of ``data``; returns (tensors, what could not be verified)."""
    if kind == "descriptor":
        summary.bare_descriptor(data)
        return 0, []
    count, unchecked, by_reference, total = 0, 0, 0, None
    with suppress(HurrayWireError):  # for the bar; the checking pass says what is wrong
        total = summary.framing(data, kind).records
    with _bar(args, total if total and total > 1 else None, "check", "record") as bar:
        for item in _items(data, kind, True):
            count += 1
            error = _bad_pages(item)
            if error is not None:
                raise error
            if item.blob is not None:  # a blob written with --no-checksum / checksum=False
                envelope = summary.describe_blob_envelope(item.blob, True)
                unchecked += not envelope["checksums_verified"]
            by_reference += len(item.pages["by_reference"]) if item.pages else 0
            bar.update(1)
    notes = []
    if kind in ("reference-stream", "hrry-file"):
        notes.append(f"a {kind} carries no data checksums: structure checked, values not")
    if unchecked:
        notes.append(f"{unchecked} of {count} blob(s) carry no checksums (written with "
                     "--no-checksum / checksum=False)")  # fmt: skip
    if by_reference:
        notes.append(f"{by_reference} page(s) held by reference in a receiver's page store, "
                     "not in this input")  # fmt: skip
    return count, notes


def _validate_one(path: str, args: argparse.Namespace, result: dict[str, Any]) -> None:
    data, kind = _read(path, args)
    result["kind"] = kind
    if kind == "descriptor":
        line = f"{path}: ok (descriptor, {summary.bare_descriptor(data)[1]})"
    else:
        count, notes = _check(data, kind, args)
        result.update(tensors=count, not_verified=notes)
        line = f"{path}: ok ({kind}, {count} tensor{'s' if count != 1 else ''})"
        line += "; NOT VERIFIED: " + "; ".join(notes) if notes else ""
    if not args.json:
        print(line)
    result["ok"] = True


# -- convert ---------------------------------------------------------------------------------
def _tensor_name(tensor: BlockPagedTensor, taken: set[str]) -> str:
    """``layer{L}.{role}`` (``layer_none`` for a layer-less tensor), made unique with a
    ``#n`` suffix when the input repeats a {layer, role}."""
    layer = "_none" if tensor.layer_index is None else tensor.layer_index
    base = f"layer{layer}.{tensor.kv_role}"
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
    stated = {
        "model": header.model or None,
        "num_layers": header.num_layers,
        "kv_roles": list(header.kv_roles) or None,
        "element_type": None if header.element_type is None else header.element_type.name,
        "end_record": None if header.end_record else False,
    }
    return {**header.metadata, **{STREAM_KEY + k: v for k, v in stated.items() if v is not None}}


def _metadata_header(metadata: Mapping[str, Any]) -> StreamHeader:
    """The reverse of :func:`_header_metadata`: ``.hrry`` file metadata as a stream header."""
    rest = {k: v for k, v in metadata.items() if not k.startswith(STREAM_KEY)}
    model, layers, roles, element = (
        metadata.get(STREAM_KEY + k) for k in ("model", "num_layers", "kv_roles", "element_type")
    )
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


def _load(
    args: argparse.Namespace, data: Any, kind: str, count: int | None
) -> list[tuple[str, BlockPagedTensor]]:
    """Decode and check every tensor of the input (zero-copy views), one bar step each."""
    if kind == "descriptor":
        raise CliError("a bare descriptor has no buffers to convert")
    tensors: list[tuple[str, BlockPagedTensor]] = []
    taken: set[str] = set()
    name = Path(args.input).name if args.input != STDIO else "stdin"
    with _bar(args, count, f"check {name}", "tensor") as bar:
        for item in _items(data, kind, True):
            if item.tensor is None:
                raise CliError(f"{item.label}: not a block-paged tensor, cannot convert")
            name = item.extra.get("name") or _tensor_name(item.tensor, taken)
            tensors.append((name, item.tensor))
            bar.update(1)
    return tensors


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


def _one_blob(target: str, path: str, held: int) -> None:
    if target == "blob" and held != 1:
        raise UsageError(f"a .hrwb blob holds one tensor; {path} holds {held}: convert to a "
                         "blob stream (.hrws) or a .hrry file")  # fmt: skip


def _convert(args: argparse.Namespace) -> None:
    target = _target(args)
    spec = args.compression
    try:
        compression = None if spec is None else Compression.parse(spec)  # text specs end here
    except CodecConfigError as exc:
        raise UsageError(f"--compression {spec}: {exc}") from None
    inputs = [] if args.input == STDIO else [args.input]
    if args.output != STDIO:
        check_not_input(args.output, inputs)  # before anything is opened for writing
    data, kind = _read(args.input, args)
    count, header, _, metadata = summary.framing(data, kind)
    _one_blob(target, args.input, count or 1)  # from the framing, before checking the tensors
    tensors = _load(args, data, kind, count)
    _one_blob(target, args.input, len(tensors))  # a reference stream is not counted
    checksum = not args.no_checksum
    stream_header = header or (_metadata_header(metadata) if metadata else StreamHeader())
    total = sum(t.nbytes for _, t in tensors)  # the data; a compressed output ends short
    name = Path(args.output).name if args.output != STDIO else "stdout"
    with _bar(args, total, name, "B") as bar:
        if target == "hrry-file":
            metadata = metadata or _header_metadata(header)
            write_file(args.output, dict(tensors), metadata, progress=partial(_advance, bar))
        else:
            output: AbstractContextManager[BinaryIO] = (
                nullcontext(sys.stdout.buffer)
                if args.output == STDIO
                else atomic_output(args.output, inputs=inputs)
            )
            with output as out:
                sink = _Counted(out, bar)
                if target == "blob":
                    parts = encode_parts(tensors[0][1], compression=compression, checksum=checksum)
                    sink.writelines(parts)
                elif target == "blob-stream":
                    with StreamWriter(sink, stream_header) as writer:
                        for _, tensor in tensors:  # a conversion keeps every page
                            writer.write(
                                tensor, compression=compression, checksum=checksum, pages="all"
                            )
                else:
                    for _, tensor in tensors:
                        write_stream(sink, tensor)
                sink.flush()
        bar.update(total - bar.n)


# -- errors ----------------------------------------------------------------------------------
def _guard(path: str, step: Callable[[], None], result: dict[str, Any] | None = None) -> int:
    """Run ``step`` for ``path``; print its failure as one line and return its exit code
    (``result["error"]``: the code, the line and the error's structured fields, for ``--json``)."""
    error: BaseException
    try:
        step()
        return EXIT_OK
    except UsageError as exc:
        code, message, error = EXIT_USAGE, str(exc), exc
    except FileAccessError as exc:  # its message starts with the path it is about
        code, message, error = EXIT_FILE, str(exc), exc
    except (HurrayWireError, CliError) as exc:
        code, message, error = EXIT_INVALID, f"{path}: {exc}", exc
    except BrokenPipeError:
        raise
    except OSError as exc:  # a write that failed under us (disk full, ...)
        code, message = EXIT_FILE, f"{exc.filename or path}: {exc.strerror or exc}"
        error = exc
    except Exception as exc:  # a bug: still one line, never a traceback (the contract)
        code, message = EXIT_INTERNAL, f"{path}: internal error: {type(exc).__name__}: {exc}"
        error = exc
    print(f"hurray-wire: {message}", file=sys.stderr)
    if result is not None:
        result["error"] = {**_details(error), "message": message, "exit_code": code}
    return code


# -- entry -----------------------------------------------------------------------------------
def run(args: argparse.Namespace) -> int:
    """Run the command ``cli_args.main`` parsed (without loading this module): its exit code."""
    args.worst = EXIT_OK  # the worst exit code so far: what a broken pipe returns
    try:
        if args.command == "convert":  # one input, one output; errors name the input
            return _guard(args.input, lambda: _convert(args))
        return _each_input(args)
    except KeyboardInterrupt:
        print("hurray-wire: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # e.g. `| head`: stop quietly, and keep Python's exit flush quiet
        with suppress(OSError, ValueError), open(os.devnull, "wb") as devnull:
            os.dup2(devnull.fileno(), sys.stdout.fileno())
        return int(args.worst)  # invalid inputs seen before the reader left still count


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` and run the command (the console script is ``cli_args.main``)."""
    return run(build_parser().parse_args(argv))


if __name__ == "__main__":  # pragma: no cover - python -m hurray_wire.cli
    sys.exit(main())
