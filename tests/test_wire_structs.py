"""The construct structs are the source of truth; the derived struct formats must agree."""

from __future__ import annotations

from pathlib import Path

import construct as c
import pytest

import hurray_wire as hw
from hurray_wire.wire import blob as wb, descriptor as wd
from hurray_wire.wire.fast import derive
from tests.conftest import BLOCK_PAGED, REFERENCE, load_manifest

FIXED = {
    "FIXED_HEADER": (wd.FIXED_HEADER, 20),
    "BLOCK_PAGED_PAYLOAD": (wd.BLOCK_PAGED_PAYLOAD, 32),
    "BUFFER_HANDLE": (wd.BUFFER_HANDLE, 16),
    "QUANT_HEADER": (wd.QUANT_HEADER, 4),
    "PER_TENSOR_AFFINE": (wd.PER_TENSOR_AFFINE, 12),
    "PER_CHANNEL_AFFINE": (wd.PER_CHANNEL_AFFINE, 16),
    "PER_BLOCK_AFFINE": (wd.PER_BLOCK_AFFINE, 20),
    "NF4": (wd.NF4, 12),
    "MXFP": (wd.MXFP, 12),
    "STATISTICS": (wd.STATISTICS, 72),
    "EXTENSION_TYPE": (wd.EXTENSION_TYPE, 20),
    "COMPOSITE_MEMBER": (wd.COMPOSITE_MEMBER, 16),
    "BLOB_HEADER": (wb.BLOB_HEADER, 32),
    "SECTION_ENTRY": (wb.SECTION_ENTRY, 48),
}


@pytest.mark.parametrize("name", sorted(FIXED))
def test_derived_format_has_the_construct_size(name: str) -> None:
    struct_def, size = FIXED[name]
    assert struct_def.sizeof() == size
    assert derive(struct_def).size == size


def _descriptor_files() -> list[str]:
    bp = load_manifest(BLOCK_PAGED)
    ref = load_manifest(REFERENCE)
    files = [str(BLOCK_PAGED / e["file"]) for e in bp["descriptors"] + bp["tolerant_descriptors"]]
    return files + [str(REFERENCE / e["file"]) for e in ref["descriptors"]]


@pytest.mark.parametrize("path", _descriptor_files(), ids=lambda p: p.rsplit("/", 1)[-1])
def test_construct_round_trips_every_vector_plain_and_compiled(path: str) -> None:
    data = Path(path).read_bytes()
    parsed = wd.DESCRIPTOR.parse(data)
    assert wd.DESCRIPTOR.build(parsed) == data
    header = wd.FIXED_HEADER.parse(data)
    compiled = wd.FIXED_HEADER.compile()
    assert compiled.parse(data) == header
    assert compiled.build(header) == data[:20] == wd.FIXED_HEADER.build(header)


@pytest.mark.parametrize("path", _descriptor_files(), ids=lambda p: p.rsplit("/", 1)[-1])
def test_derived_structs_parse_like_construct(path: str) -> None:
    data = Path(path).read_bytes()
    parsed = wd.DESCRIPTOR.parse(data)
    fast_header = derive(wd.FIXED_HEADER).struct.unpack_from(data, 0)
    assert fast_header[1:] == tuple(parsed.header[k] for k in derive(wd.FIXED_HEADER).names[1:])
    offset = 20 + 8 * parsed.header.rank + 8
    if parsed.header.layout_tag == 0x0A:
        fast = derive(wd.BLOCK_PAGED_PAYLOAD)
        values = fast.struct.unpack_from(data, offset)
        layout = parsed.layout
        assert values[:4] == (
            layout.page_size,
            layout.num_pages,
            layout.paged_axis,
            layout.num_seqs,
        )
        assert wd.KV_ROLES[layout.kv_role] == values[4]
        assert (None if values[5] == wd.LAYER_NONE else values[5]) == layout.layer_index
        assert wd.INDEX_TYPES[layout.block_table_index_type] == values[6]
        offset += 32
    fast_handle = derive(wd.BUFFER_HANDLE)
    table = parsed.buffer_table_offset
    assert data[table] == len(parsed.buffers)
    for number, handle in enumerate(parsed.buffers):
        values = fast_handle.struct.unpack_from(data, table + 1 + 16 * number)
        assert values[:5] == (handle.byte_size, handle.alignment, handle.device_tag,
                              handle.sync_mode, handle.memory_class)  # fmt: skip


def test_reserved_bytes_are_checked_by_construct_itself() -> None:
    payload = bytearray(wd.BLOCK_PAGED_PAYLOAD.build(dict(
        page_size=4, num_pages=5, paged_axis=0, num_seqs=2, kv_role="key", layer_index=None,
        block_table_index_type="uint32",
    )))  # fmt: skip
    assert payload[21:25] == b"\xff\xff\xff\xff"  # None is the sentinel
    assert wd.BLOCK_PAGED_PAYLOAD.parse(bytes(payload)).layer_index is None
    payload[31] = 1
    with pytest.raises(c.ConstError):
        wd.BLOCK_PAGED_PAYLOAD.parse(bytes(payload))
    payload[31] = 0
    payload[20] = 3  # unknown kv_role
    with pytest.raises(c.MappingError):
        wd.BLOCK_PAGED_PAYLOAD.parse(bytes(payload))


def test_explicit_sentinel_cannot_be_built() -> None:
    with pytest.raises(c.MappingError):
        wd.BLOCK_PAGED_PAYLOAD.build(dict(
            page_size=4, num_pages=5, paged_axis=0, num_seqs=2, kv_role="key",
            layer_index=0xFFFFFFFF, block_table_index_type="uint32",
        ))  # fmt: skip


def test_unknown_layout_tag_is_an_error_not_silence() -> None:
    data = bytearray((BLOCK_PAGED / "descriptors/bp_spec_example_f16_key_l3.bin").read_bytes())
    data[15] = 0x0C
    with pytest.raises(c.ExplicitError):
        wd.DESCRIPTOR.parse(bytes(data))
    with pytest.raises(hw.errors.InvalidDescriptorError):
        hw.decode_header(bytes(data))
