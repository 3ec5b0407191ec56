"""The decode pipeline (:func:`run`), which every route into memory calls with a
:class:`~hurray_wire.blob.decoder.Decoder`'s options and, where the pool lands in caller
memory, a landing target's last step (blob/landing/).

Everything the header bytes decide (envelope, descriptor, section table) is checked once
per distinct header and cached as a plan, keyed by a copy of those bytes with the section
checksums masked out: equal bytes, equal verdict, whatever the caller does to its buffer
meanwhile. Padding, section checksums and the contents (index invariants, seq_lens,
metadata) are checked on every call.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from contextlib import suppress
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
import xxhash

from hurray_wire.blob.envelope import (
    ENTRY,
    ENTRY_AT,
    HEADER,
    HEADER_SIZE,
    I_CHECKSUM_TYPE,
    I_HEADER_LENGTH,
    I_SECTION_COUNT,
    I_TOTAL_LENGTH,
    check_header_fields,
    checked_header,
    embedded_descriptor,
    entry_at,
    whole_blob_header,
)
from hurray_wire.blob.limits import DEFAULT_LIMITS, DecodeLimits
from hurray_wire.blob.pages import NO_PAGES, DecodeReport, PageWork, paged_buffers
from hurray_wire.blob.sections import Entry, check_entries
from hurray_wire.buffers import U8Array, check_zero
from hurray_wire.codecs import CODEC_RAW, decode_section
from hurray_wire.errors import (
    ArgumentTypeError,
    ChecksumError,
    HurrayWireError,
    IndexBufferError,
    InvalidMetadataError,
    PaddingError,
)
from hurray_wire.integrity import (
    EngineFingerprint,
    PageStore,
    check_compatible,
    decode_digest_section,
    require_fingerprint,
)
from hurray_wire.memo import PER_ENTRY, BoundedMemo, weight
from hurray_wire.metadata import decode_metadata
from hurray_wire.model.descriptor import TensorDescriptor
from hurray_wire.tensor import SEQ_LENS, BlockPagedTensor, assemble, pool_typing
from hurray_wire.wire import blob as w
from hurray_wire.wire.fast import item_struct
from hurray_wire.wire.records import PAGE_REFS

__all__ = [
    "Accept",
    "Options",
    "checksum_mismatch",
    "decompress",
    "new_plan_cache",
    "plan_of",
    "run",
]

_U64 = item_struct(w.SECTION_ENTRY.checksum.subcon)  # an entry's checksum, read per call
_U64_CODE = _U64.format[-1]
_CHECKSUM_AT = ENTRY_AT["checksum"]
_SMALL_PADDING = 4096  # larger padding goes to the vectorised check directly
_CHECKSUM_END = _CHECKSUM_AT + ENTRY.sizes["checksum"]


class _Plan:
    """Everything a blob's header bytes determine, validated once, memoised and never
    changed: derived here, so that decoding a known header does no bookkeeping per section."""

    def __init__(
        self, descriptor: TensorDescriptor, total: int, entries: tuple[Entry, ...],
        tail_start: int, verify_sections: bool,
    ) -> None:  # fmt: skip
        self.descriptor, self.total, self.entries = descriptor, total, entries
        self.verify_sections = verify_sections
        gaps = [(e.pad_start, e.offset, e.where) for e in entries if e.offset > e.pad_start]
        if total > tail_start:  # trailing zero padding: [tail_start, total)
            gaps.append((tail_start, total, "trailing padding"))
        self.paddings = tuple(gaps)
        known = {(e.kind, e.index): e for e in entries if e.kind in w.SECTION_KINDS}
        self.buffers = tuple(known[(w.KIND_BUFFER, i)] for i in range(len(descriptor.buffers)))
        self.seq_lens = known.get((w.KIND_SEQ_LENS, 0))
        self.metadata = known.get((w.KIND_METADATA, 0))
        self.page_digests = known.get((w.KIND_PAGE_DIGESTS, 0))
        self.page_refs = known.get((w.KIND_PAGE_REFS, 0))
        self.raw_buffers = all(e.codec == CODEC_RAW for e in self.buffers)
        self.buffer_spans = tuple(slice(e.offset, e.offset + e.stored_size) for e in self.buffers)
        self.spans = tuple(slice(e.offset, e.offset + e.stored_size) for e in entries)
        small = [(a, b) for a, b, _ in gaps if b - a <= _SMALL_PADDING]
        #: One unpack of every small padding region, and the zero bytes each must hold.
        self.zeros = (_spans_struct(small), tuple(bytes(b - a) for a, b in small))
        self.large_paddings = tuple(g for g in gaps if g[1] - g[0] > _SMALL_PADDING)
        at = [(e.entry_offset + _CHECKSUM_AT, e.entry_offset + _CHECKSUM_END) for e in entries]
        #: One unpack of every entry's stored checksum, in table order.
        self.stored_checksums = _spans_struct(at, _U64_CODE)
        self.pool_typing: tuple[tuple[int, ...], np.dtype[Any]] | None = None
        if not descriptor.element_type.is_packed:
            with suppress(HurrayWireError):  # else refused by assemble, in its place
                self.pool_typing = pool_typing(descriptor)

    @property
    def sent_pages(self) -> int:
        """The pages the blob carries as bytes (the others are page refs)."""
        num_pages = self.descriptor.layout.num_pages
        if self.page_refs is None:
            return num_pages
        refs = PAGE_REFS.count_of(self.page_refs.raw_size)
        assert refs is not None  # the section table refused any other size
        return num_pages - refs


def _spans_struct(spans: list[tuple[int, int]], code: str = "s") -> struct.Struct:
    """A struct reading the ascending, disjoint byte ranges ``spans`` as one field each
    (``code`` "s": bytes; else the struct code of an item filling its range) and skipping
    what lies between."""
    fmt, cursor = ["<"], 0
    for start, stop in spans:
        fmt.append(f"{start - cursor}x" if start > cursor else "")
        fmt.append(f"{stop - start}s" if code == "s" else code)
        cursor = stop
    return struct.Struct("".join(fmt))


def new_plan_cache() -> BoundedMemo[Any]:
    """A decoder's one plan cache: plans by masked header bytes and limits, the checksum
    masks by header geometry, descriptors by their bytes (``peek_descriptor``) and the
    in-place landing's engine descriptors; 512 entries or 64 MiB they keep alive."""
    return BoundedMemo(512, 64 << 20)


