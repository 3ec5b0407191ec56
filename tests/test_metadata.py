"""The KV metadata codec (containers.md § B.4): golden bytes, every rejection, and fuzzing."""

from __future__ import annotations

import contextlib
import json
import math
import struct
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from hurray_wire import metadata
from hurray_wire.errors import ArgumentTypeError, HurrayWireError, InvalidMetadataError
from hurray_wire.metadata import (
    INT64_MAX,
    INT64_MIN,
    UINT64_MAX,
    Int64,
    MetadataValue,
    UInt64,
    decode_metadata,
    encode_metadata,
)
from hurray_wire.wire.containers import HrryTrailer, KvSection

CONFORMANCE = Path(__file__).resolve().parent.parent / "fixtures" / "conformance"
BASIC = CONFORMANCE / "reference" / "files" / "basic.hrry"
LAYER0 = CONFORMANCE / "block_paged" / "files" / "layer0_kv.hrry"
LAYER0_KVFLAG = CONFORMANCE / "block_paged" / "files" / "layer0_kv_kvflag.hrry"
ALL_FILES = [BASIC, LAYER0, LAYER0_KVFLAG]

# containers.md § B.9: the 60-byte KV section of basic.hrry, written out by hand.
BASIC_KV = (
    b"\x02\x00\x00\x00"
    + b"\x08\x00producer"
    + b"\x01\x12\x00\x00\x00hurray-conformance"
    + b"\x0c\x00tensor_count"
    + b"\x02"
    + (2).to_bytes(8, "little")
)


def kv_section(path: Path) -> tuple[bytes, int]:
    """The KV section bytes (exactly kv_length) and kv_offset of a fixture file."""
    data = path.read_bytes()
    trailer = HrryTrailer.parse(data[-40:])
    return data[trailer.kv_offset : trailer.kv_offset + trailer.kv_length], trailer.kv_offset


FIXTURE_SECTIONS = [kv_section(BASIC)[0], kv_section(LAYER0)[0]]


def manifest_kv(path: Path) -> list[dict[str, Any]]:
    manifest = json.loads((path.parent.parent / "manifest.json").read_text())
    (entry,) = [f for f in manifest["files"] if f["file"] == f"files/{path.name}"]
    kv: list[dict[str, Any]] = entry["kv"]
    return kv


def raises_metadata(
    data: bytes, *, field: str | None = None, offset: int | None = None, found: Any = None
) -> InvalidMetadataError:
    """Decode ``data``, expect InvalidMetadataError, check where and what it names."""
    with pytest.raises(InvalidMetadataError) as info:
        decode_metadata(data)
    err = info.value
    assert err.section == "kv_metadata"
    assert err.offset is not None
    assert err.found is not None
    if field is not None:
        assert err.field == field
    if offset is not None:
        assert err.offset == offset
    if found is not None:
        assert err.found == found
    return err


def entry(key: bytes, tag: int, payload: bytes) -> bytes:
    return struct.pack("<H", len(key)) + key + bytes((tag,)) + payload


def section(*entries: bytes) -> bytes:
    return struct.pack("<I", len(entries)) + b"".join(entries)


# ---------------------------------------------------------------------------------------------
# Golden bytes
# ---------------------------------------------------------------------------------------------


def test_basic_kv_matches_the_annotated_table() -> None:
    kv, offset = kv_section(BASIC)
    assert offset == 0x2008
    assert kv == BASIC_KV
    assert decode_metadata(kv) == {"producer": "hurray-conformance", "tensor_count": 2}
    assert encode_metadata({"producer": "hurray-conformance", "tensor_count": 2}) == BASIC_KV


_KIND_CHECKS: dict[str, Callable[[object], bool]] = {
    "string": lambda v: type(v) is str,
    "int64": lambda v: type(v) is int,
    "uint64": lambda v: type(v) is UInt64,
    "float64": lambda v: type(v) is float,
    "bool": lambda v: type(v) is bool,
    "bytes": lambda v: type(v) is bytes,
}


