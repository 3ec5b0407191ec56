"""BlockPagedLayout, the quantization objects and the element types as Python values.

Layout: value semantics, every constructor error, ``index_dtype``, ``validate_against_shape``
and ``validate_index_buffers`` (block-paged.md §§ 2, 4, 8). Quantization: constructors, value
semantics, every field error, float32 rounding (descriptor.md § 8). Element types: the table
of descriptor.md § 4 (tag, name, bit width, NumPy dtype, byte sizes with [A27]).

Known bugs in files this test does not own are pinned by ``xfail(strict=True)`` tests whose
reason starts with ``BUG:``.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import pickle
import struct
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import hurray_wire as hw
from hurray_wire.model.layout import DYNAMIC_DIM, INDEX_TYPE_NAMES, KV_ROLE_NAMES

FIELDS = (
    "page_size",
    "num_pages",
    "paged_axis",
    "num_seqs",
    "kv_role",
    "layer_index",
    "block_table_index_type",
)


def layout(**changes: Any) -> hw.BlockPagedLayout:
    """The spec example's layout (P 4, N 5, S 2, key, layer 3, uint32) with changes."""
    fields: dict[str, Any] = dict(
        page_size=4,
        num_pages=5,
        paged_axis=0,
        num_seqs=2,
        kv_role="key",
        layer_index=3,
        block_table_index_type="uint32",
    )
    fields.update(changes)
    return hw.BlockPagedLayout(**fields)


def refused(
    error: type[hw.HurrayWireError], field: str | None, call: Any, *args: Any, **kw: Any
) -> Any:
    """``call(*args, **kw)`` raises ``error`` naming ``field``; returns the exception."""
    with pytest.raises(error) as info:
        call(*args, **kw)
    assert info.value.field == field, str(info.value)
    return info.value


# == BlockPagedLayout: value semantics =========================================================


def test_layout_fields_and_class_constants() -> None:
    value = layout()
    assert [getattr(value, name) for name in FIELDS] == [4, 5, 0, 2, "key", 3, "uint32"]
    assert (value.tag, value.name, value.buffer_count, value.is_dense) == (
        0x0A,
        "block_paged",
        3,
        False,
    )
    assert value.page_slots == 20
    assert value.index_max == 0xFFFFFFFF


def test_layout_defaults() -> None:
    value = hw.BlockPagedLayout(16, 100, 0, 3)
    assert (value.kv_role, value.layer_index, value.block_table_index_type) == (
        "key",
        None,
        "uint32",
    )


@pytest.mark.parametrize("name", [*FIELDS, "other", "_page_size"])
def test_layout_is_immutable(name: str) -> None:
    value = layout()
    with pytest.raises(AttributeError):
        setattr(value, name, 1)
    assert value == layout()


@pytest.mark.parametrize("name", FIELDS)
def test_layout_public_fields_cannot_be_deleted(name: str) -> None:
    value = layout()
    with pytest.raises(AttributeError):
        delattr(value, name)
    assert value == layout()


def test_layout_slots_cannot_be_deleted() -> None:
    """The layout's storage is exactly its fields' slots, and none of them can be deleted,
    not even through object.__delattr__'s generic path of the class."""
    assert set(hw.BlockPagedLayout.__slots__) == set(FIELDS)
    value = layout()
    for name in FIELDS:
        with pytest.raises(AttributeError):
            type(value).__delattr__(value, name)
    assert value.page_size == 4


def test_layout_has_no_instance_dict() -> None:
    assert not hasattr(layout(), "__dict__")


@pytest.mark.parametrize(
    "changes",
    [
        {"page_size": 8},
        {"num_pages": 6},
        {"num_seqs": 3},
        {"kv_role": "value"},
        {"kv_role": "fused"},
        {"layer_index": None},
        {"layer_index": 0},
        {"block_table_index_type": "uint64"},
    ],
    ids=lambda changes: "-".join(f"{k}={v}" for k, v in changes.items()),
)
def test_layout_equality_and_hash_by_value(changes: dict[str, Any]) -> None:
    assert layout() == layout()
    assert hash(layout()) == hash(layout())
    assert layout() != layout(**changes)
    assert len({layout(), layout(), layout(**changes)}) == 2


def test_layout_equality_with_other_types() -> None:
    assert layout() != (4, 5, 0, 2, "key", 3, "uint32")  # type: ignore[comparison-overlap]
    assert layout() != "BlockPagedLayout"  # type: ignore[comparison-overlap]
    assert layout().__eq__(object()) is NotImplemented


def test_layout_numpy_integers_equal_python_integers() -> None:
    value = hw.BlockPagedLayout(
        np.uint32(4), np.int64(5), np.uint8(0), np.uint16(2), layer_index=np.uint32(3)
    )
    assert value == hw.BlockPagedLayout(4, 5, 0, 2, layer_index=3)
    assert hash(value) == hash(hw.BlockPagedLayout(4, 5, 0, 2, layer_index=3))
    assert type(value.page_size) is int and type(value.num_pages) is int


def test_layout_repr_shows_every_field() -> None:
    text = repr(layout(layer_index=None, block_table_index_type="uint64", kv_role="fused"))
    assert text == (
        "BlockPagedLayout(page_size=4, num_pages=5, paged_axis=0, num_seqs=2, "
        "kv_role='fused', layer_index=None, block_table_index_type='uint64')"
    )
    for name in FIELDS:
        assert f"{name}=" in text


def test_layout_repr_evaluates_back() -> None:
    value = layout(layer_index=0xFFFFFFFE)
    assert eval(repr(value), {"BlockPagedLayout": hw.BlockPagedLayout}) == value


