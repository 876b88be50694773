"""``tools/cluster.py`` without a cluster: its command line (one-line errors, exit 2, help text) and the
decisions of ``up`` and ``down`` (keep a healthy cluster, bring down stale state, clean up after a failed
start, purge the state directory only when asked). The steps that touch the machine are replaced by
recorders; the real ``up``/``down`` run in tests/e2e (fixture ``local_cluster``)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from tests.infra._proc import REPO_ROOT

TOOL = REPO_ROOT / "tools" / "cluster.py"


@pytest.fixture
def cluster(monkeypatch, tmp_path):
    spec = importlib.util.spec_from_file_location("dynoplan_cluster_tool", TOOL)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    calls: list[str] = []
    mod.calls = calls
    monkeypatch.setattr(mod, "check_prerequisites", lambda: None)
    monkeypatch.setattr(mod, "down", lambda purge=False: calls.append("down"))
    monkeypatch.setattr(mod, "_start", lambda timeout_s: calls.append(f"start {timeout_s:g}"))
    monkeypatch.setattr(mod, "leftovers", lambda: [])
    monkeypatch.setattr(mod, "running", lambda name: None)
    return mod


def run_tool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(TOOL), *args], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(
    "args, value",
    [
        (["--timeout-s", "0", "up"], "'0'"),
        (["--timeout-s", "-3", "up"], "'-3'"),
        (["up", "--timeout-s", "nan"], "'nan'"),
        (["up", "--timeout-s", "x"], "'x'"),
        (["--timeout-s", "inf", "up"], "'inf'"),
    ],
)
def test_timeout_must_be_positive_seconds(args, value):
    p = run_tool(*args)
    assert p.returncode == 2 and p.stdout == ""
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert "--timeout-s" in lines[0] and value in lines[0] and "expected seconds > 0" in lines[0], lines[0]


def test_unknown_command_is_one_line_exit_2():
    p = run_tool("frobnicate")
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and "frobnicate" in p.stderr


def test_help_is_whole_and_names_every_subcommand():
    p = run_tool("--help")
    assert p.returncode == 0
    # the whole usage block, not cut at the docstring's first paragraph
    for text in (
        "tools/cluster.py up ",
        "tools/cluster.py status",
        "tools/cluster.py down --purge",
        "healthy running",
        "--timeout-s S",
    ):
        assert text in p.stdout, text
    for cmd, words in (
        ("up", "start the cluster"),
        ("status", "which components run"),
        ("down", "undo every host change"),
    ):
        line = next(ln for ln in p.stdout.splitlines() if ln.strip().startswith(cmd + " "))
        assert words in line, line
    d = run_tool("down", "--help")
    assert d.returncode == 0 and "--purge" in d.stdout


def test_up_keeps_a_healthy_running_cluster(cluster, monkeypatch, capsys):
    monkeypatch.setattr(cluster, "running", lambda name: 4242)
    monkeypatch.setattr(
        cluster,
        "api_get",
        lambda path: (
            200,
            {"status": {"conditions": [{"type": "Ready", "status": "True"}]}} if "nodes" in path else {},
        ),
    )
    cluster.up(30)
    out = capsys.readouterr().out
    assert cluster.calls == []  # neither down nor start
    assert "already up and healthy" in out and f"KUBECONFIG={cluster.KUBECONFIG}" in out


@pytest.mark.parametrize("node_status", ["False", None])
def test_up_restarts_a_running_cluster_that_is_not_healthy(cluster, monkeypatch, capsys, node_status):
    monkeypatch.setattr(cluster, "running", lambda name: 4242)
    if node_status is None:  # apiserver gone

        def api_get(path):
            raise ConnectionRefusedError(111, "Connection refused")
    else:

        def api_get(path):
            return (
                200,
                {"status": {"conditions": [{"type": "Ready", "status": node_status}]}} if "nodes" in path else {},
            )

    monkeypatch.setattr(cluster, "api_get", api_get)
    cluster.up(30)
    err = capsys.readouterr().err
    assert cluster.calls == ["down", "start 30"]
    assert ("not Ready" if node_status else "unreachable") in err


def test_up_brings_down_a_partial_run_first(cluster, monkeypatch, capsys):
    monkeypatch.setattr(cluster, "running", lambda name: 4242 if name == "containerd" else None)
    monkeypatch.setattr(cluster, "leftovers", lambda: ["process containerd", "interface cni0"])
    cluster.up(30)
    assert cluster.calls == ["down", "start 30"]
    assert "process containerd" in capsys.readouterr().err


def test_up_on_a_clean_machine_only_starts(cluster):
    cluster.up(12)
    assert cluster.calls == ["start 12"]


def test_failed_up_brings_down_what_it_started(cluster, monkeypatch, capsys):
    def start(timeout_s):
        cluster.calls.append("start")
        raise cluster.ClusterError("kube-apiserver: not ready after 1 s")

    monkeypatch.setattr(cluster, "_start", start)
    assert cluster.main(["up", "--timeout-s", "1"]) == 1
    err = capsys.readouterr().err
    assert cluster.calls == ["start", "down"]
    assert "kube-apiserver: not ready" in err and "bringing down what it started" in err


def test_failed_up_reports_a_failed_clean_up_too(cluster, monkeypatch, capsys):
    monkeypatch.setattr(cluster, "_start", lambda t: (_ for _ in ()).throw(cluster.ClusterError("etcd: not ready")))

    def down(purge=False):
        raise cluster.ClusterError("cluster down left: interface cni0")

    monkeypatch.setattr(cluster, "down", down)
    assert cluster.main(["up"]) == 1
    err = capsys.readouterr().err
    assert "etcd: not ready" in err and "interface cni0" in err


def test_interrupted_up_brings_down_what_it_started(cluster, monkeypatch):
    def start(timeout_s):
        raise KeyboardInterrupt

    monkeypatch.setattr(cluster, "_start", start)
    with pytest.raises(KeyboardInterrupt):
        cluster.up(30)
    assert cluster.calls == ["down"]


def test_purge_deletes_the_state_directory_only_when_nothing_is_mounted(cluster, monkeypatch, tmp_path, capsys):
    state = tmp_path / "state"
    (state / "containerd" / "root").mkdir(parents=True)
    (state / "logs" / "kubelet.log").parent.mkdir()
    (state / "logs" / "kubelet.log").write_text("x")
    monkeypatch.setattr(cluster, "STATE", state)
    monkeypatch.setattr(cluster, "mounts_under", lambda *p: [str(state / "containerd" / "root" / "m")])
    with pytest.raises(cluster.ClusterError, match="still mounted"):
        cluster.purge_state()
    assert state.is_dir()
    monkeypatch.setattr(cluster, "mounts_under", lambda *p: [])
    cluster.purge_state()
    assert not state.exists() and f"deleted {state}" in capsys.readouterr().out
