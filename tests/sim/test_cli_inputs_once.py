"""``dynoplan simulate`` reads each input once, with one trace reader (real CLI via main()).

A settings file given as a pipe (``--config <(printf ...)``) is read once, so its settings apply and its
mistakes are reported; ``--warm-start`` goes through the reader of ``--trace`` (same UTF-8 error, same
aliases)."""

from __future__ import annotations

import json
import os

import pytest

from planner.cli import main as cli_main
from tests.sim.cli_helpers import TRACE
from tests.sim.cli_helpers import one_line as _one_line


def _pipe(text: str) -> str:
    """A /dev/fd path reading ``text`` from a pipe (as bash's ``<(printf ...)`` gives)."""
    r, w = os.pipe()
    os.write(w, text.encode())
    os.close(w)
    return f"/dev/fd/{r}"


def _details(out) -> dict:
    return json.loads((out / "details.json").read_text())


def test_config_through_a_pipe_applies(tmp_path, profile):
    out = tmp_path / "o"
    rc = cli_main(
        [
            "simulate",
            "--trace",
            TRACE,
            "--profile",
            profile,
            "--quiet",
            "--compare",
            "static:1",
            "--config",
            _pipe("ttft_ms: 123\n"),
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    run = _details(out)["run"]
    assert run["sla_ttft_ms"] == 123.0 and run["planner_config"]["ttft_ms"] == 123.0  # was 500: ignored


def test_invalid_config_through_a_pipe_is_refused(capsys, profile):
    path = _pipe("ttft_ms: soon\n")
    rc = cli_main(
        ["simulate", "--trace", TRACE, "--profile", profile, "--quiet", "--compare", "static:1", "--config", path]
    )
    _one_line(capsys, rc, path, "ttft_ms")  # was accepted (exit 0)


def test_engine_config_through_a_pipe_applies_and_is_checked(tmp_path, capsys, profile):
    out = tmp_path / "o"
    rc = cli_main(
        [
            "simulate",
            "--trace",
            TRACE,
            "--profile",
            profile,
            "--quiet",
            "--compare",
            "static:1",
            "--engine-config",
            _pipe("num_gpu_blocks: 2\n"),
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    # 2 x 64 tokens of KV cache: the trace's prompts can never fit (the file applied, it was ignored before)
    assert "requests failed" in capsys.readouterr().err
    path = _pipe("num_gpu_blocks: 2\nnum_gpu_blocks: 3\n")
    rc = cli_main(
        [
            "simulate",
            "--trace",
            TRACE,
            "--profile",
            profile,
            "--quiet",
            "--compare",
            "static:1",
            "--engine-config",
            path,
        ]
    )
    _one_line(capsys, rc, f"--engine-config {path}: line 2: duplicate key 'num_gpu_blocks'")


def _warm_started(profile: str, warm_start) -> int:
    """``simulate`` of the test trace by ``throughput-only`` (a policy that reads ``--warm-start``), warm-started
    from ``warm_start``; its exit code."""
    argv = ["simulate", "--trace", TRACE, "--profile", profile, "--quiet", "--compare", "throughput-only"]
    return cli_main([*argv, "--warm-start", str(warm_start)])


def test_warm_start_not_utf8_is_the_trace_readers_one_line(tmp_path, capsys, profile):
    w = tmp_path / "w.csv"
    w.write_bytes("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6,caf\xe9,1\n".encode("latin-1"))
    rc = _warm_started(profile, w)
    _one_line(capsys, rc, f"--warm-start {w}: {w}:2: byte 0xe9 at column 26: expected UTF-8 text")  # was a traceback


@pytest.mark.parametrize("ts", ["timestamp", "created_time"])
def test_warm_start_accepts_the_trace_aliases(tmp_path, profile, ts):
    w = tmp_path / "w.jsonl"
    w.write_text("".join(f'{{"{ts}": {i * 1000}, "input_tokens": 100, "output_tokens": 10}}\n' for i in range(5)))
    rc = _warm_started(profile, w)
    assert rc == 0
