"""encode_descriptor / decode_descriptor: TensorDescriptor <-> the reference's exact bytes.

Fast path: ``struct.Struct`` formats derived from the construct definitions in
``hurray_wire.wire.descriptor`` (see ``hurray_wire.wire.fast``), with every MUST-reject rule
of descriptor.md § 11 checked explicitly here or in the model constructors. General path:
``decode_header`` parses a descriptor of any layout with the construct ``DESCRIPTOR``
struct and checks the layout-independent rules (for ``dump``).
"""

from __future__ import annotations

import dataclasses
import re
import struct
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import construct as c

from hurray_wire import dtypes
from hurray_wire.buffers import byte_view
from hurray_wire.dtypes import ElementType
from hurray_wire.errors import (
    ArgumentTypeError,
    DescriptorTruncatedError,
    HurrayWireError,
    InvalidDescriptorError,
    UnsupportedLayoutError,
)
from hurray_wire.model.descriptor import BufferHandle, Statistics, TensorDescriptor
from hurray_wire.model.layout import BlockPagedLayout
from hurray_wire.model.quantization import (
    MXFP,
    NF4,
    NO_BUFFER,
    SYMMETRIC,
    PerBlockAffine,
    PerChannelAffine,
    PerTensorAffine,
    Quantization,
)
from hurray_wire.wire import descriptor as w
from hurray_wire.wire.fast import derive

__all__ = [
    "encode_descriptor",
    "decode_descriptor",
    "decode_header",
    "peek_descriptor_length",
    "DescriptorHeader",
]


def _fmt_prefix(fast: Any, position: int) -> int:
    """Length of the format string covering the fields before ``position``."""
    codes = re.findall(r"\d*[A-Za-z]", fast.struct.format[1:])
    return sum(len(code) for code in codes[:position])


_HEADER = derive(w.FIXED_HEADER)
_PAYLOAD = derive(w.BLOCK_PAGED_PAYLOAD)
_HANDLE = derive(w.BUFFER_HANDLE)
_QHEADER = derive(w.QUANT_HEADER)
_SCHEME = {tag: derive(defn) for tag, defn in w.SCHEME_PAYLOADS.items()}
_STATS = derive(w.STATISTICS)
_MEMBER = derive(w.COMPOSITE_MEMBER)
_SHAPE3 = struct.Struct("<4Q")  # shape[0..2] + byte_offset
_U32 = struct.Struct("<I")

_HEADER_LEN = _HEADER.size  # 20
_BP_FIXED_LEN = _HEADER_LEN + _SHAPE3.size + _PAYLOAD.size + 1  # up to buffer_count: 85
_KV_ROLE_NAMES = {v: k for k, v in w.KV_ROLES.items()}
_INDEX_TYPE_NAMES = {v: k for k, v in w.INDEX_TYPES.items()}
_SCALE_TYPE_TAGS = {0x01: dtypes.float16, 0x02: dtypes.bfloat16, 0x03: dtypes.float32}
_STATS_OFFSETS = {
    name: struct.calcsize("<" + _STATS.struct.format[1:][: _fmt_prefix(_STATS, i)])
    for i, name in enumerate(_STATS.names)
}
_CACHE: dict[bytes, TensorDescriptor] = {}
_HANDLES: dict[bytes, BufferHandle] = {}
_CACHE_LIMIT = 1024

# Byte offsets of the fixed fields of a rank-3 block-paged descriptor, for error messages.
_FIELD_OFFSETS = {
    "magic": 0,
    "version_major": 4,
    "version_minor": 5,
    "descriptor_length": 6,
    "flags": 10,
    "type_tag": 14,
    "element_type": 14,
    "layout_tag": 15,
    "rank": 16,
    "shape": 20,
    "shape[0]": 20,
    "shape[1]": 28,
    "shape[2]": 36,
    "byte_offset": 44,
    "page_size": 52,
    "num_pages": 56,
    "paged_axis": 64,
    "num_seqs": 68,
    "kv_role": 72,
    "layer_index": 73,
    "block_table_index_type": 77,
    "_reserved": 78,
    "buffer_count": 84,
}
_HANDLE_OFFSETS = {
    "byte_size": 0,
    "alignment": 8,
    "device_tag": 12,
    "sync_mode": 13,
    "memory_class": 14,
}
_QUANT_OFFSETS = {"scheme_tag": 4, "scheme_version": 5, "flags": 6}  # from the section start
for _tag, _fast in _SCHEME.items():  # payload fields start 8 bytes in
    _QUANT_OFFSETS.update(
        {
            f"{_tag}.{name}": 8
            + struct.calcsize("<" + _fast.struct.format[1:][: _fmt_prefix(_fast, i)])
            for i, name in enumerate(_fast.names)
        }
    )

