"""The closed loop: a trace through a pooled fleet whose size a policy controls, in virtual time.

Data flows one way (docs/architecture.md "The flow"): trace -> arrivals -> fleet (router, engine cores) ->
request records and per-pass metrics -> simulated metric source (:mod:`planner.sim.metrics`) -> policy ->
simulated connector (``add_worker`` with the start-up delay; ``remove_worker`` drains) -> fleet size.

Event order at one virtual instant ``t``: arrivals with ``arrival <= t`` are submitted, every engine runs
up to ``t``, the frontend counters are scraped at ``t``, a timeline sample is taken when due, then the
policy ticks when due and its targets are applied at ``t``. The run ends when every request has
finished (or ``max_tail_s`` after the last arrival, if a policy leaves requests unserved); its duration is
first arrival (t = 0) -> last finish, and every worker is charged from its request to its release (or the
end).

FPM relay: the load loop gets at most ``fpm_per_engine`` most recent passes of each engine per tick (a
bounded subscriber queue, as a ZMQ SUB with a high-water mark); the planner's regressions keep a bounded
sample anyway and its engine state uses the latest pass.
"""

from __future__ import annotations

import bisect
import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from dynoplan.errors import SimulationConfigError
from dynoplan.fpm import ForwardPassMetrics
from mocker.config import EngineConfig
from mocker.fleet.config import run_end_problem
from mocker.records import RequestRecord, TraceRequest
from planner.core import PassObservation, TrafficWindow
from planner.core.sizing import ARRIVAL_BIN_S
from planner.sim.fleet import make_fleet
from planner.sim.metrics import CounterSnapshot, FrontendCounters, sla_miss_shares, window
from planner.sim.policies import Policy, View

MAX_TIMELINE_SAMPLES = 100_000
"""Most timeline samples one run may take (``SimSettings.sample_interval_s`` apart): keeps a run's memory and
time bounded. ``dynoplan simulate`` refuses a trace span that needs more before it runs; the loop refuses a run
that reaches it anyway (requests still running long after the last arrival, or all arriving at once)."""


MIN_STEP_S = 1e-3
"""The loop's smallest clock step, s: a policy's next tick is at least this much later (:meth:`_SimLoop.tick`)
and the timeline sampling period is at least this. It keeps ``t + step > t`` in float64 seconds over the
simulator's whole time range (resolution ~1e-9 s at :data:`mocker.traces.MAX_TRACE_TIMESTAMP_MS`); a 1e-300 s
period would stop the clock."""


@dataclass(frozen=True)
class SimSettings:
    """Closed-loop settings (validated at construction; SimulationConfigError lists every problem)."""

    startup_delay_s: float = 60.0
    """Seconds from requesting a worker until it serves (model load; default 60 s,
    docs/architecture.md "Simulated connector")."""
    sla_ttft_ms: float = 500.0
    """TTFT target, ms (planner default 500)."""
    sla_itl_ms: float = 50.0
    """Per-request mean ITL target, ms (planner default 50)."""
    sample_interval_s: float = 10.0
    """Timeline sampling period, seconds; at least :data:`MIN_STEP_S`."""
    router: str = "round_robin"
    """Routing among ready workers: round_robin | least_loaded."""
    seed: int = 0
    fpm_per_engine: int = 16
    """Most recent passes per engine relayed to the policy per tick."""
    gpus_per_worker: Mapping[str, int] = field(default_factory=dict)
    """GPUs per worker by pool (default: the engine's ``dp_size``)."""
    transfer: Any = None
    """KV transfer of a disaggregated fleet (``mocker.transfer.KvTransferConfig``; None = no delay)."""
    max_tail_s: float = 3600.0
    """Stop this long after the last arrival even if requests are still unserved (they count as misses)."""

    def __post_init__(self) -> None:
        p = []
        for n in ("startup_delay_s",):
            v = getattr(self, n)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                p.append(f"{n}={v!r}: expected seconds >= 0")
        v = self.sample_interval_s
        if isinstance(v, (int, float)) and math.isfinite(v) and 0 < v < MIN_STEP_S:
            p.append(f"sample_interval_s={v!r}: expected seconds >= {MIN_STEP_S:g} (the loop's smallest clock step)")
        for n in ("sla_ttft_ms", "sla_itl_ms", "sample_interval_s", "max_tail_s"):
            v = getattr(self, n)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                p.append(f"{n}={v!r}: expected a number > 0")
        if p:
            raise SimulationConfigError(p)


