"""What a user sees for a DGD or DynoPlanner the operator cannot act on, and the status a user watches:

- a DGD service the reconciler cannot run (no command or args for the worker image) is an InvalidSpec
  naming the container, not a crash-looping Pod;
- every DynoPlanner spec problem (settings, target name, profile, engine) is reported at once, named by its
  CRD field, before the target DGD is looked up (a missing target does not hide them);
- status.observed keeps the last throughput observation between throughput ticks; an adopted hand edit
  is an Event.

The planner loop runs against an in-memory stand-in of the Kubernetes calls (planner.operator.kube.Kube's
methods); the real apiserver runs in test_operator_k8s.py and tests/e2e."""

from __future__ import annotations

import asyncio
import copy
from types import SimpleNamespace
from typing import Any

import pytest

from dynoplan.errors import SpecError
from planner.core import PlannerConfig, TrafficWindow, save_profile
from planner.core.interpolation import PerformanceProfile
from planner.operator.handlers import reconcile_dgd
from planner.operator.loop import PlannerLoop
from planner.operator.reconcile import reconcile_problems
from planner.operator.spec import parse_dgd, parse_planner
from tests.planner.helpers import profile as make_profile

IMAGE = "dynoplan:latest"


def dgd_body(**services: Any) -> dict[str, Any]:
    return {
        "apiVersion": "nvidia.com/v1alpha1",
        "kind": "DynamoGraphDeployment",
        "metadata": {"name": "g", "namespace": "ns", "uid": "u-1", "generation": 1, "resourceVersion": "1"},
        "spec": {"services": services},
    }


def planner_body(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "dynoplan.dev/v1alpha1",
        "kind": "DynoPlanner",
        "metadata": {"name": "p", "namespace": "ns", "generation": 1, "uid": "u-2"},
        "spec": {"targetRef": {"name": "g"}, **spec},
    }


class FakeKube:
    """The Kube calls the planner loop and the DGD reconciler make, on in-memory objects."""

    def __init__(self, dgd: dict[str, Any] | None = None) -> None:
        self.dgd = dgd
        self.planner_status: dict[str, Any] = {}
        self.dgd_status: dict[str, Any] | None = None
        self.events: list[tuple[str, str, str]] = []
        self.applied: list[dict[str, Any]] = []

    async def get_dgd(self, namespace, name):
        return copy.deepcopy(self.dgd)

    async def patch_dgd(self, namespace, name, patch, resource_version=None):
        for svc, v in patch["spec"]["services"].items():
            self.dgd["spec"]["services"][svc].update(v)

    async def patch_dgd_status(self, namespace, name, status):
        self.dgd_status = dict(status)

    async def patch_planner_status(self, namespace, name, status):
        self.planner_status = copy.deepcopy(dict(status))

    async def list_children(self, namespace, selector):
        return []

    async def apply(self, body):
        self.applied.append(body)

    async def delete(self, kind, namespace, name):
        pass

    async def list_endpoint_slices(self, namespace, service):
        return []

    async def event(self, obj, type_, reason, message):
        self.events.append((obj.get("kind", ""), reason, message))


class NoFpm:
    endpoints: dict = {}
    ok = True

    def set_endpoints(self, eps):
        self.endpoints = dict(eps)

    def drain(self):
        return ()

    def latest(self):
        return {}

    def close(self):
        pass


def conditions(kube: FakeKube) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in kube.planner_status.get("conditions", [])}


def loop_for(body, kube, traffic=None, clock=None) -> PlannerLoop:
    return PlannerLoop(
        body,
        kube,
        defaults=PlannerConfig(),
        traffic_factory=lambda plan: traffic,
        metrics_registry=None,
        budget=None,
        min_sleep_s=0.5,
        max_sleep_s=5.0,
        clock=clock or (lambda: 0.0),
        fpm_factory=lambda clock: NoFpm(),
        wall_clock=lambda: 1e9,
    )


# ------------------------------------------------------------------ DGD services the reconciler cannot run
def test_a_worker_service_without_extra_pod_spec_is_refused_naming_the_container():
    dgd = parse_dgd(dgd_body(W={"componentType": "worker", "replicas": 1}))
    problems = reconcile_problems(dgd, IMAGE)
    assert len(problems) == 1
    assert problems[0].startswith("spec.services.W.extraPodSpec.mainContainer: no command or args: expected")
    assert "mocker, serve" in problems[0] and IMAGE in problems[0]


