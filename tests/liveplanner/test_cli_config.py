"""User mistakes in the stack file and on the command line: one line on stderr, exit 2, nothing started."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from planner.errors import ConfigError
from planner.live.config import load_stack_config, stack_config_from_mapping
from tests.liveplanner.stack import stack_file

DYNOPLAN = [sys.executable, "-m", "planner.cli"]


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(DYNOPLAN + list(argv), capture_output=True, text=True, timeout=60)


def test_every_problem_is_named_at_once(tmp_path):
    with pytest.raises(ConfigError) as e:
        stack_config_from_mapping({"planner": {"mode": "agg", "ttft_ms": -1}, "connector": "k8s", "bogus": 1,
                                   "frontend": {"router": "random"}, "fleet": {"initial": {"decode": 2}},
                                   "prometheus": {"enabled": "maybe"}}, tmp_path)
    msg = str(e.value)
    for part in ("planner.ttft_ms=-1", "connector='k8s'", "bogus: unknown setting", "frontend.router='random'",
                 "fleet.initial.decode: pool not planned in mode 'agg'", "prometheus.enabled='maybe'",
                 "profile=None: expected a performance profile"):
        assert part in msg, part


def test_valid_file_resolves_paths(tmp_path):
    cfg = load_stack_config(stack_file(tmp_path))
    assert cfg.profile == (tmp_path / "profile.npz").resolve() and cfg.state_dir == (tmp_path / "state").resolve()
    assert cfg.planner.mode == "agg" and cfg.initial == {"agg": 1} and cfg.worker_args["agg"][0] == "--speedup-ratio"


def test_up_bad_file_one_line_exit_2(tmp_path):
    p = stack_file(tmp_path)
    doc = yaml.safe_load(p.read_text())
    doc["planner"]["agg"] = {"min_replicas": 5, "max_replicas": 2}
    p.write_text(yaml.safe_dump(doc))
    r = _run("up", "--config", str(p))
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "agg.min_replicas=5: expected <= agg.max_replicas=2" in r.stderr
    assert not (tmp_path / "state" / "stack.json").exists()


def test_missing_file_and_unparsable(tmp_path):
    r = _run("planner", "--config", str(tmp_path / "nope.yaml"))
    assert r.returncode == 2 and "cannot read stack file" in r.stderr and r.stderr.count("\n") == 1
    bad = tmp_path / "bad.yaml"
    bad.write_text("planner: [unclosed\n")
    r = _run("up", "--config", str(bad))
    assert r.returncode == 2 and "cannot parse stack file" in r.stderr and r.stderr.count("\n") == 1


def test_up_refuses_virtual_connector(tmp_path):
    p = stack_file(tmp_path, connector="virtual")
    r = _run("up", "--config", str(p))
    assert r.returncode == 2 and "connector='virtual'" in r.stderr


def test_planner_port_in_use(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        p = stack_file(tmp_path, connector="virtual")
        r = _run("planner", "--config", str(p), "--port", str(port))
    assert r.returncode == 2 and f"cannot listen on 127.0.0.1:{port}" in r.stderr.splitlines()[-1]
