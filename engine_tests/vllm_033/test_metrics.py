"""HurrayConnector's metrics through vLLM 0.33.0's own code: the worker's stats ride the model
runner's ``KVConnectorOutput`` into the v1 ``Scheduler``, which hands them to its stat
loggers as a dict; vLLM's ``KVConnectorLogging`` rebuilds and logs them and its
``PrometheusStatLogger`` registers the connector's metrics (``build_prom_metrics``) and
records them, as for NixlConnector."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from .test_scheduler import model_dir, request, runner_output, scheduler, waiting_load

pytest.importorskip("vllm.v1.metrics.loggers")
__all__ = ["model_dir"]  # the fixture, imported for pytest


def worker_stats(**counters: Any) -> Any:
    from hurray_wire.vllm.metrics import HurrayConnectorStats

    return HurrayConnectorStats(data=dict(counters))


def sample(text: str, name: str) -> float:
    """The value of one Prometheus sample line ``name{...} value`` in ``text``."""
    found = [line for line in text.splitlines() if line.startswith(name + "{")]
    assert len(found) == 1, (name, found)
    return float(found[0].rsplit(" ", 1)[1])


def test_scheduler_ships_the_worker_stats(model_dir: Path) -> None:
    sched = scheduler(model_dir, "kv_consumer", log_stats=True)
    sched.add_request(request("d-1", 4, None))
    out = sched.schedule()
    one = worker_stats(transfers=1, bytes_received=4096, pages_reused=2, transfer_seconds=[0.03])
    eco = sched.update_from_output(out, runner_output(["d-1"], 7, kv_connector_stats=one))
    payload = eco[0].scheduler_stats.kv_connector_stats
    assert payload["bytes_received"] == 4096 and payload["transfer_seconds"] == [0.03]


def test_prometheus_and_the_log_line(model_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    import prometheus_client
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorLogging
    from vllm.v1.metrics.loggers import PrometheusStatLogger
    from vllm.v1.metrics.stats import SchedulerStats

    sched, _, _ = waiting_load(model_dir, "fail")
    config = sched.vllm_config
    prom = PrometheusStatLogger(config, [0])
    first = worker_stats(transfers=1, bytes_received=1000, pages_reused=2,
                         transfer_seconds=[0.02])  # fmt: skip
    second = worker_stats(verification_failures=1, bytes_sent=300, pages_sent=3)
    # two workers' stats of one step, summed as vLLM's KVOutputAggregator does
    merged = first.aggregate(second)
    for payload in (merged.to_dict(), worker_stats(transfers=1, transfer_seconds=[0.4]).data):
        prom.record(SchedulerStats(kv_connector_stats=payload), None, engine_idx=0)
    text = prometheus_client.generate_latest().decode()
    assert sample(text, "vllm:hurray_transfers_total") == 2
    assert sample(text, "vllm:hurray_bytes_received_total") == 1000
    assert sample(text, "vllm:hurray_bytes_sent_total") == 300
    assert sample(text, "vllm:hurray_pages_sent_total") == 3
    assert sample(text, "vllm:hurray_pages_reused_total") == 2
    assert sample(text, "vllm:hurray_verification_failures_total") == 1
    assert sample(text, "vllm:hurray_transfer_time_seconds_count") == 2
    assert sample(text, "vllm:hurray_transfer_time_seconds_sum") == pytest.approx(0.42)
    buckets = [line for line in text.splitlines()
               if line.startswith("vllm:hurray_transfer_time_seconds_bucket")]  # fmt: skip
    assert any('le="0.025"' in line and line.endswith(" 1.0") for line in buckets), buckets

    logging = KVConnectorLogging(config.kv_transfer_config)
    logging.observe(merged.to_dict())
    logging.observe(worker_stats(transfers=1, transfer_seconds=[0.4]).to_dict())
    lines: list[str] = []
    logging.log(log_fn=lambda fmt, *args: lines.append(fmt % args))
    assert len(lines) == 1
    assert "transfers=2" in lines[0] and "verification_failures=1" in lines[0]
    assert "avg_transfer_time_s=0.21" in lines[0]


def test_stats_reduce_and_empty() -> None:
    from hurray_wire.vllm import HurrayConnector

    assert HurrayConnector.build_kv_connector_stats().is_empty()
    assert HurrayConnector.build_kv_connector_stats({"transfer_seconds": [0.1]}).is_empty() is False
    a = HurrayConnector.build_kv_connector_stats({"bytes_sent": 5, "transfer_seconds": [1.0]})
    a.reset()
    assert a.is_empty() and a.reduce()["avg_transfer_time_s"] == 0.0
