"""CLI error paths of dynoplan mocker serve / frontend / loadgen: one line on stderr, exit code 2."""

from __future__ import annotations

import subprocess
import sys

import pytest

CMD = [sys.executable, "-m", "planner.cli"]


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["mocker"], "dynoplan mocker: error"),
        (["mocker", "serve", "--speedup-ratio", "0"], "--speedup-ratio"),
        (["mocker", "serve", "--engine", "tgi", "--port", "0"], "--engine"),
        (
            [
                "mocker",
                "serve",
                "--num-gpu-blocks",
                "4",
                "--block-size",
                "64",
                "--max-num-batched-tokens",
                "8",
                "--port",
                "0",
            ],
            "max_num_batched_tokens=8",
        ),
        (["frontend"], "--workers"),
        (["frontend", "--workers", "localhost:8000"], "not an http(s) URL"),
        (
            ["frontend", "--workers-file", "/nonexistent/workers.txt", "--port", "0"],
            "workers_file='/nonexistent/workers.txt': no such file",
        ),
        (  # was: "no such file" for a directory
            ["frontend", "--workers-file", "/tmp", "--port", "0"],
            "workers_file='/tmp': is a directory; expected an existing file of worker URLs",
        ),
        (["frontend", "--workers-file", "/dev/null", "--port", "0"], "workers_file='/dev/null': not a regular file;"),
        (  # was: accepted, every request then answered 404 (exit 1)
            [
                "loadgen",
                "--url",
                "http://127.0.0.1:9",
                "--trace",
                "synthetic:poisson?rate=1&num_requests=1",
                "--model",
                "",
            ],
            'dynoplan loadgen: error: model="": expected string should have at least 1 character',
        ),
        (  # was: the current directory named as the unreadable stack file
            ["up", "--config", ""],
            "dynoplan up: error: argument --config: '': empty, expected a stack file path",
        ),
        (["planner", "--config", " "], "dynoplan planner: error: argument --config: ' ': empty, expected a stack file"),
        (["up", "--config", "/dev/zero"], "/dev/zero: cannot read stack file: more than 16 MiB"),  # was: read forever
        (["mocker", "serve", "--port", "0", "--speedup", "2"], "unrecognized arguments: --speedup"),  # no abbreviations
        (["loadgen", "--url", "http://127.0.0.1:9", "--trace", "/nonexistent.csv"], "/nonexistent.csv"),
        (["loadgen", "--url", "http://127.0.0.1:9", "--trace", "synthetic:poisson?rate=-1&num_requests=3"], "rate"),
        (  # was: 1e5 ranks built before the worker listened
            ["mocker", "serve", "--port", "0", "--dp-size", "100000"],
            "dynoplan mocker serve: error: argument --dp-size: '100000': expected a DP size between 1 and 1024 "
            "(ranks per worker, each at least one GPU) (see --help)",
        ),
        (  # was: the last --trace sent, the first silently dropped
            ["loadgen", "--url", "http://127.0.0.1:9", "--trace", "a.csv", "--trace", "b.csv"],
            "dynoplan loadgen: error: argument --trace: given twice ('a.csv' and 'b.csv'), expected it once "
            "(see --help)",
        ),
    ],
)
def test_user_mistakes_are_one_line_exit_2(argv, needle):
    p = subprocess.run(CMD + argv, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], p.stderr
    assert "Traceback" not in p.stderr


