"""Engines for the connector's tests: two prefill engines (without and with vLLM's prefix
cache) and three decode engines (block size 32 with kv_load_failure_policy "fail" over the
socket transport, the same over NIXL, block size 64 with "recompute"), each its own process
(engine_worker.py), started once per session and stopped (killed if need be) at the end."""

from __future__ import annotations

import contextlib
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engine_tests import NO_TRAFFIC

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
START_TIMEOUT = 600  # seconds for one engine to come up on a loaded 2-core machine
#: The engines' fingerprint extras (the model digest), read from an engine once started:
#: a test's own fingerprint must carry them to be the engines' (test_connector.fingerprint).
ENGINE_EXTRAS: dict[str, Any] = {}


def free_port() -> int:
    """A free port below the ephemeral range (32768+), where vLLM, UCX and NIXL take theirs:
    a port picked there may be taken again before the engine binds it."""
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(20000, 32000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 20000..32000")


class Engine:
    """A vLLM engine process answering JSON commands."""

    def __init__(self, spec: dict[str, Any], log: Path, prefix: tuple[str, ...] = ()) -> None:
        """``prefix``: what the command runs under (``ip netns exec NAME``: another host)."""
        env = dict(os.environ, PYTHONPATH=str(ROOT), **NO_TRAFFIC)
        env.update(
            VLLM_ENABLE_V1_MULTIPROCESSING="0",
            VLLM_CPU_KVCACHE_SPACE="1",
            VLLM_CPU_OMP_THREADS_BIND="nobind",
        )
        self._log = log.open("w")
        worker = str(Path(__file__).with_name("engine_worker.py"))
        self.proc = subprocess.Popen(
            [*prefix, sys.executable, worker, json.dumps(spec)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            env=env,
        )
        self.log = log

    def wait_ready(self) -> None:
        import selectors

        sel = selectors.DefaultSelector()
        assert self.proc.stdout is not None
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        if not sel.select(START_TIMEOUT):
            raise RuntimeError(f"engine did not start; see {self.log}")
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"engine died; see {self.log}:\n{self.log.read_text()[-3000:]}")

    def ask(self, cmd: dict[str, Any]) -> Any:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"engine died; see {self.log}:\n{self.log.read_text()[-3000:]}")
        return json.loads(line)

    def generate(self, reqs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return list(self.ask({"generate": reqs}))

    def stats(self) -> dict[str, float]:
        return dict(self.ask({"stats": True}))

    def close(self) -> None:
        with contextlib.suppress(Exception):  # a dead engine is killed below
            self.ask({"quit": True})
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)
        self._log.close()


def connector(
    role: str, port: int, policy: str = "fail", transport: str = "socket"
) -> dict[str, Any]:
    return {
        "kv_connector": "HurrayConnector",
        "kv_connector_module_path": "hurray_wire.vllm",
        "kv_role": role,
        "kv_load_failure_policy": policy,
        "kv_connector_extra_config": {
            "port": port,
            "model_id": "tiny-llama",
            "transport": transport,
        },
    }


def kv_of(model_dir: Any, tokens: list[int]) -> list[tuple[Any, Any]]:
    """An independent transformers forward pass: per layer, its keys and values
    ``[tokens, H, D]`` for ``tokens``."""
    import torch
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        cache = model(torch.tensor([tokens]), use_cache=True).past_key_values
    return [
        (layer.keys[0].transpose(0, 1).numpy(), layer.values[0].transpose(0, 1).numpy())
        for layer in cache.layers
    ]


@pytest.fixture(scope="session")
def model_dir() -> Path:
    from make_tiny_llama import make_tiny_llama

    path = Path(
        os.environ.get("HURRAY_TINY_LLAMA", Path(tempfile.gettempdir()) / "hurray-tiny-llama")
    )
    return make_tiny_llama(path)


@pytest.fixture(scope="session")
def engines(
    model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Engine]]:
    # not under pytest's basetemp, which other pytest runs on the machine prune
    logs = Path(tempfile.mkdtemp(prefix="hurray-vllm-engines-"))
    specs = {
        # No prefix cache on the prefill engine: its own greedy tokens, the single-engine
        # baseline, are then computed from scratch every time.
        # transport "nixl" on the prefill side serves both socket and NIXL pulls.
        "prefill": {
            "block_size": 32,
            "kv": connector("kv_producer", free_port(), transport="nixl"),
            "pc": False,
        },
        "decode": {
            "block_size": 32,
            "kv": connector("kv_consumer", free_port(), "fail"),
            "log_stats": True,
        },
        # A prefill engine with vLLM's prefix cache: a prompt sharing blocks with an earlier
        # one is computed from the cached blocks on, and the transfer must still carry them.
        "prefill_pc": {
            "block_size": 32,
            "kv": connector("kv_producer", free_port(), transport="nixl"),
            "log_stats": True,
        },
        "decode64": {"block_size": 64, "kv": connector("kv_consumer", free_port(), "recompute")},
        "decode_nixl": {
            "block_size": 32,
            "kv": connector("kv_consumer", free_port(), "fail", transport="nixl"),
        },
    }
    started: dict[str, Engine] = {}
    try:
        for name, spec in specs.items():
            started[name] = Engine(
                {
                    "model": str(model_dir),
                    "block_size": spec["block_size"],
                    "kv_transfer_config": spec["kv"],
                    "prefix_caching": spec.get("pc", True),
                    "log_stats": spec.get("log_stats", False),
                },
                logs / f"{name}.log",
            )
        for engine in started.values():
            engine.wait_ready()
        ENGINE_EXTRAS.update(started["decode"].ask({"fingerprint": True}))
        yield started
    finally:
        for engine in started.values():
            engine.close()
