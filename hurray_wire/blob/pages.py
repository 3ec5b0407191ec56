"""The blob's page sections, page digests (0x04) and page refs (0x05) (docs/integrity.md
§§ 4, 6).

The page-row buffers (the pool and per-block slot scales / zero points) of a blob with
``R`` refs hold only the ``num_pages - R`` sent rows, ascending; a row is a page's record,
so digests are checked on the rows as they arrive, before the decoder rebuilds full
buffers from them and the receiver's page store. ``PageWork`` is what one decode does
with these sections: which checksums ``decode_report`` may tolerate, digests, rebuild and
fill, then one error or a ``DecodeReport``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from hurray_wire.buffers import U8Array
from hurray_wire.errors import ChecksumError, PageDigestError, PageStoreMissError
from hurray_wire.integrity import (
    FillReport,
    PageRecords,
    PageRefs,
    PageStore,
    decode_digest_section,
    decode_page_refs,
    digests_and_checksum,
    fill_from_store,
    logical_positions,
)
from hurray_wire.integrity.digests import DigestArray
from hurray_wire.model.descriptor import TensorDescriptor
from hurray_wire.model.quantization import PerBlockAffine
from hurray_wire.tensor import ZERO_POINTS, BlockPagedTensor, assemble

__all__ = [
    "NO_PAGES",
    "DecodeReport",
    "PageWork",
    "PagedBuffers",
    "paged_buffers",
    "put_rows",
    "sent_sizes",
]

_ZERO_POINT_BYTES = ZERO_POINTS.itemsize


@dataclass(frozen=True)
class PagedBuffers:
    """Which buffers hold one row per physical page.

    ``page_nbytes`` is a pool row (None for a packed pool whose pages do not end on a byte
    boundary: such a tensor has no page rows); ``params`` are ``(buffer index, widths)`` of
    the per-block parameter buffers, ``widths`` the row bytes of each part of the buffer
    (scales, then zero points when they share it).
    """

    page_nbytes: int | None
    params: tuple[tuple[int, tuple[int, ...]], ...]

    @property
    def indexes(self) -> frozenset[int]:
        return frozenset([0, *(index for index, _ in self.params)])


def paged_buffers(descriptor: TensorDescriptor) -> PagedBuffers:
    """The page-row buffers of ``descriptor`` (a pure function of its geometry)."""
    layout = descriptor.layout
    etype = descriptor.element_type
    elements = layout.page_size * descriptor.shape[1] * descriptor.shape[2]
    bits = elements * etype.bit_width
    page_nbytes = None if bits % 8 else bits // 8
    params: list[tuple[int, tuple[int, ...]]] = []
    quant = descriptor.quantization
    if isinstance(quant, PerBlockAffine):
        scale_width = layout.page_size * quant.scale_type.itemsize
        zp_width = layout.page_size * _ZERO_POINT_BYTES
        zp = quant.zero_point_buffer_index
        if zp == quant.scale_buffer_index:
            params.append((quant.scale_buffer_index, (scale_width, zp_width)))
        else:
            params.append((quant.scale_buffer_index, (scale_width,)))
            if zp is not None:
                params.append((zp, (zp_width,)))
    return PagedBuffers(page_nbytes, tuple(sorted(params)))


def sent_sizes(descriptor: TensorDescriptor, sent: int) -> tuple[int, ...]:
    """raw_size of every buffer section when only ``sent`` pages travel as bytes."""
    paged = paged_buffers(descriptor)
    sizes = [h.byte_size for h in descriptor.buffers]
    assert paged.page_nbytes is not None  # the section table refuses refs otherwise
    sizes[0] = sent * paged.page_nbytes
    for index, widths in paged.params:
        sizes[index] = sent * sum(widths)
    return tuple(sizes)


def page_rows(descriptor: TensorDescriptor, buffers: list[U8Array], count: int) -> PageRecords:
    """The page-row buffers (1-D uint8, ``count`` rows each) as PageRecords (views)."""
    paged = paged_buffers(descriptor)
    assert paged.page_nbytes is not None
    pool = buffers[0].reshape(count, paged.page_nbytes)
    parts: list[U8Array] = []
    for index, widths in paged.params:
        at = 0
        for width in widths:
            parts.append(buffers[index][at : at + count * width].reshape(count, width))
            at += count * width
    scales = parts[0] if parts else None
    zero_points = parts[1] if len(parts) > 1 else None
    return PageRecords(pool, scales, zero_points)


def put_rows(dst: PageRecords, at: Any, src: PageRecords | None = None, pool: bool = True) -> None:
    """``src``'s rows (None: zeros) into rows ``at`` of ``dst``, part by part (``pool``
    False: the slot parameters only)."""
    for name in ("pool", "scales", "zero_points")[0 if pool else 1 :]:
        into, rows = getattr(dst, name), 0 if src is None else getattr(src, name)
        if into is not None and rows is not None:
            into[at] = rows


@dataclass(frozen=True)
class DecodeReport:
    """What ``decode_report`` returns: the tensor and the pages it could not vouch for.

    ``pages`` are the failed physical page ids, ascending (a digest mismatch, a page missing
    from or corrupt in the page store); ``positions`` every logical place of them as
    ``(sequence, page_in_sequence)``, in block-table order (a shared prefix page yields one
    position per sequence). Every other page and every other buffer of ``tensor`` passed the
    same checks ``decode`` makes. ``missing`` / ``corrupt`` are the store's share of
    ``pages``; ``digest_mismatch`` the pages whose bytes disagree with the blob's digests.
    """

    tensor: BlockPagedTensor
    pages: npt.NDArray[np.int64]
    positions: tuple[tuple[int, int], ...]
    digest_mismatch: npt.NDArray[np.int64]
    missing: npt.NDArray[np.int64]
    corrupt: npt.NDArray[np.int64]
    has_digests: bool

    @property
    def ok(self) -> bool:
        return self.pages.size == 0


#: No pages: the empty page-id array of every report with none.
NO_PAGES = np.zeros(0, np.int64)


class PageWork:
    """One decode's handling of the page sections (the decoder calls it at three points)."""

    def __init__(
        self,
        descriptor: TensorDescriptor,
        *,
        has_digests: bool,
        page_store: PageStore | None,
        report: bool,
        verify: bool,
    ) -> None:
        self.descriptor = descriptor  # the decoder checked page_store's type
        self.has_digests = has_digests
        self.store = page_store
        self.report = report
        self.verify = verify
        self.damaged: list[str] = []  # sections whose checksum was tolerated
        self.mismatch = NO_PAGES
        self.fill: FillReport | None = None
        self._tolerate = paged_buffers(descriptor).indexes if report and has_digests else None
        self._found: DigestArray | None = None  # the rows' digests, when digest_rows ran

    def digest_rows(self, buffers: list[U8Array], count: int) -> int:
        """Digest the ``count`` page rows of the (raw) buffers as they sit in the blob and
        return xxh3_64 of buffer 0 from the same pass (its section checksum)."""
        self._found, checksum = digests_and_checksum(page_rows(self.descriptor, buffers, count))
        return checksum

    def tolerates(self, kind_is_buffer: bool, index: int, where: str) -> bool:
        """In report mode with digests, a page-row buffer's checksum mismatch is recorded
        (the digests will say which pages) instead of raised."""
        if self._tolerate is None or not kind_is_buffer or index not in self._tolerate:
            return False
        self.damaged.append(where)
        return True

    def digests_of(self, buffers: list[U8Array], count: int) -> DigestArray:
        """The digests of the ``count`` page rows of ``buffers`` (``digest_rows``' if it ran)."""
        if self._found is not None:
            return self._found
        return page_rows(self.descriptor, buffers, count).digests()

    def rebuild(
        self,
        buffers: list[U8Array],
        digests_payload: U8Array | None,
        digests_offset: int | None,
        refs_payload: U8Array | None,
        refs_offset: int | None,
    ) -> list[U8Array]:
        """Read the page refs (a page store required) and the expected digests, then
        ``check_rows``: returns the buffers to assemble."""
        num_pages = self.descriptor.layout.num_pages
        refs = sent = expected = None
        if refs_payload is not None:
            refs = decode_page_refs(refs_payload, num_pages, base_offset=refs_offset or 0)
            if self.store is None:
                raise PageStoreMissError(
                    f"the blob references {refs.pages.size} page(s) held in the receiver's "
                    "page store, and no page_store was given",
                    field="page_store",
                    pages=tuple(refs.pages.tolist()),
                )
            sent = refs.sent_pages(num_pages)
        if digests_payload is not None:  # the section's rules hold with verify=False too:
            expected = decode_digest_section(  # only comparing the pages is a checksum's work
                digests_payload, num_pages, base_offset=digests_offset or 0
            )
        return self.check_rows(buffers, refs, sent, expected if self.verify else None)

    def check_rows(
        self, buffers: list[U8Array], refs: PageRefs | None, sent: Any, expected: Any
    ) -> list[U8Array]:
        """Check the sent rows (``sent``: their page ids, None: every page) against the
        ``expected`` digests (None: none, or not verifying), then (with refs) rebuild the
        full page-row buffers from the sent rows and the store."""
        if expected is not None:
            count = len(expected) if sent is None else int(sent.size)
            self.compare(self.digests_of(buffers, count), expected, refs, sent)
        if refs is None:
            return buffers
        return self._expand(buffers, refs, sent)

    def compare(
        self, found: DigestArray, expected: DigestArray, refs: PageRefs | None, sent: Any
    ) -> None:
        """Record the pages whose digest (of the sent rows ``found``, or carried by a ref)
        is not the one the blob expects."""
        if refs is None:
            self.mismatch = np.flatnonzero(found != expected)
        else:
            bad_sent = sent[found != expected[sent]]
            bad_refs = refs.pages[refs.digests != expected[refs.pages]]
            self.mismatch = np.union1d(bad_sent, bad_refs)

    def _expand(self, buffers: list[U8Array], refs: PageRefs, sent: Any) -> list[U8Array]:
        """The full page-row buffers (new arrays): the sent rows placed, the referenced ones
        filled from the store."""
        full, rows_out = self.place(buffers, sent)
        self.fill_refs(refs, rows_out)
        return full

    def place(
        self, buffers: list[U8Array], sent: Any, pool: U8Array | None = None
    ) -> tuple[list[U8Array], PageRecords]:
        """New full page-row buffers with the sent rows placed at their page ids, and their
        rows. ``pool``: buffer 0 is that array, its rows left to the caller."""
        descriptor = self.descriptor
        full = list(buffers)
        for index in paged_buffers(descriptor).indexes:  # each row: sent, filled or zeroed
            size = descriptor.buffers[index].byte_size
            full[index] = pool if index == 0 and pool is not None else np.empty(size, np.uint8)
        rows_out = page_rows(descriptor, full, descriptor.layout.num_pages)
        if sent.size:
            put_rows(rows_out, sent, page_rows(descriptor, buffers, int(sent.size)), pool is None)
        return full, rows_out

    def fill_refs(self, refs: PageRefs, rows_out: PageRecords) -> None:
        """Fill the referenced rows from the store; a failed page's rows are zeroed."""
        num_pages = self.descriptor.layout.num_pages
        assert self.store is not None
        self.fill = fill_from_store(
            refs,
            self.store,
            rows_out.pool,
            num_pages=num_pages,
            out_scales=rows_out.scales,
            out_zero_points=rows_out.zero_points,
            report=True,  # failures are raised by finish(), with their logical positions
        )
        put_rows(rows_out, self.fill.failed)  # never the bytes of another page: left zero

    #: buffer 0 lands after assembly (``landing.arrays._OnePass``)
    pool_later = False

    def assemble(
        self,
        descriptor: TensorDescriptor,
        buffers: list[U8Array],
        seq_lens: npt.NDArray[Any] | None,
        metadata: dict[str, Any],
    ) -> BlockPagedTensor:
        """Build the tensor from the (rebuilt) buffers: ``tensor.assemble``, unless a
        subclass puts the pages elsewhere (landing/in_place.py)."""
        return assemble(descriptor, buffers, seq_lens, metadata, pool_later=self.pool_later)

    def verdict(
        self, table: Any, starts: Any, missing: Any, corrupt: Any, pages: str, stale: str,
        absent: str, tail: str = "",
    ) -> tuple[npt.NDArray[np.int64], tuple[tuple[int, int], ...]]:  # fmt: skip
        """The failed pages (a digest mismatch, ``missing`` or ``corrupt`` refs) and their
        logical positions; raised unless reporting (or ``tail`` says it cannot report): a
        mismatch first, then ``stale`` (stored pages that no longer match), then ``absent``
        ones, ``pages`` naming the ids shown. With none failed, a tolerated section
        checksum that no digest localises refuses the blob as decode would."""
        mismatch = self.mismatch
        failed = np.union1d(np.union1d(missing, corrupt), mismatch).astype(np.int64)
        if not failed.size:
            if self.damaged:
                raise ChecksumError(
                    "section checksum mismatch that no page digest localises",
                    section=self.damaged[0],
                )
            return failed, ()
        _, seqs, in_seq = logical_positions(table, starts, failed)
        positions = tuple(zip(seqs.tolist(), in_seq.tolist(), strict=True))
        if self.report and not tail:
            return failed, positions
        if mismatch.size:
            kind: type[PageDigestError] = PageDigestError
            field, what = "page_digests", f"{mismatch.size} page(s) do not match their digest"
        elif corrupt.size:
            kind, field, what = PageDigestError, "page_refs", stale
        else:
            kind, field, what = PageStoreMissError, "page_refs", absent
        raise kind(
            f"{what}: {pages} {failed[:16].tolist()}{' ...' * (failed.size > 16)}; "
            f"logical positions {list(positions)[:16]}{tail}",
            field=field,
            pages=tuple(failed.tolist()),
            positions=positions,
        )

    def finish(self, tensor: BlockPagedTensor) -> DecodeReport:
        """The outcome for the assembled tensor: raises (decode) or reports (decode_report)."""
        fill = self.fill
        missing = fill.missing if fill is not None else NO_PAGES
        corrupt = fill.corrupt if fill is not None else NO_PAGES
        failed, positions = self.verdict(
            tensor.block_table, tensor.seq_ptr, missing, corrupt, "physical pages",
            f"{corrupt.size} stored page(s) are corrupt",
            f"{missing.size} referenced page(s) are missing from the page store",
        )  # fmt: skip
        mismatch, missing, corrupt = (a.astype(np.int64) for a in (self.mismatch, missing, corrupt))
        return DecodeReport(tensor, failed, positions, mismatch, missing, corrupt, self.has_digests)