@pytest.mark.parametrize("path", ALL_FILES, ids=lambda p: p.name)
def test_fixture_kv_matches_manifest_and_reencodes_exactly(path: Path) -> None:
    kv, offset = kv_section(path)
    decoded = decode_metadata(kv, base_offset=offset)
    expected = manifest_kv(path)
    assert list(decoded) == [e["key"] for e in expected]
    for item in expected:
        value = decoded[item["key"]]
        kind = item["kind"]
        if kind == "array":
            assert isinstance(value, list)
            assert value == item["value"]
            assert all(_KIND_CHECKS[item["elem_kind"]](v) for v in value)
        else:
            # The reference manifest says value_string / value_int, the block-paged one value.
            if "value" in item:
                want = item["value"]
            else:
                want = item["value_string"] if kind == "string" else item["value_int"]
            assert value == want
            assert _KIND_CHECKS[kind](value), (item["key"], type(value))
    assert encode_metadata(decoded) == kv


def test_layer0_kv_written_from_plain_python() -> None:
    kv, _ = kv_section(LAYER0)
    built = encode_metadata(
        {
            "producer": "hurray-wire-golden",
            "kv.num_layers": 1,
            "kv.page_size": UInt64(4),
            "kv.rope_theta": 10000.0,
            "kv.prefix_shared": True,
            "kv.layers": [0],
        }
    )
    assert built == kv
    # Without the wrapper the same value takes the int64 tag: one byte differs.
    plain = encode_metadata({**decode_metadata(kv), "kv.page_size": 4})
    assert len(plain) == len(kv)
    assert [i for i in range(len(kv)) if plain[i] != kv[i]] == [kv.index(b"kv.page_size") + 12]


@pytest.mark.parametrize("path", [BASIC, LAYER0], ids=lambda p: p.name)
def test_codec_agrees_with_the_construct_struct(path: Path) -> None:
    kv, _ = kv_section(path)
    parsed = KvSection.parse(kv)
    decoded = decode_metadata(kv)
    assert [e.key.decode() for e in parsed.entries] == list(decoded)
    assert KvSection.build(parsed) == kv


def test_encoding_is_deterministic_and_follows_mapping_order() -> None:
    entries: dict[str, MetadataValue] = {"b": 1, "a": "x", "c": [1.5, 2.5]}
    assert encode_metadata(entries) == encode_metadata(dict(entries))
    assert list(decode_metadata(encode_metadata(entries))) == ["b", "a", "c"]
    assert encode_metadata({"a": "x", "b": 1}) != encode_metadata({"b": 1, "a": "x"})


# ---------------------------------------------------------------------------------------------
# Each value type, literal bytes
# ---------------------------------------------------------------------------------------------

SCALARS: list[tuple[object, int, bytes]] = [
    ("", 0x01, b"\x00\x00\x00\x00"),
    ("h\u00e9", 0x01, b"\x03\x00\x00\x00h\xc3\xa9"),
    (0, 0x02, bytes(8)),
    (-1, 0x02, b"\xff" * 8),
    (INT64_MIN, 0x02, b"\x00" * 7 + b"\x80"),
    (INT64_MAX, 0x02, b"\xff" * 7 + b"\x7f"),
    (INT64_MAX + 1, 0x03, b"\x00" * 7 + b"\x80"),
    (UINT64_MAX, 0x03, b"\xff" * 8),
    (UInt64(0), 0x03, bytes(8)),
    (UInt64(5), 0x03, b"\x05" + bytes(7)),
    (Int64(5), 0x02, b"\x05" + bytes(7)),
    (1.5, 0x04, struct.pack("<d", 1.5)),
    (-0.0, 0x04, b"\x00" * 7 + b"\x80"),
    (math.inf, 0x04, struct.pack("<d", math.inf)),
    (True, 0x05, b"\x01"),
    (False, 0x05, b"\x00"),
    (b"", 0x06, b"\x00\x00\x00\x00"),
    (b"\x00\xff", 0x06, b"\x02\x00\x00\x00\x00\xff"),
    (["a", ""], 0x07, b"\x01\x02\x00\x00\x00\x01\x00\x00\x00a\x00\x00\x00\x00"),
    ([1, -2], 0x07, b"\x02\x02\x00\x00\x00" + struct.pack("<qq", 1, -2)),
    ([1, UINT64_MAX], 0x07, b"\x03\x02\x00\x00\x00" + struct.pack("<QQ", 1, UINT64_MAX)),
    ([UInt64(1)], 0x07, b"\x03\x01\x00\x00\x00" + struct.pack("<Q", 1)),
    ([Int64(1), 2], 0x07, b"\x02\x02\x00\x00\x00" + struct.pack("<qq", 1, 2)),
    ([0.5], 0x07, b"\x04\x01\x00\x00\x00" + struct.pack("<d", 0.5)),
    ([True, False, True], 0x07, b"\x05\x03\x00\x00\x00\x01\x00\x01"),
    ([b"xy"], 0x07, b"\x06\x01\x00\x00\x00\x02\x00\x00\x00xy"),
]


