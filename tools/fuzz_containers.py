#!/usr/bin/env python3
"""atheris fuzz harness for the container readers: reference streams, ``.hrry`` files and
hurray-wire streams.

Every input goes through ``check_containers``, which feeds the same bytes to

* ``hurray_wire.containers.read_stream`` twice, from the bytes (zero-copy views)
  and from an ``io.BytesIO`` (the file-like path), consuming the iterator;
* ``hurray_wire.containers.HrryFile.from_buffer``: ``names``, ``metadata``,
  ``user_metadata``, and per tensor ``entry``, ``descriptor_header``, ``buffer_spans`` and
  ``tensor`` (each tensor on its own, so one bad tensor does not hide the others); and
  ``read_file`` on the bytes written to a scratch file (the mapped path);
* ``hurray_wire.cli``: ``identify``, ``main(["validate", path])``, ``main(["dump", "--json",
  path])``, ``dump --index`` and (inputs up to 16 KiB) ``dump --hex`` on the bytes written
  to a scratch file: exit 0 or 1 (``--hex`` of a kind it does not annotate: 2), every dump
  accepting what ``validate`` accepts; ``convert`` to a ``.hrws`` file (every invalid input,
  one valid input in 8 by its hash: the atomic write syncs), which converts what
  ``validate`` accepts into a stream that validates;
* ``hurray_wire.containers``' blob stream: ``StreamReader`` from an
  ``io.BytesIO`` and from the bytes, ``StreamReader`` with a small ``max_blob_bytes``,
  ``StreamReader(report=True)``, ``StreamFile``, and ``load_cache`` of the
  bytes as a ``.hrws`` file;

and fails on any exception that is not a ``HurrayWireError`` and on any disagreement:

* the two ``read_stream`` paths yield the same tensors and fail with the same error type;
  a stream that reads completely is written back byte for byte by ``write_stream``;
* ``read_file`` returns the same tensors as ``HrryFile.from_buffer`` when every tensor
  reads, and raises our error when one does not or the file does not open;
* ``.hrry`` tensors that read are written back with ``write_file`` (with the user metadata)
  and read again to equal tensors, ``seq_lens`` and metadata included;
* the two ``StreamReader`` sources agree (tensors, error type, header, completeness); a
  small ``max_blob_bytes`` refuses only with ``LimitExceededError``; a stream that reads
  completely has the same entries and tensors through ``StreamFile``, and is written again
  by ``StreamWriter`` to a stream that reads back to the same tensors;
* the report mode hands out the strict reader's tensors with empty reports, and goes
  further only with a blob whose report names failed pages where the strict reader raised
  ``PageDigestError`` / ``ChecksumError``; ``load_cache`` loads only a stream the strict
  reader reads whole, to the same tensors.

Modes. By default libFuzzer's byte mutations drive the search. ``--fix-checksums`` (or
``HW_FUZZ_FIX_CHECKSUMS=1``) installs a custom mutator that, after each mutation (a plain
libFuzzer one, or a boundary value written into a field located by parsing the container:
the ``.hrry`` header, trailer and index entries, each descriptor's fixed fields and buffer
handles, stream and end record fields, or a structure-aware blob mutation from
``fuzz_blob.py`` spliced into a stream with the end record's index moved to match),
RE-COMPUTES the ``.hrry`` index CRC-32C (over the ``index_length`` index bytes, stored in
the trailer at ``size - 40 + 28``, when ``HAS_INDEX_CRC32C`` is set; containers.md § B.6)
and, in hurray-wire streams, every blob's section and header checksums and the stream
header's and end record's xxh3_64 checksums. The target never rewrites its input, so a
crash file reproduces as it is. ``--report-known`` works as in ``fuzz_blob.py``.

Usage (``pip install atheris``)::

    mkdir -p /tmp/hw-containers-corpus
    python tools/fuzz_containers.py -max_total_time=300 -timeout=20 /tmp/hw-containers-corpus \\
        fixtures/conformance/block_paged/streams fixtures/conformance/block_paged/files \\
        fixtures/conformance/reference/files
    python tools/fuzz_containers.py --fix-checksums -max_total_time=300 -timeout=20 ...

Generated seeds (hurray-wire streams with and without header, end record and index,
``.hrry`` files with seq_lens, per-tensor and user metadata and a sorted index, reference
streams of quantized and packed tensors) go to ``$TMPDIR/hurray-wire-fuzz-containers-seeds``
and are appended as a seed directory whenever every positional argument is a directory.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import io
import random
import shutil
import struct
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

try:
    import atheris  # type: ignore[import-untyped]
except ImportError:
    atheris = None

if atheris is not None and __name__ == "__main__":
    with atheris.instrument_imports(include=["hurray_wire"]):
        import _instrumented  # the lazy package: every module now, instrumented

        import hurray_wire as hw
        from hurray_wire import cli, containers as hws, containers as reference
        from hurray_wire.crc32c import crc32c
        from hurray_wire.metadata import encode_metadata

        _instrumented.import_all()
else:
    import hurray_wire as hw
    from hurray_wire import cli, containers as hws, containers as reference
    from hurray_wire.crc32c import crc32c
    from hurray_wire.metadata import encode_metadata

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fuzz_blob  # the blob checksum fixer, mutator and tensor comparison

ROOT = Path(__file__).resolve().parent.parent
CONFORMANCE = ROOT / "fixtures" / "conformance"
SEED_DIRS = [
    CONFORMANCE / "block_paged" / "streams",
    CONFORMANCE / "block_paged" / "files",
    CONFORMANCE / "reference" / "files",
    ROOT / "fixtures" / "streams",
]
HRRY_MAGIC = b"HRRYFILE"
TRAILER_SIZE = 40
FLAG_INDEX_CRC = 0x04
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_SMALL_MAX_BLOB = 4096
_SCRATCH: list[Path] = []


_outcome = fuzz_blob.outcome  # our error, or an open finding's, as a value


def _collect(iterator_factory: Callable[[], Any]) -> tuple[list[Any], hw.HurrayWireError | None]:
    """Every item an iterator yields before it ends or raises our error."""
    items: list[Any] = []
    try:
        for item in iterator_factory():
            items.append(item)
    except hw.HurrayWireError as exc:
        return items, exc
    except Exception as exc:
        known = fuzz_blob.as_known(exc)
        if known is None:
            raise
        return items, known
    return items, None


def _same_tensors(what: str, a: list[Any], b: list[Any], *, extras: bool = True) -> None:
    if len(a) != len(b):
        raise AssertionError(f"{what}: {len(a)} tensors vs {len(b)}")
    for number, (x, y) in enumerate(zip(a, b, strict=True)):
        diff = tensor_difference(x, y, extras=extras)
        if diff is not None:
            raise AssertionError(f"{what}: tensor {number} differs in {diff}")


def tensor_difference(
    a: hw.BlockPagedTensor, b: hw.BlockPagedTensor, *, extras: bool = True
) -> str | None:
    """Where two tensors differ; ``extras=False`` ignores seq_lens and metadata."""
    if extras:
        return fuzz_blob.tensor_difference(a, b)
    return fuzz_blob.tensor_difference(_bare(a), _bare(b))


def _bare(tensor: hw.BlockPagedTensor) -> hw.BlockPagedTensor:
    return hw.BlockPagedTensor._trusted(
        tensor.descriptor,
        tensor.page_pool,
        tensor.block_table,
        tensor.seq_ptr,
        tensor.scales,
        tensor.zero_points,
    )


def _same_error(what: str, e1: Exception | None, e2: Exception | None) -> None:
    if (e1 is None) != (e2 is None) or (e1 is not None and type(e1) is not type(e2)):
        raise AssertionError(f"{what}: {e1!r} vs {e2!r}")


# -- reference streams -------------------------------------------------------------------------
def check_reference_stream(data: bytes) -> None:
    tensors, error = _collect(lambda: reference.read_stream(data))
    from_file, file_error = _collect(lambda: reference.read_stream(io.BytesIO(data)))
    _same_tensors("read_stream bytes vs BytesIO", tensors, from_file)
    _same_error("read_stream bytes vs BytesIO", error, file_error)
    if error is None and tensors:
        sink = io.BytesIO()
        try:
            reference.write_stream(sink, tensors)
        except hw.HurrayWireError as exc:
            raise AssertionError(f"write_stream refused tensors read_stream gave: {exc!r}") from exc
        if sink.getvalue() != data:
            raise AssertionError("write_stream(read_stream(data)) != data")


# -- .hrry files -------------------------------------------------------------------------------
def _scratch_file() -> Path:
    if not _SCRATCH:
        folder = tempfile.mkdtemp(prefix="hw-fuzz-")
        atexit.register(shutil.rmtree, folder, ignore_errors=True)  # no scratch left in /tmp
        _SCRATCH.append(Path(folder) / "roundtrip.hrry")
    return _SCRATCH[0]


def _has_empty_array(values: Any) -> bool:
    return any(isinstance(v, list) and not v for v in values)


def check_hrry(data: bytes) -> None:
    hrry, _ = _outcome(lambda: reference.HrryFile.from_buffer(data))
    if data[:8] == HRRY_MAGIC:
        _check_read_file(data, hrry)
    if hrry is None:
        return
    with hrry:
        names = hrry.names
        metadata = hrry.metadata
        user = hrry.user_metadata
        if len(set(names)) != len(names) or len(hrry) != len(names):
            raise AssertionError("duplicate or miscounted tensor names")
        good: dict[str, hw.BlockPagedTensor] = {}
        for name in names:
            if name not in hrry:
                raise AssertionError(f"{name!r} listed but not 'in' the file")
            hrry.entry(name)
            _outcome(functools.partial(hrry.descriptor_header, name))
            _outcome(functools.partial(hrry.buffer_spans, name))
            tensor, _ = _outcome(functools.partial(hrry.tensor, name))
            if tensor is not None:
                good[name] = tensor
        if good and not _has_empty_array(metadata.values()):
            _hrry_round_trip(good, user)


def _check_read_file(data: bytes, hrry: Any) -> None:
    """``read_file`` on the bytes written to a file (the mapped path) agrees with
    ``HrryFile.from_buffer``: the same tensors when every tensor reads, else our error."""
    path = _scratch_file().with_suffix(".in.hrry")
    path.unlink(missing_ok=True)  # a new inode: a mapping still alive is never truncated
    path.write_bytes(data)
    tensors, error = _outcome(lambda: reference.read_file(path))
    if hrry is None:
        if error is None:
            raise AssertionError("read_file accepted a file HrryFile.from_buffer refused")
        return
    # (no ``with``: the caller goes on reading ``hrry``)
    names = hrry.names
    expected = [_outcome(functools.partial(hrry.tensor, name)) for name in names]
    if any(e is not None for _, e in expected):
        if error is None:
            raise AssertionError("read_file accepted a tensor HrryFile.tensor refused")
        return
    if error is not None:
        raise AssertionError(f"read_file refused a file HrryFile reads: {error!r}")
    if tuple(tensors) != names:
        raise AssertionError("read_file and HrryFile disagree on the names")
    for name, (tensor, _) in zip(names, expected, strict=True):
        diff = tensor_difference(tensor, tensors[name])
        if diff is not None:
            raise AssertionError(f"read_file and HrryFile.tensor differ on {name!r}: {diff}")


def _hrry_round_trip(tensors: dict[str, hw.BlockPagedTensor], user: dict[str, Any]) -> None:
    path = _scratch_file()
    try:
        reference.write_file(path, tensors, user)
    except hw.HurrayWireError as exc:
        raise AssertionError(f"write_file refused what HrryFile read: {exc!r}") from exc
    try:
        with reference.HrryFile(path) as again:
            if again.names != tuple(tensors):
                raise AssertionError("write_file -> HrryFile changed the names")
            if encode_metadata(again.user_metadata) != encode_metadata(user):
                raise AssertionError("write_file -> HrryFile changed the user metadata")
            for name, tensor in tensors.items():
                copy = again.tensor(name)
                if tensor.seq_lens is not None and not len(tensor.seq_lens):
                    tensor = _bare_with_metadata(tensor)  # an empty seq_lens is not written
                diff = tensor_difference(tensor, copy)
                if diff is not None:
                    raise AssertionError(f"write_file -> HrryFile changed {name!r}: {diff}")
    except hw.HurrayWireError as exc:
        raise AssertionError(f"a file write_file wrote does not read: {exc!r}") from exc


def _bare_with_metadata(tensor: hw.BlockPagedTensor) -> hw.BlockPagedTensor:
    bare = _bare(tensor)
    bare.metadata = tensor.metadata
    return bare


# -- hurray-wire streams -----------------------------------------------------------------------
def _read_all(source: Any, **options: Any) -> tuple[Any, list[Any], hw.HurrayWireError | None]:
    """(reader or None, tensors, error) of a StreamReader over ``source``."""
    reader, error = _outcome(lambda: hws.StreamReader(source, **options))
    if reader is None:
        return None, [], error
    tensors, error = _collect(lambda: reader)
    return reader, tensors, error


def check_stream(data: bytes) -> None:
    reader, tensors, error = _read_all(io.BytesIO(data))
    mem_reader, mem_tensors, mem_error = _read_all(data)
    _same_tensors("StreamReader BytesIO vs bytes", tensors, mem_tensors)
    _same_error("StreamReader BytesIO vs bytes", error, mem_error)
    if reader is not None and mem_reader is not None:
        if reader.complete != mem_reader.complete or reader.entries != mem_reader.entries:
            raise AssertionError("StreamReader BytesIO vs bytes: entries or completeness differ")
        if error is None and reader.header != mem_reader.header:
            raise AssertionError("StreamReader BytesIO vs bytes: headers differ")
    _, small, small_error = _read_all(io.BytesIO(data), max_blob_bytes=_SMALL_MAX_BLOB)
    _same_tensors("small max_blob_bytes", small, tensors[: len(small)])
    if (
        error is None
        and small_error is not None
        and not isinstance(small_error, hw.errors.LimitExceededError)
    ):
        raise AssertionError(f"small max_blob_bytes refused a good stream: {small_error!r}")
    if error is not None and small_error is None:
        raise AssertionError("small max_blob_bytes accepted a stream the defaults refuse")

    stream_file, _ = _outcome(lambda: hws.StreamFile(data))
    if stream_file is not None:
        with stream_file:
            file_tensors, file_error = _collect(lambda: stream_file)
            for key in list(stream_file.keys()):
                _outcome(functools.partial(stream_file.tensor, *key))
            if error is None and reader is not None:
                if file_error is not None:
                    raise AssertionError(f"StreamFile refused a good stream: {file_error!r}")
                if stream_file.entries != reader.entries:
                    raise AssertionError("StreamFile and StreamReader disagree on the entries")
                if stream_file.complete != reader.complete:
                    raise AssertionError("StreamFile and StreamReader disagree on completeness")
                _same_tensors("StreamFile vs StreamReader", file_tensors, tensors)
    if error is None and reader is not None:
        _stream_round_trip(reader, tensors)
    check_report_mode(data, tensors, error)
    check_load_cache(data, tensors, error)


def check_report_mode(data: bytes, tensors: list[Any], error: hw.HurrayWireError | None) -> None:
    """``StreamReader(report=True)`` hands out what the strict reader reads, with
    an empty report, and goes further only with a blob whose report names failed pages,
    where the strict reader stopped with a page-digest (or deferred checksum) error."""
    reader, opened = _outcome(lambda: hws.StreamReader(data, report=True))
    if reader is None:
        if error is None:
            raise AssertionError(f"report=True refused a good stream: {opened!r}")
        return
    got: list[Any] = []
    reports: list[Any] = []
    while True:
        tensor, failed = _outcome(lambda: next(reader, None))
        if failed is not None or tensor is None:
            break
        got.append(tensor)
        reports.append(reader.page_report)
    bad = next((i for i, r in enumerate(reports) if r is None or not r.ok), None)
    _same_tensors("report=True vs the strict reader", got[:bad], tensors[: len(got[:bad])])
    if bad is None:
        if len(got) != len(tensors) or type(failed) is not type(error):
            raise AssertionError(
                f"report=True vs the strict reader: {len(got)} tensors, {failed!r} vs "
                f"{len(tensors)} tensors, {error!r}"
            )
    elif (
        reports[bad] is None
        or len(tensors) != bad
        or not isinstance(error, (hw.errors.PageDigestError, hw.errors.ChecksumError))
    ):
        raise AssertionError(
            f"report=True handed out blob {bad} with failed pages where the strict "
            f"reader read {len(tensors)} blobs and raised {error!r}"
        )


def check_load_cache(data: bytes, tensors: list[Any], error: hw.HurrayWireError | None) -> None:
    """``load_cache`` of the bytes as a ``.hrws`` file: a cache only of a stream the strict
    reader reads whole, with a header naming every layer and role, and the same tensors."""
    path = _scratch_file().with_suffix(".hrws")
    path.write_bytes(data)
    cache, _ = _outcome(lambda: hw.load_cache(path))
    if cache is None:
        return
    if error is not None:
        raise AssertionError(f"load_cache read a stream StreamReader refuses: {error!r}")
    loaded = [cache.tensors[(t.layer_index, t.kv_role)] for t in tensors]
    if len(cache.tensors) != len(tensors):
        raise AssertionError("load_cache holds another number of tensors than the stream")
    _same_tensors("load_cache vs StreamReader", loaded, tensors)


def _stream_round_trip(reader: Any, tensors: list[Any]) -> None:
    if any(_has_empty_array(t.metadata.values()) for t in tensors):
        return
    header = reader.header
    if header is not None and _has_empty_array(header.metadata.values()):
        return
    sink = io.BytesIO()
    try:
        with hws.StreamWriter(sink, header) as writer:
            for tensor in tensors:
                writer.write(tensor, pages="all")
    except hw.HurrayWireError as exc:
        raise AssertionError(f"StreamWriter refused what StreamReader read: {exc!r}") from exc
    again, copies, error = _read_all(sink.getvalue())
    if error is not None:
        raise AssertionError(f"a stream StreamWriter wrote does not read: {error!r}")
    _same_tensors("StreamWriter -> StreamReader", tensors, copies)
    if again.header != header:
        raise AssertionError("StreamWriter -> StreamReader changed the header")


# -- the command line ---------------------------------------------------------------------------
# argparse builds the parser in ~2 ms, most of the CLI check's time: build it once. (It holds
# no state between parse_args calls.) The commands themselves run unchanged.
cli.build_parser = functools.lru_cache(maxsize=1)(cli.build_parser)  # what cli.main calls


def check_cli(data: bytes) -> None:
    """``identify`` answers or raises our error; ``validate`` and ``dump --json`` exit 0 or 1
    (a one-line message, never a traceback), and dump accepts whatever validate accepts."""
    kind = None
    with contextlib.suppress(hw.HurrayWireError, cli.CliError):
        kind = cli.identify(data)
    path = _scratch_file().with_suffix(".bin")
    path.write_bytes(data)
    codes = []
    commands = [["validate", str(path)], ["dump", "--json", str(path)]]
    commands.append(["dump", "--index", str(path)])
    if len(data) <= 16384:  # annotated hex: about 40 bytes of text per input byte
        commands.append(["dump", "--hex", str(path)])
    for argv in commands:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            code, known = _outcome(functools.partial(cli.main, argv))
        if known is not None:
            return  # an open finding (the CLI lets it through as a traceback)
        codes.append(code)
    if codes[0] != 0 or xxhash.xxh3_64_intdigest(data) % 8 == 0:  # a valid one fsyncs: 1 in 8
        _check_convert(path, kind, codes[0])
    hex_usage = len(codes) == 4 and kind is not None and kind not in cli.HEX_KINDS
    if hex_usage and codes.pop() != cli.EXIT_USAGE:  # --hex annotates only some kinds
        raise AssertionError(f"dump --hex of a {kind} did not exit {cli.EXIT_USAGE}")
    if any(code not in (0, 1) for code in codes) or (codes[0] == 0 and any(codes[1:])):
        raise AssertionError(f"validate / dump --json / dump --index / dump --hex: {codes}")


def _check_convert(path: Path, kind: str | None, valid: int) -> None:
    """``convert IN OUT.hrws``: exit 0 or 1 (2 for a bare descriptor, which has no blob
    form); an input ``validate`` accepts converts (unless a ``.hrry`` tensor is not
    block-paged), and the output validates."""
    out = path.with_name("converted.hrws")
    out.unlink(missing_ok=True)
    sink = io.StringIO()
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        code = cli.main(["convert", str(path), str(out)])
        again = cli.main(["validate", str(out)]) if code == 0 else None
    if code == cli.EXIT_USAGE and kind == "descriptor":
        return
    # a .hrry file may hold tensors of other layouts: valid, but with no blob form
    other_layout = "not a block-paged tensor, cannot convert" in sink.getvalue()
    if code not in (0, 1) or (valid == 0 and code != 0 and not other_layout) or again:
        raise AssertionError(f"convert: exit {code} (validate {valid}, of the output {again})")


def check_containers(data: bytes) -> None:
    """One fuzz case: every reader accepts consistently or raises our error."""
    check_reference_stream(data)
    check_hrry(data)
    check_stream(data)
    check_cli(data)


# -- checksum fixing -------------------------------------------------------------------------
def fix_hrry_crc(data: bytes) -> bytes:
    """Recompute the index CRC-32C of a ``.hrry`` image (when its flag is set)."""
    size = len(data)
    if size < 64 + TRAILER_SIZE or data[:8] != HRRY_MAGIC:
        return data
    flags = _U32.unpack_from(data, 12)[0]
    at = size - TRAILER_SIZE
    index_offset, index_length = struct.unpack_from("<QQ", data, at)
    if not flags & FLAG_INDEX_CRC or index_offset + index_length > at:
        return data
    buf = bytearray(data)
    _U32.pack_into(buf, at + 28, crc32c(bytes(buf[index_offset : index_offset + index_length])))
    return bytes(buf)


def stream_records(data: bytes) -> list[tuple[bytes, int, int]]:
    """(magic, start, total_length) of each record of a hurray-wire stream, as framed."""
    out = []
    pos = 0
    while pos + 16 <= len(data):
        magic = data[pos : pos + 4]
        if magic not in (b"HRWS", b"HRWB", b"HRWE"):
            break
        total = _U64.unpack_from(data, pos + 8)[0]
        if total < 64 or total % 64:
            break
        out.append((magic, pos, total))
        pos += total
    return out


def fix_stream_checksums(data: bytes) -> bytes:
    """Recompute every checksum of a hurray-wire stream (stream header, blobs, end record)."""
    buf = data
    for magic, start, total in stream_records(data):
        if start + total > len(buf):
            if magic == b"HRWB":
                buf = fuzz_blob.fix_checksums(buf, start)
            break
        if magic == b"HRWB":
            buf = fuzz_blob.fix_checksums(buf, start)
            continue
        footer = 8 if magic == b"HRWS" else 16
        mutable = bytearray(buf)
        digest = xxhash.xxh3_64_intdigest(bytes(mutable[start : start + total - footer]))
        _U64.pack_into(mutable, start + total - footer, digest)
        buf = bytes(mutable)
    return buf


def fix_checksums(data: bytes) -> bytes:
    if data[:8] == HRRY_MAGIC:
        return fix_hrry_crc(data)
    if data[:4] in (b"HRWS", b"HRWB", b"HRWE"):
        return fix_stream_checksums(data)
    return data


# -- structure-aware mutation ----------------------------------------------------------------
def _descriptor_fields(start: int, data: bytes) -> list[tuple[int, int]]:
    """(offset, width) of a descriptor's fixed fields and its buffer handles' sizes."""
    fields = [(start + o, w) for o, w in ((4, 1), (5, 1), (6, 4), (10, 1), (11, 1), (12, 4))]
    fields += [(start + o, 1) for o in range(16, 24)]
    fields += [(start + o, 8) for o in range(24, 96, 8)]
    fields += [(start + o, 4) for o in range(24, 96, 4)]
    return [(o, w) for o, w in fields if o + w <= len(data)]


def _hrry_fields(data: bytes) -> list[tuple[int, int]]:
    size = len(data)
    fields = [(8, 1), (9, 1), (12, 4), (16, 4), (20, 8), (28, 8)]
    at = size - TRAILER_SIZE
    fields += [(at, 8), (at + 8, 8), (at + 16, 8), (at + 24, 4), (at + 28, 4)]
    index_offset, index_length = struct.unpack_from("<QQ", data, at)
    if index_offset + index_length <= at and index_length >= 8:
        fields.append((index_offset, 8))
        pos = index_offset + 8
        end = index_offset + index_length
        while pos + 2 <= end:
            name_length = _U16.unpack_from(data, pos)[0]
            fields.append((pos, 2))
            fixed = pos + 2 + name_length
            if fixed + 32 > end:
                break
            fields += [
                (fixed, 8),
                (fixed + 8, 4),
                (fixed + 12, 8),
                (fixed + 20, 8),
                (fixed + 28, 4),
            ]
            d_off, d_len = struct.unpack_from("<QI", data, fixed)
            if d_off + min(d_len, 96) <= size:
                fields += _descriptor_fields(d_off, data)
            pos = fixed + 32
    return [(o, w) for o, w in fields if o >= 0 and o + w <= size]


def _reference_fields(data: bytes) -> list[tuple[int, int]]:
    fields: list[tuple[int, int]] = []
    pos = 0
    while pos + 10 <= len(data) and data[pos : pos + 4] == b"HRRY":
        fields += _descriptor_fields(pos, data)
        try:
            descriptor = hw.decode_descriptor(data[pos:])
        except hw.HurrayWireError:
            break
        pos += descriptor.descriptor_length + sum(h.byte_size for h in descriptor.buffers)
        if pos < len(data):
            fields.append((pos, 4))
    return fields


def stream_fields(data: bytes) -> list[tuple[int, int]]:
    fields = []
    for magic, start, total in stream_records(data):
        fields += [(start + 4, 1), (start + 5, 1), (start + 6, 2), (start + 8, 8)]
        if magic == b"HRWS":
            fields += [
                (start + 16, 4),
                (start + 20, 1),
                (start + 21, 1),
                (start + 22, 2),
                (start + 24, 4),
                (start + 28, 4),
            ]
        elif magic == b"HRWE":
            fields += [(start + 16, 8), (start + 24, 4), (start + 28, 4)]
            fields += [
                (start + o, w) for o in range(32, min(total, 32 + 24 * 8), 24) for w in (8,)
            ] + [(start + total - 8, 8)]
            fields += [(start + o + 8, 8) for o in range(32, min(total - 16, 32 + 24 * 8), 24)]
            fields += [(start + o + 16, 4) for o in range(32, min(total - 16, 32 + 24 * 8), 24)]
            fields += [(start + o + 20, 1) for o in range(32, min(total - 16, 32 + 24 * 8), 24)]
        else:
            fields += [(start + 16, 4), (start + 20, 2), (start + 22, 1), (start + 24, 4)]
    return [(o, w) for o, w in fields if o + w <= len(data)]


def set_field(data: bytes, fields: list[tuple[int, int]], rng: random.Random) -> bytes:
    if not fields:
        return data
    offset, width = rng.choice(fields)
    buf = bytearray(data)
    current = int.from_bytes(buf[offset : offset + width], "little")
    buf[offset : offset + width] = fuzz_blob.interesting(rng, width, current).to_bytes(
        width, "little"
    )
    return bytes(buf)


def _splice_blob(data: bytes, rng: random.Random, max_size: int) -> bytes:
    """Mutate one blob of a stream with the blob mutator; move the end index to match."""
    records = stream_records(data)
    blobs = [(s, t) for m, s, t in records if m == b"HRWB" and s + t <= len(data)]
    if not blobs:
        return data
    start, total = rng.choice(blobs)
    new = fuzz_blob.mutate(data[start : start + total], max_size, rng.getrandbits(32))
    out = bytearray(data[:start] + new + data[start + total :])
    shift = len(new) - total
    for magic, s, t in stream_records(bytes(out)):
        if magic == b"HRWE" and s + t <= len(out):
            count = _U32.unpack_from(out, s + 24)[0]
            for number in range(min(count, (t - 48) // 24)):
                at = s + 32 + 24 * number
                offset = _U64.unpack_from(out, at)[0]
                if offset == start:
                    struct.pack_into("<QQ", out, at, offset, len(new))
                elif offset > start:
                    _U64.pack_into(out, at, (offset + shift) & (2**64 - 1))
    return bytes(out)


_IN_LIBFUZZER: list[bool] = []


def _byte_mutate(data: bytes, rng: random.Random, max_size: int) -> bytes:
    if _IN_LIBFUZZER and rng.random() < 0.7:
        return bytes(atheris.Mutate(data, max_size))
    return fuzz_blob.byte_mutate(data, rng, max_size)


def mutate(data: bytes, max_size: int, seed: int) -> bytes:
    """The ``--fix-checksums`` custom mutator: a mutation, then every checksum recomputed."""
    return fuzz_blob.guarded_mutate(
        "fuzz_containers", MUTATOR_ERRORS, _mutate, fix_checksums, data, max_size, seed
    )


MUTATOR_ERRORS: list[str] = []


def _mutate(data: bytes, max_size: int, seed: int) -> bytes:
    rng = random.Random(seed)
    choice = rng.random()
    if data[:8] == HRRY_MAGIC and len(data) >= 64 + TRAILER_SIZE and choice < 0.6:
        if choice < 0.3:
            out = set_field(data, _hrry_fields(data), rng)
        else:
            out = _rebuild_hrry(data, rng, max_size)
    elif data[:4] in (b"HRWS", b"HRWB", b"HRWE") and choice < 0.5:
        if rng.random() < 0.5:
            out = _splice_blob(data, rng, max_size)
        else:
            out = set_field(data, stream_fields(data), rng)
    elif data[:4] == b"HRRY" and data[:8] != HRRY_MAGIC and choice < 0.5:
        if choice < 0.2:
            out = set_field(data, _reference_fields(data), rng)
        else:
            out = _rebuild_reference(data, rng)
    else:
        out = _byte_mutate(data, rng, max_size)
    return fix_checksums(out)[:max_size]


Record = tuple[bytes, list[bytes]]  # descriptor bytes, buffer bytes in table order


def _mutate_record(record: Record, rng: random.Random) -> Record:
    """Descriptor fields (sizes repaired, buffers resized, index buffers made coherent), or
    one element of a buffer."""
    descriptor, buffers = record
    if rng.random() < 0.3 and buffers:
        index = rng.randrange(len(buffers))
        buffers = list(buffers)
        buffers[index] = fuzz_blob.set_int(buffers[index], rng)
        return descriptor, buffers
    blob = fuzz_blob.Blob(1, 0, 0, 0, 0, bytes(4), descriptor)
    blob.sections = [fuzz_blob.Section(1, 1, 0, 0, i, len(b), 64, b) for i, b in enumerate(buffers)]
    if rng.random() < 0.8:
        blob.descriptor = fuzz_blob.mutate_descriptor_fields(descriptor, rng)
    else:
        mutated = _byte_mutate(descriptor, rng, len(descriptor) + 32)
        blob.descriptor = fuzz_blob.repair_descriptor(mutated)
    fuzz_blob.sync_buffers(blob, rng)
    return blob.descriptor, [s.payload for s in blob.sections if s.kind == 1]


def _reference_records(data: bytes) -> tuple[list[Record], bytes]:
    """The records of a reference stream that frame, and the bytes after them."""
    records: list[Record] = []
    pos = 0
    while pos < len(data):
        try:
            descriptor = hw.decode_descriptor(data[pos:])
        except hw.HurrayWireError:
            break
        end = pos + descriptor.descriptor_length
        buffers = []
        for handle in descriptor.buffers:
            buffers.append(data[end : end + handle.byte_size])
            end += handle.byte_size
        if end > len(data):
            break
        records.append((data[pos : pos + descriptor.descriptor_length], buffers))
        pos = end
    return records, data[pos:]


def _rebuild_reference(data: bytes, rng: random.Random) -> bytes:
    records, tail = _reference_records(data)
    if not records:
        return set_field(data, _reference_fields(data), rng)
    number = rng.randrange(len(records))
    if rng.random() < 0.15:
        records.insert(rng.randint(0, len(records)), records[number])
    else:
        records[number] = _mutate_record(records[number], rng)
    return b"".join(d + b"".join(bs) for d, bs in records) + tail


def _hrry_parts(data: bytes) -> tuple[Any, list[tuple[str, Record]], dict[str, Any]] | None:
    """(header, [(name, record)], KV metadata) of a .hrry image whose tensors all frame."""
    try:
        with reference.HrryFile.from_buffer(data) as hrry:
            parts = []
            for name in hrry.names:
                entry = hrry.entry(name)
                start = entry.descriptor_offset
                descriptor = data[start : start + entry.descriptor_length]
                spans = hrry.buffer_spans(name)
                parts.append((name, (descriptor, [data[a : a + n] for a, n in spans])))
            return hrry.header, parts, dict(hrry.metadata)
    except hw.HurrayWireError:
        return None


def build_hrry(
    header: Any, parts: list[tuple[str, Record]], kv: bytes, sorted_index: bool = False
) -> bytes:
    """A .hrry image laid out as the reference FileWriter lays it out (containers.md § B.3-B.6)."""
    align = header.data_buffer_alignment
    out = bytearray(
        struct.pack("<8sBB2sIIQQ28s", HRRY_MAGIC, 1, header.version[1], bytes(2),
                    header.file_flags, align, 64, 2**64 - 1, bytes(28))
    )  # fmt: skip

    def pad(alignment: int) -> None:
        out.extend(bytes(-len(out) % alignment))

    rows = []
    for name, (descriptor, buffers) in parts:
        d_off = len(out)
        out.extend(descriptor)
        pad(align)
        data_off = len(out)
        for number, buffer in enumerate(buffers):
            if number:
                pad(align)
            out.extend(buffer)
        raw = name.encode("utf-8", "surrogatepass")
        rows.append((raw, d_off, len(descriptor), data_off, len(out) - data_off))
        pad(8)
    kv_off = kv_len = 0
    if kv:
        kv_off, kv_len = len(out), len(kv)
        out.extend(kv)
        pad(8)
    if sorted_index:
        rows.sort()
    index = _U64.pack(len(rows)) + b"".join(
        _U16.pack(len(raw)) + raw + struct.pack("<QIQQI", d_off, d_len, data_off, data_len, 0)
        for raw, d_off, d_len, data_off, data_len in rows
    )
    index_off = len(out)
    out.extend(index)
    crc = crc32c(index) if header.file_flags & FLAG_INDEX_CRC else 0
    out.extend(struct.pack("<QQQII4s4s", index_off, len(index), kv_off, kv_len, crc, bytes(4),
                           b"HRRY"))  # fmt: skip
    return bytes(out)


def _rebuild_hrry(data: bytes, rng: random.Random, max_size: int) -> bytes:
    """Re-lay a .hrry image after changing a tensor, its name or the KV metadata."""
    parsed = _hrry_parts(data)
    if parsed is None or not parsed[1]:
        return set_field(data, _hrry_fields(data), rng)
    header, parts, metadata = parsed
    name, record = rng.choice(parts)
    op = rng.randrange(4)
    if op <= 1:
        parts[parts.index((name, record))] = (name, _mutate_record(record, rng))
    elif op == 2:  # the reserved keys of one tensor
        key = rng.choice([reference.SEQ_LENS_KEY_PREFIX, reference.METADATA_KEY_PREFIX]) + name
        if key.startswith(reference.SEQ_LENS_KEY_PREFIX):
            count = rng.choice([0, 1, 2, 3])
            values = [rng.choice([0, 1, 3, 4, 7, 2**64 - 1]) for _ in range(count)]
            metadata[key] = (
                [hw.metadata.UInt64(v) for v in values] if values else [hw.metadata.Int64(1)]
            )
        else:
            payload = fuzz_blob.random_metadata(rng)
            metadata[key] = payload if rng.random() < 0.7 else fuzz_blob.byte_mutate(payload, rng)
    else:  # rename, or duplicate a tensor under another name
        other = name + rng.choice(["", "x", "\u00e9"])
        if rng.random() < 0.5:
            parts.append((other, record))
        else:
            parts[parts.index((name, record))] = (other, record)
    try:
        kv = encode_metadata(metadata) if metadata else b""
    except hw.HurrayWireError:
        kv = b""
    out = build_hrry(header, parts, kv, header.sorted_index and rng.random() < 0.9)
    return out if len(out) <= max_size else data


# -- seeds -------------------------------------------------------------------------------------
def generated_seeds() -> dict[str, bytes]:
    """Containers the fixtures do not cover, written by the library's own writers."""
    seeds: dict[str, bytes] = {}
    tensors = {}
    for name, data in fuzz_blob.generated_seeds().items():
        if name.endswith(("-shuffle.hrwb", "-nock.hrwb", "-digests.hrwb", "-chunked.hrwb")):
            continue
        tensors[name[4:-5]] = hw.decode(data)
    small = [t for t in tensors.values() if t.nbytes < 2048]
    sink = io.BytesIO()
    reference.write_stream(sink, small[:6])
    seeds["gen-reference-mixed.hrrs"] = sink.getvalue()
    f16 = [t for t in small if t.element_type == hw.float16][:2]
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "f.hrry"
        reference.write_file(path, dict(list(tensors.items())[:5]), {"model": "seed", "n": [1, 2]})
        seeds["gen-five.hrry"] = path.read_bytes()
        reference.write_file(
            path, {"b": small[0], "a": small[1]}, sorted_index=True, data_buffer_alignment=8192
        )
        seeds["gen-sorted.hrry"] = path.read_bytes()
    roles = ("key", "value", "fused")
    tagged = [
        hw.BlockPagedTensor.from_arrays(
            np.full((2, 4, 1, 8), i, np.float16),
            [0, 1],
            [0, 2],
            seq_lens=[7],
            kv_role=roles[i % 2],
            layer_index=i // 2,
            metadata={"i": i} if i == 1 else None,
        )
        for i in range(3)
    ]
    headers = {
        "full": hws.StreamHeader(
            model="seed-model",
            num_layers=2,
            kv_roles=roles[:2],
            element_type=hw.float16,
            metadata={"request_id": "r-1", "k": 0.5},
        ),
        "bare": hws.StreamHeader(),
        "no-end": hws.StreamHeader(end_record=False),
    }
    for label, header in headers.items():
        for index in (True, False):
            sink = io.BytesIO()
            with hws.StreamWriter(sink, header, index=index) as writer:
                for tensor in tagged:
                    writer.write(tensor, pages="all")
            seeds[f"gen-stream-{label}-index{int(index)}.hrws"] = sink.getvalue()
    sink = io.BytesIO()
    with hws.StreamWriter(sink, None) as writer:
        for tensor in f16 + tagged[:1]:
            writer.write(tensor, compression=hw.Compression(2, min_size=0), pages="all")
    seeds["gen-stream-headerless.hrws"] = sink.getvalue()
    sink = io.BytesIO()  # page digests: what report=True reads
    with hws.StreamWriter(sink, headers["full"]) as writer:
        for tensor in tagged[:2]:
            writer.write(tensor, page_digests=True, pages="all")
    seeds["gen-stream-digests.hrws"] = sink.getvalue()
    with tempfile.TemporaryDirectory() as folder:  # a whole-model cache (load_cache)
        path = Path(folder) / "cache.hrws"
        cache = [hw.BlockPagedTensor.from_arrays(
            np.full((2, 4, 1, 8), i, np.float16), [1], [0, 1], seq_lens=[3],
            kv_role=roles[i % 2], layer_index=i // 2) for i in range(4)]  # fmt: skip
        hw.save_cache(path, cache, model="seed-model", metadata={"k": 1})
        seeds["gen-model-cache.hrws"] = path.read_bytes()
    return seeds


def seed_inputs() -> dict[str, bytes]:
    """Every seed: the container fixtures and the generated containers."""
    seeds = {
        f"{p.parent.parent.name}-{p.name}": p.read_bytes()
        for d in SEED_DIRS
        for p in sorted(d.iterdir())
        if p.is_file()
    }
    seeds.update(generated_seeds())
    return seeds


def main() -> None:
    fix, argv = fuzz_blob.fix_mode(sys.argv)
    argv = fuzz_blob.seeded_argv(argv, "containers", SEED_DIRS, generated_seeds)
    if fix:
        _IN_LIBFUZZER.append(True)
        fuzz_blob._IN_LIBFUZZER.append(True)
        atheris.Setup(argv, check_containers, custom_mutator=mutate)
    else:
        atheris.Setup(argv, check_containers)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
