"""Unit tests of the operator's pure parts: spec parsing, reconcile functions, budget division, settings."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dynoplan.errors import SettingsError, SpecError
from planner.core import PlannerConfig
from planner.operator.reconcile import (
    HASH_ANNOTATION,
    child_actions,
    child_name,
    desired_children,
    dgd_status,
    divide_budget,
    replica_patch,
    set_condition,
)
from planner.operator.settings import OperatorSettings, settings_from_env
from planner.operator.spec import parse_dgd, parse_planner, resolve_pools


def dgd_body(**services):
    return {
        "apiVersion": "nvidia.com/v1alpha1",
        "kind": "DynamoGraphDeployment",
        "metadata": {"name": "g", "namespace": "ns", "uid": "u-1", "generation": 3},
        "spec": {"backendFramework": "vllm", "services": services},
    }


DISAGG = dict(
    Frontend={"componentType": "frontend", "replicas": 1, "extraPodSpec": {"mainContainer": {"args": ["frontend"]}}},
    Prefill={
        "componentType": "worker",
        "subComponentType": "prefill",
        "replicas": 2,
        "resources": {"limits": {"nvidia.com/gpu": "2"}},
    },
    Decode={"componentType": "worker", "subComponentType": "decode", "replicas": 1},
    Planner={"componentType": "planner", "replicas": 1},
)


def planner_body(**spec):
    return {"metadata": {"name": "p", "namespace": "ns", "generation": 1}, "spec": {"targetRef": {"name": "g"}, **spec}}


def test_parse_dgd_reads_gpus_per_engine_and_defaults_to_one():
    d = parse_dgd(dgd_body(**DISAGG))
    assert d.services["Prefill"].gpus_per_engine == 2
    assert d.services["Decode"].gpus_per_engine == 1
    assert d.generation == 3 and d.backend == "vllm"


def test_parse_dgd_bad_gpu_count_names_the_field():
    with pytest.raises(SpecError, match=r"spec.services.Decode.resources.limits.nvidia.com/gpu='x'"):
        parse_dgd(dgd_body(Decode={"subComponentType": "decode", "resources": {"limits": {"nvidia.com/gpu": "x"}}}))


def test_planner_spec_maps_typed_fields_and_settings_over_defaults():
    base = PlannerConfig(predictor="kalman", ttft_ms=400.0)
    p = parse_planner(
        planner_body(
            sla={"itlMs": 30},
            replicas={"maxDecode": 5, "minWorker": 2},
            settings={"scaleDownCooldownS": 30},
            throughput={"adjustmentIntervalS": 60},
        ),
        base,
    )
    c = p.config
    assert (c.predictor, c.ttft_ms, c.itl_ms, c.decode.max_replicas, c.agg.min_replicas) == (
        "kalman",
        400.0,
        30.0,
        5,
        2,
    )
    assert c.scale_down_cooldown_s == 30.0 and c.adjustment_interval_s == 60.0


def test_planner_spec_invalid_values_all_reported():
    with pytest.raises(SpecError) as e:
        parse_planner(planner_body(settings={"nope": 1, "predictor": "bogus"}))
    msg = str(e.value)
    assert "nope: unknown setting" in msg and 'predictor="bogus"' in msg


def test_resolve_pools_by_subcomponent_and_explicit_names():
    d = parse_dgd(dgd_body(**DISAGG))
    pools = resolve_pools(parse_planner(planner_body()), d)
    assert {k: v.name for k, v in pools.items()} == {"prefill": "Prefill", "decode": "Decode"}
    with pytest.raises(SpecError, match="has 0 agg services"):
        resolve_pools(parse_planner(planner_body(mode="agg")), d)
    with pytest.raises(SpecError, match=r"spec.services.decode='Nope': no such service"):
        resolve_pools(parse_planner(planner_body(services={"decode": "Nope"})), d)


def test_desired_children_owner_refs_labels_and_no_planner_service():
    kids = desired_children(parse_dgd(dgd_body(**DISAGG)), "img:1")
    names = [(k["kind"], k["metadata"]["name"]) for k in kids]
    assert names == [
        ("Deployment", "g-decode"),
        ("Service", "g-decode"),
        ("Deployment", "g-frontend"),
        ("Service", "g-frontend"),
        ("Deployment", "g-prefill"),
        ("Service", "g-prefill"),
    ]
    dep = kids[4]
    assert dep["spec"]["replicas"] == 2
    assert dep["metadata"]["ownerReferences"][0] == {
        "apiVersion": "nvidia.com/v1alpha1",
        "kind": "DynamoGraphDeployment",
        "name": "g",
        "uid": "u-1",
        "controller": True,
        "blockOwnerDeletion": True,
    }
    c = dep["spec"]["template"]["spec"]["containers"][0]
    assert c["image"] == "img:1" and c["resources"] == {"limits": {"nvidia.com/gpu": "2"}}
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert kids[2]["spec"]["template"]["spec"]["containers"][0]["args"] == ["frontend"]
    assert child_name("My_DGD", "VllmWorker") == "my-dgd-vllmworker"


def test_child_actions_idempotent_and_deletes_orphans():
    kids = desired_children(parse_dgd(dgd_body(**DISAGG)), "img")
    acts = child_actions(kids, [])
    assert [a.verb for a in acts] == ["apply"] * 6
    assert child_actions(kids, kids) == []
    # Decode replicas changed -> only its Deployment is re-applied; a stale child is deleted.
    changed = desired_children(parse_dgd(dgd_body(**{**DISAGG, "Decode": {**DISAGG["Decode"], "replicas": 3}})), "img")
    stale = {"kind": "Service", "metadata": {"name": "g-old", "annotations": {HASH_ANNOTATION: "x"}}}
    acts = child_actions(changed, kids + [stale])
    assert [(a.verb, a.kind, a.name) for a in acts] == [
        ("apply", "Deployment", "g-decode"),
        ("delete", "Service", "g-old"),
    ]


def test_dgd_status_ready_only_when_every_service_ready():
    d = parse_dgd(dgd_body(**DISAGG))
    deps = {
        n: {"status": {"readyReplicas": r, "updatedReplicas": r, "availableReplicas": r}}
        for n, r in (("Frontend", 1), ("Prefill", 1), ("Decode", 1))
    }
    s = dgd_status(d, deps, None, "2026-01-01T00:00:00Z")
    assert s["services"]["Prefill"] == {"replicas": 2, "updatedReplicas": 1, "readyReplicas": 1, "availableReplicas": 1}
    assert s["state"] == "pending" and s["conditions"][0]["status"] == "False"
    assert "Prefill 1/2" in s["conditions"][0]["message"] and "Planner" not in s["services"]
    deps["Prefill"]["status"]["readyReplicas"] = 2
    s2 = dgd_status(d, deps, s, "2026-01-01T00:01:00Z")
    assert s2["state"] == "successful" and s2["conditions"][0]["status"] == "True"
    assert s2["conditions"][0]["lastTransitionTime"] == "2026-01-01T00:01:00Z"
    s3 = dgd_status(d, deps, s2, "2026-01-01T00:02:00Z")
    assert s3["conditions"][0]["lastTransitionTime"] == "2026-01-01T00:01:00Z"  # unchanged status keeps it


def test_replica_patch_only_changed_pools():
    svc = {"prefill": "Prefill", "decode": "Decode"}
    assert replica_patch(svc, {"prefill": 1, "decode": 2}, {"prefill": 1, "decode": 3}) == {
        "spec": {"services": {"Decode": {"replicas": 3}}}
    }
    assert replica_patch(svc, {"prefill": 1, "decode": 2}, {"prefill": 1, "decode": 2}) is None


def test_set_condition_replaces_one_type():
    c = set_condition([{"type": "A", "status": "True"}, {"type": "B", "status": "False"}], "B", "True", "r", "m", "t")
    assert [x["type"] for x in c] == ["A", "B"] and c[1]["status"] == "True"


def test_divide_budget_by_need_hand_computed():
    # 10 GPUs, mins 1+1, extra needs 6 and 2 -> 8 remaining split 6:2 exactly.
    assert divide_budget(10, {"a": 7, "b": 3}, {"a": 1, "b": 1}, {"a": 1, "b": 1}) == {"a": 7, "b": 3}
    # 6 GPUs, extra needs 6 and 2 (sum 8 > 4 left): shares 3.0 and 1.0.
    assert divide_budget(6, {"a": 7, "b": 3}, {"a": 1, "b": 1}, {"a": 1, "b": 1}) == {"a": 4, "b": 2}
    # b still holds 5 GPUs it must give back: a may only grow into what is free now (8 - 5 = 3).
    assert divide_budget(8, {"a": 7, "b": 1}, {"a": 1, "b": 1}, {"a": 1, "b": 5}) == {"a": 3, "b": 1}


@settings(max_examples=300, deadline=None)
@given(
    st.integers(0, 40),
    st.dictionaries(
        st.sampled_from("abcde"), st.tuples(st.integers(0, 12), st.integers(0, 3), st.integers(0, 12)), min_size=1
    ),
)
def test_divide_budget_never_exceeded(total, spec):
    needs = {k: v[0] for k, v in spec.items()}
    mins = {k: v[1] for k, v in spec.items()}
    cur = {k: v[2] for k, v in spec.items()}
    alloc = divide_budget(total, needs, mins, cur)
    assert set(alloc) == set(needs) and all(v >= 0 for v in alloc.values())
    if sum(cur.values()) <= total and sum(mins.values()) <= total:
        # Even before anyone shrinks, what each holds or may grow to fits in the budget.
        assert sum(max(cur[k], alloc[k]) for k in alloc) <= total
    if (
        sum(mins.values()) <= total
        and sum(max(n, m) for n, m in zip(needs.values(), mins.values())) <= total
        and all(cur[k] <= max(needs[k], mins[k]) for k in cur)
    ):
        assert all(alloc[k] >= max(needs[k], mins[k]) for k in alloc)  # enough for all: everyone gets its need


def test_operator_settings_env_and_errors():
    s = settings_from_env({"DYNOPLAN_OPERATOR_RECONCILE_DGD": "false", "DYNOPLAN_OPERATOR_SHARED_GPU_BUDGET": "16"})
    assert s.reconcile_dgd is False and s.shared_gpu_budget == 16
    with pytest.raises(SettingsError) as e:
        settings_from_env({"DYNOPLAN_OPERATOR_HEALTH_PORT": "70000", "DYNOPLAN_OPERATOR_DGD_RESYNC_S": "-1"})
    assert set(e.value.problems) == {"health_port=70000: expected <= 65535", "dgd_resync_s=-1: expected > 0.0"}
    with pytest.raises(SettingsError, match="bogus: unknown setting"):
        from planner.operator.settings import settings_from_mapping

        settings_from_mapping({"bogus": 1})
    assert OperatorSettings().planner_max_sleep_s == 5.0 and not math.isnan(OperatorSettings().dgd_resync_s)


def test_operator_settings_strict_types_and_every_problem_at_once():
    from planner.operator.settings import settings_from_mapping

    with pytest.raises(SettingsError) as e:
        settings_from_mapping(
            {
                "health_port": True,
                "dgd_resync_s": "fast",
                "helth_port": 1,
                "log_format": "xml",
                "prometheus_url": "ftp://p",
                "standalone": 1,
                "shared_gpu_budget": -1,
            }
        )
    assert set(e.value.problems) == {
        "health_port=true: expected an integer",
        'dgd_resync_s="fast": expected a number',
        "helth_port: unknown setting (did you mean health_port?)",
        "log_format=\"xml\": expected one of 'json' or 'plain'",
        'prometheus_url="ftp://p": expected an http:// or https:// URL',
        "standalone=1: expected a boolean (true/false)",
        "shared_gpu_budget=-1: expected >= 0",
    }
    # environment text is read as the setting's type; a text setting keeps the text
    s = settings_from_mapping({"dgd_resync_s": "2.5", "standalone": "true", "peering_name": "true", "health_port": "0"})
    assert (s.dgd_resync_s, s.standalone, s.peering_name, s.health_port) == (2.5, True, "true", 0)
    # ... by the grammar of a settings file: what a file refuses, the environment cannot slip in
    with pytest.raises(SettingsError) as e:
        settings_from_mapping({"standalone": "yes", "reconcile_dgd": "1", "health_port": "1e3"})
    assert set(e.value.problems) == {
        'standalone="yes": expected a boolean (true/false)',
        "reconcile_dgd=1: expected a boolean (true/false)",
        "health_port=1000.0: expected an integer",
    }
    with pytest.raises(SettingsError) as e:
        settings_from_mapping({"planner_min_sleep_s": 9})
    assert e.value.problems == ["planner_min_sleep_s=9.0: expected <= planner_max_sleep_s=5.0"]


def test_cli_user_errors_are_one_line_exit_2(tmp_path, capsys, monkeypatch):
    from planner.cli import main

    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert main(["operator", "--health-port", "70000"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["dynoplan operator: error: --health-port=70000: expected <= 65535"]
    bad = tmp_path / "p.yaml"
    bad.write_text("ttft_ms: -1\n")
    assert main(["operator", "--planner-defaults-file", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "ttft_ms=-1" in err[0]
    assert main(["operator"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no Kubernetes credentials" in err[0]


@pytest.mark.parametrize(
    "args, port",
    [
        (["mocker", "serve", "--fpm-endpoint", "tcp://0.0.0.0:5557"], 5557),
        (["mocker", "serve", "--fpm-endpoint=tcp://*:6000", "--port", "8000"], 6000),
        (["mocker", "serve", "--fpm-endpoint", "off"], None),
        (["mocker", "serve", "--fpm-endpoint", "tcp://127.0.0.1:0"], None),  # any free port: unreachable
        (["mocker", "serve", "--fpm-endpoint", "ipc:///tmp/x"], None),
        (["mocker", "serve"], None),
        (["mocker", "serve", "--fpm-endpoint"], None),
    ],
)
def test_fpm_port_from_worker_args(args, port):
    from planner.operator.reconcile import fpm_port

    assert fpm_port(args) == port


def test_desired_children_expose_the_fpm_port_only_when_fixed():
    body = dgd_body(
        W={
            "componentType": "worker",
            "replicas": 2,
            "extraPodSpec": {"mainContainer": {"args": ["mocker", "serve", "--fpm-endpoint", "tcp://0.0.0.0:5557"]}},
        },
        F={"componentType": "frontend", "extraPodSpec": {"mainContainer": {"args": ["frontend"]}}},
    )
    kids = {(k["kind"], k["metadata"]["name"]): k for k in desired_children(parse_dgd(body), "img")}
    w = kids[("Deployment", "g-w")]["spec"]["template"]["spec"]["containers"][0]
    assert w["ports"] == [{"name": "http", "containerPort": 8000}, {"name": "fpm", "containerPort": 5557}]
    assert kids[("Service", "g-w")]["spec"]["ports"][1] == {"name": "fpm", "port": 5557, "targetPort": "fpm"}
    f = kids[("Deployment", "g-f")]["spec"]["template"]["spec"]["containers"][0]
    assert [p["name"] for p in f["ports"]] == ["http"] and len(kids[("Service", "g-f")]["spec"]["ports"]) == 1


def test_fpm_feed_tells_workers_with_the_same_worker_id_apart():
    """Two real ZMQ publishers (the live worker's Publisher), both worker_id 0 as every replica of a
    Deployment would be: the feed gives each endpoint its own engine id and restores the pool."""
    import time

    import zmq

    from dynoplan.fpm import FPM_TOPIC, ForwardPassMetrics, QueuedRequests, ScheduledRequests
    from mocker.live.publish import Publisher, idle_fpm
    from planner.operator.loop import FpmFeed

    ctx = zmq.Context()
    pubs = [Publisher(ctx, "tcp://127.0.0.1:0") for _ in range(2)]
    feed = FpmFeed(clock=time.monotonic)
    try:
        feed.set_endpoints({pubs[0].endpoint: "prefill", pubs[1].endpoint: "decode"})
        got: list = []
        deadline = time.monotonic() + 20
        # PUB/SUB joins asynchronously: publish until both streams arrive
        while time.monotonic() < deadline and {p.pool for p in got} != {"prefill", "decode"}:
            pubs[0].publish(
                FPM_TOPIC,
                ForwardPassMetrics(
                    0, 0, 0.012, ScheduledRequests(num_prefill_requests=1, sum_prefill_tokens=300), QueuedRequests()
                ),
            )
            pubs[1].publish(FPM_TOPIC, idle_fpm(0, 0, 0.0))
            time.sleep(0.05)
            got += feed.drain()
        by_pool = {p.pool: p for p in got}
        assert set(by_pool) == {"prefill", "decode"}
        assert by_pool["prefill"].worker_id != by_pool["decode"].worker_id
        assert by_pool["prefill"].scheduled_requests.sum_prefill_tokens == 300 and by_pool["prefill"].wall_time == 0.012
        assert by_pool["decode"].wall_time == 0.0
        # ids are stable per endpoint
        assert len({(p.pool, p.worker_id) for p in got}) == 2
        assert all(p.timestamp_s <= time.monotonic() for p in got)  # stamped on the loop's clock
    finally:
        feed.close()
        for p in pubs:
            p.close()
        ctx.term()


def test_desired_children_pull_policy_if_not_present_unless_the_dgd_says():
    """kind: an image loaded with `kind load` under a :latest tag must not be pulled (the default policy of
    :latest is Always, which fails without a registry)."""
    body = dgd_body(
        A={"componentType": "worker", "extraPodSpec": {"mainContainer": {"image": "dynoplan:latest"}}},
        B={"componentType": "frontend", "extraPodSpec": {"mainContainer": {"imagePullPolicy": "Always"}}},
    )
    deps = {k["metadata"]["name"]: k for k in desired_children(parse_dgd(body), "img:1") if k["kind"] == "Deployment"}
    assert deps["g-a"]["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] == "IfNotPresent"
    assert deps["g-b"]["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] == "Always"


def test_peering_priority_explicit_or_stable_from_the_host_name():
    from planner.operator.settings import effective_peering_priority

    assert effective_peering_priority(OperatorSettings(peering_priority=7)) == 7
    a = effective_peering_priority(OperatorSettings(), host="dynoplan-operator-5d9c-abcde")
    assert a == effective_peering_priority(OperatorSettings(), host="dynoplan-operator-5d9c-abcde")
    assert 1 <= a < 2**31
    assert a != effective_peering_priority(OperatorSettings(), host="dynoplan-operator-5d9c-fghij")
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="peering_priority"):
        OperatorSettings(peering_priority=-1)


def test_planner_spec_fpm_discovery_fields():
    body = {
        "metadata": {"name": "p", "namespace": "ns"},
        "spec": {
            "targetRef": {"name": "g"},
            "mode": "agg",
            "load": {"enabled": True, "fpmServices": {"worker": "vllm-workers"}, "fpmPortName": "metrics-zmq"},
        },
    }
    plan = parse_planner(body)
    assert plan.fpm_services == {"agg": "vllm-workers"} and plan.fpm_port_name == "metrics-zmq"
    plan = parse_planner({**body, "spec": {"targetRef": {"name": "g"}}})
    assert plan.fpm_services == {} and plan.fpm_port_name == "fpm"


def test_misspelled_operator_variables_are_warned_and_service_links_are_not():
    from planner.operator.settings import ignored_env_variables

    env = {
        "DYNOPLAN_OPERATOR_NAMESPCE": "demo",  # misspelled
        "DYNOPLAN_OPERATOR_NAMESPACE": "demo",  # a setting
        "DYNOPLAN_OPERATOR_COLOUR": "blue",  # nothing close
        # what Kubernetes injects for a Service named dynoplan-operator (enableServiceLinks)
        "DYNOPLAN_OPERATOR_SERVICE_HOST": "10.0.0.1",
        "DYNOPLAN_OPERATOR_SERVICE_PORT": "8080",
        "DYNOPLAN_OPERATOR_SERVICE_PORT_METRICS": "8080",
        "DYNOPLAN_OPERATOR_PORT": "tcp://10.0.0.1:8080",
        "DYNOPLAN_OPERATOR_PORT_8080_TCP": "tcp://10.0.0.1:8080",
        "DYNOPLAN_OPERATOR_PORT_8080_TCP_ADDR": "10.0.0.1",
        "DYNOPLAN_OPERATOR_PORT_8080_TCP_PORT": "8080",
        "DYNOPLAN_OPERATOR_PORT_8080_TCP_PROTO": "tcp",
        "HOME": "/root",
    }
    assert ignored_env_variables(env) == [
        "DYNOPLAN_OPERATOR_COLOUR: not a setting, ignored (settings: DYNOPLAN_OPERATOR_<FIELD>, docs/operator.md)",
        "DYNOPLAN_OPERATOR_NAMESPCE: not a setting, ignored; did you mean DYNOPLAN_OPERATOR_NAMESPACE?",
    ]
    s = settings_from_env(env)  # ignored, not refused
    assert s.namespace == "demo"