@dataclass
class SimRun:
    """The outcome of one policy on one trace."""

    policy: str
    pools: tuple[str, ...]
    records: list[RequestRecord]
    timeline: list[dict[str, Any]]
    decisions: list[dict[str, Any]]
    """Every applied change: t_s, targets, previous, reason."""
    worker_spans: list[tuple[str, int, float, float, float | None]]
    gpu_seconds: dict[str, float]
    duration_s: float
    settings: SimSettings


def simulate(
    requests: Sequence[TraceRequest],
    engines: Mapping[str, EngineConfig],
    policy: Policy,
    settings: SimSettings,
    progress: Callable[[int, int], None] | None = None,
) -> SimRun:
    """Run ``policy`` on ``requests`` (arrival times already scaled). Deterministic for equal inputs.

    Raises SimulationConfigError when the policy's pools differ from ``engines``, when the run reaches
    :data:`MAX_TIMELINE_SAMPLES`, or when its last request finishes past the simulator's time limit
    (:func:`mocker.fleet.config.run_end_problem`)."""
    if set(policy.pools) != set(engines):
        raise SimulationConfigError(
            f"policy {policy.name!r} plans pools {list(policy.pools)}: expected the fleet's {list(engines)}"
        )
    run = _SimLoop(requests, engines, policy, settings, progress)
    end_s = run.run()
    return run.result(end_s, engines)


