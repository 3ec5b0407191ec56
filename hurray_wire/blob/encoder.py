"""Encoding: one BlockPagedTensor into one blob, as pieces, into a buffer, or new.

An :class:`Encoder` holds the options and one layout cache (raw blobs' layouts by
geometry, descriptors' wire bytes); the module functions are thin calls on a default
instance. Every route plans a :class:`_Plan` (a layout: the header with zero checksums and
the padding; the sections' pieces) and writes it by joining, as views or into a buffer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import xxhash

from hurray_wire.blob.copying import copy_and_hash
from hurray_wire.blob.envelope import CHECKSUM, ENTRY, ENTRY_AT, HEADER, entry_at
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
from hurray_wire.integrity.digests import DigestArray, digest_array
from hurray_wire.memo import BoundedMemo, weight
from hurray_wire.metadata import encode_metadata
from hurray_wire.model.descriptor import TensorDescriptor
from hurray_wire.model.descriptor_codec import encode_descriptor
from hurray_wire.model.layout import check_indexes
from hurray_wire.tensor import SEQ_LENS, BlockPagedTensor
from hurray_wire.wire import blob as w
from hurray_wire.wire.fast import item_struct
from hurray_wire.wire.seal import checksum_of, seal

__all__ = [
    "DEFAULT_ENCODER",
    "Encoder",
    "encode",
    "encode_deferred",
    "encode_into",
    "encode_parts",
    "encoder_for",
    "planned_into",
]

_SMALL_BLOB = 1 << 16  # below this, encode() joins pieces instead of slicing a NumPy buffer
_SECTION_CHECKSUM = item_struct(w.SECTION_ENTRY.checksum.subcon)  # patched per call
assert _SECTION_CHECKSUM.size == ENTRY.sizes["checksum"]
_FIRST_CHECKSUM = entry_at(0) + ENTRY_AT["checksum"]  # then one every ENTRY.size bytes
_ENTRY_SIZE = ENTRY.size
_SEAL = CHECKSUM.struct
_UNHASHED = (0,) * 5  # the checksums of a cached layout's (at most 5) sections: none yet
#: A section entry but its offset and checksum: (kind, flags, codec, codec_param, index,
#: stored_size, raw_size, alignment).
_Entry = tuple[int, int, int, int, int, int, int, int]


def _u8(piece: Any) -> Any:
    """A stored piece as flat bytes (strided arrays copied)."""
    return piece if isinstance(piece, bytes) else piece.reshape(-1).view(np.uint8)


def _hash(parts: Any) -> int:
    """xxh3_64 of the pieces one after the other."""
    hasher = xxhash.xxh3_64()
    for part in parts:
        hasher.update(part)
    return int(hasher.intdigest())


def _size(parts: Any) -> int:
    return sum(len(p) if isinstance(p, bytes) else p.nbytes for p in parts)


@dataclass
class _PageSections:
    """What the page options add: the digests and refs sections (as ``_extras`` has them),
    and (with refs) the sent rows of the page-row buffers, replacing those buffers' parts."""

    extras: list[tuple[int, int, Any]] = field(default_factory=list)
    parts: dict[int, list[Any]] = field(default_factory=dict)
    pool_checksum: int = 0  # buffer 0's section checksum, from the digest pass (0: none)


