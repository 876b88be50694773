"""Fresh-user defects of ``dynoplan simulate``: each bad input is one line on stderr naming the field, exit 2."""

from __future__ import annotations

import json

import pytest

from planner.cli import main as cli_main
from tests.sim.cli_helpers import TRACE
from tests.sim.cli_helpers import one_line as _one_line


def _no_sim(monkeypatch):
    import planner.cli_simulate as cs

    monkeypatch.setattr(cs, "build_context", lambda a: (_ for _ in ()).throw(AssertionError("simulated")))


def test_out_holding_the_trace_is_refused_and_the_trace_kept(tmp_path, capsys, monkeypatch):
    _no_sim(monkeypatch)
    trace = tmp_path / "requests.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1]}\n')
    before = trace.read_text()
    rc = cli_main(["simulate", "--trace", str(trace), "--quiet", "--out", str(tmp_path)])
    _one_line(capsys, rc, "--out", "--trace", str(trace), "requests.jsonl")
    assert trace.read_text() == before


def test_out_holding_the_trace_via_a_symlink_is_refused(tmp_path, capsys, monkeypatch):
    _no_sim(monkeypatch)
    trace = tmp_path / "t.jsonl"
    trace.write_text("{}\n")
    out = tmp_path / "o"
    out.mkdir()
    (out / "requests.jsonl").symlink_to(trace)
    rc = cli_main(["simulate", "--trace", str(out / "requests.jsonl"), "--quiet", "--out", str(out)])
    _one_line(capsys, rc, "would overwrite --trace")


def test_failed_write_prints_results_then_one_line(tmp_path, capsys, profile):
    out = tmp_path / "o"
    out.mkdir()
    (out / "summary.json").mkdir()  # writing summary.json fails (a directory), even as root
    rc = cli_main(
        ["simulate", "--trace", TRACE, "--profile", profile, "--compare", "static:1", "--quiet", "--out", str(out)]
    )
    stdout = _one_line(capsys, rc, "--out", "summary.json", "results printed")
    assert "static:1" in stdout
    summary = json.loads(stdout[stdout.index("\n{") + 1 :])
    assert "static:1" in json.dumps(summary)


@pytest.mark.parametrize(
    "policy, needles",
    [
        ("static:99999999", ("static:99999999", "agg=99999999", "--max-replicas=64")),
        ("static:65", ("agg=65", "at most")),
        ("hpa:kv:2", ("hpa:kv:2", "'2'", "0 < target <= 1")),
        ("hpa:kv:0", ("'0'", "0 < target <= 1")),
    ],
)
def test_policy_spec_out_of_range_rejected(capsys, profile, policy, needles):
    rc = cli_main(["simulate", "--trace", TRACE, "--profile", profile, "--quiet", "--compare", policy])
    _one_line(capsys, rc, *needles)


def test_static_at_max_replicas_and_hpa_kv_1_accepted(profile):
    from planner.cli import build_parser
    from planner.cli_simulate import build_context
    from planner.sim.runner import make_policy

    args = build_parser().parse_args(["simulate", "--trace", TRACE, "--profile", profile, "--max-replicas", "3"])
    ctx = build_context(args)
    assert make_policy("static:3", ctx).replicas == {"agg": 3}
    assert make_policy("hpa:kv:1", ctx).target == 1.0
    assert make_policy("hpa:running:7", ctx).target == 7.0  # running requests: not a fraction


def test_a_planner_variant_gives_a_list_setting_over_the_items_without_equals(capsys, profile):
    from planner.cli import build_parser
    from planner.cli_simulate import build_context
    from planner.sim.runner import make_policy

    ctx = build_context(build_parser().parse_args(["simulate", "--trace", TRACE, "--profile", profile]))
    cfg = make_policy("planner:auto_candidates=constant,kalman,load_enabled=true", ctx).config
    assert cfg.auto_candidates == ("constant", "kalman") and cfg.load_enabled is True
    assert make_policy("planner:auto_candidates=arima", ctx).config.auto_candidates == ("arima",)
    rc = cli_main(["simulate", "--trace", TRACE, "--profile", profile, "--quiet", "--compare", "planner:kalman"])
    _one_line(capsys, rc, "expected planner:key=value,key=value")
    rc = cli_main(
        ["simulate", "--trace", TRACE, "--profile", profile, "--quiet", "--compare", "planner:load_enabled=true,x"]
    )
    _one_line(capsys, rc, "load_enabled")


