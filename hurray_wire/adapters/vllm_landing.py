"""``into_vllm``: a tensor's pages written into a live vLLM cache at engine block ids.

A KV connector's load: the cache is read by ``hurray_wire.adapters.vllm``'s rules (backend,
era, CPU_ATTN ISA), everything is checked, then only the named blocks are written, in place.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import numpy as np

from hurray_wire._interop import engine_array, rows_at, scatter_rows
from hurray_wire.adapters import _vllm_forms as forms
from hurray_wire.adapters._common import Array, from_table, last_page_tokens, refuse_first
from hurray_wire.adapters.vllm import (
    Pair,
    _check_ids,
    _role_pools,
    _tensors,
    fp8_view,
    kernel_ratio,
    kernel_table,
)
from hurray_wire.errors import IndexBufferError, InvalidTensorError
from hurray_wire.tensor import BlockPagedTensor

__all__ = ["checked_write", "into_vllm"]


def _targets(
    tensor: BlockPagedTensor, block_ids: Any, num_blocks: int, block_size: int | None
) -> tuple[Array, Array, Array]:
    """``(engine kernel block, tensor page, valid tokens)`` per written block, checked
    (``block_ids`` in manager blocks of ``block_size`` tokens when given)."""
    counts, last = last_page_tokens(tensor)
    page_size = tensor.layout.page_size
    ratio = kernel_ratio(block_size, page_size, num_blocks)
    tokens = counts * page_size
    targets, ptr = from_table(block_ids, tokens, page_size * ratio, "block_ids")
    sources = tensor.block_table.astype(np.int64)
    # Valid tokens of each page: full, except each sequence's last one.
    valid = np.full(len(sources), page_size, np.int64)
    valid[(np.cumsum(counts) - 1)[counts > 0]] = last[counts > 0]
    refuse_first(targets == 0, targets, "block 0 is vLLM's null block: never written", "block_ids")
    targets, _ = kernel_table(targets, ptr, tokens, ratio, (num_blocks, page_size), "block_ids")
    _check_ids(targets, num_blocks, "block_ids")
    order = np.argsort(targets, kind="stable")
    t, s = targets[order], sources[order]
    clash = (t[1:] == t[:-1]) & (s[1:] != s[:-1])
    if clash.any():
        bad = int(order[int(np.argmax(clash)) + 1])
        raise IndexBufferError(
            "two different pages are aimed at one engine block",
            position=bad,
            field="block_ids",
            found=int(targets[bad]),
        )
    unique, first = np.unique(targets, return_index=True)
    most = np.zeros(len(unique), np.int64)
    np.maximum.at(most, np.searchsorted(unique, targets), valid)
    # in the order the tensor names them: a sequence's pages stay one slice of the pool
    # (``rows_at``), not a gathered copy
    by_use = np.argsort(first, kind="stable")
    return unique[by_use], sources[first[by_use]], most[by_use]


def _check_match(name: str, found: Any, expected: Any) -> None:
    if found != expected:
        raise InvalidTensorError(
            f"the tensor's {name} differs from the cache's",
            field="kv_cache",
            found=found,
            expected=expected,
        )


def into_vllm(
    tensor_or_pair: BlockPagedTensor | Pair,
    kv_cache: Any,
    block_ids: Any,
    *,
    backend: Any = None,
    vllm_version: str | None = None,
    isa: str | None = None,
    kv_cache_dtype: str | None = None,
    k_scale: Any = None,
    v_scale: Any = None,
    block_size: int | None = None,
) -> None:
    """Write the tensor's pages into an engine cache at vLLM block ids (a connector's load):
    :func:`checked_write`'s arguments and checks, its write run at once (the signature is
    written out so that a caller's keywords are type-checked)."""
    checked_write(
        tensor_or_pair, kv_cache, block_ids, backend=backend, vllm_version=vllm_version,
        isa=isa, kv_cache_dtype=kv_cache_dtype, k_scale=k_scale, v_scale=v_scale,
        block_size=block_size,
    )()  # fmt: skip


