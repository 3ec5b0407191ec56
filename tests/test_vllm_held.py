"""The prefix-cache delta of hurray_wire.vllm: pages the decode worker holds travel as page
references (digest, no bytes) and are checked against the pages it holds, re-hashed there;
a held page that differs fails the load from its block on, over the socket and NIXL."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from hurray_wire.errors import PageDigestError
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


@pytest.mark.parametrize(("layer", "role", "block"), [(0, 0, 0), (1, 1, 1), (1, 0, 1)])
def test_a_held_page_that_differs_fails_from_its_block(layer: int, role: int, block: int) -> None:
    with producer() as (_, params, layers):
        held = [(k[:2].copy(), v[:2].copy()) for k, v in layers]
        held[layer][role][block, 3, 1, 7] += 1e-3  # stale or poisoned in the engine's pool
        result = rc.pull(
            params, FP, LAYERS, first_block=2, held=HeldPages.from_pages(held), timeout=5
        )
    assert result.pages is None and isinstance(result.error, PageDigestError)
    assert result.failed_from == block


def test_held_pages_over_nixl() -> None:
    pytest.importorskip("nixl_cu12")
    with producer() as (server, params, layers):
        server.nixl = NixlPeers("held-p", timeout=20)
        peers = NixlPeers("held-d", timeout=20)
        try:
            good = rc.pull(params, FP, LAYERS, first_block=2, held=held_of(layers, 2),
                           timeout=20, nixl=peers)  # fmt: skip
        finally:
            peers.close()
    assert good.pages is not None, good.error
    np.testing.assert_array_equal(good.pages.layers[0][0], layers[0][0][2:])
    with producer() as (server, params, layers):
        server.nixl = NixlPeers("held-p2", timeout=20)
        peers = NixlPeers("held-d2", timeout=20)
        held = [(k[:2].copy(), v[:2].copy()) for k, v in layers]
        held[1][0][1] += 1.0
        try:
            bad = rc.pull(params, FP, LAYERS, first_block=2, held=HeldPages.from_pages(held),
                          timeout=20, nixl=peers)  # fmt: skip
        finally:
            peers.close()
    assert bad.pages is None and "PageStoreMissError" in str(bad.error)
    assert bad.failed_from == 0  # NIXL stops at the failing blob: later held pages unchecked