E = TypeVar("E", bound=HurrayWireError)


def _error(
    message: str, field: str | None, offset: int | None, **kw: Any
) -> InvalidDescriptorError:
    return InvalidDescriptorError(message, section="descriptor", field=field, offset=offset, **kw)


def peek_descriptor_length(data: Any) -> int:
    """descriptor_length from the first 10 bytes (what stream framing needs), checked."""
    view = byte_view(data)
    if len(view) >= 4 and view[:4] != w.MAGIC:
        raise _error(
            "bad magic", "magic", 0, expected="48 52 52 59", found=bytes(view[:4]).hex(" ")
        )
    if len(view) < 10:
        raise DescriptorTruncatedError(
            "input ends inside the descriptor prefix",
            section="descriptor",
            offset=len(view),
            expected="at least 10 bytes",
            found=len(view),
        )
    major = view[4]
    if major != 1:
        raise _error("unsupported major version", "version_major", 4, expected=1, found=major)
    length: int = _U32.unpack_from(view, 6)[0]
    if length < _HEADER_LEN:
        raise _error(
            "descriptor_length below the 20-byte header", "descriptor_length", 6, found=length
        )
    return length


# -- decode ----------------------------------------------------------------------------------
def _descriptor_bytes(data: Any) -> bytes:
    """Exactly the ``descriptor_length`` bytes at the start of ``data``, or the error."""
    view = byte_view(data)
    length = peek_descriptor_length(view)
    if length > len(view):
        raise DescriptorTruncatedError(
            "input is shorter than descriptor_length",
            section="descriptor",
            field="descriptor_length",
            offset=len(view),
            expected=length,
            found=len(view),
        )
    return bytes(view[:length])


def decode_descriptor(data: Any) -> TensorDescriptor:
    """Decode one block-paged descriptor from the start of ``data``; reads exactly
    ``descriptor_length`` bytes (``result.descriptor_length`` says how many).

    A valid descriptor of another layout raises ``UnsupportedLayoutError``.
    """
    raw = _descriptor_bytes(data)
    cached = _CACHE.get(raw)
    if cached is not None:
        return cached
    descriptor = _decode_block_paged(raw)
    if len(_CACHE) >= _CACHE_LIMIT:
        _CACHE.clear()
    _CACHE[raw] = descriptor
    return descriptor


def _check_consts(fast: Any, values: tuple[Any, ...], base: int, section: str) -> None:
    for position, expected in fast.consts:
        found = values[position]
        if found != expected:
            offset = base + struct.calcsize(
                "<" + fast.struct.format[1:][: _fmt_prefix(fast, position)]
            )
            first = next(i for i, b in enumerate(found) if b)
            raise _error(
                "reserved bytes must be zero",
                f"{section}{fast.names[position]}",
                offset + first,
                found=found.hex(" "),
            )


