"""Stream records (docs/streaming.md § 2, § 4): the stream header and the end record.

Encode and decode of the two records a blob stream adds around its blobs, plus the rules
that tie a blob to the header it sits under. Byte positions come from the construct structs
in ``hurray_wire.wire.stream`` (``offset_of``), never restated here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np
import numpy.typing as npt
import xxhash

from hurray_wire.blob import BLOB_PREFIX_SIZE
from hurray_wire.blob.limits import DecodeLimits, check_limits_argument
from hurray_wire.buffers import align, byte_view, check_zero
from hurray_wire.dtypes import ElementType, element_type_from_tag, element_type_of
from hurray_wire.errors import (
    ArgumentTypeError,
    HurrayWireError,
    InvalidStreamError,
    LimitExceededError,
    StreamTruncatedError,
)
from hurray_wire.integrity import (
    FINGERPRINT_METADATA_KEY,
    EngineFingerprint,
    check_compatible,
    fingerprint_from_metadata,
    fingerprint_to_metadata,
    require_fingerprint,
)
from hurray_wire.metadata import decode_metadata, encode_metadata
from hurray_wire.model.layout import KV_ROLE_NAMES
from hurray_wire.tensor import BlockPagedTensor
from hurray_wire.wire import stream as ws
from hurray_wire.wire.descriptor import KV_ROLES, LAYER_NONE
from hurray_wire.wire.fast import derive, item_dtype, item_struct, offset_of

__all__ = [
    "DEFAULT_MAX_BLOB_BYTES",
    "END_RECORD_MIN",
    "STREAM_HEADER_MIN",
    "StreamEntry",
    "StreamHeader",
    "add_note",
    "check_against_header",
    "check_end_record_entries",
    "check_header_metadata_length",
    "check_max_blob_bytes",
    "check_record_limit",
    "check_record_size",
    "decode_end_record",
    "decode_end_rows",
    "decode_stream_header",
    "encode_end_record",
    "encode_stream_header",
    "entries_of",
    "max_end_record_bytes",
    "max_stream_header_bytes",
    "record_length",
    "rows_match",
]

DEFAULT_MAX_BLOB_BYTES = 4 << 30  # largest record a reader accepts unless told otherwise

_PREFIX = derive(ws.RECORD_PREFIX)
_SHEADER = derive(ws.STREAM_HEADER)
_CHECKSUM = derive(ws.RECORD_CHECKSUM)
_END = derive(ws.END_RECORD)
_ENTRY = derive(ws.END_ENTRY)
_FOOTER = derive(ws.END_FOOTER)
STREAM_HEADER_MIN = align(_SHEADER.size + _CHECKSUM.size, ws.RECORD_ALIGNMENT)
END_RECORD_MIN = align(_END.size + _FOOTER.size, ws.RECORD_ALIGNMENT)
_AT_PREFIX = {name: offset_of(ws.RECORD_PREFIX, name) for name in _PREFIX.names}
_AT_SHEADER = {name: offset_of(ws.STREAM_HEADER, name) for name in _SHEADER.names}
_AT_END = {name: offset_of(ws.END_RECORD, name) for name in _END.names}
_AT_ENTRY_ROLE = offset_of(ws.END_ENTRY, "kv_role")
_AT_FOOTER_TOTAL = offset_of(ws.END_FOOTER, "total_length")
_ROLES_KNOWN = sum(ws.ROLE_BITS.values())
_ENTRY_COUNT = item_struct(ws.END_RECORD.entry_count.subcon)
_ROLE_BY_CODE = {code: name for name, code in KV_ROLES.items()}
_ROLE_CODES = np.array(sorted(_ROLE_BY_CODE), np.uint8)
# One index entry as a NumPy record, from the wire struct (offsets and sizes derived).
_ENTRY_DTYPE = np.dtype(
    {
        "names": list(_ENTRY.names),  # offset, length, layer_index, kv_role, _reserved
        "formats": [item_dtype(getattr(ws.END_ENTRY, n).subcon) for n in _ENTRY.names[:-1]]
        + [("u1", (_ENTRY.sizes["_reserved"],))],
        "offsets": [offset_of(ws.END_ENTRY, n) for n in _ENTRY.names],
        "itemsize": _ENTRY.size,
    }
)
# The largest stream header a metadata limit admits: fixed part, longest model name (u16
# length), the metadata, checksum and alignment. A reader checks a header's total_length
# against it before reading the record.
_MAX_NAME = 0xFFFF


def max_stream_header_bytes(limits: DecodeLimits | None) -> int:
    """The longest stream header record ``limits`` can accept (its metadata at the limit)."""
    limits = check_limits_argument(limits)
    body = _SHEADER.size + _MAX_NAME + limits.max_metadata_bytes + _CHECKSUM.size
    return align(body, ws.RECORD_ALIGNMENT)


def check_header_metadata_length(meta_length: int, limits: DecodeLimits) -> None:
    """A stream header's ``metadata_length`` against ``limits.max_metadata_bytes``."""
    if meta_length > limits.max_metadata_bytes:
        raise LimitExceededError(
            "stream header metadata larger than the decode limit allows",
            section="stream header",
            field="metadata_length",
            offset=_AT_SHEADER["metadata_length"],
            expected=f"<= {limits.max_metadata_bytes} (DecodeLimits.max_metadata_bytes)",
            found=meta_length,
        )


