"""What a ``dynoplan`` command imports before it prints its help: only the chosen subcommand's module and what
its flags need (planner/cli.py imports one subcommand module; each CLI module imports what only a run needs
inside its ``run``). Each case runs in a fresh interpreter, whose ``sys.modules`` is then read."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import contextlib, io, json, sys
from planner.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    try:
        main(sys.argv[1:])
    except SystemExit as e:
        assert e.code == 0, e.code
print(json.dumps(sorted(sys.modules)))
"""

RUN_ONLY = ("scipy", "pandas", "plotly", "statsmodels", "kubernetes", "kopf", "aiohttp", "prometheus_client", "zmq")
"""Libraries no ``--help`` needs (they serve a run: sizing statistics, the live stack, the operator)."""


def modules_after(*argv: str) -> set[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", PROBE, *argv], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    ).stdout
    return set(json.loads(out))


@pytest.mark.parametrize(
    ("argv", "imported", "not_imported"),
    [
        (("--help",), (), ("mocker.cli_replay", "planner.cli_simulate", "mocker.arguments")),
        (
            ("replay", "--help"),
            ("mocker.cli_replay",),
            ("planner.core", "planner.cli_simulate", "mocker.cli_live", "mocker.fleet", "mocker.engine", "rich"),
        ),
        (("mocker", "serve", "--help"), ("mocker.cli_live",), ("mocker.engine", "mocker.live.worker", "asyncio")),
        (("simulate", "--help"), ("planner.cli_simulate",), ("planner.sim.loop", "mocker.fleet", "mocker.cli_replay")),
        (("planner", "--help"), ("planner.cli_up",), ("planner.whatif", "mocker.fleet")),
        (("profile", "--help"), ("planner.cli_profile",), ("planner.sim.profile", "mocker.engine")),
    ],
)
def test_help_imports_only_the_chosen_subcommand(
    argv: tuple[str, ...], imported: tuple[str, ...], not_imported: tuple[str, ...]
) -> None:
    mods = modules_after(*argv)
    for name in imported:
        assert name in mods, name
    roots = {m.split(".")[0] for m in mods}
    for name in not_imported + RUN_ONLY:
        assert name not in mods and name not in roots, name
