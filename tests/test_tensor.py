"""BlockPagedTensor.from_arrays: derivation, every refusal, gather and unpacking.

``from_arrays`` promises to check its arrays the way the blob decoder does, so a tensor
that exists encodes and decodes cleanly; the caller's arrays are never modified.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import hurray_wire as hw
from hurray_wire import dtypes
from tests.conftest import random_pool

PACKED = [t for t in dtypes.ELEMENT_TYPES if t.is_packed]
U32_MAX = 0xFFFFFFFF


def f16(*shape: int) -> np.ndarray:
    return np.arange(int(np.prod(shape)), dtype=np.float16).reshape(shape)


def build(pool: Any = None, block_table: Any = (0, 1, 0), seq_ptr: Any = (0, 2, 3),
          **kw: Any) -> hw.BlockPagedTensor:  # fmt: skip
    pool = f16(5, 4, 2, 8) if pool is None else pool
    return hw.BlockPagedTensor.from_arrays(pool, list(block_table), list(seq_ptr), **kw)


# -- what from_arrays derives -----------------------------------------------------------------


def test_spec_example_descriptor() -> None:
    tensor = build(seq_lens=[6, 3], layer_index=3)
    layout = tensor.layout
    assert tensor.shape == (9, 2, 8)
    assert (layout.page_size, layout.num_pages, layout.num_seqs) == (4, 5, 2)
    assert tensor.kv_role == "key" and tensor.layer_index == 3
    assert tensor.element_type == dtypes.float16
    assert tensor.quantization is None
    assert [h.byte_size for h in tensor.descriptor.buffers] == [640, 12, 12]
    assert all(h.alignment == 64 for h in tensor.descriptor.buffers)
    assert tensor.block_table.dtype == np.dtype("<u4") and tensor.seq_ptr.dtype == np.dtype("<u4")
    assert tensor.seq_lens is not None and tensor.seq_lens.dtype == np.dtype("<u8")
    assert tensor.nbytes == 664
    assert tensor.metadata == {}
    assert "float16" in repr(tensor)


def test_total_tokens_defaults() -> None:
    assert build().shape[0] == 12  # every page full without seq_lens
    assert build(seq_lens=[5, 1]).shape[0] == 6
    assert build(total_tokens=10).shape[0] == 10
    assert build(seq_lens=[6, 3], total_tokens=9).shape[0] == 9


def test_direct_construction_is_refused() -> None:
    with pytest.raises(TypeError):
        hw.BlockPagedTensor()


@pytest.mark.parametrize("role", ["key", "value", "fused"])
@pytest.mark.parametrize("layer", [None, 0, 7, U32_MAX - 1])
def test_roles_and_layers(role: str, layer: int | None) -> None:
    tensor = build(kv_role=role, layer_index=layer)
    assert tensor.kv_role == role and tensor.layer_index == layer


def test_element_type_by_name_and_object() -> None:
    pool = f16(5, 4, 2, 8)
    assert build(pool, element_type="float16").element_type == dtypes.float16
    assert build(pool, element_type=dtypes.float16).element_type == dtypes.float16
    bf = pool.astype(dtypes.bfloat16.numpy_dtype)
    assert build(bf).element_type == dtypes.bfloat16


# -- refusals ---------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(5, 4, 16), (5, 64), (640,), (5, 4, 2, 8, 1), ()])
def test_page_pool_must_be_4d(shape: tuple[int, ...]) -> None:
    with pytest.raises(hw.errors.InvalidTensorError) as info:
        build(np.zeros(shape, np.float16))
    assert info.value.field == "page_pool"


def test_page_pool_dtype_must_match_element_type() -> None:
    with pytest.raises(hw.errors.InvalidTensorError) as info:
        build(f16(5, 4, 2, 8), element_type="float32")
    assert info.value.field == "page_pool"
    assert "float32" in str(info.value) and "float16" in str(info.value)
    with pytest.raises(hw.errors.InvalidTensorError):
        build(np.zeros((5, 4, 2, 8), np.uint8), element_type="int4")  # pass unpacked values


@pytest.mark.parametrize("dtype", ["U1", object, ">f2", "m8[s]"])
def test_page_pool_dtype_without_element_type(dtype: Any) -> None:
    with pytest.raises(hw.HurrayWireError):
        build(np.zeros((5, 4, 2, 8), dtype))


def test_strided_pools_give_only_their_referenced_pages() -> None:
    """A strided pool is never copied whole: the pages the table names, in first-reference
    order (block table 3, 1, 3 -> pages [3, 1] renumbered 0, 1, 0), same tokens."""
    base = f16(5, 4, 2, 16)
    for pool in (base[..., ::2], np.asfortranarray(base[..., :8]), base[::-1, :, :, :8]):
        assert not pool.flags.c_contiguous
        before = pool.copy()
        tensor = build(pool, block_table=(3, 1, 3), seq_lens=[8, 3])
        assert tensor.page_pool.flags.c_contiguous
        assert not np.shares_memory(tensor.page_pool, base)
        assert tensor.layout.num_pages == 2 and tensor.block_table.tolist() == [0, 1, 0]
        assert np.array_equal(tensor.page_pool, pool[[3, 1]])
        whole = build(np.ascontiguousarray(pool), block_table=(3, 1, 3), seq_lens=[8, 3])
        for seq in (0, 1):
            assert np.array_equal(tensor.sequence(seq), whole.sequence(seq))
        np.testing.assert_array_equal(pool, before)
        assert hw.decode(hw.encode(tensor)).page_pool.tobytes() == pool[[3, 1]].tobytes()
    with pytest.raises(hw.errors.IndexBufferError) as info:  # checked before any page is read
        build(base[..., ::2], block_table=(0, 5, 0))
    assert (info.value.field, info.value.found) == ("block_table", 5)
    strided = np.array([0, 9, 1, 9, 0], np.uint32)[::2]
    tensor = build(block_table=strided)
    assert tensor.block_table.tolist() == [0, 1, 0] and tensor.block_table.flags.c_contiguous


def test_contiguous_inputs_are_shared() -> None:
    pool = f16(5, 4, 2, 8)
    bt = np.array([0, 1, 0], np.uint32)
    sp = np.array([0, 2, 3], np.uint32)
    tensor = hw.BlockPagedTensor.from_arrays(pool, bt, sp)
    assert np.shares_memory(tensor.page_pool, pool)
    assert np.shares_memory(tensor.block_table, bt)
    assert np.shares_memory(tensor.seq_ptr, sp)


def test_index_inputs_of_other_integer_dtypes() -> None:
    tensor = hw.BlockPagedTensor.from_arrays(
        f16(5, 4, 2, 8), np.array([0, 1, 0], ">i8"), np.array([0, 2, 3], np.int8)
    )
    assert tensor.block_table.dtype == np.dtype("<u4")
    assert tensor.block_table.tolist() == [0, 1, 0] and tensor.seq_ptr.tolist() == [0, 2, 3]


def test_index_type_uint64_when_asked() -> None:
    tensor = build(block_table_index_type="uint64")
    assert tensor.layout.block_table_index_type == "uint64"
    assert tensor.block_table.dtype == np.dtype("<u8") and tensor.seq_ptr.dtype == np.dtype("<u8")
    assert [h.byte_size for h in tensor.descriptor.buffers] == [640, 24, 24]
    decoded = hw.decode(hw.encode(tensor))
    assert decoded.block_table.dtype == np.dtype("<u8")


def test_index_type_default_is_uint32() -> None:
    # the auto switch to uint64 needs > 2^32 - 1 pages or block-table entries: impractical
    # to allocate, so only the default is checked here
    assert build().layout.block_table_index_type == "uint32"


@pytest.mark.parametrize("index_type", [None, "uint32"])
def test_values_that_do_not_fit_uint32_are_refused(index_type: str | None) -> None:
    with pytest.raises(hw.errors.IndexBufferError) as info:
        build(block_table=[0, U32_MAX + 1, 0], block_table_index_type=index_type)
    assert info.value.field == "block_table"
    with pytest.raises(hw.errors.IndexBufferError) as info:
        build(seq_ptr=[0, 2, U32_MAX + 1], block_table_index_type=index_type)
    assert info.value.field == "seq_ptr"


def test_uint64_values_reach_the_pool_bound() -> None:
    # with uint64 the value fits the type, and is then refused as a page id
    with pytest.raises(hw.errors.IndexBufferError) as info:
        build(block_table=[0, U32_MAX + 1, 0], block_table_index_type="uint64")
    assert "num_pages" in str(info.value)


@pytest.mark.parametrize("index_type", ["uint16", "int32", "", "u4"])
def test_unknown_index_type(index_type: str) -> None:
    with pytest.raises(hw.errors.InvalidDescriptorError):
        build(block_table_index_type=index_type)


@pytest.mark.parametrize(
    ("block_table", "seq_ptr"),
    [
        ([-1, 1, 0], [0, 2, 3]),
        ([0.0, 1.0, 0.0], [0, 2, 3]),
        ([True, False, True], [0, 2, 3]),
        ([[0, 1, 0]], [0, 2, 3]),
        ([0, 1, 0], []),
        ([0, 1, 0], [1, 2, 3]),  # seq_ptr[0] != 0
        ([0, 1, 0], [0, 3, 2]),  # decreasing
        ([0, 1, 0], [0, 2, 2]),  # last != len(block_table)
        ([0, 1, 0], [0, 2, 4]),
        ([0, 5, 0], [0, 2, 3]),  # page id == num_pages
        ([0, 1, 2**64], [0, 2, 3]),
        (["0", "1", "0"], [0, 2, 3]),
    ],
)
def test_index_arrays_refused(block_table: Any, seq_ptr: Any) -> None:
    with pytest.raises(hw.errors.IndexBufferError):
        hw.BlockPagedTensor.from_arrays(f16(5, 4, 2, 8), block_table, seq_ptr)


def test_empty_pool_needs_empty_block_table() -> None:
    tensor = hw.BlockPagedTensor.from_arrays(np.zeros((0, 4, 2, 8), np.float16), [], [0, 0])
    assert tensor.num_seqs == 1 and tensor.shape[0] == 0
    with pytest.raises(hw.errors.IndexBufferError):
        hw.BlockPagedTensor.from_arrays(np.zeros((0, 4, 2, 8), np.float16), [0], [0, 1])


@pytest.mark.parametrize(
    ("kwargs", "exc"),
    [
        ({"kv_role": "query"}, hw.errors.InvalidDescriptorError),
        ({"kv_role": 0}, hw.errors.InvalidDescriptorError),
        ({"layer_index": U32_MAX}, hw.errors.InvalidDescriptorError),
        ({"layer_index": -1}, hw.errors.InvalidDescriptorError),
        ({"alignment": 3}, hw.errors.InvalidDescriptorError),
        ({"alignment": 32}, hw.errors.InvalidDescriptorError),
        ({"total_tokens": 13}, hw.errors.InvalidDescriptorError),  # beyond 3 pages x 4
    ],
)
def test_layout_arguments_refused(kwargs: dict[str, Any], exc: type[Exception]) -> None:
    with pytest.raises(exc):
        build(**kwargs)


def test_page_size_zero_refused() -> None:
    with pytest.raises(hw.errors.InvalidDescriptorError):
        build(np.zeros((5, 0, 2, 8), np.float16), [], [0])


# -- seq_lens ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seq_lens", "extra"),
    [
        ([6], {}),  # one entry per sequence
        ([6, 3, 0], {}),
        ([6, 3], {"total_tokens": 10}),  # sum != shape[0]
        ([4, 3], {}),  # sequence 0: 4 tokens need 1 page, it has 2
        ([9, 3], {}),  # 9 tokens need 3 pages
        ([6, 0], {}),  # 0 tokens need 0 pages, sequence 1 has 1
        ([6, 5], {}),
        ([-6, 3], {}),
        ([6.0, 3.0], {}),
        ([[6, 3]], {}),
        ([2**64, 3], {}),
        ([2**63, 2**63 + 9], {}),  # wraps to 9 in uint64
    ],
)
def test_seq_lens_refused(seq_lens: Any, extra: dict[str, Any]) -> None:
    with pytest.raises(hw.HurrayWireError) as info:
        build(seq_lens=seq_lens, **extra)
    assert isinstance(info.value, (hw.errors.IndexBufferError, hw.errors.InvalidDescriptorError))


@pytest.mark.parametrize("seq_lens", [[5, 1], [8, 4], [6, 3], [7, 2]])
def test_seq_lens_accepted(seq_lens: list[int]) -> None:
    tensor = build(seq_lens=np.array(seq_lens, np.int16))
    assert tensor.seq_lens is not None and tensor.seq_lens.tolist() == seq_lens
    assert tensor.shape[0] == sum(seq_lens)


def test_seq_lens_with_an_empty_sequence() -> None:
    tensor = build(block_table=[0, 1], seq_ptr=[0, 0, 2], seq_lens=[0, 5])
    assert tensor.gather_sequence(0).shape == (0, 2, 8)
    assert tensor.gather_sequence(1).shape == (5, 2, 8)


# -- quantization arrays ----------------------------------------------------------------------

I8 = np.zeros((5, 4, 2, 8), np.int8)
PBA_SYM = hw.PerBlockAffine.symmetric(0, 4, 3, dtypes.float16)
PBA_ASYM = hw.PerBlockAffine.asymmetric(0, 4, 3, 4, dtypes.bfloat16)
PBA_SHARED = hw.PerBlockAffine.asymmetric(0, 4, 3, 3, dtypes.float32)
PCH_SYM = hw.PerChannelAffine.symmetric(2, 3)
PCH_ASYM = hw.PerChannelAffine.asymmetric(1, 3, 4)
BF16 = dtypes.bfloat16.numpy_dtype


@pytest.mark.parametrize(
    ("quant", "scales", "zero_points", "buffers"),
    [
        (PBA_SYM, np.ones(20, np.float16), None, [320, 12, 12, 40]),
        (PBA_ASYM, np.ones(20, BF16), np.zeros(20, np.int32), [320, 12, 12, 40, 80]),
        (PBA_SHARED, np.ones(20, np.float32), np.zeros(20, np.int32), [320, 12, 12, 160]),
        (PCH_SYM, np.ones(8, np.float32), None, [320, 12, 12, 32]),
        (PCH_ASYM, np.ones(2, np.float32), np.zeros(2, np.int32), [320, 12, 12, 8, 8]),
        (hw.PerTensorAffine(0.5, 3), None, None, [320, 12, 12]),
    ],
)
def test_quantization_arrays_accepted(quant: Any, scales: Any, zero_points: Any,
                                      buffers: list[int]) -> None:  # fmt: skip
    tensor = build(I8, quantization=quant, scales=scales, zero_points=zero_points)
    assert [h.byte_size for h in tensor.descriptor.buffers] == buffers
    assert tensor.quantization == quant
    assert (tensor.scales is None) == (scales is None)
    if scales is not None:
        assert tensor.scales is not None and tensor.scales.dtype == scales.dtype
    assert hw.decode(hw.encode(tensor)).quantization == quant


def test_quantization_scales_may_be_shaped() -> None:
    tensor = build(I8, quantization=PBA_SYM, scales=np.ones((5, 4), np.float16))
    assert tensor.scales is not None and tensor.scales.shape == (20,)


@pytest.mark.parametrize(
    ("quant", "scales", "zero_points", "field"),
    [
        (PBA_SYM, None, None, "scales"),  # missing
        (PBA_SYM, np.ones(19, np.float16), None, "scales"),  # wrong size
        (PBA_SYM, np.ones(21, np.float16), None, "scales"),
        (PBA_SYM, np.ones(20, np.float32), None, "scales"),  # wrong dtype
        (PBA_SYM, [1.0] * 20, None, "scales"),  # a list is float64
        (PBA_SYM, np.ones(20, np.float16), np.zeros(20, np.int32), "zero_points"),  # extra
        (PBA_ASYM, np.ones(20, BF16), None, "zero_points"),  # missing
        (PBA_ASYM, np.ones(20, BF16), np.zeros(20, np.int64), "zero_points"),
        (PBA_ASYM, np.ones(20, BF16), np.zeros(10, np.int32), "zero_points"),
        (PBA_ASYM, np.ones(20, np.float16), np.zeros(20, np.int32), "scales"),
        (PCH_SYM, np.ones(2, np.float32), None, "scales"),  # axis 2 has 8 channels
        (PCH_SYM, np.ones(8, np.float64), None, "scales"),
        (PCH_ASYM, np.ones(2, np.float32), np.zeros(2, np.uint32), "zero_points"),
        (hw.PerTensorAffine(0.5), np.ones(1, np.float32), None, "scales"),  # no buffers
        (None, np.ones(20, np.float16), None, "scales"),
        (None, None, np.zeros(20, np.int32), "scales"),
    ],
)
def test_quantization_arrays_refused(quant: Any, scales: Any, zero_points: Any,
                                     field: str) -> None:  # fmt: skip
    with pytest.raises(hw.errors.InvalidTensorError) as info:
        build(I8, quantization=quant, scales=scales, zero_points=zero_points)
    assert info.value.field == field


@pytest.mark.parametrize(
    ("pool", "quant", "scales", "exc"),
    [
        (f16(5, 4, 2, 8), PBA_SYM, np.ones(20, np.float16), hw.errors.InvalidDescriptorError),
        (np.zeros((5, 4, 2, 8), dtypes.float8_e4m3.numpy_dtype), PBA_SYM,
         np.ones(20, np.float16), hw.errors.InvalidDescriptorError),
        (I8, hw.PerBlockAffine.symmetric(0, 8, 3, dtypes.float16), np.ones(20, np.float16),
         hw.errors.InvalidDescriptorError),
        (I8, hw.PerBlockAffine.symmetric(1, 4, 3, dtypes.float16), np.ones(20, np.float16),
         hw.errors.InvalidDescriptorError),
        (I8, hw.PerChannelAffine.symmetric(0, 3), np.ones(20, np.float32),
         hw.errors.InvalidDescriptorError),
        (I8, hw.PerChannelAffine.symmetric(1, 1), np.ones(2, np.float32),
         hw.errors.InvalidDescriptorError),
        (I8, hw.PerChannelAffine.symmetric(1, 5), np.ones(2, np.float32),
         hw.errors.InvalidDescriptorError),
        (np.zeros((5, 4, 2, 8), dtypes.uint4.numpy_dtype), hw.NF4(0, 64, 3),
         np.ones(2, np.float32), hw.errors.QuantizationNotDefinedError),
    ],
)  # fmt: skip
def test_quantization_schemes_refused(pool: Any, quant: Any, scales: Any,
                                      exc: type[Exception]) -> None:  # fmt: skip
    with pytest.raises(exc):
        build(pool, quantization=quant, scales=scales)


# -- gather_sequence and unpacked_page_pool ---------------------------------------------------


def test_gather_sequence_prefix_sharing() -> None:
    pool = f16(6, 4, 2, 8)
    tensor = build(pool, [3, 1, 4, 3, 1, 5], [0, 3, 6])
    a, b = tensor.gather_sequence(0), tensor.gather_sequence(1)
    assert a.shape == b.shape == (12, 2, 8)
    assert np.array_equal(a[:8], b[:8])  # the shared prefix: pages 3, 1
    assert not np.array_equal(a[8:], b[8:])
    assert np.array_equal(a[:4], pool[3]) and np.array_equal(b[8:], pool[5])
    assert tensor.sequence_pages(1).tolist() == [3, 1, 5]


def test_gather_sequence_trims_partial_pages() -> None:
    pool = f16(5, 4, 2, 8)
    tensor = build(pool, seq_lens=[6, 3])
    s0, s1 = tensor.gather_sequence(0), tensor.gather_sequence(1)
    assert s0.shape == (6, 2, 8) and s1.shape == (3, 2, 8)
    assert np.array_equal(s0, np.concatenate([pool[0], pool[1]])[:6])
    assert np.array_equal(s1, pool[0, :3])
    assert np.array_equal(s0[:3], s1)  # the shared page
    untrimmed = build(pool)
    assert untrimmed.gather_sequence(0).shape == (8, 2, 8)


def test_gather_sequence_out_of_range() -> None:
    tensor = build()
    for seq in (-1, 2, 100):
        with pytest.raises(hw.errors.InvalidTensorError):
            tensor.gather_sequence(seq)
        with pytest.raises(hw.errors.InvalidTensorError):
            tensor.sequence_pages(seq)


def test_gather_sequence_returns_a_copy() -> None:
    pool = f16(5, 4, 2, 8)
    tensor = build(pool)
    tokens = tensor.gather_sequence(0)
    tokens[...] = 0
    assert np.array_equal(pool, f16(5, 4, 2, 8))


@pytest.mark.parametrize("etype", PACKED, ids=lambda t: t.name)
@pytest.mark.parametrize("shape", [(5, 4, 2, 8), (3, 1, 1, 3), (2, 3, 1, 5), (0, 4, 2, 8)])
def test_unpacked_page_pool_equals_input(etype: hw.ElementType, shape: tuple[int, ...]) -> None:
    pool = random_pool(etype, shape, seed=etype.tag)
    before = pool.copy()
    bt, sp = ([0], [0, 1]) if shape[0] else ([], [0])
    tensor = hw.BlockPagedTensor.from_arrays(pool, bt, sp)
    assert tensor.page_pool.dtype == np.uint8 and tensor.page_pool.ndim == 1
    assert tensor.page_pool.nbytes == tensor.descriptor.buffers[0].byte_size
    assert tensor.page_pool.nbytes == etype.byte_size(int(np.prod(shape)))
    unpacked = tensor.unpacked_page_pool()
    assert unpacked.dtype == pool.dtype and unpacked.shape == pool.shape
    assert unpacked.view(np.uint8).tobytes() == pool.view(np.uint8).tobytes()
    decoded = hw.decode(hw.encode(tensor)).unpacked_page_pool()
    assert decoded.view(np.uint8).tobytes() == pool.view(np.uint8).tobytes()
    np.testing.assert_array_equal(pool.view(np.uint8), before.view(np.uint8))
    if shape[0]:
        assert (
            tensor.gather_sequence(0).view(np.uint8).tobytes() == pool[0].view(np.uint8).tobytes()
        )


def test_packing_bit_order() -> None:
    """descriptor.md § 4: bool LSB first, 4-bit low nibble first, 6-bit 4-in-3."""
    bools = np.array([1, 0, 0, 0, 0, 0, 0, 1] * 2, bool).reshape(1, 2, 1, 8)
    assert hw.BlockPagedTensor.from_arrays(bools, [], [0]).page_pool.tolist() == [0x81, 0x81]
    nibbles = np.array([1, 2, 3, 4], np.uint8).view(dtypes.uint4.numpy_dtype).reshape(1, 1, 1, 4)
    assert hw.BlockPagedTensor.from_arrays(nibbles, [], [0]).page_pool.tolist() == [0x21, 0x43]
    sixes = np.array([1, 2, 3, 4], np.uint8).view(dtypes.float6_e2m3.numpy_dtype)
    packed = hw.BlockPagedTensor.from_arrays(sixes.reshape(1, 1, 1, 4), [], [0]).page_pool
    word = 1 | 2 << 6 | 3 << 12 | 4 << 18
    assert packed.tolist() == list(word.to_bytes(3, "little"))


def test_unpacked_page_pool_of_unpacked_type_is_the_pool() -> None:
    tensor = build()
    assert tensor.unpacked_page_pool() is tensor.page_pool


# -- the caller's arrays ----------------------------------------------------------------------


def test_callers_arrays_untouched() -> None:
    pool = random_pool(dtypes.int4, (5, 4, 2, 8))
    bt = np.array([0, 1, 0], np.int64)
    sp = np.array([0, 2, 3], np.int32)
    lens = np.array([6, 3], np.int64)
    scales = np.full(20, 0.5, np.float32)
    zps = np.arange(20, dtype=np.int32)
    metadata = {"a": [1, 2]}
    originals = [a.copy() for a in (pool, bt, sp, lens, scales, zps)]
    flags = [a.flags.writeable for a in (pool, bt, sp, lens, scales, zps)]
    tensor = hw.BlockPagedTensor.from_arrays(
        pool, bt, sp, seq_lens=lens, quantization=hw.PerBlockAffine.asymmetric(
            0, 4, 3, 4, dtypes.float32), scales=scales, zero_points=zps, metadata=metadata,
    )  # fmt: skip
    blob = hw.encode(tensor, compression="default")
    hw.encode_parts(tensor)
    decoded = hw.decode(blob)
    decoded.unpacked_page_pool()
    decoded.gather_sequence(0)
    tensor.gather_sequence(1)
    arrays: list[np.ndarray[Any, Any]] = [pool, bt, sp, lens, scales, zps]
    for array, original, writable in zip(arrays, originals, flags, strict=True):
        assert array.tobytes() == original.tobytes() and array.dtype == original.dtype
        assert array.flags.writeable == writable
    assert metadata == {"a": [1, 2]}
    tensor.metadata["b"] = 1
    assert "b" not in metadata  # the tensor holds its own dict


def test_index_lists_are_not_modified() -> None:
    bt, sp, lens = [0, 1, 0], [0, 2, 3], [6, 3]
    build(block_table=bt, seq_ptr=sp, seq_lens=lens)
    assert (bt, sp, lens) == ([0, 1, 0], [0, 2, 3], [6, 3])


@pytest.mark.parametrize("metadata", [{"a": {1}}, {"": 1}, {1: "x"}, {"a": []}])
def test_unencodable_metadata_refused_by_from_arrays(metadata: dict[Any, Any]) -> None:
    with pytest.raises(hw.HurrayWireError):
        build(metadata=metadata)


def test_from_arrays_reuses_the_validated_descriptor_of_equal_arguments() -> None:
    pool = np.zeros((4, 2, 1, 8), np.float16)
    first = hw.BlockPagedTensor.from_arrays(pool, [0, 1], [0, 2], layer_index=1)
    again = hw.BlockPagedTensor.from_arrays(pool.copy(), [1, 0], [0, 2], layer_index=1)
    assert again.descriptor is first.descriptor
    other = hw.BlockPagedTensor.from_arrays(pool, [0, 1], [0, 2], layer_index=2)
    assert other.descriptor is not first.descriptor and other.layer_index == 2
    # Equal values of another type are validated on their own: True is not layer 1.
    with pytest.raises(hw.HurrayWireError):
        hw.BlockPagedTensor.from_arrays(pool, [0, 1], [0, 2], layer_index=True)
    with pytest.raises(hw.HurrayWireError):
        hw.BlockPagedTensor.from_arrays(pool, [0, 1], [0, 2], kv_role=["key"])  # type: ignore[arg-type]
    numpy_layer = hw.BlockPagedTensor.from_arrays(pool, [0, 1], [0, 2], layer_index=np.int64(1))
    assert numpy_layer.layer_index == 1 and type(numpy_layer.layer_index) is int