def max_end_record_bytes(limits: DecodeLimits | None) -> int:
    """The longest end record ``limits`` can accept (its index at the limit)."""
    limits = check_limits_argument(limits)
    body = _END.size + _ENTRY.size * limits.max_stream_entries + _FOOTER.size
    return align(body, ws.RECORD_ALIGNMENT)


def check_end_record_entries(view: memoryview, limits: DecodeLimits) -> None:
    """An end record's ``entry_count`` (read from its fixed part, which must be there)
    against ``limits.max_stream_entries``, before the record is checked or decoded."""
    if len(view) < _AT_END["entry_count"] + _ENTRY_COUNT.size:
        return  # too short: the record's own checks say so
    (count,) = _ENTRY_COUNT.unpack_from(view, _AT_END["entry_count"])
    if count > limits.max_stream_entries:
        raise LimitExceededError(
            "end record index has more entries than the decode limit allows",
            section="end record",
            field="entry_count",
            offset=_AT_END["entry_count"],
            expected=f"<= {limits.max_stream_entries} (DecodeLimits.max_stream_entries)",
            found=count,
        )


@dataclass(frozen=True)
class StreamHeader:
    """What a stream carries, stated before the first blob so a reader can preallocate.

    Every field may be left unstated (``""``, ``None``, ``()``). A reader checks each blob
    against what is stated; which layer and role a blob holds still comes from the blob's
    own descriptor. ``end_record`` is the writer's promise to end the stream with an end
    record, which lets a reader tell a finished stream from one cut at a blob boundary.
    ``fingerprint`` is the sending engine's (docs/integrity.md § 3), carried in the header's
    metadata under the reserved ``hurray.engine_fingerprint`` key (``metadata`` given with
    that key fills ``fingerprint`` from it; the key is never left in ``metadata``).
    """

    model: str = ""
    num_layers: int | None = None
    kv_roles: tuple[str, ...] = ()
    element_type: ElementType | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict, hash=False)
    end_record: bool = True
    fingerprint: EngineFingerprint | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.model, str):
            raise ArgumentTypeError("model must be a str", field="model", found=repr(self.model))
        try:
            name_length = len(self.model.encode("utf-8"))
        except UnicodeEncodeError:
            raise InvalidStreamError("model is not encodable as UTF-8", field="model") from None
        if name_length > 0xFFFF:
            raise InvalidStreamError(
                "model name too long", field="model", expected="<= 65535 bytes", found=name_length
            )
        layers = self.num_layers
        if layers is not None and (
            isinstance(layers, bool)
            or not isinstance(layers, int)
            or not 0 <= layers < ws.NUM_LAYERS_UNKNOWN
        ):
            raise InvalidStreamError(
                "num_layers must be None or an int in [0, 2**32 - 2]",
                field="num_layers",
                found=repr(layers),
            )
        if isinstance(self.kv_roles, str):
            raise ArgumentTypeError(
                "kv_roles must be a sequence of role names", field="kv_roles", found=self.kv_roles
            )
        roles = tuple(self.kv_roles)
        for role in roles:
            if role not in KV_ROLE_NAMES:
                raise InvalidStreamError(
                    "unknown kv_role", field="kv_roles", found=repr(role), expected=KV_ROLE_NAMES
                )
        object.__setattr__(self, "kv_roles", tuple(r for r in KV_ROLE_NAMES if r in roles))
        if self.element_type is not None:
            object.__setattr__(self, "element_type", element_type_of(self.element_type))
        if not isinstance(self.metadata, Mapping):
            raise ArgumentTypeError(
                "metadata must be a mapping", field="metadata", found=type(self.metadata).__name__
            )
        meta = dict(self.metadata)
        fp = self.fingerprint
        if fp is not None and not isinstance(fp, EngineFingerprint):
            raise ArgumentTypeError(
                "fingerprint must be an EngineFingerprint or None",
                field="fingerprint",
                found=type(fp).__name__,
            )
        if FINGERPRINT_METADATA_KEY in meta:
            carried = fingerprint_from_metadata(meta)  # validates the record
            del meta[FINGERPRINT_METADATA_KEY]
            if fp is not None and carried != fp:
                raise InvalidStreamError(
                    "fingerprint disagrees with metadata[hurray.engine_fingerprint]",
                    field="fingerprint",
                )
            object.__setattr__(self, "fingerprint", carried)
        object.__setattr__(self, "metadata", MappingProxyType(meta))
        object.__setattr__(self, "end_record", bool(self.end_record))


