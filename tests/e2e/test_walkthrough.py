"""The Kubernetes walkthrough (docs/kubernetes.md), end to end, on a real one-node cluster (tools/cluster.py): the
project's image in Pods, the chart's probes, RBAC and securityContext under a kubelet, the planner
scaling the example DGD under the example's load Job, the chart's Prometheus and Grafana queries, the
operator's live dashboard in headless Chromium, and three faults.

The commands are the walkthrough's (checked verbatim against docs/kubernetes.md, see ``README_COMMANDS``); the only
additions are the test's shorter load (``-f tests/e2e/values-e2e.yaml`` on ``helm template``), a
second, low-rate load Job that keeps streams in flight through the scale-down, and ``:PORT`` (a free local
port) in ``kubectl port-forward``. Every wait polls the state it
checks, with a deadline and a message naming it.

Timeline (s from the apply): Pods Ready (~30) -> load 20 req/s for 150 s -> scale-up, new Pods Ready and
serving -> a worker Pod killed under load (replaced; the frontend's documented retries keep every
request) -> load ends, scale-down, removed Pods drain their streams -> dashboard checked -> operator Pod
deleted (resumes, no scale) -> replicas edited by hand (adopted, an AdoptedExternalChange Event) -> the tail
Job completes -> helm uninstall with the DGD still there (the post-delete hook removes the operator's
finalizer) -> the example deleted (completes; its Deployments garbage-collected). Right after the scale-up,
example.yaml is applied again: the DGD is unchanged (it sets no worker replicas). ``kubectl get dynoplanners
-w`` runs as the walkthrough shows it (read until the planner's row, then stopped).
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import requests
import yaml

from tests.infra._proc import REPO_ROOT

# The test takes about 6 minutes; its fixture may first rebuild the image (sources changed since
# `make infra-deps`) and bring the cluster up, which pytest-timeout counts too.
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(1500)]

NS = "dynoplan"
DGD = "mocker-agg"
WORKER_SVC = "VllmWorker"
OPERATOR_DEPLOY = "dynoplan-dynoplan-operator"
OPERATOR_SA = "dynoplan-dynoplan"
OUT = REPO_ROOT / "out" / "e2e"

# The walkthrough's commands, as the test runs them (README_COMMANDS are checked to appear in docs/kubernetes.md).
HELM_INSTALL = "helm install dynoplan helm/dynoplan -n dynoplan --create-namespace -f tools/cluster-values.yaml"
ROLLOUT = "kubectl -n dynoplan rollout status deploy/dynoplan-dynoplan-operator"
TEMPLATE = (
    "helm template dynoplan helm/dynoplan -n dynoplan --set example.enabled=true "
    "--show-only templates/example.yaml > example.yaml"
)
TEMPLATE_LOAD = (
    "helm template dynoplan helm/dynoplan -n dynoplan --set example.enabled=true "
    "--show-only templates/example-load.yaml > load.yaml"
)
APPLY = "kubectl -n dynoplan apply -f example.yaml -f load.yaml"
GET = "kubectl -n dynoplan get dynoplanners -w"
GET_DGD = "kubectl -n dynoplan get dgd"
RERUN_LOAD = "kubectl -n dynoplan delete job mocker-agg-load && kubectl -n dynoplan apply -f load.yaml"
PROM_FORWARD = "kubectl -n dynoplan port-forward svc/dynoplan-dynoplan-prometheus 9090"
DASH_FORWARD = "kubectl -n dynoplan port-forward svc/dynoplan-dynoplan-operator 8090"
DELETE_EXAMPLE = "kubectl -n dynoplan delete -f load.yaml -f example.yaml"
UNINSTALL = "helm uninstall dynoplan -n dynoplan"
README_COMMANDS = (
    HELM_INSTALL,
    ROLLOUT,
    TEMPLATE,
    TEMPLATE_LOAD,
    APPLY,
    GET,
    GET_DGD,
    RERUN_LOAD,
    PROM_FORWARD,
    DASH_FORWARD,
    DELETE_EXAMPLE,
    UNINSTALL,
)

TAIL_JOB = "e2e-tail-load"
# Low-rate load with long streams (300 tokens) through the scale-down, the operator restart and the edit.
TAIL_TRACE = "synthetic:poisson?rate=1&duration_s=330&isl=500&osl=300&seed=7"


def readme_text() -> str:
    """docs/kubernetes.md with shell line continuations joined (a command split over lines reads as one)."""
    return re.sub(r"\s*\\\n\s*", " ", (REPO_ROOT / "docs" / "kubernetes.md").read_text())


def poll(check: Callable[[], Any], timeout_s: float, what: str, interval_s: float = 1.0) -> Any:
    """Poll ``check()`` until it returns a truthy value (returned); fail naming ``what`` at the deadline."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        try:
            v = check()
            if v:
                return v
            last = v
        except Exception as e:  # noqa: BLE001 - a component restarting
            last = e
        time.sleep(interval_s)
    pytest.fail(f"{what}: not reached within {timeout_s:.0f} s (last: {last!r})")


