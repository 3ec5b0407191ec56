"""Encoding: one BlockPagedTensor into one blob, as pieces, into a buffer, or new.

An :class:`Encoder` holds the options and one layout cache (small raw blobs' layouts,
descriptors' wire bytes); the module functions are thin calls on a default instance.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
import numpy.typing as npt
import xxhash

from hurray_wire.blob.copying import COPY_CHUNK, copy_and_hash
from hurray_wire.blob.envelope import CHECKSUM, ENTRY, ENTRY_AT, entry_at, pack_header
from hurray_wire.blob.output import OUTPUT_POOL
from hurray_wire.blob.pages import paged_buffers
from hurray_wire.buffers import align, byte_view
from hurray_wire.codecs import CODEC_RAW, Compression, compress_parts, parse_spec
from hurray_wire.errors import (
    ArgumentTypeError,
    InvalidBlobError,
    InvalidTensorError,
    flag,
    instance,
)
from hurray_wire.integrity import (
    DeltaPlan,
    check_plan,
    digests_and_checksum,
    encode_digest_section,
    encode_page_refs,
    gather_sent,
    page_records,
    plan_delta,
)
from hurray_wire.memo import BoundedMemo, weight
from hurray_wire.metadata import encode_metadata
from hurray_wire.model.descriptor import TensorDescriptor
from hurray_wire.model.descriptor_encode import encode_descriptor
from hurray_wire.model.layout import check_indexes
from hurray_wire.tensor import SEQ_LENS, BlockPagedTensor
from hurray_wire.wire import blob as w
from hurray_wire.wire.fast import item_struct
from hurray_wire.wire.seal import checksum_of

__all__ = [
    "DEFAULT_ENCODER",
    "Encoder",
    "encode",
    "encode_deferred",
    "encode_into",
    "encode_parts",
    "encoder_for",
    "new_layout_cache",
    "planned_into",
]

_ZEROS = bytes(1 << 16)
_SMALL_BLOB = 1 << 16  # below this, encode() joins pieces instead of slicing a NumPy buffer
_SECTION_CHECKSUM = item_struct(w.SECTION_ENTRY.checksum.subcon)  # patched per call
assert _SECTION_CHECKSUM.size == ENTRY.sizes["checksum"]


def new_layout_cache() -> BoundedMemo[Any]:
    """An encoder's one cache: small raw blobs' layouts by geometry and descriptors' wire
    bytes by identity; 512 entries or 16 MiB they keep alive."""
    return BoundedMemo(512, 16 << 20)


def _wire(layouts: BoundedMemo[Any], descriptor: TensorDescriptor) -> bytes:
    """The descriptor's wire bytes, cached by its identity: the entry holds the descriptor,
    so no other object can have its id while the entry lives."""
    found = layouts.get(id(descriptor))
    if found is not None and found[0] is descriptor:
        return found[1]  # type: ignore[no-any-return]
    wire = encode_descriptor(descriptor)
    layouts.put(id(descriptor), (descriptor, wire), weight(2 * len(wire)))
    return wire


def _check_tensor(tensor: object) -> None:
    if not isinstance(tensor, BlockPagedTensor):
        raise ArgumentTypeError("expected a BlockPagedTensor", found=type(tensor).__name__)


@dataclass
class _Section:
    kind: int
    index: int
    alignment: int
    raw_size: int
    parts: list[Any]  # stored bytes, as 1-D uint8 arrays / bytes
    codec: int = CODEC_RAW
    codec_param: int = 0
    flags: int = 0
    checksum: int = 0
    offset: int = 0
    stored_size: int = 0

    def __post_init__(self) -> None:
        self.stored_size = sum(len(p) if isinstance(p, bytes) else p.nbytes for p in self.parts)


@dataclass
class _PageSections:
    """What the page options add: the digests and refs payloads, and (with refs) the sent
    rows of the page-row buffers, replacing those buffers' parts."""

    digests: bytes | None = None
    refs: bytes | None = None
    parts: dict[int, list[Any]] | None = None
    pool_checksum: int | None = None  # buffer 0's section checksum, from the digest pass


