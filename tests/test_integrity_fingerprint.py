"""The engine fingerprint: validation, the reserved metadata entry, compatibility checks."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
import xxhash
from hypothesis import given, settings, strategies as st

import hurray_wire as hw
from hurray_wire.errors import (
    ArgumentTypeError,
    HurrayWireError,
    IncompatibleFingerprintError,
    InvalidMetadataError,
)
from hurray_wire.integrity import (
    FINGERPRINT_METADATA_KEY,
    EngineFingerprint,
    check_compatible,
    decode_fingerprint,
    differences,
    encode_fingerprint,
    fingerprint_from_metadata,
    fingerprint_to_metadata,
)
from hurray_wire.metadata import UInt64, encode_metadata

BASE: dict[str, Any] = {
    "model_id": "m",
    "engine": "vllm",
    "engine_version": "0.9",
    "kv_cache_layout": "NHD",
    "cache_dtype": "fp16",
    "block_size": 16,
    "tp_rank": 0,
    "tp_size": 2,
}


def fp(**kw: Any) -> EngineFingerprint:
    return EngineFingerprint(**{**BASE, **kw})


GOLDEN_BODY = (
    b"\x08\x00\x00\x00"
    b"\x08\x00model_id\x01\x01\x00\x00\x00m"
    b"\x06\x00engine\x01\x04\x00\x00\x00vllm"
    b"\x0e\x00engine_version\x01\x03\x00\x00\x000.9"
    b"\x0f\x00kv_cache_layout\x01\x03\x00\x00\x00NHD"
    b"\x0b\x00cache_dtype\x01\x04\x00\x00\x00fp16"
    b"\x0a\x00block_size\x02\x10\x00\x00\x00\x00\x00\x00\x00"
    b"\x07\x00tp_rank\x02\x00\x00\x00\x00\x00\x00\x00\x00"
    b"\x07\x00tp_size\x02\x02\x00\x00\x00\x00\x00\x00\x00"
)
GOLDEN = (
    b"HWFP\x01\x00\x00\x00"
    + len(GOLDEN_BODY).to_bytes(4, "little")
    + b"\x00\x00\x00\x00"
    + xxhash.xxh3_64_intdigest(GOLDEN_BODY).to_bytes(8, "little")
    + GOLDEN_BODY
)


def test_golden_bytes() -> None:
    assert encode_fingerprint(fp()) == GOLDEN
    assert GOLDEN[:16] == b"HWFP\x01\x00\x00\x00\xa5\x00\x00\x00\x00\x00\x00\x00"
    assert GOLDEN[16:24] == b"\x08$F\xad\xa5\x88\x89S"  # xxh3_64 of the body, frozen
    assert decode_fingerprint(GOLDEN) == fp()


def test_extras_are_sorted_and_round_trip() -> None:
    a = fp(extras={"z": 1, "a": True, "m": 0.5, "s": "x"})
    b = fp(extras={"s": "x", "m": 0.5, "a": True, "z": 1})
    assert encode_fingerprint(a) == encode_fingerprint(b)
    body = encode_fingerprint(a)[24:]
    assert body.index(b"extra.a") < body.index(b"extra.m") < body.index(b"extra.z")
    back = decode_fingerprint(encode_fingerprint(a))
    assert back == a and dict(back.extras) == {"a": True, "m": 0.5, "s": "x", "z": 1}
    assert type(back.extras["a"]) is bool and type(back.extras["z"]) is int


def test_metadata_entry_survives_a_blob() -> None:
    f = fp(extras={"sliding_window": 4096})
    meta = fingerprint_to_metadata(f)
    assert list(meta) == [FINGERPRINT_METADATA_KEY] == ["hurray.engine_fingerprint"]
    pool = np.zeros((2, 4, 1, 8), np.float16)
    t = hw.BlockPagedTensor.from_arrays(pool, [0, 1], [0, 2], metadata={"x": 1, **meta})
    back = hw.decode(hw.encode(t))
    assert fingerprint_from_metadata(back.metadata) == f
    assert fingerprint_from_metadata({"x": 1}) is None


def test_hashable_and_frozen() -> None:
    assert hash(fp(extras={"a": 1})) == hash(fp(extras={"a": 1}))
    with pytest.raises(dataclasses.FrozenInstanceError):
        fp().model_id = "x"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"model_id": ""}, "model_id"),
        ({"engine": 3}, "engine"),
        ({"cache_dtype": None}, "cache_dtype"),
        ({"kv_cache_layout": "x" * 2000}, "kv_cache_layout"),
        ({"engine_version": "\udcff"}, "engine_version"),
        ({"block_size": 0}, "block_size"),
        ({"block_size": True}, "block_size"),
        ({"block_size": 16.0}, "block_size"),
        ({"tp_size": 0}, "tp_size"),
        ({"tp_rank": -1}, "tp_rank"),
        ({"tp_rank": 2}, "tp_rank"),
        ({"tp_size": 2**63}, "tp_size"),
        ({"extras": [("a", 1)]}, "extras"),
        ({"extras": {1: 1}}, "extras key"),
        ({"extras": {"": 1}}, "extras key"),
        ({"extras": {"a": None}}, "extras['a']"),
        ({"extras": {"a": b"x"}}, "extras['a']"),
        ({"extras": {"a": float("nan")}}, "extras['a']"),
        ({"extras": {"a": 2**64}}, "extras['a']"),
        ({"extras": {str(i): i for i in range(65)}}, "extras"),
    ],
)
def test_construction_refuses(kw: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidMetadataError) as info:
        fp(**kw)
    assert info.value.field == field
    assert field.split("[")[0] in str(info.value)


def test_differences_name_every_field_with_both_values() -> None:
    a = fp(extras={"a": 1, "b": "x"})
    b = fp(model_id="m2", tp_size=4, tp_rank=3, block_size=32, extras={"a": True, "c": 2})
    assert differences(a, b) == {
        "model_id": ("m", "m2"),
        "block_size": (16, 32),
        "tp_rank": (0, 3),
        "tp_size": (2, 4),
        "extras.a": (1, True),
        "extras.b": ("x", None),
        "extras.c": (None, 2),
    }
    with pytest.raises(IncompatibleFingerprintError) as info:
        check_compatible(a, b)
    err = info.value
    assert "tp_rank" not in err.differences  # ignored by default
    assert set(err.differences) == {
        "model_id",
        "block_size",
        "tp_size",
        "extras.a",
        "extras.b",
        "extras.c",
    }
    for name in err.differences:
        assert name in str(err)
    assert "'m' != 'm2'" in str(err) and "16 != 32" in str(err)
    assert isinstance(err, HurrayWireError)


def test_compatible_and_ignore() -> None:
    check_compatible(fp(), fp(tp_rank=1))
    check_compatible(fp(), fp(engine_version="1.0"), ignore=("tp_rank", "engine_version"))
    check_compatible(fp(extras={"a": 1}), fp(), ignore=("extras",))
    with pytest.raises(IncompatibleFingerprintError):
        check_compatible(fp(), fp(tp_rank=1), ignore=())
    with pytest.raises(ArgumentTypeError):
        differences(fp(), "x")  # type: ignore[arg-type]


# -- decoding hostile bytes ------------------------------------------------------------------


@pytest.mark.parametrize("cut", range(len(GOLDEN)))
def test_truncated_at_every_byte(cut: int) -> None:
    with pytest.raises(InvalidMetadataError):
        decode_fingerprint(GOLDEN[:cut])


@pytest.mark.parametrize("at", range(len(GOLDEN)))
def test_flipped_byte_anywhere(at: int) -> None:
    data = bytearray(GOLDEN)
    data[at] ^= 0x01
    with pytest.raises(InvalidMetadataError):
        decode_fingerprint(bytes(data))


def _record(body: bytes) -> bytes:
    return (
        b"HWFP\x01\x00\x00\x00"
        + len(body).to_bytes(4, "little")
        + bytes(4)
        + xxhash.xxh3_64_intdigest(body).to_bytes(8, "little")
        + body
    )


@pytest.mark.parametrize(
    ("entries", "match"),
    [
        ({k: v for k, v in BASE.items() if k != "engine"}, "lacks"),
        ({**BASE, "colour": "red"}, "unknown"),
        ({**BASE, "tp_rank": 5}, "tp_rank"),
        ({**BASE, "block_size": "16"}, "block_size"),
        ({**BASE, "block_size": UInt64(16)}, "canonical"),
        (dict(reversed(list(BASE.items()))), "canonical"),
        ({**BASE, "extra.b": 1, "extra.a": 2}, "canonical"),
        ({**BASE, "extra.a": [1, 2]}, "extras"),
    ],
)
def test_well_checksummed_but_wrong_bodies(entries: dict[str, Any], match: str) -> None:
    with pytest.raises(InvalidMetadataError, match=match):
        decode_fingerprint(_record(encode_metadata(entries)))


def test_other_rejections() -> None:
    with pytest.raises(InvalidMetadataError, match="version"):
        decode_fingerprint(GOLDEN[:4] + b"\x02" + GOLDEN[5:])
    with pytest.raises(InvalidMetadataError, match="body_length"):
        decode_fingerprint(GOLDEN + b"\0")
    with pytest.raises(InvalidMetadataError, match="body"):
        decode_fingerprint(_record(b"\x01\x00\x00\x00\xff"))
    with pytest.raises(InvalidMetadataError, match="bytes value"):
        fingerprint_from_metadata({FINGERPRINT_METADATA_KEY: "HWFP"})
    with pytest.raises(ArgumentTypeError):
        fingerprint_from_metadata([])  # type: ignore[arg-type]
    with pytest.raises(ArgumentTypeError):
        decode_fingerprint("HWFP")
    with pytest.raises(ArgumentTypeError):
        encode_fingerprint(BASE)  # type: ignore[arg-type]


_extra = st.one_of(
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=10),
)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.text(alphabet=st.characters(codec="utf-8"), min_size=1, max_size=12),
        min_size=5,
        max_size=5,
    ),
    st.integers(1, 2**20),
    st.integers(1, 64).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n - 1))),
    st.dictionaries(
        st.text(alphabet=st.characters(codec="utf-8"), min_size=1, max_size=8), _extra, max_size=6
    ),
)
def test_round_trip_property(
    strings: list[str], block: int, tp: tuple[int, int], extras: dict[str, Any]
) -> None:
    model_id, engine, version, layout, dtype = strings
    f = EngineFingerprint(model_id, engine, version, layout, dtype, block, tp[1], tp[0], extras)
    data = encode_fingerprint(f)
    back = decode_fingerprint(data)
    assert back == f and encode_fingerprint(back) == data