@pytest.mark.parametrize(
    "value",
    [layout(), layout(layer_index=None), layout(num_pages=2**40, block_table_index_type="uint64")],
)
def test_layout_pickle_and_copy_round_trip(value: hw.BlockPagedLayout) -> None:
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        clone = pickle.loads(pickle.dumps(value, protocol))
        assert clone == value and hash(clone) == hash(value)
        assert type(clone) is hw.BlockPagedLayout
    assert copy.copy(value) == value
    assert copy.deepcopy(value) == value


def test_layout_replace() -> None:
    value = layout()
    changed = value.replace(num_seqs=7, kv_role="value")
    assert changed == layout(num_seqs=7, kv_role="value")
    assert value == layout()  # the original is untouched
    with pytest.raises(hw.errors.InvalidDescriptorError):
        value.replace(page_size=0)


# == BlockPagedLayout: constructor errors ======================================================

INTEGER_FIELDS = {
    "page_size": (1, 0xFFFFFFFF),
    "num_pages": (0, 2**64 - 1),
    "num_seqs": (0, 0xFFFFFFFF),
    "layer_index": (0, 0xFFFFFFFE),
}


@pytest.mark.parametrize("name", [*INTEGER_FIELDS, "paged_axis"])
@pytest.mark.parametrize("value", [True, False, 1.0, 4.5, "4", None, [4], b"\x04", 1j])
def test_layout_integer_fields_refuse_non_integers(name: str, value: Any) -> None:
    if name == "layer_index" and value is None:
        return  # None is the "not layer-scoped" value
    refused(hw.errors.InvalidDescriptorError, name, layout, **{name: value})


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("page_size", 0),
        ("page_size", -1),
        ("page_size", 2**32),
        ("num_pages", -1),
        ("num_pages", 2**64),
        ("num_seqs", -1),
        ("num_seqs", 2**32),
        ("layer_index", -1),
        ("layer_index", 2**32),
        ("paged_axis", -1),
        ("paged_axis", 2**32),
    ],
)
def test_layout_integer_fields_out_of_range(name: str, value: int) -> None:
    changes: dict[str, Any] = {name: value}
    if name == "num_pages":
        changes["block_table_index_type"] = "uint64"
    exc = refused(hw.errors.InvalidDescriptorError, name, layout, **changes)
    assert exc.found == value


@pytest.mark.parametrize("name", INTEGER_FIELDS)
def test_layout_integer_fields_at_their_limits(name: str) -> None:
    low, high = INTEGER_FIELDS[name]
    extra: dict[str, Any] = {"block_table_index_type": "uint64"} if name == "num_pages" else {}
    assert getattr(layout(**{name: low}, **extra), name) == low
    assert getattr(layout(**{name: high}, **extra), name) == high


@pytest.mark.parametrize("axis", [1, 2, 3, 0xFFFFFFFF])
def test_layout_paged_axis_must_be_0(axis: int) -> None:
    exc = refused(hw.errors.InvalidDescriptorError, "paged_axis", layout, paged_axis=axis)
    assert exc.found == axis


def test_layout_layer_index_sentinel_is_refused_explicitly() -> None:
    exc = refused(hw.errors.InvalidDescriptorError, "layer_index", layout, layer_index=0xFFFFFFFF)
    assert "None" in str(exc)


def test_layout_layer_0_is_not_none() -> None:
    assert layout(layer_index=0).layer_index == 0
    assert layout(layer_index=0) != layout(layer_index=None)


@pytest.mark.parametrize("role", ["Key", "keys", "k", "", "kv", 0, 1, None, b"key"])
def test_layout_unknown_kv_role(role: Any) -> None:
    exc = refused(hw.errors.InvalidDescriptorError, "kv_role", layout, kv_role=role)
    assert exc.expected == KV_ROLE_NAMES


@pytest.mark.parametrize("role", KV_ROLE_NAMES)
def test_layout_kv_roles(role: str) -> None:
    assert layout(kv_role=role).kv_role == role


def test_layout_kv_role_array_raises_our_error() -> None:
    with pytest.raises(hw.errors.InvalidDescriptorError):
        layout(kv_role=np.array(["key", "value"]))


@pytest.mark.parametrize("index_type", ["int32", "uint16", "u4", "UINT32", "", 0, 1, None])
def test_layout_unknown_block_table_index_type(index_type: Any) -> None:
    exc = refused(
        hw.errors.InvalidDescriptorError,
        "block_table_index_type",
        layout,
        block_table_index_type=index_type,
    )
    assert exc.expected == INDEX_TYPE_NAMES


@pytest.mark.parametrize("num_pages", [2**32, 2**32 + 1, 2**64 - 1])
def test_layout_uint32_with_a_huge_pool(num_pages: int) -> None:
    exc = refused(hw.errors.InvalidDescriptorError, "num_pages", layout, num_pages=num_pages)
    assert exc.found == num_pages
    assert layout(num_pages=num_pages, block_table_index_type="uint64").num_pages == num_pages


def test_layout_uint32_with_exactly_0xffffffff_pages() -> None:
    assert layout(num_pages=0xFFFFFFFF).num_pages == 0xFFFFFFFF


# == index_dtype ===============================================================================


