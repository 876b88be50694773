"""A dynamic, pooled virtual-time fleet for the closed loop (interim driver until ``mocker.fleet.Fleet``).

Same API as the pooled ``mocker.fleet.Fleet`` developer G is writing (``add_worker``, ``remove_worker``,
``submit``, ``advance_until``, ``finish``, ``take_fpm``, ``pool_counts``, ``gpu_seconds``,
``engine_states``); :func:`make_fleet` uses G's class when it exists and this one otherwise. This one
drives aggregated pools only (a disaggregated hand-off needs the P/D fleet).

Worker life cycle (issue 5, "simulated connector"):

- ``add_worker(pool, now_ms, startup_delay_ms)``: the worker costs GPU time from ``now_ms`` and becomes
  routable at ``now_ms + startup_delay_ms`` (model load time);
- ``remove_worker``: a worker still starting is cancelled at once (released at ``now_ms``); a ready one
  stops receiving requests at once, finishes (drains) what it holds, and is released when its last pass
  ends (``max(now_ms, end of its last pass)``);
- ``submit``: routes among ready workers (round robin over the ready list in worker-id order, or
  least-loaded: fewest waiting + running requests, then lowest id); with no ready worker the request
  waits in the fleet queue and is dispatched, in arrival order, when a worker becomes ready.

GPU time of a worker = (released or now) - requested, times its GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from mocker.config import EngineConfig
from mocker.engine import make_engine
from mocker.records import ForwardPassMetrics, RequestRecord, TraceRequest
from planner.sim.errors import SimulationConfigError

ROUTING: tuple[str, ...] = ("round_robin", "least_loaded")
"""Routers of the interim fleet (the pooled fleet also has ``kv``)."""


@dataclass(frozen=True, slots=True)
class PoolCounts:
    """Workers of one pool: ``requested`` (starting + ready, what the spec asks for), ``ready``
    (routable), ``draining`` (removed, finishing their requests) and requests ``queued_at_fleet``."""

    requested: int
    ready: int
    draining: int
    queued_at_fleet: int


@dataclass(frozen=True, slots=True)
class EngineState:
    """One ready worker's scheduler state: ``waiting``/``running`` requests, ``kv_usage`` (active KV
    blocks / total blocks, 0..1)."""

    worker_id: int
    waiting: int
    running: int
    kv_usage: float


@dataclass
class _Worker:
    worker_id: int
    pool: str
    core: Any
    requested_ms: float
    ready_ms: float
    state: str = "starting"  # starting | ready | draining | released
    released_ms: float | None = None
    fpm_seen: int = 0


@dataclass
class DynamicFleet:
    """Aggregated pools of engine cores whose size changes in virtual time (see module docstring)."""

    engines: Mapping[str, EngineConfig]
    router: str = "round_robin"
    seed: int = 0
    collect_fpm: bool = False
    single_step: bool = False
    _workers: list[_Worker] = field(default_factory=list)
    _queue: dict[str, list[tuple[TraceRequest, RequestRecord]]] = field(default_factory=dict)
    _rr: dict[str, int] = field(default_factory=dict)
    _now_ms: float = 0.0

    def __post_init__(self) -> None:
        problems = []
        for pool in self.engines:
            if pool != "agg":
                problems.append(f"pool {pool!r}: this interim fleet drives aggregated pools only (expected 'agg'); "
                                "disaggregated pools need mocker.fleet.Fleet")
        if self.router not in ROUTING:
            problems.append(f"router={self.router!r}: expected one of {', '.join(ROUTING)}")
        if problems:
            raise SimulationConfigError(problems)
        for cfg in self.engines.values():
            cfg.validate()
        self._queue = {p: [] for p in self.engines}
        self._rr = {p: 0 for p in self.engines}

    # ------------------------------------------------------------------ connector side
    def add_worker(self, pool: str, now_ms: float, startup_delay_ms: float = 0.0) -> int:
        """Request a worker at ``now_ms``; routable from ``now_ms + startup_delay_ms``. Returns its id."""
        self.advance_until(now_ms)
        wid = len(self._workers)
        core = make_engine(self.engines[pool], worker_id=wid, collect_fpm=self.collect_fpm)
        w = _Worker(wid, pool, core, float(now_ms), float(now_ms) + float(startup_delay_ms))
        self._workers.append(w)
        if startup_delay_ms <= 0:
            self._make_ready(w)
        return wid

    def remove_worker(self, pool: str, now_ms: float, worker_id: int | None = None) -> int:
        """Remove a worker of ``pool`` (a starting one first, else the ready one holding the least work).

        Raises SimulationConfigError when the pool has no starting or ready worker (or ``worker_id`` is not one).
        """
        self.advance_until(now_ms)
        cands = [w for w in self._workers if w.pool == pool and w.state in ("starting", "ready")
                 and (worker_id is None or w.worker_id == worker_id)]
        if not cands:
            raise SimulationConfigError(f"remove_worker: pool {pool!r} has no starting or ready worker"
                                        + (f" with id {worker_id}" if worker_id is not None else ""))
        starting = [w for w in cands if w.state == "starting"]
        if starting:
            w = max(starting, key=lambda x: (x.ready_ms, x.worker_id))
            w.state, w.released_ms = "released", float(now_ms)
            return w.worker_id
        w = min(cands, key=lambda x: (x.core.num_waiting + x.core.num_running, -x.worker_id))
        w.state = "draining"
        self._maybe_release(w, float(now_ms))
        return w.worker_id

    # ------------------------------------------------------------------ traffic side
    def submit(self, req: TraceRequest, now_ms: float) -> RequestRecord:
        """Route ``req`` arriving at ``now_ms`` to a ready worker of the (single) pool, or queue it."""
        self.advance_until(now_ms)
        pool = next(iter(self.engines))
        rec = RequestRecord(request_id=req.request_id, arrival_ms=float(now_ms), input_length=req.input_length,
                            output_length=req.output_length)
        ready = [w for w in self._workers if w.pool == pool and w.state == "ready"]
        if not ready:
            self._queue[pool].append((req, rec))
            return rec
        self._route(pool, ready, req, rec, float(now_ms))
        return rec

    def _route(self, pool: str, ready: list[_Worker], req: TraceRequest, rec: RequestRecord, now_ms: float) -> None:
        if self.router == "round_robin":
            w = ready[self._rr[pool] % len(ready)]
            self._rr[pool] += 1
        else:
            w = min(ready, key=lambda x: (x.core.num_waiting + x.core.num_running, x.worker_id))
        w.core.advance_until(now_ms) if not self.single_step else w.core.advance_single_step(now_ms)
        w.core.add_request(req, now_ms, rec)

    def _make_ready(self, w: _Worker) -> None:
        w.state = "ready"
        q = self._queue[w.pool]
        if q:
            ready = [x for x in self._workers if x.pool == w.pool and x.state == "ready"]
            for req, rec in q:
                self._route(w.pool, ready, req, rec, w.ready_ms)
            q.clear()

    def _maybe_release(self, w: _Worker, now_ms: float) -> None:
        if w.state == "draining" and not w.core.has_work():
            w.state = "released"
            w.released_ms = now_ms

    def advance_until(self, t_ms: float) -> None:
        """Run every worker up to ``t_ms``, making workers ready (and dispatching the fleet queue) on time."""
        if t_ms < self._now_ms:
            return
        while True:
            due = [w for w in self._workers if w.state == "starting" and w.ready_ms <= t_ms]
            if not due:
                break
            w = min(due, key=lambda x: (x.ready_ms, x.worker_id))
            self._advance_all(w.ready_ms)
            self._make_ready(w)
        self._advance_all(t_ms)

    def _advance_all(self, t_ms: float) -> None:
        self._now_ms = max(self._now_ms, t_ms)
        for w in self._workers:
            if w.state in ("ready", "draining"):
                if self.single_step:
                    w.core.advance_single_step(t_ms)
                else:
                    w.core.advance_until(t_ms)
                if w.state == "draining" and not w.core.has_work():
                    w.state = "released"
                    w.released_ms = max(w.core.next_pass_ms, 0.0)

    def finish(self) -> None:
        """Run every worker until it is idle and fill the records' token times."""
        for w in self._workers:
            if w.state == "starting":  # never became ready before the end: nothing routed to it
                continue
            w.core.advance_until(float("inf"))
            if w.state == "draining":
                w.state, w.released_ms = "released", w.core.next_pass_ms
            w.core.finalize()

    # ------------------------------------------------------------------ observation side
    def take_fpm(self, max_per_worker: int | None = None) -> list[tuple[str, ForwardPassMetrics]]:
        """(pool, pass) of the passes run since the previous call (empty unless collect_fpm); with
        ``max_per_worker``, only each worker's most recent ones."""
        out: list[tuple[str, ForwardPassMetrics]] = []
        for w in self._workers:
            fpm = w.core.fpm
            n = len(fpm)
            if n > w.fpm_seen:
                lo = w.fpm_seen if max_per_worker is None else max(w.fpm_seen, n - max_per_worker)
                out.extend((w.pool, fpm[k]) for k in range(lo, n))
                w.fpm_seen = n
        return out

    def pool_counts(self, pool: str) -> PoolCounts:
        ws = [w for w in self._workers if w.pool == pool]
        return PoolCounts(requested=sum(w.state in ("starting", "ready") for w in ws),
                          ready=sum(w.state == "ready" for w in ws),
                          draining=sum(w.state == "draining" for w in ws),
                          queued_at_fleet=len(self._queue.get(pool, ())))

    def engine_states(self, pool: str) -> list[EngineState]:
        out = []
        for w in self._workers:
            if w.pool == pool and w.state == "ready":
                c = w.core
                out.append(EngineState(w.worker_id, c.num_waiting, c.num_running, c.active_blocks() / c.num_blocks))
        return out

    def gpu_seconds(self, now_ms: float, gpus_per_worker: Mapping[str, int] | None = None) -> dict[str, float]:
        """GPU-seconds per pool: every worker from its request until its release (or ``now_ms``)."""
        out = {p: 0.0 for p in self.engines}
        for w in self._workers:
            end = w.released_ms if w.released_ms is not None else now_ms
            g = (gpus_per_worker or {}).get(w.pool, 1)
            out[w.pool] += max(0.0, end - w.requested_ms) / 1000.0 * g
        return out

    def worker_spans(self) -> list[tuple[str, int, float, float, float | None]]:
        """(pool, worker_id, requested_ms, ready_ms, released_ms) of every worker ever requested."""
        return [(w.pool, w.worker_id, w.requested_ms, w.ready_ms, w.released_ms) for w in self._workers]


