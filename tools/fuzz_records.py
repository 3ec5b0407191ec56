#!/usr/bin/env python3
"""atheris fuzz harness for the stream records: ``hurray_wire.containers.decode_stream_header``
and ``decode_end_record`` (docs/streaming.md § 2 and § 4).

``check_records(data)`` feeds the same bytes to both decoders, each from the bytes, a
``bytearray``, and a ``memoryview`` slice at offset 3 of a larger buffer with bytes after the
record, and fails on any exception that is not a ``HurrayWireError`` and on any
disagreement:

* the three paths give the same verdict, the same error (type, section, field, offset) or
  the same result; trailing bytes after the record change nothing; the input is never
  modified;
* a stream header that decodes is encoded again by ``encode_stream_header`` to a record
  that decodes to the same header; when the record is in the writer's form (minor 0 and
  the length the writer gives it) the bytes are identical. The same for an end record and
  ``encode_end_record``;
* (an empty KV section, ``metadata_length`` 4 with ``kv_count`` 0, decodes to the same header
  as no section: such a header is outside the writer's form);
* a stream header whose metadata holds an empty array is not re-encoded (the metadata
  codec refuses to write one, docs of ``hurray_wire.metadata``).

Modes. By default libFuzzer's byte mutations. ``--fix-checksums`` installs a custom mutator
that sets a record field (prefix, flags, num_layers, kv_roles, element_type, name and
metadata lengths, blob and entry counts, an index entry's fields, the footer), rewrites the
header's model name or metadata (with lengths fixed), or makes a byte mutation, and then
RE-COMPUTES the xxh3_64 checksum of each record (``fuzz_containers.fix_stream_checksums``).

Usage (``pip install atheris``)::

    mkdir -p /tmp/hw-records
    python tools/fuzz_records.py -max_total_time=300 -timeout=20 /tmp/hw-records
    python tools/fuzz_records.py --fix-checksums -max_total_time=300 /tmp/hw-records-fix

Generated seeds go to ``$TMPDIR/hurray-wire-fuzz-records-seeds``; the stream fixtures'
first and last records are seeds too.
"""

from __future__ import annotations

import functools
import io
import random
import struct
import sys
from pathlib import Path
from typing import Any

try:
    import atheris  # type: ignore[import-untyped]
except ImportError:
    atheris = None

if atheris is not None and __name__ == "__main__":
    with atheris.instrument_imports(include=["hurray_wire"]):
        import _instrumented  # the lazy package: every module now, instrumented

        import hurray_wire as hw
        from hurray_wire import containers as hws

        _instrumented.import_all()
else:
    import hurray_wire as hw
    from hurray_wire import containers as hws

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fuzz_blob  # byte mutations, boundary values, flags and seeding
import fuzz_containers  # the stream checksum fixer and record fields
import fuzz_metadata  # metadata comparison and mutation

ROOT = Path(__file__).resolve().parent.parent
SEED_DIRS: list[Path] = []
_STREAM_DIRS = [ROOT / "fixtures" / "streams", ROOT / "fixtures/conformance/block_paged/streams"]
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
HEADER_FIXED = 32  # the stream header's fixed fields (docs/streaming.md § 2)


def header_key(header: Any) -> tuple[Any, ...]:
    return (
        header.model,
        header.num_layers,
        header.kv_roles,
        header.element_type,
        header.end_record,
        fuzz_metadata.metadata_key(header.metadata),
    )


def _error_key(error: hw.HurrayWireError) -> tuple[Any, ...]:
    return (type(error), error.section, error.field, error.offset)


def _paths(data: bytes, accepted: bool) -> list[tuple[str, Any]]:
    padded = bytearray(b"xyz" + data + b"!")
    paths = [("bytearray", bytearray(data)), ("memoryview at 3", memoryview(padded)[3:-1])]
    if accepted:  # what follows a good record is ignored
        paths.append(("trailing bytes", data + b"\x00" * 64 + b"HRWE"))
    return paths


def _agree(what: str, key: Any, decoder: Any, data: bytes) -> tuple[Any, Any]:
    result, error = fuzz_blob.outcome(lambda: decoder(data))
    for label, source in _paths(data, error is None):
        other, other_error = fuzz_blob.outcome(functools.partial(decoder, source))
        if (error is None) != (other_error is None):
            raise AssertionError(f"{what} bytes vs {label}: {error!r} vs {other_error!r}")
        if (
            error is not None
            and other_error is not None
            and _error_key(error) != _error_key(other_error)
        ):
            raise AssertionError(f"{what} bytes vs {label}: {error!r} vs {other_error!r}")
        if error is None and key(result) != key(other):
            raise AssertionError(f"{what} bytes vs {label}: different results")
    return result, error


def _total(data: bytes) -> int:
    total: int = _U64.unpack_from(data, 8)[0]
    return total


def check_stream_header(data: bytes) -> None:
    header, error = _agree("decode_stream_header", header_key, hws.decode_stream_header, data)
    if error is not None or fuzz_metadata.has_empty_array(header.metadata):
        return
    try:
        again = hws.encode_stream_header(header)
    except hw.HurrayWireError as exc:
        raise AssertionError(f"encode_stream_header refused a decoded header: {exc!r}") from exc
    if header_key(hws.decode_stream_header(again)) != header_key(header):
        raise AssertionError("decode(encode(decode_stream_header(data))) differs")
    # The writer's form: minor 0, its length, and no empty KV section (4 bytes, count 0)
    # where the writer writes none.
    writers = data[5] == 0 and len(again) == _total(data) and again[24:28] == data[24:28]
    if writers and again != data[: len(again)]:
        raise AssertionError("a stream header in the writer's form re-encodes differently")


