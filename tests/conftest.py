# Shared fixtures for real components (apiserver/etcd, helm, Prometheus, headless chromium):
# see tests/infra/fixtures.py. Other conftest content may be added below.
# Property tests draw the same examples on every run in CI (``derandomize``: examples derived from each test
# itself), so a submission's CI cannot fail on an example no earlier run saw; locally they explore at random.
import os as _os

from hypothesis import settings as _settings

from tests.infra.fixtures import chromium, helm_bin, k8s, k8s_admin, prometheus_factory  # noqa: F401

# No per-example deadline anywhere: how long an example takes depends on the machine's load, not on the code,
# and a test must not fail by timing luck.
_settings.register_profile("ci", derandomize=True, database=None, deadline=None)
_settings.register_profile("local", deadline=None)
_settings.load_profile("ci" if _os.environ.get("CI") else "local")
