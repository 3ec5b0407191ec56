"""The connector as operators run it: vLLM's OpenAI servers and the two-call proxy.

One deployment per session, started by the example's own launcher
(``examples/pd_cpu/launch.py``'s ``start``) on free ports: a prefill server (no prefix
cache: a plain request to it is the single engine's answer), a decode server under
``kv_load_failure_policy`` "fail", and beside them a second decode server under
"recompute"; the connector's ``timeout`` is 10 s so that a stalled pull ends quickly.
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "examples" / "pd_cpu"))

from launch import Deployment, start  # noqa: E402
from make_tiny_llama import make_tiny_llama  # noqa: E402
from pd_servers import Server, free_port, hurray_config  # noqa: E402

#: The connector's ``timeout`` on these servers: a stalled pull ends after it.
TIMEOUT = 10.0


@pytest.fixture(scope="session")
def model_dir() -> Path:
    return make_tiny_llama(Path(tempfile.gettempdir()) / "hurray-tiny-llama")


@pytest.fixture(scope="session")
def pd(model_dir: Path) -> Iterator[Deployment]:
    """The deployment (proxy included) plus ``extra[0]``, the "recompute" decode server."""
    logs = Path(tempfile.mkdtemp(prefix="hurray-vllm-http-"))
    recompute = Server(model_dir, free_port(),
                       hurray_config("kv_consumer", policy="recompute", timeout=TIMEOUT),
                       logs / "decode_recompute.log")  # fmt: skip
    try:
        deployment = start(model_dir, logs, prefill_port=free_port(),
                           decode_port=free_port(), kv_port=free_port(), proxy_port=0,
                           timeout=TIMEOUT, max_connections=64)  # fmt: skip
    except BaseException:
        recompute.close()
        raise
    deployment.extra.append(recompute)
    try:
        recompute.wait_ready()
        yield deployment
    finally:
        deployment.close()
