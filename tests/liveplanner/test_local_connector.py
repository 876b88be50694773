"""LocalConnector on its own (disaggregated pools): readiness-gated listing, drain-then-stop, adoption
by a second connector, and a clean stop. Real ``dynoplan mocker serve`` processes on loopback."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
import requests

from planner.connectors.local import LocalConnector, LocalFleetSettings
from planner.core import PoolState
from tests.liveplanner.stack import FAST_WORKER, pid_alive

pytestmark = pytest.mark.integration


async def _until(cond, timeout_s: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await cond():
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def test_disagg_fleet_ready_drain_adopt_stop(tmp_path):
    settings = LocalFleetSettings(
        state_dir=tmp_path,
        pools=("prefill", "decode"),
        worker_args={"prefill": tuple(FAST_WORKER), "decode": tuple(FAST_WORKER)},
        drain_grace_s=0.5,
    )

    async def go() -> None:
        conn = LocalConnector(settings, initial={"prefill": 1, "decode": 1})
        await conn.start()
        pids: set[int] = set()
        try:
            # spec is what was asked; ready only after /ready answered (the file lists only ready workers)
            assert await conn.observe() == {"prefill": PoolState(1, 0), "decode": PoolState(1, 0)}
            assert (tmp_path / "workers.txt").read_text() == ""

            async def ready(p: int, d: int):  # type: ignore[no-untyped-def]
                return await conn.observe() == {"prefill": PoolState(p, p), "decode": PoolState(d, d)}

            await _until(lambda: ready(1, 1), 60, "1+1 ready")
            await conn.apply({"prefill": 2, "decode": 1}, 1, "test")
            assert (await conn.observe())["prefill"] == PoolState(2, 1)
            await _until(lambda: ready(2, 1), 60, "2+1 ready")
            # the file is rewritten after the ready state is recorded: wait on the file itself
            await _until(
                lambda: asyncio.sleep(0, result=len((tmp_path / "workers.txt").read_text().split()) == 3),
                30,
                "workers.txt lists the 3 ready workers",
            )
            listed = (tmp_path / "workers.txt").read_text().split()
            roles = {requests.get(u + "/info", timeout=5).json()["worker_type"] for u in listed}
            assert len(listed) == 3 and roles == {"prefill", "decode"}
            fleet = json.loads((tmp_path / "fleet.json").read_text())
            pids = {w["pid"] for w in fleet["workers"]}
            newest = max((w for w in fleet["workers"] if w["pool"] == "prefill"), key=lambda w: w["worker_id"])
            eps = conn.fpm_endpoints()
            assert sorted(eps.values()) == ["decode", "prefill", "prefill"]
            newest_ep = requests.get(newest["url"] + "/info", timeout=5).json()["fpm_endpoint"]
            assert eps[newest_ep] == "prefill"
            # scale down: the newest prefill worker leaves the file first, then stops; its FPM stream is
            # dropped at once (a draining engine takes no new request: it must not sway the load loop)
            await conn.apply({"prefill": 1, "decode": 1}, 2, "test")
            assert newest["url"] not in (tmp_path / "workers.txt").read_text()
            assert newest_ep not in conn.fpm_endpoints() and len(conn.fpm_endpoints()) == 2
            await _until(lambda: ready(1, 1), 30, "back to 1+1")

            def events() -> list[str]:
                return [e["event"] for e in conn.events if e["worker"] == newest["name"]]

            await _until(lambda: asyncio.sleep(0, result="stopped" in events()), 30, "drained worker stopped")
            assert events() == ["started", "ready", "draining", "stopped"] and not pid_alive(newest["pid"])
            await conn.close(stop_workers=False)
            # a second manager (a restarted planner) adopts the same processes
            again = LocalConnector(settings, initial={"prefill": 5, "decode": 5})
            await again.start()
            try:
                assert await again.observe() == {"prefill": PoolState(1, 1), "decode": PoolState(1, 1)}
                assert again.adopted == 2 and {w.pid for w in again.workers} <= pids
            finally:
                await again.close(stop_workers=True)
        finally:
            if conn._task is not None and not conn._task.done():
                await conn.close(stop_workers=True)
        assert not any(pid_alive(p) for p in pids)
        assert json.loads((tmp_path / "fleet.json").read_text())["workers"] == []

    asyncio.run(go())
