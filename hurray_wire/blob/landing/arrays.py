"""The copying landings: ``IntoArray`` (an engine array, whole) and ``IntoPages`` (page
ids of an engine pool), the verified pool copied or scattered as the pipeline's last step
(``IntoArray(one_pass=True)``: copied, hashed and digested in one pass, ``_OnePass``).
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
import numpy.typing as npt
import xxhash

from hurray_wire._interop import engine_array, scatter_rows
from hurray_wire.blob.copying import copy_and_hash
from hurray_wire.blob.decoder import Decoder
from hurray_wire.blob.pages import DecodeReport, PageWork, page_rows
from hurray_wire.blob.pipeline import (
    Accept,
    checksum_mismatch,
    decompress,
    plan_of,
    run,
)
from hurray_wire.blob.sections import Entry
from hurray_wire.buffers import U8Array
from hurray_wire.codecs import CODEC_RAW
from hurray_wire.codecs.base import output
from hurray_wire.errors import ArgumentTypeError, HurrayWireError, flag
from hurray_wire.integrity import PageRecords, PageRefs
from hurray_wire.integrity.digests import IntArray
from hurray_wire.integrity.page_store import page_id_array
from hurray_wire.model.descriptor import TensorDescriptor
from hurray_wire.tensor import BlockPagedTensor, check_padding_bits, pool_form

__all__ = ["IntoArray", "IntoPages"]

Landed = tuple[BlockPagedTensor, DecodeReport | None]


def _check_form(
    descriptor: TensorDescriptor, array: npt.NDArray[Any], pages: int | None = None
) -> None:
    """``array`` has the pool's dtype and shape (``pages``: that many pages of its page
    shape) or is uint8 of its byte size: any other type would read other values."""
    shape, dtype = pool_form(descriptor)
    if pages is not None:
        shape = (pages, *shape[1:])
    nbytes = int(np.prod(shape, dtype=object)) * dtype.itemsize
    typed = array.dtype == dtype and tuple(array.shape) == tuple(shape)
    untyped = array.dtype == np.uint8 and array.nbytes == nbytes  # also for a uint8 pool
    if not (typed or (untyped and (pages is None or array.shape[0] == pages))):
        raise ArgumentTypeError(
            "the engine array does not have the blob's page pool type and shape",
            field="page_pool",
            found=f"{array.dtype} {list(array.shape)} ({array.nbytes} bytes)",
            expected=f"{dtype} {list(shape)} ({nbytes} bytes), or uint8 of its bytes",
        )


@dataclass(frozen=True, eq=False)
class _Copied(ABC):
    """What ``IntoArray`` and ``IntoPages`` share: the engine array's intake, and a copy of
    the verified pool as the pipeline's last step."""

    page_pool: Any
    one_pass: bool = field(default=False, kw_only=True)
    array: npt.NDArray[Any] = field(init=False, repr=False)
    flat: U8Array = field(init=False, repr=False)

    def __post_init__(self) -> None:
        array = engine_array(self.page_pool, "page_pool")
        object.__setattr__(self, "one_pass", flag(self.one_pass, "one_pass"))
        object.__setattr__(self, "array", array)
        object.__setattr__(self, "flat", array.reshape(-1).view(np.uint8))

    @abstractmethod
    def check(self, descriptor: TensorDescriptor) -> None:
        """The target's form against the blob's header (each target its own)."""

    @abstractmethod
    def _write(self, pool: U8Array) -> None: ...

    @abstractmethod
    def _typed(self, tensor: BlockPagedTensor) -> BlockPagedTensor: ...

    def land(
        self, view: memoryview, opts: Decoder, *, report: bool = False,
        accept: Accept | None = None, pool: U8Array | None = None, placed: bool = False,
    ) -> Landed:  # fmt: skip
        """Checked against the blob's header, the pipeline, then the pool written
        (``pool``: buffer 0 landed apart, NIXL's split blob; ``placed``: it is already
        there). ``IntoArray(one_pass=True)`` checks while writing (``_one_pass``)."""
        plan = plan_of(view, opts)
        self.check(plan.descriptor)
        whole = np.frombuffer(view, np.uint8)
        if self.flat.size and whole.size and np.may_share_memory(self.flat, whole):
            raise ArgumentTypeError(
                "page_pool overlaps the blob being decoded",
                field="page_pool",
                found="memory shared with data",
            )
        if isinstance(self, IntoArray) and self.one_pass and pool is None:
            tensor, found = self._one_pass(view, opts, plan, report, accept)
        else:
            tensor, found = run(view, opts, report=report, accept=accept, plan=plan, pool=pool)
            if not placed:
                self._write(tensor.page_pool.reshape(-1).view(np.uint8))
        tensor = self._typed(tensor)
        return tensor, None if found is None else dataclasses.replace(found, tensor=tensor)


