"""The memoised fast paths of the per-blob fixed cost (docs/performance.md, "Per-blob fixed
overhead"): what a cache remembers is derived from immutable geometry only, every value
check still runs on every call, and the caches stay bounded.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import hurray_wire as hw
from hurray_wire.blob import encoder, envelope
from hurray_wire.errors import PaddingError
from hurray_wire.memo import BoundedMemo


def _tiny(**kwargs: Any) -> hw.BlockPagedTensor:
    pool = np.arange(2 * 4 * 2 * 8, dtype=np.float16).reshape(2, 4, 2, 8)
    return hw.BlockPagedTensor.from_arrays(pool, [1, 0, 1], [0, 2, 3], **kwargs)


def _general(tensor: hw.BlockPagedTensor, checksum: bool = True) -> bytes:
    """The blob as the planner lays it out without a cache, as pieces."""
    uncached = encoder.Encoder(checksum=checksum, layouts=BoundedMemo(1, 0))
    return b"".join(uncached.encode_parts(tensor))


TINY_VARIANTS: list[dict[str, Any]] = [
    {},
    {"kv_role": "value", "layer_index": 7},
    {"seq_lens": [8, 3]},
    {"metadata": {"model": "m", "step": 3}},
    {"seq_lens": [5, 4], "metadata": {"a": b"\x00\x01"}, "kv_scale": 0.5},
    {"block_table_index_type": "uint64"},
    {"alignment": 4096},
]


@pytest.mark.parametrize("kwargs", TINY_VARIANTS)
@pytest.mark.parametrize("checksum", [True, False])
def test_small_encode_equals_the_general_planner(kwargs: dict[str, Any], checksum: bool) -> None:
    tensor = _tiny(**kwargs)
    for _ in range(2):  # the second call takes the memoised layout
        blob = hw.encode(tensor, checksum=checksum)
        assert bytes(blob) == _general(tensor, checksum)
    assert type(blob) is memoryview and not blob.readonly
    decoded = hw.decode(blob)
    assert decoded.page_pool.tobytes() == tensor.page_pool.tobytes()


def test_memoised_layout_hashes_the_current_contents() -> None:
    """The layout is keyed by geometry; the checksums always come from the bytes."""
    tensor = _tiny()
    hw.encode(tensor)
    tensor.page_pool[0, 0, 0, 0] = 42.0  # same geometry, other values
    blob = bytes(hw.encode(tensor))
    assert blob == _general(tensor)
    assert hw.decode(blob).page_pool[0, 0, 0, 0] == 42.0
    other = _tiny(metadata={"model": "n"})
    hw.encode(other)
    other.metadata["model"] = "o"  # same encoded length, other bytes
    assert bytes(hw.encode(other)) == _general(other)
    other.metadata["model"] = "longer"  # another length: another layout
    assert bytes(hw.encode(other)) == _general(other)
    assert hw.decode(hw.encode(other)).metadata == {"model": "longer"}


def test_strided_or_reshaped_contents_take_the_general_path() -> None:
    tensor = _tiny()
    hw.encode(tensor)
    every_other = np.zeros((4, 4, 2, 8), np.float16)
    every_other[::2] = tensor.page_pool
    tensor.page_pool = every_other[::2]  # not C-contiguous: the general path copies it
    assert bytes(hw.encode(tensor)) == _general(tensor)
    assert hw.decode(hw.encode(tensor)).page_pool.tobytes() == tensor.page_pool.tobytes()


@pytest.mark.parametrize(
    "etype", [hw.bfloat16, hw.float8_e4m3, hw.int4, hw.uint2, hw.float32], ids=str
)
def test_small_encode_of_exotic_element_types(etype: hw.ElementType) -> None:
    count = 2 * 4 * 2 * 8
    if etype.is_packed:
        pool: Any = np.zeros(count, np.uint8).view(etype.numpy_dtype).reshape(2, 4, 2, 8)
    else:
        pool = np.arange(count).astype(etype.numpy_dtype).reshape(2, 4, 2, 8)
    tensor = hw.BlockPagedTensor.from_arrays(pool, [1, 0], [0, 2], element_type=etype)
    assert bytes(hw.encode(tensor)) == _general(tensor)
    assert bytes(hw.encode(tensor, checksum=False)) == _general(tensor, checksum=False)


def test_parameter_buffers_and_options_take_the_general_path() -> None:
    quant = hw.PerBlockAffine.symmetric(
        axis=0, block_size=4, scale_buffer_index=3, scale_type=hw.float32
    )
    pool = np.zeros((2, 4, 2, 8), np.int8)
    tensor = hw.BlockPagedTensor.from_arrays(
        pool, [1, 0], [0, 2], quantization=quant, scales=np.ones(8, np.float32)
    )
    assert bytes(hw.encode(tensor)) == _general(tensor)
    plain = _tiny()
    assert bytes(hw.encode(plain, compact=True)) == _general(plain.compact())
    with pytest.raises(hw.errors.ArgumentTypeError):
        hw.encode(plain, checksum=1)  # type: ignore[arg-type]


def test_raw_layouts_are_bounded() -> None:
    encoder_ = encoder.Encoder(layouts=BoundedMemo(4, 1 << 20))
    for layer in range(10):
        tensor = _tiny(layer_index=layer)
        assert bytes(encoder_.encode(tensor)) == _general(tensor)
        assert len(encoder_.layouts) <= 4
    assert encoder_.layouts.nbytes <= 1 << 20


# -- from_arrays: the geometry memo ---------------------------------------------------------
def _arrays(
    table_dtype: Any = np.uint32,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    pool = np.zeros((4, 2, 1, 8), np.float16)
    return pool, np.array([0, 3, 1], table_dtype), np.array([0, 2, 3], table_dtype)


def _build(pool: Any, table: Any, seq_ptr: Any, **kwargs: Any) -> hw.BlockPagedTensor:
    return hw.BlockPagedTensor.from_arrays(pool, table, seq_ptr, **kwargs)


@pytest.mark.parametrize("table_dtype", [np.uint32, np.int64, np.uint64, np.int16])
def test_every_value_check_runs_after_a_memoised_geometry(table_dtype: Any) -> None:
    pool, table, seq_ptr = _arrays(table_dtype)
    for _ in range(2):
        assert _build(pool, table, seq_ptr).block_table.tolist() == [0, 3, 1]
    cases: list[tuple[Any, Any, str]] = [
        ([0, 4, 1], [0, 2, 3], "block_table"),  # a page id outside the pool
        ([0, 3, 1], [0, 3, 2], "seq_ptr"),  # decreasing
        ([0, 3, 1], [1, 2, 3], "seq_ptr"),  # seq_ptr[0] != 0
        ([0, 3, 1], [0, 1, 2], "seq_ptr"),  # seq_ptr[-1] != entries
    ]
    if np.dtype(table_dtype).kind == "i":
        cases.append(([0, -1, 1], [0, 2, 3], "block_table"))  # negative
    for bad_table, bad_ptr, field in cases:  # the same geometry, other values
        with pytest.raises(hw.errors.IndexBufferError) as info:
            _build(pool, np.array(bad_table, table_dtype), np.array(bad_ptr, table_dtype))
        assert info.value.field == field
        assert _build(pool, table, seq_ptr).block_table.tolist() == [0, 3, 1]


def test_values_that_do_not_fit_the_index_type_after_a_memoised_geometry() -> None:
    pool, table, seq_ptr = _arrays(np.uint64)
    _build(pool, table, seq_ptr)
    big = np.array([0, 3, 2**33], np.uint64)
    with pytest.raises(hw.errors.IndexBufferError, match="do not fit uint32") as info:
        _build(pool, big, seq_ptr)
    assert info.value.field == "block_table"
    wide = _build(pool, table, seq_ptr, block_table_index_type="uint64")
    assert wide.layout.block_table_index_type == "uint64"
    with pytest.raises(hw.errors.IndexBufferError, match="outside the pool"):  # fits, but no page
        _build(pool, big, seq_ptr, block_table_index_type="uint64")


def test_seq_lens_metadata_and_total_tokens_after_a_memoised_geometry() -> None:
    pool, table, seq_ptr = _arrays()
    lens = np.array([3, 2], np.uint64)
    first = _build(pool, table, seq_ptr, seq_lens=lens)
    assert first.shape[0] == 5
    other = _build(pool, table, seq_ptr, seq_lens=np.array([4, 1], np.uint64))
    assert other.shape[0] == 5 and other.descriptor is first.descriptor
    longer = _build(pool, table, seq_ptr, seq_lens=np.array([4, 2], np.uint64))
    assert longer.shape[0] == 6
    with pytest.raises(hw.errors.IndexBufferError) as info:  # 5 tokens need 3 pages of 2, not 2
        _build(pool, table, seq_ptr, seq_lens=np.array([5, 1], np.uint64))
    assert info.value.field == "seq_lens"
    with pytest.raises(hw.HurrayWireError):
        _build(pool, table, seq_ptr, seq_lens=lens, total_tokens=4)
    with pytest.raises(hw.errors.InvalidMetadataError):
        _build(pool, table, seq_ptr, metadata={"hurray.k_scale": "not a float"})
    assert _build(pool, table, seq_ptr, total_tokens=np.int64(5)).shape[0] == 5


def test_geometry_key_separates_types_and_skips_what_it_cannot_key() -> None:
    pool, table, seq_ptr = _arrays()
    _build(pool, table, seq_ptr, layer_index=1)
    with pytest.raises(hw.HurrayWireError):
        _build(pool, table, seq_ptr, layer_index=True)
    with pytest.raises(hw.HurrayWireError):
        _build(pool, table, seq_ptr, layer_index=1.0)
    with pytest.raises(hw.HurrayWireError):
        _build(pool, table, seq_ptr, kv_role=("key",))
    with pytest.raises(hw.HurrayWireError):
        _build(pool, table, seq_ptr, kv_role=["key"])  # unhashable
    assert _build(pool, [0, 3, 1], [0, 2, 3]).descriptor == _build(pool, table, seq_ptr).descriptor
    with pytest.raises(hw.errors.InvalidTensorError):  # same shape, another dtype: its own geometry
        _build(pool.astype(np.float32), table, seq_ptr, element_type=hw.float16)
    with pytest.raises(hw.errors.InvalidTensorError):
        _build(pool.reshape(4, 2, 8), table, seq_ptr)


def test_geometries_and_their_descriptors_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    from hurray_wire import tensor as tensor_module

    memo: BoundedMemo[Any] = BoundedMemo(4, 1 << 20)
    monkeypatch.setattr(tensor_module, "_BUILT", memo)
    pool, table, seq_ptr = _arrays()
    for layer in range(10):
        assert _build(pool, table, seq_ptr, layer_index=layer).layer_index == layer
        assert len(memo) <= 4
    memo = BoundedMemo(64, 1 << 20)
    monkeypatch.setattr(tensor_module, "_BUILT", memo)
    monkeypatch.setattr(tensor_module, "_TOKENS_PER_GEOMETRY", 2)  # descriptors per geometry
    for tokens in [1, 2, 3, 4, 5, 6, 1, 2]:
        assert _build(pool, table, seq_ptr, total_tokens=tokens).shape[0] == tokens
        (geometry,) = (g for g in memo._items.values() if getattr(g, "descriptors", None))
        assert 1 <= len(geometry.descriptors) <= 2
    assert memo.nbytes <= 1 << 20


# -- decode: the per-plan checks in one unpack ----------------------------------------------
def test_padding_and_checksums_checked_on_every_decode_of_a_memoised_plan() -> None:
    tensor = _tiny(seq_lens=[8, 3], metadata={"m": 1})
    blob = bytes(hw.encode(tensor))
    hw.decode(blob)  # the plan is memoised now
    entries = [envelope.ENTRY.unpack_dict(blob, envelope.entry_at(i))
               for i in range(5)]  # fmt: skip
    for number, entry in enumerate(entries):
        damaged = bytearray(blob)
        damaged[entry["offset"]] ^= 1
        with pytest.raises(hw.errors.ChecksumError) as info:
            hw.decode(damaged)
        assert info.value.offset == entry["offset"]
        if number == 0:  # pool bytes: only the checksum can tell
            assert hw.decode(damaged, verify=False).num_seqs == 2
    gaps = [e["offset"] - 1 for e in entries if blob[e["offset"] - 1] == 0]
    gaps.append(len(blob) - 1)  # trailing padding
    for at in gaps:
        damaged = bytearray(blob)
        damaged[at] = 7
        with pytest.raises(PaddingError):
            hw.decode(damaged, verify=False)
    assert hw.decode(blob).metadata == {"m": 1}


def test_large_padding_checked_on_every_decode() -> None:
    tensor = _tiny(alignment=1 << 14)  # > 4 KiB of padding before the pool
    blob = bytes(hw.encode(tensor))
    hw.decode(blob)
    pool_at = envelope.ENTRY.unpack_dict(blob, envelope.entry_at(0))["offset"]
    damaged = bytearray(blob)
    damaged[pool_at - 5000] = 1
    with pytest.raises(PaddingError):
        hw.decode(damaged)
