"""atomic_output starts the kernel's writeback window by window; the bytes never change."""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import hurray_wire as hw
from hurray_wire.containers import atomic


def _payload(size: int) -> bytes:
    return np.random.default_rng(size).integers(0, 256, size, np.uint8).tobytes()


@pytest.mark.parametrize("writeback", [True, False])
def test_windows_are_handed_to_writeback_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, writeback: bool
) -> None:
    calls: list[tuple[int, int, int]] = []

    def recorder(fd: int, start: int, length: int, flags: int) -> int:
        assert os.fstat(fd).st_size >= start + length  # flushed before the hint
        calls.append((start, length, flags))
        return 0

    monkeypatch.setattr(atomic, "WRITEBACK_WINDOW", 1000)
    monkeypatch.setattr(atomic, "_start_writeback", lambda: recorder if writeback else None)
    data = _payload(5500)
    target = tmp_path / "out.bin"
    with atomic.atomic_output(target) as out:
        for at in range(0, len(data), 700):
            assert out.write(memoryview(data)[at : at + 700]) == len(data[at : at + 700])
    assert target.read_bytes() == data
    if writeback:
        starts = [c[0] for c in calls]
        assert starts == sorted(starts) and starts[0] == 0
        assert all(b[0] == a[0] + a[1] for a, b in itertools.pairwise(calls))
        assert all(length >= 1000 and flags == 2 for _, length, flags in calls)
        assert calls[-1][0] + calls[-1][1] <= len(data)
    else:
        assert calls == []


def test_the_real_call_runs_on_this_platform(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the libc call (Linux) a stream file written in many windows reads back equal."""
    monkeypatch.setattr(atomic, "WRITEBACK_WINDOW", 1 << 16)
    pool = np.arange(64 * 16 * 2 * 8, dtype=np.uint16).view(np.float16).reshape(64, 16, 2, 8)
    tensor = hw.BlockPagedTensor.from_arrays(pool, np.arange(64), [0, 64], layer_index=0)
    path = tmp_path / "cache.hrws"
    with hw.StreamWriter(path, hw.StreamHeader(num_layers=1)) as writer:
        for _ in range(3):
            writer.write(tensor)
    with hw.StreamFile(path) as f:
        assert len(f) == 3
        assert all(t.page_pool.tobytes() == pool.tobytes() for t in f)


def test_a_failing_hint_changes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def failing(*_: Any) -> int:
        return -1  # sync_file_range's error return: the final fsync is what counts

    monkeypatch.setattr(atomic, "WRITEBACK_WINDOW", 100)
    monkeypatch.setattr(atomic, "_start_writeback", lambda: failing)
    data = _payload(1000)
    with atomic.atomic_output(tmp_path / "x") as out:
        out.write(data)
    assert (tmp_path / "x").read_bytes() == data
