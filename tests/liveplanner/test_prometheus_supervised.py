"""``dynoplan up`` supervises the Prometheus it started (real Prometheus, real stack processes, the
dashboard in real headless Chromium):

- Prometheus SIGKILLed: ``up`` logs the exit and restarts it on the same port after its back-off
  (``prometheus_restarts`` in stack.json), backing off longer when a restart fails (the test holds the
  port until the planner was seen holding with ``hold_metrics_unknown``);
- once the restarted Prometheus answers, the planner's throughput loop reads known traffic again within
  two of its ticks (counted on the planner's own tick record, never on sleeps);
- the dashboard marks the outage as a band on the time axis, and its observed / forecast lines
  have gaps there instead of the last value drawn through it; a worker SIGKILLed afterwards is marked as
  a death.
"""

from __future__ import annotations

import os
import signal
import socket
import time

import pytest
import requests

from tests.infra._proc import wait_until
from tests.liveplanner.stack import UpStack, stack_file

pytestmark = pytest.mark.integration

OUTAGE_BANDS = (
    "document.getElementById('load').layout.shapes.filter(s => s.name === 'metrics outage')"
    ".map(s => [new Date(s.x0).getTime() / 1000, new Date(s.x1).getTime() / 1000])"
)


def _first_sample_s(prom: str, after_s: float) -> float:
    """Unix time of the first frontend sample the (restarted) Prometheus scraped after ``after_s``."""
    r = requests.get(prom + "/api/v1/query", params={"query": "dynamo_frontend_requests_started_total[2m]"}, timeout=5)
    return min(float(v[0]) for res in r.json()["data"]["result"] for v in res["values"] if float(v[0]) > after_s)


def _tp(st: dict) -> list[dict]:
    return [t for t in st["ticks"] if "throughput" in t["loops"]]