def _decode_block_paged(raw: bytes) -> TensorDescriptor:
    length = len(raw)
    header = _HEADER.struct.unpack_from(raw, 0)
    _, major, minor, _, flags, type_tag, layout_tag, rank = header
    if flags & ~0x1F:
        raise _error("reserved flag bits set", "flags", 10, found=f"0x{flags:08X}")
    element_type = _element_type(type_tag, flags)
    if layout_tag != 0x0A:
        _refuse_other_layout(raw, layout_tag)
    if rank != 3:
        raise _error("block-paged tensors have rank 3", "rank", 16, expected=3, found=rank)
    need = _need(length, _BP_FIXED_LEN, "the block-paged payload and buffer_count")
    shape0, shape1, shape2, byte_offset = _SHAPE3.unpack_from(raw, 20)
    if byte_offset != 0:
        raise _error("byte_offset must be 0 for block-paged", "byte_offset", 44, found=byte_offset)
    payload = _PAYLOAD.struct.unpack_from(raw, 52)
    _check_consts(_PAYLOAD, payload, 52, "")
    page_size, num_pages, paged_axis, num_seqs, role_byte, layer, index_byte, _ = payload
    role = _KV_ROLE_NAMES.get(role_byte)
    if role is None:
        raise _error("unknown kv_role", "kv_role", 72, expected="0, 1 or 2", found=role_byte)
    index_type = _INDEX_TYPE_NAMES.get(index_byte)
    if index_type is None:
        raise _error(
            "unknown block_table_index_type",
            "block_table_index_type",
            77,
            expected="0 or 1",
            found=index_byte,
        )
    count = raw[84]
    pos = _need(length, need + 16 * count, f"{count} buffer handles") if count else need
    handles = tuple(_handle(raw, 85 + 16 * i, i) for i in range(count))
    quant: Quantization | None = None
    quant_padding = b""
    if flags & 0x01:
        quant, quant_padding, pos = _quantization(raw, pos, length)
    if flags & 0x02:
        raise _error(
            "a block-paged tensor must not carry a shard section",
            "flags",
            10,
            found=f"0x{flags:08X}",
        )
    statistics = None
    if flags & 0x08:
        statistics, pos = _statistics(raw, pos, length)
    member = None
    if flags & 0x10:
        member, pos = _composite_member(raw, pos, length)
    trailing = _trailing(raw, pos, minor)
    with _Located(_quant_base(count), quant.scheme_tag if quant is not None else 0):
        layout = BlockPagedLayout(
            page_size,
            num_pages,
            paged_axis,
            num_seqs,
            role,
            None if layer == w.LAYER_NONE else layer,
            index_type,
        )
        return TensorDescriptor(
            element_type,
            (shape0, shape1, shape2),
            layout,
            handles,
            quant,
            (major, minor),
            statistics,
            member,
            quant_padding,
            trailing,
        )


def _quant_base(count: int) -> int:
    return 85 + 16 * count


def _need(length: int, end: int, what: str) -> int:
    """``end`` if the descriptor is long enough to hold it, else the length error."""
    if end > length:
        raise _error(
            f"descriptor_length too small to hold {what}",
            "descriptor_length",
            6,
            expected=f">= {end}",
            found=length,
        )
    return end


def _trailing(raw: bytes, pos: int, minor: int) -> bytes:
    if pos == len(raw):
        return b""
    if minor == 0:
        raise _error(
            "descriptor_length disagrees with the content at version 1.0",
            "descriptor_length",
            6,
            expected=pos,
            found=len(raw),
        )
    return raw[pos:]


def _element_type(type_tag: int, flags: int) -> ElementType:
    private = 0xF0 <= type_tag <= 0xFE
    if bool(flags & 0x04) != private:
        raise _error(
            "HAS_EXTENSION_TYPE must be set exactly for private type tags 0xF0-0xFE",
            "flags",
            10,
            found=f"flags 0x{flags:08X}, type_tag 0x{type_tag:02X}",
        )
    if private:
        raise _error(
            "private extension element types are not supported for block-paged tensors",
            "type_tag",
            14,
            found=f"0x{type_tag:02X}",
        )
    try:
        return dtypes.element_type_from_tag(type_tag)
    except InvalidDescriptorError as exc:
        raise exc.relocated(section="descriptor", offset=14) from None


def _refuse_other_layout(raw: bytes, layout_tag: int) -> None:
    name = _layout_name(layout_tag)
    if name is None:
        raise _error(
            _layout_class(layout_tag) + " layout tag", "layout_tag", 15, found=f"0x{layout_tag:02X}"
        )
    decode_header(raw)  # an invalid descriptor of another layout is an input error
    raise UnsupportedLayoutError(
        f"descriptor has layout {name} (0x{layout_tag:02X}); hurray-wire decodes block_paged "
        "(0x0A) tensors, use decode_header() for the common header",
        layout_tag=layout_tag,
        layout_name=name,
        section="descriptor",
        field="layout_tag",
        offset=15,
    )


def _layout_name(tag: int) -> str | None:
    if 0xF0 <= tag <= 0xFE:
        return f"private_0x{tag:02X}"
    return w.LAYOUT_NAMES.get(tag)