def _page_sections(
    tensor: BlockPagedTensor, page_digests: object, known_pages: object, fuse: bool
) -> _PageSections | None:
    """Plan the page sections (docs/integrity.md § 4, § 6): one digest pass, shared by
    the digests section and the delta plan. With ``fuse`` (a raw, checksummed, whole pool)
    the same pass also hashes the pool for buffer 0's section checksum."""
    if not page_digests and known_pages is None:
        return None
    records = page_records(tensor)
    pool_checksum = None
    planned = known_pages if isinstance(known_pages, DeltaPlan) else None
    if planned is not None:  # the engine's cached digests, planned by the caller
        digests = check_plan(planned, records)
    elif fuse and known_pages is None:
        digests, pool_checksum = digests_and_checksum(records)
    else:
        digests = records.digests()
    out = _PageSections(encode_digest_section(digests) if page_digests else None)
    out.pool_checksum = pool_checksum
    if known_pages is not None:
        plan = planned or plan_delta(tensor, known_pages, digests=digests)
        sent = gather_sent(tensor, plan)
        out.refs = encode_page_refs(plan.refs)
        rows = [sent.scales, sent.zero_points]
        out.parts = {0: [sent.pool.reshape(-1)]}
        for index, widths in paged_buffers(tensor.descriptor).params:
            taken, rows = rows[: len(widths)], rows[len(widths) :]
            out.parts[index] = [r.reshape(-1) for r in taken if r is not None]
    return out


def _sections(
    tensor: BlockPagedTensor, compression: Compression | None, pages: _PageSections | None
) -> list[_Section]:
    desc = tensor.descriptor
    sections = []
    widths = desc.element_widths() if compression is not None else ()
    sent = pages.parts if pages is not None and pages.parts is not None else {}
    for index, (parts, handle) in enumerate(zip(tensor.buffer_arrays(), desc.buffers, strict=True)):
        section = _Section(
            w.KIND_BUFFER,
            index,
            max(64, handle.alignment),
            handle.byte_size,
            list(parts),
            flags=w.FLAG_REQUIRED,
        )
        if index in sent:  # delta: only the sent pages' rows, ascending (page_refs)
            section.parts = sent[index]
            section.raw_size = section.stored_size = sum(p.nbytes for p in section.parts)
        if index == 0 and pages is not None and pages.pool_checksum is not None:
            section.checksum = pages.pool_checksum  # hashed in the digest pass
        if compression is not None and section.raw_size:
            data = section.parts[0] if len(section.parts) == 1 else np.concatenate(section.parts)
            codec, param, stored = compress_parts(data, compression, widths[index])
            if codec != CODEC_RAW:
                section.codec, section.codec_param = codec, param
                section.parts = stored
                section.stored_size = sum(len(p) for p in stored)
        sections.append(section)
    if tensor.seq_lens is not None:
        lens = np.ascontiguousarray(tensor.seq_lens, SEQ_LENS).view(np.uint8)
        sections.append(
            _Section(w.KIND_SEQ_LENS, 0, 64, lens.nbytes, [lens], flags=w.FLAG_REQUIRED)
        )
    if tensor.metadata:
        meta = encode_metadata(tensor.metadata)
        sections.append(_Section(w.KIND_METADATA, 0, 64, len(meta), [meta]))
    if pages is not None and pages.digests is not None:
        sections.append(_Section(w.KIND_PAGE_DIGESTS, 0, 64, len(pages.digests), [pages.digests]))
    if pages is not None and pages.refs is not None:
        sections.append(
            _Section(w.KIND_PAGE_REFS, 0, 64, len(pages.refs), [pages.refs], flags=w.FLAG_REQUIRED)
        )
    return sections


