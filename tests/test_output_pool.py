"""encode()'s output pool: memory is reused only after the caller dropped every reference."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import hurray_wire as hw
from hurray_wire.blob.output import OUTPUT_POOL, OutputPool


def _tensor(value: int) -> hw.BlockPagedTensor:
    pool = np.full((64, 16, 8, 64), value, np.float16)  # 1 MiB: a pooled size
    return hw.BlockPagedTensor.from_arrays(pool, np.arange(64), [0, 32, 64])


def _address(blob: memoryview) -> int:
    return int(np.frombuffer(blob, np.uint8).ctypes.data)


def test_a_dropped_blob_is_reused_and_a_held_one_never_is() -> None:
    OUTPUT_POOL.clear()
    first = hw.encode(_tensor(1))
    address = _address(first)
    held = hw.encode(_tensor(2))  # first is still referenced: a different block
    assert _address(held) != address
    expected_first = bytes(first)
    del first
    gc.collect()
    again = hw.encode(_tensor(3))  # same size class: the dropped block comes back
    assert _address(again) == address
    assert hw.decode(again).page_pool[0, 0, 0, 0] == 3
    assert hw.decode(held).page_pool[0, 0, 0, 0] == 2  # untouched by the reuse
    assert expected_first != bytes(again)


def test_a_view_built_on_the_blob_keeps_it_out_of_the_pool() -> None:
    OUTPUT_POOL.clear()
    blob = hw.encode(_tensor(4))
    array = np.frombuffer(blob, np.uint8)
    tensor = hw.decode(blob)
    del blob
    gc.collect()
    other = hw.encode(_tensor(5))
    assert not np.shares_memory(array, np.frombuffer(other, np.uint8))
    assert tensor.page_pool[0, 0, 0, 0] == 4


def test_idle_memory_is_bounded_and_recycling_can_be_turned_off() -> None:
    pool = OutputPool(max_idle_bytes=4 << 20)
    taken = [pool.take(3 << 20) for _ in range(3)]  # 4 MiB blocks each (rounded to 2 MiB)
    del taken
    gc.collect()
    assert pool.idle_bytes <= 4 << 20
    off = OutputPool(max_idle_bytes=0)
    block = off.take(2 << 20)
    del block
    gc.collect()
    assert off.idle_bytes == 0


@pytest.mark.parametrize("size", [0, 1, 4095, (1 << 20) - 1])
def test_small_outputs_are_plain_arrays(size: int) -> None:
    array = OutputPool().take(size)
    assert array.size == size and array.base is None
