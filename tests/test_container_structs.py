"""The .hrry construct structs (containers.md Part B) and CRC-32C against the golden files.

For each struct: ``parse(data) == obj``, ``build(obj) == data`` and ``sizeof`` where fixed, in
plain and compiled form; the plain form must also refuse bad magic and reserved bytes.
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path
from typing import Any

import construct as c
import numpy as np
import pytest
from hypothesis import given, strategies as st

from hurray_wire.crc32c import CRC32C_CHECK, crc32c
from hurray_wire.errors import ArgumentTypeError
from hurray_wire.wire.containers import (
    FILE_FLAG_HAS_INDEX_CRC32C,
    FILE_FLAG_HAS_KV_METADATA,
    FILE_MAGIC,
    HEADER_SIZE,
    INDEX_ENTRY_FIXED_SIZE,
    MIN_FILE_SIZE,
    TENSOR_COUNT_UNKNOWN,
    TRAILER_MAGIC,
    TRAILER_SIZE,
    HrryHeader,
    HrryIndex,
    HrryIndexEntry,
    HrryTrailer,
    KvArray,
    KvEntry,
    KvSection,
)

CONFORMANCE = Path(__file__).resolve().parent.parent / "fixtures" / "conformance"
BASIC = CONFORMANCE / "reference" / "files" / "basic.hrry"
LAYER0 = CONFORMANCE / "block_paged" / "files" / "layer0_kv.hrry"
LAYER0_KVFLAG = CONFORMANCE / "block_paged" / "files" / "layer0_kv_kvflag.hrry"

# containers.md § B.9, the annotated table of basic.hrry (the reference manifest lists only
# tensors and KV entries).
BASIC_EXPECTED: dict[str, Any] = {
    "total_bytes": 8391,
    "file_flags": 0x04,
    "data_buffer_alignment": 4096,
    "first_descriptor_offset": 64,
    "tensor_count_hint": TENSOR_COUNT_UNKNOWN,
    "trailer": {
        "index_offset": 0x2048,
        "index_length": 87,
        "kv_offset": 0x2008,
        "kv_length": 60,
        "index_crc32c": 0x51349F72,
    },
    "index": [
        {
            "name": "weights",
            "descriptor_offset": 64,
            "descriptor_length": 61,
            "data_offset": 4096,
            "data_length": 16,
        },
        {
            "name": "bias",
            "descriptor_offset": 4112,
            "descriptor_length": 53,
            "data_offset": 8192,
            "data_length": 3,
        },
    ],
}


def _block_paged_expected(path: Path) -> dict[str, Any]:
    manifest = json.loads((CONFORMANCE / "block_paged" / "manifest.json").read_text())
    (entry,) = [f for f in manifest["files"] if f["file"] == f"files/{path.name}"]
    return dict(entry)


FILES = {
    BASIC.name: (BASIC, BASIC_EXPECTED),
    LAYER0.name: (LAYER0, _block_paged_expected(LAYER0)),
    LAYER0_KVFLAG.name: (LAYER0_KVFLAG, _block_paged_expected(LAYER0_KVFLAG)),
}
FILE_IDS = list(FILES)

# basic.hrry's header, spelled out from § B.2 / § B.9.
BASIC_HEADER = (
    b"HRRYFILE"
    + b"\x01\x00"
    + b"\x00\x00"
    + b"\x04\x00\x00\x00"
    + b"\x00\x10\x00\x00"
    + (64).to_bytes(8, "little")
    + b"\xff" * 8
    + bytes(28)
)


def header_obj(expected: dict[str, Any]) -> dict[str, Any]:
    return {
        "magic": FILE_MAGIC,
        "container_version_major": 1,
        "container_version_minor": 0,
        "file_flags": expected["file_flags"],
        "data_buffer_alignment": expected["data_buffer_alignment"],
        "first_descriptor_offset": expected["first_descriptor_offset"],
        "tensor_count_hint": expected["tensor_count_hint"],
    }


def trailer_obj(expected: dict[str, Any]) -> dict[str, Any]:
    return {**expected["trailer"], "magic": TRAILER_MAGIC}


def index_obj(expected: dict[str, Any]) -> dict[str, Any]:
    entries = [
        {**e, "name": e["name"].encode(), "name_length": len(e["name"].encode()), "flags": 0}
        for e in expected["index"]
    ]
    return {"entry_count": len(entries), "entries": entries}


def parts(path: Path) -> tuple[bytes, bytes, bytes, bytes]:
    """Header, index, KV section and trailer bytes of a fixture, cut by the trailer."""
    data = path.read_bytes()
    trailer = HrryTrailer.parse(data[-TRAILER_SIZE:])
    index = data[trailer.index_offset : trailer.index_offset + trailer.index_length]
    kv = data[trailer.kv_offset : trailer.kv_offset + trailer.kv_length]
    return data[:HEADER_SIZE], index, kv, data[-TRAILER_SIZE:]


def check_struct(struct: Any, data: bytes, obj: dict[str, Any]) -> None:
    """The construct test pattern, plain and compiled."""
    for form in (struct, struct.compile()):
        assert form.parse(data) == obj
        assert form.build(obj) == data
        assert form.build(form.parse(data)) == data


def test_sizes() -> None:
    assert HrryHeader.sizeof() == HEADER_SIZE == 64
    assert HrryTrailer.sizeof() == TRAILER_SIZE == 40
    assert MIN_FILE_SIZE == 104
    for variable in (HrryIndexEntry, HrryIndex, KvEntry, KvSection, KvArray):
        with pytest.raises(c.SizeofError):
            variable.sizeof()


def test_basic_header_literal_bytes() -> None:
    assert BASIC.read_bytes()[:64] == BASIC_HEADER
    check_struct(HrryHeader, BASIC_HEADER, header_obj(BASIC_EXPECTED))


@pytest.mark.parametrize("name", FILE_IDS)
def test_header_golden(name: str) -> None:
    path, expected = FILES[name]
    header, _, _, _ = parts(path)
    check_struct(HrryHeader, header, header_obj(expected))


def test_kvflag_variant_differs_only_in_file_flags() -> None:
    plain, flagged = LAYER0.read_bytes(), LAYER0_KVFLAG.read_bytes()
    assert [i for i in range(len(plain)) if plain[i] != flagged[i]] == [12]
    assert HrryHeader.parse(plain).file_flags == FILE_FLAG_HAS_INDEX_CRC32C
    assert HrryHeader.parse(flagged).file_flags == (
        FILE_FLAG_HAS_INDEX_CRC32C | FILE_FLAG_HAS_KV_METADATA
    )


@pytest.mark.parametrize("name", FILE_IDS)
def test_trailer_golden(name: str) -> None:
    path, expected = FILES[name]
    data = path.read_bytes()
    assert len(data) == expected["total_bytes"]
    _, _, _, trailer = parts(path)
    assert trailer[-4:] == b"HRRY"
    check_struct(HrryTrailer, trailer, trailer_obj(expected))
    # § B.5: the trailer follows the index immediately.
    parsed = HrryTrailer.parse(trailer)
    assert parsed.index_offset + parsed.index_length == len(data) - TRAILER_SIZE


@pytest.mark.parametrize("name", FILE_IDS)
def test_index_golden(name: str) -> None:
    path, expected = FILES[name]
    _, index, _, _ = parts(path)
    obj = index_obj(expected)
    check_struct(HrryIndex, index, obj)
    # Each entry on its own: 2 + name_length + 32 bytes.
    offset = 8
    for entry in obj["entries"]:
        size = 2 + entry["name_length"] + INDEX_ENTRY_FIXED_SIZE
        check_struct(HrryIndexEntry, index[offset : offset + size], entry)
        offset += size
    assert offset == len(index)


@pytest.mark.parametrize("name", FILE_IDS)
def test_index_crc32c(name: str) -> None:
    path, expected = FILES[name]
    _, index, _, _ = parts(path)
    assert crc32c(index) == expected["trailer"]["index_crc32c"]


def test_builders_rebuild_lengths_and_counts() -> None:
    """A writer passes names and entries only; lengths and counts come from them."""
    _, index, kv, _ = parts(BASIC)
    entries = [
        {k: v for k, v in e.items() if k != "name_length"}
        for e in index_obj(BASIC_EXPECTED)["entries"]
    ]
    assert HrryIndex.build({"entries": entries}) == index
    assert HrryIndexEntry.build(entries[0]) == index[8 : 8 + 2 + 7 + 32]
    assert (
        HrryHeader.build({k: v for k, v in header_obj(BASIC_EXPECTED).items() if k != "magic"})
        == BASIC_HEADER
    )
    built_kv = KvSection.build(
        {
            "entries": [
                {"key": b"producer", "value_tag": 1, "value": b"hurray-conformance"},
                {"key": b"tensor_count", "value_tag": 2, "value": 2},
            ]
        }
    )
    assert built_kv == kv


@pytest.mark.parametrize("name", [BASIC.name, LAYER0.name])
def test_kv_section_golden(name: str) -> None:
    path, _ = FILES[name]
    _, _, kv, _ = parts(path)
    for form in (KvSection, KvSection.compile()):
        parsed = form.parse(kv)
        assert parsed.kv_count == len(parsed.entries)
        assert form.build(parsed) == kv
    parsed = KvSection.parse(kv)
    if name == LAYER0.name:
        tags = [(e.key, e.value_tag) for e in parsed.entries]
        assert tags == [
            (b"producer", 1),
            (b"kv.num_layers", 2),
            (b"kv.page_size", 3),
            (b"kv.rope_theta", 4),
            (b"kv.prefix_shared", 5),
            (b"kv.layers", 7),
        ]
        assert parsed.entries[5].value == {"element_tag": 2, "count": 1, "elements": [0]}
        assert parsed.entries[4].value is True


# ---------------------------------------------------------------------------------------------
# What the plain structs refuse
# ---------------------------------------------------------------------------------------------


def _flip(data: bytes, position: int, value: int = 0x01) -> bytes:
    return data[:position] + bytes((data[position] ^ value,)) + data[position + 1 :]


@pytest.mark.parametrize("position", [*range(0, 8), 10, 11, *range(36, 64)])
def test_header_magic_and_reserved_bytes_are_checked(position: int) -> None:
    with pytest.raises(c.ConstError):
        HrryHeader.parse(_flip(BASIC_HEADER, position))


@pytest.mark.parametrize("position", range(32, 40))
def test_trailer_reserved_and_magic_are_checked(position: int) -> None:
    _, _, _, trailer = parts(BASIC)
    with pytest.raises(c.ConstError):
        HrryTrailer.parse(_flip(trailer, position))


def test_truncated_fixed_structs() -> None:
    _, _, _, trailer = parts(BASIC)
    for cut in range(64):
        with pytest.raises(c.StreamError):
            HrryHeader.parse(BASIC_HEADER[:cut])
    for cut in range(40):
        with pytest.raises(c.StreamError):
            HrryTrailer.parse(trailer[:cut])


def test_index_structure_is_checked() -> None:
    _, index, _, _ = parts(LAYER0)
    with pytest.raises(c.TerminatedError):
        HrryIndex.parse(index + b"\x00")
    with pytest.raises(c.StreamError):
        HrryIndex.parse(b"\x03" + index[1:])  # one entry more than the bytes hold
    for cut in range(len(index)):
        with pytest.raises((c.StreamError, c.TerminatedError)):
            HrryIndex.parse(index[:cut])
    with pytest.raises(c.StreamError):
        HrryIndex.parse(b"\xff" * 8)  # 2**64-1 entries: fails at the first, allocates nothing


def test_kv_section_structure_is_checked() -> None:
    _, _, kv, _ = parts(LAYER0)
    parsed = KvSection.parse(kv)
    tag_at = 4 + 2 + 8  # producer's value tag
    for tag in (0x00, 0x08, 0xF0, 0xFF):
        bad = kv[:tag_at] + bytes((tag,)) + kv[tag_at + 1 :]
        with pytest.raises(c.ExplicitError):
            KvSection.parse(bad)
    bool_at = kv.index(b"kv.prefix_shared") + 16 + 1
    assert kv[bool_at] == 1
    with pytest.raises(c.MappingError):
        KvSection.parse(kv[:bool_at] + b"\x02" + kv[bool_at + 1 :])
    element_tag_at = kv.index(b"kv.layers") + 9 + 1
    with pytest.raises(c.ExplicitError):
        KvSection.parse(kv[:element_tag_at] + b"\x07" + kv[element_tag_at + 1 :])
    with pytest.raises(c.TerminatedError):
        KvSection.parse(kv + b"\x00")
    assert len(parsed.entries) == 6


# ---------------------------------------------------------------------------------------------
# Round trips over the whole field ranges
# ---------------------------------------------------------------------------------------------

u8 = st.integers(0, 0xFF)
u32 = st.integers(0, 0xFFFF_FFFF)
u64 = st.integers(0, 0xFFFF_FFFF_FFFF_FFFF)


@given(u8, u8, u32, u32, u64, u64)
def test_header_round_trip(
    major: int, minor: int, flags: int, align: int, first: int, hint: int
) -> None:
    obj = {
        "magic": FILE_MAGIC,
        "container_version_major": major,
        "container_version_minor": minor,
        "file_flags": flags,
        "data_buffer_alignment": align,
        "first_descriptor_offset": first,
        "tensor_count_hint": hint,
    }
    data = HrryHeader.build(obj)
    assert len(data) == 64
    assert HrryHeader.parse(data) == obj


@given(u64, u64, u64, u32, u32)
def test_trailer_round_trip(
    index_offset: int, index_length: int, kv_offset: int, kv_length: int, crc: int
) -> None:
    obj = {
        "index_offset": index_offset,
        "index_length": index_length,
        "kv_offset": kv_offset,
        "kv_length": kv_length,
        "index_crc32c": crc,
        "magic": TRAILER_MAGIC,
    }
    data = HrryTrailer.build(obj)
    assert len(data) == 40
    assert HrryTrailer.parse(data) == obj


index_entries = st.fixed_dictionaries(
    {
        "name": st.binary(min_size=0, max_size=40),
        "descriptor_offset": u64,
        "descriptor_length": u32,
        "data_offset": u64,
        "data_length": u64,
        "flags": u32,
    }
)


@given(st.lists(index_entries, max_size=5))
def test_index_round_trip(entries: list[dict[str, Any]]) -> None:
    data = HrryIndex.build({"entries": entries})
    assert len(data) == 8 + sum(2 + len(e["name"]) + INDEX_ENTRY_FIXED_SIZE for e in entries)
    parsed = HrryIndex.parse(data)
    assert parsed.entry_count == len(entries)
    assert parsed.entries == [{**e, "name_length": len(e["name"])} for e in entries]


# ---------------------------------------------------------------------------------------------
# CRC-32C
# ---------------------------------------------------------------------------------------------


def test_crc32c_check_value_and_buffer_kinds() -> None:
    check = b"123456789"
    assert CRC32C_CHECK == 0xE3069283
    assert crc32c(check) == CRC32C_CHECK
    assert crc32c(bytearray(check)) == CRC32C_CHECK
    assert crc32c(memoryview(check)) == CRC32C_CHECK
    assert crc32c(memoryview(bytearray(check))) == CRC32C_CHECK
    assert crc32c(np.frombuffer(check, dtype=np.uint8)) == CRC32C_CHECK
    assert crc32c(b"") == 0
    assert crc32c(b"56789", crc32c(b"1234")) == CRC32C_CHECK


def test_crc32c_of_typed_and_strided_arrays_is_that_of_their_bytes() -> None:
    array = np.arange(24, dtype=np.float16).reshape(4, 6)
    assert crc32c(array) == crc32c(array.tobytes())
    assert crc32c(array.data) == crc32c(array.tobytes())
    assert crc32c(array[:, ::2]) == crc32c(array[:, ::2].tobytes())
    assert crc32c(array.T) == crc32c(array.T.tobytes())
    strided = memoryview(bytearray(b"1a2b3c4d5e6f7g8h9i"))[::2]
    assert crc32c(strided) == CRC32C_CHECK


def test_crc32c_is_not_zlib_crc32() -> None:
    assert crc32c(b"123456789") != zlib.crc32(b"123456789")


@pytest.mark.parametrize("bad", ["123", 12, None, [1, 2], np.array([None])], ids=repr)
def test_crc32c_rejects_non_buffers(bad: Any) -> None:
    with pytest.raises(ArgumentTypeError):
        crc32c(bad)


@pytest.mark.parametrize("crc", [-1, 1 << 32, 1.0, True, "0"], ids=repr)
def test_crc32c_rejects_bad_running_value(crc: Any) -> None:
    with pytest.raises(ArgumentTypeError):
        crc32c(b"x", crc)
