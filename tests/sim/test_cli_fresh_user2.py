"""Second fresh-user round of ``dynoplan simulate`` / ``dynoplan profile`` defects (real CLI via main())."""

from __future__ import annotations

import json

import pytest

from planner.cli import main as cli_main
from tests.sim.cli_helpers import PROFILE_GRID, TRACE
from tests.sim.cli_helpers import one_line as _one_line


# ------------------------------------------------------------------ 1. profile --out must not overwrite inputs
@pytest.mark.parametrize(
    "flag, name, out",
    [("--timing", "tm.npz", "tm.npz"), ("--timing", "tm.npz", "tm"), ("--engine-config", "eng.npz", "eng")],
)
def test_profile_out_naming_an_input_is_refused_before_running(tmp_path, capsys, flag, name, out):
    src = tmp_path / name
    src.write_bytes(b"not touched\x00")
    rc = cli_main(["profile", "--out", str(tmp_path / out), flag, str(src), *PROFILE_GRID])
    _one_line(capsys, rc, "--out", flag, str(src))
    assert src.read_bytes() == b"not touched\x00"


# ------------------------------------------------------------------ 2. --attainment-target: one effective value
TRACE_RAMP = "synthetic:poisson?rate=20&duration_s=40&isl=2000&osl=40&seed=3"


def _sim_out(tmp_path, name, profile, *argv) -> tuple[dict, dict]:
    out = tmp_path / name
    rc = cli_main(
        [
            "simulate",
            "--trace",
            TRACE_RAMP,
            "--profile",
            profile,
            "--quiet",
            "--startup-delay-s",
            "0",
            "--sla-ttft-ms",
            "150",
            "--sla-itl-ms",
            "20",
            "--out",
            str(out),
            *argv,
        ]
    )
    assert rc == 0
    return (json.loads((out / "summary.json").read_text()), json.loads((out / "details.json").read_text()))


def test_attainment_target_flag_beats_planner_set_and_config_and_is_recorded(tmp_path, profile):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("sla_attainment_target: 0.5\nmax_gpu_budget: 64\n")  # 64: simulate's default
    combos = {
        "flag": ["--attainment-target", "0.99"],
        "set": ["--planner-set", "sla_attainment_target=0.99"],
        "set_and_flag": ["--planner-set", "sla_attainment_target=0.9", "--attainment-target", "0.99"],
        "file_and_flag": ["--config", str(cfg), "--attainment-target", "0.99"],
    }
    got = {k: _sim_out(tmp_path, k, profile, *v) for k, v in combos.items()}
    for k, (summary, details) in got.items():
        assert details["run"]["planner_config"]["sla_attainment_target"] == 0.99, k
        assert summary == got["flag"][0], k
    # the value matters on this trace: the file's 0.5 alone sizes differently (so the equalities above can fail)
    low = _sim_out(tmp_path, "file", profile, "--config", str(cfg))
    assert low[1]["run"]["planner_config"]["sla_attainment_target"] == 0.5
    assert low[0] != got["flag"][0]


# ------------------------------------------------------------------ 3. GPU-hours count gpus_per_engine
def _policies(out) -> dict:
    return json.loads((out / "details.json").read_text())["policies"]


def test_gpu_hours_count_gpus_per_engine_for_every_policy(tmp_path, profile):
    cfg = tmp_path / "gp.yaml"
    cfg.write_text("agg: {gpus_per_engine: 4}\nmax_gpu_budget: 16\n")
    out = tmp_path / "o"
    assert (
        cli_main(
            [
                "simulate",
                "--trace",
                TRACE,
                "--profile",
                profile,
                "--config",
                str(cfg),
                "--quiet",
                "--startup-delay-s",
                "0",
                "--out",
                str(out),
                "--compare",
                "static:2",
                "planner",
                "hpa",
                "saturation",
                "throughput-only",
            ]
        )
        == 0
    )
    pol = _policies(out)
    s = pol["static:2"]
    # hand-computed: 2 workers x the run's duration x 4 GPUs / 3600
    assert s["gpu_hours"] == pytest.approx(2 * s["duration_s"] * 4 / 3600, abs=2e-6)
    for name, p in pol.items():  # worker-seconds (mean replicas x duration) x 4 GPUs / 3600
        assert p["gpu_hours"] == pytest.approx(
            p["mean_replicas"]["agg"] * p["duration_s"] * 4 / 3600, rel=1e-4, abs=2e-6
        ), name
        assert p["gpu_hours_by_pool"] == {"agg": p["gpu_hours"]}