@pytest.mark.parametrize(
    ("index_type", "dtype", "maximum"),
    [("uint32", "<u4", 0xFFFFFFFF), ("uint64", "<u8", 2**64 - 1)],
)
def test_index_dtype(index_type: str, dtype: str, maximum: int) -> None:
    value = layout(block_table_index_type=index_type)
    assert value.index_dtype == np.dtype(dtype)
    assert value.index_dtype.byteorder in ("<", "=")
    assert value.index_dtype.str == dtype
    assert value.index_max == maximum


# == validate_against_shape ====================================================================


@pytest.mark.parametrize("shape", [[9, 2, 8], (0, 0, 0), (12, 1, 1), [np.uint64(9), 2, 8]])
def test_validate_against_shape_accepts(shape: Any) -> None:
    layout().validate_against_shape(shape)


@pytest.mark.parametrize("shape", [[], [9], [9, 2], [9, 2, 8, 1], [1] * 65])
def test_validate_against_shape_rank(shape: list[int]) -> None:
    exc = refused(hw.errors.InvalidDescriptorError, "rank", layout().validate_against_shape, shape)
    assert (exc.found, exc.expected) == (len(shape), 3)


@pytest.mark.parametrize("axis", range(3))
@pytest.mark.parametrize("bad", [-1, 2**64, 1.0, "9", None, True])
def test_validate_against_shape_dimension_values(axis: int, bad: Any) -> None:
    shape: list[Any] = [9, 2, 8]
    shape[axis] = bad
    refused(
        hw.errors.InvalidDescriptorError, f"shape[{axis}]", layout().validate_against_shape, shape
    )


@pytest.mark.parametrize("axis", range(3))
def test_validate_against_shape_dynamic_dimension(axis: int) -> None:
    shape = [9, 2, 8]
    shape[axis] = DYNAMIC_DIM
    refused(
        hw.errors.InvalidDescriptorError, f"shape[{axis}]", layout().validate_against_shape, shape
    )


@pytest.mark.parametrize("shape", [None, 5, 3.0])
def test_validate_against_shape_not_a_sequence(shape: Any) -> None:
    refused(hw.errors.InvalidDescriptorError, "shape", layout().validate_against_shape, shape)


def test_validate_against_shape_empty_batch_has_no_tokens() -> None:
    empty = layout(num_seqs=0)
    empty.validate_against_shape([0, 2, 8])
    exc = refused(
        hw.errors.InvalidDescriptorError, "shape[0]", empty.validate_against_shape, [1, 2, 8]
    )
    assert exc.found == 1


# == validate_index_buffers ====================================================================

SEQ_PTR = [0, 2, 3]
BLOCK_TABLE = [0, 1, 0]


def check(value: hw.BlockPagedLayout, seq_ptr: Any, block_table: Any) -> None:
    value.validate_index_buffers(seq_ptr=seq_ptr, block_table=block_table)


def index_error(value: hw.BlockPagedLayout, seq_ptr: Any, block_table: Any, field: str) -> Any:
    with pytest.raises(hw.errors.IndexBufferError) as info:
        check(value, seq_ptr, block_table)
    assert isinstance(info.value, hw.errors.InvalidDescriptorError)
    assert info.value.field == field, str(info.value)
    return info.value


def test_index_buffers_spec_example_with_a_shared_page() -> None:
    check(layout(), SEQ_PTR, BLOCK_TABLE)
    check(layout(), tuple(SEQ_PTR), tuple(BLOCK_TABLE))


INTEGER_DTYPES = [
    "int8",
    "uint8",
    "int16",
    "uint16",
    "<i4",
    ">i4",
    "<u4",
    ">u4",
    "<i8",
    "<u8",
    ">u8",
]


@pytest.mark.parametrize("table_dtype", INTEGER_DTYPES)
@pytest.mark.parametrize("ptr_dtype", INTEGER_DTYPES)
def test_index_buffers_every_integer_dtype(ptr_dtype: str, table_dtype: str) -> None:
    for index_type in INDEX_TYPE_NAMES:
        check(
            layout(block_table_index_type=index_type),
            np.array(SEQ_PTR, dtype=ptr_dtype),
            np.array(BLOCK_TABLE, dtype=table_dtype),
        )


@pytest.mark.parametrize("dtype", ["int8", "int16", "int32", "int64"])
def test_index_buffers_signed_negative_value(dtype: str) -> None:
    exc = index_error(layout(), SEQ_PTR, np.array([0, -1, 0], dtype=dtype), "block_table")
    assert exc.found == -1
    assert "position 1" in str(exc)
    exc = index_error(layout(), np.array([0, 2, -3], dtype=dtype), BLOCK_TABLE, "seq_ptr")
    assert exc.found == -3 and "position 2" in str(exc)


def test_index_buffers_negative_in_a_list() -> None:
    exc = index_error(layout(), SEQ_PTR, [0, 1, -5], "block_table")
    assert exc.found == -5 and "position 2" in str(exc)


@pytest.mark.parametrize("value", [2**32, 2**64, 2**100], ids=["2^32", "2^64", "2^100"])
def test_index_buffers_value_beyond_uint32(value: int) -> None:
    exc = index_error(layout(), [0, 2, 3], [0, value, 0], "block_table")
    assert str(exc.found) == str(value) and "position 1" in str(exc)
    exc = index_error(layout(), [0, value, 3], [0, 1, 0], "seq_ptr")
    assert str(exc.found) == str(value) and "position 1" in str(exc)


@pytest.mark.parametrize("value", [2**63, 2**64 - 1], ids=["2^63", "2^64-1"])
def test_index_buffers_list_value_beyond_int64_is_refused(value: int) -> None:
    index_error(layout(), [0, 2, 3], [0, value, 0], "block_table")


