"""The planner's three loop objects; :class:`planner.core.planner.Planner` combines them in one short rule.

- :class:`ThroughputLoop` (every ``adjustment_interval_s``, early checks every ``early_sizing_s``): predicts the
  next interval's demand from the frontend's traffic windows and sizes every pool for it -- by simulation when
  the driver gave an engine model (:mod:`planner.core.sizing`), else by the reference formulas
  (:mod:`planner.core.throughput`). ``propose(current)`` gives per-pool goals with reasons; its goal is the
  floor of the combined decision.
- :class:`LoadLoop` (every ``load_adjustment_interval_s``, with ``load_enabled``): per-engine TTFT/ITL
  estimates from ForwardPassMetrics; ``propose(pool, current)`` steps a pool up (proportionally to the TTFT
  excess, or +1 for ITL) or down by one when the fleet without a replica still meets the SLA.
- :class:`PendingGuard`: a published decision is pending until the spec, ready replicas and (when the
  connector acknowledges) the acknowledgement reflect it; a spec that moved elsewhere is someone else's
  change, adopted and left alone for ``external_change_grace_s``; grace and cooldown restrict goals.

Each loop owns its state; none reads a clock (times are arguments, seconds on the driver's clock).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from planner.core.config import PlannerConfig
from planner.core.interpolation import PerformanceProfile
from planner.core.load import (
    FEATURES_BY_POOL,
    EngineEstimate,
    PassTimeRegression,
    RegressionFit,
    estimate_engine,
    guess_isl_tokens,
)
from planner.core.observations import PassObservation, TrafficWindow
from planner.core.predictors import make_predictor
from planner.core.reasons import Reason
from planner.core.sizing import (
    ARRIVAL_BIN_S,
    SIZE_HISTORY_S,
    FleetEvaluator,
    PoolPlan,
    SimulatedSizing,
    build_sample,
    pool_buckets,
    sequential_looks,
)
from planner.core.throughput import (
    Demand,
    ceil_replicas,
    clamp_correction,
    decode_correction,
    prefill_correction,
    size_pool,
)

Goals = dict[str, tuple[int, Reason]]
"""Per pool: (goal replicas, reason)."""

PROFILE_BINS = int(SIZE_HISTORY_S // ARRIVAL_BIN_S)
"""Bins of a window's rate profile the sample uses: its latest :data:`~planner.core.sizing.SIZE_HISTORY_S` (360), the
longest a sample spans unless its first look needs more (:meth:`ThroughputLoop._size`)."""


def pool_bounds(cfg: PlannerConfig) -> dict[str, tuple[int, int]]:
    """Replica bounds per pool: ``[max(1, min_replicas), max_replicas]``, the upper bound at most what the GPU
    budget holds with every other pool at its minimum."""
    out = {}
    for p in cfg.pools:
        lim = cfg.limits(p)
        others = sum(cfg.limits(q).min_replicas * cfg.limits(q).gpus_per_engine for q in cfg.pools if q != p)
        hi = max(lim.min_replicas, (cfg.max_gpu_budget - others) // lim.gpus_per_engine)
        if lim.max_replicas is not None:
            hi = min(hi, lim.max_replicas)
        out[p] = (max(1, lim.min_replicas), max(1, hi, lim.min_replicas))
    return out


def _total(mean: float, count: float) -> tuple[float, float]:
    """(sum, count) of a window mean; (0, 0) when unknown."""
    if math.isfinite(mean) and math.isfinite(count) and count > 0:
        return mean * count, count
    return 0.0, 0.0


def _mean(totals: Sequence[tuple[float, float]], fallback: float) -> float:
    s = sum(t[0] for t in totals)
    n = sum(t[1] for t in totals)
    return s / n if n > 0 else fallback


FORECAST_TEST_LEVEL = 0.01
"""Significance of one check of the forecast (:func:`forecast_exceeded`), over all the stretches it tests: the
chance that arrivals at the forecast rate trigger a re-sizing at one check. At checks every 30 s, about one
needless re-sizing an hour at a steady load; a needless one sizes at a rate just above the forecast, so it rarely
changes a count."""


def dispersion_index(counts: Sequence[float]) -> float:
    """Index of dispersion (variance / mean, >= 1) of arrivals per bin, from consecutive bin counts.

    ``counts``: requests started per :data:`~planner.core.sizing.ARRIVAL_BIN_S` bin, oldest first. The variance
    is the mean square successive difference over two, ``sum((c[i] - c[i-1])**2) / (2 (k - 1))`` (von Neumann et
    al., *Ann. Math. Statist.* 12, 1941), which a slow trend (a ramp) barely moves, unlike the plain variance.
    1.0 (Poisson) with fewer than 3 bins or no arrivals, and never below 1: a test is never made sharper than the
    Poisson one. Poisson arrivals give about 1; bursty ones more (a renewal process with gap coefficient of
    variation ``cv`` tends to ``cv**2`` for bins much longer than a gap; Cox and Lewis, *The Statistical Analysis of
    Series of Events*, 1966, ch. 4)."""
    k = len(counts)
    total = float(sum(counts))
    if k < 3 or not total > 0:
        return 1.0
    mssd = sum((b - a) ** 2 for a, b in zip(counts, counts[1:], strict=False)) / (2.0 * (k - 1))
    return max(1.0, mssd / (total / k))


def rate_lower_bound(count: float, span_s: float, level: float, dispersion: float = 1.0) -> float:
    """One-sided lower confidence bound (requests/s) at ``level`` on the arrival rate of ``count`` arrivals in
    ``span_s`` seconds; 0.0 when nothing arrived.

    Arrivals are taken as Poisson scaled by ``dispersion`` (:func:`dispersion_index`, >= 1; below 1 or not finite
    means 1): ``count / dispersion`` is Poisson with mean ``rate x span_s / dispersion`` (the quasi-Poisson model
    for over-dispersed counts; McCullagh and Nelder, *Generalized Linear Models*, 2nd ed., 1989, ch. 6). With
    ``n = count / dispersion`` the bound is ``gammaincinv(n, level) x dispersion / span_s`` (Johnson, Kemp and
    Kotz, *Univariate Discrete Distributions*, 3rd ed., 4.7.3): a rate ``r`` is below it exactly when
    ``P(N >= n | r x span_s / dispersion) = gammainc(n, r x span_s / dispersion) < level``, so ``bound > r`` is
    the level-``level`` test of the rate ``r``. ``dispersion`` 1 is the exact Poisson bound."""
    from scipy.special import gammaincinv  # here, not at module level: scipy costs start-up time

    d = max(1.0, dispersion) if math.isfinite(dispersion) else 1.0
    n = float(count) / d
    if not n > 0 or not span_s > 0:
        return 0.0
    return float(gammaincinv(n, level)) * d / span_s


def trailing_stretches(num_bins: int) -> tuple[int, ...]:
    """Lengths (in bins) of the stretches a check tests, latest bins first: 1, 2, 4, ... below ``num_bins``, and
    ``num_bins`` itself; () for none. Doubling lengths (a dyadic scan) see a surge of any duration at a resolution
    within 2x of it with only ``log2`` many tests, each at its share of the level (Bonferroni)."""
    out: list[int] = []
    k = 1
    while k < num_bins:
        out.append(k)
        k *= 2
    if num_bins > 0:
        out.append(num_bins)
    return tuple(out)


def forecast_exceeded(counts: Sequence[float], bin_s: float, rate: float, dispersion: float = 1.0) -> float | None:
    """The highest arrival rate (requests/s) that some stretch of the latest arrivals supports (the largest of
    their lower bounds) when it exceeds the forecast ``rate``; None when none does (the forecast stands) or nothing
    arrived.

    ``counts``: arrivals per ``bin_s`` bin, oldest first, over the span the forecast is tested on. The tested
    stretches are the latest 1, 2, 4, ... bins and the whole span (:func:`trailing_stretches`), each at level
    ``FORECAST_TEST_LEVEL / J`` for ``J`` stretches (Bonferroni: the check as a whole keeps
    :data:`FORECAST_TEST_LEVEL`). A stretch rejects the forecast when its lower bound
    (:func:`rate_lower_bound`, at ``dispersion``) is above ``rate``; the result is the largest such bound, the
    highest rate that some recent stretch supports. The whole span alone sees a persistent excess; the short
    stretches see a surge that began late in the span, which the span's mean dilutes."""
    lengths = trailing_stretches(len(counts))
    if not lengths or not bin_s > 0:
        return None
    level = FORECAST_TEST_LEVEL / len(lengths)
    best: float | None = None
    for k in lengths:
        lo = rate_lower_bound(sum(counts[-k:]), k * bin_s, level, dispersion)
        if lo > max(rate, 0.0) and (best is None or lo > best):
            best = lo
    return best


