"""Every MUST-reject rule of descriptor.md § 11, one flipped field at a time.

Each test takes a valid conformance vector, changes exactly the bytes that break one rule
(at the absolute offsets of descriptor.md § 1.1) and checks that ``decode_descriptor``
refuses it with the right exception type, naming the field (``exc.field``) and its byte
offset (``exc.offset``). Wire-level rules (those that do not depend on the layout) are also
checked through the general path, ``decode_header``. The last groups check that the
encoder writes back every valid vector byte for byte, that no truncation escapes as
anything but a descriptor error, and that the model constructors refuse what the decoder
refuses (so the encoder cannot write it).

Known bugs in files this test does not own are pinned by ``xfail(strict=True)`` tests
whose reason starts with ``BUG:``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import struct
from collections.abc import Callable
from typing import Any

import pytest

import hurray_wire as hw
from hurray_wire import errors as hwe
from tests.conftest import BLOCK_PAGED


def _vector(name: str) -> bytes:
    return (BLOCK_PAGED / "descriptors" / f"{name}.bin").read_bytes()


SPEC = _vector("bp_spec_example_f16_key_l3")  # f16 [9, 2, 8], P 4, N 5, S 2, uint32
CUDA = _vector("bp_cuda_unified_event")  # CUDA / unified / event handles, alignment 4096
U64 = _vector("bp_u64_index_f16")  # uint64 indices: block_table 24, seq_ptr 24
HUGE = _vector("bp_large_num_pages_u64")  # num_pages 2**32 + 1, uint64
EMPTY = _vector("bp_empty_batch_pool_alloc")  # num_seqs 0, 0-byte block_table, alignment 1
MINOR1 = _vector("bp_minor1_trailing_bytes")  # version 1.1 + 8 unknown trailing bytes
PBA_SYM = _vector("bp_quant_pba_int8_sym_f32scales")  # quantization section at 149
PBA_ASYM = _vector("bp_quant_pba_uint8_asym_f16scales")  # 5 buffers, section at 165
PER_CHANNEL = _vector("bp_quant_per_channel_int8_axis1")  # 4 buffers, section at 149
PER_TENSOR = _vector("bp_quant_per_tensor_int8")  # 3 buffers, section at 133
STATS = _vector("bp_quant_pba_int8_with_stats")  # statistics section at 177
MEMBER = hw.encode_descriptor(dataclasses.replace(hw.decode_descriptor(SPEC), composite_member=0))

MANIFEST = json.loads((BLOCK_PAGED / "manifest.json").read_text(encoding="utf-8"))
VALID = [
    (case["name"], (BLOCK_PAGED / case["file"]).read_bytes()) for case in MANIFEST["descriptors"]
]
TOLERANT = [
    (case["name"], (BLOCK_PAGED / case["file"]).read_bytes())
    for case in MANIFEST["tolerant_descriptors"]
]
STATS_AT = 177
MEMBER_AT = 133


def handle_at(index: int) -> int:
    """Absolute offset of buffer handle ``index`` (descriptor.md § 1.1)."""
    return 85 + 16 * index


def quant_at(data: bytes) -> int:
    """Absolute offset of quantization_length: right after the buffer table."""
    return handle_at(data[84])


def put(data: bytes, offset: int, fmt: str, value: Any) -> bytes:
    """``data`` with one little-endian field overwritten."""
    buf = bytearray(data)
    struct.pack_into("<" + fmt, buf, offset, value)
    return bytes(buf)


def relength(data: bytes) -> bytes:
    """``data`` with descriptor_length set to its actual size."""
    return put(data, 6, "I", len(data))


def splice(data: bytes, offset: int, remove: int = 0, insert: bytes = b"") -> bytes:
    """Remove and insert bytes at ``offset`` and repair descriptor_length."""
    return relength(data[:offset] + insert + data[offset + remove :])


def with_buffer_count(data: bytes, count: int, extra: bytes = bytes(16)) -> bytes:
    """Drop handles from, or append copies of ``extra`` to, the end of the buffer table."""
    current = data[84]
    end = handle_at(current)
    if count < current:
        data = splice(data, handle_at(count), remove=end - handle_at(count))
    else:
        data = splice(data, end, insert=extra * (count - current))
    return put(data, 84, "B", count)


def all_handles(data: bytes, **fields: int) -> bytes:
    """Set ``device_tag`` / ``sync_mode`` / ``memory_class`` on every handle."""
    at = {"device_tag": 12, "sync_mode": 13, "memory_class": 14}
    for index in range(data[84]):
        for name, value in fields.items():
            data = put(data, handle_at(index) + at[name], "B", value)
    return data


def rejects(
    data: bytes,
    field: str | None,
    offset: int | None,
    error: type[hw.errors.InvalidDescriptorError] = hw.errors.InvalidDescriptorError,
    *,
    header_too: bool = False,
) -> hw.errors.InvalidDescriptorError:
    """decode_descriptor refuses ``data`` with ``error`` naming ``field`` at ``offset``."""
    with pytest.raises(error) as info:
        hw.decode_descriptor(data)
    exc = info.value
    assert exc.field == field, str(exc)
    assert exc.offset == offset, str(exc)
    assert exc.section == "descriptor"
    assert str(exc), "the message says what is wrong"
    if header_too:
        with pytest.raises(hw.errors.InvalidDescriptorError):
            hw.decode_header(data)
    return exc


def accepts(data: bytes) -> hw.TensorDescriptor:
    """decode_descriptor accepts ``data`` and writes it back byte for byte."""
    desc = hw.decode_descriptor(data)
    assert hw.encode_descriptor(desc) == data
    hw.decode_header(data)
    return desc


# == 1. Fixed header (descriptor.md § 2, § 3, § 4, § 6, § 10) ================================


@pytest.mark.parametrize("magic", [b"HRRX", b"hrry", b"\0\0\0\0", b"YRRH", b"\xffRRY"])
def test_bad_magic(magic: bytes) -> None:
    rejects(put(SPEC, 0, "4s", magic), "magic", 0, header_too=True)


def test_bad_magic_is_reported_before_a_truncation() -> None:
    rejects(b"HRRX\x01\x00", "magic", 0)


@pytest.mark.parametrize("major", [0, 2, 0x7F, 0xFF])
def test_version_major_other_than_1(major: int) -> None:
    rejects(put(SPEC, 4, "B", major), "version_major", 4, header_too=True)


@pytest.mark.parametrize("minor", [1, 2, 0xFF])
def test_newer_version_minor_is_accepted(minor: int) -> None:
    assert accepts(put(SPEC, 5, "B", minor)).version == (1, minor)


@pytest.mark.parametrize("length", [0, 1, 10, 19])
def test_descriptor_length_below_20(length: int) -> None:
    rejects(put(SPEC, 6, "I", length), "descriptor_length", 6, header_too=True)


@pytest.mark.parametrize("length", [20, 44, 52, 84, 85, 100, 132])
def test_descriptor_length_too_small_for_the_content(length: int) -> None:
    rejects(put(SPEC, 6, "I", length), "descriptor_length", 6, header_too=True)


@pytest.mark.parametrize(
    ("data", "length"),
    [(PBA_SYM, 176), (PBA_SYM, 152), (PBA_SYM, 148), (STATS, 248), (STATS, 200), (MEMBER, 148)],
)
def test_descriptor_length_too_small_for_an_optional_section(data: bytes, length: int) -> None:
    rejects(put(data, 6, "I", length), "descriptor_length", 6, header_too=True)


@pytest.mark.parametrize("length", [134, 200, 0xFFFFFFFF])
def test_descriptor_length_larger_than_the_input(length: int) -> None:
    """The input is truncated: it ends before descriptor_length (offset = where it ends)."""
    exc = rejects(
        put(SPEC, 6, "I", length), "descriptor_length", len(SPEC), hwe.DescriptorTruncatedError
    )
    assert exc.expected == length
    assert exc.found == len(SPEC)
    with pytest.raises(hwe.DescriptorTruncatedError):
        hw.decode_header(put(SPEC, 6, "I", length))


@pytest.mark.parametrize("extra", [1, 7, 64])
@pytest.mark.parametrize(
    "data", [SPEC, PBA_ASYM, STATS, MEMBER], ids=["spec", "pba", "stats", "member"]
)
def test_descriptor_length_larger_than_the_content_at_minor_0(data: bytes, extra: int) -> None:
    rejects(relength(data + b"\0" * extra), "descriptor_length", 6, header_too=True)


@pytest.mark.parametrize("extra", [1, 7, 64])
def test_unknown_trailing_bytes_are_kept_at_a_newer_minor(extra: int) -> None:
    data = relength(put(PBA_ASYM, 5, "B", 1) + b"\xab" * extra)
    assert accepts(data).unknown_trailing == b"\xab" * extra


@pytest.mark.parametrize("bit", range(5, 32))
def test_reserved_flag_bit(bit: int) -> None:
    rejects(put(SPEC, 10, "I", 1 << bit), "flags", 10, header_too=True)


@pytest.mark.parametrize("bit", [5, 31])
def test_reserved_flag_bit_also_at_a_newer_minor(bit: int) -> None:
    rejects(put(MINOR1, 10, "I", 1 << bit), "flags", 10, header_too=True)


def test_extension_type_flag_without_a_private_type_tag() -> None:
    rejects(put(SPEC, 10, "I", 0x04), "flags", 10, header_too=True)


@pytest.mark.parametrize("tag", [0xF0, 0xF3, 0xFE])
def test_private_type_tag_without_the_extension_type_flag(tag: int) -> None:
    rejects(put(SPEC, 14, "B", tag), "flags", 10, header_too=True)


@pytest.mark.parametrize("tag", [0xF0, 0xF3, 0xFE])
def test_private_type_tag_with_the_flag_is_not_supported_for_block_paged(tag: int) -> None:
    data = put(put(SPEC, 14, "B", tag), 10, "I", 0x04)
    rejects(data, "type_tag", 14)


@pytest.mark.parametrize(
    "tag", [0x00, 0xFF, 0x47, 0x80, 0xEF, 0x30, 0x05, 0x18, 0x21, 0x4C, 0x52, 0x7F]
)
def test_invalid_reserved_or_unknown_type_tag(tag: int) -> None:
    exc = rejects(put(SPEC, 14, "B", tag), "type_tag", 14, header_too=True)
    assert exc.found == f"0x{tag:02X}"


@pytest.mark.parametrize("tag", [0x00, 0xFF, 0x0C, 0x3F, 0x41, 0x80, 0xEF])
def test_invalid_or_reserved_layout_tag(tag: int) -> None:
    rejects(put(SPEC, 15, "B", tag), "layout_tag", 15, header_too=True)


@pytest.mark.parametrize("rank", [0, 1, 2, 4, 64, 65, 0xFFFFFFFF])
def test_rank_other_than_3(rank: int) -> None:
    rejects(put(SPEC, 16, "I", rank), "rank", 16)


@pytest.mark.parametrize("rank", [65, 1000, 0xFFFFFFFF])
def test_rank_above_64_on_the_general_path(rank: int) -> None:
    with pytest.raises(hw.errors.InvalidDescriptorError) as info:
        hw.decode_header(put(SPEC, 16, "I", rank))
    assert (info.value.field, info.value.offset) == ("rank", 16)


# == 2. Block-paged payload and core fields (§ 5, § 6.1, § 9.1, block-paged.md § 2) =========


@pytest.mark.parametrize("axis", [1, 2, 0xFFFFFFFF])
def test_paged_axis_not_0(axis: int) -> None:
    rejects(put(SPEC, 64, "I", axis), "paged_axis", 64)


def test_page_size_0() -> None:
    rejects(put(SPEC, 52, "I", 0), "page_size", 52)


@pytest.mark.parametrize("role", [3, 0x7F, 0xFF])
def test_unknown_kv_role(role: int) -> None:
    rejects(put(SPEC, 72, "B", role), "kv_role", 72, header_too=True)


@pytest.mark.parametrize("index_type", [2, 0x80, 0xFF])
def test_unknown_block_table_index_type(index_type: int) -> None:
    rejects(put(SPEC, 77, "B", index_type), "block_table_index_type", 77, header_too=True)


@pytest.mark.parametrize("value", [0x01, 0x80, 0xFF])
@pytest.mark.parametrize("position", range(6))
def test_reserved_payload_byte(position: int, value: int) -> None:
    rejects(put(SPEC, 78 + position, "B", value), "_reserved", 78 + position, header_too=True)


@pytest.mark.parametrize("byte_offset", [1, 8, 640, 2**64 - 1])
def test_byte_offset_not_0(byte_offset: int) -> None:
    rejects(put(SPEC, 44, "Q", byte_offset), "byte_offset", 44)


def test_has_shard_flag() -> None:
    rejects(put(SPEC, 10, "I", 0x02), "flags", 10)


def test_has_shard_with_a_well_formed_shard_section() -> None:
    shard = struct.pack("<6Q", 9, 2, 8, 0, 0, 0)  # parent_shape == shape, offsets 0
    data = put(splice(SPEC, len(SPEC), insert=shard), 10, "I", 0x02)
    hw.decode_header(data)  # well formed for the general path
    rejects(data, "flags", 10)


@pytest.mark.parametrize("num_pages", [2**32, 2**32 + 1, 2**64 - 1])
def test_uint32_indices_with_more_than_0xffffffff_pages(num_pages: int) -> None:
    rejects(put(SPEC, 56, "Q", num_pages), "num_pages", 56)


def test_uint32_indices_on_the_huge_pool_vector() -> None:
    rejects(put(HUGE, 77, "B", 0), "num_pages", 56)


def test_uint32_indices_with_exactly_0xffffffff_pages_are_fine() -> None:
    layout = hw.BlockPagedLayout(4, 0xFFFFFFFF, 0, 1)
    desc = hw.TensorDescriptor.block_paged(layout, [4, 1, 1], "int8", num_logical_pages=1)
    assert accepts(hw.encode_descriptor(desc)) == desc


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_dynamic_dimension(axis: int) -> None:
    rejects(put(SPEC, 20 + 8 * axis, "Q", 2**64 - 1), f"shape[{axis}]", 20 + 8 * axis)


def test_total_tokens_beyond_the_capacity_of_the_block_table() -> None:
    rejects(put(SPEC, 20, "Q", 13), "shape[0]", 20)  # 3 logical pages x 4 slots = 12


def test_empty_batch_with_tokens() -> None:
    rejects(put(EMPTY, 20, "Q", 1), "shape[0]", 20)


# == 3. Buffer table: count (§ 7, block-paged.md § 2) ========================================


@pytest.mark.parametrize("count", [0, 1, 2, 4, 5, 0xFF])
def test_buffer_count_flipped_alone(count: int) -> None:
    """Only the count byte changes, so the table no longer fits descriptor_length."""
    with pytest.raises(hw.errors.InvalidDescriptorError):
        hw.decode_descriptor(put(SPEC, 84, "B", count))


@pytest.mark.parametrize("count", [0, 1, 2])
def test_buffer_count_below_3(count: int) -> None:
    rejects(with_buffer_count(SPEC, count), "buffer_count", 84)


@pytest.mark.parametrize("count", [4, 5])
def test_buffer_count_above_3_without_quantization(count: int) -> None:
    extra = SPEC[handle_at(2) : handle_at(3)]
    rejects(with_buffer_count(SPEC, count, extra), "buffer_count", 84)


@pytest.mark.parametrize(
    ("data", "count"),
    [(PBA_SYM, 3), (PBA_SYM, 5), (PBA_ASYM, 4), (PBA_ASYM, 6), (PER_TENSOR, 4), (PER_CHANNEL, 5)],
    ids=["pba_sym3", "pba_sym5", "pba_asym4", "pba_asym6", "per_tensor4", "per_channel5"],
)
def test_buffer_count_not_3_plus_parameter_buffers(data: bytes, count: int) -> None:
    extra = data[handle_at(2) : handle_at(3)]
    rejects(with_buffer_count(data, count, extra), "buffer_count", 84)


def test_shared_scale_and_zero_point_buffer_counts_once() -> None:
    """zero_point index == scale index: one [scales | zero_points] buffer, not two."""
    q = quant_at(PBA_ASYM)
    rejects(put(PBA_ASYM, q + 20, "I", 3), "buffer_count", 84)


# == 4. Buffer handles (§ 7.1) ================================================================

HANDLES = [(SPEC, 0), (SPEC, 1), (SPEC, 2), (PBA_ASYM, 3), (PBA_ASYM, 4)]
HANDLE_IDS = ["page_pool", "block_table", "seq_ptr", "scales", "zero_points"]


@pytest.mark.parametrize("value", [0x01, 0xFF])
@pytest.mark.parametrize(("data", "index"), HANDLES, ids=HANDLE_IDS)
def test_handle_reserved_byte(data: bytes, index: int, value: int) -> None:
    at = handle_at(index) + 15
    rejects(put(data, at, "B", value), f"buffers[{index}]._reserved", at, header_too=True)


@pytest.mark.parametrize("alignment", [0, 3, 32, 63, 1, 96, 0x80000001, 0xFFFFFFFF])
@pytest.mark.parametrize(("data", "index"), HANDLES, ids=HANDLE_IDS)
def test_handle_alignment(data: bytes, index: int, alignment: int) -> None:
    at = handle_at(index) + 8
    rejects(put(data, at, "I", alignment), f"buffers[{index}].alignment", at, header_too=True)


@pytest.mark.parametrize("alignment", [0, 3, 12])
def test_alignment_of_an_empty_buffer_must_still_be_a_power_of_two(alignment: int) -> None:
    at = handle_at(1) + 8  # EMPTY's block_table: 0 bytes, alignment 1
    rejects(put(EMPTY, at, "I", alignment), "buffers[1].alignment", at, header_too=True)


@pytest.mark.parametrize("alignment", [1, 2, 32, 64, 2**31])
def test_any_power_of_two_is_fine_for_an_empty_buffer(alignment: int) -> None:
    accepts(put(EMPTY, handle_at(1) + 8, "I", alignment))


@pytest.mark.parametrize("device", [0x09, 0x10, 0x80, 0xEF, 0xFF])
@pytest.mark.parametrize(("data", "index"), HANDLES, ids=HANDLE_IDS)
def test_handle_device_tag(data: bytes, index: int, device: int) -> None:
    at = handle_at(index) + 12
    rejects(put(data, at, "B", device), f"buffers[{index}].device_tag", at, header_too=True)


@pytest.mark.parametrize("sync", [3, 0x80, 0xFF])
@pytest.mark.parametrize("index", range(3))
def test_handle_sync_mode_above_2(index: int, sync: int) -> None:
    at = handle_at(index) + 13
    rejects(put(CUDA, at, "B", sync), f"buffers[{index}].sync_mode", at, header_too=True)


@pytest.mark.parametrize("sync", [1, 2])
@pytest.mark.parametrize(("data", "index"), HANDLES, ids=HANDLE_IDS)
def test_cpu_handle_with_sync_mode_not_0(data: bytes, index: int, sync: int) -> None:
    at = handle_at(index) + 13
    rejects(put(data, at, "B", sync), f"buffers[{index}].sync_mode", at, header_too=True)


@pytest.mark.parametrize("memory", [0x04, 0x10, 0x80, 0xEF, 0xFF, 0xF0, 0xFE])
@pytest.mark.parametrize(("data", "index"), HANDLES, ids=HANDLE_IDS)
def test_handle_memory_class_reserved_or_private_on_a_standard_device(
    data: bytes, index: int, memory: int
) -> None:
    at = handle_at(index) + 14
    rejects(put(data, at, "B", memory), f"buffers[{index}].memory_class", at, header_too=True)


INVALID_PAIRS = [
    (0x00, 0x03),  # CPU + peer
    (0x03, 0x03),  # Metal + peer
    (0x06, 0x03),  # Hexagon + peer
    (0x08, 0x03),  # OpenCL + peer
    (0x05, 0x01),  # WebGPU + host-pinned
    (0x05, 0x02),  # WebGPU + unified
    (0x05, 0x03),  # WebGPU + peer
    (0xF3, 0x01),  # private device + host-pinned
    (0xF3, 0x02),  # private device + unified
    (0xF3, 0x03),  # private device + peer
    (0x01, 0xF5),  # CUDA + private memory class
    (0x00, 0xF5),  # CPU + private memory class
]


@pytest.mark.parametrize(("device", "memory"), INVALID_PAIRS)
def test_invalid_device_memory_class_pair(device: int, memory: int) -> None:
    """Every handle carries the pair, so colocation holds and the pair rule alone fires."""
    data = all_handles(SPEC, device_tag=device, memory_class=memory)
    rejects(data, "buffers[0].memory_class", handle_at(0) + 14, header_too=True)


VALID_PAIRS = [
    (device, memory)
    for device in (0x00, 0x03, 0x06, 0x08)
    for memory in (0, 1, 2)
] + [
    (device, memory)
    for device in (0x01, 0x02, 0x04, 0x07)
    for memory in (0, 1, 2, 3)
] + [(0x05, 0), (0xF0, 0), (0xF3, 0xF0), (0xFE, 0xFE)]  # fmt: skip


@pytest.mark.parametrize(("device", "memory"), VALID_PAIRS)
def test_valid_device_memory_class_pair(device: int, memory: int) -> None:
    desc = accepts(all_handles(PBA_ASYM, device_tag=device, memory_class=memory))
    assert {(h.device_tag, h.memory_class) for h in desc.buffers} == {(device, memory)}


@pytest.mark.parametrize(("data", "index"), HANDLES[1:], ids=HANDLE_IDS[1:])
def test_buffers_on_different_devices(data: bytes, index: int) -> None:
    at = handle_at(index) + 12
    rejects(put(data, at, "B", 0x01), f"buffers[{index}].device_tag", at)
    with pytest.raises(hw.errors.InvalidDescriptorError):
        hw.decode_header(put(data, at, "B", 0x01))


def test_page_pool_on_another_device_names_the_first_disagreeing_buffer() -> None:
    rejects(put(SPEC, handle_at(0) + 12, "B", 0x01), "buffers[1].device_tag", handle_at(1) + 12)


@pytest.mark.parametrize("memory", [0, 1])
@pytest.mark.parametrize("index", [1, 2])
def test_buffers_in_different_memory_classes(index: int, memory: int) -> None:
    at = handle_at(index) + 14  # CUDA's buffers are all unified (2)
    rejects(put(CUDA, at, "B", memory), f"buffers[{index}].memory_class", at, header_too=True)


def test_quantization_buffer_in_another_memory_class() -> None:
    at = handle_at(4) + 14
    data = put(all_handles(PBA_ASYM, device_tag=0x01, memory_class=0x02), at, "B", 0)
    rejects(data, "buffers[4].memory_class", at, header_too=True)


def test_sync_mode_may_differ_between_gpu_handles() -> None:
    accepts(put(CUDA, handle_at(1) + 13, "B", 2))


# == 5. Buffer sizes: exact, [A16] strict (block-paged.md § 3) ================================


@pytest.mark.parametrize("size", [0, 638, 639, 641, 642, 704, 1280])
def test_page_pool_size_not_exact(size: int) -> None:
    rejects(put(SPEC, handle_at(0), "Q", size), "buffers[0].byte_size", handle_at(0))


@pytest.mark.parametrize(("data", "size"), [(SPEC, 0), (SPEC, 8), (SPEC, 16), (U64, 16), (U64, 32)])
def test_seq_ptr_size_not_num_seqs_plus_1_entries(data: bytes, size: int) -> None:
    rejects(put(data, handle_at(2), "Q", size), "buffers[2].byte_size", handle_at(2))


def test_seq_ptr_of_an_empty_batch_is_one_entry() -> None:
    rejects(put(EMPTY, handle_at(2), "Q", 0), "buffers[2].byte_size", handle_at(2))


@pytest.mark.parametrize(
    ("data", "size"),
    [(SPEC, 1), (SPEC, 13), (SPEC, 14), (SPEC, 15), (U64, 12), (U64, 20), (U64, 28)],
)
def test_block_table_size_not_a_multiple_of_the_index_width(data: bytes, size: int) -> None:
    rejects(put(data, handle_at(1), "Q", size), "buffers[1].byte_size", handle_at(1))


def test_block_table_of_an_empty_batch_is_empty() -> None:
    data = put(put(EMPTY, handle_at(1), "Q", 4), handle_at(1) + 8, "I", 64)
    rejects(data, "buffers[1].byte_size", handle_at(1))


@pytest.mark.parametrize(
    ("data", "index", "size"),
    [
        (PBA_ASYM, 3, 38), (PBA_ASYM, 3, 42), (PBA_ASYM, 3, 80),  # 20 slots x f16 = 40
        (PBA_ASYM, 4, 76), (PBA_ASYM, 4, 84), (PBA_ASYM, 4, 40),  # 20 slots x i32 = 80
        (PBA_SYM, 3, 76), (PBA_SYM, 3, 84),  # 20 slots x f32 = 80
        (PER_CHANNEL, 3, 4), (PER_CHANNEL, 3, 12),  # shape[1] = 2 x f32 = 8
    ],
)  # fmt: skip
def test_quantization_parameter_buffer_size_not_exact(data: bytes, index: int, size: int) -> None:
    names = hw.decode_descriptor(data).buffer_names
    assert names[index] in ("scales", "zero_points")
    rejects(put(data, handle_at(index), "Q", size), f"buffers[{index}].byte_size", handle_at(index))


# == 6. Quantization section (§ 8, block-paged.md § 7) ========================================

QUANTIZED = [PER_TENSOR, PER_CHANNEL, PBA_SYM, PBA_ASYM]
QUANTIZED_IDS = ["per_tensor", "per_channel", "pba_sym", "pba_asym"]


@pytest.mark.parametrize("tag", [0x00, 0x06, 0x5F, 0x60, 0xEF, 0xF0, 0xFE, 0xFF])
@pytest.mark.parametrize("data", QUANTIZED, ids=QUANTIZED_IDS)
def test_invalid_unassigned_reserved_or_private_scheme_tag(data: bytes, tag: int) -> None:
    q = quant_at(data)
    rejects(put(data, q + 4, "B", tag), "quantization.scheme_tag", q + 4, header_too=True)


@pytest.mark.parametrize("version", [2, 0x7F, 0xFF])
@pytest.mark.parametrize("data", QUANTIZED, ids=QUANTIZED_IDS)
def test_newer_scheme_version(data: bytes, version: int) -> None:
    q = quant_at(data)
    rejects(put(data, q + 5, "B", version), "quantization.scheme_version", q + 5, header_too=True)


@pytest.mark.parametrize("data", QUANTIZED, ids=QUANTIZED_IDS)
def test_scheme_version_0_is_accepted_and_kept(data: bytes) -> None:
    """[A28]: only a greater version is refused; the byte survives a round trip."""
    desc = accepts(put(data, quant_at(data) + 5, "B", 0))
    assert desc.quantization is not None and desc.quantization.scheme_version == 0


@pytest.mark.parametrize("bit", range(16))
def test_per_tensor_flag_bits(bit: int) -> None:
    q = quant_at(PER_TENSOR)
    rejects(put(PER_TENSOR, q + 6, "H", 1 << bit), "quantization.flags", q + 6, header_too=True)


@pytest.mark.parametrize("bit", range(1, 16))
@pytest.mark.parametrize("data", QUANTIZED[1:], ids=QUANTIZED_IDS[1:])
def test_affine_unknown_flag_bits(data: bytes, bit: int) -> None:
    q = quant_at(data)
    flags = struct.unpack_from("<H", data, q + 6)[0] | (1 << bit)
    rejects(put(data, q + 6, "H", flags), "quantization.flags", q + 6, header_too=True)


RESERVED_QUANT_BYTES = [
    (PER_TENSOR, 16, 4),  # u8[4] after the zero point
    (PER_CHANNEL, 21, 3),  # u8[3] after scale_type_tag
    (PBA_SYM, 25, 3),
    (PBA_ASYM, 25, 3),
]


@pytest.mark.parametrize(
    ("data", "position"),
    [(data, at + i) for data, at, count in RESERVED_QUANT_BYTES for i in range(count)],
)
def test_quantization_reserved_byte(data: bytes, position: int) -> None:
    at = quant_at(data) + position
    rejects(put(data, at, "B", 0x01), "quantization._reserved", at, header_too=True)


@pytest.mark.parametrize(
    "bits",
    [0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001, 0xFFFFFFFF],
    ids=["zero", "minus_zero", "inf", "minus_inf", "nan", "snan", "minus_nan"],
)
def test_per_tensor_scale_zero_or_not_finite(bits: int) -> None:
    q = quant_at(PER_TENSOR)
    rejects(put(PER_TENSOR, q + 8, "I", bits), "quantization.scale", q + 8)


@pytest.mark.parametrize("bits", [0x00000001, 0x80000001, 0x7F7FFFFF, 0xFF7FFFFF])
def test_per_tensor_scale_subnormal_or_largest_is_fine(bits: int) -> None:
    accepts(put(PER_TENSOR, quant_at(PER_TENSOR) + 8, "I", bits))


@pytest.mark.parametrize(
    ("type_tag", "zero_point"),
    [(0x10, 128), (0x10, -129), (0x10, 2**31 - 1), (0x10, -(2**31)), (0x11, -1), (0x11, 256)],
)
def test_per_tensor_zero_point_outside_the_storage_range(type_tag: int, zero_point: int) -> None:
    q = quant_at(PER_TENSOR)
    data = put(put(PER_TENSOR, 14, "B", type_tag), q + 12, "i", zero_point)
    rejects(data, "quantization.zero_point", q + 12)


@pytest.mark.parametrize(("type_tag", "zero_point"), [(0x10, 127), (0x10, -128), (0x11, 255)])
def test_per_tensor_zero_point_at_the_storage_limits(type_tag: int, zero_point: int) -> None:
    accepts(put(put(PER_TENSOR, 14, "B", type_tag), quant_at(PER_TENSOR) + 12, "i", zero_point))


SYMMETRIC_MISMATCHES = [
    (PER_CHANNEL, 16, 4, "flag set, zero point index 4"),
    (PER_CHANNEL, 16, 3, "flag set, zero point index 3"),
    (PBA_SYM, 20, 4, "flag set, zero point index 4"),
    (PBA_ASYM, 20, 0xFFFFFFFF, "flag clear, no zero point"),
]


@pytest.mark.parametrize(
    ("data", "position", "zero_point_index", "what"),
    SYMMETRIC_MISMATCHES,
    ids=[f"{i}:{case[3]}" for i, case in enumerate(SYMMETRIC_MISMATCHES)],
)
def test_symmetric_flag_disagrees_with_the_zero_point_index(
    data: bytes, position: int, zero_point_index: int, what: str
) -> None:
    q = quant_at(data)
    rejects(
        put(data, q + position, "I", zero_point_index), "quantization.flags", q + 6, header_too=True
    )


@pytest.mark.parametrize(("data", "flags"), [(PER_CHANNEL, 0), (PBA_SYM, 0), (PBA_ASYM, 1)])
def test_symmetric_flag_flipped_alone(data: bytes, flags: int) -> None:
    q = quant_at(data)
    rejects(put(data, q + 6, "H", flags), "quantization.flags", q + 6, header_too=True)


@pytest.mark.parametrize("block_size", [0, 1, 3, 5, 6, 12, 0x80000001, 0xFFFFFFFF])
def test_per_block_block_size_not_a_power_of_two_of_at_least_2(block_size: int) -> None:
    q = quant_at(PBA_SYM)
    rejects(
        put(PBA_SYM, q + 12, "I", block_size), "quantization.block_size", q + 12, header_too=True
    )


@pytest.mark.parametrize("block_size", [2, 8, 16, 0x80000000])
def test_per_block_block_size_not_page_size(block_size: int) -> None:
    q = quant_at(PBA_SYM)
    rejects(put(PBA_SYM, q + 12, "I", block_size), "quantization.block_size", q + 12)


@pytest.mark.parametrize("axis", [1, 2, 3, 0xFFFFFFFF])
@pytest.mark.parametrize("data", [PBA_SYM, PBA_ASYM], ids=["sym", "asym"])
def test_per_block_axis_not_0(data: bytes, axis: int) -> None:
    q = quant_at(data)
    rejects(put(data, q + 8, "I", axis), "quantization.axis", q + 8)


@pytest.mark.parametrize("axis", [0, 3, 0xFFFFFFFF])
def test_per_channel_axis_not_1_or_2(axis: int) -> None:
    q = quant_at(PER_CHANNEL)
    rejects(put(PER_CHANNEL, q + 8, "I", axis), "quantization.axis", q + 8)


@pytest.mark.parametrize("tag", [0x00, 0x01, 0x02, 0x04, 0x10, 0xFF])
def test_per_channel_scale_type_not_float32(tag: int) -> None:
    q = quant_at(PER_CHANNEL)
    rejects(
        put(PER_CHANNEL, q + 20, "B", tag), "quantization.scale_type_tag", q + 20, header_too=True
    )


@pytest.mark.parametrize("tag", [0x00, 0x04, 0x10, 0x40, 0xF0, 0xFF])
@pytest.mark.parametrize("data", [PBA_SYM, PBA_ASYM], ids=["sym", "asym"])
def test_per_block_scale_type_not_f16_bf16_f32(data: bytes, tag: int) -> None:
    q = quant_at(data)
    rejects(put(data, q + 24, "B", tag), "quantization.scale_type_tag", q + 24, header_too=True)


@pytest.mark.parametrize("index", [0, 1, 2])
@pytest.mark.parametrize(
    ("data", "position"),
    [(PER_CHANNEL, 12), (PBA_SYM, 16), (PBA_ASYM, 16)],
    ids=["pc", "sym", "asym"],
)
def test_scale_buffer_index_below_3(data: bytes, position: int, index: int) -> None:
    q = quant_at(data)
    rejects(put(data, q + position, "I", index), "quantization.scale_buffer_index", q + position)


@pytest.mark.parametrize("index", [4, 5, 0xFF, 0xFFFFFFFE, 0xFFFFFFFF])
@pytest.mark.parametrize(
    ("data", "position"), [(PER_CHANNEL, 12), (PBA_SYM, 16)], ids=["pc", "sym"]
)
def test_scale_buffer_index_beyond_the_buffer_table(data: bytes, position: int, index: int) -> None:
    q = quant_at(data)
    rejects(put(data, q + position, "I", index), "quantization.scale_buffer_index", q + position)


@pytest.mark.parametrize("index", [0, 1, 2, 5, 0xFFFFFFFE])
def test_zero_point_buffer_index_out_of_place_is_rejected(index: int) -> None:
    q = quant_at(PBA_ASYM)
    with pytest.raises(hw.errors.InvalidDescriptorError) as info:
        hw.decode_descriptor(put(PBA_ASYM, q + 20, "I", index))
    assert (info.value.field or "").startswith("quantization.")


@pytest.mark.parametrize("index", [2, 5])
def test_zero_point_buffer_index_error_names_its_own_field(index: int) -> None:
    q = quant_at(PBA_ASYM)
    rejects(put(PBA_ASYM, q + 20, "I", index), "quantization.zero_point_buffer_index", q + 20)


@pytest.mark.parametrize(
    ("data", "type_tag"),
    [
        (PBA_SYM, 0x40), (PBA_SYM, 0x41), (PBA_SYM, 0x42), (PBA_ASYM, 0x40),  # float8
        (PBA_SYM, 0x12), (PBA_SYM, 0x14), (PBA_SYM, 0x01), (PBA_SYM, 0x20),
        (PER_TENSOR, 0x40), (PER_TENSOR, 0x01), (PER_TENSOR, 0x16), (PER_TENSOR, 0x20),
        (PER_CHANNEL, 0x41), (PER_CHANNEL, 0x02), (PER_CHANNEL, 0x43),
    ],
)  # fmt: skip
def test_storage_type_not_allowed_by_the_scheme(data: bytes, type_tag: int) -> None:
    rejects(put(data, 14, "B", type_tag), "type_tag", 14)


@pytest.mark.parametrize("length", [0, 1, 3])
@pytest.mark.parametrize("data", QUANTIZED, ids=QUANTIZED_IDS)
def test_quantization_length_below_the_scheme_header(data: bytes, length: int) -> None:
    q = quant_at(data)
    rejects(put(data, q, "I", length), "quantization_length", q)


@pytest.mark.parametrize("short_by", [1, 4, 12])
@pytest.mark.parametrize("data", QUANTIZED, ids=QUANTIZED_IDS)
def test_quantization_length_below_the_scheme_size(data: bytes, short_by: int) -> None:
    q = quant_at(data)
    length = struct.unpack_from("<I", data, q)[0] - short_by
    rejects(put(data, q, "I", length), "quantization_length", q)
    # the same with the section really cut short and descriptor_length repaired
    cut = put(splice(data, q + 4 + length, remove=short_by), q, "I", length)
    rejects(cut, "quantization_length", q)


@pytest.mark.parametrize("length", [25, 1000, 0xFFFFFFFF])
def test_quantization_length_beyond_the_descriptor(length: int) -> None:
    rejects(put(PBA_SYM, quant_at(PBA_SYM), "I", length), "descriptor_length", 6)


@pytest.mark.parametrize("padding", [b"\0", b"\x01\x02\x03", bytes(range(40))])
@pytest.mark.parametrize("data", QUANTIZED, ids=QUANTIZED_IDS)
def test_quantization_padding_is_accepted_and_kept(data: bytes, padding: bytes) -> None:
    """[A31]: quantization_length may exceed the scheme's size; the bytes survive."""
    q = quant_at(data)
    length = struct.unpack_from("<I", data, q)[0]
    end = q + 4 + length
    padded = put(splice(data, end, insert=padding), q, "I", length + len(padding))
    assert accepts(padded).quantization_padding == padding


