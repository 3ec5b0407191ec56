"""Byte-for-byte agreement with the conformance vectors in fixtures/conformance/."""

from __future__ import annotations

from typing import Any

import pytest

import hurray_wire as hw
from tests.conftest import BLOCK_PAGED, REFERENCE, load_manifest

BP = load_manifest(BLOCK_PAGED)
REF = load_manifest(REFERENCE)


def _check_params(desc: hw.TensorDescriptor, params: dict[str, Any]) -> None:
    assert desc.element_type.name == params["element_type"]
    assert desc.element_type.tag == params["element_type_tag"]
    assert list(desc.shape) == params["shape"]
    assert desc.total_tokens == params["total_tokens"]
    assert desc.num_heads == params["num_heads"]
    assert desc.head_dim == params["head_dim"]
    layout = desc.layout
    assert layout.page_size == params["page_size"]
    assert layout.num_pages == params["num_pages"]
    assert layout.num_seqs == params["num_seqs"]
    assert layout.paged_axis == params["paged_axis"]
    assert layout.kv_role == params["kv_role"]
    assert layout.layer_index == params["layer_index"]
    assert layout.block_table_index_type == params["block_table_index_type"]
    assert list(desc.buffer_names) == params["buffer_names"]
    assert [h.byte_size for h in desc.buffers] == params["buffer_byte_sizes"]
    for handle, expected in zip(desc.buffers, params["buffer_handles"], strict=True):
        assert handle.byte_size == expected["byte_size"]
        assert handle.alignment == expected["alignment"]
        assert handle.device_tag == expected["device_tag"]
        assert handle.sync_mode == expected["sync_mode"]
        assert handle.memory_class == expected["memory_class"]
    assert (desc.statistics is not None) == params["has_statistics"]
    quant = params["quantization"]
    if quant is None:
        assert desc.quantization is None
    else:
        _check_quantization(desc.quantization, quant)
    assert desc.num_logical_pages == len(params["block_table"])


def _check_quantization(q: hw.Quantization | None, expected: dict[str, Any]) -> None:
    assert q is not None
    assert q.scheme_tag == expected["scheme_tag"]
    for key, value in expected.items():
        if key in ("axis", "block_size", "scale_buffer_index", "zero_point", "scale"):
            assert getattr(q, key) == pytest.approx(value)
        elif key == "zero_point_buffer_index":
            assert getattr(q, key) == (None if value in (None, 0xFFFFFFFF) else value)
        elif key == "scale_type":
            assert isinstance(q, (hw.PerChannelAffine, hw.PerBlockAffine))
            assert q.scale_type.name == value


@pytest.mark.parametrize("case", BP["descriptors"], ids=lambda case: case["name"])
def test_block_paged_vector_decodes_and_reencodes(case: dict[str, Any]) -> None:
    data = (BLOCK_PAGED / case["file"]).read_bytes()
    assert data.hex() == case["expect"]["hex"]
    desc = hw.decode_descriptor(data)
    assert desc.descriptor_length == case["expect"]["descriptor_length"] == len(data)
    assert desc.version == (case["expect"]["version_major"], case["expect"]["version_minor"])
    assert desc.flags == case["expect"]["flags"]
    assert desc.layout_tag == case["expect"]["layout_tag"]
    start = case["expect"]["layout_payload_offset"]
    assert data[start : start + 32].hex() == case["expect"]["layout_payload_hex"]
    _check_params(desc, case["params"])
    assert hw.encode_descriptor(desc) == data


@pytest.mark.parametrize("case", BP["descriptors"], ids=lambda case: case["name"])
def test_block_paged_vector_rebuilt_from_params(case: dict[str, Any]) -> None:
    """Building the descriptor from the manifest's parameters gives the same bytes."""
    params = case["params"]
    desc = hw.decode_descriptor((BLOCK_PAGED / case["file"]).read_bytes())
    handle = params["buffer_handles"][0]
    rebuilt = hw.TensorDescriptor.block_paged(
        hw.BlockPagedLayout(
            params["page_size"], params["num_pages"], 0, params["num_seqs"], params["kv_role"],
            params["layer_index"], params["block_table_index_type"],
        ),
        params["shape"],
        params["element_type"],
        num_logical_pages=len(params["block_table"]),
        quantization=desc.quantization,
        alignment=handle["alignment"],
        device_tag=handle["device_tag"],
        sync_mode=handle["sync_mode"],
        memory_class=handle["memory_class"],
        statistics=desc.statistics,
    )  # fmt: skip
    if any(h["alignment"] != handle["alignment"] for h in params["buffer_handles"]):
        pytest.skip("handles with differing alignments are not derivable from one alignment")
    assert hw.encode_descriptor(rebuilt) == bytes.fromhex(case["expect"]["hex"])