def _plan(
    tensor: BlockPagedTensor,
    options: Encoder,
    hash_raw: bool,
    known_pages: object = None,
    hash_sections: bool = True,
) -> tuple[bytes, list[_Section], int]:
    """Lay out a blob: (header bytes incl. its checksum, sections with offsets, total).
    ``hash_sections=False``: the section checksums are left zero (``encode_deferred``)."""
    _check_tensor(tensor)
    check_contents(tensor)  # the arrays may have changed since from_arrays
    compression, checksum = options.compression, options.checksum
    assert not isinstance(compression, str)  # parsed by Encoder
    fuse = checksum and compression is None
    pages = _page_sections(tensor, options.page_digests, known_pages, fuse)
    sections = _sections(tensor, compression, pages)
    descriptor = _wire(options.layouts, tensor.descriptor)
    total = _place(sections, descriptor)
    for section in sections:
        if (
            checksum
            and hash_sections
            and section.checksum == 0
            and (hash_raw or section.codec != CODEC_RAW or section.raw_size < COPY_CHUNK)
        ):
            section.checksum = _hash_parts(section.parts)
    return _header(descriptor, sections, total, checksum), sections, total


def _place(sections: list[_Section], descriptor: bytes) -> int:
    """Give each section its aligned offset after the header; the blob's total length."""
    cursor = entry_at(len(sections)) + len(descriptor) + CHECKSUM.size
    for section in sections:
        section.offset = align(cursor, section.alignment)
        cursor = section.offset + section.stored_size
    return align(cursor, w.BLOB_ALIGNMENT)


@dataclass(frozen=True)
class _RawLayout:
    """A raw blob of one geometry without its checksums: the bytes between the contents
    (``gaps[0]``: the header and first padding) and where each checksum goes. Built by the
    general planner, so the bytes cannot drift from it."""

    gaps: tuple[bytes, ...]
    checksum_at: tuple[int, ...]
    header_length: int
    total: int


def _raw_layout(tensor: BlockPagedTensor, checksum: bool, descriptor: bytes) -> _RawLayout:
    sections = _sections(tensor, None, None)
    total = _place(sections, descriptor)
    header = _header(descriptor, sections, total, checksum)  # section checksums still 0
    gaps, cursor, previous = [], 0, header
    for section in sections:
        gaps.append(previous + bytes(section.offset - cursor - len(previous)))
        cursor, previous = section.offset + section.stored_size, b""
    gaps.append(bytes(total - cursor))
    at = tuple(entry_at(i) + ENTRY_AT["checksum"] for i in range(len(sections)))
    return _RawLayout(tuple(gaps), at, len(header) - CHECKSUM.size, total)


def _encode_small(
    tensor: BlockPagedTensor, checksum: bool, layouts: BoundedMemo[Any]
) -> memoryview | None:
    """encode() of a small raw blob from its cached layout: one join, then the checksums
    patched in (3x faster than planning). None when the general path must do it (64 KiB or
    more, parameter buffers, contents that are not C-contiguous arrays)."""
    descriptor = tensor.descriptor
    if len(descriptor.buffers) != 3:
        return None
    contents: list[Any] = [tensor.page_pool, tensor.block_table, tensor.seq_ptr]
    try:
        sizes = (contents[0].nbytes, contents[1].nbytes, contents[2].nbytes)
    except AttributeError:  # not arrays: the general path judges them
        return None
    if sum(sizes) >= _SMALL_BLOB:
        return None  # before the metadata is encoded: the general path encodes it once
    lens_size = meta_size = -1
    if tensor.seq_lens is not None:
        lens = np.ascontiguousarray(tensor.seq_lens, SEQ_LENS)
        contents.append(lens)
        lens_size = lens.nbytes
    if tensor.metadata:
        meta = encode_metadata(tensor.metadata)
        contents.append(meta)
        meta_size = len(meta)
    wire = _wire(layouts, descriptor)
    key = (wire, checksum, sizes, lens_size, meta_size)
    layout: _RawLayout | None = layouts.get(key)
    if layout is None:
        layout = _raw_layout(tensor, checksum, wire)
        layouts.put(key, layout, weight(2 * len(wire)) + layout.total)
    check_contents(tensor)  # the arrays may have changed since from_arrays
    pieces: list[Any] = [None] * (2 * len(contents) + 1)
    pieces[0::2] = layout.gaps
    pieces[1::2] = contents
    try:
        out = bytearray().join(pieces)
    except (TypeError, ValueError, BufferError):  # strided or exotic arrays: copied there
        return None
    view = memoryview(out)
    if checksum:
        pack = _SECTION_CHECKSUM.pack_into
        for at, content in zip(layout.checksum_at, contents, strict=True):
            pack(out, at, xxhash.xxh3_64_intdigest(content))
        end = layout.header_length
        CHECKSUM.struct.pack_into(out, end, checksum_of(view[:end]))
    return view


