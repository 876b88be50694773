"""With the DGD reconciler switched off (a real Dynamo operator owns DGDs) and no peering, the chart's
Role has no Deployment/Service/KopfPeering rights and the operator only patches DGD replicas.
Same real control plane and fixtures as test_operator_k8s.py."""

from __future__ import annotations

import kubernetes
import pytest
from kubernetes.client.rest import ApiException

from tests.operator.test_operator_k8s import DGD, DPL, SA, Env, dgd_manifest, planner_manifest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def env(k8s, helm_bin, tmp_path_factory):
    e = Env(
        k8s,
        helm_bin,
        tmp_path_factory.mktemp("patch-only"),
        extra_sets=("operator.settings.reconcile_dgd=false", "operator.settings.standalone=true"),
    )
    try:
        e.start_operator()
        yield e
    finally:
        e.close()


def test_patch_only_operator_scales_replicas_and_creates_nothing(env):
    token = env.k8s.service_account_token(env.ns, SA, create=False)
    with kubernetes.client.ApiClient(env.k8s.configuration_for_token(token)) as sa:
        for forbidden in (
            lambda: kubernetes.client.AppsV1Api(sa).list_namespaced_deployment(env.ns),
            lambda: kubernetes.client.CoreV1Api(sa).list_namespaced_service(env.ns),
            lambda: kubernetes.client.CustomObjectsApi(sa).list_namespaced_custom_object(
                "kopf.dev", "v1", env.ns, "kopfpeerings"
            ),
        ):
            with pytest.raises(ApiException) as denied:
                forbidden()
            assert denied.value.status == 403
    env.prom.set_traffic(15, 2000, 450)
    env.co.create_namespaced_custom_object(*DGD[:2], env.ns, DGD[2], dgd_manifest("g"))
    env.co.create_namespaced_custom_object(*DPL[:2], env.ns, DPL[2], planner_manifest("p", "g", env.profile))

    def scaled() -> bool:
        s = env.dgd("g")["spec"]["services"]
        return (s["Prefill"]["replicas"], s["Decode"]["replicas"]) == (2, 3)

    env.wait(scaled, "planner scales the DGD to prefill 2, decode 3 (hand-computed, see test_operator_k8s)")
    assert env.apps.list_namespaced_deployment(env.ns, label_selector="dynoplan.dev/dgd").items == []
    assert "status" not in env.dgd("g") or "state" not in env.dgd("g")["status"]
    assert [e.reason for e in env.events_once("g", "ScaledUp") if e.reason.startswith("Scaled")] == ["ScaledUp"]
