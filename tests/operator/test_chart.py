"""The Helm chart: lint, values in step with the settings dataclasses, CRDs identical to crds/, least-
privilege Role, hardened operator Pod, optional parts switch on and off."""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

import pytest
import yaml

from planner.core import PlannerConfig
from planner.operator.settings import OperatorSettings, settings_from_env

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "dynoplan"

pytestmark = pytest.mark.integration


def render(helm_bin: Path, *sets: str, ns: str = "demo") -> list[dict]:
    args = [str(helm_bin), "template", "rel", str(CHART), "--namespace", ns]
    for s in sets:
        args += ["--set", s]
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def by_kind(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


def test_helm_lint(helm_bin):
    out = subprocess.run([str(helm_bin), "lint", str(CHART), "--strict"], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    out = subprocess.run(
        [str(helm_bin), "lint", str(CHART), "--strict", "--set", "example.enabled=true"], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_values_mirror_planner_config_and_operator_settings():
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    # `planner:` is PlannerConfig field for field, with its defaults.
    assert values["planner"] == PlannerConfig().to_dict()
    # `operator.settings:` is every OperatorSettings field but the two the chart sets itself.
    fields = {f.name for f in dataclasses.fields(OperatorSettings)} - {"namespace", "planner_defaults_file"}
    assert set(values["operator"]["settings"]) == fields
    defaults = OperatorSettings()
    for k, v in values["operator"]["settings"].items():
        if k not in ("prometheus_url", "worker_image"):  # chart-computed when empty
            assert v == getattr(defaults, k), k


def test_chart_crds_are_the_repository_crds():
    for f in (REPO / "crds").glob("*.yaml"):
        assert (CHART / "crds" / f.name).read_text() == f.read_text(), f.name
    assert sorted(p.name for p in (CHART / "crds").glob("*.yaml")) == sorted(
        p.name for p in (REPO / "crds").glob("*.yaml")
    )


def test_operator_pod_hardened_and_env_from_values(helm_bin):
    docs = render(helm_bin, "operator.settings.shared_gpu_budget=12")
    dep = next(d for d in by_kind(docs, "Deployment") if d["metadata"]["name"] == "rel-dynoplan-operator")
    pod = dep["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["serviceAccountName"] == "rel-dynoplan"
    assert (
        c["securityContext"]["readOnlyRootFilesystem"] is True
        and c["securityContext"]["allowPrivilegeEscalation"] is False
    )
    assert c["resources"]["requests"] == {"cpu": "100m", "memory": "256Mi"}
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["DYNOPLAN_OPERATOR_SHARED_GPU_BUDGET"] == "12"
    assert env["DYNOPLAN_OPERATOR_PROMETHEUS_URL"] == "http://rel-dynoplan-prometheus.demo.svc:9090"
    assert env["DYNOPLAN_OPERATOR_WORKER_IMAGE"] == "dynoplan:latest"
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    cm = next(d for d in by_kind(docs, "ConfigMap") if d["metadata"]["name"].endswith("planner-defaults"))
    assert yaml.safe_load(cm["data"]["planner.yaml"]) == PlannerConfig().to_dict()


def test_operator_env_writes_whole_numbers_of_a_values_file_in_digits(helm_bin, tmp_path):
    # a values file's numbers are float64 to helm, which prints 2147483647 as 2.147483647e+09; the operator
    # reads its environment by the grammar of a settings file (decimal integers only, dynoplan.settings_text)
    values = tmp_path / "v.yaml"
    values.write_text("operator:\n  settings:\n    peering_priority: 2147483647\n    shared_gpu_budget: 1000000\n")
    args = [str(helm_bin), "template", "rel", str(CHART), "--namespace", "demo", "-f", str(values)]
    docs = [d for d in yaml.safe_load_all(subprocess.run(args, capture_output=True, text=True, check=True).stdout) if d]
    dep = next(d for d in by_kind(docs, "Deployment") if d["metadata"]["name"] == "rel-dynoplan-operator")
    env = {e["name"]: e["value"] for e in dep["spec"]["template"]["spec"]["containers"][0]["env"] if "value" in e}
    assert (env["DYNOPLAN_OPERATOR_PEERING_PRIORITY"], env["DYNOPLAN_OPERATOR_SHARED_GPU_BUDGET"]) == (
        "2147483647",
        "1000000",
    )
    assert env["DYNOPLAN_OPERATOR_PLANNER_MIN_SLEEP_S"] == "0.5"
    s = settings_from_env(env)
    assert (s.peering_priority, s.shared_gpu_budget, s.planner_min_sleep_s) == (2147483647, 1000000, 0.5)


def test_rbac_is_namespaced_and_shrinks_with_options(helm_bin):
    docs = render(helm_bin)
    assert by_kind(docs, "ClusterRole") == [] and by_kind(docs, "ClusterRoleBinding") == []
    role = next(d for d in by_kind(docs, "Role") if d["metadata"]["name"] == "rel-dynoplan")
    res = {(g, r) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]}
    assert ("apps", "deployments") in res and ("kopf.dev", "kopfpeerings") in res
    assert all("*" not in rule["verbs"] and "*" not in rule["resources"] for rule in role["rules"])
    docs = render(helm_bin, "operator.settings.reconcile_dgd=false", "operator.settings.standalone=true")
    role = next(d for d in by_kind(docs, "Role") if d["metadata"]["name"] == "rel-dynoplan")
    res = {(g, r) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]}
    assert (
        ("apps", "deployments") not in res and ("", "services") not in res and ("kopf.dev", "kopfpeerings") not in res
    )
    assert by_kind(docs, "KopfPeering") == []


def test_optional_parts(helm_bin):
    base = render(helm_bin)
    assert by_kind(base, "ServiceMonitor") == []
    # the only Job without the example: the post-delete hook (templates/uninstall-hook.yaml)
    assert [j["metadata"]["name"] for j in by_kind(base, "Job")] == ["rel-dynoplan-uninstall"]
    dash = next(d for d in by_kind(base, "ConfigMap") if d["metadata"]["name"].endswith("dashboard"))
    import json

    board = json.loads(dash["data"]["dynoplan.json"])
    exprs = " ".join(t["expr"] for p in board["panels"] for t in p["targets"])
    assert dash["metadata"]["labels"]["grafana_dashboard"] == "1"
    for name in (
        "dynamo_planner_num_decode_replicas",
        "dynamo_planner_observed_requests_per_second",
        "dynamo_planner_predicted_requests_per_second",
        "dynoplan_planner_ttft_target_ms",
        "dynoplan_planner_itl_target_ms",
    ):
        assert name in exprs, name
    none = render(helm_bin, "prometheus.deploy=false", "grafana.dashboard=false")
    assert not any(d["metadata"]["name"].endswith("prometheus") for d in none)
    assert not any(d["metadata"]["name"].endswith("dashboard") for d in none)
    sm = render(helm_bin, "prometheus.serviceMonitor=true")
    assert len(by_kind(sm, "ServiceMonitor")) == 2
    ex = render(helm_bin, "example.enabled=true")
    kinds = sorted(
        d["kind"]
        for d in ex
        if d["apiVersion"] in ("nvidia.com/v1alpha1", "dynoplan.dev/v1alpha1", "batch/v1")
        and "helm.sh/hook" not in (d["metadata"].get("annotations") or {})
    )
    assert kinds == ["DynamoGraphDeployment", "DynoPlanner", "Job"]


def _walkthrough() -> str:
    text = (REPO / "docs" / "kubernetes.md").read_text()
    start = text.index("## Kubernetes walkthrough")
    return text[start : text.index("\n## ", start + 10)]


def test_readme_walkthrough_names_exist(helm_bin):
    """A fresh user's pass over the Kubernetes walkthrough (docs/kubernetes.md): the kind cluster name, every file it
    names, and every object name it uses (rendered with the walkthrough's release name and namespace)."""
    import re

    text = _walkthrough()
    kind_cfg = yaml.safe_load((REPO / "kind-config.yaml").read_text())
    assert kind_cfg["kind"] == "Cluster" and kind_cfg["apiVersion"] == "kind.x-k8s.io/v1alpha4"
    assert f"kind load docker-image dynoplan:latest --name {kind_cfg['name']}" in text
    for path in re.findall(r"`((?:helm|crds|examples|docs|tools)/[\w./-]+)`", text) + [
        "Dockerfile",
        "kind-config.yaml",
    ]:
        assert (REPO / path).exists(), path
    # helm install dynoplan helm/dynoplan -n dynoplan ... then the example rendered the same way
    args = [
        str(helm_bin),
        "template",
        "dynoplan",
        str(CHART),
        "--namespace",
        "dynoplan",
        "--set",
        "example.enabled=true",
    ]
    docs = [d for d in yaml.safe_load_all(subprocess.run(args, capture_output=True, text=True, check=True).stdout) if d]
    names = {(d["kind"], d["metadata"]["name"]) for d in docs}
    for kind, name in (
        ("Deployment", "dynoplan-dynoplan-operator"),
        ("ConfigMap", "dynoplan-dynoplan-dashboard"),
        ("Service", "dynoplan-dynoplan-prometheus"),
        ("Job", "mocker-agg-load"),
    ):
        assert (kind, name) in names and name in text, (kind, name)
    dash = next(d for d in docs if d["metadata"]["name"] == "dynoplan-dynoplan-dashboard")
    assert dash["metadata"]["labels"].get("grafana_dashboard") == "1"
    # every image of the example runs with a pull policy that works with `kind load` (no registry)
    for d in docs:
        if d["kind"] in ("Deployment", "Job"):
            for c in d["spec"]["template"]["spec"]["containers"]:
                if c["image"].startswith("dynoplan:"):
                    assert c.get("imagePullPolicy") == "IfNotPresent", d["metadata"]["name"]
