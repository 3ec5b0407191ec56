"""FlashInfer paged KV caches <-> BlockPagedTensor, as flashinfer-python 0.7.2's code reads them.

``kv_indptr`` is ``seq_ptr`` and ``kv_indices`` is ``block_table``; the cache forms are those
``_unpack_paged_kv_cache`` (``flashinfer/utils.py``) accepts, so a 4-D tensor without
``kv_role`` is the combined page-size-1 cache; lengths are ``get_seq_lens``
(``flashinfer/page.py``), refused where the pages cannot hold them exactly.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hurray_wire._interop import is_torch
from hurray_wire.adapters._common import (
    Array,
    check_choice,
    check_pair,
    engine_buffer,
    engine_outputs,
    int32,
    int_vector,
    last_page_tokens,
    per_tensor_scale,
    refuse_first,
    role_tensors,
)
from hurray_wire.errors import IndexBufferError, InvalidTensorError, flag
from hurray_wire.tensor import BlockPagedTensor

__all__ = ["from_flashinfer", "to_flashinfer"]

_LAYOUTS = ("NHD", "HND")
ROLES = ("key", "value")
_SCALE_RULE = "FlashInfer's run() takes one k_scale / v_scale float"


def _role_pages(cache: Any, layout: str, name: str) -> Any:
    """One role ``[pages, page_size, H, D]`` (``[pages, H, D]``: page size 1) as NHD pages."""
    if cache.ndim == 3:  # _expand_4d: page_size == 1
        cache = cache[:, None] if layout == "NHD" else cache[:, :, None]
    if cache.ndim != 4:
        raise InvalidTensorError(
            "one role is [pages, page_size, H, D] or [pages, H, D] (page size 1); "
            "HND: [pages, H, page_size, D]",
            field=name,
            found=f"shape {tuple(cache.shape)}",
        )
    if layout == "NHD":
        return cache
    return cache.permute(0, 2, 1, 3) if is_torch(cache) else cache.transpose(0, 2, 1, 3)


def _caches(paged_kv_cache: Any, layout: str, kv_role: str | None, dtype: Any) -> list[Any]:
    """``[(role, NHD pages), ...]`` following ``_unpack_paged_kv_cache``."""
    if isinstance(paged_kv_cache, tuple):
        if len(paged_kv_cache) != 2 or kv_role is not None:
            raise InvalidTensorError(
                "a tuple cache is (k_cache, v_cache) and holds both roles (no kv_role)",
                field="paged_kv_cache",
                found=f"{len(paged_kv_cache)} items, kv_role {kv_role!r}",
            )
        return [
            (role, _role_pages(engine_buffer(part, name, dtype), layout, name))
            for role, part, name in zip(ROLES, paged_kv_cache, ("k_cache", "v_cache"), strict=True)
        ]
    cache = engine_buffer(paged_kv_cache, "paged_kv_cache", dtype)
    if kv_role is not None:
        if kv_role not in ("key", "value"):
            raise InvalidTensorError(
                "kv_role is 'key' or 'value'", field="kv_role", found=repr(kv_role)
            )
        return [(kv_role, _role_pages(cache, layout, "paged_kv_cache"))]
    if cache.ndim == 4:  # _expand_5d: page_size == 1
        cache = cache[:, :, None] if layout == "NHD" else cache[:, :, :, None]
    if cache.ndim != 5 or cache.shape[1] != 2:
        raise InvalidTensorError(
            "one tensor is FlashInfer's combined cache [pages, 2, page_size, H, D] or "
            "[pages, 2, H, D] (page size 1; HND swaps page_size and H); for one role alone "
            "pass kv_role='key' or 'value'",
            field="paged_kv_cache",
            found=f"shape {tuple(cache.shape)}",
        )
    return [
        (role, _role_pages(cache[:, i], layout, "paged_kv_cache")) for i, role in enumerate(ROLES)
    ]


def _seq_lens(indptr: Array, last: Array, page_size: int) -> Array:
    """FlashInfer's ``get_seq_lens``, then the lengths checked against the pages."""
    if len(indptr) < 1 or len(last) != len(indptr) - 1:
        raise IndexBufferError(
            "kv_last_page_len needs one entry per request (len(kv_indptr) - 1)",
            field="kv_last_page_len",
            found=len(last),
            expected=max(len(indptr) - 1, 0),
        )
    if indptr[0] != 0:
        raise IndexBufferError(
            "kv_indptr must start at 0 (slice kv_indices to the batch's pages)",
            position=0,
            field="kv_indptr",
            found=int(indptr[0]),
        )
    counts = np.diff(indptr)
    decreases = np.concatenate(([False], counts < 0))
    refuse_first(decreases, indptr, "kv_indptr decreases at position {}", "kv_indptr")
    lens: Array = np.maximum(counts - 1, 0) * page_size + last  # flashinfer/page.py get_seq_lens
    wrong = -(-lens // page_size) != counts
    if wrong.any():
        seq = int(np.argmax(wrong))
        raise IndexBufferError(
            f"request {seq}: get_seq_lens gives {int(lens[seq])} tokens, which "
            f"{int(counts[seq])} page(s) of {page_size} cannot hold exactly (an empty request "
            "needs kv_last_page_len 0; one with pages 1..page_size)",
            position=seq,
            field="kv_last_page_len",
            found=int(last[seq]),
            expected="0" if counts[seq] == 0 else f"1..{page_size}",
        )
    return lens


def from_flashinfer(
    paged_kv_cache: Any,
    kv_indptr: Any,
    kv_indices: Any,
    kv_last_page_len: Any,
    *,
    kv_layout: str = "NHD",
    kv_role: str | None = None,
    dtype: Any = None,
    k_scale: Any = None,
    v_scale: Any = None,
    layer_index: int | None = None,
) -> BlockPagedTensor | tuple[BlockPagedTensor, BlockPagedTensor]:
    """A ``(key, value)`` pair, or one tensor for a one-role cache given with ``kv_role``;
    ``dtype`` for fp8 held as uint8; ``k_scale`` / ``v_scale``: the floats ``run()`` takes."""
    layout = check_choice(kv_layout, "kv_layout", _LAYOUTS)
    pages = _caches(paged_kv_cache, layout, kv_role, dtype)
    if tuple(pages[0][1].shape) != tuple(pages[-1][1].shape):
        raise InvalidTensorError(
            "k and v caches differ in shape",
            field="paged_kv_cache",
            found=tuple(pages[-1][1].shape),
            expected=tuple(pages[0][1].shape),
        )
    page_size = int(pages[0][1].shape[1])
    indptr = int_vector(kv_indptr, "kv_indptr")
    indices = int_vector(kv_indices, "kv_indices")
    lens = _seq_lens(indptr, int_vector(kv_last_page_len, "kv_last_page_len"), page_size)
    scales = {"key": per_tensor_scale(k_scale, "k_scale", _SCALE_RULE),
              "value": per_tensor_scale(v_scale, "v_scale", _SCALE_RULE)}  # fmt: skip
    return role_tensors(pages, indices, indptr, lens, layer_index, scales)


def to_flashinfer(
    tensor_or_pair: BlockPagedTensor | tuple[BlockPagedTensor, BlockPagedTensor],
    *,
    kv_layout: str = "NHD",
    combined: bool = False,
    as_torch: bool = False,
) -> tuple[Any, Any, Any, Any]:
    """``(paged_kv_cache, kv_indptr, kv_indices, kv_last_page_len)``, the indices int32: a
    pair's ``(k, v)`` (NHD: the pools themselves), or one ``[pages, 2, page_size, H, D]``
    copy with ``combined=True``; an empty request's ``kv_last_page_len`` is 0."""
    layout = check_choice(kv_layout, "kv_layout", _LAYOUTS)
    combined = flag(combined, "combined")

    def cache_of(t: BlockPagedTensor) -> Array:
        pool = t.unpacked_page_pool()
        return pool if layout == "NHD" else np.ascontiguousarray(pool.transpose(0, 2, 1, 3))

    cache: Any
    if isinstance(tensor_or_pair, BlockPagedTensor):
        if combined:
            raise InvalidTensorError(
                "combined=True needs a (key, value) pair", field="combined", found=True
            )
        tensor = tensor_or_pair
        cache = cache_of(tensor)
    else:
        tensor, value = check_pair(tensor_or_pair, "tensor_or_pair")
        k, v = cache_of(tensor), cache_of(value)
        cache = np.stack((k, v), axis=1) if combined else (k, v)
    last = last_page_tokens(tensor)[1].astype(np.int32)
    indptr = int32(tensor.seq_ptr, "kv_indptr")
    indices = int32(tensor.block_table, "kv_indices")
    names = ("paged_kv_cache", "kv_indptr", "kv_indices", "kv_last_page_len")
    result: tuple[Any, Any, Any, Any] = engine_outputs(
        (cache, indptr, indices, last), names, as_torch
    )
    return result