def _layout_class(tag: int) -> str:
    return "invalid" if tag in (0x00, 0xFF) else "reserved or unknown"


def _handle(raw: bytes, offset: int, index: int) -> BufferHandle:
    key = raw[offset : offset + 16]
    known = _HANDLES.get(key)
    if known is not None:  # handles are immutable values: reuse the checked one
        return known
    handle = _new_handle(raw, offset, index)
    if len(_HANDLES) >= _CACHE_LIMIT:
        _HANDLES.clear()
    _HANDLES[key] = handle
    return handle


def _new_handle(raw: bytes, offset: int, index: int) -> BufferHandle:
    values = _HANDLE.struct.unpack_from(raw, offset)
    if values[5] != b"\0":
        raise _error(
            "reserved byte must be zero",
            f"buffers[{index}]._reserved",
            offset + 15,
            found=values[5][0],
        )
    try:
        return BufferHandle(*values[:5])
    except InvalidDescriptorError as exc:
        rel = _HANDLE_OFFSETS.get(exc.field or "", 0)
        raise exc.relocated(
            section="descriptor", field=f"buffers[{index}].{exc.field}", offset=offset + rel
        ) from None


def _scheme_class(tag: int) -> str:
    if tag in (0x00, 0xFF):
        return "invalid"
    if 0x06 <= tag <= 0x5F:
        return "unassigned"
    if 0x60 <= tag <= 0xEF:
        return "reserved"
    return "private"


def _quantization(raw: bytes, pos: int, length: int) -> tuple[Quantization, bytes, int]:
    """Parse the quantization section at ``pos``: (scheme, writer padding, end)."""
    _need(length, pos + 4, "quantization_length")
    qlen = _U32.unpack_from(raw, pos)[0]
    end = _need(length, pos + 4 + qlen, "the quantization section")
    if qlen < 4:
        raise _error(
            "quantization_length below the 4-byte scheme header",
            "quantization_length",
            pos,
            found=qlen,
        )
    scheme_tag, version, qflags = _QHEADER.struct.unpack_from(raw, pos + 4)
    fast = _SCHEME.get(scheme_tag)
    if fast is None:
        raise _error(
            f"{_scheme_class(scheme_tag)} quantization scheme tag",
            "quantization.scheme_tag",
            pos + 4,
            found=f"0x{scheme_tag:02X}",
        )
    body = 4 + fast.size
    if qlen < body:
        raise _error(
            "quantization_length too small for the scheme",
            "quantization_length",
            pos,
            expected=f">= {body}",
            found=qlen,
        )
    values = fast.struct.unpack_from(raw, pos + 8)
    _check_consts(fast, values, pos + 8, "quantization.")
    quant = _quant_from_fields(scheme_tag, version, qflags, values, pos)
    return quant, raw[pos + 4 + body : end], end


def _quant_from_fields(
    scheme_tag: int, version: int, qflags: int, values: tuple[Any, ...], pos: int
) -> Quantization:
    """Build a scheme object from its unpacked payload; ``pos`` is the section offset."""
    allowed = SYMMETRIC if scheme_tag in (0x02, 0x03) else 0
    if qflags & ~allowed:
        raise _error(
            "unknown quantization flag bits", "quantization.flags", pos + 6, found=f"0x{qflags:04X}"
        )
    symmetric = bool(qflags & SYMMETRIC)
    with _Located(pos, scheme_tag):
        if scheme_tag == 0x01:
            return PerTensorAffine(values[0], values[1], version)
        if scheme_tag in (0x02, 0x03):
            zp_position = 2 if scheme_tag == 0x02 else 3
            zp = values[zp_position]
            if symmetric != (zp == NO_BUFFER):
                raise _error(
                    "SYMMETRIC flag must be set exactly when zero_point_buffer_index is 0xFFFFFFFF",
                    "quantization.flags",
                    pos + 6,
                    found=f"flags 0x{qflags:04X}, zero_point_buffer_index {zp}",
                )
            zero_point = None if symmetric else zp
            scale_tag = values[zp_position + 1]
            if scheme_tag == 0x02:
                if scale_tag != 0x03:
                    raise _error(
                        "per-channel scale type must be float32 (0x03)",
                        "quantization.scale_type_tag",
                        pos + 20,
                        found=scale_tag,
                    )
                return PerChannelAffine(values[0], values[1], zero_point, version)
            scale_type = _SCALE_TYPE_TAGS.get(scale_tag)
            if scale_type is None:
                raise _error(
                    "per-block scale type must be 0x01, 0x02 or 0x03",
                    "quantization.scale_type_tag",
                    pos + 24,
                    found=scale_tag,
                )
            return PerBlockAffine(values[0], values[1], values[2], scale_type, zero_point, version)
        scheme = NF4 if scheme_tag == 0x04 else MXFP
        return scheme(values[0], values[1], values[2], version)


