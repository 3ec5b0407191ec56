"""TP degree conversion between a prefill and a decode engine (hurray_wire.vllm.tp), over
real transfers: every prefill rank a store and a socket server of its own (port + rank),
every decode rank a pull; each decode rank must receive exactly the heads vLLM gives that
rank, as restated below from vLLM's own code, and a pair vLLM's sharding cannot map is
refused naming the fields."""

from __future__ import annotations

import contextlib
import random
import socket
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from hurray_wire.errors import IncompatibleFingerprintError, InvalidTensorError
from hurray_wire.fingerprint import EngineFingerprint
from hurray_wire.vllm import receive as rc, tp, transfer as tr
from hurray_wire.vllm.held import HeldPages

B, D, LAYERS = 4, 8, 2
PROMPT = list(range(30, 41))  # 11 tokens: 3 pages of 4, the last partial
FP = EngineFingerprint(
    model_id="m", engine="vllm", engine_version="0.32.0", kv_cache_layout="CPU_ATTN/vec",
    cache_dtype="float32", block_size=B, tp_rank=0, tp_size=1,
)  # fmt: skip


def vllm_heads(num_kv_heads: int, tp_size: int, rank: int) -> list[int]:
    """The KV heads vLLM gives TP rank ``rank``, restated from vLLM 0.32's
    model_executor/layers/linear.py (QKVParallelLinear.__init__, lines 1053-1058:
    ``num_kv_heads = divide(H, tp)`` or ``num_kv_head_replicas = divide(tp, H)``; its
    weight_loader, line 1303: ``shard_rank = tp_rank // num_kv_head_replicas``)."""
    if tp_size >= num_kv_heads:
        assert tp_size % num_kv_heads == 0
        return [rank // (tp_size // num_kv_heads)]
    assert num_kv_heads % tp_size == 0
    per = num_kv_heads // tp_size
    return list(range(rank * per, rank * per + per))


def full_pages(num_kv_heads: int) -> list[tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]]:
    """Every head's pages of each layer, ``[3, B, H, D]`` (what a TP=1 engine holds)."""
    rng = np.random.default_rng(num_kv_heads)
    shape = (3, B, num_kv_heads, D)
    layers = []
    for _ in range(LAYERS):
        key = rng.standard_normal(shape).astype(np.float32)
        layers.append((key, rng.standard_normal(shape).astype(np.float32)))
    return layers


def listeners(count: int) -> list[socket.socket]:
    """``count`` listening sockets on consecutive ports (a rank serves on port + rank)."""
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(20000, 32000)
        socks: list[socket.socket] = []
        try:
            for rank in range(count):
                socks.append(socket.create_server(("127.0.0.1", base + rank)))
        except OSError:
            for s in socks:
                s.close()
            continue
        return socks
    raise RuntimeError("no free consecutive ports")


@contextlib.contextmanager
def prefill(
    num_kv_heads: int, tp_size: int, full: list[Any], poison: tuple[int, int] | None = None
) -> Iterator[tuple[tr.TransferParams, list[tr.TransferServer]]]:
    """A prefill engine of ``tp_size`` ranks, rank ``r`` holding vLLM's heads for it;
    ``poison``: (rank, head position) whose value pages get +1 on that rank only."""
    socks = listeners(tp_size)
    tid = tr.TransferStore.new_id()
    servers = []
    for rank, sock in enumerate(socks):
        store = tr.TransferStore(replace(FP, tp_rank=rank, tp_size=tp_size), "m", LAYERS)
        store.begin(tid, "req-1", (7, 3, 9), len(PROMPT), tr.prompt_digest(PROMPT))
        heads = vllm_heads(num_kv_heads, tp_size, rank)
        for layer, (key, value) in enumerate(full):
            k, v = key[:, :, heads].copy(), value[:, :, heads].copy()
            if poison is not None and poison[0] == rank:
                v[:, :, poison[1]] += 1.0
            store.add_layer(tid, layer, k, v)
        servers.append(tr.TransferServer(store, "127.0.0.1", 0, timeout=5, listener=sock))
    params = tr.TransferParams(
        tid, "req-1", "127.0.0.1", servers[0].port, (7, 3, 9), len(PROMPT), B,
        tr.prompt_digest(PROMPT), tp_size=tp_size,
    )  # fmt: skip
    try:
        yield params, servers
    finally:
        for server in servers:
            server.close()


CASES = [  # (num_kv_heads, prefill TP, decode TP)
    (4, 1, 2), (4, 2, 1), (4, 1, 4), (4, 4, 1), (4, 2, 4), (4, 4, 2), (4, 2, 2),
    (2, 1, 4), (2, 4, 1), (2, 4, 2), (2, 2, 4), (2, 1, 2), (1, 1, 2), (1, 2, 1),
    (6, 2, 3), (6, 3, 2),
]  # fmt: skip


@pytest.mark.parametrize(("heads", "p", "d"), CASES)
def test_each_decode_rank_receives_vllms_heads_for_it(heads: int, p: int, d: int) -> None:
    full = full_pages(heads)
    with prefill(heads, p, full) as (params, _servers):
        for rank in range(d):
            ours = replace(FP, tp_rank=rank, tp_size=d)
            result = rc.pull(params, ours, LAYERS, num_kv_heads=heads, timeout=5)
            assert result.error is None and result.pages is not None, result.error
            want = vllm_heads(heads, d, rank)
            for (key, value), (k, v) in zip(result.pages.layers, full, strict=True):
                np.testing.assert_array_equal(key, k[:, :, want])
                np.testing.assert_array_equal(value, v[:, :, want])
            assert ("tp_size" in result.pages.converted) == (p != d)
        # every decode rank that needed a prefill rank pulled it once: all consumed now
        for rank in range(d):
            again = rc.pull(params, replace(FP, tp_rank=rank, tp_size=d), LAYERS,
                            num_kv_heads=heads, timeout=5)  # fmt: skip
            assert again.pages is None and getattr(again.error, "reason", None) == "consumed"


