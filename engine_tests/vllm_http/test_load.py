"""Load with faults through the HTTP servers: 36 concurrent requests (mixed lengths, three
shared prefixes, half of them streamed), a third of them faulted on the way: the pull sent
through a relay that flips a byte, cuts, stalls or resets the answer, or hostile
``kv_transfer_params`` from the proxy. Every request ends; the unfaulted ones give the single
engine's tokens; the faulted ones an error under "fail" and the single engine's tokens under
"recompute"; the decode engine's ``vllm:hurray_verification_failures_total`` grows by the
faults injected and its ``vllm:kv_cache_usage_perc`` returns to 0 (no block held); the
prefill listener serves a clean request afterwards."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from launch import Deployment
from pd_proxy import PDProxy
from pd_servers import Server, complete, load_prompts

from .conftest import TIMEOUT
from .relay import FAULTS, Relay
from .test_http import MAX_TOKENS, single

#: Hostile params the proxy hands the decode server instead of the prefill server's.
HOSTILE = {
    "digest": lambda p: {**p, "prompt_digest": "0" * 32},  # another prompt's pages
    "blocks": lambda p: {**p, "remote_block_ids": [b + 7000 for b in p["remote_block_ids"]]},
    "host": lambda p: {**p, "remote_host": "a" * 64 + ".invalid"},  # a DNS label over 63
    "both": lambda p: {**p, "do_remote_decode": True},  # contradictory flags
}
KINDS = (*FAULTS, *HOSTILE)
#: A client that waits longer than this for one answer fails the test: the bound is the
#: connector's ``timeout`` + 5 s + an engine step; the rest is a loaded 2-core machine.
CLIENT_BOUND = 180.0


@pytest.fixture(scope="module")
def relays(pd: Deployment) -> Iterator[dict[str, Relay]]:
    made = {fault: Relay(("127.0.0.1", pd.kv_port), fault, hold=3 * TIMEOUT) for fault in FAULTS}
    try:
        yield made
    finally:
        for relay in made.values():
            relay.close()


def router(faults: dict[tuple[int, ...], str], relays: dict[str, Relay]) -> Any:
    """The proxy's ``route``: a faulted request's params to its relay, or made hostile."""

    def route(body: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
        kind = faults.get(tuple(body["prompt"]))
        if kind in HOSTILE:
            return dict(HOSTILE[kind](params))
        if kind is not None:
            host, port = relays[kind].address
            return {**params, "remote_host": host, "remote_port": port}
        return params

    return route


def wait_for(server: Server, name: str, want: float, bound: float = 60.0) -> float:
    """``name`` on the server's /metrics once it equals ``want`` or ``bound`` s passed
    (vLLM's stat loggers publish a step's counters after that step)."""
    deadline = time.monotonic() + bound
    while True:
        value = server.metrics().get(name, 0.0)
        if value == want or time.monotonic() > deadline:
            return value
        time.sleep(1)


def run_load(
    pd: Deployment, decode: Server, relays: dict[str, Relay], count: int, seed: int
) -> tuple[list[dict[str, Any]], list[list[int]], dict[int, str]]:
    """``count`` requests at once through a proxy to ``decode``, one of each fault kind on
    every third request; returns the answers, the baseline tokens and the faulted indices."""
    batch = load_prompts(seed, count)
    baseline = single(pd, batch)
    chosen = {i: KINDS[n % len(KINDS)] for n, i in enumerate(range(1, count, 3))}
    faults = {tuple(batch[i]): kind for i, kind in chosen.items()}
    proxy = PDProxy(pd.prefill.url, decode.url, route=router(faults, relays),
                    timeout=CLIENT_BOUND)  # fmt: skip
    try:
        with ThreadPoolExecutor(count) as pool:
            answers = list(pool.map(
                lambda i: complete(proxy.url, batch[i], MAX_TOKENS, stream=i % 2 == 1,
                                   timeout=CLIENT_BOUND, request_id=f"load{seed}-{i}"),
                range(count),
            ))  # fmt: skip
    finally:
        proxy.close()
    return answers, baseline, chosen


def check_no_block_held(pd: Deployment, decode: Server) -> None:
    for server in (decode, pd.prefill):
        assert wait_for(server, "vllm:kv_cache_usage_perc", 0.0) == 0.0, server.url


def test_load_with_faults_under_fail(pd: Deployment, relays: dict[str, Relay]) -> None:
    before = pd.decode.metrics()
    damaged = {fault: relay.damaged for fault, relay in relays.items()}
    answers, baseline, chosen = run_load(pd, pd.decode, relays, 36, seed=1)
    print("slowest answer", max(a["seconds"] for a in answers), "s")
    for i, (answer, tokens) in enumerate(zip(answers, baseline, strict=True)):
        if i in chosen:  # an error, never tokens: HTTP 500, or an error event when streamed
            assert answer["tokens"] == [], (i, chosen[i], answer)
            assert answer["error"]["message"] == "Internal server error", (i, answer)
            assert answer["status"] == (200 if i % 2 else 500), (i, answer)
        else:
            assert (answer["status"], answer["finish_reason"]) == (200, "length"), (i, answer)
            assert answer["tokens"] == tokens, (i, answer)
    for fault, relay in relays.items():  # each relay fault really hit its pulls
        want = sum(kind == fault for kind in chosen.values())
        assert relay.damaged - damaged[fault] == want, fault
    failures = before.get("vllm:hurray_verification_failures_total", 0.0) + len(chosen)
    name = "vllm:hurray_verification_failures_total"
    assert wait_for(pd.decode, name, failures) == failures
    landed = before.get("vllm:hurray_transfers_total", 0.0) + len(answers) - len(chosen)
    assert wait_for(pd.decode, "vllm:hurray_transfers_total", landed) == landed
    check_no_block_held(pd, pd.decode)
    # the prefill listener and the decode engine still serve
    assert pd.proxy is not None
    clean = complete(pd.proxy.url, load_prompts(9, 1)[0], MAX_TOKENS)
    assert clean["tokens"] == single(pd, load_prompts(9, 1))[0]


def test_load_with_faults_under_recompute(pd: Deployment, relays: dict[str, Relay]) -> None:
    decode = pd.extra[0]
    before = decode.metrics().get("vllm:hurray_verification_failures_total", 0.0)
    answers, baseline, chosen = run_load(pd, decode, relays, 24, seed=2)
    assert [(a["status"], a["finish_reason"], a["error"]) for a in answers] == [
        (200, "length", None)
    ] * len(answers)
    assert [a["tokens"] for a in answers] == baseline  # the faulted ones recomputed locally
    name = "vllm:hurray_verification_failures_total"
    assert wait_for(decode, name, before + len(chosen)) == before + len(chosen)
    check_no_block_held(pd, decode)
