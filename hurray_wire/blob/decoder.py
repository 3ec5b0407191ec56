"""Decoding: validate one blob, then hand back its tensor (NumPy views of the input).

Everything the header bytes decide (envelope, descriptor, section table) is checked once
per distinct header and memoised, keyed by a copy of those bytes with the section
checksums masked out: equal bytes, equal verdict, whatever the caller does to its buffer
meanwhile. Padding, section checksums and the contents (index invariants, seq_lens,
metadata) are checked on every call.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import xxhash

from hurray_wire.blob.envelope import (
    ENTRY,
    ENTRY_AT,
    HEADER_SIZE,
    check_header_fields,
    check_limits,
    checked_header,
    embedded_descriptor,
    entry_at,
    fixed_header,
    total_length,
)
from hurray_wire.blob.limits import DecodeLimits, check_limits_argument
from hurray_wire.blob.sections import Entry, check_entries
from hurray_wire.buffers import byte_view, check_zero
from hurray_wire.codecs import CODEC_RAW, check_threads, decode_section
from hurray_wire.errors import (
    ArgumentTypeError,
    ChecksumError,
    HurrayWireError,
    IndexBufferError,
    InvalidMetadataError,
    PaddingError,
)
from hurray_wire.memo import BoundedMemo
from hurray_wire.metadata import decode_metadata
from hurray_wire.model.descriptor import TensorDescriptor
from hurray_wire.tensor import BlockPagedTensor, assemble
from hurray_wire.wire import blob as w

__all__ = ["decode", "peek_descriptor"]

_U64 = struct.Struct("<Q")  # a section entry's checksum, read per call
_CHECKSUM_AT = ENTRY_AT["checksum"]
_CHECKSUM_END = _CHECKSUM_AT + ENTRY.sizes["checksum"]
_ZERO_CHECKSUM = bytes(ENTRY.sizes["checksum"])
_SMALL_TABLE = 16  # up to this many entries the memo key is joined in Python, else NumPy


@dataclass(frozen=True)
class _Plan:
    """Everything a blob's header bytes determine, validated once (and memoised)."""

    descriptor: TensorDescriptor
    total: int
    entries: tuple[Entry, ...]
    tail_start: int  # trailing zero padding: [tail_start, total)
    verify_sections: bool

    def __post_init__(self) -> None:
        # Derived once, so that decoding a known header does no bookkeeping per section.
        gaps = [(e.pad_start, e.offset, e.where) for e in self.entries if e.offset > e.pad_start]
        if self.total > self.tail_start:
            gaps.append((self.tail_start, self.total, "trailing padding"))
        known = {(e.kind, e.index): e for e in self.entries if e.kind in w.SECTION_KINDS}
        count = len(self.descriptor.buffers)
        object.__setattr__(self, "paddings", tuple(gaps))
        object.__setattr__(self, "buffers", tuple(known[(w.KIND_BUFFER, i)] for i in range(count)))
        object.__setattr__(self, "seq_lens", known.get((w.KIND_SEQ_LENS, 0)))
        object.__setattr__(self, "metadata", known.get((w.KIND_METADATA, 0)))

    paddings: tuple[tuple[int, int, str], ...] = ()
    buffers: tuple[Entry, ...] = ()
    seq_lens: Entry | None = None
    metadata: Entry | None = None


#: Plans by masked header bytes and limits: 512 headers or 64 MiB of them, whichever first.
PLANS: BoundedMemo[_Plan] = BoundedMemo(512, 64 << 20)


def _memo_key(header: bytes, count: int, checksummed: bool) -> bytes:
    """The header bytes with the section checksums zeroed (they are checked per call);
    linear in the header's size. Without checksums they must be zero and stay in."""
    if not checksummed or not count:
        return header
    if count <= _SMALL_TABLE:
        pieces = [header[:HEADER_SIZE]]
        for number in range(count):
            at = entry_at(number)
            pieces += (header[at : at + _CHECKSUM_AT], _ZERO_CHECKSUM)
            pieces.append(header[at + _CHECKSUM_END : at + ENTRY.size])
        pieces.append(header[entry_at(count) :])
        return b"".join(pieces)
    key = bytearray(header)
    table = np.frombuffer(key, np.uint8, ENTRY.size * count, HEADER_SIZE).reshape(count, ENTRY.size)
    table[:, _CHECKSUM_AT:_CHECKSUM_END] = 0
    return bytes(key)


def _header_plan(view: memoryview, total: int, limits: DecodeLimits, *, memoise: bool) -> _Plan:
    """The validated plan of the blob at the start of ``view``: limits first (on the fixed
    header alone), then the header checksum, then the memo or a full check."""
    fixed, head = fixed_header(view)
    check_limits(head, limits)
    header = checked_header(view, fixed, head, total)
    checksummed = head["checksum_type"] == w.CHECKSUM_XXH3_64
    key = _memo_key(header, head["section_count"], checksummed)
    plan = PLANS.get((key, limits)) if memoise else None
    if plan is None:
        plan = _plan_from_header(header, head, total, limits)
        if memoise:
            PLANS.put((key, limits), plan, 2 * len(key))
    return plan


def _plan_from_header(
    header: bytes, head: dict[str, Any], total: int, limits: DecodeLimits
) -> _Plan:
    """Validate the fixed header, descriptor and section table (all within ``header``)."""
    check_header_fields(head)
    count = head["section_count"]
    descriptor = embedded_descriptor(header, entry_at(count))
    checksum_type = head["checksum_type"]
    start = len(header) + _U64.size
    entries, tail = check_entries(header, count, descriptor, start, total, checksum_type, limits)
    return _Plan(descriptor, total, entries, tail, checksum_type == w.CHECKSUM_XXH3_64)


