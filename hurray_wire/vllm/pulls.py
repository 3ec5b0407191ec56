"""The decode worker's pulls in flight (docs/vllm.md § bounds), one thread each, and every one
ends: its ``Deadline`` shuts its sockets at ``timeout``; the engine thread (``collect``) ends
one still running at ``timeout + SLACK`` (stuck where no socket wakes it: DNS, NIXL) and
cancels those of requests vLLM finished. A late result is dropped: only the engine thread lands.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from hurray_wire.errors import HurrayWireError, TransportError
from hurray_wire.vllm.net import Deadline
from hurray_wire.vllm.receive import LoadResult

__all__ = ["SLACK", "Pulls", "failure"]

#: Seconds past ``timeout`` after which the engine thread ends a pull whatever it is doing.
SLACK = 5.0


@dataclass
class _Pull:
    deadline: Deadline
    failed_from: int
    started: float = field(default_factory=time.monotonic)
    result: LoadResult | None = None
    seconds: float = 0.0
    thread: threading.Thread | None = None


def failure(error: BaseException, failed_from: int) -> LoadResult:
    """A failed load whose error is the project's own (a foreign one is wrapped)."""
    if not isinstance(error, HurrayWireError):
        error = TransportError(f"the pull failed: {type(error).__name__}: {error}")
    return LoadResult(None, failed_from=failed_from, error=error)


class Pulls:
    """Pulls by request id, each bounded by ``timeout`` (its sockets) and ``timeout +
    SLACK`` (the engine thread)."""

    def __init__(self, timeout: float, slack: float = SLACK) -> None:
        self.timeout = timeout
        self.slack = slack
        self._lock = threading.Lock()
        self._live: dict[str, _Pull] = {}

    def start(self, key: str, work: Callable[[Deadline], LoadResult], failed_from: int) -> None:
        """Run ``work(deadline)`` on a thread of its own; whatever it raises is its result."""
        entry = self._add(key, failed_from)
        entry.thread = threading.Thread(target=self._run, args=(key, entry, work),
                                        name=f"hurray-pull-{key}"[:64], daemon=True)  # fmt: skip
        try:
            entry.thread.start()
        except Exception as exc:  # no thread to be had: the load fails now
            self._finish(key, entry, failure(exc, failed_from))

    def fail(self, key: str, error: BaseException, failed_from: int) -> None:
        """A load that fails before it starts (its params were refused)."""
        self._finish(key, self._add(key, failed_from), failure(error, failed_from))

    def _add(self, key: str, failed_from: int) -> _Pull:
        entry = _Pull(Deadline(self.timeout), failed_from)
        with self._lock:
            self._live[key] = entry
        return entry

    def _run(self, key: str, entry: _Pull, work: Callable[[Deadline], LoadResult]) -> None:
        try:
            result = work(entry.deadline)
        except BaseException as exc:  # the thread's top: nothing leaves it
            result = failure(exc, entry.failed_from)
        if entry.deadline.reason is not None and result.pages is not None:
            result = failure(entry.deadline.error(), entry.failed_from)
        self._finish(key, entry, result)

    def _finish(self, key: str, entry: _Pull, result: LoadResult) -> None:
        entry.deadline.close()
        with self._lock:
            if self._live.get(key) is entry and entry.result is None:
                entry.result = result
                entry.seconds = time.monotonic() - entry.started

    def collect(
        self, finished: Iterable[str] = ()
    ) -> tuple[list[tuple[str, LoadResult, float]], set[str]]:
        """The pulls that ended (by themselves, or overdue: ended here), and the ids of those
        cancelled because vLLM finished their request: reported received, nothing landed."""
        now = time.monotonic()
        gone = set(finished)
        done: list[tuple[str, LoadResult, float]] = []
        aborted: set[str] = set()
        with self._lock:
            for key, entry in list(self._live.items()):
                if key in gone:
                    entry.deadline.cancel()
                    aborted.add(key)
                elif entry.result is not None:
                    done.append((key, entry.result, entry.seconds))
                elif now - entry.started > self.timeout + self.slack:
                    entry.deadline.expire()
                    result = failure(entry.deadline.error(), entry.failed_from)
                    done.append((key, result, now - entry.started))
                else:
                    continue
                del self._live[key]
        return done, aborted

    def pending(self) -> int:
        with self._lock:
            return len(self._live)

    def close(self) -> None:
        """Cancel every pull and wait (bounded) for their threads."""
        with self._lock:
            entries = list(self._live.values())
            self._live.clear()
        for entry in entries:
            entry.deadline.cancel()
        for entry in entries:
            if entry.thread is not None and entry.thread.ident is not None:
                entry.thread.join(timeout=self.slack)
