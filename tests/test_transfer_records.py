"""Transfer control records (hurray_wire.transport.records, structs in wire/transfer.py).

Round trips of every kind, pinned bytes, and the rejection of every field: a record is
input from the peer and is refused with an InvalidTransferRecordError (a TransportError)
naming the field. Needs no NIXL.
"""

from __future__ import annotations

import struct

import pytest
import xxhash

import hurray_wire as hw
from hurray_wire.errors import InvalidTransferRecordError
from hurray_wire.transport.records import (
    MAX_SEGMENTS,
    Segment,
    TransferRecord,
    decode_record,
    encode_record,
)
from hurray_wire.wire import transfer as w

SEGMENTS = (Segment(0, 512, 0x7F0000001000), Segment(512, 4096, 0x7F0000200000, 1))
OFFER = TransferRecord(
    "offer", 0x1122334455667788, 3, "value", write=True, total_length=4608,
    pool_offset=512, pool_length=4096, segments=SEGMENTS,
)  # fmt: skip
RECORDS = [
    OFFER,
    TransferRecord("offer", 1, 0, "key", total_length=64, segments=(Segment(0, 64, 4096),)),
    TransferRecord(
        "offer", 2, 1, "key", ready=True, total_length=64, segments=(Segment(0, 64, 4096),)
    ),
    TransferRecord("grant", 7, 2, "fused", total_length=4608, segments=SEGMENTS),
    TransferRecord("ready", 7, 2, "key", header=bytes(range(117))),
    TransferRecord("done", 7, 0xFFFFFFFE, "value"),
    TransferRecord("abort", 7, reason="sender died: \u00e9t\u00e9"),
    TransferRecord("abort", 7, 5, "key", reason=""),
]


def resealed(data: bytes) -> bytes:
    """``data`` with its trailing checksum recomputed (to reach the checks behind it)."""
    return data[:-8] + struct.pack("<Q", xxhash.xxh3_64_intdigest(data[:-8]))


def patched(data: bytes, offset: int, value: bytes) -> bytes:
    return resealed(data[:offset] + value + data[offset + len(value) :])


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: r.kind)
def test_round_trip(record: TransferRecord) -> None:
    data = encode_record(record)
    assert decode_record(data) == record
    assert decode_record(memoryview(bytearray(data))) == record
    tail = len(record.reason.encode()) + len(record.header)
    assert len(data) == 64 + 32 * len(record.segments) + tail + 8
    assert encode_record(decode_record(data)) == data


def test_pinned_bytes() -> None:
    head = bytes(range(64))
    data = encode_record(TransferRecord("ready", 0x0102030405060708, 9, "value", header=head))
    assert data[:-8] == (
        b"HRWT\x02\x00\x02\x00" + struct.pack("<I", 136) + bytes.fromhex("0807060504030201")
        + struct.pack("<I", 9) + b"\x01\x00\x00\x00" + bytes(24) + bytes(2) + b"\x40\x00"
        + bytes(8) + head
    )  # fmt: skip
    assert data[-8:] == struct.pack("<Q", xxhash.xxh3_64_intdigest(data[:-8]))
    assert w.TRANSFER_RECORD.sizeof() == 64 and w.TRANSFER_SEGMENT.sizeof() == 32


def test_errors_are_transport_errors() -> None:
    assert issubclass(InvalidTransferRecordError, hw.errors.TransportError)
    assert issubclass(hw.errors.TransportError, hw.HurrayWireError)


@pytest.mark.parametrize("cut", [0, 1, 63, 71, 100, 135])
def test_truncation(cut: int) -> None:
    data = encode_record(OFFER)
    with pytest.raises(InvalidTransferRecordError):
        decode_record(data[:cut])
    with pytest.raises(InvalidTransferRecordError, match="record_length"):
        decode_record(data + b"\0")


def test_checksum() -> None:
    data = bytearray(encode_record(OFFER))
    data[20] ^= 1
    with pytest.raises(InvalidTransferRecordError, match="checksum mismatch") as info:
        decode_record(bytes(data))
    assert info.value.field == "checksum"
    data = bytearray(encode_record(OFFER))
    data[-1] ^= 1
    with pytest.raises(InvalidTransferRecordError, match="checksum mismatch"):
        decode_record(bytes(data))


# (offset, new bytes, field named in the error) on the encoded OFFER (two segments)
FIELD_REJECTS = [
    (0, b"HRWX", "magic"),
    (4, b"\x01", "version_major"),  # a version-1 peer (it READs the header after ready)
    (4, b"\x03", "version_major"),
    (6, b"\x00", "kind"),
    (6, b"\x06", "kind"),
    (7, b"\x04", "flags"),
    (8, struct.pack("<I", 199), "record_length"),
    (24, b"\x03", "kv_role"),
    (25, b"\x01", "_reserved"),
    (36, struct.pack("<Q", 513), "pool_offset"),
    (44, struct.pack("<Q", 4097), "pool_length"),
    (56, b"\x01", "_reserved"),
    (63, b"\x01", "_reserved"),
    (28, struct.pack("<Q", 4672), "segment_count"),  # total_length above the segments
    (28, struct.pack("<Q", 4600), "total_length"),  # not a multiple of 64
    (28, struct.pack("<Q", 0), "total_length"),
    (64, struct.pack("<Q", 8), "segment[0].blob_offset"),
    (72, struct.pack("<Q", 0), "segment[0].length"),
    (72, struct.pack("<Q", 448), "segment[1].blob_offset"),  # a gap between segments
    (80, struct.pack("<Q", 0), "segment[0].address"),
    (80, struct.pack("<Q", (1 << 64) - 8), "segment[0].address"),
    (92, b"\x01", "segment[0]._reserved"),
    (104, struct.pack("<Q", 5000), "segment[1].length"),  # past total_length
]