def _header(descriptor: bytes, sections: list[_Section], total: int, checksum: bool) -> bytes:
    entries = [
        (s.kind, s.flags, s.codec, s.codec_param, s.index, s.offset, s.stored_size, s.raw_size,
         s.checksum, s.alignment)
        for s in sections
    ]  # fmt: skip
    return pack_header(descriptor, entries, total, checksum)


def _descriptor_in(head: bytes, sections: list[_Section]) -> bytes:
    """The descriptor's bytes in a planned header (between the table and the checksum)."""
    return head[entry_at(len(sections)) : len(head) - CHECKSUM.size]


def _hash_parts(parts: list[Any]) -> int:
    if len(parts) == 1:
        return int(xxhash.xxh3_64_intdigest(parts[0]))
    hasher = xxhash.xxh3_64()
    for part in parts:
        hasher.update(part)
    return int(hasher.intdigest())


def _zeros(count: int) -> memoryview:
    return memoryview(_ZEROS)[:count] if count <= len(_ZEROS) else memoryview(bytes(count))


def encode_parts(
    tensor: BlockPagedTensor,
    *,
    compression: Compression | str | None = None,
    checksum: bool = True,
    compact: bool = False,
    page_digests: bool = False,
    known_pages: Any = None,
) -> list[memoryview]:
    """The blob as scatter-gather pieces (for ``socket.sendmsg``, ``writelines``, an RDMA
    registration): each uncompressed buffer a view of the tensor's own array, no page data
    copied. Options as for :func:`encode`."""
    options = encoder_for(compression, checksum, compact, page_digests)
    return options.encode_parts(tensor, known_pages=known_pages)


def _pieces(head: bytes, sections: list[_Section], total: int) -> list[memoryview]:
    """The planned blob as views: header, zero padding, each section's own arrays."""
    parts = [memoryview(head)]
    cursor = len(head)
    for section in sections:
        if section.offset > cursor:
            parts.append(_zeros(section.offset - cursor))
        for piece in section.parts:
            if len(piece):
                parts.append(
                    memoryview(piece).cast("B")
                    if not isinstance(piece, bytes)
                    else memoryview(piece)
                )
        cursor = section.offset + section.stored_size
    if total > cursor:
        parts.append(_zeros(total - cursor))
    return parts


def encode_deferred(tensor: BlockPagedTensor) -> tuple[list[memoryview], Callable[[], bytes]]:
    """The pieces of :func:`encode_parts` with zero section checksums, and a function that
    hashes them and returns the final header: NixlSender sends the pool meanwhile."""
    head, sections, total = _plan(tensor, DEFAULT_ENCODER, True, hash_sections=False)
    parts = _pieces(head, sections, total)

    def final_header() -> bytes:
        for section in sections:
            if section.checksum == 0:
                section.checksum = _hash_parts(section.parts)
        return _header(_descriptor_in(head, sections), sections, total, True)

    return parts, final_header


def encode_into(
    tensor: BlockPagedTensor,
    buffer: Any,
    *,
    compression: Compression | str | None = None,
    checksum: bool = True,
    compact: bool = False,
    page_digests: bool = False,
    known_pages: Any = None,
) -> int:
    """Write the blob into the start of a caller-provided writable buffer; bytes written.
    Options as for :func:`encode`."""
    options = encoder_for(compression, checksum, compact, page_digests)
    return options.encode_into(tensor, buffer, known_pages=known_pages)


def planned_into(
    tensor: BlockPagedTensor,
    compression: Compression | str | None = None,
    checksum: bool = True,
    page_digests: bool = False,
    known_pages: Any = None,
) -> tuple[int, Callable[[Any], int]]:
    """The blob planned once (sizes known, small sections hashed, compressed sections
    compressed): its size and the writer that copies it into a buffer (``encode_into``;
    the NIXL sender reserves the size, then writes on its hashing thread)."""
    options = encoder_for(compression, checksum, False, page_digests)
    head, sections, total = _plan(tensor, options, False, known_pages)
    return total, partial(_write_into, tensor, head, sections, total, options.checksum)


