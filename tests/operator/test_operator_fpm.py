"""The operator's load loop on real worker FPM, against the real control plane (no mocks of the API).

Real ``dynoplan mocker serve`` processes stand in for the Pods of a DGD's worker service: each publishes
ForwardPassMetrics on a ZMQ PUB socket bound to this machine's non-loopback address (the apiserver rejects
loopback addresses in EndpointSlices, as it would for Pods). The test writes the EndpointSlices of the
worker Service (what the EndpointSlice controller writes for ready Pods: their IP and the port named
``fpm``); the operator lists them with the chart ServiceAccount's token, subscribes, and runs the load loop.

Both workers run with ``--worker-id 0``, as every replica of a Deployment would: the operator must still
see two engines (it identifies an engine by its endpoint).

Scenario (agg, TTFT target 300 ms, load interval 1 s, throughput loop off):
1. one worker flooded with 6000-token prompts: its queued prefill tokens give an estimated TTFT far above
   300 ms -> ``scale_up_ttft`` (the DGD goes 1 -> 2 or 1 -> 3: the proportional step is at most x2 of 1);
2. the new replicas become ready (Deployment status written as a kubelet would) and the second worker's
   slice appears; the load stops; both engines idle (estimated TTFT 0 < 300 x 0.8) and N-1 absorb the
   (zero) load -> ``scale_down_consolidated`` one replica per interval.
"""

from __future__ import annotations

import socket
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import kubernetes
import pytest
import requests

from tests.infra._proc import free_port, start_process, stop_process, wait_until
from tests.operator.test_operator_k8s import DGD, DPL, Env

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

DYNOPLAN = str(Path(sys.executable).parent / "dynoplan")