@pytest.mark.parametrize("value", [2**63, 2**64 - 1], ids=["2^63", "2^64-1"])
def test_index_buffers_list_value_beyond_int64_names_its_position(value: int) -> None:
    exc = index_error(layout(), [0, 2, 3], [0, value, 0], "block_table")
    assert str(exc.found) == str(value) and "position 1" in str(exc)


def test_index_buffers_value_beyond_uint32_in_an_array() -> None:
    table = np.array([0, 1, 2**32 + 7], dtype=np.uint64)
    exc = index_error(layout(), SEQ_PTR, table, "block_table")
    assert exc.found == 2**32 + 7 and "position 2" in str(exc)


def test_index_buffers_uint64_array_with_large_page_ids() -> None:
    wide = layout(block_table_index_type="uint64", num_pages=2**64 - 1)
    check(wide, SEQ_PTR, np.array([0, 2**64 - 2, 2**40], np.uint64))
    check(wide, SEQ_PTR, [2**64 - 2, 2**64 - 3, 2**63])  # all large: NumPy infers uint64
    exc = index_error(wide, SEQ_PTR, [0, 2**64, 0], "block_table")
    assert str(exc.found) == str(2**64)


def test_index_buffers_uint64_list_with_large_page_ids() -> None:
    wide = layout(block_table_index_type="uint64", num_pages=2**64 - 1)
    check(wide, SEQ_PTR, [0, 2**64 - 2, 2**40])


@pytest.mark.parametrize("shape", [(3, 1), (1, 3), (0, 0)])
def test_index_buffers_two_dimensional(shape: tuple[int, int]) -> None:
    arr = np.zeros(shape, dtype=np.uint32)
    index_error(layout(), SEQ_PTR, arr, "block_table")
    index_error(layout(), arr, BLOCK_TABLE, "seq_ptr")


def test_index_buffers_nested_list() -> None:
    index_error(layout(), [[0, 2, 3]], BLOCK_TABLE, "seq_ptr")
    index_error(layout(), SEQ_PTR, [[0, 1], [0]], "block_table")  # ragged


@pytest.mark.parametrize("scalar", [0, 3, "0,2,3", None, b"\x00\x02\x03"])
def test_index_buffers_not_an_array(scalar: Any) -> None:
    index_error(layout(), scalar, BLOCK_TABLE, "seq_ptr")


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "bool", "complex64", "U1"])
def test_index_buffers_non_integer_dtype(dtype: str) -> None:
    table = np.array(BLOCK_TABLE).astype(dtype)
    exc = index_error(layout(), SEQ_PTR, table, "block_table")
    assert dtype.lstrip("<>") in str(exc.found) or str(np.dtype(dtype)) in str(exc.found)


@pytest.mark.parametrize("table", [[0.0, 1.0, 0.0], [0, 1.5, 0], [0, "1", 0], [0, None, 0]])
def test_index_buffers_non_integer_list(table: list[Any]) -> None:
    index_error(layout(), SEQ_PTR, table, "block_table")


def test_index_buffers_empty_batch() -> None:
    empty = layout(num_seqs=0)
    check(empty, [0], [])
    check(empty, np.zeros(1, np.uint64), np.zeros(0, np.uint32))
    check(empty, [0], np.array([], dtype=np.float64))  # empty: no element has a wrong type
    check(layout(num_seqs=0, num_pages=0), [0], [])
    exc = index_error(empty, [], [], "seq_ptr")
    assert (exc.found, exc.expected) == (0, 1)
    exc = index_error(empty, [0], [0], "seq_ptr")
    assert (exc.found, exc.expected) == (0, 1)


def test_index_buffers_sequences_without_pages() -> None:
    check(layout(num_seqs=3), [0, 0, 0, 0], [])


@pytest.mark.parametrize("seq_ptr", [[0, 2], [0, 2, 3, 3], [0], []])
def test_index_buffers_seq_ptr_wrong_length(seq_ptr: list[int]) -> None:
    exc = index_error(layout(), seq_ptr, BLOCK_TABLE, "seq_ptr")
    assert (exc.found, exc.expected) == (len(seq_ptr), 3)


@pytest.mark.parametrize("first", [1, 2, 3])
def test_index_buffers_seq_ptr_not_starting_at_0(first: int) -> None:
    exc = index_error(layout(), [first, 2, 3], BLOCK_TABLE, "seq_ptr")
    assert exc.found == first and "seq_ptr[0]" in str(exc)


@pytest.mark.parametrize(
    ("seq_ptr", "position", "value"),
    [([0, 3, 2, 3], 2, 2), ([0, 2, 1, 0], 2, 1), ([0, 1, 1, 0], 3, 0)],
)
def test_index_buffers_seq_ptr_decreasing(seq_ptr: list[int], position: int, value: int) -> None:
    seq3 = layout(num_seqs=3)
    exc = index_error(seq3, seq_ptr, [0, 1, 0], "seq_ptr")
    assert exc.found == value
    assert f"position {position}" in str(exc)
    # the same as an array
    exc = index_error(seq3, np.array(seq_ptr, np.int32), [0, 1, 0], "seq_ptr")
    assert exc.found == value and f"position {position}" in str(exc)


@pytest.mark.parametrize(("seq_ptr", "table"), [([0, 2, 2], [0, 1, 0]), ([0, 2, 4], [0, 1, 0])])
def test_index_buffers_last_seq_ptr_not_the_block_table_length(
    seq_ptr: list[int], table: list[int]
) -> None:
    exc = index_error(layout(), seq_ptr, table, "seq_ptr")
    assert (exc.found, exc.expected) == (seq_ptr[-1], len(table))
    assert "seq_ptr[2]" in str(exc)


