"""encode / encode_into / encode_parts / decode: one BlockPagedTensor <-> one blob.

The byte layout is docs/wire-format.md. Decoding validates the whole blob (envelope,
descriptor, buffer sizes, index invariants, seq_lens, padding, checksums, decompressed
sizes, limits) before it returns anything; uncompressed buffers come back as NumPy views
of the input.
"""

from __future__ import annotations

import struct
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import xxhash

from hurray_wire import codecs, parallel
from hurray_wire.buffers import align, byte_view, check_zero
from hurray_wire.codecs import Compression, parse_spec
from hurray_wire.errors import (
    ArgumentTypeError,
    BlobTruncatedError,
    ChecksumError,
    HurrayWireError,
    IndexBufferError,
    InvalidBlobError,
    LimitExceededError,
    PaddingError,
    SectionError,
)
from hurray_wire.metadata import decode_metadata, encode_metadata
from hurray_wire.model.descriptor import TensorDescriptor
from hurray_wire.model.descriptor_codec import decode_descriptor, encode_descriptor
from hurray_wire.model.quantization import PerBlockAffine, PerChannelAffine
from hurray_wire.tensor import BlockPagedTensor, assemble
from hurray_wire.wire import blob as w
from hurray_wire.wire.fast import derive

__all__ = [
    "DecodeLimits",
    "decode",
    "encode",
    "encode_into",
    "encode_parts",
    "blob_length",
    "peek_descriptor",
    "BLOB_PREFIX_SIZE",
]

_HEADER = derive(w.BLOB_HEADER)
_ENTRY = derive(w.SECTION_ENTRY)
_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")
_U16 = struct.Struct("<H")
_LENGTH_COUNT = struct.Struct("<IH")
_HEADER_SIZE = _HEADER.size  # 32
_ENTRY_SIZE = _ENTRY.size  # 48
BLOB_PREFIX_SIZE = 16  # magic, versions, flags, total_length: enough to frame a blob
_ZEROS = bytes(1 << 16)
_COPY_CHUNK = 1 << 20  # copy-then-hash granularity: the chunk is still in cache when hashed
_PARALLEL_CHUNK = 4 << 20  # copied on two cores, hashed on the caller: best at 2-4 MiB
_SMALL_BLOB = 1 << 16  # below this, encode() joins pieces instead of slicing a NumPy buffer


@dataclass(frozen=True)
class DecodeLimits:
    """Caps on what a blob may make the decoder allocate or parse."""

    max_descriptor_length: int = 16 << 20
    max_sections: int = 1024
    max_decompressed_bytes: int = 16 << 30  # sum of raw sizes of compressed sections
    max_metadata_bytes: int = 16 << 20


_DEFAULT_LIMITS = DecodeLimits()


# -- encode ----------------------------------------------------------------------------------
@dataclass
class _Section:
    kind: int
    index: int
    alignment: int
    raw_size: int
    parts: list[Any]  # stored bytes, as 1-D uint8 arrays / bytes
    codec: int = codecs.CODEC_RAW
    codec_param: int = 0
    flags: int = 0
    checksum: int = 0
    offset: int = 0
    stored_size: int = 0

    def __post_init__(self) -> None:
        self.stored_size = sum(len(p) if isinstance(p, bytes) else p.nbytes for p in self.parts)


def _sections(tensor: BlockPagedTensor, compression: Compression | None) -> list[_Section]:
    desc = tensor.descriptor
    sections = []
    widths = _element_widths(tensor) if compression is not None else []
    for index, (parts, handle) in enumerate(zip(tensor.buffer_arrays(), desc.buffers, strict=True)):
        section = _Section(
            w.KIND_BUFFER,
            index,
            max(64, handle.alignment),
            handle.byte_size,
            list(parts),
            flags=w.FLAG_REQUIRED,
        )
        if compression is not None and handle.byte_size:
            data = parts[0] if len(parts) == 1 else np.concatenate(parts)
            codec, param, stored = codecs.compress_parts(data, compression, widths[index])
            if codec != codecs.CODEC_RAW:
                section.codec, section.codec_param = codec, param
                section.parts = stored
                section.stored_size = sum(len(p) for p in stored)
        sections.append(section)
    if tensor.seq_lens is not None:
        lens = np.ascontiguousarray(tensor.seq_lens, "<u8").view(np.uint8)
        sections.append(
            _Section(w.KIND_SEQ_LENS, 0, 64, lens.nbytes, [lens], flags=w.FLAG_REQUIRED)
        )
    if tensor.metadata:
        meta = encode_metadata(tensor.metadata)
        sections.append(_Section(w.KIND_METADATA, 0, 64, len(meta), [meta]))
    return sections


