"""The Kaitai Struct description of the descriptor (schemas/hurray_descriptor.ksy) against the
conformance vectors.

A session fixture compiles every ``schemas/*.ksy`` with ``tools/kaitai/build.sh`` (Node.js +
the npm ``kaitai-struct-compiler``) into ``tools/_kaitai_out/`` and imports the generated
Python parser (runtime: PyPI ``kaitaistruct``). Every descriptor under
``fixtures/conformance/`` is parsed and compared field by field with its manifest; the
must-reject vectors must fail to parse, except the few rules the schema does not express.

The comparison goes through plain dicts: ``kaitai_fields`` flattens a parse, the
``*_expectations`` helpers turn manifest entries into the same keys, and ``descriptor_views``
is the one place where a second reading of the same bytes (for example
``hurray_wire.decode_descriptor``) can be added to every check.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import struct
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
BUILD_SCRIPT = ROOT / "tools" / "kaitai" / "build.sh"
KAITAI_OUT = ROOT / "tools" / "_kaitai_out"
CONFORMANCE = ROOT / "fixtures" / "conformance"
REFERENCE_MANIFEST = CONFORMANCE / "reference" / "manifest.json"
BLOCK_PAGED_MANIFEST = CONFORMANCE / "block_paged" / "manifest.json"
FIXTURES = ROOT / "fixtures"

LAYER_NONE = 0xFFFFFFFF
BLOCK_PAGED_TAG = 0x0A

#: Must-reject vectors that the schema accepts on purpose, with the rule it leaves to
#: hurray_wire. If the schema learns one of these rules, drop the entry (the test says so).
NOT_CHECKED_BY_SCHEMA: dict[str, str] = {
    "bp_bad_pool_size": "buffer byte sizes implied by shape and element type",
    "bp_bad_seq_ptr_size": "buffer byte sizes implied by num_seqs and index type",
}


# ---------------------------------------------------------------------------------------
# Building and importing the generated parser
# ---------------------------------------------------------------------------------------


def _unavailable(reason: str) -> None:
    """Fail under CI (the tools are part of CI's contract), skip on a developer machine."""
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (required when CI is set)")
    pytest.skip(reason)


def _import_generated(name: str) -> Any:
    """Import ``tools/_kaitai_out/<name>.py`` as top-level module ``name``.

    The generated code of an importing schema does ``import <imported schema>``, so each
    module is registered under its own name (imported schemas are loaded first).
    """
    if name in sys.modules:
        return sys.modules[name]
    path = KAITAI_OUT / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        pytest.fail(f"cannot import the generated parser {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def kaitai_build() -> Path:
    """Run tools/kaitai/build.sh once per session; return the output folder."""
    missing = [tool for tool in ("node", "npm") if shutil.which(tool) is None]
    if missing:
        _unavailable(f"Kaitai build needs {' and '.join(missing)} on PATH")
    if importlib.util.find_spec("kaitaistruct") is None:
        _unavailable("the generated parsers need the PyPI package kaitaistruct")
    proc = subprocess.run(
        ["bash", str(BUILD_SCRIPT)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    if proc.returncode != 0:
        pytest.fail(
            f"tools/kaitai/build.sh failed with exit code {proc.returncode}\n"
            f"--- stdout ---\n{proc.stdout}\n--- stderr ---\n{proc.stderr}"
        )
    return KAITAI_OUT


@pytest.fixture(scope="session")
def descriptor_parser(kaitai_build: Path) -> Any:
    """The generated ``HurrayDescriptor`` class."""
    return _import_generated("hurray_descriptor").HurrayDescriptor


@pytest.fixture(scope="session")
def blob_parser(descriptor_parser: Any) -> Any:
    """The generated ``HurrayWireBlob`` class (imports ``hurray_descriptor``)."""
    return _import_generated("hurray_wire_blob").HurrayWireBlob


@pytest.fixture(scope="session")
def kaitai_errors() -> tuple[type[BaseException], ...]:
    """What a generated parser raises on bytes it rejects."""
    import kaitaistruct

    return (kaitaistruct.KaitaiStructError, EOFError)


# ---------------------------------------------------------------------------------------
# Flattening a parse into plain data
# ---------------------------------------------------------------------------------------


def kaitai_fields(parsed: Any) -> dict[str, Any]:
    """Flatten a ``HurrayDescriptor`` parse into a dict of plain Python values.

    Keys are the same for every layout; layout fields that do not apply are ``None``.
    Enumerations are given as their wire integers, ``layer_index`` as ``None`` for the
    0xFFFFFFFF sentinel, and ``quantization_bytes`` as the ``quantization_length`` bytes
    after the length field (header, payload and padding), or ``None``.
    """
    header = parsed.header
    body = parsed.body
    flags = header.flags
    paged = body.layout_payload if header.layout_tag == BLOCK_PAGED_TAG else None
    quantized = bool(flags.has_quantization)
    return {
        "version_major": header.version_major,
        "version_minor": header.version_minor,
        "descriptor_length": header.descriptor_length,
        "flags": flags.value,
        "has_quantization": quantized,
        "has_shard": bool(flags.has_shard),
        "has_extension_type": bool(flags.has_extension_type),
        "has_statistics": bool(flags.has_statistics),
        "has_composite_member": bool(flags.has_composite_member),
        "type_tag": header.type_tag,
        "layout_tag": header.layout_tag,
        "rank": header.rank,
        "shape": list(body.shape),
        "byte_offset": body.byte_offset,
        "page_size": None if paged is None else paged.page_size,
        "num_pages": None if paged is None else paged.num_pages,
        "paged_axis": None if paged is None else paged.paged_axis,
        "num_seqs": None if paged is None else paged.num_seqs,
        "kv_role": None if paged is None else int(paged.kv_role),
        "layer_index": None if paged is None or not paged.has_layer else paged.layer_index,
        "block_table_index_type": None if paged is None else int(paged.block_table_index_type),
        "buffers": [
            {
                "byte_size": handle.byte_size,
                "alignment": handle.alignment,
                "device_tag": handle.device_tag,
                "sync_mode": int(handle.sync_mode),
                "memory_class": handle.memory_class,
            }
            for handle in body.buffers
        ],
        "quantization_bytes": bytes(body._raw_quantization) if quantized else None,
        "unknown_trailing": bytes(body.unknown_trailing),
    }


def descriptor_views(data: bytes, parser: Any) -> dict[str, dict[str, Any]]:
    """Every independent reading of ``data``, flattened to the keys of ``kaitai_fields``.

    This is the single place to add another decoder: e.g.
    ``views["hurray_wire"] = decoder_fields(hurray_wire.decode_descriptor(data))``; each
    test below then checks it against the manifests too.
    """
    return {"kaitai": kaitai_fields(parser.from_bytes(data)), "hurray_wire": decoder_fields(data)}


def decoder_fields(data: bytes) -> dict[str, Any]:
    """What hurray_wire's own decoders read from ``data``, with the keys of ``kaitai_fields``.

    ``decode_header`` reads any layout; for block-paged descriptors ``decode_descriptor``
    must agree with it. Invalid descriptors yield ``{}`` (the tests compare readings of
    valid ones; rejection is compared separately).
    """
    import hurray_wire
    from hurray_wire.wire import descriptor as wd

    try:
        header = hurray_wire.decode_header(data)
    except hurray_wire.HurrayWireError:
        return {}
    length = header.descriptor_length
    parsed = wd.DESCRIPTOR.parse(data[:length])
    quantization_bytes = None
    if parsed.quantization is not None:
        start = parsed.quantization_offset + 4
        quantization_bytes = data[start : start + parsed.quantization.quantization_length]
    layout = header.layout_fields if header.layout_tag == BLOCK_PAGED_TAG else {}
    flags = header.flags
    fields: dict[str, Any] = {
        "version_major": header.version_major,
        "version_minor": header.version_minor,
        "descriptor_length": length,
        "flags": flags,
        "has_quantization": bool(flags & 0x01),
        "has_shard": bool(flags & 0x02),
        "has_extension_type": bool(flags & 0x04),
        "has_statistics": bool(flags & 0x08),
        "has_composite_member": bool(flags & 0x10),
        "type_tag": header.type_tag,
        "layout_tag": header.layout_tag,
        "rank": header.rank,
        "shape": list(header.shape),
        "byte_offset": header.byte_offset,
        "page_size": layout.get("page_size"),
        "num_pages": layout.get("num_pages"),
        "paged_axis": layout.get("paged_axis"),
        "num_seqs": layout.get("num_seqs"),
        "kv_role": None if not layout else wd.KV_ROLES[layout["kv_role"]],
        "layer_index": layout.get("layer_index"),
        "block_table_index_type": (
            None if not layout else wd.INDEX_TYPES[layout["block_table_index_type"]]
        ),
        "buffers": [
            {"byte_size": h.byte_size, "alignment": h.alignment, "device_tag": h.device_tag,
             "sync_mode": h.sync_mode, "memory_class": h.memory_class}
            for h in header.buffers
        ],
        "quantization_bytes": quantization_bytes,
        "unknown_trailing": header.unknown_trailing,
    }  # fmt: skip
    if header.layout_tag == BLOCK_PAGED_TAG:
        try:
            desc = hurray_wire.decode_descriptor(data)
        except hurray_wire.errors.InvalidDescriptorError:
            return fields  # valid common header, block-paged rules broken (e.g. pool size)
        assert list(desc.shape) == fields["shape"]
        assert desc.layout.layer_index == fields["layer_index"]
        assert [h.byte_size for h in desc.buffers] == [b["byte_size"] for b in fields["buffers"]]
    return fields


# ---------------------------------------------------------------------------------------
# Manifest entries as expectations with the same keys
# ---------------------------------------------------------------------------------------


def reference_expectations(entry: dict[str, Any]) -> dict[str, Any]:
    """Expected fields of one ``reference/manifest.json`` descriptor entry."""
    expect = entry["expect"]
    return {
        "version_major": expect["version_major"],
        "version_minor": expect["version_minor"],
        "type_tag": expect["element_type_tag"],
        "shape": expect["shape"],
        "rank": len(expect["shape"]),
        "byte_offset": expect["byte_offset"],
        "layout_tag": expect["layout_tag"],
        "buffer_byte_sizes": expect["buffer_byte_sizes"],
        "has_quantization": expect["has_quantization"],
        "has_shard": expect["has_shard"],
    }


def block_paged_param_expectations(params: dict[str, Any]) -> dict[str, Any]:
    """Expected fields of a block-paged ``params`` object (descriptors, streams, files)."""
    quant = params["quantization"]
    return {
        "type_tag": params["element_type_tag"],
        "layout_tag": BLOCK_PAGED_TAG,
        "rank": 3,
        "shape": params["shape"],
        "byte_offset": 0,
        "page_size": params["page_size"],
        "num_pages": params["num_pages"],
        "paged_axis": params["paged_axis"],
        "num_seqs": params["num_seqs"],
        "kv_role": params["kv_role_byte"],
        "layer_index": params["layer_index"],
        "block_table_index_type": params["block_table_index_type_byte"],
        "buffer_byte_sizes": params["buffer_byte_sizes"],
        "buffers": params["buffer_handles"],
        "has_quantization": quant is not None,
        "has_shard": False,
        "has_statistics": params["has_statistics"],
        "quantization_bytes": None if quant is None else bytes.fromhex(quant["hex"]),
    }


def block_paged_expectations(entry: dict[str, Any]) -> dict[str, Any]:
    """Expected fields of one ``block_paged/manifest.json`` descriptor entry."""
    expect = entry["expect"]
    fields = block_paged_param_expectations(entry["params"])
    fields.update(
        descriptor_length=expect["descriptor_length"],
        version_major=expect["version_major"],
        version_minor=expect["version_minor"],
        flags=expect["flags"],
        layout_tag=expect["layout_tag"],
        byte_offset=expect["byte_offset"],
        unknown_trailing=bytes.fromhex(entry.get("trailing_hex", "")),
    )
    return fields


def mismatches(actual: dict[str, Any], expected: dict[str, Any]) -> list[str]:
    """Every expected key whose value differs; ``buffer_byte_sizes`` is derived from ``buffers``."""
    derived = dict(actual, buffer_byte_sizes=[b["byte_size"] for b in actual["buffers"]])
    return [
        f"{key}: expected {value!r}, got {derived.get(key, '<missing>')!r}"
        for key, value in expected.items()
        if derived.get(key, "<missing>") != value
    ]


def parse_at(parser: Any, data: bytes, offset: int) -> tuple[Any, int]:
    """Parse one descriptor starting at ``offset`` of ``data``; return it and where it stopped."""
    import kaitaistruct

    stream = kaitaistruct.KaitaiStream(kaitaistruct.BytesIO(data))
    stream.seek(offset)
    parsed = parser(stream)
    return parsed, stream.pos()


def assert_matches(data: bytes, parser: Any, expected: dict[str, Any], where: str) -> None:
    """Check every reading of ``data`` against ``expected`` and report all differences at once."""
    problems = [
        f"[{source}] {problem}"
        for source, actual in descriptor_views(data, parser).items()
        for problem in mismatches(actual, expected)
    ]
    assert not problems, f"{where}:\n  " + "\n  ".join(problems)


# ---------------------------------------------------------------------------------------
# Cases from the manifests
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DescriptorCase:
    """One descriptor file and the fields its manifest promises."""

    name: str
    path: Path
    expected: dict[str, Any]


def _load(manifest: Path) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(manifest.read_text(encoding="utf-8"))
    return result


def _descriptor_cases() -> list[DescriptorCase]:
    cases: list[DescriptorCase] = []
    reference = _load(REFERENCE_MANIFEST)
    for entry in reference["descriptors"]:
        path = REFERENCE_MANIFEST.parent / entry["file"]
        cases.append(DescriptorCase(f"reference/{path.stem}", path, reference_expectations(entry)))
    paged = _load(BLOCK_PAGED_MANIFEST)
    for entry in paged["descriptors"] + paged["tolerant_descriptors"]:
        path = BLOCK_PAGED_MANIFEST.parent / entry["file"]
        cases.append(
            DescriptorCase(f"block_paged/{path.stem}", path, block_paged_expectations(entry))
        )
    return cases


DESCRIPTOR_CASES = _descriptor_cases()
INVALID_ENTRIES: list[dict[str, Any]] = _load(BLOCK_PAGED_MANIFEST)["invalid_descriptors"]


def _stream_entries() -> list[dict[str, Any]]:
    """Stream entries with their records; ``records_from`` lists the streams concatenated."""
    streams: list[dict[str, Any]] = _load(BLOCK_PAGED_MANIFEST)["streams"]
    by_file = {stream["file"]: stream for stream in streams}
    entries = []
    for stream in streams:
        records = stream.get("records")
        if records is None:
            records = [r for name in stream["records_from"] for r in by_file[name]["records"]]
        assert len(records) == stream["record_count"]
        entries.append(dict(stream, records=records))
    return entries


STREAM_ENTRIES = _stream_entries()
FILE_ENTRIES: list[dict[str, Any]] = _load(BLOCK_PAGED_MANIFEST)["files"]


def _ids(key: str) -> Callable[[dict[str, Any]], str]:
    return lambda entry: str(entry[key])


# ---------------------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------------------


def test_every_descriptor_file_is_in_a_manifest() -> None:
    on_disk = {
        p.relative_to(CONFORMANCE)
        for folder in ("reference/descriptors", "block_paged/descriptors")
        for p in (CONFORMANCE / folder).glob("*.bin")
    }
    listed = {case.path.relative_to(CONFORMANCE) for case in DESCRIPTOR_CASES}
    assert on_disk == listed


@pytest.mark.parametrize("case", DESCRIPTOR_CASES, ids=lambda case: case.name)
def test_descriptor_matches_manifest(case: DescriptorCase, descriptor_parser: Any) -> None:
    data = case.path.read_bytes()
    assert_matches(data, descriptor_parser, case.expected, case.name)
    parsed = descriptor_parser.from_bytes(data)
    assert parsed.header.descriptor_length == len(data), "a descriptor file is one descriptor"
    assert parsed._io.pos() == len(data)


def test_block_paged_layer_sentinel(descriptor_parser: Any) -> None:
    folder = BLOCK_PAGED_MANIFEST.parent / "descriptors"
    none = descriptor_parser.from_file(str(folder / "bp_layer_none_f16_key.bin"))
    assert none.body.layout_payload.layer_index == LAYER_NONE
    assert not none.body.layout_payload.has_layer
    zero = descriptor_parser.from_file(str(folder / "bp_bf16_value_l0.bin"))
    assert zero.body.layout_payload.layer_index == 0
    assert zero.body.layout_payload.has_layer


def test_block_paged_payload_at_offset_52(descriptor_parser: Any) -> None:
    """The layout payload starts at 20 + 8 x rank + 8 = 52 and is 32 bytes for rank 3."""
    for entry in _load(BLOCK_PAGED_MANIFEST)["descriptors"]:
        data = (BLOCK_PAGED_MANIFEST.parent / entry["file"]).read_bytes()
        expect = entry["expect"]
        start = expect["layout_payload_offset"]
        payload = bytes.fromhex(expect["layout_payload_hex"])
        assert start == 52 and len(payload) == 32
        assert data[start : start + 32] == payload
        # The parsed fields are the bytes at those offsets (descriptor.md § 6.1).
        bp = descriptor_parser.from_bytes(data).body.layout_payload
        assert payload[0:4] == bp.page_size.to_bytes(4, "little")
        assert payload[4:12] == bp.num_pages.to_bytes(8, "little")
        assert payload[20] == int(bp.kv_role)
        assert payload[21:25] == bp.layer_index.to_bytes(4, "little")
        assert payload[25] == int(bp.block_table_index_type)


@pytest.mark.parametrize("entry", INVALID_ENTRIES, ids=_ids("name"))
def test_invalid_descriptor_rejected(
    entry: dict[str, Any],
    descriptor_parser: Any,
    kaitai_errors: tuple[type[BaseException], ...],
) -> None:
    data = (BLOCK_PAGED_MANIFEST.parent / entry["file"]).read_bytes()
    assert data == bytes.fromhex(entry["hex"])
    if entry["name"] in NOT_CHECKED_BY_SCHEMA:
        # Documented gap: the schema must still accept it, else update NOT_CHECKED_BY_SCHEMA.
        descriptor_parser.from_bytes(data)
        return
    with pytest.raises(kaitai_errors):
        descriptor_parser.from_bytes(data)


def test_not_checked_list_is_current() -> None:
    names = {entry["name"] for entry in INVALID_ENTRIES}
    assert set(NOT_CHECKED_BY_SCHEMA) <= names


@pytest.mark.parametrize("entry", STREAM_ENTRIES, ids=_ids("name"))
def test_stream_records_frame_themselves(entry: dict[str, Any], descriptor_parser: Any) -> None:
    """A stream record is a descriptor then its buffers: the parse stops at descriptor_length."""
    data = (BLOCK_PAGED_MANIFEST.parent / entry["file"]).read_bytes()
    offset = 0
    for index, record in enumerate(entry["records"]):
        parsed, end = parse_at(descriptor_parser, data, offset)
        length = parsed.header.descriptor_length
        assert length == record["descriptor_length"]
        assert end == offset + length, "the parser must stop at descriptor_length"
        descriptor = data[offset : offset + length]
        assert descriptor == bytes.fromhex(record["descriptor_hex"])
        assert_matches(
            descriptor,
            descriptor_parser,
            block_paged_param_expectations(record["params"]),
            f"{entry['name']} record {index}",
        )
        offset += length + sum(buffer["byte_size"] for buffer in record["buffers"])
    assert offset == len(data) == entry["total_bytes"]


@pytest.mark.parametrize("entry", FILE_ENTRIES, ids=_ids("file"))
def test_hrry_file_descriptors(entry: dict[str, Any], descriptor_parser: Any) -> None:
    data = (BLOCK_PAGED_MANIFEST.parent / entry["file"]).read_bytes()
    tensors = {tensor["name"]: tensor for tensor in entry["tensors"]}
    for item in entry["index"]:
        start, length = item["descriptor_offset"], item["descriptor_length"]
        descriptor = data[start : start + length]
        assert_matches(
            descriptor,
            descriptor_parser,
            dict(
                block_paged_param_expectations(tensors[item["name"]]["params"]),
                descriptor_length=length,
            ),
            f"{entry['file']} {item['name']}",
        )


# ---------------------------------------------------------------------------------------
# Synthetic descriptors for the parts of the schema no conformance vector exercises
# ---------------------------------------------------------------------------------------

CPU_64 = (64, 0, 0, 0)  # alignment, device_tag, sync_mode, memory_class


def build_descriptor(
    *,
    type_tag: int = 0x03,
    layout_tag: int = 0x01,
    shape: tuple[int, ...] = (4,),
    payload: bytes = b"",
    buffer_sizes: tuple[int, ...] = (16,),
    flags: int = 0,
    sections: bytes = b"",
    version_minor: int = 0,
) -> bytes:
    """Assemble descriptor bytes by hand (descriptor.md § 1); all buffers CPU, alignment 64."""
    body = b"".join(struct.pack("<Q", d) for d in shape) + struct.pack("<Q", 0) + payload
    body += bytes([len(buffer_sizes)])
    body += b"".join(struct.pack("<QIBBBB", size, *CPU_64, 0) for size in buffer_sizes)
    body += sections
    header = b"HRRY" + bytes([1, version_minor])
    header += struct.pack("<IIBBI", 20 + len(body), flags, type_tag, layout_tag, len(shape))
    return header + body


def quantization_section(scheme: int, flags: int, payload: bytes, padding: bytes = b"") -> bytes:
    body = struct.pack("<BBH", scheme, 1, flags) + payload + padding
    return struct.pack("<I", len(body)) + body


STATISTICS = struct.pack(
    "<II Q 6d BBBB 4x", 0x3F, 0, 7, 0.25, -1.0, 2.0, 2.0, 0.5, 0.75, 2, 4, 0, 1
)
EXTENSION_TYPE = struct.pack("<I BBBBBB 2x I BB 2x", 4, 2, 1, 1, 1, 2, 1, 1, 1, 0)


def tiled_payload(tile: tuple[int, ...], outer: int, inner: int, rest: bytes = b"") -> bytes:
    strides = b"".join(struct.pack("<q", 1) for _ in tile)
    out = b"".join(struct.pack("<Q", t) for t in tile) + bytes([outer, inner, 0, 0])
    if outer == 3:
        out += strides
    if inner == 3:
        out += strides
    return out + rest


def nested_tiled(depth: int) -> bytes:
    """``depth`` tiled payloads, each nesting the next; the innermost is row-major inside."""
    payload = tiled_payload((1, 1), 1, 1)
    for _ in range(depth - 1):
        payload = tiled_payload((1, 1), 1, 4, payload)
    return payload


def test_builder_reproduces_the_worked_example() -> None:
    """descriptor.md § 12.1: float32 [3, 4], row-major, one 192-byte CPU buffer (61 bytes)."""
    expected = bytes.fromhex(
        "48525259 0100 3d000000 00000000 03 01 02000000"
        "0300000000000000 0400000000000000 0000000000000000"
        "01 c000000000000000 40000000 00000000"
    )
    assert build_descriptor(shape=(3, 4), buffer_sizes=(192,)) == expected


def test_worked_example(descriptor_parser: Any) -> None:
    data = build_descriptor(shape=(3, 4), buffer_sizes=(192,))
    fields = kaitai_fields(descriptor_parser.from_bytes(data))
    assert fields["descriptor_length"] == 61
    assert fields["shape"] == [3, 4]
    assert fields["buffers"] == [
        {"byte_size": 192, "alignment": 64, "device_tag": 0, "sync_mode": 0, "memory_class": 0}
    ]


def test_tiled_nested_payloads(descriptor_parser: Any) -> None:
    inner = tiled_payload((1, 2), 1, 3)
    data = build_descriptor(
        layout_tag=0x04, shape=(4, 4), payload=tiled_payload((2, 2), 3, 4, inner)
    )
    tiled = descriptor_parser.from_bytes(data).body.layout_payload
    assert tiled.tile_shape == [2, 2]
    assert tiled.outer_strides == [1, 1]
    assert tiled.nested.tile_shape == [1, 2]
    assert tiled.nested.inner_strides == [1, 1]
    descriptor_parser.from_bytes(
        build_descriptor(layout_tag=0x04, shape=(4, 4), payload=nested_tiled(8))
    )


def test_sparse_hilbert_and_private_layouts(descriptor_parser: Any) -> None:
    coo = descriptor_parser.from_bytes(
        build_descriptor(
            layout_tag=0x06, shape=(4, 4), payload=struct.pack("<QB7x", 3, 1), buffer_sizes=(12, 48)
        )
    )
    assert (coo.body.layout_payload.nnz, coo.body.layout_payload.is_sorted) == (3, 1)
    csf = descriptor_parser.from_bytes(
        build_descriptor(
            layout_tag=0x09,
            shape=(4, 4),
            payload=struct.pack("<QII8x", 3, 1, 0),
            buffer_sizes=(12, 8, 8, 8, 8),
        )
    )
    assert csf.body.layout_payload.mode_order == [1, 0]
    hilbert = descriptor_parser.from_bytes(
        build_descriptor(layout_tag=0x40, shape=(4, 4), payload=struct.pack("<II", 2, 2))
    )
    assert hilbert.body.layout_payload.order == 2
    private = descriptor_parser.from_bytes(
        build_descriptor(layout_tag=0xF3, payload=struct.pack("<QI", 77, 3) + b"abc")
    )
    assert private.header.layout_tag == 0xF3
    assert private.body.layout_payload.data == b"abc"
    assert private.body.buffers[0].byte_size == 16


def test_statistics_come_before_extension_type(descriptor_parser: Any) -> None:
    data = build_descriptor(
        type_tag=0xF0, flags=0x04 | 0x08, buffer_sizes=(2,), sections=STATISTICS + EXTENSION_TYPE
    )
    body = descriptor_parser.from_bytes(data).body
    assert body.statistics.nnz == 7
    assert body.statistics.value_stddev == 0.75
    assert body.statistics.computed.nan_inf
    assert body.extension_type.bit_width == 4
    assert body.extension_type.packing_factor == 2


def test_composite_member_section(descriptor_parser: Any) -> None:
    data = build_descriptor(flags=0x10, sections=bytes([1]) + bytes(15))
    assert int(descriptor_parser.from_bytes(data).body.composite_member.member_role) == 1


@pytest.mark.parametrize(
    ("type_tag", "scheme", "payload"),
    [
        (0x49, 4, struct.pack("<III", 0, 32, 1)),  # NF4 over uint4, block 32
        (0x40, 5, struct.pack("<III", 0, 32, 1)),  # MXFP over float8_e4m3, block 32
        (0x10, 2, struct.pack("<IIIB3x", 0, 1, 0xFFFFFFFF, 3)),  # per-channel, symmetric
    ],
    ids=["nf4", "mxfp", "per_channel"],
)
def test_quantization_schemes(
    type_tag: int, scheme: int, payload: bytes, descriptor_parser: Any
) -> None:
    flags = 1 if scheme == 2 else 0
    data = build_descriptor(
        type_tag=type_tag,
        shape=(64,),
        buffer_sizes=(64, 8),
        flags=0x01,
        sections=quantization_section(scheme, flags, payload),
    )
    fields = kaitai_fields(descriptor_parser.from_bytes(data))
    assert fields["quantization_bytes"] == bytes([scheme, 1, flags, 0]) + payload


def test_quantization_padding_is_kept(descriptor_parser: Any) -> None:
    payload = struct.pack("<fi4x", 0.5, -3)
    data = build_descriptor(
        type_tag=0x10, flags=0x01, sections=quantization_section(1, 0, payload, b"\x00\x07")
    )
    quant = descriptor_parser.from_bytes(data).body.quantization
    assert quant.payload.scale == 0.5
    assert quant.payload.zero_point == -3
    assert quant.padding == b"\x00\x07"


def test_unknown_trailing_needs_a_newer_minor(
    descriptor_parser: Any, kaitai_errors: tuple[type[BaseException], ...]
) -> None:
    newer = build_descriptor(version_minor=1, sections=b"\x01\x02")
    assert descriptor_parser.from_bytes(newer).body.unknown_trailing == b"\x01\x02"
    with pytest.raises(kaitai_errors):
        descriptor_parser.from_bytes(build_descriptor(sections=b"\x01\x02"))


def _per_block(length: int) -> bytes:
    """A symmetric per-block-affine section whose quantization_length says ``length``."""
    body = struct.pack("<BBHIIIIB3x", 3, 1, 1, 0, 2, 1, 0xFFFFFFFF, 3)
    return struct.pack("<I", length) + body[:length]


def _spec_example_with(offset: int, patch: bytes) -> bytes:
    """The block-paged spec example (descriptor.md § 12.3) with ``patch`` written at ``offset``."""
    path = BLOCK_PAGED_MANIFEST.parent / "descriptors" / "bp_spec_example_f16_key_l3.bin"
    data = bytearray(path.read_bytes())
    data[offset : offset + len(patch)] = patch
    return bytes(data)


def _per_tensor(scale: float, zero_point: int) -> bytes:
    return quantization_section(1, 0, struct.pack("<fi4x", scale, zero_point))


#: (bytes, a piece of the error that names the rule, id). The .ksy path in a Kaitai
#: validation error names the type and field: /types/<type>/seq/<field number>.
SYNTHETIC_REJECTS: list[tuple[bytes, str, str]] = [
    (
        build_descriptor(layout_tag=0x04, shape=(4, 4), payload=nested_tiled(9)),
        "/types/layout_tiled/seq/2",
        "tiled_depth_9",
    ),
    (
        build_descriptor(layout_tag=0x06, payload=struct.pack("<QB7x", 3, 2), buffer_sizes=(4, 4)),
        "/types/layout_coo/seq/1",
        "coo_is_sorted_2",
    ),
    (
        build_descriptor(layout_tag=0x40, shape=(4, 4, 4), payload=struct.pack("<II", 2, 2)),
        "/types/layout_hilbert/seq/1",
        "hilbert_rank_mismatch",
    ),
    (build_descriptor(layout_tag=0x0C), "/types/fixed_header/seq/6", "reserved_layout_tag"),
    (build_descriptor(type_tag=0x47), "/types/fixed_header/seq/5", "reserved_type_tag"),
    (
        build_descriptor(type_tag=0xF0, buffer_sizes=(2,)),
        "/types/fixed_header/seq/5",
        "private_type_without_ext_flag",
    ),
    (
        build_descriptor(flags=0x04, sections=EXTENSION_TYPE),
        "/types/fixed_header/seq/5",
        "ext_flag_on_float32",
    ),
    (build_descriptor(shape=(1,) * 65), "/types/fixed_header/seq/7", "rank_65"),
    (build_descriptor(buffer_sizes=()), "/types/descriptor_body/seq/3", "dense_without_buffer"),
    (
        build_descriptor(type_tag=0x10, buffer_sizes=(4, 4), flags=0x01, sections=_per_block(20)),
        "bytes available",
        "quantization_length_too_short",
    ),
    (
        build_descriptor(type_tag=0x10, flags=0x01, sections=_per_tensor(float("nan"), 0)),
        "/types/quant_per_tensor_affine/seq/0",
        "per_tensor_scale_nan",
    ),
    (
        build_descriptor(type_tag=0x10, flags=0x01, sections=_per_tensor(1.0, 128)),
        "/types/quant_per_tensor_affine/seq/1",
        "per_tensor_zero_point_outside_int8",
    ),
    (
        _spec_example_with(20, b"\xff" * 8),
        "/types/descriptor_body/seq/0",
        "block_paged_dynamic_dimension",
    ),
]


def test_synthetic_per_block_section_is_well_formed(descriptor_parser: Any) -> None:
    """The too-short case above differs from an accepted descriptor only in its length."""
    data = build_descriptor(type_tag=0x10, buffer_sizes=(4, 4), flags=0x01, sections=_per_block(24))
    assert descriptor_parser.from_bytes(data).body.quantization.payload.block_size == 2


@pytest.mark.parametrize(
    ("data", "where"),
    [pytest.param(data, where, id=name) for data, where, name in SYNTHETIC_REJECTS],
)
def test_synthetic_rejects(
    data: bytes, where: str, descriptor_parser: Any, kaitai_errors: tuple[type[BaseException], ...]
) -> None:
    """Each must fail for its own reason: ``where`` is part of the error message."""
    with pytest.raises(kaitai_errors, match=re.escape(where)):
        descriptor_parser.from_bytes(data)


# ---------------------------------------------------------------------------------------
# The blob envelope (schemas/hurray_wire_blob.ksy, docs/wire-format.md)
# ---------------------------------------------------------------------------------------

BLOB_MAGIC = b"HRWB"


@dataclass(frozen=True)
class BlobSection:
    """One section to place in a hand-built blob (docs/wire-format.md § 2)."""

    kind: int
    stored: bytes
    index: int = 0
    flags: int = 1
    codec: int = 0
    codec_param: int = 0
    raw_size: int | None = None
    alignment: int = 64


def _align(value: int, alignment: int) -> int:
    return -(-value // alignment) * alignment


def build_blob(descriptor: bytes, sections: list[BlobSection], checksum_type: int = 1) -> bytes:
    """Lay out a blob by the rules of docs/wire-format.md, independently of hurray_wire."""
    import xxhash

    header_length = 32 + 48 * len(sections) + len(descriptor)
    position = header_length + 8
    table = b""
    placed: list[tuple[int, bytes]] = []
    for section in sections:
        offset = _align(position, section.alignment)
        raw_size = len(section.stored) if section.raw_size is None else section.raw_size
        checksum = xxhash.xxh3_64_intdigest(section.stored) if checksum_type == 1 else 0
        table += struct.pack(
            "<BBBBIQQQQI4x",
            section.kind,
            section.flags,
            section.codec,
            section.codec_param,
            section.index,
            offset,
            len(section.stored),
            raw_size,
            checksum,
            section.alignment,
        )
        placed.append((offset, section.stored))
        position = offset + len(section.stored)
    total_length = _align(position, 64)
    header = BLOB_MAGIC + struct.pack(
        "<BBHQIHBBI4x",
        1,
        0,
        0,
        total_length,
        header_length,
        len(sections),
        checksum_type,
        0,
        len(descriptor),
    )
    blob = bytearray(total_length)
    blob[:header_length] = header + table + descriptor
    blob[header_length : header_length + 8] = struct.pack(
        "<Q", xxhash.xxh3_64_intdigest(bytes(blob[:header_length]))
    )
    for offset, stored in placed:
        blob[offset : offset + len(stored)] = stored
    return bytes(blob)


def _kv_metadata() -> bytes:
    """Three entries in the .hrry KV encoding: a string, a float64 and an int64 array."""

    def key(name: str) -> bytes:
        return struct.pack("<H", len(name)) + name.encode()

    return (
        struct.pack("<I", 3)
        + key("model")
        + b"\x01"
        + struct.pack("<I", 4)
        + b"tiny"
        + key("hurray.k_scale")
        + b"\x04"
        + struct.pack("<d", 0.5)
        + key("request_ids")
        + b"\x07\x02"
        + struct.pack("<Iqq", 2, 7, -1)
    )


def spec_example_blob_sections(metadata: bool = False) -> tuple[bytes, list[BlobSection]]:
    """The worked example of docs/wire-format.md § 9: the spec example with seq_lens [6, 3]."""
    stream = (BLOCK_PAGED_MANIFEST.parent / "streams" / "spec_example_f16_key_l3.hrrs").read_bytes()
    descriptor, pool = stream[:133], stream[133:773]
    block_table, seq_ptr = stream[773:785], stream[785:797]
    sections = [
        BlobSection(1, pool, index=0),
        BlobSection(1, block_table, index=1),
        BlobSection(1, seq_ptr, index=2),
        BlobSection(2, struct.pack("<QQ", 6, 3)),
    ]
    if metadata:
        sections.append(BlobSection(3, _kv_metadata(), flags=0))
    return descriptor, sections


def test_blob_worked_example(blob_parser: Any, descriptor_parser: Any) -> None:
    """docs/wire-format.md § 9 recomputed from the rules of § 2 (§ 9 itself says 1024 bytes)."""
    descriptor, sections = spec_example_blob_sections()
    data = build_blob(descriptor, sections)
    blob = blob_parser.from_bytes(data)
    assert blob.header.header_length == 357
    assert [entry.offset for entry in blob.sections] == [384, 1024, 1088, 1152]
    assert blob.data_end == 1168
    assert blob.header.total_length == len(data) == 1216
    assert kaitai_fields(blob.descriptor) == kaitai_fields(descriptor_parser.from_bytes(descriptor))
    assert [part.stored for part in blob.section_data[:3]] == [s.stored for s in sections[:3]]
    assert blob.section_data[3].stored.lengths == [6, 3]


@pytest.mark.parametrize("metadata", [False, True], ids=["plain", "metadata"])
def test_blob_agrees_with_hurray_wire(metadata: bool, blob_parser: Any) -> None:
    """The blob built from the doc alone is what hurray_wire decodes and re-encodes, byte
    for byte, and hurray_wire's own encoding parses under the schema."""
    import hurray_wire

    built = build_blob(*spec_example_blob_sections(metadata=metadata))
    tensor = hurray_wire.decode(built)
    encoded = bytes(hurray_wire.encode(tensor))
    assert encoded == built
    assert blob_parser.from_bytes(encoded).header.total_length == len(encoded)


def test_blob_metadata_and_compressed_sections(blob_parser: Any) -> None:
    import zstandard

    descriptor, sections = spec_example_blob_sections(metadata=True)
    pool = sections[0].stored
    sections[0] = BlobSection(
        1, zstandard.ZstdCompressor().compress(pool), codec=1, raw_size=len(pool)
    )
    blob = blob_parser.from_bytes(build_blob(descriptor, sections))
    entries = blob.section_data[4].stored.entries
    assert [e.key for e in entries] == ["model", "hurray.k_scale", "request_ids"]
    assert entries[0].value.value.value == "tiny"
    assert entries[1].value.value == 0.5
    assert [v.value for v in entries[2].value.value.elements] == [7, -1]
    assert blob.sections[0].raw_size == len(pool) != blob.sections[0].stored_size


def test_blob_unknown_optional_section_is_skipped(blob_parser: Any) -> None:
    descriptor, sections = spec_example_blob_sections()
    sections.append(BlobSection(0x42, b"future", flags=0))
    blob = blob_parser.from_bytes(build_blob(descriptor, sections))
    assert blob.section_data[4].stored == b"future"


def test_blob_chunked_section_table(blob_parser: Any) -> None:
    """The chunked codec's table as the schema reads it, against hurray_wire's decoding."""
    import numpy as np
    import zstandard

    import hurray_wire
    from hurray_wire import codecs

    data = (ROOT / "fixtures" / "blobs" / "chunked_shuffle_zstd_f16.hrwb").read_bytes()
    parsed = blob_parser.from_bytes(data)
    entry = parsed.sections[0]
    assert entry.codec == blob_parser.Codec.chunked_shuffle_zstd and entry.codec_param == 2
    table = parsed.section_data[0].stored
    assert (table.chunk_size, table.chunk_count) == (16384, 4)
    assert sum(table.frame_sizes) + 8 + 4 * 4 == entry.stored_size
    pool = hurray_wire.decode(data).page_pool.reshape(-1).view(np.uint8)
    for i, frame in enumerate(table.frames):
        plain = np.frombuffer(zstandard.ZstdDecompressor().decompress(frame), np.uint8)
        chunk = pool[i * 16384 : (i + 1) * 16384]
        assert codecs.unshuffle_bytes(plain, 2).tobytes() == chunk.tobytes()


def test_blob_chunked_table_rejects(blob_parser: Any) -> None:
    from kaitaistruct import ValidationFailedError

    data = bytearray((ROOT / "fixtures" / "blobs" / "chunked_shuffle_zstd_f16.hrwb").read_bytes())
    start = blob_parser.from_bytes(bytes(data)).sections[0].offset
    for patch_at, value, field in ((0, 3 << 12, "chunk_size"), (4, 5, "chunk_count")):
        bad = bytearray(data)
        struct.pack_into("<I", bad, start + patch_at, value)
        with pytest.raises(ValidationFailedError) as info:
            blob_parser.from_bytes(bytes(bad))
        assert "chunked_frames" in str(info.value.src_path), (field, info.value.src_path)


def _blob_with(change: Callable[[list[BlobSection]], None], checksum_type: int = 1) -> bytes:
    descriptor, sections = spec_example_blob_sections()
    change(sections)
    return build_blob(descriptor, sections, checksum_type)


def _zstd(data: bytes) -> bytes:
    import zstandard

    result: bytes = zstandard.ZstdCompressor().compress(data)
    return result


def _patched(data: bytes, offset: int, patch: bytes) -> bytes:
    out = bytearray(data)
    out[offset : offset + len(patch)] = patch
    return bytes(out)


_EXAMPLE_BLOB_SECTIONS = spec_example_blob_sections()
_EXAMPLE_BLOB = build_blob(*_EXAMPLE_BLOB_SECTIONS)

BLOB_REJECTS: list[tuple[bytes, str, str]] = [
    (_patched(_EXAMPLE_BLOB, 0, b"HRWX"), "/types/blob_header/seq/0", "bad_magic"),
    (_patched(_EXAMPLE_BLOB, 6, b"\x01"), "/types/blob_header/seq/3", "header_flags"),
    (_patched(_EXAMPLE_BLOB, 370, b"\x01"), "/types/section_data/seq/0", "nonzero_padding"),
    (_patched(_EXAMPLE_BLOB, 1200, b"\x01"), "/seq/6", "nonzero_trailing_padding"),
    (
        _blob_with(lambda s: s.append(BlobSection(0x42, b"future", flags=1))),
        "/types/section_entry/seq/1",
        "unknown_required_kind",
    ),
    (
        _blob_with(lambda s: s.__setitem__(1, BlobSection(1, b"\0" * 16, index=1))),
        "/types/section_data/seq/2",
        "buffer_size_differs_from_descriptor",
    ),
    (
        # compressed, so the schema keeps the bytes and checks raw_size (8 x num_seqs = 16)
        _blob_with(
            lambda s: s.__setitem__(
                3, BlobSection(2, _zstd(struct.pack("<Q", 9)), codec=1, raw_size=8)
            )
        ),
        "/types/section_data/seq/2",
        "seq_lens_size",
    ),
    (
        _blob_with(lambda s: s.insert(0, s.pop(1))),
        "/types/section_entry/seq/4",
        "buffers_out_of_order",
    ),
    (
        # the first section's offset is not the minimal aligned one (384 -> 448)
        _patched(_EXAMPLE_BLOB, 32 + 8, struct.pack("<Q", 448)),
        "/types/section_entry/seq/9",
        "offset_not_minimal",
    ),
    (
        _patched(_EXAMPLE_BLOB, 22, b"\x00"),
        "/types/section_entry/seq/8",
        "checksum_without_checksum_type",
    ),
    (
        _patched(_EXAMPLE_BLOB, 8, struct.pack("<Q", 1280)) + bytes(64),
        "/seq/7",
        "total_length_not_minimal",
    ),
    (_EXAMPLE_BLOB[:-1], "bytes available", "truncated"),
]


@pytest.mark.parametrize(
    ("data", "where"),
    [pytest.param(data, where, id=name) for data, where, name in BLOB_REJECTS],
)
def test_blob_rejects(
    data: bytes, where: str, blob_parser: Any, kaitai_errors: tuple[type[BaseException], ...]
) -> None:
    pattern = f"^{re.escape(where)}:" if where.startswith("/") else re.escape(where)
    with pytest.raises(kaitai_errors, match=pattern):
        blob_parser.from_bytes(data)


def _blob_fixture_files() -> list[Path]:
    """Every file under fixtures/ that starts with the blob magic (none existed at first)."""
    found = []
    for path in sorted(FIXTURES.rglob("*")):
        if path.is_file() and path.suffix not in {".json", ".md", ".txt"}:
            with path.open("rb") as handle:
                if handle.read(4) == BLOB_MAGIC:
                    found.append(path)
    return found


@pytest.mark.parametrize(
    "path", _blob_fixture_files(), ids=lambda path: str(path.relative_to(FIXTURES))
)
def test_blob_fixtures_parse(path: Path, blob_parser: Any) -> None:
    """Blobs (or streams of blobs) in fixtures/ parse back to back up to the end of the file."""
    import kaitaistruct

    data = path.read_bytes()
    stream = kaitaistruct.KaitaiStream(kaitaistruct.BytesIO(data))
    count = 0
    while not stream.is_eof():
        start = stream.pos()
        blob = blob_parser(stream)
        assert stream.pos() - start == blob.header.total_length
        count += 1
    assert count >= 1


@pytest.mark.parametrize(
    "path", _blob_fixture_files(), ids=lambda path: str(path.relative_to(FIXTURES))
)
def test_blob_fixtures_agree_with_hurray_wire(path: Path, blob_parser: Any) -> None:
    """Every header and section field the schema reads is what hurray_wire's decoder reads,
    and the embedded descriptor reads the same under both."""
    import hurray_wire
    from hurray_wire import report as summary

    data = path.read_bytes()
    blob = blob_parser.from_bytes(data)
    tensor = hurray_wire.decode(data)
    envelope = summary.describe_blob_envelope(data, verified=True)
    header = blob.header
    assert f"{header.version_major}.{header.version_minor}" == envelope["version"]
    assert header.total_length == envelope["total_length"] == len(data)
    assert header.header_length == envelope["header_length"]
    assert len(blob.sections) == len(envelope["sections"])
    codecs = {0: "raw", 1: "zstd", 2: "shuffle-zstd", 3: "chunked-shuffle-zstd"}
    for entry, ours in zip(blob.sections, envelope["sections"], strict=True):
        assert (int(entry.kind), entry.index, entry.offset) == (
            {"buffer": 1, "seq_lens": 2, "metadata": 3}[ours["kind"]], ours["index"],
            ours["offset"],
        )  # fmt: skip
        assert (entry.stored_size, entry.raw_size, entry.alignment) == (
            ours["stored_size"], ours["raw_size"], ours["alignment"]
        )  # fmt: skip
        assert codecs[int(entry.codec)] == ours["codec"]
        assert entry.codec_param == ours["codec_param"]
    descriptor = hurray_wire.encode_descriptor(tensor.descriptor)
    assert kaitai_fields(blob.descriptor) == decoder_fields(descriptor)


def test_blob_page_sections_as_the_schema_reads_them(
    blob_parser: Any, kaitai_errors: tuple[type[BaseException], ...]
) -> None:
    """Issue 14: a page_digests section is parsed (kind known, not REQUIRED, one digest per
    page); a delta blob (page_refs) is refused, not misread: its short pool is a rule the
    schema does not express."""
    import numpy as np

    import hurray_wire

    pool = np.arange(5 * 4 * 2 * 8, dtype=np.float16).reshape(5, 4, 2, 8)
    tensor = hurray_wire.BlockPagedTensor.from_arrays(pool, [0, 1, 0], [0, 2, 3])
    blob = bytes(hurray_wire.encode(tensor, page_digests=True))
    parsed = blob_parser.from_bytes(blob)
    entry = parsed.sections[3]
    assert entry.section_kind == blob_parser.SectionKind.page_digests
    assert entry.section_flags == 0 and entry.raw_size == 8 + 8 * 5
    required = bytearray(blob)
    required[32 + 48 * 3 + 1] = 1  # page_digests flagged REQUIRED
    with pytest.raises(kaitai_errors):
        blob_parser.from_bytes(bytes(hurray_wire_rehash(required)))
    from hurray_wire.integrity import page_digests

    delta = bytes(hurray_wire.encode(tensor, known_pages=np.sort(page_digests(tensor)[[1]])))
    with pytest.raises(kaitai_errors):
        blob_parser.from_bytes(delta)


def hurray_wire_rehash(blob: bytearray) -> bytes:
    """The blob with its header checksum recomputed (header_length at offset 16)."""
    import struct

    import xxhash

    length = struct.unpack_from("<I", blob, 16)[0]
    struct.pack_into("<Q", blob, length, xxhash.xxh3_64_intdigest(bytes(blob[:length])))
    return bytes(blob)