def test_tiny_sample_interval_rejected(capsys, profile):
    # below the loop's 1 ms clock step: refused as the flag is read
    with pytest.raises(SystemExit) as e:
        cli_main(["simulate", "--trace", TRACE, "--profile", profile, "--quiet", "--sample-interval-s", "1e-9"])
    _one_line(capsys, e.value.code, "--sample-interval-s: '1e-9': expected seconds >= 0.001 (the loop's smallest clock")
    # 20 arrivals 10 s apart span 190 s; / 1e-3 s = 190000 samples > MAX_TIMELINE_SAMPLES (100000)
    trace = "synthetic:constant?rate=0.1&num_requests=20"
    rc = cli_main(["simulate", "--trace", trace, "--profile", profile, "--quiet", "--sample-interval-s", "0.001"])
    _one_line(capsys, rc, "at --sample-interval-s=0.001 that is 1.9e+05", "more than the cap of 100000 per policy")


def test_attainment_target_off_accepted_and_disables_the_feedback(profile):
    from planner.cli import build_parser
    from planner.cli_simulate import build_context
    from planner.sim.runner import make_policy

    p = build_parser()
    args = p.parse_args(["simulate", "--trace", TRACE, "--profile", profile, "--attainment-target", "off"])
    assert make_policy("planner", build_context(args)).config.sla_attainment_target is None
    args = p.parse_args(["simulate", "--trace", TRACE, "--profile", profile, "--attainment-target", "0.9"])
    assert make_policy("planner", build_context(args)).config.sla_attainment_target == 0.9


@pytest.mark.parametrize("value", ["1", "0", "-0.5", "nan", "offf"])
def test_attainment_target_bad_values_rejected(capsys, value):
    with pytest.raises(SystemExit) as e:
        cli_main(["simulate", "--trace", TRACE, "--attainment-target", value])
    _one_line(capsys, e.value.code, "--attainment-target", repr(value), "0 < F <= 0.9999 or off")


def _ctx(profile, *argv):
    from planner.cli import build_parser
    from planner.cli_simulate import build_context

    return build_context(build_parser().parse_args(["simulate", "--trace", TRACE, "--profile", profile, *argv]))


@pytest.mark.parametrize("text", ["ttft_ms: 100\nitl_ms: 20\n", "planner:\n  ttft_ms: 100\n  itl_ms: 20\n"])
def test_config_file_sla_is_honoured_when_the_flag_is_not_given(tmp_path, profile, text):
    f = tmp_path / "c.yaml"
    f.write_text(text)
    ctx = _ctx(profile, "--config", str(f))
    assert (ctx.config.ttft_ms, ctx.config.itl_ms) == (100.0, 20.0)
    assert (ctx.settings.sla_ttft_ms, ctx.settings.sla_itl_ms) == (100.0, 20.0)
    ctx = _ctx(profile, "--config", str(f), "--sla-ttft-ms", "300")  # flag > file
    assert (ctx.config.ttft_ms, ctx.settings.sla_ttft_ms, ctx.settings.sla_itl_ms) == (300.0, 300.0, 20.0)
    ctx = _ctx(profile)  # no file: the defaults
    assert (ctx.settings.sla_ttft_ms, ctx.settings.sla_itl_ms) == (500.0, 50.0)


def test_config_file_mode_is_honoured(tmp_path, profile):
    f = tmp_path / "c.yaml"
    f.write_text("mode: disagg\n")
    assert _ctx(profile, "--config", str(f)).pools == ("prefill", "decode")
    assert _ctx(profile, "--config", str(f), "--mode", "agg").pools == ("agg",)


