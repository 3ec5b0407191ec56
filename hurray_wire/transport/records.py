"""Transfer control records: validated model <-> bytes (structs in hurray_wire.wire.transfer).

The records are the only thing one side of a NIXL transfer learns from the other besides the
blob bytes themselves, so they are parsed like any other hostile input: exact length,
magic, version, known kind and flags, zero reserved bytes, a checksum, and segments that
tile the blob exactly. Nothing here imports NIXL; nothing here uses pickle.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import construct as c
import xxhash

from hurray_wire.errors import ArgumentTypeError, InvalidTransferRecordError
from hurray_wire.wire import transfer as w

__all__ = [
    "MAX_SEGMENTS",
    "MAX_REASON_BYTES",
    "ROLE_CODES",
    "Segment",
    "TransferRecord",
    "encode_record",
    "decode_record",
]

MAX_SEGMENTS = 256  # far above what one blob needs (header, pool, index arrays, padding)
MAX_REASON_BYTES = 1024
ROLE_CODES = {"key": 0, "value": 1, "fused": 2}
_ROLE_NAMES = {code: name for name, code in ROLE_CODES.items()}
_FIXED = w.TRANSFER_RECORD.sizeof()  # 64
_SEGMENT = w.TRANSFER_SEGMENT.sizeof()  # 32
_U64_MAX = (1 << 64) - 1
_ALIGNMENT = 64  # blob total_length and section offsets are multiples of 64


@dataclass(frozen=True)
class Segment:
    """One contiguous piece ``[blob_offset, blob_offset + length)`` of a blob at ``address``
    in the memory of the record's author."""

    blob_offset: int
    length: int
    address: int
    device_id: int = 0


@dataclass(frozen=True)
class TransferRecord:
    """One control record; ``layer``/``role`` are None for a record about the whole session."""

    kind: str  # offer, ready, grant, done, abort
    session: int
    layer: int | None = None
    role: str | None = None
    write: bool = False  # offer: the sender will WRITE (else the receiver READs)
    total_length: int = 0
    pool_offset: int = 0
    pool_length: int = 0
    segments: tuple[Segment, ...] = field(default_factory=tuple)
    reason: str = ""

    def __post_init__(self) -> None:
        _check(self)


_KIND_CODES = {name: code for code, name in w.RECORD_KINDS.items()}


def _bad(message: str, field_name: str, found: Any, expected: Any = None, **kw: Any) -> None:
    extra = {} if expected is None else {"expected": expected}
    raise InvalidTransferRecordError(
        message, section="transfer record", field=field_name, found=found, **extra, **kw
    )


