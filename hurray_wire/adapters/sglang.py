"""SGLang token-slot pools <-> BlockPagedTensor.

SGLang keeps per layer ``k_buffer`` / ``v_buffer`` of ``[size + page_size, H, D]`` token
slots (the first page is padding: slot 0 is the dummy slot) and ``req_to_token``, a
``[max_reqs, max_context_len]`` int32 table of each request's token slots. With
``page_size > 1`` a page's slots are contiguous and page-aligned, so page id =
``slot // page_size`` and the pools reshape into page pools without a copy. Requests whose
slots within a page are not contiguous, or that touch the padding page, are refused.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hurray_wire.adapters._common import Array, array, check_pair, int32, int_vector, lens_of
from hurray_wire.errors import IndexBufferError, InvalidTensorError
from hurray_wire.tensor import BlockPagedTensor
from hurray_wire.transforms._common import check_int

__all__ = ["from_sglang", "to_sglang"]


def _pool(buffer: Any, name: str, page_size: int) -> Array:
    slots = array(buffer, name)
    if slots.ndim != 3 or slots.shape[0] % page_size or slots.shape[0] < page_size:
        raise InvalidTensorError(
            f"expected [size + page_size, H, D] with a multiple of page_size = {page_size} slots",
            field=name,
            found=f"shape {slots.shape}",
        )
    return slots.reshape(slots.shape[0] // page_size, page_size, *slots.shape[1:])


def from_sglang(
    k_buffer: Any,
    v_buffer: Any,
    req_to_token: Any,
    seq_lens: Any,
    *,
    page_size: int,
    layer_index: int | None = None,
    req_pool_indices: Any = None,
) -> tuple[BlockPagedTensor, BlockPagedTensor]:
    """The ``(key, value)`` pair of one layer. Request ``s`` is row
    ``req_pool_indices[s]`` of ``req_to_token`` (default: row ``s``)."""
    size = check_int(page_size, "page_size", minimum=1)
    k_pool = _pool(k_buffer, "k_buffer", size)
    v_pool = _pool(v_buffer, "v_buffer", size)
    if k_pool.shape != v_pool.shape:
        raise InvalidTensorError(
            "k_buffer and v_buffer differ in shape",
            field="v_buffer",
            found=v_pool.shape,
            expected=k_pool.shape,
        )
    lens = int_vector(seq_lens, "seq_lens")
    table = array(req_to_token, "req_to_token")
    if table.ndim != 2 or (table.size and table.dtype.kind not in "iu"):
        raise IndexBufferError(
            "req_to_token must be a 2-D integer table",
            field="req_to_token",
            found=f"dtype {table.dtype}, shape {table.shape}",
        )
    if req_pool_indices is None:
        if table.shape[0] < len(lens):
            raise IndexBufferError(
                "req_to_token has fewer rows than requests",
                field="req_to_token",
                found=table.shape[0],
                expected=f">= {len(lens)}",
            )
        rows = table[: len(lens)]
    else:
        index = int_vector(req_pool_indices, "req_pool_indices")
        if len(index) != len(lens) or (index.size and int(index.max()) >= table.shape[0]):
            raise IndexBufferError(
                "req_pool_indices: one row of req_to_token per request",
                field="req_pool_indices",
                found=index.tolist()[:8],
            )
        rows = table[index]
    width = rows.shape[1]
    if lens.size and int(lens.max()) > width:
        seq = int(np.argmax(lens > width))
        raise IndexBufferError(
            f"request {seq} is longer than max_context_len",
            position=seq,
            field="seq_lens",
            found=int(lens[seq]),
            expected=f"<= {width}",
        )
    cols = np.arange(width)[None, :]
    used = cols < lens[:, None]
    slots = rows[used].astype(np.int64)
    pos = np.broadcast_to(cols, rows.shape)[used]
    num_slots = k_pool.shape[0] * size
    outside = (slots < size) | (slots >= num_slots)
    if outside.any():
        bad = int(np.argmax(outside))
        raise IndexBufferError(
            f"token slot at used entry {bad} is in the padding page or outside the pool",
            position=bad,
            field="req_to_token",
            found=int(slots[bad]),
            expected=f"{size}..{num_slots - 1}",
        )
    offset = pos % size
    starts = np.arange(len(slots)) - offset
    page_start = slots[starts]
    broken = (slots != page_start + offset) | (page_start % size != 0)
    if broken.any():
        bad = int(np.argmax(broken))
        seq = int(np.searchsorted(np.cumsum(lens), bad, side="right"))
        raise IndexBufferError(
            f"request {seq}: token {int(pos[bad])}'s slot is not contiguous and page-aligned "
            f"within its page of {size}",
            position=bad,
            field="req_to_token",
            found=int(slots[bad]),
            expected=int(page_start[bad]) + int(offset[bad])
            if page_start[bad] % size == 0
            else f"a page start (multiple of {size})",
        )
    block_table = slots[offset == 0] // size
    seq_ptr = np.concatenate(([0], np.cumsum(-(-lens // size)))).astype(np.int64)
    key, value = (
        BlockPagedTensor.from_arrays(
            pool, block_table, seq_ptr, seq_lens=lens, kv_role=role, layer_index=layer_index
        )
        for role, pool in (("key", k_pool), ("value", v_pool))
    )
    return key, value


def to_sglang(
    pair: tuple[BlockPagedTensor, BlockPagedTensor], *, max_context_len: int | None = None
) -> tuple[Array, Array, Array, Array]:
    """``(k_buffer, v_buffer, req_to_token, seq_lens)``: request ``s`` in row ``s``.

    The buffers are the pools reshaped (no copy) when page 0 is unreferenced, as SGLang
    wants its padding page; otherwise a zero padding page is put in front (a copy) and
    every page id moves up by one. ``req_to_token`` is int32 padded with 0 (the dummy slot),
    ``max_context_len`` wide (default: the longest request).
    """
    key, value = check_pair(pair, "pair")
    size = key.layout.page_size
    table = key.block_table.astype(np.int64)
    k_pool, v_pool = key.unpacked_page_pool(), value.unpacked_page_pool()
    if table.size and int(table.min()) == 0:
        pad = np.zeros((1, *k_pool.shape[1:]), k_pool.dtype)
        k_pool, v_pool = np.concatenate((pad, k_pool)), np.concatenate((pad, v_pool))
        table = table + 1
    lens = lens_of(key).astype(np.int64)
    longest = int(lens.max()) if lens.size else 0
    width = longest if max_context_len is None else check_int(max_context_len, "max_context_len")
    if width < longest:
        raise InvalidTensorError(
            "max_context_len is below the longest request",
            field="max_context_len",
            found=width,
            expected=f">= {longest}",
        )
    total = int(lens.sum())
    seq_of = np.repeat(np.arange(len(lens)), lens)
    pos = np.arange(total) - np.repeat(np.cumsum(lens) - lens, lens)
    entries = key.seq_ptr[:-1].astype(np.int64)[seq_of] + pos // size
    req_to_token = np.zeros((len(lens), width), np.int32)
    req_to_token[seq_of, pos] = int32(table[entries] * size + pos % size, "req_to_token")
    shape = (-1, *k_pool.shape[2:])
    return k_pool.reshape(shape), v_pool.reshape(shape), req_to_token, int32(lens, "seq_lens")
