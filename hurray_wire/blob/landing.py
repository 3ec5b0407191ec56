"""Decode a blob with its page pool landed in the caller's memory (an engine's KV pages).

Nothing lands before every check has passed, the pool's own included (its section
checksum, page digests, the store's pages, decompression): the pool is verified where it
is (or decompressed into scratch), then copied. ``one_pass=True`` opts into one pass over
memory instead (each chunk copied, then hashed and digested while in cache; a compressed
pool decompressed straight into the destination), at the price that a refusal of those
checks leaves refused bytes in the destination (docs/decisions.md).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np
import numpy.typing as npt
import xxhash

from hurray_wire.blob.copying import copy_and_hash
from hurray_wire.blob.decoder import (
    Accept,
    Decoder,
    checksum_mismatch,
    decode_options,
    decompress_pool,
    plan_of,
    run,
    stored_section_checksum,
)
from hurray_wire.blob.limits import DecodeLimits
from hurray_wire.blob.pages import DecodeReport, PageWork, page_rows
from hurray_wire.blob.sections import Entry
from hurray_wire.buffers import U8Array, byte_view
from hurray_wire.codecs import CODEC_RAW
from hurray_wire.codecs.base import output
from hurray_wire.errors import ArgumentTypeError, HurrayWireError, flag
from hurray_wire.integrity import EngineFingerprint, PageRecords, PageStore
from hurray_wire.integrity.pool_store import engine_array
from hurray_wire.model.descriptor import TensorDescriptor
from hurray_wire.tensor import BlockPagedTensor, assemble, check_padding_bits, pool_form

__all__ = ["check_landing", "decode_into", "land_into"]


def check_landing(
    descriptor: TensorDescriptor, array: npt.NDArray[Any], *, pages: int | None = None,
    field: str = "page_pool",
) -> None:  # fmt: skip
    """``array`` can hold the blob's pool as the engine reads it: the pool's dtype and
    shape (``pages``: an engine pool of that many pages of the blob's page shape), or
    untyped bytes (uint8) of the same byte size. A float16 array for a bfloat16 pool, or a
    float32 array of half the length, is refused: the engine would read other values."""
    shape, dtype = pool_form(descriptor)
    if pages is not None:
        shape = (pages, *shape[1:])
    nbytes = int(np.prod(shape, dtype=object)) * dtype.itemsize
    typed = array.dtype == dtype and tuple(array.shape) == tuple(shape)
    untyped = array.dtype == np.uint8 and array.nbytes == nbytes  # also for a uint8 pool
    if not (typed or (untyped and (pages is None or array.shape[0] == pages))):
        raise ArgumentTypeError(
            "the engine array does not have the blob's page pool type and shape",
            field=field,
            found=f"{array.dtype} {list(array.shape)} ({array.nbytes} bytes)",
            expected=f"{dtype} {list(shape)} ({nbytes} bytes), or uint8 of its bytes",
        )


def decode_into(
    data: Any,
    page_pool: npt.NDArray[Any],
    *,
    verify: bool = True,
    limits: DecodeLimits | None = None,
    threads: int = -1,
    page_store: PageStore | None = None,
    expect_fingerprint: EngineFingerprint | None = None,
    one_pass: bool = False,
) -> BlockPagedTensor:
    """Validate the blob at the start of ``data`` as :func:`decode` does, land its page
    pool in ``page_pool`` and return the tensor, whose ``page_pool`` is that array (viewed
    with the blob's dtype and shape when it is raw bytes).

    ``page_pool``: a writable C-contiguous NumPy array with the pool's dtype and shape, or
    uint8 of its byte size, not overlapping ``data``. On any refusal it is untouched.
    ``one_pass=True`` checks the pool's section checksum, page digests and store pages
    while copying (and decompresses into ``page_pool``): faster, but on those refusals
    ``page_pool`` holds refused bytes (docs/decisions.md).
    """
    one_pass = flag(one_pass, "one_pass")
    opts = decode_options(verify, limits, threads, page_store, expect_fingerprint)
    return land_into(byte_view(data), page_pool, opts, one_pass=one_pass)


def land_into(
    view: memoryview, page_pool: Any, opts: Decoder, accept: Accept | None = None,
    one_pass: bool = False,
) -> BlockPagedTensor:  # fmt: skip
    """The pipeline with the pool landed in ``page_pool`` (decode_into, StreamFile)."""
    out = engine_array(page_pool, "page_pool").reshape(-1).view(np.uint8)
    plan = plan_of(view, opts)
    check_landing(plan.descriptor, page_pool)
    whole = np.frombuffer(view, np.uint8)
    if out.size and whole.size and np.may_share_memory(out, whole):
        raise ArgumentTypeError(
            "page_pool overlaps the blob being decoded",
            field="page_pool",
            found="memory shared with data",
        )
    if not one_pass:
        tensor = run(view, opts, accept=accept, plan=plan)[0]
        np.copyto(out, tensor.page_pool.reshape(-1).view(np.uint8))
        return _typed(tensor, page_pool, out)
    entry = plan.buffers[0]
    raw = entry.codec == CODEC_RAW
    hashed = opts.verify and plan.verify_sections and raw  # buffer 0's checksum, as it lands
    if raw and plan.page_digests is None and plan.page_refs is None:
        tensor = run(view, opts, accept=accept, plan=plan, defer_pool=hashed)[0]
        hasher = xxhash.xxh3_64() if hashed else None
        copy_and_hash(out, whole[entry.offset : entry.offset + entry.stored_size], hasher)
        if hasher is not None:
            _compare(hasher, view, entry)
        return _typed(tensor, page_pool, out)
    # The pool lands in _OnePass.finish, after every other check: a compressed one is
    # decompressed into the destination (its sent rows into scratch when page refs
    # scatter them), each page-row chunk copied, hashed and digested while in cache.
    late = None if raw else out if plan.page_refs is None else output(None, entry.raw_size)
    work = partial(_OnePass, out, view, entry, hashed, late, opts.threads)
    tensor = run(view, opts, accept=accept, plan=plan, work=work, defer_pool=hashed,
                 late_pool=late)[0]  # fmt: skip
    return _typed(tensor, page_pool, out)


def _compare(hasher: Any, view: memoryview, entry: Entry) -> None:
    """Buffer 0's section checksum, hashed while it landed, against the stored one."""
    stored = stored_section_checksum(view, entry)
    if hasher.intdigest() != stored:
        raise checksum_mismatch(entry, int(hasher.intdigest()), stored)


def _typed(tensor: BlockPagedTensor, page_pool: Any, out: U8Array) -> BlockPagedTensor:
    pool = tensor.page_pool
    if page_pool.dtype == pool.dtype and page_pool.shape == pool.shape:
        tensor.page_pool = page_pool
    else:
        tensor.page_pool = out.view(pool.dtype).reshape(pool.shape)
    return tensor


class _OnePass(PageWork):
    """The pool landed by ``land_into(one_pass=True)`` in the pipeline's last step: the
    other checks and ``accept`` run on the typed destination, still unwritten; ``finish``
    then decompresses a compressed pool into it (or, with page refs, its sent rows into
    ``late``) and checks a packed pool's padding bits, the last bytes just written; with
    page sections it copies each ~1 MiB chunk of rows into place and, while the chunk is
    in cache, feeds it to buffer 0's section hasher and digests its pages; then the store
    fills the referenced pages. A failure found here leaves the destination written."""

    def __init__(
        self, out: U8Array, view: memoryview, entry: Entry, hash_pool: bool,
        late: U8Array | None, threads: int, *args: Any, **kwargs: Any,
    ) -> None:  # fmt: skip
        super().__init__(*args, **kwargs)
        self.out, self.view, self.entry, self.hash_pool = out, view, entry, hash_pool
        self.late, self.threads = late, threads
        self.sent_buffers: list[U8Array] = []
        self.pending: tuple[Any, ...] = (None, None, None, None)

    def digest_rows(self, buffers: list[U8Array], refs: int | None) -> int:
        return 0  # digested while landed (buffer 0's checksum is deferred: not compared)

    def rebuild(
        self,
        buffers: list[U8Array],
        digests_payload: U8Array | None,
        digests_offset: int | None,
        refs_payload: U8Array | None,
        refs_offset: int | None,
    ) -> list[U8Array]:
        refs, sent, expected = self.sections(
            digests_payload, digests_offset, refs_payload, refs_offset
        )
        self.sent_buffers = buffers
        full = [self.out, *buffers[1:]]
        if refs is not None:
            full = self.place(buffers, sent, self.out)[0]
        self.pending = (refs, sent, expected, full)
        return full

    def assemble(
        self,
        descriptor: TensorDescriptor,
        buffers: list[U8Array],
        seq_lens: npt.NDArray[Any] | None,
        metadata: dict[str, Any],
    ) -> BlockPagedTensor:
        return assemble(descriptor, buffers, seq_lens, metadata, pool_later=True)

    def finish(self, tensor: BlockPagedTensor) -> DecodeReport:
        refs, sent, expected, full = self.pending
        rows = None if full is None else _Rows(self, sent, expected, full)
        if self.late is not None:  # the one write of a compressed pool, rows checked as they come
            decompress_pool(self.view, self.entry, self.threads, self.late,
                            None if rows is None else rows.up_to_byte)  # fmt: skip
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
                _compare(rows.hasher, self.view, self.entry)
            if rows.found is not None:
                self.compare(rows.found, expected, refs, sent)
            if refs is not None:
                self.fill_refs(refs, rows.landed)
        return super().finish(tensor)


class _Rows:
    """The page rows of a one-pass landing, landed in ascending chunks (``up_to``): each
    chunk copied into place (scattered to its page ids with refs; already there when it
    was decompressed into the destination), then, while in cache, fed to buffer 0's
    section hasher and digested."""

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
        while self.done < stop:
            self._chunk(min(stop, self.done + self.step))

    def _chunk(self, stop: int) -> None:
        start, rows, sent = self.done, self.rows, self.sent
        if sent is not None:  # scattered to their page ids: the source rows, just read
            self.landed.pool[sent[start:stop]] = chunk = rows.pool[start:stop]
        else:
            chunk = self.landed.pool[start:stop]
            if self.moved:
                chunk[...] = rows.pool[start:stop]
        if self.hasher is not None:
            self.hasher.update(chunk.data)
        if self.found is not None:
            self.found[start:stop] = PageRecords(
                chunk,
                None if rows.scales is None else rows.scales[start:stop],
                None if rows.zero_points is None else rows.zero_points[start:stop],
            ).digests()
        self.done = stop
