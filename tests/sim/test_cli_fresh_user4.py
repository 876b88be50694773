"""Fourth fresh-user round of ``dynoplan simulate`` defects (real CLI via main()): planner tick caps, each
--compare variant checked like the run's config, repeated flags, duplicate keys in any spelling, and cap
messages that blame only what the user set."""

from __future__ import annotations

import json

import pytest

from planner.cli import main as cli_main
from planner.core.config import setting_name
from planner.sim.runner import MAX_EARLY_TICKS, MAX_LOAD_TICKS, MAX_THROUGHPUT_TICKS

TINY = "synthetic:constant?rate=1&num_requests=20&isl=100&osl=10"  # arrivals 0..19 s


def _err(capsys, rc: int) -> str:
    """The one stderr line of a user-error exit (code 2, no traceback)."""
    err = capsys.readouterr().err
    assert rc == 2, err
    assert len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err
    return err.strip()


def _sim(profile: str, *argv: str) -> int:
    return cli_main(["simulate", "--trace", TINY, "--profile", profile, "--quiet", *argv])


# ------------------------------------------------------------------ 1. planner ticks are capped
def test_tiny_adjustment_interval_is_refused_before_running(profile, capsys):
    rc = _sim(profile, "--compare", "planner:adjustment_interval_s=1e-3,load_adjustment_interval_s=1e-4")
    assert _err(capsys, rc) == (
        "dynoplan simulate: error: policy 'planner:adjustment_interval_s=1e-3,load_adjustment_interval_s=1e-4': "
        f"adjustment_interval_s=0.001: --trace {TINY}: the trace spans 19 s; that is 1.9e+04 throughput-loop "
        f"ticks, more than the cap of {MAX_THROUGHPUT_TICKS} per policy; expected adjustment_interval_s >= 0.0019 s"
    )


def test_tiny_load_interval_with_the_load_loop_is_refused(profile, capsys):
    rc = _sim(profile, "--compare", "planner:load_enabled=true,load_adjustment_interval_s=1e-6")
    err = _err(capsys, rc)
    assert "load_adjustment_interval_s=1e-06: " in err
    assert f"1.9e+07 load-loop ticks, more than the cap of {MAX_LOAD_TICKS} per policy" in err


def test_tiny_early_sizing_interval_is_refused_and_off_or_without_the_throughput_loop_runs(profile, capsys):
    # 19 s / 1e-6 s = 1.9e7 early checks, over the cap (each advances the simulation: a tiny value ran for hours)
    rc = _sim(profile, "--compare", "planner:early_sizing_s=1e-6")
    err = _err(capsys, rc)
    assert "early_sizing_s=1e-06: " in err
    assert f"1.9e+07 early-check ticks, more than the cap of {MAX_EARLY_TICKS} per policy" in err
    assert err.endswith("expected early_sizing_s >= 0.00019 s")
    assert _sim(profile, "--compare", "planner:early_sizing_s=null") == 0, capsys.readouterr().err
    assert _sim(profile, "--compare", "planner:early_sizing_s=1e-6,throughput_enabled=false,load_enabled=true") == 0


def test_tiny_interval_of_the_run_config_is_refused_for_the_planner_policy(profile, capsys):
    rc = _sim(
        profile, "--planner-set", "adjustment_interval_s=1e-3", "--planner-set", "load_adjustment_interval_s=1e-4"
    )
    assert _err(capsys, rc).startswith(
        "dynoplan simulate: error: policy 'planner': adjustment_interval_s=0.001: --trace "
    )


def test_tiny_load_interval_without_the_load_loop_runs(profile, capsys):
    # the load loop's clock is not stepped while the loop is off (it used to be stepped 1e-9 s at a time)
    assert _sim(profile, "--compare", "planner:load_adjustment_interval_s=1e-9") == 0, capsys.readouterr().err


