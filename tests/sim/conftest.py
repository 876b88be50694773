"""Fixtures of the simulate CLI tests."""

from __future__ import annotations

import pytest

from planner.cli import main as cli_main
from tests.sim.cli_helpers import PROFILE_GRID


@pytest.fixture(scope="module")
def profile(tmp_path_factory) -> str:
    """A small planner profile of the default engine (``dynoplan profile`` on PROFILE_GRID), path as str."""
    out = tmp_path_factory.mktemp("prof") / "p.npz"
    assert cli_main(["profile", "--out", str(out), *PROFILE_GRID]) == 0
    return str(out)
