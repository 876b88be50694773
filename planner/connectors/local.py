"""A local process fleet: applies decisions by starting and stopping ``dynoplan mocker serve`` workers.

State lives in ``state_dir`` so that a restarted planner *adopts* the running fleet instead of
resetting it:

- ``fleet.json``: the spec per pool and every worker (pool, pid, port, url, worker_id, state), written
  atomically *before* a process is started, so whoever stops the stack (``dynoplan up``) can always
  find every worker (no orphans);
- ``workers.txt``: the URLs the frontend routes to (``dynoplan frontend --workers-file``), only workers
  that answered ``/ready`` and are not draining;
- ``prometheus_workers.json``: the same workers as a Prometheus ``file_sd`` target list.

Life of a worker: ``starting`` (process spawned in its own session, polled on ``/ready`` — readiness is
checked, never a fixed sleep; gives up after ``ready_timeout_s``) -> ``ready`` (listed in workers.txt;
``/health`` checked every reconcile, a dead or failing process is dropped and replaced) -> ``draining``
(removed from workers.txt; after the frontend had ``drain_grace_s`` to re-read the file, stopped with
SIGTERM once its ``/info`` shows no outstanding request, or after ``drain_timeout_s``) -> gone.

Pools and worker roles: ``agg`` -> ``--worker-type aggregated``, ``prefill`` -> ``prefill``, ``decode``
-> ``decode``; ``worker_args[pool]`` adds engine flags (speedup ratio, KV blocks, ...).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from dynoplan.errors import ConfigError
from planner.core import PoolState

log = logging.getLogger("dynoplan.local")

WORKER_TYPE = {"agg": "aggregated", "prefill": "prefill", "decode": "decode"}
DYNOPLAN_CMD = (sys.executable, "-m", "planner.cli")


@dataclass(frozen=True, slots=True)
class LocalFleetSettings:
    """Settings of :class:`LocalConnector`.

    - ``state_dir``: directory of fleet.json / workers.txt / logs (created).
    - ``pools``: pools managed (e.g. ``("agg",)`` or ``("prefill", "decode")``).
    - ``worker_args``: extra ``dynoplan mocker serve`` flags per pool.
    - ``model_name``: served model name (default ``mocker``).
    - ``ready_timeout_s`` (60): a starting worker not ready by then is killed and replaced.
    - ``drain_grace_s`` (1.5): time the frontend gets to re-read workers.txt before the outstanding
      count is trusted; must exceed the frontend's ``--poll-s``.
    - ``drain_timeout_s`` (60): a draining worker is stopped after this long even with requests left.
    - ``reconcile_s`` (0.25): period of the reconcile loop.
    - ``health_failures`` (3): consecutive failed health checks before a worker is declared dead.
    - ``command``: how to run ``dynoplan`` (default this Python, ``-m planner.cli``).
    """

    state_dir: Path
    pools: tuple[str, ...] = ("agg",)
    worker_args: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    model_name: str = "mocker"
    ready_timeout_s: float = 60.0
    drain_grace_s: float = 1.5
    drain_timeout_s: float = 60.0
    reconcile_s: float = 0.25
    health_failures: int = 3
    command: tuple[str, ...] = DYNOPLAN_CMD

    def __post_init__(self) -> None:
        bad = [p for p in self.pools if p not in WORKER_TYPE]
        if bad or not self.pools:
            raise ConfigError(f"fleet.pools={list(self.pools)!r}: expected a non-empty list of agg, prefill, decode")
        for n in ("ready_timeout_s", "drain_grace_s", "drain_timeout_s", "reconcile_s"):
            v = getattr(self, n)
            if not (isinstance(v, (int, float)) and v > 0):
                raise ConfigError(f"fleet.{n}={v!r}: expected seconds > 0")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pid_alive(pid: int) -> bool:
    """True while ``pid`` runs. A zombie (exited, not yet reaped by its parent — e.g. a worker adopted
    from another process) counts as dead; our own zombie children are reaped here."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    except ChildProcessError:
        pass
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def read_fleet_file(state_dir: Path) -> dict[str, Any]:
    """The parsed fleet.json (``{"spec": {}, "workers": []}`` when absent or unreadable)."""
    try:
        data = json.loads((Path(state_dir) / "fleet.json").read_text())
        if isinstance(data, dict):
            return data
    except (OSError, ValueError):
        pass
    return {"spec": {}, "workers": [], "next_worker_id": 1}