@pytest.mark.parametrize(
    ("table", "position", "value"),
    [([0, 5, 0], 1, 5), ([5, 1, 0], 0, 5), ([0, 1, 6], 2, 6), ([0, 9, 5], 1, 9)],
)
def test_index_buffers_page_id_outside_the_pool(
    table: list[int], position: int, value: int
) -> None:
    for form in (table, np.array(table, np.uint32), np.array(table, np.int64)):
        exc = index_error(layout(), SEQ_PTR, form, "block_table")
        assert exc.found == value
        assert f"position {position}" in str(exc)
        assert exc.expected == "< num_pages = 5"


def test_index_buffers_empty_pool_refuses_every_page() -> None:
    exc = index_error(layout(num_pages=0), SEQ_PTR, [0, 0, 0], "block_table")
    assert exc.found == 0


def test_index_buffers_page_id_last_page_is_fine() -> None:
    check(layout(), SEQ_PTR, [4, 4, 4])


# == Quantization objects ======================================================================


def f32(value: float) -> float:
    return float(struct.unpack("<f", struct.pack("<f", value))[0])


def test_per_tensor_constructors() -> None:
    sym = hw.PerTensorAffine.symmetric(0.5)
    asym = hw.PerTensorAffine.asymmetric(0.5, -3)
    assert (sym.scale, sym.zero_point, sym.scheme_version) == (0.5, 0, 1)
    assert (asym.scale, asym.zero_point) == (0.5, -3)
    assert sym.symmetric_flag and not asym.symmetric_flag
    assert sym.flags == asym.flags == 0
    assert sym.parameter_buffers == asym.parameter_buffers == ()
    assert (sym.scheme_tag, sym.name) == (0x01, "per_tensor_affine")


@pytest.mark.parametrize("value", [0.1, 1 / 3, 1e-40, 3.4e38, -0.7, 2.0**-149])
def test_per_tensor_scale_is_rounded_to_float32(value: float) -> None:
    scale = hw.PerTensorAffine(value).scale
    assert scale == f32(value)
    assert scale == float(np.float32(value))
    assert hw.PerTensorAffine(value) == hw.PerTensorAffine(f32(value))


@pytest.mark.parametrize(
    "scale", [0.0, -0.0, math.nan, math.inf, -math.inf, 1e-46, -1e-46, 3.5e38, 1e300]
)
def test_per_tensor_scale_zero_or_not_finite_after_rounding(scale: float) -> None:
    refused(hw.errors.InvalidDescriptorError, "scale", hw.PerTensorAffine, scale)


@pytest.mark.parametrize("scale", ["1.0", None, [1.0], 1j, b"\x00"])
def test_per_tensor_scale_not_a_number(scale: Any) -> None:
    refused(hw.errors.InvalidDescriptorError, "scale", hw.PerTensorAffine, scale)


def test_per_tensor_scale_from_numpy_and_int() -> None:
    assert hw.PerTensorAffine(np.float32(0.25)).scale == 0.25
    assert hw.PerTensorAffine(np.float64(0.1)).scale == f32(0.1)
    assert hw.PerTensorAffine(2).scale == 2.0


def test_per_tensor_scale_refuses_a_bool() -> None:
    with pytest.raises(hw.errors.InvalidDescriptorError):
        hw.PerTensorAffine(True)


@pytest.mark.parametrize("zero_point", [-(2**31) - 1, 2**31, True, 0.0, "0", None])
def test_per_tensor_zero_point_errors(zero_point: Any) -> None:
    refused(hw.errors.InvalidDescriptorError, "zero_point", hw.PerTensorAffine, 1.0, zero_point)


@pytest.mark.parametrize("zero_point", [-(2**31), 2**31 - 1, np.int8(-5)])
def test_per_tensor_zero_point_int32_limits(zero_point: int) -> None:
    assert hw.PerTensorAffine(1.0, zero_point).zero_point == int(zero_point)


@pytest.mark.parametrize("version", [2, 0xFF, -1, 256, True, 1.0])
def test_scheme_version_errors(version: Any) -> None:
    for build in (
        lambda: hw.PerTensorAffine(1.0, 0, version),
        lambda: hw.PerChannelAffine(1, 3, None, version),
        lambda: hw.PerBlockAffine(0, 4, 3, hw.float32, None, version),
        lambda: hw.NF4(0, 8, 3, version),
        lambda: hw.MXFP(0, 32, 3, version),
    ):
        refused(hw.errors.InvalidDescriptorError, "scheme_version", build)


def test_scheme_version_0_is_accepted() -> None:
    assert hw.PerTensorAffine(1.0, 0, 0).scheme_version == 0
    assert hw.PerBlockAffine(0, 4, 3, hw.float32, None, 0).scheme_version == 0