def test_has_quantization_flag_cleared_on_a_quantized_descriptor() -> None:
    with pytest.raises(hw.errors.InvalidDescriptorError):
        hw.decode_descriptor(put(PBA_SYM, 10, "I", 0))


def test_has_quantization_flag_set_without_a_section() -> None:
    rejects(put(SPEC, 10, "I", 0x01), "descriptor_length", 6, header_too=True)


def _with_scheme(storage_tag: int, scheme_tag: int, block_size: int) -> bytes:
    """PBA_SYM's first 149 bytes (4 buffers) with an NF4 / MXFP section instead."""
    body = struct.pack("<IBBHIII", 16, scheme_tag, 1, 0, 0, block_size, 3)
    return relength(put(PBA_SYM[:149], 14, "B", storage_tag) + body)


@pytest.mark.parametrize(
    ("storage_tag", "scheme_tag", "block_size"),
    [
        (0x49, 0x04, 8), (0x49, 0x04, 64),  # NF4 over uint4
        (0x40, 0x05, 32), (0x41, 0x05, 16), (0x43, 0x05, 32), (0x44, 0x05, 32),
        (0x45, 0x05, 32), (0x10, 0x05, 2048), (0x48, 0x05, 32),  # MXFP storage types
    ],
)  # fmt: skip
def test_nf4_and_mxfp_are_not_defined_for_block_paged(
    storage_tag: int, scheme_tag: int, block_size: int
) -> None:
    data = _with_scheme(storage_tag, scheme_tag, block_size)
    header = hw.decode_header(data)  # valid for the layout-independent path
    assert header.quantization is not None and header.quantization.scheme_tag == scheme_tag
    rejects(data, "quantization", 149, hw.errors.QuantizationNotDefinedError)


