"""A real transfer: a prefill process streams a KV cache to a decode process over TCP.

Both sides are ``tools/transfer_example.py`` (the example docs/streaming.md runs), started
as two processes that talk over 127.0.0.1 by the example's own ``run_demo``: it makes the
listening socket and hands it to the decode process, so there is no port race. Everything
is bounded by timeouts.
Also: the memory bound of a reader (peak RSS, measured in a child process by
``tools/bench_transfer.py rss``) and a smoke run of the transfer benchmark.

Set HURRAY_WIRE_SLOW=1 to also run the 2 GiB memory measurement.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "tools" / "transfer_example.py"
BENCH = ROOT / "tools" / "bench_transfer.py"
TIMEOUT = 60
ROLES = ("key", "value")
slow = pytest.mark.skipif(
    not os.environ.get("HURRAY_WIRE_SLOW"), reason="slow: set HURRAY_WIRE_SLOW=1 to run"
)


def _load_example() -> Any:
    spec = importlib.util.spec_from_file_location("transfer_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


EXAMPLE_MODULE = _load_example()


def transfer(
    layers: int, num_pages: int, cut_after: int | None = None, reset: bool = False
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run one prefill process and one decode process (the example's own demo runner);
    (prefill report, decode report)."""
    spec = EXAMPLE_MODULE.CacheSpec(layers=layers, num_pages=num_pages)
    result = EXAMPLE_MODULE.run_demo(spec, cut_after, reset)
    assert result["exit_codes"] == [0, 0]
    return result["prefill"], result["decode"]


def expected_order(layers: int) -> list[list[Any]]:
    return [[layer, role] for layer in range(layers) for role in ROLES]


def test_full_transfer_8_layers() -> None:
    sent, got = transfer(8, 640)  # 16 x 20 MiB = 320 MiB
    assert sent["blobs_sent"] == 16
    assert got["error"] is None
    assert got["complete"] is True
    assert got["received"] == expected_order(8)
    assert got["checked_values"] == 16 * 640 * 16 * 8 * 128  # every value compared
    assert got["intact_after"] is True
    assert got["bytes"] == sent["bytes"] > 320 << 20
    assert got["header"] == {
        "model": "demo-llm-8l",
        "num_layers": 8,
        "kv_roles": ["key", "value"],
        "element_type": "float16",
    }


def test_connection_cut_mid_blob() -> None:
    sent, got = transfer(8, 160, cut_after=11)
    assert sent == {"side": "prefill", "blobs_sent": 11, "cut": True}
    assert got["received"] == expected_order(8)[:11]  # five and a half layers
    error = got["error"]
    assert error["type"] == "StreamBlobTruncatedError"
    assert {"BlobTruncatedError", "StreamTruncatedError", "HurrayWireError"} <= set(
        error["classes"]
    )
    assert "blob 11" in error["message"]
    assert got["complete"] is False
    assert got["intact_after"] is True


def test_connection_reset_mid_blob() -> None:
    sent, got = transfer(8, 160, cut_after=11, reset=True)
    assert sent["blobs_sent"] == 11
    # An RST may discard data the decode side had not read yet: fewer blobs, never wrong ones.
    assert got["received"] == expected_order(8)[: len(got["received"])]
    assert len(got["received"]) <= 11
    assert "StreamTruncatedError" in got["error"]["classes"]
    assert got["complete"] is False
    assert got["intact_after"] is True


def rss(tmp_path: Path, size_gib: float, blob_mib: int, via: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, str(BENCH), "rss", f"--size-gib={size_gib}", f"--blob-mib={blob_mib}",
         f"--via={via}", f"--path={tmp_path / 'rss.hrws'}", "--regenerate", "--remove"],
        capture_output=True, text=True, timeout=600, check=True,
    ).stdout  # fmt: skip
    result: dict[str, Any] = json.loads(out)
    assert result["complete"] is True
    return result


@pytest.mark.parametrize("via", ["pipe", "socket"])
def test_reader_memory_stays_bounded(tmp_path: Path, via: str) -> None:
    result = rss(tmp_path, 0.25, 16, via)  # 16 blobs of 16 MiB
    assert result["blobs"] == 16
    assert result["rss_growth_in_blobs"] < 2  # one blob in flight, plus small change


@slow
@pytest.mark.parametrize("via", ["pipe", "socket"])
def test_reader_memory_stays_bounded_2gib(tmp_path: Path, via: str) -> None:
    result = rss(tmp_path, 2, 32, via)  # 64 blobs of 32 MiB
    assert result["stream_gib"] >= 2
    assert result["rss_growth_in_blobs"] < 2


def test_bench_transfer_smoke() -> None:
    out = subprocess.run(
        [sys.executable, str(BENCH), "rate", "--rounds=1", "--layers=1", "--num-pages=32"],
        capture_output=True, text=True, timeout=TIMEOUT, check=True,
    ).stdout  # fmt: skip
    result = json.loads(out)
    assert result["tensors"] == 2
    assert result["ratio_stream_best"] > 0
