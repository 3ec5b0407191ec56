"""The connector's save digests each page as it copies it out of the cache (issue 30):
the digests are ``page_digests`` of the held pages for every backend layout, and a pull
that sends them is byte for byte the pull that hashes the held pages itself."""

from __future__ import annotations

import socket
from typing import Any

import numpy as np
import pytest
import torch

from hurray_wire.adapters import _vllm_forms as forms
from hurray_wire.integrity.digests import page_digests
from hurray_wire.vllm import backends, transfer as tr
from hurray_wire.vllm.backends import CacheForm, kernel_ids
from hurray_wire.vllm.device import gather
from hurray_wire.vllm.params import one_sequence
from tests.test_vllm_transfer import FP, PROMPT, pages

H, D = 2, 64  # a K/V row of 16 tokens: 4 KiB, a row per call; consecutive ids: in chunks
# (backend, layout, isa, scheduler block, kernel block)
FORMS = [
    ("FLASH_ATTN", "LBNHC", None, 16, 16),
    ("FLASH_ATTN", "LBHNC", None, 16, 16),
    ("FLASHINFER", "LBHNC", None, 32, 16),  # the kernel-block split: two rows per page
    ("FLASHMLA", "LBNHC", None, 128, 64),  # a shared pool: digested after the read
    ("CPU_ATTN", "LBHNC", "vec", 32, 32),
]


def _cache(spec: tuple[Any, ...], blocks: int) -> torch.Tensor:
    backend, layout, _, _, kernel = spec
    heads, width = (1, 96) if backend in forms.MLA_BACKENDS else (H, 2 * D)
    ratio = spec[3] // kernel
    shape = (blocks * ratio, heads, kernel, width)
    physical = forms.LAYOUTS[layout]
    gen = torch.Generator().manual_seed(blocks)
    memory = torch.randn([shape[a] for a in physical], generator=gen).half()
    return memory.permute([physical.index(a) for a in range(4)])


@pytest.mark.parametrize("spec", FORMS, ids=lambda s: f"{s[0]}-{s[1]}-{s[3]}/{s[4]}")
@pytest.mark.parametrize("count", [1, 9, 40])
def test_save_digests_are_the_held_pages_digests(
    spec: tuple[Any, ...], count: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend, layout, isa, block, kernel = spec
    if backend not in forms.MLA_BACKENDS:  # K/V pages: digested in the gather, none after

        def after(*_: Any) -> None:
            raise AssertionError("digested after the read")

        monkeypatch.setattr(backends, "page_rows", after)
    form = CacheForm(backend, layout, isa, block, kernel, None, "float16")
    cache = _cache(spec, 2 * count + 1)
    shuffled = np.random.default_rng(count).permutation(np.arange(1, 2 * count + 1))
    for ids in ([int(i) for i in shuffled[:count]], list(range(1, count + 1))):
        held, digests = form.read_digested(cache, ids)
        assert len(held) == len(digests) == len(form.roles)
        for mine, want, got in zip(held, form.read(cache, ids), digests, strict=True):
            np.testing.assert_array_equal(mine, want)
            expected = page_digests(one_sequence(mine, count * block))
            np.testing.assert_array_equal(got, expected)
        # poisoned control: another block's pages do not have these digests
        other = form.read(cache, [ids[-1], *ids[:-1]]) if count > 1 else None
        if other is not None:
            assert not np.array_equal(page_digests(one_sequence(other[0], count * block)),
                                      digests[0])  # fmt: skip


@pytest.mark.parametrize("spec", FORMS[:3], ids=lambda s: f"{s[0]}-{s[1]}")
def test_a_device_save_digests_its_staged_pages(spec: tuple[Any, ...]) -> None:
    """A GPU's pages arrive gathered in pinned memory: digested there, as the pull would."""
    backend, layout, isa, block, kernel = spec
    form = CacheForm(backend, layout, isa, block, kernel, None, "float16")
    cache = _cache(spec, 9)
    ids = [5, 2, 7]
    staged = gather(cache, kernel_ids([0, *ids], form.ratio), views=form.page_views).host()
    held, digests = form.read_digested(staged, range(1, 4), fresh=True)
    for mine, want, got in zip(held, form.read(cache, ids), digests, strict=True):
        np.testing.assert_array_equal(mine, want)
        np.testing.assert_array_equal(got, page_digests(one_sequence(mine, 3 * block)))


def _pull(with_digests: bool, first: int) -> bytes:
    """One socket pull of a two-layer transfer; the bytes the decode worker receives."""
    store = tr.TransferStore(FP, "m", 2)
    store.begin("t", "r", (1, 2, 3), len(PROMPT), tr.prompt_digest(PROMPT))
    for layer in range(2):
        held = pages(layer)
        digests = [page_digests(one_sequence(p, len(PROMPT))) for p in held]
        store.add_layer("t", layer, *held, digests=digests if with_digests else None)
    a, b = socket.socketpair()
    with a, b:
        a.sendall(b'{"transfer_id":"t","request_id":"r","prompt_digest":"'
                  + tr.prompt_digest(PROMPT).encode() + b'","block_ids":[1,2,3],'
                  + b'"first_page":' + str(first).encode() + b"}\n")  # fmt: skip
        assert tr.serve_one(store, b) > 0
        b.shutdown(socket.SHUT_WR)
        data = bytearray()
        while chunk := a.recv(1 << 16):
            data += chunk
    return bytes(data)


@pytest.mark.parametrize("first", [0, 2])
def test_a_pull_with_held_digests_sends_the_same_bytes(first: int) -> None:
    """The golden equivalence on the connector's route: the held digests change nothing
    the decode worker receives (the encoder's own pass gives the same bytes)."""
    mine = _pull(True, first)
    assert mine == _pull(False, first)
    assert len(mine) > 2 * 2 * pages(0)[0][first:].nbytes