def test_prometheus_killed_is_restarted_and_the_planner_resumes_within_two_ticks(tmp_path, chromium):
    # ticks of 8 s: a restarted Prometheus 2.42 scrapes first up to 5 s after it answers (its scrape manager
    # applies discovered targets on a 5 s ticker), and the planner's window needs two samples after that
    cfg = stack_file(tmp_path, planner={"adjustment_interval_s": 8}, prometheus={"scrape_interval_s": 0.5})
    with UpStack(cfg) as up:
        assert up.prometheus_url, "prometheus is installed: up must start it"
        up.wait(lambda: any(t["observed_rps"] is not None for t in _tp(up.state_json())), 60, "traffic known")
        old_pid = up.stack_info()["prometheus_pid"]
        port = int(up.prometheus_url.rsplit(":", 1)[1])
        os.kill(old_pid, signal.SIGKILL)
        t_kill = time.time()
        # hold the port (up restarts after a 1 s back-off; this bind comes microseconds after the kill) so the
        # restarts fail until the planner was seen holding: the outage lasts at least one throughput tick
        blocker = socket.socket()
        blocker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)

        def bound() -> bool:  # the port is free once the killed process is gone (ms after the signal)
            try:
                blocker.bind(("127.0.0.1", port))
            except OSError:
                return False
            return True

        wait_until(bound, 5, "the killed Prometheus's port released", interval_s=0.001)
        blocker.listen()
        assert "restarting it in 1 s" not in up.log.read_text() or "restarted (pid" not in up.log.read_text()
        try:
            up.wait(
                lambda: any(t["reason"] == "hold_metrics_unknown" and t["t"] > t_kill for t in _tp(up.state_json())),
                60,
                "the planner holds while Prometheus is down",
            )
            up.wait(lambda: "restarting it in 2 s" in up.log.read_text(), 60, "a failed restart, backed off")
        finally:
            blocker.close()
        n_before = up.stack_info().get("prometheus_restarts", 0)
        up.wait(lambda: up.stack_info().get("prometheus_restarts", 0) > n_before, 60, "prometheus restarted by up")
        new_pid = up.stack_info()["prometheus_pid"]
        assert new_pid != old_pid
        up.wait(lambda: requests.get(up.prometheus_url + "/-/ready", timeout=1).ok, 60, "restarted prometheus ready")
        t_ready = time.time()
        log = up.log.read_text()
        assert "notice: prometheus exited with code -9" in log and "restarting it in 1 s" in log, log[-2000:]
        assert f"notice: prometheus restarted (pid {new_pid}, restart {n_before + 1})" in log
        # the planner resumes: the first throughput tick with known traffic after the restart
        up.wait(
            lambda: any(t["observed_rps"] is not None and t["t"] > t_ready for t in _tp(up.state_json())),
            60,
            "throughput loop reads traffic again",
        )
        st = up.state_json()
        t_data = _first_sample_s(up.prometheus_url, t_kill)
        after = [t for t in _tp(st) if t["t"] > t_ready]
        first_known = next(i for i, t in enumerate(after) if t["observed_rps"] is not None)
        held = [t for t in _tp(st) if t_kill < t["t"] <= t_ready]
        print(
            f"\nprometheus outage: {len(held)} throughput ticks held ({sorted({t['reason'] for t in held})}), "
            f"resumed at throughput tick {first_known + 1} after the restarted Prometheus answered "
            f"(its first frontend sample {t_data - t_ready:+.1f} s after it answered, the resuming tick "
            f"{after[first_known]['t'] - t_ready:+.1f} s)"
        )
        assert first_known + 1 <= 2
        assert held and all(t["reason"] == "hold_metrics_unknown" and t["metrics_unknown"] for t in held), held
        assert all(t["observed_rps"] is None and t["predicted_rps"] is None for t in held)
        outages = [o for o in st["marks"]["outages"] if not o["ongoing"]]
        assert len(outages) == 1 and t_kill < outages[0]["start_s"] <= outages[0]["end_s"] <= after[first_known]["t"]
        assert st["pools"]["agg"]["spec"] == 1  # the outage never read as zero demand / a scale event
        # --- a worker dies: marked too
        victim = up.fleet()["workers"][0]
        os.kill(victim["pid"], signal.SIGKILL)
        up.wait(
            lambda: any(d["worker"] == victim["name"] for d in up.state_json()["marks"]["deaths"]),
            60,
            "the death in the dashboard state",
        )
        # --- the dashboard in Chromium, once it has data: the outage band and gaps, the death line
        page = chromium.open(
            up.planner_url + "/",
            wait_for="window.dashboardReady === true && "
            "window.dashboardState.ticks.some(t => t.observed_rps !== null) && "
            "document.getElementById('status').textContent !== 'loading...'",
        )
        try:
            page.wait_for(
                f"window.dashboardState.marks.deaths.some(d => d.worker === {victim['name']!r})", timeout_s=30
            )
            bands = page.evaluate(OUTAGE_BANDS)
            assert len(bands) == 1 and abs(bands[0][0] - outages[0]["start_s"]) < 2e-3, (bands, outages)
            # the lines break in the outage: the traces hold null at exactly the held ticks' times
            gaps = page.evaluate(
                "(() => { const d = document.getElementById('load').data; return d.map(tr => "
                "[tr.name, tr.x.filter((x, i) => tr.y[i] === null).map(x => new Date(x).getTime() / 1000)]); })()"
            )
            for name, xs in gaps:  # (Date keeps whole milliseconds)
                assert all(any(abs(x - t["t"]) < 2e-3 for x in xs) for t in held), (name, xs, held)
            deaths = page.evaluate(
                "document.getElementById('load').layout.shapes.filter(s => s.name && "
                "s.name.startsWith('died ')).map(s => s.name)"
            )
            assert f"died {victim['name']}" in deaths, deaths
            assert page.evaluate(
                "document.getElementById('replicas').layout.annotations.some(a => "
                f"a.text.indexOf({victim['name']!r} + ' died') >= 0)"
            )
            print(f"dashboard screenshot: {page.screenshot(tmp_path / 'dashboard.png')}")
            assert page.errors() == []
        finally:
            page.close()
