"""The plan cache of a ``Decoder`` or ``Encoder``, bounded by entries *and* by what they keep
alive (:func:`weight`, checked against measured memory by tests/test_codec_objects.py), so
a few huge valid headers cannot pin gigabytes; past a bound it forgets everything."""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

__all__ = ["PER_BYTE", "PER_ENTRY", "BoundedMemo", "weight"]

V = TypeVar("V")

#: What a cache entry keeps alive, by the bytes it was built from: the Python objects of a
#: parsed header measure 5-17 bytes per header byte (tests/test_codec_objects.py checks
#: the bound against the memory a full cache holds), plus the cache's slot and the key.
PER_BYTE = 32
PER_ENTRY = 1024


def weight(nbytes: int) -> int:
    """The weight of a cache entry built from ``nbytes`` bytes (a header, a descriptor)."""
    return PER_ENTRY + PER_BYTE * nbytes


class BoundedMemo(Generic[V]):
    """A dict-like cache of at most ``max_entries`` entries and ``max_bytes`` (of the weights
    ``put`` is given); thread-safe: a reader sees a complete entry or none."""

    def __init__(self, max_entries: int, max_bytes: int) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._bytes = 0
        self._lock = threading.Lock()
        self._reset()

    def _reset(self) -> None:
        self._items: dict[Hashable, V] = {}
        #: The value cached under a key, or None (the dict's own ``get``: on hot paths).
        self.get: Callable[[Hashable], V | None] = self._items.get
        self._bytes = 0

    def put(self, key: Hashable, value: V, size: int) -> V:
        """Remember ``value`` under ``key``; ``size``: the bytes the entry keeps alive (key,
        value and the cache's own slot). Returns ``value``."""
        if size > self.max_bytes:
            return value  # larger than the whole cache: not worth keeping
        with self._lock:
            if key in self._items:
                return value
            if len(self._items) >= self.max_entries or self._bytes + size > self.max_bytes:
                self._reset()
            self._bytes += size
            self._items[key] = value
        return value

    def clear(self) -> None:
        with self._lock:
            self._reset()

    @property
    def nbytes(self) -> int:
        """Bytes the entries keep alive, by their weights."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._items)
