"""Prometheus gauges of the planner (names as docs/architecture.md "Planner gauges"), on a registry passed in.

``PlannerMetrics(registry).update(tick_result)`` after every tick. Gauges (prefix ``dynamo_planner_``):
num_prefill_replicas, num_decode_replicas (agg mode reports its pool here, as Dynamo's agg planner
scales the decode component), observed_ttft_ms, observed_itl_ms, observed_requests_per_second,
predicted_requests_per_second, predicted_num_prefill_replicas, predicted_num_decode_replicas,
gpu_hours, estimated_ttft_ms, estimated_itl_ms, p_correction_factor, d_correction_factor,
decisions_total (counter of published decisions), and the enum ``decision_reason`` (one state per
:class:`~planner.core.reasons.Reason`). Unknown values are exported as NaN.
"""

from __future__ import annotations

import math
from typing import TypeVar

from prometheus_client import CollectorRegistry, Counter, Enum, Gauge
from prometheus_client.metrics import MetricWrapperBase

from planner.core.planner import TickResult
from planner.core.reasons import Reason

_M = TypeVar("_M", bound=MetricWrapperBase)

PREFIX = "dynamo_planner_"


class PlannerMetrics:
    """Planner gauges registered on ``registry`` (never the global default registry)."""

    def __init__(self, registry: CollectorRegistry, labels: dict[str, str] | None = None) -> None:
        self.labels = dict(labels or {})
        names = list(self.labels)

        def g(name: str, doc: str) -> Gauge:
            return Gauge(PREFIX + name, doc, names, registry=registry)

        self.num_prefill_replicas = g("num_prefill_replicas", "Prefill replicas in the deployment spec")
        self.num_decode_replicas = g("num_decode_replicas", "Decode (or aggregated) replicas in the deployment spec")
        self.observed_ttft_ms = g("observed_ttft_ms", "Mean TTFT over the last throughput interval, ms")
        self.observed_itl_ms = g("observed_itl_ms", "Mean ITL over the last throughput interval, ms")
        self.observed_requests_per_second = g("observed_requests_per_second", "Requests/s over the last interval")
        self.predicted_requests_per_second = g("predicted_requests_per_second", "Predicted requests/s, next interval")
        self.predicted_num_prefill_replicas = g("predicted_num_prefill_replicas", "Throughput-loop prefill replicas")
        self.predicted_num_decode_replicas = g("predicted_num_decode_replicas", "Throughput-loop decode/agg replicas")
        self.gpu_hours = g("gpu_hours", "GPU-hours of the deployment spec since the planner started")
        self.estimated_ttft_ms = g("estimated_ttft_ms", "Load loop: max estimated TTFT over engines, ms")
        self.estimated_itl_ms = g("estimated_itl_ms", "Load loop: max estimated ITL over engines, ms")
        self.p_correction_factor = g("p_correction_factor", "Prefill correction factor (actual/expected TTFT)")
        self.d_correction_factor = g("d_correction_factor", "Decode correction factor (actual/expected ITL)")
        self.decisions_total = Counter(PREFIX + "decisions", "Published scaling decisions", names, registry=registry)
        self.decision_reason = Enum(
            PREFIX + "decision_reason",
            "Reason of the latest tick's decision",
            names,
            states=[r.value for r in Reason],
            registry=registry,
        )

    def _l(self, m: _M) -> _M:
        return m.labels(**self.labels) if self.labels else m

    def update(self, result: TickResult) -> None:
        """Set every gauge from one tick's diagnostics."""
        d = result.diagnostics
        cur = d.current_replicas or {}
        nan = math.nan
        self._l(self.num_prefill_replicas).set(cur.get("prefill", nan))
        self._l(self.num_decode_replicas).set(cur.get("decode", cur.get("agg", nan)))
        if d.observed is not None:
            self._l(self.observed_ttft_ms).set(d.observed.mean_ttft_ms)
            self._l(self.observed_itl_ms).set(d.observed.mean_itl_ms)
            self._l(self.observed_requests_per_second).set(d.observed.requests_per_second)
        self._l(self.predicted_requests_per_second).set(d.predicted_requests_per_second)
        req = d.throughput_replicas
        self._l(self.predicted_num_prefill_replicas).set(req.get("prefill", nan))
        self._l(self.predicted_num_decode_replicas).set(req.get("decode", req.get("agg", nan)))
        self._l(self.gpu_hours).set(d.gpu_hours)
        self._l(self.estimated_ttft_ms).set(d.estimated_ttft_ms)
        self._l(self.estimated_itl_ms).set(d.estimated_itl_ms)
        self._l(self.p_correction_factor).set(d.p_correction)
        self._l(self.d_correction_factor).set(d.d_correction)
        if result.decision.decision_id is not None:
            self._l(self.decisions_total).inc()
        self._l(self.decision_reason).state(result.decision.reason.value)