def _check(traffic: TrafficWindow, span_s: float, rate: float) -> float | None:
    """:func:`forecast_exceeded` on the window's last ``span_s`` seconds of bins, at the whole window's
    dispersion."""
    m = int(round(span_s / ARRIVAL_BIN_S))
    counts = traffic.arrival_counts[-m:] if m > 0 else ()
    return forecast_exceeded(counts, ARRIVAL_BIN_S, rate, dispersion_index(traffic.arrival_counts))


@dataclass
class _Seen:
    """What one traffic window contributes to the sample (module :mod:`planner.core.sizing`)."""

    t_s: float
    isl_buckets: tuple[tuple[float, float], ...]
    osl_buckets: tuple[tuple[float, float], ...]
    isl_total: tuple[float, float]
    osl_total: tuple[float, float]
    cached_total: tuple[float, float]
    """(prompt tokens served from the prefix cache, prompt tokens) of the window; (0, 0) when not reported."""


class ThroughputLoop:
    """Demand prediction and pool sizing (module docstring). ``evaluator`` None = closed-form sizing."""

    def __init__(
        self,
        config: PlannerConfig,
        profile: PerformanceProfile | None,
        evaluator: FleetEvaluator | None,
        warm_start: Sequence[TrafficWindow] = (),
    ) -> None:
        self.config = config
        self.profile = profile
        self.evaluator = evaluator
        self._pred_req = make_predictor(config.predictor, config, phase=0)
        self._pred_isl = make_predictor(config.predictor, config, phase=1)
        self._pred_osl = make_predictor(config.predictor, config, phase=2)
        for w in warm_start:
            self._feed(w)
        self.p_correction = 1.0
        self.d_correction = 1.0
        self.demand = Demand(math.nan, math.nan, math.nan)
        self.exact: dict[str, float] = {}
        """Fractional requirement per pool (simulation: the least passing count)."""
        self.required: dict[str, int] = {}
        self.sized_full = False
        """A full-interval sizing has happened (not only the early one)."""
        self._seen: deque[_Seen] = deque()
        self._gap_buckets: tuple[tuple[float, float], ...] = ()
        self._profile: tuple[float, ...] = ()
        self._inflight = 0.0
        self._duration_s = 0.0
        self._osl_buckets: tuple[tuple[float, float], ...] = ()
        self._isl_buckets: tuple[tuple[float, float], ...] = ()
        self.last_isl_tokens = math.nan
        self._sizings = 0
        self._forecast: tuple[float, float] | None = None
        """(time of the latest full sizing or the first early one, s; the rate it sized at, requests/s): what the
        early checks test."""
        self._checked_s: float | None = None
        """Time (s) of the latest check of the forecast (early or full sizing)."""
        self._search: SimulatedSizing | None = None
        self._plans: dict[tuple[int, ...], Goals] = {}

    # ------------------------------------------------------------------ state
    @property
    def simulating(self) -> bool:
        """True when pools are sized by simulation (an evaluator, ``simulated_sizing`` and a target)."""
        c = self.config
        return self.evaluator is not None and c.simulated_sizing and c.sla_attainment_target is not None

    @property
    def predictor_name(self) -> str:
        return str(getattr(self._pred_req, "chosen", self._pred_req.name))

    @property
    def evaluations(self) -> int:
        """Candidate fleets simulated for the current sizing (0 for closed-form sizing)."""
        return self._search.evaluations if self._search is not None else 0

    def _feed(self, w: TrafficWindow) -> None:
        self._pred_req.add(w.num_requests)
        self._pred_isl.add(w.mean_isl_tokens if w.num_requests > 0 else math.nan)
        self._pred_osl.add(w.mean_osl_tokens if w.num_requests > 0 else math.nan)

    def _note(self, now_s: float, w: TrafficWindow, keep: bool) -> None:
        """Keep what the sample needs from ``w``; ``keep``: into the pooled history too."""
        if w.gap_buckets:
            self._gap_buckets = w.gap_buckets
        if w.osl_buckets:
            self._osl_buckets = w.osl_buckets
        if w.isl_buckets:
            self._isl_buckets = w.isl_buckets
        # the latest SIZE_HISTORY_S of the window's rate profile: the sample spans at most that (see _size)
        self._profile = w.arrival_counts[-PROFILE_BINS:]
        self._inflight = w.num_inflight if math.isfinite(w.num_inflight) else 0.0
        d = w.mean_request_duration_s
        if not math.isfinite(d):
            d = (w.mean_ttft_ms + w.mean_osl_tokens * w.mean_itl_ms) / 1000.0
        if math.isfinite(d) and d > 0:
            self._duration_s = d
        if w.num_requests > 0 and math.isfinite(w.mean_isl_tokens):
            self.last_isl_tokens = w.mean_isl_tokens
        if keep:
            self._seen.append(
                _Seen(
                    now_s,
                    w.isl_buckets,
                    w.osl_buckets,
                    _total(w.mean_isl_tokens, w.num_requests),
                    _total(w.mean_osl_tokens, w.num_finished),
                    _total(w.cached_prompt_share, _total(w.mean_isl_tokens, w.num_requests)[0]),
                )
            )
            while self._seen and now_s - self._seen[0].t_s >= SIZE_HISTORY_S:
                self._seen.popleft()

    def _correct(self, w: TrafficWindow, decode_replicas: int | None) -> None:
        """Reference correction factors (closed-form sizing only; a simulation needs none)."""
        cfg, prof = self.config, self.profile
        if not cfg.correction_enabled or w.num_requests <= 0 or prof is None:
            return
        if prof.prefill is not None:
            self.p_correction = clamp_correction(
                prefill_correction(w.mean_ttft_ms, w.mean_isl_tokens, prof.prefill), self.p_correction
            )
        if prof.decode is not None and decode_replicas:
            dur = w.mean_request_duration_s
            if not math.isfinite(dur):
                dur = (w.mean_ttft_ms + w.mean_osl_tokens * w.mean_itl_ms) / 1000.0
            self.d_correction = clamp_correction(
                decode_correction(
                    w.mean_itl_ms,
                    w.num_requests,
                    w.mean_isl_tokens,
                    w.mean_osl_tokens,
                    dur,
                    decode_replicas,
                    w.duration_s,
                    prof.decode,
                ),
                self.d_correction,
            )

    # ------------------------------------------------------------------ learning
    def learn(
        self, now_s: float, traffic: TrafficWindow | None, decode_replicas: int | None, ready: Mapping[str, int] | None
    ) -> bool:
        """A full interval: feed the predictors, predict and size. False when the traffic is unknown.

        With early checks on (``early_sizing_s`` below the interval), the sizing also makes the check it falls on:
        the latest check span (``early_sizing_s``, or the time since the previous check when shorter) tested
        against the new forecast (:func:`forecast_exceeded`); when exceeded, the interval is sized at the bound.
        The predictors see one count per interval, and an interval that ends in a surge would otherwise be sized
        at its mean."""
        if traffic is None:
            return False
        self._feed(traffic)
        self._note(now_s, traffic, keep=True)
        if not self.simulating:
            self._correct(traffic, decode_replicas)
        demand = Demand(
            self._pred_req.predict_next(),
            self._pred_isl.predict_next(),
            self._pred_osl.predict_next(),
            self._osl_buckets,
            self._isl_buckets,
        )
        checked_s, self._checked_s = self._checked_s, now_s
        if not demand.known:
            self.demand = demand
            return False
        cfg = self.config
        early_s = cfg.early_sizing_s
        if early_s is not None and early_s < cfg.adjustment_interval_s:
            # the check this sizing falls on: the latest check span against the new forecast
            span_s = min(early_s, now_s - checked_s) if checked_s is not None else early_s
            lo = _check(traffic, span_s, demand.num_requests / cfg.adjustment_interval_s)
            if lo is not None:
                demand = replace(demand, num_requests=lo * cfg.adjustment_interval_s)
        self.demand = demand
        self._size(demand, ready)
        self.sized_full = True
        self._forecast = (now_s, demand.num_requests / cfg.adjustment_interval_s)
        return True

    def learn_early(self, now_s: float, traffic: TrafficWindow | None, ready: Mapping[str, int] | None) -> bool:
        """Early sizing (``early_sizing_s``), scale-up only; predictors and corrections are not fed (a short window
        is too noisy to learn from). False when it does not size.

        The first time: the traffic seen since the start, its count scaled to a full interval, at its observed
        lengths (OSL from the predictor when nothing finished yet). After it: a test of the latest full (or first
        early) sizing's rate (:func:`forecast_exceeded`) on the arrivals since that sizing, at the dispersion of the
        window this check reads (:func:`dispersion_index`); only when a stretch of them exceeds it at its share of
        :data:`FORECAST_TEST_LEVEL` is the pool sized again, at the highest rate a stretch supports."""
        cfg = self.config
        self._checked_s = now_s
        if traffic is None or not (traffic.num_requests > 0) or not math.isfinite(traffic.mean_isl_tokens):
            return False
        if self._forecast is not None:
            t0, rate = self._forecast
            lo = _check(traffic, now_s - t0, rate)
            if lo is None:
                return False
            self._note(now_s, traffic, keep=False)
            self.demand = replace(self.demand, num_requests=lo * cfg.adjustment_interval_s)
            self._size(self.demand, ready)
            return True
        osl = traffic.mean_osl_tokens if math.isfinite(traffic.mean_osl_tokens) else self._pred_osl.predict_next()
        if not math.isfinite(osl):
            return False
        self._note(now_s, traffic, keep=False)
        self.demand = Demand(
            traffic.num_requests * cfg.adjustment_interval_s / traffic.duration_s,
            traffic.mean_isl_tokens,
            osl,
            traffic.osl_buckets or self._osl_buckets,
            traffic.isl_buckets or self._isl_buckets,
        )
        self._size(self.demand, ready)
        self._forecast = (now_s, self.demand.num_requests / cfg.adjustment_interval_s)
        return True

    # ------------------------------------------------------------------ sizing
    def allowed_miss(self) -> float:
        """Miss share the next interval may have: ``1 - sla_attainment_target``. (An error budget that let an interval
        spend what the last hour left unspent was tried and removed: spending the surplus lowers the fleet, the
        misses refill the budget's deficit, and the loop cycles -- with the load loop on, a steady load flapped
        1 <-> 2 four times in 20 minutes.)"""
        assert self.config.sla_attainment_target is not None
        return 1.0 - self.config.sla_attainment_target

    def _size(self, demand: Demand, ready: Mapping[str, int] | None) -> None:
        cfg = self.config
        self._plans = {}
        self._search = None
        if not self.simulating:
            assert self.profile is not None
            self.exact = {
                p: size_pool(p, demand, cfg, self.profile, self.p_correction, self.d_correction) for p in cfg.pools
            }
            self.required = {p: ceil_replicas(x) for p, x in self.exact.items()}
            return
        assert self.evaluator is not None
        self._sizings += 1
        rate = demand.num_requests / cfg.adjustment_interval_s
        bounds = pool_bounds(cfg)
        if not rate > 0:  # no traffic expected: the least fleet the limits allow serves it
            self.exact = {p: 0.0 for p in cfg.pools}
            self.required = {p: bounds[p][0] for p in cfg.pools}
            return
        allowed = self.allowed_miss()
        # looks longer than the hour the sample's sizes are drawn from would invent traffic (and replay hours of it
        # per candidate at low rates): the looks that fit in SIZE_HISTORY_S at the forecast rate, at least one
        looks = sequential_looks(allowed)
        looks = tuple(m for m in looks if m / rate <= SIZE_HISTORY_S) or looks[:1]
        seen = list(self._seen)
        sample = build_sample(
            rate,
            _mean([s.isl_total for s in seen], demand.isl_tokens),
            _mean([s.osl_total for s in seen], demand.osl_tokens),
            min_horizon_s=min(cfg.adjustment_interval_s, SIZE_HISTORY_S),
            min_requests=looks[-1],
            isl_buckets=pool_buckets([s.isl_buckets for s in seen]) or demand.isl_buckets,
            osl_buckets=pool_buckets([s.osl_buckets for s in seen]) or demand.osl_buckets,
            gap_buckets=self._gap_buckets,
            num_inflight=int(self._inflight),
            warmup_s=self._duration_s,
            rate_profile=self._profile,
            profile_bin_s=ARRIVAL_BIN_S,
            cached_prompt_share=_mean([s.cached_total for s in seen], 0.0),
            seed=(self._sizings,),
        )
        self._search = SimulatedSizing(self.evaluator, sample, cfg.pools, bounds, allowed, looks)
        if ready is not None and all(p in ready for p in cfg.pools):
            self.propose(ready)

    def propose(self, current: Mapping[str, int]) -> Goals:
        """Per-pool goals against ``current`` replicas (cached per fleet).

        Simulation: :meth:`SimulatedSizing.plan` (scale down to the least passing fleet; up to it when the
        current one fails; undecided holds). Closed form: the reference's ``ceil(requirement)``."""
        cfg = self.config
        key = tuple(int(current[p]) for p in cfg.pools)
        if key in self._plans:
            return self._plans[key]
        if self._search is not None:
            plans: dict[str, PoolPlan] = self._search.plan(current)
            goals = {p: (pl.goal, pl.reason) for p, pl in plans.items()}
            self.required = {p: pl.required for p, pl in plans.items()}
            self.exact = {p: float(pl.required) for p, pl in plans.items()}
        else:
            goals = {}
            for p in cfg.pools:
                req, cur = self.required.get(p, current[p]), current[p]
                goals[p] = (
                    req,
                    Reason.SCALE_UP_THROUGHPUT
                    if req > cur
                    else Reason.SCALE_DOWN_THROUGHPUT
                    if req < cur
                    else Reason.HOLD_STEADY,
                )
        self._plans[key] = goals
        return goals


