"""Every way of producing a blob gives the same bytes, whatever path the copy takes."""

from __future__ import annotations

import numpy as np
import pytest

import hurray_wire as hw
from hurray_wire import blob
from hurray_wire.blob import copying


def _large_tensor() -> hw.BlockPagedTensor:
    pool = np.arange(40 * 16 * 8 * 128, dtype=np.uint16).view(np.float16).reshape(40, 16, 8, 128)
    return hw.BlockPagedTensor.from_arrays(pool, np.arange(40), [0, 20, 40], kv_role="value")


@pytest.mark.parametrize("parallel", [False, True, None])
@pytest.mark.parametrize("checksum", [False, True])
def test_encode_into_encode_and_parts_agree(
    parallel: bool | None, checksum: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(copying, "PARALLEL_HASH", parallel)
    monkeypatch.setattr(copying, "COPY_CHUNK", 1 << 16)  # several chunks per section
    monkeypatch.setattr(copying, "PARALLEL_CHUNK", 1 << 16)
    tensor = _large_tensor()
    joined = b"".join(blob.encode_parts(tensor, checksum=checksum))
    assert bytes(blob.encode(tensor, checksum=checksum)) == joined
    out = bytearray(len(joined) + 100)
    assert blob.encode_into(tensor, out, checksum=checksum) == len(joined)
    assert bytes(out[: len(joined)]) == joined
    decoded = hw.decode(joined)
    assert decoded.page_pool.tobytes() == tensor.page_pool.tobytes()


@pytest.mark.parametrize("chunk", [1 << 16, 100_003, 1 << 19])
def test_two_core_copy_and_hash_any_chunking(chunk: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks copied by the pool and the caller, hashed in order: the serial bytes."""
    tensor = _large_tensor()
    expected = b"".join(blob.encode_parts(tensor))
    monkeypatch.setattr(copying, "PARALLEL_HASH", True)
    monkeypatch.setattr(copying, "PARALLEL_CHUNK", chunk)
    for _ in range(5):
        out = np.zeros(len(expected), np.uint8)
        assert blob.encode_into(tensor, out) == len(expected)
        assert out.tobytes() == expected


def test_copy_and_hash_finishes_when_the_pool_is_busy(monkeypatch: pytest.MonkeyPatch) -> None:
    """With every pool thread blocked, the caller copies and hashes everything itself."""
    import threading

    from hurray_wire import parallel

    tensor = _large_tensor()
    expected = b"".join(blob.encode_parts(tensor))
    monkeypatch.setattr(copying, "PARALLEL_HASH", True)
    monkeypatch.setattr(copying, "PARALLEL_CHUNK", 1 << 16)
    release = threading.Event()
    pool = parallel.shared_pool()
    blockers = [pool.submit(release.wait, 30) for _ in range(pool._max_workers)]
    try:
        assert bytes(blob.encode(tensor)) == expected
    finally:
        release.set()
        for blocker in blockers:
            blocker.result()


def test_busy_machine_takes_the_serial_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    """With PARALLEL_HASH left automatic and no idle second core, no pool thread copies."""
    from hurray_wire import parallel

    tensor = _large_tensor()
    expected = b"".join(blob.encode_parts(tensor))
    monkeypatch.setattr(copying, "PARALLEL_HASH", None)
    monkeypatch.setattr(copying, "PARALLEL_CHUNK", 1 << 16)
    monkeypatch.setattr(parallel, "idle_cores", lambda: 1)
    submitted: list[object] = []
    monkeypatch.setattr(parallel, "submit", lambda call: submitted.append(call))
    assert bytes(blob.encode(tensor)) == expected
    assert submitted == []