def _element_widths(tensor: BlockPagedTensor) -> list[int]:
    """Bytes per element of each buffer, by buffer index: the shuffle width a codec may use."""
    index_width = tensor.layout.index_dtype.itemsize
    widths = {0: tensor.element_type.itemsize, 1: index_width, 2: index_width}
    quant = tensor.descriptor.quantization
    if isinstance(quant, (PerChannelAffine, PerBlockAffine)):
        if quant.zero_point_buffer_index is not None:
            widths[quant.zero_point_buffer_index] = 4  # int32
        widths[quant.scale_buffer_index] = quant.scale_type.itemsize
    return [widths[i] for i in range(len(tensor.descriptor.buffers))]


def _plan(
    tensor: BlockPagedTensor, compression: Compression | str | None, checksum: bool, hash_raw: bool
) -> tuple[bytes, list[_Section], int]:
    """Lay out a blob: (header bytes incl. its checksum, sections with offsets, total)."""
    if not isinstance(tensor, BlockPagedTensor):
        raise ArgumentTypeError("expected a BlockPagedTensor", found=type(tensor).__name__)
    if isinstance(compression, str):  # the documented text specs, read once at the API edge
        compression = parse_spec(compression)
    elif compression is not None and not isinstance(compression, Compression):
        raise ArgumentTypeError(
            "compression must be a str, a Compression or None",
            field="compression",
            found=type(compression).__name__,
        )
    sections = _sections(tensor, compression)
    descriptor = encode_descriptor(tensor.descriptor)
    header_length = _HEADER_SIZE + _ENTRY_SIZE * len(sections) + len(descriptor)
    cursor = header_length + 8
    for section in sections:
        section.offset = align(cursor, section.alignment)
        cursor = section.offset + section.stored_size
        if checksum and (
            hash_raw or section.codec != codecs.CODEC_RAW or section.raw_size < _COPY_CHUNK
        ):
            section.checksum = _hash_parts(section.parts)
    total = align(cursor, w.BLOB_ALIGNMENT)
    return _header(descriptor, sections, total, checksum), sections, total


def _header(descriptor: bytes, sections: list[_Section], total: int, checksum: bool) -> bytes:
    header_length = _HEADER_SIZE + _ENTRY_SIZE * len(sections) + len(descriptor)
    pieces = [
        _HEADER.struct.pack(
            w.BLOB_MAGIC,
            1,
            0,
            0,
            total,
            header_length,
            len(sections),
            w.CHECKSUM_XXH3_64 if checksum else w.CHECKSUM_NONE,
            b"\0",
            len(descriptor),
            bytes(4),
        )
    ]
    for s in sections:
        pieces.append(
            _ENTRY.struct.pack(
                s.kind,
                s.flags,
                s.codec,
                s.codec_param,
                s.index,
                s.offset,
                s.stored_size,
                s.raw_size,
                s.checksum,
                s.alignment,
                bytes(4),
            )
        )
    pieces.append(descriptor)
    head = b"".join(pieces)
    return head + _U64.pack(xxhash.xxh3_64_intdigest(head))


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
) -> list[memoryview]:
    """The blob as scatter-gather pieces: small header/padding pieces and, for every
    uncompressed buffer, a view of the tensor's own array (no page data is copied).

    The pieces can go to ``socket.sendmsg``, ``file.writelines`` or an RDMA registration.
    ``compact=True`` sends only the referenced pages (``BlockPagedTensor.compact``).
    """
    if compact and isinstance(tensor, BlockPagedTensor):
        tensor = tensor.compact()
    head, sections, total = _plan(tensor, compression, checksum, hash_raw=True)
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