@dataclass(frozen=True)
class StreamEntry:
    """Where one blob sits in a stream, and which ``{kv_role, layer}`` its descriptor names."""

    offset: int  # from the first byte of the stream
    length: int  # the blob's total_length
    layer_index: int | None
    kv_role: str


# -- records ---------------------------------------------------------------------------------
def encode_stream_header(header: StreamHeader) -> bytes:
    """The stream header record for ``header`` (docs/streaming.md § 2)."""
    if not isinstance(header, StreamHeader):
        raise ArgumentTypeError("expected a StreamHeader", found=type(header).__name__)
    name = header.model.encode("utf-8")
    entries = dict(header.metadata)
    if header.fingerprint is not None:
        entries.update(fingerprint_to_metadata(header.fingerprint))
    meta = encode_metadata(entries) if entries else b""
    if len(meta) > 0xFFFF_FFFF:
        raise InvalidStreamError("stream metadata too long", field="metadata", found=len(meta))
    body = _SHEADER.size + len(name) + len(meta)
    total = align(body + _CHECKSUM.size, ws.RECORD_ALIGNMENT)
    roles = 0
    for role in header.kv_roles:
        roles |= ws.ROLE_BITS[role]
    fixed = _SHEADER.pack(
        version_major=1,
        version_minor=0,
        stream_flags=ws.STREAM_FLAG_END_RECORD if header.end_record else 0,
        total_length=total,
        num_layers=ws.NUM_LAYERS_UNKNOWN if header.num_layers is None else header.num_layers,
        kv_roles=roles,
        element_type=(
            ws.ELEMENT_TYPE_UNKNOWN if header.element_type is None else header.element_type.tag
        ),
        model_name_length=len(name),
        metadata_length=len(meta),
    )
    head = b"".join((fixed, name, meta, bytes(total - _CHECKSUM.size - body)))
    return head + _CHECKSUM.pack(checksum=xxhash.xxh3_64_intdigest(head))


def record_length(prefix: Any, magic: bytes, what: str, minimum: int) -> int:
    """total_length of a stream header or end record from its 16-byte prefix, checked."""
    view = byte_view(prefix)
    if len(view) < BLOB_PREFIX_SIZE:
        raise StreamTruncatedError(
            f"input ends inside the {what} prefix",
            section=what,
            offset=len(view),
            expected=BLOB_PREFIX_SIZE,
            found=len(view),
        )
    found_magic, major, _minor, _flags, total = _PREFIX.struct.unpack_from(view, 0)
    if found_magic != magic:
        raise InvalidStreamError(
            f"bad {what} magic",
            section=what,
            field="magic",
            offset=_AT_PREFIX["magic"],
            expected=magic.hex(" "),
            found=found_magic.hex(" "),
        )
    if major != 1:
        raise InvalidStreamError(
            f"unsupported {what} major version",
            section=what,
            field="version_major",
            offset=_AT_PREFIX["version_major"],
            expected=1,
            found=major,
        )
    if total < minimum or total % ws.RECORD_ALIGNMENT:
        raise InvalidStreamError(
            f"total_length is not a valid {what} length",
            section=what,
            field="total_length",
            offset=_AT_PREFIX["total_length"],
            expected=f"a multiple of {ws.RECORD_ALIGNMENT}, >= {minimum}",
            found=total,
        )
    return int(total)


def _whole_record(view: memoryview, total: int, what: str) -> None:
    if len(view) < total:
        raise StreamTruncatedError(
            f"input ends inside the {what}",
            section=what,
            offset=len(view),
            expected=total,
            found=len(view),
        )


