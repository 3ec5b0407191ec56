"""Issue 29 on real engines: every decode request ends, and vLLM's own free-block count
returns to its baseline, whatever the params, the peer or the client do; a prefill engine
with other weights under the same ``model_id`` is refused; a prefill engine killed in the
middle of a transfer ends the pull.

One extra engine (a prefill engine loading a model of the same config with other weights,
``make_tiny_llama(seed=1)``, under the same ``model_id``); the rest are the session's."""

from __future__ import annotations

import contextlib
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .conftest import Engine, connector, free_port
from .test_connector import MAX_TOKENS, decode, prefill, prompt, single, via

#: Out of an int32 block id's range; vLLM's own SamplingParams refuses extra_args ints
#: beyond int64/uint64 (the 4,300-digit case is the unit tests', tests/test_vllm_hostile.py).
BIG = (1 << 63) - 1
#: The extra prefill engine's ``transfer_ttl`` (seconds): long enough for the pulls its other
#: tests make at once, short enough for a test to outwait it.
TTL = 20.0


def free_blocks(engine: Engine) -> int:
    return int(engine.ask({"free_blocks": True})["free"])


@pytest.fixture(scope="module")
def baseline(engines: dict[str, Engine]) -> dict[str, int]:
    return {name: free_blocks(engines[name]) for name in ("decode", "decode64")}


@pytest.fixture(scope="module")
def other_weights(engines: dict[str, Engine]) -> Iterator[Engine]:
    """A prefill engine whose weights differ (seed 1), named ``tiny-llama`` like the rest."""
    from make_tiny_llama import make_tiny_llama

    folder = Path(tempfile.gettempdir()) / "hurray-tiny-llama-seed1"
    logs = Path(tempfile.mkdtemp(prefix="hurray-vllm-faults-"))
    config = connector("kv_producer", free_port())
    config["kv_connector_extra_config"]["transfer_ttl"] = TTL
    engine = Engine(
        {"model": str(make_tiny_llama(folder, seed=1)), "block_size": 32,
         "kv_transfer_config": config, "prefix_caching": False},
        logs / "other_weights.log",
    )  # fmt: skip
    try:
        engine.wait_ready()
        yield engine
    finally:
        engine.close()


def hostile_params(good: dict[str, Any]) -> list[Any]:
    """Params a router or client may send: each must end its request, never hang it."""
    # (not a mapping: vLLM 0.32's own front end raises AttributeError on it before any
    # connector, in OutputProcessor.add_request; the connector's refusal of it is unit-tested)
    return [
        {**good, "do_remote_decode": True},  # both flags
        {**good, "remote_host": "a" * 64 + ".example"},  # a DNS label over 63 (UnicodeError)
        {**good, "remote_block_ids": [*good["remote_block_ids"][:-1], BIG]},
        {**good, "remote_port": True},
        {**good, "remote_block_ids": {"0": 1}},
        {**good, "remote_num_tokens": 1 << 40},
        {**good, "do_remote_prefill": "yes"},
        {k: v for k, v in good.items() if k != "prompt_digest"},
    ]


def test_hostile_params_end_by_policy_and_free_their_blocks(
    engines: dict[str, Engine], baseline: dict[str, int]
) -> None:
    """Under "fail" each request ends with finish_reason "error"; under "recompute" with the
    single engine's tokens; the free-block count returns to its baseline on both."""
    p = prompt(41, 90)
    good = prefill(engines, [p])[0]
    cases = hostile_params(good)
    failed = decode(engines["decode"], [p] * len(cases), cases)
    assert [r["finish_reason"] for r in failed] == ["error"] * len(cases)
    recomputed = decode(engines["decode64"], [p] * len(cases), cases)
    assert [r["tokens"] for r in recomputed] == single(engines, [p]) * len(cases)
    assert free_blocks(engines["decode"]) == baseline["decode"]
    assert free_blocks(engines["decode64"]) == baseline["decode64"]


@contextlib.contextmanager
def silent_prefill() -> Iterator[tuple[int, threading.Event]]:
    """A prefill worker that accepts a pull and never answers; the event is set when the
    decode side closes the connection."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(120)
    closed = threading.Event()

    def run() -> None:
        with contextlib.suppress(OSError):
            conn, _ = server.accept()
            with conn:
                conn.settimeout(300)
                while conn.recv(1 << 16):  # the ask, then nothing until the decode side ends
                    pass
                closed.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1], closed
    finally:
        server.close()
        thread.join(timeout=10)


def test_an_aborted_decode_request_stops_its_pull_and_frees_its_blocks(
    engines: dict[str, Engine], baseline: dict[str, int]
) -> None:
    """A client that goes away while its request waits on a pull that would take the whole
    ``timeout`` (30 s): the pull's connection is closed and the blocks return at once."""
    p = prompt(42, 100)
    good = prefill(engines, [p])[0]
    with silent_prefill() as (port, closed):
        req = {"prompt": p, "max_tokens": MAX_TOKENS, "params": via(good, port)}
        out = engines["decode"].ask({"abort": {"requests": [req], "after": 1.0}})
        assert closed.wait(60), "the pull's connection was not closed"
    assert all(reason == "abort" for reason in out["reasons"].values())
    # ended by the abort (which logs nothing), not by the 30 s timeout (which would log
    # "the transfer took over 30.0 s")
    assert "took over" not in Path(engines["decode"].log).read_text()
    assert free_blocks(engines["decode"]) == baseline["decode"]


