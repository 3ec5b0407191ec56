"""The fp8 engine scalar (vLLM's ``k_scale`` / ``v_scale``; an fp8 cache travels
unquantized, [A12]) in the reserved metadata key ``hurray.k_scale`` / ``hurray.v_scale``,
checked by ``from_arrays`` and every decoder."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from hurray_wire.errors import ArgumentTypeError, InvalidMetadataError
from hurray_wire.wire.integrity import FINGERPRINT_METADATA_KEY

__all__ = [
    "KV_SCALE_KEYS",
    "RESERVED_PREFIX",
    "RESERVED_TENSOR_KEYS",
    "check_reserved_metadata",
    "kv_scale_of",
    "with_kv_scale",
]

KV_SCALE_KEYS = ("hurray.k_scale", "hurray.v_scale")
RESERVED_PREFIX = "hurray."
#: Every reserved key a tensor's metadata may hold: the fp8 scales (checked here) and the
#: engine fingerprint (its value is hurray_wire.integrity.fingerprint's to check). Any other
#: ``hurray.`` key is refused, so that a later version can give one a meaning without an
#: old file already holding it with another (docs/security.md, "Decisions and limits").
RESERVED_TENSOR_KEYS = frozenset((*KV_SCALE_KEYS, FINGERPRINT_METADATA_KEY))
_BY_ROLE = {"key": "hurray.k_scale", "value": "hurray.v_scale", "fused": "hurray.k_scale"}


def _checked(value: object, field: str) -> float:
    if not isinstance(value, float):
        raise InvalidMetadataError("must be a float (float64)", field=field, found=repr(value))
    if not math.isfinite(value) or value <= 0.0:
        raise InvalidMetadataError("must be finite and > 0", field=field, found=value)
    return value


def with_kv_scale(metadata: dict[str, Any], kv_scale: object, kv_role: str) -> dict[str, Any]:
    """``metadata`` with the ``kv_scale`` argument stored under the role's reserved key."""
    if kv_scale is None:
        return metadata
    if isinstance(kv_scale, (bool, np.bool_)) or not isinstance(
        kv_scale, (int, float, np.integer, np.floating)
    ):
        raise ArgumentTypeError("kv_scale must be a float", field="kv_scale", found=repr(kv_scale))
    value = _checked(float(kv_scale), "kv_scale")
    key = _BY_ROLE[kv_role]
    if key in metadata and metadata[key] != value:
        raise InvalidMetadataError(
            f"kv_scale disagrees with metadata[{key!r}]",
            field="kv_scale",
            found=value,
            expected=metadata[key],
        )
    return {**metadata, key: value}


def check_reserved_metadata(metadata: Mapping[str, Any], kv_role: str) -> None:
    """Refuse a ``hurray.`` key this version does not define, and a scale key that is not
    the role's or not a finite positive float."""
    for key in metadata:
        reserved = isinstance(key, str) and key.startswith(RESERVED_PREFIX)
        if reserved and key not in RESERVED_TENSOR_KEYS:
            raise InvalidMetadataError(
                f"unknown reserved key: keys starting with {RESERVED_PREFIX!r} are reserved "
                "for hurray-wire",
                field=key,
                expected=sorted(RESERVED_TENSOR_KEYS),
                found=repr(key),
            )
    expected = _BY_ROLE[kv_role]
    for key in KV_SCALE_KEYS:
        if key in metadata and key != expected:
            raise InvalidMetadataError(
                f"a {kv_role} tensor carries its scale in {expected!r}",
                field=key,
                found=repr(metadata[key]),
            )
        if key in metadata:
            _checked(metadata[key], key)


def kv_scale_of(metadata: Mapping[str, Any], kv_role: str) -> float | None:
    """The (already validated) scale, or None."""
    value = metadata.get(_BY_ROLE[kv_role])
    return None if value is None else float(value)