def test_per_channel_constructors() -> None:
    sym = hw.PerChannelAffine.symmetric(1, 3)
    asym = hw.PerChannelAffine.asymmetric(2, 3, 4)
    shared = hw.PerChannelAffine.asymmetric(2, 3, 3)
    assert (sym.axis, sym.scale_buffer_index, sym.zero_point_buffer_index) == (1, 3, None)
    assert sym.symmetric_flag and sym.flags == 1
    assert not asym.symmetric_flag and asym.flags == 0
    assert sym.parameter_buffers == (3,)
    assert asym.parameter_buffers == (3, 4)
    assert shared.parameter_buffers == (3,)
    assert sym.scale_type == hw.float32
    assert (sym.scheme_tag, sym.name) == (0x02, "per_channel_affine")


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"axis": -1}, "axis"),
        ({"axis": 2**32}, "axis"),
        ({"axis": True}, "axis"),
        ({"axis": 1.0}, "axis"),
        ({"scale_buffer_index": 0xFFFFFFFF}, "scale_buffer_index"),
        ({"scale_buffer_index": -1}, "scale_buffer_index"),
        ({"scale_buffer_index": "3"}, "scale_buffer_index"),
        ({"zero_point_buffer_index": 0xFFFFFFFF}, "zero_point_buffer_index"),
        ({"zero_point_buffer_index": -1}, "zero_point_buffer_index"),
        ({"zero_point_buffer_index": 2**32}, "zero_point_buffer_index"),
        ({"zero_point_buffer_index": False}, "zero_point_buffer_index"),
    ],
    ids=lambda value: str(value),
)
def test_per_channel_field_errors(kwargs: dict[str, Any], field: str) -> None:
    fields: dict[str, Any] = {"axis": 1, "scale_buffer_index": 3}
    fields.update(kwargs)
    refused(hw.errors.InvalidDescriptorError, field, hw.PerChannelAffine, **fields)


def test_per_block_constructors() -> None:
    sym = hw.PerBlockAffine.symmetric(0, 16, 3, hw.bfloat16)
    asym = hw.PerBlockAffine.asymmetric(0, 16, 3, 4, hw.float16)
    assert (sym.axis, sym.block_size, sym.scale_buffer_index) == (0, 16, 3)
    assert (sym.scale_type, sym.zero_point_buffer_index) == (hw.bfloat16, None)
    assert sym.symmetric_flag and sym.flags == 1
    assert (asym.zero_point_buffer_index, asym.flags) == (4, 0)
    assert asym.parameter_buffers == (3, 4)
    assert hw.PerBlockAffine(0, 2, 3).scale_type == hw.float32  # default
    assert (sym.scheme_tag, sym.name) == (0x03, "per_block_affine")


@pytest.mark.parametrize("scale_type", ["float16", "bfloat16", np.float32, ml_dtypes.bfloat16])
def test_per_block_scale_type_coerced(scale_type: Any) -> None:
    q = hw.PerBlockAffine(0, 4, 3, scale_type)
    assert q.scale_type in (hw.float16, hw.bfloat16, hw.float32)
    assert isinstance(q.scale_type, hw.ElementType)


@pytest.mark.parametrize("block_size", [0, 1, 3, 6, 12, 2**32 - 1, -2, True, 4.0])
def test_per_block_block_size_errors(block_size: Any) -> None:
    refused(hw.errors.InvalidDescriptorError, "block_size", hw.PerBlockAffine, 0, block_size, 3)


@pytest.mark.parametrize("block_size", [2, 4, 2**31])
def test_per_block_block_sizes(block_size: int) -> None:
    assert hw.PerBlockAffine(0, block_size, 3).block_size == block_size


@pytest.mark.parametrize(
    "scale_type", [hw.int8, hw.float64, hw.float8_e4m3, hw.float8_e8m0, "uint8"]
)
def test_per_block_scale_type_not_f16_bf16_f32(scale_type: Any) -> None:
    refused(hw.errors.InvalidDescriptorError, "scale_type", hw.PerBlockAffine, 0, 4, 3, scale_type)


@pytest.mark.parametrize("scale_type", ["bogus", 3, object()])
def test_per_block_scale_type_not_an_element_type_names_scale_type(scale_type: Any) -> None:
    refused(hw.errors.InvalidDescriptorError, "scale_type", hw.PerBlockAffine, 0, 4, 3, scale_type)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"axis": -1}, "axis"),
        ({"scale_buffer_index": 0xFFFFFFFF}, "scale_buffer_index"),
        ({"zero_point_buffer_index": 0xFFFFFFFF}, "zero_point_buffer_index"),
        ({"zero_point_buffer_index": 1.0}, "zero_point_buffer_index"),
    ],
    ids=lambda value: str(value),
)
def test_per_block_field_errors(kwargs: dict[str, Any], field: str) -> None:
    fields: dict[str, Any] = {"axis": 0, "block_size": 4, "scale_buffer_index": 3}
    fields.update(kwargs)
    refused(hw.errors.InvalidDescriptorError, field, hw.PerBlockAffine, **fields)


@pytest.mark.parametrize(
    ("scheme", "good", "bad"),
    [
        (hw.NF4, [8, 16, 2**31], [0, 1, 2, 4, 12, 2**32]),
        (hw.MXFP, [16, 32, 2048], [0, 8, 24, 4096, 2**31]),
    ],
)
def test_nf4_and_mxfp_block_sizes(scheme: Any, good: list[int], bad: list[int]) -> None:
    for block_size in good:
        q = scheme(0, block_size, 3)
        assert (q.block_size, q.flags, q.parameter_buffers) == (block_size, 0, (3,))
    for block_size in bad:
        refused(hw.errors.InvalidDescriptorError, "block_size", scheme, 0, block_size, 3)


def test_nf4_and_mxfp_tags_and_storage() -> None:
    assert (hw.NF4.scheme_tag, hw.MXFP.scheme_tag) == (0x04, 0x05)
    assert hw.NF4.allowed_storage == {hw.uint4.tag}
    assert hw.MXFP.allowed_storage == {
        t.tag
        for t in (
            *(hw.float8_e4m3, hw.float8_e5m2, hw.float4_e2m1, hw.float6_e2m3),
            *(hw.float6_e3m2, hw.int8, hw.int4),
        )
    }


