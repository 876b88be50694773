"""The process defaults ``dynoplan/__init__.py`` sets before numpy is imported (docs/architecture.md "Start-up"):
one OpenBLAS thread unless the environment says otherwise. Each case runs a fresh interpreter, since a setting
made after numpy's first import has no effect."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

PROBE = """
import json, os, sys
import {first}
import numpy
from threadpoolctl import threadpool_info
blas = [i["num_threads"] for i in threadpool_info() if i["internal_api"] == "openblas"]
print(json.dumps({{"env": os.environ.get("OPENBLAS_NUM_THREADS"), "blas": blas}}))
"""


def _probe(first: str, env_value: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    if env_value is not None:
        env["OPENBLAS_NUM_THREADS"] = env_value
    out = subprocess.run(
        [sys.executable, "-c", PROBE.format(first=first)], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.splitlines()[-1])


@pytest.mark.parametrize("first", ["mocker.config", "planner.core", "dynoplan.settings"])
def test_one_blas_thread_when_the_environment_sets_none(first: str) -> None:
    got = _probe(first, None)
    assert got["env"] == "1"
    assert got["blas"] and all(n == 1 for n in got["blas"])


def test_a_thread_count_the_environment_sets_is_kept() -> None:
    got = _probe("mocker.config", "2")
    assert got["env"] == "2"
    # OpenBLAS runs no more threads than the machine has cores
    assert got["blas"] and all(n == min(2, os.cpu_count() or 1) for n in got["blas"])