@pytest.mark.parametrize(("value", "tag", "payload"), SCALARS, ids=repr)
def test_value_bytes(value: MetadataValue, tag: int, payload: bytes) -> None:
    data = section(entry(b"k", tag, payload))
    assert encode_metadata({"k": value}) == data
    decoded = decode_metadata(data)
    assert decoded == {"k": value}
    assert encode_metadata(decoded) == data


def test_decoded_types_name_the_tag() -> None:
    data = encode_metadata({"i": 4, "u": UInt64(4), "a": [UInt64(4)], "b": [4], "j": Int64(4)})
    decoded = decode_metadata(data)
    assert type(decoded["i"]) is int
    assert type(decoded["j"]) is int
    assert type(decoded["u"]) is UInt64
    assert isinstance(decoded["a"], list) and isinstance(decoded["b"], list)
    assert [type(v) for v in decoded["a"]] == [UInt64]
    assert [type(v) for v in decoded["b"]] == [int]


def test_nan_payload_survives() -> None:
    raw = b"\x01\x00\x00\x00\x00\x00\xf8\x7f"  # a quiet NaN with a payload
    data = section(entry(b"f", 0x04, raw), entry(b"g", 0x07, b"\x04\x01\x00\x00\x00" + raw))
    decoded = decode_metadata(data)
    assert isinstance(decoded["f"], float) and math.isnan(decoded["f"])
    assert encode_metadata(decoded) == data


def test_bytes_like_values_and_tuples_are_accepted() -> None:
    data = encode_metadata({"b": b"ab", "a": [b"c"]})
    assert encode_metadata({"b": bytearray(b"ab"), "a": (memoryview(b"c"),)}) == data
    assert decode_metadata(data) == {"b": b"ab", "a": [b"c"]}


def test_empty_mapping_is_a_zero_count_section() -> None:
    assert encode_metadata({}) == b"\x00\x00\x00\x00"
    assert decode_metadata(b"\x00\x00\x00\x00") == {}


def test_decode_accepts_any_buffer_and_reports_file_offsets() -> None:
    kv, offset = kv_section(LAYER0)
    expected = decode_metadata(kv)
    assert decode_metadata(bytearray(kv)) == expected
    assert decode_metadata(memoryview(kv)) == expected
    assert decode_metadata(np.frombuffer(kv, dtype=np.uint8)) == expected
    strided = np.zeros(2 * len(kv), dtype=np.uint8)
    strided[::2] = np.frombuffer(kv, dtype=np.uint8)
    assert decode_metadata(strided[::2]) == expected
    assert decode_metadata(np.frombuffer(kv, dtype=np.uint8).reshape(9, 17)) == expected
    with pytest.raises(InvalidMetadataError) as info:
        decode_metadata(kv[:-1], base_offset=offset)
    assert info.value.offset is not None and offset <= info.value.offset < offset + len(kv)


def test_key_lengths_at_the_limit() -> None:
    longest = "k" * 65535
    assert decode_metadata(encode_metadata({longest: 1})) == {longest: 1}
    with pytest.raises(InvalidMetadataError) as info:
        encode_metadata({"k" * 65536: 1})
    assert info.value.field == "entries[0].key"
    assert info.value.found == "65536 bytes"