def _page_sections(
    tensor: BlockPagedTensor,
    page_digests: object,
    known_pages: object,
    fuse: bool,
    given: DigestArray | None = None,
) -> _PageSections | None:
    """Plan the page sections (docs/integrity.md § 4, § 6): one digest pass, shared by
    the digests section and the delta plan. With ``fuse`` (a raw, checksummed, whole pool)
    the same pass also hashes the pool for buffer 0's section checksum. ``given``: the
    caller's digests of exactly these pages (:func:`precomputed`), no pass at all."""
    if not page_digests and known_pages is None and given is None:
        return None
    records = page_records(tensor)
    pool_checksum = 0
    planned = known_pages if isinstance(known_pages, DeltaPlan) else None
    if given is not None:
        if planned is not None:
            raise ArgumentTypeError(
                "page_digests as an array and a DeltaPlan both give the digests: pass one",
                field="page_digests",
                found="an array with known_pages=DeltaPlan",
            )
        digests = digest_array(given, records.num_pages, "page_digests")
    elif planned is not None:  # the engine's cached digests, planned by the caller
        digests = check_plan(planned, records)
    elif fuse and known_pages is None:
        digests, pool_checksum = digests_and_checksum(records)
    else:
        digests = records.digests()
    out = _PageSections(pool_checksum=pool_checksum)
    if page_digests or given is not None:
        out.extras.append((w.KIND_PAGE_DIGESTS, 0, encode_digest_section(digests)))
    if known_pages is not None:
        plan = planned or plan_delta(tensor, known_pages, digests=digests)
        sent = gather_sent(tensor, plan)
        out.extras.append((w.KIND_PAGE_REFS, w.FLAG_REQUIRED, encode_page_refs(plan.refs)))
        rows = [sent.scales, sent.zero_points]
        out.parts[0] = [sent.pool.reshape(-1)]
        for index, widths in paged_buffers(tensor.descriptor).params:
            taken, rows = rows[: len(widths)], rows[len(widths) :]
            out.parts[index] = [r.reshape(-1) for r in taken if r is not None]
    return out


def _extras(tensor: BlockPagedTensor, pages: _PageSections | None) -> list[tuple[int, int, Any]]:
    """The sections after the buffers that the blob has: (kind, flags, payload)."""
    extras: list[tuple[int, int, Any]] = []
    if tensor.seq_lens is not None:
        lens = np.ascontiguousarray(tensor.seq_lens, SEQ_LENS)
        extras.append((w.KIND_SEQ_LENS, w.FLAG_REQUIRED, lens))
    if tensor.metadata:
        extras.append((w.KIND_METADATA, 0, encode_metadata(tensor.metadata)))
    return extras if pages is None else extras + pages.extras


def _sections(
    tensor: BlockPagedTensor,
    arrays: Any,
    compression: Compression | None,
    pages: _PageSections | None,
) -> tuple[list[_Entry], list[Any], list[int]]:
    """Each section's entry, the stored pieces of all, and how many each has: the buffers
    (``arrays``: each one's parts), compressed or (with refs) only the sent rows, then
    seq_lens, metadata and the page sections."""
    desc = tensor.descriptor
    entries: list[_Entry] = []
    contents: list[Any] = []
    counts: list[int] = []
    widths = desc.element_widths() if compression is not None else ()
    sent = pages.parts if pages is not None else {}
    buffers = desc.buffers
    for index, parts in enumerate(arrays):
        handle = buffers[index]
        raw = handle.byte_size
        if index in sent:  # delta: only the sent pages' rows, ascending (page_refs)
            parts = sent[index] or [b""]
            raw = _size(parts)
        codec = param = 0
        if compression is not None and raw:
            data = parts[0] if len(parts) == 1 else np.concatenate(parts)
            codec, param, stored = compress_parts(data, compression, widths[index])
            if codec != CODEC_RAW:
                parts = stored
        alignment = handle.alignment if handle.alignment > 64 else 64
        entries.append((w.KIND_BUFFER, w.FLAG_REQUIRED, codec, param, index, _size(parts), raw,
                        alignment))  # fmt: skip
        contents += parts
        counts.append(len(parts))
    for kind, flags, payload in _extras(tensor, pages):
        size = len(payload) if isinstance(payload, bytes) else payload.nbytes
        entries.append((kind, flags, CODEC_RAW, 0, 0, size, size, 64))
        contents.append(payload)
        counts.append(1)
    return entries, contents, counts


@dataclass(frozen=True)
class _Layout:
    """A blob but its sections' stored pieces: the header (sealed, section checksums 0),
    ``gaps[k]`` (zeros) before piece k and ``gaps[-1]`` after the last, each section's
    offset and its pieces ``[bounds[i], bounds[i + 1])``."""

    header: bytes
    gaps: tuple[bytes, ...]
    offsets: tuple[int, ...]
    bounds: tuple[int, ...]
    total: int
    checksum_at: range  # of each section's checksum field