def encode_into(
    tensor: BlockPagedTensor,
    buffer: Any,
    *,
    compression: Compression | str | None = None,
    checksum: bool = True,
    compact: bool = False,
) -> int:
    """Write the blob into the start of a caller-provided writable buffer; bytes written."""
    if compact and isinstance(tensor, BlockPagedTensor):
        tensor = tensor.compact()
    head, sections, total = _plan(tensor, compression, checksum, hash_raw=False)
    try:
        out = np.frombuffer(buffer, np.uint8)
    except (TypeError, ValueError):
        raise ArgumentTypeError("buffer must be a writable bytes-like object") from None
    if not out.flags.writeable:
        raise ArgumentTypeError("buffer must be writable", found=type(buffer).__name__)
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
    """Copy the planned blob into ``out``; large raw sections are copied on two cores when
    there are two and hashed chunk by chunk right after each chunk is copied (still in
    cache), so checksumming costs no extra pass over memory, and the header, which holds
    those checksums, is written last."""
    cursor = len(head)
    late = False
    for section in sections:
        out[cursor : section.offset] = 0
        position = section.offset
        hasher = None
        if checksum and section.checksum == 0 and section.raw_size >= _COPY_CHUNK:
            hasher = xxhash.xxh3_64()
        for piece in section.parts:
            src = np.frombuffer(piece, np.uint8) if isinstance(piece, bytes) else piece
            size = src.nbytes
            _copy_and_hash(out[position : position + size], src, hasher)
            position += size
        if hasher is not None:
            section.checksum = int(hasher.intdigest())
            late = True
        cursor = position
    out[cursor:total] = 0
    if late:
        head = _header(encode_descriptor(tensor.descriptor), sections, total, checksum)
    out[: len(head)] = np.frombuffer(head, np.uint8)


#: Copy on two cores and hash on the caller. None (the default): when two cores are idle
#: (parallel.idle_cores). False: copying and hashing alternate on the calling thread
#: (docs/performance.md).
PARALLEL_HASH: bool | None = None


