"""Engine adapters: exact round trips engine -> hurray-wire -> engine against loop references.

SGLang and FlashInfer: tests/test_adapters_sglang_flashinfer.py (and their own code as the
oracle in engine_tests/oracle_sglang)."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

import hurray_wire as hw
from tests.adapter_reference import (
    Batch,
    random_batch,
    random_values,
    ref_tensor_sequences,
)

DTYPES = [np.float16, ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, np.int8]
SHAPES = [(16, 8, 128), (32, 2, 64), (64, 4, 128), (16, 1, 576)]  # block, kv heads, head dim


def same(a: Any, b: Any) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    if a.size == 0 and b.size == 0:
        return True
    if a.dtype.kind in "iu" and b.dtype.kind in "iu":
        return a.shape == b.shape and bool(np.array_equal(a, b))
    return a.shape == b.shape and bool(np.array_equal(a.view(np.uint8), b.view(np.uint8)))


def check_sequences(tensor: hw.BlockPagedTensor, expected: list[Any]) -> None:
    got = tensor.sequences()
    assert len(got) == len(expected)
    for a, b in zip(got, expected, strict=True):
        assert same(a, b)
    for a, b in zip(ref_tensor_sequences(tensor), expected, strict=True):
        assert same(a, b)


def batch(seed: int, block: int, heads: int, dim: int, dtype: Any, **kw: Any) -> Batch:
    return random_batch(
        np.random.default_rng(seed),
        num_pages=12,
        page_size=block,
        heads=heads,
        head_dim=dim,
        dtype=dtype,
        **kw,
    )


# -- hurray-wire -> engine -> hurray-wire, on random tensors ------------------------------------
def pair_of(seed: int, block: int, dtype: Any) -> tuple[hw.BlockPagedTensor, hw.BlockPagedTensor]:
    b = batch(seed, block, 2, 8, dtype)
    v = random_values(np.random.default_rng(seed + 7), b.pool.shape, dtype)
    args = (b.block_table(), b.seq_ptr())
    key = hw.BlockPagedTensor.from_arrays(b.pool, *args, seq_lens=b.lens, layer_index=3)
    value = hw.BlockPagedTensor.from_arrays(
        v, *args, seq_lens=b.lens, kv_role="value", layer_index=3
    )
    return key, value


def same_tensor(a: hw.BlockPagedTensor, b: hw.BlockPagedTensor) -> None:
    assert a.descriptor == b.descriptor
    for name in ("page_pool", "block_table", "seq_ptr", "seq_lens"):
        assert same(getattr(a, name), getattr(b, name)), name