def _layout(wire: bytes, entries: list[_Entry], counts: list[int], checksum: bool) -> _Layout:
    """Give each section its aligned offset after the header; pack and seal the header."""
    length = entry_at(len(entries)) + len(wire)  # header_length: its checksum follows
    cursor = length + CHECKSUM.size
    fields, gaps, offsets, bounds = [], [], [], [0]
    for (kind, flags, codec, param, index, stored, raw, alignment), count in zip(
        entries, counts, strict=True
    ):
        offset = align(cursor, alignment)
        fields.append((kind, flags, codec, param, index, offset, stored, raw, 0, alignment))
        gaps += [bytes(offset - cursor)] + [b""] * (count - 1)
        offsets.append(offset)
        bounds.append(bounds[-1] + count)
        cursor = offset + stored
    total = align(cursor, w.BLOB_ALIGNMENT)
    gaps.append(bytes(total - cursor))
    kind = w.CHECKSUM_XXH3_64 if checksum else w.CHECKSUM_NONE
    fixed = HEADER.pack(1, 0, 0, total, length, len(entries), kind, len(wire))
    header = seal(b"".join([fixed, *(ENTRY.pack(*f) for f in fields), wire]))
    at = range(_FIRST_CHECKSUM, _FIRST_CHECKSUM + _ENTRY_SIZE * len(entries), _ENTRY_SIZE)
    return _Layout(header, tuple(gaps), tuple(offsets), tuple(bounds), total, at)


def _join(layout: _Layout, contents: list[Any]) -> tuple[memoryview, list[Any]]:
    """The blob in a new bytearray, its checksums not patched in yet, and the contents
    as joined (strided arrays copied)."""
    pieces: list[Any] = [None] * (2 * len(contents) + 2)
    pieces[0] = layout.header
    pieces[1::2] = layout.gaps
    pieces[2::2] = contents
    try:
        return memoryview(bytearray().join(pieces)), contents
    except (TypeError, ValueError, BufferError):  # strided arrays: copied
        return _join(layout, [_u8(piece) for piece in contents])


def _seal(out: memoryview, layout: _Layout, contents: list[Any], sums: Sequence[int]) -> None:
    """Patch the section checksums into the header at the start of ``out`` (hashing the
    sections whose sum is 0) and reseal it."""
    pack = _SECTION_CHECKSUM.pack_into
    if len(contents) == len(layout.offsets):  # one piece each (a cached layout: _UNHASHED)
        for at, value, piece in zip(layout.checksum_at, sums, contents, strict=False):
            pack(out, at, value or checksum_of(piece))
    else:
        b = layout.bounds
        for n, at in enumerate(layout.checksum_at):
            pack(out, at, sums[n] or _hash(contents[b[n] : b[n + 1]]))
    end = len(layout.header) - _SEAL.size
    _SEAL.pack_into(out, end, checksum_of(out[:end]))