def checked_write(
    tensor_or_pair: BlockPagedTensor | Pair,
    kv_cache: Any,
    block_ids: Any,
    *,
    backend: Any = None,
    vllm_version: str | None = None,
    isa: str | None = None,
    kv_cache_dtype: str | None = None,
    k_scale: Any = None,
    v_scale: Any = None,
    block_size: int | None = None,
) -> Callable[[], None]:
    """Every check of a write of the tensor's pages into an engine cache at vLLM block ids,
    nothing written: returns the write, to run once every layer of a transfer passed (the
    connector's transfer-atomic landing; :func:`into_vllm` runs it at once).

    ``block_ids`` holds per sequence the engine blocks of its pages (ragged lists or a
    padded ``[num_seqs, width]`` table, as vLLM's block table); each block receives its
    page's valid tokens only (a partial last page leaves the block's tail untouched).
    Checked: backend and era forms, dtype (``kv_cache_dtype`` for a uint8 fp8 cache),
    geometry, ids in ``1 .. num_blocks - 1`` (block 0 is the null block), no block aimed at
    by two different pages, the engine's ``k_scale`` / ``v_scale`` equal to the tensor's.
    The cache is writable CPU memory (a NumPy array or a CPU torch tensor, written in place).

    ``block_size``: vLLM's scheduler block size when the cache is split into smaller kernel
    blocks (the tensor's pages are kernel blocks): ``block_ids`` are then manager block ids,
    and page ``i`` of a sequence lands in kernel block ``block_ids[i // ratio] * ratio +
    i % ratio``, where the attention reads it.
    """
    name = forms.backend_name(backend)
    tensors = _tensors(tensor_or_pair, name)
    cache = fp8_view(engine_array(kv_cache, "kv_cache", contiguous=False), kv_cache_dtype)
    era = forms.era_of(vllm_version)
    for tensor, given in zip(tensors, (k_scale, v_scale), strict=False):
        scale_name = "k_scale" if tensor.kv_role != "value" else "v_scale"
        engine = forms.scale_value(given, scale_name)
        if engine is not None and engine != (tensor.kv_scale or 1.0):
            raise InvalidTensorError(
                "the engine's fp8 scale differs from the tensor's (the values would be "
                "dequantized with the wrong scale)",
                field=scale_name,
                found=engine,
                expected=tensor.kv_scale or 1.0,
            )
    pools = [t.unpacked_page_pool() for t in tensors]
    _check_match("dtype", str(pools[0].dtype), str(cache.dtype))
    kind, views = _role_pools(cache, name, era, None, isa)
    # CPU_ATTN's views are unsigned ints in its slab order: its page shape is the cache's
    page = views[0][1].shape[1:]
    if kind == "cpu":
        page = (cache.shape[2], cache.shape[1], cache.shape[3] // 2)
    forms.check_kernel_block(name, page[0], era)
    _check_match("page shape", pools[0].shape[1:], page)
    targets, sources, valid = _targets(tensors[0], block_ids, views[0][1].shape[0], block_size)
    pools = [p.view(views[0][1].dtype) for p in pools]
    return partial(_write, [v for _, v in views], pools, targets, sources, valid, page[0])


def _write(
    views: Sequence[Array], pools: Sequence[Array], targets: Array, sources: Array, valid: Array,
    page_size: int,
) -> None:  # fmt: skip
    """Each role's pages ``sources`` into its view's blocks ``targets``, every check done.
    A view is ``[blocks, *token axes, H, *dim axes]`` (the token axes in C order are the
    token: ``[blocks, page_size, H, D]``, or CPU_ATTN's slab order as strides): whole pages
    are written as they are; a partial one keeps its block's tail."""
    part = valid < page_size
    whole = ~part
    mask = np.arange(page_size)[None, :, None, None] < valid[part, None, None, None]
    tails = []
    for view, pool in zip(views, pools, strict=True):
        shape = view.shape[1:]
        held = np.ascontiguousarray(view[targets[part]]).reshape(-1, *pool.shape[1:])
        tails.append(np.where(mask, pool[sources[part]], held).reshape(-1, *shape))
    rows = [
        rows_at(pool, sources[whole]).reshape(-1, *v.shape[1:])
        for v, pool in zip(views, pools, strict=True)
    ]
    scatter_rows(views, targets[whole], rows)
    for view, tail in zip(views, tails, strict=True):
        view[targets[part]] = tail
