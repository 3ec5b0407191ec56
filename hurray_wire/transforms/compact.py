"""Dropping unreferenced pages (renumbered in first-reference order, sharing kept: compact
is idempotent and a receiver's pool fills front to back), and which pages sequences share."""

from __future__ import annotations

import numpy as np

from hurray_wire._interop import first_reference_order
from hurray_wire.errors import ArgumentTypeError
from hurray_wire.model.quantization import PerBlockAffine
from hurray_wire.tensor_core import TensorCore, TensorT
from hurray_wire.transforms._common import Array, check_tensor, rebuild

__all__ = ["PAGES", "compact", "first_reference_order", "prefix_sharing", "referenced_pages"]

#: ``pages=`` of ``StreamWriter.write`` / ``NixlSender.publish``: only the pages the block
#: table references (the default: a request over an engine pool), or the whole pool.
PAGES = ("referenced", "all")


def compact(tensor: TensorT) -> TensorT:
    """The same sequences over a pool of only the pages the block table names."""
    old_ids, table = first_reference_order(check_tensor(tensor).block_table)
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


def referenced_pages(tensor: TensorT, pages: object = "referenced") -> tuple[TensorT, Array | None]:
    """What to send for ``pages=``: ``(tensor, None)`` for the whole pool (``"all"`` or all
    referenced), else ``(compact(tensor), old_ids)``, ``old_ids[i]`` the source of page ``i``."""
    if not isinstance(pages, str) or pages not in PAGES:
        raise ArgumentTypeError("pages is 'referenced' or 'all'", field="pages",
                                found=repr(pages))  # fmt: skip
    if pages == "all":
        return tensor, None
    num_pages = tensor.layout.num_pages
    table = tensor.block_table
    if table.size >= num_pages and np.unique(table).size == num_pages:
        return tensor, None  # every page is referenced: the pool goes as it is, no copy
    old_ids, _ = first_reference_order(table)
    return compact(tensor), old_ids


def prefix_sharing(tensor: TensorCore) -> dict[int, tuple[int, ...]]:
    """``{page_id: (seq, ...)}`` for every physical page that two or more block-table
    entries name, with the distinct sequences naming it in ascending order (one sequence
    naming a page twice gives a 1-tuple). Pages in ascending order."""
    table = check_tensor(tensor).block_table.astype(np.int64)
    if not table.size:
        return {}
    counts = np.bincount(table)
    shared = counts[table] >= 2
    pages: Array = np.diff(tensor.seq_ptr.astype(np.int64))  # uint64 counts: refused by repeat
    seq_of = np.repeat(np.arange(tensor.num_seqs, dtype=np.int64), pages)
    pairs = np.unique(np.stack((table[shared], seq_of[shared]), axis=1), axis=0)
    if not len(pairs):
        return {}
    pages, starts = np.unique(pairs[:, 0], return_index=True)
    groups = np.split(pairs[:, 1], starts[1:])
    return dict(zip(pages.tolist(), (tuple(g.tolist()) for g in groups), strict=True))
