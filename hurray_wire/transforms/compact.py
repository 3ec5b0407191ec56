"""Dropping unreferenced pages, and reporting which pages sequences share.

``compact`` renumbers the referenced pages in first-reference order (the order a reader
walking the block table meets them), so compacting a compact tensor changes nothing and a
receiver's pool fills front to back. Sharing is preserved: every block-table entry naming
one old page names the same new page.
"""

from __future__ import annotations

import numpy as np

from hurray_wire._interop import first_reference_order
from hurray_wire.model.quantization import PerBlockAffine
from hurray_wire.tensor import BlockPagedTensor
from hurray_wire.transforms._common import rebuild

__all__ = ["compact", "first_reference_order", "prefix_sharing"]


def compact(tensor: BlockPagedTensor) -> BlockPagedTensor:
    """The same sequences over a pool of only the pages the block table names."""
    old_ids, table = first_reference_order(tensor.block_table)
    pool = tensor.unpacked_page_pool()[old_ids]
    scales, zero_points = tensor.scales, tensor.zero_points
    if isinstance(tensor.quantization, PerBlockAffine):  # per page slot: move with the page
        page_size = tensor.layout.page_size
        assert scales is not None
        scales = scales.reshape(-1, page_size)[old_ids].reshape(-1)
        if zero_points is not None:
            zero_points = zero_points.reshape(-1, page_size)[old_ids].reshape(-1)
    return rebuild(tensor, page_pool=pool, block_table=table, scales=scales,
                   zero_points=zero_points)  # fmt: skip


def prefix_sharing(tensor: BlockPagedTensor) -> dict[int, tuple[int, ...]]:
    """``{page_id: (seq, ...)}`` for every physical page that two or more block-table
    entries name, with the distinct sequences naming it in ascending order (one sequence
    naming a page twice gives a 1-tuple). Pages in ascending order."""
    table = tensor.block_table.astype(np.int64)
    if not table.size:
        return {}
    counts = np.bincount(table)
    shared = counts[table] >= 2
    seq_of = np.repeat(np.arange(tensor.num_seqs, dtype=np.int64), np.diff(tensor.seq_ptr))
    pairs = np.unique(np.stack((table[shared], seq_of[shared]), axis=1), axis=0)
    if not len(pairs):
        return {}
    pages, starts = np.unique(pairs[:, 0], return_index=True)
    groups = np.split(pairs[:, 1], starts[1:])
    return dict(zip(pages.tolist(), (tuple(g.tolist()) for g in groups), strict=True))
