"""Prefill/decode through vLLM's OpenAI servers and the proxy: the single engine's tokens,
streamed or not; a refused transfer as the client and the decode log see it."""

from __future__ import annotations

import random
import re

from launch import Deployment
from pd_servers import complete

MAX_TOKENS = 16


def prompt(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1, 512) for _ in range(n)]


def single(
    pd: Deployment, prompts: list[list[int]], max_tokens: int = MAX_TOKENS
) -> list[list[int]]:
    """The prefill server's own greedy tokens for each prompt (no transfer: a plain request;
    that server has no prefix cache, so each is computed from scratch)."""
    out = [complete(pd.prefill.url, p, max_tokens) for p in prompts]
    assert all(r["status"] == 200 and r["finish_reason"] == "length" for r in out), out
    tokens = [r["tokens"] for r in out]
    # degenerate output (one token repeated, every prompt alike) would prove nothing
    assert len({t for ts in tokens for t in ts}) > 3, tokens
    assert len(prompts) == 1 or len({tuple(t) for t in tokens}) > 1, tokens
    return tokens


def test_proxy_gives_the_single_engines_tokens_streamed_or_not(pd: Deployment) -> None:
    assert pd.proxy is not None
    prompts = [prompt(100 + i, n) for i, n in enumerate((33, 100, 250))]
    baseline = single(pd, prompts)
    for stream in (False, True):
        got = [complete(pd.proxy.url, p, MAX_TOKENS, stream=stream) for p in prompts]
        assert [(r["status"], r["finish_reason"], r["error"]) for r in got] == [
            (200, "length", None)
        ] * len(prompts), got
        assert [r["tokens"] for r in got] == baseline, f"stream={stream}"
    # the transfers really moved: the decode server counted them on its /metrics
    assert pd.decode.metrics()["vllm:hurray_transfers_total"] >= 2 * len(prompts)


def test_a_refused_transfer_is_http_500_and_named_in_the_decode_log(pd: Deployment) -> None:
    """A consumed transfer sent again (vLLM #52234's reused reference): non-streaming, HTTP
    500 "Internal server error"; streaming, HTTP 200 and an error event; the reason only in
    the decode server's log, on a line carrying the request id (docs/vllm.md § 9)."""
    p = prompt(200, 70)
    first = complete(pd.prefill.url, p, 1, kv_transfer_params={"do_remote_decode": True})
    params = first["kv_transfer_params"]
    ok = complete(pd.decode.url, p, MAX_TOKENS, kv_transfer_params=params)
    assert ok["status"] == 200 and ok["tokens"] == single(pd, [p])[0]
    again = complete(pd.decode.url, p, MAX_TOKENS, kv_transfer_params=params,
                     request_id="reused-ref-plain")  # fmt: skip
    assert again["status"] == 500
    assert again["error"]["message"] == "Internal server error"
    assert again["tokens"] == []
    streamed = complete(pd.decode.url, p, MAX_TOKENS, kv_transfer_params=params, stream=True,
                        request_id="reused-ref-stream")  # fmt: skip
    assert streamed["status"] == 200 and streamed["tokens"] == []
    assert streamed["error"]["message"] == "Internal server error"
    log = pd.decode.log.read_text(errors="replace")
    for rid in ("reused-ref-plain", "reused-ref-stream"):
        line = re.search(rf"HurrayConnector: request cmpl-{rid}\S*: KV load refused: .*", log)
        assert line is not None, f"no refusal line for {rid}"
        assert "consumed" in line.group(0)
