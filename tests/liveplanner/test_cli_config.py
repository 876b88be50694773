"""User mistakes in the stack file and on the command line: one line on stderr, exit 2, nothing started."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from dynoplan.errors import ConfigError
from planner.live.config import load_stack_config, stack_config_from_mapping
from tests.liveplanner.stack import stack_file, write_profile

DYNOPLAN = [sys.executable, "-m", "planner.cli"]


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(DYNOPLAN + list(argv), capture_output=True, text=True, timeout=60)


def test_every_problem_is_named_at_once(tmp_path):
    with pytest.raises(ConfigError) as e:
        stack_config_from_mapping(
            {
                "planner": {"mode": "agg", "ttft_ms": -1},
                "connector": "k8s",
                "bogus": 1,
                "frontend": {"router": "random"},
                "fleet": {"initial": {"decode": 2}},
                "prometheus": {"enabled": "maybe"},
            },
            tmp_path,
        )
    msg = str(e.value)
    for part in (
        "planner.ttft_ms=-1",
        'connector="k8s"',
        "bogus: unknown setting",
        'frontend.router="random"',
        "fleet.initial.decode: pool not planned in mode 'agg'",
        'prometheus.enabled="maybe"',
        "profile=null: expected a performance profile",
    ):
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


def test_values_checked_with_field_value_expectation(tmp_path):
    (tmp_path / "ca.pem").write_text("not checked here")
    with pytest.raises(ConfigError) as e:
        stack_config_from_mapping(
            {
                "planner": {"mode": "agg", "agg": {"min_replicas": 1, "max_replicas": 3}},
                "service": {"port": 70000, "token": 123},
                "frontend": {"port": -1},
                "fleet": {"initial": {"agg": 9}},
                "prometheus": {"url": "localhost:9090", "ca_file": "missing.pem", "port": "x"},
            },
            tmp_path,
        )
    msg = str(e.value)
    assert e.value.problems == [
        "service.port=70000: expected <= 65535",
        "service.token=123: expected a string",
        "frontend.port=-1: expected >= 0",
        'prometheus.url="localhost:9090": expected an http:// or https:// URL',
        'prometheus.port="x": expected an integer',
        "profile=null: expected a performance profile (.npz) when planner.throughput_enabled is true",
        "fleet.initial.agg=9: expected at most planner.agg.max_replicas=3",
        f'prometheus.ca_file="{tmp_path / "missing.pem"}": file not found (expected a PEM CA bundle)',
    ], msg
    ok = stack_config_from_mapping(
        {
            "planner": {"mode": "agg", "throughput_enabled": False, "load_enabled": True},
            "prometheus": {"url": "https://p:9090", "ca_file": "ca.pem"},
        },
        tmp_path,
    )
    assert ok.prometheus_ca_file == str(tmp_path / "ca.pem")


def test_unknown_mode_reported_alone(tmp_path):
    """A bad mode is one problem; the pools of the other sections are not judged against a guessed mode."""
    with pytest.raises(ConfigError) as e:
        stack_config_from_mapping(
            {
                "planner": {"mode": "foo"},
                "profile": str(write_profile(tmp_path / "p.npz")),
                "fleet": {"initial": {"agg": 1}},
            },
            tmp_path,
        )
    assert e.value.problems == ["planner.mode=\"foo\": expected one of 'disagg', 'prefill', 'decode' or 'agg'"]


def test_up_port_in_use_named_before_anything_starts(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        p = stack_file(tmp_path, frontend={"port": port})
        r = _run("up", "--config", str(p))
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert f"frontend.port={port}: cannot listen on 127.0.0.1:{port}" in r.stderr
    assert not (tmp_path / "state" / "stack.json").exists()


def test_up_bad_worker_flag_reports_the_worker_error(tmp_path):
    """A worker flag mocker serve rejects: up stops at the first worker exit with that worker's own one-line
    error and leaves nothing running. The state dir existed before, so it keeps what the run wrote (a fresh one
    is removed: tests/liveplanner/test_cli_small_things.py)."""
    (tmp_path / "state").mkdir()
    p = stack_file(
        tmp_path,
        prometheus={"enabled": False},
        fleet={"initial": {"agg": 1}, "worker_args": {"agg": ["--speedup-ratio", "-3"]}},
    )
    r = _run("up", "--config", str(p))
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert 'fleet.worker_args.agg=["--speedup-ratio", "-3"]: worker agg-1 exited during start-up: ' in r.stderr
    assert "--speedup-ratio: '-3': expected" in r.stderr
    import json

    from tests.liveplanner.stack import pid_alive

    info = json.loads((tmp_path / "state" / "stack.json").read_text())
    assert info["frontend_pid"] and not pid_alive(info["frontend_pid"])


def test_up_bad_profile_and_prometheus_binary(tmp_path):
    p = stack_file(tmp_path, profile="stack.yaml")
    r = _run("up", "--config", str(p))
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert f"profile={str(tmp_path / 'stack.yaml')!r}: expected a performance profile .npz" in r.stderr
    (tmp_path / "warm.jsonl").write_text('{"timestamp": "soon"}\n')
    r = _run("up", "--config", str(stack_file(tmp_path, warm_start_trace="warm.jsonl")))
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert f"warm_start_trace={str(tmp_path / 'warm.jsonl')!r}: cannot read the trace: " in r.stderr
    p = stack_file(tmp_path)
    import os

    r = subprocess.run(
        DYNOPLAN + ["up", "--config", str(p)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "DYNOPLAN_PROMETHEUS": str(tmp_path / "nope")},
    )
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert f"DYNOPLAN_PROMETHEUS={str(tmp_path / 'nope')!r}: expected the path of an executable" in r.stderr
    # prometheus.enabled: true without the binary: refused before anything starts
    env = {k: v for k, v in os.environ.items() if k != "DYNOPLAN_PROMETHEUS"}
    r = subprocess.run(
        DYNOPLAN + ["up", "--config", str(stack_file(tmp_path, prometheus={"enabled": True}))],
        capture_output=True,
        text=True,
        timeout=60,
        env={**env, "PATH": str(tmp_path)},
    )
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "prometheus.enabled=true: expected a `prometheus` binary on PATH" in r.stderr
    assert not (tmp_path / "state" / "stack.json").exists()


def test_planner_port_flag_range(tmp_path):
    r = _run("planner", "--config", str(stack_file(tmp_path)), "--port", "70000")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "'70000': expected a TCP port" in r.stderr


@pytest.mark.parametrize("value", ["-1", "abc", "1.5"])
def test_up_max_planner_restarts_is_a_count(tmp_path, value):
    r = _run("up", "--config", str(stack_file(tmp_path)), "--max-planner-restarts", value)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert f"argument --max-planner-restarts: {value!r}: expected an integer >= 0" in r.stderr
    assert not (tmp_path / "state").exists()  # refused as the flag is read: nothing started, nothing written


@pytest.mark.parametrize("command", ["up", "planner"])
@pytest.mark.parametrize("value", ["", "  "])
def test_an_empty_state_dir_flag_is_refused(tmp_path, command, value):
    # was: the stack file's state_dir used silently (up started the whole stack there)
    r = _run(command, "--config", str(stack_file(tmp_path)), "--state-dir", value)
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr == (
        f"dynoplan {command}: error: argument --state-dir: {value!r}: empty, expected a directory path (omit "
        f"--state-dir for the stack file's state_dir) (see dynoplan {command} --help)\n"
    )
    assert not (tmp_path / "state").exists()  # the stack file's state_dir: nothing started, nothing written


def test_up_stops_promptly_when_interrupted_during_start_up(tmp_path):
    """SIGTERM while ``up`` still waits for a child to become ready (here a stand-in Prometheus that never
    answers): up stops what it started and exits instead of finishing the start-up first."""
    import json
    import os
    import signal

    from tests.infra._proc import start_process, wait_until
    from tests.liveplanner.stack import pid_alive

    fake = tmp_path / "never-ready-prometheus"
    fake.write_text("#!/bin/sh\nexec sleep 300\n")
    fake.chmod(0o755)
    p = stack_file(tmp_path)
    log = tmp_path / "up.log"
    proc = start_process(
        DYNOPLAN + ["up", "--config", str(p)], log, env={**os.environ, "DYNOPLAN_PROMETHEUS": str(fake)}
    )
    info_path = tmp_path / "state" / "stack.json"

    def prometheus_started() -> bool:
        try:
            return "prometheus_pid" in json.loads(info_path.read_text())
        except (OSError, ValueError):
            return False

    try:
        wait_until(prometheus_started, 60, "up starting the stand-in prometheus", proc, log)
        info = json.loads(info_path.read_text())
        os.kill(proc.pid, signal.SIGTERM)
        rc = proc.wait(timeout=30)  # the wait for /-/ready is 60 s: returning first means it was cut short
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert rc == 130, log.read_text()
    assert "ready" not in log.read_text().split()
    assert not pid_alive(info["frontend_pid"]) and not pid_alive(info["prometheus_pid"])


def test_state_dir_host_and_planner_section_mistakes(tmp_path):
    with pytest.raises(ConfigError) as e:
        stack_config_from_mapping({"planner": 5, "fleet": {"initial": {"agg": -1}}}, tmp_path)
    # the pools of fleet.initial cannot be judged without a mode: only the values themselves are
    assert e.value.problems == ["planner=5: expected a mapping", "fleet.initial.agg=-1: expected >= 0"]
    r = _run("up", "--config", str(stack_file(tmp_path, state_dir=str(tmp_path / "profile.npz"))))
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert f"state_dir={str(tmp_path / 'profile.npz')!r}: expected a writable directory" in r.stderr
    r = _run("up", "--config", str(stack_file(tmp_path, service={"host": "999.1.1.1", "port": 0})))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and 'service.host="999.1.1.1": cannot listen' in r.stderr


def test_second_up_on_a_running_stack_is_refused(tmp_path):
    """A second ``up`` with the same state_dir must not stop the first one's processes as 'left over'."""
    import json
    import os
    import signal

    from tests.infra._proc import start_process, wait_until
    from tests.liveplanner.stack import pid_alive

    p = stack_file(tmp_path, prometheus={"enabled": False})
    first = start_process(DYNOPLAN + ["up", "--config", str(p)], tmp_path / "up1.log")
    try:
        wait_until(
            lambda: "ready" in (tmp_path / "up1.log").read_text().split(), 120, "first up", first, tmp_path / "up1.log"
        )
        info = json.loads((tmp_path / "state" / "stack.json").read_text())
        r = _run("up", "--config", str(p))
        assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
        assert f"another `dynoplan up` (pid {first.pid}) runs this stack" in r.stderr
        assert pid_alive(info["frontend_pid"]) and pid_alive(info["planner_pid"]) and first.poll() is None
    finally:
        os.kill(first.pid, signal.SIGTERM)
        first.wait(60)


