"""The chart's values are validated before anything is installed: ``values.schema.json`` (unknown keys,
types, bounds, enums) and the template's cross-field checks (``dynoplan.validate``), in step with the
operator's own validation (``PlannerConfig``, ``OperatorSettings``) so that a value helm accepts never
crashes the new operator after the old one is gone (the Deployment's strategy is Recreate).

The schema's ``planner:`` and ``operator.settings:`` parts are generated from those models
(``planner.operator.schemas``, checked by tests/operator/test_schemas.py); here the generated schema is checked
against the code field by field with ``jsonschema`` (installed with the dev extra's ``openapi-spec-validator``)
on candidate values, as the chart hands them to the operator, and through ``helm template`` / ``helm lint``
for the messages a user sees.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from dynoplan.errors import ConfigError, SettingsError
from planner.core import PlannerConfig, config_from_mapping
from planner.operator.settings import OperatorSettings, settings_from_mapping

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "dynoplan"
SCHEMA = json.loads((CHART / "values.schema.json").read_text())
VALUES = yaml.safe_load((CHART / "values.yaml").read_text())
CHART_SET_SETTINGS = {"namespace", "planner_defaults_file"}  # the chart sets these itself

# Candidate values for every field: each is judged by the schema and by the code (no infinities: helm's
# values are JSON for the schema check, which has none).
CANDIDATES: list[Any] = [
    -5,
    -1,
    0,
    0.25,
    0.5,
    1,
    2,
    5,
    100.5,
    65535,
    65536,
    1e6,
    5e6,
    2**31 - 1,
    2**31,
    None,
    True,
    False,
    "fast",
    "",
    "xml",
    "json",
    "plain",
    "agg",
    "disagg",
    "kalman",
    "auto",
    "http://p:9090",
    "ftp://p",
    [],
    ["constant"],
    ["auto"],
    ["constant", "prophet"],
    ["x"],
    {},
    {"min_replicas": 0},
    {"min_replicas": 2, "max_replicas": 3, "gpus_per_engine": 2},
    {"min_replicas": -1},
    {"gpus_per_engine": 0},
    {"max_replicas": None},
    {"frobnicate": 1},
    {"min_replicas": 1.5},
]
# A base where no cross-field rule of the code binds for these candidates (they are the template's checks,
# tested through helm below): the interval pair, the GPU budget pair and the pools' minimums.
PLANNER_SLACK = {
    "adjustment_interval_s": 1e15,
    "load_adjustment_interval_s": 1e-9,
    "max_gpu_budget": 2**40,
    "min_gpu_budget": 0,
    "load_enabled": True,
    **{p: {"min_replicas": 0, "max_replicas": None, "gpus_per_engine": 1} for p in ("prefill", "decode", "agg")},
}
SETTINGS_SLACK = {"planner_min_sleep_s": 1e-9, "planner_max_sleep_s": 1e15}


def schema_errors(values: dict[str, Any], path: tuple[str, ...]) -> list[str]:
    """Schema errors at or below ``path`` for ``values``."""
    v = jsonschema.Draft7Validator(SCHEMA)
    return [e.message for e in v.iter_errors(values) if tuple(e.absolute_path)[: len(path)] == path]


def with_value(path: tuple[str, ...], value: Any, base: dict[str, Any] | None = None) -> dict[str, Any]:
    values = json.loads(json.dumps(VALUES))
    cur = values
    for k in path[:-1]:
        cur = cur[k]
    if base:
        cur.update(json.loads(json.dumps(base)))
    cur[path[-1]] = value
    return values


def same_type(value: Any, default: Any, optional: bool) -> bool:
    """``value`` has the field's own type (the schema is allowed to be stricter only on other types:
    strings such as ``"16"`` or ``"true"``, which the code reads as environment text, dynoplan.settings_text)."""
    if value is None:
        return optional
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(value, bool) and isinstance(default, bool)
    if isinstance(default, float) or (default is None and isinstance(value, (int, float))):
        return isinstance(value, (int, float))
    if isinstance(default, int):
        return isinstance(value, int)
    return type(value) is type(default) or (isinstance(default, (list, tuple)) and isinstance(value, list))


def rendered(value: Any) -> Any:
    """``value`` as the operator receives it from the chart: helm's values are float64, and an integral one
    reaches the code as an integer (``toYaml`` writes ``1000000``; the operator's environment is written in
    digits by templates/operator.yaml, tests/operator/test_chart.py checks it)."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def planner_code_ok(key: str, value: Any) -> bool:
    try:
        config_from_mapping({**PLANNER_SLACK, key: rendered(value)})
        return True
    except ConfigError:
        return False


def settings_code_ok(key: str, value: Any) -> bool:
    try:
        settings_from_mapping({**SETTINGS_SLACK, key: rendered(value)})
        return True
    except SettingsError:
        return False


