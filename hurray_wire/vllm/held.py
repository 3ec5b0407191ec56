"""Pages a decode worker already holds for a request (vLLM's prefix cache), checked rather than
trusted (docs/vllm.md § prefix reuse): read through the adapter (a page in the Hurray layout
is not a region of every backend's memory) and hashed; the prefill worker sends them as page
references (docs/integrity.md § 5), and each must match its digest or the load fails there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from hurray_wire.integrity.digests import DigestArray, page_digests
from hurray_wire.integrity.page_store import MemoryPageStore, store_pages
from hurray_wire.tensor import BlockPagedTensor
from hurray_wire.vllm.params import one_sequence

__all__ = ["HeldPages"]

Pages = npt.NDArray[Any]  # [pages, block_size, heads, head_dim], page i = request block i


def _tensor(pages: Pages) -> BlockPagedTensor:
    return one_sequence(np.ascontiguousarray(pages), pages.shape[0] * pages.shape[1])


def digests_of(pages: Pages) -> DigestArray:
    """One page digest per page, in order (the digests page references carry)."""
    return page_digests(_tensor(pages)) if pages.shape[0] else np.zeros(0, np.uint64)


@dataclass
class HeldPages:
    """The first ``count`` pages of a request: per layer each role's digests in block order,
    and a store of their records (refs are filled from it)."""

    count: int
    digests: list[tuple[DigestArray, ...]]
    store: MemoryPageStore

    @classmethod
    def from_pages(cls, layers: Sequence[tuple[Pages, ...]]) -> HeldPages:
        """``layers``: per layer, the held pages of each role read from the engine."""
        count = layers[0][0].shape[0] if layers else 0
        total = sum(p.nbytes for roles in layers for p in roles)
        store = MemoryPageStore(total)
        digests = []
        for roles in layers:
            for pages in roles:
                if pages.shape[0]:
                    store_pages(store, _tensor(pages))
            digests.append(tuple(digests_of(pages) for pages in roles))
        return cls(count, digests, store)

    def first_mismatch(self, layers: Sequence[tuple[Pages, ...]]) -> int | None:
        """The first block position below ``count`` whose held page differs from the
        transfer's (in any layer or role), or None."""
        worst: int | None = None
        for roles, held in zip(layers, self.digests, strict=True):
            for pages, mine in zip(roles, held, strict=True):
                theirs = digests_of(pages[: self.count])
                bad = np.flatnonzero(theirs != mine)
                if bad.size and (worst is None or int(bad[0]) < worst):
                    worst = int(bad[0])
        return worst