def _write_into(
    tensor: BlockPagedTensor,
    head: bytes,
    sections: list[_Section],
    total: int,
    checksum: bool,
    buffer: Any,
) -> int:
    view = byte_view(buffer, "buffer")
    if view.readonly:
        raise ArgumentTypeError(
            "buffer must be writable", field="buffer", found=type(buffer).__name__
        )
    out = np.frombuffer(view, np.uint8)
    if len(out) < total:
        raise InvalidBlobError(
            "buffer too small for the blob", section="buffer", expected=total, found=len(out)
        )
    _write(tensor, out, head, sections, total, checksum)
    return total


def _write(
    tensor: BlockPagedTensor,
    out: npt.NDArray[np.uint8],
    head: bytes,
    sections: list[_Section],
    total: int,
    checksum: bool,
) -> None:
    """Copy the planned blob into ``out``, large raw sections hashed chunk by chunk while in
    cache (no extra pass over memory); the header, which holds the checksums, goes last."""
    cursor = len(head)
    late = False
    for section in sections:
        out[cursor : section.offset] = 0
        position = section.offset
        hasher = None
        if checksum and section.checksum == 0 and section.raw_size >= COPY_CHUNK:
            hasher = xxhash.xxh3_64()
        for piece in section.parts:
            src = np.frombuffer(piece, np.uint8) if isinstance(piece, bytes) else piece
            size = src.nbytes
            copy_and_hash(out[position : position + size], src, hasher)
            position += size
        if hasher is not None:
            section.checksum = int(hasher.intdigest())
            late = True
        cursor = position
    out[cursor:total] = 0
    if late:
        head = _header(_descriptor_in(head, sections), sections, total, checksum)
    out[: len(head)] = np.frombuffer(head, np.uint8)


def encode(
    tensor: BlockPagedTensor,
    *,
    compression: Compression | str | None = None,
    checksum: bool = True,
    compact: bool = False,
    page_digests: bool = False,
    known_pages: Any = None,
) -> memoryview:
    """The blob in a new buffer (a writable ``memoryview`` of a NumPy allocation, far cheaper
    than a fresh ``bytes``; large ones come from ``blob.output.OUTPUT_POOL``, which takes the
    memory back once the caller drops the blob).

    ``compression``: a :class:`Compression`, None (raw) or a text spec (``"zstd:3"``, read by
    :func:`~hurray_wire.codecs.parse_spec`). ``compact=True`` encodes ``tensor.compact()``.
    ``page_digests=True`` adds the page-digests section; ``known_pages`` (a receiver's sorted
    digests, or a ``DeltaPlan`` made for this tensor) makes a delta blob whose known pages
    travel as references (docs/integrity.md §§ 4-5). :class:`Encoder` holds the options
    for many tensors.
    """
    options = encoder_for(compression, checksum, compact, page_digests)
    return options.encode(tensor, known_pages=known_pages)