def test_every_object_of_the_values_schema_refuses_unknown_keys():
    """The generated parts (planner.operator.schemas) and the hand-written rest alike; the chart's own values
    pass (tests/operator/test_schemas.py checks the generated parts are the models')."""

    def walk(node: dict[str, Any], where: str) -> None:
        if node.get("type") == "object" and "properties" in node:
            assert node.get("additionalProperties") is False, where
            for k, sub in node["properties"].items():
                walk(sub, f"{where}.{k}")

    walk(SCHEMA, "values")
    assert jsonschema.Draft7Validator(SCHEMA).is_valid(VALUES)


@pytest.mark.parametrize("field", [f.name for f in dataclasses.fields(PlannerConfig)])
def test_planner_schema_agrees_with_planner_config(field):
    default = PlannerConfig().to_dict()[field]
    optional = "None" in str(next(f for f in dataclasses.fields(PlannerConfig) if f.name == field).type)
    disagree = []
    for value in CANDIDATES:
        schema_ok = not schema_errors(with_value(("planner", field), value, PLANNER_SLACK), ("planner",))
        code_ok = planner_code_ok(field, value)
        if schema_ok and not code_ok:
            disagree.append(f"{value!r}: the schema accepts what the planner refuses")
        if code_ok and not schema_ok and same_type(value, default, optional) and not isinstance(default, dict):
            disagree.append(f"{value!r}: the schema refuses what the planner accepts")
    assert not disagree, f"planner.{field}: " + "; ".join(disagree)


@pytest.mark.parametrize("field", sorted({f.name for f in dataclasses.fields(OperatorSettings)} - CHART_SET_SETTINGS))
def test_operator_settings_schema_agrees_with_operator_settings(field):
    default = getattr(OperatorSettings(), field)
    # Stricter in the chart, on purpose: the probes and the scrape need their ports, the KopfPeering name
    # is a Kubernetes object name, and "" means "computed by the chart" for these two.
    chart_stricter = {("health_port", 0), ("metrics_port", 0)}
    disagree = []
    for value in CANDIDATES:
        if value == "" and field in ("prometheus_url", "worker_image"):
            continue
        schema_ok = not schema_errors(
            with_value(("operator", "settings", field), value, SETTINGS_SLACK), ("operator", "settings")
        )
        code_ok = settings_code_ok(field, value)
        if schema_ok and not code_ok:
            disagree.append(f"{value!r}: the schema accepts what the operator refuses")
        if (
            code_ok
            and not schema_ok
            and same_type(value, default, False)
            and not isinstance(default, str)
            and (field, value) not in chart_stricter
        ):
            disagree.append(f"{value!r}: the schema refuses what the operator accepts")
    assert not disagree, f"operator.settings.{field}: " + "; ".join(disagree)


def helm(helm_bin: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(helm_bin), *args], capture_output=True, text=True, timeout=60)


@pytest.mark.integration
def test_helm_refuses_bad_values_naming_each_key(helm_bin):
    """The fresh user's values: each refused by helm template, lint and install (same validation), the
    message naming the key."""
    bad = {
        "operator.replcas=2": "'replcas' not allowed",
        "imagee.tag=x": "'imagee' not allowed",
        "operator.settings.frobnicate=1": "'frobnicate' not allowed",
        "prometheus.deploy=maybe": "/prometheus/deploy",
        "operator.settings.dgd_resync_s=fast": "/operator/settings/dgd_resync_s",
        "operator.settings.log_format=xml": "/operator/settings/log_format",
        "planner.ttft_ms=-5": "/planner/ttft_ms",
        "operator.replicas=two": "/operator/replicas",
        "planner.predictor=magic": "/planner/predictor",
        "example.maxWorkers=0": "/example/maxWorkers",
    }
    for s, expect in bad.items():
        p = helm(helm_bin, "template", "rel", str(CHART), "--set", s)
        assert p.returncode != 0 and expect in p.stderr, (s, p.stderr)
        assert len(p.stderr) < 600, (s, p.stderr)  # a message, not a dump
    lint = helm(helm_bin, "lint", str(CHART), "--strict", "--set", "operator.settings.log_format=xml")
    assert lint.returncode != 0 and "/operator/settings/log_format" in lint.stdout + lint.stderr