@dataclass(slots=True)
class _Plan:
    """One blob planned: its layout, its sections' stored pieces and checksums (0: not
    hashed yet; ``sums`` None without checksums). Every route writes from here."""

    layout: _Layout
    contents: list[Any]
    sums: list[int] | None

    def header(self) -> bytes:
        """The header, every section hashed."""
        out = bytearray(self.layout.header)
        if self.sums is not None:
            _seal(memoryview(out), self.layout, self.contents, self.sums)
        return bytes(out)

    def _flatten(self) -> None:
        """Each piece as flat bytes (strided arrays copied), for views and hashing."""
        self.contents = [_u8(piece) for piece in self.contents]

    def pieces(self, hashed: bool = True) -> list[memoryview]:
        """The blob as views: header, zero padding, each section's own arrays (without
        ``hashed``: with zero section checksums)."""
        self._flatten()
        out = [memoryview(self.header() if hashed else self.layout.header)]
        for gap, piece in zip(self.layout.gaps, [*self.contents, b""], strict=True):
            out += [memoryview(p) for p in (gap, piece) if len(p)]
        return out

    def joined(self) -> memoryview:
        """The blob in a new bytearray: one join, then the checksums patched in."""
        out, self.contents = _join(self.layout, self.contents)
        if self.sums is not None:
            _seal(out, self.layout, self.contents, self.sums)
        return out

    def write_into(self, buffer: Any) -> int:
        """Write the blob into the start of a caller's writable buffer; bytes written."""
        view = byte_view(buffer, "buffer")
        if view.readonly:
            raise ArgumentTypeError(
                "buffer must be writable", field="buffer", found=type(buffer).__name__
            )
        out = np.frombuffer(view, np.uint8)
        if len(out) < self.layout.total:
            raise InvalidBlobError(
                "buffer too small for the blob", section="buffer", expected=self.layout.total,
                found=len(out),
            )  # fmt: skip
        self.write(out)
        return self.layout.total

    def write(self, out: npt.NDArray[np.uint8]) -> None:
        """Copy the blob into ``out``, each section hashed chunk by chunk while in cache (no
        extra pass over memory); the header, which holds the checksums, goes last."""
        self._flatten()
        layout, sums = self.layout, self.sums
        cursor = len(layout.header)
        for number, at in enumerate(layout.offsets):
            out[cursor:at] = 0
            hasher = xxhash.xxh3_64() if sums is not None and not sums[number] else None
            for piece in self.contents[layout.bounds[number] : layout.bounds[number + 1]]:
                src = np.frombuffer(piece, np.uint8)
                copy_and_hash(out[at : at + src.nbytes], src, hasher)
                at += src.nbytes
            if sums is not None and hasher is not None:
                sums[number] = int(hasher.intdigest())
            cursor = at
        out[cursor : layout.total] = 0
        out[: len(layout.header)] = np.frombuffer(self.header(), np.uint8)


def encode_parts(
    tensor: BlockPagedTensor,
    *,
    compression: Compression | str | None = None,
    checksum: bool = True,
    compact: bool = False,
    page_digests: bool | DigestArray = False,
    known_pages: Any = None,
) -> list[memoryview]:
    """The blob as scatter-gather pieces (for ``socket.sendmsg``, ``writelines``, an RDMA
    registration): each uncompressed buffer a view of the tensor's own array, no page data
    copied. Options as for :func:`encode`."""
    wanted, given = precomputed(page_digests)
    options = encoder_for(compression, checksum, compact, wanted)
    return options.encode_parts(tensor, known_pages=known_pages, page_digests=given)


def encode_deferred(tensor: BlockPagedTensor) -> tuple[list[memoryview], Callable[[], bytes]]:
    """The pieces of :func:`encode_parts` with zero section checksums, and a function that
    hashes them and returns the final header: NixlSender sends the pool meanwhile."""
    plan = DEFAULT_ENCODER._plan(tensor)
    return plan.pieces(hashed=False), plan.header


def encode_into(
    tensor: BlockPagedTensor,
    buffer: Any,
    *,
    compression: Compression | str | None = None,
    checksum: bool = True,
    compact: bool = False,
    page_digests: bool | DigestArray = False,
    known_pages: Any = None,
) -> int:
    """Write the blob into the start of a caller-provided writable buffer; bytes written.
    Options as for :func:`encode`."""
    wanted, given = precomputed(page_digests)
    options = encoder_for(compression, checksum, compact, wanted)
    return options.encode_into(tensor, buffer, known_pages=known_pages, page_digests=given)


def planned_into(
    tensor: BlockPagedTensor,
    compression: Compression | str | None = None,
    checksum: bool = True,
    page_digests: bool | DigestArray = False,
    known_pages: Any = None,
) -> tuple[int, Callable[[Any], int]]:
    """The blob planned once (sizes known, compressed sections compressed): its size and
    the writer that copies and hashes it into a buffer (``encode_into``; the NIXL sender
    reserves the size, then writes on its hashing thread)."""
    wanted, given = precomputed(page_digests)
    plan = encoder_for(compression, checksum, False, wanted)._plan(tensor, known_pages, given)
    return plan.layout.total, plan.write_into