@pytest.mark.parametrize(("offset", "value", "field"), FIELD_REJECTS)
def test_every_field_is_checked(offset: int, value: bytes, field: str) -> None:
    bad = patched(encode_record(OFFER), offset, value)
    with pytest.raises(InvalidTransferRecordError) as info:
        decode_record(bad)
    assert info.value.field == field, str(info.value)


def test_count_fields_must_agree_with_the_length() -> None:
    data = encode_record(OFFER)
    for offset, value in ((52, struct.pack("<H", 3)), (54, struct.pack("<H", 1))):
        with pytest.raises(InvalidTransferRecordError, match="record_length"):
            decode_record(patched(data, offset, value))


def test_kind_rules() -> None:
    ready = encode_record(TransferRecord("ready", 1, 0, "key", header=bytes(64)))
    with pytest.raises(InvalidTransferRecordError, match="no total_length"):
        decode_record(patched(ready, 28, struct.pack("<Q", 64)))
    with pytest.raises(InvalidTransferRecordError, match="write or ready flag"):
        decode_record(patched(ready, 7, b"\x01"))
    with pytest.raises(InvalidTransferRecordError, match="names its layer"):
        decode_record(patched(ready, 24, b"\xff"))
    with pytest.raises(InvalidTransferRecordError, match="no layer; pass None"):
        TransferRecord("ready", 1, 0xFFFFFFFF, "key")
    abort = encode_record(TransferRecord("abort", 1, reason="ab"))
    with pytest.raises(InvalidTransferRecordError, match="not UTF-8"):
        decode_record(resealed(abort[:64] + b"\xff\xfe" + abort[66:]))
    with pytest.raises(InvalidTransferRecordError, match="only an abort"):
        TransferRecord("done", 1, 0, "key", reason="x")
    with pytest.raises(InvalidTransferRecordError, match="reason too long"):
        TransferRecord("abort", 1, reason="x" * 1025)
    with pytest.raises(InvalidTransferRecordError, match="segment count"):
        TransferRecord("offer", 1, 0, "key", total_length=64, segments=())
    many = tuple(Segment(64 * k, 64, 4096 + 64 * k) for k in range(MAX_SEGMENTS + 1))
    with pytest.raises(InvalidTransferRecordError, match="segment count"):
        TransferRecord("grant", 1, 0, "key", total_length=64 * len(many), segments=many)
    with pytest.raises(InvalidTransferRecordError, match="pool_offset without"):
        TransferRecord("offer", 1, 0, "key", total_length=128, pool_offset=64,
                       segments=(Segment(0, 128, 4096),))  # fmt: skip
    with pytest.raises(InvalidTransferRecordError, match="unknown record kind"):
        TransferRecord("hello", 1, 0, "key")
    with pytest.raises(InvalidTransferRecordError, match="unknown kv_role"):
        TransferRecord("ready", 1, 0, "query")
    with pytest.raises(InvalidTransferRecordError, match="session out of range"):
        TransferRecord("ready", 1 << 64, 0, "key")


def test_argument_types() -> None:
    with pytest.raises(hw.errors.ArgumentTypeError):
        decode_record("HRWT")
    with pytest.raises(hw.errors.ArgumentTypeError):
        encode_record(b"x")  # type: ignore[arg-type]
    with pytest.raises(hw.errors.ArgumentTypeError):
        TransferRecord("ready", True, 0, "key")
    with pytest.raises(hw.errors.ArgumentTypeError):
        TransferRecord("offer", 1, 0, "key", total_length=64, segments=[Segment(0, 64, 1)])  # type: ignore[arg-type]


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: r.kind)
def test_construct_structs_agree(record: TransferRecord) -> None:
    """The codec packs the derived struct.Struct; the construct structs read the same."""
    data = encode_record(record)
    head = w.TRANSFER_RECORD.parse(data[:64])
    assert w.RECORD_KINDS[head.kind] == record.kind
    assert (head.session, head.total_length, head.segment_count) == (
        record.session, record.total_length, len(record.segments),
    )  # fmt: skip
    assert head.record_length == len(data)
    for k, s in enumerate(record.segments):
        seg = w.TRANSFER_SEGMENT.parse(data[64 + 32 * k : 96 + 32 * k])
        assert (seg.blob_offset, seg.length, seg.address, seg.device_id) == (
            s.blob_offset, s.length, s.address, s.device_id,
        )  # fmt: skip
    assert w.RECORD_CHECKSUM.parse(data[-8:]).checksum == xxhash.xxh3_64_intdigest(data[:-8])


def test_a_version_1_peer_and_a_ready_record_without_its_header_are_refused() -> None:
    """Version 2 moved the blob header into the ready record: an older peer's records are
    refused by version (naming what changed), never read as if they meant the same."""
    old = patched(encode_record(TransferRecord("done", 1, 0, "key")), 4, b"\x01")
    with pytest.raises(InvalidTransferRecordError, match="another hurray-wire release") as info:
        decode_record(old)
    assert (info.value.field, info.value.found, info.value.expected) == ("version_major", 1, 2)
    for header in (b"", bytes(63), bytes(0x10000)):
        with pytest.raises(InvalidTransferRecordError, match="carries the blob header"):
            TransferRecord("ready", 1, 0, "key", header=header)
    with pytest.raises(InvalidTransferRecordError, match="only a ready record"):
        TransferRecord("done", 1, 0, "key", header=bytes(64))
    with pytest.raises(hw.errors.ArgumentTypeError, match="header must be bytes"):
        TransferRecord("ready", 1, 0, "key", header=bytearray(64))  # type: ignore[arg-type]
