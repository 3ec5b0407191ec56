"""The checksum that seals a self-checked record (the blob header, stream records, known
pages, transfer records, the fingerprint body): xxh3_64 (seed 0) of the bytes it covers,
one little-endian u64; where each record keeps it is its struct's business."""

from __future__ import annotations

import construct as c
import xxhash

from hurray_wire.wire.fast import item_struct

SEAL_ITEM = c.Int64ul
_SEAL = item_struct(SEAL_ITEM)
SEAL_SIZE = _SEAL.size

checksum_of = xxhash.xxh3_64_intdigest  # the record checksum of a bytes-like


def seal(body: bytes) -> bytes:
    """``body`` followed by its checksum: a whole self-checked record."""
    return body + _SEAL.pack(checksum_of(body))