# == 7. Statistics section (§ 9.2) ============================================================


@pytest.mark.parametrize("bit", range(6, 32))
def test_statistics_reserved_mask_bit(bit: int) -> None:
    mask = struct.unpack_from("<I", STATS, STATS_AT)[0] | (1 << bit)
    rejects(put(STATS, STATS_AT, "I", mask), "statistics.computed_mask", STATS_AT, header_too=True)


@pytest.mark.parametrize("position", [*range(4, 8), *range(68, 72)])
def test_statistics_reserved_byte(position: int) -> None:
    field = "statistics._reserved0" if position < 8 else "statistics._reserved1"
    at = STATS_AT + position
    rejects(put(STATS, at, "B", 0x01), field, at, header_too=True)


@pytest.mark.parametrize("value", [2, 0x80, 0xFF])
@pytest.mark.parametrize(("name", "position"), [("has_nan", 66), ("has_inf", 67)])
def test_statistics_boolean_byte_not_0_or_1(name: str, position: int, value: int) -> None:
    """[A30]: only 0 and 1 round-trip."""
    with pytest.raises(hw.errors.InvalidDescriptorError) as info:
        hw.decode_descriptor(put(STATS, STATS_AT + position, "B", value))
    assert info.value.field == f"statistics.{name}"
    with pytest.raises(hw.errors.InvalidDescriptorError):
        hw.decode_header(put(STATS, STATS_AT + position, "B", value))