# ---------------------------------------------------------------------------------------------
# Decoding: every rejection names the place and the value
# ---------------------------------------------------------------------------------------------

INVALID_VALUE_TAGS = [0x00, *range(0x08, 0x100)]


@pytest.mark.parametrize("tag", INVALID_VALUE_TAGS, ids=lambda t: f"0x{t:02X}")
def test_every_invalid_value_tag(tag: int) -> None:
    data = section(entry(b"k", tag, bytes(16)))
    err = raises_metadata(data, field="entries[0]('k').value_tag", offset=7, found=f"0x{tag:02X}")
    assert ("private" in err.message) == (0xF0 <= tag <= 0xFE)


@pytest.mark.parametrize("tag", [0x00, 0x07, 0x08, 0xF0, 0xFF], ids=lambda t: f"0x{t:02X}")
def test_invalid_array_element_tags(tag: int) -> None:
    data = section(entry(b"k", 0x07, bytes((tag,)) + b"\x01\x00\x00\x00" + bytes(16)))
    raises_metadata(data, field="entries[0]('k').value.element_tag", offset=8, found=f"0x{tag:02X}")


@pytest.mark.parametrize("byte", range(2, 256))
def test_bad_bool_bytes(byte: int) -> None:
    raises_metadata(
        section(entry(b"k", 0x05, bytes((byte,)))),
        field="entries[0]('k').value",
        offset=8,
        found=f"0x{byte:02X}",
    )
    array = section(entry(b"k", 0x07, b"\x05\x03\x00\x00\x00" + bytes((1, 0, byte))))
    raises_metadata(array, field="entries[0]('k').value[2]", offset=15, found=f"0x{byte:02X}")


@pytest.mark.parametrize("path", [BASIC, LAYER0], ids=lambda p: p.name)
def test_truncation_at_every_length(path: Path) -> None:
    kv, offset = kv_section(path)
    for cut in range(len(kv)):
        with pytest.raises(InvalidMetadataError) as info:
            decode_metadata(kv[:cut], base_offset=offset)
        err = info.value
        assert err.offset is not None and offset <= err.offset <= offset + cut, cut
        assert err.field is not None
        assert err.found is not None


@pytest.mark.parametrize("path", [BASIC, LAYER0], ids=lambda p: p.name)
def test_trailing_bytes(path: Path) -> None:
    kv, _ = kv_section(path)
    for extra in (b"\x00", bytes(8), b"\x01\x00k\x05\x01"):
        raises_metadata(
            kv + extra, field="kv_count", offset=len(kv), found=f"{len(extra)} trailing bytes"
        )


def test_count_too_small_leaves_trailing_bytes_and_too_large_truncates() -> None:
    kv, _ = kv_section(BASIC)
    raises_metadata(b"\x01" + kv[1:], field="kv_count", offset=4 + 2 + 8 + 1 + 4 + 18)
    raises_metadata(b"\x03" + kv[1:], field="entries[2].key_length", offset=len(kv))


def test_duplicate_key() -> None:
    data = section(
        entry(b"k", 0x05, b"\x01"), entry(b"j", 0x05, b"\x01"), entry(b"k", 0x05, b"\x00")
    )
    err = raises_metadata(data, field="entries[2].key", offset=4 + 5 + 5 + 2, found="'k'")
    assert "entries[0]" in err.message


def test_duplicate_key_is_byte_exact() -> None:
    # Distinct byte strings are distinct keys, even when they look alike once normalised.
    data = section(entry("é".encode(), 0x05, b"\x01"), entry("e\u0301".encode(), 0x05, b"\x01"))
    assert len(decode_metadata(data)) == 2


def test_empty_key() -> None:
    data = section(entry(b"a", 0x05, b"\x01"), entry(b"", 0x05, b"\x01"))
    raises_metadata(data, field="entries[1].key_length", offset=9, found=0)


