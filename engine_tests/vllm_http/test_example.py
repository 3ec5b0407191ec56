"""examples/pd_cpu/README.md runs as written: its deployment is the session's (the example's
own ``launch.start``, on free ports), each ``bash`` block runs with the example's ports and
log folder replaced by the session's, and prints the ``text`` block that follows it
(``<hex>`` matching an id that changes from run to run). Runs first in the session (file
order): the example's metrics are those of a fresh decode server."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

from launch import Deployment

README = Path(__file__).resolve().parents[2] / "examples" / "pd_cpu" / "README.md"
FENCE = re.compile(r"^```(\w+)\n(.*?)^```$", re.M | re.S)


def pairs() -> list[tuple[str, str]]:
    """(bash block, the text block right after it) in the README's order."""
    blocks = FENCE.findall(README.read_text())
    return [(code, blocks[i + 1][1]) for i, (lang, code) in enumerate(blocks)
            if lang == "bash" and i + 1 < len(blocks) and blocks[i + 1][0] == "text"]  # fmt: skip


def expected(text: str) -> re.Pattern[str]:
    return re.compile(re.escape(text.strip()).replace(re.escape("<hex>"), "[0-9a-f]+"))


def test_the_example_runs_as_written(pd: Deployment) -> None:
    assert pd.proxy is not None
    found = pairs()
    assert len(found) == 6, "the README's bash blocks changed: update this test"
    subs = {"http://127.0.0.1:8000": pd.proxy.url, "http://127.0.0.1:8100": pd.prefill.url,
            "http://127.0.0.1:8200": pd.decode.url,
            "/tmp/hurray-pd-cpu": str(pd.decode.log.parent)}  # fmt: skip
    for code, text in found:
        for old, new in subs.items():
            code = code.replace(old, new)
        want = expected(text)
        # a counter shows a step's counts after that step: /metrics is read again briefly
        for _ in range(30 if "/metrics" in code else 1):
            run = subprocess.run(["bash", "-c", code], capture_output=True, text=True,
                                 timeout=300)  # fmt: skip
            if want.fullmatch(run.stdout.strip()):
                break
            time.sleep(1)
        assert want.fullmatch(run.stdout.strip()), (code, run.stdout, run.stderr)
