"""Stream records (docs/streaming.md § 2, § 4): the stream header and the end record, and the
rules both stream readers apply to the records around their blobs (layouts: ``wire.records``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np
import numpy.typing as npt

from hurray_wire.blob import peek_descriptor
from hurray_wire.blob.limits import DecodeLimits, check_limits_argument
from hurray_wire.buffers import byte_view, check_zero
from hurray_wire.dtypes import ElementType, element_type_from_tag, element_type_of
from hurray_wire.errors import (
    ArgumentTypeError,
    HurrayWireError,
    InvalidStreamError,
    LimitExceededError,
    StreamBlobTruncatedError,
    StreamTruncatedError,
    instance,
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
from hurray_wire.wire import records as wr, stream as ws
from hurray_wire.wire.descriptor import KV_ROLE_BY_CODE, KV_ROLES, LAYER_NONE
from hurray_wire.wire.fast import item_dtype

DEFAULT_MAX_BLOB_BYTES = 4 << 30  # largest record a reader accepts unless told otherwise

_HEADER = wr.STREAM_HEADER.raising(InvalidStreamError, StreamTruncatedError)
_END = wr.END_RECORD.raising(InvalidStreamError, StreamTruncatedError)
_RECORDS = {"stream header": _HEADER, "end record": _END}
_ENTRY = ws.FAST_END_ENTRY
_ROLE_CODES = np.array(sorted(KV_ROLE_BY_CODE), np.uint8)
_MAX_NAME = _HEADER.head.limit("model_name_length")
# One index entry as a NumPy record, from the wire struct (offsets and sizes derived).
_ENTRY_DTYPE = np.dtype(
    {
        "names": list(_ENTRY.names),  # offset, length, layer_index, kv_role, _reserved
        "formats": [item_dtype(getattr(ws.END_ENTRY, n).subcon) for n in _ENTRY.names[:-1]]
        + [("u1", (_ENTRY.sizes["_reserved"],))],
        "offsets": [_ENTRY.offsets[n] for n in _ENTRY.names],
        "itemsize": _ENTRY.size,
    }
)
STREAM_HEADER_MIN = _HEADER.minimum
END_RECORD_MIN = _END.minimum


@dataclass(frozen=True)
class StreamHeader:
    """What a stream carries, stated before the first blob so a reader can preallocate; every
    field may be left unstated. ``end_record`` promises an end record, so a reader tells a
    finished stream from one cut at a blob boundary. ``fingerprint`` travels in the metadata
    under ``hurray.engine_fingerprint`` (docs/integrity.md § 3), never left in ``metadata``.
    """

    model: str = ""
    num_layers: int | None = None
    kv_roles: tuple[str, ...] = ()
    element_type: ElementType | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict, hash=False)
    end_record: bool = True
    fingerprint: EngineFingerprint | None = None

    def __post_init__(self) -> None:
        set_ = object.__setattr__  # frozen: normalise the checked fields once, here
        if not isinstance(self.model, str):
            raise ArgumentTypeError("model must be a str", field="model", found=repr(self.model))
        try:
            name_length = len(self.model.encode("utf-8"))
        except UnicodeEncodeError:
            raise InvalidStreamError("model is not encodable as UTF-8", field="model") from None
        if name_length > _MAX_NAME:
            raise InvalidStreamError(
                "model name too long",
                field="model",
                expected=f"<= {_MAX_NAME} bytes",
                found=name_length,
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
        set_(self, "kv_roles", tuple(r for r in KV_ROLE_NAMES if r in roles))
        if self.element_type is not None:
            set_(self, "element_type", element_type_of(self.element_type))
        if not isinstance(self.metadata, Mapping):
            raise ArgumentTypeError(
                "metadata must be a mapping", field="metadata", found=type(self.metadata).__name__
            )
        meta = dict(self.metadata)
        fp = self.fingerprint
        if fp is not None:
            instance(fp, EngineFingerprint, "fingerprint")
        if FINGERPRINT_METADATA_KEY in meta:
            carried = fingerprint_from_metadata(meta)  # validates the record
            del meta[FINGERPRINT_METADATA_KEY]
            if fp is not None and carried != fp:
                raise InvalidStreamError(
                    "fingerprint disagrees with metadata[hurray.engine_fingerprint]",
                    field="fingerprint",
                )
            set_(self, "fingerprint", carried)
        set_(self, "metadata", MappingProxyType(meta))
        set_(self, "end_record", bool(self.end_record))


@dataclass(frozen=True)
class StreamEntry:
    """Where one blob sits in a stream, and which ``{kv_role, layer}`` its descriptor names."""

    offset: int  # from the first byte of the stream
    length: int  # the blob's total_length
    layer_index: int | None
    kv_role: str


# -- framing ---------------------------------------------------------------------------------
def check_record_size(total: int, limit: int, what: str, offset: int, why: str = "") -> None:
    """Refuse a record over a reader's limit before anything is allocated for it."""
    if total > limit:
        raise LimitExceededError(
            f"{what} larger than " + (why or "max_blob_bytes"),
            section=what,
            field="total_length",
            offset=offset + wr.PREFIX.offsets["total_length"],
            expected=f"<= {limit}",
            found=total,
        )


