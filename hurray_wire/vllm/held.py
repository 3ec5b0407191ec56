"""Pages a decode worker already holds for a request (vLLM's prefix cache), hashed where they
sit, so that they are checked rather than trusted (docs/vllm.md § prefix reuse).

vLLM asks the connector only for the tokens after its local prefix-cache hit. Those held
blocks are read out of the decode engine's own cache (the adapter's reading of the
backend's layout: CPU_ATTN keeps each page's keys transposed, so a page in the Hurray layout
is never a region of vLLM's memory and cannot be hashed as one; a gather of the held blocks
only) and hashed now. The prefill worker sends the same pages as page references (digest,
no bytes: the delta protocol of docs/integrity.md § 5), filled from ``store``; every page
of the request before ``count`` must then equal the prefill worker's page of the same
position, digest for digest, or the load fails from the first that does not.
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
    """The first ``count`` pages of a request as the decode worker holds them: per layer each
    role's digests (key and value, or MLA's fused latent) in block order, and a store of
    their records (refs are filled from it)."""

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
        """The first block position below ``count`` whose held page differs from the page
        the transfer carries for it (in any layer or role), or None when all agree."""
        worst: int | None = None
        for roles, held in zip(layers, self.digests, strict=True):
            for pages, mine in zip(roles, held, strict=True):
                theirs = digests_of(pages[: self.count])
                bad = np.flatnonzero(theirs != mine)
                if bad.size and (worst is None or int(bad[0]) < worst):
                    worst = int(bad[0])
        return worst