def test_services_with_a_command_line_their_own_image_or_the_planner_role_pass():
    dgd = parse_dgd(
        dgd_body(
            A={"componentType": "worker", "extraPodSpec": {"mainContainer": {"args": ["mocker", "serve"]}}},
            B={"componentType": "worker", "extraPodSpec": {"mainContainer": {"command": ["python", "-m", "x"]}}},
            C={"componentType": "worker", "extraPodSpec": {"mainContainer": {"image": "vllm/vllm:1"}}},
            P={"componentType": "planner"},
        )
    )
    assert reconcile_problems(dgd, IMAGE) == []
    # the operator's own image named explicitly is the same as no image
    dgd = parse_dgd(dgd_body(D={"componentType": "worker", "extraPodSpec": {"mainContainer": {"image": IMAGE}}}))
    assert [p.split(":")[0] for p in reconcile_problems(dgd, IMAGE)] == ["spec.services.D.extraPodSpec.mainContainer"]


def test_the_reconciler_writes_invalid_spec_and_creates_nothing():
    kube = FakeKube()
    memo = SimpleNamespace(kube=kube, op_settings=SimpleNamespace(worker_image=IMAGE), reconciles=None)
    status = asyncio.run(reconcile_dgd(dgd_body(W={"componentType": "worker", "replicas": 1}), memo))
    assert status["state"] == "failed" and kube.applied == []
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "False" and ready["reason"] == "InvalidSpec"
    assert "spec.services.W.extraPodSpec.mainContainer: no command or args" in ready["message"]
    assert [e[1] for e in kube.events] == ["InvalidSpec"]


# ------------------------------------------------------------------ DynoPlanner problems named by CRD field
@pytest.mark.parametrize("mode", ["disagg", "agg"])
def test_min_above_max_names_the_crd_fields(mode):
    with pytest.raises(SpecError) as e:
        parse_planner(
            planner_body(mode=mode, replicas={"minWorker": 5, "maxWorker": 2, "minPrefill": 3, "maxPrefill": 1})
        )
    assert e.value.problems == [
        "spec.replicas.minPrefill=3: expected <= spec.replicas.maxPrefill=1",
        "spec.replicas.minWorker=5: expected <= spec.replicas.maxWorker=2",
    ]


def test_settings_problems_name_spec_settings_and_typed_fields_their_path():
    with pytest.raises(SpecError) as e:
        parse_planner(
            planner_body(
                sla={"ttftMs": -1},
                throughput={"enabled": False},
                settings={"loadEnabled": False, "agg": {"min_replicas": 4, "max_replicas": 1}, "nope": 1},
            )
        )
    assert e.value.problems == ["spec.settings.nope: unknown setting", "spec.sla.ttftMs=-1: expected > 0.0"]
    # the cross-field checks run once every field is valid, every line at once
    with pytest.raises(SpecError) as e:
        parse_planner(
            planner_body(
                throughput={"enabled": False},
                settings={"loadEnabled": False, "agg": {"min_replicas": 4, "max_replicas": 1}},
            )
        )
    assert e.value.problems == [
        "spec.throughput.enabled=false and spec.settings.loadEnabled=false: expected at least one loop enabled",
        "spec.settings.agg.min_replicas=4: expected <= spec.settings.agg.max_replicas=1",
    ]


def test_a_missing_target_name_is_reported_with_the_settings_problems():
    body = planner_body(sla={"itlMs": 0})
    body["spec"]["targetRef"] = {}
    with pytest.raises(SpecError) as e:
        parse_planner(body)
    assert e.value.problems == [
        "spec.sla.itlMs=0: expected > 0.0",
        "spec.targetRef.name: expected the name of a DynamoGraphDeployment",
    ]


def run_step(body, kube) -> PlannerLoop:
    loop = loop_for(body, kube)
    asyncio.run(loop.step())
    return loop


def test_every_spec_problem_is_reported_before_the_target_is_looked_up(tmp_path):
    """targetRef names a DGD that does not exist: a bad profile path, an engine that is not a mapping, a
    misspelled engine field and a bad setting are all in the InvalidSpec condition, not TargetNotFound."""
    kube = FakeKube(dgd=None)
    missing = tmp_path / "nope.npz"
    run_step(
        planner_body(
            mode="agg",
            throughput={"profile": str(missing)},
            engine={"numGpuBlcoks": 10},
            replicas={"minWorker": 3, "maxWorker": 1},
        ),
        kube,
    )
    c = conditions(kube)
    assert c["SpecValid"]["status"] == "False" and c["SpecValid"]["reason"] == "InvalidSpec"
    assert "TargetFound" not in c and c["Ready"]["reason"] == "InvalidSpec"
    msg = c["SpecValid"]["message"]
    assert "spec.replicas.minWorker=3: expected <= spec.replicas.maxWorker=1" in msg
    assert f"spec.throughput.profile={str(missing)!r}: no such file or directory" in msg
    assert "spec.engine.numGpuBlcoks" in msg or "spec.engine.num_gpu_blcoks" in msg, msg
    assert [e[1] for e in kube.events] == ["InvalidSpec"]

    kube = FakeKube(dgd=None)
    run_step(planner_body(engine="tensorflow", throughput={"profile": str(missing)}), kube)
    msg = conditions(kube)["SpecValid"]["message"]
    assert "spec.engine='tensorflow': expected a mapping" in msg and "spec.throughput.profile=" in msg

    # a valid spec with a missing target: TargetNotFound (and only then)
    prof = tmp_path / "p.npz"
    save_profile(make_profile(), prof)
    kube = FakeKube(dgd=None)
    run_step(planner_body(mode="agg", throughput={"profile": str(prof)}), kube)
    c = conditions(kube)
    assert c["TargetFound"]["reason"] == "TargetNotFound" and "SpecValid" not in c


