"""Transfer control records: validated model <-> bytes (structs in hurray_wire.wire.transfer).

All one side of a NIXL transfer learns from the other besides the blob bytes, so they are
parsed as hostile input (segments must tile the blob exactly). No NIXL, no pickle here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NoReturn

from hurray_wire.buffers import byte_view
from hurray_wire.errors import ArgumentTypeError, InvalidTransferRecordError, instance
from hurray_wire.wire import transfer as w
from hurray_wire.wire.blob import BLOB_ALIGNMENT
from hurray_wire.wire.descriptor import KV_ROLE_BY_CODE, KV_ROLES

__all__ = [
    "MAX_HEADER_BYTES",
    "MAX_REASON_BYTES",
    "MAX_SEGMENTS",
    "ROLE_CODES",
    "Segment",
    "TransferRecord",
    "decode_record",
    "encode_record",
]

MAX_SEGMENTS = 256  # far above what one blob needs (header, pool, index arrays, padding)
MAX_REASON_BYTES = 1024
ROLE_CODES = KV_ROLES  # the descriptor's codes (wire/descriptor.py): one role map
# construct parsing costs ~50 us per struct: the hot path unpacks the derived struct.Struct
# formats (wire/fast.py); the record (wire/records.py) checks its Const fields and its seal.
_TRANSFER = w.TRANSFER.raising(InvalidTransferRecordError, InvalidTransferRecordError)
_RECORD = _TRANSFER.head
_SEG = w.FAST_TRANSFER_SEGMENT
_SEGMENT = _SEG.size  # 32
_AT = _RECORD.offsets
MAX_HEADER_BYTES = _RECORD.limit("tail_length")  # a ready record's blob header
_ALIGNMENT = BLOB_ALIGNMENT  # blob total_length and section offsets are multiples of it


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
    ready: bool = False  # offer: the header segment is final (no ready record will follow)
    total_length: int = 0
    pool_offset: int = 0
    pool_length: int = 0
    segments: tuple[Segment, ...] = field(default_factory=tuple)
    reason: str = ""
    header: bytes = b""  # ready: the final bytes of the offer's header segment

    def __post_init__(self) -> None:
        _check(self)


_KIND_CODES = {name: code for code, name in w.RECORD_KINDS.items()}
_TYPES = (
    ("write", bool, "a bool"),
    ("ready", bool, "a bool"),
    ("reason", str, "a str"),
    ("header", bytes, "bytes"),
)


def _bad(
    message: str, field_name: str | None, found: Any, expected: Any = None, **kw: Any
) -> NoReturn:
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
    for name, kind, what in _TYPES:
        if not isinstance(value := getattr(r, name), kind):
            shown = type(value).__name__ if kind is bytes else repr(value)
            raise ArgumentTypeError(f"{name} must be {what}", field=name, found=shown)
    try:  # strict: what encode_record writes (a lone surrogate is no UTF-8)
        size = len(r.reason.encode("utf-8"))
    except UnicodeEncodeError as exc:
        _bad("reason is not encodable as UTF-8", "reason", repr(r.reason[exc.start : exc.end]))
    if size > MAX_REASON_BYTES:
        _bad("reason too long", "tail_length", f"{size} bytes", f"<= {MAX_REASON_BYTES} bytes")
    if r.reason and r.kind != "abort":
        _bad("only an abort record has a reason", "tail_length", len(r.reason), 0)
    if r.kind == "ready" and not _ALIGNMENT <= len(r.header) <= MAX_HEADER_BYTES:
        _bad("a ready record carries the blob header (version 2)", "tail_length",
             len(r.header), f"64..{MAX_HEADER_BYTES}")  # fmt: skip
    if r.header and r.kind != "ready":
        _bad("only a ready record carries a header", "tail_length", len(r.header), 0)
    if (r.write or r.ready) and r.kind != "offer":
        _bad("only an offer record has the write or ready flag", "flags",
             w.FLAG_WRITE * r.write | w.FLAG_READY * r.ready, 0)  # fmt: skip
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
        for name, bits in (("blob_offset", 64), ("length", 64), ("address", 64), ("device_id", 32)):
            _uint(getattr(s, name), f"{where}.{name}", bits)
        if s.blob_offset != cursor:
            _bad("segments must tile the blob in order", f"{where}.blob_offset", s.blob_offset,
                 cursor)  # fmt: skip
        if s.length == 0:
            _bad("empty segment", f"{where}.length", 0, "> 0")
        if s.address == 0 or s.address + s.length >= 1 << 64:
            _bad("segment address out of range", f"{where}.address", s.address)
        cursor += s.length
        if cursor > total:
            _bad("segments extend past total_length", f"{where}.length", s.length,
                 f"<= {total - s.blob_offset}")  # fmt: skip
    if cursor != total:
        _bad("segments do not cover the blob", "segment_count", cursor, total)


def encode_record(record: TransferRecord) -> bytes:
    """The record's bytes (it was checked when built)."""
    instance(record, TransferRecord, "record")
    tail = record.header or record.reason.encode("utf-8")
    length = _TRANSFER.total_for(_SEGMENT * len(record.segments) + len(tail))
    head = _RECORD.pack(
        w.RECORD_VERSION,
        0,
        _KIND_CODES[record.kind],
        (w.FLAG_WRITE if record.write else 0) | (w.FLAG_READY if record.ready else 0),
        length,
        record.session,
        w.LAYER_NONE if record.layer is None else record.layer,
        w.ROLE_NONE if record.role is None else ROLE_CODES[record.role],
        record.total_length,
        record.pool_offset,
        record.pool_length,
        len(record.segments),
        len(tail),
    )
    # Const fields (magic, reserved bytes) fill themselves in.
    segments = (_SEG.pack(s.blob_offset, s.length, s.address, s.device_id) for s in record.segments)
    return _TRANSFER.close(b"".join((head, *segments, tail)))


