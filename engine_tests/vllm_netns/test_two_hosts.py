"""Prefill and decode on two hosts (network namespaces joined by a veth pair): the single
engine's tokens over the socket transport (decode TP=2) and over NIXL (decode TP=1), the
transfer handed out with the prefill host's own address; a TP group the params spread over
hosts is refused by name (``tp_size``), never served."""

from __future__ import annotations

import re

from engine_tests.vllm_cpu.conftest import Engine
from engine_tests.vllm_cpu.test_connector import decode, prefill, prompt, single

from .conftest import KV_PORT, PREFILL_ADDR

PROMPTS = [prompt(900 + i, n) for i, n in enumerate((40, 130, 300))]


def test_params_name_the_prefill_hosts_own_address(engines: dict[str, Engine]) -> None:
    params = prefill(engines, PROMPTS[:1])[0]
    assert (params["remote_host"], params["remote_port"]) == (PREFILL_ADDR, KV_PORT)


def test_two_hosts_over_the_socket_into_a_tp2_decode_engine(engines: dict[str, Engine]) -> None:
    baseline = single(engines, PROMPTS)
    assert len({t for ts in baseline for t in ts}) > 3, "degenerate output proves nothing"
    out = decode(engines["decode_tp2"], PROMPTS, prefill(engines, PROMPTS))
    assert [r["finish_reason"] for r in out] == ["length"] * len(PROMPTS)
    assert [r["tokens"] for r in out] == baseline


def test_two_hosts_over_nixl(engines: dict[str, Engine]) -> None:
    baseline = single(engines, PROMPTS)
    out = decode(engines["decode_nixl"], PROMPTS, prefill(engines, PROMPTS))
    assert [r["finish_reason"] for r in out] == ["length"] * len(PROMPTS)
    assert [r["tokens"] for r in out] == baseline
    assert engines["decode_nixl"].stats()["transfers"] >= len(PROMPTS)


def test_a_tp_group_spread_over_hosts_is_refused(engines: dict[str, Engine]) -> None:
    """A prefill "TP=2" whose rank 1 would live on another host: the params can only name
    one host (rank r on ``remote_port + r``), so the decode side asks the prefill host for
    rank 1, finds no such rank there, and refuses the transfer: an error, no tokens."""
    params = prefill(engines, PROMPTS[:1])[0]
    spread = {**params, "remote_tp_size": 2}
    out = decode(engines["decode_nixl"], PROMPTS[:1], [spread])
    assert out[0]["finish_reason"] == "error" and out[0]["tokens"] == []
    log = engines["decode_nixl"].log.read_text(errors="replace")
    refusals = re.findall(r"HurrayConnector: request \S+: KV load refused: .*", log)
    assert refusals, "no refusal line in the decode log"
    # e.g. "field tp_size: the transfer comes from another TP rank than the one asked"
    assert "field tp_size" in refusals[-1], refusals[-1]
