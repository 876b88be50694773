"""Policy specs -> policies, ``static:peak`` sizing, ``static:auto`` search, and side-by-side comparisons.

``static:peak``: the throughput formulas of :mod:`planner.core.throughput` (prefill and decode sizing at the
SLA, correction factors 1) applied to the trace's busiest ``adjustment_interval_s`` window (most
requests; its mean ISL/OSL), rounded up.

``static:auto``: the smallest fixed fleet whose SLA attainment reaches ``auto_attainment``. Aggregated:
replicas 1, 2, 4, ... until one reaches it, then bisection between the last miss and the first hit
(attainment is taken as monotone in fleet size). Disaggregated: for each prefill count from the search
over prefill (decode fixed large), the smallest decode count, minimising total GPUs.
"""

from __future__ import annotations

import bisect
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from dynoplan.errors import SimulationConfigError
from dynoplan.fields import float_text
from dynoplan.settings_text import assignments, check_utf8
from mocker.config import EngineConfig
from mocker.records import RequestRecord, TraceRequest
from planner.arguments import ATTAINMENT_EXPECTED, attainment_text
from planner.core import PerformanceProfile, PlannerConfig, TrafficWindow, config_from_mapping
from planner.core.budget import apply_limits
from planner.core.config import absent_pool_problems, setting_name
from planner.core.loops import ThroughputLoop, pool_bounds
from planner.core.sizing import ARRIVAL_BIN_S, SIZE_HISTORY_S
from planner.core.throughput import Demand, ceil_replicas, size_pool
from planner.sim.loop import SimRun, SimSettings, simulate
from planner.sim.metrics import ISL_BUCKETS_TOKENS, OSL_BUCKETS_TOKENS, FrontendCounters, window
from planner.sim.policies import HpaPolicy, PlannerPolicy, Policy, SaturationPolicy, SchedulePolicy, StaticPolicy
from planner.whatif import EngineFleetEvaluator


@dataclass(frozen=True)
class RunContext:
    """Everything policies are built from: trace, engines, settings, planner config/profile/warm start."""

    requests: Sequence[TraceRequest]
    engines: Mapping[str, EngineConfig]
    settings: SimSettings
    config: PlannerConfig
    profile: PerformanceProfile | None
    warm_start: Sequence[TrafficWindow] = ()
    auto_attainment: float = 0.995
    initial: Mapping[str, int] | None = None
    max_replicas: int = 64
    attainment_target: float | str | None = None
    """--attainment-target: a share, ``"off"`` (feedback disabled) or None (the planner config's)."""
    span_note: str = ""
    """``the trace spans X s`` and the inputs that made it so (the start of the tick caps' message)."""

    @property
    def pools(self) -> tuple[str, ...]:
        return tuple(self.engines)