def test_gpu_hours_per_pool_in_disagg(tmp_path, profile):
    cfg = tmp_path / "gp.yaml"
    cfg.write_text("mode: disagg\nprefill: {gpus_per_engine: 2}\ndecode: {gpus_per_engine: 3}\nmax_gpu_budget: 16\n")
    out = tmp_path / "o"
    assert (
        cli_main(
            [
                "simulate",
                "--trace",
                TRACE,
                "--profile",
                profile,
                "--config",
                str(cfg),
                "--quiet",
                "--startup-delay-s",
                "0",
                "--out",
                str(out),
                "--compare",
                "static:1+2",
            ]
        )
        == 0
    )
    s = _policies(out)["static:1+2"]
    d = s["duration_s"]
    assert s["gpu_hours_by_pool"]["prefill"] == pytest.approx(1 * d * 2 / 3600, abs=2e-6)
    assert s["gpu_hours_by_pool"]["decode"] == pytest.approx(2 * d * 3 / 3600, abs=2e-6)
    assert s["gpu_hours"] == pytest.approx(d * (2 + 6) / 3600, abs=2e-6)


# ------------------------------------------------------------------ 4. the GPU budget is checked for the run's mode
def test_budget_of_one_gpu_in_a_file_without_mode_runs_agg(tmp_path, capsys, profile):
    cfg = tmp_path / "b.yaml"
    cfg.write_text("max_gpu_budget: 1\n")
    out = tmp_path / "o"
    assert (
        cli_main(
            [
                "simulate",
                "--trace",
                TRACE,
                "--profile",
                profile,
                "--config",
                str(cfg),
                "--quiet",
                "--out",
                str(out),
                "--compare",
                "static:1",
            ]
        )
        == 0
    )
    assert json.loads((out / "details.json").read_text())["run"]["planner_config"]["max_gpu_budget"] == 1
    # the same file for a disaggregated run needs 2 GPUs (one per pool): refused naming the budget
    rc = cli_main(
        [
            "simulate",
            "--trace",
            TRACE,
            "--profile",
            profile,
            "--config",
            str(cfg),
            "--quiet",
            "--mode",
            "disagg",
            "--compare",
            "static:1+1",
        ]
    )
    _one_line(capsys, rc, "max_gpu_budget=1", ">= 2 GPUs")


# ------------------------------------------------------------------ 5. requests no engine can serve
def _csv(path, rows) -> str:
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        + "".join(f"2023-11-16 18:15:{46 + k:02d}.6805900,{isl},{osl}\n" for k, (isl, osl) in enumerate(rows))
    )
    return str(path)