def _suspect(
    exc: ChecksumError, view: memoryview, header_length: int, total: int, limits: DecodeLimits
) -> ChecksumError:
    """A header checksum mismatch, with the field that changed when the header read without
    its checksum breaks a rule there (a flipped offset, size or descriptor field usually
    does; a flipped value that stays valid cannot be named)."""
    if exc.section != "header" or header_length > len(view):
        return exc
    try:
        _plan_from_header(bytes(view[:header_length]), total, limits)
    except HurrayWireError as inner:
        if inner.field is None and inner.offset is None:
            return exc
        place = f"field {inner.field}" if inner.field else f"section {inner.section}"
        at = "" if inner.offset is None else f" at byte offset {inner.offset}"
        exc.message += f"; read without it, {place}{at} is invalid ({inner.message})"
        exc.relocated()  # the text again, with the longer message
    return exc


def _plan_from_header(header: bytes, total: int, limits: DecodeLimits) -> _Plan:
    """Validate the fixed header, descriptor and section table (all within ``header``)."""
    head = HEADER.unpack_dict(header)
    check_header_fields(head)
    descriptor = embedded_descriptor(header, entry_at(head["section_count"]))
    entries, tail = check_entries(header, head, descriptor, total, limits)
    return _Plan(descriptor, total, entries, tail, head["checksum_type"] == w.CHECKSUM_XXH3_64)


#: A route's own check of the validated tensor (stream header, index entry, offered
#: layer and role), run after every blob check and before anything lands.
Accept = Callable[[BlockPagedTensor], None]


class Options(Protocol):
    """What the pipeline reads of its options: a :class:`~hurray_wire.blob.decoder.Decoder`
    (checked once when it is made)."""

    @property
    def verify(self) -> bool: ...
    @property
    def limits(self) -> DecodeLimits: ...
    @property
    def threads(self) -> int: ...
    @property
    def page_store(self) -> PageStore | None: ...
    @property
    def expect_fingerprint(self) -> EngineFingerprint | None: ...
    @property
    def plans(self) -> BoundedMemo[Any]: ...


