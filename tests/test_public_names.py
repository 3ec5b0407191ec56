"""The public names that were easy to confuse (issue 23, "Discoverability and typing"):
the ``EnginePoolStore`` keyword is ``pool_store`` (never ``pool``, which read like
``page_pool``, an engine array), and ``Tensor`` / ``BlockPagedTensor`` say which is which."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import pytest

import hurray_wire as hw
from hurray_wire.errors import TransportError

IN_PLACE: list[Callable[..., Any]] = [hw.InPlace]


@pytest.mark.parametrize("route", IN_PLACE, ids=lambda f: f.__name__)
def test_the_engine_pool_store_keyword_is_pool_store(route: Callable[..., Any]) -> None:
    params = inspect.signature(route).parameters
    assert "pool_store" in params
    assert "pool" not in params
    assert "page_pool" not in params


def test_nixl_expect_takes_a_landing_target() -> None:
    try:
        from hurray_wire.transport.nixl_receiver import NixlReceiver
    except TransportError:
        pytest.skip("NIXL cannot load here")
    params = inspect.signature(NixlReceiver.expect).parameters
    assert list(params) == ["self", "layer", "role", "into"]


def test_tensor_and_block_paged_tensor_name_each_other() -> None:
    assert hw.Tensor.__doc__ is not None and hw.BlockPagedTensor.__doc__ is not None
    assert "BlockPagedTensor" in hw.Tensor.__doc__
    assert "Tensor" in hw.BlockPagedTensor.__doc__.replace("BlockPagedTensor", "")
    assert hw.__doc__ is not None
    assert "``Tensor`` is" in hw.__doc__