def peek_descriptor(data: Any, *, limits: DecodeLimits | None = None) -> TensorDescriptor:
    """The descriptor of the blob at the start of ``data``, after checking the blob's header
    and header checksum, without reading its sections (``data`` may end after the header)."""
    view = byte_view(data)
    limits = check_limits_argument(limits)
    total = total_length(view, whole=False)
    fixed, head = fixed_header(view)
    check_limits(head, limits)
    header = checked_header(view, fixed, head, min(total, len(view)))
    return embedded_descriptor(header, entry_at(head["section_count"]))


def decode(
    data: Any, *, verify: bool = True, limits: DecodeLimits | None = None, threads: int = -1
) -> BlockPagedTensor:
    """Validate one blob at the start of ``data`` and return its tensor.

    Uncompressed buffers are NumPy views of ``data``; every array of the tensor, decompressed
    ones included, is read-only exactly when ``data`` is (docs/wire-format.md). With
    ``verify=False`` the section checksums are skipped; everything else is still checked.
    ``threads`` (the caller included; -1 = every usable core, 0 = the caller only)
    decompress the chunks of chunked sections.
    """
    view = byte_view(data)
    limits = check_limits_argument(limits)
    if type(verify) is not bool:
        raise ArgumentTypeError("verify must be True or False", field="verify", found=repr(verify))
    if threads != -1:
        threads = check_threads(threads)
    total = total_length(view, whole=True)
    plan = _header_plan(view, total, limits, memoise=True)
    return _materialize(view, plan, verify, threads, limits.max_metadata_entries)


def _materialize(
    view: memoryview, plan: _Plan, verify: bool, threads: int, max_metadata_entries: int
) -> BlockPagedTensor:
    """Check padding and checksums, decode the sections, then assemble the tensor."""
    for start, stop, where in plan.paddings:
        check_zero(view, start, stop, error=PaddingError, section=where)
    if verify and plan.verify_sections:
        for e in plan.entries:
            computed = xxhash.xxh3_64_intdigest(view[e.offset : e.offset + e.stored_size])
            (stored_checksum,) = _U64.unpack_from(view, e.entry_offset + ENTRY_AT["checksum"])
            if computed != stored_checksum:
                raise ChecksumError(
                    "section checksum mismatch",
                    section=e.where,
                    offset=e.offset,
                    expected=f"0x{computed:016x}",
                    found=f"0x{stored_checksum:016x}",
                )
    whole = np.frombuffer(view, np.uint8, plan.total)
    readonly = view.readonly

    def payload(e: Entry) -> npt.NDArray[np.uint8]:
        if e.codec == CODEC_RAW:
            return whole[e.offset : e.offset + e.stored_size]
        decoded = _decompress(e, whole[e.offset : e.offset + e.stored_size], threads)
        if readonly:  # one rule for every array: read-only exactly when the input is
            decoded.flags.writeable = False
        return decoded

    buffers = [payload(e) for e in plan.buffers]
    lens = None if plan.seq_lens is None else payload(plan.seq_lens)
    meta = None if plan.metadata is None else payload(plan.metadata)
    return _assemble(plan, buffers, lens, meta, max_metadata_entries)


def _decompress(e: Entry, stored: npt.NDArray[np.uint8], threads: int) -> npt.NDArray[np.uint8]:
    """Decode one compressed section into a new array (allocated after its layout checks);
    errors carry blob offsets. The section table checked the codec and its parameter."""
    try:
        return decode_section(e.codec, e.codec_param, stored, e.raw_size, threads)
    except HurrayWireError as exc:
        inside = exc.offset if exc.offset is not None and exc.offset <= stored.size else 0
        raise exc.relocated(section=e.where, offset=e.offset + inside) from None


def _assemble(
    plan: _Plan,
    buffers: list[npt.NDArray[np.uint8]],
    lens_payload: npt.NDArray[np.uint8] | None,
    meta_payload: npt.NDArray[np.uint8] | None,
    max_metadata_entries: int,
) -> BlockPagedTensor:
    """Type the sections and check what needs their contents (tensor.assemble, shared
    with the containers), placing its errors at blob offsets."""
    descriptor = plan.descriptor

    def raw_offset(e: Entry | None) -> int | None:
        """Blob offset of a section's contents; None for decoded (compressed) bytes."""
        return e.offset if e is not None and e.codec == CODEC_RAW else None

    seq_lens = None if lens_payload is None else lens_payload.view("<u8")
    metadata: dict[str, Any] = {}
    if meta_payload is not None:
        try:
            metadata = dict(decode_metadata(meta_payload, max_entries=max_metadata_entries))
        except HurrayWireError as exc:
            start = raw_offset(plan.metadata)
            offset = None if start is None else start + (exc.offset or 0)
            raise exc.relocated(section="metadata", offset=offset) from None
    try:
        return assemble(descriptor, buffers, seq_lens, metadata)
    except IndexBufferError as exc:
        if exc.field == "seq_lens":
            entry, section, width = plan.seq_lens, "seq_lens", 8
        else:
            index = 1 if exc.field == "block_table" else 2
            entry, section = plan.buffers[index], f"buffer[{index}]"
            width = descriptor.layout.index_dtype.itemsize
        start = raw_offset(entry)
        offset = start + width * (exc.position or 0) if start is not None else None
        raise exc.relocated(section=section, offset=offset) from None
    except InvalidMetadataError as exc:  # a reserved key (kv_scale.check_reserved_metadata)
        raise exc.relocated(section="metadata") from None
    except HurrayWireError as exc:  # a pool error: its offset (if any) is within the pool
        start = raw_offset(plan.buffers[0])
        offset = None if start is None else start + (exc.offset or 0)
        raise exc.relocated(section="buffer[0]", offset=offset) from None
