"""What :class:`kvc.vllm.KvcConnector` tells vLLM's metrics: its stats
(``get_kv_connector_stats``), logged by vLLM every interval and exported
as Prometheus counters (``build_prom_metrics``).

The stats are counters, summed over the workers and the scheduler side
(each adds its own keys) and over the steps of an interval:

- the scheduler side's decisions: ``decisions.<strategy>`` for each
  request it decided to load by a strategy, ``decisions.recompute`` for
  each it left to vLLM's prefill, and ``hit_tokens``, the tokens decided
  to load past vLLM's own;
- the workers' loads: ``loads``, ``loaded_tokens``, ``load_bytes`` (read
  from the stores), ``fallback_tokens`` (tokens a load could not read,
  recomputed by kvc or left to vLLM), ``failed_loads``, and
  ``load_seconds``, each load's seconds (a list, concatenated);
- the workers' saves: ``saves``, ``saved_objects`` (objects written),
  ``save_bytes``, ``failed_saves``.

Prometheus (``vllm:kvc_*``, with vLLM's engine labels): one counter per
key, ``vllm:kvc_decisions`` labelled by ``strategy``, and the histogram
``vllm:kvc_load_seconds``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from prometheus_client import Counter, Histogram
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
    KVConnectorPromMetrics, KVConnectorStats, PromMetric, PromMetricT)

__all__ = ["KvcConnectorStats", "KvcPromMetrics", "COUNTERS"]

_DECISIONS = "decisions."

COUNTERS: dict[str, str] = {
    "hit_tokens": "Prompt tokens kvc decided to load past vLLM's own.",
    "loads": "Loads the workers ran.",
    "loaded_tokens": "Tokens the workers' loads made resident.",
    "load_bytes": "Bytes the workers' loads read from kvc's stores.",
    "fallback_tokens": "Tokens a load could not read from the stores "
                       "(recomputed by kvc or left to vLLM).",
    "failed_loads": "Loads that failed as a whole (vLLM recomputes them).",
    "saves": "Saves whose objects were written.",
    "saved_objects": "Objects the saves wrote (those stored already are "
                     "skipped).",
    "save_bytes": "Bytes the saves wrote to kvc's stores.",
    "failed_saves": "Saves that failed.",
}
"""The counters, by stats key, with their Prometheus documentation."""


@dataclass
class KvcConnectorStats(KVConnectorStats):
    """kvc's counters over an interval (the module's documentation)."""

    def add(self, key: str, value: float = 1) -> None:
        self.data[key] = self.data.get(key, 0) + value

    def decided(self, strategy: str | None, hit_tokens: int) -> None:
        """A scheduler decision: loads by ``strategy`` (None: recomputes)."""
        self.add(_DECISIONS + (strategy or "recompute"))
        if strategy is not None:
            self.add("hit_tokens", hit_tokens)

    def loaded(self, tokens: int, metrics: dict[str, Any] | None) -> None:
        """A load that ended; ``metrics`` None when it failed."""
        if metrics is None:
            self.add("failed_loads")
            return
        self.add("loads")
        self.add("loaded_tokens", tokens)
        self.add("load_bytes", sum(metrics.get("bytes_read", {}).values()))
        self.data.setdefault("load_seconds", []).append(
            float(metrics.get("seconds", 0.0)))
        self.add("fallback_tokens", sum(
            end - begin for begin, end in metrics.get("fallback_tokens", [])))

    def saved(self, metrics: dict[str, Any] | None) -> None:
        """A save whose writes ended; ``metrics`` None when it failed."""
        if metrics is None:
            self.add("failed_saves")
            return
        self.add("saves")
        self.add("saved_objects", int(metrics.get("written", 0)))
        self.add("save_bytes",
                 sum(metrics.get("bytes_written", {}).values()))

    def reset(self) -> None:
        self.data = {}

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        merged = dict(self.data)
        for key, value in other.data.items():
            merged[key] = merged[key] + value if key in merged else value
        return KvcConnectorStats(data=merged)

    def reduce(self) -> dict[str, int | float]:
        reduced = {key: value for key, value in sorted(self.data.items())
                   if not isinstance(value, list)}
        seconds = self.data.get("load_seconds", [])
        if seconds:
            reduced["load_ms_mean"] = round(1e3 * sum(seconds) / len(seconds), 3)
            reduced["load_ms_max"] = round(1e3 * max(seconds), 3)
        return reduced

    def is_empty(self) -> bool:
        return not any(self.data.values())


class KvcPromMetrics(KVConnectorPromMetrics):
    """kvc's counters as Prometheus counters (``vllm:kvc_<key>``)."""

    def __init__(self, vllm_config: Any,
                 metric_types: dict[type[PromMetric], type[PromMetricT]],
                 labelnames: list[str],
                 per_engine_labelvalues: dict[int, list[object]]) -> None:
        super().__init__(vllm_config, metric_types, labelnames,
                         per_engine_labelvalues)
        counter = cast("type[Counter]", self._counter_cls)
        histogram = cast("type[Histogram]", self._histogram_cls)
        self._counters = {
            key: counter(name=f"vllm:kvc_{key}", documentation=doc,
                                   labelnames=labelnames)
            for key, doc in COUNTERS.items()}
        self._load_seconds = histogram(
            name="vllm:kvc_load_seconds",
            documentation="Seconds each of the workers' loads took.",
            buckets=[1e-3, 2e-3, 5e-3, 1e-2, 2e-2, 5e-2, 0.1, 0.2, 0.5, 1.0,
                     2.0, 5.0, 10.0],
            labelnames=labelnames)
        self._decisions = counter(
            name="vllm:kvc_decisions",
            documentation="Requests kvc's scheduler side decided, by the "
                          "strategy it loads them by (recompute: vLLM "
                          "prefills them).",
            labelnames=labelnames + ["strategy"])

    def observe(self, transfer_stats_data: dict[str, Any],
                engine_idx: int = 0) -> None:
        labels = self.per_engine_labelvalues[engine_idx]
        for key, value in (transfer_stats_data or {}).items():
            if not value:
                continue
            if key == "load_seconds":
                histogram = self._load_seconds.labels(*labels)
                for seconds in value:
                    histogram.observe(seconds)
            elif key.startswith(_DECISIONS):
                self._decisions.labels(
                    *labels, key.removeprefix(_DECISIONS)).inc(value)
            elif key in self._counters:
                self._counters[key].labels(*labels).inc(value)
