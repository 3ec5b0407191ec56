"""Key/value metadata of a ``.hrry`` file (containers.md § B.4): a pure codec, bytes <-> dict.

``decode_metadata`` reads untrusted input, checks every length against what remains before
slicing, and raises only ``InvalidMetadataError`` (``ArgumentTypeError`` for a non-bytes
argument). A plain ``int`` is int64 when it fits, else uint64; ``Int64`` / ``UInt64`` force
the tag (in arrays too), and uint64 decodes as ``UInt64``, so decode -> encode keeps the
bytes. An empty array decodes but is refused on encode, as the reference writer refuses it.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, NoReturn, SupportsIndex, TypeAlias, TypeVar, cast

from hurray_wire.buffers import byte_view
from hurray_wire.errors import ArgumentTypeError, InvalidMetadataError, LimitExceededError
from hurray_wire.wire.containers import (
    KV_ARRAY,
    KV_BOOL,
    KV_BYTES,
    KV_FLOAT64,
    KV_INT64,
    KV_LEAST_PAYLOAD,
    KV_SCALAR_PAYLOADS,
    KV_STRING,
    KV_TAG_NAMES,
    KV_UINT64,
    KvEntry,
    KvSection,
)
from hurray_wire.wire.fast import array_struct, item_struct

__all__ = [
    "Int64",
    "MetadataArray",
    "MetadataInput",
    "MetadataScalar",
    "MetadataValue",
    "UInt64",
    "decode_metadata",
    "encode_metadata",
]

SECTION = "kv_metadata"

INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1
UINT64_MAX = (1 << 64) - 1
# Every format from the wire structs (wire/containers.py, § B.4).
_U16 = item_struct(KvEntry.key_length)  # key lengths
_U32 = item_struct(KvSection.kv_count)  # kv_count, array counts, string / bytes lengths
#: The fixed-width scalar tags (int64, uint64, float64): their formats and structs.
_FIXED_FORMAT = {tag: KV_SCALAR_PAYLOADS[tag] for tag in (KV_INT64, KV_UINT64, KV_FLOAT64)}
_FIXED = {tag: item_struct(form) for tag, form in _FIXED_FORMAT.items()}
_TAG = item_struct(KvEntry.value_tag).size  # a value tag, an array's element tag
_BOOL = KV_LEAST_PAYLOAD[KV_BOOL]  # a bool's one byte
_SIZED = {KV_STRING: "string", KV_BYTES: "bytes value"}  # the length-prefixed tags, named
U16_MAX = (1 << 8 * _U16.size) - 1
U32_MAX = (1 << 8 * _U32.size) - 1  # string/bytes lengths, array counts, kv_count, kv_length

# Smallest entry: key length, a 1-byte key, the tag and the smallest payload (a bool's byte).
_MIN_ENTRY_SIZE = _U16.size + 1 + _TAG + min(KV_LEAST_PAYLOAD.values())


_TI = TypeVar("_TI", bound="_TaggedInt")


class _TaggedInt(int):
    """An ``int`` whose value tag is chosen by its class, not by its value."""

    __slots__ = ()
    RANGE: ClassVar[tuple[int, int]]

    def __new__(cls: type[_TI], value: SupportsIndex) -> _TI:
        if isinstance(value, bool) or not hasattr(value, "__index__"):
            raise ArgumentTypeError(
                f"{cls.__name__}() takes an integer",
                section=SECTION,
                expected="int",
                found=type(value).__name__,
            )
        number = operator.index(value)
        lo, hi = cls.RANGE
        if not lo <= number <= hi:
            raise InvalidMetadataError(
                f"{number} is out of range for {cls.__name__}",
                section=SECTION,
                expected=f"{lo} <= value <= {hi}",
                found=number,
            )
        return super().__new__(cls, number)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({int(self)})"

    __str__ = int.__repr__


class Int64(_TaggedInt):
    """An ``int`` written with tag 02 (int64) whatever its value, e.g. inside a uint64 context."""

    __slots__ = ()
    RANGE = (INT64_MIN, INT64_MAX)


class UInt64(_TaggedInt):
    """An ``int`` written with tag 03 (uint64): how uint64 values below 2**63 keep their tag."""

    __slots__ = ()
    RANGE = (0, UINT64_MAX)


MetadataScalar: TypeAlias = str | int | float | bool | bytes
MetadataArray: TypeAlias = list[str] | list[int] | list[float] | list[bool] | list[bytes]
MetadataValue: TypeAlias = MetadataScalar | MetadataArray
"""What ``decode_metadata`` returns for one entry; arrays are flat lists of one type."""

MetadataInput: TypeAlias = (
    MetadataValue
    | bytearray
    | memoryview
    | Sequence[str]
    | Sequence[int]
    | Sequence[float]
    | Sequence[bytes | bytearray | memoryview]
)
"""What ``encode_metadata`` takes: also other bytes-likes, and tuples or ``list[UInt64]``."""


# --------------------------------------------------------------------------------------------
# Encoding
# --------------------------------------------------------------------------------------------


def _error(
    message: str, field: str | None, offset: int | None = None, **kw: Any
) -> InvalidMetadataError:
    return InvalidMetadataError(message, section=SECTION, field=field, offset=offset, **kw)


def _encode_text(text: str, field: str, what: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise _error(
            f"{what} is not encodable as UTF-8 ({exc.reason})",
            field,
            expected="a str without lone surrogates",
            found=repr(text[exc.start : exc.end]),
        ) from None


#: The tag family of each scalar type (02 for every int); a subclass (``Int64``, NumPy's
#: float64) found by isinstance, bool before int, its base.
_KINDS = {
    bool: KV_BOOL,
    int: KV_INT64,
    float: KV_FLOAT64,
    str: KV_STRING,
    bytes: KV_BYTES,
    bytearray: KV_BYTES,
    memoryview: KV_BYTES,
}


def _kind(value: object) -> int | None:
    """The tag family of a scalar, or None if it is not a scalar."""
    kind = _KINDS.get(type(value))
    if kind is None:
        kind = next((tag for cls, tag in _KINDS.items() if isinstance(value, cls)), None)
    return kind


def _int_tag(value: int, field: str) -> int:
    """Tag 02 or 03 for one scalar int (see the module docstring)."""
    if isinstance(value, UInt64):
        return KV_UINT64
    if isinstance(value, Int64) or INT64_MIN <= value <= INT64_MAX:
        return KV_INT64
    if 0 <= value <= UINT64_MAX:
        return KV_UINT64
    raise _error(
        "integer fits neither int64 nor uint64",
        field,
        expected=f"{INT64_MIN} <= value <= {UINT64_MAX}",
        found=value,
    )


def _array_int_tag(values: Sequence[int], field: str) -> int:
    """One tag for a whole int array: forced by a wrapper, else int64 if all fit, else uint64."""
    forced_u = next((j for j, v in enumerate(values) if isinstance(v, UInt64)), None)
    forced_i = next((j for j, v in enumerate(values) if isinstance(v, Int64)), None)
    if forced_u is not None and forced_i is not None:
        raise _error(
            "array mixes Int64 and UInt64 elements",
            field,
            expected="one element type",
            found=f"Int64 at [{forced_i}], UInt64 at [{forced_u}]",
        )
    why = ""
    if forced_u is not None:
        lo, hi, tag = 0, UINT64_MAX, KV_UINT64
    elif forced_i is not None or all(INT64_MIN <= v <= INT64_MAX for v in values):
        lo, hi, tag = INT64_MIN, INT64_MAX, KV_INT64
    else:
        lo, hi, tag = 0, UINT64_MAX, KV_UINT64
        why = " (chosen because another element exceeds int64)"
    for j, v in enumerate(values):
        if not lo <= v <= hi:
            raise _error(
                f"array element does not fit the array's element type {KV_TAG_NAMES[tag]}{why}",
                f"{field}[{j}]",
                expected=f"{lo} <= value <= {hi}",
                found=v,
            )
    return tag


def _encode_array(values: Sequence[object], field: str) -> bytes:
    if not values:
        raise _error(
            "empty arrays cannot be written (the reference writer refuses them)",
            field,
            expected="at least one element",
            found="[]",
        )
    if len(values) > U32_MAX:
        raise _error(
            "array too long for its u32 count",
            field,
            expected=f"at most {U32_MAX} elements",
            found=len(values),
        )
    first = _kind(values[0])
    for j, element in enumerate(values):
        kind = _kind(element)
        if kind is None:
            raise ArgumentTypeError(
                "array elements must be str, int, float, bool or bytes (arrays do not nest)",
                section=SECTION,
                field=f"{field}[{j}]",
                expected="str, int, float, bool or bytes",
                found=type(element).__name__,
            )
        if kind != first:
            raise _error(
                "array elements must all have one type (the reference writer refuses mixed arrays)",
                f"{field}[{j}]",
                expected=type(values[0]).__name__,
                found=type(element).__name__,
            )
    assert first is not None  # every element's kind was checked above
    tag = _array_int_tag(cast("Sequence[int]", values), field) if first == KV_INT64 else first
    if tag in _FIXED_FORMAT:  # one pack for the whole array
        body = array_struct(_FIXED_FORMAT[tag], len(values)).pack(*values)
    else:
        body = b"".join(_payload(tag, v, f"{field}[{j}]") for j, v in enumerate(values))
    return bytes((tag,)) + _U32.pack(len(values)) + body


def _payload(tag: int, value: Any, field: str) -> bytes:
    """The payload of one value of a scalar tag, alone or in an array."""
    if tag in _FIXED:
        return _FIXED[tag].pack(value)
    if tag == KV_BOOL:
        return b"\x01" if value else b"\x00"
    what = _SIZED[tag]
    payload = _encode_text(value, field, what) if tag == KV_STRING else bytes(value)
    if len(payload) > U32_MAX:
        raise _error(
            f"{what} is too long for its u32 length",
            field,
            expected=f"at most {U32_MAX} bytes",
            found=f"{len(payload)} bytes",
        )
    return _U32.pack(len(payload)) + payload


def _encode_value(value: object, field: str) -> bytes:
    """Tag byte and payload of one value."""
    kind = _kind(value)
    if kind is not None:
        tag = _int_tag(cast(int, value), field) if kind == KV_INT64 else kind
        return bytes((tag,)) + _payload(tag, value, field)
    if isinstance(value, (list, tuple)):
        return bytes((KV_ARRAY,)) + _encode_array(value, field)
    raise ArgumentTypeError(
        "metadata values must be str, int, float, bool, bytes or a list of one of them",
        section=SECTION,
        field=field,
        expected="str, int, float, bool, bytes or list",
        found=type(value).__name__,
    )


def encode_metadata(entries: Mapping[str, MetadataInput]) -> bytes:
    """The KV section for ``entries``, in mapping order, without the file's padding to 8.

    An empty mapping gives the 4-byte section ``kv_count = 0``; a file writer omits the
    section instead (``kv_offset = kv_length = 0``), as the reference does.
    """
    if not isinstance(entries, Mapping):
        raise ArgumentTypeError(
            "metadata must be a mapping of str keys to values",
            section=SECTION,
            expected="Mapping[str, MetadataValue]",
            found=type(entries).__name__,
        )
    parts = [b""]
    count = 0
    for index, (key, value) in enumerate(entries.items()):
        if not isinstance(key, str):
            raise ArgumentTypeError(
                "metadata keys must be str",
                section=SECTION,
                field=f"entries[{index}].key",
                expected="str",
                found=f"{type(key).__name__} {key!r}",
            )
        field = f"entries[{index}]({key!r})"
        key_bytes = _encode_text(key, f"{field}.key", "key")
        if not key_bytes:
            raise _error(
                "keys must not be empty",
                f"entries[{index}].key",
                expected="1..65535 bytes",
                found="''",
            )
        if len(key_bytes) > U16_MAX:
            raise _error(
                "key too long for its u16 length",
                f"entries[{index}].key",
                expected=f"at most {U16_MAX} UTF-8 bytes",
                found=f"{len(key_bytes)} bytes",
            )
        parts.append(_U16.pack(len(key_bytes)))
        parts.append(key_bytes)
        parts.append(_encode_value(value, f"{field}.value"))
        count += 1
    if count > U32_MAX:
        raise _error("too many entries for the u32 kv_count", "kv_count", found=count)
    parts[0] = _U32.pack(count)
    section = b"".join(parts)
    if len(section) > U32_MAX:
        raise _error(
            "KV section too large for the trailer's u32 kv_length",
            None,
            expected=f"at most {U32_MAX} bytes",
            found=f"{len(section)} bytes",
        )
    return section


# --------------------------------------------------------------------------------------------
# Decoding
# --------------------------------------------------------------------------------------------

# One reader: each check sits where the fast loop reads, and a fault raises there, named by
# field and file offset (``base`` + position); field names are built only for an error.


def _ends_inside(what: str, field: str, at: int, size: int, end: int, base: int) -> NoReturn:
    raise _error(
        f"section ends inside {what}",
        field,
        base + at,
        expected=f"{size} bytes",
        found=f"{end - at} bytes left",
    )


def _not_utf8(exc: UnicodeDecodeError, at: int, field: str, what: str, base: int) -> NoReturn:
    raise _error(
        f"{what} is not valid UTF-8 ({exc.reason})",
        field,
        base + at + exc.start,
        expected="UTF-8",
        found=f"bytes {exc.object[exc.start : exc.end].hex(' ')}",
    ) from None


def _bad_bool(byte: int, field: str, at: int) -> NoReturn:
    raise _error("bool must be 0x00 or 0x01", field, at, expected="0x00 or 0x01",
                 found=f"0x{byte:02X}")  # fmt: skip


def _bad_tag(tag: int, field: str, at: int, *, element: bool) -> NoReturn:
    if tag == KV_ARRAY and element:
        message = "arrays do not nest: element tag 0x07 is not allowed"
    elif 0xF0 <= tag <= 0xFE:
        message = f"private value tag 0x{tag:02X} is not agreed out of band"
    else:
        message = f"unknown value tag 0x{tag:02X}"
    expected = "an element tag 0x01-0x06" if element else "a value tag 0x01-0x07"
    raise _error(message, field, at, expected=expected, found=f"0x{tag:02X}")


def _value(index: int, key: str, element: int | None = None) -> str:
    """The field name of entry ``index``'s value (or of one of its array's elements)."""
    field = f"entries[{index}]({key!r}).value"
    return field if element is None else f"{field}[{element}]"


def _sized(view: memoryview, pos: int, end: int, tag: int, base: int,
           where: tuple[int, str, int | None]) -> tuple[str | bytes, int]:  # fmt: skip
    """A string or bytes payload (u32 length, then the bytes) at ``pos``, an entry's value
    or an array element, and its end; ``where``: ``_value``'s arguments, for an error."""
    if pos + _U32.size > end:
        length_name = "string length" if tag == KV_STRING else "bytes length"
        _ends_inside(length_name, f"{_value(*where)}.length", pos, _U32.size, end, base)
    (length,) = _U32.unpack_from(view, pos)
    pos += _U32.size
    if pos + length > end:
        _ends_inside(_SIZED[tag], _value(*where), pos, length, end, base)
    raw = view[pos : pos + length]
    if tag == KV_BYTES:
        return bytes(raw), pos + length
    try:
        return str(raw, "utf-8"), pos + length
    except UnicodeDecodeError as exc:
        _not_utf8(exc, pos, _value(*where), _SIZED[tag], base)


