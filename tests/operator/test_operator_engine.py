"""The operator sizes by simulation of the engine a DynoPlanner declares (``spec.engine``), against the real
control plane (the environment of tests/operator/test_operator_k8s.py: chart-rendered operator, RBAC, a
Prometheus API serving the frontend figures the test sets).

Traffic: 15 requests per 2 s interval, ISL 2000, OSL 450, ITL target 30 ms, TTFT target 100 s. The
closed-form sizing of the test profile asks for prefill 2, decode 3 (test_operator_k8s's module docstring);
a simulation of the mocker's default engine (vLLM, polynomial timing, 16384 KV blocks) serves that load
with one of each, so a DGD at 3 + 3 is scaled down to 1 + 1. That Prometheus API knows no histogram
buckets, inter-arrival series or in-flight gauge (empty results / an error answer): the sample is then Poisson
with the window's mean lengths, and starts empty.
"""

from __future__ import annotations

import pytest

from tests.infra._proc import tail
from tests.operator.test_operator_k8s import DGD, DPL, Env, dgd_manifest, planner_manifest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def env(k8s, helm_bin, tmp_path_factory):
    e = Env(k8s, helm_bin, tmp_path_factory.mktemp("operator-engine"))
    try:
        e.start_operator()
        yield e
    finally:
        if e.proc is not None and e.proc.poll() is not None:
            print(tail(e.log))
        e.close()


def _conditions(env: Env, name: str) -> dict[str, dict]:
    return {c["type"]: c for c in (env.planner(name).get("status") or {}).get("conditions", [])}


def test_spec_engine_drives_the_sizing_by_simulation(env):
    env.co.create_namespaced_custom_object(*DGD[:2], env.ns, DGD[2], dgd_manifest("s", prefill=3, decode=3))
    env.wait(
        lambda: (
            {
                d.metadata.name
                for d in env.apps.list_namespaced_deployment(env.ns, label_selector="dynoplan.dev/dgd=s").items
            }
            == {"s-frontend", "s-prefill", "s-decode"}
        ),
        "Deployments of s",
    )
    env.set_ready("s-frontend", 1)
    env.set_ready("s-prefill", 3)
    env.set_ready("s-decode", 3)
    env.wait(lambda: env.dgd("s")["status"]["state"] == "successful", "DGD ready at 3/3")
    env.prom.set_traffic(15, 2000, 450)
    engine = {"engine": "vllm", "numGpuBlocks": 16384}  # the defaults, spelled out (camelCase)
    env.co.create_namespaced_custom_object(
        *DPL[:2],
        env.ns,
        DPL[2],
        planner_manifest("sim", "s", env.profile, engine=engine, settings={"simulatedSizing": True}),
    )
    assert env.planner("sim")["spec"]["engine"] == engine  # the schema keeps the mapping (no pruning)

    def scaled() -> bool:
        s = env.dgd("s")["spec"]["services"]
        return (s["Prefill"]["replicas"], s["Decode"]["replicas"]) == (1, 1)

    env.wait(scaled, "planner scales the DGD down to prefill 1, decode 1 by simulation", 90)
    env.wait(
        lambda: (env.planner("sim").get("status") or {}).get("desiredReplicas") == {"prefill": 1, "decode": 1},
        "planner status",
    )
    st = env.planner("sim")["status"]
    assert st["observed"]["requestsPerSecond"] == pytest.approx(7.5)
    downs = [e for e in env.events_once("s", "ScaledDown") if e.reason == "ScaledDown"]
    assert len(downs) == 1 and "Prefill 3->1" in downs[0].message and "Decode 3->1" in downs[0].message
    assert "scale_down_throughput" in downs[0].message
    env.co.delete_namespaced_custom_object(*DPL[:2], env.ns, DPL[2], "sim")


def test_invalid_spec_engine_is_an_invalid_spec_condition(env):
    env.co.create_namespaced_custom_object(
        *DPL[:2], env.ns, DPL[2], planner_manifest("badengine", "s", env.profile, engine={"numGpuBlocks": 0})
    )
    env.wait(
        lambda: _conditions(env, "badengine").get("SpecValid", {}).get("status") == "False", "InvalidSpec condition"
    )
    cond = _conditions(env, "badengine")["SpecValid"]
    assert cond["reason"] == "InvalidSpec"
    assert "spec.engine.num_gpu_blocks=0: expected > 0" in cond["message"]
    env.co.delete_namespaced_custom_object(*DPL[:2], env.ns, DPL[2], "badengine")
