# The local one-node cluster (tools/cluster.py) for the walkthrough test: tests/infra/fixtures.py.
from tests.infra.fixtures import local_cluster  # noqa: F401
