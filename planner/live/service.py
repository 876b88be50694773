"""The long-running planner on the wall clock: tick the core, feed it, apply, serve state and dashboard.

One asyncio loop runs

- the tick loop: ``now = clock()``; build :class:`~planner.core.Observations` from the connector
  (pools: spec and ready), the traffic source (throughput loop; read in a worker thread, ``None`` when
  unknown) and the FPM subscriber (passes since the previous tick); ``Planner.tick`` (in a worker
  thread: model fits can take a fraction of a second); publish the decision through the connector;
  sleep until ``next_tick_s``. A decision that is abandoned after ``pending_timeout_s`` is logged as a
  warning with its reason (``pending_timeout_replan``);
- a sampler (every ``sample_s``, default 0.5 s) recording replicas (spec / ready) per pool and the
  engines' latest queues for the dashboard, and exporting them as gauges;
- the HTTP server: ``GET /`` (dashboard), ``/static/plotly.min.js`` (from the installed ``plotly``
  package: no network), ``GET /api/state`` (JSON, :meth:`PlannerService.state`), ``GET /metrics``
  (planner gauges, :class:`planner.core.metrics.PlannerMetrics`, plus ``dynoplan_planner_replicas``
  {pool, kind=spec|ready} and counters of ticks/unknown reads), ``GET /health``, and the
  VirtualConnector routes when that connector is used.

The clock is injected (``clock``, default ``time.time``); times in the state JSON are Unix seconds.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
import time
from pathlib import Path
from typing import Any, Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, generate_latest

from planner.core import Observations, Planner, TickResult
from planner.core.metrics import PlannerMetrics
from planner.core.reasons import Reason
from planner.live.dashboard import DASHBOARD_HTML, plotly_js_path

log = logging.getLogger("dynoplan.planner")


def _f(x: Any) -> Any:
    """JSON-safe float (NaN/inf -> None)."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