@pytest.mark.integration
def test_helm_refuses_cross_field_values_the_operator_would_refuse(helm_bin):
    cases = [
        (
            ["planner.load_adjustment_interval_s=200"],
            "planner.load_adjustment_interval_s=200: expected less than planner.adjustment_interval_s=180",
        ),
        (["planner.throughput_enabled=false"], "expected at least one loop enabled"),
        (["planner.min_gpu_budget=9"], "planner.min_gpu_budget=9: expected <= planner.max_gpu_budget=8"),
        (
            ["planner.agg.min_replicas=5", "planner.agg.max_replicas=2"],
            "planner.agg.min_replicas=5: expected <= planner.agg.max_replicas=2",
        ),
        (
            ["planner.mode=agg", "planner.agg.min_replicas=5", "planner.agg.gpus_per_engine=2"],
            "planner.max_gpu_budget=8: expected >= 10 GPUs",
        ),
        (
            ["operator.settings.planner_min_sleep_s=9"],
            "operator.settings.planner_min_sleep_s=9: expected <= operator.settings.planner_max_sleep_s=5",
        ),
    ]
    for sets, expect in cases:
        args = ["template", "rel", str(CHART)]
        for s in sets:
            args += ["--set", s]
        p = helm(helm_bin, *args)
        assert p.returncode != 0 and expect in p.stderr, (sets, p.stderr)
        # ... and the code refuses the same values (the template mirrors it, not more)
        data: dict[str, Any] = {}
        for s in sets:
            k, v = s.split("=", 1)
            parts = k.split(".")
            if parts[0] == "planner":
                data[parts[1] if len(parts) == 2 else f"{parts[1]}_{parts[2]}"] = v
        if data:
            with pytest.raises(ConfigError):
                config_from_mapping(data)
        else:
            with pytest.raises(SettingsError):
                settings_from_mapping({k.split(".")[-1]: v for k, v in (s.split("=", 1) for s in sets)})
    # in range: accepted
    ok = helm(
        helm_bin,
        "template",
        "rel",
        str(CHART),
        "--set",
        "planner.load_adjustment_interval_s=179",
        "--set",
        "planner.mode=agg",
        "--set",
        "planner.agg.min_replicas=2",
        "--set",
        "planner.agg.max_replicas=2",
    )
    assert ok.returncode == 0, ok.stderr


def render(helm_bin: Path, *args: str) -> list[dict[str, Any]]:
    p = helm(helm_bin, "template", "dynoplan", str(CHART), "-n", "dynoplan", *args)
    assert p.returncode == 0, p.stderr
    return [d for d in yaml.safe_load_all(p.stdout) if d]


@pytest.mark.integration
def test_example_and_its_load_are_separate_files_and_the_dgd_leaves_worker_replicas_to_the_planner(helm_bin):
    """docs/kubernetes.md: example.yaml (DGD, Service, DynoPlanner) and load.yaml (the Job) are rendered separately, so
    running the load again re-applies only the Job; the DGD has no worker ``replicas``, so applying
    example.yaml again cannot reset what the planner scaled to."""
    ex = render(helm_bin, "--set", "example.enabled=true", "--show-only", "templates/example.yaml")
    assert sorted(d["kind"] for d in ex) == ["DynamoGraphDeployment", "DynoPlanner", "Service"]
    dgd = next(d for d in ex if d["kind"] == "DynamoGraphDeployment")
    assert "replicas" not in dgd["spec"]["services"]["VllmWorker"]
    assert dgd["spec"]["services"]["Frontend"]["replicas"] == 1
    load = render(helm_bin, "--set", "example.enabled=true", "--show-only", "templates/example-load.yaml")
    assert [(d["kind"], d["metadata"]["name"]) for d in load] == [("Job", "mocker-agg-load")]
    pinned = render(
        helm_bin,
        "--set",
        "example.enabled=true",
        "--set",
        "example.workerReplicas=2",
        "--show-only",
        "templates/example.yaml",
    )
    assert (
        next(d for d in pinned if d["kind"] == "DynamoGraphDeployment")["spec"]["services"]["VllmWorker"]["replicas"]
        == 2
    )
    off = helm(
        helm_bin,
        "template",
        "dynoplan",
        str(CHART),
        "--set",
        "example.enabled=true",
        "--set",
        "example.load.enabled=false",
        "--show-only",
        "templates/example-load.yaml",
    )
    assert off.returncode != 0 and "could not find template" in off.stderr  # renders nothing


@pytest.mark.integration
def test_uninstall_hook_removes_only_the_operators_finalizer(helm_bin):
    docs = render(helm_bin)
    hook = [d for d in docs if (d["metadata"].get("annotations") or {}).get("helm.sh/hook") == "post-delete"]
    assert sorted(d["kind"] for d in hook) == ["Job", "Role", "RoleBinding", "ServiceAccount"]
    weights = {d["kind"]: int(d["metadata"]["annotations"]["helm.sh/hook-weight"]) for d in hook}
    assert weights["Job"] > max(weights[k] for k in ("Role", "RoleBinding", "ServiceAccount"))  # RBAC first
    role = next(d for d in hook if d["kind"] == "Role")
    assert {
        (g, r, tuple(rule["verbs"])) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]
    } == {
        ("nvidia.com", "dynamographdeployments", ("list", "patch")),
        ("dynoplan.dev", "dynoplanners", ("list", "patch")),
    }
    job = next(d for d in hook if d["kind"] == "Job")
    c = job["spec"]["template"]["spec"]["containers"][0]
    script = c["args"][0]
    compile(script, "uninstall-hook", "exec")
    assert '"dynoplan.dev/finalizer"' in script and '"dynoplan"' in script  # the release namespace
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert job["spec"]["template"]["spec"]["serviceAccountName"] == "dynoplan-dynoplan-uninstall"