class PooledFleet:
    """Adapter of ``mocker.fleet.Fleet`` (pooled, aggregated or disaggregated) to this module's API:
    :class:`EngineState` per ready engine, ``take_fpm(max_per_worker)``, ``worker_spans()``."""

    def __init__(self, fleet: Any) -> None:
        self.fleet = fleet

    def add_worker(self, pool: str, now_ms: float, startup_delay_ms: float = 0.0) -> int:
        return int(self.fleet.add_worker(pool, now_ms, startup_delay_ms))

    def remove_worker(self, pool: str, now_ms: float, worker_id: int | None = None) -> int:
        return int(self.fleet.remove_worker(pool, now_ms, worker_id))

    def submit(self, req: TraceRequest, now_ms: float) -> RequestRecord:
        return self.fleet.submit(req, now_ms)  # type: ignore[no-any-return]

    def advance_until(self, t_ms: float) -> None:
        self.fleet.advance_until(t_ms)

    def finish(self) -> None:
        self.fleet.finish()

    def take_fpm(self, max_per_worker: int | None = None) -> list[tuple[str, ForwardPassMetrics]]:
        return list(self.fleet.take_fpm())

    def pool_counts(self, pool: str) -> PoolCounts:
        c = self.fleet.pool_counts(pool)
        return PoolCounts(c.requested, c.ready, c.draining, c.queued_at_fleet)

    def engine_states(self, pool: str) -> list[EngineState]:
        return [EngineState(e.worker_id, e.num_waiting, e.num_running, e.kv_usage) for e in self.fleet.engine_states(pool)]

    def gpu_seconds(self, now_ms: float, gpus_per_worker: Mapping[str, int] | None = None) -> dict[str, float]:
        return dict(self.fleet.gpu_seconds(now_ms, dict(gpus_per_worker or {}) or None))

    def worker_spans(self) -> list[tuple[str, int, float, float, float | None]]:
        out = []
        for name, p in self.fleet.pools.items():
            for w in p.workers:
                out.append((name, int(w.worker_id), float(w.requested_ms), float(w.ready_ms), w.released_ms))
        return out