def test_load_loop_needs_fpm_from_a_local_fleet(tmp_path):
    write_profile(tmp_path / "p.npz")
    base = {"planner": {"mode": "agg", "load_enabled": True}, "profile": "p.npz"}
    with pytest.raises(ConfigError) as e:
        stack_config_from_mapping({**base, "fpm": False}, tmp_path)
    assert e.value.problems == [
        "fpm=false: expected true when planner.load_enabled is true (the load loop reads "
        "the workers' ForwardPassMetrics)"
    ]
    with pytest.raises(ConfigError) as e:
        stack_config_from_mapping({**base, "connector": "virtual"}, tmp_path)
    assert e.value.problems[0].startswith("planner.load_enabled=true: expected false with connector virtual")
    assert stack_config_from_mapping(base, tmp_path).planner.load_enabled


def test_stack_sections_strict_types_did_you_mean_and_every_problem_at_once(tmp_path):
    prof = str(write_profile(tmp_path / "p.npz"))
    with pytest.raises(ConfigError) as e:
        stack_config_from_mapping(
            {
                "planner": {"mode": "agg", "max_gpu_budget": True},
                "profile": prof,
                "service": {"port": True, "hots": "0.0.0.0"},
                "frontend": {"poll_s": "0.5"},
                "fleet": {"initial": {"agg": 1.5}, "worker_args": {"agg": [True]}},
                "prometheus": {"timeout_s": False},
                "conector": "local",
            },
            tmp_path,
        )
    assert e.value.problems == [
        "service.port=true: expected an integer",
        "service.hots: unknown setting (did you mean service.host?)",
        'frontend.poll_s="0.5": expected a number',
        "fleet.initial.agg=1.5: expected an integer",
        "fleet.worker_args.agg.0=true: expected a string",
        "prometheus.timeout_s=false: expected a number",
        "conector: unknown setting (did you mean connector?)",
        "planner.max_gpu_budget=true: expected an integer",
    ]
    # numbers in worker_args are their text; YAML's true/false for prometheus.enabled are its words
    ok = stack_config_from_mapping(
        {
            "planner": {"mode": "agg"},
            "profile": prof,
            "prometheus": {"enabled": False},
            "fleet": {"worker_args": {"agg": ["--speedup-ratio", 10]}},
        },
        tmp_path,
    )
    assert (ok.worker_args, ok.prometheus_enabled, ok.initial) == (
        {"agg": ("--speedup-ratio", "10")},
        "false",
        {"agg": 1},
    )
