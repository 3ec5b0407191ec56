"""P/D through vLLM's OpenAI servers under load: HurrayConnector vs vLLM's NixlConnector.

Runs in the engine venv (``.ci/venv_vllm_cpu.sh``): ``python tools/bench_pd_http.py``.
Starts two server pairs on the same random-weight model (``tools/make_tiny_llama.py``):
HurrayConnector (socket transport by default, ``--transport nixl`` for its NIXL one) and
NixlConnector (NIXL over UCX, host buffers), each behind the proxy (``tools/pd_proxy.py``),
warms each pair up with one unmeasured round, and alternates rounds between them, the pair
not measured paused (SIGSTOP to its process groups: idle NIXL/UCX threads keep a core
busy). A round sends ``--requests`` streamed
requests at once (the engine tests' load: mixed lengths, shared prefixes, no faults) and
measures requests per second and each request's time to first token (TTFT: the client's
send to the first streamed token, both calls of the two-call flow and the transfer
included). Then the quiet round: one request at a time, the fastest TTFT of each.

Prints, per round and over all rounds (medians of the rounds): HurrayConnector / NixlConnector
for requests/s (higher is better for Hurray) and TTFT p50 / p99 (lower is better). Every
answer's tokens are compared between the two pairs. The tiny model on 2 shared CPU cores:
the ratios are what to read, not the absolute times, and not a GPU claim.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from make_tiny_llama import make_tiny_llama
from pd_proxy import PDProxy
from pd_servers import (
    Server,
    complete,
    free_port,
    hurray_config,
    load_prompts,
    nixl_config,
)


def pair(name: str, model: Path, logs: Path, transport: str) -> tuple[Server, Server]:
    if name == "hurray":
        return (
            Server(model, free_port(), hurray_config("kv_producer", port=free_port(),
                   transport=transport, max_connections=128), logs / "hurray-prefill.log",
                   prefix_caching=False),
            Server(model, free_port(), hurray_config("kv_consumer", transport=transport),
                   logs / "hurray-decode.log"),
        )  # fmt: skip
    return tuple(  # type: ignore[return-value]
        Server(model, free_port(), nixl_config(), logs / f"nixl-{role}.log",
               prefix_caching=role == "decode",
               env={"VLLM_NIXL_SIDE_CHANNEL_PORT": str(free_port())})
        for role in ("prefill", "decode")
    )  # fmt: skip


def pause(servers: tuple[Server, Server], stop: bool) -> None:
    for server in servers:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.proc.pid, signal.SIGSTOP if stop else signal.SIGCONT)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def load_round(url: str, prompts: list[list[int]], max_tokens: int) -> dict[str, Any]:
    start = time.perf_counter()
    with ThreadPoolExecutor(len(prompts)) as pool:
        answers = list(pool.map(lambda p: complete(url, p, max_tokens, stream=True), prompts))
    wall = time.perf_counter() - start
    bad = [a for a in answers if a["status"] != 200 or a["error"] or a["first_token_s"] is None]
    if bad:
        raise RuntimeError(f"{len(bad)} requests failed, e.g. {bad[0]}")
    ttft = [a["first_token_s"] for a in answers]
    return {"rps": len(prompts) / wall, "p50": percentile(ttft, 0.5),
            "p99": percentile(ttft, 0.99), "tokens": [a["tokens"] for a in answers]}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=32, help="concurrent requests a round")
    parser.add_argument("--rounds", type=int, default=3, help="load rounds per connector")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--quiet", type=int, default=8, help="single requests per connector")
    parser.add_argument("--transport", choices=("socket", "nixl"), default="socket")
    parser.add_argument(
        "--model", type=Path, default=Path(tempfile.gettempdir()) / "hurray-tiny-llama"
    )
    args = parser.parse_args(argv)
    model = make_tiny_llama(args.model)
    logs = Path(tempfile.mkdtemp(prefix="hurray-bench-pd-http-"))
    print(f"logs in {logs}", flush=True)
    names = ("hurray", "nixl")
    pairs = {name: pair(name, model, logs, args.transport) for name in names}
    proxies: dict[str, PDProxy] = {}
    try:
        for name in names:
            for server in pairs[name]:
                server.wait_ready()
            proxies[name] = PDProxy(pairs[name][0].url, pairs[name][1].url)
            # one unmeasured load round: NixlConnector's first transfers pay its agents'
            # handshake (34 s TTFT in a first round here, against 2-5 s after it)
            load_round(proxies[name].url, load_prompts(99, args.requests), args.max_tokens)
            pause(pairs[name], True)
        rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
        for r in range(args.rounds):
            prompts = load_prompts(100 + r, args.requests)  # fresh prompts: no cross-round hits
            order = names if r % 2 == 0 else names[::-1]
            for name in order:
                pause(pairs[name], False)
                try:
                    complete(proxies[name].url, prompts[0][:40], 2)  # wake the pair
                    rounds[name].append(load_round(proxies[name].url, prompts, args.max_tokens))
                finally:
                    pause(pairs[name], True)
            h, n = rounds["hurray"][-1], rounds["nixl"][-1]
            same = h["tokens"] == n["tokens"]
            print(f"round {r}: requests/s {h['rps']:.2f} vs {n['rps']:.2f} "
                  f"({h['rps'] / n['rps']:.2f}x), TTFT p50 {h['p50']:.3f} vs {n['p50']:.3f} s "
                  f"({h['p50'] / n['p50']:.2f}x), p99 {h['p99']:.3f} vs {n['p99']:.3f} s "
                  f"({h['p99'] / n['p99']:.2f}x), tokens equal: {same}, "
                  f"load {os.getloadavg()[0]:.1f}", flush=True)  # fmt: skip
        quiet: dict[str, list[float]] = {name: [] for name in names}
        for i, p in enumerate(load_prompts(900, args.quiet)):
            for name in names if i % 2 == 0 else names[::-1]:
                pause(pairs[name], False)
                try:
                    answer = complete(proxies[name].url, p, args.max_tokens, stream=True)
                    quiet[name].append(answer["first_token_s"])
                finally:
                    pause(pairs[name], True)
        med = {name: {k: statistics.median(x[k] for x in rounds[name])
                      for k in ("rps", "p50", "p99")} for name in names}  # fmt: skip
        print(f"HurrayConnector ({args.transport}) / NixlConnector over {args.rounds} rounds of "
              f"{args.requests} concurrent requests (medians): requests/s "
              f"{med['hurray']['rps'] / med['nixl']['rps']:.2f}x, TTFT p50 "
              f"{med['hurray']['p50'] / med['nixl']['p50']:.2f}x, TTFT p99 "
              f"{med['hurray']['p99'] / med['nixl']['p99']:.2f}x")  # fmt: skip
        hq, nq = min(quiet["hurray"]), min(quiet["nixl"])
        print(f"quietest single request: TTFT {hq:.3f} s vs {nq:.3f} s ({hq / nq:.2f}x)")
    finally:
        for name in names:
            pause(pairs[name], False)
            if name in proxies:
                proxies[name].close()
            for server in pairs[name]:
                server.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