@pytest.mark.parametrize(("name", "position"), [("has_nan", 66), ("has_inf", 67)])
def test_statistics_boolean_byte_error_names_its_offset(name: str, position: int) -> None:
    rejects(put(STATS, STATS_AT + position, "B", 2), f"statistics.{name}", STATS_AT + position)


def test_statistics_values_are_advisory_nan_and_inf_are_kept() -> None:
    data = put(put(STATS, STATS_AT + 24, "d", math.nan), STATS_AT + 32, "d", -math.inf)
    desc = accepts(data)
    assert desc.statistics is not None and math.isnan(desc.statistics.value_min)


# == 8. Composite-member section (§ 9.4) ======================================================


@pytest.mark.parametrize("role", [2, 3, 0x80, 0xFF])
def test_composite_member_role(role: int) -> None:
    data = put(MEMBER, MEMBER_AT, "B", role)
    rejects(data, "composite_member.member_role", MEMBER_AT, header_too=True)


@pytest.mark.parametrize("role", [0, 1])
def test_composite_member_roles_0_and_1(role: int) -> None:
    assert accepts(put(MEMBER, MEMBER_AT, "B", role)).composite_member == role


@pytest.mark.parametrize("position", range(1, 16))
def test_composite_member_reserved_byte(position: int) -> None:
    with pytest.raises(hw.errors.InvalidDescriptorError) as info:
        hw.decode_descriptor(put(MEMBER, MEMBER_AT + position, "B", 0x01))
    assert info.value.field == "composite_member._reserved"
    # the field starts at +1; the code names the field, not the non-zero byte
    assert info.value.offset in (MEMBER_AT + 1, MEMBER_AT + position)
    with pytest.raises(hw.errors.InvalidDescriptorError):
        hw.decode_header(put(MEMBER, MEMBER_AT + position, "B", 0x01))


