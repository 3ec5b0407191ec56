"""Memo caches bounded by entries *and* bytes, so hostile inputs cannot make them grow.

Decoders memoise verdicts on header bytes (equal bytes, equal verdict). A cache bounded by
entry count alone lets a peer pin gigabytes with a few huge, valid headers; this one also
counts the bytes of its keys and values (as the caller sizes them) and forgets everything
when either bound would be passed. Clearing rather than evicting one entry keeps every
operation O(1) and the common case (a few geometries, reused) unaffected.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

__all__ = ["BoundedMemo"]

V = TypeVar("V")


class BoundedMemo(Generic[V]):
    """A dict-like memo with at most ``max_entries`` entries and ``max_bytes`` bytes.

    Safe to share between threads: a reader sees either a complete entry or none.
    """

    def __init__(self, max_entries: int, max_bytes: int) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._bytes = 0
        self._lock = threading.Lock()
        self._reset()

    def _reset(self) -> None:
        self._items: dict[Hashable, V] = {}
        #: The value memoised under a key, or None (the dict's own ``get``: on hot paths).
        self.get: Callable[[Hashable], V | None] = self._items.get
        self._bytes = 0

    def put(self, key: Hashable, value: V, size: int) -> None:
        """Remember ``value`` under ``key``; ``size`` is what the entry keeps alive."""
        if size > self.max_bytes:
            return  # larger than the whole cache: not worth keeping
        with self._lock:
            if len(self._items) >= self.max_entries or self._bytes + size > self.max_bytes:
                self._reset()
            if key not in self._items:
                self._bytes += size
            self._items[key] = value

    def clear(self) -> None:
        with self._lock:
            self._reset()

    @property
    def nbytes(self) -> int:
        """Bytes the entries are accounted for."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._items)