def _check_checksum(view: memoryview, start: int, stored: int, what: str) -> None:
    computed = xxhash.xxh3_64_intdigest(view[:start])
    if computed != stored:
        raise InvalidStreamError(
            f"{what} checksum mismatch",
            section=what,
            field="checksum",
            offset=start,
            expected=f"0x{computed:016x}",
            found=f"0x{stored:016x}",
        )


def decode_stream_header(data: Any, *, limits: DecodeLimits | None = None) -> StreamHeader:
    """Validate the stream header at the start of ``data`` (what follows it is ignored).

    ``limits.max_metadata_bytes`` and ``max_metadata_entries`` bound its metadata, checked
    before the record's checksum is computed or an entry decoded.
    """
    what = "stream header"
    limits = check_limits_argument(limits)
    view = byte_view(data)
    total = record_length(view, ws.STREAM_MAGIC, what, STREAM_HEADER_MIN)
    _whole_record(view, total, what)
    view = view[:total]
    (_, _, minor, flags, _, layers, roles, tag, name_length, meta_length, reserved) = (
        _SHEADER.struct.unpack_from(view, 0)
    )
    check_header_metadata_length(meta_length, limits)
    at_checksum = total - _CHECKSUM.size
    _check_checksum(view, at_checksum, _CHECKSUM.struct.unpack_from(view, at_checksum)[0], what)
    _check_sheader_fields(flags, reserved, roles)
    body = _SHEADER.size + name_length + meta_length
    if body > at_checksum:
        raise InvalidStreamError(
            "model name and metadata extend past total_length",
            section=what,
            field="metadata_length",
            offset=_AT_SHEADER["metadata_length"],
            expected=f"<= {at_checksum - _SHEADER.size - name_length}",
            found=meta_length,
        )
    if minor == 0:  # a newer minor may append fields here; 1.0 has only padding
        check_zero(view, body, at_checksum, error=InvalidStreamError, section=what)
    try:
        model = bytes(view[_SHEADER.size : _SHEADER.size + name_length]).decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidStreamError(
            "model name is not valid UTF-8", section=what, field="model_name", offset=_SHEADER.size
        ) from None
    meta_start = _SHEADER.size + name_length
    metadata: dict[str, Any] = {}
    if meta_length:
        metadata = dict(
            decode_metadata(
                view[meta_start:body],
                base_offset=meta_start,
                max_entries=limits.max_metadata_entries,
            )
        )
        try:
            fingerprint_from_metadata(metadata)  # the reserved entry must be a valid record
        except HurrayWireError as exc:
            raise exc.relocated(section=what, offset=meta_start) from None
    element_type = None
    if tag != ws.ELEMENT_TYPE_UNKNOWN:
        try:
            element_type = element_type_from_tag(tag)
        except HurrayWireError as exc:
            raise exc.relocated(
                section=what, field="element_type", offset=_AT_SHEADER["element_type"]
            ) from None
    return StreamHeader(
        model=model,
        num_layers=None if layers == ws.NUM_LAYERS_UNKNOWN else layers,
        kv_roles=tuple(name for name, bit in ws.ROLE_BITS.items() if roles & bit),
        element_type=element_type,
        metadata=metadata,
        end_record=bool(flags & ws.STREAM_FLAG_END_RECORD),
    )


def _check_sheader_fields(flags: int, reserved: bytes, roles: int) -> None:
    """The stream header's flag, reserved and role bits: only known ones may be set."""
    what = "stream header"
    if flags & ~ws.STREAM_FLAGS_KNOWN:
        raise InvalidStreamError(
            "unknown stream flags set",
            section=what,
            field="stream_flags",
            offset=_AT_SHEADER["stream_flags"],
            found=flags,
        )
    if reserved != _SHEADER.consts[-1][1]:
        raise InvalidStreamError(
            "reserved bytes set", section=what, field="_reserved", offset=_AT_SHEADER["_reserved"]
        )
    if roles & ~_ROLES_KNOWN:
        raise InvalidStreamError(
            "unknown kv_roles bits set",
            section=what,
            field="kv_roles",
            offset=_AT_SHEADER["kv_roles"],
            found=roles,
        )


