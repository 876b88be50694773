"""``--rate-envelope``: the time warp of :func:`mocker.traces.apply_rate_envelope`, its spec parser, repetition,
and the flag on ``dynoplan replay`` / ``dynoplan simulate`` (one-line errors, exit 2). Expectations are computed by
hand in the comments."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.integrate import quad

from dynoplan.errors import TraceError
from mocker.records import TraceRequest
from mocker.traces import (
    MIN_RATE_MULTIPLIER,
    apply_rate_envelope,
    load_trace,
    parse_rate_envelope,
    scale_arrivals,
)
from planner.cli import main


def reqs(arrivals_s: list[float], hash_ids: list[tuple[int, ...] | None] | None = None) -> list[TraceRequest]:
    ids = hash_ids or [(i,) for i in range(len(arrivals_s))]
    return [TraceRequest(i, 1000.0 * a, 100 + i, 10 + i, h) for i, (a, h) in enumerate(zip(arrivals_s, ids))]


def envelope_csv(tmp_path: Path, rows: str, name: str = "env.csv") -> Path:
    p = tmp_path / name
    p.write_text("time_s,multiplier\n" + rows)
    return p


def arrivals_s(out: list[TraceRequest]) -> list[float]:
    return [r.arrival_ms / 1000.0 for r in out]


# ---------------------------------------------------------------------------------------------- the warp
def test_constant_multiplier_two_halves_every_arrival_time(tmp_path: Path) -> None:
    # m = 2: M(t') = 2 t' = t, so t' = t / 2 exactly (both spec forms); sizes and hash ids unchanged
    trace = reqs([0.0, 0.4, 1.0, 3.0, 7.5])
    for spec in ("periodic:period_s=60,low=2,high=2", str(envelope_csv(tmp_path, "0,2\n"))):
        out = apply_rate_envelope(trace, parse_rate_envelope(spec))
        assert [r.arrival_ms for r in out] == [0.0, 200.0, 500.0, 1500.0, 3750.0]
        assert [(r.input_length, r.output_length, r.hash_ids) for r in out] == [
            (r.input_length, r.output_length, r.hash_ids) for r in trace
        ]


def test_step_envelope_hand_computed(tmp_path: Path) -> None:
    # m = 1 on [0, 10], rising linearly to 3 at 20 (slope 0.2), then 3 for ever.
    # M(10) = 10, M(20) = 10 + (1 + 3) / 2 * 10 = 30, beyond: 30 + 3 (t' - 20).
    # t = 5 -> 5; t = 10 -> 10; in the ramp M = 10 + u + 0.1 u^2: t = 17.5 -> u = 5 -> 15;
    # t = 30 -> 20; t = 36 -> 22; t = 60 -> 30.
    env = parse_rate_envelope(str(envelope_csv(tmp_path, "0,1\n10,1\n20,3\n")))
    out = apply_rate_envelope(reqs([5.0, 10.0, 17.5, 30.0, 36.0, 60.0]), env)
    assert arrivals_s(out) == pytest.approx([5.0, 10.0, 15.0, 20.0, 22.0, 30.0], rel=1e-12, abs=1e-12)
    assert env.multiplier([0.0, 15.0, 25.0]).tolist() == [1.0, 2.0, 3.0]


def test_sharp_step_quadruples_the_rate_after_it(tmp_path: Path) -> None:
    # m = 1 up to 10 s, 4 from 10.001 s: arrivals each 1 s become 0.25 s apart after the step
    env = parse_rate_envelope(str(envelope_csv(tmp_path, "0,1\n10,1\n10.001,4\n")))
    out = apply_rate_envelope(reqs([float(i) for i in range(21)]), env)
    t = arrivals_s(out)
    assert t[:11] == pytest.approx([float(i) for i in range(11)], abs=1e-9)
    # M(10.001) = 10 + 0.001 * 2.5 = 10.0025; after: t' = 10.001 + (t - 10.0025) / 4
    assert t[11:] == pytest.approx([10.001 + (i - 10.0025) / 4 for i in range(11, 21)], rel=1e-12)
    assert np.diff(t[11:]) == pytest.approx([0.25] * 9)


def test_zero_multiplier_stretch_is_a_silent_gap(tmp_path: Path) -> None:
    # m = 1 to 10 s, 0 between 10.001 and 19.999 s, 1 again from 20 s: the trace's arrivals after 10 s
    # (almost all the integral is spent by 10 s) wait until about 20 s
    env = parse_rate_envelope(str(envelope_csv(tmp_path, "0,1\n10,1\n10.001,0\n19.999,0\n20,1\n")))
    out = apply_rate_envelope(reqs([float(i) for i in range(15)]), env)
    t = arrivals_s(out)
    assert not any(10.001 < x < 19.999 for x in t)
    # M(10.001) = 10.0005, M(20) = 10.0005 + 0.0005 = 10.001: t = 11 -> 20 + (11 - 10.001)
    assert t[11] == pytest.approx(20.999, rel=1e-12)


def test_periodic_integral_matches_closed_form_and_quadrature() -> None:
    # low 1, high 3, P 100 s: mean 2, so M(P) = 200 and M(P / 2) = 100 (the sine term vanishes);
    # M(25) = 2 * 25 - 1 * 100 / (2 pi) * sin(pi / 2) = 50 - 50 / pi
    env = parse_rate_envelope("periodic:period_s=100,low=1,high=3")
    assert env.integral(100.0) == pytest.approx(200.0, rel=1e-14)
    assert env.integral(50.0) == pytest.approx(100.0, rel=1e-14)
    assert env.integral(25.0) == pytest.approx(50.0 - 50.0 / math.pi, rel=1e-14)
    assert env.multiplier([0.0, 50.0, 100.0]).tolist() == pytest.approx([1.0, 3.0, 1.0])
    shifted = parse_rate_envelope("periodic:period_s=100,low=1,high=3,phase_s=50")  # starts at the peak
    assert float(shifted.multiplier(0.0)) == pytest.approx(3.0)
    for e in (env, shifted, parse_rate_envelope("periodic:period_s=37,low=0,high=5,phase_s=-3.5")):
        for t in (0.3, 12.0, 49.9, 131.0, 1000.0):
            assert float(e.integral(t)) == pytest.approx(
                quad(lambda s, e=e: float(e.multiplier(s)), 0.0, t, limit=500)[0], rel=1e-9
            )


@settings(max_examples=60, deadline=None)
@given(
    period=st.floats(1.0, 1e5),
    low=st.floats(0.0, 10.0),
    span=st.floats(0.0, 10.0),
    phase=st.floats(-1e5, 1e5),
    x=st.lists(st.floats(0.0, 1e6), min_size=1, max_size=20),
)
def test_periodic_inverse_inverts_the_integral(
    period: float, low: float, span: float, phase: float, x: list[float]
) -> None:
    high = low + span
    if high < 1e-6 or 0 < low < MIN_RATE_MULTIPLIER:
        # a peak multiplier below 1e-6 stretches an hour of trace past 10^9 s (x / m overflowed for denormal m:
        # hypothesis found low = high = 1.4e-304, now refused below MIN_RATE_MULTIPLIER, as a low of 5e-225 is)
        return
    env = parse_rate_envelope(f"periodic:period_s={period!r},low={low!r},high={high!r},phase_s={phase!r}")
    t = env.inverse_integral(np.asarray(x))
    assert (t >= 0).all()
    assert env.integral(t) == pytest.approx(np.asarray(x), rel=1e-9, abs=1e-6 * period)
    order = np.argsort(x, kind="stable")
    assert (np.diff(t[order]) >= 0).all()  # the warp keeps arrival order


def test_rate_follows_the_multiplier() -> None:
    # a constant 10 req/s trace under low 1 / high 3, P 600 s: near the low point (t' ~ 0) about 10 req/s,
    # near the peak (t' ~ 300 s) about 30 req/s; the mean over one period is 20 req/s
    trace = reqs([i / 10.0 for i in range(12_000)], [None] * 12_000)
    out = apply_rate_envelope(trace, parse_rate_envelope("periodic:period_s=600,low=1,high=3,duration_s=600"))
    t = np.asarray(arrivals_s(out))
    assert len(t) == pytest.approx(20 * 600, abs=1)  # M(600) = 1200 s of trace = 12,000 requests
    assert ((t >= 290) & (t < 310)).sum() == pytest.approx(
        10
        * 20
        * float(
            np.mean(parse_rate_envelope("periodic:period_s=600,low=1,high=3").multiplier(np.linspace(290, 310, 201)))
        ),
        abs=2,
    )
    assert ((t >= 0) & (t < 10)).sum() == pytest.approx(100, abs=2)


# ---------------------------------------------------------------------------------------------- repetition
def test_repeat_count_fresh_ids_and_offset_hash_ids() -> None:
    # 10 requests at 0..9 s (span 9 s, mean gap 1 s): copy k is shifted by 10 k s. m = 1 and D = 35 s:
    # ceil(35 / 10) = 4 copies, arrivals 0..39 s, cut at 35 -> 35 requests. Largest hash id 10 (request 9
    # has (9, 10)), so copy k's ids are offset by 11 k.
    ids: list[tuple[int, ...] | None] = [(0, i) for i in range(1, 10)] + [(9, 10)]
    trace = reqs([float(i) for i in range(10)], ids)
    out = apply_rate_envelope(trace, parse_rate_envelope("periodic:period_s=100,low=1,high=1,duration_s=35"))
    assert len(out) == 35
    assert [r.request_id for r in out] == list(range(35))
    assert arrivals_s(out) == [float(i) for i in range(35)]
    assert (
        out[10].hash_ids == (11, 12) and out[19].hash_ids == (20, 21) and out[34].hash_ids == (33, 33 + 5)
    )  # copy 3, request 4: (0, 5) + 33
    assert [r.input_length for r in out] == [100 + i % 10 for i in range(35)]
    # prefixes shared within a copy, never across copies (copy 3 is cut after its request 4: no 9 + 33)
    firsts = {r.hash_ids[0] for r in out if r.hash_ids}
    assert firsts == {0, 9, 11, 20, 22, 31, 33}


def test_repeat_with_rate_and_no_hash_ids() -> None:
    # m = 2 over D = 10 s consumes M(10) = 20 s of trace; a 4 s trace (0, 2, 4 s; mean gap 2 s -> copies
    # 6 s apart) needs ceil(20 / 6) = 4 copies: trace times 0, 2, 4, 6, ..., 22 -> warped 0, 1, ..., 11; cut at 10
    trace = reqs([0.0, 2.0, 4.0], [None, None, None])
    out = apply_rate_envelope(trace, parse_rate_envelope("periodic:period_s=5,low=2,high=2,duration_s=10"))
    assert arrivals_s(out) == [float(i) for i in range(10)]
    assert all(r.hash_ids is None for r in out)


def test_duration_shorter_than_the_trace_cuts_it() -> None:
    out = apply_rate_envelope(
        reqs([float(i) for i in range(10)]), parse_rate_envelope("periodic:period_s=5,low=1,high=1,duration_s=4.5")
    )
    assert arrivals_s(out) == [0.0, 1.0, 2.0, 3.0, 4.0]


def test_csv_longer_than_the_trace_repeats_it_and_cuts_at_its_last_time(tmp_path: Path) -> None:
    # m = 1 up to the last row at 25 s: the 0..4 s trace (copies 5 s apart) repeats 5 times, cut at 25 s
    env = parse_rate_envelope(str(envelope_csv(tmp_path, "0,1\n25,1\n")))
    out = apply_rate_envelope(reqs([0.0, 1.0, 2.0, 3.0, 4.0]), env)
    assert arrivals_s(out) == [float(i) for i in range(25)]


def test_csv_shorter_than_the_trace_neither_repeats_nor_cuts(tmp_path: Path) -> None:
    # m = 2 until 2 s, then 2 for ever: 0..9 s -> 0..4.5 s, all kept
    env = parse_rate_envelope(str(envelope_csv(tmp_path, "0,2\n2,2\n")))
    assert arrivals_s(apply_rate_envelope(reqs([float(i) for i in range(10)]), env)) == [i / 2 for i in range(10)]


def test_repetition_of_a_one_instant_trace_is_an_error() -> None:
    with pytest.raises(TraceError, match="duration_s.*all its arrivals fall at 0 s"):
        apply_rate_envelope(reqs([0.0, 0.0]), parse_rate_envelope("periodic:period_s=5,low=1,high=1,duration_s=10"))


def test_repetition_beyond_the_request_bound_is_an_error() -> None:
    with pytest.raises(TraceError, match="duration_s.*expected at most 10,000,000"):
        apply_rate_envelope(reqs([0.0, 1.0]), parse_rate_envelope("periodic:period_s=5,low=1,high=1,duration_s=1e8"))


def test_deterministic_and_input_untouched() -> None:
    trace = load_trace("synthetic:gamma?rate=5&duration_s=120&shape=0.2&seed=3")
    before = list(trace)
    env = parse_rate_envelope("periodic:period_s=90,low=0.5,high=4,phase_s=10,duration_s=400")
    a, b = apply_rate_envelope(trace, env), apply_rate_envelope(trace, env)
    assert a == b and trace == before
    t = [r.arrival_ms for r in a]
    assert t == sorted(t) and t[-1] < 400_000.0


# ---------------------------------------------------------------------------------------------- spec errors
@pytest.mark.parametrize(
    "spec,needles",
    [
        ("periodic:low=1,high=2", ("'period_s'", "missing")),
        ("periodic:period_s=10,high=2", ("'low'", "missing")),
        ("periodic:period_s=0,low=1,high=2", ("'period_s'", "'0'", "> 0")),
        ("periodic:period_s=inf,low=1,high=2", ("'period_s'", "'inf'")),
        ("periodic:period_s=10,low=-1,high=2", ("'low'", "'-1'", ">= 0")),
        ("periodic:period_s=10,low=0,high=0", ("'high'", "'0'", "> 0")),
        ("periodic:period_s=10,low=3,high=2", ("'high'", "'2'", ">= low (3)")),
        ("periodic:period_s=10,low=1,high=2,phase_s=x", ("'phase_s'", "'x'", "finite number of seconds")),
        ("periodic:period_s=10,low=1,high=2,duration_s=-5", ("'duration_s'", "'-5'", "> 0")),
        ("periodic:period_s=10,low=1,high=2,amp=3", ("'amp'", "unknown parameter", "period_s, low, high")),
        ("periodic:period_s=10,low=1,high=2,low=1", ("'low'", "given twice")),
        ("periodic:period_s=10,low", ("'low'", "KEY=VALUE")),
        ("sine:period_s=10", ("unknown envelope kind 'sine'", "periodic:period_s=P")),
        ("", ("expected periodic:",)),
    ],
)
def test_bad_specs_name_field_value_and_expectation(spec: str, needles: tuple[str, ...]) -> None:
    with pytest.raises(TraceError) as e:
        parse_rate_envelope(spec)
    for n in needles:
        assert n in str(e.value), str(e.value)


@pytest.mark.parametrize(
    "body,line,needles",
    [
        ("t,m\n0,1\n", 1, ("header 't,m'", "expected time_s,multiplier")),
        ("", None, ("header ''",)),
        ("time_s,multiplier\n", None, ("no rows after the header",)),
        ("time_s,multiplier\n5,1\n", 2, ("'time_s'", "'5'", "first row at time_s 0")),
        ("time_s,multiplier\n0,1\n10,1\n10,2\n", 4, ("'time_s'", "'10'", "after the previous row's 10 s")),
        ("time_s,multiplier\n0,1\n-1,1\n", 3, ("'time_s'", "'-1'", ">= 0")),
        ("time_s,multiplier\n0,1\n5,x\n", 3, ("'multiplier'", "'x'", ">= 0")),
        (
            "time_s,multiplier\n0,1\n5,nan\n",
            3,
            (
                "'multiplier'",
                "'nan'",
            ),
        ),
        ("time_s,multiplier\n0,1\n5,0\n", 3, ("'multiplier'", "'0'", "last multiplier > 0")),
        ("time_s,multiplier\n0,1,2\n", 2, ("3 fields, expected 2",)),
    ],
)
def test_bad_csv_names_line_field_and_value(
    tmp_path: Path, body: str, line: int | None, needles: tuple[str, ...]
) -> None:
    p = tmp_path / "env.csv"
    p.write_text(body)
    with pytest.raises(TraceError) as e:
        parse_rate_envelope(str(p))
    msg = str(e.value)
    assert msg.startswith(f"--rate-envelope {p}" + (f":{line}:" if line else ":")), msg
    for n in needles:
        assert n in msg, msg


def test_csv_missing_non_utf8_and_directory(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="file not found"):
        parse_rate_envelope(str(tmp_path / "nope.csv"))
    with pytest.raises(TraceError, match="not a regular file"):
        parse_rate_envelope(str(tmp_path))
    p = tmp_path / "latin1.csv"
    p.write_bytes(b"time_s,multiplier\n0,1\n5,\xe91\n")
    with pytest.raises(TraceError, match=r":3: byte 0xe9 at column 3: expected UTF-8"):
        parse_rate_envelope(str(p))
    ok = tmp_path / "bom.csv"
    ok.write_bytes("\ufefftime_s,multiplier\n0,1\n".encode())
    assert parse_rate_envelope(str(ok)).multipliers == (1.0,)


# ---------------------------------------------------------------------------------------------- the CLIs
def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    try:
        rc = main(list(argv))
    except SystemExit as e:
        rc = int(e.code or 0)
    return rc, capsys.readouterr().err


def test_replay_applies_the_envelope_after_the_arrival_speedup(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # constant 1 req/s, 8 requests (0..7 s). --arrival-speedup 2 -> 0, 0.5, ..., 3.5 s; then m = 1 up to 2 s
    # and 3 from 2.001 s: M(2.001) = 2 + 0.001 * 2 = 2.002; t = 3 -> 2.001 + 0.998 / 3
    env = envelope_csv(tmp_path, "0,1\n2,1\n2.001,3\n")
    per = tmp_path / "r.jsonl"
    rc, err = run_cli(
        capsys,
        "replay",
        "--trace",
        "synthetic:constant?rate=1&num_requests=8",
        "--arrival-speedup",
        "2",
        "--rate-envelope",
        str(env),
        "--quiet",
        "--per-request",
        str(per),
    )
    assert rc == 0, err
    got = [json.loads(ln)["arrival_ms"] / 1000.0 for ln in per.read_text().splitlines()]
    want = [0.0, 0.5, 1.0, 1.5, 2.0] + [2.001 + (t - 2.002) / 3 for t in (2.5, 3.0, 3.5)]
    assert got == pytest.approx(want, rel=1e-12)
    assert scale_arrivals(load_trace("synthetic:constant?rate=1&num_requests=8"), 2.0)[-1].arrival_ms == 3500.0


@pytest.mark.parametrize("command", ["replay", "simulate"])
@pytest.mark.parametrize(
    "spec,needles",
    [
        ("periodic:period_s=10,low=3,high=2", ("--rate-envelope", "'high'", "'2'", ">= low")),
        ("periodic:period_s=10,low=1,high=2,cycle=3", ("--rate-envelope", "'cycle'", "unknown parameter")),
        ("missing.csv", ("--rate-envelope", "missing.csv", "file not found")),
    ],
)
def test_cli_bad_envelope_is_one_line_exit_2(
    command: str, spec: str, needles: tuple[str, ...], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, err = run_cli(
        capsys,
        command,
        "--trace",
        "synthetic:constant?rate=1&num_requests=8",
        "--rate-envelope",
        str(tmp_path / spec) if spec.endswith(".csv") else spec,
        "--quiet",
    )
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"dynoplan {command}: error: "), lines[0]
    for n in needles:
        assert n in lines[0], lines[0]


def test_simulate_runs_the_warped_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # 2 req/s for 60 s under m = 2 with duration_s = 90: 240 trace-seconds' worth needed over 90 s
    # -> copies of the trace; 2 * 2 * 90 = 360 requests (the copy gap is one mean gap: no request lost)
    out = tmp_path / "o"
    rc, err = run_cli(
        capsys,
        "simulate",
        "--trace",
        "synthetic:constant?rate=2&duration_s=60&isl=200&osl=20",
        "--rate-envelope",
        "periodic:period_s=30,low=2,high=2,duration_s=90",
        "--compare",
        "static:1",
        "--quiet",
        "--out",
        str(out),
    )
    assert rc == 0, err
    details = json.loads((out / "details.json").read_text())
    assert details["policies"]["static:1"]["num_requests"] == 360
    assert json.dumps(details).count("periodic:period_s=30,low=2,high=2,duration_s=90") >= 1


# ---------------------------------------------------------------------------------------------- fresh-user findings
@pytest.mark.parametrize(
    ("rows", "line", "needles"),
    [
        ("0,1e300\n", 2, ("'multiplier'", "'1e300'", "from 1e-09 to 1e+09")),  # was an overflow RuntimeWarning
        ("0,1\n5,2e9\n10,1\n", 3, ("'multiplier'", "'2e9'")),
        ("0,1e-300\n", 2, ("'multiplier'", "'1e-300'")),
        ("0,1\n1e300,1\n", 3, ("'time_s'", "'1e300'", "<= 4.5036e+06")),
        ("6_0,1\n", 2, ("'time_s'", "'6_0'")),
        ("0,1\n６0,1\n", 3, ("'time_s'", "'６0'")),
        ("0,1\n60,1_0\n", 3, ("'multiplier'", "'1_0'")),
    ],
)
def test_csv_multipliers_and_times_that_overflow_or_break_the_grammar_are_refused(
    tmp_path: Path, rows: str, line: int, needles: tuple[str, ...]
) -> None:
    p = envelope_csv(tmp_path, rows)
    with pytest.raises(TraceError) as ei:
        parse_rate_envelope(str(p))
    assert ei.value.line == line and str(p) in str(ei.value)
    for n in needles:
        assert n in str(ei.value), str(ei.value)


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ("periodic:period_s=1_0,low=1,high=2", "period_s"),
        ("periodic:period_s=６0,low=1,high=2", "period_s"),
        ("periodic:period_s=10,low=1,high=2,duration_s=6_0", "duration_s"),
        ("periodic:period_s=1e300,low=1,high=2", "period_s"),
        ("periodic:period_s=10,low=1,high=1e300", "high"),
        ("periodic:period_s=10,low=1e-300,high=1", "low"),
    ],
)
def test_periodic_numbers_that_overflow_or_break_the_grammar_are_refused(spec: str, field: str) -> None:
    with pytest.raises(TraceError) as ei:
        parse_rate_envelope(spec)
    assert ei.value.field == field, str(ei.value)


def test_a_warp_past_the_trace_time_bound_is_refused() -> None:
    # a peak of 1e-9 stretches 10 s of trace to 1e10 s, past the 4.5e9 ms bound of trace times
    with pytest.raises(TraceError, match=r"--rate-envelope: the warp moves the trace's last arrival to .* at most"):
        apply_rate_envelope(reqs([0.0, 10.0]), parse_rate_envelope("periodic:period_s=10,low=0,high=1e-9"))


def test_overflowing_envelope_on_the_cli_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = envelope_csv(tmp_path, "0,1e300\n")
    rc = main(["replay", "--trace", "synthetic:poisson?rate=2&num_requests=5", "--quiet", "--rate-envelope", str(p)])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and f"{p}:2: field 'multiplier' '1e300'" in err, err
    assert "Warning" not in err
