"""Pages of one request in a vLLM per-layer cache, read out and written back at block ids.

vLLM's CPU_ATTN backend (``vllm/v1/attention/backends/cpu_attn.py``, 0.32/0.33) allocates
each layer as ``[num_blocks, H, B, 2 * D]`` and reads it with
``kv_cache.view(num_blocks, H, 2 * B, D).chunk(2, dim=2)``: each (block, head) slab holds
the block's keys, then its values, each ``B * D`` elements. Inside the key half the
``cpu_attn_reshape_and_cache`` kernel (ISA "vec"/"vec16", float32/float16) stores the keys
transposed, ``[D, B]``; the value half is ``[B, D]``. The engine tests check this reading
against an independent transformers forward pass.

``read_pages`` copies, ``write_pages`` writes only the named blocks; both return and take
key and value as ``[pages, B, H, D]`` NumPy arrays (the BlockPagedTensor page layout).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from hurray_wire._interop import torch_to_numpy
from hurray_wire.adapters._common import check_choice
from hurray_wire.errors import InvalidTensorError

__all__ = ["BACKENDS", "read_pages", "write_pages"]

BACKENDS = ("CPU_ATTN",)


def _slabs(kv_cache: Any, backend: str) -> tuple[npt.NDArray[Any], int, int, int]:
    check_choice(backend, "backend", BACKENDS)
    cache = torch_to_numpy(kv_cache, "kv_cache") if not isinstance(kv_cache, np.ndarray) else kv_cache
    if cache.ndim != 4 or cache.shape[3] % 2:
        raise InvalidTensorError(
            "a CPU_ATTN layer cache is [num_blocks, H, block_size, 2 * head_size]",
            field="kv_cache",
            found=f"shape {cache.shape}",
        )
    if not cache.flags.c_contiguous:
        raise InvalidTensorError("the cache must be C-contiguous", field="kv_cache")
    n, heads, block, width = cache.shape
    return cache, heads, block, width // 2


def _blocks(block_ids: Sequence[int], num_blocks: int) -> npt.NDArray[np.intp]:
    ids = np.asarray(list(block_ids), dtype=np.int64)
    if ids.size and (ids.min() < 0 or ids.max() >= num_blocks):
        raise InvalidTensorError(
            "block ids out of the cache's range",
            field="block_ids",
            expected=f"0..{num_blocks - 1}",
            found=f"{int(ids.min())}..{int(ids.max())}",
        )
    return ids.astype(np.intp)


def read_pages(
    kv_cache: Any, block_ids: Sequence[int], *, backend: str = "CPU_ATTN"
) -> tuple[npt.NDArray[Any], npt.NDArray[Any]]:
    """Copies of the keys and values of ``block_ids``, each ``[pages, B, H, D]``."""
    cache, heads, block, dim = _slabs(kv_cache, backend)
    ids = _blocks(block_ids, cache.shape[0])
    slab = cache[ids].reshape(len(ids), heads, 2, block * dim)
    key = slab[:, :, 0].reshape(len(ids), heads, dim, block).transpose(0, 3, 1, 2)
    value = slab[:, :, 1].reshape(len(ids), heads, block, dim).transpose(0, 2, 1, 3)
    return np.ascontiguousarray(key), np.ascontiguousarray(value)


def write_pages(
    kv_cache: Any,
    block_ids: Sequence[int],
    key: npt.NDArray[Any],
    value: npt.NDArray[Any],
    *,
    backend: str = "CPU_ATTN",
) -> None:
    """Write ``[pages, B, H, D]`` keys and values into ``block_ids`` of the cache. Every
    check (range, shapes, dtype) runs before the first byte is written."""
    cache, heads, block, dim = _slabs(kv_cache, backend)
    ids = _blocks(block_ids, cache.shape[0])
    want = (len(ids), block, heads, dim)
    for name, arr in (("key", key), ("value", value)):
        if arr.shape != want or arr.dtype != cache.dtype:
            raise InvalidTensorError(
                f"{name} pages do not fit the cache's blocks",
                field=name,
                expected=f"{want} {cache.dtype}",
                found=f"{arr.shape} {arr.dtype}",
            )
    if len(set(ids.tolist())) != len(ids):
        raise InvalidTensorError("block ids repeat", field="block_ids", found=ids.tolist())
    slab = np.empty((len(ids), heads, 2, block * dim), dtype=cache.dtype)
    slab[:, :, 0] = key.transpose(0, 2, 3, 1).reshape(len(ids), heads, block * dim)
    slab[:, :, 1] = value.transpose(0, 2, 1, 3).reshape(len(ids), heads, block * dim)
    cache[ids] = slab.reshape(len(ids), heads, block, 2 * dim)