@pytest.mark.parametrize(
    "text, needles",
    [
        ("ttft_ms: .nan\n", ("ttft_ms=.nan", "expected a finite number")),
        ("planner:\n  itl_ms: .nan\n", ("itl_ms=.nan",)),
        ("bogus_key: 1\n", ("bogus_key", "unknown setting")),
        ("bogus_key: 1\nplanner:\n  ttft_ms: 100\n", ("bogus_key", "a section beside other keys")),
        ("max_num_batched_tokens: 1234\n", ("max_num_batched_tokens=1234", "engine's")),
        ("mode: prefill\n", ("mode='prefill'", "expected agg or disagg")),
    ],
)
def test_config_file_bad_keys_rejected(tmp_path, capsys, profile, text, needles):
    f = tmp_path / "c.yaml"
    f.write_text(text)
    rc = cli_main(["simulate", "--trace", TRACE, "--profile", profile, "--quiet", "--config", str(f)])
    _one_line(capsys, rc, *needles)


# ---------------------------------------------------------------------------------------------- HPA / saturation
def _view(now_s: float, window_requests: float | None, current: int = 2):
    from mocker.fleet import EngineState, PoolCounts
    from planner.core import TrafficWindow
    from planner.sim.policies import View

    w = None if window_requests is None else TrafficWindow(now_s, window_requests, 100.0, 10.0)
    counts = {"agg": PoolCounts(current, current, 0, 0)}
    engines = [EngineState("agg", i, 0, num_waiting=0, num_running=0, kv_usage=0.0) for i in range(current)]
    return View(now_s, counts, {"agg": engines}, lambda d: w)


@pytest.mark.parametrize(
    "make, act_s",
    [
        # HPA: the t=0 recommendation (2) holds a scale-down for the 300 s stabilization window
        (
            lambda: __import__("planner.sim.policies", fromlist=["x"]).HpaPolicy(
                "hpa", ("agg",), "kv", 0.4, {"agg": 2}
            ),
            301.0,
        ),
        (
            lambda: __import__("planner.sim.policies", fromlist=["x"]).SaturationPolicy(
                "saturation", ("agg",), {"agg": 2}
            ),
            30.0,
        ),
    ],
)
def test_metric_baselines_hold_until_a_request_was_seen(make, act_s):
    pol = make()
    for now, reqs in ((0.0, None), (15.0, None), (15.0, 0.0)):  # t = 0, nothing scraped, an empty window
        step = pol.tick(_view(now, reqs))
        assert step.targets is None and step.reason == "hold_no_metrics"
        assert step.next_tick_s > now
    step = pol.tick(_view(act_s, 5.0))  # requests seen, idle engines (KV 0): now the rule acts -> scale down
    assert step.targets == {"agg": 1}


def test_hpa_in_the_loop_does_not_scale_before_the_first_request(profile):
    from dataclasses import replace

    from mocker.traces import load_trace
    from planner.sim.loop import simulate
    from planner.sim.runner import make_policy

    late = load_trace("synthetic:constant?rate=2&duration_s=60&isl=256&osl=16")  # first request 40 s in
    ctx = _ctx(profile, "--initial-replicas", "2")
    ctx = replace(ctx, requests=[replace(r, arrival_ms=r.arrival_ms + 40_000.0) for r in late])
    first_s = min(r.arrival_ms for r in ctx.requests) / 1000.0
    for spec in ("hpa", "saturation"):
        run = simulate(ctx.requests, ctx.engines, make_policy(spec, ctx), ctx.settings)
        assert run.decisions or spec == "hpa", spec  # hpa: its t=0 recommendation holds 2 for 300 s
        assert all(d["t_s"] > first_s for d in run.decisions), (spec, run.decisions[:2])


@pytest.mark.parametrize(
    "argv, needles",
    [
        (["--initial-replicas", "-1"], ("agg=-1", "1 <= N <= 64")),  # was "integers >= 0" though 0 is rejected too
        (["--initial-replicas", "1+1"], ("'1+1'", "expected N", "min_replicas..max_replicas")),
        (["--initial-replicas", "x"], ("'x'", "or auto")),
    ],
)
def test_initial_replicas_message_states_the_real_bounds(capsys, monkeypatch, argv, needles):
    import planner.sim.profile as prof

    monkeypatch.setattr(prof, "profile_engine", lambda *a, **k: (_ for _ in ()).throw(AssertionError("profiled")))
    rc = cli_main(["simulate", "--trace", TRACE, "--quiet", *argv])
    out = _one_line(capsys, rc, "--initial-replicas", *needles)
    assert ">= 0" not in out