def test_a_missing_profile_names_spec_throughput_profile_and_says_when_it_is_required():
    kube = FakeKube(dgd=None)
    run_step(planner_body(mode="agg"), kube)
    msg = conditions(kube)["SpecValid"]["message"]
    assert msg.startswith("DynoPlanner ns/p: spec.throughput.profile: required while the throughput loop is on")
    assert "/opt/dynoplan/profiles/mocker_vllm.npz" in msg and "spec.throughput.enabled: false" in msg
    assert "prefill profile" not in msg  # not the core's wording for the halves
    # the load loop alone needs no profile
    kube = FakeKube(dgd=None)
    run_step(planner_body(mode="agg", throughput={"enabled": False}, load={"enabled": True}), kube)
    assert "SpecValid" not in conditions(kube) and conditions(kube)["TargetFound"]["reason"] == "TargetNotFound"


def test_an_agg_profile_without_its_decode_half_says_both_halves(tmp_path):
    half = tmp_path / "prefill-only.npz"
    save_profile(PerformanceProfile(make_profile().prefill, None), half)
    kube = FakeKube(dgd=None)
    run_step(planner_body(mode="agg", throughput={"profile": str(half)}), kube)
    msg = conditions(kube)["SpecValid"]["message"]
    assert (
        f"spec.throughput.profile={str(half)!r}: mode agg needs a profile with both halves, prefill and decode "
        "(aggregated workers do both); this one has no decode half"
    ) in msg
    kube = FakeKube(dgd=None)
    run_step(planner_body(mode="disagg", throughput={"profile": str(half)}), kube)
    assert (
        f"spec.throughput.profile={str(half)!r}: mode disagg needs a profile with the prefill and decode halves; "
        "this one has no decode half"
    ) in conditions(kube)["SpecValid"]["message"]


# ------------------------------------------------------------------ the status a user watches
AGG_DGD = dict(
    Frontend={"componentType": "frontend", "replicas": 1, "extraPodSpec": {"mainContainer": {"args": ["frontend"]}}},
    W={"componentType": "worker", "replicas": 1, "extraPodSpec": {"mainContainer": {"args": ["mocker", "serve"]}}},
)


class Traffic:
    """20 req/s of ISL 1000 / OSL 100 at every read (the throughput loop's Prometheus read)."""

    def __init__(self) -> None:
        self.reads = 0

    def read(self, window_s):
        self.reads += 1
        return TrafficWindow(
            duration_s=window_s,
            num_requests=20.0 * window_s,
            mean_isl_tokens=1000.0,
            mean_osl_tokens=100.0,
            mean_ttft_ms=120.0,
            mean_itl_ms=12.0,
        )


def ready_dgd(replicas: int = 1) -> dict[str, Any]:
    d = dgd_body(**copy.deepcopy(AGG_DGD))
    d["spec"]["services"]["W"]["replicas"] = replicas
    d["status"] = {"services": {"W": {"readyReplicas": replicas}, "Frontend": {"readyReplicas": 1}}}
    return d