def host_ip() -> str:
    """This machine's primary non-loopback IPv4 address (a UDP connect sends nothing)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect(("192.0.2.123", 9))
        ip = s.getsockname()[0]
    except OSError:
        ip = "127.0.0.1"
    finally:
        s.close()
    if ip.startswith("127."):
        pytest.skip("no non-loopback IPv4 address: EndpointSlices cannot point at loopback")
    return ip


class Worker:
    """A real live mocker worker with its FPM socket on ``ip:fpm_port``."""

    def __init__(self, tmp: Path, name: str, ip: str) -> None:
        self.port, self.fpm_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        log = tmp / f"{name}.log"
        self.proc = start_process(
            [
                DYNOPLAN,
                "mocker",
                "serve",
                "--port",
                str(self.port),
                "--worker-id",
                "0",
                "--fpm-endpoint",
                f"tcp://{ip}:{self.fpm_port}",
                "--kv-events-endpoint",
                "off",
            ],
            log,
        )
        wait_until(lambda: requests.get(self.url + "/ready", timeout=2).status_code == 200, 60, name, self.proc, log)

    def stop(self) -> None:
        stop_process(self.proc)


class Flood:
    """Keeps ``concurrency`` 6000-token requests in flight against one worker until stopped."""

    def __init__(self, url: str, concurrency: int = 48) -> None:
        self.url = url
        self.stop_flag = threading.Event()
        self.done = 0
        self.pool = ThreadPoolExecutor(concurrency)
        self.futures = [self.pool.submit(self._loop) for _ in range(concurrency)]

    def _loop(self) -> None:
        with requests.Session() as s:
            while not self.stop_flag.is_set():
                r = s.post(
                    self.url + "/v1/completions",
                    json={"model": "mocker", "input_length": 6000, "max_tokens": 20},
                    timeout=120,
                )
                r.raise_for_status()
                self.done += 1

    def stop(self) -> None:
        self.stop_flag.set()
        self.pool.shutdown(wait=True)
        for f in self.futures:
            f.result()  # a failed request fails the test


def slice_for(ns: str, service: str, n: int, ip: str, port: int) -> dict:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": f"{service}-{n}",
            "namespace": ns,
            "labels": {
                "kubernetes.io/service-name": service,
                "endpointslice.kubernetes.io/managed-by": "dynoplan-tests",
            },
        },
        "addressType": "IPv4",
        "ports": [{"name": "fpm", "port": port, "protocol": "TCP"}],
        "endpoints": [{"addresses": [ip], "conditions": {"ready": True}}],
    }


@pytest.fixture(scope="module")
def env(k8s, helm_bin, tmp_path_factory):
    e = Env(k8s, helm_bin, tmp_path_factory.mktemp("operator-fpm"), extra_sets=("operator.settings.standalone=true",))
    workers: list[Worker] = []
    e.workers = workers
    try:
        e.start_operator()
        yield e
    finally:
        for w in workers:
            w.stop()
        e.close()


def test_load_loop_scales_on_worker_fpm_found_through_endpointslices(env):
    ip = host_ip()
    w1 = Worker(env.tmp, "worker1", ip)
    env.workers.append(w1)
    dgd = {
        "apiVersion": "nvidia.com/v1alpha1",
        "kind": "DynamoGraphDeployment",
        "metadata": {"name": "w"},
        "spec": {
            "backendFramework": "vllm",
            "services": {
                "VllmWorker": {
                    "componentType": "worker",
                    "replicas": 1,
                    "extraPodSpec": {
                        "mainContainer": {
                            "image": "dynoplan:test",
                            "args": [
                                "mocker",
                                "serve",
                                "--host",
                                "0.0.0.0",
                                "--fpm-endpoint",
                                f"tcp://0.0.0.0:{w1.fpm_port}",
                            ],
                        }
                    },
                }
            },
        },
    }
    env.co.create_namespaced_custom_object(*DGD[:2], env.ns, DGD[2], dgd)
    # The reconciler exposes the fixed FPM port on the worker Deployment and Service.
    env.wait(
        lambda: any(p.name == "fpm" for p in env.core.read_namespaced_service("w-vllmworker", env.ns).spec.ports),
        "Service w-vllmworker with port fpm",
    )
    svc_ports = {p.name: p.port for p in env.core.read_namespaced_service("w-vllmworker", env.ns).spec.ports}
    assert svc_ports == {"http": 8000, "fpm": w1.fpm_port}
    dep = env.apps.read_namespaced_deployment("w-vllmworker", env.ns)
    assert {p.name: p.container_port for p in dep.spec.template.spec.containers[0].ports} == {
        "http": 8000,
        "fpm": w1.fpm_port,
    }
    env.set_ready("w-vllmworker", 1)

    discovery = kubernetes.client.DiscoveryV1Api(env.admin)
    planner = {
        "apiVersion": "dynoplan.dev/v1alpha1",
        "kind": "DynoPlanner",
        "metadata": {"name": "lp"},
        "spec": {
            "targetRef": {"name": "w"},
            "mode": "agg",
            "sla": {"ttftMs": 300, "itlMs": 10000},
            "throughput": {"enabled": False},
            "load": {"enabled": True, "intervalS": 1},
            "replicas": {"minWorker": 1, "maxWorker": 3},
            "budget": {"maxGpus": 3},
        },
    }
    env.co.create_namespaced_custom_object(*DPL[:2], env.ns, DPL[2], planner)

    def load_status() -> dict:
        return (env.planner("lp").get("status") or {}).get("load") or {}

    def condition(type_: str) -> dict:
        return next(
            (c for c in (env.planner("lp").get("status") or {}).get("conditions", []) if c["type"] == type_), {}
        )

    # No EndpointSlice yet (no worker Pod ready): metrics unknown, said so, and the planner holds.
    env.wait(lambda: condition("MetricsAvailable").get("status") == "False", "MetricsAvailable=False", 60)
    assert "no FPM endpoints" in condition("MetricsAvailable")["message"]
    assert "w-vllmworker" in condition("MetricsAvailable")["message"]
    discovery.create_namespaced_endpoint_slice(env.ns, slice_for(env.ns, "w-vllmworker", 1, ip, w1.fpm_port))

    # Idle heartbeats arrive: one endpoint, one engine, nothing to do at the minimum.
    env.wait(
        lambda: load_status().get("fpmEndpoints") == 1 and load_status().get("engines") == 1,
        "planner subscribed to worker1's FPM",
        60,
    )
    cond = {c["type"]: c for c in env.planner("lp")["status"]["conditions"]}
    assert cond["SpecValid"]["status"] == "True"
    assert (
        cond["MetricsAvailable"]["status"] == "True"
        and "FPM from 1 worker endpoints" in cond["MetricsAvailable"]["message"]
    )
    assert env.dgd("w")["spec"]["services"]["VllmWorker"]["replicas"] == 1

    flood = Flood(w1.url)
    try:
        env.wait(lambda: env.dgd("w")["spec"]["services"]["VllmWorker"]["replicas"] > 1, "load loop scales up", 90)
    finally:
        flood.stop()
    assert flood.done > 0
    up = env.dgd("w")["spec"]["services"]["VllmWorker"]["replicas"]
    assert up in (2, 3)  # +ceil(1 x min(est/target, 2)) - 1
    # later ticks hold until the new replicas are ready
    assert env.planner("lp")["status"]["lastDecision"]["reason"] in ("scale_up_ttft", "hold_pending")
    ups = [e for e in env.events_once("w", "ScaledUp") if e.reason == "ScaledUp"]
    assert len(ups) == 1 and f"VllmWorker 1->{up}" in ups[0].message and "scale_up_ttft" in ups[0].message
    env.wait(
        lambda: env.apps.read_namespaced_deployment("w-vllmworker", env.ns).spec.replicas == up, "Deployment follows"
    )

    # The new replica "starts": its FPM endpoint appears in a second slice, the Deployment reports ready.
    w2 = Worker(env.tmp, "worker2", ip)
    env.workers.append(w2)
    discovery.create_namespaced_endpoint_slice(env.ns, slice_for(env.ns, "w-vllmworker", 2, ip, w2.fpm_port))
    env.set_ready("w-vllmworker", up)
    # Two workers with the same --worker-id 0 are two engines.
    env.wait(
        lambda: load_status().get("fpmEndpoints") == 2 and load_status().get("engines") == 2,
        "planner sees two engines",
        60,
    )
    # Load gone, both engines idle: consolidate one replica per load interval, down to the minimum.
    env.wait(lambda: env.dgd("w")["spec"]["services"]["VllmWorker"]["replicas"] == up - 1, "load loop scales down", 90)
    downs = [e for e in env.events_once("w", "ScaledDown") if e.reason == "ScaledDown"]
    assert downs and f"VllmWorker {up}->{up - 1}" in downs[0].message and "scale_down_consolidated" in downs[0].message
    assert env.planner("lp")["status"]["load"]["estimatedTtftMs"] == 0.0

    print("load-loop events:", [f"{e.reason}: {e.message}" for e in env.events("w") if e.reason.startswith("Scaled")])
    # A worker that leaves (its slice removed) is unsubscribed.
    discovery.delete_namespaced_endpoint_slice("w-vllmworker-2", env.ns)
    env.wait(lambda: load_status().get("fpmEndpoints") == 1, "worker2's endpoint dropped", 30)


def test_fpm_endpoint_discovery_rules_on_the_real_api(env):
    """KubernetesConnector.fpm_endpoints on EndpointSlices stored by the apiserver: the default Service
    ``<dgd>-<service>`` and port ``fpm``; ``spec.load.fpmServices`` / ``fpmPortName`` overrides; endpoints
    with ``ready: false`` skipped, unknown readiness kept; IPv6 addresses in brackets; other ports ignored."""
    import asyncio

    from planner.operator.kube import Kube
    from planner.operator.loop import KubernetesConnector
    from planner.operator.spec import parse_planner

    discovery = kubernetes.client.DiscoveryV1Api(env.admin)
    env.co.create_namespaced_custom_object(
        *DGD[:2],
        env.ns,
        DGD[2],
        {
            "apiVersion": "nvidia.com/v1alpha1",
            "kind": "DynamoGraphDeployment",
            "metadata": {"name": "d"},
            "spec": {
                "services": {
                    "P": {"componentType": "worker", "subComponentType": "prefill", "replicas": 2},
                    "D": {"componentType": "worker", "subComponentType": "decode", "replicas": 1},
                }
            },
        },
    )

    def es(name: str, service: str, family: str, port_name: str, port: int, endpoints: list) -> None:
        discovery.create_namespaced_endpoint_slice(
            env.ns,
            {
                "apiVersion": "discovery.k8s.io/v1",
                "kind": "EndpointSlice",
                "metadata": {
                    "name": name,
                    "labels": {
                        "kubernetes.io/service-name": service,
                        "endpointslice.kubernetes.io/managed-by": "dynoplan-tests",
                    },
                },
                "addressType": family,
                "ports": [{"name": port_name, "port": port, "protocol": "TCP"}],
                "endpoints": endpoints,
            },
        )

    es(
        "d-p-a",
        "d-p",
        "IPv4",
        "fpm",
        5557,
        [
            {"addresses": ["10.1.0.1"], "conditions": {"ready": True}},
            {"addresses": ["10.1.0.2"], "conditions": {"ready": False}},
            {"addresses": ["10.1.0.3"]},
        ],
    )
    es("d-p-b", "d-p", "IPv6", "fpm", 5557, [{"addresses": ["fd00::7"], "conditions": {"ready": True}}])
    es("d-p-http", "d-p", "IPv4", "http", 8000, [{"addresses": ["10.1.0.9"], "conditions": {"ready": True}}])
    es("d-d-a", "d-d", "IPv4", "fpm", 6000, [{"addresses": ["10.1.1.1"], "conditions": {"ready": True}}])
    es("custom-a", "decode-pods", "IPv4", "zmq", 7000, [{"addresses": ["10.1.2.1"], "conditions": {"ready": True}}])

    def endpoints(load: dict) -> dict:
        body = {
            "metadata": {"name": "x", "namespace": env.ns},
            "spec": {"targetRef": {"name": "d"}, "mode": "disagg", "load": load},
        }
        conn = KubernetesConnector(Kube(env.admin), parse_planner(body))

        async def go() -> dict:
            return await conn.fpm_endpoints(await conn.observe())

        return asyncio.run(go())

    assert endpoints({"enabled": True}) == {
        "tcp://10.1.0.1:5557": "prefill",
        "tcp://10.1.0.3:5557": "prefill",
        "tcp://[fd00::7]:5557": "prefill",
        "tcp://10.1.1.1:6000": "decode",
    }
    assert endpoints({"enabled": True, "fpmServices": {"decode": "decode-pods"}, "fpmPortName": "zmq"}) == {
        "tcp://10.1.2.1:7000": "decode"
    }
