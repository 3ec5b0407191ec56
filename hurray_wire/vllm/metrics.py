"""The HurrayConnector's metrics, as vLLM's own connectors report theirs (docs/vllm.md § 4):
``HurrayConnectorStats`` each step (vLLM sums, logs ``reduce()`` and ships ``data``), and
``HurrayPromMetrics``, registered as NixlConnector's ``NixlPromMetrics`` is
(``vllm/distributed/kv_transfer/kv_connector/v1/nixl/stats.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
    KVConnectorPromMetrics,
    KVConnectorStats,
)
from vllm.v1.metrics.utils import create_metric_per_engine

__all__ = ["COUNTERS", "HurrayConnectorStats", "HurrayPromMetrics"]

#: Counters (summed) and what each counts; ``transfer_seconds`` is one entry per pull.
COUNTERS = {
    "transfers": "KV transfers landed on this decode worker",
    "bytes_sent": "bytes of KV pages this prefill worker sent (socket stream or NIXL blobs)",
    "bytes_received": "bytes of KV pages this decode worker received",
    "pages_sent": "KV pages (blocks, all layers together) this prefill worker copied to send",
    "pages_reused": "blocks the decode worker's prefix cache held: not transferred",
    "pages_repaired": "held prefix-cache blocks that differed from the transfer's pages and "
    "were overwritten with them (docs/vllm.md, held pages)",
    "verification_failures": "pulls refused or failed (fingerprint, identity, page digest, "
    "transport): reported to vLLM as load errors",
}
TIMES = "transfer_seconds"
#: Histogram buckets of one pull's seconds (NixlConnector's, vllm/.../nixl/stats.py).
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0)


@dataclass
class HurrayConnectorStats(KVConnectorStats):  # type: ignore[misc]
    """Counters since the last report (``COUNTERS``) and the seconds of each pull
    (``transfer_seconds``, a list so that vLLM's histogram and averages see every one)."""

    data: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.data = {**dict.fromkeys(COUNTERS, 0), **self.data}
        self.data[TIMES] = list(self.data.get(TIMES) or ())

    def reset(self) -> None:
        self.data = {**dict.fromkeys(COUNTERS, 0), TIMES: []}

    def count(self, name: str, amount: float) -> None:
        self.data[name] = self.data.get(name, 0) + amount

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        for name in COUNTERS:
            self.count(name, other.data.get(name, 0))
        self.data[TIMES].extend(other.data.get(TIMES) or ())
        return self

    def reduce(self) -> dict[str, int | float]:
        times: list[float] = self.data[TIMES]
        out: dict[str, int | float] = {name: self.data.get(name, 0) for name in COUNTERS}
        out["transfer_time_s"] = round(sum(times), 6)
        out["avg_transfer_time_s"] = round(sum(times) / len(times), 6) if times else 0.0
        return out

    def is_empty(self) -> bool:
        return not self.data[TIMES] and not any(self.data.get(n, 0) for n in COUNTERS)


class HurrayPromMetrics(KVConnectorPromMetrics):  # type: ignore[misc]
    """``vllm:hurray_<counter>`` counters (exposed with ``_total``) and
    ``vllm:hurray_transfer_time_seconds``, one child per engine label set."""

    def __init__(
        self,
        vllm_config: Any,
        metric_types: dict[type, type],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> None:
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self.counters = {
            name: create_metric_per_engine(
                self._counter_cls(
                    name=f"vllm:hurray_{name}", documentation=f"HurrayConnector: {doc}.",
                    labelnames=labelnames,
                ),
                per_engine_labelvalues,
            )
            for name, doc in COUNTERS.items()
        }  # fmt: skip
        self.transfer_time = create_metric_per_engine(
            self._histogram_cls(
                name="vllm:hurray_transfer_time_seconds",
                documentation="HurrayConnector: seconds from a pull's start to its pages "
                "validated, per transfer.",
                buckets=list(BUCKETS), labelnames=labelnames,
            ),
            per_engine_labelvalues,
        )  # fmt: skip

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        for name, metric in self.counters.items():
            amount = transfer_stats_data.get(name, 0)
            if amount:
                metric[engine_idx].inc(amount)
        for seconds in transfer_stats_data.get(TIMES) or ():
            self.transfer_time[engine_idx].observe(seconds)