class _SimLoop:
    """The mutable state of one :func:`simulate` run and its steps.

    The loop advances a clock ``t`` (s) to the earlier of the next policy tick and the next timeline
    sample; at each stop it submits the requests that arrived by then, advances the fleet, takes a
    frontend counter snapshot, then samples the timeline and/or ticks the policy (scaling the pools).
    ``snaps``/``snap_t``: counter snapshots and their times (s), strictly increasing; ``records``: the
    fleet's record of each request (index = position in ``requests``; None = never submitted).
    """

    def __init__(
        self,
        requests: Sequence[TraceRequest],
        engines: Mapping[str, EngineConfig],
        policy: Policy,
        settings: SimSettings,
        progress: Callable[[int, int], None] | None,
    ) -> None:
        self.requests = requests
        self.policy = policy
        self.settings = settings
        self.progress = progress
        self.fleet = make_fleet(
            engines,
            router=settings.router,
            seed=settings.seed,
            collect_fpm=policy.needs_fpm,
            transfer=settings.transfer,
        )
        self.delay_ms = settings.startup_delay_s * 1000.0
        for pool, n in policy.initial_replicas().items():
            for _ in range(n):
                self.fleet.add_worker(pool, 0.0, 0.0)
        self.order = sorted(range(len(requests)), key=lambda i: (requests[i].arrival_ms, i))
        self.records: list[RequestRecord | None] = [None] * len(requests)
        self.counters = FrontendCounters(settings.sla_ttft_ms, settings.sla_itl_ms)
        self.snaps: list[CounterSnapshot] = [self.counters.scrape(0.0)]
        self.snap_t: list[float] = [0.0]
        self.last_arrival_s = requests[self.order[-1]].arrival_ms / 1000.0 if self.order else 0.0
        self.pools = tuple(engines)
        self.gpw = {p: int(settings.gpus_per_worker.get(p, engines[p].dp_size)) for p in self.pools}
        self.timeline: list[dict[str, Any]] = []
        self.decisions: list[dict[str, Any]] = []
        self.last_step: dict[str, Any] = {
            "reason": "",
            "predicted_rps": math.nan,
            "estimated_ttft_ms": math.nan,
            "estimated_itl_ms": math.nan,
        }
        self.reasons_since_sample: list[str] = []
        self.next_tick = 0.0
        self.next_sample = 0.0
        self.i = 0  # requests submitted so far, in arrival order
        self.n = len(self.order)
        self.every = max(1, self.n // 200)  # progress callback every this many submissions

    def run(self) -> float:
        """Step the clock until every request is terminal or the tail limit (``max_tail_s`` after the last
        arrival) is passed; returns the last clock time (s)."""
        n = self.n
        while True:
            t = min(self.next_tick, self.next_sample)
            self.submit_until(t * 1000.0)
            self.fleet.advance_until(t * 1000.0)
            self.scrape(t)
            if t >= self.next_sample:
                self.sample(t)
            if t >= self.next_tick:
                self.tick(t)
            if self.i >= n and self.counters.terminal >= n:
                break
            if self.i >= n and t > self.last_arrival_s + self.settings.max_tail_s:
                break
            if self.progress is not None and self.i >= n:
                self.progress(n, n)
        return t

    def submit_until(self, t_ms: float) -> None:
        """Submit every not yet submitted request with ``arrival_ms <= t_ms``, in arrival order."""
        requests, order, n, i = self.requests, self.order, self.n, self.i
        fleet, records, counters, progress, every = self.fleet, self.records, self.counters, self.progress, self.every
        while i < n and requests[order[i]].arrival_ms <= t_ms:
            j = order[i]
            req = requests[j]
            rec = fleet.submit(req, req.arrival_ms)
            records[j] = rec
            counters.on_arrival(rec)
            i += 1
            if progress is not None and i % every == 0:
                progress(i, n)
        self.i = i

    def scrape(self, t: float) -> None:
        """Snapshot the frontend counters at ``t`` (s); a snapshot at the same time replaces the last one."""
        snap = self.counters.scrape(t)
        if self.snap_t[-1] < t:
            self.snaps.append(snap)
            self.snap_t.append(t)
        else:
            self.snaps[-1] = snap

    def traffic(self, d: float, now: float) -> TrafficWindow | None:
        """Frontend interval averages over the last ``d`` s before ``now`` (s), with arrival counts per
        ``ARRIVAL_BIN_S`` bin; None when no snapshot is that old or the window is empty."""
        snaps = self.snaps
        k = bisect.bisect_right(self.snap_t, now - d + 1e-9) - 1
        if k < 0 or now - snaps[k].t_s <= 0:
            return None
        return replace(
            window(snaps[-1], snaps[k]),
            arrival_counts=self.counters.arrival_counts(snaps[k].t_s, snaps[-1].t_s, ARRIVAL_BIN_S),
        )

    def misses(self, d: float, now: float) -> tuple[float, float]:
        """Shares (0..1) of TTFT and ITL SLA misses over the last ``d`` s before ``now`` (s); NaN, NaN when
        no snapshot is that old or the window is empty."""
        k = bisect.bisect_right(self.snap_t, now - d + 1e-9) - 1
        if k < 0 or now - self.snaps[k].t_s <= 0:
            return math.nan, math.nan
        return sla_miss_shares(self.snaps[-1], self.snaps[k])

    def sample(self, t: float) -> None:
        """Append the timeline row at ``t`` (s) and schedule the next one ``sample_interval_s`` later.
        Raises SimulationConfigError when the timeline already holds :data:`MAX_TIMELINE_SAMPLES` rows."""
        interval_s = self.settings.sample_interval_s
        if len(self.timeline) >= MAX_TIMELINE_SAMPLES:
            running = self.i - self.counters.terminal
            raise SimulationConfigError(
                f"sample_interval_s={interval_s:g}: policy {self.policy.name} reached the cap of "
                f"{MAX_TIMELINE_SAMPLES} timeline samples at t={t:g} s of simulated time with {running} of "
                f"{self.n} requests still running (the last arrives at {self.last_arrival_s:g} s); expected "
                f"sample_interval_s > {interval_s:g}: the run lasts longer than {t:g} s"
            )
        self.timeline.append(
            _sample(
                t,
                self.fleet,
                self.pools,
                self.snaps,
                self.snap_t,
                interval_s,
                self.last_step,
                self.reasons_since_sample,
                self.gpw,
            )
        )
        self.reasons_since_sample = []
        self.next_sample = t + interval_s

    def tick(self, t: float) -> None:
        """Show the policy its :class:`View` at ``t`` (s), scale the pools to its targets and schedule its
        next tick (at least :data:`MIN_STEP_S` later; never again when it answers an infinite time)."""
        pools = self.pools
        passes: tuple[PassObservation, ...] = ()
        if self.policy.needs_fpm:
            per_engine = self.settings.fpm_per_engine
            passes = _relay(self.fleet.take_fpm(per_engine), per_engine)
        view = View(
            now_s=t,
            counts={p: self.fleet.pool_counts(p) for p in pools},
            engines={p: self.fleet.engine_states(p) for p in pools},
            traffic=functools.partial(self.traffic, now=t),
            passes=passes,
            sla_misses=functools.partial(self.misses, now=t),
        )
        step = self.policy.tick(view)
        self.last_step = {
            "reason": step.reason,
            "predicted_rps": step.predicted_rps,
            "estimated_ttft_ms": step.estimated_ttft_ms,
            "estimated_itl_ms": step.estimated_itl_ms,
        }
        self.reasons_since_sample.append(step.reason)
        if step.targets is not None:
            self.scale(t, {p: view.counts[p].requested for p in pools}, step.targets, step.reason)
        self.next_tick = max(step.next_tick_s, t + MIN_STEP_S) if math.isfinite(step.next_tick_s) else math.inf

    def scale(self, t: float, prev: dict[str, int], targets: Mapping[str, int], reason: str) -> None:
        """Add or remove workers so each pool's requested count goes from ``prev`` to ``targets`` at ``t``
        (s; new workers start after ``startup_delay_s``), and record the decision; no-op when equal."""
        pools = self.pools
        if not any(int(targets[p]) != prev[p] for p in pools):
            return
        t_ms = t * 1000.0
        for p in pools:
            for _ in range(int(targets[p]) - prev[p]):
                self.fleet.add_worker(p, t_ms, self.delay_ms)
            for _ in range(prev[p] - int(targets[p])):
                self.fleet.remove_worker(p, t_ms)
        self.decisions.append(
            {"t_s": t, "targets": {p: int(targets[p]) for p in pools}, "previous": prev, "reason": reason}
        )

    def result(self, end_s: float, engines: Mapping[str, EngineConfig]) -> SimRun:
        """Finish the fleet and assemble the :class:`SimRun`; never-submitted requests get an empty record.

        The run ends (ms) at the latest finish, or at ``end_s`` when nothing finished, and never before the
        last arrival; the timeline is closed and GPU-seconds are counted up to that end. Raises
        SimulationConfigError when that end is past the simulator's time limit (``engines``' settings named).
        """
        fleet, pools, requests = self.fleet, self.pools, self.requests
        fleet.finish()
        recs: list[RequestRecord] = []
        for j, r in enumerate(self.records):
            if r is None:
                q = requests[j]
                r = RequestRecord(q.request_id, q.arrival_ms, q.input_length, q.output_length)
            recs.append(r)
        finishes = [r.finish_ms for r in recs if r.finish_ms is not None]
        end_ms = max([end_s * 1000.0 if not finishes else max(finishes), self.last_arrival_s * 1000.0])
        too_long = run_end_problem(end_ms, engines.values(), self.settings.transfer)
        if too_long is not None:
            raise SimulationConfigError(f"policy {self.policy.name}: {too_long}")
        _end_timeline(
            self.timeline,
            end_ms / 1000.0,
            fleet,
            pools,
            self.snaps,
            self.snap_t,
            self.counters,
            self.settings.sample_interval_s,
            self.last_step,
            self.gpw,
        )
        spans = fleet.worker_spans()
        gpu_s = fleet.gpu_seconds(end_ms, self.gpw)
        return SimRun(
            self.policy.name, pools, recs, self.timeline, self.decisions, spans, gpu_s, end_ms / 1000.0, self.settings
        )


def _relay(raw: list[tuple[str, ForwardPassMetrics]], per_engine: int) -> tuple[PassObservation, ...]:
    """The fleet's ``(pool, pass)`` records as the planner observes them: the last ``per_engine`` passes of
    each engine (pool, worker id, DP rank, in that order), stamped at the pass end (``timestamp_ms`` / 1000 s,
    the virtual clock); the records' parts are shared, not copied."""
    by_engine: dict[tuple[str, int, int], list[ForwardPassMetrics]] = {}
    for pool, p in raw:
        by_engine.setdefault((pool, p.worker_id, p.dp_rank), []).append(p)
    of = PassObservation.of
    return tuple(of(p, pool=key[0]) for key, ps in sorted(by_engine.items()) for p in ps[-per_engine:])


def _end_timeline(
    timeline: list[dict[str, Any]],
    end_t: float,
    fleet: Any,
    pools: tuple[str, ...],
    snaps: list[CounterSnapshot],
    snap_t: list[float],
    counters: Any,
    interval_s: float,
    last_step: Mapping[str, Any],
    gpw: Mapping[str, int],
) -> None:
    """No sample lies beyond the end of the run (the loop steps to the next sample or tick, which may be far
    past the last finish): samples after ``end_t`` are dropped and one sample at ``end_t`` closes the
    timeline (its windows from the counters, which hold every terminal request by then; the last dropped
    sample's reason)."""
    late = [r for r in timeline if r["t_s"] > end_t + 1e-9]
    if not late:
        return
    del timeline[len(timeline) - len(late) :]
    keep = bisect.bisect_left(snap_t, end_t - 1e-9)
    row = _sample(
        end_t,
        fleet,
        pools,
        [*snaps[:keep], counters.scrape(end_t)],
        [*snap_t[:keep], end_t],
        interval_s,
        last_step,
        [],
        gpw,
    )
    row["reason"] = late[-1]["reason"]
    if timeline and timeline[-1]["t_s"] >= row["t_s"]:
        timeline[-1] = row
    else:
        timeline.append(row)


def _sample(
    t: float,
    fleet: Any,
    pools: tuple[str, ...],
    snaps: list[CounterSnapshot],
    snap_t: list[float],
    interval_s: float,
    last_step: Mapping[str, Any],
    reasons: list[str],
    gpw: Mapping[str, int],
) -> dict[str, Any]:
    row: dict[str, Any] = {"t_s": round(t, 6)}
    waiting = running = 0
    kv: list[float] = []
    for p in pools:
        c = fleet.pool_counts(p)
        row[f"{p}_replicas"] = c.requested
        row[f"{p}_ready"] = c.ready
        row[f"{p}_draining"] = c.draining
        row[f"{p}_queued_at_fleet"] = c.queued_at_fleet
        for e in fleet.engine_states(p):
            waiting += e.num_waiting
            running += e.num_running
            kv.append(e.kv_usage)
    k = bisect.bisect_right(snap_t, t - interval_s + 1e-9) - 1
    w = window(snaps[-1], snaps[max(k, 0)]) if t > 0 and snaps[-1].t_s > snaps[max(k, 0)].t_s else None
    row["observed_rps"] = w.requests_per_second if w else math.nan
    row["observed_ttft_ms"] = w.mean_ttft_ms if w else math.nan
    row["observed_itl_ms"] = w.mean_itl_ms if w else math.nan
    row["predicted_rps"] = last_step["predicted_rps"]
    row["estimated_ttft_ms"] = last_step["estimated_ttft_ms"]
    row["estimated_itl_ms"] = last_step["estimated_itl_ms"]
    row["waiting_requests"] = waiting + sum(fleet.pool_counts(p).queued_at_fleet for p in pools)
    row["running_requests"] = running
    row["kv_usage_mean"] = sum(kv) / len(kv) if kv else math.nan
    row["kv_usage_max"] = max(kv) if kv else math.nan
    acts = [r for r in reasons if not r.startswith("hold") and r != "static"]
    row["reason"] = acts[-1] if acts else (reasons[-1] if reasons else last_step["reason"])
    return row
