"""The in-place landing (docs/integrity.md § 5.3): ``decode(data, into=InPlace(pool_store,
free_pages))`` decodes a blob, delta or full, into the engine's own pool, the one landing
target that writes an engine's page store: the sent pages into free pages, referenced pages
re-hashed where they sit, failed pages zero-filled for the engine to recompute. Like the
copying targets (``landing.arrays``) it is checked against the header before a section is
read and writes as the pipeline's last step.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from hurray_wire.blob.decoder import Decoder, decode_options
from hurray_wire.blob.limits import DecodeLimits
from hurray_wire.blob.pages import NO_PAGES, DecodeReport, PageWork, page_rows, put_rows
from hurray_wire.blob.pipeline import Accept, plan_of, run
from hurray_wire.buffers import U8Array, byte_view
from hurray_wire.errors import ArgumentTypeError, InvalidTensorError
from hurray_wire.integrity import EnginePoolStore, PageRefs
from hurray_wire.integrity.digests import IntArray
from hurray_wire.integrity.page_store import page_id_array
from hurray_wire.memo import BoundedMemo, weight
from hurray_wire.model.descriptor import TensorDescriptor
from hurray_wire.model.quantization import PerBlockAffine
from hurray_wire.tensor import ZERO_POINTS, BlockPagedTensor, checked_indexes, typed_params

__all__ = ["InPlace", "InPlaceReport", "check_pool_fits", "peek_in_place"]

Landed = tuple[BlockPagedTensor, DecodeReport | None]


@dataclass(frozen=True, eq=False)
class InPlace:
    """A blob (delta or full) decoded into the engine's pool that ``pool_store`` wraps
    (docs/integrity.md § 5.3): the sent pages go into the first ``peek_in_place(data)[1]``
    of ``free_pages``; referenced pages are re-hashed where they sit; the tensor is over
    ``pool_store.page_pool``, its block table in engine pages. Reported failed pages
    (``InPlaceReport``) each get a further free page, zero-filled, for the engine to
    recompute. The decoder's ``page_store`` is ignored: the engine's pool is the store."""

    pool_store: EnginePoolStore
    free_pages: Any

    def __post_init__(self) -> None:
        if not isinstance(self.pool_store, EnginePoolStore):
            raise ArgumentTypeError(
                "pool_store must be an EnginePoolStore over the engine's pool",
                field="pool_store",
                found=type(self.pool_store).__name__,
            )

    def land(
        self, view: memoryview, opts: Decoder, *, report: bool = False,
        accept: Accept | None = None, pool: U8Array | None = None, placed: bool = False,
    ) -> Landed:  # fmt: skip
        """The pipeline with the pages written by ``_InPlaceWork.finish``, its last step."""
        if pool is not None:
            raise ArgumentTypeError("an in-place landing takes the whole blob", field="pool")
        store = self.pool_store
        free = page_id_array(self.free_pages, store.num_pages, "free_pages", distinct=True)
        held = np.flatnonzero(store.indexed(free))  # in range, unique, none of them indexed
        if held.size:
            raise ArgumentTypeError(
                "free_pages must not include pages the pool store indexes (forget them first)",
                field="free_pages",
                found=f"free_pages[{int(held[0])}] = page {int(free[held[0]])}, indexed",
            )
        plan = plan_of(view, opts)  # the header alone decides how many pages are sent
        if free.size < plan.sent_pages:
            raise ArgumentTypeError(
                "free_pages has fewer pages than the blob sends",
                field="free_pages",
                found=f"{free.size} pages",
                expected=f">= {plan.sent_pages}",
            )
        check_pool_fits(plan.descriptor, store)
        work = functools.partial(_InPlaceWork, pool=store, free=free, plans=opts.plans)
        opts = dataclasses.replace(opts, page_store=store)
        tensor, found = run(view, opts, report=report, work=work, accept=accept, plan=plan)
        return tensor, found if report else None


@dataclass(frozen=True)
class InPlaceReport(DecodeReport):
    """``decode_report(into=InPlace(...))``'s: a DecodeReport in engine page ids (failed
    pages: zero-filled free pages to recompute). ``stale``: indexed engine pages whose bytes
    no longer match their digest (``forget`` them); ``written``: the free pages used."""

    stale: npt.NDArray[np.int64]
    written: npt.NDArray[np.int64]


def _engine_descriptor(
    plans: BoundedMemo[Any], descriptor: TensorDescriptor, num_pages: int
) -> TensorDescriptor:
    """The blob's descriptor over the engine's pool of ``num_pages`` pages, from the
    decoder's plan cache (which weighs the descriptors it keeps)."""
    key = ("engine", descriptor, num_pages)
    found: TensorDescriptor | None = plans.get(key)
    if found is not None:
        return found
    layout = descriptor.layout
    index_type = layout.block_table_index_type
    if num_pages and num_pages - 1 > layout.index_max:
        index_type = "uint64"
    engine = dataclasses.replace(layout, num_pages=num_pages, block_table_index_type=index_type)
    handle = descriptor.buffers[0]
    found = TensorDescriptor.block_paged(
        engine,
        descriptor.shape,
        descriptor.element_type,
        num_logical_pages=descriptor.buffers[1].byte_size // layout.index_dtype.itemsize,
        quantization=descriptor.quantization,
        alignment=handle.alignment,
        device_tag=handle.device_tag,
        sync_mode=handle.sync_mode,
        memory_class=handle.memory_class,
        statistics=descriptor.statistics,
    )
    plans.put(key, found, weight(2 * descriptor.descriptor_length))  # the key's, and it
    return found


