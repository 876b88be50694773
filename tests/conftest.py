# Shared fixtures for real components (apiserver/etcd, helm, Prometheus, headless chromium):
# see tests/infra/fixtures.py. Other conftest content may be added below.
from tests.infra.fixtures import chromium, helm_bin, k8s, k8s_admin, prometheus_factory  # noqa: F401
