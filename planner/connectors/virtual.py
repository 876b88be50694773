"""VirtualConnector: the planner publishes decisions over HTTP; an external system applies them.

Protocol (docs/architecture.md "VirtualConnector protocol"; OpenAPI: ``docs/virtual-connector.openapi.yaml``).
Served by the planner's own HTTP server under ``/v1/virtual``; every route needs
``Authorization: Bearer <token>`` when a token is configured (401 otherwise).

- ``GET  /v1/virtual/decision`` -> 200 :class:`DecisionInfo` JSON (``decision_id`` null before the first)
- ``GET  /v1/virtual/decision/wait?after=ID&timeout_s=T`` -> 200 with the decision as soon as its
  ``decision_id`` > ID (long poll, T <= 300 s, default 30), 204 when none came within T
- ``POST /v1/virtual/decision/{id}/complete`` body ``{"replicas": {pool: n}}`` (optional: what is now
  running; defaults to the decision's targets) -> 200 ``{"acknowledged_id": id}``; 409 when ``id`` is
  not the latest published decision or was already completed; 400 on a malformed body.
- ``PUT  /v1/virtual/replicas`` body ``{"replicas": {pool: n}}``: the external system reports a change
  it made on its own (manual edit); the planner adopts it (``adopted_external_change``).

The planner makes no new decision while one is unacknowledged (the core's pending guard:
``hold_pending``); after ``pending_timeout_s`` (default 1800 s, :class:`planner.core.PlannerConfig`) it
re-plans with reason ``pending_timeout_replan`` and logs a warning.

Decision ids only increase, also across planner restarts when ``state_file`` is set (the current state
is persisted there and reloaded).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler

from dynoplan.errors import DynoplanError, VirtualConnectorError
from planner.core import PoolState

log = logging.getLogger("dynoplan.virtual")

PREFIX = "/v1/virtual"
MAX_WAIT_S = 300.0


@dataclass
class DecisionInfo:
    """What the planner currently asks for.

    ``decision_id``: latest published id (None before the first); ``targets``: replicas per pool;
    ``reason``: the decision's main reason; ``published_at_s``: Unix seconds; ``acknowledged_id``: the
    last id the external system completed; ``replicas``: replicas the external system last reported.
    """

    decision_id: int | None = None
    targets: dict[str, int] | None = None
    reason: str | None = None
    published_at_s: float | None = None
    acknowledged_id: int | None = None
    replicas: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class VirtualConnector:
    """Server side. ``pools`` and ``initial`` replicas; ``token`` (None = open); ``state_file`` (None =
    in memory only)."""

    def __init__(
        self,
        pools: tuple[str, ...],
        initial: Mapping[str, int],
        token: str | None = None,
        state_file: str | Path | None = None,
    ) -> None:
        self.pools = pools
        self.token = token
        self.state_file = Path(state_file) if state_file else None
        self.info = DecisionInfo(replicas={p: int(initial.get(p, 1)) for p in pools})
        self._id_base = 0
        self._cond: asyncio.Condition | None = None
        if self.state_file and self.state_file.exists():
            try:
                d = json.loads(self.state_file.read_text())
                self.info = DecisionInfo(**d)
                self._id_base = int(self.info.decision_id or 0)
            except (ValueError, TypeError) as e:
                raise DynoplanError(f"{self.state_file}: cannot read VirtualConnector state: {e}") from None

    # ---------------------------------------------------------------- ids
    def to_wire_id(self, core_id: int) -> int:
        """Core decision ids restart at 1 with the process; wire ids continue after the persisted ones."""
        return self._id_base + core_id

    def _save(self) -> None:
        if self.state_file:
            tmp = self.state_file.with_name(self.state_file.name + ".tmp")
            tmp.write_text(json.dumps(self.info.to_dict()))
            tmp.replace(self.state_file)

    def _notify(self) -> None:
        if self._cond is not None:

            async def n() -> None:
                assert self._cond is not None
                async with self._cond:
                    self._cond.notify_all()

            asyncio.get_running_loop().create_task(n())

    # ---------------------------------------------------------------- connector surface
    async def start(self) -> None:
        self._cond = asyncio.Condition()

    async def close(self) -> None:
        pass

    async def observe(self) -> dict[str, PoolState] | None:
        return {p: PoolState(int(self.info.replicas.get(p, 0))) for p in self.pools}

    async def apply(self, targets: Mapping[str, int], decision_id: int, reason: str) -> None:
        self.info.decision_id = self.to_wire_id(decision_id)
        self.info.targets = {p: int(n) for p, n in targets.items()}
        self.info.reason = reason
        self.info.published_at_s = time.time()
        self._save()
        self._notify()

    def applied_decision_id(self) -> int | None:
        """The acknowledged id in core numbering (None before any acknowledgement this run)."""
        a = self.info.acknowledged_id
        if a is None or a <= self._id_base:
            return None
        return a - self._id_base

    def fpm_endpoints(self) -> dict[str, str]:
        return {}

    # ---------------------------------------------------------------- HTTP
    def _authorized(self, request: web.Request) -> bool:
        if not self.token:
            return True
        got = request.headers.get("Authorization", "")
        return hmac.compare_digest(got.encode(), f"Bearer {self.token}".encode())

    @web.middleware
    async def _auth(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path.startswith(PREFIX) and not self._authorized(request):
            return web.json_response(
                {"error": "unauthorized: expected Authorization: Bearer <token>"},
                status=401,
                headers={"WWW-Authenticate": "Bearer"},
            )
        return await handler(request)

    def add_routes(self, app: web.Application) -> None:
        app.middlewares.append(self._auth)
        app.router.add_get(PREFIX + "/decision", self._get)
        app.router.add_get(PREFIX + "/decision/wait", self._wait)
        app.router.add_post(PREFIX + "/decision/{id}/complete", self._complete)
        app.router.add_put(PREFIX + "/replicas", self._put_replicas)

    async def _get(self, request: web.Request) -> web.Response:
        return web.json_response(self.info.to_dict())

    async def _wait(self, request: web.Request) -> web.Response:
        raw_after, raw_t = request.query.get("after", "0"), request.query.get("timeout_s", "30")
        try:
            after = int(raw_after)
        except ValueError:
            return web.json_response(
                {"error": f"after={raw_after!r}: expected an integer (last decision id seen)"}, status=400
            )
        try:
            timeout_s = float(raw_t)
            if not 0 <= timeout_s <= MAX_WAIT_S:
                raise ValueError
        except ValueError:
            return web.json_response(
                {"error": f"timeout_s={raw_t!r}: expected seconds from 0 to {MAX_WAIT_S:g}"}, status=400
            )
        assert self._cond is not None

        def newer() -> bool:
            return self.info.decision_id is not None and self.info.decision_id > after

        try:
            async with self._cond:
                await asyncio.wait_for(self._cond.wait_for(newer), timeout_s)
        except TimeoutError:
            return web.Response(status=204)
        return web.json_response(self.info.to_dict())

    def _replicas_from(self, body: Any) -> dict[str, int] | str:
        reps = body.get("replicas") if isinstance(body, dict) else None
        if not isinstance(reps, dict):
            return 'expected {"replicas": {pool: integer >= 0}}'
        out = {}
        for p, n in reps.items():
            if p not in self.pools:
                return f"replicas.{p}: unknown pool (expected one of {', '.join(self.pools)})"
            if not (isinstance(n, int) and not isinstance(n, bool) and n >= 0):
                return f"replicas.{p}={n!r}: expected an integer >= 0"
            out[p] = n
        return out

    async def _complete(self, request: web.Request) -> web.Response:
        try:
            did = int(request.match_info["id"])
        except ValueError:
            return web.json_response({"error": "decision id: expected an integer"}, status=400)
        if self.info.decision_id is None or did != self.info.decision_id:
            return web.json_response(
                {"error": f"decision {did} is not the latest ({self.info.decision_id})"}, status=409
            )
        if self.info.acknowledged_id == did:
            return web.json_response({"error": f"decision {did} already completed"}, status=409)
        reps: dict[str, int] = dict(self.info.targets or {})
        if request.can_read_body:
            try:
                body = await request.json()
            except ValueError:
                return web.json_response({"error": "body: expected JSON"}, status=400)
            if body:
                parsed = self._replicas_from(body)
                if isinstance(parsed, str):
                    return web.json_response({"error": parsed}, status=400)
                reps = parsed
        self.info.replicas.update(reps)
        self.info.acknowledged_id = did
        self._save()
        self._notify()
        return web.json_response({"acknowledged_id": did})

    async def _put_replicas(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except ValueError:
            return web.json_response({"error": "body: expected JSON"}, status=400)
        reps = self._replicas_from(body)
        if isinstance(reps, str):
            return web.json_response({"error": reps}, status=400)
        self.info.replicas.update(reps)
        self._save()
        return web.json_response(self.info.to_dict())


class VirtualConnectorClient:
    """Blocking Python client of the protocol (``requests``). ``base_url`` = the planner's URL.

    Raises :class:`VirtualConnectorError` on an HTTP error answer (401, 409, 400...) and, with ``status`` 0,
    when the planner cannot be reached (so one ``except VirtualConnectorError`` covers a restarting planner).
    """

    def __init__(self, base_url: str, token: str | None = None, timeout_s: float = 10.0) -> None:
        import requests

        self.base = base_url.rstrip("/") + PREFIX
        self.timeout_s = timeout_s
        self.session = requests.Session()
        if token:
            self.session.headers["Authorization"] = f"Bearer {token}"

    def _send(self, method: str, url: str, **kw: Any) -> Any:
        import requests

        try:
            r = self.session.request(method, url, **kw)
        except requests.RequestException as e:
            kind = "no answer in time" if isinstance(e, requests.Timeout) else "cannot connect"
            raise VirtualConnectorError(0, f"{kind}: {self.base.removesuffix(PREFIX)} ({type(e).__name__})") from None
        return self._check(r)

    def _check(self, r: Any) -> Any:
        if r.status_code >= 400:
            try:
                msg = r.json().get("error", r.text)
            except ValueError:
                msg = r.text
            raise VirtualConnectorError(r.status_code, msg)
        return r

    def get(self) -> DecisionInfo:
        """The current decision (``decision_id`` None before the first)."""
        return DecisionInfo(**self._send("GET", self.base + "/decision", timeout=self.timeout_s).json())

    def wait(self, after: int | None = None, timeout_s: float = 30.0) -> DecisionInfo | None:
        """Long-poll until a decision newer than ``after`` (default: the current one) exists; None on
        timeout."""
        if after is None:
            after = self.get().decision_id or 0
        r = self._send(
            "GET",
            self.base + "/decision/wait",
            params={"after": after, "timeout_s": timeout_s},
            timeout=timeout_s + self.timeout_s,
        )
        return None if r.status_code == 204 else DecisionInfo(**r.json())

    def complete(self, decision_id: int, replicas: Mapping[str, int] | None = None) -> int:
        """Report ``decision_id`` applied (``replicas``: what now runs; default its targets)."""
        body = {"replicas": dict(replicas)} if replicas is not None else {}
        r = self._send("POST", f"{self.base}/decision/{decision_id}/complete", json=body, timeout=self.timeout_s)
        return int(r.json()["acknowledged_id"])

    def report_replicas(self, replicas: Mapping[str, int]) -> DecisionInfo:
        """Report a change made outside the planner (it adopts it)."""
        return DecisionInfo(
            **self._send(
                "PUT", self.base + "/replicas", json={"replicas": dict(replicas)}, timeout=self.timeout_s
            ).json()
        )
