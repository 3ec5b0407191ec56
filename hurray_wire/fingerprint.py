"""The engine fingerprint (docs/integrity.md § 3): refuse KV bytes from an engine whose cache
would not mean the same thing here (another model, layout, dtype, block size or TP split).

Not in ``integrity/``: ``BlockPagedTensor.from_arrays`` validates its metadata entry. Its
body is in the KV metadata encoding, not JSON (which accepts NaN, duplicate keys and nesting
deep enough to raise RecursionError).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any

from hurray_wire.buffers import byte_view
from hurray_wire.errors import (
    ArgumentTypeError,
    HurrayWireError,
    IncompatibleFingerprintError,
    InvalidMetadataError,
    instance,
)
from hurray_wire.metadata import INT64_MAX, UInt64, decode_metadata, encode_metadata
from hurray_wire.wire import integrity as w, records as wr
from hurray_wire.wire.seal import checksum_of

__all__ = [
    "FINGERPRINT_METADATA_KEY",
    "EngineFingerprint",
    "ExtraValue",
    "check_compatible",
    "decode_fingerprint",
    "differences",
    "encode_fingerprint",
    "fingerprint_from_metadata",
    "fingerprint_to_metadata",
    "require_fingerprint",
]

FINGERPRINT_METADATA_KEY = w.FINGERPRINT_METADATA_KEY
ExtraValue = str | int | float | bool
SECTION = "engine_fingerprint"
_RECORD = wr.FINGERPRINT.raising(InvalidMetadataError, InvalidMetadataError)
_HEAD = _RECORD.head
_STRINGS = ("model_id", "engine", "engine_version", "kv_cache_layout", "cache_dtype")
_INTS = ("block_size", "tp_rank", "tp_size")
_EXTRA_PREFIX = "extra."
MAX_STRING = 1024  # bytes of UTF-8 per string field or extras key/value
MAX_EXTRAS = 64


def _bad(message: str, name: str, value: object) -> InvalidMetadataError:
    return InvalidMetadataError(message, section=SECTION, field=name, found=repr(value))


def _check_text(value: object, name: str) -> str:
    if not isinstance(value, str):
        raise _bad("must be a str", name, value)
    if not value:
        raise _bad("must be a non-empty string", name, value)
    if len(value.encode("utf-8", "surrogatepass")) > MAX_STRING:
        raise _bad(f"must be at most {MAX_STRING} bytes of UTF-8", name, value[:40] + "...")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise _bad("must be encodable as UTF-8", name, value) from None
    return value


def _check_extra(value: object, name: str) -> ExtraValue:
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        if not -INT64_MAX - 1 <= value <= INT64_MAX:
            raise _bad("an int extra must fit in int64", name, value)
        return int(value)
    if isinstance(value, float):
        if not math.isfinite(value):  # NaN != NaN would make equal fingerprints differ
            raise _bad("a float extra must be finite", name, value)
        return value
    if isinstance(value, str):
        if len(value.encode("utf-8", "surrogatepass")) > MAX_STRING:
            raise _bad(f"a str extra must be at most {MAX_STRING} bytes", name, value[:40])
        return value
    raise _bad("an extra must be str, int, float or bool", name, value)


@dataclass(frozen=True)
class EngineFingerprint:
    """What must agree between two engines for one's KV pages to be valid in the other
    (``tp_rank`` aside: every rank of a TP group sends). ``extras``: engine-specific facts
    (e.g. rope scaling), str keys, str / int / float / bool values."""

    model_id: str
    engine: str
    engine_version: str
    kv_cache_layout: str
    cache_dtype: str
    block_size: int
    tp_rank: int
    tp_size: int
    extras: Mapping[str, ExtraValue] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in _STRINGS:
            _check_text(getattr(self, name), name)
        for name, least in (("block_size", 1), ("tp_size", 1), ("tp_rank", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise _bad("must be an int", name, value)
            if not least <= value <= INT64_MAX:
                raise _bad(f"must be in [{least}, 2**63)", name, value)
        if self.tp_rank >= self.tp_size:
            raise InvalidMetadataError(
                "tp_rank must be < tp_size",
                section=SECTION,
                field="tp_rank",
                found=self.tp_rank,
                expected=f"< {self.tp_size}",
            )
        if not isinstance(self.extras, Mapping):
            raise _bad("extras must be a mapping", "extras", self.extras)
        if len(self.extras) > MAX_EXTRAS:
            raise _bad(f"at most {MAX_EXTRAS} extras", "extras", len(self.extras))
        for key in self.extras:
            _check_text(key, "extras key")
        checked = {
            key: _check_extra(self.extras[key], f"extras[{key!r}]") for key in sorted(self.extras)
        }
        object.__setattr__(self, "extras", MappingProxyType(checked))

    def __hash__(self) -> int:
        values = tuple(getattr(self, f.name) for f in fields(self) if f.name != "extras")
        return hash((values, tuple(self.extras.items())))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, EngineFingerprint):
            return NotImplemented
        return not differences(self, other, ignore=())


def differences(
    a: EngineFingerprint, b: EngineFingerprint, *, ignore: tuple[str, ...] = ()
) -> dict[str, tuple[Any, Any]]:
    """Every field that differs, as ``{name: (a's value, b's value)}``; an extra present on
    one side only shows as ``extras.<key>`` with None on the other side. Types matter
    (``1`` and ``True`` differ)."""
    if isinstance(ignore, str) or not isinstance(ignore, (tuple, list, set, frozenset)):
        raise ArgumentTypeError(
            "ignore must be a tuple of field names", field="ignore", found=repr(ignore)
        )
    for name in ignore:
        if not isinstance(name, str):
            raise ArgumentTypeError("ignore holds field names", field="ignore", found=repr(name))
    instance(a, EngineFingerprint, "a")
    instance(b, EngineFingerprint, "b")
    out: dict[str, tuple[Any, Any]] = {}
    for name in (*_STRINGS, *_INTS):
        if name not in ignore and getattr(a, name) != getattr(b, name):
            out[name] = (getattr(a, name), getattr(b, name))
    if "extras" in ignore:
        return out
    for key in sorted(set(a.extras) | set(b.extras)):
        name = f"extras.{key}"
        if name in ignore:
            continue
        left, right = a.extras.get(key), b.extras.get(key)
        if type(left) is not type(right) or left != right:
            out[name] = (left, right)
    return out


def check_compatible(
    a: EngineFingerprint, b: EngineFingerprint, *, ignore: tuple[str, ...] = ("tp_rank",)
) -> None:
    """Raise :class:`IncompatibleFingerprintError` naming every differing field."""
    found = differences(a, b, ignore=ignore)
    if found:
        listed = "; ".join(f"{k}: {v[0]!r} != {v[1]!r}" for k, v in found.items())
        raise IncompatibleFingerprintError(
            f"engine fingerprints differ in {len(found)} field(s): {listed}",
            section=SECTION,
            differences=found,
        )


# -- bytes ------------------------------------------------------------------------------------


def encode_fingerprint(fp: EngineFingerprint) -> bytes:
    """The fingerprint record: head + KV-encoded body (fields in order, extras sorted)."""
    instance(fp, EngineFingerprint, "fp")
    fields = {name: getattr(fp, name) for name in (*_STRINGS, *_INTS)}
    body = encode_metadata(fields | {_EXTRA_PREFIX + k: v for k, v in fp.extras.items()})
    return _RECORD.pack(body_length=len(body), body_checksum=checksum_of(body)) + body


def decode_fingerprint(data: object) -> EngineFingerprint:
    """A fingerprint record back to the dataclass; InvalidMetadataError on any defect."""
    view = byte_view(data, "data", allow_copy=True)
    head = _RECORD.read_head(view, what="fingerprint shorter than its head")
    if head["body_length"] != len(view) - _HEAD.size:
        msg = "body_length does not match the bytes after the head"
        found, size = head["body_length"], len(view) - _HEAD.size
        raise _RECORD.error("body_length", msg, found=found, expected=size)
    body = view[_HEAD.size :]
    at = _RECORD.at("body_checksum")
    _RECORD.check_checksum(head["body_checksum"], checksum_of(body), "body_checksum", at)
    try:
        entries = decode_metadata(body, base_offset=_HEAD.size)
    except HurrayWireError as exc:
        raise InvalidMetadataError(
            f"fingerprint body: {exc}", section=SECTION, field="body"
        ) from None
    names = (*_STRINGS, *_INTS)
    missing = [n for n in names if n not in entries]
    unknown = [k for k in entries if k not in names and not k.startswith(_EXTRA_PREFIX)]
    for what, keys in (("lacks", missing), ("has unknown", unknown)):
        if keys:
            raise InvalidMetadataError(
                f"fingerprint {what} fields", section=SECTION, field=keys[0], found=keys
            )
    cut = len(_EXTRA_PREFIX)
    extras: dict[str, Any] = {k[cut:]: v for k, v in entries.items() if k.startswith(_EXTRA_PREFIX)}
    # types checked by the constructor; a uint64 (>= 2**63) reaches its range check as an int
    kwargs: dict[str, Any] = {n: entries[n] for n in names}
    kwargs.update({n: int(v) for n, v in kwargs.items() if isinstance(v, UInt64)})
    try:
        fp = EngineFingerprint(**kwargs, extras=extras)
    except HurrayWireError as exc:
        raise exc.relocated(section=SECTION) from None
    if encode_fingerprint(fp) != bytes(view):  # one encoding per fingerprint
        raise InvalidMetadataError(
            "fingerprint is not in canonical form (field order, extras sorted, value tags)",
            section=SECTION,
            field="body",
        )
    return fp


def fingerprint_to_metadata(fp: EngineFingerprint) -> dict[str, bytes]:
    """``{"hurray.engine_fingerprint": record}``, to merge into a tensor's metadata."""
    return {FINGERPRINT_METADATA_KEY: encode_fingerprint(fp)}