def encode_end_record(entries: list[StreamEntry] | None, blob_count: int) -> bytes:
    """The end record: end-of-stream marker, blob count and (optionally) the index."""
    rows = entries if entries is not None and len(entries) <= 0xFFFF_FFFF else []
    body = _END.size + _ENTRY.size * len(rows)
    total = align(body + _FOOTER.size, ws.RECORD_ALIGNMENT)
    pieces = [
        _END.pack(
            version_major=1,
            version_minor=0,
            end_flags=0,
            total_length=total,
            blob_count=blob_count,
            entry_count=len(rows),
        )
    ]
    for e in rows:
        layer = LAYER_NONE if e.layer_index is None else e.layer_index
        pieces.append(
            _ENTRY.pack(
                offset=e.offset, length=e.length, layer_index=layer, kv_role=KV_ROLES[e.kv_role]
            )
        )
    pieces.append(bytes(total - _FOOTER.size - body))
    head = b"".join(pieces)
    return head + _FOOTER.pack(checksum=xxhash.xxh3_64_intdigest(head), total_length=total)


def decode_end_record(
    data: Any, *, limits: DecodeLimits | None = None
) -> tuple[int, tuple[StreamEntry, ...] | None]:
    """(blob_count, index entries or None) of the end record at the start of ``data``.

    ``limits.max_stream_entries`` bounds the index, checked before anything else is read;
    the entries are checked as one structured NumPy array (the dtype from the wire struct),
    and become ``StreamEntry`` objects only once every check has passed.
    """
    blob_count, rows = decode_end_rows(data, limits=limits)
    return blob_count, None if rows is None else entries_of(rows)


def entries_of(rows: npt.NDArray[Any]) -> tuple[StreamEntry, ...]:
    """The ``StreamEntry`` objects of checked index rows (~1-2 us each: call it last)."""
    layers = [None if v == LAYER_NONE else v for v in rows["layer_index"].tolist()]
    roles = [_ROLE_BY_CODE[v] for v in rows["kv_role"].tolist()]
    return tuple(map(StreamEntry, rows["offset"].tolist(), rows["length"].tolist(), layers, roles))


def rows_match(rows: npt.NDArray[Any], entries: Sequence[StreamEntry]) -> bool:
    """Index rows equal to ``entries`` (the blobs a reader met), compared as arrays."""
    if len(rows) != len(entries):
        return False
    if not len(rows):
        return True
    offsets = np.fromiter((e.offset for e in entries), np.uint64, len(entries))
    lengths = np.fromiter((e.length for e in entries), np.uint64, len(entries))
    layers = np.fromiter(
        (LAYER_NONE if e.layer_index is None else e.layer_index for e in entries),
        np.uint64,
        len(entries),
    )
    roles = np.fromiter((KV_ROLES[e.kv_role] for e in entries), np.uint8, len(entries))
    return bool(
        np.array_equal(rows["offset"], offsets)
        and np.array_equal(rows["length"], lengths)
        and np.array_equal(rows["layer_index"].astype(np.uint64), layers)
        and np.array_equal(rows["kv_role"], roles)
    )


def decode_end_rows(
    data: Any, *, limits: DecodeLimits | None = None
) -> tuple[int, npt.NDArray[Any] | None]:
    """``decode_end_record`` without the objects: (blob_count, the checked index as a
    structured array viewing ``data``, or None). What the readers use, so that an index
    that disagrees with the stream is refused without building an object per entry."""
    what = "end record"
    limits = check_limits_argument(limits)
    view = byte_view(data)
    check_end_record_entries(view, limits)
    total = record_length(view, ws.END_MAGIC, what, END_RECORD_MIN)
    _whole_record(view, total, what)
    view = view[:total]
    _, _, minor, flags, _, blob_count, count, reserved = _END.struct.unpack_from(view, 0)
    stored, again = _FOOTER.struct.unpack_from(view, total - _FOOTER.size)
    if again != total:
        raise InvalidStreamError(
            "the footer's total_length disagrees with the prefix",
            section=what,
            field="footer.total_length",
            offset=total - _FOOTER.size + _AT_FOOTER_TOTAL,
            expected=total,
            found=again,
        )
    _check_checksum(view, total - _FOOTER.size, stored, what)
    if flags:
        raise InvalidStreamError(
            "unknown end record flags set",
            section=what,
            field="end_flags",
            offset=_AT_END["end_flags"],
            found=flags,
        )
    if reserved != _END.consts[-1][1]:
        raise InvalidStreamError(
            "reserved bytes set", section=what, field="_reserved", offset=_AT_END["_reserved"]
        )
    body = _END.size + _ENTRY.size * count
    if body + _FOOTER.size > total:
        raise InvalidStreamError(
            "index entries extend past total_length",
            section=what,
            field="entry_count",
            offset=_AT_END["entry_count"],
            found=count,
        )
    if count and count != blob_count:
        raise InvalidStreamError(
            "the index must list every blob or none",
            section=what,
            field="entry_count",
            offset=_AT_END["entry_count"],
            expected=blob_count,
            found=count,
        )
    if minor == 0:
        check_zero(view, body, total - _FOOTER.size, error=InvalidStreamError, section=what)
    rows = np.frombuffer(view, _ENTRY_DTYPE, count, _END.size)
    bad = ~np.isin(rows["kv_role"], _ROLE_CODES) | rows["_reserved"].any(axis=1)
    if bad.any():
        number = int(np.argmax(bad))
        raise InvalidStreamError(
            "bad kv_role or reserved bytes in an index entry",
            section=what,
            field=f"entries[{number}]",
            offset=_END.size + _ENTRY.size * number + _AT_ENTRY_ROLE,
            found=int(rows["kv_role"][number]),
        )
    return blob_count, (rows if count or not blob_count else None)