def _array(view: memoryview, pos: int, end: int, base: int, index: int, key: str
           ) -> tuple[list[Any], int]:  # fmt: skip
    """Entry ``index``'s array payload at ``pos`` (element tag, u32 count, elements), and
    the end of it."""
    if pos + _TAG > end:
        _ends_inside("array element tag", f"{_value(index, key)}.element_tag", pos, _TAG, end, base)
    tag = view[pos]
    if tag not in KV_LEAST_PAYLOAD:
        _bad_tag(tag, f"{_value(index, key)}.element_tag", base + pos, element=True)
    pos += _TAG
    if pos + _U32.size > end:
        _ends_inside("array count", f"{_value(index, key)}.count", pos, _U32.size, end, base)
    (count,) = _U32.unpack_from(view, pos)
    pos += _U32.size
    least = count * KV_LEAST_PAYLOAD[tag]  # a count of 4 billion: refused before any list
    remaining = end - pos
    if least > remaining:
        raise _error(
            f"array count too large: {count} {KV_TAG_NAMES[tag]} elements need at least "
            f"{least} bytes but the section has {remaining} left",
            f"{_value(index, key)}.count",
            base + pos - _U32.size,
            expected=f"at most {remaining // KV_LEAST_PAYLOAD[tag]} elements",
            found=count,
        )
    if tag in _FIXED_FORMAT:  # the count check above covers the whole payload
        values = list(array_struct(_FIXED_FORMAT[tag], count).unpack_from(view, pos))
        return ([UInt64(v) for v in values] if tag == KV_UINT64 else values), pos + least
    if tag == KV_BOOL:
        raw = bytes(view[pos : pos + least])
        if raw.translate(None, b"\x00\x01"):
            j = next(j for j, b in enumerate(raw) if b > 1)
            _bad_bool(raw[j], _value(index, key, j), base + pos + j)
        return [b == 1 for b in raw], pos + least
    values = []
    for j in range(count):
        value, pos = _sized(view, pos, end, tag, base, (index, key, j))
        values.append(value)
    return values, pos


