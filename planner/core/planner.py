"""The planner: ``Planner.tick(now_s, observations) -> TickResult``, three loop objects and one rule.

A tick (all times are the caller's clock, seconds; the planner never reads a clock):

1. the load loop ingests ForwardPassMetrics (:class:`~planner.core.loops.LoadLoop`);
2. the throughput loop, when due (every ``adjustment_interval_s``, first at start + interval, and early
   checks every ``early_sizing_s`` in between), learns from the traffic window and sizes every pool
   (:class:`~planner.core.loops.ThroughputLoop`; ``None`` traffic = unknown: nothing learned,
   ``hold_metrics_unknown``);
3. the pools: ``None`` = unknown -> ``hold_metrics_unknown`` (never "zero demand");
4. the pending guard (:class:`~planner.core.loops.PendingGuard`): a published decision is pending until the
   spec, ready replicas and acknowledgement reflect it (``hold_pending``; ``pending_timeout_replan`` after
   ``pending_timeout_s``); a spec moved elsewhere is adopted (``adopted_external_change``) and left alone for
   ``external_change_grace_s``;
5. **the rule**: the throughput loop's goal is the floor; the load loop (when on) steps a pool above it, or
   down toward it; grace and cooldown restrict; then
6. :func:`~planner.core.budget.apply_limits` -- min/max, GPU budget, decrease-first rebalancing, counting the
   GPUs draining workers still hold;
7. a :class:`Decision` with a new ``decision_id`` when the targets differ from the spec.

Deterministic: the same config, profile, evaluator, warm start and tick sequence give identical results.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dynoplan.errors import ConfigError, ObservationError
from planner.core.budget import apply_limits, gpus
from planner.core.config import PlannerConfig
from planner.core.interpolation import PerformanceProfile
from planner.core.load import EngineEstimate, RegressionFit
from planner.core.loops import LoadLoop, PendingGuard, ThroughputLoop
from planner.core.observations import Observations, TrafficWindow
from planner.core.predictors import single_thread_blas
from planner.core.reasons import ACTION_REASONS, Reason
from planner.core.sizing import FleetEvaluator

_EPS = 1e-9

_CATCH_UP_STEPS = 1024
"""A loop's clock more than this many intervals behind is moved to its next due time by one multiplication
(a tiny interval stepped one addition at a time would take ages, and below the clock's resolution forever)."""


def _next_due(due_s: float, now_s: float, interval_s: float) -> float:
    """The first time after ``now_s`` (+ the tick tolerance) on the grid ``due_s + k * interval_s``: one
    addition per interval passed (the planner's clock as it always was), or when far behind
    (:data:`_CATCH_UP_STEPS`) one step there, never a time at or before ``now_s``."""
    until = now_s + _EPS
    if until - due_s > _CATCH_UP_STEPS * interval_s:
        k = math.floor((until - due_s) / interval_s) + 1
        return max(due_s + k * interval_s, math.nextafter(until, math.inf))
    while due_s <= until:
        nxt = due_s + interval_s
        if nxt == due_s:  # the interval is below the clock's resolution here
            return math.nextafter(until, math.inf)
        due_s = nxt
    return due_s


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
    allowed_miss: float = math.nan
    """Miss share the sizing by simulation allowed this interval (``1 - sla_attainment_target``; NaN in closed form)."""
    evaluations: int = 0
    """Candidate fleets the sizing by simulation replayed for the current sample (0: closed-form sizing)."""

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-safe data (NaN/inf -> None, enums -> their names)."""
        out: dict[str, Any] = _plain(dataclasses.asdict(self))
        return out


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


class Planner:
    """Pure decision state machine. One instance per managed deployment.

    ``profile`` is required when the throughput loop is on (prefill half for prefill/agg pools, decode half
    for decode/agg pools); ``evaluator``: the engine model of the sizing by simulation
    (:class:`planner.core.sizing.FleetEvaluator`, e.g. :class:`planner.whatif.EngineFleetEvaluator`; None =
    closed-form sizing); ``warm_start``: historical intervals fed to the predictors before the first tick.
    Raises ConfigError when the profile lacks a half the mode needs.
    """

    def __init__(
        self,
        config: PlannerConfig,
        profile: PerformanceProfile | None = None,
        warm_start: Sequence[TrafficWindow] = (),
        evaluator: FleetEvaluator | None = None,
    ) -> None:
        self.config = config
        self.profile = profile
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
        self.throughput = ThroughputLoop(config, profile, evaluator, warm_start)
        self.load = LoadLoop(config)
        self.guard = PendingGuard(config)
        self._thpt_goal: dict[str, int] = {}
        """Goals of the last full throughput sizing, kept until the next (a rebalance may take several ticks)."""
        self._next_thpt_s: float | None = None
        self._next_load_s: float | None = None
        self._early_s: float | None = None
        self._last_now_s: float | None = None
        self._last_gpus = 0
        self._gpu_hours = 0.0
        self._limit = single_thread_blas()
        self._unmet_goal = False
        """Published targets fall short of the goal (decrease-first rebalancing): tick again after one load
        interval instead of waiting for the next throughput interval."""
        self._now_s = 0.0

    # ------------------------------------------------------------------ public helpers
    @property
    def evaluator(self) -> FleetEvaluator | None:
        return self.throughput.evaluator

    @property
    def simulating(self) -> bool:
        """True when the throughput loop sizes by simulation."""
        return self.throughput.simulating

    @property
    def pending_decision_id(self) -> int | None:
        return self.guard.pending.decision_id if self.guard.pending else None

    def withdraw(self, decision_id: int) -> bool:
        """The driver could not apply decision ``decision_id`` (its scale request was refused or failed):
        stop waiting for it, so the next tick re-plans instead of holding ``hold_pending`` until
        ``pending_timeout_s``. Returns False when ``decision_id`` is not the pending decision (then nothing
        changes: a later decision superseded it, or it was already reached)."""
        return self.guard.withdraw(decision_id)

    @property
    def p_correction(self) -> float:
        return self.throughput.p_correction

    @property
    def d_correction(self) -> float:
        return self.throughput.d_correction

    def regression(self, pool: str) -> RegressionFit | None:
        """The current pass-time fit of ``pool`` (None until enough samples)."""
        return self.load.fit(pool)

    # ------------------------------------------------------------------ the tick
    def tick(self, now_s: float, observations: Observations) -> TickResult:
        """Advance to ``now_s`` (seconds, caller's clock, non-decreasing) with what was observed since the previous
        tick. Returns the decision, the diagnostics and when to call again.

        Raises ObservationError when ``now_s`` goes backwards. BLAS runs single-threaded inside a tick (tiny
        matrices; multi-threaded OpenBLAS only spins on a shared machine)."""
        with self._limit():
            return self._tick(now_s, observations)

    def _due(self, now_s: float) -> tuple[bool, tuple[str, ...]]:
        """(first tick?, loops due now) -- and the next due times advanced."""
        cfg = self.config
        first = self._next_thpt_s is None
        if first:
            self._next_thpt_s = now_s + cfg.adjustment_interval_s
            self._next_load_s = now_s + cfg.load_adjustment_interval_s
            first_s = cfg.early_sizing_s
            if cfg.throughput_enabled and first_s is not None and first_s < cfg.adjustment_interval_s:
                self._early_s = now_s + first_s
        assert self._next_thpt_s is not None and self._next_load_s is not None
        thpt = cfg.throughput_enabled and not first and now_s + _EPS >= self._next_thpt_s
        load = cfg.load_enabled and not first and now_s + _EPS >= self._next_load_s
        if cfg.throughput_enabled:  # a disabled loop's clock is never read: not stepped either
            self._next_thpt_s = _next_due(self._next_thpt_s, now_s, cfg.adjustment_interval_s)
        if cfg.load_enabled:
            self._next_load_s = _next_due(self._next_load_s, now_s, cfg.load_adjustment_interval_s)
        early = self._early_s is not None and not first and not thpt and now_s + _EPS >= self._early_s
        first_s = cfg.early_sizing_s
        if thpt:  # the early checks of the new interval: every early_sizing_s until the next full sizing
            self._early_s = now_s + first_s if first_s is not None and first_s < cfg.adjustment_interval_s else None
        elif early:
            assert self._early_s is not None and first_s is not None
            nxt = _next_due(self._early_s, now_s, first_s)
            self._early_s = nxt if nxt + _EPS < self._next_thpt_s else None
        return first, tuple(n for n, d in (("early_throughput", early), ("throughput", thpt), ("load", load)) if d)

    def _tick(self, now_s: float, obs: Observations) -> TickResult:
        cfg = self.config
        if self._last_now_s is not None and now_s < self._last_now_s:
            raise ObservationError(f"now_s={now_s!r}: expected >= the previous tick's {self._last_now_s!r}")
        if self._last_now_s is not None:  # GPU-hours of the spec held since the previous tick
            self._gpu_hours += self._last_gpus * (now_s - self._last_now_s) / 3600.0
        self._last_now_s = self._now_s = now_s
        self.load.observe(now_s, obs.passes)
        first, loops = self._due(now_s)
        pools = obs.pools
        known = pools is not None and all(p in pools for p in cfg.pools)
        ready: dict[str, int] | None = None
        if known:
            assert pools is not None
            ready = {p: r if (r := pools[p].ready_replicas) is not None else pools[p].replicas for p in cfg.pools}
        reasons: list[Reason] = []
        thpt_ok = early_ok = False
        if "throughput" in loops:
            dec = ready.get("decode", ready.get("agg")) if ready else None
            thpt_ok = self.throughput.learn(now_s, obs.traffic, dec, ready)
            if not thpt_ok:
                reasons.append(Reason.HOLD_METRICS_UNKNOWN)
        if "early_throughput" in loops:
            early_ok = self.throughput.learn_early(now_s, obs.traffic, ready)
        ests = self.load.estimates(self.throughput.last_isl_tokens) if cfg.load_enabled else []

        def finish(decision: Decision) -> TickResult:
            if known and pools is not None:
                self._last_gpus = gpus({p: pools[p].replicas for p in cfg.pools}, cfg)
            return TickResult(decision, self._diag(now_s, loops, obs, decision, ests), self._next_tick())

        def hold(reason: Reason, pool_reasons: Mapping[str, Reason] | None = None) -> TickResult:
            rs = tuple(dict.fromkeys([*reasons, reason]))
            return finish(Decision(None, None, reason, rs, dict(pool_reasons or {})))

        if not known:
            return hold(Reason.HOLD_METRICS_UNKNOWN)
        assert pools is not None
        current = {p: pools[p].replicas for p in cfg.pools}
        spec_ready = {p: pools[p].ready_replicas for p in cfg.pools}
        if first:
            self.guard.last_targets = dict(current)
            return hold(Reason.HOLD_WARMING_UP)
        held, external, guard_reasons = self.guard.check(now_s, current, spec_ready, obs.applied_decision_id)
        reasons.extend(guard_reasons)
        if held is Reason.ADOPTED_EXTERNAL_CHANGE:
            self._unmet_goal = False
            for p in external:
                self._thpt_goal.pop(p, None)
            return hold(held, {p: held for p in external})
        if held is not None:
            return hold(held)
        goal, pool_reasons = self._combine(now_s, loops, thpt_ok, early_ok, current, ready, ests, obs.passes_ok)
        self.guard.restrict(now_s, goal, current, pool_reasons)
        draining = {p: pools[p].draining_replicas for p in cfg.pools}
        res = apply_limits(goal, current, cfg, draining)
        targets = res.targets
        self._unmet_goal = targets != res.goal
        reasons.extend(
            pool_reasons[p]
            for p in cfg.pools
            if p in pool_reasons and pool_reasons[p] in ACTION_REASONS and targets[p] != current[p]
        )
        reasons.extend(Reason(r) for r in res.reasons)
        if targets == current:
            main = (
                Reason.PENDING_TIMEOUT_REPLAN
                if Reason.PENDING_TIMEOUT_REPLAN in reasons
                else next((r for r in reasons if r not in ACTION_REASONS), None)
            )
            if main is None:
                prs = [
                    pool_reasons[p] for p in cfg.pools if p in pool_reasons and pool_reasons[p] not in ACTION_REASONS
                ]
                main = prs[0] if prs else (Reason.HOLD_STEADY if loops else Reason.HOLD_NOT_DUE)
            return hold(main, pool_reasons)
        decision_id = self.guard.publish(now_s, targets, current)
        rs = tuple(dict.fromkeys(reasons))
        main = next((r for r in rs if r in ACTION_REASONS), rs[0] if rs else Reason.SCALE_UP_THROUGHPUT)
        return finish(Decision(dict(targets), decision_id, main, rs, pool_reasons))

    def _combine(
        self,
        now_s: float,
        loops: tuple[str, ...],
        thpt_ok: bool,
        early_ok: bool,
        current: dict[str, int],
        ready: dict[str, int] | None,
        ests: list[EngineEstimate],
        passes_ok: bool,
    ) -> tuple[dict[str, int], dict[str, Reason]]:
        """The rule: the throughput goal is the floor, the load loop adjusts above it (module docstring, step 5)."""
        cfg = self.config
        goal = dict(current)
        pool_reasons: dict[str, Reason] = {}
        thr = self.throughput
        if "throughput" in loops and thpt_ok:
            for p, (g, r) in thr.propose(current).items():
                self._thpt_goal[p] = g
                pool_reasons[p] = r
        if "early_throughput" in loops and early_ok:
            for p, (g, _) in thr.propose(current).items():  # scale up only: a short window removes nothing
                if g > current[p]:
                    self._thpt_goal[p] = g
                    pool_reasons[p] = Reason.SCALE_UP_THROUGHPUT
        if not cfg.load_enabled:
            for p, g in self._thpt_goal.items():
                goal[p] = g
                if p not in pool_reasons and g != current[p]:
                    pool_reasons[p] = Reason.SCALE_UP_THROUGHPUT if g > current[p] else Reason.SCALE_DOWN_THROUGHPUT
            return goal, pool_reasons
        floors = (
            {p: g for p, (g, _) in thr.propose(current).items()} if cfg.throughput_enabled and thr.sized_full else {}
        )
        if "load" in loops:
            for p in cfg.pools:
                delta, r = self.load.propose(
                    p, current[p], ready.get(p) if ready else None, ests, passes_ok, thr.last_isl_tokens
                )
                if delta < 0 and cfg.throughput_enabled and not thr.sized_full:
                    # no full throughput interval yet (the early sizing only scales up): the fleet was sized for the
                    # load by someone; the load loop's young regression alone does not remove capacity
                    delta, r = 0, Reason.HOLD_THROUGHPUT_FLOOR
                goal[p] = current[p] + delta
                pool_reasons[p] = r
        for p, floor in floors.items():
            if goal[p] < floor:
                goal[p] = floor
                pool_reasons[p] = (
                    Reason.RAISED_TO_THROUGHPUT_FLOOR if floor > current[p] else Reason.HOLD_THROUGHPUT_FLOOR
                )
        return goal, pool_reasons

    def _diag(
        self, now_s: float, loops: tuple[str, ...], obs: Observations, decision: Decision, ests: list[EngineEstimate]
    ) -> Diagnostics:
        ttfts = [e.estimated_ttft_ms for e in ests if e.estimated_ttft_ms is not None]
        itls = [e.estimated_itl_ms for e in ests if e.estimated_itl_ms is not None]
        pools = obs.pools
        thr = self.throughput
        d = thr.demand
        interval = self.config.adjustment_interval_s
        return Diagnostics(
            now_s=now_s,
            loops_run=loops,
            current_replicas=(
                {p: pools[p].replicas for p in self.config.pools if p in pools} if pools is not None else None
            ),
            ready_replicas=(
                {p: pools[p].ready_replicas for p in self.config.pools if p in pools} if pools is not None else None
            ),
            observed=obs.traffic if "throughput" in loops else None,
            predicted_num_requests=d.num_requests,
            predicted_isl_tokens=d.isl_tokens,
            predicted_osl_tokens=d.osl_tokens,
            predicted_requests_per_second=d.num_requests / interval if math.isfinite(d.num_requests) else math.nan,
            predictor=thr.predictor_name,
            p_correction=thr.p_correction,
            d_correction=thr.d_correction,
            allowed_miss=thr.allowed_miss() if thr.simulating else math.nan,
            evaluations=thr.evaluations,
            throughput_replicas_exact=dict(thr.exact),
            throughput_replicas=dict(thr.required),
            engines=tuple(ests),
            regressions={p: self.load.fit(p) for p in self.config.pools},
            estimated_ttft_ms=max(ttfts) if ttfts else math.nan,
            estimated_itl_ms=max(itls) if itls else math.nan,
            decision=decision,
            pending_decision_id=self.pending_decision_id,
            gpus=self._last_gpus,
            gpu_hours=self._gpu_hours,
        )

    def _next_tick(self) -> float:
        c = [
            t
            for t, on in (
                (self._next_thpt_s, self.config.throughput_enabled),
                (self._next_load_s, self.config.load_enabled),
                (self._early_s, True),
            )
            if on and t is not None
        ]
        if self._unmet_goal:
            c.append(self._now_s + self.config.load_adjustment_interval_s)
        return min(c)