def _end_key(result: tuple[int, Any]) -> tuple[Any, ...]:
    return result


def check_end_record(data: bytes) -> None:
    result, error = _agree("decode_end_record", _end_key, hws.decode_end_record, data)
    if error is not None:
        return
    blob_count, entries = result
    again = hws.encode_end_record(list(entries) if entries else None, blob_count)
    if hws.decode_end_record(again) != result:
        raise AssertionError("decode(encode(decode_end_record(data))) differs")
    if data[5] == 0 and len(again) == _total(data) and again != data[: len(again)]:
        raise AssertionError("an end record in the writer's form re-encodes differently")


def check_records(data: bytes) -> None:
    """One fuzz case: both record decoders, every input path, and the round trips."""
    original = bytes(data)
    check_stream_header(data)
    check_end_record(data)
    if data != original:
        raise AssertionError("a record decoder modified its input")


# -- the structure-aware mutator -------------------------------------------------------------
def _rewrite_header(data: bytes, rng: random.Random) -> bytes | None:
    """A stream header with another model name or metadata, lengths and total fixed."""
    if len(data) < HEADER_FIXED + 8 or data[:4] != b"HRWS":
        return None
    name_length, meta_length = struct.unpack_from("<HI", data, 22)
    name = data[HEADER_FIXED : HEADER_FIXED + name_length]
    meta = data[HEADER_FIXED + name_length : HEADER_FIXED + name_length + meta_length]
    if rng.random() < 0.4:
        name = rng.choice([b"", b"m", "\u00e9".encode(), b"\xff\xfe", b"x" * rng.randint(0, 200)])
    elif rng.random() < 0.5:
        meta = fuzz_metadata.rebuild(meta, rng) or fuzz_metadata.set_field(
            meta, fuzz_metadata.metadata_fields(meta), rng
        )
    else:
        meta = fuzz_metadata.set_field(meta, fuzz_metadata.metadata_fields(meta), rng)
    body = bytearray(data[:HEADER_FIXED]) + name + meta
    total = -(-(len(body) + 8) // 64) * 64
    body += bytes(total - 8 - len(body))
    struct.pack_into("<HI", body, 22, len(name), len(meta))
    _U64.pack_into(body, 8, total)
    return bytes(body) + bytes(8)


def _mutate(data: bytes, max_size: int, seed: int) -> bytes:
    rng = random.Random(seed)
    choice = rng.random()
    out: bytes | None = None
    if choice < 0.4:
        out = fuzz_containers.set_field(data, fuzz_containers.stream_fields(data), rng)
    elif choice < 0.7:
        out = _rewrite_header(data, rng)
    if out is None:
        out = fuzz_blob.libfuzzer_mutate(data, rng, max_size)
    return fuzz_containers.fix_stream_checksums(out)[:max_size]


MUTATOR_ERRORS: list[str] = []


def mutate(data: bytes, max_size: int, seed: int) -> bytes:
    """The ``--fix-checksums`` custom mutator: a record edit, then the checksums recomputed."""
    return fuzz_blob.guarded_mutate(
        "fuzz_records",
        MUTATOR_ERRORS,
        _mutate,
        fuzz_containers.fix_stream_checksums,
        data,
        max_size,
        seed,
    )


# -- seeds -----------------------------------------------------------------------------------
def generated_seeds() -> dict[str, bytes]:
    """Stream headers and end records from the library's encoders, and the fixtures' ones."""
    headers = {
        "bare": hws.StreamHeader(),
        "no-end": hws.StreamHeader(end_record=False),
        "full": hws.StreamHeader(
            model="seed-model-\u00e9",
            num_layers=32,
            kv_roles=("key", "value"),
            element_type=hw.float16,
            metadata={"request_id": "r-1", "k": 0.5, "ids": [1, 2], "raw": b"\x00"},
        ),
        "fused": hws.StreamHeader(num_layers=0, kv_roles=("fused",), element_type=hw.int8),
    }
    seeds = {f"gen-header-{k}.rec": hws.encode_stream_header(v) for k, v in headers.items()}
    entries = [
        hws.StreamEntry(64, 448, 0, "key"),
        hws.StreamEntry(512, 448, 0, "value"),
        hws.StreamEntry(960, 512, None, "fused"),
    ]
    seeds["gen-end-empty.rec"] = hws.encode_end_record(None, 0)
    seeds["gen-end-count.rec"] = hws.encode_end_record(None, 3)
    seeds["gen-end-index.rec"] = hws.encode_end_record(entries, 3)
    for folder in _STREAM_DIRS:
        for path in sorted(folder.glob("*")):
            records = fuzz_containers.stream_records(path.read_bytes())
            data = path.read_bytes()
            for magic, start, total in records:
                if magic in (b"HRWS", b"HRWE"):
                    seeds[f"{path.stem}-{start}.rec"] = data[start : start + total]
    sink = io.BytesIO()
    with hws.StreamWriter(sink, headers["full"]):
        pass
    seeds["gen-empty-stream.rec"] = sink.getvalue()
    return seeds


def seed_inputs() -> dict[str, bytes]:
    return generated_seeds()


def main() -> None:
    fix, argv = fuzz_blob.fix_mode(sys.argv)
    argv = fuzz_blob.seeded_argv(argv, "records", SEED_DIRS, generated_seeds)
    if fix:
        fuzz_blob._IN_LIBFUZZER.append(True)
        atheris.Setup(argv, check_records, custom_mutator=mutate)
    else:
        atheris.Setup(argv, check_records)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