def _geometry_error(what: str, field: str, expected: object, found: object) -> InvalidTensorError:
    return InvalidTensorError(
        f"the engine's pool does not fit the blob: {what}",
        field=field,
        expected=expected,
        found=found,
    )


def check_pool_fits(descriptor: TensorDescriptor, pool: EnginePoolStore) -> None:
    """The engine's arrays have the blob's page shape and dtypes (and slot parameters
    exactly when the blob is per-block quantized), so page records mean the same on both
    sides."""
    etype = descriptor.element_type
    if etype.is_packed:
        raise _geometry_error(
            "an in-place decode needs an unpacked element type (engines keep no packed pools)",
            "element_type",
            "a type of whole bytes",
            etype.name,
        )
    layout = descriptor.layout
    array = pool.page_pool
    page = (layout.page_size, descriptor.shape[1], descriptor.shape[2])
    if array.ndim != 4 or tuple(array.shape[1:]) != page:
        raise _geometry_error(
            "page shape", "pool_store.page_pool", f"[num_pages, {', '.join(map(str, page))}]",
            list(array.shape),
        )  # fmt: skip
    if array.dtype != etype.numpy_dtype:
        raise _geometry_error(
            "dtype", "pool_store.page_pool", str(etype.numpy_dtype), str(array.dtype)
        )
    quant = descriptor.quantization
    slots = pool.num_pages * layout.page_size
    wanted: dict[str, np.dtype[Any] | None] = {"scales": None, "zero_points": None}
    if isinstance(quant, PerBlockAffine):
        wanted["scales"] = quant.scale_type.numpy_dtype
        if quant.zero_point_buffer_index is not None:
            wanted["zero_points"] = ZERO_POINTS
    for name, dtype in wanted.items():
        given: npt.NDArray[Any] | None = getattr(pool, name)
        want = "none" if dtype is None else f"{slots} entries of {dtype}"
        got = "none" if given is None else f"{given.size} entries of {given.dtype}"
        if want != got:
            raise _geometry_error(f"per-page-slot {name}", f"pool_store.{name}", want, got)


def _slots(free: IntArray, start: int, count: int) -> IntArray:
    """``count`` free pages from ``start``; past the end, placeholders (page 0: the tensor
    is then never handed out, finish() raises first)."""
    taken = free[start : start + count]
    if taken.size < count:
        taken = np.concatenate([taken, np.zeros(count - taken.size, np.int64)])
    return taken