def plan_of(view: memoryview, opts: Options) -> _Plan:
    """The validated plan of the whole blob at the start of ``view``: limits first (on the
    fixed header alone), then the header checksum, then the plan cache or a full check.

    The cache key is the checked copy of the header as one integer, section checksums
    masked out (they are checked per call; with checksum_type 0 they must stay zero, so
    stay in).
    """
    head = whole_blob_header(view)
    total, limits, plans = head[I_TOTAL_LENGTH], opts.limits, opts.plans
    header_length, count = head[I_HEADER_LENGTH], head[I_SECTION_COUNT]
    try:
        header = checked_header(view, head, total, limits)
    except ChecksumError as exc:
        raise _suspect(exc, view, header_length, total, limits) from None
    key = int.from_bytes(header, "little")
    if head[I_CHECKSUM_TYPE] == w.CHECKSUM_XXH3_64 and count:
        mask: int | None = plans.get((header_length, count))  # no other key is a pair
        if mask is None:  # all-ones but the section checksums, once per header geometry
            ones = bytearray(b"\xff") * header_length
            table = np.frombuffer(ones, np.uint8, ENTRY.size * count, HEADER_SIZE)
            table.reshape(count, ENTRY.size)[:, _CHECKSUM_AT:_CHECKSUM_END] = 0
            mask = plans.put(
                (header_length, count), int.from_bytes(ones, "little"), PER_ENTRY + header_length
            )
        key &= mask
    plan_key = (key, header_length, None if limits is DEFAULT_LIMITS else limits)
    plan: _Plan | None = plans.get(plan_key)
    if plan is None:
        plan = _plan_from_header(header, total, limits)
        plans.put(plan_key, plan, weight(header_length) + sum(map(len, plan.zeros[1])))
    return plan


def run(
    view: memoryview,
    opts: Options,
    *,
    report: bool = False,
    work: Callable[..., PageWork] | None = None,
    accept: Accept | None = None,
    plan: _Plan | None = None,
    pool: U8Array | None = None,
    defer_pool: bool = False,
    late_pool: U8Array | None = None,
) -> tuple[BlockPagedTensor, DecodeReport | None]:
    """The one decode pipeline: framing, the plan, padding, checksums, page digests and
    refs, metadata, fingerprint, index invariants, then the route's ``accept``, then the
    page work's verdict (``finish``: raised, or reported with ``report``), which for an
    in-place ``work`` is the one step that writes caller memory.

    ``pool``: the raw bytes of buffer 0 when they are not in ``view`` (a transport landed
    them elsewhere; ``view`` then holds anything, e.g. zeros, in their range).
    ``defer_pool``: buffer 0's section checksum is left to the caller, which hashes it
    while copying it to its destination (``landing.IntoArray``). ``late_pool``: the
    destination of a compressed buffer 0, typed now and written by the page work's
    ``finish`` (``decompress``): one pass, and nothing written before the checks."""
    if plan is None:
        plan = plan_of(view, opts)
    if pool is not None:
        entry = plan.buffers[0]
        if entry.codec != CODEC_RAW or entry.stored_size != pool.size:
            raise ArgumentTypeError(
                "the landed page pool is not the blob's raw buffer[0]",
                field="page_pool",
                expected=f"{entry.stored_size} raw bytes",
                found=f"{pool.size} bytes",
            )
    pages = None
    if work is not None or plan.page_digests is not None or plan.page_refs is not None:
        pages = (work or PageWork)(
            plan.descriptor,
            has_digests=plan.page_digests is not None,
            page_store=opts.page_store,
            report=report,
            verify=opts.verify,
        )
    tensor = _materialize(view, plan, opts, pages, pool, defer_pool, late_pool)
    if accept is not None:
        accept(tensor)
    if pages is not None:
        return tensor, pages.finish(tensor)  # raises for any failed page unless reporting
    if report:  # nothing to report: no page sections
        return tensor, DecodeReport(tensor, NO_PAGES, (), NO_PAGES, NO_PAGES, NO_PAGES, False)
    return tensor, None


