"""Small things on the ``dynoplan up`` / ``dynoplan planner`` path, through the real CLI:
one line naming the field (or place), the value and what was expected, exit 2, nothing left behind."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from dynoplan.errors import ConfigError
from planner.live.config import load_stack_config, stack_config_from_mapping
from tests.liveplanner.stack import stack_file, write_profile

DYNOPLAN = [sys.executable, "-m", "planner.cli"]


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(DYNOPLAN + list(argv), capture_output=True, text=True, timeout=60)


def test_broken_stack_yaml_names_line_and_column(tmp_path):
    bad = tmp_path / "stack.yaml"
    bad.write_text("# a stack\nplanner: {mode: agg, adjustment_interval_s: 10\nprofile: p.npz\n")
    for cmd in ("up", "planner"):
        r = _run(cmd, "--config", str(bad))
        assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
        # the flow mapping opened at line 2 column 10 is not closed; the parser notices at line 3 column 8
        assert r.stderr == (
            f"dynoplan {cmd}: error: {bad}: cannot parse stack file at line 3, column 8: expected ',' "
            "or '}', but got ':' (while parsing a flow mapping started at line 2, column 10); "
            "expected YAML (see examples/stack.yaml)\n"
        ), r.stderr
    tab = tmp_path / "tab.yaml"
    tab.write_text("planner:\n\tmode: agg\n")
    r = _run("up", "--config", str(tab))
    assert (
        r.returncode == 2
        and "cannot parse stack file at line 2, column 1: found character '\\t' that cannot start any token" in r.stderr
    ), r.stderr


@pytest.mark.parametrize("cmd,key", [("up", "frontend"), ("up", "service"), ("planner", "service")])
def test_refused_start_on_a_port_in_use_leaves_no_state_dir(tmp_path, cmd, key):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        p = stack_file(tmp_path, **{key: {"port": port}}, state_dir="new/state")
        r = _run(cmd, "--config", str(p))
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert f"127.0.0.1:{port}" in r.stderr
    if cmd == "up":
        assert (
            f"{key}.port={port}: cannot listen on 127.0.0.1:{port} (Address already in use); expected a free port"
            in r.stderr
        )
    assert not (tmp_path / "new").exists()  # neither the state dir nor its parent it would have created


def test_short_adjustment_interval_is_not_refused_for_a_load_loop_that_is_off(tmp_path):
    prof = str(write_profile(tmp_path / "p.npz"))
    # load loop off, its interval unset: the core's default 5 s is not below 5 s, so half the throughput interval
    cfg = stack_config_from_mapping({"planner": {"mode": "agg", "adjustment_interval_s": 5}, "profile": prof}, tmp_path)
    assert (cfg.planner.adjustment_interval_s, cfg.planner.load_adjustment_interval_s) == (5, 2.5)
    cfg = stack_config_from_mapping(
        {"planner": {"mode": "agg", "adjustment_interval_s": 30}, "profile": prof}, tmp_path
    )
    assert cfg.planner.load_adjustment_interval_s == 5.0  # the default where it fits
    # set by the user, or with the load loop on: validated as given
    for planner in (
        {"adjustment_interval_s": 5, "load_adjustment_interval_s": 5},
        {"adjustment_interval_s": 5, "load_enabled": True},
    ):
        with pytest.raises(ConfigError) as e:
            stack_config_from_mapping({"planner": {"mode": "agg", **planner}, "profile": prof}, tmp_path)
        assert e.value.problems == [
            "planner.load_adjustment_interval_s=5.0: expected less than adjustment_interval_s=5.0"
        ]
    # through the CLI: the file of the issue loads (up refuses it only later, on its own port check here)
    p = stack_file(tmp_path, planner={"adjustment_interval_s": 5})
    text = p.read_text().replace("  load_adjustment_interval_s: 1\n", "")
    assert "load_adjustment_interval_s" not in text
    p.write_text(text)
    assert load_stack_config(p).planner.load_adjustment_interval_s == 2.5


@pytest.mark.parametrize(
    "cmd,sections,expected",
    [
        (
            "up",
            {"frontend": {"port": 18090}, "service": {"port": 18090}},
            "service.port=18090: same port as frontend.port, expected distinct ports",
        ),
        (
            "planner",
            {"frontend": {"port": 18090}, "service": {"port": 18090}},
            "service.port=18090: same port as frontend.port, expected distinct ports",
        ),
        (
            "up",
            {"frontend": {"port": 18091}, "prometheus": {"port": 18091}},
            "prometheus.port=18091: same port as frontend.port, expected distinct ports",
        ),
        (
            "up",
            {"service": {"port": 18092}, "prometheus": {"port": 18092}},
            "prometheus.port=18092: same port as service.port, expected distinct ports",
        ),
    ],
)
def test_equal_ports_of_the_stack_are_refused_before_anything_starts(tmp_path, cmd, sections, expected):
    p = stack_file(tmp_path, **sections, state_dir="new/state")
    r = _run(cmd, "--config", str(p))
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert expected in r.stderr, r.stderr
    assert not (tmp_path / "new").exists()


def test_equal_ports_are_fine_where_they_do_not_listen(tmp_path):
    prof = str(write_profile(tmp_path / "p.npz"))
    base = {"planner": {"mode": "agg"}, "profile": prof}
    # 0 = a free port each; prometheus.port is unused with an external Prometheus or none
    cfg = stack_config_from_mapping({**base, "frontend": {"port": 0}, "service": {"port": 0}}, tmp_path)
    assert (cfg.frontend_port, cfg.service_port, cfg.prometheus_port) == (0, 0, 0)
    for pr in ({"url": "http://127.0.0.1:9090", "port": 8080}, {"enabled": False, "port": 8080}):
        assert stack_config_from_mapping({**base, "prometheus": pr}, tmp_path).prometheus_port == 8080
    with pytest.raises(ConfigError) as e:
        stack_config_from_mapping({**base, "prometheus": {"port": 8080}}, tmp_path)  # frontend's default 8080
    assert e.value.problems == [
        "prometheus.port=8080: same port as frontend.port, expected distinct ports (or 0 for any free port)"
    ]


def _processes_naming(text: str) -> list[int]:
    """Pids of live (not zombie) processes whose command line contains ``text``."""
    from pathlib import Path

    from tests.liveplanner.stack import pid_alive

    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if text in cmd and pid_alive(int(d.name)):
                out.append(int(d.name))
    return out


def test_failed_start_removes_the_state_dir_it_created(tmp_path):
    """A worker flag mocker serve rejects, found only when the worker starts (after the frontend): the error
    quotes the worker's own line, names no log (it is gone with the state dir), and nothing runs on."""
    p = stack_file(
        tmp_path,
        prometheus={"enabled": False},
        state_dir="new/state",
        fleet={"initial": {"agg": 1}, "worker_args": {"agg": ["--speedup-ratioo", "1"]}},
    )
    r = _run("up", "--config", str(p))
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert 'fleet.worker_args.agg=["--speedup-ratioo", "1"]: worker agg-1 exited during start-up: ' in r.stderr
    assert "unrecognized arguments: --speedup-ratioo 1" in r.stderr, r.stderr
    assert "log" not in r.stderr.split("exited during start-up")[1], r.stderr
    assert not (tmp_path / "new").exists()  # the state dir and the parent this run created
    assert _processes_naming(str(tmp_path / "new" / "state")) == []


def test_pool_of_another_mode_under_a_defaulted_mode_names_planner_mode(tmp_path):
    p = stack_file(tmp_path)
    import yaml

    doc = yaml.safe_load(p.read_text())
    del doc["planner"]  # no planner section: mode disagg by default; the file's fleet is agg
    p.write_text(yaml.safe_dump(doc))
    r = _run("up", "--config", str(p))
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert (
        "fleet.initial.agg: pool not planned in mode 'disagg' (planner.mode unset, default disagg; expected "
        "prefill, decode)"
    ) in r.stderr, r.stderr
    assert (
        "fleet.worker_args.agg: pool not planned in mode 'disagg' (planner.mode unset, default disagg; "
        "expected prefill, decode)"
    ) in r.stderr, r.stderr
    assert not (tmp_path / "state").exists()
    # set explicitly: no note
    doc["planner"] = {"mode": "disagg"}
    p.write_text(yaml.safe_dump(doc))
    r = _run("up", "--config", str(p))
    assert (
        r.returncode == 2
        and "fleet.initial.agg: pool not planned in mode 'disagg' (expected prefill, decode)" in r.stderr
    ), r.stderr
