"""hurray_wire.parallel: shared-counter tasks and the in-order offload."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import pytest

from hurray_wire import parallel


def test_resolve_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    assert parallel.resolve_threads(0) == 1
    assert parallel.resolve_threads(1) == 1
    assert parallel.resolve_threads(5) == 5
    assert 1 <= parallel.resolve_threads(-1) <= parallel.usable_cores()
    monkeypatch.setattr(parallel, "usable_cores", lambda: 4)
    for others, idle in ((0, 4), (1, 3), (3, 1), (9, 1)):
        monkeypatch.setattr(parallel, "running_others", lambda others=others: others)
        monkeypatch.setattr(parallel, "_load_reading", (-1.0, 0))
        assert parallel.idle_cores() == idle == parallel.resolve_threads(-1)
        assert parallel.resolve_threads(3) == 3  # an explicit count is taken as given


def test_run_queue_reading(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    loadavg = tmp_path / "loadavg"
    loadavg.write_text("0.50 0.40 0.30 3/120 4567\n")
    monkeypatch.setattr(parallel, "_LOADAVG", str(loadavg))
    assert parallel.running_others() == 2
    for broken in ("", "1 2 3\n", "a b c x/y z\n"):
        loadavg.write_text(broken)
        assert parallel.running_others() == 0
    monkeypatch.setattr(parallel, "_LOADAVG", str(tmp_path / "missing"))
    assert parallel.running_others() == 0


def test_busy_cores_run_everything_on_the_caller(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(parallel, "idle_cores", lambda: 1)
    names: set[str] = set()
    parallel.for_each(50, lambda i: names.add(threading.current_thread().name), -1)
    assert names == {threading.current_thread().name}


@pytest.mark.parametrize("threads", [0, 1, 2, 4, -1])
def test_run_tasks_returns_results_in_task_order(threads: int) -> None:
    def task(i: int) -> int:
        time.sleep(0.001 * (i % 3))
        return i * i

    tasks = [lambda i=i: task(i) for i in range(40)]
    assert parallel.run_tasks(tasks, threads) == [i * i for i in range(40)]
    assert parallel.run_tasks([], threads) == []


def test_run_tasks_uses_other_threads_and_the_caller() -> None:
    seen: set[str] = set()
    gate = threading.Barrier(2, timeout=10)

    def task() -> None:
        seen.add(threading.current_thread().name)
        gate.wait()  # only passes when two threads run tasks at the same time

    parallel.run_tasks([task, task], 2)
    assert threading.current_thread().name in seen and len(seen) == 2


@pytest.mark.parametrize("threads", [0, 2, 3])
def test_run_tasks_raises_the_lowest_failure_and_skips_later_tasks(threads: int) -> None:
    ran: list[int] = []

    def task(i: int) -> int:
        ran.append(i)
        if i in (5, 9):
            time.sleep(0.002 if i == 5 else 0)  # the later failure may finish first
            raise ValueError(i)
        return i

    for _ in range(5):
        ran.clear()
        tasks = [lambda i=i: task(i) for i in range(200)]
        with pytest.raises(ValueError) as info:
            parallel.run_tasks(tasks, threads)
        assert info.value.args == (5,)
        assert max(ran) < 199  # tasks after a failure were skipped
        assert set(range(6)) <= set(ran)


def test_run_tasks_never_waits_for_a_busy_pool() -> None:
    """With every pool thread blocked, the caller still finishes all tasks itself."""
    release = threading.Event()
    pool = parallel.shared_pool()
    blockers = [pool.submit(release.wait, 10) for _ in range(pool._max_workers)]
    try:
        tasks = [lambda i=i: i for i in range(10)]
        done = parallel.run_tasks(tasks, 4)
        assert done == list(range(10))
    finally:
        release.set()
        for blocker in blockers:
            blocker.result()


def test_submit_runs_on_a_pool_thread() -> None:
    future = parallel.submit(lambda: threading.current_thread().name)
    assert future is not None
    assert future.result(timeout=10).startswith("hurray-wire")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_pool_is_recreated_in_a_forked_child() -> None:
    parallel.run_tasks([lambda: 1, lambda: 2], 2)  # the parent's pool exists
    pid = os.fork()
    if pid == 0:  # child: the parent's threads are gone; a new pool must be built
        try:
            ok = not parallel.pool_exists() and parallel.run_tasks([lambda: 1, lambda: 2], 2) == [
                1,
                2,
            ]
            os._exit(0 if ok else 1)
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_shut_down_pool_runs_everything_on_the_caller() -> None:
    from concurrent.futures import ThreadPoolExecutor

    dead = ThreadPoolExecutor(1)
    dead.shutdown()
    assert parallel.submit(lambda: 1, dead) is None
    with parallel.using_pool(dead):
        tasks = [lambda i=i: i for i in range(5)]
        assert parallel.run_tasks(tasks, 4) == list(range(5))
        assert parallel.submit(lambda: 1) is None


def test_for_each_inside_a_pool_thread_does_not_wait_for_itself() -> None:
    """Called from the pool's only thread, the helpers it queues can never start: the
    caller does all the work and drops them instead of waiting."""
    pool = parallel.shared_pool()
    if pool._max_workers != 1:
        pytest.skip("needs a one-thread pool (a two-core machine)")
    done: list[int] = []
    future = pool.submit(lambda: parallel.for_each(20, done.append, 4))
    future.result(timeout=30)
    assert sorted(done) == list(range(20))
