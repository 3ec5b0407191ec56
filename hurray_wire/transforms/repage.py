"""Re-paging: the same tokens per sequence on pages of another size. A new page is named by
the source slots it holds (up to the source capacity), so new pages with equal slot lists
are one physical page and sharing survives; pages numbered in first-reference order,
positions past the source capacity zero (scale 1.0, zero point 0: [A15]).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from hurray_wire._interop import first_reference_order
from hurray_wire.errors import InvalidTensorError
from hurray_wire.model.quantization import PerBlockAffine
from hurray_wire.tensor_core import TensorT
from hurray_wire.transforms._common import (
    check_int,
    check_tensor,
    flat_pool,
    rebuild,
    token_counts,
    token_slots,
    with_fingerprint,
)

__all__ = ["MAX_PAGE_SIZE", "repage"]

#: The largest page size ``repage`` builds: every new page costs ``page_size`` slots of
#: pool (and of the slot map that finds them) however few tokens it holds, so 2^20 took
#: 17 s for three tokens and 2^40 ended in a MemoryError. Engines page 1 to 1,024 tokens.
MAX_PAGE_SIZE = 1 << 16


def repage(tensor: TensorT, page_size: object) -> TensorT:
    """The tensor on pages of ``page_size`` tokens (any size >= 1)."""
    check_tensor(tensor)
    size = check_int(page_size, "page_size", minimum=1, maximum=MAX_PAGE_SIZE)
    quant = tensor.quantization
    if isinstance(quant, PerBlockAffine) and (size < 2 or size & (size - 1)):
        raise InvalidTensorError(
            "a per-block quantized tensor needs a power-of-two page_size >= 2 "
            "(block_size == page_size, [A9])",
            field="page_size",
            found=size,
        )
    lens = token_counts(tensor)
    pages_per_seq = -(-lens // size)
    new_entries = int(pages_per_seq.sum()) if lens.size else 0
    # A new page holds every source slot its positions reach, up to the sequence's page
    # capacity (not just its tokens): so a partial last page that a longer sequence fills
    # stays one page for both, exactly as in the source.
    capacity = np.diff(tensor.seq_ptr.astype(np.int64)) * tensor.layout.page_size
    reach = np.minimum(capacity, pages_per_seq * size)
    slots = token_slots(tensor, reach)  # source slot of every reached position
    # Each position's place: logical new page (across the batch) and offset in it.
    seq_of = np.repeat(np.arange(len(lens), dtype=np.int64), reach)
    t = np.arange(len(slots), dtype=np.int64) - (np.cumsum(reach) - reach)[seq_of]
    entry_start = np.cumsum(pages_per_seq) - pages_per_seq
    entry = entry_start[seq_of] + t // size
    keys = np.full((new_entries, size), -1, np.int64)
    keys[entry, t % size] = slots
    # [new pages, size]: source slot of each new slot (-1 unused), pages in first-use order
    page_keys, table = first_reference_order(keys, axis=0) if new_entries else (keys, keys[:, 0])
    used = page_keys >= 0
    source = flat_pool(tensor)
    pool = np.zeros((len(page_keys) * size, *source.shape[1:]), source.dtype)
    flat_keys = page_keys.reshape(-1)
    flat_used = used.reshape(-1)
    pool[flat_used] = source[flat_keys[flat_used]]
    pool = pool.reshape((len(page_keys), size, *source.shape[1:]))
    new_quant = quant
    scales, zero_points = tensor.scales, tensor.zero_points
    if isinstance(quant, PerBlockAffine):
        assert scales is not None
        new_quant = dataclasses.replace(quant, block_size=size)
        scales = _per_slot(scales, flat_keys, flat_used, 1)
        if zero_points is not None:
            zero_points = _per_slot(zero_points, flat_keys, flat_used, 0)
    new_sp = np.concatenate(([0], np.cumsum(pages_per_seq))).astype(np.int64)
    keep_lens = tensor.seq_lens is not None or bool((lens % size).any())
    return rebuild(
        tensor,
        page_pool=pool,
        block_table=table,
        seq_ptr=new_sp,
        seq_lens=lens if keep_lens else None,
        scales=scales,
        zero_points=zero_points,
        quantization=new_quant,
        metadata=with_fingerprint(tensor, block_size=size),  # the engine's block size now
    )


def _per_slot(values: np.ndarray, keys: np.ndarray, used: np.ndarray, fill: int) -> np.ndarray:
    out = np.full(len(keys), fill, values.dtype)
    out[used] = values[keys[used]]
    return out