def frame_record(
    prefix: Any, what: str, offset: int, max_blob_bytes: int, limits: DecodeLimits
) -> int:
    """The total_length of a stream header or end record at stream ``offset``, refused over
    ``max_blob_bytes`` or the longest record ``limits`` admit, before it is read."""
    total = _RECORDS[what].frame(byte_view(prefix))
    check_record_size(total, max_blob_bytes, what, offset)
    if what == "stream header":
        longest = _HEADER.total_for(_MAX_NAME + limits.max_metadata_bytes)
    else:
        longest = _END.total_for(_ENTRY.size * limits.max_stream_entries)
    why = "the decode limits admit (DecodeLimits.max_metadata_bytes / max_stream_entries)"
    check_record_size(total, longest, what, offset, why)
    return total


def record_kind(prefix: Any, offset: int, cause: BaseException | None = None) -> str:
    """The kind ("blob", "end record") of the prefix at stream ``offset``; a cut prefix
    (``cause`` chained), a stream header past the start or an unknown magic is refused."""
    head = bytes(prefix[: len(ws.STREAM_MAGIC)])
    kinds = [r.what for magic, r in wr.RECORDS_BY_MAGIC.items() if magic.startswith(head)]
    if kinds and len(prefix) == wr.PREFIX.size:
        if kinds[0] == "stream header":
            raise InvalidStreamError(
                "a stream header may only open the stream", section="stream", offset=offset
            )
        return kinds[0]
    if not kinds:
        raise InvalidStreamError(
            "not a stream record", section="stream", field="magic", offset=offset,
            found=head.hex(" "),
        )  # fmt: skip
    kind = kinds[0] if len(kinds) == 1 else "record"
    error = StreamBlobTruncatedError if kind == "blob" else StreamTruncatedError
    raise error(
        f"stream ends inside a {kind} prefix" + (f" ({cause!r})" if cause else ""),
        section=kind,
        offset=offset + len(prefix),
        expected=wr.PREFIX.size,
        found=len(prefix),
    ) from cause


def _check_flags(
    record: wr.Record, fields: tuple[Any, ...], flags: int, known: int, name: str
) -> None:
    """A record's flags (only ``known`` bits) and its reserved bytes (zero)."""
    if flags & ~known:
        raise record.error(name, f"unknown {name} bits set", found=flags)
    record.check_consts(fields, skip=1)


