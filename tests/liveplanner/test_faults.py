"""Faults against a running ``dynoplan up`` stack (real processes, real Prometheus).

- a worker killed (SIGKILL) mid-stream: the requests it carried are re-routed by the frontend (counted
  in ``dynamo_frontend_request_retries_total``) and complete with every token; nothing hangs; the fleet
  replaces the worker (exact per-stream counts: test_midstream.py);
- Prometheus stopped and restarted: the planner holds with ``hold_metrics_unknown`` (never reads the
  outage as zero demand), then resumes;
- the planner killed: ``up`` restarts it and it adopts the running fleet (same worker pids, same spec,
  no decision) instead of resetting it;
- ``up`` itself SIGKILLed: the next ``up`` in the same state dir stops what the dead one left running.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import requests

from tests.infra._proc import free_port
from tests.liveplanner.stack import UpStack, pid_alive, samples, stack_file, step_trace, total

pytestmark = pytest.mark.integration


def _tp_ticks(st: dict, after: float) -> list[dict]:
    return [t for t in st["ticks"] if "throughput" in t["loops"] and t["t"] > after]


def test_prometheus_outage_then_planner_restart(tmp_path, prometheus_factory):
    fe_port, pl_port = free_port(), free_port()
    prom = prometheus_factory(
        {"frontend": [f"127.0.0.1:{fe_port}"], "planner": [f"127.0.0.1:{pl_port}"]}, scrape_interval_s=0.5
    )
    cfg = stack_file(
        tmp_path,
        planner={"agg": {"min_replicas": 2, "max_replicas": 3}, "adjustment_interval_s": 2},
        service={"port": pl_port},
        frontend={"port": fe_port, "poll_s": 0.2},
        prometheus={"enabled": False, "url": prom.url},
    )
    with UpStack(cfg) as up:
        # min_replicas 2 > the initial 1: the planner raises the fleet, and waits for readiness
        up.wait(lambda: up.state_json()["pools"]["agg"] == {"spec": 2, "ready": 2}, 60, "fleet of 2 ready")
        t0 = time.time()
        up.wait(
            lambda: any(t["observed_rps"] == 0.0 for t in _tp_ticks(up.state_json(), t0)),
            30,
            "a throughput tick with known (zero) traffic",
        )
        # --- Prometheus down: hold, never zero demand
        prom.stop_process()
        t_down = time.time()
        up.wait(
            lambda: any(
                t["reason"] == "hold_metrics_unknown" and t["observed_rps"] is None
                for t in _tp_ticks(up.state_json(), t_down + 0.5)
            ),
            30,
            "hold_metrics_unknown",
        )
        st = up.state_json()
        assert st["pools"]["agg"]["spec"] == 2 and st["traffic_error"]
        assert "dynoplan_planner_traffic_unknown_total" in requests.get(up.planner_url + "/metrics", timeout=5).text
        # --- Prometheus back: the planner resumes reading
        prom.start_process()
        t_up = time.time()
        up.wait(
            lambda: any(t["observed_rps"] is not None for t in _tp_ticks(up.state_json(), t_up)),
            30,
            "throughput loop resumes",
        )
        assert up.state_json()["pools"]["agg"]["spec"] == 2
        # --- planner killed: up restarts it; it adopts the running fleet
        before = {w["name"]: w["pid"] for w in up.fleet()["workers"]}
        assert len(before) == 2
        old_pid = up.stack_info()["planner_pid"]
        os.kill(old_pid, signal.SIGKILL)
        up.wait(lambda: up.stack_info().get("planner_pid") != old_pid, 30, "planner restarted by up")
        up.wait(lambda: requests.get(up.planner_url + "/health", timeout=1).ok, 60, "new planner serving")
        up.wait(lambda: len(_tp_ticks(up.state_json(), 0)) >= 2, 30, "two throughput ticks of the new planner")
        st = up.state_json()
        assert st["ticks"][0]["reason"] == "hold_warming_up"
        assert st["decisions"] == []  # nothing reset, nothing re-decided
        assert st["pools"]["agg"] == {"spec": 2, "ready": 2}
        assert {w["name"]: w["pid"] for w in up.fleet()["workers"]} == before
        assert up.stack_info()["planner_restarts"] == 1


def test_worker_killed_mid_stream(tmp_path):
    slow = ["--speedup-ratio", "2", "--num-gpu-blocks", "2048", "--block-size", "16", "--trace-block-size", "16"]
    cfg = stack_file(
        tmp_path,
        planner={"agg": {"min_replicas": 2, "max_replicas": 2}},
        fleet={"initial": {"agg": 2}, "worker_args": {"agg": slow}, "drain_grace_s": 1.0},
    )
    trace = tmp_path / "steady.jsonl"
    n = step_trace(trace, [(8.0, 6.0)], isl=200, osl=200)
    # prometheus.enabled is auto and no binary can be found: up says so and the planner scrapes directly
    env = {k: v for k, v in os.environ.items() if k != "DYNOPLAN_PROMETHEUS"}
    env["PATH"] = str(tmp_path / "empty-bin")
    up = UpStack(cfg, env=env)
    try:
        assert "notice: prometheus is not installed" in up.log.read_text()
        assert up.prometheus_url is None
        fleet = up.fleet()["workers"]
        assert len(fleet) == 2
        victim = fleet[0]
        result: dict = {}
        th = threading.Thread(target=lambda: result.update(zip(("rc", "rep", "err"), up.loadgen(trace))))
        th.start()
        # kill when the victim is streaming (it has outstanding requests)
        up.wait(
            lambda: sum(requests.get(victim["url"] + "/info", timeout=1).json()["outstanding"]) >= 1, 30, "victim busy"
        )
        os.kill(victim["pid"], signal.SIGKILL)
        th.join(120)
        assert not th.is_alive()
        rep = result["rep"]
        # a spare worker takes over every stream of the victim: each request completes with all its tokens
        # (exact counts with N known at the kill: tests/liveplanner/test_midstream.py)
        assert (rep["completed_requests"], rep["failed_requests"], rep["errors"]) == (n, 0, {}), rep.get("failures")
        assert rep["total_output_tokens"] == n * 200
        fe = samples(up.frontend_url)
        assert total(fe, "dynamo_frontend_requests_total", status="success") == n
        assert total(fe, "dynoplan_frontend_request_failures_total") == 0
        retries = total(fe, "dynamo_frontend_request_retries_total")
        assert (
            retries >= 1 and total(fe, "dynoplan_frontend_stream_continuations_total") <= retries
        )  # the kill was felt
        # the fleet recovers: the dead worker is replaced and serves
        up.wait(
            lambda: (
                up.state_json()["pools"]["agg"] == {"spec": 2, "ready": 2}
                and victim["name"] not in {w["name"] for w in up.fleet()["workers"]}
            ),
            60,
            "fleet recovered",
        )
        # the direct-scrape fallback fed the throughput loop with real (non-zero) traffic
        assert any(t["observed_rps"] for t in up.state_json()["ticks"])
        events = up.state_json()["fleet_events"]
        assert any(e["event"] == "died" and e["worker"] == victim["name"] for e in events)
        again = tmp_path / "again.jsonl"
        m = step_trace(again, [(4.0, 2.0)], isl=200, osl=10)
        rc, rep2, err = up.loadgen(again)
        assert rc == 0 and rep2["completed_requests"] == m and rep2["failed_requests"] == 0, err
        # --- up itself SIGKILLed: its children survive it; the next `up` in the same state dir stops them
        left = {up.stack_info()[k] for k in ("frontend_pid", "planner_pid")} | {w["pid"] for w in up.fleet()["workers"]}
        os.kill(up.proc.pid, signal.SIGKILL)
        up.proc.wait(10)
        assert all(pid_alive(p) for p in left)
        with UpStack(cfg, log_name="up2.log", env=env) as second:
            assert "notice: stopping" in second.log.read_text()
            assert not any(pid_alive(p) for p in left)
            assert second.spec() == 2
        up.seen_pids.clear()  # the second run stopped them
    finally:
        up.stop()
