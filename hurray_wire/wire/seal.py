"""The checksum that seals a self-checked record: xxh3_64 (seed 0) of the bytes it covers,
one little-endian u64 (the blob header, stream records, known pages, transfer records, the
fingerprint body).

Where each record keeps it is its struct's business (``HEADER_CHECKSUM``, ``RECORD_CHECKSUM``,
``KNOWN_PAGES_CHECKSUM``, ``FINGERPRINT_HEADER.body_checksum``); how it is computed and
where a trailing one sits is said once, here. Comparing the two values and naming the
field is the validating module's part.
"""

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