# ------------------------------------------------------------------ 2. --initial-replicas per variant
@pytest.mark.parametrize(
    ("variant", "expected"),
    [
        (
            "planner:max_gpu_budget=2",
            "expected 1 <= N <= 2 (planner agg.min_replicas / max_replicas, max_gpu_budget=2)",
        ),
        ("planner:agg.max_replicas=1", "expected 1 <= N <= 1 (planner agg.min_replicas / max_replicas"),
    ],
)
def test_initial_replicas_outside_a_variants_limits_is_refused(profile, capsys, variant, expected):
    rc = _sim(profile, "--compare", "planner", variant, "--initial-replicas", "3")
    assert _err(capsys, rc).startswith(f"dynoplan simulate: error: policy {variant!r}: --initial-replicas agg=3: ")
    rc = _sim(profile, "--compare", "planner", variant, "--initial-replicas", "3")
    assert expected in _err(capsys, rc)


# ------------------------------------------------------------------ 3. a variant's gpus_per_engine
@pytest.mark.parametrize("key", ["agg.gpus_per_engine", "agg_gpus_per_engine", "agg-gpus-per-engine"])
def test_a_variant_changing_gpus_per_engine_is_refused(profile, capsys, key):
    rc = _sim(profile, "--compare", "planner", f"planner:{key}=4", "--initial-replicas", "3")
    assert _err(capsys, rc) == (
        f"dynoplan simulate: error: policy 'planner:{key}=4': agg.gpus_per_engine=4: a --compare variant cannot "
        "change the fleet's GPUs per worker, expected agg.gpus_per_engine=1 (the run's: --planner-set, --config, "
        "at least --dp-size) or none"
    )


def test_a_variant_repeating_the_runs_gpus_per_engine_is_accepted(profile, capsys):
    rc = _sim(profile, "--planner-set", "agg.gpus_per_engine=2", "--compare", "planner:agg.gpus_per_engine=2")
    assert rc == 0, capsys.readouterr().err


# ------------------------------------------------------------------ 4. repeated --compare accumulates
def test_repeated_compare_runs_every_policy(profile, tmp_path, capsys):
    out = tmp_path / "o"
    assert _sim(profile, "--compare", "static:1", "--compare", "static:2", "static:3", "--out", str(out)) == 0
    assert list(json.loads((out / "summary.json").read_text())["policies"]) == ["static:1", "static:2", "static:3"]


def test_without_compare_the_planner_runs(profile, tmp_path):
    out = tmp_path / "o"
    assert _sim(profile, "--out", str(out)) == 0
    assert list(json.loads((out / "summary.json").read_text())["policies"]) == ["planner"]


# ------------------------------------------------------------------ 5. duplicates across spellings
def test_setting_name_is_one_spelling_per_setting():
    assert {setting_name(k) for k in ("agg.gpus_per_engine", "agg_gpus_per_engine", "agg-gpus-per-engine")} == {
        "agg_gpus_per_engine"
    }
    assert setting_name("ttft-ms") == "ttft_ms"
    assert setting_name("agg.max_replica") == "agg.max_replica"  # not a pool key: left for the did-you-mean


def test_planner_set_pool_key_in_two_spellings_is_refused(profile, capsys):
    rc = _sim(profile, "--planner-set", "agg_gpus_per_engine=2", "--planner-set", "agg.gpus_per_engine=4")
    assert _err(capsys, rc) == (
        "dynoplan simulate: error: --planner-set agg.gpus_per_engine=4: agg.gpus_per_engine given twice "
        "(first agg_gpus_per_engine=2), expected each setting once"
    )


@pytest.mark.parametrize(
    ("spec", "tail"),
    [
        ("planner:ttft_ms=100,ttft-ms=200", "ttft-ms=200: ttft-ms given twice (first ttft_ms=100)"),
        ("planner:agg_max_replicas=1,agg.max_replicas=2", "agg.max_replicas=2: agg.max_replicas given twice"),
    ],
)
def test_variant_key_in_two_spellings_is_refused(profile, capsys, spec, tail):
    rc = _sim(profile, "--compare", spec)
    assert _err(capsys, rc).startswith(f"dynoplan simulate: error: policy {spec!r}: {tail}")


