"""The memoised fast paths of the per-blob fixed cost (docs/performance.md, "Per-blob fixed
overhead"): what a cache remembers is derived from immutable geometry only, every value
check still runs on every call, and the caches stay bounded.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import hurray_wire as hw
from hurray_wire.blob import encoder
from hurray_wire.memo import BoundedMemo


def _tiny(**kwargs: Any) -> hw.BlockPagedTensor:
    pool = np.arange(2 * 4 * 2 * 8, dtype=np.float16).reshape(2, 4, 2, 8)
    return hw.BlockPagedTensor.from_arrays(pool, [1, 0, 1], [0, 2, 3], **kwargs)


def _general(tensor: hw.BlockPagedTensor, checksum: bool = True) -> bytes:
    """The blob as the general planner lays it out (encode_parts never memoises)."""
    return b"".join(encoder.encode_parts(tensor, checksum=checksum))


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
    with pytest.raises(hw.ArgumentTypeError):
        hw.encode(plain, checksum=1)  # type: ignore[arg-type]


def test_raw_layouts_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    memo: BoundedMemo[Any] = BoundedMemo(4, 1 << 20)
    monkeypatch.setattr(encoder, "RAW_LAYOUTS", memo)
    for layer in range(10):
        tensor = _tiny(layer_index=layer)
        assert bytes(hw.encode(tensor)) == _general(tensor)
        assert len(memo) <= 4
    assert memo.nbytes <= 1 << 20
