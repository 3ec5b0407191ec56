"""FlashInfer paged KV caches <-> BlockPagedTensor.

FlashInfer's CSR arrays are the block-paged buffers under other names: ``kv_indptr`` is
``seq_ptr`` and ``kv_indices`` is ``block_table``; lengths follow from ``kv_last_page_len``
(``(pages - 1) * page_size + last_page_len``; a sequence of no pages has length 0 and its
``kv_last_page_len`` entry is ignored on the way in, written as 0 on the way out). Caches:
one role ``[pages, page_size, H, D]``, the combined ``[pages, 2, page_size, H, D]`` or a
``(k, v)`` tuple; ``kv_layout="HND"`` swaps ``page_size`` and ``H``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hurray_wire.adapters._common import (
    Array,
    array,
    check_choice,
    check_pair,
    int32,
    int_vector,
    lens_of,
)
from hurray_wire.errors import ArgumentTypeError, IndexBufferError, InvalidTensorError
from hurray_wire.tensor import BlockPagedTensor

__all__ = ["from_flashinfer", "to_flashinfer"]

_LAYOUTS = ("NHD", "HND")


def _nhd(pages: Array, layout: str, name: str) -> Array:
    if pages.ndim != 4:
        raise InvalidTensorError(
            "expected [pages, page_size, H, D] (HND: [pages, H, page_size, D])",
            field=name,
            found=f"shape {pages.shape}",
        )
    return pages if layout == "NHD" else pages.transpose(0, 2, 1, 3)


def from_flashinfer(
    paged_kv_cache: Any,
    kv_indptr: Any,
    kv_indices: Any,
    kv_last_page_len: Any,
    *,
    kv_layout: str = "NHD",
    kv_role: str | None = None,
    layer_index: int | None = None,
) -> BlockPagedTensor | tuple[BlockPagedTensor, BlockPagedTensor]:
    """One tensor (a 4-D cache with ``kv_role``) or a ``(key, value)`` pair."""
    layout = check_choice(kv_layout, "kv_layout", _LAYOUTS)
    if isinstance(paged_kv_cache, tuple):
        if len(paged_kv_cache) != 2:
            raise ArgumentTypeError(
                "a tuple cache is (k_cache, v_cache)",
                field="paged_kv_cache",
                found=len(paged_kv_cache),
            )
        if kv_role is not None:
            raise InvalidTensorError(
                "kv_role is for one-role caches", field="kv_role", found=repr(kv_role)
            )
        k = _nhd(array(paged_kv_cache[0], "paged_kv_cache[0]"), layout, "paged_kv_cache[0]")
        v = _nhd(array(paged_kv_cache[1], "paged_kv_cache[1]"), layout, "paged_kv_cache[1]")
        pages: list[tuple[str, Array]] = [("key", k), ("value", v)]
    else:
        cache = array(paged_kv_cache, "paged_kv_cache")
        if cache.ndim == 5:
            if cache.shape[1] != 2 or kv_role is not None:
                raise InvalidTensorError(
                    "a 5-D cache is [pages, 2, page_size, H, D] (HND: [pages, 2, H, page_size, D])"
                    " and holds both roles",
                    field="paged_kv_cache",
                    found=f"shape {cache.shape}, kv_role {kv_role!r}",
                )
            pages = [
                ("key", _nhd(cache[:, 0], layout, "paged_kv_cache")),
                ("value", _nhd(cache[:, 1], layout, "paged_kv_cache")),
            ]
        else:
            if kv_role not in ("key", "value"):
                raise InvalidTensorError(
                    "a one-role cache needs kv_role 'key' or 'value'",
                    field="kv_role",
                    found=repr(kv_role),
                )
            pages = [(kv_role, _nhd(cache, layout, "paged_kv_cache"))]
    if pages[0][1].shape != pages[-1][1].shape:
        raise InvalidTensorError(
            "k and v caches differ in shape",
            field="paged_kv_cache",
            found=pages[-1][1].shape,
            expected=pages[0][1].shape,
        )
    page_size = int(pages[0][1].shape[1])
    indptr = int_vector(kv_indptr, "kv_indptr")
    indices = int_vector(kv_indices, "kv_indices")
    last = int_vector(kv_last_page_len, "kv_last_page_len")
    if len(indptr) < 1 or len(last) != len(indptr) - 1:
        raise IndexBufferError(
            "kv_last_page_len needs one entry per sequence",
            field="kv_last_page_len",
            found=len(last),
            expected=max(len(indptr) - 1, 0),
        )
    counts = np.diff(indptr)
    if (counts < 0).any():
        bad = int(np.argmax(counts < 0)) + 1
        raise IndexBufferError(
            f"kv_indptr decreases at position {bad}",
            position=bad,
            field="kv_indptr",
            found=int(indptr[bad]),
        )
    bad_last = (counts > 0) & ((last < 1) | (last > page_size))
    if bad_last.any():
        seq = int(np.argmax(bad_last))
        raise IndexBufferError(
            f"last page length of sequence {seq} is not in 1..{page_size}",
            position=seq,
            field="kv_last_page_len",
            found=int(last[seq]),
            expected=f"1..{page_size}",
        )
    lens = np.where(counts > 0, (counts - 1) * page_size + last, 0)
    tensors = tuple(
        BlockPagedTensor.from_arrays(
            pool, indices, indptr, seq_lens=lens, kv_role=role, layer_index=layer_index
        )
        for role, pool in pages
    )
    return tensors[0] if len(tensors) == 1 else (tensors[0], tensors[1])


def to_flashinfer(
    tensor_or_pair: BlockPagedTensor | tuple[BlockPagedTensor, BlockPagedTensor],
    *,
    kv_layout: str = "NHD",
    combined: bool = False,
) -> tuple[Any, Array, Array, Array]:
    """``(paged_kv_cache, kv_indptr, kv_indices, kv_last_page_len)``, indices int32.

    A pair gives a ``(k, v)`` tuple (the pools themselves for NHD), or with
    ``combined=True`` one ``[pages, 2, page_size, H, D]`` array. ``kv_indptr`` and
    ``kv_indices`` are int32 views of the tensor's uint32 arrays (copies for uint64).
    """
    layout = check_choice(kv_layout, "kv_layout", _LAYOUTS)
    if not isinstance(combined, bool):
        raise ArgumentTypeError("combined must be a bool", field="combined", found=repr(combined))

    def cache_of(t: BlockPagedTensor) -> Array:
        pool = t.unpacked_page_pool()
        return pool if layout == "NHD" else np.ascontiguousarray(pool.transpose(0, 2, 1, 3))

    cache: Any
    if isinstance(tensor_or_pair, BlockPagedTensor):
        tensor = tensor_or_pair
        cache = cache_of(tensor)
    else:
        tensor, value = check_pair(tensor_or_pair, "tensor_or_pair")
        k, v = cache_of(tensor), cache_of(value)
        cache = np.stack((k, v), axis=1) if combined else (k, v)
    page_size = tensor.layout.page_size
    counts = np.diff(tensor.seq_ptr.astype(np.int64))
    lens = lens_of(tensor).astype(np.int64)
    last = np.where(counts > 0, lens - (counts - 1) * page_size, 0).astype(np.int32)
    indptr = int32(tensor.seq_ptr, "kv_indptr")
    indices = int32(tensor.block_table, "kv_indices")
    return cache, indptr, indices, last