def _statistics(raw: bytes, pos: int, length: int) -> tuple[Statistics, int]:
    end = _need(length, pos + 72, "the statistics section")
    values = _STATS.struct.unpack_from(raw, pos)
    _check_consts(_STATS, values, pos, "statistics.")
    fields = [v for i, v in enumerate(values) if i not in (1, 13)]
    try:
        return Statistics(*fields), end
    except InvalidDescriptorError as exc:
        name = (exc.field or "").rsplit(".", 1)[-1]
        rel = _STATS_OFFSETS.get(name, 0)
        raise exc.relocated(section="descriptor", offset=pos + rel) from None


def _composite_member(raw: bytes, pos: int, length: int) -> tuple[int, int]:
    end = _need(length, pos + 16, "the composite-member section")
    role, reserved = _MEMBER.struct.unpack_from(raw, pos)
    if role > 1:
        raise _error("unknown member_role", "composite_member.member_role", pos, found=role)
    if reserved != bytes(15):
        raise _error("reserved bytes must be zero", "composite_member._reserved", pos + 1)
    return role, end


class _Located:
    """Context manager that adds byte offsets to errors raised by model constructors."""

    def __init__(self, quant_base: int, scheme_tag: int) -> None:
        self.quant_base = quant_base
        self.scheme_tag = scheme_tag

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> Literal[False]:
        if not isinstance(exc, InvalidDescriptorError) or exc.offset is not None:
            return False
        field = exc.field or ""
        offset: int | None = _FIELD_OFFSETS.get(field)
        if field.startswith("buffers["):
            index = int(field[8 : field.index("]")])
            offset = 85 + 16 * index + _HANDLE_OFFSETS.get(field.rsplit(".", 1)[-1], 0)
        elif field.startswith("quantization") or field in (
            "scale",
            "zero_point",
            "axis",
            "block_size",
            "scale_buffer_index",
            "zero_point_buffer_index",
            "scheme_version",
            "scale_type",
        ):
            name = field.rsplit(".", 1)[-1]
            name = {"scale_type": "scale_type_tag"}.get(name, name)
            rel = _QUANT_OFFSETS.get(name, _QUANT_OFFSETS.get(f"{self.scheme_tag}.{name}", 0))
            offset = self.quant_base + rel
            if not field.startswith("quantization"):
                field = f"quantization.{field}"
        raise exc.relocated(section="descriptor", field=field or None, offset=offset) from None


# -- encode ----------------------------------------------------------------------------------
def encode_descriptor(descriptor: TensorDescriptor) -> bytes:
    """The exact bytes the reference writes for ``descriptor`` (always valid: see model)."""
    if not isinstance(descriptor, TensorDescriptor):
        raise ArgumentTypeError("expected a TensorDescriptor", found=type(descriptor).__name__)
    cached: bytes | None = descriptor.__dict__.get("_wire_bytes")
    if cached is None:
        cached = _encode(descriptor)
        object.__setattr__(descriptor, "_wire_bytes", cached)  # immutable: memoise
    return cached