def _entries(view: memoryview, count: int, base: int) -> dict[str, MetadataValue]:
    """The ``count`` entries after ``kv_count``, in one pass with no per-entry bookkeeping
    (~1 us a scalar entry): every read is checked where it happens, and a fault raises there."""
    end = len(view)
    pos = _U32.size
    u16, w16, w8 = _U16.unpack_from, _U16.size, _TAG
    entries: dict[str, MetadataValue] = {}
    value: MetadataValue
    for index in range(count):
        if pos + w16 > end:
            _ends_inside(f"key length of entry {index}", f"entries[{index}].key_length", pos,
                         w16, end, base)  # fmt: skip
        (key_length,) = u16(view, pos)
        if not key_length:
            raise _error(f"entry {index} has an empty key", f"entries[{index}].key_length",
                         base + pos, expected=f"1..{U16_MAX}", found=0)  # fmt: skip
        pos += w16
        stop = pos + key_length
        if stop > end:
            _ends_inside(f"key of entry {index}", f"entries[{index}].key", pos, key_length, end,
                         base)  # fmt: skip
        try:
            key = str(view[pos:stop], "utf-8")
        except UnicodeDecodeError as exc:
            _not_utf8(exc, pos, f"entries[{index}].key", f"key of entry {index}", base)
        if key in entries:
            raise _error(
                f"duplicate key {key!r} (first used by entries[{list(entries).index(key)}])",
                f"entries[{index}].key",
                base + pos,
                expected="unique keys",
                found=repr(key),
            )
        if stop + w8 > end:
            _ends_inside("value tag", f"{_value(index, key)}_tag", stop, w8, end, base)
        tag = view[stop]
        pos = stop + w8
        if tag in _FIXED:  # (arrays of these, and of bools, are read as a whole in _array)
            width = KV_LEAST_PAYLOAD[tag]
            if pos + width > end:
                _ends_inside(KV_TAG_NAMES[tag], _value(index, key), pos, width, end, base)
            (number,) = _FIXED[tag].unpack_from(view, pos)
            value = UInt64(number) if tag == KV_UINT64 else number
            pos += width
        elif tag == KV_BOOL:
            if pos + _BOOL > end:
                _ends_inside("bool", _value(index, key), pos, _BOOL, end, base)
            if view[pos] > 1:
                _bad_bool(view[pos], _value(index, key), base + pos)
            value = view[pos] == 1
            pos += _BOOL
        elif tag in _SIZED:
            value, pos = _sized(view, pos, end, tag, base, (index, key, None))
        elif tag == KV_ARRAY:
            value, pos = _array(view, pos, end, base, index, key)
        else:
            _bad_tag(tag, f"{_value(index, key)}_tag", base + stop, element=False)
        entries[key] = value
    if pos != end:
        raise _error(
            f"trailing bytes after the last of {count} entries (kv_count too small, or junk)",
            "kv_count",
            base + pos,
            expected=f"section end at {base + pos}",
            found=f"{end - pos} trailing bytes",
        )
    return entries


