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
import logging
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, generate_latest

from planner.core import Observations, Planner, TickResult
from planner.core.metrics import PlannerMetrics
from planner.core.reasons import Reason
from planner.dashboard import DashboardHistory, add_routes

log = logging.getLogger("dynoplan.planner")


class PlannerService:
    """See the module docstring. ``connector``: a :mod:`planner.connectors` object; ``traffic``: an object
    with ``read(window_s) -> TrafficWindow | None`` (blocking) or None; ``fpm``: an
    :class:`~planner.sources.fpm.FpmSubscriber` or None."""

    def __init__(
        self,
        planner: Planner,
        connector: Any,
        traffic: Any = None,
        fpm: Any = None,
        host: str = "127.0.0.1",
        port: int = 8090,
        clock: Callable[[], float] = time.time,
        sample_s: float = 0.5,
        history_points: int = 3600,
        poll_ms: int = 1000,
    ) -> None:
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
        self.g_replicas = Gauge(
            "dynoplan_planner_replicas",
            "Replicas per pool as the connector reports them (kind=spec: requested, kind=ready: serving)",
            ["pool", "kind"],
            registry=self.registry,
        )
        self.c_ticks = Counter("dynoplan_planner_ticks", "Planner ticks run", registry=self.registry)
        self.c_unknown = Counter(
            "dynoplan_planner_traffic_unknown", "Throughput reads that were unknown", registry=self.registry
        )
        self.c_timeouts = Counter(
            "dynoplan_planner_pending_timeouts", "Decisions abandoned after pending_timeout_s", registry=self.registry
        )
        self.history = DashboardHistory(history_points)  # the dashboard's series (planner.dashboard)
        self.last_result: TickResult | None = None
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
        return Observations(
            pools=pools,
            traffic=traffic,
            passes=passes,
            passes_ok=ok,
            applied_decision_id=self.connector.applied_decision_id(),
        )

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
            log.warning(
                "decision %s was not applied within pending_timeout_s=%ss; re-planning (reason %s)",
                diag.pending_decision_id,
                self.cfg.pending_timeout_s,
                Reason.PENDING_TIMEOUT_REPLAN.value,
            )
        if d.targets is not None and d.decision_id is not None:
            try:
                await self.connector.apply(d.targets, d.decision_id, d.reason.value)
            except Exception:
                self.planner.withdraw(d.decision_id)  # not applied: re-plan next tick, do not hold_pending
                raise
            log.info(
                "decision %s: %s -> %s (%s)",
                d.decision_id,
                dict(diag.current_replicas or {}),
                dict(d.targets),
                ", ".join(r.value for r in d.reasons),
            )
        self.metrics.update(result)
        self.history.record_tick(now_s, result)
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
            for p, s in pools.items():
                self.g_replicas.labels(p, "spec").set(s.replicas)
                self.g_replicas.labels(p, "ready").set(s.ready_replicas if s.ready_replicas is not None else s.replicas)
        self.history.record_sample(t, pools)
        if self.fpm is not None:
            self.fpm.set_endpoints(self.connector.fpm_endpoints())  # follow the fleet between ticks too
            self.history.record_engines(self.fpm.latest())

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
        return self.history.state(
            self.clock(),
            self.started_s,
            self.cfg,
            self.poll_ms,
            self.last_result,
            traffic_error=self.traffic_error,
            fleet=self.connector.snapshot() if hasattr(self.connector, "snapshot") else [],
            fleet_events=list(getattr(self.connector, "events", []))[-50:][::-1],
        )

    # ------------------------------------------------------------------ HTTP
    def make_app(self) -> web.Application:
        app = web.Application()
        if hasattr(self.connector, "add_routes"):
            self.connector.add_routes(app)
        add_routes(app, self._state_of)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/health", self._health)
        return app

    async def _state_of(self, request: web.Request) -> dict[str, Any]:
        return self.state()

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
        if self._runner.addresses:  # (host, port, ...) of the listening socket, any event loop
            self.port = int(self._runner.addresses[0][1])
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