# == 9. Truncation at every length ============================================================

TRUNCATED = [
    ("spec", SPEC), ("cuda", CUDA), ("huge", HUGE), ("empty", EMPTY), ("minor1", MINOR1),
    ("per_tensor", PER_TENSOR), ("per_channel", PER_CHANNEL), ("pba_asym", PBA_ASYM),
    ("stats", STATS), ("member", MEMBER),
]  # fmt: skip


@pytest.mark.parametrize(("name", "data"), TRUNCATED, ids=[n for n, _ in TRUNCATED])
def test_truncation_at_every_length(name: str, data: bytes) -> None:
    for size in range(len(data)):
        for decode in (hw.decode_descriptor, hw.decode_header):
            with pytest.raises(hwe.DescriptorTruncatedError) as info:
                decode(data[:size])
            assert isinstance(info.value, hw.errors.InvalidDescriptorError)
            assert info.value.offset == size, (size, str(info.value))


@pytest.mark.parametrize(("name", "data"), TRUNCATED, ids=[n for n, _ in TRUNCATED])
def test_truncation_with_a_repaired_descriptor_length(name: str, data: bytes) -> None:
    """Cut short and told so: what is left is a descriptor too small for its content."""
    for size in range(20, len(data)):
        cut = relength(data[:size])
        for decode in (hw.decode_descriptor, hw.decode_header):
            if name == "minor1" and size >= 133:
                decode(cut)  # only unknown trailing bytes were cut: still valid
                continue
            with pytest.raises(hw.errors.InvalidDescriptorError):
                decode(cut)