def decode_metadata(
    data: object, *, base_offset: int = 0, max_entries: int | None = None
) -> dict[str, MetadataValue]:
    """The entries of exactly one KV section (``kv_length`` bytes, no padding), in file order.

    ``base_offset`` (the section's ``kv_offset``) is added to every offset an error reports,
    so a file reader's errors point into the file. ``max_entries`` (``DecodeLimits.
    max_metadata_entries`` for the readers that have limits) refuses a larger ``kv_count``
    with a ``LimitExceededError`` before any entry is read: a decoded entry costs ~150 bytes
    of Python objects, ~20x a tiny entry's wire size.
    """
    if isinstance(base_offset, bool) or not isinstance(base_offset, int) or base_offset < 0:
        raise ArgumentTypeError(
            "base_offset must be a non-negative int",
            section=SECTION,
            expected="int >= 0",
            found=repr(base_offset),
        )
    view = byte_view(data, "data", allow_copy=True)
    if len(view) < _U32.size:
        _ends_inside("kv_count", "kv_count", 0, _U32.size, len(view), base_offset)
    (count,) = _U32.unpack_from(view, 0)
    # (a count the section cannot even hold is a malformed section, said by the reader)
    fits = count * _MIN_ENTRY_SIZE <= len(view) - _U32.size
    if max_entries is not None and count > max_entries and fits:
        raise LimitExceededError(
            "metadata has more entries than the decode limit allows",
            section=SECTION,
            field="kv_count",
            offset=base_offset,
            expected=f"<= {max_entries} (DecodeLimits.max_metadata_entries)",
            found=count,
        )
    return _entries(view, count, base_offset)