@pytest.mark.parametrize(
    "bad",
    [b"\xff", b"\xc0\x80", b"\xed\xa0\x80", b"a\xe2\x82", b"\xf4\x90\x80\x80"],
    ids=["invalid-start", "overlong", "surrogate", "truncated-seq", "above-max"],
)
def test_invalid_utf8(bad: bytes) -> None:
    bad_at = 1 if bad.startswith(b"a") else 0
    key = section(entry(bad, 0x05, b"\x01"))
    err = raises_metadata(key, field="entries[0].key", offset=6 + bad_at)
    assert "UTF-8" in err.message
    value = section(entry(b"k", 0x01, struct.pack("<I", len(bad)) + bad))
    raises_metadata(value, field="entries[0]('k').value", offset=12 + bad_at)
    element = section(
        entry(b"k", 0x07, b"\x01\x01\x00\x00\x00" + struct.pack("<I", len(bad)) + bad)
    )
    raises_metadata(element, field="entries[0]('k').value[0]", offset=17 + bad_at)


HUGE = 0xFFFF_FFFF


@pytest.mark.parametrize(
    ("data", "field"),
    [
        (struct.pack("<I", HUGE), "entries[0].key_length"),
        (section(entry(b"k", 0x01, struct.pack("<I", HUGE) + b"abc")), "entries[0]('k').value"),
        (section(entry(b"k", 0x06, struct.pack("<I", HUGE) + b"abc")), "entries[0]('k').value"),
        (section(b"\xff\xffabc"), "entries[0].key"),
        *[
            (
                section(entry(b"k", 0x07, bytes((tag,)) + struct.pack("<I", HUGE) + bytes(64))),
                "entries[0]('k').value.count",
            )
            for tag in range(1, 7)
        ],
    ],
    ids=["kv_count", "string", "bytes", "key", *[f"array-{t}" for t in range(1, 7)]],
)
def test_huge_counts_are_refused_without_allocating(data: bytes, field: str) -> None:
    tracemalloc.start()
    try:
        raises_metadata(data, field=field)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


def test_array_count_checked_against_element_size() -> None:
    # 3 int64 elements need 24 bytes; 23 are there.
    data = section(entry(b"k", 0x07, b"\x02\x03\x00\x00\x00" + bytes(23)))
    raises_metadata(data, field="entries[0]('k').value.count", offset=9, found=3)
    # Strings: the count passes the 4-bytes-each test, then the third length runs out.
    data = section(entry(b"k", 0x07, b"\x01\x03\x00\x00\x00" + bytes(8) + b"\x05\x00\x00\x00"))
    raises_metadata(data, field="entries[0]('k').value[2]", offset=25)


def test_empty_arrays_decode_but_do_not_encode() -> None:
    for tag in range(1, 7):
        data = section(entry(b"k", 0x07, bytes((tag,)) + bytes(4)))
        assert decode_metadata(data) == {"k": []}
    with pytest.raises(InvalidMetadataError):
        encode_metadata(decode_metadata(data))


@pytest.mark.parametrize("data", ["abc", 12, None, [1, 2]], ids=repr)
def test_decode_rejects_non_buffers(data: object) -> None:
    with pytest.raises(ArgumentTypeError):
        decode_metadata(data)


@pytest.mark.parametrize("base", [-1, 1.0, True, "0"], ids=repr)
def test_decode_rejects_bad_base_offset(base: object) -> None:
    with pytest.raises(ArgumentTypeError):
        decode_metadata(b"\x00\x00\x00\x00", base_offset=base)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# Encoding rejections
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "field", "found"),
    [
        ([], "entries[0]('k').value", "[]"),
        ([1, 2.0], "entries[0]('k').value[1]", "float"),
        ([1.0, 2], "entries[0]('k').value[1]", "int"),
        ([True, 1], "entries[0]('k').value[1]", "int"),
        ([1, True], "entries[0]('k').value[1]", "bool"),
        (["a", b"a"], "entries[0]('k').value[1]", "bytes"),
        ([Int64(1), UInt64(1)], "entries[0]('k').value", "Int64 at [0], UInt64 at [1]"),
        ([-1, INT64_MAX + 1], "entries[0]('k').value[0]", -1),
        ([UInt64(1), -1], "entries[0]('k').value[1]", -1),
        ([Int64(1), INT64_MAX + 1], "entries[0]('k').value[1]", INT64_MAX + 1),
        ([UINT64_MAX + 1], "entries[0]('k').value[0]", UINT64_MAX + 1),
        (INT64_MIN - 1, "entries[0]('k').value", INT64_MIN - 1),
        (UINT64_MAX + 1, "entries[0]('k').value", UINT64_MAX + 1),
        ("\ud800", "entries[0]('k').value", "'\\ud800'"),
        (["ok", "\udfff"], "entries[0]('k').value[1]", "'\\udfff'"),
    ],
    ids=repr,
)
def test_encode_rejects(value: Any, field: str, found: Any) -> None:
    with pytest.raises(InvalidMetadataError) as info:
        encode_metadata({"k": value})
    assert info.value.section == "kv_metadata"
    assert info.value.field == field
    assert info.value.found == found


