"""The prefill listener's NIXL pulls with real NIXL (``hurray_wire.vllm.peers``): one decode
agent that asks and never reads delays no other agent's pull and ends by its deadline, its
sender closed; the endpoints are bounded (the least recently used idle one closed, a new
peer refused by name when all are in use); a pull after a failed one pairs afresh."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

import numpy as np
import pytest

from hurray_wire.errors import (
    HurrayWireError,
    IncompatibleFingerprintError,
    TransferRefusedError,
    TransportError,
)
from hurray_wire.vllm import receive as rc, transfer as tr
from hurray_wire.vllm.net import Deadline
from hurray_wire.vllm.peers import NixlPeers
from tests.test_vllm_transfer import FP, LAYERS, PROMPT, pages

pytest.importorskip("nixl_cu12")
from tests.nixl_hostile import Hostile

ARENA = 1 << 20
LONG = 60.0  # a deadline no pull here should reach unless it is made to
SHORT = 5.0  # the deadline a test waits out (a NIXL agent is made well within it)


@contextmanager
def prefill(
    timeout: float = LONG, max_peers: int = 4
) -> Iterator[tuple[tr.TransferServer, NixlPeers]]:
    store = tr.TransferStore(FP, "m", LAYERS)
    peers = NixlPeers("p", timeout=timeout, arena_bytes=ARENA, max_peers=max_peers)
    server = tr.TransferServer(store, "127.0.0.1", 0, timeout=timeout, nixl=peers)
    try:
        yield server, peers
    finally:
        server.close()


@contextmanager
def decoders(*names: str, max_peers: int = 4) -> Iterator[list[NixlPeers]]:
    made = [NixlPeers(n, timeout=LONG, arena_bytes=ARENA, max_peers=max_peers) for n in names]
    try:
        yield made
    finally:
        for peers in made:
            peers.close()


def offer(server: tr.TransferServer) -> tr.TransferParams:
    """A complete transfer held by ``server``'s store, and the params that pull it."""
    store = server.store
    tid = store.new_id()
    params = tr.TransferParams(tid, f"r-{tid[:6]}", "127.0.0.1", server.port, (5, 9, 2),
                               len(PROMPT), FP.block_size, tr.prompt_digest(PROMPT))  # fmt: skip
    store.begin(tid, params.request_id, params.block_ids, len(PROMPT), params.prompt_digest)
    for layer in range(LAYERS):
        store.add_layer(tid, layer, *pages(layer))
    return params


def pulled(params: tr.TransferParams, peers: NixlPeers) -> rc.LoadResult:
    result = rc.pull(params, FP, LAYERS, timeout=LONG, nixl=peers)
    if result.error is None:
        assert result.pages is not None
        for (key, value), layer in zip(result.pages.layers, range(LAYERS), strict=True):
            np.testing.assert_array_equal(key, pages(layer)[0])
            np.testing.assert_array_equal(value, pages(layer)[1])
    return result


def agent_of(peers: NixlPeers) -> str:
    """The name of ``peers``' one receiver (its agent, as the prefill side knows it)."""
    (address,) = peers.receivers()
    deadline = Deadline(5)
    try:
        with peers.receiving(*address, deadline) as peer:
            return str(peer.endpoint.name)
    finally:
        deadline.close()


def errors_of(server: tr.TransferServer, count: int) -> list[BaseException]:
    """The listener's first ``count`` errors, waiting (bounded) for its threads to log them."""
    for _ in range(int(2 * LONG / 0.05)):
        if len(server.errors) >= count:
            break
        time.sleep(0.05)
    return list(server.errors)


def test_a_client_that_never_reads_delays_no_other_agents_pull() -> None:
    """Before: one lock for every NIXL send, so the good pull waited for the hostile's
    whole deadline."""
    with prefill() as (server, peers), decoders("good") as (good,):
        hostile = Hostile("hostile", offer(server))
        try:
            assert hostile.answer["ok"] is True
            result = pulled(offer(server), good)
            assert result.error is None, result.error
            assert hostile.still_served()  # the good pull ended while the hostile's ran
            assert peers.senders() == ["hostile", agent_of(good)]
            hostile.poison()
            assert b"done" not in hostile.ended()
        finally:
            hostile.close()
        (error,) = errors_of(server, 1)
        assert isinstance(error, HurrayWireError)
        assert peers.senders() == [agent_of(good)]  # the failed sender closed, not reused


def test_a_client_that_never_reads_ends_by_its_deadline_and_its_agent_pulls_afresh() -> None:
    """The prefill side's pull ends by the connection's deadline with a typed error, its
    sender closed: the next pull from that agent name pairs with a new one."""
    with prefill(timeout=SHORT) as (server, peers), decoders("d") as (decode,):
        hostile = Hostile("d-r0", offer(server))  # the name d's first receiver takes
        try:
            assert hostile.answer["ok"] is True
            assert b"done" not in hostile.ended()  # closed at the deadline
        finally:
            hostile.close()
        (error,) = errors_of(server, 1)
        assert isinstance(error, TransportError) and error.field == "timeout"
        assert peers.senders() == []
        result = pulled(offer(server), decode)
        assert result.error is None, result.error
        assert peers.senders() == ["d-r0"] == [agent_of(decode)]