def test_allowed_storage_per_scheme() -> None:
    affine = {"int8", "uint8", "int16", "uint16", "int32", "uint32"}
    affine |= {"int4", "uint4", "int2", "uint2"}
    block = {"int8", "uint8", "int4", "uint4", "int2", "uint2"}
    names = {t.tag: t.name for t in hw.ELEMENT_TYPES}
    assert {names[t] for t in hw.PerTensorAffine.allowed_storage} == affine
    assert {names[t] for t in hw.PerChannelAffine.allowed_storage} == affine
    assert {names[t] for t in hw.PerBlockAffine.allowed_storage} == block


QUANTIZATIONS = [
    hw.PerTensorAffine(0.1, -4),
    hw.PerChannelAffine.asymmetric(2, 3, 4),
    hw.PerBlockAffine.asymmetric(0, 8, 3, 3, hw.bfloat16),
    hw.NF4(0, 64, 3),
    hw.MXFP(1, 32, 3),
]


@pytest.mark.parametrize("q", QUANTIZATIONS, ids=lambda q: q.name)
def test_quantization_value_semantics(q: Any) -> None:
    clone = pickle.loads(pickle.dumps(q))
    assert clone == q and hash(clone) == hash(q)
    assert copy.deepcopy(q) == q
    assert dataclasses.replace(q) == q
    with pytest.raises(dataclasses.FrozenInstanceError):
        q.axis = 1  # every scheme is a frozen dataclass
    assert len({q, clone}) == 1
    text = repr(q)
    for field in dataclasses.fields(q):
        assert f"{field.name}=" in text


def test_quantization_equality_across_schemes() -> None:
    assert hw.NF4(0, 32, 3) != hw.MXFP(0, 32, 3)
    assert hw.PerChannelAffine.symmetric(1, 3) != hw.PerChannelAffine.asymmetric(1, 3, 4)
    assert hw.PerBlockAffine(0, 4, 3, hw.float16) != hw.PerBlockAffine(0, 4, 3, hw.bfloat16)


def test_replace_revalidates() -> None:
    with pytest.raises(hw.errors.InvalidDescriptorError):
        dataclasses.replace(hw.PerBlockAffine(0, 4, 3), block_size=3)
    with pytest.raises(hw.errors.InvalidDescriptorError):
        dataclasses.replace(hw.PerTensorAffine(1.0), scale=0.0)


# == block-paged compatibility (block-paged.md § 7) ============================================


@pytest.mark.parametrize(
    "q",
    [
        None,
        hw.PerTensorAffine(1.0),
        hw.PerChannelAffine.symmetric(1, 3),
        hw.PerChannelAffine.asymmetric(2, 3, 4),
        hw.PerBlockAffine.symmetric(0, 4, 3, hw.float16),
        hw.PerBlockAffine.asymmetric(0, 4, 4, 3, hw.float32),
    ],
    ids=lambda q: getattr(q, "name", "none"),
)
def test_block_paged_compatible(q: Any) -> None:
    layout().validate_quantization_compatibility(q)


@pytest.mark.parametrize(
    ("q", "field", "error"),
    [
        (hw.NF4(0, 8, 3), "quantization", hw.errors.QuantizationNotDefinedError),
        (hw.MXFP(0, 32, 3), "quantization", hw.errors.QuantizationNotDefinedError),
        (
            hw.PerChannelAffine.symmetric(0, 3),
            "quantization.axis",
            hw.errors.InvalidDescriptorError,
        ),
        (
            hw.PerChannelAffine.symmetric(3, 3),
            "quantization.axis",
            hw.errors.InvalidDescriptorError,
        ),
        (hw.PerBlockAffine(1, 4, 3), "quantization.axis", hw.errors.InvalidDescriptorError),
        (hw.PerBlockAffine(0, 8, 3), "quantization.block_size", hw.errors.InvalidDescriptorError),
        (hw.PerBlockAffine(0, 2, 3), "quantization.block_size", hw.errors.InvalidDescriptorError),
        (
            hw.PerBlockAffine(0, 4, 2),
            "quantization.scale_buffer_index",
            hw.errors.InvalidDescriptorError,
        ),
        (
            hw.PerChannelAffine(1, 0),
            "quantization.scale_buffer_index",
            hw.errors.InvalidDescriptorError,
        ),
        ("per_block_affine", "quantization", hw.errors.InvalidDescriptorError),
    ],
    ids=lambda value: str(value)[:40],
)
def test_block_paged_incompatible(q: Any, field: str, error: type[hw.HurrayWireError]) -> None:
    refused(error, field, layout().validate_quantization_compatibility, q)


def test_per_block_with_page_size_1_has_no_legal_block_size() -> None:
    """[A9]: block_size must be a power of two >= 2, so page_size 1 cannot be quantized."""
    for block_size in (2, 4):
        refused(
            hw.errors.InvalidDescriptorError,
            "quantization.block_size",
            layout(page_size=1).validate_quantization_compatibility,
            hw.PerBlockAffine(0, block_size, 3),
        )


# == Element types (descriptor.md § 4) =========================================================