@pytest.mark.parametrize("data", [b"", b"H", b"HRR", b"HRRY", b"HRRY\x01\x00\x85\x00\x00"])
def test_tiny_inputs_are_truncated(data: bytes) -> None:
    with pytest.raises(hwe.DescriptorTruncatedError):
        hw.decode_descriptor(data)


# == 10. Valid vectors: exact re-encoding ======================================================


@pytest.mark.parametrize(("name", "data"), VALID + TOLERANT, ids=[n for n, _ in VALID + TOLERANT])
def test_every_valid_vector_reencodes_to_its_bytes(name: str, data: bytes) -> None:
    desc = accepts(data)
    assert desc.descriptor_length == len(data)
    assert hw.decode_descriptor(hw.encode_descriptor(desc)) == desc
    assert hw.encode_descriptor(hw.decode_descriptor(bytearray(data) + b"\xee" * 5)) == data


def test_composite_member_vector_reencodes() -> None:
    assert accepts(MEMBER).composite_member == 0


INVALID_FIELDS = {
    "bp_bad_rank2": ("rank", 16),
    "bp_bad_paged_axis1": ("paged_axis", 64),
    "bp_bad_page_size0": ("page_size", 52),
    "bp_bad_kv_role3": ("kv_role", 72),
    "bp_bad_index_type2": ("block_table_index_type", 77),
    "bp_bad_reserved_byte0": ("_reserved", 78),
    "bp_bad_reserved_byte5": ("_reserved", 83),
    "bp_bad_byte_offset8": ("byte_offset", 44),
    "bp_bad_has_shard": ("flags", 10),
    "bp_bad_buffer_count2": ("buffer_count", 84),
    "bp_bad_buffer_count4_unquantized": ("buffer_count", 84),
    "bp_bad_pba_axis2": ("quantization.axis", 157),
    "bp_bad_pba_block_size8": ("quantization.block_size", 161),
    "bp_bad_per_channel_axis0": ("quantization.axis", 157),
    "bp_bad_pba_fp8_storage": ("type_tag", 14),
    "bp_bad_scale_index_overlaps_block_table": ("quantization.scale_buffer_index", 165),
    "bp_bad_device_mismatch": ("buffers[1].device_tag", 113),
    "bp_bad_memory_class_mismatch": ("buffers[2].memory_class", 131),
    "bp_bad_alignment32": ("buffers[0].alignment", 93),
    "bp_bad_handle_reserved": ("buffers[0]._reserved", 100),
    "bp_bad_u32_index_huge_pool": ("num_pages", 56),
    "bp_bad_pool_size": ("buffers[0].byte_size", 85),
    "bp_bad_seq_ptr_size": ("buffers[2].byte_size", 117),
    "bp_bad_version_major2": ("version_major", 4),
    "bp_bad_reserved_flag5": ("flags", 10),
    "bp_bad_length_mismatch": ("descriptor_length", 6),
}