# ------------------------------------------------------------------ 6. the sample cap blames what was set
def test_sample_cap_after_arrival_speedup_names_the_speedup_and_the_default_interval(profile, capsys):
    # 19 s at 1e-5 of the rate: 1.9e6 s, past the sample cap (1e6 s at 10 s per sample), inside the trace time
    # bound (4.5e6 s), which 1e-300 crosses first (its own message: test_cli_bad_input)
    rc = _sim(profile, "--arrival-speedup", "1e-5")
    assert _err(capsys, rc) == (
        "dynoplan simulate: error: the trace spans 1.9e+06 s after --arrival-speedup=1e-05 (--trace "
        f"{TINY}: 19 s as read); at --sample-interval-s=10 (default) that is 1.9e+05 timeline samples, more than "
        "the cap of 100000 per policy; expected a trace of at most 1e+06 s or --sample-interval-s >= 19"
    )


def test_sample_cap_after_a_rate_envelope_names_the_envelope(profile, tmp_path, capsys):
    env = tmp_path / "env.csv"
    # 9 s of trace at 5e-6 of the rate span 1.8e6 s: past the sample cap (1e6 s at 10 s per sample), inside the
    # trace time bound (4.5e6 s), which a multiplier near 0 such as 1e-9 crosses first (its own message)
    env.write_text("time_s,multiplier\n0,1\n10,5e-6\n")
    rc = _sim(profile, "--rate-envelope", str(env))
    err = _err(capsys, rc)
    assert f"after --rate-envelope {env} (--trace {TINY}: 19 s as read)" in err
    assert "at --sample-interval-s=10 (default) that is" in err


def test_sample_cap_of_a_long_trace_names_the_trace(profile, capsys):
    rc = cli_main(
        ["simulate", "--trace", "synthetic:constant?rate=1e-6&num_requests=3", "--profile", profile, "--quiet"]
    )
    err = _err(capsys, rc)
    # 3 arrivals 1e6 s apart from t = 0: the last at 2e6 s, inside the time bound (4.5e6 s), past the sample cap
    assert err.startswith(
        "dynoplan simulate: error: --trace synthetic:constant?rate=1e-6&num_requests=3: the trace spans 2e+06 s; "
    )
    assert "at --sample-interval-s=10 (default) that is" in err


def test_sample_cap_with_the_interval_given_does_not_say_default(profile, capsys):
    rc = cli_main(
        ["simulate", "--trace", "synthetic:constant?rate=1e-3&num_requests=3", "--profile", profile, "--quiet"]
        + ["--sample-interval-s", "0.01"]
    )
    err = _err(capsys, rc)  # 2000 s / 0.01 s = 2e5 samples
    assert "at --sample-interval-s=0.01 that is 2e+05" in err and "(default)" not in err


# ------------------------------------------------------------------ 7. smaller grammar points
@pytest.mark.parametrize(("value", "index"), [("constant,,kalman", "1"), ("constant,kalman,", "2"), (",constant", "0")])
def test_empty_list_items_are_refused(profile, capsys, value, index):
    rc = _sim(profile, "--compare", f"planner:auto_candidates={value}")
    assert f'auto_candidates.{index}="": expected one of' in _err(capsys, rc)
    rc = _sim(profile, "--planner-set", f"auto_candidates={value}")
    assert f'--planner-set auto_candidates.{index}="": expected one of' in _err(capsys, rc)


