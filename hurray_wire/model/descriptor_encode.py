"""encode_descriptor: a TensorDescriptor as the exact bytes the reference writes (Const
fields fill themselves in: ``FastStruct.pack``)."""

from __future__ import annotations

from hurray_wire import dtypes
from hurray_wire.errors import instance
from hurray_wire.model.descriptor import TensorDescriptor
from hurray_wire.model.quantization import (
    NO_BUFFER,
    PerBlockAffine,
    PerChannelAffine,
    PerTensorAffine,
    Quantization,
)
from hurray_wire.wire import descriptor as w, descriptor_layout as dl


def encode_descriptor(descriptor: TensorDescriptor) -> bytes:
    """The exact bytes the reference writes for ``descriptor`` (always valid: see model)."""
    instance(descriptor, TensorDescriptor, "descriptor")
    layout = descriptor.layout
    major, minor = descriptor.version
    parts = [
        dl.FIXED.pack(
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
            dl.HANDLE.pack(h.byte_size, h.alignment, h.device_tag, h.sync_mode, h.memory_class)
        )
    if descriptor.quantization is not None:
        body = _encode_quantization(descriptor.quantization) + descriptor.quantization_padding
        parts += [dl.U32.pack(len(body)), body]
    if descriptor.statistics is not None:
        parts.append(dl.STATS.pack(*vars(descriptor.statistics).values()))  # in field order
    if descriptor.composite_member is not None:
        parts.append(dl.MEMBER.pack(descriptor.composite_member))
    parts.append(descriptor.unknown_trailing)
    return b"".join(parts)


def _encode_quantization(q: Quantization) -> bytes:
    head = dl.QHEADER.struct.pack(q.scheme_tag, q.scheme_version, q.flags)
    fast = dl.SCHEME[q.scheme_tag]
    if isinstance(q, PerTensorAffine):
        return head + fast.pack(q.scale, q.zero_point)
    if isinstance(q, (PerChannelAffine, PerBlockAffine)):
        zp = NO_BUFFER if q.zero_point_buffer_index is None else q.zero_point_buffer_index
        if isinstance(q, PerChannelAffine):
            return head + fast.pack(q.axis, q.scale_buffer_index, zp, dtypes.float32.tag)
        return head + fast.pack(q.axis, q.block_size, q.scale_buffer_index, zp, q.scale_type.tag)
    return head + fast.struct.pack(q.axis, q.block_size, q.scale_buffer_index)