def _copy_and_hash(
    dst: npt.NDArray[np.uint8], src: npt.NDArray[np.uint8], hasher: Any | None
) -> None:
    """Copy ``src`` into ``dst`` and feed ``dst`` to ``hasher`` (if any) in order, each
    chunk while it is still in cache.

    With a second idle core, a pool thread and the caller both copy chunks, taken in
    order from one counter (two cores copy ~1.3x faster than one), and the caller hashes
    every chunk as soon as it and the ones before it are copied. If the pool thread never
    starts, the caller copies everything itself. On a machine whose other cores are busy
    the serial path is taken: a second thread there makes it slower, not faster.
    """
    size = src.nbytes
    if size < 2 * _PARALLEL_CHUNK or not (
        PARALLEL_HASH if PARALLEL_HASH is not None else parallel.idle_cores() >= 2
    ):
        if hasher is None:
            dst[...] = src
            return
        for start in range(0, size, _COPY_CHUNK):
            chunk = dst[start : start + _COPY_CHUNK]
            chunk[...] = src[start : start + _COPY_CHUNK]
            hasher.update(chunk.data)
        return
    step = _PARALLEL_CHUNK
    count = -(-size // step)
    copied = [threading.Event() for _ in range(count)]
    failures: list[BaseException] = []
    lock = threading.Lock()
    cursor = [0]

    def copy_next() -> bool:
        with lock:
            k = cursor[0]
            if k >= count:
                return False
            cursor[0] = k + 1
        try:
            dst[k * step : (k + 1) * step] = src[k * step : (k + 1) * step]
        except BaseException as exc:  # re-raised on the caller
            failures.append(exc)
        finally:
            copied[k].set()
        return True

    def helper() -> None:
        while copy_next():
            pass

    pool_copier = parallel.submit(helper)
    for k in range(count):
        while not copied[k].is_set():
            if not copy_next():
                copied[k].wait()
        if failures:
            break
        if hasher is not None:
            hasher.update(dst[k * step : (k + 1) * step].data)
    if pool_copier is not None and not pool_copier.cancel():
        pool_copier.result()
    if failures:
        raise failures[0]


def encode(
    tensor: BlockPagedTensor,
    *,
    compression: Compression | str | None = None,
    checksum: bool = True,
    compact: bool = False,
) -> memoryview:
    """The blob in a new buffer (a writable ``memoryview`` of a NumPy allocation, which
    costs far less than a fresh ``bytes``); ``bytes(blob)`` copies it if needed.

    ``compression``: a :class:`Compression`, None (every section raw) or a text spec such
    as ``"default"`` or ``"zstd:3"``, read once by :func:`~hurray_wire.codecs.parse_spec`
    (as are the other encoders' and the stream writer's). ``compact=True`` encodes
    ``tensor.compact()``: only the referenced pages."""
    if not isinstance(tensor, BlockPagedTensor):
        raise ArgumentTypeError("expected a BlockPagedTensor", found=type(tensor).__name__)
    if compact:
        tensor = tensor.compact()
    if tensor.nbytes < _SMALL_BLOB:  # tiny blobs: joining a few pieces beats NumPy slicing
        return memoryview(
            bytearray().join(encode_parts(tensor, compression=compression, checksum=checksum))
        )
    head, sections, total = _plan(tensor, compression, checksum, hash_raw=False)
    out = np.empty(total, np.uint8)
    _write(tensor, out, head, sections, total, checksum)
    return memoryview(out.data)


# -- decode ----------------------------------------------------------------------------------
def blob_length(data: Any) -> int:
    """total_length of the blob at the start of ``data`` (needs 16 bytes): for framing."""
    view = byte_view(data)
    _check_magic(view)
    if len(view) < BLOB_PREFIX_SIZE:
        raise BlobTruncatedError(
            "input ends inside the blob prefix",
            section="header",
            offset=len(view),
            expected=BLOB_PREFIX_SIZE,
            found=len(view),
        )
    major = view[4]
    if major != 1:
        raise InvalidBlobError(
            "unsupported blob major version",
            section="header",
            field="version_major",
            offset=4,
            expected=1,
            found=major,
        )
    total: int = _U64.unpack_from(view, 8)[0]
    if total < _HEADER_SIZE + 8 or total % w.BLOB_ALIGNMENT:
        raise InvalidBlobError(
            "total_length is not a valid blob length",
            section="header",
            field="total_length",
            offset=8,
            found=total,
        )
    return total


def _check_magic(view: memoryview) -> None:
    head = bytes(view[:4])
    if head != w.BLOB_MAGIC[: len(head)]:
        raise InvalidBlobError(
            "bad blob magic",
            section="header",
            field="magic",
            offset=0,
            expected=w.BLOB_MAGIC.hex(" "),
            found=head.hex(" "),
        )


@dataclass(frozen=True)
class _Entry:
    """One checked section entry: where its stored bytes are and how to decode them."""

    kind: int
    index: int
    codec: int
    codec_param: int
    offset: int
    stored_size: int
    raw_size: int
    entry_offset: int  # where the section's table entry is (its checksum is read per call)
    pad_start: int  # the zero padding before the section: [pad_start, offset)
    where: str


@dataclass(frozen=True)
class _Plan:
    """Everything a blob's header bytes determine, validated once (and memoised)."""

    descriptor: TensorDescriptor
    total: int
    entries: tuple[_Entry, ...]
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
    buffers: tuple[_Entry, ...] = ()
    seq_lens: _Entry | None = None
    metadata: _Entry | None = None


_PLANS: dict[tuple[int, int, DecodeLimits], _Plan] = {}
_PLAN_LIMIT = 512
_MASKS: dict[tuple[int, int], int] = {}


def _checksum_mask(header_length: int, count: int) -> int:
    """All-ones over ``header_length`` bytes but the section checksums (little-endian)."""
    mask = _MASKS.get((header_length, count))
    if mask is None:
        mask = (1 << (8 * header_length)) - 1
        for at in range(_HEADER_SIZE + 32, _HEADER_SIZE + _ENTRY_SIZE * count, _ENTRY_SIZE):
            mask &= ~(((1 << 64) - 1) << (8 * at))
        if len(_MASKS) >= _PLAN_LIMIT:
            _MASKS.clear()
        _MASKS[(header_length, count)] = mask
    return mask


def _checked_header(view: memoryview, total: int) -> tuple[int, int]:
    """(header_length, section_count) once ``header_length`` agrees with the header's counts
    and fits in ``total`` bytes, and the header checksum matches."""
    header_length, count = _LENGTH_COUNT.unpack_from(view, 16)
    expected_length = _HEADER_SIZE + _ENTRY_SIZE * count + _U32.unpack_from(view, 24)[0]
    if header_length != expected_length or header_length + 8 > total:
        raise InvalidBlobError(
            "header_length disagrees with section_count and descriptor_length, or leaves no "
            "room for the header checksum within total_length",
            section="header",
            field="header_length",
            offset=16,
            expected=expected_length,
            found=header_length,
        )
    stored_hash = _U64.unpack_from(view, header_length)[0]
    computed = xxhash.xxh3_64_intdigest(view[:header_length])
    if stored_hash != computed:
        raise ChecksumError(
            "header checksum mismatch",
            section="header",
            offset=header_length,
            expected=f"0x{computed:016x}",
            found=f"0x{stored_hash:016x}",
        )
    return header_length, count


def _check_limits(count: int, dlen: int, limits: DecodeLimits) -> None:
    """Refuse a header whose section table or descriptor is above the decode limits."""
    if count > limits.max_sections:
        raise LimitExceededError(
            "too many sections",
            section="header",
            field="section_count",
            offset=20,
            found=count,
            expected=f"<= {limits.max_sections}",
        )
    if dlen > limits.max_descriptor_length:
        raise LimitExceededError(
            "descriptor too long",
            section="header",
            field="descriptor_length",
            offset=24,
            found=dlen,
            expected=f"<= {limits.max_descriptor_length}",
        )


def _embedded_descriptor(view: memoryview, start: int, header_length: int) -> TensorDescriptor:
    """Decode the descriptor at ``[start, header_length)``; errors carry blob offsets."""
    try:
        descriptor = decode_descriptor(view[start:header_length])
    except HurrayWireError as exc:
        offset = None if exc.offset is None else start + exc.offset
        raise exc.relocated(section="descriptor", offset=offset) from None
    if descriptor.descriptor_length != header_length - start:
        raise InvalidBlobError(
            "descriptor is shorter than the header's descriptor_length",
            section="descriptor",
            offset=start,
            expected=header_length - start,
            found=descriptor.descriptor_length,
        )
    return descriptor


def _total_length(view: memoryview, *, whole: bool) -> int:
    """total_length of the blob at the start of ``view`` once its 32-byte header is there
    (and, with ``whole``, all of it); otherwise the precise framing error."""
    if len(view) >= _HEADER_SIZE and view[:4] == w.BLOB_MAGIC and view[4] == 1:
        total: int = _U64.unpack_from(view, 8)[0]
        plausible = total >= _HEADER_SIZE + 8 and not total % w.BLOB_ALIGNMENT
        if plausible and (not whole or total <= len(view)):
            return total
    total = blob_length(view)  # raises for bad magic, version or total_length
    if len(view) < _HEADER_SIZE:
        raise BlobTruncatedError(
            "input ends inside the blob header",
            section="header",
            offset=len(view),
            expected=_HEADER_SIZE,
            found=len(view),
        )
    raise BlobTruncatedError(
        "input is shorter than total_length",
        section="header",
        field="total_length",
        offset=len(view),
        expected=total,
        found=len(view),
    )


def peek_descriptor(data: Any, *, limits: DecodeLimits | None = None) -> TensorDescriptor:
    """The descriptor of the blob at the start of ``data``, after checking the blob's header
    and header checksum, without reading its sections (``data`` may end after the header)."""
    view = byte_view(data)
    total = _total_length(view, whole=False)
    count, dlen = _U16.unpack_from(view, 20)[0], _U32.unpack_from(view, 24)[0]
    _check_limits(count, dlen, _DEFAULT_LIMITS if limits is None else limits)
    header_length, count = _checked_header(view, min(total, len(view)))
    return _embedded_descriptor(view, _HEADER_SIZE + _ENTRY_SIZE * count, header_length)


def decode(
    data: Any, *, verify: bool = True, limits: DecodeLimits | None = None, threads: int = -1
) -> BlockPagedTensor:
    """Validate one blob at the start of ``data`` and return its tensor.

    Uncompressed buffers are NumPy views of ``data`` (read-only when ``data`` is). With
    ``verify=False`` the section checksums are skipped; everything else is still checked.
    ``threads`` (the caller included; -1 = every usable core, 0 = the caller only)
    decompress the chunks of chunked sections.
    """
    view = byte_view(data)
    limits = _DEFAULT_LIMITS if limits is None else limits
    if threads != -1:
        threads = codecs.check_threads(threads)
    total = _total_length(view, whole=True)
    header_length, count = _checked_header(view, total)
    # Everything but the section checksums is memoised: equal bytes, equal verdict. The
    # key is the header as one integer with the checksum fields masked out (with
    # checksum_type 0 they must stay zero, so they stay in the key).
    key = int.from_bytes(view[:header_length], "little")
    if view[22] == w.CHECKSUM_XXH3_64:
        key &= _checksum_mask(header_length, count)
    memo_key = (key, header_length, limits)
    plan = _PLANS.get(memo_key)
    if plan is None:
        plan = _plan_from_header(view, total, limits)
        if len(_PLANS) >= _PLAN_LIMIT:
            _PLANS.clear()
        _PLANS[memo_key] = plan
    return _materialize(view, plan, verify, threads)


def _plan_from_header(view: memoryview, total: int, limits: DecodeLimits) -> _Plan:
    """Validate the fixed header, header checksum, descriptor and section table."""
    (_, _, _, flags, _, header_length, count, checksum_type, reserved0, dlen, reserved1) = (
        _HEADER.struct.unpack_from(view, 0)
    )
    if flags:
        raise InvalidBlobError(
            "reserved header flag bits set",
            section="header",
            field="header_flags",
            offset=6,
            found=f"0x{flags:04X}",
        )
    if reserved0 != b"\0" or reserved1 != bytes(4):
        raise PaddingError(
            "reserved header bytes must be zero",
            section="header",
            offset=23 if reserved0 != b"\0" else 28,
        )
    if checksum_type not in (w.CHECKSUM_NONE, w.CHECKSUM_XXH3_64):
        raise InvalidBlobError(
            "unknown checksum_type",
            section="header",
            field="checksum_type",
            offset=22,
            found=checksum_type,
        )
    _check_limits(count, dlen, limits)
    desc_start = _HEADER_SIZE + _ENTRY_SIZE * count
    descriptor = _embedded_descriptor(view, desc_start, header_length)
    raw_entries = list(_ENTRY.struct.iter_unpack(view[_HEADER_SIZE:desc_start]))
    entries, tail = _check_entries(
        raw_entries, descriptor, header_length + 8, total, checksum_type, limits
    )
    return _Plan(descriptor, total, entries, tail, checksum_type == w.CHECKSUM_XXH3_64)


def _check_entries(
    raw_entries: list[tuple[Any, ...]],
    descriptor: TensorDescriptor,
    start: int,
    total: int,
    checksum_type: int,
    limits: DecodeLimits,
) -> tuple[tuple[_Entry, ...], int]:
    """Check every entry against the rules of docs/wire-format.md § 2 and the descriptor."""
    buffers = descriptor.buffers
    entries: list[_Entry] = []
    seen: set[int] = set()
    cursor = start
    next_buffer = 0
    decompressed = 0
    for number, entry in enumerate(raw_entries):
        (kind, sflags, codec, param, index, offset, stored, raw, checksum, alignment, reserved) = (
            entry
        )
        where = f"{w.SECTION_KINDS.get(kind, f'kind 0x{kind:02X}')}[{index}]"
        at = _HEADER_SIZE + _ENTRY_SIZE * number
        if reserved != bytes(4) or sflags & ~w.FLAG_REQUIRED:
            raise SectionError("reserved section bits or bytes set", section=where, offset=at)
        if alignment < w.BLOB_ALIGNMENT or alignment & (alignment - 1):
            raise SectionError(
                "section alignment must be a power of two >= 64",
                section=where,
                field="alignment",
                offset=at + 40,
                found=alignment,
            )
        if offset != align(cursor, alignment):
            raise SectionError(
                "section is not at the next aligned offset after the previous one",
                section=where,
                field="offset",
                offset=at + 8,
                expected=align(cursor, alignment),
                found=offset,
            )
        end = offset + stored
        if end > total:
            raise BlobTruncatedError(
                "section extends past total_length",
                section=where,
                field="stored_size",
                offset=at + 16,
                expected=f"<= {total - offset}",
                found=stored,
            )
        if kind == w.KIND_BUFFER:
            if index != next_buffer or number != index:
                raise SectionError(
                    "buffer sections must come first, in buffer-table order",
                    section=where,
                    field="index",
                    offset=at + 4,
                    expected=next_buffer,
                    found=index,
                )
            if index >= len(buffers):
                raise SectionError(
                    "buffer index beyond the descriptor's buffer table",
                    section=where,
                    field="index",
                    offset=at + 4,
                    expected=f"< {len(buffers)}",
                    found=index,
                )
            handle = buffers[index]
            if raw != handle.byte_size:
                raise SectionError(
                    "raw_size disagrees with the descriptor's byte_size",
                    section=where,
                    field="raw_size",
                    offset=at + 24,
                    expected=handle.byte_size,
                    found=raw,
                )
            if alignment < handle.alignment:
                raise SectionError(
                    "section alignment below the descriptor's alignment",
                    section=where,
                    field="alignment",
                    offset=at + 40,
                    expected=f">= {handle.alignment}",
                    found=alignment,
                )
            if not sflags & w.FLAG_REQUIRED:
                raise SectionError(
                    "buffer sections must be flagged required",
                    section=where,
                    field="section_flags",
                    offset=at + 1,
                    found=sflags,
                )
            next_buffer += 1
        elif kind in (w.KIND_SEQ_LENS, w.KIND_METADATA):
            if index != 0 or kind in seen:
                raise SectionError(
                    "extension section duplicated or with a non-zero index",
                    section=where,
                    field="index",
                    offset=at + 4,
                    found=index,
                )
            if next_buffer != len(buffers):
                raise SectionError(
                    "extension sections follow all buffer sections", section=where, offset=at
                )
            if kind == w.KIND_SEQ_LENS and not sflags & w.FLAG_REQUIRED:
                raise SectionError(
                    "a seq_lens section must be flagged required",
                    section=where,
                    field="section_flags",
                    offset=at + 1,
                    found=sflags,
                )
            if kind == w.KIND_SEQ_LENS and raw != 8 * descriptor.layout.num_seqs:
                raise SectionError(
                    "seq_lens needs 8 bytes per sequence",
                    section=where,
                    field="raw_size",
                    offset=at + 24,
                    expected=8 * descriptor.layout.num_seqs,
                    found=raw,
                )
            if kind == w.KIND_METADATA and raw > limits.max_metadata_bytes:
                raise LimitExceededError(
                    "metadata section above the limit",
                    section=where,
                    field="raw_size",
                    offset=at + 24,
                    found=raw,
                    expected=f"<= {limits.max_metadata_bytes}",
                )
            seen.add(kind)
        elif sflags & w.FLAG_REQUIRED or kind == 0:
            raise SectionError(
                "unknown section kind flagged required",
                section=where,
                field="kind",
                offset=at,
                found=kind,
            )
        elif index != 0:
            raise SectionError(
                "a section that is not a buffer has index 0",
                section=where,
                field="index",
                offset=at + 4,
                found=index,
            )
        if checksum_type == w.CHECKSUM_NONE and checksum:
            raise SectionError(
                "checksum set although checksum_type is none",
                section=where,
                field="checksum",
                offset=at + 32,
                found=checksum,
            )
        if codec == codecs.CODEC_RAW:
            if stored != raw or param:
                raise SectionError(
                    "a raw section has stored_size == raw_size and no codec parameter",
                    section=where,
                    field="stored_size",
                    offset=at + 16,
                    expected=raw,
                    found=stored,
                )
        elif (known := codecs.registry.find(codec)) is not None:
            if not known.valid_param(param):
                raise SectionError(
                    "codec_param must be 0 for zstd, a shuffle width of 2, 4 or 8 for "
                    "shuffle-zstd and of 1, 2, 4 or 8 for chunked-shuffle-zstd",
                    section=where,
                    field="codec_param",
                    offset=at + 3,
                    found=param,
                )
            if kind in w.SECTION_KINDS:
                decompressed += raw
                if decompressed > limits.max_decompressed_bytes:
                    raise LimitExceededError(
                        "decompressed size above the limit",
                        section=where,
                        field="raw_size",
                        offset=at + 24,
                        found=raw,
                        expected=f"<= {limits.max_decompressed_bytes} in all",
                    )
        else:
            raise SectionError(
                "unknown codec", section=where, field="codec", offset=at + 2, found=codec
            )
        entries.append(_Entry(kind, index, codec, param, offset, stored, raw, at, cursor, where))
        cursor = end
    if next_buffer != len(buffers):
        raise SectionError(
            "a descriptor buffer has no section",
            section="section table",
            expected=len(buffers),
            found=next_buffer,
        )
    if total != align(cursor, w.BLOB_ALIGNMENT):
        raise InvalidBlobError(
            "total_length must be the end of the last section rounded up to 64",
            section="header",
            field="total_length",
            offset=8,
            expected=align(cursor, w.BLOB_ALIGNMENT),
            found=total,
        )
    return tuple(entries), cursor


def _materialize(view: memoryview, plan: _Plan, verify: bool, threads: int) -> BlockPagedTensor:
    """Check padding and checksums, decode the sections, then assemble the tensor."""
    for start, stop, where in plan.paddings:
        if int.from_bytes(view[start:stop], "little"):
            check_zero(view, start, stop, error=PaddingError, section=where)
    if verify and plan.verify_sections:
        for e in plan.entries:
            computed = xxhash.xxh3_64_intdigest(view[e.offset : e.offset + e.stored_size])
            stored_checksum = _U64.unpack_from(view, e.entry_offset + 32)[0]
            if computed != stored_checksum:
                raise ChecksumError(
                    "section checksum mismatch",
                    section=e.where,
                    offset=e.offset,
                    expected=f"0x{computed:016x}",
                    found=f"0x{stored_checksum:016x}",
                )
    whole = np.frombuffer(view, np.uint8, plan.total)

    def payload(e: _Entry) -> npt.NDArray[np.uint8]:
        if e.codec == codecs.CODEC_RAW:
            return whole[e.offset : e.offset + e.stored_size]
        return _decompress(e, whole[e.offset : e.offset + e.stored_size], threads)

    buffers = [payload(e) for e in plan.buffers]
    lens = None if plan.seq_lens is None else payload(plan.seq_lens)
    meta = None if plan.metadata is None else payload(plan.metadata)
    return _assemble(plan, buffers, lens, meta)


def _decompress(e: _Entry, stored: npt.NDArray[np.uint8], threads: int) -> npt.NDArray[np.uint8]:
    """Decode one compressed section into a new array (allocated after its layout checks);
    errors carry blob offsets. The section table checked the codec and its parameter."""
    try:
        return codecs.decode_section(e.codec, e.codec_param, stored, e.raw_size, threads)
    except HurrayWireError as exc:
        inside = exc.offset if exc.offset is not None and exc.offset <= stored.size else 0
        raise exc.relocated(section=e.where, offset=e.offset + inside) from None


def _assemble(
    plan: _Plan,
    buffers: list[npt.NDArray[np.uint8]],
    lens_payload: npt.NDArray[np.uint8] | None,
    meta_payload: npt.NDArray[np.uint8] | None,
) -> BlockPagedTensor:
    """Type the sections and check what needs their contents (tensor.assemble, shared
    with the containers), placing its errors at blob offsets."""
    descriptor = plan.descriptor

    def raw_offset(e: _Entry | None) -> int | None:
        """Blob offset of a section's contents; None for decoded (compressed) bytes."""
        return e.offset if e is not None and e.codec == codecs.CODEC_RAW else None

    seq_lens = None if lens_payload is None else lens_payload.view("<u8")
    metadata: dict[str, Any] = {}
    if meta_payload is not None:
        try:
            metadata = dict(decode_metadata(meta_payload))
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
    except HurrayWireError as exc:
        raise exc.relocated(section="buffer[0]", offset=raw_offset(plan.buffers[0])) from None