def test_observed_rps_is_kept_between_throughput_ticks_and_a_hand_edit_is_an_event(tmp_path):
    prof = tmp_path / "p.npz"
    save_profile(make_profile(), prof)
    kube = FakeKube(ready_dgd(1))
    now = [0.0]
    traffic = Traffic()
    body = planner_body(
        mode="agg",
        throughput={"profile": str(prof), "adjustmentIntervalS": 30, "predictor": "constant"},
        load={"enabled": True, "intervalS": 5},
        settings={"simulatedSizing": False, "earlySizingS": None},
        replicas={"minWorker": 1, "maxWorker": 1},
    )
    loop = loop_for(body, kube, traffic=traffic, clock=lambda: now[0])

    def tick_until(cond, what, limit=40):
        for _ in range(limit):
            delay = asyncio.run(loop.step())
            now[0] += delay
            if cond():
                return
        pytest.fail(f"{what}: not reached in {limit} steps (status {kube.planner_status})")

    def loops() -> tuple[str, ...]:
        return loop.last_result.diagnostics.loops_run if loop.last_result else ()

    tick_until(lambda: "throughput" in loops(), "a throughput tick")
    observed = kube.planner_status["observed"]
    assert observed == {"requestsPerSecond": 20.0, "ttftMs": 120.0, "itlMs": 12.0}
    # load-loop ticks in between (the core's diagnostics carry no observation then) write the status
    # again and keep the last observation
    seen_between = []

    def load_tick_seen():
        if loops() == ("load",):
            assert loop.last_result.diagnostics.observed is None
            seen_between.append(kube.planner_status.get("observed"))
        return len(seen_between) >= 3

    tick_until(load_tick_seen, "three load-loop ticks")
    assert seen_between and all(o == observed for o in seen_between), seen_between
    assert kube.planner_status["predicted"]["requestsPerSecond"] is not None

    # a hand edit: the planner adopts it, and says so in an Event on the DynoPlanner
    kube.dgd = ready_dgd(3)
    tick_until(lambda: any(e[1] == "AdoptedExternalChange" for e in kube.events), "the adoption Event")
    ev = next(e for e in kube.events if e[1] == "AdoptedExternalChange")
    assert ev[0] == "DynoPlanner"
    assert ev[2] == (
        "replicas changed outside the planner, adopted: W 1->3; left alone for external_change_grace_s=180 s"
    )
    assert kube.planner_status["desiredReplicas"] == {"worker": 3}


def test_a_new_operator_keeps_the_observation_the_previous_one_wrote(tmp_path):
    """An operator restart: the new planner loop starts from the DynoPlanner's status, so its first ticks
    (before its own first throughput tick) do not blank OBSERVED-RPS."""
    prof = tmp_path / "p.npz"
    save_profile(make_profile(), prof)
    kube = FakeKube(ready_dgd(1))
    body = planner_body(
        mode="agg",
        throughput={"profile": str(prof), "adjustmentIntervalS": 30, "predictor": "constant"},
        load={"enabled": True, "intervalS": 5},
        settings={"simulatedSizing": False},
    )
    body["status"] = {
        "observed": {"requestsPerSecond": 7.5, "ttftMs": 90.0, "itlMs": 9.0},
        "predicted": {"requestsPerSecond": 8.0},
    }
    now = [0.0]
    loop = loop_for(body, kube, traffic=Traffic(), clock=lambda: now[0])
    asyncio.run(loop.step())  # the first tick: the core warms up, no throughput loop
    assert "throughput" not in loop.last_result.diagnostics.loops_run
    assert kube.planner_status["observed"] == {"requestsPerSecond": 7.5, "ttftMs": 90.0, "itlMs": 9.0}
    assert kube.planner_status["predicted"] == {"requestsPerSecond": 8.0}


def test_a_scale_refused_with_409_is_replanned_not_left_pending(tmp_path):
    """The DGD changed between the planner's read and its conditional patch (409): the decision was not
    applied, so the core withdraws it and the next throughput tick re-plans and patches. Before, the core
    held ``hold_pending`` for the applied decision until pending_timeout_s (1800 s)."""
    from planner.operator.kube import Conflict

    class ConflictOnce(FakeKube):
        def __init__(self, dgd):
            super().__init__(dgd)
            self.refused = 0

        async def patch_dgd(self, namespace, name, patch, resource_version=None):
            if not self.refused:
                self.refused += 1
                raise Conflict("409: the object has been modified")
            await super().patch_dgd(namespace, name, patch, resource_version)

    prof = tmp_path / "p.npz"
    save_profile(make_profile(), prof)
    kube = ConflictOnce(ready_dgd(1))
    now = [0.0]
    body = planner_body(
        mode="agg",
        throughput={"profile": str(prof), "adjustmentIntervalS": 30, "predictor": "constant"},
        settings={"simulatedSizing": False, "earlySizingS": None},
        replicas={"minWorker": 1, "maxWorker": 8},
    )
    loop = loop_for(body, kube, traffic=Traffic(), clock=lambda: now[0])
    for _ in range(40):
        now[0] += asyncio.run(loop.step())
        if kube.dgd["spec"]["services"]["W"]["replicas"] != 1:
            break
    assert kube.refused == 1
    conflict = [e for e in kube.events if e[1] == "ScaleConflict"]
    assert len(conflict) == 1 and conflict[0][2].startswith("decision 1: ")
    scaled = [e for e in kube.events if e[1] == "ScaledUp"]
    assert kube.dgd["spec"]["services"]["W"]["replicas"] > 1, (now[0], kube.planner_status.get("lastDecision"))
    # re-planned at the next throughput tick (30 s later), as decision 2, from the unchanged spec of 1
    assert scaled and scaled[0][2].startswith("decision 2: W 1->"), scaled
    assert now[0] <= 90.0