# -- stream header ---------------------------------------------------------------------------
def encode_stream_header(header: StreamHeader) -> bytes:
    """The stream header record for ``header`` (docs/streaming.md § 2)."""
    name = instance(header, StreamHeader, "header").model.encode("utf-8")
    entries = dict(header.metadata)
    if header.fingerprint is not None:
        entries.update(fingerprint_to_metadata(header.fingerprint))
    meta = encode_metadata(entries) if entries else b""
    if len(meta) > _HEADER.head.limit("metadata_length"):
        raise InvalidStreamError("stream metadata too long", field="metadata", found=len(meta))
    total = _HEADER.total_for(len(name) + len(meta))
    roles = sum(ws.ROLE_BITS[role] for role in header.kv_roles)  # each role once: an OR
    fixed = _HEADER.head.pack(
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
    return _HEADER.close(b"".join((fixed, name, meta)), total)


def decode_stream_header(data: Any, *, limits: DecodeLimits | None = None) -> StreamHeader:
    """Validate the stream header at the start of ``data``; ``limits`` bound its metadata
    before the record's checksum is computed or an entry decoded."""
    what = "stream header"
    limits = check_limits_argument(limits)
    view = byte_view(data)
    view = _HEADER.whole(view, _HEADER.frame(view))
    fields = _HEADER.head.struct.unpack_from(view, 0)
    (_, _, minor, flags, total, layers, roles, tag, name_length, meta_length, _) = fields
    if meta_length > limits.max_metadata_bytes:
        raise LimitExceededError(
            "stream header metadata larger than the decode limit allows",
            section=what,
            field="metadata_length",
            offset=_HEADER.at("metadata_length"),
            expected=f"<= {limits.max_metadata_bytes} (DecodeLimits.max_metadata_bytes)",
            found=meta_length,
        )
    spans = _HEADER.spans(total, (("model_name", name_length), ("metadata", meta_length)))
    body, at_checksum = spans["padding"]
    _HEADER.check_seal(view, at_checksum)
    _check_flags(_HEADER, fields, flags, ws.STREAM_FLAGS_KNOWN, "stream_flags")
    if roles & ~sum(ws.ROLE_BITS.values()):
        raise _HEADER.error("kv_roles", "unknown kv_roles bits set", found=roles)
    if body > at_checksum:
        raise _HEADER.error(
            "metadata_length",
            "model name and metadata extend past total_length",
            expected=f"<= {at_checksum - spans['metadata'][0]}",
            found=meta_length,
        )
    if minor == 0:  # a newer minor may append fields here; 1.0 has only padding
        check_zero(view, body, at_checksum, error=InvalidStreamError, section=what)
    name_at, meta_start = spans["model_name"]
    try:
        model = bytes(view[name_at:meta_start]).decode("utf-8")
    except UnicodeDecodeError:
        raise _HEADER.error("model_name", "model name is not valid UTF-8", name_at) from None
    metadata: dict[str, Any] = {}
    if meta_length:
        at, entries = meta_start, limits.max_metadata_entries
        metadata = decode_metadata(view[at:body], base_offset=at, max_entries=entries)
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
                section=what, field="element_type", offset=_HEADER.at("element_type")
            ) from None
    return StreamHeader(
        model=model,
        num_layers=None if layers == ws.NUM_LAYERS_UNKNOWN else layers,
        kv_roles=tuple(name for name, bit in ws.ROLE_BITS.items() if roles & bit),
        element_type=element_type,
        metadata=metadata,
        end_record=bool(flags & ws.STREAM_FLAG_END_RECORD),
    )


# -- end record ------------------------------------------------------------------------------
def _entry_bytes(entries: Sequence[StreamEntry]) -> bytes:
    """The index entries as the end record stores them."""
    return b"".join(
        _ENTRY.pack(
            offset=e.offset,
            length=e.length,
            layer_index=LAYER_NONE if e.layer_index is None else e.layer_index,
            kv_role=KV_ROLES[e.kv_role],
        )
        for e in entries
    )


def encode_end_record(entries: list[StreamEntry] | None, blob_count: int) -> bytes:
    """The end record: end-of-stream marker, blob count and (optionally) the index."""
    rows = entries if entries is not None and len(entries) <= _END.head.limit("entry_count") else []
    total = _END.total_for(_ENTRY.size * len(rows))
    fixed = _END.head.pack(
        version_major=1,
        version_minor=0,
        end_flags=0,
        total_length=total,
        blob_count=blob_count,
        entry_count=len(rows),
    )
    return _END.close(fixed + _entry_bytes(rows), total)


def decode_end_record(
    data: Any, *, limits: DecodeLimits | None = None
) -> tuple[int, tuple[StreamEntry, ...] | None]:
    """(blob_count, index entries or None) of the end record at the start of ``data``;
    ``limits.max_stream_entries`` bounds the index before anything else is read."""
    blob_count, rows = decode_end_rows(data, limits=limits)
    return blob_count, None if rows is None else entries_of(rows)


def entries_of(rows: npt.NDArray[Any]) -> tuple[StreamEntry, ...]:
    """The ``StreamEntry`` objects of checked index rows (~1-2 us each: call it last)."""
    layers = [None if v == LAYER_NONE else v for v in rows["layer_index"].tolist()]
    roles = [KV_ROLE_BY_CODE[v] for v in rows["kv_role"].tolist()]
    return tuple(map(StreamEntry, rows["offset"].tolist(), rows["length"].tolist(), layers, roles))


