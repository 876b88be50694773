"""Virtual-time fleet: N aggregated workers replaying a trace as fast as the CPU allows.

Discrete-event loop: arrivals, in (time, input order) order, are the fleet's events; each worker is an
independent engine core (:mod:`mocker.engine`) advanced lazily to the next event time that concerns it
(only the chosen worker for round-robin; every worker when the router needs their state). Inside a worker,
passes are events too: between arrivals, completions, block-boundary crossings and preemptions a
decode-only batch evolves predictably, so whole stretches of passes are computed at once with numpy
(:meth:`VllmCore.advance_until`). ``single_step=True`` runs one pass at a time instead; both give identical
records (tested).

Semantics shared with the reference replay (Dynamo Mocker 1.6.1): an arrival joins the worker's waiting
queue and is considered at the first pass that starts at or after it (an idle worker starts a pass at the
arrival); ``duration_ms`` = last finish - first arrival; ``worker_seconds`` = workers * duration (the
reference's ``decode_worker_seconds``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from math import inf
from typing import Callable, Sequence

from mocker.config import EngineConfig
from mocker.engine import make_engine
from mocker.errors import ConfigError
from mocker.records import ForwardPassMetrics, RequestRecord, TraceRequest
from mocker.routers import ROUTERS


@dataclass(frozen=True)
class FleetConfig:
    """Fleet settings, validated at construction (ConfigError listing every problem)."""

    num_workers: int = 1
    """Aggregated workers (each one engine core)."""
    router: str = "round_robin"
    """round_robin | least_loaded | kv"""
    arrival_speedup: float = 1.0
    """Arrival times are divided by this (dimensionless, > 0)."""
    max_time_ms: float | None = None
    """Stop at this virtual time (ms): passes starting later are not run; unfinished requests stay pending."""
    single_step: bool = False
    """Disable fast-forward (one pass at a time; for equivalence tests)."""
    seed: int = 0
    """Seed of the router's tie-breaking generator."""

    def __post_init__(self) -> None:
        p: list[str] = []
        if not isinstance(self.num_workers, int) or isinstance(self.num_workers, bool) or self.num_workers <= 0:
            p.append(f"num_workers={self.num_workers!r}: expected a positive integer")
        if self.router not in ROUTERS:
            p.append(f"router={self.router!r}: unknown router, expected one of {', '.join(ROUTERS)}")
        if not isinstance(self.arrival_speedup, (int, float)) or isinstance(self.arrival_speedup, bool) \
                or not self.arrival_speedup > 0 or self.arrival_speedup == inf:
            p.append(f"arrival_speedup={self.arrival_speedup!r}: expected a finite number > 0")
        if self.max_time_ms is not None and (not isinstance(self.max_time_ms, (int, float)) or not self.max_time_ms > 0):
            p.append(f"max_time_ms={self.max_time_ms!r}: expected a number > 0 or None")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            p.append(f"seed={self.seed!r}: expected an integer")
        if p:
            raise ConfigError(p)


@dataclass
class ReplayResult:
    records: list[RequestRecord]
    """One per input request, in input order."""
    fpm: list[ForwardPassMetrics]
    """Per-pass metrics (empty unless collect_fpm=True), grouped by worker, in time order per worker."""
    duration_ms: float
    """First arrival -> last finish (ms); 0 when nothing finished."""
    worker_seconds: float
    """Sum over workers of their lifetime (= num_workers * duration, s)."""
    num_workers: int
    engine: EngineConfig


def run_replay(requests: Sequence[TraceRequest], engine: EngineConfig, fleet: FleetConfig, *,
               progress: Callable[[int, int], None] | None = None,
               collect_fpm: bool = False) -> ReplayResult:
    """Replay ``requests`` through ``fleet.num_workers`` engines configured by ``engine``.

    Raises ConfigError on an invalid configuration (e.g. an engine without a core).
    """
    engine.validate()
    n = len(requests)
    workers = [make_engine(engine, worker_id=w, collect_fpm=collect_fpm) for w in range(fleet.num_workers)]
    router = ROUTERS[fleet.router](fleet.num_workers, fleet.seed)
    needs_state = router.needs_state
    on_routed = getattr(router, "on_routed", None)
    stop = inf if fleet.max_time_ms is None else float(fleet.max_time_ms)
    speed = float(fleet.arrival_speedup)
    if fleet.single_step:
        def advance(w, h):  # type: ignore[no-untyped-def]
            w.advance_single_step(h)
    else:
        def advance(w, h):  # type: ignore[no-untyped-def]
            w.advance_until(h)
    records: list[RequestRecord | None] = [None] * n
    order = sorted(range(n), key=lambda i: (requests[i].arrival_ms, i))
    every = max(1, n // 100)
    replace = dataclasses.replace
    done = 0
    for done, i in enumerate(order):
        req = requests[i]
        t = req.arrival_ms / speed if speed != 1.0 else float(req.arrival_ms)
        if t >= stop:
            break
        if needs_state:
            for w in workers:
                advance(w, t)
        wid = router.choose(req, t, workers)
        w = workers[wid]
        if not needs_state:
            advance(w, t)
        rec = RequestRecord(request_id=req.request_id, arrival_ms=t, input_length=req.input_length,
                            output_length=req.output_length)
        w.add_request(replace(req, request_id=i) if req.request_id != i else req, t, rec)
        records[i] = rec
        if on_routed is not None:
            on_routed(rec)
        if progress is not None and done % every == 0:
            progress(sum(x.finished_total for x in workers), n)
    for w in workers:
        advance(w, stop)
        w.finalize()
    out: list[RequestRecord] = []
    for i, rec in enumerate(records):
        if rec is None:
            q = requests[i]
            rec = RequestRecord(request_id=q.request_id, arrival_ms=q.arrival_ms / speed, input_length=q.input_length,
                                output_length=q.output_length)
        out.append(rec)
    finishes = [r.finish_ms for r in out if r.finish_ms is not None and r.status == "finished"]
    first = min((r.arrival_ms for r in out), default=0.0)
    duration = (max(finishes) - first) if finishes else 0.0
    fpm: list[ForwardPassMetrics] = []
    if collect_fpm:
        for w in workers:
            fpm.extend(w.fpm)
    if progress is not None:
        progress(sum(x.finished_total for x in workers), n)
    return ReplayResult(records=out, fpm=fpm, duration_ms=duration, worker_seconds=fleet.num_workers * duration / 1000.0,
                        num_workers=fleet.num_workers, engine=engine)
