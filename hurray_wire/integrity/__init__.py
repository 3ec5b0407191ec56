"""Integrity for KV transfers (docs/integrity.md): per-page digests that say *which* page is
corrupt, an engine fingerprint that says whether a cache is meaningful here, and a
content-addressed page store with a delta protocol that skips pages the receiver holds.
Nothing here frames a blob: the blob codec, streams and transports call these functions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hurray_wire._lazy import exports

if TYPE_CHECKING:
    from hurray_wire.fingerprint import (
        FINGERPRINT_METADATA_KEY,
        EngineFingerprint,
        check_compatible,
        decode_fingerprint,
        differences,
        encode_fingerprint,
        fingerprint_from_metadata,
        fingerprint_to_metadata,
        require_fingerprint,
    )
    from hurray_wire.integrity.arguments import check_integrity_arguments
    from hurray_wire.integrity.bloom import (
        KnownPagesBloom,
        bloom_candidates,
        confirm_known,
        decode_known_pages_bloom,
        encode_known_pages_bloom,
    )
    from hurray_wire.integrity.delta import (
        DeltaPlan,
        FillReport,
        PageRefs,
        check_plan,
        decode_known_pages,
        decode_page_refs,
        encode_known_pages,
        encode_page_refs,
        fill_from_store,
        gather_sent,
        place_sent_pages,
        plan_delta,
    )
    from hurray_wire.integrity.digests import (
        PageDigestReport,
        PageRecords,
        decode_digest_section,
        digests_and_checksum,
        encode_digest_section,
        logical_positions,
        page_digests,
        page_records,
        record_digest,
        verify_page_digests,
    )
    from hurray_wire.integrity.page_store import MemoryPageStore, PageStore, store_pages
    from hurray_wire.integrity.pool_store import EnginePoolStore

__all__ = [
    "FINGERPRINT_METADATA_KEY",
    "DeltaPlan",
    "EngineFingerprint",
    "EnginePoolStore",
    "FillReport",
    "KnownPagesBloom",
    "MemoryPageStore",
    "PageDigestReport",
    "PageRecords",
    "PageRefs",
    "PageStore",
    "bloom_candidates",
    "check_compatible",
    "check_integrity_arguments",
    "check_plan",
    "confirm_known",
    "decode_digest_section",
    "decode_fingerprint",
    "decode_known_pages",
    "decode_known_pages_bloom",
    "decode_page_refs",
    "differences",
    "digests_and_checksum",
    "encode_digest_section",
    "encode_fingerprint",
    "encode_known_pages",
    "encode_known_pages_bloom",
    "encode_page_refs",
    "fill_from_store",
    "fingerprint_from_metadata",
    "fingerprint_to_metadata",
    "gather_sent",
    "logical_positions",
    "page_digests",
    "page_records",
    "place_sent_pages",
    "plan_delta",
    "record_digest",
    "require_fingerprint",
    "store_pages",
    "verify_page_digests",
]

#: Each name by the module that defines it, imported on first use (hurray_wire._lazy).
__getattr__, __dir__ = exports(
    __name__,
    {
        "hurray_wire.fingerprint": "FINGERPRINT_METADATA_KEY EngineFingerprint check_compatible"
        " decode_fingerprint differences encode_fingerprint"
        " fingerprint_from_metadata fingerprint_to_metadata"
        " require_fingerprint",
        "hurray_wire.integrity.arguments": "check_integrity_arguments",
        "hurray_wire.integrity.bloom": "KnownPagesBloom bloom_candidates confirm_known"
        " decode_known_pages_bloom encode_known_pages_bloom",
        "hurray_wire.integrity.delta": "DeltaPlan FillReport PageRefs check_plan"
        " decode_known_pages decode_page_refs encode_known_pages"
        " encode_page_refs fill_from_store gather_sent"
        " place_sent_pages plan_delta",
        "hurray_wire.integrity.digests": "PageDigestReport PageRecords decode_digest_section"
        " digests_and_checksum encode_digest_section"
        " logical_positions page_digests page_records"
        " record_digest verify_page_digests",
        "hurray_wire.integrity.page_store": "MemoryPageStore PageStore store_pages",
        "hurray_wire.integrity.pool_store": "EnginePoolStore",
    },
)
