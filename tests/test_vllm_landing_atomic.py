"""The connector's landing is transfer-atomic (issue 31): every check of every layer passes
before the first block of any layer is written (``backends.land_layers``, which
``HurrayConnector._land`` calls for host caches). Caches are built as vLLM lays them out
(tests/test_vllm_device.py's ``cache_of``); the refusals are ``into_vllm``'s own."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from hurray_wire.errors import (
    ArgumentTypeError,
    HurrayWireError,
    IndexBufferError,
    InvalidTensorError,
)
from hurray_wire.vllm.backends import land_layers
from tests.test_vllm_device import FORMS, cache_of, form_of

torch = pytest.importorskip("torch")

LAYERS = 4


def _transfer(spec: tuple[Any, ...]) -> tuple[Any, list[Any], list[Any], int]:
    """A form, per layer a destination cache and the pages read from another one."""
    backend, layout, _isa, block, kernel = spec
    form = form_of(*spec)
    caches, pages = [], []
    for layer in range(LAYERS):
        source = cache_of(backend, layout, kernel, form.ratio, "cpu") * (layer + 2)
        pages.append(form.read(source, [3, 6]))
        caches.append(cache_of(backend, layout, kernel, form.ratio, "cpu") * 0 + layer)
    return form, caches, pages, block + block // 2 + 1  # the second block partial


def _last_layer_refused(kind: str, caches: list[Any], pages: list[Any]) -> type[HurrayWireError]:
    """Spoil the last layer so that only its checks refuse it."""
    last = caches[-1]
    if kind == "read-only cache":
        caches[-1] = last.numpy()
        caches[-1].flags.writeable = False
        return ArgumentTypeError
    if kind == "another dtype":
        caches[-1] = last.to(torch.float32)
        return InvalidTensorError
    # a page short: its pages cannot fill the blocks the first layers took
    pages[-1] = tuple(p[:1] for p in pages[-1])
    return HurrayWireError


@pytest.mark.parametrize("kind", ["read-only cache", "another dtype", "a page short"])
@pytest.mark.parametrize("spec", FORMS, ids=lambda s: f"{s[0]}-{s[1]}-{s[3]}/{s[4]}")
def test_a_refusal_at_the_last_layer_leaves_every_layer_untouched(
    kind: str, spec: tuple[Any, ...]
) -> None:
    form, caches, pages, tokens = _transfer(spec)
    error = _last_layer_refused(kind, caches, pages)
    before = [(c if isinstance(c, np.ndarray) else c.numpy()).copy() for c in caches]
    layers = [(c, p, (None, None)) for c, p in zip(caches, pages, strict=True)]
    with pytest.raises(error):
        land_layers(form, layers, tokens, [2, 8])
    for layer, (cache, held) in enumerate(zip(caches, before, strict=True)):
        assert np.array_equal(np.asarray(cache), held), f"layer {layer} was written"


@pytest.mark.parametrize("spec", FORMS, ids=lambda s: f"{s[0]}-{s[1]}-{s[3]}/{s[4]}")
def test_every_layer_lands_when_every_check_passes(spec: tuple[Any, ...]) -> None:
    """The control: the same transfer unspoiled lands in every layer, as each layer's own
    write would land it."""
    form, caches, pages, tokens = _transfer(spec)
    expected = [c.clone() for c in caches]
    for cache, p in zip(expected, pages, strict=True):
        form.write(p, tokens, cache, [2, 8])
    land_layers(form, [(c, p, (None, None)) for c, p in zip(caches, pages, strict=True)],
                tokens, [2, 8])  # fmt: skip
    for cache, want, layer in zip(caches, expected, range(LAYERS), strict=True):
        assert torch.equal(cache, want)
        assert not torch.equal(cache, cache * 0 + layer)  # it was written


def test_block_zero_at_the_last_layer_is_refused_before_any_write() -> None:
    """The block ids are the transfer's: a null block refuses the first layer already."""
    form, caches, pages, tokens = _transfer(FORMS[0])
    before = [c.clone() for c in caches]
    with pytest.raises(IndexBufferError, match="null block"):
        land_layers(form, [(c, p, (None, None)) for c, p in zip(caches, pages, strict=True)],
                    tokens, [2, 0])  # fmt: skip
    assert all(torch.equal(c, b) for c, b in zip(caches, before, strict=True))
