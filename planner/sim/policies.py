"""Autoscaling policies of the closed loop: one narrow protocol, a plain registry of specs.

A policy sees a :class:`View` of the fleet at a tick (virtual seconds) and returns a :class:`Step`: the
replica targets per pool (``None`` = no change), a reason, and when to tick next. Specs (``--compare``):

============================  ===========================================================================
``planner``                   dynoplan's planner (:class:`planner.core.Planner`) with the run's config;
``planner:k=v,k=v``           a variant: PlannerConfig fields overridden (``planner:predictor=kalman``)
``throughput-only``           the reference planner's throughput loop alone: constant predictor, no load
                              loop, no scale-down hysteresis, none of dynoplan's sizing rules (queueing cap,
                              agg interference, SLA-attainment headroom) (Dynamo Planner design)
``static:N`` / ``static:P+D`` a fixed fleet (aggregated N, or P prefill + D decode workers)
``static:peak``               a fixed fleet sized by the throughput formulas for the trace's busiest
                              adjustment interval (resolved by the runner)
``static:auto``               the smallest fixed fleet reaching the target attainment (resolved by search)
``schedule:T=N,T=N,...``      a replica schedule in virtual seconds from the trace start (``schedule:0=4,300=3``,
                              disaggregated ``schedule:0=2+1,140=3+1``): a recorded fleet history or a
                              hand-made what-if; each change goes through the same connector (start-up delay,
                              drain, GPU time from the request)
``hpa[:metric[:target]]``     Kubernetes HPA: ``desired = ceil(current x metric / target)``, no change
                              within 10 % tolerance, scale-down to the max recommendation of the last
                              300 s (stabilization window), 15 s sync; metric ``kv`` (KV usage, 0..1) or
                              ``running`` (running requests per engine); unready pods count as 0 usage;
                              no action before the first scraped window with a request (no metrics yet)
``saturation``                queue / KV thresholds with spare capacity (llm-d workload-variant-autoscaler
                              style): +1 when average spare KV (``kv_threshold - usage``) < ``kv_spare`` or
                              spare queue (``queue_threshold - waiting``) < ``queue_spare``; -1 when N-1
                              engines would keep both spares; one step at a time (none while starting,
                              none before the first scraped window with a request)
============================  ===========================================================================

Kubernetes HPA facts: horizontal-pod-autoscaler docs ("Algorithm details": desiredReplicas =
ceil[currentReplicas * (currentMetricValue / desiredMetricValue)], tolerance 0.1, downscale
stabilization 300 s, sync period 15 s); the controller's first reconcile of an HPA records the current
replica count as a recommendation (kube-controller-manager ``recordInitialRecommendation``), so no
scale-down happens within the first 300 s, and pods without metrics are left out of the calculation.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from dynoplan.errors import SimulationConfigError
from mocker.fleet import EngineState, PoolCounts
from planner.core import (
    Observations,
    PassObservation,
    PerformanceProfile,
    Planner,
    PlannerConfig,
    PoolState,
    TrafficWindow,
)
from planner.core.sizing import FleetEvaluator


@dataclass(frozen=True)
class View:
    """What a policy observes at ``now_s``: pool counts, ready engines' states, frontend windows, FPM."""

    now_s: float
    counts: Mapping[str, PoolCounts]
    engines: Mapping[str, Sequence[EngineState]]
    traffic: Callable[[float], TrafficWindow | None]
    """``traffic(d)``: frontend interval averages over the last ``d`` seconds (None if not scraped)."""
    passes: tuple[PassObservation, ...] = ()
    sla_misses: Callable[[float], tuple[float, float]] = lambda d: (math.nan, math.nan)
    """``sla_misses(d)``: shares of TTFT and ITL SLA misses over the last ``d`` seconds (NaN if none)."""


@dataclass(frozen=True)
class Step:
    """A policy's answer: ``targets`` (None = keep), ``reason``, ``next_tick_s`` and what it estimated."""

    targets: Mapping[str, int] | None
    reason: str
    next_tick_s: float
    predicted_rps: float = math.nan
    estimated_ttft_ms: float = math.nan
    estimated_itl_ms: float = math.nan


class Policy(Protocol):
    name: str

    @property
    def pools(self) -> tuple[str, ...]: ...

    @property
    def needs_fpm(self) -> bool: ...

    def initial_replicas(self) -> dict[str, int]: ...

    def tick(self, view: View) -> Step: ...


