"""Property tests of the descriptor codec over random valid descriptors and their mutations.

The strategy (``hurray_wire.testing.strategies.block_paged_descriptors``) draws valid descriptors
only; the properties are:

* encode -> decode gives an equal object, and encoding that again gives identical bytes;
* the general path (``decode_header``) agrees with the block-paged fast path;
* any mutation of a valid encoding (bit flip, byte overwrite, insert, delete, truncate,
  a field overwritten with an edge value, with or without a repaired descriptor_length)
  either decodes to a descriptor that re-encodes to exactly the mutated bytes, or raises a
  ``HurrayWireError`` -- never ``struct.error``, ``IndexError``, ``KeyError`` or a foreign
  ``ValueError``.
"""

from __future__ import annotations

import contextlib
import struct
from typing import Any

from hypothesis import HealthCheck, given, settings, strategies as st

import hurray_wire as hw
from hurray_wire.testing.strategies import block_paged_descriptors

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

EDGE_VALUES = {
    1: (0x00, 0x01, 0x02, 0x03, 0x7F, 0x80, 0xF0, 0xFE, 0xFF),
    2: (0x0000, 0x0001, 0x0002, 0x8000, 0xFFFF),
    4: (0, 1, 2, 3, 4, 19, 20, 64, 0x7FFFFFFF, 0xFFFFFFFE, 0xFFFFFFFF),
    8: (0, 1, 8, 2**32, 2**63, 2**64 - 1),
}
FORMATS = {1: "<B", 2: "<H", 4: "<I", 8: "<Q"}


def _apply(data: bytes, op: tuple[Any, ...]) -> bytes:
    """One mutation; positions are taken modulo the current length."""
    buf = bytearray(data)
    kind = op[0]
    if kind == "truncate":
        return bytes(buf[: op[1] % (len(buf) + 1)])
    if kind == "insert":
        position = op[1] % (len(buf) + 1)
        buf[position:position] = op[2]
        return bytes(buf)
    if not buf:
        return b""
    position = op[1] % len(buf)
    if kind == "flip":
        buf[position] ^= 1 << op[2]
    elif kind == "overwrite":
        buf[position] = op[2]
    elif kind == "delete":
        del buf[position : position + op[2]]
    elif kind == "field":
        width, value = op[2], op[3]
        if position + width <= len(buf):
            struct.pack_into(FORMATS[width], buf, position, value)
    elif kind == "fix_length" and len(buf) >= 10:
        struct.pack_into("<I", buf, 6, len(buf))
    return bytes(buf)


_POSITION = st.integers(min_value=0, max_value=400)
_FIELD = st.sampled_from(sorted(EDGE_VALUES)).flatmap(
    lambda width: st.tuples(
        st.just("field"), _POSITION, st.just(width), st.sampled_from(EDGE_VALUES[width])
    )
)
MUTATIONS = st.lists(
    st.one_of(
        st.tuples(st.just("flip"), _POSITION, st.integers(min_value=0, max_value=7)),
        st.tuples(st.just("overwrite"), _POSITION, st.integers(min_value=0, max_value=255)),
        st.tuples(st.just("insert"), _POSITION, st.binary(min_size=1, max_size=20)),
        st.tuples(st.just("delete"), _POSITION, st.integers(min_value=1, max_value=20)),
        st.tuples(st.just("truncate"), _POSITION),
        _FIELD,
        st.tuples(st.just("fix_length"), st.just(0)),
    ),
    min_size=1,
    max_size=4,
)


def _header_agrees(header: hw.DescriptorHeader, desc: hw.TensorDescriptor) -> None:
    assert (header.version_major, header.version_minor) == desc.version
    assert header.descriptor_length == desc.descriptor_length
    assert header.flags == desc.flags
    assert header.type_tag == desc.type_tag
    assert header.element_type == desc.element_type
    assert header.layout_tag == 0x0A
    assert header.layout_name == "block_paged"
    assert header.rank == 3
    assert header.shape == desc.shape
    assert header.byte_offset == 0
    assert header.buffers == desc.buffers
    assert header.quantization == desc.quantization
    assert header.shard is None
    assert header.statistics == desc.statistics
    assert header.extension_type is None
    assert header.composite_member == desc.composite_member
    assert header.unknown_trailing == desc.unknown_trailing
    layout = desc.layout
    fields = header.layout_fields
    assert fields["page_size"] == layout.page_size
    assert fields["num_pages"] == layout.num_pages
    assert fields["paged_axis"] == layout.paged_axis
    assert fields["num_seqs"] == layout.num_seqs
    assert fields["kv_role"] == layout.kv_role
    assert fields["layer_index"] == layout.layer_index
    assert fields["block_table_index_type"] == layout.block_table_index_type


@SETTINGS
@given(block_paged_descriptors())
def test_encode_decode_round_trip(desc: hw.TensorDescriptor) -> None:
    data = hw.encode_descriptor(desc)
    assert len(data) == desc.descriptor_length
    assert struct.unpack_from("<I", data, 6)[0] == len(data)
    decoded = hw.decode_descriptor(data)
    assert decoded == desc
    assert decoded.descriptor_length == desc.descriptor_length
    assert hw.encode_descriptor(decoded) == data
    # the decoder reads exactly descriptor_length bytes, wherever the descriptor sits
    framed = memoryview(b"\x5a" * 3 + data + b"\xa5" * 9)[3:]
    assert hw.encode_descriptor(hw.decode_descriptor(framed)) == data


@SETTINGS
@given(block_paged_descriptors())
def test_decode_header_agrees_with_decode_descriptor(desc: hw.TensorDescriptor) -> None:
    data = hw.encode_descriptor(desc)
    _header_agrees(hw.decode_header(data), hw.decode_descriptor(data))


@SETTINGS
@given(block_paged_descriptors(), MUTATIONS)
def test_mutations_decode_exactly_or_raise_our_errors(
    desc: hw.TensorDescriptor, ops: list[tuple[Any, ...]]
) -> None:
    mutated = hw.encode_descriptor(desc)
    for op in ops:
        mutated = _apply(mutated, op)
    try:
        decoded = hw.decode_descriptor(mutated)
    except hw.HurrayWireError:
        decoded = None
    try:
        header = hw.decode_header(mutated)
    except hw.HurrayWireError:
        header = None
    if decoded is not None:
        assert hw.encode_descriptor(decoded) == mutated[: decoded.descriptor_length]
        assert header is not None, "a valid block-paged descriptor passes the general path"
        _header_agrees(header, decoded)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_arbitrary_bytes_raise_only_our_errors(data: bytes) -> None:
    for decode in (hw.decode_descriptor, hw.decode_header):
        with contextlib.suppress(hw.HurrayWireError):
            decode(data)


@settings(max_examples=300, deadline=None)
@given(st.binary(min_size=0, max_size=250))
def test_arbitrary_bytes_after_a_valid_prefix(tail: bytes) -> None:
    """A valid magic, version and length in front of random content."""
    data = bytearray(b"HRRY\x01\x00" + struct.pack("<I", 10 + len(tail)) + tail)
    for decode in (hw.decode_descriptor, hw.decode_header):
        try:
            desc = decode(bytes(data))
        except hw.HurrayWireError:
            continue
        if isinstance(desc, hw.TensorDescriptor):
            assert hw.encode_descriptor(desc) == bytes(data)