@pytest.mark.parametrize(
    "case",
    MANIFEST["invalid_descriptors"],
    ids=[c["name"] for c in MANIFEST["invalid_descriptors"]],
)
def test_every_invalid_vector_names_its_field(case: dict[str, Any]) -> None:
    data = (BLOCK_PAGED / case["file"]).read_bytes()
    field, offset = INVALID_FIELDS[case["name"]]
    rejects(data, field, offset)


# == 11. The model refuses what the decoder refuses (so the encoder cannot write it) ===========


def _spec() -> hw.TensorDescriptor:
    return hw.decode_descriptor(SPEC)


def _pba_asym() -> hw.TensorDescriptor:
    return hw.decode_descriptor(PBA_ASYM)


def _layout(**changes: Any) -> hw.BlockPagedLayout:
    fields: dict[str, Any] = dict(
        page_size=4, num_pages=5, paged_axis=0, num_seqs=2, kv_role="key", layer_index=3
    )
    fields.update(changes)
    return hw.BlockPagedLayout(**fields)


BAD_LAYOUTS: list[tuple[dict[str, Any], str]] = [
    ({"page_size": 0}, "page_size"),
    ({"paged_axis": 1}, "paged_axis"),
    ({"kv_role": "keys"}, "kv_role"),
    ({"kv_role": 3}, "kv_role"),
    ({"block_table_index_type": "uint16"}, "block_table_index_type"),
    ({"block_table_index_type": 2}, "block_table_index_type"),
    ({"num_pages": 2**32}, "num_pages"),
    ({"num_pages": 2**64}, "num_pages"),
    ({"layer_index": 0xFFFFFFFF}, "layer_index"),
    ({"layer_index": 2**32}, "layer_index"),
    ({"num_seqs": -1}, "num_seqs"),
]


@pytest.mark.parametrize(("changes", "field"), BAD_LAYOUTS, ids=[f for _, f in BAD_LAYOUTS])
def test_model_refuses_a_bad_layout(changes: dict[str, Any], field: str) -> None:
    with pytest.raises(hw.errors.InvalidDescriptorError) as info:
        _layout(**changes)
    assert info.value.field == field


BAD_HANDLES: list[tuple[dict[str, Any], str]] = [
    ({"byte_size": -1}, "byte_size"),
    ({"byte_size": 2**64}, "byte_size"),
    ({"alignment": 0}, "alignment"),
    ({"alignment": 3}, "alignment"),
    ({"alignment": 32}, "alignment"),
    ({"alignment": 2**32}, "alignment"),
    ({"device_tag": 0x09}, "device_tag"),
    ({"device_tag": 0xFF}, "device_tag"),
    ({"device_tag": 1, "sync_mode": 3}, "sync_mode"),
    ({"sync_mode": 1}, "sync_mode"),
    ({"memory_class": 4}, "memory_class"),
    ({"memory_class": 0xFF}, "memory_class"),
    ({"memory_class": 0xF0}, "memory_class"),
    ({"memory_class": 3}, "memory_class"),
    ({"device_tag": 5, "memory_class": 1}, "memory_class"),
    ({"device_tag": 0xF3, "memory_class": 2}, "memory_class"),
]


@pytest.mark.parametrize(
    ("changes", "field"), BAD_HANDLES, ids=[f"{f}-{i}" for i, (_, f) in enumerate(BAD_HANDLES)]
)
def test_model_refuses_a_bad_handle(changes: dict[str, Any], field: str) -> None:
    fields: dict[str, Any] = {"byte_size": 64}
    fields.update(changes)
    with pytest.raises(hw.errors.InvalidDescriptorError) as info:
        hw.BufferHandle(**fields)
    assert info.value.field == field


