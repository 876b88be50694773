"""The operator's driver of the live dashboard (:mod:`planner.dashboard`, the page ``dynoplan up``
serves): one page per DynoPlanner, on ``dashboard_port`` (default 8090), reached with
``kubectl port-forward svc/<release>-dynoplan-operator 8090``.

- ``GET /?planner=<namespace>/<name>``: the page (``?planner=`` may be left out while the operator runs
  exactly one planner);
- ``GET /api/state?planner=...``: the page's state, recorded by that planner's loop
  (:attr:`planner.operator.loop.PlannerLoop.history`); 404 naming the running planners otherwise;
- ``GET /api/planners``: ``{"planners": ["ns/name", ...]}``.

The server runs on kopf's event loop (started in the startup handler, stopped in cleanup) and reads the
loops from ``memo.loops`` only.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from planner.dashboard import add_routes

log = logging.getLogger("dynoplan.operator.dashboard")


def _key(request: web.Request, loops: Mapping[tuple[str, str], Any]) -> tuple[str, str] | str:
    """The (namespace, name) the request selects, or why it selects none."""
    want = request.query.get("planner", "")
    if not want:
        if len(loops) == 1:
            return next(iter(loops))
        return f"{len(loops)} planners run here; choose one with ?planner=<namespace>/<name>: " + ", ".join(
            sorted("/".join(k) for k in loops)
        )
    ns, _, name = want.partition("/")
    if (ns, name) not in loops:
        return (
            f"planner {want!r} is not running here (running: "
            + (", ".join(sorted("/".join(k) for k in loops)) or "none")
            + ")"
        )
    return (ns, name)


def make_app(loops: Mapping[tuple[str, str], Any]) -> web.Application:
    """The dashboard app over ``loops`` ((namespace, name) -> PlannerLoop, live view)."""

    async def state_of(request: web.Request) -> dict[str, Any] | str:
        key = _key(request, loops)
        if isinstance(key, str):
            return key
        st = loops[key].dashboard_state()
        return st if st is not None else f"planner {key[0]}/{key[1]} has not read its spec yet"

    async def planners(request: web.Request) -> web.Response:
        return web.json_response({"planners": sorted("/".join(k) for k in loops)})

    app = web.Application()
    add_routes(app, state_of)
    app.router.add_get("/api/planners", planners)
    return app


async def start(loops: Mapping[tuple[str, str], Any], port: int, host: str = "0.0.0.0") -> web.AppRunner:
    """Serve :func:`make_app` on ``host:port``; returns the runner (``await runner.cleanup()`` stops it)."""
    runner = web.AppRunner(make_app(loops), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    log.info("dashboard on port %s", port)
    return runner