def _encode(descriptor: TensorDescriptor) -> bytes:
    layout = descriptor.layout
    major, minor = descriptor.version
    parts = [
        _HEADER.struct.pack(
            w.MAGIC,
            major,
            minor,
            descriptor.descriptor_length,
            descriptor.flags,
            descriptor.element_type.tag,
            0x0A,
            3,
        ),
        _SHAPE3.pack(*descriptor.shape, 0),
        _PAYLOAD.struct.pack(
            layout.page_size,
            layout.num_pages,
            0,
            layout.num_seqs,
            w.KV_ROLES[layout.kv_role],
            w.LAYER_NONE if layout.layer_index is None else layout.layer_index,
            w.INDEX_TYPES[layout.block_table_index_type],
            bytes(6),
        ),
        bytes((len(descriptor.buffers),)),
    ]
    for h in descriptor.buffers:
        parts.append(
            _HANDLE.struct.pack(
                h.byte_size, h.alignment, h.device_tag, h.sync_mode, h.memory_class, b"\0"
            )
        )
    if descriptor.quantization is not None:
        body = _encode_quantization(descriptor.quantization) + descriptor.quantization_padding
        parts += [_U32.pack(len(body)), body]
    if descriptor.statistics is not None:
        s = descriptor.statistics
        parts.append(
            _STATS.struct.pack(
                s.computed_mask,
                bytes(4),
                s.nnz,
                s.sparsity_ratio,
                s.value_min,
                s.value_max,
                s.value_abs_max,
                s.value_mean,
                s.value_stddev,
                s.nm_n,
                s.nm_m,
                s.has_nan,
                s.has_inf,
                bytes(4),
            )
        )
    if descriptor.composite_member is not None:
        parts.append(_MEMBER.struct.pack(descriptor.composite_member, bytes(15)))
    parts.append(descriptor.unknown_trailing)
    return b"".join(parts)


def _encode_quantization(q: Quantization) -> bytes:
    head = _QHEADER.struct.pack(q.scheme_tag, q.scheme_version, q.flags)
    fast = _SCHEME[q.scheme_tag]
    if isinstance(q, PerTensorAffine):
        return head + fast.struct.pack(q.scale, q.zero_point, bytes(4))
    if isinstance(q, (PerChannelAffine, PerBlockAffine)):
        zp = NO_BUFFER if q.zero_point_buffer_index is None else q.zero_point_buffer_index
        if isinstance(q, PerChannelAffine):
            return head + fast.struct.pack(q.axis, q.scale_buffer_index, zp, 0x03, bytes(3))
        return head + fast.struct.pack(
            q.axis, q.block_size, q.scale_buffer_index, zp, q.scale_type.tag, bytes(3)
        )
    return head + fast.struct.pack(q.axis, q.block_size, q.scale_buffer_index)


# -- the general path: the common header of any descriptor -----------------------------------
@dataclass(frozen=True)
class DescriptorHeader:
    """What any valid Hurray descriptor says, whatever its layout (for dump and triage)."""

    version_major: int
    version_minor: int
    descriptor_length: int
    flags: int
    type_tag: int
    element_type: ElementType | None  # None for private extension types
    layout_tag: int
    layout_name: str
    rank: int
    shape: tuple[int, ...]
    byte_offset: int
    layout_fields: dict[str, Any] = field(hash=False)
    buffers: tuple[BufferHandle, ...] = ()
    quantization: Quantization | None = None
    shard: tuple[tuple[int, ...], tuple[int, ...]] | None = None
    statistics: Statistics | None = None
    extension_type: dict[str, int] | None = field(default=None, hash=False)
    composite_member: int | None = None
    unknown_trailing: bytes = b""

    @property
    def has_quantization(self) -> bool:
        return self.quantization is not None

    @property
    def has_shard(self) -> bool:
        return self.shard is not None

    @property
    def buffer_byte_sizes(self) -> tuple[int, ...]:
        return tuple(h.byte_size for h in self.buffers)


