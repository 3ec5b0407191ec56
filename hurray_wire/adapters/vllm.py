"""vLLM (0.2x - 0.33) per-layer KV caches <-> BlockPagedTensor.

Cache forms (``B`` = block_size, ``H`` = KV heads, ``D`` = head_size; ``kv_cache_layout=
"HND"`` swaps ``B`` and ``H`` in each):

* one role ``[num_blocks, B, H, D]`` (pass ``kv_role``) -> one tensor;
* ``[2, num_blocks, B, H, D]`` (FlashAttention, ``combined="2NBHD"``),
  ``[num_blocks, 2, B, H, D]`` (FlashInfer / Triton backends, ``"N2BHD"``) or K and V packed
  in the content dim ``[num_blocks, B, H, 2*D]`` (a 4-D cache without ``kv_role``,
  ``"packed"``) -> a ``(key, value)`` pair;
* MLA ``[num_blocks, B, 576]`` -> one ``fused`` tensor of one head.

vLLM's block table is a padded ``[num_reqs, max_blocks]`` int32 table; row ``s`` uses its
first ``ceil(seq_lens[s] / B)`` entries. ``to_vllm`` pads with 0, as vLLM's own table does.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hurray_wire.adapters._common import (
    Array,
    array,
    check_choice,
    check_pair,
    from_table,
    int_vector,
    lens_of,
    padded_table,
)
from hurray_wire.errors import ArgumentTypeError, InvalidTensorError
from hurray_wire.tensor import BlockPagedTensor
from hurray_wire.transforms._common import check_int

__all__ = ["COMBINED_FORMS", "from_vllm", "to_vllm"]

COMBINED_FORMS = ("2NBHD", "N2BHD", "packed")
_LAYOUTS = ("NHD", "HND")


def _nhd(page: Array, layout: str) -> Array:
    """``[pages, B, H, D]`` from a page array in ``layout`` (a view)."""
    return page if layout == "NHD" else page.transpose(0, 2, 1, 3)


def _split(cache: Array, layout: str, combined: str | None) -> tuple[Array, Array]:
    """Key and value page arrays (views) of a two-role cache."""
    if cache.ndim == 4:
        if combined not in (None, "packed"):
            raise InvalidTensorError(
                f"a 4-D cache is not the {combined} form", field="combined", found=combined
            )
        width = cache.shape[3]
        if width % 2:
            raise InvalidTensorError(
                "a packed cache [num_blocks, B, H, 2*D] needs an even last dimension "
                "(pass kv_role for a one-role cache)",
                field="kv_cache",
                found=f"shape {cache.shape}",
            )
        return cache[..., : width // 2], cache[..., width // 2 :]
    if combined is None:
        first, second = cache.shape[0] == 2, cache.shape[1] == 2
        if first and second:
            raise InvalidTensorError(
                "both [2, N, ...] and [N=2, 2, ...] fit this cache: pass combined=",
                field="combined",
                found=f"shape {cache.shape}",
                expected=("2NBHD", "N2BHD"),
            )
        if not (first or second):
            raise InvalidTensorError(
                "a 5-D cache is [2, num_blocks, B, H, D] or [num_blocks, 2, B, H, D]",
                field="kv_cache",
                found=f"shape {cache.shape}",
            )
        combined = "2NBHD" if first else "N2BHD"
    if combined == "2NBHD" and cache.shape[0] == 2:
        return cache[0], cache[1]
    if combined == "N2BHD" and cache.shape[1] == 2:
        return cache[:, 0], cache[:, 1]
    raise InvalidTensorError(
        f"the cache is not of the {combined} form", field="combined", found=f"shape {cache.shape}"
    )


def from_vllm(
    kv_cache: Any,
    block_table: Any,
    seq_lens: Any,
    *,
    kv_cache_layout: str = "NHD",
    kv_role: str | None = None,
    layer_index: int | None = None,
    combined: str | None = None,
    k_scale: float | None = None,
    v_scale: float | None = None,
) -> BlockPagedTensor | tuple[BlockPagedTensor, BlockPagedTensor]:
    """One tensor (one role, or MLA as ``fused``) or a ``(key, value)`` pair.

    ``combined`` names the two-role form when the shape alone cannot (a 5-D cache with
    ``num_blocks == 2``); by default it is read from the shape. ``k_scale`` / ``v_scale``
    are the layer's fp8 scalars (``tensor.kv_scale``; ``k_scale`` for key and fused).
    """
    cache = array(kv_cache, "kv_cache")
    layout = check_choice(kv_cache_layout, "kv_cache_layout", _LAYOUTS)
    if combined is not None:
        check_choice(combined, "combined", COMBINED_FORMS)
    lens = int_vector(seq_lens, "seq_lens")
    if cache.ndim == 3:  # MLA: one latent vector per token
        if kv_role not in (None, "fused"):
            raise InvalidTensorError(
                "an MLA cache [num_blocks, B, dim] is fused", field="kv_role", found=repr(kv_role)
            )
        if layout != "NHD":
            raise InvalidTensorError(
                "an MLA cache has no head axis to swap", field="kv_cache_layout", found=layout
            )
        pages: list[tuple[str, Array]] = [("fused", cache[:, :, None, :])]
    elif cache.ndim == 4 and kv_role is not None:
        if kv_role not in ("key", "value"):
            raise ArgumentTypeError(
                "kv_role must be 'key' or 'value'", field="kv_role", found=repr(kv_role)
            )
        pages = [(kv_role, _nhd(cache, layout))]
    elif cache.ndim in (4, 5):
        if kv_role is not None:
            raise InvalidTensorError(
                "kv_role is for one-role caches [num_blocks, B, H, D]",
                field="kv_role",
                found=repr(kv_role),
            )
        key, value = _split(cache, layout, combined)
        pages = [("key", _nhd(key, layout)), ("value", _nhd(value, layout))]
    else:
        raise InvalidTensorError(
            "a vLLM cache is 3-D (MLA), 4-D or 5-D", field="kv_cache", found=f"shape {cache.shape}"
        )
    page_size = pages[0][1].shape[1]
    if page_size < 1:
        raise InvalidTensorError(
            "block_size must be >= 1", field="kv_cache", found=f"shape {cache.shape}"
        )
    table, seq_ptr = from_table(block_table, lens, page_size)
    scales = {"key": k_scale, "fused": k_scale, "value": v_scale}
    tensors = tuple(
        BlockPagedTensor.from_arrays(
            pool,
            table,
            seq_ptr,
            seq_lens=lens,
            kv_role=role,
            layer_index=layer_index,
            kv_scale=scales[role],
        )
        for role, pool in pages
    )
    return tensors[0] if len(tensors) == 1 else (tensors[0], tensors[1])


def to_vllm(
    tensor_or_pair: BlockPagedTensor | tuple[BlockPagedTensor, BlockPagedTensor],
    *,
    kv_cache_layout: str = "NHD",
    combined: str = "2NBHD",
    max_blocks: int | None = None,
) -> tuple[Array, Array, Array]:
    """``(kv_cache, block_table, seq_lens)`` in vLLM's forms (see the module docstring).

    The cache of one NHD tensor is its pool (no copy); pairs and HND are new arrays. The
    block table is ``[num_reqs, max_blocks]`` int32 padded with 0 (``max_blocks`` defaults
    to the longest sequence's page count); seq_lens int32 (every page full when the tensor
    has no seq_lens).
    """
    layout = check_choice(kv_cache_layout, "kv_cache_layout", _LAYOUTS)
    form = check_choice(combined, "combined", COMBINED_FORMS)
    if isinstance(tensor_or_pair, BlockPagedTensor):
        tensor = tensor_or_pair
        pool = tensor.unpacked_page_pool()
        if tensor.kv_role == "fused" and tensor.shape[1] == 1:
            if layout != "NHD":
                raise InvalidTensorError(
                    "an MLA cache has no head axis to swap", field="kv_cache_layout", found=layout
                )
            cache = pool[:, :, 0, :]
        else:
            cache = np.ascontiguousarray(_nhd(pool, layout))
    else:
        key, value = check_pair(tensor_or_pair, "tensor_or_pair")
        tensor = key
        k = _nhd(key.unpacked_page_pool(), layout)
        v = _nhd(value.unpacked_page_pool(), layout)
        if form == "2NBHD":
            cache = np.stack((k, v))
        elif form == "N2BHD":
            cache = np.stack((k, v), axis=1)
        else:
            cache = np.concatenate((k, v), axis=3)
    width = None if max_blocks is None else check_int(max_blocks, "max_blocks")
    return cache, padded_table(tensor, width), lens_of(tensor)
