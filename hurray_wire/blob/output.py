"""Output memory for ``encode()``: large blocks recycled once the caller drops a blob (a
fresh 128 MiB array faults on every page, 0.6-1x the copy; pyarrow's pool does the same),
idle ones bounded in bytes."""

from __future__ import annotations

import threading
import weakref

import numpy as np

from hurray_wire.buffers import U8Array

__all__ = ["OUTPUT_POOL", "OutputPool"]

_MIN_POOLED = 1 << 20  # below this, page faults are not worth a pool
_ROUND = 2 << 20  # capacities in multiples of a huge page


class OutputPool:
    """Recycles encode()'s output blocks; at most ``max_idle_bytes`` of them wait idle."""

    def __init__(self, max_idle_bytes: int = 512 << 20) -> None:
        self.max_idle_bytes = max_idle_bytes
        self._idle: list[U8Array] = []
        self._idle_bytes = 0
        self._lock = threading.Lock()

    def take(self, size: int) -> U8Array:
        """A writable uint8 array of exactly ``size`` bytes (contents undefined)."""
        if size < _MIN_POOLED:
            return np.empty(size, np.uint8)
        block = self._reuse(size)
        if block is None:
            block = np.empty(-(-size // _ROUND) * _ROUND, np.uint8)
        lent: U8Array = block[:size]
        weakref.finalize(lent, self._give_back, block)
        return lent

    def _reuse(self, size: int) -> U8Array | None:
        """The smallest idle block that holds ``size`` bytes and is at most twice that."""
        with self._lock:
            fits = [b.size for b in self._idle if size <= b.size <= 2 * size]
            if not fits:
                return None
            block = self._idle.pop([b.size for b in self._idle].index(min(fits)))
            self._idle_bytes -= block.size
            return block

    def _give_back(self, block: U8Array) -> None:
        with self._lock:
            if block.size > self.max_idle_bytes:
                return
            while self._idle and self._idle_bytes + block.size > self.max_idle_bytes:
                self._idle_bytes -= self._idle.pop(0).size  # the oldest goes first
            self._idle.append(block)
            self._idle_bytes += block.size

    def clear(self) -> None:
        """Release every idle block to the operating system."""
        with self._lock:
            self._idle = []
            self._idle_bytes = 0

    @property
    def idle_bytes(self) -> int:
        return self._idle_bytes


#: The pool ``encode()`` uses; ``OUTPUT_POOL.max_idle_bytes = 0`` turns recycling off.
OUTPUT_POOL = OutputPool()