def decode_header(data: Any) -> DescriptorHeader:
    """Decode and check the layout-independent parts of a descriptor of any layout."""
    raw = _descriptor_bytes(data)
    length = len(raw)
    _, major, minor, _, flags, type_tag, layout_tag, rank = _HEADER.struct.unpack_from(raw, 0)
    if flags & ~0x1F:
        raise _error("reserved flag bits set", "flags", 10, found=f"0x{flags:08X}")
    if bool(flags & 0x04) != (0xF0 <= type_tag <= 0xFE):
        raise _error(
            "HAS_EXTENSION_TYPE must be set exactly for private type tags",
            "flags",
            10,
            found=f"flags 0x{flags:08X}, type_tag 0x{type_tag:02X}",
        )
    element_type = None
    if not 0xF0 <= type_tag <= 0xFE:
        element_type = _element_type(type_tag, flags)
    name = _layout_name(layout_tag)
    if name is None:
        raise _error(
            _layout_class(layout_tag) + " layout tag", "layout_tag", 15, found=f"0x{layout_tag:02X}"
        )
    if rank > 64:
        raise _error("rank above 64", "rank", 16, found=rank)
    parsed = _construct_parse(raw)
    pos = len(raw) - len(parsed.unknown_trailing)
    trailing = _trailing(raw, pos, minor)
    handles = []
    for index, h in enumerate(parsed.buffers):
        try:
            handles.append(
                BufferHandle(h.byte_size, h.alignment, h.device_tag, h.sync_mode, h.memory_class)
            )
        except InvalidDescriptorError as exc:
            start = parsed.buffer_table_offset + 1 + 16 * index
            raise exc.relocated(
                section="descriptor",
                field=f"buffers[{index}].{exc.field}",
                offset=start + _HANDLE_OFFSETS.get(exc.field or "", 0),
            ) from None
    _check_colocation(handles, parsed.buffer_table_offset)
    quant = None
    if parsed.quantization is not None:
        body = parsed.quantization.body
        payload = body.payload
        fast = _SCHEME[body.header.scheme_tag]
        values = tuple(payload[n] for n in fast.names)
        quant = _quant_from_fields(
            body.header.scheme_tag,
            body.header.scheme_version,
            body.header.flags,
            values,
            parsed.quantization_offset,
        )
        for index in quant.parameter_buffers:
            if index >= len(handles) or index == 0:
                raise _error(
                    "quantization parameter buffer index out of range",
                    "quantization.scale_buffer_index",
                    None,
                    found=index,
                )
    statistics = None
    if parsed.statistics is not None:
        s = parsed.statistics
        statistics = Statistics(**{f.name: s[f.name] for f in dataclasses.fields(Statistics)})
    ext = None
    if parsed.extension_type is not None:
        ext = {k: v for k, v in parsed.extension_type.items() if not k.startswith("_")}
    member = None
    if parsed.composite_member is not None:
        member = parsed.composite_member.member_role
        if member > 1 or layout_tag == 0x0B:
            raise _error(
                "invalid composite member section",
                "composite_member.member_role",
                None,
                found=member,
            )
    shard = None
    if parsed.shard is not None:
        shard = (tuple(parsed.shard.parent_shape), tuple(parsed.shard.shard_offset))
    layout_fields: dict[str, Any] = {}
    if isinstance(parsed.layout, dict):
        layout_fields = {k: v for k, v in parsed.layout.items() if not k.startswith("_")}
    return DescriptorHeader(
        major,
        minor,
        length,
        flags,
        type_tag,
        element_type,
        layout_tag,
        name,
        rank,
        tuple(parsed.shape),
        parsed.byte_offset,
        layout_fields,
        tuple(handles),
        quant,
        shard,
        statistics,
        ext,
        member,
        trailing,
    )


def _check_colocation(handles: list[BufferHandle], table: int) -> None:
    for index, handle in enumerate(handles[1:], 1):
        if (handle.device_tag, handle.memory_class) != (
            handles[0].device_tag,
            handles[0].memory_class,
        ):
            raise _error(
                "all buffers must share one device and memory class",
                f"buffers[{index}].device_tag",
                table + 1 + 16 * index + 12,
                expected=f"device {handles[0].device_tag}, class {handles[0].memory_class}",
                found=f"device {handle.device_tag}, class {handle.memory_class}",
            )


def _construct_parse(raw: bytes) -> Any:
    """Parse with the declarative struct, translating construct's errors into ours."""
    try:
        return w.DESCRIPTOR.parse(raw)
    except c.ConstError as exc:
        raise _error(f"reserved bytes must be zero ({exc.path})", None, None) from None
    except c.MappingError as exc:
        raise _error(f"unknown enumeration value ({exc.path})", None, None) from None
    except (c.SwitchError, c.ExplicitError) as exc:
        raise _error(f"unknown tag ({exc.path})", None, None) from None
    except (c.StreamError, c.ConstructError) as exc:
        raise _error(
            f"descriptor_length too small for the content ({exc.path})", "descriptor_length", 6
        ) from None
    except RecursionError:
        raise _error("tiled payload nested too deeply", "layout", 52) from None
