"""The delta protocol (docs/integrity.md § 5, its steps there): send only the pages the
receiver lacks. A referenced page is re-hashed before it is used: a missing or corrupt one
is never silently reused (it raises, or is reported with its logical positions so that the
engine can recompute those blocks).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import xxhash

from hurray_wire.buffers import U8Array, byte_view, u8_array, writable_u8
from hurray_wire.errors import (
    ArgumentTypeError,
    IntegrityRecordTruncatedError,
    InvalidIntegrityRecordError,
    LimitExceededError,
    PageDigestError,
    PageStoreMissError,
    instance,
    non_negative,
)
from hurray_wire.integrity.digests import (
    DigestArray,
    FailedPlaces,
    IntArray,
    PageRecords,
    digest_array,
    logical_positions,
    page_records,
)
from hurray_wire.integrity.page_store import PageStore
from hurray_wire.tensor import BlockPagedTensor
from hurray_wire.wire import records as wr

__all__ = [
    "DeltaPlan",
    "FillReport",
    "PageRefs",
    "check_plan",
    "decode_known_pages",
    "decode_page_refs",
    "encode_known_pages",
    "encode_page_refs",
    "fill_from_store",
    "gather_sent",
    "place_sent_pages",
    "plan_delta",
]

#: The known-pages record sealed (wire/records.py), raising this module's errors.
KNOWN_RECORD = wr.KNOWN_PAGES.raising(InvalidIntegrityRecordError, IntegrityRecordTruncatedError)
_REFS = wr.PAGE_REFS.raising(InvalidIntegrityRecordError, IntegrityRecordTruncatedError)


def _first_unsorted(values: npt.NDArray[Any]) -> int | None:
    """Index of the first element not strictly above its predecessor, or None."""
    if values.size < 2:
        return None
    bad = np.flatnonzero(values[1:] <= values[:-1])
    return int(bad[0]) + 1 if bad.size else None


# -- known pages (receiver -> sender) ------------------------------------------------------


def encode_known_pages(digests: object) -> bytes:
    """The known-pages record of ``digests`` (sorted and deduplicated here)."""
    values = np.unique(digest_array(digests, None))
    return KNOWN_RECORD.close(KNOWN_RECORD.pack(count=values.size, runs=(values,)))


def decode_known_pages(data: object, *, max_entries: int) -> DigestArray:
    """The sorted unique digests of a known-pages record (an owned copy); a ``count`` above
    ``max_entries`` is refused first, so a peer cannot make us hold more than that."""
    limit = non_negative(max_entries, "max_entries")
    view = byte_view(data, "data")
    count = KNOWN_RECORD.read_head(view)["count"]
    if count > limit:
        msg = "more known pages than max_entries allows"
        raise KNOWN_RECORD.error("count", msg, found=count, expected=f"<= {limit}")
    KNOWN_RECORD.sealed(view, KNOWN_RECORD.item_at(count, 1))
    values = KNOWN_RECORD.runs(view, count)[0].astype(np.uint64)  # owned copy
    bad = _first_unsorted(values)
    if bad is not None:
        raise KNOWN_RECORD.error(
            f"digests[{bad}]",
            "known pages must be strictly increasing (sorted, unique)",
            KNOWN_RECORD.item_at(count, 0, bad),
            found=f"0x{int(values[bad]):016X} after 0x{int(values[bad - 1]):016X}",
        )
    return values


# -- page refs (the proposed blob section 0x05) -------------------------------------------


@dataclass(frozen=True)
class PageRefs:
    """Physical pages taken from the receiver's store: ``pages`` strictly increasing, and
    the ``digests`` of their records. All other pages travel as bytes, in page order."""

    pages: IntArray
    digests: DigestArray

    def __post_init__(self) -> None:
        pages = self.pages
        if not isinstance(pages, np.ndarray) or pages.ndim != 1 or pages.dtype.kind not in "iu":
            raise ArgumentTypeError(
                "refs.pages must be a 1-D integer array", field="refs.pages", found=repr(pages)
            )
        digests = digest_array(self.digests, pages.size, "refs.digests")
        ids = pages.astype(np.int64)
        bad = _first_unsorted(ids)
        if (ids.size and int(ids[0]) < 0) or bad is not None:
            raise InvalidIntegrityRecordError(
                "page ids must be non-negative and strictly increasing",
                field="refs.pages",
                found=ids[: (bad or 0) + 1].tolist()[-2:],
            )
        object.__setattr__(self, "pages", ids)
        object.__setattr__(self, "digests", digests)

    def sent_pages(self, num_pages: int) -> IntArray:
        """The physical ids of the pages sent as bytes: the complement, ascending (a count
        beyond memory is a ``LimitExceededError``; the decoder passes only counts its blob
        paid for, ``DecodeLimits.max_empty_pages``)."""
        count = non_negative(num_pages, "num_pages")
        if self.pages.size and int(self.pages[-1]) >= count:
            raise InvalidIntegrityRecordError(
                "page id out of range",
                field="num_pages",
                found=count,
                expected=f"> the largest ref page id {int(self.pages[-1])}",
            )
        try:
            keep = np.ones(count, bool)
            keep[self.pages] = False
            return np.flatnonzero(keep)
        except MemoryError:  # the caller asked for more ids than memory holds
            raise LimitExceededError(
                "too many pages for memory", field="num_pages", found=count
            ) from None


def encode_page_refs(refs: PageRefs) -> bytes:
    """A page-refs section payload: 8-byte head, ``count`` u64 page ids, ``count`` digests."""
    instance(refs, PageRefs, "refs")
    pages, digests = refs.pages, refs.digests  # checked by PageRefs
    return _REFS.pack(count=pages.size, runs=(pages, digests))


def decode_page_refs(data: object, num_pages: int, *, base_offset: int = 0) -> PageRefs:
    """The refs of a page-refs section payload, checked against the descriptor's
    ``num_pages`` (ids strictly increasing and below it)."""
    limit = non_negative(num_pages, "num_pages")
    view = byte_view(data, "data")
    count = _REFS.read_head(view, base=base_offset)["count"]
    if count > limit:
        msg = "more page refs than pages"
        raise _REFS.error(
            "count", msg, base=base_offset, found=count, expected=f"<= num_pages {limit}"
        )
    _REFS.exact(view, _REFS.item_at(count, 2), base=base_offset, what="page ids/digests")
    raw_pages, digests = _REFS.runs(view, count)
    bad = _first_unsorted(raw_pages)
    if bad is not None:
        at = base_offset + _REFS.item_at(count, 0, bad)
        msg = "page ids must be strictly increasing"
        raise _REFS.error(f"pages[{bad}]", msg, at, found=int(raw_pages[bad]))
    if count and int(raw_pages[-1]) >= limit:
        at = base_offset + _REFS.item_at(count, 0, count - 1)
        raise _REFS.error(
            f"pages[{count - 1}]",
            "page id out of range",
            at,
            found=int(raw_pages[-1]),
            expected=f"< num_pages {limit}",
        )
    return PageRefs(raw_pages.astype(np.int64), digests.astype(np.uint64, copy=False))


# -- sender: the plan -----------------------------------------------------------------------


@dataclass(frozen=True)
class DeltaPlan:
    """Which physical pages are sent as bytes (``sent_pages``, ascending: the compacted
    pool's order) and which as references (``refs``); byte counts are of page records."""

    digests: DigestArray
    sent_pages: IntArray
    refs: PageRefs
    record_nbytes: int

    @property
    def num_pages(self) -> int:
        return int(self.digests.size)

    @property
    def bytes_sent(self) -> int:
        return int(self.sent_pages.size) * self.record_nbytes

    @property
    def bytes_referenced(self) -> int:
        return int(self.refs.pages.size) * self.record_nbytes

    @property
    def sent_fraction(self) -> float:
        """Page bytes sent / page bytes of a full transfer (1.0 for an empty pool)."""
        total = self.num_pages * self.record_nbytes
        return self.bytes_sent / total if total else 1.0


def plan_delta(tensor: BlockPagedTensor, known: object, *, digests: object = None) -> DeltaPlan:
    """Plan a delta transfer of every physical page of ``tensor`` to a receiver holding
    ``known`` (sorted digests): one searchsorted. ``digests``: already computed ones."""
    records = page_records(tensor)
    values = records.digests() if digests is None else digest_array(digests, records.num_pages)
    table = digest_array(known, None, "known")
    bad = _first_unsorted(table)
    if bad is not None:
        raise InvalidIntegrityRecordError(
            "known digests must be strictly increasing (use decode_known_pages)",
            field=f"known[{bad}]",
            found=int(table[bad]),
        )
    if table.size:
        at = np.minimum(np.searchsorted(table, values), table.size - 1)
        hit = table[at] == values
    else:
        hit = np.zeros(values.size, bool)
    ref_pages = np.flatnonzero(hit)
    refs = PageRefs(ref_pages, values[ref_pages])
    return DeltaPlan(values, np.flatnonzero(~hit), refs, records.record_nbytes)


def check_plan(plan: DeltaPlan, records: PageRecords) -> DigestArray:
    """A caller's plan (``encode(..., known_pages=plan)``) made for these page records:
    one digest per page, refs and sent pages that partition the pages and agree with the
    digests. Returns the plan's digests. It cannot check that the digests are the pages'
    (that is the pass it saves): a wrong cached digest of a sent page fails the receiver's
    page-digest check, and of a referenced page makes the receiver use the page it holds
    under that digest (docs/integrity.md § 5.3)."""
    instance(plan, DeltaPlan, "known_pages")
    digests = digest_array(plan.digests, records.num_pages, "known_pages.digests")
    refs = plan.refs
    if not isinstance(refs, PageRefs) or plan.record_nbytes != records.record_nbytes:
        raise InvalidIntegrityRecordError(
            "the plan was made for another tensor",
            field="known_pages",
            found=f"record_nbytes {plan.record_nbytes}",
            expected=records.record_nbytes,
        )
    sent = np.asarray(plan.sent_pages)
    if (
        (refs.pages.size and int(refs.pages[-1]) >= records.num_pages)
        or sent.shape != (records.num_pages - refs.pages.size,)
        or not np.array_equal(sent, refs.sent_pages(records.num_pages))
        or not np.array_equal(refs.digests, digests[refs.pages])
    ):
        raise InvalidIntegrityRecordError(
            "the plan's refs and sent pages do not partition the pages by its digests",
            field="known_pages",
            found=f"{refs.pages.size} refs, {sent.size} sent",
            expected=f"{records.num_pages} pages",
        )
    return digests


def gather_sent(tensor: BlockPagedTensor, plan: DeltaPlan) -> PageRecords:
    """The compacted pool and slot parameters to send (copies of the sent rows)."""
    return page_records(tensor).take(plan.sent_pages)


# -- receiver --------------------------------------------------------------------------------


def _writable_bytes(array: object, name: str) -> U8Array:
    """A caller's receiving array of any plain dtype as flat writable bytes (no copy)."""
    if isinstance(array, np.ndarray) and array.dtype != np.uint8 and array.flags.c_contiguous:
        return writable_u8(u8_array(array, name), name)
    return writable_u8(array, name)


def _out_records(
    out_pool: object, num_pages: int | None, out_scales: object, out_zero_points: object
) -> PageRecords:
    pool = _writable_bytes(out_pool, "out_pool")
    if num_pages is None:
        if not isinstance(out_pool, np.ndarray) or out_pool.ndim != 4:
            raise ArgumentTypeError(
                "num_pages is needed unless out_pool is 4-D [num_pages, ...]", field="num_pages"
            )
        num_pages = int(out_pool.shape[0])
    count = non_negative(num_pages, "num_pages")
    params = {"out_scales": out_scales, "out_zero_points": out_zero_points}
    writable = {k: None if a is None else _writable_bytes(a, k) for k, a in params.items()}
    return PageRecords.of(count, out_pool=pool, **writable)


def place_sent_pages(
    refs: PageRefs,
    sent: PageRecords,
    out_pool: object,
    *,
    num_pages: int | None = None,
    out_scales: object = None,
    out_zero_points: object = None,
) -> None:
    """Scatter the compacted pool (and slot parameters) to their physical pages."""
    out = _out_records(out_pool, num_pages, out_scales, out_zero_points)
    rows = refs.sent_pages(out.num_pages)
    for name, src, dst in (("pool", sent.pool, out.pool), ("scales", sent.scales, out.scales),
                           ("zero_points", sent.zero_points, out.zero_points)):  # fmt: skip
        if (src is None) != (dst is None):
            raise ArgumentTypeError(f"sent and out disagree on {name}", field=name)
        if src is None or dst is None:
            continue
        if src.shape != (rows.size, dst.shape[1]):
            raise InvalidIntegrityRecordError(
                f"sent {name} has the wrong shape",
                field=name,
                found=src.shape,
                expected=(rows.size, dst.shape[1]),
            )
        dst[rows] = src


@dataclass(frozen=True)
class FillReport(FailedPlaces):
    """What ``fill_from_store`` did: ``filled`` pages, ``missing`` (not in the store) and
    ``corrupt`` (stored record fails its digest) pages, plus the logical positions of the
    failed pages (when the block table was given) as in PageDigestReport."""

    filled: IntArray
    missing: IntArray
    corrupt: IntArray
    position_pages: IntArray
    sequences: IntArray
    pages_in_sequence: IntArray

    @property
    def ok(self) -> bool:
        return self.missing.size == 0 and self.corrupt.size == 0

    @property
    def failed(self) -> IntArray:
        return np.union1d(self.missing, self.corrupt)


def fill_from_store(
    refs: PageRefs | DeltaPlan,
    store: PageStore,
    out_pool: object,
    *,
    num_pages: int | None = None,
    out_scales: object = None,
    out_zero_points: object = None,
    block_table: object = None,
    seq_ptr: object = None,
    report: bool = False,
) -> FillReport:
    """Copy every referenced page's record from ``store`` into the receiving arrays.

    Each record is re-hashed and must match its digest. Without ``report`` any failure
    raises before anything is written (PageDigestError if a stored record is corrupt,
    else PageStoreMissError), naming every failed page and, given ``block_table`` and
    ``seq_ptr``, its logical positions. With ``report=True`` the good pages are written,
    failed ones left untouched, and the FillReport says which to recompute.
    """
    if isinstance(refs, DeltaPlan):
        refs = refs.refs
    refs = instance(refs, PageRefs, "refs")
    if not isinstance(store, PageStore):
        raise ArgumentTypeError("expected a PageStore", field="store", found=type(store).__name__)
    out = _out_records(out_pool, num_pages, out_scales, out_zero_points)
    if refs.pages.size and int(refs.pages[-1]) >= out.num_pages:
        raise InvalidIntegrityRecordError(
            "page ref beyond the receiving pool",
            field="refs.pages",
            found=int(refs.pages[-1]),
            expected=f"< {out.num_pages}",
        )
    width = out.record_nbytes
    hash64 = xxhash.xxh3_64_intdigest
    good: list[memoryview] = []
    ok = np.zeros(refs.pages.size, bool)
    missing = np.zeros(refs.pages.size, bool)
    wanted = refs.digests.tolist()
    for i, (digest, found) in enumerate(zip(wanted, store.get_many(wanted), strict=True)):
        if found is None:  # one hash per page; the lookups were one call
            missing[i] = True
            continue
        record = byte_view(found, "stored record", allow_copy=True)  # any store's bytes-like
        if len(record) == width and hash64(record) == digest:
            ok[i] = True
            good.append(record)
    filled = refs.pages[ok]
    miss = refs.pages[missing]
    corrupt = refs.pages[~ok & ~missing]
    failed = np.union1d(miss, corrupt)
    if block_table is not None and seq_ptr is not None:
        pos_pages, seqs, in_seq = logical_positions(
            np.asarray(block_table), np.asarray(seq_ptr), failed
        )
    else:
        pos_pages = seqs = in_seq = np.zeros(0, np.int64)
    result = FillReport(filled, miss, corrupt, pos_pages, seqs, in_seq)
    if not report and not result.ok:
        kind = PageDigestError if corrupt.size else PageStoreMissError
        raise kind(
            f"{miss.size} referenced page(s) missing from the store {miss[:16].tolist()}, "
            f"{corrupt.size} corrupt in it {corrupt[:16].tolist()}; logical positions "
            f"{list(result.positions)[:16]}",
            field="page_refs",
            pages=tuple(failed.tolist()),
            positions=result.positions,
        )
    parts = [(p, p.shape[1]) for p in (out.pool, out.scales, out.zero_points) if p is not None]
    for page, record in zip(filled.tolist(), good, strict=True):
        # Measured (tools/bench_digests.py): a row copy per page beats joining the records
        # and scattering them with one fancy-index assignment (two copies instead of one).
        at = 0
        for part, size in parts:
            memoryview(part[page])[:] = record[at : at + size]
            at += size
    return result
