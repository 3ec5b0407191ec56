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
        FINGERPRINT_METADATA_KEY as FINGERPRINT_METADATA_KEY,
        EngineFingerprint as EngineFingerprint,
        check_compatible as check_compatible,
        decode_fingerprint as decode_fingerprint,
        differences as differences,
        encode_fingerprint as encode_fingerprint,
        fingerprint_from_metadata as fingerprint_from_metadata,
        fingerprint_to_metadata as fingerprint_to_metadata,
        require_fingerprint as require_fingerprint,
    )
    from hurray_wire.integrity.bloom import (
        KnownPagesBloom as KnownPagesBloom,
        bloom_candidates as bloom_candidates,
        confirm_known as confirm_known,
        decode_known_pages_bloom as decode_known_pages_bloom,
        encode_known_pages_bloom as encode_known_pages_bloom,
    )
    from hurray_wire.integrity.delta import (
        DeltaPlan as DeltaPlan,
        FillReport as FillReport,
        PageRefs as PageRefs,
        check_plan as check_plan,
        decode_known_pages as decode_known_pages,
        decode_page_refs as decode_page_refs,
        encode_known_pages as encode_known_pages,
        encode_page_refs as encode_page_refs,
        fill_from_store as fill_from_store,
        gather_sent as gather_sent,
        place_sent_pages as place_sent_pages,
        plan_delta as plan_delta,
    )
    from hurray_wire.integrity.digests import (
        PageDigestReport as PageDigestReport,
        PageRecords as PageRecords,
        decode_digest_section as decode_digest_section,
        digests_and_checksum as digests_and_checksum,
        encode_digest_section as encode_digest_section,
        logical_positions as logical_positions,
        page_digests as page_digests,
        page_records as page_records,
        record_digest as record_digest,
        verify_page_digests as verify_page_digests,
    )
    from hurray_wire.integrity.page_store import (
        MemoryPageStore as MemoryPageStore,
        PageStore as PageStore,
        check_integrity_arguments as check_integrity_arguments,
        store_pages as store_pages,
    )
    from hurray_wire.integrity.pool_store import EnginePoolStore as EnginePoolStore

#: Each name by the module that defines it, imported on first use (hurray_wire._lazy).
_NAMES = {
    "hurray_wire.fingerprint": "FINGERPRINT_METADATA_KEY EngineFingerprint check_compatible"
    " decode_fingerprint differences encode_fingerprint"
    " fingerprint_from_metadata fingerprint_to_metadata"
    " require_fingerprint",
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
    "hurray_wire.integrity.page_store": "MemoryPageStore PageStore check_integrity_arguments"
    " store_pages",
    "hurray_wire.integrity.pool_store": "EnginePoolStore",
}
__all__ = sorted(name for names in _NAMES.values() for name in names.split())
__getattr__, __dir__ = exports(__name__, _NAMES)