def fingerprint_from_metadata(metadata: Mapping[str, Any]) -> EngineFingerprint | None:
    """The fingerprint a tensor's metadata carries, None when it has none."""
    if not isinstance(metadata, Mapping):
        raise ArgumentTypeError(
            "metadata must be a mapping", field="metadata", found=type(metadata).__name__
        )
    if FINGERPRINT_METADATA_KEY not in metadata:
        return None
    value = metadata[FINGERPRINT_METADATA_KEY]
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise InvalidMetadataError(
            "the engine fingerprint must be a bytes value",
            section=SECTION,
            field=FINGERPRINT_METADATA_KEY,
            found=type(value).__name__,
        )
    return decode_fingerprint(value)


def require_fingerprint(
    expected: EngineFingerprint | None,
    metadata: Mapping[str, Any],
    *,
    section: str = SECTION,
    ignore: tuple[str, ...] = ("tp_rank",),
) -> EngineFingerprint | None:
    """The fingerprint ``metadata`` carries (validated), checked against ``expected`` when
    one is given: a cache that carries none is refused too (of unknown origin, it is not
    decoded as if it were ours)."""
    found = fingerprint_from_metadata(metadata)
    if expected is None:
        return found
    if found is None:
        raise IncompatibleFingerprintError(
            f"no engine fingerprint ({FINGERPRINT_METADATA_KEY}) where one is required: "
            f"expected {expected.model_id!r} on {expected.engine!r}",
            section=section,
            field=FINGERPRINT_METADATA_KEY,
            differences={"fingerprint": (expected, None)},
        )
    check_compatible(expected, found, ignore=ignore)
    return found