@dataclass(frozen=True, eq=False)
class Encoder:
    """Encode options (as for :func:`encode`), checked once, and one layout cache, safe to
    share between threads: ``Encoder(compression="zstd:3").encode(tensor)`` (msgspec's
    ``Encoder``); the module functions use :data:`DEFAULT_ENCODER` or share its cache."""

    compression: Compression | str | None = None  # a text spec is parsed on construction
    checksum: bool = True
    compact: bool = False
    page_digests: bool = False
    layouts: BoundedMemo[Any] = field(default_factory=new_layout_cache, repr=False)

    def __post_init__(self) -> None:
        set_ = object.__setattr__  # frozen: normalise the checked options once, here
        set_(self, "compact", flag(self.compact, "compact"))
        set_(self, "checksum", flag(self.checksum, "checksum"))
        compression: object = self.compression
        if isinstance(compression, str):  # the documented text specs, read once here
            set_(self, "compression", parse_spec(compression))
        elif compression is not None and not isinstance(compression, Compression):
            raise ArgumentTypeError(
                "compression must be a str, a Compression or None",
                field="compression",
                found=type(compression).__name__,
            )
        set_(self, "page_digests", flag(self.page_digests, "page_digests"))
        instance(self.layouts, BoundedMemo, "layouts")

    def _compacted(self, tensor: BlockPagedTensor) -> BlockPagedTensor:
        return tensor.compact() if self.compact and isinstance(tensor, BlockPagedTensor) else tensor

    def encode(self, tensor: BlockPagedTensor, *, known_pages: Any = None) -> memoryview:
        """The blob in a new buffer (:func:`encode`); ``known_pages`` makes a delta blob."""
        _check_tensor(tensor)
        if (
            self.compression is None
            and not self.compact
            and not self.page_digests
            and known_pages is None
        ):
            small = _encode_small(tensor, self.checksum, self.layouts)
            if small is not None:
                return small
        tensor = self._compacted(tensor)
        if tensor.nbytes < _SMALL_BLOB:  # tiny blobs: joining a few pieces beats NumPy slicing
            head, sections, total = _plan(tensor, self, True, known_pages)
            return memoryview(bytearray().join(_pieces(head, sections, total)))
        head, sections, total = _plan(tensor, self, False, known_pages)
        out = OUTPUT_POOL.take(total)  # recycled once the caller drops the blob: no faults
        _write(tensor, out, head, sections, total, self.checksum)
        return memoryview(out.data)

    def encode_parts(
        self, tensor: BlockPagedTensor, *, known_pages: Any = None
    ) -> list[memoryview]:
        """The blob as scatter-gather pieces (:func:`encode_parts`)."""
        tensor = self._compacted(tensor)
        head, sections, total = _plan(tensor, self, True, known_pages)
        return _pieces(head, sections, total)

    def encode_into(self, tensor: BlockPagedTensor, buffer: Any, *, known_pages: Any = None) -> int:
        """Write the blob into the start of ``buffer``; bytes written (:func:`encode_into`)."""
        tensor = self._compacted(tensor)
        head, sections, total = _plan(tensor, self, False, known_pages)
        return _write_into(tensor, head, sections, total, self.checksum, buffer)


#: The encoder the module functions use (and whose cache the others share).
DEFAULT_ENCODER = Encoder()
_NO_CHECKSUM = Encoder(checksum=False, layouts=DEFAULT_ENCODER.layouts)


def encoder_for(
    compression: Compression | str | None = None,
    checksum: object = True,
    compact: object = False,
    page_digests: object = False,
) -> Encoder:
    """The encoder for these options, checked (typed errors naming the argument), sharing
    the default encoder's cache."""
    if compression is None and compact is False and page_digests is False:
        if checksum is True:
            return DEFAULT_ENCODER
        if checksum is False:
            return _NO_CHECKSUM
    return Encoder(
        compression,
        checksum,  # type: ignore[arg-type]  # checked by Encoder
        compact,  # type: ignore[arg-type]
        page_digests,  # type: ignore[arg-type]
        DEFAULT_ENCODER.layouts,
    )


def check_contents(tensor: BlockPagedTensor) -> None:
    """The index invariants and seq_lens rule of the arrays ``tensor`` holds now, in
    O(index): ``from_arrays`` shares the caller's arrays, so a value changed afterwards
    would make the encoder write a blob the decoder refuses (``assemble``'s checks)."""
    layout = tensor.descriptor.layout
    table, starts = tensor.block_table, tensor.seq_ptr
    dtype = layout.index_dtype
    if (
        not isinstance(table, np.ndarray)
        or not isinstance(starts, np.ndarray)
        or table.dtype != dtype
        or starts.dtype != dtype
        or table.ndim != 1
        or starts.ndim != 1
    ):
        raise InvalidTensorError(
            "block_table and seq_ptr must stay 1-D arrays of the layout's index type",
            field="block_table",
            expected=str(dtype),
            found=f"{type(table).__name__} / {type(starts).__name__}",
        )
    check_indexes(starts, table, layout.num_pages, layout.num_seqs, tensor.seq_lens,
                  layout.page_size, tensor.descriptor.shape[0])  # fmt: skip
