"""Bounded-work checks: how many Python lines a call runs, never how long it takes.

The brief forbids timed assertions; a hang guard instead counts the interpreter's line
events (a per-block or per-page Python loop over a hostile input runs millions of them;
a vectorised or C-level pass runs a few thousand, whatever the machine's load).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import FrameType
from typing import Any


def python_lines(call: Callable[[], Any]) -> int:
    """The number of Python lines ``call`` runs on this thread (exceptions propagate)."""
    count = 0

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal count
        if event == "line":
            count += 1
        return tracer

    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        call()
    finally:
        sys.settrace(previous)
    return count


def refused_within(call: Callable[[], Any], error: type[BaseException], lines: int) -> Any:
    """Run ``call``, expect ``error``, and check it ran at most ``lines`` Python lines;
    returns the exception."""
    caught: list[BaseException] = []

    def run() -> None:
        try:
            call()
        except error as exc:
            caught.append(exc)

    ran = python_lines(run)
    assert caught, f"{error.__name__} not raised"
    assert ran <= lines, f"{ran} Python lines (bound {lines})"
    return caught[0]


__all__ = ["python_lines", "refused_within"]