def test_unservable_prompt_warns_per_policy_and_the_static_fleet_is_counted(tmp_path, capsys, profile):
    trace = _csv(tmp_path / "huge.csv", [(2147483647, 10)])
    out = tmp_path / "o"
    assert (
        cli_main(
            [
                "simulate",
                "--trace",
                trace,
                "--profile",
                profile,
                "--quiet",
                "--out",
                str(out),
                "--compare",
                "static:1",
                "planner",
            ]
        )
        == 0
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2, err
    for line, name in zip(err, ("static:1", "planner")):
        assert line.startswith(f"dynoplan simulate: warning: policy {name}: 1 of 1 requests failed"), line
        assert "2147483647 prompt + 10 output = 2147483657 tokens" in line
    pol = _policies(out)
    assert pol["static:1"]["max_replicas"] == {"agg": 1}
    assert pol["static:1"]["mean_replicas"] == {"agg": 1.0}
    # the auto initial fleet stays within the planner's limits (max_gpu_budget 64 by default in simulate)
    assert 1 <= pol["planner"]["max_replicas"]["agg"] <= 64


def test_one_unservable_prompt_among_normal_ones_warns(tmp_path, capsys, profile):
    trace = _csv(tmp_path / "mix.csv", [(374, 44), (2_000_000, 10), (374, 44)])
    assert cli_main(["simulate", "--trace", trace, "--profile", profile, "--quiet", "--compare", "static:1"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "policy static:1: 1 of 3 requests failed" in err[0], err
    assert "2000000 prompt + 10 output = 2000010 tokens" in err[0]


# ------------------------------------------------------------------ 6. an empty --out
@pytest.mark.parametrize(
    "argv", [["simulate", "--trace", TRACE, "--quiet", "--compare", "static:1"], ["profile", *PROFILE_GRID]]
)
@pytest.mark.parametrize("out", ["", "  "])
def test_empty_out_is_refused(tmp_path, capsys, monkeypatch, argv, out):
    monkeypatch.chdir(tmp_path)
    rc = cli_main([*argv, f"--out={out}"])
    _one_line(capsys, rc, "--out", "expected")
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------ 7. CSV timestamps with UTC offsets
@pytest.mark.parametrize(
    "stamps, arrivals_ms",
    [
        (["18:15:46.6805900+00:00", "19:15:46.6805900+01:00"], [0.0, 0.0]),  # the same instant
        (["18:15:46.6805900+01:00", "18:15:47.6805900+00:00"], [0.0, 3_601_000.0]),  # 17:15:46 and 18:15:47 UTC
        (["18:15:46.5Z", "13:15:47.5-0500", "18:45:48.5+00:30"], [0.0, 1000.0, 2000.0]),
        (["18:15:46.5", "18:15:48"], [0.0, 1500.0]),  # no offsets: as before
    ],
)
def test_csv_utc_offsets_are_converted(tmp_path, stamps, arrivals_ms):
    from mocker.traces import load_trace

    f = tmp_path / "tz.csv"
    f.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(f"2023-11-16 {s},374,44\n" for s in stamps))
    assert [r.arrival_ms for r in load_trace(str(f))] == arrivals_ms


def test_csv_mixing_offsets_and_naive_stamps_is_refused(tmp_path, capsys):
    f = tmp_path / "tz.csv"
    f.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46+00:00,374,44\n2023-11-16 18:15:47,374,44\n"
    )
    rc = cli_main(["simulate", "--trace", str(f), "--quiet", "--compare", "static:1"])
    _one_line(capsys, rc, "TIMESTAMP", "data row 2", "UTC offset")


# ------------------------------------------------------------------ 8. silently accepted inputs
@pytest.mark.parametrize(
    "text, needles",
    [
        ("ttft_ms: 100\nitl_ms: 20\nttft_ms: 200\n", ["line 3", "duplicate key 'ttft_ms'", "first at line 1"]),
        (
            "planner:\n  agg:\n    max_replicas: 3\n    max_replicas: 4\n",
            ["line 4", "duplicate key 'planner.agg.max_replicas' (first at line 3)"],
        ),
        ('agg:\n  max_replicas: "3"\n', ['agg.max_replicas="3": expected an integer or null']),
        ("agg_max_replicas: '3'\n", ['agg.max_replicas="3": expected an integer or null']),
        ("ttft_ms: '100'\n", ['ttft_ms="100": expected a number']),
    ],
)
def test_config_file_duplicates_and_quoted_numbers_refused(tmp_path, capsys, text, needles):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(text)
    rc = cli_main(["simulate", "--trace", TRACE, "--config", str(cfg), "--quiet", "--compare", "static:1"])
    _one_line(capsys, rc, "--config", str(cfg), *needles)


def test_config_file_quoted_words_are_left_to_the_planner_config(tmp_path, profile):
    cfg = tmp_path / "c.yaml"  # a quoted non-number is the planner config's to judge (here: accepted)
    cfg.write_text("mode: \"agg\"\npredictor: 'constant'\n")
    assert (
        cli_main(
            [
                "simulate",
                "--trace",
                TRACE,
                "--profile",
                profile,
                "--config",
                str(cfg),
                "--quiet",
                "--compare",
                "static:1",
            ]
        )
        == 0
    )


def test_synthetic_spec_with_a_key_twice_refused(capsys):
    # the shared spec parser (mocker.traces.parse_synthetic_spec) refuses it, so replay does too
    rc = cli_main(["simulate", "--trace", TRACE + "&rate=5", "--quiet", "--compare", "static:1"])
    _one_line(capsys, rc, "'rate' given twice", "'5'")
    rc = cli_main(["replay", "--trace", TRACE + "&rate=5"])
    _one_line(capsys, rc, "'rate' given twice", "'5'")


def test_duplicate_compare_entries_warn_once_and_run_once(tmp_path, capsys, profile):
    out = tmp_path / "o"
    assert (
        cli_main(
            [
                "simulate",
                "--trace",
                TRACE,
                "--profile",
                profile,
                "--quiet",
                "--out",
                str(out),
                "--compare",
                "static:1",
                "static:2",
                "static:1",
                "static:1",
            ]
        )
        == 0
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["dynoplan simulate: warning: --compare static:1: given more than once, each runs once"]
    assert list(_policies(out)) == ["static:1", "static:2"]


# ------------------------------------------------------------------ 9. profile grid flags name the flag and the value
@pytest.mark.parametrize(
    "argv, needles",
    [
        (["--isl", "-5,100"], ["--isl", "'-5,100'", "positive"]),
        (["--isl=-5,100"], ["--isl", "'-5,100'", "positive"]),
        (["--isl", "100"], ["--isl", "'100'", "at least 2"]),
        (["--context", "512"], ["--context", "'512'", "at least 2"]),
        (["--kv-usage", "-0.1,0.5"], ["--kv-usage", "'-0.1,0.5'"]),
        (["--kv-usage", "0.5"], ["--kv-usage", "at least 2"]),
        (["--isl", "100,200000", "--num-gpu-blocks", "100"], ["--isl", "1 point(s) fit", "6400 tokens", "at least 2"]),
    ],
)
def test_profile_grid_errors_name_flag_value_and_the_two_points_needed(tmp_path, capsys, argv, needles):
    out = tmp_path / "p.npz"
    try:
        rc = cli_main(["profile", "--out", str(out), *argv])
    except SystemExit as e:  # argparse's exit for a bad flag value
        rc = e.code
    _one_line(capsys, rc, *needles)
    assert not out.exists()


# ------------------------------------------------------------------ 10. error lines name the flag
@pytest.mark.parametrize(
    "argv, needles",
    [
        (["--planner-set", "foo=1"], ["--planner-set foo=1: unknown setting"]),
        (["--planner-set", "ttft_ms=abc"], ['--planner-set ttft_ms="abc": expected a number']),
        (["--compare", "hpa:running:0"], ["policy 'hpa:running:0':", "target=0.0"]),
    ],
)
def test_error_lines_name_the_flag(capsys, profile, argv, needles):
    rc = cli_main(["simulate", "--trace", TRACE, "--profile", profile, "--quiet", *argv])
    _one_line(capsys, rc, *needles)


def test_planner_set_items_valid_together_are_not_judged_alone(profile):
    # min_gpu_budget=16 alone exceeds the default max_gpu_budget 8; with max_gpu_budget=32 it is valid
    assert (
        cli_main(
            [
                "simulate",
                "--trace",
                TRACE,
                "--profile",
                profile,
                "--quiet",
                "--compare",
                "static:1",
                "--planner-set",
                "min_gpu_budget=16",
                "--planner-set",
                "max_gpu_budget=32",
            ]
        )
        == 0
    )


def test_missing_warm_start_names_the_flag(tmp_path, capsys, profile):
    rc = cli_main(
        [
            "simulate",
            "--trace",
            TRACE,
            "--profile",
            profile,
            "--quiet",
            "--compare",
            "throughput-only",  # a policy that reads it (static:1 alone refuses the flag itself)
            "--warm-start",
            str(tmp_path / "nope.csv"),
        ]
    )
    _one_line(capsys, rc, f"--warm-start {tmp_path / 'nope.csv'}:")


def test_engine_timing_profile_given_as_planner_profile_is_named_as_swapped(tmp_path, capsys):
    import numpy as np

    timing = tmp_path / "timing.npz"  # an engine timing profile (the arrays --timing reads)
    np.savez(
        timing,
        prefill_isl=np.array([128.0, 512.0]),
        prefill_ttft_ms=np.array([10.0, 30.0]),
        decode_active_kv_tokens=np.array([1000.0, 8000.0]),
        decode_context_length=np.array([256.0, 1024.0]),
        decode_itl=np.array([[5.0, 6.0], [7.0, 9.0]]),
    )
    rc = cli_main(["simulate", "--trace", TRACE, "--quiet", "--profile", str(timing), "--compare", "static:1"])
    _one_line(capsys, rc, f"--profile {timing}", "engine timing profile", "go to --timing")


# ------------------------------------------------------------------ 11. the policy column is never cut
@pytest.mark.parametrize("width", [100, 140])
def test_long_policy_names_are_folded_not_truncated(width):
    from rich.console import Console

    from planner.sim.report import render_table

    name = "planner:prefill_ttft_tail=false,agg_itl_tail=false,predictor=kalman"
    row = {
        "sla_attainment": 0.99,
        "ttft_attainment": 0.995,
        "itl_attainment": 0.999,
        "goodput_rps": 1.5,
        "p50_ttft_ms": 20.0,
        "p99_ttft_ms": 80.0,
        "p50_itl_ms": 5.0,
        "p99_itl_ms": 9.0,
        "gpu_hours": 0.5,
        "mean_replicas": {"agg": 1.5},
        "max_replicas": {"agg": 3},
        "scale_events": 4,
    }
    with open("/dev/null", "w") as devnull:
        con = Console(width=width, record=True, file=devnull)
        con.print(render_table({"policies": {name: row, "static:1": row}}))
    text = con.export_text()
    assert "…" not in text
    first_cells = [ln.split("│")[1].strip() for ln in text.splitlines() if ln.count("│") > 2]
    assert name in "".join(first_cells)


# ------------------------------------------------------------------ 12. --out DIR holding an input; last sample
def test_out_dir_holding_an_input_that_is_no_output_name_runs_and_keeps_it(tmp_path, profile):
    trace = _csv(tmp_path / "one.csv", [(374, 44), (374, 44)])  # docs/offline.md: only output-file names are refused
    before = (tmp_path / "one.csv").read_bytes()
    assert (
        cli_main(
            [
                "simulate",
                "--trace",
                trace,
                "--profile",
                profile,
                "--quiet",
                "--out",
                str(tmp_path),
                "--compare",
                "static:1",
            ]
        )
        == 0
    )
    assert (tmp_path / "one.csv").read_bytes() == before
    assert (tmp_path / "summary.json").exists()


@pytest.mark.parametrize("interval", ["1000000", "7"])
def test_last_timeline_sample_is_not_beyond_the_end_of_the_run(tmp_path, profile, interval):
    import csv

    out = tmp_path / "o"
    assert (
        cli_main(
            [
                "simulate",
                "--trace",
                TRACE,
                "--profile",
                profile,
                "--quiet",
                "--out",
                str(out),
                "--sample-interval-s",
                interval,
                "--compare",
                "static:1",
                "planner",
            ]
        )
        == 0
    )
    pol = _policies(out)
    rows = list(csv.DictReader((out / "timeline.csv").open()))
    for name in ("static:1", "planner"):
        ts = [float(r["t_s"]) for r in rows if r["policy"] == name]
        assert ts[0] == 0.0 and ts == sorted(ts) and len(set(ts)) == len(ts), (name, ts)
        assert ts[-1] <= pol[name]["duration_s"] + 1e-6, (name, ts[-1], pol[name]["duration_s"])
    static = [r for r in rows if r["policy"] == "static:1"]
    if interval == "1000000":  # the closing sample sits at the end and sees every request of the 20 s trace
        assert float(static[-1]["t_s"]) == pytest.approx(pol["static:1"]["duration_s"], abs=1e-6)
        # window (0, end]: every request but the one arriving at t = 0 (counted by the snapshot at 0)
        seen = float(static[-1]["observed_rps"]) * pol["static:1"]["duration_s"]
        assert seen == pytest.approx(pol["static:1"]["num_requests"] - 1, abs=1e-3)


def test_simulate_gpu_budget_default_applies_with_a_config_file_too(tmp_path, profile):
    # simulate's default budget (64 GPUs) holds unless the file or --planner-set sets one: file > default
    def budget(name, *argv):
        out = tmp_path / name
        assert (
            cli_main(
                [
                    "simulate",
                    "--trace",
                    TRACE,
                    "--profile",
                    profile,
                    "--quiet",
                    "--compare",
                    "static:1",
                    "--out",
                    str(out),
                    *argv,
                ]
            )
            == 0
        )
        return json.loads((out / "details.json").read_text())["run"]["planner_config"]["max_gpu_budget"]

    plain = tmp_path / "plain.yaml"
    plain.write_text("predictor: constant\n")
    own = tmp_path / "own.yaml"
    own.write_text("max_gpu_budget: 12\n")
    assert budget("none") == 64
    assert budget("plain", "--config", str(plain)) == 64
    assert budget("own", "--config", str(own)) == 12
    assert budget("set", "--config", str(own), "--planner-set", "max_gpu_budget=16") == 16
