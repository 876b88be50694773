# Shared fixtures for real components (apiserver/etcd, helm, Prometheus, headless chromium):
# see tests/infra/fixtures.py. Other conftest content may be added below.
# Property tests draw the same examples on every run in CI (``derandomize``: examples derived from each test
# itself), so a submission's CI cannot fail on an example no earlier run saw; locally they explore at random.
import os as _os

from hypothesis import settings as _settings

from tests.infra.fixtures import chromium, helm_bin, k8s, k8s_admin, prometheus_factory  # noqa: F401

_settings.register_profile("ci", derandomize=True, database=None)
if _os.environ.get("CI"):
    _settings.load_profile("ci")