def _bad_descriptors() -> list[tuple[str, Callable[[], object], str | None]]:
    spec, pba = _spec(), _pba_asym()
    quant: Any = pba.quantization
    pool, table, seq_ptr = spec.buffers
    cuda = hw.BufferHandle(table.byte_size, 64, 1)
    unified = dataclasses.replace(seq_ptr, memory_class=2)
    per_channel_0 = hw.PerChannelAffine.symmetric(0, 3)

    def spec_with(**changes: Any) -> Callable[[], object]:
        return lambda: dataclasses.replace(spec, **changes)

    def pba_with(**changes: Any) -> Callable[[], object]:
        return lambda: dataclasses.replace(pba, **changes)

    def pba_quant_with(**changes: Any) -> Callable[[], object]:
        return lambda: dataclasses.replace(pba, quantization=dataclasses.replace(quant, **changes))

    return [
        ("version_0", spec_with(version=(0, 0)), "version_major"),
        ("version_2", spec_with(version=(2, 0)), "version_major"),
        ("trailing_at_minor_0", spec_with(unknown_trailing=b"x"), "unknown_trailing"),
        ("padding_unquantized", spec_with(quantization_padding=b"x"), "quantization_padding"),
        ("two_buffers", spec_with(buffers=(pool, table)), "buffer_count"),
        ("four_buffers", spec_with(buffers=(pool, table, seq_ptr, seq_ptr)), "buffer_count"),
        ("not_a_handle", spec_with(buffers=(pool, 12, seq_ptr)), "buffers[1]"),
        ("mixed_devices", spec_with(buffers=(pool, cuda, seq_ptr)), "buffers[1].device_tag"),
        ("mixed_memory", spec_with(buffers=(pool, table, unified)), "buffers[2].memory_class"),
        (
            "pool_size",
            spec_with(buffers=(hw.BufferHandle(641), table, seq_ptr)),
            "buffers[0].byte_size",
        ),
        (
            "seq_ptr_size",
            spec_with(buffers=(pool, table, hw.BufferHandle(16))),
            "buffers[2].byte_size",
        ),
        (
            "table_width",
            spec_with(buffers=(pool, hw.BufferHandle(13), seq_ptr)),
            "buffers[1].byte_size",
        ),
        ("capacity", spec_with(shape=(13, 2, 8)), "shape[0]"),
        ("rank_2", spec_with(shape=(9, 2)), "rank"),
        ("dynamic_dim", spec_with(shape=(9, 2**64 - 1, 8)), "shape[1]"),
        ("not_a_layout", spec_with(layout="block_paged"), "layout"),
        ("bad_element_type", spec_with(element_type="float17"), "element_type"),
        ("member_role_2", spec_with(composite_member=2), "composite_member.member_role"),
        ("statistics_type", spec_with(statistics={"nnz": 1}), "statistics"),
        ("statistics_mask", lambda: hw.Statistics(computed_mask=0x40), "statistics.computed_mask"),
        ("statistics_has_nan", lambda: hw.Statistics(has_nan=2), "statistics.has_nan"),
        ("not_a_quantization", spec_with(quantization="per_tensor"), "quantization"),
        (
            "zero_point_range",
            spec_with(element_type=hw.int8, quantization=hw.PerTensorAffine(1.0, 200)),
            "quantization.zero_point",
        ),
        ("fp8_per_block", pba_with(element_type=hw.float8_e4m3), "type_tag"),
        ("per_block_axis", pba_quant_with(axis=1), "quantization.axis"),
        ("per_block_size", pba_quant_with(block_size=8), "quantization.block_size"),
        ("scale_index_5", pba_quant_with(scale_buffer_index=5), "quantization.scale_buffer_index"),
        (
            "per_channel_axis_0",
            lambda: hw.TensorDescriptor.block_paged(
                _layout(), [9, 2, 8], hw.int8, num_logical_pages=3, quantization=per_channel_0
            ),
            "quantization.axis",
        ),
    ]


BAD_DESCRIPTORS = _bad_descriptors()


@pytest.mark.parametrize(
    ("build", "field"), [c[1:] for c in BAD_DESCRIPTORS], ids=[c[0] for c in BAD_DESCRIPTORS]
)
def test_model_refuses_a_bad_descriptor(build: Callable[[], object], field: str | None) -> None:
    with pytest.raises(hw.errors.InvalidDescriptorError) as info:
        build()
    assert info.value.field == field


@pytest.mark.parametrize(
    "quantization",
    [hw.NF4(0, 8, 3), hw.NF4(0, 64, 3), hw.MXFP(0, 32, 3), hw.MXFP(2, 16, 3)],
    ids=["nf4_8", "nf4_64", "mxfp_32", "mxfp_axis2"],
)
def test_model_refuses_nf4_and_mxfp_on_block_paged(quantization: hw.Quantization) -> None:
    storage = (
        hw.uint4
        if isinstance(quantization, hw.NF4) and not isinstance(quantization, hw.MXFP)
        else hw.float8_e4m3
    )
    with pytest.raises(hw.errors.QuantizationNotDefinedError):
        hw.TensorDescriptor.block_paged(
            _layout(), [9, 2, 8], storage, num_logical_pages=3, quantization=quantization
        )
    with pytest.raises(hw.errors.QuantizationNotDefinedError):
        _layout().validate_quantization_compatibility(quantization)
    spec = _spec()
    with pytest.raises(hw.errors.QuantizationNotDefinedError):
        dataclasses.replace(
            spec, element_type=storage, quantization=quantization,
            buffers=(*spec.buffers, hw.BufferHandle(80)),
        )  # fmt: skip


def test_encoder_refuses_what_is_not_a_descriptor() -> None:
    with pytest.raises(hw.errors.ArgumentTypeError):
        hw.encode_descriptor(SPEC)  # type: ignore[arg-type]


@pytest.mark.parametrize("data", ["HRRY", 133, None, [1, 2, 3]])
def test_decoder_refuses_what_is_not_bytes(data: object) -> None:
    for decode in (hw.decode_descriptor, hw.decode_header):
        with pytest.raises(hw.errors.ArgumentTypeError):
            decode(data)


def test_model_with_a_one_shot_shape_raises_our_error_or_works() -> None:
    spec = _spec()
    try:
        desc = hw.TensorDescriptor(spec.element_type, iter((9, 2, 8)), spec.layout, spec.buffers)  # type: ignore[arg-type]
    except hw.HurrayWireError:
        return
    assert desc.shape == (9, 2, 8)


def test_model_with_buffers_none_raises_our_error() -> None:
    spec = _spec()
    with pytest.raises(hw.HurrayWireError):
        hw.TensorDescriptor(spec.element_type, spec.shape, spec.layout, None)  # type: ignore[arg-type]


def test_model_refuses_element_type_none() -> None:
    with pytest.raises(hw.errors.InvalidDescriptorError):
        hw.TensorDescriptor.block_paged(_layout(), [9, 2, 8], None, num_logical_pages=3)


# == 12. The general path's offsets ============================================================


@pytest.mark.parametrize(
    ("position", "fmt", "value", "field"),
    [(5, "B", 2, "quantization.scheme_version"), (6, "H", 0x8001, "quantization.flags"),
     (12, "I", 3, "quantization.block_size")],
)  # fmt: skip
def test_decode_header_quantization_errors_carry_absolute_offsets(
    position: int, fmt: str, value: int, field: str
) -> None:
    q = quant_at(PBA_SYM)
    with pytest.raises(hw.errors.InvalidDescriptorError) as info:
        hw.decode_header(put(PBA_SYM, q + position, fmt, value))
    assert info.value.field == field
    assert info.value.offset in (None, q + position)
