"""The planner state machine: ``Planner.tick(now_s, observations) -> TickResult``.

One tick, in order (all times are the caller's clock, seconds; the planner never reads a clock):

1. ingest ForwardPassMetrics into the per-pool pass-time regressions and the per-engine latest state;
2. if the throughput loop is due (every ``adjustment_interval_s``, first at start + interval): feed the
   traffic window to the predictors and correction factors (``None`` traffic = unknown: nothing fed,
   the loop holds with ``hold_metrics_unknown``), predict demand and size every pool;
3. read the pools: ``None`` = unknown -> ``hold_metrics_unknown`` (never "zero demand");
4. pending guard: the previous decision is pending until the spec equals its targets, ready replicas
   equal them (when reported) and the connector acknowledged it (when it acknowledges). A spec that
   moved elsewhere is someone else's change -> ``adopted_external_change`` (the new count becomes the
   current state, the pool is left alone for ``external_change_grace_s``). Still pending ->
   ``hold_pending``; pending longer than ``pending_timeout_s`` -> ``pending_timeout_replan``;
5. combine the loops: throughput alone sets the goal (scale-down only beyond the hysteresis band);
   with the load loop on, the load loop steps +/-1 per load interval and the throughput result is the
   floor; scale-down cooldown and external-change grace apply;
6. :func:`~planner.core.budget.apply_limits` (min/max, GPU budget, decrease-first rebalancing);
7. publish a :class:`Decision` with a new ``decision_id`` when the targets differ from the spec.

Deterministic: the same config, profile, warm start and tick sequence give identical results.
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from planner.core.budget import apply_limits, gpus
from planner.core.config import PlannerConfig
from planner.core.interpolation import PerformanceProfile
from planner.core.load import (FEATURES_BY_POOL, EngineEstimate, PassTimeRegression, RegressionFit, estimate_engine,
                               guess_isl_tokens)
from planner.core.observations import ForwardPassMetrics, LengthBucket, Observations, TrafficWindow
from planner.core.predictors import _single_thread_blas, make_predictor
from planner.core.reasons import ACTION_REASONS, Reason
from planner.core.sizing import (SIZE_HISTORY_S, FleetEvaluator, PoolPlan, SimulatedSizing, build_sample, pool_buckets,
                                 sample_size)
from planner.core.throughput import (Demand, agg_itl_miss_model, agg_itl_tail_calibration, ceil_replicas,
                                     clamp_correction, decode_correction, prefill_correction, size_pool)
from planner.errors import ConfigError, ObservationError

_EPS = 1e-9


@dataclass(frozen=True)
class Decision:
    """What to do now. ``targets`` is None when nothing should change (a hold)."""

    targets: Mapping[str, int] | None
    """Replicas to publish per pool, or None (keep the current spec)."""
    decision_id: int | None
    """Increasing id of a published decision (VirtualConnector protocol), None for holds."""
    reason: Reason
    """The main reason (an action reason for actions, the hold reason otherwise)."""
    reasons: tuple[Reason, ...] = ()
    """Every reason that applied this tick, in the order they arose."""
    pool_reasons: Mapping[str, Reason] = field(default_factory=dict)


@dataclass(frozen=True)
class Diagnostics:
    """Everything the tick saw and concluded (one record per tick; JSON via :meth:`to_dict`)."""

    now_s: float
    loops_run: tuple[str, ...]
    current_replicas: Mapping[str, int] | None
    ready_replicas: Mapping[str, int | None] | None
    observed: TrafficWindow | None
    predicted_num_requests: float
    predicted_isl_tokens: float
    predicted_osl_tokens: float
    predicted_requests_per_second: float
    predictor: str
    """Predictor in use (for ``auto``: the candidate chosen this interval)."""
    p_correction: float
    d_correction: float
    throughput_replicas_exact: Mapping[str, float]
    throughput_replicas: Mapping[str, int]
    engines: tuple[EngineEstimate, ...]
    regressions: Mapping[str, RegressionFit | None]
    estimated_ttft_ms: float
    """Max over prefill/agg engines (NaN when unknown)."""
    estimated_itl_ms: float
    """Max over decode/agg engines (NaN when unknown)."""
    decision: Decision
    pending_decision_id: int | None
    gpus: int
    """GPUs of the current spec (replicas x gpus_per_engine)."""
    gpu_hours: float
    """GPU-hours of the spec integrated over ticks so far."""
    headroom: Mapping[str, float] = field(default_factory=dict)
    """SLA-attainment headroom factors on the TTFT (prefill) and ITL (decode) requirements."""
    demand_factor: float = 1.0
    """Burst-aware factor applied to the predicted request count (``predicted_num_requests`` includes it)."""

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-safe data (NaN/inf -> None, enums -> their names)."""
        return _plain(dataclasses.asdict(self))


def _plain(x: Any) -> Any:
    if isinstance(x, Reason):
        return x.value
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x


@dataclass(frozen=True)
class TickResult:
    """Output of :meth:`Planner.tick`: the decision, the diagnostics and when to tick next (s)."""

    decision: Decision
    diagnostics: Diagnostics
    next_tick_s: float


@dataclass
class _Pending:
    decision_id: int
    targets: dict[str, int]
    previous: dict[str, int]
    since_s: float


def significant_misses(observed: float, expected: float, z: float) -> bool:
    """True when ``observed`` SLA misses exceed what a fleet meeting the target would show by chance:
    ``observed > expected + z x sqrt(expected)`` (``expected = allowed share x requests``; misses of a
    fleet exactly at the target are binomial with a small share, ~Poisson(expected), whose standard
    deviation is ``sqrt(expected)``; z = 1.645 is its one-sided 95 % bound). ``z = 0`` reduces to
    ``observed > expected``."""
    return observed > expected + z * math.sqrt(max(expected, 0.0))


def _total(mean: float, count: float) -> tuple[float, float]:
    """(sum, count) of a window mean; (0, 0) when unknown."""
    if math.isfinite(mean) and math.isfinite(count) and count > 0:
        return mean * count, count
    return 0.0, 0.0


def _misses(w: TrafficWindow) -> tuple[float, float]:
    """(misses, requests) the frontend's SLA buckets report for a window: TTFT misses of the first tokens plus ITL
    misses of the finished requests (their sum bounds the requests missing either), over the larger count; (0, 0)
    when not reported."""
    vals = (w.num_ttft_observed, w.num_ttft_within_sla, w.num_finished, w.num_itl_within_sla)
    if not all(math.isfinite(v) for v in vals):
        return 0.0, 0.0
    return (w.num_ttft_observed - w.num_ttft_within_sla) + (w.num_finished - w.num_itl_within_sla), \
        max(w.num_ttft_observed, w.num_finished)