def _uint(value: Any, name: str, bits: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ArgumentTypeError(f"{name} must be an int", field=name, found=type(value).__name__)
    if not 0 <= value < (1 << bits):
        _bad(f"{name} out of range", name, value, f"0 <= {name} < 2**{bits}")
    return value


def _check(r: TransferRecord) -> None:
    """The rules every record obeys, checked when built and when parsed (so that the encoder
    cannot write what the decoder refuses)."""
    if r.kind not in _KIND_CODES:
        _bad("unknown record kind", "kind", repr(r.kind), sorted(_KIND_CODES))
    _uint(r.session, "session", 64)
    if r.layer is not None and _uint(r.layer, "layer_index", 32) == w.LAYER_NONE:
        _bad("0xFFFFFFFF means no layer; pass None", "layer_index", r.layer)
    if r.role is not None and r.role not in ROLE_CODES:
        _bad("unknown kv_role", "kv_role", repr(r.role), sorted(ROLE_CODES))
    for name in ("total_length", "pool_offset", "pool_length"):
        _uint(getattr(r, name), name, 64)
    if not isinstance(r.write, bool):
        raise ArgumentTypeError("write must be a bool", field="write", found=repr(r.write))
    if not isinstance(r.reason, str):
        raise ArgumentTypeError("reason must be a str", field="reason", found=repr(r.reason))
    if len(r.reason.encode("utf-8", "surrogatepass")) > MAX_REASON_BYTES:
        _bad("reason too long", "reason_length", len(r.reason), f"<= {MAX_REASON_BYTES} bytes")
    if r.reason and r.kind != "abort":
        _bad("only an abort record has a reason", "reason_length", len(r.reason), 0)
    if r.write and r.kind != "offer":
        _bad("only an offer record has the write flag", "flags", w.FLAG_WRITE, 0)
    if r.kind in ("offer", "grant"):
        _check_layout(r)
    else:
        for name in ("total_length", "pool_offset", "pool_length"):
            if getattr(r, name):
                _bad(f"a {r.kind} record has no {name}", name, getattr(r, name), 0)
        if r.segments:
            _bad(f"a {r.kind} record has no segments", "segment_count", len(r.segments), 0)
    if r.kind != "abort" and (r.layer is None or r.role is None):
        _bad(f"a {r.kind} record names its layer and kv_role", "kv_role", repr(r.role))


def _check_layout(r: TransferRecord) -> None:
    """An offer or grant: an aligned blob length, a pool section inside it, and segments that
    tile [0, total_length) in order, without gaps or overlaps."""
    total = r.total_length
    if total < _ALIGNMENT or total % _ALIGNMENT:
        _bad("total_length is not a valid blob length", "total_length", total, "k * 64 > 0")
    if r.pool_length:
        if r.pool_offset % _ALIGNMENT or r.pool_offset < _ALIGNMENT:
            _bad("pool_offset is not an aligned section offset", "pool_offset", r.pool_offset)
        if r.pool_offset + r.pool_length > total:
            _bad(
                "page pool extends past total_length",
                "pool_length",
                r.pool_length,
                f"<= {total - r.pool_offset}",
            )
    elif r.pool_offset:
        _bad("pool_offset without a pool_length", "pool_offset", r.pool_offset, 0)
    if not isinstance(r.segments, tuple):
        raise ArgumentTypeError("segments must be a tuple", field="segments")
    if not 1 <= len(r.segments) <= MAX_SEGMENTS:
        _bad("segment count out of range", "segment_count", len(r.segments), f"1..{MAX_SEGMENTS}")
    cursor = 0
    for number, s in enumerate(r.segments):
        if not isinstance(s, Segment):
            raise ArgumentTypeError("segments holds Segment objects", found=type(s).__name__)
        where = f"segment[{number}]"
        _uint(s.blob_offset, f"{where}.blob_offset", 64)
        _uint(s.length, f"{where}.length", 64)
        _uint(s.address, f"{where}.address", 64)
        _uint(s.device_id, f"{where}.device_id", 32)
        if s.blob_offset != cursor:
            _bad("segments must tile the blob in order", f"{where}.blob_offset", s.blob_offset,
                 cursor)  # fmt: skip
        if s.length == 0:
            _bad("empty segment", f"{where}.length", 0, "> 0")
        if s.address == 0 or s.address + s.length > _U64_MAX:
            _bad("segment address out of range", f"{where}.address", s.address)
        cursor += s.length
        if cursor > total:
            _bad("segments extend past total_length", f"{where}.length", s.length,
                 f"<= {total - s.blob_offset}")  # fmt: skip
    if cursor != total:
        _bad("segments do not cover the blob", "segment_count", cursor, total)


def encode_record(record: TransferRecord) -> bytes:
    """The record's bytes (it was checked when built)."""
    if not isinstance(record, TransferRecord):
        raise ArgumentTypeError("expected a TransferRecord", found=type(record).__name__)
    reason = record.reason.encode("utf-8")
    length = _FIXED + _SEGMENT * len(record.segments) + len(reason) + 8
    head = w.TRANSFER_RECORD.build(
        {
            "version_major": 1,
            "version_minor": 0,
            "kind": _KIND_CODES[record.kind],
            "flags": w.FLAG_WRITE if record.write else 0,
            "record_length": length,
            "session": record.session,
            "layer_index": w.LAYER_NONE if record.layer is None else record.layer,
            "kv_role": w.ROLE_NONE if record.role is None else ROLE_CODES[record.role],
            "total_length": record.total_length,
            "pool_offset": record.pool_offset,
            "pool_length": record.pool_length,
            "segment_count": len(record.segments),
            "reason_length": len(reason),
        }
    )
    body = b"".join(
        w.TRANSFER_SEGMENT.build(
            {
                "blob_offset": s.blob_offset,
                "length": s.length,
                "address": s.address,
                "device_id": s.device_id,
            }
        )
        for s in record.segments
    )
    data: bytes = head + body + reason
    trailer: bytes = w.RECORD_CHECKSUM.build({"checksum": xxhash.xxh3_64_intdigest(data)})
    return data + trailer


def decode_record(data: Any) -> TransferRecord:
    """Parse and validate one record that must fill ``data`` exactly."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ArgumentTypeError("a record is bytes", found=type(data).__name__)
    raw = bytes(data)
    if len(raw) < _FIXED + 8:
        raise InvalidTransferRecordError(
            "record shorter than its fixed part and checksum",
            section="transfer record",
            offset=len(raw),
            expected=_FIXED + 8,
            found=len(raw),
        )
    try:
        head = w.TRANSFER_RECORD.parse(raw[:_FIXED])
    except c.ConstError:
        where = 0 if raw[:4] != w.TRANSFER_MAGIC else (25 if raw[25:28] != bytes(3) else 56)
        raise InvalidTransferRecordError(
            "bad magic" if where == 0 else "reserved bytes must be zero",
            section="transfer record",
            field="magic" if where == 0 else "_reserved",
            offset=where,
            found=raw[where : where + 4].hex(" "),
        ) from None
    if head.version_major != 1:
        _bad("unsupported record version", "version_major", head.version_major, 1, offset=4)
    expected = _FIXED + _SEGMENT * head.segment_count + head.reason_length + 8
    if head.record_length != len(raw) or expected != len(raw):
        raise InvalidTransferRecordError(
            "record_length disagrees with the bytes received or with the counts",
            section="transfer record",
            field="record_length",
            offset=8,
            expected=f"{len(raw)} (received) == {expected} (counts)",
            found=head.record_length,
        )
    stored = w.RECORD_CHECKSUM.parse(raw[-8:]).checksum
    computed = xxhash.xxh3_64_intdigest(raw[:-8])
    if stored != computed:
        raise InvalidTransferRecordError(
            "record checksum mismatch",
            section="transfer record",
            field="checksum",
            offset=len(raw) - 8,
            expected=f"0x{computed:016x}",
            found=f"0x{stored:016x}",
        )
    if head.kind not in w.RECORD_KINDS:
        _bad("unknown record kind", "kind", head.kind, sorted(w.RECORD_KINDS), offset=6)
    if head.flags & ~w.RECORD_FLAGS_KNOWN:
        _bad("unknown record flag bits", "flags", f"0x{head.flags:02X}", offset=7)
    if head.kv_role != w.ROLE_NONE and head.kv_role not in _ROLE_NAMES:
        _bad("unknown kv_role code", "kv_role", head.kv_role, sorted(_ROLE_NAMES), offset=24)
    segments = []
    for k in range(head.segment_count):
        at = _FIXED + _SEGMENT * k
        try:
            s = w.TRANSFER_SEGMENT.parse(raw[at : at + _SEGMENT])
        except c.ConstError:
            raise InvalidTransferRecordError(
                "reserved bytes must be zero",
                section="transfer record",
                field=f"segment[{k}]._reserved",
                offset=at + 28,
            ) from None
        segments.append(Segment(s.blob_offset, s.length, s.address, s.device_id))
    start = _FIXED + _SEGMENT * head.segment_count
    try:
        reason = raw[start : start + head.reason_length].decode("utf-8")
    except UnicodeDecodeError:
        _bad("reason is not UTF-8", "reason", raw[start : start + 16].hex(" "), offset=start)
    return TransferRecord(
        kind=w.RECORD_KINDS[head.kind],
        session=head.session,
        layer=None if head.layer_index == w.LAYER_NONE else head.layer_index,
        role=None if head.kv_role == w.ROLE_NONE else _ROLE_NAMES[head.kv_role],
        write=bool(head.flags & w.FLAG_WRITE),
        total_length=head.total_length,
        pool_offset=head.pool_offset,
        pool_length=head.pool_length,
        segments=tuple(segments),
        reason=reason,
    )
