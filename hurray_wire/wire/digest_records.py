"""The integrity records as whole records (docs/integrity.md): a fixed head, then ``arrays``
runs of ``count`` u64 (digests or page ids), packed and located here.

A page-digest section payload holds one run, a page-refs payload two (page ids, then
digests), a sorted known-pages record one (then its seal, wire/seal.py). Validation (the
head's values, counts against limits, sortedness) stays in ``hurray_wire.integrity``;
this says where each item sits, so that its errors name byte offsets without restating one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from hurray_wire.wire import integrity as w
from hurray_wire.wire.fast import FastStruct, derive, item_dtype

ITEM_DTYPE = item_dtype(w.DIGEST_ITEM)  # one digest or page id on the wire
ITEM_SIZE: int = w.DIGEST_ITEM.sizeof()
_ITEM = np.dtype(ITEM_DTYPE)


@dataclass(frozen=True)
class DigestRecord:
    """A head and the runs of u64 after it: their packing and their byte offsets."""

    head: FastStruct
    arrays: int  # runs of ``count`` items after the head
    start: int = field(init=False)  # where the first run starts: the head's size

    def __post_init__(self) -> None:
        object.__setattr__(self, "start", self.head.size)

    def at(self, count: int, array: int = 0, item: int = 0) -> int:
        """Byte offset of ``item`` of run ``array`` in a record of ``count`` items a run
        (``at(count, arrays)`` is where the runs end)."""
        return self.start + ITEM_SIZE * (array * count + item)

    def count_of(self, size: int) -> int | None:
        """The ``count`` of a record of ``size`` bytes (None: no whole number of items)."""
        run = ITEM_SIZE * self.arrays
        if size < self.start or (size - self.start) % run:
            return None
        return (size - self.start) // run

    def pack(self, *head: Any, runs: Sequence[npt.NDArray[Any]]) -> bytes:
        """The head's non-Const fields, then each run as little-endian u64."""
        return self.head.pack(*head) + b"".join(
            run.astype(_ITEM, copy=False).tobytes() for run in runs
        )

    def runs(self, view: Any, count: int) -> list[npt.NDArray[np.uint64]]:
        """Read-only views of the runs (the caller has checked that the bytes are there)."""
        step = ITEM_SIZE * count
        return [
            np.frombuffer(view, _ITEM, count, self.start + step * i) for i in range(self.arrays)
        ]


DIGEST_SECTION = DigestRecord(derive(w.DIGEST_SECTION_HEADER), 1)
COUNT_MAX = DIGEST_SECTION.head.limit("count")  # a u32 count
PAGE_REFS = DigestRecord(derive(w.PAGE_REFS_HEADER), 2)
KNOWN_PAGES = DigestRecord(derive(w.KNOWN_PAGES_HEADER), 1)