@pytest.mark.parametrize(
    ("entries", "error"),
    [
        ({"": 1}, InvalidMetadataError),
        ({"\udc80": 1}, InvalidMetadataError),
        ({1: 1}, ArgumentTypeError),
        ({b"k": 1}, ArgumentTypeError),
        ({"k": None}, ArgumentTypeError),
        ({"k": {"a": 1}}, ArgumentTypeError),
        ({"k": [[1]]}, ArgumentTypeError),
        ({"k": [None]}, ArgumentTypeError),
        ({"k": np.int64(3)}, ArgumentTypeError),
        ({"k": np.bool_(True)}, ArgumentTypeError),
        ([("k", 1)], ArgumentTypeError),
        ("k", ArgumentTypeError),
    ],
    ids=repr,
)
def test_encode_rejects_keys_and_types(entries: Any, error: type[Exception]) -> None:
    with pytest.raises(error) as info:
        encode_metadata(entries)
    assert isinstance(info.value, HurrayWireError)


def test_u32_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metadata, "U32_MAX", 3)
    with pytest.raises(InvalidMetadataError, match="u32 length"):
        encode_metadata({"k": "abcd"})
    with pytest.raises(InvalidMetadataError, match="u32 length"):
        encode_metadata({"k": b"abcd"})
    with pytest.raises(InvalidMetadataError, match="u32 count"):
        encode_metadata({"k": [1, 2, 3, 4]})
    with pytest.raises(InvalidMetadataError, match="u32 kv_count"):
        encode_metadata({"a": 1, "b": 2, "c": 3, "d": 4})
    monkeypatch.setattr(metadata, "U32_MAX", 20)
    with pytest.raises(InvalidMetadataError, match="kv_length"):
        encode_metadata({"k": 1, "j": 2})


class TestWrappers:
    def test_ranges(self) -> None:
        assert Int64(INT64_MIN) == INT64_MIN and Int64(INT64_MAX) == INT64_MAX
        assert UInt64(0) == 0 and UInt64(UINT64_MAX) == UINT64_MAX
        for bad in (INT64_MIN - 1, INT64_MAX + 1):
            with pytest.raises(InvalidMetadataError):
                Int64(bad)
        for bad in (-1, UINT64_MAX + 1):
            with pytest.raises(InvalidMetadataError):
                UInt64(bad)

    @pytest.mark.parametrize("bad", [1.0, "1", True, None], ids=repr)
    def test_types(self, bad: Any) -> None:
        with pytest.raises(ArgumentTypeError):
            Int64(bad)
        with pytest.raises(ArgumentTypeError):
            UInt64(bad)

    def test_behaves_as_int(self) -> None:
        assert UInt64(np.uint64(7)) == 7 and hash(UInt64(7)) == hash(7)
        assert repr(UInt64(7)) == "UInt64(7)" and repr(Int64(-7)) == "Int64(-7)"
        assert str(UInt64(7)) == "7" and f"{Int64(-7)}" == "-7"
        assert json.dumps({"a": UInt64(7)}) == '{"a": 7}'


# ---------------------------------------------------------------------------------------------
# Property tests
# ---------------------------------------------------------------------------------------------