def encode(
    tensor: BlockPagedTensor,
    *,
    compression: Compression | str | None = None,
    checksum: bool = True,
    compact: bool = False,
    page_digests: bool | DigestArray = False,
    known_pages: Any = None,
) -> memoryview:
    """The blob in a new buffer (a writable ``memoryview`` of a NumPy allocation, far cheaper
    than a fresh ``bytes``; large ones come from ``blob.output.OUTPUT_POOL``, which takes the
    memory back once the caller drops the blob).

    ``compression``: a :class:`Compression`, None (raw) or a text spec (``"zstd:3"``, read by
    :func:`~hurray_wire.codecs.parse_spec`). ``compact=True`` encodes ``tensor.compact()``.
    ``page_digests=True`` adds the page-digests section (an array: that section with
    these precomputed digests, :func:`precomputed`); ``known_pages`` (a receiver's sorted
    digests, or a ``DeltaPlan`` made for this tensor) makes a delta blob whose known pages
    travel as references (docs/integrity.md §§ 4-5). :class:`Encoder` holds the options
    for many tensors.
    """
    wanted, given = precomputed(page_digests)
    options = encoder_for(compression, checksum, compact, wanted)
    return options.encode(tensor, known_pages=known_pages, page_digests=given)


def precomputed(page_digests: object) -> tuple[object, DigestArray | None]:
    """``page_digests=`` read as ``(the flag, the precomputed digests or None)``: an array
    holds the digests of the tensor's physical pages, in pool order, over the very bytes
    encoded (docs/performance.md § issue 30). Dtype and count are checked; the values
    cannot be without the pass they save: the receiver's page-digest check catches them."""
    if isinstance(page_digests, np.ndarray):
        return True, page_digests
    return page_digests, None