class PortForward:
    """``kubectl port-forward`` (the walkthrough's command with ``:PORT``) in the background; ``url``."""

    def __init__(self, cluster, command: str) -> None:
        target = command.rsplit(" ", 1)
        self.proc = subprocess.Popen(
            ["bash", "-c", f"exec {target[0]} :{target[1]}"],
            env=cluster.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        m = re.search(r"Forwarding from 127\.0\.0\.1:(\d+)", line)
        if not m:
            self.close()
            pytest.fail(f"`{command}`: no 'Forwarding from' line: {line!r}")
        self.url = f"http://127.0.0.1:{m.group(1)}"
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        for _ in self.proc.stdout or ():
            pass

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


class Timeline:
    """Every second: the DGD's spec/ready worker replicas and the worker Pods (phase, ready, deleting)."""

    def __init__(self, api) -> None:
        import kubernetes

        self.co = kubernetes.client.CustomObjectsApi(api)
        self.core = kubernetes.client.CoreV1Api(api)
        self.t0 = time.monotonic()
        self.rows: list[dict[str, Any]] = []
        self.deleting_seen: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def now(self) -> float:
        return round(time.monotonic() - self.t0, 1)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                dgd = self.co.get_namespaced_custom_object("nvidia.com", "v1alpha1", NS, "dynamographdeployments", DGD)
                pods = self.core.list_namespaced_pod(
                    NS, label_selector=f"dynoplan.dev/dgd={DGD},dynoplan.dev/service={WORKER_SVC}"
                ).items
                spec = dgd["spec"]["services"][WORKER_SVC].get("replicas")
                try:
                    dpl = self.co.get_namespaced_custom_object("dynoplan.dev", "v1alpha1", NS, "dynoplanners", DGD)
                    observed_rps = ((dpl.get("status") or {}).get("observed") or {}).get("requestsPerSecond")
                except Exception:  # noqa: BLE001 - not created yet
                    observed_rps = "absent"
                ready = ((dgd.get("status") or {}).get("services") or {}).get(WORKER_SVC, {}).get("readyReplicas")
                fe = self.core.list_namespaced_pod(
                    NS, label_selector=f"dynoplan.dev/dgd={DGD},dynoplan.dev/service=Frontend"
                ).items
                t = self.now()
                row = {
                    "t": t,
                    "wall": time.time(),
                    "spec": spec,
                    "ready": ready,
                    "observed_rps": observed_rps,
                    "frontend_ready": [
                        any(c.type == "Ready" and c.status == "True" for c in (p.status.conditions or [])) for p in fe
                    ],
                    "pods": {
                        p.metadata.name: {
                            "ip": p.status.pod_ip,
                            "deleting": p.metadata.deletion_timestamp is not None,
                            "ready": any(c.type == "Ready" and c.status == "True" for c in (p.status.conditions or [])),
                        }
                        for p in pods
                    },
                }
                for name, p in row["pods"].items():
                    if p["deleting"] and name not in self.deleting_seen:
                        self.deleting_seen[name] = time.time()
                self.rows.append(row)
            except Exception:  # noqa: BLE001 - the DGD may not exist yet
                pass
            self._stop.wait(1.0)

    def spec_series(self) -> list[tuple[float, int]]:
        """(t, spec replicas) at every change."""
        out: list[tuple[float, int]] = []
        for r in self.rows:
            if r["spec"] is not None and (not out or out[-1][1] != r["spec"]):
                out.append((r["t"], r["spec"]))
        return out

    def latest(self) -> dict[str, Any]:
        return self.rows[-1] if self.rows else {}

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def tail_job_manifest(image: str, init_containers: list[dict[str, Any]]) -> dict[str, Any]:
    """A second loadgen Job; it waits for the frontend with the example Job's own init container."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": TAIL_JOB, "namespace": NS},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "securityContext": {"runAsNonRoot": True, "runAsUser": 10001},
                    "initContainers": init_containers,
                    "containers": [
                        {
                            "name": "loadgen",
                            "image": image,
                            "imagePullPolicy": "IfNotPresent",
                            "args": [
                                "loadgen",
                                "--url",
                                f"http://{DGD}-frontend:8000",
                                "--trace",
                                TAIL_TRACE,
                                "--quiet",
                                "--report-json",
                                "/tmp/report.json",
                                "--per-request",
                                "/tmp/req.jsonl",
                            ],
                            # the report last (the test parses it); failed requests' records before it
                            "command": [
                                "sh",
                                "-c",
                                'dynoplan "$@"; rc=$?; grep -v \'"status": *"finished"\' /tmp/req.jsonl; '
                                "cat /tmp/report.json; exit $rc",
                                "--",
                            ],
                            "securityContext": {
                                "readOnlyRootFilesystem": True,
                                "allowPrivilegeEscalation": False,
                                "capabilities": {"drop": ["ALL"]},
                            },
                            "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
                        }
                    ],
                    "volumes": [{"name": "tmp", "emptyDir": {}}],
                }
            },
        },
    }


class Prom:
    def __init__(self, url: str) -> None:
        self.url = url

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        params = {"query": expr, **({"time": str(at)} if at is not None else {})}
        r = requests.get(f"{self.url}/api/v1/query", params=params, timeout=10)
        r.raise_for_status()
        return r.json()["data"]["result"]

    def scalar(self, expr: str, at: float | None = None) -> float | None:
        res = self.query(expr, at)
        return float(res[0]["value"][1]) if res else None


def job_status(cluster, name: str) -> dict[str, Any]:
    return json.loads(cluster.kubectl("-n", NS, "get", "job", name, "-o", "json").stdout).get("status", {})


def test_readme_lists_the_commands_the_test_runs():
    text = readme_text()
    missing = [c for c in README_COMMANDS if c not in text]
    assert not missing, f"docs/kubernetes.md no longer shows these walkthrough commands: {missing}"
    assert "tools/cluster.py up" in text and "tools/cluster.py down" in text
    # no command the walkthrough shows re-applies example.yaml (it would be a hand edit of the DGD's replicas
    # if the DGD set them; the test below checks that it sets none)
    assert (
        "apply -f example.yaml &&" not in text
        and "sudo " not in text.split("## Kubernetes walkthrough")[1].split("\n## ")[0]
    )


def watch_lines(cluster, command: str, until: Callable[[list[str]], bool], timeout_s: float = 60) -> list[str]:
    """Run a ``kubectl ... -w`` command line until ``until(lines)``; its lines. Fails naming the command
    when it exits (e.g. kubectl refusing the arguments) or the deadline passes."""
    proc = subprocess.Popen(
        ["bash", "-c", f"exec {command}"], env=cluster.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines: list[str] = []
    done = threading.Event()

    def read() -> None:
        for line in proc.stdout or ():
            lines.append(line.rstrip("\n"))
            if until(lines):
                done.set()
                return
        done.set()

    threading.Thread(target=read, daemon=True).start()
    ok = done.wait(timeout_s) and until(lines)
    proc.kill()
    proc.wait(10)
    if not ok:
        pytest.fail(
            f"`{command}` (exit {proc.returncode}) did not show what was expected within {timeout_s:.0f} s: {lines}"
        )
    return lines


def test_walkthrough_on_a_real_cluster(local_cluster, chromium, tmp_path):  # noqa: C901 - one story, in order
    import kubernetes

    c = local_cluster
    OUT.mkdir(parents=True, exist_ok=True)
    work = tmp_path / "walkthrough"
    work.mkdir()
    for d in ("helm", "tools"):  # the walkthrough's relative paths, run from a scratch directory
        (work / d).symlink_to(REPO_ROOT / d)
    figures: dict[str, Any] = {}
    t_start = time.monotonic()

    # ------------------------------------------------------------------ install (docs/kubernetes.md)
    c.run(HELM_INSTALL, cwd=work, timeout_s=300)
    c.run(ROLLOUT, cwd=work, timeout_s=300)
    api = kubernetes.config.new_client_from_config(str(c.kubeconfig))
    core = kubernetes.client.CoreV1Api(api)
    co = kubernetes.client.CustomObjectsApi(api)

    # The operator Pod: non-root, read-only root filesystem, the chart's ServiceAccount and nothing more.
    op_pods = [
        p
        for p in core.list_namespaced_pod(NS, label_selector="app.kubernetes.io/component=operator").items
        if p.metadata.deletion_timestamp is None
    ]
    assert len(op_pods) == 1, [p.metadata.name for p in op_pods]
    op = op_pods[0]
    assert op.spec.service_account_name == OPERATOR_SA
    assert op.spec.security_context.run_as_non_root is True and op.spec.security_context.run_as_user == 10001
    csc = op.spec.containers[0].security_context
    assert csc.read_only_root_filesystem is True and csc.allow_privilege_escalation is False
    uid = c.kubectl("-n", NS, "exec", op.metadata.name, "--", "python", "-c", "import os; print(os.getuid())").stdout
    assert uid.strip() == "10001"
    ro = c.kubectl("-n", NS, "exec", op.metadata.name, "--", "python", "-c", "open('/probe', 'w')", check=False)
    assert ro.returncode != 0 and "Read-only file system" in ro.stderr, ro.stderr
    sa = f"system:serviceaccount:{NS}:{OPERATOR_SA}"
    can = {
        q: c.kubectl("auth", "can-i", "--as", sa, "-n", NS, *q.split(), check=False).stdout.strip()
        for q in (
            "patch dynamographdeployments.nvidia.com",
            "list endpointslices.discovery.k8s.io",
            "create deployments.apps",
            "get secrets",
            "list pods",
            "delete dynamographdeployments.nvidia.com",
        )
    }
    can_other = c.kubectl(
        "auth", "can-i", "--as", sa, "-n", "default", "list", "dynamographdeployments.nvidia.com", check=False
    ).stdout.strip()
    assert (
        can
        == {
            "patch dynamographdeployments.nvidia.com": "yes",
            "list endpointslices.discovery.k8s.io": "yes",
            "create deployments.apps": "yes",
            "get secrets": "no",
            "list pods": "no",
            "delete dynamographdeployments.nvidia.com": "no",
        }
        and can_other == "no"
    ), (can, can_other)
    figures["operator_rbac"] = can

    # ------------------------------------------------------------------ the example (docs/kubernetes.md) + a tail load
    for command in (TEMPLATE, TEMPLATE_LOAD):
        c.run(command.replace(" > ", f" -f {REPO_ROOT / 'tests/e2e/values-e2e.yaml'} > "), cwd=work)
    docs = [d for d in yaml.safe_load_all((work / "example.yaml").read_text()) if d]
    # the DGD leaves the worker count to the planner (re-applying it below changes nothing)
    dgd_doc = next(d for d in docs if d["kind"] == "DynamoGraphDeployment")
    assert "replicas" not in dgd_doc["spec"]["services"][WORKER_SVC], dgd_doc["spec"]["services"][WORKER_SVC]
    load_docs = [d for d in yaml.safe_load_all((work / "load.yaml").read_text()) if d]
    assert [d["kind"] for d in load_docs] == ["Job"] and not any(d["kind"] == "Job" for d in docs)
    load_job = load_docs[0]
    image = load_job["spec"]["template"]["spec"]["containers"][0]["image"]
    timeline = Timeline(api)
    c.run(APPLY, cwd=work)
    t_apply = time.monotonic()
    init = load_job["spec"]["template"]["spec"]["initContainers"]
    assert [x["name"] for x in init] == ["wait-frontend"], init
    (work / "tail.json").write_text(json.dumps(tail_job_manifest(image, init)))
    c.run(f"kubectl -n {NS} apply -f tail.json", cwd=work)
    try:
        # Worker and frontend Pods Ready through the probes the operator's reconciler writes.
        def pods_ready(selector: str, n: int = 1):
            pods = [
                p
                for p in core.list_namespaced_pod(NS, label_selector=selector).items
                if p.metadata.deletion_timestamp is None
            ]
            ok = [p for p in pods if any(x.type == "Ready" and x.status == "True" for x in (p.status.conditions or []))]
            return ok if len(ok) >= n else None

        worker_sel = f"dynoplan.dev/dgd={DGD},dynoplan.dev/service={WORKER_SVC}"
        fe_sel = f"dynoplan.dev/dgd={DGD},dynoplan.dev/service=Frontend"
        w0 = poll(lambda: pods_ready(worker_sel), 240, "worker Pod Ready")[0]
        fe = poll(lambda: pods_ready(fe_sel), 240, "frontend Pod Ready")[0]
        figures["pods_ready_s"] = round(time.monotonic() - t_apply, 1)
        probe = w0.spec.containers[0].readiness_probe
        assert probe.http_get.path == "/ready" and w0.spec.containers[0].lifecycle.pre_stop.sleep.seconds == 20
        # The frontend reaches the workers through Service names: the ClusterIP Service (kube-proxy)...
        reach = c.kubectl(
            "-n",
            NS,
            "exec",
            fe.metadata.name,
            "-c",
            "main",
            "--",
            "python",
            "-c",
            "import urllib.request as u; print(u.urlopen('http://mocker-agg-vllmworker:8000/ready').status)",
        )
        assert reach.stdout.strip() == "200"
        # ... and the headless one, whose addresses the sidecar writes to the frontend's workers file.
        urls = poll(
            lambda: c.kubectl(
                "-n", NS, "exec", fe.metadata.name, "-c", "main", "--", "cat", "/tmp/workers.txt"
            ).stdout.split(),
            30,
            "workers file lists the worker Pod",
        )
        assert urls == [f"http://{w0.status.pod_ip}:8000"], urls
        # The walkthrough's watch: kubectl accepts it and shows the planner row under its columns.
        watched = watch_lines(c, GET, lambda ls: any(ln.startswith(DGD + " ") for ln in ls))
        assert "WORKER" in watched[0] and "OBSERVED-RPS" in watched[0] and "REASON" in watched[0], watched
        get = c.run(GET_DGD, cwd=work).stdout
        assert DGD in get and "READY" in get.splitlines()[0], get
        figures["kubectl_get"] = "\n".join(watched) + "\n" + get

        prom_pf = PortForward(c, PROM_FORWARD)
        dash_pf = PortForward(c, DASH_FORWARD)
        prom = Prom(prom_pf.url)
        page = chromium.open(
            f"{dash_pf.url}/?planner={NS}/{DGD}", wait_for="window.dashboardReady === true", timeout_s=120
        )

        # ------------------------------------------------------------------ scale-up under the load Job
        up = poll(
            lambda: (timeline.latest().get("spec") or 0) > 1 and timeline.latest()["spec"],
            240,
            "the planner scales the worker pool above 1 under the load Job",
            interval_s=1,
        )
        figures["scaled_up_to"] = up
        figures["scale_up_at_s"] = round(time.monotonic() - t_apply, 1)
        # The walkthrough's example.yaml applied again (e.g. after editing it) leaves the DGD as the planner scaled it.
        again = c.run(f"kubectl -n {NS} apply -f example.yaml", cwd=work).stdout
        assert f"dynamographdeployment.nvidia.com/{DGD} unchanged" in again, again
        after = co.get_namespaced_custom_object("nvidia.com", "v1alpha1", NS, "dynamographdeployments", DGD)
        assert (after["spec"]["services"][WORKER_SVC].get("replicas") or 1) > 1, after["spec"]["services"][WORKER_SVC]
        figures["example_reapplied"] = again.strip().splitlines()
        new_ready = poll(lambda: pods_ready(worker_sel, up), 180, f"{up} worker Pods Ready after the scale-up")
        poll(
            lambda: (
                page.evaluate(
                    "Math.max(...window.dashboardState.samples.filter(s => s.pools).map(s => s.pools.agg.spec))"
                )
                > 1
            ),
            30,
            "dashboard shows the scale-up",
        )
        page.screenshot(OUT / "dashboard-scale-up.png")
        newer = [p.metadata.name for p in new_ready if p.metadata.name != w0.metadata.name]

        def served_by_new():
            res = {
                r["metric"].get("pod"): float(r["value"][1])
                for r in prom.query(f'sum by (pod) (vllm:request_success_total{{dgd="{DGD}"}})')
            }
            return all(res.get(n, 0) > 0 for n in newer) and res

        served = poll(served_by_new, 120, f"new worker Pods {newer} serve requests (Prometheus)", interval_s=3)
        figures["served_per_pod_after_scale_up"] = served

        # ------------------------------------------------------------------ fault: a worker Pod killed under load
        assert job_status(c, f"{DGD}-load").get("active") == 1, "the load Job ended before the worker fault"
        victim = newer[0]
        retries_before = prom.scalar("sum(dynamo_frontend_request_retries_total)") or 0.0
        c.kubectl("-n", NS, "delete", "pod", victim, "--grace-period=1", "--wait=false")
        poll(
            lambda: (
                victim not in [p.metadata.name for p in core.list_namespaced_pod(NS, label_selector=worker_sel).items]
            ),
            90,
            f"killed worker Pod {victim} gone",
        )
        poll(
            lambda: pods_ready(worker_sel, min(timeline.latest()["spec"], up)),
            180,
            "worker pool back to its replica count after the kill",
        )
        figures["worker_kill"] = {"pod": victim, "at_s": round(time.monotonic() - t_apply, 1)}

        # Prometheus scrapes frontend, workers and operator; every dashboard query returns series.
        up_targets = poll(
            lambda: (lambda r: r if {"frontend", "worker", "operator"} <= set(r) else None)(
                {
                    (
                        "operator"
                        if "operator" in x["metric"].get("pod", "")
                        else "frontend"
                        if "frontend" in x["metric"].get("pod", "")
                        else "worker"
                        if "vllmworker" in x["metric"].get("pod", "")
                        else "other"
                    ): 1
                    for x in prom.query("up == 1")
                }
            ),
            60,
            "Prometheus targets up: frontend, worker, operator",
        )
        assert up_targets
        dash = json.loads((REPO_ROOT / "helm/dynoplan/dashboards/dynoplan.json").read_text())
        exprs = [
            t["expr"].replace("$namespace", NS).replace("$planner", DGD)
            for p in dash["panels"]
            for t in p.get("targets", [])
        ]

        def all_panels():
            empty = [e for e in exprs if not prom.query(e)]
            return not empty or (setattr(all_panels, "empty", empty) and False)

        poll(all_panels, 120, "every Grafana dashboard query returns series", interval_s=5)
        figures["dashboard_queries"] = len(exprs)

        # ------------------------------------------------------------------ load Job completes, no request failed
        poll(
            lambda: job_status(c, f"{DGD}-load").get("succeeded") == 1 or job_status(c, f"{DGD}-load").get("failed"),
            420,
            "the load Job finishes",
        )
        st = job_status(c, f"{DGD}-load")
        log = c.kubectl("-n", NS, "logs", f"job/{DGD}-load").stdout
        (OUT / "load-job.log").write_text(log)
        assert st.get("succeeded") == 1, f"load Job failed (some request failed): {st}\n{log[-3000:]}"
        retries_after_load = prom.scalar("sum(dynamo_frontend_request_retries_total)") or 0.0
        figures["load_job"] = {
            "status": "succeeded",
            "frontend_retries_during_kill": retries_after_load - retries_before,
        }
        t_load_end = time.monotonic()

        # ------------------------------------------------------------------ scale-down; removed Pods drain
        peak = max(n for _, n in timeline.spec_series())
        down = poll(
            lambda: (timeline.latest().get("spec") or 99) < peak and timeline.latest()["spec"],
            300,
            f"the planner scales the worker pool below its peak {peak} after the load",
        )
        figures["scaled_down_to"] = down
        figures["scale_down_after_load_s"] = round(time.monotonic() - t_load_end, 1)
        # Wait until the removed Pods are gone (preStop drain, then exit).
        poll(
            lambda: len([n for n, p in timeline.latest()["pods"].items()]) <= timeline.latest()["spec"],
            120,
            "removed worker Pods terminated after draining",
        )
        drained = {}
        for name, t_del in timeline.deleting_seen.items():
            if name == victim:
                continue
            running = prom.scalar(f'sum(vllm:num_requests_running{{pod="{name}"}})', at=t_del)
            drained[name] = running
        figures["drained_pods_in_flight_at_delete"] = drained
        retries_after_down = prom.scalar("sum(dynamo_frontend_request_retries_total)") or 0.0
        assert retries_after_down == retries_after_load, (
            f"a draining worker cut streams: frontend retries {retries_after_load} -> {retries_after_down}"
        )
        tail_active = job_status(c, TAIL_JOB)
        assert tail_active.get("active") == 1 and not tail_active.get("failed"), tail_active

        # The dashboard's replica trace shows the scale-up and the scale-down; no console errors.
        trace = page.evaluate("window.dashboardState.samples.filter(s => s.pools).map(s => s.pools.agg.spec)")
        assert max(trace) >= up and trace[-1] < max(trace) and trace[0] == 1, trace
        assert page.errors() == [], page.errors()
        page.screenshot(OUT / "dashboard-after-scale-down.png")
        page.close()
        dash_pf.close()
        figures["dashboard_trace_changes"] = [v for i, v in enumerate(trace) if i == 0 or trace[i - 1] != v]

        # ------------------------------------------------------------------ fault: operator Pod deleted
        # At the tail's 1 req/s one worker serves: the planner settles there (its minimum), then the
        # operator is replaced; a new operator that re-planned from a cold start would scale up.
        poll(
            lambda: timeline.latest()["spec"] == 1 and len(timeline.latest()["pods"]) == 1,
            240,
            "the worker pool settles at 1 Pod under the tail load",
        )
        before = 1
        old_op = op.metadata.name
        dpl0 = co.get_namespaced_custom_object("dynoplan.dev", "v1alpha1", NS, "dynoplanners", DGD)
        last0 = (dpl0.get("status") or {}).get("lastDecision", {}).get("time")
        c.kubectl("-n", NS, "delete", "pod", old_op, "--wait=false")
        new_op = poll(
            lambda: [p for p in pods_ready("app.kubernetes.io/component=operator") or [] if p.metadata.name != old_op],
            180,
            "a new operator Pod Ready",
        )[0]

        def resumed():
            st = (
                co.get_namespaced_custom_object("dynoplan.dev", "v1alpha1", NS, "dynoplanners", DGD).get("status") or {}
            )
            return st.get("lastDecision", {}).get("time", "") > (last0 or "") and st

        t_new = time.monotonic()
        poll(resumed, 120, f"the new operator {new_op.metadata.name} writes the planner status")
        # Two throughput intervals (30 s each) of the new operator: the replica count it found stays.
        end = t_new + 65
        while time.monotonic() < end:
            assert timeline.latest()["spec"] == before, (
                f"spurious scale after the operator restart: {before} -> {timeline.latest()['spec']}"
            )
            time.sleep(1)
        figures["operator_restart"] = {"old": old_op, "new": new_op.metadata.name, "replicas_kept": before}

        # ------------------------------------------------------------------ fault: replicas edited by hand
        edited = before + 1
        c.kubectl(
            "-n",
            NS,
            "patch",
            "dgd",
            DGD,
            "--type",
            "merge",
            "-p",
            json.dumps({"spec": {"services": {WORKER_SVC: {"replicas": edited}}}}),
        )
        poll(lambda: pods_ready(worker_sel, edited), 180, f"{edited} worker Pods Ready after the hand edit")

        def adopted():
            st = (
                co.get_namespaced_custom_object("dynoplan.dev", "v1alpha1", NS, "dynoplanners", DGD).get("status") or {}
            )
            return st.get("desiredReplicas", {}).get("worker") == edited and st

        poll(adopted, 60, "the planner adopts the hand-edited count (status.desiredReplicas.worker)")
        # docs/operator.md: the edit is adopted, not reverted, for external_change_grace_s (180 s).
        hold_end = time.monotonic() + 40
        while time.monotonic() < hold_end:
            assert timeline.latest()["spec"] == edited, f"hand edit reverted: {timeline.latest()['spec']}"
            time.sleep(1)
        figures["hand_edit"] = {"from": before, "to": edited, "held_s": 40}

        # ------------------------------------------------------------------ the tail Job: every request succeeded
        poll(
            lambda: job_status(c, TAIL_JOB).get("succeeded") == 1 or job_status(c, TAIL_JOB).get("failed"),
            300,
            "the tail load Job finishes",
        )
        tail_log = c.kubectl("-n", NS, "logs", f"job/{TAIL_JOB}").stdout
        (OUT / "tail-job.log").write_text(tail_log)
        assert job_status(c, TAIL_JOB).get("succeeded") == 1, tail_log[-3000:]
        tail_rep = json.loads(tail_log[tail_log.index("{\n") :])
        figures["tail_job"] = {k: tail_rep.get(k) for k in ("num_requests", "completed_requests", "failed_requests")}
        figures["frontend_requests"] = {
            r["metric"].get("status"): float(r["value"][1])
            for r in prom.query("sum by (status) (dynamo_frontend_requests_total)")
        }
        prom_pf.close()

        # OBSERVED-RPS of `kubectl get dynoplanners -w`: once the throughput loop observed the traffic, the
        # status keeps an observation (the load loop's ticks in between do not blank it).
        rps = [r["observed_rps"] for r in timeline.rows if r.get("observed_rps") not in (None, "absent")]
        first = next(i for i, r in enumerate(timeline.rows) if r.get("observed_rps") not in (None, "absent"))
        blank = [r["t"] for r in timeline.rows[first:] if r.get("observed_rps") in (None, "absent")]
        assert rps and not blank, f"status.observed.requestsPerSecond blank at t={blank[:10]}"
        events = json.loads(
            c.kubectl(
                "-n",
                NS,
                "get",
                "events",
                "--field-selector",
                f"involvedObject.kind=DynoPlanner,involvedObject.name={DGD}",
                "-o",
                "json",
            ).stdout
        )
        adopted = [e["message"] for e in events["items"] if e["reason"] == "AdoptedExternalChange"]
        assert any(f"{WORKER_SVC} {before}->{edited}" in m for m in adopted), adopted
        figures["adopted_event"] = adopted

        # ------------------------------------------------------------------ uninstall with the DGD still there
        # The wrong order (chart first): the post-delete hook removes the operator's finalizer, so deleting
        # the example afterwards completes and the DGD's Deployments go through owner references.
        c.run(f"kubectl -n {NS} delete -f load.yaml", cwd=work)
        c.run(UNINSTALL, cwd=work, timeout_s=300)
        left = co.get_namespaced_custom_object("nvidia.com", "v1alpha1", NS, "dynamographdeployments", DGD)
        assert "dynoplan.dev/finalizer" not in (left["metadata"].get("finalizers") or []), left["metadata"]
        c.run(f"kubectl -n {NS} delete -f example.yaml --timeout=60s", cwd=work, timeout_s=90)
        apps = kubernetes.client.AppsV1Api(api)
        poll(
            lambda: not apps.list_namespaced_deployment(NS, label_selector=f"dynoplan.dev/dgd={DGD}").items,
            120,
            "the deleted DGD's Deployments garbage-collected",
        )
        figures["uninstall"] = "helm uninstall, then the example deleted: finalizer removed, children collected"
    finally:
        timeline.stop()
        figures["replicas_over_time"] = timeline.spec_series()
        figures["e2e_s"] = round(time.monotonic() - t_start, 1)
        (OUT / "figures.json").write_text(json.dumps(figures, indent=1, default=str))
        (OUT / "timeline.json").write_text(json.dumps(timeline.rows, default=str))
