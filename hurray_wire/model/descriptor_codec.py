"""encode_descriptor / decode_descriptor: TensorDescriptor <-> the reference's exact bytes.

The encoder packs the derived structs (Const fields fill themselves in: ``FastStruct.pack``).
One decoder (``_read``): ``struct.Struct`` formats derived from ``hurray_wire.wire.descriptor``,
every MUST-reject rule of descriptor.md § 11 checked here or in the model constructors;
``decode_header`` reads any layout (for ``dump``), its payload through construct.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from operator import itemgetter
from typing import Any, TypeVar

import construct as c

from hurray_wire import dtypes
from hurray_wire.buffers import byte_view
from hurray_wire.dtypes import ElementType
from hurray_wire.errors import (
    DescriptorTruncatedError,
    InvalidDescriptorError,
    UnsupportedLayoutError,
    cut_inside,
    instance,
)
from hurray_wire.model.descriptor import (
    BufferHandle,
    Statistics,
    TensorDescriptor,
    check_colocation,
)
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

_T = TypeVar("_T")
Places = Callable[[], Mapping[str, int]]  # field -> byte offset, computed only for an error
_HEADER_LEN = w.HEADER.size  # 20
_PREFIX_LEN = w.AT["flags"]  # magic, version and descriptor_length: what frames a descriptor
_STATS_VALUES, _HANDLE_VALUES = (
    itemgetter(*(i for i in range(len(f.names)) if i not in dict(f.consts)))
    for f in (w.STATS, w.HANDLE)
)  # a struct's values that are not reserved bytes
_FIXED_PLACES: Places = partial(dict, w.AT)
_INDEX_TYPE_NAMES = {v: k for k, v in w.INDEX_TYPES.items()}
_SCHEMES: dict[int, Callable[..., Quantization]] = {
    s.scheme_tag: s for s in (PerTensorAffine, PerChannelAffine, PerBlockAffine, NF4, MXFP)
}
_SCALE_TYPE_TAGS = {0x01: dtypes.float16, 0x02: dtypes.bfloat16, 0x03: dtypes.float32}


def _error(
    message: str, field: str | None, offset: int | None = None, **kw: Any
) -> InvalidDescriptorError:
    """The error naming ``field``, at ``offset`` (by default: where the fixed field sits)."""
    offset = w.AT.get(field or "") if offset is None else offset
    return InvalidDescriptorError(message, section="descriptor", field=field, offset=offset, **kw)


def peek_descriptor_length(data: Any) -> int:
    """descriptor_length from the first 10 bytes (what stream framing needs), checked."""
    view = byte_view(data)
    magic = len(w.MAGIC)
    if len(view) >= magic and view[:magic] != w.MAGIC:
        raise _error(
            "bad magic", "magic", 0, expected=w.MAGIC.hex(" "), found=bytes(view[:magic]).hex(" ")
        )
    if len(view) < _PREFIX_LEN:
        raise DescriptorTruncatedError(
            cut_inside("descriptor prefix", len(view)),
            section="descriptor",
            offset=len(view),
            expected=f"at least {_PREFIX_LEN} bytes",
            found=len(view),
        )
    major = view[w.AT["version_major"]]
    if major != 1:
        raise _error("unsupported major version", "version_major", expected=1, found=major)
    length: int = w.U32.unpack_from(view, w.AT["descriptor_length"])[0]
    if length < _HEADER_LEN:
        message = f"descriptor_length below the {_HEADER_LEN}-byte header"
        raise _error(message, "descriptor_length", found=length)
    return length


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


def encode_descriptor(descriptor: TensorDescriptor) -> bytes:
    """The exact bytes the reference writes for ``descriptor`` (always valid: see model)."""
    instance(descriptor, TensorDescriptor, "descriptor")
    layout = descriptor.layout
    major, minor = descriptor.version
    parts = [
        w.FIXED.pack(
            major,
            minor,
            descriptor.descriptor_length,
            descriptor.flags,
            descriptor.element_type.tag,
            0x0A,
            3,
            *descriptor.shape,
            0,
            layout.page_size,
            layout.num_pages,
            0,
            layout.num_seqs,
            w.KV_ROLES[layout.kv_role],
            w.LAYER_NONE if layout.layer_index is None else layout.layer_index,
            w.INDEX_TYPES[layout.block_table_index_type],
            len(descriptor.buffers),
        ),
    ]
    for h in descriptor.buffers:
        parts.append(
            w.HANDLE.pack(h.byte_size, h.alignment, h.device_tag, h.sync_mode, h.memory_class)
        )
    if descriptor.quantization is not None:
        body = _encode_quantization(descriptor.quantization) + descriptor.quantization_padding
        parts += [w.U32.pack(len(body)), body]
    if descriptor.statistics is not None:
        parts.append(w.STATS.pack(*vars(descriptor.statistics).values()))  # in field order
    if descriptor.composite_member is not None:
        parts.append(w.MEMBER.pack(descriptor.composite_member))
    parts.append(descriptor.unknown_trailing)
    return b"".join(parts)


def _encode_quantization(q: Quantization) -> bytes:
    head = w.QHEADER.struct.pack(q.scheme_tag, q.scheme_version, q.flags)
    fast = w.SCHEME[q.scheme_tag]
    if isinstance(q, PerTensorAffine):
        return head + fast.pack(q.scale, q.zero_point)
    if isinstance(q, (PerChannelAffine, PerBlockAffine)):
        zp = NO_BUFFER if q.zero_point_buffer_index is None else q.zero_point_buffer_index
        if isinstance(q, PerChannelAffine):
            return head + fast.pack(q.axis, q.scale_buffer_index, zp, dtypes.float32.tag)
        return head + fast.pack(q.axis, q.block_size, q.scale_buffer_index, zp, q.scale_type.tag)
    return head + fast.struct.pack(q.axis, q.block_size, q.scale_buffer_index)


def decode_descriptor(data: Any) -> TensorDescriptor:
    """Decode the block-paged descriptor at the start of ``data`` (exactly its
    ``descriptor_length`` bytes); another layout raises ``UnsupportedLayoutError``."""
    values, quant_padding, quant_at = _read(_descriptor_bytes(data), general=False)
    (major, minor, *_, element_type, _, _, _, shape, _, fields, handles, quant, _, statistics,
     _, member, trailing) = values  # fmt: skip

    def places() -> dict[str, int]:  # the fixed layout and the sections read
        found = dict(w.AT)
        found.update({model: w.AT[wire] for model, wire in w.WIRE_NAMES.items() if wire in found})
        found.update(w.handle_places(w.BUFFER_TABLE_AT, len(handles)))
        if quant is not None:
            found.update(w.quant_places(quant_at, quant.scheme_tag), quantization=quant_at)
        return found

    layout = _built(BlockPagedLayout, fields, places)
    rest = (quant, (major, minor), statistics, member, quant_padding, trailing)
    return _built(TensorDescriptor, (element_type, shape, layout, handles, *rest), places)


def decode_header(data: Any) -> DescriptorHeader:
    """Decode and check the layout-independent parts of a descriptor of any layout."""
    return DescriptorHeader(*_read(_descriptor_bytes(data), general=True)[0])


def _check_consts(fast: Any, values: tuple[Any, ...], base: int, section: str) -> None:
    for position, expected in fast.consts:
        found = values[position]
        if found != expected:
            name = fast.names[position]
            first = next(i for i, b in enumerate(found) if b)
            raise _error(
                "reserved bytes must be zero",
                f"{section}{name}",
                base + fast.offsets[name] + first,
                found=found.hex(" "),
            )


def _read(raw: bytes, general: bool) -> tuple[tuple[Any, ...], bytes, int]:
    """The one descriptor decoder: rank-3 block-paged through its fixed struct (``general``:
    any other layout's payload through construct), then the shared sections; returns the
    ``DescriptorHeader``'s fields, the quantization's writer padding and offset."""
    length = len(raw)
    _, major, minor, _, flags, type_tag, layout_tag, rank = w.HEADER.struct.unpack_from(raw, 0)
    if flags & ~w.FLAGS_KNOWN:
        raise _error("reserved flag bits set", "flags", found=f"0x{flags:08X}")
    if bool(flags & w.FLAG_HAS_EXTENSION_TYPE) != (type_tag in w.PRIVATE_TYPE_TAGS):
        raise _error(
            "HAS_EXTENSION_TYPE must be set exactly for private type tags 0xF0-0xFE",
            "flags",
            found=f"flags 0x{flags:08X}, type_tag 0x{type_tag:02X}",
        )
    element_type = None  # a private extension type's: what the extension section says
    if type_tag not in w.PRIVATE_TYPE_TAGS:
        element_type = _built(dtypes.element_type_from_tag, (type_tag,), _FIXED_PLACES)
    elif not general:
        message = "private extension element types are not supported for block-paged tensors"
        raise _error(message, "type_tag", found=f"0x{type_tag:02X}")
    private_layout = 0xF0 <= layout_tag <= 0xFE
    name = f"private_0x{layout_tag:02X}" if private_layout else w.LAYOUT_NAMES.get(layout_tag)
    if name is None:
        kind = "invalid" if layout_tag in (0x00, 0xFF) else "reserved or unknown"
        raise _error(f"{kind} layout tag", "layout_tag", found=f"0x{layout_tag:02X}")
    fields: Any
    if not general:
        if layout_tag != 0x0A:
            _read(raw, general=True)  # an invalid descriptor of another layout is an input error
            raise UnsupportedLayoutError(
                f"descriptor has layout {name} (0x{layout_tag:02X}); hurray-wire decodes "
                "block_paged (0x0A) tensors, use decode_header() for the common header",
                layout_tag=layout_tag,
                layout_name=name,
                section="descriptor",
                field="layout_tag",
                offset=w.AT["layout_tag"],
            )
        if rank != 3:
            raise _error("block-paged tensors have rank 3", "rank", expected=3, found=rank)
        shape, byte_offset, fields, pos = _block_paged(raw, length)
    else:
        if rank > 64:
            raise _error("rank above 64", "rank", found=rank)
        prefix = _construct_parse(raw)
        shape, byte_offset = tuple(prefix.shape), prefix.byte_offset
        pos = prefix.buffer_table_offset
        payload = prefix.layout if isinstance(prefix.layout, dict) else {}
        fields = {k: v for k, v in payload.items() if not k.startswith("_")}
    table = pos + w.COUNT_SIZE
    count = raw[_need(length, table, "buffer_count") - w.COUNT_SIZE]
    pos = _need(length, w.handle_at(count, table), f"{count} buffer handles")
    places = partial(w.handle_places, table, count)
    handles = tuple(_handle(raw, w.handle_at(i, table), i, places) for i in range(count))
    if general:  # the model's one-device rule, located in the table
        _built(check_colocation, (handles,), places)
    quant: Quantization | None = None
    quant_padding = b""
    quant_at = pos
    if flags & w.FLAG_HAS_QUANTIZATION:
        quant, quant_padding, pos = _quantization(raw, pos, length)
        if general:
            for index in quant.parameter_buffers:
                if index >= count or index == 0:
                    raise _error(
                        "quantization parameter buffer index out of range",
                        "quantization.scale_buffer_index",
                        found=index,
                    )
    shard = None
    if flags & w.FLAG_HAS_SHARD:
        if not general:
            message = "a block-paged tensor must not carry a shard section"
            raise _error(message, "flags", found=f"0x{flags:08X}")
        axes = w.shard_struct(rank)
        end = _need(length, pos + axes.size, "the shard section")
        values = axes.unpack_from(raw, pos)
        shard, pos = (values[:rank], values[rank:]), end
    statistics = None
    if flags & w.FLAG_HAS_STATISTICS:
        end = _need(length, pos + w.STATS.size, "the statistics section")
        values = w.STATS.struct.unpack_from(raw, pos)
        _check_consts(w.STATS, values, pos, "statistics.")
        statistics = _built(
            Statistics,
            _STATS_VALUES(values),
            lambda: {f"statistics.{name}": pos + at for name, at in w.STATS.offsets.items()},
        )
        pos = end
    extension = None
    if flags & w.FLAG_HAS_EXTENSION_TYPE:
        end = _need(length, pos + w.EXTENSION.size, "the extension type section")
        values = w.EXTENSION.struct.unpack_from(raw, pos)
        _check_consts(w.EXTENSION, values, pos, "extension_type.")
        consts = dict(w.EXTENSION.consts)
        extension = {n: values[i] for i, n in enumerate(w.EXTENSION.names) if i not in consts}
        pos = end
    member = None
    if flags & w.FLAG_HAS_COMPOSITE_MEMBER:
        end = _need(length, pos + w.MEMBER.size, "the composite-member section")
        values = w.MEMBER.struct.unpack_from(raw, pos)
        member = values[0]
        if member > 1:
            raise _error("unknown member_role", "composite_member.member_role", pos, found=member)
        _check_consts(w.MEMBER, values, pos, "composite_member.")
        pos = end
        if layout_tag == 0x0B:
            message = "invalid composite member section"
            raise _error(message, "composite_member.member_role", found=member)
    if pos != length and minor == 0:
        raise _error(
            "descriptor_length disagrees with the content at version 1.0",
            "descriptor_length",
            expected=pos,
            found=length,
        )
    header = (
        major, minor, length, flags, type_tag, element_type, layout_tag, name, rank, shape,
        byte_offset, fields, handles, quant, shard, statistics, extension, member, raw[pos:],
    )  # fmt: skip
    return header, quant_padding, quant_at


def _block_paged(raw: bytes, length: int) -> tuple[tuple[int, ...], int, tuple[Any, ...], int]:
    """The fixed part of a rank-3 block-paged descriptor: shape, byte_offset, the layout's
    arguments (to ``BlockPagedLayout``) and where the buffer table starts."""
    _need(length, w.BUFFER_TABLE_AT, "the block-paged payload and buffer_count")
    fixed = w.FIXED.struct.unpack_from(raw, 0)
    (*_, shape0, shape1, shape2, byte_offset, page_size, num_pages, paged_axis, num_seqs,
     role_byte, layer, index_byte, _, _) = fixed  # fmt: skip
    if byte_offset != 0:
        raise _error("byte_offset must be 0 for block-paged", "byte_offset", found=byte_offset)
    _check_consts(w.FIXED, fixed, 0, "")
    role = w.KV_ROLE_BY_CODE.get(role_byte)
    if role is None:
        raise _error("unknown kv_role", "kv_role", expected="0, 1 or 2", found=role_byte)
    index_type = _INDEX_TYPE_NAMES.get(index_byte)
    if index_type is None:
        message = "unknown block_table_index_type"
        raise _error(message, "block_table_index_type", expected="0 or 1", found=index_byte)
    layer_index = None if layer == w.LAYER_NONE else layer
    fields = (page_size, num_pages, paged_axis, num_seqs, role, layer_index, index_type)
    return (shape0, shape1, shape2), byte_offset, fields, w.BUFFER_TABLE_AT - w.COUNT_SIZE


def _built(
    make: Callable[..., _T],
    args: tuple[Any, ...],
    places: Places,
    prefix: str = "",
    at: int | None = None,
) -> _T:
    """``make(*args)``, or the model error it raised, named ``prefix`` + its field and
    located at that field's byte in ``places()`` (else ``at``): the one place where an error
    of the model, which knows the field, learns where the field sits in the bytes."""
    try:
        return make(*args)
    except InvalidDescriptorError as exc:
        if exc.offset is not None:
            raise
        field = exc.field or prefix.rstrip(".") or None
        if field is not None and not field.startswith(prefix.rstrip(".")):
            field = prefix + field
        offset = places().get(field or "", at)
        raise exc.relocated(section="descriptor", field=field, offset=offset) from None


def _need(length: int, end: int, what: str) -> int:
    """``end`` if the descriptor is long enough to hold it, else the length error."""
    if end > length:
        message = f"descriptor_length too small to hold {what}"
        raise _error(message, "descriptor_length", expected=f">= {end}", found=length)
    return end


def _handle(raw: bytes, offset: int, index: int, places: Places) -> BufferHandle:
    """Buffer handle ``index`` at ``offset``."""
    values = w.HANDLE.struct.unpack_from(raw, offset)
    prefix = f"buffers[{index}]."
    _check_consts(w.HANDLE, values, offset, prefix)
    return _built(BufferHandle, _HANDLE_VALUES(values), places, prefix)


def _quantization(raw: bytes, pos: int, length: int) -> tuple[Quantization, bytes, int]:
    """Parse the quantization section at ``pos``: (scheme, writer padding, end)."""
    _need(length, pos + w.QUANT_HEADER_AT, "quantization_length")
    qlen = w.U32.unpack_from(raw, pos)[0]
    end = _need(length, pos + w.QUANT_HEADER_AT + qlen, "the quantization section")
    if qlen < w.QHEADER.size:
        message = f"quantization_length below the {w.QHEADER.size}-byte scheme header"
        raise _error(message, "quantization_length", pos, found=qlen)
    scheme_tag, version, qflags = w.QHEADER.struct.unpack_from(raw, pos + w.QUANT_HEADER_AT)
    fast = w.SCHEME.get(scheme_tag)
    if fast is None:
        kind = "unassigned" if scheme_tag < 0x60 else "reserved" if scheme_tag < 0xF0 else "private"
        raise _error(
            f"{'invalid' if scheme_tag in (0x00, 0xFF) else kind} quantization scheme tag",
            "quantization.scheme_tag",
            pos + w.QUANT_HEADER_AT,
            found=f"0x{scheme_tag:02X}",
        )
    body = w.QHEADER.size + fast.size
    if qlen < body:
        message = "quantization_length too small for the scheme"
        raise _error(message, "quantization_length", pos, expected=f">= {body}", found=qlen)
    values = fast.struct.unpack_from(raw, pos + w.QUANT_PAYLOAD_AT)
    _check_consts(fast, values, pos + w.QUANT_PAYLOAD_AT, "quantization.")
    fields = {n: v for n, v in zip(fast.names, values, strict=True) if not n.startswith("_")}
    places = partial(w.quant_places, pos, scheme_tag)
    allowed = SYMMETRIC if scheme_tag in (0x02, 0x03) else 0  # the rules the wire adds
    if qflags & ~allowed:
        message = "unknown quantization flag bits"
        raise _error(message, "quantization.flags", places()["flags"], found=f"0x{qflags:04X}")
    zp = fields.get("zero_point_buffer_index")
    if zp is not None:
        if bool(qflags & SYMMETRIC) != (zp == NO_BUFFER):
            raise _error(
                "SYMMETRIC flag must be set exactly when zero_point_buffer_index is 0xFFFFFFFF",
                "quantization.flags",
                places()["flags"],
                found=f"flags 0x{qflags:04X}, zero_point_buffer_index {zp}",
            )
        fields["zero_point_buffer_index"] = None if zp == NO_BUFFER else zp
    scale_tag = fields.pop("scale_type_tag", None)
    if scale_tag is not None:
        scale_type = _SCALE_TYPE_TAGS.get(scale_tag)
        per_channel = scheme_tag == 0x02
        if scale_type is None or (per_channel and scale_tag != 0x03):
            raise _error(
                "per-channel scale type must be float32 (0x03)"
                if per_channel
                else "per-block scale type must be 0x01, 0x02 or 0x03",
                "quantization.scale_type_tag",
                places()["scale_type_tag"],
                found=scale_tag,
            )
        if not per_channel:
            fields["scale_type"] = scale_type
    scheme = partial(_SCHEMES[scheme_tag], **fields, scheme_version=version)
    quant = _built(scheme, (), places, "quantization.", pos)
    return quant, raw[pos + w.QUANT_HEADER_AT + body : end], end


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


def _construct_parse(raw: bytes) -> Any:
    """Parse with the declarative struct, translating construct's errors into ours."""
    try:
        return w.LAYOUT_PREFIX.parse(raw)
    except c.ConstError as exc:
        raise _error(f"reserved bytes must be zero ({exc.path})", None, None) from None
    except c.MappingError as exc:
        raise _error(f"unknown enumeration value ({exc.path})", None, None) from None
    except (c.SwitchError, c.ExplicitError) as exc:
        raise _error(f"unknown tag ({exc.path})", None, None) from None
    except (c.StreamError, c.ConstructError) as exc:
        raise _error(
            f"descriptor_length too small for the content ({exc.path})",
            "descriptor_length",
        ) from None
    except RecursionError:
        raise _error("tiled payload nested too deeply", "layout") from None
