"""HA and observability of the operator against the real control plane (no mocks of the API).

Two operator processes run in one namespace with the chart's peering (KopfPeering ``dynoplan``) and the
chart ServiceAccount's token, with peering priorities 200 (A) and 100 (B): A is active, B pauses. Only A
plans (one ScaledUp event; planner gauges on A's ``/metrics`` only). When A stops, B resumes and takes over
the planner (it scales on new demand). Both serve ``/healthz`` throughout, and their logs are JSON lines
carrying the planner's fields.
(kopf starts every peer paused; A logs "Resuming operations" once it sees no higher-priority peer.)

Expected replicas as in test_operator_k8s (hand-computed): 15 req/2 s, ISL 2000, OSL 450 -> prefill 2,
decode 3; then 30 req/2 s, ISL 2000, OSL 280 -> prefill 3.75 -> 4, decode 2.8 -> 3 (holds at 3).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import requests

from tests.infra._proc import free_port, start_process, stop_process, tail, wait_until
from tests.operator.test_operator_k8s import DGD, DPL, Env, dgd_manifest, planner_manifest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def json_lines(path: Path) -> list[dict]:
    """Every line of an operator log as a JSON object (fails on a line that is not one)."""
    out = []
    for line in path.read_text().splitlines():
        if line.strip():
            rec = json.loads(line)
            assert isinstance(rec, dict), line
            out.append(rec)
    return out


def logged(path: Path, needle: str) -> bool:
    return any(needle in str(r.get("message", "")) for r in json_lines(path))


@pytest.fixture(scope="module")
def env(k8s, helm_bin, tmp_path_factory):
    e = Env(k8s, helm_bin, tmp_path_factory.mktemp("operator-ha"))
    e.b = None
    try:
        e.start_operator(DYNOPLAN_OPERATOR_PEERING_PRIORITY="200")
        yield e
    finally:
        if e.b is not None:
            stop_process(e.b)
        e.close()


def start_b(env) -> tuple[object, Path, int, int]:
    health, metrics = free_port(), free_port()
    log = env.tmp / "operator-b.log"
    proc = start_process(
        [str(Path(sys.executable).parent / "dynoplan"), "operator"],
        log,
        env={
            **env.operator_env(),
            "DYNOPLAN_OPERATOR_HEALTH_PORT": str(health),
            "DYNOPLAN_OPERATOR_METRICS_PORT": str(metrics),
            "DYNOPLAN_OPERATOR_PEERING_PRIORITY": "100",
        },
    )
    wait_until(
        lambda: requests.get(f"http://127.0.0.1:{health}/healthz", timeout=2).ok, 60, "operator B /healthz", proc, log
    )
    return proc, log, health, metrics


def test_peering_one_active_operator_and_failover(env):
    b, b_log, b_health, b_metrics = start_b(env)
    env.b = b

    # Both peers are registered in the chart's KopfPeering with their priorities. kopf starts paused and
    # resumes only when no live peer has a higher priority: A resumes, B stays paused (it logs nothing).
    def priorities() -> list[int]:
        st = (
            env.co.get_namespaced_custom_object("kopf.dev", "v1", env.ns, "kopfpeerings", "dynoplan").get("status")
            or {}
        )
        return sorted(int(v["priority"]) for v in st.values() if isinstance(v, dict) and "priority" in v)

    wait_until(lambda: priorities() == [100, 200], 30, "both operators in KopfPeering dynoplan", b, b_log)
    assert logged(env.log, "Resuming operations") and not logged(b_log, "Resuming operations")

    env.prom.set_traffic(15, 2000, 450)
    env.co.create_namespaced_custom_object(*DGD[:2], env.ns, DGD[2], dgd_manifest("g"))
    env.co.create_namespaced_custom_object(*DPL[:2], env.ns, DPL[2], planner_manifest("p", "g", env.profile))

    def replicas() -> tuple[int, int]:
        s = env.dgd("g")["spec"]["services"]
        return s["Prefill"]["replicas"], s["Decode"]["replicas"]

    env.wait(lambda: replicas() == (2, 3), "active operator A scales to prefill 2, decode 3")
    env.set_ready("g-prefill", 2)
    env.set_ready("g-decode", 3)
    env.set_ready("g-frontend", 1)
    gauge = f'dynamo_planner_num_decode_replicas{{namespace="{env.ns}",planner="p"}} 3.0'
    env.wait(
        lambda: gauge in requests.get(f"http://127.0.0.1:{env.metrics_port}/metrics", timeout=5).text,
        "A exports the planner gauges",
    )
    b_text = requests.get(f"http://127.0.0.1:{b_metrics}/metrics", timeout=5).text
    assert "dynamo_planner_num_decode_replicas{" not in b_text  # the paused operator runs no planner
    assert [e.reason for e in env.events_once("g", "ScaledUp") if e.reason.startswith("Scaled")] == ["ScaledUp"]
    # Operator metrics: the reconciler's actions are counted.
    a_text = requests.get(f"http://127.0.0.1:{env.metrics_port}/metrics", timeout=5).text
    applied = re.search(
        r'^dynoplan_operator_reconciles_total\{action="apply_Deployment",kind="DynamoGraphDeployment"\} (\S+)$',
        a_text,
        re.M,
    )
    assert applied and float(applied.group(1)) >= 5  # 3 Deployments created, 2 scaled
    # Structured logs: every line of A's log is JSON; the scaling record carries the planner's fields.
    wait_until(
        lambda: any(r.get("message") == "scaled" for r in json_lines(env.log)),
        30,
        "operator A logs its scaling",
        env.proc,
        env.log,
    )
    recs = json_lines(env.log)
    scaled = [r for r in recs if r.get("message") == "scaled"]
    assert len(scaled) == 1 and scaled[0]["planner"] == "p" and scaled[0]["reason"] == "scale_up_throughput"
    assert scaled[0]["patch"]["spec"]["services"] == {"Prefill": {"replicas": 2}, "Decode": {"replicas": 3}}
    assert all("severity" in r and "timestamp" in r for r in recs)
    assert requests.get(f"http://127.0.0.1:{b_health}/healthz", timeout=5).ok

    # Failover: A stops (SIGTERM); B resumes and plans the new demand.
    env.stop_operator()
    env.prom.set_traffic(30, 2000, 280)
    wait_until(lambda: logged(b_log, "Resuming operations"), 90, "operator B resumes", b, b_log)
    env.wait(lambda: replicas()[0] == 4, "operator B scales prefill 2 -> 4", 60)
    assert replicas()[1] == 3
    # B logs its "scaled" record after the patch and the two Events
    wait_until(
        lambda: any(r.get("message") == "scaled" and r.get("planner") == "p" for r in json_lines(b_log)),
        30,
        "operator B logs its scaling",
        b,
        b_log,
    )
    assert b.poll() is None and "Traceback" not in b_log.read_text(), tail(b_log)