def test_a_decode_pull_that_failed_midway_pairs_afresh() -> None:
    with prefill(timeout=SHORT) as (server, _), decoders("d") as (decode,):
        # the decode side refuses the first blob (another model): its receiver is closed
        refused = rc.pull(offer(server), replace(FP, model_id="other"), LAYERS, timeout=LONG,
                          nixl=decode)  # fmt: skip
        assert isinstance(refused.error, IncompatibleFingerprintError)
        assert decode.receivers() == []
        result = pulled(offer(server), decode)
        assert result.error is None, result.error
        assert agent_of(decode) == "d-r1"


def test_the_least_recently_used_idle_sender_goes_and_its_agent_pairs_afresh() -> None:
    with prefill(max_peers=2) as (server, peers), decoders("a", "b", "c") as (a, b, c):
        for decode in (a, b, c):
            assert pulled(offer(server), decode).error is None
        assert peers.senders() == [agent_of(b), agent_of(c)]  # a's closed: the oldest idle
        old = agent_of(a)
        result = pulled(offer(server), a)  # refused as "agent", then paired afresh
        assert result.error is None, result.error
        assert agent_of(a) != old
        assert peers.senders() == [agent_of(c), agent_of(a)]


def test_an_ask_without_a_live_transfer_makes_or_closes_no_sender() -> None:
    """A sender is made (and an idle one closed for it) only for a live transfer's ask:
    an agent without a valid transfer id cannot churn the senders."""
    with prefill(max_peers=1) as (server, peers), decoders("a") as (a,):
        assert pulled(offer(server), a).error is None
        bogus = replace(offer(server), transfer_id="0" * 32)
        hostile = Hostile("h", bogus)
        hostile.close()
        assert (hostile.answer["ok"], hostile.answer["reason"]) == (False, "unknown")
        assert peers.senders() == [agent_of(a)]


def test_an_ask_with_metadata_pairs_a_new_sender_even_for_a_known_agent() -> None:
    """An agent that sends its metadata again (it never saw the answer that paired it)
    gets a new sender, not the old one its new receiver cannot talk to."""
    with prefill() as (server, peers), decoders("d") as (decode,):
        assert pulled(offer(server), decode).error is None
        again = Hostile(agent_of(decode), offer(server))  # the same name, a new receiver
        try:
            assert again.answer["ok"] is True
            assert isinstance(again.answer["agent_metadata"], str)  # a new sender's
            again.poison()
            again.ended()
        finally:
            again.close()
        assert peers.senders() == []  # the new sender failed: closed; the old one replaced


def test_a_new_agent_is_refused_by_name_while_every_sender_is_in_use() -> None:
    with prefill(max_peers=2) as (server, peers), decoders("late") as (late,):
        hostiles = [Hostile(f"h{n}", offer(server)) for n in range(2)]
        try:
            assert all(h.answer["ok"] for h in hostiles)
            params = offer(server)
            result = pulled(params, late)
            assert isinstance(result.error, TransferRefusedError)
            assert (result.error.reason, result.error.field) == ("busy", "agent")
            assert late.receivers()  # refused before any page moved: its receiver kept
            for hostile in hostiles:
                hostile.poison()
                hostile.ended()
        finally:
            for hostile in hostiles:
                hostile.close()
        errors_of(server, 2)
        assert peers.senders() == []
        # the refused transfer was not consumed: the agent pulls it now
        assert pulled(params, late).error is None


def test_the_decode_side_keeps_at_most_max_peers_receivers() -> None:
    with prefill() as (one, _), prefill() as (two, _), decoders("d", max_peers=1) as (decode,):
        assert pulled(offer(one), decode).error is None
        assert pulled(offer(two), decode).error is None
        assert decode.receivers() == [("127.0.0.1", two.port)]  # one's closed
        with decode.receiving("127.0.0.1", two.port, Deadline(5)):  # held by a pull
            result = pulled(offer(one), decode)
        assert isinstance(result.error, TransferRefusedError)
        assert (result.error.reason, result.error.field) == ("busy", "remote_host")
        assert pulled(offer(one), decode).error is None


def test_agents_pull_side_by_side() -> None:
    """Three decode agents pulling at once from one prefill worker: each through its own
    sender, every pull whole."""
    with prefill() as (server, peers), decoders("x", "y", "z") as agents:
        work = [(offer(server), decode) for decode in agents]
        results: list[rc.LoadResult] = []
        threads = [
            threading.Thread(target=lambda p=p, d=d: results.append(pulled(p, d))) for p, d in work
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=2 * LONG)
        assert len(results) == 3 and all(r.error is None for r in results), results
        assert sorted(peers.senders()) == sorted(agent_of(d) for d in agents)