def test_frontend_port_in_use_is_one_line_without_unclosed_session(tmp_path):
    import socket

    with socket.socket() as taken:  # a listening socket (not SO_REUSEPORT): the frontend cannot bind its port
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        wf = tmp_path / "workers.txt"
        wf.write_text("")
        p = subprocess.run(
            CMD + ["frontend", "--port", str(port), "--workers-file", str(wf)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot listen on 127.0.0.1" in lines[0], p.stderr  # was followed by aiohttp's
    assert "Unclosed" not in p.stderr and "Traceback" not in p.stderr  # "Unclosed client session" lines


def test_loadgen_per_request_onto_the_trace_is_refused(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.0,374,44\n")
    before = trace.read_bytes()
    p = subprocess.run(
        CMD + ["loadgen", "--url", "http://127.0.0.1:9", "--trace", str(trace), "--per-request", str(trace)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "is the --trace file" in p.stderr, p.stderr
    assert trace.read_bytes() == before


@pytest.mark.parametrize("flag", ["--report-json", "--per-request"])
def test_loadgen_output_under_missing_directory_is_refused_not_created(tmp_path, flag):
    # checked before any request is sent (was: the directory was created after the run)
    target = tmp_path / "missing" / "dir" / "out.json"
    p = subprocess.run(
        CMD
        + [
            "loadgen",
            "--url",
            "http://127.0.0.1:9",
            "--trace",
            "synthetic:poisson?rate=1&num_requests=3",
            flag,
            str(target),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert f"{flag} {target}: parent directory" in p.stderr and "expected an existing directory" in p.stderr
    assert not (tmp_path / "missing").exists()


@pytest.mark.parametrize("flag", ["--report-json", "--per-request"])
def test_loadgen_output_that_is_a_directory_is_refused_before_the_run(tmp_path, flag):
    # was: the requests were sent, then the write failed (an IsADirectoryError line, the report lost)
    p = subprocess.run(
        CMD
        + ["loadgen", "--url", "http://127.0.0.1:9", "--trace", "synthetic:poisson?rate=1&num_requests=3"]
        + [flag, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (p.returncode, p.stdout) == (2, "")
    assert p.stderr == f"dynoplan loadgen: error: {flag} {tmp_path}: is a directory, expected a file path\n"


LOADGEN_TRACE = "synthetic:poisson?rate=10&num_requests=3"


@pytest.mark.parametrize(
    "url,needle",
    [
        ("http://", "url='http://': expected an http(s) base URL with a host"),
        ("localhost:18080", "url='localhost:18080': expected an http(s) base URL with a host"),
        ("http://127.0.0.1:99999", "url='http://127.0.0.1:99999': expected an http(s) base URL with a host"),
        ("http://127.0.0.1:1", "url='http://127.0.0.1:1': cannot connect (Connection refused)"),
    ],
)
def test_loadgen_url_without_host_or_server_is_one_line_exit_2(url, needle):
    p = subprocess.run(
        CMD + ["loadgen", "--url", url, "--trace", LOADGEN_TRACE], capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 2, p.stderr
    assert p.stderr.count("\n") == 1 and p.stderr.startswith("dynoplan loadgen: error: ") and needle in p.stderr, (
        p.stderr
    )


def test_loadgen_quiet_keeps_the_failure_lines_and_help_names_the_exit_codes(tmp_path):
    """A frontend without workers answers every request 503: exit 1, and --quiet still says why on stderr."""
    from tests.infra._proc import start_process, wait_until

    (tmp_path / "workers.txt").write_text("")
    log = tmp_path / "frontend.log"
    fe = start_process(CMD + ["frontend", "--port", "0", "--workers-file", str(tmp_path / "workers.txt")], log)
    try:
        wait_until(lambda: "listening on http://" in log.read_text(), 60, "frontend", fe, log)
        url = log.read_text().split("listening on ")[1].split()[0]
        p = subprocess.run(
            CMD + ["loadgen", "--quiet", "--url", url, "--trace", LOADGEN_TRACE],
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        fe.terminate()
        fe.wait(timeout=30)
    assert p.returncode == 1, p.stderr
    assert p.stdout == ""
    assert p.stderr.splitlines() == [
        "3 requests failed: {'http_503': 3}",
        "  http_503: request 0: no ready worker to serve the request",
    ], p.stderr
    h = subprocess.run(CMD + ["loadgen", "--help"], capture_output=True, text=True, timeout=60)
    assert h.returncode == 0 and "1 when any request failed" in " ".join(h.stdout.split()), h.stdout