def _materialize(
    view: memoryview,
    plan: _Plan,
    opts: Options,
    pages: PageWork | None,
    pool: U8Array | None,
    defer_pool: bool,
    late_pool: U8Array | None = None,
) -> BlockPagedTensor:
    """Check padding and checksums, decode the sections, then assemble the tensor."""
    zeros, expected = plan.zeros
    if zeros.unpack_from(view) != expected:  # the small regions in one unpack; which one:
        for start, stop, where in plan.paddings:
            check_zero(view, start, stop, error=PaddingError, section=where)
    for start, stop, where in plan.large_paddings:
        check_zero(view, start, stop, error=PaddingError, section=where)
    verify = opts.verify and plan.verify_sections
    moved = pool is not None or defer_pool
    whole = np.frombuffer(view, np.uint8, plan.total)
    if (
        verify
        and pages is None
        and not moved
        and tuple(map(xxhash.xxh3_64_intdigest, map(view.__getitem__, plan.spans)))
        == plan.stored_checksums.unpack_from(view)
    ):
        pass  # every section checksum matched, compared in one go (else: which one)
    elif verify:
        pool_entry, pool_checksum = plan.buffers[0], None
        if pages is not None and plan.page_digests is not None and plan.raw_buffers:
            rows = [whole[span] for span in plan.buffer_spans]  # one pass over the pool: its
            rows[0] = rows[0] if pool is None else pool  # page digests and section checksum
            pool_checksum = pages.digest_rows(rows, plan.sent_pages)
        for e in plan.entries:
            if e is pool_entry and defer_pool:
                continue  # hashed while it is copied to its destination
            if e is pool_entry and pool_checksum is not None:
                computed = pool_checksum  # hashed in the page-digest pass
            elif e is pool_entry and pool is not None:
                computed = xxhash.xxh3_64_intdigest(pool.data)
            else:
                computed = xxhash.xxh3_64_intdigest(view[e.offset : e.offset + e.stored_size])
            mismatch = checksum_mismatch(view, e, computed)
            if mismatch is not None:
                if pages is not None and pages.tolerates(e.kind == w.KIND_BUFFER, e.index, e.where):
                    continue  # decode_report: the page digests localise the damage
                raise _localised(mismatch, view, plan, pages, e) if pool is None else mismatch
    readonly = view.readonly
    threads = opts.threads

    def payload(e: Entry) -> npt.NDArray[np.uint8]:
        if e.codec == CODEC_RAW:
            return whole[e.offset : e.offset + e.stored_size]
        decoded = decompress(whole, e, threads)
        if readonly:  # one rule for every array: read-only exactly when the input is
            decoded.flags.writeable = False
        return decoded

    if plan.raw_buffers:  # every buffer stored raw: views at spans decided by the plan
        buffers = [whole[span] for span in plan.buffer_spans]
    elif late_pool is not None:  # decompressed into it after every check (IntoArray)
        buffers = [late_pool, *(payload(e) for e in plan.buffers[1:])]
    else:
        buffers = [payload(e) for e in plan.buffers]
    if pool is not None:
        buffers[0] = pool
    lens = None if plan.seq_lens is None else payload(plan.seq_lens)
    metadata: dict[str, Any] = {}
    found = None
    if plan.metadata is not None:
        meta = payload(plan.metadata)
        try:  # within the limits; the reserved fingerprint entry must be a valid record
            metadata = dict(decode_metadata(meta, max_entries=opts.limits.max_metadata_entries))
            found = require_fingerprint(None, metadata, section="metadata")
        except HurrayWireError as exc:
            raise exc.relocated(section="metadata", offset=_at(plan.metadata, exc.offset)) from None
    expect = opts.expect_fingerprint
    if expect is not None and found is not None:
        check_compatible(expect, found)  # the fingerprint parsed once, with the metadata
    elif expect is not None:
        require_fingerprint(expect, metadata, section="metadata")  # raises: none carried
    if pages is not None and (plan.page_digests is not None or plan.page_refs is not None):
        digests, refs = plan.page_digests, plan.page_refs
        buffers = pages.rebuild(
            buffers,
            None if digests is None else payload(digests),
            _at(digests),
            None if refs is None else payload(refs),
            _at(refs),
        )
    return _assemble(plan, buffers, lens, metadata, pages)


def checksum_mismatch(view: memoryview, e: Entry, computed: int) -> ChecksumError | None:
    """The error of a section whose bytes do not hash to the checksum its table entry stores
    (read per call, never memoised), or None when they do."""
    (stored,) = _U64.unpack_from(view, e.entry_offset + _CHECKSUM_AT)
    if computed == stored:
        return None
    return ChecksumError(
        "section checksum mismatch",
        section=e.where,
        offset=e.offset,
        expected=f"0x{stored:016x}",  # what the blob says the bytes hash to
        found=f"0x{computed:016x}",  # what they hash to now
    )