def pooled_fleet_available() -> bool:
    """True when ``mocker.fleet.Fleet`` (developer G's pooled fleet) can be imported."""
    try:
        from mocker.fleet import Fleet  # noqa: F401
    except ImportError:
        return False
    return True


def make_fleet(engines: Mapping[str, EngineConfig], *, router: str = "round_robin", seed: int = 0,
               collect_fpm: bool = False, single_step: bool = False, transfer: Any = None) -> Any:
    """The pooled fleet for ``engines`` ({"agg": cfg} or {"prefill": cfg, "decode": cfg}): ``mocker.fleet.Fleet``
    when available (aggregated and disaggregated), else the interim :class:`DynamicFleet` (aggregated only)."""
    if pooled_fleet_available():
        from mocker.fleet import Fleet

        kw: dict[str, Any] = {"transfer": transfer} if transfer is not None else {}
        return PooledFleet(Fleet(dict(engines), router=router, seed=seed, collect_fpm=collect_fpm,
                                 single_step=single_step, **kw))
    return DynamicFleet(dict(engines), router=router, seed=seed, collect_fpm=collect_fpm, single_step=single_step)


__all__ = ["DynamicFleet", "EngineState", "PoolCounts", "PooledFleet", "ROUTING", "make_fleet", "pooled_fleet_available"]