keys = st.text(min_size=1, max_size=20)
floats = st.floats(allow_nan=True, allow_infinity=True)
scalars = st.one_of(
    st.text(max_size=20),
    st.integers(INT64_MIN, UINT64_MAX),
    st.integers(0, UINT64_MAX).map(UInt64),
    st.integers(INT64_MIN, INT64_MAX).map(Int64),
    floats,
    st.booleans(),
    st.binary(max_size=20),
)
arrays = st.one_of(
    st.lists(st.text(max_size=8), min_size=1, max_size=6),
    st.lists(st.integers(INT64_MIN, INT64_MAX), min_size=1, max_size=6),
    st.lists(st.integers(0, UINT64_MAX), min_size=1, max_size=6),
    st.lists(st.integers(0, UINT64_MAX).map(UInt64), min_size=1, max_size=6),
    st.lists(floats, min_size=1, max_size=6),
    st.lists(st.booleans(), min_size=1, max_size=6),
    st.lists(st.binary(max_size=8), min_size=1, max_size=6),
)
documents = st.dictionaries(keys, st.one_of(scalars, arrays), max_size=8)


def same(decoded: object, original: object) -> bool:
    """Equal values (NaN equal to NaN), and a bool only where a bool went in."""
    if isinstance(original, (list, tuple)):
        return (
            isinstance(decoded, list)
            and len(decoded) == len(original)
            and all(same(d, o) for d, o in zip(decoded, original, strict=True))
        )
    if isinstance(original, float) and math.isnan(original):
        return isinstance(decoded, float) and math.isnan(decoded)
    return decoded == original and isinstance(decoded, bool) == isinstance(original, bool)


def is_uint64(value: object) -> bool:
    """Whether encoding ``value`` picks tag 03 (for an array: its element tag)."""
    if isinstance(value, list):
        return any(is_uint64(v) for v in value) and not any(isinstance(v, Int64) for v in value)
    if isinstance(value, bool) or not isinstance(value, int):
        return False
    return isinstance(value, UInt64) or value > INT64_MAX


@given(documents)
def test_valid_documents_round_trip(doc: dict[str, MetadataValue]) -> None:
    data = encode_metadata(doc)
    decoded = decode_metadata(data)
    assert list(decoded) == list(doc)
    for key, value in doc.items():
        got = decoded[key]
        assert same(got, value)
        got_items = got if isinstance(got, list) else [got]
        assert all(
            isinstance(g, UInt64) == is_uint64(value)
            for g in got_items
            if isinstance(g, int) and not isinstance(g, bool)
        )
    assert encode_metadata(decoded) == data
    parsed = KvSection.parse(data)
    assert [e.key for e in parsed.entries] == [k.encode() for k in doc]
    assert KvSection.build(parsed) == data


def _has_empty_array(doc: dict[str, MetadataValue]) -> bool:
    return any(isinstance(v, list) and not v for v in doc.values())


@settings(suppress_health_check=[HealthCheck.too_slow], max_examples=300)
@given(st.data())
def test_mutated_sections_decode_or_raise_invalid_metadata(data: st.DataObject) -> None:
    base = data.draw(
        st.one_of(
            st.sampled_from(FIXTURE_SECTIONS),
            documents.map(encode_metadata),
        )
    )
    mutated = bytearray(base)
    for _ in range(data.draw(st.integers(1, 4))):
        action = data.draw(st.sampled_from(["set", "insert", "delete", "truncate"]))
        position = data.draw(st.integers(0, max(len(mutated) - 1, 0)))
        if action == "set" and mutated:
            mutated[position] = data.draw(st.integers(0, 255))
        elif action == "insert":
            mutated[position:position] = data.draw(st.binary(min_size=1, max_size=4))
        elif action == "delete" and mutated:
            del mutated[position]
        else:
            del mutated[position:]
    try:
        decoded = decode_metadata(bytes(mutated))
    except InvalidMetadataError as err:
        assert err.offset is not None and 0 <= err.offset <= len(mutated)
        return
    if not _has_empty_array(decoded):
        assert encode_metadata(decoded) == bytes(mutated)


@given(st.binary(max_size=64))
def test_random_bytes_decode_or_raise_invalid_metadata(blob: bytes) -> None:
    with contextlib.suppress(InvalidMetadataError):
        decode_metadata(blob)