class LoadLoop:
    """Per-engine estimates from ForwardPassMetrics and +/- steps per pool (module docstring)."""

    def __init__(self, config: PlannerConfig) -> None:
        self.config = config
        self.regressions = {
            p: PassTimeRegression(
                FEATURES_BY_POOL[p],
                n_buckets=config.regression_buckets,
                per_bucket=config.regression_samples_per_bucket,
                min_samples=config.regression_min_samples,
            )
            for p in config.pools
        }
        self.engines: dict[tuple[str, int, int], tuple[PassObservation, float]] = {}
        self.reported: set[str] = set()
        """Pools from which some engine has ever reported a pass (a silent pool that never reported is unknown)."""
        self._work: dict[tuple[str, int, int], deque[tuple[float, int, int, float]]] = {}
        """Per engine: (tick s, prefill tokens, prefill-carrying passes, pass wall time s) summed over the passes
        of each tick within ``load_prefill_window_s`` (the agg ITL estimate's prefill work rate)."""

    def observe(self, now_s: float, passes: Sequence[PassObservation]) -> None:
        """Ingest the passes since the last tick; engines silent for ``engine_stale_s`` are forgotten."""
        cfg = self.config
        batch: dict[tuple[str, int, int], list[PassObservation]] = {}
        for p in passes:
            if p.pool not in self.regressions:
                continue
            self.regressions[p.pool].add(p)
            self.reported.add(p.pool)
            seen = p.timestamp_s if p.timestamp_s > 0 else now_s
            key = (p.pool, p.worker_id, p.dp_rank)
            if key not in self.engines or seen >= self.engines[key][1]:
                self.engines[key] = (p, seen)
            batch.setdefault(key, []).append(p)
        for key, ps in batch.items():
            # the latest pass of a tick's batch is the one running at the sampling instant, which is a long
            # (prefill) pass with probability proportional to its length (inspection paradox): left out
            ps = sorted(ps, key=lambda x: x.timestamp_s)[:-1] if len(ps) > 1 else ps
            tok = sum(x.scheduled_requests.sum_prefill_tokens for x in ps)
            n_pre = sum(1 for x in ps if x.scheduled_requests.sum_prefill_tokens > 0)
            self._work.setdefault(key, deque()).append((now_s, tok, n_pre, sum(x.wall_time for x in ps)))
        for key in list(self._work):
            w = self._work[key]
            while w and now_s - w[0][0] >= cfg.load_prefill_window_s:
                w.popleft()
            if not w:
                del self._work[key]
        for key in [k for k, (_, seen) in self.engines.items() if now_s - seen > cfg.engine_stale_s]:
            del self.engines[key]

    def fit(self, pool: str) -> RegressionFit | None:
        return self.regressions[pool].fit()

    def _rate(self, key: tuple[str, int, int]) -> tuple[float, float] | None:
        """(prefill tokens, prefill-carrying passes) per second of pass wall time over ``load_prefill_window_s``."""
        w = self._work.get(key)
        if not w:
            return None
        wall = sum(x[3] for x in w)
        return (sum(x[1] for x in w) / wall, sum(x[2] for x in w) / wall) if wall > 0 else None

    def estimates(self, isl_tokens: float, load_scale: Mapping[str, float] | None = None) -> list[EngineEstimate]:
        cfg = self.config
        out = []
        for key, (p, _seen) in sorted(self.engines.items()):
            pool = key[0]
            hint = isl_tokens if math.isfinite(isl_tokens) else guess_isl_tokens([p])
            out.append(
                estimate_engine(
                    pool,
                    p,
                    self.fit(pool),
                    hint,
                    cfg.max_num_batched_tokens,
                    (load_scale or {}).get(pool, 1.0),
                    self._rate(key),
                )
            )
        return out

    def _up_step(self, current: int, ratio: float) -> int:
        """Scale-up when every engine's estimated TTFT is ``ratio`` x the target: ``ceil(current x min(ratio,
        load_max_scale_up_factor)) - current`` replicas (at least 1; factor 1 = the reference's +1)."""
        f = min(ratio, self.config.load_max_scale_up_factor)
        return max(1, ceil_replicas(max(current, 1) * f) - current) if math.isfinite(f) else 1

    def propose(
        self, pool: str, current: int, ready: int | None, ests: list[EngineEstimate], passes_ok: bool, isl_tokens: float
    ) -> tuple[int, Reason]:
        """(replica delta, reason) for ``pool``. A healthy FPM feed with no recent pass from a pool that has ready
        replicas and has reported before means its engines are idle (an engine with no work runs no passes), not
        unknown: the pool shrinks by one toward its minimum. A pool that never reported is unknown."""
        cfg = self.config
        if not passes_ok:
            return 0, Reason.HOLD_METRICS_UNKNOWN
        engs = [e for e in ests if e.pool == pool]
        if not engs:
            if pool not in self.reported:
                return 0, Reason.HOLD_METRICS_UNKNOWN
            if ready and current > cfg.limits(pool).min_replicas:
                return -1, Reason.SCALE_DOWN_CONSOLIDATED
            return 0, (Reason.HOLD_WITHIN_SLA if ready else Reason.HOLD_METRICS_UNKNOWN)
        need_ttft, need_itl = pool in ("prefill", "agg"), pool in ("decode", "agg")

        def values(e: EngineEstimate) -> list[tuple[str, float | None, float]]:
            v = []
            if need_ttft:
                v.append(("ttft", e.estimated_ttft_ms, cfg.ttft_ms))
            if need_itl:
                v.append(("itl", e.estimated_itl_ms, cfg.itl_ms))
            return v

        def known(e: EngineEstimate) -> list[tuple[float, float]]:
            """(estimate, SLA) pairs of ``values(e)`` whose estimate is known."""
            return [(val, sla) for _, val, sla in values(e) if val is not None]

        # A known violation on every engine is enough to scale up, even when another estimate is unknown (a
        # saturated agg engine whose passes are all full chunks leaves the decode slope unidentified, yet its
        # TTFT estimate is known); unknown estimates only stop what needs them: holding or scaling down.
        if all(any(val > sla for val, sla in known(e)) for e in engs):
            ttfts = [e.estimated_ttft_ms for e in engs]
            if need_ttft and all(t is not None and t > cfg.ttft_ms for t in ttfts):
                ratio = min(t / cfg.ttft_ms for t in ttfts if t is not None)
                return self._up_step(current, ratio), Reason.SCALE_UP_TTFT
            return +1, Reason.SCALE_UP_ITL
        if any(val is None for e in engs for _, val, _ in values(e)):
            warming = self.fit(pool) is None
            return 0, (Reason.HOLD_REGRESSION_WARMING_UP if warming else Reason.HOLD_REGRESSION_DEGENERATE)
        if current > cfg.limits(pool).min_replicas and all(
            all(val < sla * cfg.load_sensitivity for val, sla in known(e)) for e in engs
        ):
            n = len(engs)
            per_replica = max(1, round(n / max(1, current)))
            if n - per_replica <= 0:
                absorbed = all(e.idle for e in engs)
            else:
                scale = n / (n - per_replica)
                fit = self.fit(pool)
                re = []
                for e in engs:
                    key = (pool, e.worker_id, e.dp_rank)
                    fpm = self.engines[key][0]
                    hint = isl_tokens if math.isfinite(isl_tokens) else guess_isl_tokens([fpm])
                    re.append(estimate_engine(pool, fpm, fit, hint, cfg.max_num_batched_tokens, scale, self._rate(key)))
                absorbed = all(val is not None and val < sla for e in re for _, val, sla in values(e))
            if absorbed:
                return -1, Reason.SCALE_DOWN_CONSOLIDATED
        return 0, Reason.HOLD_WITHIN_SLA


