"""pytest fixtures for the real components (imported by tests/conftest.py so every test can use them).

- ``k8s`` (session): a running :class:`tests.infra.k8s.ControlPlane` (etcd + kube-apiserver, RBAC).
- ``k8s_admin`` (function): a ``kubernetes.client.ApiClient`` for the admin, closed afterwards.
- ``helm_bin`` (session): path of the pinned helm binary.
- ``prometheus_factory`` (function): ``make(targets, scrape_interval_s=1.0) -> PrometheusServer``;
  every server it made is stopped (and its temp dir removed) at teardown.
- ``chromium`` (session): a :class:`tests.infra.browser.HeadlessChromium`.
- ``local_cluster`` (module): a :class:`tests.infra.cluster.LocalCluster` (``tools/cluster.py``: a real
  one-node cluster with kubelet, containerd, CNI, kube-proxy, CoreDNS), torn down after the module, so
  it never runs next to other tests.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.infra.browser import HeadlessChromium
from tests.infra.cluster import LocalCluster
from tests.infra.k8s import ControlPlane, binary_path
from tests.infra.prometheus import PrometheusServer, Targets


@pytest.fixture(scope="session")
def k8s() -> Iterator[ControlPlane]:
    cp = ControlPlane.start()
    try:
        yield cp
    finally:
        cp.stop()


@pytest.fixture
def k8s_admin(k8s: ControlPlane):
    with k8s.admin_client() as api:
        yield api


@pytest.fixture(scope="session")
def helm_bin() -> Path:
    return binary_path("helm")


@pytest.fixture
def prometheus_factory():
    made: list[PrometheusServer] = []

    def make(targets: Targets = (), scrape_interval_s: float = 1.0, **kw) -> PrometheusServer:
        server = PrometheusServer.start(targets, scrape_interval_s, **kw)
        made.append(server)
        return server

    try:
        yield make
    finally:
        for server in made:
            server.stop()


@pytest.fixture(scope="session")
def chromium() -> Iterator[HeadlessChromium]:
    with HeadlessChromium() as browser:
        yield browser


@pytest.fixture(scope="module")
def local_cluster() -> Iterator[LocalCluster]:
    cluster = LocalCluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()