def _mean(totals: Sequence[tuple[float, float]], fallback: float) -> float:
    s = sum(t[0] for t in totals)
    n = sum(t[1] for t in totals)
    return s / n if n > 0 else fallback


class Planner:
    """Pure decision state machine. One instance per managed deployment.

    ``profile`` is required when the throughput loop is on (prefill half for prefill/agg pools, decode
    half for decode/agg pools). ``warm_start``: historical intervals (e.g. from
    :func:`planner.core.traces.read_trace_intervals`) fed to the predictors before the first tick.
    Raises ConfigError when the profile lacks a half the mode needs.
    """

    def __init__(self, config: PlannerConfig, profile: PerformanceProfile | None = None,
                 warm_start: Sequence[TrafficWindow] = (), evaluator: FleetEvaluator | None = None) -> None:
        self.config = config
        self.profile = profile
        self.evaluator = evaluator
        """The engine model of the sizing by simulation (:mod:`planner.core.sizing`); None = closed-form sizing."""
        self._sim: SimulatedSizing | None = None
        """This interval's candidate search (its sample and cached evaluations); None before the first sizing."""
        self._sim_plans: dict[tuple[int, ...], dict[str, PoolPlan]] = {}
        self._sizings = 0
        self._last_gap_buckets: tuple[tuple[float, float], ...] = ()
        self._size_history: deque[tuple[Any, ...]] = deque()
        """(tick s, ISL histogram, OSL histogram, (ISL sum, count), (OSL sum, count)) of the throughput windows
        within ``SIZE_HISTORY_S``."""
        self._last_inflight = 0.0
        self._last_duration_s = 0.0
        self._last_profile: tuple[float, ...] = ()
        if config.throughput_enabled:
            problems = []
            needs_prefill = any(p in ("prefill", "agg") for p in config.pools)
            needs_decode = any(p in ("decode", "agg") for p in config.pools)
            if profile is None or (needs_prefill and profile.prefill is None):
                problems.append(f"profile: mode {config.mode!r} with the throughput loop needs a prefill profile")
            if profile is None or (needs_decode and profile.decode is None):
                problems.append(f"profile: mode {config.mode!r} with the throughput loop needs a decode profile")
            if problems:
                raise ConfigError(problems)
        self._pred_req = make_predictor(config.predictor, config, phase=0)
        self._pred_isl = make_predictor(config.predictor, config, phase=1)
        self._pred_osl = make_predictor(config.predictor, config, phase=2)
        for w in warm_start:
            self._feed_predictors(w)
        self._regressions = {p: PassTimeRegression(FEATURES_BY_POOL[p], n_buckets=config.regression_buckets,
                                                   per_bucket=config.regression_samples_per_bucket,
                                                   min_samples=config.regression_min_samples)
                             for p in config.pools}
        self._engines: dict[tuple[str, int, int], tuple[ForwardPassMetrics, float]] = {}
        self._prefill_work: dict[tuple[str, int, int], deque[tuple[float, int, int, float]]] = {}
        """Per engine: (tick time s, prefill tokens, prefill-carrying passes, pass wall time s) summed over the passes of each tick
        within ``load_prefill_window_s`` (the agg ITL estimate's prefill work rate)."""
        self._decision_seq = 0
        self._pending: _Pending | None = None
        self._last_targets: dict[str, int] | None = None
        self._thpt_goal: dict[str, int] = {}
        self._thpt_exact: dict[str, float] = {}
        self._thpt_required: dict[str, int] = {}
        self._thpt_full = False
        """A full-interval throughput tick has sized the pools (not only the early sizing)."""
        self._last_mix: tuple[LengthBucket, ...] = ()
        self._last_osl_buckets: tuple[tuple[float, float], ...] = ()
        self._last_isl_buckets: tuple[tuple[float, float], ...] = ()
        self._last_isl_tokens = math.nan
        self.p_correction = 1.0
        self.d_correction = 1.0
        self.headroom = {"ttft": 1.0, "itl": 1.0}
        self._sla_missed = {"ttft": False, "itl": False}
        """Per SLA: the last throughput window missed the attainment target by more than chance (the growth
        test of :meth:`_update_headroom` without its other conditions); lifts the scale-up tolerance."""
        self.itl_tail_calibration = 1.0
        """Capacity the aggregated ITL-tail model under-credits, from the last settled window
        (:func:`~planner.core.throughput.agg_itl_tail_calibration`; 1 = none)."""
        self._ready_at_thpt: dict[str, int] | None = None
        self._last_decision_s = -math.inf
        self._last_pred_req = math.nan
        self._demand_ratios: deque[float] = deque(maxlen=config.demand_error_window)
        self._demand_factor = 1.0
        self._window_sized: dict[str, bool] = {}
        """Per pool: at the last throughput tick, ready replicas already met the requirement computed then."""
        """SLA-attainment headroom factors (>= 1) on the prefill (TTFT) and decode (ITL) requirements."""
        self._next_thpt_s: float | None = None
        self._early_s: float | None = None
        """When the early sizing (``first_sizing_s``) is due; None once done or when off."""
        self._next_load_s: float | None = None
        self._last_up_s: dict[str, float] = {}
        self._grace_until_s: dict[str, float] = {}
        self._last_now_s: float | None = None
        self._last_gpus = 0
        self._gpu_hours = 0.0
        self._demand = Demand(math.nan, math.nan, math.nan)
        self._limit = _single_thread_blas()
        self._unmet_goal = False
        """True while published targets fall short of the goal (decrease-first rebalancing): tick again
        after one load interval instead of waiting for the next throughput interval."""
        self._now_s = 0.0
        self._cur_all: dict[str, int] = {}
        """The current spec of every pool during a tick (the simulated sizing plans pools jointly)."""

    # ------------------------------------------------------------------ public helpers
    @property
    def pending_decision_id(self) -> int | None:
        return self._pending.decision_id if self._pending else None

    def regression(self, pool: str) -> RegressionFit | None:
        """The current pass-time fit of ``pool`` (None until enough samples)."""
        return self._regressions[pool].fit()

    # ------------------------------------------------------------------ internals
    def _feed_predictors(self, w: TrafficWindow) -> None:
        self._pred_req.add(w.num_requests)
        self._pred_isl.add(w.mean_isl_tokens if w.num_requests > 0 else math.nan)
        self._pred_osl.add(w.mean_osl_tokens if w.num_requests > 0 else math.nan)

    def _predictor_name(self) -> str:
        return str(getattr(self._pred_req, "chosen", self._pred_req.name))

    def _run_throughput(self, traffic: TrafficWindow | None, decode_replicas: int | None,
                        ready: Mapping[str, int] | None = None) -> bool:
        """Feed and size; False when the traffic is unknown (nothing learned, nothing sized)."""
        cfg = self.config
        if traffic is None:
            return False
        if (cfg.demand_error_quantile is not None and math.isfinite(self._last_pred_req) and self._last_pred_req > 0
                and math.isfinite(traffic.num_requests)):
            self._demand_ratios.append(traffic.num_requests * cfg.adjustment_interval_s / traffic.duration_s
                                       / self._last_pred_req)
        self._feed_predictors(traffic)
        if traffic.mix:
            self._last_mix = traffic.mix
        if traffic.osl_buckets:
            self._last_osl_buckets = traffic.osl_buckets
        if traffic.isl_buckets:
            self._last_isl_buckets = traffic.isl_buckets
        if traffic.gap_buckets:
            self._last_gap_buckets = traffic.gap_buckets
        self._last_profile = traffic.arrival_counts
        self._last_inflight = traffic.num_inflight if math.isfinite(traffic.num_inflight) else 0.0
        self._note_duration(traffic)
        self._size_history.append((self._now_s, traffic.isl_buckets, traffic.osl_buckets,
                                   _total(traffic.mean_isl_tokens, traffic.num_requests),
                                   _total(traffic.mean_osl_tokens, traffic.num_finished), _misses(traffic)))
        while self._size_history and self._now_s - self._size_history[0][0] >= SIZE_HISTORY_S:
            self._size_history.popleft()
        if traffic.num_requests > 0 and math.isfinite(traffic.mean_isl_tokens):
            self._last_isl_tokens = traffic.mean_isl_tokens
        prof = self.profile
        assert prof is not None
        if cfg.correction_enabled and traffic.num_requests > 0:
            if prof.prefill is not None:
                self.p_correction = clamp_correction(
                    prefill_correction(traffic.mean_ttft_ms, traffic.mean_isl_tokens, prof.prefill), self.p_correction)
            if prof.decode is not None and decode_replicas:
                dur = traffic.mean_request_duration_s
                if not math.isfinite(dur):
                    dur = (traffic.mean_ttft_ms + traffic.mean_osl_tokens * traffic.mean_itl_ms) / 1000.0
                interfering = prof.prefill if ("agg" in cfg.pools and cfg.agg_prefill_interference) else None
                self.d_correction = clamp_correction(
                    decode_correction(traffic.mean_itl_ms, traffic.num_requests, traffic.mean_isl_tokens,
                                      traffic.mean_osl_tokens, dur, decode_replicas, traffic.duration_s, prof.decode,
                                      interfering),
                    self.d_correction)
        self._update_headroom(traffic, ready)
        self._calibrate_itl_tail(traffic, ready)
        predicted = self._pred_req.predict_next()
        self._demand_factor = self._burst_factor()
        self._last_pred_req = predicted
        demand = Demand(predicted * self._demand_factor, self._pred_isl.predict_next(), self._pred_osl.predict_next(),
                        self._last_mix, self._last_osl_buckets, self._last_isl_buckets)
        self._demand = demand
        if not demand.known:
            return False
        if self.simulating:
            self._size_by_simulation(demand, traffic, ready)
        else:
            self._size_pools(demand, prof, ready)
        return True

    def _run_early(self, traffic: TrafficWindow | None, ready: Mapping[str, int] | None) -> bool:
        """Early sizing (``PlannerConfig.first_sizing_s``): the requirement of every pool for the traffic seen
        since the start, its count scaled to a full adjustment interval (``n x interval / duration``), at the
        observed mean ISL/OSL and histograms (OSL not yet observed: the predictor's, e.g. from the warm
        start). Predictors, correction factors and headroom are left alone (a short window is too noisy to
        learn from); the caller only ever scales up on it. False when nothing usable was observed."""
        cfg = self.config
        if traffic is None or not (traffic.num_requests > 0) or not math.isfinite(traffic.mean_isl_tokens):
            return False
        osl = traffic.mean_osl_tokens if math.isfinite(traffic.mean_osl_tokens) else self._pred_osl.predict_next()
        if not math.isfinite(osl):
            return False
        demand = Demand(traffic.num_requests * cfg.adjustment_interval_s / traffic.duration_s, traffic.mean_isl_tokens,
                        osl, traffic.mix, traffic.osl_buckets or self._last_osl_buckets,
                        traffic.isl_buckets or self._last_isl_buckets)
        prof = self.profile
        assert prof is not None
        self._demand = demand
        if self.simulating:
            if traffic.gap_buckets:
                self._last_gap_buckets = traffic.gap_buckets
            self._last_inflight = traffic.num_inflight if math.isfinite(traffic.num_inflight) else 0.0
            self._last_profile = traffic.arrival_counts
            self._note_duration(traffic)
            self._size_by_simulation(demand, traffic, ready)
        else:
            self._size_pools(demand, prof, ready)
        return True

    @property
    def simulating(self) -> bool:
        """True when the throughput loop sizes by simulation (an evaluator, ``simulated_sizing`` and a target)."""
        c = self.config
        return self.evaluator is not None and c.simulated_sizing and c.sla_attainment_target is not None

    def _pool_bounds(self) -> dict[str, tuple[int, int]]:
        """Replica bounds of the candidate search per pool: ``[min_replicas, max_replicas]``, the upper bound
        at most what the GPU budget holds with every other pool at its minimum."""
        cfg = self.config
        out = {}
        for p in cfg.pools:
            lim = cfg.limits(p)
            others = sum(cfg.limits(q).min_replicas * cfg.limits(q).gpus_per_engine for q in cfg.pools if q != p)
            hi = max(lim.min_replicas, (cfg.max_gpu_budget - others) // lim.gpus_per_engine)
            if lim.max_replicas is not None:
                hi = min(hi, lim.max_replicas)
            out[p] = (max(1, lim.min_replicas), max(1, hi, lim.min_replicas))
        return out

    def _size_by_simulation(self, demand: Demand, traffic: TrafficWindow, ready: Mapping[str, int] | None) -> None:
        """Start this interval's candidate search (:class:`~planner.core.sizing.SimulatedSizing`) on a sample of
        ``demand`` (count over ``adjustment_interval_s``, mean lengths, histograms) with the gap histogram and
        in-flight count of ``traffic``; the plan itself is made against the current fleet in the tick."""
        cfg = self.config
        assert self.evaluator is not None and cfg.sla_attainment_target is not None
        allowed = self._allowed_miss()
        self._sizings += 1
        self._sim_plans = {}
        rate = demand.num_requests / cfg.adjustment_interval_s
        if not (rate > 0):
            # no traffic expected: the least fleet the limits allow serves it
            self._sim = None
            self._thpt_exact = {p: 0.0 for p in cfg.pools}
            self._thpt_required = {p: self._pool_bounds()[p][0] for p in cfg.pools}
            return
        isl_h = pool_buckets([h[1] for h in self._size_history]) or demand.isl_buckets
        osl_h = pool_buckets([h[2] for h in self._size_history]) or demand.osl_buckets
        # sizes: the pooled windows' own mean (exact sums), which corrects the within-bucket law's bias; the
        # forecast mean only without history
        isl_m = _mean([h[3] for h in self._size_history], demand.isl_tokens)
        osl_m = _mean([h[4] for h in self._size_history], demand.osl_tokens)
        sample = build_sample(rate, isl_m, osl_m, min_horizon_s=cfg.adjustment_interval_s,
                              min_requests=sample_size(allowed), isl_buckets=isl_h,
                              osl_buckets=osl_h, gap_buckets=self._last_gap_buckets,
                              num_inflight=int(self._last_inflight), warmup_s=self._last_duration_s,
                              rate_profile=self._last_profile,
                              seed=(self._sizings,))
        self._sim = SimulatedSizing(self.evaluator, sample, cfg.pools, self._pool_bounds(), allowed)
        if ready is not None and all(p in ready for p in cfg.pools):
            self._sim_plan(ready)

    def _allowed_miss(self) -> float:
        """Miss share the next interval may have: the target's ``a = 1 - sla_attainment_target``, plus what the
        windows of the last ``SIZE_HISTORY_S`` left unspent, ``min(2a, max(a, 2a - m))`` with ``m`` their observed
        miss share (an error budget, as SLOs are kept over a period rather than per sample: a quiet hour that
        missed nothing lets the next interval miss up to ``2a``, and the two average to the target). Past
        misses beyond the budget are not made up (the share never goes below ``a``)."""
        assert self.config.sla_attainment_target is not None
        a = 1.0 - self.config.sla_attainment_target
        seen = [h[5] for h in self._size_history]
        n = sum(x[1] for x in seen)
        if n <= 0:
            return a
        m = sum(x[0] for x in seen) / n
        return min(2.0 * a, max(a, 2.0 * a - m))

    def _note_duration(self, traffic: TrafficWindow) -> None:
        """Keep the window's mean request duration (seconds; TTFT + OSL x ITL when the frontend does not report
        it): the warm-up of the traffic sample."""
        d = traffic.mean_request_duration_s
        if not math.isfinite(d):
            d = (traffic.mean_ttft_ms + traffic.mean_osl_tokens * traffic.mean_itl_ms) / 1000.0
        if math.isfinite(d) and d > 0:
            self._last_duration_s = d

    def _sim_plan(self, current: Mapping[str, int]) -> dict[str, PoolPlan]:
        """The search's goals against ``current`` (cached per fleet); also sets the requirement diagnostics."""
        cfg = self.config
        key = tuple(int(current[p]) for p in cfg.pools)
        if key not in self._sim_plans:
            if self._sim is None:
                lo = self._pool_bounds()
                self._sim_plans[key] = {p: PoolPlan(lo[p][0], Reason.SCALE_DOWN_THROUGHPUT if lo[p][0] < current[p]
                                                    else Reason.HOLD_STEADY, lo[p][0], "pass") for p in cfg.pools}
            else:
                self._sim_plans[key] = self._sim.plan(current)
        plans = self._sim_plans[key]
        self._thpt_required = {p: pl.required for p, pl in plans.items()}
        self._thpt_exact = {p: float(pl.required) for p, pl in plans.items()}
        return plans

    def _size_pools(self, demand: Demand, prof, ready: Mapping[str, int] | None) -> None:
        """Throughput sizing of every pool for ``demand`` (DESIGN.md formulas via :func:`size_pool`), with the
        current correction factors and headroom; records the exact and ceiled requirement and whether each
        pool's ready replicas already meet it."""
        cfg = self.config
        exact = {pool: size_pool(pool, demand, cfg, prof, self.p_correction, self.d_correction,
                                 (self.headroom["ttft"], self.headroom["itl"]), self.itl_tail_calibration)
                 for pool in cfg.pools}
        self._thpt_exact = exact
        self._thpt_required = {p: ceil_replicas(x) for p, x in exact.items()}
        self._window_sized = {p: ready is not None and p in ready and ready[p] >= self._thpt_required[p]
                              for p in cfg.pools}

    def _calibrate_itl_tail(self, traffic: TrafficWindow, ready: Mapping[str, int] | None) -> None:
        """Aggregated ITL-tail calibration (``PlannerConfig.agg_itl_tail_calibration``): compare the tail model's
        miss share at the ready replicas for the window's own traffic with the misses observed
        (:func:`~planner.core.throughput.agg_itl_tail_calibration`). Judged only on a settled window: the same
        ready count at the previous throughput tick and now, no decision published in between; otherwise the
        previous value is kept."""
        cfg = self.config
        prev, self._ready_at_thpt = self._ready_at_thpt, (dict(ready) if ready is not None else None)
        if not (cfg.agg_itl_tail_calibration and cfg.agg_itl_tail and cfg.sla_attainment_target is not None
                and "agg" in cfg.pools and ready is not None and prev is not None and self.profile is not None
                and self.profile.prefill is not None and self.profile.decode is not None):
            return
        n0 = ready.get("agg")
        if not n0 or prev.get("agg") != n0 or self._last_decision_s >= self._now_s - traffic.duration_s - _EPS:
            return
        if not (math.isfinite(traffic.num_finished) and math.isfinite(traffic.num_itl_within_sla)
                and traffic.num_finished > 0 and traffic.num_requests > 0 and math.isfinite(traffic.mean_isl_tokens)
                and math.isfinite(traffic.mean_osl_tokens)):
            return
        seen = self._observed_demand(traffic)
        miss = agg_itl_miss_model(seen, cfg.adjustment_interval_s, self.d_correction, cfg.itl_ms, self.profile.decode,
                                  self.profile.prefill)
        if miss is not None:
            self.itl_tail_calibration = agg_itl_tail_calibration(
                miss, float(n0), traffic.num_finished - traffic.num_itl_within_sla, traffic.num_finished)

    def _burst_factor(self) -> float:
        """Burst-aware demand (``PlannerConfig.demand_error_quantile``): ``max(1, quantile_q(ratios))`` over
        the last ``demand_error_window`` one-step ratios ``observed count / predicted count`` (the observed
        count scaled to a full interval), once ``demand_error_min_points`` exist; 1 otherwise. Sizing for the
        q-quantile of what the predictor's own record says the next interval may bring, rather than its
        point forecast, covers ramps and bursts a mean forecast lags (an interval that comes in 30 % above
        its forecast one time in ten gets 30 % more capacity). Quantile: numpy's default (linear)."""
        q = self.config.demand_error_quantile
        r = self._demand_ratios
        if q is None or len(r) < self.config.demand_error_min_points:
            return 1.0
        return max(1.0, float(np.quantile(np.fromiter(r, dtype=float), q)))

    def _unservable_ttft_share(self, traffic: TrafficWindow) -> float:
        """Share of the window's prompts that no fleet size serves within the TTFT target: those in ISL
        buckets whose *lower* bound already has a profiled prefill time >= ``ttft_ms`` (an unloaded engine
        needs that long), from ``traffic.isl_buckets``; 0 without a histogram, a prefill profile or with
        ``attainment_discount_unservable`` off. Subtracted from the TTFT miss share before the attainment
        feedback judges the fleet (without it, long-prompt traces such as Mooncake grow the TTFT headroom
        to its cap for misses extra replicas cannot remove)."""
        prof = self.profile
        if not (self.config.attainment_discount_unservable and traffic.isl_buckets and prof is not None
                and prof.prefill is not None):
            return 0.0
        total = bad = 0.0
        lo = 0.0
        for le, n in traffic.isl_buckets:
            total += n
            if n > 0 and lo > 0 and prof.prefill.ttft_ms_at(lo) >= self.config.ttft_ms:
                bad += n
            lo = le
        return bad / total if total > 0 else 0.0

    def _update_headroom(self, traffic: TrafficWindow, ready: Mapping[str, int] | None) -> None:
        """SLA-attainment feedback (``PlannerConfig.sla_attainment_target``): per SLA, ``miss`` = share of
        the window's requests over the target, ``allowed = 1 - target``; ``miss > allowed`` -> headroom x
        ``min(2, 1 + gain x (miss / allowed - 1))`` (capped at ``attainment_max_headroom``);
        ``miss < allowed / 2`` -> headroom x ``attainment_relax`` (floored at 1); otherwise unchanged.
        A window without SLA buckets (NaN) changes nothing. TTFT misses of prompts no fleet can serve in
        time are not counted (:meth:`_unservable_ttft_share`). Growth also needs the misses to be significant
        (:func:`significant_misses` with ``attainment_significance_z``): at a 0.1 % target a window of 900
        requests allows 0.9 misses, so one or two misses are chance, not evidence of an undersized pool.

        Headroom only grows when the misses are not explained by a fleet still catching up: for every pool
        the SLA concerns (TTFT: prefill/agg, ITL: decode/agg), the fleet ready at the previous throughput
        tick already met the requirement computed then (no scale-up was under way; true at the first tick,
        whose fleet was deployed for the load) and still does now (``ready`` = ready replicas per pool)."""
        cfg = self.config
        prev = self._thpt_required
        settled_pool = {p: self._window_sized.get(p, True) and ready is not None and p in ready
                        and ready[p] >= prev.get(p, 0) for p in cfg.pools}
        if cfg.sla_attainment_target is None:
            return
        allowed = 1.0 - cfg.sla_attainment_target
        totals = (traffic.num_ttft_observed, traffic.num_finished)
        unservable = {"ttft": self._unservable_ttft_share(traffic), "itl": 0.0}
        for key, att, total in zip(("ttft", "itl"), traffic.attainment(), totals):
            if not math.isfinite(att):
                self._sla_missed[key] = False
                continue
            # prompts whose prefill alone exceeds the target miss at any fleet size: not the fleet's doing
            miss = max(0.0, 1.0 - att - unservable[key])
            h = self.headroom[key]
            pools = [p for p in cfg.pools if p in (("prefill", "agg") if key == "ttft" else ("decode", "agg"))]
            settled = all(settled_pool[p] for p in pools)
            significant = miss > allowed and significant_misses(miss * total, allowed * total,
                                                                cfg.attainment_significance_z)
            self._sla_missed[key] = significant
            if significant and settled and not self._demand_explains(traffic, ready, pools):
                h = min(cfg.attainment_max_headroom, h * min(2.0, 1.0 + cfg.attainment_gain * (miss / allowed - 1.0)))
            elif miss < allowed / 2.0:
                h = max(1.0, h * cfg.attainment_relax)
            self.headroom[key] = h

    def _observed_demand(self, traffic: TrafficWindow) -> Demand:
        """The demand ``traffic`` actually brought, as the sizing takes it: its count scaled to a full
        adjustment interval, its mean ISL/OSL, mix and histograms."""
        return Demand(traffic.num_requests * self.config.adjustment_interval_s / traffic.duration_s,
                      traffic.mean_isl_tokens, traffic.mean_osl_tokens, traffic.mix, traffic.osl_buckets,
                      traffic.isl_buckets)

    def _demand_explains(self, traffic: TrafficWindow, ready: Mapping[str, int] | None, pools: Sequence[str]) -> bool:
        """``PlannerConfig.attainment_demand_guard``: True when sizing the demand observed in ``traffic`` (its
        count scaled to a full interval, its mean ISL/OSL and histograms) with the current corrections,
        headroom and ITL-tail calibration needs more replicas than are ``ready`` in one of ``pools``: the
        window's misses are then what the model predicts for that demand, not evidence against it."""
        cfg, prof = self.config, self.profile
        if not (cfg.attainment_demand_guard and ready is not None and prof is not None and traffic.num_requests > 0
                and math.isfinite(traffic.mean_isl_tokens) and math.isfinite(traffic.mean_osl_tokens)
                and traffic.duration_s > 0):
            return False
        seen = self._observed_demand(traffic)
        head = (self.headroom["ttft"], self.headroom["itl"])
        return any(p in ready and ceil_replicas(size_pool(p, seen, cfg, prof, self.p_correction, self.d_correction,
                                                          head, self.itl_tail_calibration)) > ready[p]
                   for p in pools)

    def _required(self, pool: str, current: int) -> int:
        """The throughput requirement of ``pool`` against ``current`` replicas, with the scale-up tolerance
        (``PlannerConfig.scale_up_tolerance``): a requirement above ``current`` whose fractional value is
        within ``current x (1 + tolerance)`` counts as met by ``current`` -- unless the last window missed
        an SLA of the pool (TTFT: prefill/agg, ITL: decode/agg) by more than chance, when a deadband would
        hold a fleet that is shown to be short."""
        if self.simulating:
            plan = self._sim_plan({**self._cur_all, pool: current})[pool]
            return plan.goal if plan.goal > current else min(current, plan.required)
        req = self._thpt_required[pool]
        keys = ("ttft", "itl") if pool == "agg" else (("ttft",) if pool == "prefill" else ("itl",))
        if any(self._sla_missed[k] for k in keys):
            return req  # the current fleet is missing the SLA: no deadband against the evidence
        if req > current and self._thpt_exact[pool] <= current * (1.0 + self.config.scale_up_tolerance):
            return current
        return req

    def _hysteresis_goal(self, pool: str, current: int) -> tuple[int, Reason]:
        if self.simulating:
            plan = self._sim_plan({**self._cur_all, pool: current})[pool]
            return plan.goal, plan.reason
        req = self._required(pool, current)
        if req >= current:
            if req == current and self._thpt_required[pool] > current:
                return current, Reason.HOLD_SCALE_UP_TOLERANCE
            return req, (Reason.SCALE_UP_THROUGHPUT if req > current else Reason.HOLD_STEADY)
        banded = ceil_replicas(self._thpt_exact[pool] * (1.0 + self.config.scale_down_hysteresis))
        if banded < current:
            return max(req, banded), Reason.SCALE_DOWN_THROUGHPUT
        return current, Reason.HOLD_HYSTERESIS

    def _prefill_rate(self, key: tuple[str, int, int]) -> tuple[float, float] | None:
        """(prefill tokens, prefill-carrying passes) per second of pass wall time of engine ``key`` over
        ``load_prefill_window_s``; None when it reported no pass time."""
        w = self._prefill_work.get(key)
        if not w:
            return None
        wall = sum(x[3] for x in w)
        return (sum(x[1] for x in w) / wall, sum(x[2] for x in w) / wall) if wall > 0 else None

    def _engine_estimates(self, now_s: float, load_scale: Mapping[str, float] | None = None) -> list[EngineEstimate]:
        cfg = self.config
        isl = self._last_isl_tokens
        out = []
        for key, (p, _seen) in sorted(self._engines.items()):
            pool = key[0]
            hint = isl if math.isfinite(isl) else guess_isl_tokens([p])
            out.append(estimate_engine(pool, p, self._regressions[pool].fit(), hint, cfg.max_num_batched_tokens,
                                       (load_scale or {}).get(pool, 1.0), self._prefill_rate(key)))
        return out

    def _proportional_step(self, current: int, ratio: float) -> int:
        """Load-loop scale-up when every engine's estimated TTFT is ``ratio`` x the target: the queue's work
        spreads over more engines, so ``ceil(current x min(ratio, load_max_scale_up_factor)) - current``
        replicas are added (at least 1; factor 1 = the reference's +1)."""
        f = min(ratio, self.config.load_max_scale_up_factor)
        return max(1, ceil_replicas(max(current, 1) * f) - current) if math.isfinite(f) else 1

    def _load_step(self, pool: str, current: int, ests: list[EngineEstimate], passes_ok: bool) -> tuple[int, Reason]:
        cfg = self.config
        engs = [e for e in ests if e.pool == pool]
        if not passes_ok or not engs:
            return 0, Reason.HOLD_METRICS_UNKNOWN
        need_ttft, need_itl = pool in ("prefill", "agg"), pool in ("decode", "agg")

        def values(e: EngineEstimate) -> list[tuple[str, float | None, float]]:
            v = []
            if need_ttft:
                v.append(("ttft", e.estimated_ttft_ms, cfg.ttft_ms))
            if need_itl:
                v.append(("itl", e.estimated_itl_ms, cfg.itl_ms))
            return v

        if any(val is None for e in engs for _, val, _ in values(e)):
            fit = self._regressions[pool].fit()
            return 0, (Reason.HOLD_REGRESSION_WARMING_UP if fit is None else Reason.HOLD_REGRESSION_DEGENERATE)
        if all(any(val > sla for _, val, sla in values(e)) for e in engs):  # type: ignore[operator]
            ttft_over = need_ttft and all(e.estimated_ttft_ms > cfg.ttft_ms for e in engs)  # type: ignore[operator]
            if ttft_over:
                return self._proportional_step(current, min(e.estimated_ttft_ms / cfg.ttft_ms for e in engs)), \
                    Reason.SCALE_UP_TTFT  # type: ignore[operator]
            return +1, Reason.SCALE_UP_ITL
        if current > cfg.limits(pool).min_replicas and all(
                all(val < sla * cfg.load_sensitivity for _, val, sla in values(e)) for e in engs):  # type: ignore[operator]
            n = len(engs)
            per_replica = max(1, round(n / max(1, current)))
            if n - per_replica <= 0:
                absorbed = all(e.idle for e in engs)
            else:
                scale = n / (n - per_replica)
                re = [estimate_engine(pool, self._engines[(pool, e.worker_id, e.dp_rank)][0], self._regressions[pool].fit(),
                                      self._last_isl_tokens if math.isfinite(self._last_isl_tokens) else
                                      guess_isl_tokens([self._engines[(pool, e.worker_id, e.dp_rank)][0]]),
                                      cfg.max_num_batched_tokens, scale,
                                      self._prefill_rate((pool, e.worker_id, e.dp_rank))) for e in engs]
                absorbed = all(val is not None and val < sla for e in re for _, val, sla in values(e))
            if absorbed:
                return -1, Reason.SCALE_DOWN_CONSOLIDATED
        return 0, Reason.HOLD_WITHIN_SLA

    def _diag(self, now_s: float, loops: tuple[str, ...], obs: Observations, decision: Decision,
              ests: list[EngineEstimate]) -> Diagnostics:
        ttfts = [e.estimated_ttft_ms for e in ests if e.estimated_ttft_ms is not None]
        itls = [e.estimated_itl_ms for e in ests if e.estimated_itl_ms is not None]
        pools = obs.pools
        d = self._demand
        interval = self.config.adjustment_interval_s
        return Diagnostics(
            now_s=now_s, loops_run=loops,
            current_replicas={p: pools[p].replicas for p in self.config.pools if p in pools} if pools is not None else None,
            ready_replicas={p: pools[p].ready_replicas for p in self.config.pools if p in pools} if pools is not None else None,
            observed=obs.traffic if "throughput" in loops else None,
            predicted_num_requests=d.num_requests, predicted_isl_tokens=d.isl_tokens, predicted_osl_tokens=d.osl_tokens,
            predicted_requests_per_second=d.num_requests / interval if math.isfinite(d.num_requests) else math.nan,
            predictor=self._predictor_name(), p_correction=self.p_correction, d_correction=self.d_correction, headroom=dict(self.headroom),
            demand_factor=self._demand_factor,
            throughput_replicas_exact=dict(self._thpt_exact), throughput_replicas=dict(self._thpt_required),
            engines=tuple(ests), regressions={p: r.fit() for p, r in self._regressions.items()},
            estimated_ttft_ms=max(ttfts) if ttfts else math.nan, estimated_itl_ms=max(itls) if itls else math.nan,
            decision=decision, pending_decision_id=self.pending_decision_id, gpus=self._last_gpus,
            gpu_hours=self._gpu_hours)

    def _next_tick(self) -> float:
        c = [t for t, on in ((self._next_thpt_s, self.config.throughput_enabled),
                              (self._next_load_s, self.config.load_enabled), (self._early_s, True))
             if on and t is not None]
        if self._unmet_goal:
            c.append(self._now_s + self.config.load_adjustment_interval_s)
        return min(c)

    # ------------------------------------------------------------------ the tick
    def tick(self, now_s: float, observations: Observations) -> TickResult:
        """Advance to ``now_s`` (seconds, caller's clock, non-decreasing) with what was observed since
        the previous tick. Returns the decision, the diagnostics and when to call again.

        Raises ObservationError when ``now_s`` goes backwards. BLAS runs single-threaded inside a tick
        (tiny matrices; multi-threaded OpenBLAS only spins on a shared machine)."""
        with self._limit():
            return self._tick(now_s, observations)

    def _tick(self, now_s: float, observations: Observations) -> TickResult:
        cfg, obs = self.config, observations
        if self._last_now_s is not None and now_s < self._last_now_s:
            raise ObservationError(f"now_s={now_s!r}: expected >= the previous tick's {self._last_now_s!r}")
        # GPU-hours of the spec held since the previous tick
        if self._last_now_s is not None:
            self._gpu_hours += self._last_gpus * (now_s - self._last_now_s) / 3600.0
        self._last_now_s = self._now_s = now_s
        first = self._next_thpt_s is None
        if first:
            self._next_thpt_s = now_s + cfg.adjustment_interval_s
            self._next_load_s = now_s + cfg.load_adjustment_interval_s
            if cfg.throughput_enabled and cfg.first_sizing_s is not None and cfg.first_sizing_s < cfg.adjustment_interval_s:
                self._early_s = now_s + cfg.first_sizing_s
        # 1. FPM
        batch: dict[tuple[str, int, int], list[ForwardPassMetrics]] = {}
        for p in obs.passes:
            if p.pool not in self._regressions:
                continue
            self._regressions[p.pool].add(p)
            seen = p.timestamp_s if p.timestamp_s > 0 else now_s
            key = (p.pool, p.worker_id, p.dp_rank)
            if key not in self._engines or seen >= self._engines[key][1]:
                self._engines[key] = (p, seen)
            batch.setdefault(key, []).append(p)
        for key, ps in batch.items():
            # the latest pass of a tick's batch is the one running at the sampling instant, which is a long
            # (prefill) pass with probability proportional to its length (inspection paradox): left out
            ps = sorted(ps, key=lambda x: x.timestamp_s)[:-1] if len(ps) > 1 else ps
            tok = sum(x.scheduled_requests.sum_prefill_tokens for x in ps)
            n_pre = sum(1 for x in ps if x.scheduled_requests.sum_prefill_tokens > 0)
            self._prefill_work.setdefault(key, deque()).append((now_s, tok, n_pre, sum(x.wall_time for x in ps)))
        for key in list(self._prefill_work):
            w = self._prefill_work[key]
            while w and now_s - w[0][0] >= cfg.load_prefill_window_s:
                w.popleft()
            if not w:
                del self._prefill_work[key]
        for key in [k for k, (_, seen) in self._engines.items() if now_s - seen > cfg.engine_stale_s]:
            del self._engines[key]
        # which loops are due
        assert self._next_thpt_s is not None and self._next_load_s is not None
        due_thpt = cfg.throughput_enabled and not first and now_s + _EPS >= self._next_thpt_s
        due_load = cfg.load_enabled and not first and now_s + _EPS >= self._next_load_s
        while self._next_thpt_s <= now_s + _EPS:
            self._next_thpt_s += cfg.adjustment_interval_s
        while self._next_load_s <= now_s + _EPS:
            self._next_load_s += cfg.load_adjustment_interval_s
        due_early = (self._early_s is not None and not first and not due_thpt and now_s + _EPS >= self._early_s)
        if due_early or due_thpt:
            self._early_s = None
        loops = tuple(n for n, d in (("early_throughput", due_early), ("throughput", due_thpt), ("load", due_load)) if d)
        reasons: list[Reason] = []
        pools = obs.pools
        known_pools = pools is not None and all(p in pools for p in cfg.pools)
        # 2. throughput loop learns even while holding
        thpt_ok = True
        if due_thpt:
            dec_rep = None
            if known_pools and "decode" in cfg.pools:
                st = pools["decode"]  # type: ignore[index]
                dec_rep = st.ready_replicas if st.ready_replicas is not None else st.replicas
            elif known_pools and "agg" in cfg.pools:
                st = pools["agg"]  # type: ignore[index]
                dec_rep = st.ready_replicas if st.ready_replicas is not None else st.replicas
            rdy = ({p: (pools[p].ready_replicas if pools[p].ready_replicas is not None else pools[p].replicas)  # type: ignore[index]
                    for p in cfg.pools} if known_pools else None)
            thpt_ok = self._run_throughput(obs.traffic, dec_rep, rdy)
            self._thpt_full = self._thpt_full or thpt_ok
        early_ok = False
        if due_early:
            rdy = ({p: (pools[p].ready_replicas if pools[p].ready_replicas is not None else pools[p].replicas)  # type: ignore[index]
                    for p in cfg.pools} if known_pools else None)
            early_ok = self._run_early(obs.traffic, rdy)
        ests = self._engine_estimates(now_s) if cfg.load_enabled else []

        def finish(decision: Decision) -> TickResult:
            if known_pools:
                self._last_gpus = gpus({p: pools[p].replicas for p in cfg.pools}, cfg)  # type: ignore[index]
            return TickResult(decision, self._diag(now_s, loops, obs, decision, ests), self._next_tick())

        def hold(reason: Reason, pool_reasons: Mapping[str, Reason] | None = None) -> TickResult:
            rs = tuple(dict.fromkeys([*reasons, reason]))
            return finish(Decision(None, None, reason, rs, dict(pool_reasons or {})))

        # 3. pools
        if not known_pools:
            return hold(Reason.HOLD_METRICS_UNKNOWN)
        assert pools is not None
        current = {p: pools[p].replicas for p in cfg.pools}
        ready = {p: pools[p].ready_replicas for p in cfg.pools}
        self._cur_all = dict(current)
        if first:
            self._last_targets = dict(current)
            return hold(Reason.HOLD_WARMING_UP)
        # 4. pending guard and external changes
        external: list[str] = []
        if self._pending is not None:
            pend = self._pending
            acked = obs.applied_decision_id is not None and obs.applied_decision_id >= pend.decision_id
            for p in cfg.pools:
                c = current[p]
                if c != pend.targets[p] and (c != pend.previous[p] or acked):
                    external.append(p)
            if not external:
                reached = all(current[p] == pend.targets[p] and (ready[p] is None or ready[p] == pend.targets[p])
                              for p in cfg.pools)
                if reached and (obs.applied_decision_id is None or acked):
                    self._pending = None
                elif now_s - pend.since_s >= cfg.pending_timeout_s:
                    self._pending = None
                    reasons.append(Reason.PENDING_TIMEOUT_REPLAN)
                else:
                    return hold(Reason.HOLD_PENDING)
        elif self._last_targets is not None:
            external = [p for p in cfg.pools if current[p] != self._last_targets[p]]
        if external:
            self._pending = None
            self._unmet_goal = False
            self._last_targets = dict(current)
            for p in external:
                self._grace_until_s[p] = now_s + cfg.external_change_grace_s
                self._thpt_goal.pop(p, None)
            return hold(Reason.ADOPTED_EXTERNAL_CHANGE, {p: Reason.ADOPTED_EXTERNAL_CHANGE for p in external})
        # 5. combine loops
        goal = dict(current)
        pool_reasons: dict[str, Reason] = {}
        if due_thpt and thpt_ok and not cfg.load_enabled:
            for p in cfg.pools:
                self._thpt_goal[p], pool_reasons[p] = self._hysteresis_goal(p, current[p])
        if not cfg.load_enabled:
            for p in cfg.pools:
                if p in self._thpt_goal:
                    goal[p] = self._thpt_goal[p]
                    if p not in pool_reasons and goal[p] != current[p]:
                        pool_reasons[p] = Reason.SCALE_UP_THROUGHPUT if goal[p] > current[p] else Reason.SCALE_DOWN_THROUGHPUT
        if due_early and early_ok and not cfg.load_enabled:
            for p in cfg.pools:  # scale up only: a short window is no reason to remove capacity
                if self._required(p, current[p]) > current[p]:
                    self._thpt_goal[p] = goal[p] = self._thpt_required[p]
                    pool_reasons[p] = Reason.SCALE_UP_THROUGHPUT
        if due_thpt and not thpt_ok:
            reasons.append(Reason.HOLD_METRICS_UNKNOWN)
        if due_load:
            for p in cfg.pools:
                delta, r = self._load_step(p, current[p], ests, obs.passes_ok)
                if delta < 0 and cfg.throughput_enabled and (p not in self._thpt_required or not self._thpt_full):
                    # both loops on, no throughput floor yet (first interval; the early sizing only scales
                    # up): the fleet was sized for the load by someone; the load loop's young regression
                    # alone does not remove capacity
                    delta, r = 0, Reason.HOLD_THROUGHPUT_FLOOR
                elif delta < 0 and cfg.throughput_enabled and p in self._thpt_exact:
                    # nor below what the throughput loop's hysteresis band keeps: the load estimates are
                    # means, the band is what holds the ITL/TTFT tail (a consolidation to the bare floor
                    # cost Azure 8x 6 points of ITL attainment)
                    band, _ = self._hysteresis_goal(p, current[p])
                    if self._thpt_required.get(p, 0) <= current[p] + delta < band:
                        delta, r = 0, Reason.HOLD_HYSTERESIS
                goal[p] = current[p] + delta
                pool_reasons[p] = r
        if cfg.load_enabled and self._thpt_required:
            for p in cfg.pools:
                floor = self._required(p, current[p]) if p in self._thpt_required else 0
                if goal[p] < floor:
                    goal[p] = floor
                    pool_reasons[p] = (Reason.RAISED_TO_THROUGHPUT_FLOOR if floor > current[p]
                                       else Reason.HOLD_THROUGHPUT_FLOOR)
        for p in cfg.pools:
            if goal[p] != current[p] and now_s < self._grace_until_s.get(p, -math.inf):
                goal[p], pool_reasons[p] = current[p], Reason.HOLD_EXTERNAL_GRACE
            elif goal[p] < current[p] and now_s - self._last_up_s.get(p, -math.inf) < cfg.scale_down_cooldown_s:
                goal[p], pool_reasons[p] = current[p], Reason.HOLD_COOLDOWN
        # 6. limits and budget
        res = apply_limits(goal, current, cfg)
        targets = res.targets
        self._unmet_goal = targets != res.goal
        actions = [pool_reasons[p] for p in cfg.pools if p in pool_reasons and pool_reasons[p] in ACTION_REASONS
                   and targets[p] != current[p]]
        reasons.extend(actions)
        reasons.extend(Reason(r) for r in res.reasons)
        if targets == current:
            main = Reason.PENDING_TIMEOUT_REPLAN if Reason.PENDING_TIMEOUT_REPLAN in reasons else next(
                (r for r in reasons if r not in ACTION_REASONS), None)
            if main is None:
                prs = [pool_reasons[p] for p in cfg.pools if p in pool_reasons and pool_reasons[p] not in ACTION_REASONS]
                main = prs[0] if prs else (Reason.HOLD_STEADY if loops else Reason.HOLD_NOT_DUE)
            return hold(main, pool_reasons)
        # 7. publish
        self._decision_seq += 1
        for p in cfg.pools:
            if targets[p] > current[p]:
                self._last_up_s[p] = now_s
        self._pending = _Pending(self._decision_seq, dict(targets), dict(current), now_s)
        self._last_decision_s = now_s
        self._last_targets = dict(targets)
        rs = tuple(dict.fromkeys(reasons))
        main = next((r for r in rs if r in ACTION_REASONS), rs[0] if rs else Reason.SCALE_UP_THROUGHPUT)
        return finish(Decision(dict(targets), self._decision_seq, main, rs, pool_reasons))
