"""The prefix-cache delta of hurray_wire.vllm: the decode worker sends the digests of the
pages it holds (hashed where they sit), the prefill worker sends those pages as page
references (digest, no bytes); a held page that went stale has a digest the transfer does
not produce, so its page comes in full and the decode worker overwrites the held page (and
every one after it) with the transfer's, over the socket and NIXL."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from hurray_wire.vllm import receive as rc
from hurray_wire.vllm.held import HeldPages
from hurray_wire.vllm.peers import NixlPeers
from tests.test_vllm_transfer import FP, LAYERS, producer

PAGE = 4 * 2 * 8 * 4  # B * H * D * float32


def held_of(layers: list[Any], count: int) -> HeldPages:
    return HeldPages.from_pages([(k[:count].copy(), v[:count].copy()) for k, v in layers])


def test_held_pages_travel_as_references_and_are_checked() -> None:
    with producer() as (_, params, layers):
        full = rc.pull(params, FP, LAYERS, timeout=5)
    with producer() as (_, params, layers):
        delta = rc.pull(params, FP, LAYERS, first_block=2, held=held_of(layers, 2), timeout=5)
    assert full.pages is not None and delta.pages is not None, delta.error
    # two pages' bytes fewer in each of the 4 blobs; a reference costs its digest entry
    saved = full.pages.wire_bytes - delta.pages.wire_bytes
    assert 2 * 2 * LAYERS * (PAGE - 64) <= saved < 2 * 2 * LAYERS * PAGE
    assert delta.pages.first_block == 2
    np.testing.assert_array_equal(delta.pages.layers[1][1], layers[1][1][2:])


def stale(layers: list[Any], layer: int, role: int, block: int) -> HeldPages:
    held = [(k[:2].copy(), v[:2].copy()) for k, v in layers]
    held[layer][role][block, 3, 1, 7] += 1e-3  # stale or poisoned in the engine's pool
    return HeldPages.from_pages(held)


@pytest.mark.parametrize(("layer", "role", "block"), [(0, 0, 0), (1, 1, 1), (1, 0, 1)])
def test_a_stale_held_page_is_overwritten_with_the_transfers(
    layer: int, role: int, block: int
) -> None:
    with producer() as (_, params, layers):
        good = rc.pull(params, FP, LAYERS, first_block=2, held=held_of(layers, 2), timeout=5)
    with producer() as (_, params, layers):
        result = rc.pull(params, FP, LAYERS, first_block=2, held=stale(layers, layer, role, block),
                         timeout=5)  # fmt: skip
    assert result.error is None and result.failed_from is None
    assert result.pages is not None and result.pages.first_block == block
    assert result.pages.repaired == 2 - block
    for (key, value), (k, v) in zip(result.pages.layers, layers, strict=True):
        np.testing.assert_array_equal(key, k[block:])  # the transfer's pages, from the stale one
        np.testing.assert_array_equal(value, v[block:])
    assert good.pages is not None
    assert result.pages.wire_bytes > good.pages.wire_bytes  # the stale page came in full


def test_held_pages_over_nixl() -> None:
    pytest.importorskip("nixl_cu12")
    results = []
    for name in ("good", "bad"):
        with producer() as (server, params, layers):
            held = held_of(layers, 2) if name == "good" else stale(layers, 1, 0, 1)
            server.nixl = NixlPeers(f"held-p-{name}", timeout=20)
            peers = NixlPeers(f"held-d-{name}", timeout=20)
            try:
                results.append(rc.pull(params, FP, LAYERS, first_block=2, held=held,
                                       timeout=20, nixl=peers))  # fmt: skip
            finally:
                peers.close()
    good, bad = results
    assert good.pages is not None and good.error is None, good.error
    np.testing.assert_array_equal(good.pages.layers[0][0], layers[0][0][2:])
    assert bad.error is None and bad.pages is not None
    assert bad.pages.first_block == 1 and bad.pages.repaired == 1
    np.testing.assert_array_equal(bad.pages.layers[1][0], layers[1][0][1:])


@pytest.mark.parametrize("record", ["not base64!", 7, "AAAA"])
def test_a_known_pages_record_that_is_not_one_is_refused(record: object) -> None:
    import json
    import socket

    from hurray_wire.vllm import transfer as tr

    with producer() as (server, params, _layers):
        ask = {
            "transfer_id": params.transfer_id, "request_id": params.request_id,
            "prompt_digest": params.prompt_digest, "block_ids": list(params.block_ids),
            "held_pages": 2, "known_pages": record,
        }  # fmt: skip
        mine, theirs = socket.socketpair()
        with mine, theirs:
            mine.sendall(json.dumps(ask).encode() + b"\n")
            assert tr.serve_one(server.store, theirs) == 0
            answer = json.loads(mine.makefile().readline())
    assert answer["ok"] is False and answer["reason"] == "known_pages"