@pytest.mark.parametrize("case", BP["tolerant_descriptors"], ids=lambda case: case["name"])
def test_tolerant_descriptor_is_accepted(case: dict[str, Any]) -> None:
    data = (BLOCK_PAGED / case["file"]).read_bytes()
    desc = hw.decode_descriptor(data)
    assert desc.version == (1, 1)
    assert desc.unknown_trailing.hex() == case["trailing_hex"]
    assert desc.descriptor_length == len(data)
    _check_params(desc, case["params"])
    assert hw.encode_descriptor(desc) == data  # kept losslessly


@pytest.mark.parametrize("case", BP["invalid_descriptors"], ids=lambda case: case["name"])
def test_invalid_vector_is_rejected(case: dict[str, Any]) -> None:
    data = (BLOCK_PAGED / case["file"]).read_bytes()
    assert data.hex() == case["hex"]
    with pytest.raises(hw.errors.InvalidDescriptorError) as info:
        hw.decode_descriptor(data)
    assert info.value.offset is not None, "every descriptor error names its byte offset"


@pytest.mark.parametrize("case", REF["descriptors"], ids=lambda case: case["file"])
def test_reference_vector_common_header(case: dict[str, Any]) -> None:
    data = (REFERENCE / case["file"]).read_bytes()
    header = hw.decode_header(data)
    expect = case["expect"]
    assert header.version_major == expect["version_major"]
    assert header.version_minor == expect["version_minor"]
    assert header.type_tag == expect["element_type_tag"]
    assert header.element_type is not None
    assert header.element_type.name == expect["element_type"]
    assert list(header.shape) == expect["shape"]
    assert header.byte_offset == expect["byte_offset"]
    assert header.layout_tag == expect["layout_tag"]
    assert list(header.buffer_byte_sizes) == expect["buffer_byte_sizes"]
    assert header.has_quantization == expect["has_quantization"]
    assert header.has_shard == expect["has_shard"]
    assert header.descriptor_length == len(data)


@pytest.mark.parametrize("case", REF["descriptors"], ids=lambda case: case["file"])
def test_reference_vector_is_unsupported_layout_not_invalid(case: dict[str, Any]) -> None:
    data = (REFERENCE / case["file"]).read_bytes()
    with pytest.raises(hw.errors.UnsupportedLayoutError) as info:
        hw.decode_descriptor(data)
    assert info.value.layout_tag == case["expect"]["layout_tag"]
    assert not isinstance(info.value, hw.errors.InvalidDescriptorError)


def test_block_paged_vectors_also_decode_through_the_general_path() -> None:
    for case in BP["descriptors"]:
        data = (BLOCK_PAGED / case["file"]).read_bytes()
        header = hw.decode_header(data)
        desc = hw.decode_descriptor(data)
        assert header.layout_name == "block_paged"
        assert header.buffers == desc.buffers
        assert header.quantization == desc.quantization
        assert header.statistics == desc.statistics
        assert header.layout_fields["page_size"] == desc.layout.page_size
        assert header.layout_fields["layer_index"] == desc.layout.layer_index


def test_decode_reads_exactly_descriptor_length_from_a_larger_buffer() -> None:
    data = (BLOCK_PAGED / "descriptors/bp_spec_example_f16_key_l3.bin").read_bytes()
    big = bytearray(b"\xaa" * 7 + data + b"\xff" * 100)
    desc = hw.decode_descriptor(memoryview(big)[7:])
    assert desc.descriptor_length == len(data)
    assert hw.encode_descriptor(desc) == data