@pytest.mark.parametrize(
    "argv",
    [
        ["simulate", "--trace", TRACE, "--mod", "agg"],  # not --mode / --model-config
        ["simulate", "--trace", TRACE, "--sla-ttft", "100"],
        ["profile", "--is", "128"],
        ["up", "--conf", "x.yaml"],
    ],
)
def test_abbreviated_flags_are_not_accepted(capsys, argv):
    with pytest.raises(SystemExit) as e:
        cli_main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert argv[-2] in err or "required" in err


def test_hpa_first_reconcile_records_the_current_size_so_no_early_scale_down():
    from planner.sim.policies import HpaPolicy

    h = HpaPolicy("hpa", ("agg",), "kv", 0.4, {"agg": 2})
    assert h.tick(_view(0.0, None)).reason == "hold_no_metrics"
    # idle engines (KV 0): raw recommendation 1, but 2 was recorded at t=0 -> kept for 300 s
    assert h.tick(_view(15.0, 5.0)).targets is None
    assert h.tick(_view(299.0, 5.0)).targets is None
    assert h.tick(_view(301.0, 5.0)).targets == {"agg": 1}


def test_static_auto_unreachable_names_the_best_fleet_and_keeps_the_other_results(tmp_path, capsys, profile):
    out = tmp_path / "o"
    # TTFT target 0.001 ms: no fleet meets it; the search tries 1 and 2 (= --max-replicas), all at 0 attainment
    rc = cli_main(
        [
            "simulate",
            "--trace",
            TRACE,
            "--profile",
            profile,
            "--sla-ttft-ms",
            "0.001",
            "--max-replicas",
            "2",
            "--compare",
            "static:auto",
            "static:1",
            "--out",
            str(out),
        ]
    )
    cap = capsys.readouterr()
    assert rc == 2 and "Traceback" not in cap.err
    last = cap.err.strip().splitlines()[-1]  # after the usual "wall time per policy" line
    for needle in ("error: static:auto", "--max-replicas=2", "best found: static:1 with attainment 0.0000"):
        assert needle in last, cap.err
    stdout = cap.out
    assert "static:1" in stdout  # the table of the other policies
    summary = json.loads((out / "summary.json").read_text())
    assert "static:1" in json.dumps(summary) and "static:auto" not in json.dumps(summary)


def test_static_auto_alone_unreachable_is_one_line(capsys, profile):
    rc = cli_main(
        [
            "simulate",
            "--trace",
            TRACE,
            "--profile",
            profile,
            "--sla-ttft-ms",
            "0.001",
            "--max-replicas",
            "1",
            "--compare",
            "static:auto",
            "--quiet",
        ]
    )
    _one_line(capsys, rc, "best found: static:1")


