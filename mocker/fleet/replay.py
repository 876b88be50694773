"""Fixed-fleet replay (``dynoplan replay``): :func:`run_replay` builds a :class:`mocker.fleet.Fleet` of fixed
size, submits a whole trace in arrival order and collects a :class:`ReplayResult`."""

from __future__ import annotations

import gc
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from math import inf

from dynoplan.errors import ConfigError
from dynoplan.fpm import ForwardPassMetrics
from mocker.config import EngineConfig
from mocker.fleet.config import FleetConfig, run_end_problem
from mocker.fleet.fleet import Fleet
from mocker.records import RequestRecord, TraceRequest


@dataclass
class ReplayResult:
    """What :func:`run_replay` returns: the records, per-pass metrics and fleet totals of one replay."""

    records: list[RequestRecord]
    """One per input request, in input order."""
    fpm: list[ForwardPassMetrics]
    """Per-pass metrics (empty unless collect_fpm=True), grouped by worker (prefill pool first), in time
    order per worker."""
    duration_ms: float
    """First arrival -> last finish (ms); 0 when nothing finished."""
    worker_seconds: float
    """Sum over workers of their lifetime (= workers * duration, s)."""
    num_workers: int
    engine: EngineConfig
    prefill_worker_seconds: float = 0.0
    """Disaggregated: prefill workers * duration (s); 0 for an aggregated fleet."""
    num_prefill_workers: int = 0
    num_decode_workers: int = 0
    kvbm: dict[str, int] | None = None
    """KVBM lower-tier counters (:meth:`Fleet.tier_stats`; extra report keys), None without lower tiers."""


def run_replay(
    requests: Sequence[TraceRequest],
    engine: EngineConfig,
    fleet: FleetConfig,
    *,
    progress: Callable[[int, int], None] | None = None,
    collect_fpm: bool = False,
) -> ReplayResult:
    """Replay ``requests`` through a fixed fleet: ``fleet.num_workers`` aggregated engines configured by
    ``engine``, or ``num_prefill_workers`` + ``num_decode_workers`` (``engine`` with ``worker_type``
    prefill / decode). Uses :class:`Fleet`'s lazy fast path (cores advanced only when an event concerns them).

    Raises ConfigError on an invalid configuration (e.g. an engine without a core), and after the run when its
    last request finished past the simulator's time limit (:func:`mocker.fleet.config.run_end_problem`: a tiny
    ``speedup_ratio`` or KV transfer bandwidth), instead of returning times float64 cannot resolve.

    The cyclic garbage collector is paused while it runs (restored after, also on error): the replay builds
    long-lived objects (records, requests, heaps) but no cyclic garbage, so the collector's repeated scans
    of them were pure overhead (about 6% of the Azure disaggregated replay). The fleet holds no reference cycle
    (reference counting frees it) and is closed (:meth:`Fleet.close`) before returning; what the replay returns
    goes straight to the collector's oldest generation when the collector is re-enabled.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _run_replay(requests, engine, fleet, progress, collect_fpm)
    finally:
        if was_enabled:
            # What the replay leaves (records and their token-time lists: millions of references) is long-lived.
            # freeze + unfreeze moves every tracked object to the oldest generation without a scan, so
            # re-enabling does not start with a young-generation pass over all of it (~0.1 s on the Azure trace;
            # the collector would promote the survivors there anyway). Objects of the caller move with them:
            # they are still collected, by the next full collection.
            gc.freeze()
            gc.unfreeze()
            gc.enable()


def _run_replay(
    requests: Sequence[TraceRequest],
    engine: EngineConfig,
    fleet: FleetConfig,
    progress: Callable[[int, int], None] | None,
    collect_fpm: bool,
) -> ReplayResult:
    n = len(requests)
    if fleet.disaggregated:
        pools = {"prefill": engine.replace(worker_type="prefill"), "decode": engine.replace(worker_type="decode")}
        counts = {"prefill": fleet.num_prefill_workers, "decode": fleet.num_decode_workers}
    else:
        pools = {"agg": engine}
        counts = {"agg": fleet.num_workers}
    fl = Fleet(
        pools,
        router=fleet.router,
        transfer=fleet.transfer,
        seed=fleet.seed,
        collect_fpm=collect_fpm,
        single_step=fleet.single_step,
        kv_events=fleet.kv_events,
        kv_event_lag_ms=fleet.kv_event_lag_ms,
    )
    stop = inf if fleet.max_time_ms is None else float(fleet.max_time_ms)
    speed = float(fleet.arrival_speedup)
    order = sorted(range(n), key=lambda i: (requests[i].arrival_ms, i))
    t0 = 0.0
    if order:
        a0 = requests[order[0]].arrival_ms
        t0 = min(0.0, a0 / speed if speed != 1.0 else float(a0))
    for name, k in counts.items():
        for _ in range(k):
            fl.add_worker(name, t0)
    records: list[RequestRecord | None] = [None] * n
    every = max(1, n // 100)
    for done, i in enumerate(order):
        req = requests[i]
        t = req.arrival_ms / speed if speed != 1.0 else float(req.arrival_ms)
        if t >= stop:
            break
        records[i] = fl.submit(req, t)
        if progress is not None and done % every == 0:
            progress(fl.completed, n)
    fl.finish(stop)
    out: list[RequestRecord] = []
    for i, rec in enumerate(records):
        if rec is None:
            q = requests[i]
            rec = RequestRecord(
                request_id=q.request_id,
                arrival_ms=q.arrival_ms / speed,
                input_length=q.input_length,
                output_length=q.output_length,
            )
        out.append(rec)
    finishes = [r.finish_ms for r in out if r.finish_ms is not None and r.status == "finished"]
    last = max(finishes, default=None)
    too_long = None if last is None else run_end_problem(last, pools.values(), fleet.transfer)
    if too_long is not None:
        fl.close()
        raise ConfigError(too_long)
    first = min((r.arrival_ms for r in out), default=0.0)
    duration = (last - first) if last is not None else 0.0
    fpm: list[ForwardPassMetrics] = []
    if collect_fpm:
        for name in pools:
            for c in fl.cores(name):
                fpm.extend(c.fpm)
    if progress is not None:
        progress(fl.completed, n)
    nw = sum(counts.values())
    kvbm = fl.tier_stats()
    fl.close()
    return ReplayResult(
        records=out,
        fpm=fpm,
        duration_ms=duration,
        worker_seconds=nw * duration / 1000.0,
        num_workers=nw,
        engine=engine,
        prefill_worker_seconds=counts.get("prefill", 0) * duration / 1000.0,
        num_prefill_workers=counts.get("prefill", 0),
        num_decode_workers=counts.get("decode", 0),
        kvbm=kvbm,
    )


__all__ = ["ReplayResult", "run_replay"]