class _InPlaceWork(PageWork):
    """PageWork that leaves the pool to the engine: refs are re-hashed in place, the sent
    rows kept until finish() writes them into free pages."""

    def __init__(
        self, *args: Any, pool: EnginePoolStore, free: IntArray, plans: BoundedMemo[Any],
        **kwargs: Any,
    ) -> None:  # fmt: skip
        super().__init__(*args, **kwargs)
        self.pool = pool
        self.free = free
        self.plans = plans
        self.refs: PageRefs | None = None
        self.engine_refs = NO_PAGES  # engine page of each ref (-1: not indexed)
        self.ref_ok = np.zeros(0, bool)  # indexed, and its bytes re-hash to the digest
        self.rows: list[U8Array] = []
        self.sent = self.remap = self.table = self.starts = NO_PAGES  # set by assemble

    def _expand(self, buffers: list[U8Array], refs: PageRefs, sent: Any) -> list[U8Array]:
        engine = self.pool.pages_for(refs.digests)
        held = engine >= 0
        ok = held.copy()
        if held.any():  # the re-hash where the pages sit: never trusted unchecked
            ok[held] = self.pool.records.digests_at(engine[held]) == refs.digests[held]
        self.refs, self.engine_refs, self.ref_ok = refs, engine, ok
        return buffers

    def _failed_refs(self) -> npt.NDArray[np.bool_]:
        refs = self.refs
        if refs is None:
            return np.zeros(0, bool)
        return ~self.ref_ok | np.isin(refs.pages, self.mismatch)

    def assemble(
        self,
        descriptor: TensorDescriptor,
        buffers: list[U8Array],
        seq_lens: npt.NDArray[Any] | None,
        metadata: dict[str, Any],
    ) -> BlockPagedTensor:
        """The blob's index arrays checked as ``tensor.assemble`` checks them, then the
        tensor over the engine's pool with the block table remapped to engine pages."""
        num_pages = descriptor.layout.num_pages
        table, starts = checked_indexes(descriptor, buffers, seq_lens, metadata)  # assemble's
        refs = self.refs
        sent = np.arange(num_pages) if refs is None else refs.sent_pages(num_pages)
        remap = np.empty(num_pages, np.int64)
        remap[sent] = _slots(self.free, 0, sent.size)
        if refs is not None:
            failed = self._failed_refs()
            remap[refs.pages] = self.engine_refs
            spare = _slots(self.free, sent.size, int(failed.sum()))
            remap[refs.pages[failed]] = spare if self.report else 0  # raise mode: discarded
        self.rows, self.sent, self.remap = buffers, sent, remap
        self.table, self.starts = table, starts
        engine = _engine_descriptor(self.plans, descriptor, self.pool.num_pages)
        index = engine.layout.index_dtype
        scales, zero_points = typed_params(descriptor, buffers)  # per-channel: the blob's
        if isinstance(descriptor.quantization, PerBlockAffine):  # the engine's per-slot arrays
            assert self.pool.scales is not None
            zps = self.pool.zero_points
            scales = self.pool.scales.reshape(-1)
            zero_points = None if zps is None else zps.reshape(-1)
        return BlockPagedTensor._trusted(
            engine,
            self.pool.page_pool,
            remap[table].astype(index) if table.size else np.zeros(0, index),
            starts if starts.dtype == index else starts.astype(index),
            scales,
            zero_points,
            seq_lens,
            metadata,
        )

    def finish(self, tensor: BlockPagedTensor) -> InPlaceReport:
        """Raise (or, for the report variant, decide what to report) before writing; then
        write the sent pages into their free pages and zero-fill the failed ones."""
        refs, sent, free, remap = self.refs, self.sent, self.free, self.remap
        assert free.size >= sent.size  # _run checked it on the header
        failed_refs = self._failed_refs()
        ref_pages = refs.pages if refs is not None else NO_PAGES  # engine_refs, ref_ok: empty
        missing = ref_pages[self.engine_refs < 0]
        corrupt = ref_pages[(self.engine_refs >= 0) & ~self.ref_ok]
        stale = np.unique(self.engine_refs[(self.engine_refs >= 0) & ~self.ref_ok])
        short = free.size < sent.size + int(failed_refs.sum())
        failed, positions = self.verdict(
            self.table, self.starts, missing, corrupt, "blob pages",
            f"{corrupt.size} referenced page(s) are stale in the engine's pool (engine "
            f"pages {stale[:16].tolist()} no longer match their digest)",
            f"{missing.size} referenced page(s) are not indexed in the engine's pool",
            "; free_pages has no page left to report them in" if short else "",
        )  # fmt: skip
        dst = self.pool.records  # the sent rows into their free pages, failed ones zeroed
        if sent.size:
            put_rows(dst, remap[sent], page_rows(self.descriptor, self.rows, int(sent.size)))
        put_rows(dst, remap[failed])
        written = np.concatenate([remap[sent], remap[ref_pages[failed_refs]]]).astype(np.int64)
        failed, mismatch, missing, corrupt = (
            np.unique(remap[pages]) for pages in (failed, self.mismatch, missing, corrupt)
        )  # in engine page ids
        return InPlaceReport(
            tensor, failed, positions, mismatch, missing, corrupt, self.has_digests, stale, written
        )


def peek_in_place(data: Any, *, limits: DecodeLimits | None = None) -> tuple[TensorDescriptor, int]:
    """The blob's descriptor and the number of free pages ``decode(into=InPlace)`` writes (the
    pages the blob carries), from its checked header alone: what an engine's allocator
    needs before the decode (the stream reader's ``in_place`` callback receives both)."""
    plan = plan_of(byte_view(data), decode_options(limits=limits))
    return plan.descriptor, plan.sent_pages
