"""The committed Helm values schema and DynoPlanner CRD are the ones the settings models give
(planner.operator.schemas), the CRD stays a Kubernetes structural schema, and today's examples pass them."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from planner.core import PlannerConfig
from planner.operator import schemas

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "dynoplan"


def _crd_schema() -> dict[str, Any]:
    crd = yaml.safe_load(schemas.CRDS[0].read_text())
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]  # type: ignore[no-any-return]


def _merged(base: Any, over: Any) -> Any:
    """helm's merge of a values file over the chart's values.yaml."""
    if isinstance(base, dict) and isinstance(over, dict):
        return {k: _merged(base.get(k), over[k]) if k in over else base[k] for k in {**base, **over}}
    return over


def test_committed_files_are_the_generated_ones():
    stale = [str(p.relative_to(REPO)) for p, text in schemas.generated().items() if p.read_text() != text]
    assert not stale, f"run python -m planner.operator.schemas: {stale}"
    assert schemas.CRDS[0].read_text() == schemas.CRDS[1].read_text()  # the chart's copy


def test_generated_parts_follow_the_models():
    values = json.loads(schemas.VALUES_SCHEMA.read_text())
    planner = values["properties"]["planner"]
    assert planner["properties"]["ttft_ms"] == {
        "default": 500.0,
        "description": PlannerConfig.__pydantic_fields__["ttft_ms"].description,
        "exclusiveMinimum": 0,
        "maximum": 3600000.0,
        "type": "number",
    }
    assert planner["properties"]["early_sizing_s"]["type"] == ["number", "null"]
    assert planner["properties"]["agg"]["properties"]["max_replicas"]["type"] == ["integer", "null"]
    settings = values["properties"]["operator"]["properties"]["settings"]["properties"]
    assert "namespace" not in settings and "planner_defaults_file" not in settings  # the chart sets them
    assert settings["health_port"]["minimum"] == 1 and settings["health_port"]["maximum"] == 65535
    spec = _crd_schema()["properties"]["spec"]["properties"]
    # OpenAPI v3.0 bounds and nullability, no defaults but the mode's
    assert spec["sla"]["properties"]["ttftMs"] == {
        "description": PlannerConfig.__pydantic_fields__["ttft_ms"].description,
        "minimum": 0,
        "exclusiveMinimum": True,
        "maximum": 3600000.0,
        "type": "number",
    }
    assert spec["replicas"]["properties"]["maxWorker"]["nullable"] is True
    assert spec["mode"]["default"] == "disagg" and spec["mode"]["enum"] == ["disagg", "prefill", "decode", "agg"]
    assert "default" not in spec["load"]["properties"]["scaleDownSensitivity"]


def test_crd_is_a_structural_schema():
    """No $ref/$defs/anyOf, a type on every node but where unknown fields are preserved, and no
    additionalProperties next to properties (the apiserver refuses a CRD otherwise)."""
    problems: list[str] = []

    def walk(node: dict[str, Any], where: str) -> None:
        for bad in ("$ref", "$defs", "anyOf", "oneOf", "allOf", "title"):
            if bad in node:
                problems.append(f"{where}: {bad}")
        if "type" not in node and not node.get("x-kubernetes-preserve-unknown-fields"):
            problems.append(f"{where}: no type")
        if "properties" in node and "additionalProperties" in node:
            problems.append(f"{where}: additionalProperties with properties")
        for k, sub in (node.get("properties") or {}).items():
            walk(sub, f"{where}.{k}")
        if isinstance(node.get("items"), dict):
            walk(node["items"], f"{where}[]")

    walk(_crd_schema(), "openAPIV3Schema")
    assert not problems
    # x-kubernetes-preserve-unknown-fields only where it was before the generation
    preserved = []

    def find(node: dict[str, Any], where: str) -> None:
        if node.get("x-kubernetes-preserve-unknown-fields"):
            preserved.append(where)
        for k, sub in (node.get("properties") or {}).items():
            find(sub, f"{where}.{k}")

    find(_crd_schema(), "")
    assert preserved == [".spec.settings", ".spec.engine", ".status", ".status.observed", ".status.predicted"]


def _crd_validator() -> jsonschema.Draft4Validator:
    """The CRD schema for jsonschema: OpenAPI v3.0's bounds are draft-04's; ``nullable`` as a null type."""
    schema = copy.deepcopy(_crd_schema())

    def conv(node: dict[str, Any]) -> None:
        if node.pop("nullable", False):
            node["type"] = [node["type"], "null"]
        for sub in (node.get("properties") or {}).values():
            conv(sub)
        if isinstance(node.get("items"), dict):
            conv(node["items"])

    conv(schema)
    return jsonschema.Draft4Validator(schema)


def test_crd_schema_refuses_what_the_planner_refuses_field_by_field():
    v = _crd_validator()
    base = {
        "apiVersion": "dynoplan.dev/v1alpha1",
        "kind": "DynoPlanner",
        "metadata": {"name": "p"},
        "spec": {"targetRef": {"name": "g"}},
    }

    def ok(**spec: Any) -> bool:
        return v.is_valid({**base, "spec": {**base["spec"], **spec}})

    assert ok(sla={"ttftMs": 300, "itlMs": 20.5}, replicas={"maxWorker": None, "minWorker": 0})
    assert not ok(sla={"ttftMs": 0}) and not ok(sla={"ttftMs": 4e6}) and not ok(sla={"itlMs": "20"})
    assert not ok(replicas={"minWorker": -1}) and not ok(replicas={"minWorker": True})
    assert not ok(throughput={"predictor": "lstm"}) and not ok(mode="both")
    assert not ok(load={"scaleDownSensitivity": 1.5}) and not ok(load={"enabled": "yes"})


def test_todays_values_files_pass_the_values_schema():
    v = jsonschema.Draft7Validator(json.loads(schemas.VALUES_SCHEMA.read_text()))
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert not [e.message for e in v.iter_errors(values)]
    e2e = yaml.safe_load((REPO / "tests" / "e2e" / "values-e2e.yaml").read_text())
    assert not [e.message for e in v.iter_errors(_merged(values, e2e))]
    # and a planner value the code refuses is refused by the schema too
    bad = _merged(values, {"planner": {"ttft_ms": True}})
    assert [e.message for e in v.iter_errors(bad)] == ["True is not of type 'number'"]


@pytest.mark.integration
def test_the_charts_example_dynoplanner_passes_the_crd(helm_bin):
    import subprocess

    p = subprocess.run(
        [
            str(helm_bin),
            "template",
            "dynoplan",
            str(CHART),
            "--set",
            "example.enabled=true",
            "--show-only",
            "templates/example.yaml",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert p.returncode == 0, p.stderr
    planners = [d for d in yaml.safe_load_all(p.stdout) if d and d["kind"] == "DynoPlanner"]
    assert len(planners) == 1
    assert not [e.message for e in _crd_validator().iter_errors(planners[0])]