def decode_record(data: Any) -> TransferRecord:
    """Parse and validate one record that must fill ``data`` exactly."""
    raw = bytes(byte_view(data, "record"))
    if len(raw) < _TRANSFER.minimum:
        message = "record shorter than its fixed part and checksum"
        _bad(message, None, len(raw), _TRANSFER.minimum, offset=len(raw))
    head = _RECORD.struct.unpack_from(raw)
    _TRANSFER.check_consts(head)
    (_, major, _, kind, flags, record_length, session, layer, role, _, total, pool_offset,
     pool_length, segment_count, tail_length, _) = head  # fmt: skip
    if major != w.RECORD_VERSION:
        _bad("unsupported transfer record version: the peer runs another hurray-wire "
             "release (version 2 carries the blob header in the ready record)",
             "version_major", major, w.RECORD_VERSION, offset=_AT["version_major"])  # fmt: skip
    expected = _TRANSFER.total_for(_SEGMENT * segment_count + tail_length)
    if record_length != len(raw) or expected != len(raw):
        _bad(
            "record_length disagrees with the bytes received or with the counts",
            "record_length",
            record_length,
            f"{len(raw)} (received) == {expected} (counts)",
            offset=_AT["record_length"],
        )
    spans = _TRANSFER.spans(len(raw), (("segments", _SEGMENT * segment_count),
                                       ("tail", tail_length)))  # fmt: skip
    _TRANSFER.check_seal(memoryview(raw), spans["seal"][0])
    if kind not in w.RECORD_KINDS:
        _bad("unknown record kind", "kind", kind, sorted(w.RECORD_KINDS), offset=_AT["kind"])
    if flags & ~w.RECORD_FLAGS_KNOWN:
        _bad("unknown record flag bits", "flags", f"0x{flags:02X}", offset=_AT["flags"])
    if role != w.ROLE_NONE and role not in KV_ROLE_BY_CODE:
        _bad(
            "unknown kv_role code", "kv_role", role, sorted(KV_ROLE_BY_CODE), offset=_AT["kv_role"]
        )
    if segment_count > MAX_SEGMENTS:  # before any Segment is built
        at = _AT["segment_count"]
        _bad("segment count out of range", "segment_count", segment_count,
             f"<= {MAX_SEGMENTS}", offset=at)  # fmt: skip
    segments = []
    first, start = spans["segments"]
    for k, (blob_offset, length, address, device_id, reserved) in enumerate(
        _SEG.struct.iter_unpack(raw[first:start])
    ):
        if any(reserved):
            at = first + _SEGMENT * k + _SEG.offsets["_reserved"]
            _bad(
                "reserved bytes must be zero", f"segment[{k}]._reserved", reserved.hex(), offset=at
            )
        segments.append(Segment(blob_offset, length, address, device_id))
    tail = raw[slice(*spans["tail"])]
    reason = ""
    if kind != w.KIND_READY:
        try:
            reason = tail.decode("utf-8")
        except UnicodeDecodeError:
            _bad("reason is not UTF-8", "reason", tail[:16].hex(" "), offset=start)
    return TransferRecord(
        kind=w.RECORD_KINDS[kind],
        session=session,
        layer=None if layer == w.LAYER_NONE else layer,
        role=None if role == w.ROLE_NONE else KV_ROLE_BY_CODE[role],
        write=bool(flags & w.FLAG_WRITE),
        ready=bool(flags & w.FLAG_READY),
        total_length=total,
        pool_offset=pool_offset,
        pool_length=pool_length,
        segments=tuple(segments),
        reason=reason,
        header=tail if kind == w.KIND_READY else b"",
    )