def check_header_fingerprint(expect: EngineFingerprint | None, header: StreamHeader | None) -> None:
    """Refuse, before any blob, a stream whose header does not carry the expected engine
    fingerprint (a stream without a header carries none)."""
    if expect is None:
        return
    carried = None if header is None else header.fingerprint
    if carried is None:
        require_fingerprint(expect, {}, section="stream header")
    else:
        check_compatible(expect, carried)


def check_blob_fingerprint(expect: EngineFingerprint | None, tensor: BlockPagedTensor) -> None:
    """A blob that carries a fingerprint of its own must carry the expected one too."""
    if expect is not None:
        own = fingerprint_from_metadata(tensor.metadata)
        if own is not None:
            check_compatible(expect, own)


def check_against_header(header: StreamHeader | None, tensor: BlockPagedTensor, at: str) -> None:
    """A blob must be what the stream header says the stream holds."""
    if header is None:
        return
    layer = tensor.layer_index
    if header.num_layers is not None and (layer is None or layer >= header.num_layers):
        raise InvalidStreamError(
            "blob layer_index outside the stream header's num_layers",
            section=at,
            field="layer_index",
            expected=f"< {header.num_layers}",
            found=layer,
        )
    if header.kv_roles and tensor.kv_role not in header.kv_roles:
        raise InvalidStreamError(
            "blob kv_role not among the stream header's kv_roles",
            section=at,
            field="kv_role",
            expected=header.kv_roles,
            found=tensor.kv_role,
        )
    if header.element_type is not None and tensor.element_type != header.element_type:
        raise InvalidStreamError(
            "blob element type differs from the stream header's",
            section=at,
            field="element_type",
            expected=header.element_type.name,
            found=tensor.element_type.name,
        )


def check_max_blob_bytes(max_blob_bytes: int) -> int:
    """``max_blob_bytes`` checked: an int no smaller than the smallest record."""
    if isinstance(max_blob_bytes, bool) or not isinstance(max_blob_bytes, int):
        raise ArgumentTypeError("max_blob_bytes must be an int", found=repr(max_blob_bytes))
    if max_blob_bytes < STREAM_HEADER_MIN:
        raise ArgumentTypeError(
            f"max_blob_bytes must be at least {STREAM_HEADER_MIN}", found=max_blob_bytes
        )
    return max_blob_bytes


def check_record_limit(total: int, limit: int, what: str, offset: int) -> None:
    """A header or end record longer than the decode limits admit, refused before it is
    read (``max_stream_header_bytes`` / ``max_end_record_bytes``)."""
    if total > limit:
        raise LimitExceededError(
            f"{what} longer than the decode limits admit (DecodeLimits.max_metadata_bytes / "
            "max_stream_entries)",
            section=what,
            field="total_length",
            offset=offset,
            expected=f"<= {limit}",
            found=total,
        )


def check_record_size(total: int, limit: int, what: str, offset: int) -> None:
    """Refuse a record over the reader's limit before anything is allocated for it."""
    if total > limit:
        raise LimitExceededError(
            f"{what} larger than max_blob_bytes",
            section=what,
            field="total_length",
            offset=offset + _AT_PREFIX["total_length"],
            expected=f"<= {limit}",
            found=total,
        )


def add_note(exc: HurrayWireError, text: str) -> None:
    """Say where in the stream an error from the blob decoder happened (Python >= 3.11)."""
    note = getattr(exc, "add_note", None)
    if note is not None:
        note(text)