def stop_pids(pids: list[int], timeout_s: float = 10.0) -> None:
    """SIGTERM each pid's process group, SIGKILL what is left after ``timeout_s`` (used by ``up``)."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(pid_alive(p) for p in pids):
        time.sleep(0.05)
    for pid in pids:
        if pid_alive(pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)


@dataclass
class WorkerProc:
    name: str
    pool: str
    worker_id: int
    port: int
    pid: int
    state: str = "starting"
    """starting | ready | draining"""
    started_s: float = 0.0
    drain_since_s: float = 0.0
    fpm_endpoint: str | None = None
    failures: int = 0
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "pool": self.pool,
            "worker_id": self.worker_id,
            "port": self.port,
            "pid": self.pid,
            "url": self.url,
            "state": self.state,
            "started_s": self.started_s,
            "fpm_endpoint": self.fpm_endpoint,
        }


class LocalConnector:
    """The local fleet manager (see the module docstring). All methods run on one asyncio loop."""

    def __init__(self, settings: LocalFleetSettings, initial: Mapping[str, int] | None = None) -> None:
        self.s = settings
        self.dir = Path(settings.state_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "logs").mkdir(exist_ok=True)
        self.workers_file = self.dir / "workers.txt"
        self.spec: dict[str, int] = {}
        self.workers: list[WorkerProc] = []
        self.next_worker_id = 1
        self.initial = dict(initial or {})
        self.events: list[dict[str, Any]] = []
        """Fleet events (started, ready, died, draining, stopped) for the dashboard; newest last."""
        self.adopted = 0
        self._http: aiohttp.ClientSession | None = None
        self._task: asyncio.Task[None] | None = None
        self._last_ok = True

    # ------------------------------------------------------------------ state
    def _save(self) -> None:
        write_atomic(
            self.dir / "fleet.json",
            json.dumps(
                {
                    "spec": self.spec,
                    "next_worker_id": self.next_worker_id,
                    "workers": [w.to_dict() for w in self.workers],
                },
                indent=1,
            ),
        )
        listed = [w for w in self.workers if w.state == "ready"]
        text = "".join(w.url + "\n" for w in sorted(listed, key=lambda w: w.worker_id))
        if not self.workers_file.exists() or self.workers_file.read_text() != text:
            write_atomic(self.workers_file, text)
        write_atomic(
            self.dir / "prometheus_workers.json",
            json.dumps([{"targets": [f"127.0.0.1:{w.port}" for w in listed], "labels": {"job": "workers"}}]),
        )

    def _event(self, kind: str, w: WorkerProc, **extra: Any) -> None:
        e = {"t": time.time(), "event": kind, "worker": w.name, "pool": w.pool, **extra}
        self.events.append(e)
        del self.events[:-200]
        log.info("worker %s (%s): %s %s", w.name, w.pool, kind, extra or "")

    def _adopt(self) -> None:
        data = read_fleet_file(self.dir)
        self.next_worker_id = int(data.get("next_worker_id", 1))
        spec = {p: int(v) for p, v in (data.get("spec") or {}).items() if p in self.s.pools}
        for d in data.get("workers", []):
            if d.get("pool") in self.s.pools and pid_alive(int(d["pid"])):
                w = WorkerProc(
                    d["name"],
                    d["pool"],
                    int(d["worker_id"]),
                    int(d["port"]),
                    int(d["pid"]),
                    d.get("state", "starting"),
                    float(d.get("started_s", time.time())),
                    time.time() if d.get("state") == "draining" else 0.0,
                    d.get("fpm_endpoint"),
                )
                self.workers.append(w)
                self.adopted += 1
        for p in self.s.pools:
            if p not in spec:
                spec[p] = self.initial.get(p, sum(1 for w in self.workers if w.pool == p and w.state != "draining"))
        self.spec = spec
        self._save()

    # ------------------------------------------------------------------ processes
    def _spawn(self, pool: str) -> WorkerProc:
        wid = self.next_worker_id
        self.next_worker_id += 1
        port = free_port()
        name = f"{pool}-{wid}"
        argv = [
            *self.s.command,
            "mocker",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--worker-id",
            str(wid),
            "--model-name",
            self.s.model_name,
            "--worker-type",
            WORKER_TYPE[pool],
            *self.s.worker_args.get(pool, ()),
        ]
        with open(self.dir / "logs" / f"{name}.log", "ab") as logf:
            proc = subprocess.Popen(
                argv, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
            )
        w = WorkerProc(name, pool, wid, port, proc.pid, "starting", time.time(), proc=proc)
        self.workers.append(w)
        self._save()  # recorded before anything else can happen to it
        self._event("started", w, pid=proc.pid, port=port)
        return w

    def _exited(self, w: WorkerProc) -> bool:
        if w.proc is not None:
            return w.proc.poll() is not None
        return not pid_alive(w.pid)

    def _signal(self, w: WorkerProc, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(w.pid, sig)

    async def _get_json(self, url: str, timeout_s: float = 1.0) -> tuple[int, Any]:
        assert self._http is not None
        try:
            async with self._http.get(url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
                try:
                    body = await r.json(content_type=None)
                except ValueError:
                    body = None
                return r.status, body
        except (TimeoutError, aiohttp.ClientError, OSError):
            return 0, None

    # ------------------------------------------------------------------ reconcile
    async def reconcile(self) -> None:
        """One pass: readiness, health, replacement, scale up, drain and stop (idempotent)."""
        now = time.time()
        changed = False

        async def check(w: WorkerProc) -> None:
            nonlocal changed
            if self._exited(w):
                self.workers.remove(w)
                changed = True
                self._event("stopped" if w.state == "draining" else "died", w, state=w.state)
                return
            if w.state == "starting":
                st, _ = await self._get_json(w.url + "/ready")
                if st == 200:
                    st, info = await self._get_json(w.url + "/info")
                    if st == 200 and isinstance(info, dict):
                        w.fpm_endpoint = info.get("fpm_endpoint")
                        w.state = "ready"
                        changed = True
                        self._event("ready", w, after_s=round(now - w.started_s, 3))
                elif now - w.started_s > self.s.ready_timeout_s:
                    self._event("ready_timeout", w)
                    self._signal(w, signal.SIGKILL)
            elif w.state == "ready":
                st, _ = await self._get_json(w.url + "/health")
                w.failures = 0 if st == 200 else w.failures + 1
                if w.failures >= self.s.health_failures:
                    self._event("unhealthy", w)
                    self._signal(w, signal.SIGKILL)
                    w.state = "draining"
                    changed = True
            elif w.state == "draining" and now - w.drain_since_s >= self.s.drain_grace_s:
                st, info = await self._get_json(w.url + "/info")
                idle = st == 200 and isinstance(info, dict) and sum(info.get("outstanding") or [0]) == 0
                if idle or st != 200 or now - w.drain_since_s > self.s.drain_timeout_s:
                    self._signal(w, signal.SIGTERM)

        await asyncio.gather(*(check(w) for w in list(self.workers)))
        for pool in self.s.pools:
            active = [w for w in self.workers if w.pool == pool and w.state != "draining"]
            want = self.spec.get(pool, 0)
            for _ in range(want - len(active)):
                self._spawn(pool)
            if len(active) > want:
                # drain the not-yet-ready first, then the newest
                victims = sorted(active, key=lambda w: (w.state != "starting", -w.worker_id))[: len(active) - want]
                for w in victims:
                    w.state, w.drain_since_s = "draining", now
                    changed = True
                    self._event("draining", w)
        if changed:
            self._save()

    async def _loop(self) -> None:
        while True:
            try:
                await self.reconcile()
                self._last_ok = True
            except Exception:  # noqa: BLE001 - keep managing the fleet; logged
                log.exception("fleet reconcile failed")
                self._last_ok = False
            await asyncio.sleep(self.s.reconcile_s)

    # ------------------------------------------------------------------ connector surface
    async def start(self) -> None:
        self._http = aiohttp.ClientSession()
        self._adopt()
        await self.reconcile()
        self._task = asyncio.create_task(self._loop())

    async def close(self, stop_workers: bool = False) -> None:
        """Stop managing. ``stop_workers``: also stop every worker (SIGTERM, then SIGKILL)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if stop_workers:
            await asyncio.to_thread(stop_pids, [w.pid for w in self.workers])
            for w in self.workers:
                if w.proc is not None:
                    w.proc.poll()
            self.workers.clear()
            self._save()
        if self._http is not None:
            await self._http.close()

    async def observe(self) -> dict[str, PoolState] | None:
        """Spec and ready (serving, not draining) replicas per pool."""
        if not self._last_ok:
            return None
        return {
            p: PoolState(self.spec.get(p, 0), sum(1 for w in self.workers if w.pool == p and w.state == "ready"))
            for p in self.s.pools
        }

    async def apply(self, targets: Mapping[str, int], decision_id: int, reason: str) -> None:
        """Set the spec; the reconcile loop starts or drains workers to match it."""
        for p, n in targets.items():
            if p in self.s.pools:
                self.spec[p] = int(n)
        self._save()
        await self.reconcile()

    def applied_decision_id(self) -> int | None:
        return None

    def fpm_endpoints(self) -> dict[str, str]:
        # only serving workers: a draining worker takes no new request, so its (shrinking) load must not hold
        # the load loop's "every engine is over the SLA" test; its engines are forgotten at once
        return {w.fpm_endpoint: w.pool for w in self.workers if w.fpm_endpoint and w.state == "ready"}

    def snapshot(self) -> list[dict[str, Any]]:
        return [w.to_dict() for w in self.workers]