MODEL = {"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 64}


@pytest.mark.parametrize("dtype, kv_bytes", [("fp8", 2 * 2 * 2 * 16 * 1), ("bfloat16", 2 * 2 * 2 * 16 * 2)])
def test_simulate_takes_replays_kv_cache_dtype(tmp_path, profile, dtype, kv_bytes):
    # layers x 2 (K and V) x kv_heads x head_dim (64 / 4) x dtype bytes; the file has no torch_dtype
    m = tmp_path / "config.json"
    m.write_text(json.dumps(MODEL))
    ctx = _ctx(
        profile,
        "--mode",
        "disagg",
        "--model-config",
        str(m),
        "--kv-cache-dtype",
        dtype,
        "--kv-transfer-bandwidth",
        "10",
        "--kv-transfer-timing",
        "full_prompt",
        "--handoff",
        "coordinated",
    )
    assert ctx.settings.transfer.kv_bytes_per_token == kv_bytes
    assert ctx.settings.transfer.bandwidth_gbps == 10.0


def test_model_config_without_dtype_names_a_flag_simulate_has(tmp_path, capsys, profile):
    m = tmp_path / "config.json"
    m.write_text(json.dumps(MODEL))
    rc = cli_main(
        [
            "simulate",
            "--trace",
            TRACE,
            "--profile",
            profile,
            "--quiet",
            "--mode",
            "disagg",
            "--model-config",
            str(m),
            "--kv-transfer-bandwidth",
            "10",
        ]
    )
    _one_line(capsys, rc, "torch_dtype", "--kv-cache-dtype")
    from planner.cli import build_parser

    assert build_parser().parse_args(["simulate", "--trace", TRACE, "--kv-cache-dtype", "fp8"]).kv_cache_dtype == "fp8"


@pytest.mark.parametrize("name", ["--kv-cache-dtype", "--handoff"])
def test_transfer_flags_only_in_disagg(capsys, name):
    from mocker.transfer import HANDOFF_PATHS

    flag = [name, "fp8" if name == "--kv-cache-dtype" else next(h for h in HANDOFF_PATHS if h != "coordinated")]
    rc = cli_main(["simulate", "--trace", TRACE, "--quiet", *flag])
    _one_line(capsys, rc, flag[0], "only with --mode disagg")


@pytest.mark.parametrize(
    "argv, needles",
    [
        (["--sla-itl-ms", "1e12"], ("--sla-itl-ms", "'1e12'", "expected at most 10000 ms")),
        (["--sla-ttft-ms", "1e308"], ("--sla-ttft-ms", "expected at most 3600000 ms")),
        (["--max-replicas", "99999999999"], ("--max-replicas", "expected a worker count between 1 and 4096")),
        (["--compare", "planner:itl_ms=1e20"], ("itl_ms=1e+20: expected <= 10000.0",)),
        (["--planner-set", "ttft_ms=4e6"], ("ttft_ms=4000000.0: expected <= 3600000.0",)),
        (["--compare", "hpa:kv:0.5:extra"], ("'extra'", "expected hpa, hpa:METRIC or hpa:METRIC:TARGET")),
        (
            ["--compare", "planner:predictor=kalman,predictor=arima"],
            ("predictor given twice (first predictor=kalman)",),
        ),
        (["--compare", "planner:max_gpu_budget=1.5"], ("max_gpu_budget=1.5", "expected an integer")),
    ],
)
def test_out_of_range_sla_replicas_and_malformed_specs_are_one_line(capsys, profile, argv, needles):
    try:
        rc = cli_main(["simulate", "--trace", TRACE, "--profile", profile, "--quiet", *argv])
    except SystemExit as e:  # a flag's own type check: argparse exits (2) with its one line
        rc = e.code
    _one_line(capsys, rc, *needles)


def test_broken_yaml_names_the_line_and_yaml_booleans_are_true_false(tmp_path, capsys, profile):
    bad = tmp_path / "bad.yaml"
    bad.write_text("itl_ms: 40\nttft_ms: [1, 2\n")
    rc = cli_main(["simulate", "--trace", TRACE, "--profile", profile, "--quiet", "--config", str(bad)])
    _one_line(capsys, rc, str(bad), "cannot parse config file at line 3, column 1", "expected a YAML or JSON mapping")
    from dynoplan.errors import ConfigError
    from planner.core.config import load_config

    ok = tmp_path / "ok.yaml"
    ok.write_text("correction_enabled: false\nsimulated_sizing: true\n")
    cfg = load_config(ok)
    assert cfg.correction_enabled is False and cfg.simulated_sizing is True
    # in a file a boolean is true/false (strict types, dynoplan.settings); 0/1 are integers there
    ok.write_text("correction_enabled: 0\nsimulated_sizing: 1\n")
    with pytest.raises(ConfigError) as e:
        load_config(ok)
    assert e.value.problems == [
        "correction_enabled=0: expected a boolean (true/false)",
        "simulated_sizing=1: expected a boolean (true/false)",
    ]
    # ... and on the command line (dynoplan.settings_text: one grammar for files and KEY=VALUE text)
    with pytest.raises(ConfigError) as e:
        load_config(None, {"correction_enabled": "0", "simulated_sizing": "1"})
    assert e.value.problems == [
        "correction_enabled=0: expected a boolean (true/false)",
        "simulated_sizing=1: expected a boolean (true/false)",
    ]


def test_policy_names_are_printed_verbatim_not_as_emoji(capsys, profile):
    # rich turns ":running:" into an emoji unless told not to
    rc = cli_main(["simulate", "--trace", TRACE, "--profile", profile, "--compare", "hpa:running:2"])
    cap = capsys.readouterr()
    assert rc == 0 and "hpa:running:2" in cap.out and "hpa:running:2" in cap.err


DISAGG_ONLY = "only with --mode disagg (KV transfer between pools), expected --mode disagg or none of them"


@pytest.mark.parametrize(
    "argv, message",
    [
        # given at their default values, these were ignored (exit 0); other values were refused without the value
        (["--handoff", "coordinated"], f"--handoff coordinated: {DISAGG_ONLY}"),
        (["--kv-transfer-timing", "full_prompt"], f"--kv-transfer-timing full_prompt: {DISAGG_ONLY}"),
        (
            ["--handoff", "direct", "--kv-cache-dtype", "auto", "--kv-transfer-bandwidth", "2.5"],
            f"--kv-transfer-bandwidth 2.5, --kv-cache-dtype auto, --handoff direct: {DISAGG_ONLY}",
        ),
        (
            ["--mode", "disagg", "--kv-bytes-per-token", "5", "--kv-cache-dtype", "fp8"],
            "--kv-cache-dtype fp8: only with --model-config (it sets the bytes per KV value of the model's "
            "config.json); expected --model-config or no --kv-cache-dtype",
        ),
    ],
)
def test_a_transfer_flag_without_its_prerequisite_is_refused_with_its_value(capsys, argv, message):
    rc = cli_main(["simulate", "--trace", TRACE, "--quiet", "--compare", "static:1", *argv])
    cap = capsys.readouterr()
    assert (rc, cap.out, cap.err) == (2, "", f"dynoplan simulate: error: {message}\n")


AUTO_ONLY = (
    "only with static:auto in --compare (the SLA attainment its search must reach); expected --compare static:auto "
    "or no --auto-attainment"
)


@pytest.mark.parametrize("compare", [["static:auto"], ["static:1", " static:auto "]])
def test_auto_attainment_with_static_auto_is_taken(monkeypatch, compare):
    import planner.cli_simulate as cs

    seen = []

    def stop(args):  # reached: the flag passed the check; the run itself is not needed here
        seen.append(args.auto_attainment)
        raise AssertionError("reached build_context")

    monkeypatch.setattr(cs, "build_context", stop)
    with pytest.raises(AssertionError, match="reached build_context"):
        cli_main(["simulate", "--trace", TRACE, "--quiet", "--compare", *compare, "--auto-attainment", "0.9"])
    assert seen == [0.9]


PLANNER_ONLY = (
    "only with planner in --compare (the planner's SLA-attainment target); expected --compare planner or no "
    "--attainment-target"
)
WARM_ONLY = (
    "only with planner or throughput-only in --compare (it warm-starts their predictors); expected one of them in "
    "--compare or no --warm-start"
)
INITIAL_ONLY = (
    "only with planner, throughput-only, hpa or saturation in --compare (the fleet they start from; static and "
    "schedule fleets are their own); expected one of them in --compare or no --initial-replicas"
)


@pytest.mark.parametrize(
    "argv, message",
    [
        # each was: accepted and ignored (exit 0), the static fleets run as if it were not given
        (["--compare", "static:2", "--auto-attainment", "0.5"], f"--auto-attainment 0.5: {AUTO_ONLY}"),
        # its default value given counts too; no --compare is the planner alone
        (["--auto-attainment", "0.995"], f"--auto-attainment 0.995: {AUTO_ONLY}"),
        (["--compare", "planner", "static:peak", "hpa", "--auto-attainment", "1"], f"--auto-attainment 1: {AUTO_ONLY}"),
        (["--compare", "static:1", "--attainment-target", "0.99"], f"--attainment-target 0.99: {PLANNER_ONLY}"),
        (
            ["--compare", "throughput-only", "hpa", "--attainment-target", "off"],
            f"--attainment-target off: {PLANNER_ONLY}",
        ),
        (["--compare", "static:1", "--warm-start", TRACE], f"--warm-start {TRACE}: {WARM_ONLY}"),
        (["--compare", "hpa:kv:0.5", "saturation", "--warm-start", TRACE], f"--warm-start {TRACE}: {WARM_ONLY}"),
        (["--compare", "static:1", "schedule:0=2", "--initial-replicas", "3"], f"--initial-replicas 3: {INITIAL_ONLY}"),
        # several: the first of POLICY_FLAGS' order is named
        (
            ["--compare", "static:peak", "--initial-replicas", "3", "--attainment-target", "0.99"],
            f"--attainment-target 0.99: {PLANNER_ONLY}",
        ),
    ],
)
def test_a_policy_flag_no_compared_policy_reads_is_refused_before_running(capsys, monkeypatch, tmp_path, argv, message):
    _no_sim(monkeypatch)
    out = tmp_path / "out"
    rc = cli_main(["simulate", "--trace", TRACE, "--quiet", "--out", str(out), *argv])
    cap = capsys.readouterr()
    assert (rc, cap.out, cap.err) == (2, "", f"dynoplan simulate: error: {message}\n")
    assert not out.exists()  # refused before --out was created


@pytest.mark.parametrize(
    "argv",
    [
        ["--attainment-target", "0.99"],  # no --compare: the planner alone
        ["--compare", "static:1", " planner:load_enabled=true ", "--attainment-target", "0.99"],
        ["--compare", "throughput-only", "--warm-start", TRACE],
        ["--compare", "hpa:running", "--initial-replicas", "2"],
        ["--compare", "static:1", "saturation", "--initial-replicas", "2"],
    ],
)
def test_a_policy_flag_some_compared_policy_reads_is_taken(monkeypatch, argv):
    _no_sim(monkeypatch)
    with pytest.raises(AssertionError, match="simulated"):  # reached build_context: the flag passed the check
        cli_main(["simulate", "--trace", TRACE, "--quiet", *argv])


def test_trace_given_twice_is_refused_naming_both(capsys):
    # was: the last --trace simulated, the first silently dropped
    with pytest.raises(SystemExit) as e:
        cli_main(["simulate", "--trace", TRACE, "--quiet", "--trace", "b.jsonl"])
    cap = capsys.readouterr()
    assert (e.value.code, cap.out) == (2, "")
    assert cap.err == (
        f"dynoplan simulate: error: argument --trace: given twice ({TRACE!r} and 'b.jsonl'), expected it once "
        "(see --help)\n"
    )


def test_absurd_dp_sizes_are_refused(capsys):
    with pytest.raises(SystemExit) as e:  # was: 1e5 ranks per worker accepted
        cli_main(["simulate", "--trace", TRACE, "--quiet", "--dp-size", "100000"])
    cap = capsys.readouterr()
    assert (e.value.code, cap.out) == (2, "")
    assert cap.err == (
        "dynoplan simulate: error: argument --dp-size: '100000': expected a DP size between 1 and 1024 (ranks per "
        "worker, each at least one GPU) (see --help)\n"
    )
    # the baselines grow a pool to --max-replicas workers of --dp-size ranks each
    rc = cli_main(["simulate", "--trace", TRACE, "--quiet", "--dp-size", "1024", "--max-replicas", "65"])
    cap = capsys.readouterr()
    assert (rc, cap.out) == (2, "")
    assert cap.err == (
        "dynoplan simulate: error: --max-replicas=65 x --dp-size=1024 = 66560 engine cores in one pool (each DP "
        "rank is a scheduler and KV cache built up front, and at least one GPU); expected at most 65536: fewer "
        "workers or a smaller DP size\n"
    )


def test_the_initial_sizings_window_holds_at_most_the_hour_of_bins_the_sample_uses():
    from mocker.records import TraceRequest
    from planner.sim.runner import first_window

    reqs = [TraceRequest(i, 500.0 * i, 100, 10) for i in range(60)]  # 2 requests/s for 30 s
    # 3605 s: 360 whole 10 s bins ending at 3605 s, the partial oldest one left out, as before
    w = first_window(reqs, 3605.0, 500.0, 50.0)
    # (5, 15], (15, 25], (25, 35]: arrivals 5.5 .. 15, 15.5 .. 25, 25.5 .. 29.5 s (the 11 at 0 .. 5 s are older)
    assert w is not None and w.arrival_counts == (20.0, 20.0, 9.0) + (0.0,) * 357
    w = first_window(reqs, 180.0, 500.0, 50.0)
    # (0, 10], (10, 20], (20, 30]: the arrival at 0 s is in none of them (a range query's first increase)
    assert w is not None and w.arrival_counts == (20.0, 20.0, 19.0) + (0.0,) * 15
    # was: interval / 10 bins, 1e299 of them for an interval of 1e300 s (grew until the kernel killed it)
    w = first_window(reqs, 1e300, 500.0, 50.0)
    assert w is not None and (w.num_requests, w.arrival_counts) == (60.0, ())


def test_an_adjustment_interval_of_1e300_runs_in_bounded_memory(tmp_path, profile):
    import resource
    import subprocess
    import sys

    def limit() -> None:  # 3 GB of address space: a regression dies here instead of taking the machine
        resource.setrlimit(resource.RLIMIT_AS, (3_000_000_000, 3_000_000_000))

    out = tmp_path / "o"
    cmd = [sys.executable, "-m", "planner.cli", "simulate", "--trace", "synthetic:constant?rate=2&num_requests=60"]
    cmd += ["--profile", profile, "--planner-set", "adjustment_interval_s=1e300", "--out", str(out), "--quiet"]
    done = subprocess.run(cmd, capture_output=True, text=True, preexec_fn=limit, timeout=600)
    assert (done.returncode, done.stderr) == (0, "")
    summary = json.loads((out / "summary.json").read_text())["policies"]["planner"]
    # 60 requests of the default synthetic sizes at 2/s: one worker serves them all within the SLA
    assert (summary["sla_attainment"], summary["max_replicas"]) == (1.0, {"agg": 1})


def test_a_config_given_twice_is_refused_and_the_lists_stay_repeatable(capsys):
    from planner.cli import build_parser

    # was: b.yaml read, a.yaml silently dropped
    with pytest.raises(SystemExit) as e:
        cli_main(["simulate", "--trace", TRACE, "--config", "a.yaml", "--quiet", "--config", "b.yaml"])
    cap = capsys.readouterr()
    assert (e.value.code, cap.out) == (2, "")
    assert cap.err == (
        "dynoplan simulate: error: argument --config: given twice ('a.yaml' and 'b.yaml'), expected it once "
        "(see --help)\n"
    )
    # the lists add up, a switch may be repeated
    args = build_parser().parse_args(
        ["simulate", "--trace", TRACE, "--planner-set", "ttft_ms=300", "--compare", "planner", "--planner-set",
         "itl_ms=20", "--compare", "static:1", "static:2", "--quiet", "--quiet"]
    )  # fmt: skip
    assert (args.planner_set, args.compare, args.quiet) == (
        ["ttft_ms=300", "itl_ms=20"],
        ["planner", "static:1", "static:2"],
        True,
    )


def test_a_workers_flag_given_twice_in_a_stack_file_is_refused_before_anything_starts():
    from mocker.arguments import WorkerArgvError, worker_from_argv

    # the worker refuses a flag given twice, so the stack's reading of its engine does too; the local connector
    # gives --worker-type itself
    with pytest.raises(WorkerArgvError) as e:
        worker_from_argv(["--speedup-ratio", "10", "--speedup-ratio", "20"])
    assert str(e.value) == "argument --speedup-ratio: given twice (10.0 and 20.0), expected it once"
    with pytest.raises(WorkerArgvError) as e:
        worker_from_argv(["--worker-type", "decode"], "prefill")
    assert str(e.value) == "argument --worker-type: given twice ('prefill' and 'decode'), expected it once"
    assert worker_from_argv(["--speedup-ratio", "10"], "decode").engine.worker_type == "decode"
