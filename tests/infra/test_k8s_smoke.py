"""Smoke tests of the real control plane (etcd + kube-apiserver built from Go modules) and helm."""

from __future__ import annotations

import subprocess
import threading
import time
import uuid
from pathlib import Path

import kubernetes
import pytest
import requests
import yaml
from kubernetes.client.rest import ApiException
from kubernetes.dynamic import DynamicClient

from tests.infra.k8s import ControlPlane, pinned_versions

pytestmark = pytest.mark.integration

GROUP, VERSION, PLURAL = "infra-test.dynoplan.io", "v1", "widgets"


def widget_crd() -> dict:
    """A tiny namespaced CRD with a structural schema (replicas >= 0) and a status subresource."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"plural": PLURAL, "singular": "widget", "kind": "Widget", "shortNames": ["wdg"]},
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "spec": {
                                    "type": "object",
                                    "properties": {
                                        "replicas": {"type": "integer", "minimum": 0},
                                        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                                    },
                                },
                                "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                            },
                        }
                    },
                }
            ],
        },
    }


def ensure_crd(api: kubernetes.client.ApiClient) -> None:
    """Server-side apply the CRD (as the chart will be applied later) and wait until Established."""
    dyn = DynamicClient(api)
    crds = dyn.resources.get(api_version="apiextensions.k8s.io/v1", kind="CustomResourceDefinition")
    crds.server_side_apply(body=widget_crd(), field_manager="dynoplan-tests", force_conflicts=True)
    ext = kubernetes.client.ApiextensionsV1Api(api)

    def established() -> bool:
        crd = ext.read_custom_resource_definition(f"{PLURAL}.{GROUP}")
        return any(c.type == "Established" and c.status == "True" for c in (crd.status.conditions or []))

    from tests.infra._proc import wait_until

    wait_until(established, 30, "CRD Established")


def new_namespace(api: kubernetes.client.ApiClient) -> str:
    name = f"t-{uuid.uuid4().hex[:8]}"
    kubernetes.client.CoreV1Api(api).create_namespace({"metadata": {"name": name}})
    return name


def test_server_version_matches_pinned_build(k8s: ControlPlane, k8s_admin):
    info = kubernetes.client.VersionApi(k8s_admin).get_code()
    assert info.git_version == pinned_versions()["KUBERNETES_VERSION"]
    # Unauthenticated requests are anonymous; RBAC gives them only discovery/health endpoints.
    r = requests.get(f"{k8s.url}/api/v1/namespaces", verify=str(k8s.ca_file), timeout=5)
    assert r.status_code in (401, 403)


def test_crd_custom_object_merge_patch_and_watch(k8s_admin):
    ensure_crd(k8s_admin)
    ns = new_namespace(k8s_admin)
    co = kubernetes.client.CustomObjectsApi(k8s_admin)
    obj = co.create_namespaced_custom_object(
        GROUP,
        VERSION,
        ns,
        PLURAL,
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "Widget",
            "metadata": {"name": "w1"},
            "spec": {"replicas": 1, "labels": {"a": "1", "b": "2"}},
        },
    )
    assert obj["spec"]["replicas"] == 1
    rv0 = obj["metadata"]["resourceVersion"]

    # The schema is enforced by the real apiserver: replicas must be >= 0.
    with pytest.raises(ApiException) as bad:
        co.create_namespaced_custom_object(
            GROUP,
            VERSION,
            ns,
            PLURAL,
            {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "Widget",
                "metadata": {"name": "bad"},
                "spec": {"replicas": -1},
            },
        )
    assert bad.value.status == 422 and "replicas" in bad.value.body

    # Watch from rv0 in a thread, then JSON-merge-patch: replicas 1 -> 3, drop label b, keep label a.
    events: list[dict] = []
    w = kubernetes.watch.Watch()

    def watch() -> None:
        for ev in w.stream(
            co.list_namespaced_custom_object, GROUP, VERSION, ns, PLURAL, resource_version=rv0, timeout_seconds=20
        ):
            events.append(ev)
            if ev["type"] == "MODIFIED":
                w.stop()

    t = threading.Thread(target=watch)
    t.start()
    widgets = DynamicClient(k8s_admin).resources.get(api_version=f"{GROUP}/{VERSION}", kind="Widget")
    patched = widgets.patch(
        name="w1",
        namespace=ns,
        content_type="application/merge-patch+json",
        body={"spec": {"replicas": 3, "labels": {"b": None}}},
    ).to_dict()
    t.join(30)
    assert not t.is_alive()
    assert patched["spec"] == {"replicas": 3, "labels": {"a": "1"}}
    modified = [e for e in events if e["type"] == "MODIFIED"]
    assert modified and modified[0]["object"]["spec"]["replicas"] == 3
    assert int(modified[0]["object"]["metadata"]["resourceVersion"]) > int(rv0)

    # Optimistic concurrency: an update carrying the stale resourceVersion is a 409 Conflict.
    stale = dict(obj, spec={"replicas": 5})
    with pytest.raises(ApiException) as conflict:
        co.replace_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "w1", stale)
    assert conflict.value.status == 409


def test_service_account_token_is_bound_by_rbac(k8s: ControlPlane, k8s_admin):
    ensure_crd(k8s_admin)
    ns = new_namespace(k8s_admin)
    token = k8s.service_account_token(ns, "nobody")
    with kubernetes.client.ApiClient(k8s.configuration_for_token(token)) as sa_api:
        co = kubernetes.client.CustomObjectsApi(sa_api)
        auth = kubernetes.client.AuthenticationV1Api(sa_api)
        me = auth.create_self_subject_review({}).status.user_info
        assert me.username == f"system:serviceaccount:{ns}:nobody"
        with pytest.raises(ApiException) as denied:
            co.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)
        assert denied.value.status == 403

        # Grant exactly get/list on widgets in this namespace: list works, create stays forbidden.
        rbac = kubernetes.client.RbacAuthorizationV1Api(k8s_admin)
        rbac.create_namespaced_role(
            ns,
            {
                "metadata": {"name": "widget-reader"},
                "rules": [{"apiGroups": [GROUP], "resources": [PLURAL], "verbs": ["get", "list"]}],
            },
        )
        rbac.create_namespaced_role_binding(
            ns,
            {
                "metadata": {"name": "widget-reader"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "widget-reader"},
                "subjects": [{"kind": "ServiceAccount", "name": "nobody", "namespace": ns}],
            },
        )
        # The RBAC authorizer learns new bindings through its informer cache: allow it a few seconds.
        deadline = time.monotonic() + 20.0
        while True:
            try:
                items = co.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)["items"]
                break
            except ApiException as e:
                if e.status != 403 or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        assert items == []
        with pytest.raises(ApiException) as still_denied:
            co.create_namespaced_custom_object(
                GROUP,
                VERSION,
                ns,
                PLURAL,
                {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Widget", "metadata": {"name": "x"}, "spec": {}},
            )
        assert still_denied.value.status == 403


def test_restart_apiserver_keeps_objects(k8s: ControlPlane, k8s_admin):
    ns = new_namespace(k8s_admin)
    core = kubernetes.client.CoreV1Api(k8s_admin)
    core.create_namespaced_config_map(ns, {"metadata": {"name": "before"}, "data": {"k": "v"}})
    k8s.restart_apiserver(down_s=0.5)
    # The same client configuration works again; the object was kept in etcd.
    assert core.read_namespaced_config_map("before", ns).data == {"k": "v"}


def test_apiserver_down_gives_connection_errors(k8s: ControlPlane):
    k8s.stop_apiserver()
    try:
        with pytest.raises(requests.ConnectionError):
            requests.get(f"{k8s.url}/readyz", verify=str(k8s.ca_file), timeout=5)
    finally:
        k8s.start_apiserver()
    assert k8s.is_ready()


def test_kubeconfig_files_for_admin_cert_and_service_account(k8s: ControlPlane, tmp_path, helm_bin):
    import kubernetes.config

    # Admin kubeconfig authenticates with the client certificate (O=system:masters), not the token.
    admin_api = kubernetes.config.new_client_from_config(config_file=str(k8s.kubeconfig))
    with admin_api:
        me = kubernetes.client.AuthenticationV1Api(admin_api).create_self_subject_review({}).status.user_info
        assert me.username == "dynoplan-admin" and "system:masters" in me.groups
    # helm talks to the real apiserver through the same kubeconfig.
    out = subprocess.run(
        [str(helm_bin), "list", "--all-namespaces", "-o", "json", "--kubeconfig", str(k8s.kubeconfig)],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr

    sa_cfg = k8s.service_account_kubeconfig("kcfg-test", "operator", tmp_path / "sa.kubeconfig")
    sa_api = kubernetes.config.new_client_from_config(config_file=str(sa_cfg))
    with sa_api:
        me = kubernetes.client.AuthenticationV1Api(sa_api).create_self_subject_review({}).status.user_info
        assert me.username == "system:serviceaccount:kcfg-test:operator"
        with pytest.raises(ApiException) as denied:
            kubernetes.client.CoreV1Api(sa_api).list_namespaced_config_map("kcfg-test")
        assert denied.value.status == 403


def tiny_chart(root: Path) -> Path:
    """A chart with one CRD (crds/) and one templated ConfigMap."""
    chart = root / "tiny"
    (chart / "templates").mkdir(parents=True)
    (chart / "crds").mkdir()
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: tiny\nversion: 0.1.0\n")
    (chart / "values.yaml").write_text("replicas: 2\n")
    (chart / "templates" / "cm.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}-cm\n"
        "data:\n  replicas: {{ .Values.replicas | quote }}\n"
    )
    (chart / "crds" / "widgets.yaml").write_text(yaml.safe_dump(widget_crd()))
    return chart


def test_helm_builds_lints_and_renders_a_chart(helm_bin, tmp_path):
    out = subprocess.run([str(helm_bin), "version", "--short"], capture_output=True, text=True, check=True)
    assert out.stdout.strip().startswith(pinned_versions()["HELM_VERSION"])
    chart = tiny_chart(tmp_path)
    lint = subprocess.run([str(helm_bin), "lint", str(chart)], capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    rendered = subprocess.run(
        [str(helm_bin), "template", "rel", str(chart), "--set", "replicas=7"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "name: rel-cm" in rendered and 'replicas: "7"' in rendered
    (chart / "values.yaml").write_text("replicas: [unclosed\n")
    broken = subprocess.run([str(helm_bin), "lint", str(chart)], capture_output=True, text=True)
    assert broken.returncode != 0


def test_helm_template_server_side_applied(k8s: ControlPlane, k8s_admin, helm_bin, tmp_path):
    chart = tiny_chart(tmp_path)
    ns = new_namespace(k8s_admin)
    rendered = k8s.helm(
        "template", "rel", str(chart), "--namespace", ns, "--include-crds", "--set", "replicas=4"
    ).stdout
    applied = k8s.server_side_apply(rendered, namespace=ns)
    assert [o["kind"] for o in applied] == ["CustomResourceDefinition", "ConfigMap"]
    cm = kubernetes.client.CoreV1Api(k8s_admin).read_namespaced_config_map("rel-cm", ns)
    assert cm.data == {"replicas": "4"}
    managers = {m.manager for m in cm.metadata.managed_fields}
    assert managers == {"dynoplan-tests"}
    # Re-applying is idempotent; a changed value is applied in place.
    k8s.server_side_apply(k8s.helm("template", "rel", str(chart), "--set", "replicas=5").stdout, namespace=ns)
    assert kubernetes.client.CoreV1Api(k8s_admin).read_namespaced_config_map("rel-cm", ns).data == {"replicas": "5"}
    with pytest.raises(ValueError, match="document 0"):
        k8s.server_side_apply([{"kind": "ConfigMap"}])


def _alive(pid: int) -> bool:
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_controller_manager_scales_deployment_and_teardown_leaves_nothing():
    with ControlPlane.start(controller_manager=True) as cp:
        pids = [cp.etcd_proc.pid, cp.apiserver_proc.pid, cp.controller_manager_proc.pid]
        base_dir = cp.base_dir
        _deployment_lifecycle(cp)
    # Teardown: every process group is gone and the temp dir (certs, etcd data, logs) is removed.
    assert not any(_alive(pid) for pid in pids)
    assert not base_dir.exists()


def _deployment_lifecycle(cp: ControlPlane) -> None:
    from tests.infra._proc import wait_until

    with cp.admin_client() as api:
        ns = new_namespace(api)
        apps = kubernetes.client.AppsV1Api(api)
        core = kubernetes.client.CoreV1Api(api)
        labels = {"app": "worker"}
        apps.create_namespaced_deployment(
            ns,
            {
                "metadata": {"name": "worker"},
                "spec": {
                    "replicas": 2,
                    "selector": {"matchLabels": labels},
                    "template": {
                        "metadata": {"labels": labels},
                        "spec": {"containers": [{"name": "w", "image": "example.invalid/w:1"}]},
                    },
                },
            },
        )

        def pods(n: int) -> bool:
            return len(core.list_namespaced_pod(ns, label_selector="app=worker").items) == n

        wait_until(lambda: pods(2), 60, "2 pods created by the ReplicaSet controller")
        assert cp.mark_pods_ready(ns, "app=worker") == 2
        wait_until(
            lambda: (apps.read_namespaced_deployment_status("worker", ns).status.ready_replicas or 0) == 2,
            60,
            "Deployment readyReplicas == 2",
        )

        # Scale through the scale subresource, as kubectl scale does: a 3rd Pod appears, not ready.
        apps.patch_namespaced_deployment_scale("worker", ns, {"spec": {"replicas": 3}})
        wait_until(lambda: pods(3), 60, "3rd pod")
        wait_until(
            lambda: apps.read_namespaced_deployment_status("worker", ns).status.replicas == 3,
            60,
            "Deployment status.replicas == 3",
        )
        assert apps.read_namespaced_deployment_status("worker", ns).status.ready_replicas == 2

        # Owner references are honoured by the garbage collector: deleting the Deployment removes its Pods.
        apps.delete_namespaced_deployment("worker", ns, propagation_policy="Background")
        wait_until(lambda: pods(0), 60, "pods garbage-collected")


def test_missing_binary_is_a_clear_error(monkeypatch, tmp_path):
    import tempfile

    monkeypatch.setenv("DYNOPLAN_KUBE_APISERVER", str(tmp_path / "nope"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where a leaked mkdtemp would land
    with pytest.raises(FileNotFoundError, match=r"kube-apiserver binary not found at .*nope; build it with"):
        ControlPlane()
    assert list(tmp_path.iterdir()) == []