@dataclass(frozen=True, eq=False)
class IntoArray(_Copied):
    """The pool lands whole in ``page_pool``: a writable C-contiguous engine array (NumPy,
    torch on the CPU, DLPack) with the pool's dtype and shape, or uint8 of its byte size;
    the tensor's ``page_pool`` is then that array. ``one_pass=True``: checked while copied
    (module docstring); for NIXL, READ straight into it."""

    @property
    def nbytes(self) -> int:
        """Bytes the blob's pool fills."""
        return int(self.flat.nbytes)

    def spans(self) -> list[tuple[int, int]]:
        """The [start, end) addresses this landing writes."""
        base = int(self.flat.ctypes.data)
        return [(base, base + self.flat.nbytes)]

    def check(self, descriptor: TensorDescriptor) -> None:
        """The array can hold this blob's pool (raised before anything is read into it)."""
        _check_form(descriptor, self.array)

    def _write(self, pool: U8Array) -> None:
        np.copyto(self.flat, pool)

    def _typed(self, tensor: BlockPagedTensor) -> BlockPagedTensor:
        pool, array = tensor.page_pool, self.array
        if array.dtype == pool.dtype and array.shape == pool.shape:
            tensor.page_pool = array
        else:
            tensor.page_pool = self.flat.view(pool.dtype).reshape(pool.shape)
        return tensor

    def _one_pass(
        self, view: memoryview, opts: Decoder, plan: Any, report: bool, accept: Accept | None
    ) -> Landed:
        out = self.flat
        whole = np.frombuffer(view, np.uint8)
        entry = plan.buffers[0]
        raw = entry.codec == CODEC_RAW
        hashed = opts.verify and plan.verify_sections and raw  # buffer 0's checksum, as it lands
        if raw and plan.page_digests is None and plan.page_refs is None:
            tensor, found = run(view, opts, report=report, accept=accept, plan=plan,
                                defer_pool=hashed)  # fmt: skip
            hasher = xxhash.xxh3_64() if hashed else None
            copy_and_hash(out, whole[entry.offset : entry.offset + entry.stored_size], hasher)
            if hasher is not None and (bad := checksum_mismatch(view, entry, hasher.intdigest())):
                raise bad
            return tensor, found
        # The pool lands in _OnePass.finish, after every other check: a compressed one is
        # decompressed into the destination (its sent rows into scratch when page refs
        # scatter them), each page-row chunk copied, hashed and digested while in cache.
        late = None if raw else out if plan.page_refs is None else output(None, entry.raw_size)
        work = partial(_OnePass, out, view, entry, hashed, late, opts.threads)
        return run(view, opts, report=report, accept=accept, plan=plan, work=work,
                   defer_pool=hashed, late_pool=late)  # fmt: skip