TABLE = [
    (0x01, "float16", 16, np.float16),
    (0x02, "bfloat16", 16, ml_dtypes.bfloat16),
    (0x03, "float32", 32, np.float32),
    (0x04, "float64", 64, np.float64),
    (0x10, "int8", 8, np.int8),
    (0x11, "uint8", 8, np.uint8),
    (0x12, "int16", 16, np.int16),
    (0x13, "uint16", 16, np.uint16),
    (0x14, "int32", 32, np.int32),
    (0x15, "uint32", 32, np.uint32),
    (0x16, "int64", 64, np.int64),
    (0x17, "uint64", 64, np.uint64),
    (0x20, "bool", 1, np.bool_),
    (0x40, "float8_e4m3", 8, ml_dtypes.float8_e4m3fn),
    (0x41, "float8_e5m2", 8, ml_dtypes.float8_e5m2),
    (0x42, "float8_e8m0", 8, ml_dtypes.float8_e8m0fnu),
    (0x43, "float4_e2m1", 4, ml_dtypes.float4_e2m1fn),
    (0x44, "float6_e2m3", 6, ml_dtypes.float6_e2m3fn),
    (0x45, "float6_e3m2", 6, ml_dtypes.float6_e3m2fn),
    (0x46, "float128", 128, "V16"),
    (0x48, "int4", 4, ml_dtypes.int4),
    (0x49, "uint4", 4, ml_dtypes.uint4),
    (0x4A, "int2", 2, ml_dtypes.int2),
    (0x4B, "uint2", 2, ml_dtypes.uint2),
    (0x50, "complex64", 64, np.complex64),
    (0x51, "complex128", 128, np.complex128),
]


def expected_bytes(bits: int, count: int) -> int:
    """descriptor.md § 4's "Bytes for N elements" column ([A27] for 6-bit)."""
    if bits >= 8:
        return count * bits // 8
    if bits == 6:
        return math.ceil(count / 4) * 3
    return math.ceil(count * bits / 8)


def test_element_type_table_is_complete() -> None:
    assert [(t.tag, t.name, t.bit_width) for t in hw.ELEMENT_TYPES] == [row[:3] for row in TABLE]
    assert len({t.tag for t in hw.ELEMENT_TYPES}) == 26


@pytest.mark.parametrize(("tag", "name", "bits", "dtype"), TABLE, ids=[row[1] for row in TABLE])
def test_element_type(tag: int, name: str, bits: int, dtype: Any) -> None:
    etype = hw.element_type_from_tag(tag)
    assert (etype.tag, etype.name, etype.bit_width) == (tag, name, bits)
    assert etype.numpy_dtype == np.dtype(dtype)
    assert hw.element_type_from_name(name) is etype
    assert getattr(hw, "bool_" if name == "bool" else name) is etype
    assert etype.is_packed == (bits < 8)
    assert etype.storage_dtype == (np.dtype(np.uint8) if bits < 8 else np.dtype(dtype))
    assert etype.itemsize == (1 if bits < 8 else bits // 8)
    assert repr(etype) == f"hurray_wire.{'bool_' if name == 'bool' else name}"
    assert hw.element_type_of(etype) is etype
    assert hw.element_type_of(name) is etype
    if name != "float128":
        assert hw.element_type_of(np.dtype(dtype)) is etype
    for count in (*range(0, 18), 100, 1001, 2**40 + 3):
        assert etype.byte_size(count) == expected_bytes(bits, count), count


def test_packed_byte_sizes_from_the_spec() -> None:
    assert hw.bool_.byte_size(5) == 1  # [T,F,T,T,F] -> 0D
    assert hw.uint4.byte_size(3) == 2  # [5,12,3] -> C5 03
    assert hw.uint2.byte_size(3) == 1  # [3,1,2] -> 27
    assert hw.float6_e2m3.byte_size(4) == 3  # 1,2,4,8 -> 81 40 20
    assert hw.float6_e3m2.byte_size(1) == 3  # [A27]: ceil(1/4)*3, not ceil(6/8)
    assert hw.float6_e3m2.byte_size(5) == 6
    assert hw.float4_e2m1.byte_size(1) == 1
    assert hw.int2.byte_size(9) == 3


@pytest.mark.parametrize("tag", [t for t in range(256) if t not in {row[0] for row in TABLE}])
def test_element_type_from_unassigned_tag(tag: int) -> None:
    exc = refused(hw.errors.InvalidDescriptorError, "type_tag", hw.element_type_from_tag, tag)
    assert exc.found == f"0x{tag:02X}"
    word = (
        "invalid"
        if tag in (0x00, 0xFF)
        else "reserved"
        if tag == 0x47 or 0x80 <= tag <= 0xEF
        else "private"
        if 0xF0 <= tag <= 0xFE
        else "unknown"
    )
    assert word in str(exc)


@pytest.mark.parametrize("name", ["float", "bool_", "Float16", "fp16", "", None, 1])
def test_element_type_from_unknown_name(name: Any) -> None:
    refused(hw.errors.InvalidDescriptorError, "element_type", hw.element_type_from_name, name)


@pytest.mark.parametrize("value", [">f4", np.dtype(">i8"), "V16", "U3", object, "not-a-dtype", 3.5])
def test_element_type_of_unknown(value: Any) -> None:
    refused(hw.errors.InvalidDescriptorError, "element_type", hw.element_type_of, value)


def test_element_type_of_none_is_refused() -> None:
    with pytest.raises(hw.errors.InvalidDescriptorError):
        hw.element_type_of(None)


def test_element_types_are_immutable_values() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        hw.float16.tag = 2  # type: ignore[misc]  # typed now: mypy sees the frozen field
    assert pickle.loads(pickle.dumps(hw.bfloat16)) == hw.bfloat16
    assert hash(hw.int4) == hash(hw.element_type_from_tag(0x48))