class PlannerService:
    """See the module docstring. ``connector``: a :mod:`planner.connectors` object; ``traffic``: an object
    with ``read(window_s) -> TrafficWindow | None`` (blocking) or None; ``fpm``: an
    :class:`~planner.sources.fpm.FpmSubscriber` or None."""

    def __init__(self, planner: Planner, connector: Any, traffic: Any = None, fpm: Any = None,
                 host: str = "127.0.0.1", port: int = 8090, clock: Callable[[], float] = time.time,
                 sample_s: float = 0.5, history_points: int = 3600, poll_ms: int = 1000) -> None:
        self.planner = planner
        self.cfg = planner.config
        self.connector = connector
        self.traffic = traffic
        self.fpm = fpm
        self.host, self.port = host, port
        self.clock = clock
        self.sample_s = sample_s
        self.poll_ms = poll_ms
        self.started_s = clock()
        self.registry = CollectorRegistry()
        self.metrics = PlannerMetrics(self.registry)
        self.g_replicas = Gauge("dynoplan_planner_replicas", "Replicas per pool as the connector reports them "
                                "(kind=spec: requested, kind=ready: serving)", ["pool", "kind"], registry=self.registry)
        self.c_ticks = Counter("dynoplan_planner_ticks", "Planner ticks run", registry=self.registry)
        self.c_unknown = Counter("dynoplan_planner_traffic_unknown", "Throughput reads that were unknown",
                                 registry=self.registry)
        self.c_timeouts = Counter("dynoplan_planner_pending_timeouts", "Decisions abandoned after pending_timeout_s",
                                  registry=self.registry)
        self.samples: collections.deque[dict[str, Any]] = collections.deque(maxlen=history_points)
        self.ticks: collections.deque[dict[str, Any]] = collections.deque(maxlen=history_points)
        self.decisions: collections.deque[dict[str, Any]] = collections.deque(maxlen=200)
        self.last_result: TickResult | None = None
        self.last_pools: dict[str, Any] | None = None
        self.engines: list[dict[str, Any]] = []
        self.traffic_error: str | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._runner: web.AppRunner | None = None

    # ------------------------------------------------------------------ loops
    async def _observe(self) -> Observations:
        pools = await self.connector.observe()
        traffic = None
        if self.cfg.throughput_enabled and self.traffic is not None:
            traffic = await asyncio.to_thread(self.traffic.read, self.cfg.adjustment_interval_s)
            err = getattr(self.traffic, "last_error", None) if traffic is None else None
            if err != self.traffic_error:  # log each change once (a dead Prometheus is not a warning per tick)
                if err:
                    log.warning("traffic unknown (the throughput loop holds): %s", err)
                elif self.traffic_error:
                    log.info("traffic known again")
            self.traffic_error = err
        passes: tuple[Any, ...] = ()
        ok = True
        if self.fpm is not None:
            self.fpm.set_endpoints(self.connector.fpm_endpoints())
            passes = self.fpm.drain()
            ok = bool(self.fpm.ok)
        return Observations(pools=pools, traffic=traffic, passes=passes, passes_ok=ok,
                            applied_decision_id=self.connector.applied_decision_id())

    async def tick_once(self, now_s: float) -> TickResult:
        obs = await self._observe()
        result = await asyncio.to_thread(self.planner.tick, now_s, obs)
        self.c_ticks.inc()
        d = result.decision
        diag = result.diagnostics
        if "throughput" in diag.loops_run and obs.traffic is None:
            self.c_unknown.inc()
        if Reason.PENDING_TIMEOUT_REPLAN in d.reasons:
            self.c_timeouts.inc()
            log.warning("decision %s was not applied within pending_timeout_s=%ss; re-planning (reason %s)",
                        diag.pending_decision_id, self.cfg.pending_timeout_s, Reason.PENDING_TIMEOUT_REPLAN.value)
        if d.targets is not None and d.decision_id is not None:
            await self.connector.apply(d.targets, d.decision_id, d.reason.value)
            self.decisions.append({"t": now_s, "decision_id": d.decision_id, "targets": dict(d.targets),
                                   "from": dict(diag.current_replicas or {}), "reason": d.reason.value,
                                   "reasons": [r.value for r in d.reasons]})
            log.info("decision %s: %s -> %s (%s)", d.decision_id, dict(diag.current_replicas or {}), dict(d.targets),
                     ", ".join(r.value for r in d.reasons))
        self.metrics.update(result)
        obs_t = diag.observed
        self.ticks.append({
            "t": now_s, "loops": list(diag.loops_run), "reason": d.reason.value,
            "observed_rps": _f(obs_t.requests_per_second) if obs_t is not None else None,
            "observed_ttft_ms": _f(obs_t.mean_ttft_ms) if obs_t is not None else None,
            "observed_itl_ms": _f(obs_t.mean_itl_ms) if obs_t is not None else None,
            "predicted_rps": _f(diag.predicted_requests_per_second),
            "estimated_ttft_ms": _f(diag.estimated_ttft_ms), "estimated_itl_ms": _f(diag.estimated_itl_ms),
            "throughput_replicas": dict(diag.throughput_replicas),
        })
        self.last_result = result
        return result

    async def _tick_loop(self) -> None:
        now = self.clock()
        while True:
            try:
                result = await self.tick_once(now)
                nxt = result.next_tick_s
            except Exception:  # noqa: BLE001 - a failed tick is logged; the service keeps running
                log.exception("planner tick failed")
                nxt = now + self.cfg.load_adjustment_interval_s
            await asyncio.sleep(max(0.0, nxt - self.clock()))
            now = max(self.clock(), nxt)

    async def sample(self) -> None:
        """Record replicas per pool and engine queues once (also exported as gauges)."""
        pools = await self.connector.observe()
        t = self.clock()
        if pools is not None:
            self.last_pools = {p: {"spec": s.replicas, "ready": s.ready_replicas} for p, s in pools.items()}
            for p, s in pools.items():
                self.g_replicas.labels(p, "spec").set(s.replicas)
                self.g_replicas.labels(p, "ready").set(s.ready_replicas if s.ready_replicas is not None else s.replicas)
        self.samples.append({"t": t, "pools": self.last_pools if pools is not None else None})
        if self.fpm is not None:
            self.fpm.set_endpoints(self.connector.fpm_endpoints())  # follow the fleet between ticks too
            self.engines = [{
                "worker_id": wid, "dp_rank": rank, "pool": p.pool,
                "running_prefill": p.scheduled_requests.num_prefill_requests,
                "running_decode": p.scheduled_requests.num_decode_requests,
                "queued_prefill": p.queued_requests.num_prefill_requests,
                "queued_prefill_tokens": p.queued_requests.sum_prefill_tokens,
                "queued_decode": p.queued_requests.num_decode_requests,
                "wall_time_ms": p.wall_time * 1000.0,
            } for (wid, rank), p in sorted(self.fpm.latest().items())]

    async def _sample_loop(self) -> None:
        while True:
            try:
                await self.sample()
            except Exception:  # noqa: BLE001
                log.exception("sampling failed")
            await asyncio.sleep(self.sample_s)

    # ------------------------------------------------------------------ state
    def state(self) -> dict[str, Any]:
        """The dashboard's data (JSON-safe): targets, current pools, time series, decisions, engines."""
        cfg = self.cfg
        last = self.last_result
        return {
            "now_s": self.clock(), "started_s": self.started_s,
            "config": {"mode": cfg.mode, "pools": list(cfg.pools), "ttft_ms": cfg.ttft_ms, "itl_ms": cfg.itl_ms,
                       "adjustment_interval_s": cfg.adjustment_interval_s,
                       "load_adjustment_interval_s": cfg.load_adjustment_interval_s,
                       "throughput_enabled": cfg.throughput_enabled, "load_enabled": cfg.load_enabled,
                       "pending_timeout_s": cfg.pending_timeout_s, "poll_ms": self.poll_ms},
            "pools": self.last_pools,
            "samples": list(self.samples),
            "ticks": list(self.ticks),
            "decisions": list(self.decisions)[::-1],
            "engines": self.engines,
            "last_reason": last.decision.reason.value if last else None,
            "pending_decision_id": last.diagnostics.pending_decision_id if last else None,
            "traffic_error": self.traffic_error,
            "fleet": self.connector.snapshot() if hasattr(self.connector, "snapshot") else [],
            "fleet_events": list(getattr(self.connector, "events", []))[-50:][::-1],
        }

    # ------------------------------------------------------------------ HTTP
    def make_app(self) -> web.Application:
        app = web.Application()
        if hasattr(self.connector, "add_routes"):
            self.connector.add_routes(app)
        app.router.add_get("/", self._index)
        app.router.add_get("/static/plotly.min.js", self._plotly)
        app.router.add_get("/api/state", self._state)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/health", self._health)
        return app

    async def _index(self, request: web.Request) -> web.Response:
        return web.Response(text=DASHBOARD_HTML, content_type="text/html")

    async def _plotly(self, request: web.Request) -> web.FileResponse:
        return web.FileResponse(plotly_js_path(), headers={"Content-Type": "application/javascript",
                                                          "Cache-Control": "max-age=3600"})

    async def _state(self, request: web.Request) -> web.Response:
        return web.json_response(self.state(), dumps=_dumps)

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "ticks": int(self.c_ticks._value.get())})

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> int:
        """Start the connector, the HTTP server and the loops; returns the bound port."""
        await self.connector.start()
        self._runner = web.AppRunner(self.make_app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        server = site._server
        if server is not None and server.sockets:  # type: ignore[union-attr]
            self.port = server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        await self.sample()
        self._tasks = [asyncio.create_task(self._sample_loop()), asyncio.create_task(self._tick_loop())]
        return self.port

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            try:
                await t
            except (asyncio.CancelledError, Exception):  # noqa: BLE001
                pass
        if self._runner is not None:
            await self._runner.cleanup()
        await self.connector.close()
        if self.fpm is not None:
            self.fpm.close()
        if hasattr(self.traffic, "close"):
            self.traffic.close()


def _dumps(obj: Any) -> str:
    import json

    return json.dumps(_clean(obj), allow_nan=False, default=_json_default)


def _clean(x: Any) -> Any:
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def _json_default(o: Any) -> Any:
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")