# ---------------------------------------------------------------------------------------------- static
@dataclass
class StaticPolicy:
    """A fixed fleet: ``replicas`` per pool from t = 0, never changed."""

    name: str
    replicas: dict[str, int]
    needs_fpm: bool = False

    @property
    def pools(self) -> tuple[str, ...]:
        return tuple(self.replicas)

    def initial_replicas(self) -> dict[str, int]:
        return dict(self.replicas)

    def tick(self, view: View) -> Step:
        return Step(None, "static", math.inf)


# ---------------------------------------------------------------------------------------------- schedule
@dataclass
class SchedulePolicy:
    """A fixed replica schedule: ``steps`` = ((t_s, replicas per pool), ...), increasing times, the first at
    0 s (the starting fleet). At each later time the targets are published once, as a planner would."""

    name: str
    steps: tuple[tuple[float, dict[str, int]], ...]
    needs_fpm: bool = False

    @property
    def pools(self) -> tuple[str, ...]:
        return tuple(self.steps[0][1])

    def initial_replicas(self) -> dict[str, int]:
        return dict(self.steps[0][1])

    def tick(self, view: View) -> Step:
        due = [r for t, r in self.steps if t <= view.now_s + 1e-9]
        later = [t for t, _ in self.steps if t > view.now_s + 1e-9]
        nxt = later[0] if later else math.inf
        want = due[-1]
        if all(view.counts[p].requested == want[p] for p in self.pools):
            return Step(None, "schedule", nxt)
        return Step(dict(want), "schedule", nxt)


# ---------------------------------------------------------------------------------------------- planner
@dataclass
class PlannerPolicy:
    """dynoplan's planner core in the loop: observations in, decision out (``planner.core``)."""

    name: str
    config: PlannerConfig
    profile: PerformanceProfile | None
    warm_start: Sequence[TrafficWindow] = ()
    initial: dict[str, int] | None = None
    evaluator: FleetEvaluator | None = None
    """The engine model of the sizing by simulation (None: closed-form sizing)."""
    _planner: Planner | None = None
    _start_s: float = 0.0

    @property
    def pools(self) -> tuple[str, ...]:
        return self.config.pools

    @property
    def needs_fpm(self) -> bool:
        return self.config.load_enabled

    def initial_replicas(self) -> dict[str, int]:
        if self.initial is not None:
            return dict(self.initial)
        return {p: max(1, self.config.limits(p).min_replicas) for p in self.pools}

    def tick(self, view: View) -> Step:
        if self._planner is None:
            self._planner = Planner(self.config, self.profile, self.warm_start, evaluator=self.evaluator)
            self._start_s = view.now_s
        # the frontend window of one interval, or what exists since the start (the early sizing's window)
        span = min(self.config.adjustment_interval_s, view.now_s - self._start_s)
        obs = Observations(
            pools={
                p: PoolState(view.counts[p].requested, view.counts[p].ready, view.counts[p].draining)
                for p in self.pools
            },
            traffic=view.traffic(span) if span > 0 else None,
            passes=view.passes,
        )
        res = self._planner.tick(view.now_s, obs)
        d = res.diagnostics
        return Step(
            res.decision.targets,
            res.decision.reason.value,
            res.next_tick_s,
            d.predicted_requests_per_second,
            d.estimated_ttft_ms,
            d.estimated_itl_ms,
        )


# ---------------------------------------------------------------------------------------------- HPA
def _has_metrics(view: View) -> bool:
    """True once the frontend has seen a request in a scraped window since the start (``traffic(now)``).
    Before that the engines export no load: Kubernetes' HPA skips pods without metrics (and acts only
    every sync period), so the metric-driven baselines hold rather than read an idle fleet as 0 % usage."""
    w = view.traffic(view.now_s) if view.now_s > 0 else None
    return w is not None and w.num_requests > 0


HPA_METRICS: tuple[str, ...] = ("kv", "running")