def decode_end_rows(
    data: Any, *, limits: DecodeLimits | None = None
) -> tuple[int, npt.NDArray[Any] | None]:
    """``decode_end_record`` with the index as a structured array viewing ``data``: the
    readers refuse an index that disagrees with the stream at no object per entry."""
    what = "end record"
    limits = check_limits_argument(limits)
    view = byte_view(data)
    at_count = _END.at("entry_count")
    end_count = at_count + _END.head.sizes["entry_count"]
    if len(view) >= end_count:  # the index size, before the record is checked or read
        count = int.from_bytes(view[at_count:end_count], "little")
        if count > limits.max_stream_entries:
            raise LimitExceededError(
                "end record index has more entries than the decode limit allows",
                section=what,
                field="entry_count",
                offset=at_count,
                expected=f"<= {limits.max_stream_entries} (DecodeLimits.max_stream_entries)",
                found=count,
            )
    view = _END.whole(view, _END.frame(view))
    fields = _END.head.struct.unpack_from(view, 0)
    _, _, minor, flags, total, blob_count, count, _ = fields
    spans = _END.spans(total, (("entries", _ENTRY.size * count),))
    footer, _ = spans["seal"]
    footer_total = footer + ws.FAST_END_FOOTER.offsets["total_length"]
    again = ws.FAST_END_FOOTER.unpack_dict(view, footer)["total_length"]
    if again != total:
        raise _END.error(
            "footer.total_length",
            "the footer's total_length disagrees with the prefix",
            footer_total,
            expected=total,
            found=again,
        )
    _END.check_seal(view, footer)
    _check_flags(_END, fields, flags, 0, "end_flags")
    body = spans["padding"][0]
    if body > footer:
        raise _END.error("entry_count", "index entries extend past total_length", found=count)
    if count and count != blob_count:
        raise _END.error(
            "entry_count",
            "the index must list every blob or none",
            expected=blob_count,
            found=count,
        )
    if minor == 0:
        check_zero(view, body, footer, error=InvalidStreamError, section=what)
    rows = np.frombuffer(view, _ENTRY_DTYPE, count, spans["entries"][0])
    bad = ~np.isin(rows["kv_role"], _ROLE_CODES) | rows["_reserved"].any(axis=1)
    if bad.any():
        number = int(np.argmax(bad))
        raise _END.error(
            f"entries[{number}]",
            "bad kv_role or reserved bytes in an index entry",
            spans["entries"][0] + _ENTRY.size * number + _ENTRY.offsets["kv_role"],
            found=int(rows["kv_role"][number]),
        )
    return blob_count, (rows if count or not blob_count else None)


def check_end_record(
    record: Any, entries: Sequence[StreamEntry], offset: int, limits: DecodeLimits | None
) -> None:
    """The end record at stream ``offset`` must agree with the blobs a reader met: their
    count, and the index (if any) row for row, compared as bytes."""
    count, rows = decode_end_rows(record, limits=limits)
    if count != len(entries) or (
        rows is not None and (len(rows) != len(entries) or rows.tobytes() != _entry_bytes(entries))
    ):
        raise InvalidStreamError(
            "the end record disagrees with the blobs read",
            section="end record",
            offset=offset,
            expected=f"{len(entries)} blobs",
            found=f"{count} blobs",
        )


# -- a blob under its header -----------------------------------------------------------------
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


def check_blob(
    expect: EngineFingerprint | None,
    header: StreamHeader | None,
    tensor: BlockPagedTensor,
    at: str,
) -> None:
    """A blob must carry the expected fingerprint if it carries one of its own, and be what
    the stream header says the stream holds."""
    own = None if expect is None else fingerprint_from_metadata(tensor.metadata)
    if expect is not None and own is not None:
        check_compatible(expect, own)
    if header is None:
        return

    def refuse(field: str, message: str, expected: Any, found: Any) -> InvalidStreamError:
        return InvalidStreamError(message, section=at, field=field, expected=expected, found=found)

    layer, wanted = tensor.layer_index, header.element_type
    if header.num_layers is not None and (layer is None or layer >= header.num_layers):
        message = "blob layer_index outside the stream header's num_layers"
        raise refuse("layer_index", message, f"< {header.num_layers}", layer)
    if header.kv_roles and tensor.kv_role not in header.kv_roles:
        message = "blob kv_role not among the stream header's kv_roles"
        raise refuse("kv_role", message, header.kv_roles, tensor.kv_role)
    if wanted is not None and tensor.element_type != wanted:
        message = "blob element type differs from the stream header's"
        raise refuse("element_type", message, wanted.name, tensor.element_type.name)


def empty_input_error() -> StreamTruncatedError:
    """No bytes at all is a stream cut at offset 0: every stream holds at least one record
    (its header, or without one a blob or the end record; docs/streaming.md § 5)."""
    return StreamTruncatedError(
        "empty input (0 bytes): a stream holds at least one record", section="stream", offset=0
    )


def locate(
    exc: HurrayWireError,
    blob: int,
    at: int,
    record: Any = None,
    *,
    layer: int | None = None,
    role: str | None = None,
) -> HurrayWireError:
    """``exc`` placed in blob ``blob`` at stream offset ``at``, with the layer and role of
    ``record``'s descriptor when the caller does not know them and it can be read."""
    if layer is None and role is None and record is not None:
        with contextlib.suppress(HurrayWireError):
            layout = peek_descriptor(record).layout
            layer, role = layout.layer_index, layout.kv_role
    return exc.located(blob=blob, blob_offset=at, layer=layer, role=role)
