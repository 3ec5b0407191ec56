"""The blob: one BlockPagedTensor <-> one self-contained, checksummed byte string.

The byte layout is docs/wire-format.md. ``envelope`` owns the fixed header and framing,
``sections`` the section table's rules, ``encoder`` and ``decoder`` the two directions (each
an object holding its options and one cache, ``DEFAULT_ENCODER`` / ``DEFAULT_DECODER``),
``landing`` where a decoded pool goes in caller memory, ``limits`` what a blob may make the
decoder do. Nothing is returned before the whole blob is validated.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hurray_wire._lazy import exports

if TYPE_CHECKING:
    from hurray_wire.blob.decoder import (
        DEFAULT_DECODER,
        Decoder,
        DecodeReport,
        decode,
        decode_report,
        peek_descriptor,
    )
    from hurray_wire.blob.encoder import DEFAULT_ENCODER, Encoder, encode, encode_into, encode_parts
    from hurray_wire.blob.envelope import BLOB_PREFIX_SIZE, blob_length
    from hurray_wire.blob.landing import InPlace, InPlaceReport, IntoArray, IntoPages, peek_in_place
    from hurray_wire.blob.limits import DEFAULT_LIMITS, DecodeLimits

__all__ = [
    "BLOB_PREFIX_SIZE",
    "DEFAULT_DECODER",
    "DEFAULT_ENCODER",
    "DEFAULT_LIMITS",
    "DecodeLimits",
    "DecodeReport",
    "Decoder",
    "Encoder",
    "InPlace",
    "InPlaceReport",
    "IntoArray",
    "IntoPages",
    "blob_length",
    "decode",
    "decode_report",
    "encode",
    "encode_into",
    "encode_parts",
    "peek_descriptor",
    "peek_in_place",
]

#: Each name by the module that defines it, imported on first use (hurray_wire._lazy).
__getattr__, __dir__ = exports(
    __name__,
    {
        "hurray_wire.blob.decoder": "DEFAULT_DECODER Decoder DecodeReport decode decode_report"
        " peek_descriptor",
        "hurray_wire.blob.encoder": "DEFAULT_ENCODER Encoder encode encode_into encode_parts",
        "hurray_wire.blob.envelope": "BLOB_PREFIX_SIZE blob_length",
        "hurray_wire.blob.landing": "InPlace InPlaceReport IntoArray IntoPages peek_in_place",
        "hurray_wire.blob.limits": "DEFAULT_LIMITS DecodeLimits",
    },
)
