"""Bounds of one closed-loop run that only the run itself can check: the timeline sample cap (a trace whose
arrivals share one instant has span 0, so the span check before the run cannot bound it), the loop's smallest
clock step, and the simulator's time limit on the last finish (a tiny ``speedup_ratio``)."""

from __future__ import annotations

import pytest

import planner.sim.loop as loop
from dynoplan.errors import SimulationConfigError
from planner.cli import main as cli_main
from planner.sim.loop import MIN_STEP_S, SimSettings
from tests.sim.cli_helpers import one_line

ONE_INSTANT = "TIMESTAMP,ContextTokens,GeneratedTokens\n" + "2023-11-16 18:15:46.6805900,1000,200\n" * 20


def _sim(profile: str, trace: str, *argv: str) -> int:
    try:
        return cli_main(["simulate", "--trace", trace, "--profile", profile, "--quiet", "--compare", "static:1", *argv])
    except SystemExit as e:  # a flag's own type check: argparse exits (2) with its one line
        return int(e.code or 0)


def test_the_timeline_cap_bounds_a_run_whose_arrivals_share_one_instant(tmp_path, profile, capsys, monkeypatch):
    trace = tmp_path / "one_instant.csv"
    trace.write_text(ONE_INSTANT)
    monkeypatch.setattr(loop, "MAX_TIMELINE_SAMPLES", 1000)
    out = tmp_path / "out"
    # span 0 passes the check before the run; 20 requests on one worker at 1/100 the engine's speed take far
    # longer than 1000 samples * 1 ms = 1 s: samples at t = 0, 0.001, ..., 0.999, and the 1001st at t = 1 s
    rc = _sim(profile, str(trace), "--sample-interval-s", "0.001", "--speedup-ratio", "0.01", "--out", str(out))
    one_line(
        capsys,
        rc,
        "dynoplan simulate: error: sample_interval_s=0.001: policy static:1 reached the cap of 1000 timeline samples "
        "at t=1 s of simulated time with 20 of 20 requests still running (the last arrives at 0 s); expected "
        "sample_interval_s > 0.001: the run lasts longer than 1 s",
    )
    assert list(out.iterdir()) == []  # --out is made before the run (checked writable); nothing written in it


def test_the_same_run_within_the_cap_completes(tmp_path, profile, monkeypatch):
    trace = tmp_path / "one_instant.csv"
    trace.write_text(ONE_INSTANT)
    monkeypatch.setattr(loop, "MAX_TIMELINE_SAMPLES", 1000)
    # at the default 10 s the run (seconds long at full speed) takes a handful of samples
    assert _sim(profile, str(trace), "--out", str(tmp_path / "out")) == 0


def test_sample_interval_below_the_clock_step_is_refused():
    SimSettings(sample_interval_s=MIN_STEP_S)  # the step itself is allowed
    with pytest.raises(SimulationConfigError, match=r"sample_interval_s=0\.0001: expected seconds >= 0\.001"):
        SimSettings(sample_interval_s=1e-4)


@pytest.mark.parametrize("interval", ["1e-300", "0.0009"])
def test_cli_sample_interval_below_the_clock_step_is_one_line(profile, capsys, interval):
    rc = _sim(profile, "synthetic:poisson?rate=2&num_requests=5&seed=1", "--sample-interval-s", interval)
    one_line(capsys, rc, f"--sample-interval-s: '{interval}': expected seconds >= 0.001 (the loop's smallest clock")


def test_a_run_past_the_time_limit_names_the_policy_and_the_speedup(tmp_path, profile, capsys):
    out = tmp_path / "out"
    rc = _sim(profile, "synthetic:poisson?rate=2&num_requests=5&seed=1", "--speedup-ratio", "1e-20", "--out", str(out))
    one_line(
        capsys,
        rc,
        "dynoplan simulate: error: policy static:1: the last request finished at ",
        "s of simulated time (with speedup_ratio=1e-20), past the simulator's limit of 4.504e+06 s",
    )
    assert list(out.iterdir()) == []