def _localised(
    error: ChecksumError, view: memoryview, plan: _Plan, pages: PageWork | None, e: Entry
) -> ChecksumError:
    """A page-row buffer's checksum mismatch with the pages the blob's digests name (raw
    sections, no page refs): the error says which pages, and its offset is the first bad
    page's row in the pool, not the section's start."""
    digests = plan.page_digests
    if (pages is None or digests is None or digests.codec != CODEC_RAW or not plan.raw_buffers
            or plan.page_refs is not None or e.kind != w.KIND_BUFFER
            or e.index not in paged_buffers(plan.descriptor).indexes):  # fmt: skip
        return error
    num_pages = plan.descriptor.layout.num_pages  # the pool's rows: one page each
    whole = np.frombuffer(view, np.uint8, plan.total)
    try:
        expected = decode_digest_section(
            whole[digests.offset : digests.offset + digests.stored_size],
            num_pages,
            base_offset=digests.offset,
        )
    except HurrayWireError:
        return error  # the digests section is itself unreadable
    rows = [whole[span] for span in plan.buffer_spans]
    bad = np.flatnonzero(pages.digests_of(rows, num_pages) != expected)
    if not bad.size:
        return error  # the digests vouch for every page: the damage is elsewhere in it
    listed = f"{bad[:16].tolist()}{' ...' * (bad.size > 16)}"
    located = ChecksumError(
        f"section checksum mismatch: the page digests name physical page(s) {listed}",
        section=e.where,
        offset=e.offset + (int(bad[0]) * e.raw_size // num_pages if e.index == 0 else 0),
        expected=error.expected,
        found=error.found,
    )
    located.pages = tuple(bad.tolist())
    return located


def decompress(
    whole: U8Array, e: Entry, threads: int, out: U8Array | None = None,
    progress: Callable[[int], None] | None = None,
) -> npt.NDArray[np.uint8]:  # fmt: skip
    """Decode the compressed section ``e`` of the blob ``whole`` into a new array (allocated
    after its layout checks) or ``out``, telling ``progress`` of each finished prefix
    (``codecs.decode_section``); errors carry blob offsets. The section table checked the
    codec and its parameter."""
    stored = whole[e.offset : e.offset + e.stored_size]
    try:
        return decode_section(e.codec, e.codec_param, stored, e.raw_size, threads, out, progress)
    except HurrayWireError as exc:
        inside = exc.offset if exc.offset is not None and exc.offset <= stored.size else 0
        raise exc.relocated(section=e.where, offset=e.offset + inside) from None


def _at(e: Entry | None, inside: int | None = 0) -> int | None:
    """Blob offset of byte ``inside`` a section's contents; None for decoded (compressed)
    bytes."""
    return e.offset + (inside or 0) if e is not None and e.codec == CODEC_RAW else None


def _assemble(
    plan: _Plan,
    buffers: list[npt.NDArray[np.uint8]],
    lens_payload: npt.NDArray[np.uint8] | None,
    metadata: dict[str, Any],
    pages: PageWork | None = None,
) -> BlockPagedTensor:
    """Type the sections and check what needs their contents (tensor.assemble, shared
    with the containers), placing its errors at blob offsets."""
    descriptor = plan.descriptor
    seq_lens = None if lens_payload is None else lens_payload.view(SEQ_LENS)
    try:
        if pages is None:
            return assemble(descriptor, buffers, seq_lens, metadata, typing=plan.pool_typing)
        return pages.assemble(descriptor, buffers, seq_lens, metadata)
    except IndexBufferError as exc:
        if exc.field == "seq_lens":
            entry, section, width = plan.seq_lens, "seq_lens", SEQ_LENS.itemsize
        else:
            index = 1 if exc.field == "block_table" else 2
            entry, section = plan.buffers[index], f"buffer[{index}]"
            width = descriptor.layout.index_dtype.itemsize
        raise exc.relocated(
            section=section, offset=_at(entry, width * (exc.position or 0))
        ) from None
    except InvalidMetadataError as exc:  # a reserved key (kv_scale.check_reserved_metadata)
        raise exc.relocated(section="metadata") from None
    except HurrayWireError as exc:  # a pool error: its offset (if any) is within the pool
        raise exc.relocated(section="buffer[0]", offset=_at(plan.buffers[0], exc.offset)) from None