@dataclass
class HpaPolicy:
    """Kubernetes HPA on one engine metric (module docstring), applied to every pool of the fleet."""

    name: str
    pools: tuple[str, ...]
    metric: str
    target: float
    initial: dict[str, int]
    tolerance: float = 0.1
    stabilization_s: float = 300.0
    sync_s: float = 15.0
    min_replicas: int = 1
    max_replicas: int = 64
    needs_fpm: bool = False
    _recs: dict[str, deque[tuple[float, int]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        p = []
        if self.metric not in HPA_METRICS:
            p.append(f"hpa metric={self.metric!r}: expected one of {', '.join(HPA_METRICS)}")
        if not (math.isfinite(self.target) and self.target > 0):
            p.append(f"hpa target={self.target!r}: expected a number > 0")
        if p:
            raise SimulationConfigError(p)

    def initial_replicas(self) -> dict[str, int]:
        return dict(self.initial)

    def desired(self, pool: str, now_s: float, current: int, values: Sequence[float]) -> int:
        """One HPA recommendation + stabilization. ``values``: the metric of each ready engine; engines
        requested but not ready count as 0 (Kubernetes treats unready pods as 0 % when scaling up)."""
        if current <= 0 or not values:
            raw = current
        else:
            ratio = sum(values) / (current * self.target)
            raw = current if abs(ratio - 1.0) <= self.tolerance else math.ceil(ratio * current - 1e-9)
        raw = min(max(raw, self.min_replicas), self.max_replicas)
        recs = self._recs.setdefault(pool, deque())
        recs.append((now_s, raw))
        while recs and recs[0][0] < now_s - self.stabilization_s:
            recs.popleft()
        if raw < current:  # scale down only to the highest recommendation of the window
            return min(current, max(r for _, r in recs))
        return raw

    def tick(self, view: View) -> Step:
        for p in self.pools:  # the first reconcile records the current size as a recommendation
            self._recs.setdefault(p, deque([(view.now_s, view.counts[p].requested)]))
        if not _has_metrics(view):
            return Step(None, "hold_no_metrics", view.now_s + self.sync_s)
        targets = {}
        for p in self.pools:
            engs = view.engines[p]
            vals = [e.kv_usage if self.metric == "kv" else float(e.num_running) for e in engs]
            targets[p] = self.desired(p, view.now_s, view.counts[p].requested, vals)
        changed = any(targets[p] != view.counts[p].requested for p in self.pools)
        reason = "hold_within_tolerance"
        if changed:
            up = any(targets[p] > view.counts[p].requested for p in self.pools)
            reason = f"hpa_scale_{'up' if up else 'down'}_{self.metric}"
        return Step(targets if changed else None, reason, view.now_s + self.sync_s)


# ---------------------------------------------------------------------------------------------- saturation
@dataclass
class SaturationPolicy:
    """Saturation thresholds with spare capacity (module docstring)."""

    name: str
    pools: tuple[str, ...]
    initial: dict[str, int]
    kv_threshold: float = 0.8
    queue_threshold: float = 5.0
    kv_spare: float = 0.1
    queue_spare: float = 3.0
    interval_s: float = 30.0
    min_replicas: int = 1
    max_replicas: int = 64
    needs_fpm: bool = False

    def initial_replicas(self) -> dict[str, int]:
        return dict(self.initial)

    def decide(self, current: int, ready: int, engines: Sequence[EngineState]) -> tuple[int, str]:
        """(+1/-1/0, reason) for one pool."""
        if ready < current or not engines:
            return 0, "hold_pending"
        n = len(engines)
        kv = sum(e.kv_usage for e in engines) / n
        q = sum(e.num_waiting for e in engines) / n
        if (
            self.kv_threshold - kv < self.kv_spare or self.queue_threshold - q < self.queue_spare
        ) and current < self.max_replicas:
            return +1, "saturation_scale_up"
        if current > self.min_replicas and n > 1:
            kv2, q2 = kv * n / (n - 1), q * n / (n - 1)
            if self.kv_threshold - kv2 >= self.kv_spare and self.queue_threshold - q2 >= self.queue_spare:
                return -1, "saturation_scale_down"
        return 0, "hold_spare_ok"

    def tick(self, view: View) -> Step:
        if not _has_metrics(view):
            return Step(None, "hold_no_metrics", view.now_s + self.interval_s)
        targets, reasons = {}, []
        for p in self.pools:
            c = view.counts[p]
            d, r = self.decide(c.requested, c.ready, view.engines[p])
            targets[p] = c.requested + d
            reasons.append(r)
        changed = any(targets[p] != view.counts[p].requested for p in self.pools)
        reason = next((r for r in reasons if not r.startswith("hold")), reasons[0] if reasons else "hold")
        return Step(targets if changed else None, reason, view.now_s + self.interval_s)