def test_sources_and_pullers_agree() -> None:
    for _heads, p, d in CASES:
        for prefill_rank in range(p):
            for rank in tp.pullers(p, d, prefill_rank):
                assert prefill_rank in tp.sources(p, d, rank)
        assert set().union(*(tp.sources(p, d, r) for r in range(d))) <= set(range(p))


@pytest.mark.parametrize(("heads", "p", "d"), [(2, 2, 3), (4, 1, 3), (4, 3, 1), (6, 4, 2)])
def test_a_tp_pair_vllm_cannot_shard_is_refused_naming_the_fields(
    heads: int, p: int, d: int
) -> None:
    with pytest.raises(IncompatibleFingerprintError) as info:
        tp.check_convertible(heads, p, d)
    assert info.value.differences == {"tp_size": (d, p)}
    assert "num_kv_heads" in str(info.value) and "tp_size" in str(info.value)
    if heads % p == 0 or p % heads == 0:  # a prefill engine vLLM would run: over the wire
        full = full_pages(heads)
        with prefill(heads, p, full) as (params, _):
            result = rc.pull(params, replace(FP, tp_rank=0, tp_size=d), LAYERS,
                             num_kv_heads=heads, timeout=5)  # fmt: skip
        assert result.pages is None and isinstance(result.error, IncompatibleFingerprintError)
        assert result.error.differences == {"tp_size": (d, p)}


def test_a_poisoned_replica_is_refused() -> None:
    """Two heads over four prefill ranks: ranks 0 and 1 both hold head 0. A decode rank
    of TP=2 merges them and must find them equal; a valid but different copy is refused."""
    full = full_pages(2)
    with prefill(2, 4, full, poison=(1, 0)) as (params, _):
        bad = rc.pull(params, replace(FP, tp_rank=0, tp_size=2), LAYERS, num_kv_heads=2,
                      timeout=5)  # fmt: skip
        good = rc.pull(params, replace(FP, tp_rank=1, tp_size=2), LAYERS, num_kv_heads=2,
                       timeout=5)  # fmt: skip
    assert bad.pages is None and isinstance(bad.error, InvalidTensorError)
    assert "replicate" in str(bad.error)
    assert good.pages is not None


def test_a_prefill_rank_that_is_not_the_one_asked_is_refused() -> None:
    """Rank 1's server carrying rank 0's fingerprint (a mis-wired port) is not taken."""
    full = full_pages(4)
    with prefill(4, 2, full) as (params, servers):
        servers[1].store.fingerprint = replace(FP, tp_rank=0, tp_size=2)
        result = rc.pull(params, replace(FP, tp_rank=0, tp_size=1), LAYERS, num_kv_heads=4,
                         timeout=5)  # fmt: skip
    assert result.pages is None
    assert getattr(result.error, "field", None) == "tp_rank"


def test_a_decode_rank_that_does_not_need_a_prefill_rank_is_refused() -> None:
    full = full_pages(4)
    with prefill(4, 2, full) as (params, _):
        wrong = replace(params, port=params.port + 1, tp_size=1)  # rank 1 asked as rank 0
        result = rc.pull(wrong, replace(FP, tp_rank=0, tp_size=2), LAYERS, num_kv_heads=4,
                         timeout=5)  # fmt: skip
    assert result.pages is None and getattr(result.error, "reason", None) in ("tp", "stale_content")


def test_held_pages_are_checked_after_conversion() -> None:
    """Prefill TP=1 -> decode TP=2 with a prefix the decode rank holds: the transfer comes
    in full (a page reference names the prefill rank's heads, not the decode rank's) and
    the held pages are compared digest for digest with the converted pages."""
    full = full_pages(4)
    want = vllm_heads(4, 2, 1)
    held = [(k[:2, :, want].copy(), v[:2, :, want].copy()) for k, v in full]
    ours = replace(FP, tp_rank=1, tp_size=2)
    with prefill(4, 1, full) as (params, _):
        ok = rc.pull(params, ours, LAYERS, first_block=2, num_kv_heads=4, timeout=5,
                     held=HeldPages.from_pages(held))  # fmt: skip
    assert ok.pages is not None and ok.pages.first_block == 2, ok.error
    np.testing.assert_array_equal(ok.pages.layers[1][0], full[1][0][2:, :, want])
    held[1][1][1, 0, 0, 0] += 1.0  # a stale value in the held page of block 1, layer 1
    with prefill(4, 1, full) as (params, _):
        bad = rc.pull(params, ours, LAYERS, first_block=2, num_kv_heads=4, timeout=5,
                      held=HeldPages.from_pages(held))  # fmt: skip
    assert bad.error is None and bad.pages is not None
    assert bad.pages.first_block == 1 and bad.pages.repaired == 1
    np.testing.assert_array_equal(bad.pages.layers[1][1], full[1][1][1:, :, want])  # repaired