@dataclass
class _Pending:
    decision_id: int
    targets: dict[str, int]
    previous: dict[str, int]
    since_s: float
    previous_up_s: dict[str, float]
    """The scale-up stamps (``PendingGuard._last_up_s``) before this decision, restored if it is withdrawn."""


class PendingGuard:
    """Pending decisions, external changes, grace and cooldown (module docstring)."""

    def __init__(self, config: PlannerConfig) -> None:
        self.config = config
        self.pending: _Pending | None = None
        self.last_targets: dict[str, int] | None = None
        self._grace_until_s: dict[str, float] = {}
        self._last_up_s: dict[str, float] = {}
        self._seq = 0

    def check(
        self, now_s: float, current: Mapping[str, int], ready: Mapping[str, int | None], applied_id: int | None
    ) -> tuple[Reason | None, list[str], list[Reason]]:
        """(hold reason or None, pools changed by someone else, reasons to report) for this tick."""
        cfg = self.config
        reasons: list[Reason] = []
        external: list[str] = []
        pend = self.pending
        if pend is not None:
            acked = applied_id is not None and applied_id >= pend.decision_id
            external = [
                p for p in cfg.pools if current[p] != pend.targets[p] and (current[p] != pend.previous[p] or acked)
            ]
            if not external:
                reached = all(
                    current[p] == pend.targets[p] and (ready[p] is None or ready[p] == pend.targets[p])
                    for p in cfg.pools
                )
                if reached and (applied_id is None or acked):
                    self.pending = None
                elif now_s - pend.since_s >= cfg.pending_timeout_s:
                    self.pending = None
                    reasons.append(Reason.PENDING_TIMEOUT_REPLAN)
                else:
                    return Reason.HOLD_PENDING, [], reasons
        elif self.last_targets is not None:
            external = [p for p in cfg.pools if current[p] != self.last_targets[p]]
        if external:
            self.pending = None
            self.last_targets = dict(current)
            for p in external:
                self._grace_until_s[p] = now_s + cfg.external_change_grace_s
            return Reason.ADOPTED_EXTERNAL_CHANGE, external, reasons
        return None, [], reasons

    def restrict(
        self, now_s: float, goal: dict[str, int], current: Mapping[str, int], pool_reasons: dict[str, Reason]
    ) -> None:
        """External-change grace (no change) and scale-down cooldown, in place."""
        for p in self.config.pools:
            if goal[p] != current[p] and now_s < self._grace_until_s.get(p, -math.inf):
                goal[p], pool_reasons[p] = current[p], Reason.HOLD_EXTERNAL_GRACE
            elif goal[p] < current[p] and now_s - self._last_up_s.get(p, -math.inf) < self.config.scale_down_cooldown_s:
                goal[p], pool_reasons[p] = current[p], Reason.HOLD_COOLDOWN

    def publish(self, now_s: float, targets: Mapping[str, int], current: Mapping[str, int]) -> int:
        """Record a published decision; returns its id (1, 2, ...)."""
        self._seq += 1
        before = dict(self._last_up_s)
        for p in self.config.pools:
            if targets[p] > current[p]:
                self._last_up_s[p] = now_s
        self.pending = _Pending(self._seq, dict(targets), dict(current), now_s, before)
        self.last_targets = dict(targets)
        return self._seq

    def withdraw(self, decision_id: int) -> bool:
        """Forget published decision ``decision_id`` because it was never applied (the connector refused it,
        e.g. a 409 on a DGD that changed since it was read): it is no longer pending, the replicas it came
        from are the expected ones again and its scale-up does not start a cooldown. The next tick plans
        afresh. False (nothing changed) when that decision is not the pending one."""
        pend = self.pending
        if pend is None or pend.decision_id != decision_id:
            return False
        self.pending = None
        self.last_targets = dict(pend.previous)
        self._last_up_s = dict(pend.previous_up_s)
        return True

    def state(self) -> dict[str, Any]:
        return {"pending_decision_id": self.pending.decision_id if self.pending else None}
