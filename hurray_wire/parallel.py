"""Work on a second core, without ever waiting on it: :func:`for_each` runs tasks on the
caller *and* pool threads pulling from one counter, so a busy second core costs nothing
beyond the serial time (NumPy, xxhash and zstd release the GIL on large buffers)."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

__all__ = [
    "for_each",
    "idle_cores",
    "pool_exists",
    "resolve_threads",
    "run_tasks",
    "running_others",
    "shared_pool",
    "submit",
    "usable_cores",
    "using_pool",
]

T = TypeVar("T")

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity, not the machine's core count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


def resolve_threads(threads: int) -> int:
    """Threads to use, the caller included: -1 means every usable core that is idle right
    now (see :func:`idle_cores`), 0 and 1 mean the calling thread only."""
    if threads < 0:
        return idle_cores()
    return max(1, threads)


_LOADAVG = "/proc/loadavg"
_LOAD_TTL = 0.01  # seconds a reading of the run queue is reused
_load_reading: tuple[float, int] = (-1.0, 0)


def idle_cores() -> int:
    """Usable cores minus other work running now (/proc/loadavg, read at most every 10 ms),
    at least 1: a thread on a busy core makes Python threads slower than one."""
    global _load_reading
    cores = usable_cores()
    if cores == 1:
        return 1
    now = time.monotonic()
    taken, others = _load_reading
    if now - taken > _LOAD_TTL:
        others = running_others()
        _load_reading = (now, others)
    return max(1, cores - others)


def running_others() -> int:
    """Runnable tasks on the machine besides the reading thread, from /proc/loadavg."""
    try:
        with open(_LOADAVG, "rb") as handle:
            running = int(handle.read().split()[3].split(b"/")[0])
    except (OSError, ValueError, IndexError):
        return 0
    return max(0, running - 1)


def _reset_after_fork() -> None:
    global _pool, _pool_lock
    _pool = None  # the parent's threads do not exist in the child
    _pool_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)


def shared_pool() -> ThreadPoolExecutor:
    global _pool
    pool = _pool
    if pool is None:
        with _pool_lock:
            pool = _pool
            if pool is None:
                workers = max(1, usable_cores() - 1)
                pool = _pool = ThreadPoolExecutor(workers, thread_name_prefix="hurray-wire")
    return pool


def submit(call: Callable[[], T], pool: ThreadPoolExecutor | None = None) -> Future[T] | None:
    """Run ``call`` on a thread of ``pool`` (the shared one); None once the interpreter is
    shutting down. Callers must never wait for it without first doing its work themselves
    (``cancel()`` it, or make it find nothing left to do): the pool may be busy."""
    try:
        return (pool or shared_pool()).submit(call)
    except RuntimeError:  # "cannot schedule new futures after interpreter shutdown"
        return None


def run_tasks(tasks: Sequence[Callable[[], T]], threads: int) -> list[T]:
    """Run every task once and return their results in task order (see :func:`for_each`)."""
    results: list[Any] = [None] * len(tasks)

    def run(index: int) -> None:
        results[index] = tasks[index]()

    for_each(len(tasks), run, threads)
    return results


def for_each(count: int, call: Callable[[int], object], threads: int) -> None:
    """``call(i)`` for every ``i`` in ``range(count)`` on the caller and pool threads
    (``threads`` counts the caller); raises the lowest failing index's exception, whatever
    the timing, skipping indexes above a known failure."""
    helpers = min(resolve_threads(threads), count) - 1 if count > 1 else 0
    if helpers <= 0:
        for index in range(count):
            call(index)
        return
    pool = shared_pool()
    helpers = min(helpers, pool._max_workers)
    failures: dict[int, BaseException] = {}
    lock = threading.Lock()
    cursor = [0]

    def work() -> None:
        while True:
            with lock:
                index = cursor[0]
                if index >= count or (failures and index > min(failures)):
                    return
                cursor[0] = index + 1
            try:
                call(index)
            except BaseException as exc:  # re-raised on the caller, by index
                with lock:
                    failures[index] = exc

    futures = []
    for _ in range(helpers):
        future = submit(work, pool)
        if future is not None:
            futures.append(future)
    work()
    for future in futures:  # a helper that has not started finds nothing left: drop it
        if not future.cancel():
            future.result()
    if failures:
        raise failures[min(failures)]


def pool_exists() -> bool:
    """Whether the shared pool has been built in this process (not after a fork)."""
    return _pool is not None


@contextlib.contextmanager
def using_pool(pool: ThreadPoolExecutor) -> Iterator[None]:
    """Run the block with ``pool`` as the shared pool (a test seam: e.g. a shut-down pool)."""
    global _pool
    original = _pool
    _pool = pool
    try:
        yield
    finally:
        _pool = original