@dataclass(frozen=True, eq=False)
class IntoPages(_Copied):
    """Blob page ``i`` lands on page ``page_ids[i]`` (distinct, any order) of
    ``page_pool``, the engine's whole pool ``[num_pages, ...]``; the tensor is then over
    that pool, its block table in engine page ids. Unquantized pools only (per-page scales
    would need an engine-sized scale array). ``one_pass``: NIXL's, READ straight there."""

    page_ids: Any
    ids: IntArray = field(init=False, repr=False)
    page_bytes: int = field(init=False, repr=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        array = self.array
        if array.ndim < 2 or array.shape[0] == 0:
            raise ArgumentTypeError(
                "with page_ids, page_pool is the engine's pool: [num_pages, ...] with pages",
                field="page_pool",
                found=f"shape {tuple(array.shape)}",
            )
        pages = int(array.shape[0])
        ids = page_id_array(self.page_ids, pages, "page_ids", distinct=True)
        object.__setattr__(self, "ids", ids)
        object.__setattr__(self, "page_bytes", array.nbytes // pages)

    @property
    def nbytes(self) -> int:
        """Bytes the blob's pool fills: its pages at ``page_ids``."""
        return int(self.ids.size) * self.page_bytes

    @property
    def rows(self) -> U8Array:
        """The engine pool as one row of bytes per page."""
        return self.flat.reshape(self.array.shape[0], self.page_bytes)

    def spans(self) -> list[tuple[int, int]]:
        """The [start, end) addresses this landing writes, in blob page order: one per run
        of consecutive engine ids."""
        base, size, ids = int(self.flat.ctypes.data), self.page_bytes, self.ids
        if not ids.size:
            return []
        breaks = (np.flatnonzero(np.diff(ids) != 1) + 1).tolist()
        return [
            (base + int(ids[s]) * size, base + (int(ids[e - 1]) + 1) * size)
            for s, e in zip([0, *breaks], [*breaks, int(ids.size)], strict=True)
        ]

    def check(self, descriptor: TensorDescriptor) -> None:
        """The engine pool has the blob's dtype and page shape, takes as many pages as the
        blob holds, and the blob is unquantized."""
        _check_form(descriptor, self.array, int(self.array.shape[0]))
        if descriptor.quantization is not None:
            raise ArgumentTypeError(
                "page_ids take an unquantized pool (per-page scales would need an "
                "engine-sized scale array); land this blob without page_ids",
                field="page_ids",
                found=type(descriptor.quantization).__name__,
            )
        if self.ids.size != descriptor.layout.num_pages:
            raise ArgumentTypeError(
                "page_ids do not match the blob's page count",
                field="page_ids",
                expected=descriptor.layout.num_pages,
                found=int(self.ids.size),
            )

    def _write(self, pool: U8Array) -> None:
        scatter_rows([self.rows], self.ids, [pool.reshape(self.ids.size, -1)])

    def gathered(self) -> U8Array:
        """The landed pages in blob order, as the blob's pool bytes (one copy)."""
        return self.rows[self.ids].reshape(-1)

    def _typed(self, tensor: BlockPagedTensor) -> BlockPagedTensor:
        """``tensor`` over the engine's whole pool, its block table in engine page ids,
        everything else as decoded, validated as any new tensor is."""
        pool = tensor.page_pool
        engine = self.flat.view(pool.dtype).reshape(self.array.shape[0], *pool.shape[1:])
        return BlockPagedTensor.from_arrays(
            engine,
            self.ids[np.asarray(tensor.block_table, np.int64)],
            tensor.seq_ptr,
            seq_lens=tensor.seq_lens,
            total_tokens=tensor.shape[0],
            kv_role=tensor.kv_role,
            layer_index=tensor.layer_index,
            element_type=tensor.element_type,
            metadata=tensor.metadata,
            alignment=tensor.descriptor.buffers[0].alignment,
        )


class _OnePass(PageWork):
    """``IntoArray(one_pass=True)``'s pool, landed in the pipeline's last step (``finish``):
    the other checks and ``accept`` run first on the unwritten destination, then each ~1 MiB
    chunk of rows is copied (or decompressed) into place, hashed and digested while in
    cache. A failure found here leaves the destination written."""

    def __init__(
        self, out: U8Array, view: memoryview, entry: Entry, hash_pool: bool,
        late: U8Array | None, threads: int, *args: Any, **kwargs: Any,
    ) -> None:  # fmt: skip
        super().__init__(*args, **kwargs)
        self.out, self.view, self.entry, self.hash_pool = out, view, entry, hash_pool
        self.late, self.threads = late, threads
        self.sent_buffers: list[U8Array] = []
        self.pending: tuple[Any, ...] = (None, None, None, None)

    pool_later = True

    def digest_rows(self, buffers: list[U8Array], count: int) -> int:
        return 0  # digested while landed (buffer 0's checksum is deferred: not compared)

    def check_rows(
        self, buffers: list[U8Array], refs: PageRefs | None, sent: Any, expected: Any
    ) -> list[U8Array]:
        self.sent_buffers = buffers
        full = [self.out, *buffers[1:]]
        if refs is not None:
            full = self.place(buffers, sent, self.out)[0]
        self.pending = (refs, sent, expected, full)
        return full

    def finish(self, tensor: BlockPagedTensor) -> DecodeReport:
        refs, sent, expected, full = self.pending
        rows = None if full is None else _Rows(self, sent, expected, full)
        if self.late is not None:  # the one write of a compressed pool, rows checked as they come
            progress = None if rows is None else rows.up_to_byte
            whole = np.frombuffer(self.view, np.uint8)
            decompress(whole, self.entry, self.threads, self.late, progress)
        elif rows is not None:  # a raw pool's rows, copied a chunk at a time
            rows.up_to(rows.count)
        descriptor = self.descriptor
        if descriptor.element_type.is_packed:  # O(1): the last bytes, just written
            try:
                check_padding_bits(descriptor, self.out)
            except HurrayWireError as exc:  # placed as the decoder's assembly places it
                raise exc.relocated(section="buffer[0]") from None
        if rows is not None:
            if rows.hasher is not None:
                bad = checksum_mismatch(self.view, self.entry, rows.hasher.intdigest())
                if bad is not None:
                    raise bad
            if rows.found is not None:
                self.compare(rows.found, expected, refs, sent)
            if refs is not None:
                self.fill_refs(refs, rows.landed)
        return super().finish(tensor)


class _Rows:
    """The page rows of a one-pass landing, landed in ascending chunks (``up_to``), each
    hashed and digested while in cache."""

    def __init__(self, work: _OnePass, sent: Any, expected: Any, full: list[U8Array]) -> None:
        descriptor = work.descriptor
        num_pages = descriptor.layout.num_pages
        self.count = num_pages if sent is None else int(sent.size)
        self.rows = page_rows(descriptor, work.sent_buffers, self.count)
        self.landed = page_rows(descriptor, full, num_pages)
        self.moved = work.sent_buffers[0] is not work.out  # else decompressed in place
        self.sent, self.done = sent, 0
        self.width = int(self.rows.pool.shape[1])
        self.step = max(1, (1 << 20) // self.width) if self.width else max(self.count, 1)
        self.hasher = xxhash.xxh3_64() if work.hash_pool else None
        self.found = None if expected is None else np.empty(self.count, np.uint64)

    def up_to_byte(self, end: int) -> None:
        self.up_to(end // self.width if self.width else self.count)

    def up_to(self, stop: int) -> None:
        """Lands rows up to ``stop`` in chunks of at most ``step`` (~1 MiB) rows, however
        far a threaded decompression's final prefix jumped at once."""
        rows, sent = self.rows, self.sent
        while self.done < stop:
            start, end = self.done, min(stop, self.done + self.step)
            if sent is not None:  # scattered to their page ids: the source rows, just read
                self.landed.pool[sent[start:end]] = chunk = rows.pool[start:end]
            else:
                chunk = self.landed.pool[start:end]
                if self.moved:
                    chunk[...] = rows.pool[start:end]
            if self.hasher is not None:
                self.hasher.update(chunk.data)
            if self.found is not None:
                self.found[start:end] = PageRecords(
                    chunk,
                    None if rows.scales is None else rows.scales[start:end],
                    None if rows.zero_points is None else rows.zero_points[start:end],
                ).digests()
            self.done = end
