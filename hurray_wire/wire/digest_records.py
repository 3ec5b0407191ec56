"""The integrity records as whole records (docs/integrity.md): a fixed head, then ``arrays``
runs of ``count`` u64 (digests or page ids), packed and located here.

A page-digest section payload holds one run, a page-refs payload two (page ids, then
digests), a sorted known-pages record one (then its seal, wire/seal.py). Validation (the
head's values, counts against limits, sortedness) stays in ``hurray_wire.integrity``;
this says where each item sits, so that its errors name byte offsets without restating one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from hurray_wire.wire import integrity as w
from hurray_wire.wire.fast import FastStruct, derive, item_dtype

__all__ = ["DIGEST_SECTION", "ITEM_DTYPE", "KNOWN_PAGES", "PAGE_REFS", "DigestRecord"]

ITEM_DTYPE = item_dtype(w.DIGEST_ITEM)  # one digest or page id on the wire
ITEM_SIZE: int = w.DIGEST_ITEM.sizeof()
COUNT_MAX: int = (1 << 8 * w.DIGEST_SECTION_HEADER.count.sizeof()) - 1  # a u32 count


@dataclass(frozen=True)
class DigestRecord:
    """A head and the runs of u64 after it: their packing and their byte offsets."""

    head: FastStruct
    arrays: int  # runs of ``count`` items after the head

    def at(self, count: int, array: int = 0, item: int = 0) -> int:
        """Byte offset of ``item`` of run ``array`` in a record of ``count`` items a run
        (``at(count, arrays)`` is where the runs end)."""
        return self.head.size + ITEM_SIZE * (array * count + item)

    def pack(self, *head: Any, runs: Sequence[npt.NDArray[Any]]) -> bytes:
        """The head's non-Const fields, then each run as little-endian u64."""
        return self.head.pack(*head) + b"".join(
            run.astype(ITEM_DTYPE, copy=False).tobytes() for run in runs
        )

    def runs(self, view: Any, count: int) -> tuple[npt.NDArray[np.uint64], ...]:
        """Read-only views of the runs (the caller has checked that the bytes are there)."""
        return tuple(
            np.frombuffer(view, ITEM_DTYPE, count, self.at(count, array))
            for array in range(self.arrays)
        )


DIGEST_SECTION = DigestRecord(derive(w.DIGEST_SECTION_HEADER), 1)
PAGE_REFS = DigestRecord(derive(w.PAGE_REFS_HEADER), 2)
KNOWN_PAGES = DigestRecord(derive(w.KNOWN_PAGES_HEADER), 1)
