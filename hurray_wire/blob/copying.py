"""Copy a large buffer and hash it in the same pass: each chunk is hashed right after it is
copied, while still in cache, so a checksum costs no second pass over memory (the blob
encoder writing a pool, a decoder landing a pool in an engine's memory)."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import numpy.typing as npt

from hurray_wire import parallel

__all__ = ["COPY_CHUNK", "PARALLEL_CHUNK", "PARALLEL_HASH", "copy_and_hash"]

#: Copy-then-hash granularity: source and destination chunk together fit the 2 MiB L2 of
#: this machine's cores (512 KiB measured 1.15x memcpy against 1.33x for 1 MiB chunks).
COPY_CHUNK = 512 << 10
#: Chunks copied on two cores and hashed on the caller: best at 2-4 MiB.
PARALLEL_CHUNK = 4 << 20

#: Copy on two cores and hash on the caller. None (the default): when two cores are idle
#: (parallel.idle_cores). False: copying and hashing alternate on the calling thread
#: (docs/performance.md).
PARALLEL_HASH: bool | None = None


def copy_and_hash(
    dst: npt.NDArray[np.uint8], src: npt.NDArray[np.uint8], hasher: Any | None
) -> None:
    """Copy ``src`` into ``dst`` and feed ``dst`` to ``hasher`` (if any) in order, each
    chunk while it is still in cache.

    With a second idle core, a pool thread and the caller both copy chunks, taken in
    order from one counter (two cores copy ~1.3x faster than one), and the caller hashes
    every chunk as soon as it and the ones before it are copied. If the pool thread never
    starts, the caller copies everything itself. On a machine whose other cores are busy
    the serial path is taken: a second thread there makes it slower, not faster.
    """
    size = src.nbytes
    if size < 2 * PARALLEL_CHUNK or not (
        PARALLEL_HASH if PARALLEL_HASH is not None else parallel.idle_cores() >= 2
    ):
        if hasher is None:
            dst[...] = src
            return
        for start in range(0, size, COPY_CHUNK):
            chunk = dst[start : start + COPY_CHUNK]
            chunk[...] = src[start : start + COPY_CHUNK]
            hasher.update(chunk.data)
        return
    step = PARALLEL_CHUNK
    count = -(-size // step)
    copied = [threading.Event() for _ in range(count)]
    failures: list[BaseException] = []
    lock = threading.Lock()
    cursor = [0]

    def copy_next() -> bool:
        with lock:
            k = cursor[0]
            if k >= count:
                return False
            cursor[0] = k + 1
        try:
            dst[k * step : (k + 1) * step] = src[k * step : (k + 1) * step]
        except BaseException as exc:  # re-raised on the caller
            failures.append(exc)
        finally:
            copied[k].set()
        return True

    def helper() -> None:
        while copy_next():
            pass

    pool_copier = parallel.submit(helper)
    for k in range(count):
        while not copied[k].is_set():
            if not copy_next():
                copied[k].wait()
        if failures:
            break
        if hasher is not None:
            hasher.update(dst[k * step : (k + 1) * step].data)
    if pool_copier is not None and not pool_copier.cancel():
        pool_copier.result()
    if failures:
        raise failures[0]