def test_other_weights_under_the_same_model_id_are_refused(
    engines: dict[str, Engine], other_weights: Engine, baseline: dict[str, int]
) -> None:
    p = prompt(43, 80)
    out = other_weights.generate(
        [{"prompt": p, "max_tokens": 1, "params": {"do_remote_decode": True}}]
    )
    result = decode(engines["decode"], [p], [out[0]["params"]])
    assert result[0]["finish_reason"] == "error"
    log = Path(engines["decode"].log).read_text()
    assert "extras.model_digest" in log
    # the control: the same request from the session's prefill engine is served
    served = decode(engines["decode"], [p], prefill(engines, [p]))
    assert served[0]["finish_reason"] != "error"
    assert served[0]["tokens"] == single(engines, [p])[0]
    assert free_blocks(engines["decode"]) == baseline["decode"]


def test_a_transfer_pulled_after_its_ttl_is_refused_and_its_blocks_freed(
    engines: dict[str, Engine], other_weights: Engine, baseline: dict[str, int]
) -> None:
    """A transfer the prefill side dropped at its TTL (memory returned, the id remembered
    as expired): the decode request ends by policy, "fail" with an error naming the expiry,
    "recompute" with the single engine's tokens, and no decode block stays held."""
    p = prompt(47, 70)
    params = other_weights.generate(
        [{"prompt": p, "max_tokens": 1, "params": {"do_remote_decode": True}}] * 2
    )
    time.sleep(TTL + 3.0)  # the listener sweeps expired transfers every second
    log = Path(engines["decode"].log)
    before = log.read_text().count("expired")
    failed = decode(engines["decode"], [p], [params[0]["params"]])
    assert failed[0]["finish_reason"] == "error"
    assert log.read_text().count("expired") > before
    recomputed = decode(engines["decode64"], [p], [params[1]["params"]])
    assert recomputed[0]["finish_reason"] != "error"
    assert recomputed[0]["tokens"] == single(engines, [p])[0]
    assert free_blocks(engines["decode"]) == baseline["decode"]
    assert free_blocks(engines["decode64"]) == baseline["decode64"]


def test_a_nixl_client_that_never_reads_delays_no_other_decode(
    engines: dict[str, Engine],
) -> None:
    """A client asks the prefill engine for a transfer over NIXL, pairs, and never reads a
    blob: it holds only its own sender. The NIXL decode engine's pull from the same
    prefill worker goes on meanwhile with the single engine's tokens (before, every NIXL
    send waited on one lock: the decode pull waited out the client's 30 s); the client's
    pull ends, typed, when it sends a notification that is no transfer record, and the
    listener serves the next pull."""
    pytest.importorskip("nixl_cu12")
    from hurray_wire.vllm.params import TransferParams
    from tests.nixl_hostile import Hostile

    held, good = prefill(engines, [prompt(48, 70), prompt(49, 90)])
    hostile = Hostile("hostile-agent", TransferParams.from_params(held))
    try:
        assert hostile.answer["ok"] is True
        out = decode(engines["decode_nixl"], [prompt(49, 90)], [good])
        assert out[0]["tokens"] == single(engines, [prompt(49, 90)])[0]
        assert hostile.still_served()  # the decode pull ended while the hostile's ran
        hostile.poison()
        assert b"done" not in hostile.ended()
    finally:
        hostile.close()
    again = decode(engines["decode_nixl"], [prompt(50, 60)], prefill(engines, [prompt(50, 60)]))
    assert again[0]["tokens"] == single(engines, [prompt(50, 60)])[0]


def test_a_prefill_engine_killed_mid_transfer_ends_the_pull(
    engines: dict[str, Engine], other_weights: Engine, baseline: dict[str, int]
) -> None:
    """The prefill engine's process is killed while the decode worker is in its pull: a
    proxy passes the answer line and the stream's first bytes, holds the rest (what a
    killed engine had not sent yet: this model's transfers fit in the socket buffers, so
    the engine itself is done writing before any kill) and drops it when the process
    dies. The request ends with an error under "fail", a recompute under "recompute", and
    no block stays held. Runs last: it kills the module's extra engine."""
    p = prompt(45, 120)
    params = other_weights.generate(
        [{"prompt": p, "max_tokens": 1, "params": {"do_remote_decode": True}}] * 2
    )
    killed = threading.Event()
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(120)

    def proxy() -> None:
        for _ in range(2):
            with contextlib.suppress(OSError):
                conn, _ = server.accept()
                with (
                    conn,
                    socket.create_connection(
                        ("127.0.0.1", params[0]["params"]["remote_port"]), timeout=60
                    ) as up,
                ):
                    up.sendall(conn.recv(1 << 16))
                    conn.sendall(up.recv(200))  # the answer line and a few bytes
                    killed.wait(60)  # the rest dies with the engine

    thread = threading.Thread(target=proxy, daemon=True)
    thread.start()
    try:

        def kill() -> None:
            other_weights.proc.kill()
            killed.set()

        killer = threading.Timer(3.0, kill)
        killer.start()
        port = server.getsockname()[1]
        failed = decode(engines["decode"], [p], [via(params[0]["params"], port)])
        recomputed = decode(engines["decode64"], [p], [via(params[1]["params"], port)])
        killer.join()
    finally:
        server.close()
        thread.join(timeout=60)
    assert other_weights.proc.wait(timeout=60) != 0
    assert failed[0]["finish_reason"] == "error"
    assert recomputed[0]["tokens"] == single(engines, [p])[0]
    assert free_blocks(engines["decode"]) == baseline["decode"]
    assert free_blocks(engines["decode64"]) == baseline["decode64"]
