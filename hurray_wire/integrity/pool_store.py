"""A page store over an engine's own KV pool (docs/integrity.md § 5.3): no copies, so that
the in-place decode points a block table at the engine's pages instead of copying them.
"""

from __future__ import annotations

import threading
from collections.abc import Collection
from typing import Any

import numpy as np
import numpy.typing as npt

from hurray_wire._interop import engine_array
from hurray_wire.errors import ArgumentTypeError, PageStoreError
from hurray_wire.integrity.digests import (
    DigestArray,
    IntArray,
    PageRecords,
    check_digest_range,
    digest_array,
)
from hurray_wire.integrity.page_store import KeyedStore, check_record, page_id_array

__all__ = ["EnginePoolStore"]


class EnginePoolStore(KeyedStore):
    """A ``PageStore`` over an engine's pool for one {layer, kv_role} that holds no bytes:
    digest -> page id of the pages the engine vouches for (``index``; ``forget`` before it
    frees or overwrites them, else the re-hash of every referenced page refuses them). The
    arrays are never written; ``put`` accepts only indexed records (the engine's allocator
    owns the slots). Thread-safe (one lock, hashing outside it)."""

    def __init__(
        self, page_pool: object, *, scales: object = None, zero_points: object = None
    ) -> None:
        pool = engine_array(page_pool, "page_pool")
        if pool.ndim < 2:
            raise ArgumentTypeError(
                "page_pool must be [num_pages, ...] with at least 2 dimensions",
                field="page_pool",
                found=f"shape {pool.shape}",
            )
        count = int(pool.shape[0])
        if zero_points is not None and scales is None:
            raise ArgumentTypeError(
                "zero_points without scales", field="zero_points", expected="scales too"
            )
        self.page_pool: npt.NDArray[Any] = pool
        self.scales = None if scales is None else engine_array(scales, "scales")
        self.zero_points = None if zero_points is None else engine_array(zero_points, "zero_points")
        self.records = PageRecords.of(
            count, page_pool=pool, scales=self.scales, zero_points=self.zero_points
        )
        self._digest_of: dict[int, int] = {}  # page -> digest
        self._pages_of: dict[int, list[int]] = {}  # digest -> pages holding it (first: used)
        self._lock = threading.Lock()

    @property
    def num_pages(self) -> int:
        """Physical pages of the engine's pool."""
        return self.records.num_pages

    def __len__(self) -> int:
        """Indexed pages."""
        with self._lock:
            return len(self._digest_of)

    # -- what the engine calls ---------------------------------------------------------------
    def index(self, page_ids: object) -> DigestArray:
        """Digest the engine's pages ``page_ids`` now and vouch for them: each becomes
        available under its digest until ``forget``. Returns their digests, in the order
        given. A page indexed again is re-digested (its old digest dropped)."""
        ids = page_id_array(page_ids, self.num_pages, "page_ids")
        digests = self.records.digests_at(ids)  # outside the lock: reads the pool
        with self._lock:
            for page, digest in zip(ids.tolist(), digests.tolist(), strict=True):
                self._drop(page)
                self._digest_of[page] = digest
                self._pages_of.setdefault(digest, []).append(page)
        return digests

    def forget(self, page_ids: object) -> None:
        """Stop vouching for ``page_ids`` (call before the engine frees or overwrites them);
        pages that are not indexed are ignored."""
        ids = page_id_array(page_ids, self.num_pages, "page_ids")
        with self._lock:
            for page in ids.tolist():
                self._drop(page)

    def _drop(self, page: int) -> None:
        digest = self._digest_of.pop(page, None)
        if digest is None:
            return
        holders = self._pages_of[digest]
        holders.remove(page)
        if not holders:
            del self._pages_of[digest]

    # -- lookups ---------------------------------------------------------------------------
    def indexed_pages(self) -> IntArray:
        """The indexed physical page ids, ascending."""
        with self._lock:
            pages = np.fromiter(self._digest_of, np.int64, len(self._digest_of))
        pages.sort()
        return pages

    def indexed(self, page_ids: IntArray) -> npt.NDArray[np.bool_]:
        """For each of the (checked) ``page_ids``: is it indexed?"""
        with self._lock:
            held = self._digest_of
            return np.fromiter((p in held for p in page_ids.tolist()), bool, page_ids.size)

    def pages_for(self, digests: object) -> IntArray:
        """The physical page holding each digest (-1 where none is indexed), in order: of
        several pages indexed under one digest, the first whose bytes still match it (the
        caller re-hashes what it uses; a stale first holder does not hide an intact one)."""
        values = digest_array(digests, None, "digests").tolist()
        with self._lock:
            get = self._pages_of.get
            found = [tuple(holders) if (holders := get(d)) else (-1,) for d in values]
        pages = [self._intact(d, h) for d, h in zip(values, found, strict=True)]
        return np.asarray(pages, np.int64).reshape(-1)

    def _intact(self, digest: int, holders: tuple[int, ...]) -> int:
        """The first of ``holders`` whose record hashes to ``digest`` (the first one when
        there is only one, or none matches: the caller's re-hash refuses it)."""
        if len(holders) > 1:
            found = self.records.digests_at(np.asarray(holders, np.int64))
            for page, value in zip(holders, found.tolist(), strict=True):
                if value == digest:
                    return page
        return holders[0]

    def check(self, page_ids: object = None) -> IntArray:
        """Re-hash indexed pages where they sit (all of them by default) and return the
        ascending ids of those whose bytes no longer match their digest: pages the engine
        overwrote without ``forget``. Nothing is changed."""
        with self._lock:
            known = dict(self._digest_of)
        if page_ids is None:
            ids = np.asarray(sorted(known), np.int64).reshape(-1)
        else:
            chosen = np.unique(page_id_array(page_ids, self.num_pages, "page_ids"))
            ids = np.asarray([p for p in chosen.tolist() if p in known], np.int64).reshape(-1)
        expected = np.asarray([known[p] for p in ids.tolist()], np.uint64).reshape(-1)
        stale: IntArray = ids[self.records.digests_at(ids) != expected]
        return stale

    # -- the PageStore interface -----------------------------------------------------------
    def get(self, digest: int) -> bytes | memoryview | None:
        key = check_digest_range(digest)
        with self._lock:
            holders = tuple(self._pages_of.get(key, ()))
        if not holders:
            return None
        page = self._intact(key, holders)
        records = self.records
        if records.scales is None and records.zero_points is None:
            return memoryview(records.pool[page])
        return records.record(page)

    def put(self, digest: int, page_bytes: object) -> None:
        """Accept ``page_bytes`` under ``digest`` when a page holding that digest is already
        indexed (nothing to store); refuse (``PageStoreError``) otherwise: the engine writes
        pages into the slots its allocator gives and calls ``index``."""
        key = check_digest_range(digest)
        check_record(key, page_bytes)
        if key not in self:
            raise PageStoreError(
                "an engine pool store holds only pages the engine indexed: write the page "
                "into a slot of the pool and call index([slot])",
                field="digest",
                found=f"0x{key:016X}",
            )

    def _keys(self) -> Collection[int]:
        return self._pages_of.keys()
