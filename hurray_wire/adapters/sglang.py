"""SGLang token-slot pools <-> BlockPagedTensor, as sglang 0.5.23's own code keeps them.

A pool is token slots, not pages: a page exists only because SGLang's paged allocator keeps
a page's slots contiguous and aligned (page id ``slot // page_size``, as its disaggregation
reads it), which is checked per token. docs/adapters.md tabulates the rest
(``sglang/srt/mem_cache/memory_pool.py``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hurray_wire._interop import _torch, as_numpy, is_torch
from hurray_wire.adapters._common import (
    Array,
    check_pair,
    engine_buffer,
    engine_dtype_name,
    engine_outputs,
    int32,
    int_vector,
    lens_of,
    per_tensor_scale,
    refuse_first,
    role_tensors,
)
from hurray_wire.errors import ArgumentTypeError, IndexBufferError, InvalidTensorError, instance
from hurray_wire.tensor import BlockPagedTensor
from hurray_wire.transforms._common import check_int

__all__ = ["from_sglang", "from_sglang_mla", "to_sglang", "to_sglang_mla"]

_LAYOUTS = ("nhd", "hnd")
_SCALE_RULE = "SGLang keeps one per layer (layers/quantization/kv_cache.py)"


def _layout(value: object) -> str:
    if not isinstance(value, str) or value.lower() not in _LAYOUTS:
        raise ArgumentTypeError(
            "kv_cache_layout must be SGLang's pool.kv_cache_layout: 'nhd' or 'hnd'",
            field="kv_cache_layout",
            found=repr(value),
            expected=_LAYOUTS,
        )
    return value.lower()


def _pages(buffer: Any, name: str, page_size: int, layout: str, dtype: Any) -> Any:
    """The buffer as ``[num_pages, page_size, H, D]`` pages (a view, NumPy or torch kept)."""
    buffer = engine_buffer(buffer, name, dtype)
    shape = tuple(int(d) for d in buffer.shape)
    if layout == "hnd":
        if len(shape) != 4 or shape[2] != page_size:
            raise InvalidTensorError(
                f"an HND pool is [num_pages, H, page_size = {page_size}, D]",
                field=name,
                found=f"shape {shape}",
            )
        axes = (0, 2, 1, 3)
        return buffer.permute(*axes) if is_torch(buffer) else buffer.transpose(axes)
    if len(shape) != 3:
        hint = " (a 4-D buffer is the HND pool: pass kv_cache_layout='hnd')" * (len(shape) == 4)
        raise InvalidTensorError(
            f"an NHD pool is [size + page_size, H, D] token slots{hint}",
            field=name,
            found=f"shape {shape}",
        )
    whole = shape[0] // page_size  # trailing slots past the last whole page: never allocated
    if whole < 1:
        raise InvalidTensorError(
            f"the pool has fewer slots than one page of {page_size} (SGLang's padding page)",
            field=name,
            found=f"shape {shape}",
        )
    return buffer[: whole * page_size].reshape(whole, page_size, shape[1], shape[2])


#: SGLang's DSA fp8 MLA row (mem_cache/kv_cache_configurator.py ``calculate_mla_kv_cache_dim``,
#: ``DSATokenToKVPool``): ``kv_lora_rank`` fp8 values (a multiple of ``quant_block_size`` 128),
#: one float32 scale per 128 of them, then ``qk_rope_head_dim`` (64, or 0: kernels/ops/
#: quantization/dsa_quant_k_cache.py) rope values in bfloat16: ``132 * k + 2 * rope`` bytes.
_DSA_TILE_BYTES, _DSA_ROPE_BYTES = 128 + 4, (2 * 64, 0)


def _refuse_dsa_fp8_rows(pages: Any) -> None:
    """An fp8 E4M3 MLA row as wide as a DSA fp8 row mixes three element types: refused."""
    width = int(pages.shape[-1])
    if engine_dtype_name(pages.dtype) not in ("float8_e4m3fn", "float8_e4m3"):
        return
    if any(width > rope and (width - rope) % _DSA_TILE_BYTES == 0 for rope in _DSA_ROPE_BYTES):
        raise InvalidTensorError(
            "SGLang's DSA fp8 MLA pool (DSATokenToKVPool with dsa_kv_cache_store_fp8) is not "
            "supported: each row packs kv_lora_rank fp8 values, one float32 scale per 128 of "
            "them and the rope dims in bfloat16 (calculate_mla_kv_cache_dim), three element "
            "types that cannot travel as float8",
            field="kv_buffer",
            found=f"{width} fp8 bytes per token",
            expected="kv_lora_rank + qk_rope_head_dim fp8 values (a plain MLATokenToKVPool)",
        )


def _data_start(buffer: Any) -> int:
    """The address of a buffer's first element (torch or NumPy)."""
    if is_torch(buffer):
        return int(buffer.data_ptr())
    return int(np.asarray(buffer).__array_interface__["data"][0])