def trace_windows(requests: Sequence[TraceRequest], interval_s: float) -> list[TrafficWindow]:
    """Per-interval arrivals of the (already scaled) trace: count, mean ISL/OSL and the ISL and OSL histograms
    (:mod:`planner.sim.metrics` bucket bounds, as the frontend would export them)."""
    if not requests:
        return []
    end = max(r.arrival_ms for r in requests) / 1000.0
    n = int(end // interval_s) + 1
    cnt = [0] * n
    isl = [0.0] * n
    osl = [0.0] * n
    hist = [[0] * len(OSL_BUCKETS_TOKENS) for _ in range(n)]
    ihist = [[0] * len(ISL_BUCKETS_TOKENS) for _ in range(n)]
    for r in requests:
        k = int(r.arrival_ms / 1000.0 // interval_s)
        cnt[k] += 1
        isl[k] += r.input_length
        osl[k] += r.output_length
        hist[k][bisect.bisect_left(OSL_BUCKETS_TOKENS, r.output_length)] += 1
        ihist[k][bisect.bisect_left(ISL_BUCKETS_TOKENS, r.input_length)] += 1
    return [
        TrafficWindow(
            interval_s,
            float(c),
            a / c if c else math.nan,
            b / c if c else math.nan,
            osl_buckets=tuple((le, float(x)) for le, x in zip(OSL_BUCKETS_TOKENS, h)),
            isl_buckets=tuple((le, float(x)) for le, x in zip(ISL_BUCKETS_TOKENS, ih)),
        )
        for c, a, b, h, ih in zip(cnt, isl, osl, hist, ihist)
    ]


def peak_replicas(ctx: RunContext, first: bool = False) -> dict[str, int]:
    """``static:peak`` sizing (module docstring); ``first=True`` sizes the trace's first interval instead."""
    if ctx.profile is None:
        raise SimulationConfigError(
            "static:peak / initial fleet 'auto': needs a profile (--profile FILE.npz, or let "
            "simulate profile the engine)"
        )
    cfg = ctx.config
    wins = trace_windows(ctx.requests, cfg.adjustment_interval_s)
    if not wins:
        return {p: 1 for p in ctx.pools}
    peak = wins[0] if first else max(wins, key=lambda w: w.num_requests)
    if peak.num_requests <= 0:
        return {p: 1 for p in ctx.pools}
    d = Demand(
        peak.num_requests,
        peak.mean_isl_tokens,
        peak.mean_osl_tokens,
        osl_buckets=peak.osl_buckets,
        isl_buckets=peak.isl_buckets,
    )
    return {pool: max(1, ceil_replicas(size_pool(pool, d, cfg, ctx.profile))) for pool in ctx.pools}


def _initial(ctx: RunContext, cfg: PlannerConfig | None = None) -> dict[str, int]:
    """Fleet at t = 0 of the dynamic policies: ``ctx.initial``, or when None ("auto") what an operator would
    have deployed for the load at the start — the sizing by simulation with the policy's own config ``cfg``
    (default ``ctx.config``) of the trace's first adjustment interval (:func:`_initial_by_simulation`; the
    reference formulas when that config sizes in closed form); 1 per pool without a profile."""
    if ctx.initial:
        return dict(ctx.initial)
    if ctx.profile is None:
        return {p: 1 for p in ctx.pools}
    cfg = ctx.config if cfg is None else cfg
    want = _initial_by_simulation(ctx, cfg) or peak_replicas(replace(ctx, config=cfg), first=True)
    # within the planner's limits, as the planner itself would place it: pool limits and the GPU budgets
    # (planner.core.budget.apply_limits; nothing runs yet, so its goal is the fleet)
    return apply_limits(want, {}, cfg).goal


def what_if(ctx: RunContext, cfg: PlannerConfig) -> EngineFleetEvaluator:
    """The planner's engine model in the loop: the fleet's own engine settings, router and KV transfer, with
    the planner's SLA targets (:class:`planner.whatif.EngineFleetEvaluator`)."""
    return EngineFleetEvaluator(
        ctx.engines,
        ttft_ms=cfg.ttft_ms,
        itl_ms=cfg.itl_ms,
        router=ctx.settings.router,
        transfer=ctx.settings.transfer,
        seed=ctx.settings.seed,
    )


def _capped(initial: dict[str, int], ctx: RunContext) -> dict[str, int]:
    """A baseline's initial fleet within ``--max-replicas`` per pool (the cap of every baseline)."""
    return {p: min(n, ctx.max_replicas) for p, n in initial.items()}


def first_window(
    requests: Sequence[TraceRequest], interval_s: float, ttft_ms: float, itl_ms: float
) -> TrafficWindow | None:
    """The frontend's window of the trace's first ``interval_s`` (counts, ISL/OSL and gap histograms, rate
    profile), as the planner would read it; the OSL from the requests themselves (nothing has finished yet at
    deployment time); the rate profile of its latest hour at most (what the sizing's sample uses). None for an
    empty first interval."""
    first = [r for r in requests if r.arrival_ms < interval_s * 1000.0]
    if not first:
        return None
    fc = FrontendCounters(ttft_ms, itl_ms)
    old = fc.scrape(0.0)
    for r in first:
        fc.on_arrival(RequestRecord(r.request_id, r.arrival_ms, r.input_length, r.output_length))
    w = window(fc.scrape(interval_s), old)
    osl = [r.output_length for r in first]
    counts = [0] * len(OSL_BUCKETS_TOKENS)
    for o in osl:
        counts[bisect.bisect_left(OSL_BUCKETS_TOKENS, o)] += 1
    return replace(
        w,
        mean_osl_tokens=sum(osl) / len(osl),
        num_finished=math.nan,
        osl_buckets=tuple((le, float(c)) for le, c in zip(OSL_BUCKETS_TOKENS, counts)),
        # the window's latest hour of bins at most: all the sizing's sample uses (planner.core.loops.PROFILE_BINS);
        # a whole interval of 1e300 s would be 1e299 bins
        arrival_counts=fc.arrival_counts(max(0.0, interval_s - SIZE_HISTORY_S), interval_s, ARRIVAL_BIN_S),
        num_inflight=0.0,
    )


def _initial_by_simulation(ctx: RunContext, cfg: PlannerConfig) -> dict[str, int] | None:
    """The initial fleet by the planner's own sizing by simulation of the trace's first interval (None when the
    config sizes in closed form or the interval is empty): what an operator would deploy for that load."""
    if not (cfg.simulated_sizing and cfg.sla_attainment_target is not None and cfg.throughput_enabled):
        return None
    w = first_window(ctx.requests, cfg.adjustment_interval_s, cfg.ttft_ms, cfg.itl_ms)
    if w is None:
        return None
    loop = ThroughputLoop(replace(cfg, predictor="constant"), ctx.profile, what_if(ctx, cfg))
    if not loop.learn(0.0, w, None, None):
        return None
    loop.propose({p: pool_bounds(cfg)[p][0] for p in cfg.pools})
    return dict(loop.required)


def _kv_target_from_sla(ctx: RunContext) -> float:
    """HPA default KV target: the usage at which the profile's ITL meets the SLA at the trace's mean
    context (ISL + OSL/2); 0.5 without a profile."""
    prof = ctx.profile
    if prof is None or prof.decode is None or not ctx.requests:
        return 0.5
    isl = sum(r.input_length for r in ctx.requests) / len(ctx.requests)
    osl = sum(r.output_length for r in ctx.requests) / len(ctx.requests)
    pt = prof.decode.best_thpt_per_gpu(ctx.settings.sla_itl_ms, isl + osl / 2.0)
    return max(0.01, float(pt.kv_usage))


MAX_THROUGHPUT_TICKS = 10_000
"""Most throughput-loop ticks per planner policy (trace span / ``adjustment_interval_s``): each sizes the
fleet by simulation (about 0.1 s); at the default 180 s that is a 20-day trace, longer than the timeline
cap (:data:`planner.sim.loop.MAX_TIMELINE_SAMPLES` at the default 10 s) allows anyway."""
MAX_LOAD_TICKS = 200_000
"""Most load-loop ticks per planner policy with ``load_enabled`` (trace span / ``load_adjustment_interval_s``):
about 1 ms each; at the default 5 s the span the timeline cap allows at its default 10 s."""

MAX_EARLY_TICKS = 100_000
"""Most early checks per planner policy (trace span / ``early_sizing_s``): about 2 ms each, the simulation
advanced to each check included (measured: a 600 s trace at ``early_sizing_s=0.1``, 6,000 checks, ran 13 s
longer than at the default 30 s); at the default 30 s a 35-day trace, beyond the throughput loop's cap."""


def trace_span_s(requests: Sequence[TraceRequest]) -> float:
    """Seconds from t = 0 to the trace's last arrival (after ``--arrival-speedup`` / ``--rate-envelope``)."""
    return max((r.arrival_ms for r in requests), default=0.0) / 1000.0


def check_ticks(cfg: PlannerConfig, span_s: float, span_note: str = "") -> None:
    """Refuse a planner config whose loops would tick more than :data:`MAX_THROUGHPUT_TICKS` /
    :data:`MAX_LOAD_TICKS` / :data:`MAX_EARLY_TICKS` (early checks) times over a trace of ``span_s`` seconds (a
    tiny interval would run for hours), before anything runs. ``span_note``: how the trace got its span (``the
    trace spans X s after --arrival-speedup=...``). Raises SimulationConfigError naming the setting and its value."""
    loops = (
        (
            "adjustment_interval_s",
            cfg.adjustment_interval_s,
            "throughput-loop",
            cfg.throughput_enabled,
            MAX_THROUGHPUT_TICKS,
        ),
        ("load_adjustment_interval_s", cfg.load_adjustment_interval_s, "load-loop", cfg.load_enabled, MAX_LOAD_TICKS),
        (
            "early_sizing_s",
            cfg.early_sizing_s or math.inf,
            "early-check",
            cfg.throughput_enabled and cfg.early_sizing_s is not None,
            MAX_EARLY_TICKS,
        ),
    )
    for key, interval, what, on, cap in loops:
        if on and span_s / interval > cap:
            raise SimulationConfigError(
                f"{key}={interval:g}: {span_note or f'the trace spans {span_s:g} s'}; that is "
                f"{span_s / interval:.3g} {what} ticks, more than the cap of {cap} per policy; expected "
                f"{key} >= {span_s / cap:.3g} s"
            )


def check_initial(initial: Mapping[str, int] | None, cfg: PlannerConfig) -> None:
    """Each pool of ``--initial-replicas`` within the planner config's [min_replicas, max_replicas] (max: the
    pool's ``max_replicas``, else ``max_gpu_budget // gpus_per_engine``) and the fleet's GPUs within
    ``max_gpu_budget``: the run's config and each ``planner:k=v`` variant's. Rejects rather than clamps.
    Raises SimulationConfigError."""
    if not initial:
        return
    gpus = 0
    for pool, n in initial.items():
        lim = cfg.limits(pool)
        hi = cfg.max_gpu_budget // lim.gpus_per_engine
        if lim.max_replicas is not None:
            hi = min(hi, lim.max_replicas)
        if not lim.min_replicas <= n <= hi:
            raise SimulationConfigError(
                f"--initial-replicas {pool}={n}: expected {lim.min_replicas} <= N <= {hi} "
                f"(planner {pool}.min_replicas / max_replicas, max_gpu_budget={cfg.max_gpu_budget})"
            )
        gpus += n * lim.gpus_per_engine
    if gpus > cfg.max_gpu_budget:
        raise SimulationConfigError(f"--initial-replicas: {gpus} GPUs, expected <= max_gpu_budget={cfg.max_gpu_budget}")


def _variant_settings(spec: str, s: str) -> dict[str, str]:
    """The ``key=value`` items of ``planner:key=value,...`` (an item without ``=`` continues the previous
    value: a list, ``auto_candidates=a,b``) as :func:`dynoplan.settings_text.assignments` reads
    ``--planner-set``: a key given twice in any spelling (``ttft_ms`` / ``ttft-ms``, ``agg.gpus_per_engine`` /
    ``agg_gpus_per_engine``: :func:`planner.core.config.setting_name`) is refused."""
    items: list[str] = []
    for part in s.split(":", 1)[1].split(","):
        if "=" not in part:
            if not items:
                raise SimulationConfigError(f"policy {spec!r}: expected planner:key=value,key=value")
            items[-1] += "," + part.strip()
        else:
            items.append(part)
    return assignments(items, f"policy {spec!r}:", name=setting_name)


def make_policy(spec: str, ctx: RunContext) -> Policy:
    """Build the policy named by ``spec`` (see :mod:`planner.sim.policies`). Raises SimulationConfigError
    (its message starts with ``policy 'SPEC':``; AutoStaticUnreachable as it is)."""
    from dynoplan.errors import ConfigError

    try:
        return _make_policy(spec, ctx)
    except AutoStaticUnreachable:
        raise
    except (SimulationConfigError, ConfigError) as e:
        if str(e).startswith(f"policy {spec!r}"):
            raise
        raise SimulationConfigError(f"policy {spec!r}: {e}") from None


_COUNT = re.compile(r"[0-9]+(\+[0-9]+)*")
_SECONDS = re.compile(r"[0-9]+(\.[0-9]*)?")


def _fleet_counts(
    spec: str, arg: str, pools: tuple[str, ...], ctx: RunContext, form: str, entry: str | None = None
) -> dict[str, int]:
    """``N`` (agg) or ``P+D`` (disagg), ASCII digits only, as replicas per pool, each in [1, ``--max-replicas``];
    ``form`` is the spec's prefix, ``entry`` the schedule entry, for the error message. Raises
    SimulationConfigError naming ``spec`` (and ``entry``)."""
    nums = [int(x) for x in arg.split("+")] if _COUNT.fullmatch(arg) else []
    where = f"entry {entry!r}: " if entry is not None else ""
    if len(nums) != len(pools) or any(x < 1 for x in nums):
        mode = "agg" if pools == ("agg",) else "disagg"
        if form == "static:":
            want = "static:N (N >= 1)" if len(pools) == 1 else "static:P+D (P, D >= 1)"
            raise SimulationConfigError(f"policy {spec!r}: expected {want}, static:peak or static:auto for mode {mode}")
        want = "N (N >= 1)" if len(pools) == 1 else "P+D (P, D >= 1)"
        raise SimulationConfigError(f"policy {spec!r}: {where}{arg!r}: expected {want} for mode {mode}")
    over = [f"{p}={n}" for p, n in zip(pools, nums) if n > ctx.max_replicas]
    if over:
        raise SimulationConfigError(
            f"policy {spec!r}: {where}{', '.join(over)}: expected at most --max-replicas={ctx.max_replicas} per pool"
        )
    return dict(zip(pools, nums))


def _schedule_steps(
    spec: str, arg: str, pools: tuple[str, ...], ctx: RunContext
) -> tuple[tuple[float, dict[str, int]], ...]:
    """``T=N,T=N,...`` (``T=P+D`` disaggregated) as ((t_s, replicas per pool), ...): ``T`` plain decimal
    seconds from the trace start, strictly increasing, the first 0 (the starting fleet), none after the last
    arrival (a change there would do nothing); no spaces. Raises SimulationConfigError naming the entry."""
    last_s = max((r.arrival_ms for r in ctx.requests), default=0.0) / 1000.0
    example = "(schedule:0=4,300=3; disaggregated schedule:0=2+1,140=3+1)"
    if any(c.isspace() for c in arg):
        raise SimulationConfigError(f"policy {spec!r}: expected no spaces {example}")
    steps: list[tuple[float, dict[str, int]]] = []
    for part in arg.split(","):
        t_txt, eq, n_txt = part.partition("=")
        if not eq or not _SECONDS.fullmatch(t_txt):
            raise SimulationConfigError(
                f"policy {spec!r}: entry {part!r}: expected T=N with T in seconds, a plain decimal >= 0 {example}"
            )
        t = float(t_txt)
        if steps and t <= steps[-1][0]:
            raise SimulationConfigError(
                f"policy {spec!r}: entry {part!r}: expected times in increasing order (after {steps[-1][0]:g} s)"
            )
        if not steps and t != 0:
            raise SimulationConfigError(
                f"policy {spec!r}: entry {part!r}: expected the first entry at 0 s (the starting fleet)"
            )
        if t > last_s:
            raise SimulationConfigError(
                f"policy {spec!r}: entry {part!r}: expected a time within the trace "
                f"(last arrival at {last_s:.3f} s); a later change would do nothing"
            )
        steps.append((t, _fleet_counts(spec, n_txt, pools, ctx, "schedule:", part)))
    return tuple(steps)


def _make_policy(spec: str, ctx: RunContext) -> Policy:
    check_utf8(spec, "its text")  # argv keeps non-UTF-8 bytes as lone surrogates
    s = spec.strip()
    pools = ctx.pools
    if s == "planner" or s.startswith("planner:"):
        cfg = ctx.config
        att: str | None = None
        att_key = "attainment_target"
        if ":" in s:
            kv = _variant_settings(spec, s)
            # attainment_target is the variant's short name of sla_attainment_target (one setting: both read as
            # --attainment-target reads its text, and the variant's value wins over that flag)
            given_keys = [k for k in ("attainment_target", "sla_attainment_target") if k in kv]
            if len(given_keys) == 2:
                raise SimulationConfigError(
                    f"policy {spec!r}: attainment_target={kv['attainment_target']!r} and sla_attainment_target="
                    f"{kv['sla_attainment_target']!r}: one setting given twice, expected one of the two names"
                )
            att_key = given_keys[0] if given_keys else att_key
            att = kv.pop(att_key, None)
            if "mode" in kv and kv["mode"] != cfg.mode:
                # every policy of a run replays the same fleet (pools, engines, KV transfer), fixed by --mode
                raise SimulationConfigError(
                    f"policy {spec!r}: mode={kv['mode']!r}: a --compare variant cannot change the run's mode, "
                    f"expected mode={cfg.mode} (the run's --mode {cfg.mode}) or no mode"
                )
            cfg = config_from_mapping(kv, base=cfg, source=f"policy {spec!r}", cli=True)
            absent = absent_pool_problems(kv, cfg)
            if absent:
                raise SimulationConfigError(f"policy {spec!r}: {absent[0]}")
            for p in ctx.pools:  # the fleet's GPUs per worker are the run's (one GPU-hour scale for every row)
                n, run_n = cfg.limits(p).gpus_per_engine, ctx.config.limits(p).gpus_per_engine
                if n != run_n:
                    raise SimulationConfigError(
                        f"policy {spec!r}: {p}.gpus_per_engine={n}: a --compare variant cannot change the "
                        f"fleet's GPUs per worker, expected {p}.gpus_per_engine={run_n} (the run's: --planner-set, "
                        f"--config, at least --dp-size) or none"
                    )
        given = ctx.attainment_target
        explicit = given is not None  # "off" (--attainment-target off) disables the feedback
        att_target = None if isinstance(given, str) else given  # the only text is "off"
        if att is not None:
            try:
                att_target = attainment_text(att)
            except ValueError:
                raise SimulationConfigError(
                    f"policy {spec!r}: {att_key}={att!r}: expected {ATTAINMENT_EXPECTED}"
                ) from None
        if att_target is not None or att is not None or explicit:
            cfg = replace(cfg, sla_attainment_target=att_target)
        check_ticks(cfg, trace_span_s(ctx.requests), ctx.span_note)
        check_initial(ctx.initial, cfg)
        return PlannerPolicy(s, cfg, ctx.profile, ctx.warm_start, _initial(ctx, cfg), evaluator=what_if(ctx, cfg))
    if s == "throughput-only":
        # the reference throughput loop: closed-form sizing (no engine model), constant predictor, no early
        # sizing, +1 load steps
        cfg = replace(
            ctx.config,
            throughput_enabled=True,
            load_enabled=False,
            predictor="constant",
            scale_down_cooldown_s=0.0,
            simulated_sizing=False,
            early_sizing_s=None,
            sla_attainment_target=None,
            load_max_scale_up_factor=1.0,
        )
        check_ticks(cfg, trace_span_s(ctx.requests), ctx.span_note)
        return PlannerPolicy(s, cfg, ctx.profile, ctx.warm_start, _initial(ctx))
    if s.startswith("static:"):
        arg = s.split(":", 1)[1]
        if arg == "peak":
            return StaticPolicy(s, peak_replicas(ctx))
        if arg == "auto":
            return StaticPolicy(s, auto_static(ctx))
        return StaticPolicy(s, _fleet_counts(spec, arg, pools, ctx, "static:"))
    if s.startswith("schedule:"):
        return SchedulePolicy(s, _schedule_steps(spec, s.split(":", 1)[1], pools, ctx))
    if s == "hpa" or s.startswith("hpa:"):
        parts = s.split(":")
        if len(parts) > 3:
            raise SimulationConfigError(
                f"policy {spec!r}: {':'.join(parts[3:])!r}: expected hpa, hpa:METRIC or "
                f"hpa:METRIC:TARGET (METRIC kv or running)"
            )
        metric = parts[1] if len(parts) > 1 else "kv"
        target: float | None = None
        if len(parts) > 2:
            try:
                target = float_text(parts[2])
            except ValueError:
                raise SimulationConfigError(f"policy {spec!r}: target {parts[2]!r}: expected a number") from None
        if metric == "kv" and target is not None and not 0 < target <= 1:
            raise SimulationConfigError(
                f"policy {spec!r}: target {parts[2]!r}: expected a KV usage fraction 0 < target <= 1"
            )
        if target is None:
            kv_t = _kv_target_from_sla(ctx)
            if metric == "kv":
                target = kv_t
            else:
                isl = sum(r.input_length for r in ctx.requests) / max(1, len(ctx.requests))
                osl = sum(r.output_length for r in ctx.requests) / max(1, len(ctx.requests))
                cap = next(iter(ctx.engines.values())).total_kv_tokens
                target = max(1.0, kv_t * cap / (isl + osl / 2.0))
        return HpaPolicy(s, pools, metric, target, _capped(_initial(ctx), ctx), max_replicas=ctx.max_replicas)
    if s == "saturation":
        return SaturationPolicy(s, pools, _capped(_initial(ctx), ctx), max_replicas=ctx.max_replicas)
    raise SimulationConfigError(
        f"policy {spec!r}: expected planner[:k=v,...], throughput-only, static:N, static:P+D, "
        "static:peak, static:auto, schedule:T=N,..., hpa[:kv|running[:target]] or saturation"
    )


class AutoStaticUnreachable(SimulationConfigError):
    """``static:auto`` found no fleet within ``max_replicas`` reaching the target; the message names the best
    fleet tried and its attainment."""


def attainment(run: SimRun) -> float:
    from planner.sim.report import sla_flags

    ok, _, _ = sla_flags(run.records, run.settings.sla_ttft_ms, run.settings.sla_itl_ms)
    return float(ok.mean()) if ok.size else 0.0


def auto_static(ctx: RunContext, cache: dict[tuple[int, ...], SimRun] | None = None) -> dict[str, int]:
    """``static:auto`` search (module docstring). Raises SimulationConfigError when ``max_replicas`` is not enough."""
    cache = {} if cache is None else cache
    pools = ctx.pools

    def run(counts: tuple[int, ...]) -> float:
        if counts not in cache:
            cache[counts] = simulate(
                ctx.requests,
                ctx.engines,
                StaticPolicy("static", dict(zip(pools, counts))),
                replace(ctx.settings, startup_delay_s=0.0),
            )
        return attainment(cache[counts])

    def smallest(f: Callable[[int], float]) -> int:
        lo, hi = 0, 1
        while f(hi) < ctx.auto_attainment:
            lo, hi = hi, hi * 2
            if hi > ctx.max_replicas:
                if f(ctx.max_replicas) >= ctx.auto_attainment:
                    hi = ctx.max_replicas
                    break
                best_counts, best_run = max(cache.items(), key=lambda kv: (attainment(kv[1]), [-c for c in kv[0]]))
                fleet = "+".join(str(c) for c in best_counts)
                raise AutoStaticUnreachable(
                    f"static:auto: no fleet of at most --max-replicas={ctx.max_replicas} per pool reaches attainment "
                    f"{ctx.auto_attainment} (best found: static:{fleet} with attainment {attainment(best_run):.4f}); "
                    f"expected a larger --max-replicas or a lower --auto-attainment"
                )
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if f(mid) >= ctx.auto_attainment:
                hi = mid
            else:
                lo = mid
        return hi

    if len(pools) == 1:
        return {pools[0]: smallest(lambda k: run((k,)))}
    big = ctx.max_replicas // 2
    p_min = smallest(lambda k: run((k, big)))
    d_min = smallest(lambda k: run((big, k)))
    best: tuple[int, int] | None = None
    for p in range(p_min, p_min + 3):

        def decode_attainment(k: int, _p: int = p) -> float:
            return run((_p, max(k, 1))) if k >= d_min else 0.0

        d = smallest(decode_attainment)
        if best is None or p + d < sum(best):
            best = (p, d)
    assert best is not None
    return dict(zip(pools, best))