@dataclass(frozen=True, eq=False)
class Encoder:
    """Encode options (as for :func:`encode`), checked once, and one layout cache, safe to
    share between threads: ``Encoder(compression="zstd:3").encode(tensor)`` (msgspec's
    ``Encoder``); the module functions use :data:`DEFAULT_ENCODER` or share its cache."""

    compression: Compression | str | None = None  # a text spec is parsed on construction
    checksum: bool = True
    compact: bool = False
    page_digests: bool = False
    #: Raw blobs' layouts by geometry, descriptors' wire bytes by identity: 512 entries or
    #: 16 MiB they keep alive.
    layouts: BoundedMemo[Any] = field(
        default_factory=lambda: BoundedMemo(512, 16 << 20), repr=False
    )
    _plain: bool = field(default=False, init=False, repr=False)

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
        plain = self.compression is None and not self.compact and not self.page_digests
        set_(self, "_plain", plain)  # raw blobs: layouts cached by geometry

    def _wire(self, descriptor: TensorDescriptor) -> bytes:
        """The descriptor's wire bytes, cached by its identity: the entry holds the
        descriptor, so no other object can have its id while the entry lives."""
        found = self.layouts.get(id(descriptor))
        if found is not None and found[0] is descriptor:
            return found[1]  # type: ignore[no-any-return]
        wire = encode_descriptor(descriptor)
        self.layouts.put(id(descriptor), (descriptor, wire), weight(2 * len(wire)))
        return wire

    def _plan(
        self, tensor: BlockPagedTensor, known_pages: Any = None, page_digests: Any = None
    ) -> _Plan:
        """Lay out a blob of ``tensor`` (``page_digests``: precomputed, :func:`precomputed`)."""
        if not isinstance(tensor, BlockPagedTensor):
            raise ArgumentTypeError("expected a BlockPagedTensor", found=type(tensor).__name__)
        if self._plain and known_pages is None and page_digests is None:
            found = self._cached(tensor)
            if found is not None:
                return _Plan(*found, [0] * len(found[1]) if self.checksum else None)
        given = None
        if page_digests is not None:  # precomputed: :func:`precomputed`
            if self.compact:  # compact() renumbers the pages the digests were computed for
                raise ArgumentTypeError(
                    "precomputed page_digests are of the tensor's own pages: not with compact=True",
                    field="page_digests",
                    found="compact=True",
                )
            given = digest_array(page_digests, None, "page_digests")
        if self.compact:
            tensor = tensor.compact()
        check_contents(tensor)  # the arrays may have changed since from_arrays
        compression, checksum = self.compression, self.checksum
        assert not isinstance(compression, str)  # parsed on construction
        fuse = checksum and compression is None
        pages = _page_sections(tensor, self.page_digests, known_pages, fuse, given)
        entries, contents, counts = _sections(tensor, tensor.buffer_arrays(), compression, pages)
        sums = [0] * len(entries) if checksum else None
        if sums is not None and pages is not None:
            sums[0] = pages.pool_checksum
        layout = _layout(self._wire(tensor.descriptor), entries, counts, checksum)
        return _Plan(layout, contents, sums)

    def _cached(self, tensor: BlockPagedTensor) -> tuple[_Layout, list[Any]] | None:
        """A raw blob's plan from its layout cached by geometry (3x faster for small
        blobs); None when the general route must plan it (parameter buffers, contents
        that are not arrays)."""
        descriptor = tensor.descriptor
        pool, table, starts = tensor.page_pool, tensor.block_table, tensor.seq_ptr
        try:
            if len(descriptor.buffers) != 3:
                return None
            sizes = [pool.nbytes, table.nbytes, starts.nbytes]
        except AttributeError:  # not arrays: the general route judges them
            return None
        check_contents(tensor)  # the arrays may have changed since from_arrays
        contents: list[Any] = [pool, table, starts]
        lens = tensor.seq_lens
        if lens is not None:  # as _extras has them, without its tuples (the hot path)
            lens = np.ascontiguousarray(lens, SEQ_LENS)
            contents.append(lens)
            sizes.append(lens.nbytes)
        if tensor.metadata:
            contents.append(encode_metadata(tensor.metadata))
            sizes.append(len(contents[-1]))
        wire = self._wire(descriptor)
        key = (wire, self.checksum, lens is None, *sizes)  # which kind a 4th section is
        layout: _Layout | None = self.layouts.get(key)
        if layout is None:
            arrays = [(pool,), (table,), (starts,)]
            entries, _, counts = _sections(tensor, arrays, None, None)
            layout = _layout(wire, entries, counts, self.checksum)
            size = len(layout.header) + sum(map(len, layout.gaps))
            self.layouts.put(key, layout, weight(size + 64 * len(contents)))
        return layout, contents

    def encode(
        self, tensor: BlockPagedTensor, *, known_pages: Any = None, page_digests: Any = None
    ) -> memoryview:
        """The blob in a new buffer (:func:`encode`); ``known_pages`` makes a delta blob;
        ``page_digests``: this tensor's precomputed page digests (:func:`precomputed`),
        which also add the digests section."""
        if self._plain and known_pages is None and isinstance(tensor, BlockPagedTensor):
            found = None if page_digests is not None else self._cached(tensor)
            if found is not None and found[0].total < _SMALL_BLOB:  # the hot path, inline
                blob, contents = _join(*found)
                if self.checksum:
                    _seal(blob, found[0], contents, _UNHASHED)
                return blob
        plan = self._plan(tensor, known_pages, page_digests)
        total = plan.layout.total
        if total < _SMALL_BLOB:  # tiny blobs: joining a few pieces beats NumPy slicing
            return plan.joined()
        out = OUTPUT_POOL.take(total)  # recycled once the caller drops the blob: no faults
        plan.write(out)
        return memoryview(out.data)

    def encode_parts(
        self, tensor: BlockPagedTensor, *, known_pages: Any = None, page_digests: Any = None
    ) -> list[memoryview]:
        """The blob as scatter-gather pieces (:func:`encode_parts`; ``page_digests`` as
        for :meth:`encode`)."""
        return self._plan(tensor, known_pages, page_digests).pieces()

    def encode_into(
        self,
        tensor: BlockPagedTensor,
        buffer: Any,
        *,
        known_pages: Any = None,
        page_digests: Any = None,
    ) -> int:
        """Write the blob into the start of ``buffer``; bytes written (:func:`encode_into`;
        ``page_digests`` as for :meth:`encode`)."""
        return self._plan(tensor, known_pages, page_digests).write_into(buffer)


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