@pytest.mark.parametrize("value", ["off", "null", "~", "Null", ""])
def test_attainment_target_off_or_yaml_null_disables_it(profile, capsys, value):
    from planner.cli import build_parser
    from planner.cli_simulate import build_context
    from planner.sim.runner import make_policy

    args = build_parser().parse_args(["simulate", "--trace", TINY, "--profile", profile])
    ctx = build_context(args)
    assert make_policy(f"planner:attainment_target={value}", ctx).config.sla_attainment_target is None  # type: ignore[attr-defined]
    assert _sim(profile, "--attainment-target", value, "--compare", "planner") == 0, capsys.readouterr().err


def test_attainment_target_none_is_text_and_refused(profile, capsys):
    rc = _sim(profile, "--compare", "planner:attainment_target=none")
    assert _err(capsys, rc) == (
        "dynoplan simulate: error: policy 'planner:attainment_target=none': attainment_target='none': "
        "expected a share 0 < F <= 0.9999 or off (the sizing judges each candidate fleet on at least 2 z^2 / "
        "(1 - target) simulated requests: 54,119 at 0.9999, ten times more for each further nine)"
    )
    with pytest.raises(SystemExit) as e:
        _sim(profile, "--attainment-target", "none")
    assert "argument --attainment-target: 'none': expected a share 0 < F <= 0.9999 or off (" in _err(
        capsys, e.value.code
    )


@pytest.mark.parametrize("target", ["1_0", "inf", "١"])
def test_hpa_target_is_read_by_the_number_grammar(profile, capsys, target):
    rc = _sim(profile, "--compare", f"hpa:running:{target}")
    assert _err(capsys, rc) == (
        f"dynoplan simulate: error: policy 'hpa:running:{target}': target {target!r}: expected a number"
    )


def test_a_spec_with_spaces_is_the_same_policy_and_warned_once(profile, tmp_path, capsys):
    out = tmp_path / "o"
    assert _sim(profile, "--compare", " static:1", "static:1 ", "static:2", "--out", str(out)) == 0
    err = capsys.readouterr().err
    assert "warning: --compare static:1: given more than once, each runs once" in err
    assert list(json.loads((out / "summary.json").read_text())["policies"]) == ["static:1", "static:2"]


def test_the_table_printed_to_a_file_is_whole_however_long_the_policy_names(profile, capsys):
    # a pipe or file has no width to fit: the table used to be cut at 180 columns (scale events and the right
    # border lost) and long policy names wrapped mid-word
    names = [
        "planner:early_sizing_s=null,simulated_sizing=false",
        "planner:adjustment_interval_s=90,predictor=constant",
    ]
    rc = cli_main(["simulate", "--trace", TINY, "--profile", profile, "--compare", *names, "static:1"])
    out = capsys.readouterr().out
    assert rc == 0
    rows = [ln for ln in out.splitlines() if ln[:1] in "┏┃┡│└"]
    assert len(rows) == 7  # top border, header, rule, 3 policies, bottom border
    assert all(ln[-1] in "┓┃┩│┘" for ln in rows), out
    assert len({len(ln) for ln in rows}) == 1, out  # every line of the table as wide as the others
    for name in names:
        assert any(f"│ {name} " in ln for ln in rows), out


def test_details_record_what_each_planner_row_ran_with_beyond_the_runs_config(profile, tmp_path):
    out = tmp_path / "o"
    variant = "planner:early_sizing_s=null,attainment_target=0.99"
    argv = ["simulate", "--trace", TINY, "--profile", profile, "--quiet", "--out", str(out)]
    assert cli_main([*argv, "--attainment-target", "0.9", "--compare", "planner", variant, "static:1"]) == 0
    run = json.loads((out / "details.json").read_text())["run"]
    assert run["planner_config"]["sla_attainment_target"] == 0.9 and run["planner_config"]["early_sizing_s"] == 30.0
    # the plain planner ran the run's config; the variant its two settings; a static row has no planner settings
    assert run["policy_settings"] == {
        "planner": {},
        variant: {"early_sizing_s": None, "sla_attainment_target": 0.99},
    }
