"""construct structs of the integrity records (docs/integrity.md): bytes only, no rules
(allowed versions, counts against limits, sortedness: ``hurray_wire.integrity``; where each
u64 item sits: ``wire/records.py``).
"""

from __future__ import annotations

import construct as c

from hurray_wire.wire.blob import (  # re-exported: the integrity records' section kinds
    KIND_PAGE_DIGESTS as KIND_PAGE_DIGESTS,
    KIND_PAGE_REFS as KIND_PAGE_REFS,
)

# The blob section kinds of the two payloads (docs/integrity.md § 6); wire/blob.py owns the
# table. 0x04 is optional (a reader that skips it loses only the page check); 0x05 is
# REQUIRED (a reader that skipped it would decode a short pool as garbage).

DIGEST_ALGORITHM_XXH3_64 = 1  # xxh3_64, seed 0, of the page record (docs/integrity.md § 2)
DIGEST_ITEM = c.Int64ul  # one digest, one page id

# Payload of a page-digest section: this 8-byte head, then ``count`` u64 digests, one per
# physical page in page-id order. The blob's section checksum covers the payload.
DIGEST_SECTION_VERSION = 1
DIGEST_SECTION_HEADER = c.Struct(
    "version" / c.Int8ul,
    "algorithm" / c.Int8ul,
    "_reserved" / c.Const(bytes(2)),
    "count" / c.Int32ul,
)

# Payload of a page-refs section: this 8-byte head, then ``count`` u64 physical page ids
# (strictly increasing, < num_pages), then ``count`` u64 digests (the page records to take
# from the receiver's store, in the same order): struct of arrays, each one NumPy view.
PAGE_REFS_VERSION = 1
PAGE_REFS_HEADER = DIGEST_SECTION_HEADER  # the same 8 bytes: version, algorithm, count

# Known pages (receiver -> sender, before a delta transfer): this 16-byte head, ``count``
# u64 digests strictly increasing, then KNOWN_PAGES_CHECKSUM: xxh3_64 of all bytes before it
# (the record travels outside a blob, so it carries its own checksum).
KNOWN_PAGES_MAGIC = b"HWKP"
KNOWN_PAGES_VERSION = 1
KNOWN_PAGES_FORM_SORTED = 0  # a sorted array of digests
KNOWN_PAGES_FORM_BLOOM = 1  # a Bloom filter of the digests (BLOOM_PARAMS, then the bit set)
KNOWN_PAGES_HEADER = c.Struct(
    "magic" / c.Const(KNOWN_PAGES_MAGIC),
    "version" / c.Int8ul,
    "form" / c.Int8ul,
    "algorithm" / c.Int8ul,
    "_reserved0" / c.Const(b"\0"),
    "count" / c.Int32ul,
    "_reserved1" / c.Const(bytes(4)),
)
KNOWN_PAGES_CHECKSUM = c.Struct("checksum" / c.Int64ul)

# Bloom form: the head (``count`` = digests inserted), these 8 bytes, ``2**log2_bits / 8``
# bytes of bit set (bit j of the filter is bit ``j % 8`` of byte ``j // 8``), the checksum.
BLOOM_PARAMS = c.Struct(
    "num_hashes" / c.Int8ul,
    "log2_bits" / c.Int8ul,
    "_reserved" / c.Const(bytes(6)),
)

# Engine fingerprint, the bytes value of metadata[FINGERPRINT_METADATA_KEY]: this 24-byte
# head, then ``body_length`` bytes of KV metadata encoding (containers.md § B.4; fields in a
# fixed order, then ``extra.<key>`` entries sorted by key). ``body_checksum``: xxh3_64 of the
# body.
FINGERPRINT_METADATA_KEY = "hurray.engine_fingerprint"
FINGERPRINT_MAGIC = b"HWFP"
FINGERPRINT_VERSION = 1
FINGERPRINT_HEADER = c.Struct(
    "magic" / c.Const(FINGERPRINT_MAGIC),
    "version" / c.Int8ul,
    "_reserved0" / c.Const(bytes(3)),
    "body_length" / c.Int32ul,
    "_reserved1" / c.Const(bytes(4)),
    "body_checksum" / c.Int64ul,
)