def _rows(req_to_token: Any, index: Array, width: int) -> Array:
    """``req_to_token[index, :width]`` as int64; only those rows come to host."""
    if is_torch(req_to_token):
        rows = _torch().from_numpy(index).to(req_to_token.device)
        return np.asarray(as_numpy(req_to_token[rows, :width].cpu(), "req_to_token"), np.int64)
    return np.asarray(req_to_token[index, :width], np.int64)


def _read(
    pools: list[tuple[str, Any]],
    req_to_token: Any,
    req_pool_indices: Any,
    seq_lens: Any,
    page_size: int,
    layer_index: int | None,
    scales: dict[str, float | None],
) -> BlockPagedTensor | tuple[BlockPagedTensor, BlockPagedTensor]:
    """The requests' pages of ``pools`` as tensors, every rule of SGLang checked."""
    if req_pool_indices is None or seq_lens is None:
        raise ArgumentTypeError(
            "pass req_pool_indices (the batch's rows of req_to_token: forward_batch."
            "req_pool_indices or [req.req_pool_idx, ...]) and seq_lens; request i is never "
            "row i (row 0 is ReqToTokenPool's padding row)",
            field="req_pool_indices" if req_pool_indices is None else "seq_lens",
            found=None,
        )
    shape = tuple(getattr(req_to_token, "shape", ()))
    kind = str(getattr(req_to_token, "dtype", "")).removeprefix("torch.")
    if len(shape) != 2 or not kind.startswith(("int", "uint")):
        raise IndexBufferError(
            "req_to_token must be ReqToTokenPool.req_to_token, a 2-D integer table",
            field="req_to_token",
            found=f"{type(req_to_token).__name__}, dtype {kind or None}, shape {shape}",
        )
    rows, width = shape
    index = int_vector(req_pool_indices, "req_pool_indices")
    lens = int_vector(seq_lens, "seq_lens")
    if len(index) != len(lens):
        raise IndexBufferError(
            "one seq_lens entry per req_pool_indices entry",
            field="seq_lens",
            found=len(lens),
            expected=len(index),
        )
    refused = np.flatnonzero((index == 0) | (index >= rows))  # one pass, the first named
    if refused.size:
        position, row = int(refused[0]), int(index[refused[0]])
        why = "row 0 is ReqToTokenPool's padding row (drop padded batch entries)"
        raise IndexBufferError(
            why if row == 0 else "row outside req_to_token",
            position=position,
            field="req_pool_indices",
            found=row,
            expected=f"1..{rows - 1}",
        )
    too_long = "request {} is longer than max_context_len"
    refuse_first(lens > width, lens, too_long, "seq_lens", expected=f"<= {width}")
    longest = int(lens.max()) if lens.size else 0
    table = _rows(req_to_token, index, longest)
    cols = np.arange(longest)[None, :]
    used = cols < lens[:, None]
    slots = table[used]
    pos = np.broadcast_to(cols, table.shape)[used]
    num_slots = int(pools[0][1].shape[0]) * page_size
    offset = pos % page_size
    page_start = slots[np.arange(len(slots)) - offset]
    rules = (
        ((slots < page_size) | (slots >= num_slots), "is in the padding page or outside the "
         "pool", f"{page_size}..{num_slots - 1}"),
        ((slots != page_start + offset) | (page_start % page_size != 0), "is not contiguous "
         f"and page-aligned within its page of {page_size} (SGLang's paged allocator)",
         "slot % page_size == token % page_size"),
    )  # fmt: skip
    for broken, why, expected in rules:
        if broken.any():
            bad = int(np.argmax(broken))
            seq = int(np.searchsorted(np.cumsum(lens), bad, side="right"))
            raise IndexBufferError(f"request {seq}: token {int(pos[bad])}'s slot {why}",
                                   position=bad, field="req_to_token", found=int(slots[bad]),
                                   expected=expected)  # fmt: skip
    block_table = slots[offset == 0] // page_size
    seq_ptr = np.concatenate(([0], np.cumsum(-(-lens // page_size)))).astype(np.int64)
    return role_tensors(pools, block_table, seq_ptr, lens, layer_index, scales)


def from_sglang(
    k_buffer: Any,
    v_buffer: Any,
    req_to_token: Any,
    req_pool_indices: Any = None,
    seq_lens: Any = None,
    *,
    page_size: int,
    kv_cache_layout: str = "nhd",
    dtype: Any = None,
    k_scale: Any = None,
    v_scale: Any = None,
    layer_index: int | None = None,
) -> tuple[BlockPagedTensor, BlockPagedTensor]:
    """The ``(key, value)`` pair of one layer of an ``MHATokenToKVPool`` (``pool.k_buffer[layer]``
    with ``dtype=pool.dtype`` for fp8); request ``i`` is row ``req_pool_indices[i]`` of
    ``req_to_token`` (docs/adapters.md § SGLang)."""
    size = check_int(page_size, "page_size", minimum=1)
    layout = _layout(kv_cache_layout)
    k_pages = _pages(k_buffer, "k_buffer", size, layout, dtype)
    v_pages = _pages(v_buffer, "v_buffer", size, layout, dtype)
    if tuple(k_pages.shape) != tuple(v_pages.shape):
        if _data_start(v_buffer) == _data_start(k_buffer) and int(k_pages.shape[2]) == 1:
            why = (
                "the value buffer is the start of the key buffer, as an MLATokenToKVPool's "
                "get_kv_buffer gives them (one kv_buffer, the value its first kv_lora_rank "
                "dims): read its kv_buffer with from_sglang_mla"
            )
        else:
            why = (
                "an MHATokenToKVPool built with v_head_dim != head_dim (memory_pool.py) is "
                "not supported: a (key, value) pair has one head size"
            )
        raise InvalidTensorError(
            f"k_buffer and v_buffer differ in shape: {why}",
            field="v_buffer",
            found=tuple(v_pages.shape),
            expected=tuple(k_pages.shape),
        )
    scales = {"key": per_tensor_scale(k_scale, "k_scale", _SCALE_RULE),
              "value": per_tensor_scale(v_scale, "v_scale", _SCALE_RULE)}  # fmt: skip
    pools = [("key", k_pages), ("value", v_pages)]
    pair = _read(pools, req_to_token, req_pool_indices, seq_lens, size, layer_index, scales)
    assert isinstance(pair, tuple)  # two roles
    return pair


def from_sglang_mla(
    kv_buffer: Any,
    req_to_token: Any,
    req_pool_indices: Any = None,
    seq_lens: Any = None,
    *,
    page_size: int,
    dtype: Any = None,
    kv_scale: Any = None,
    layer_index: int | None = None,
) -> BlockPagedTensor:
    """One layer of an ``MLATokenToKVPool`` (``pool.kv_buffer[layer]``) as one ``"fused"``
    tensor of one head; otherwise as ``from_sglang``."""
    size = check_int(page_size, "page_size", minimum=1)
    pages = _pages(kv_buffer, "kv_buffer", size, "nhd", dtype)
    if int(pages.shape[2]) != 1:
        raise InvalidTensorError(
            "an MLA pool is [size + page_size, 1, kv_cache_dim]",
            field="kv_buffer",
            found=f"shape {tuple(kv_buffer.shape)}",
        )
    _refuse_dsa_fp8_rows(pages)
    scales = {"fused": per_tensor_scale(kv_scale, "kv_scale", _SCALE_RULE)}
    tensor = _read([("fused", pages)], req_to_token, req_pool_indices, seq_lens, size,
                   layer_index, scales)  # fmt: skip
    assert isinstance(tensor, BlockPagedTensor)  # one role
    return tensor


def _requests(
    tensor: BlockPagedTensor, req_pool_indices: Any, max_context_len: int | None
) -> tuple[Array, Array, int, int]:
    """``(rows, lens, max_context_len, num_rows)`` of the request table to write."""
    lens = lens_of(tensor).astype(np.int64)
    n = len(lens)
    if req_pool_indices is None:
        rows = np.arange(1, n + 1, dtype=np.int64)
    else:
        rows = int_vector(req_pool_indices, "req_pool_indices")
        if len(rows) != n:
            raise IndexBufferError(
                "one req_pool_indices entry per sequence",
                field="req_pool_indices",
                found=len(rows),
                expected=n,
            )
        if (rows == 0).any() or len(np.unique(rows)) != n:
            bad = int(np.argmax(rows == 0)) if (rows == 0).any() else -1
            raise IndexBufferError(
                "rows must be distinct and never 0 (ReqToTokenPool's padding row)",
                position=bad if bad >= 0 else None,
                field="req_pool_indices",
                found=rows.tolist()[:8],
            )
    longest = int(lens.max()) if lens.size else 0
    width = longest if max_context_len is None else check_int(max_context_len, "max_context_len")
    if width < longest:
        raise InvalidTensorError(
            "max_context_len is below the longest request",
            field="max_context_len",
            found=width,
            expected=f">= {longest}",
        )
    return rows, lens, width, int(rows.max()) + 1 if n else 1


def _to_sglang(
    tensors: tuple[BlockPagedTensor, ...],
    names: tuple[str, ...],
    req_pool_indices: Any,
    max_context_len: int | None,
    layout: str,
    as_torch: bool,
) -> Any:
    """The pools as SGLang's buffers, then ``req_to_token``, ``req_pool_indices``, ``seq_lens``;
    page 0 is SGLang's padding: a pool whose page 0 is used gets a zero page in front."""
    tensor = tensors[0]
    rows, lens, width, height = _requests(tensor, req_pool_indices, max_context_len)
    pools = [t.unpacked_page_pool() for t in tensors]
    table = tensor.block_table.astype(np.int64)
    if table.size and int(table.min()) == 0:
        pools = [np.concatenate((np.zeros((1, *p.shape[1:]), p.dtype), p)) for p in pools]
        table = table + 1
    size = tensor.layout.page_size
    seq_of = np.repeat(np.arange(len(lens)), lens)
    pos = np.arange(int(lens.sum())) - np.repeat(np.cumsum(lens) - lens, lens)
    entries = tensor.seq_ptr[:-1].astype(np.int64)[seq_of] + pos // size
    req_to_token = np.zeros((height, width), np.int32)  # 0: SGLang's dummy slot
    req_to_token[rows[seq_of], pos] = int32(table[entries] * size + pos % size, "req_to_token")
    if layout == "hnd":
        buffers = [np.ascontiguousarray(p.transpose(0, 2, 1, 3)) for p in pools]
    else:
        buffers = [p.reshape(-1, *p.shape[2:]) for p in pools]
    out = (*buffers, req_to_token, rows, lens)
    return engine_outputs(out, (*names, "req_to_token", "req_pool_indices", "seq_lens"), as_torch)


def to_sglang(
    pair: tuple[BlockPagedTensor, BlockPagedTensor],
    *,
    req_pool_indices: Any = None,
    max_context_len: int | None = None,
    kv_cache_layout: str = "nhd",
    as_torch: bool = False,
) -> tuple[Any, Any, Any, Any, Any]:
    """``(k_buffer, v_buffer, req_to_token, req_pool_indices, seq_lens)`` as SGLang keeps
    them, request ``i`` in row ``req_pool_indices[i]`` (default ``1..n``; row 0 is SGLang's
    padding row); NHD pools are views unless page 0, SGLang's padding page, is used."""
    pair = check_pair(pair, "pair")
    layout = _layout(kv_cache_layout)
    result: tuple[Any, Any, Any, Any, Any] = _to_sglang(
        pair, ("k_buffer", "v_buffer"), req_pool_indices, max_context_len, layout, as_torch
    )
    return result


def to_sglang_mla(
    tensor: BlockPagedTensor,
    *,
    req_pool_indices: Any = None,
    max_context_len: int | None = None,
    as_torch: bool = False,
) -> tuple[Any, Any, Any, Any]:
    """``(kv_buffer, req_to_token, req_pool_indices, seq_lens)`` of an MLA pool from a
    ``"fused"`` tensor of one head; the rest as ``to_sglang``."""
    if instance(tensor, BlockPagedTensor, "tensor").kv_role != "fused" or tensor.shape[1] != 1:
        raise InvalidTensorError(
            "an MLA pool holds a 'fused' tensor of one head",
            field="tensor",
            found=f"kv_role {tensor.kv_role!r}, {tensor.shape[1]} heads",
        )
    result: tuple[Any, Any, Any, Any] = _to_sglang(
        (tensor,), ("kv_buffer",), req_pool_indices, max_context_len, "nhd", as_torch
    )
    return result
