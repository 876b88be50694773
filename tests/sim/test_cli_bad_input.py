"""``dynoplan simulate`` / ``dynoplan profile`` bad input: one line on stderr, exit 2, nothing simulated first."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from planner.cli import main as cli_main

AZURE = Path(__file__).resolve().parents[2] / "examples" / "traces" / "azure_llm_conv_2023.csv"
TRACE = "synthetic:poisson?rate=2&duration_s=20&isl=256&osl=16&seed=1"


def _one_line(capsys, rc: int, *needles: str) -> str:
    err = capsys.readouterr().err
    assert rc == 2, err
    assert len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err
    for n in needles:
        assert n in err, err
    return err


def test_out_existing_file_rejected_before_simulating(tmp_path, capsys, monkeypatch):
    import planner.cli_simulate as cs

    def boom(args):  # build_context runs the (expensive) profile sweep: must not be reached
        raise AssertionError("simulation started before --out was validated")

    monkeypatch.setattr(cs, "build_context", boom)
    f = tmp_path / "file.txt"
    f.write_text("keep me")
    rc = cli_main(["simulate", "--trace", TRACE, "--quiet", "--out", str(f)])
    _one_line(capsys, rc, "--out", str(f), "not a directory")
    assert f.read_text() == "keep me"


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write into a read-only directory")
def test_out_unwritable_rejected_before_simulating(tmp_path, capsys, monkeypatch):
    import planner.cli_simulate as cs

    monkeypatch.setattr(cs, "build_context", lambda a: (_ for _ in ()).throw(AssertionError("simulated")))
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        rc = cli_main(["simulate", "--trace", TRACE, "--quiet", "--out", str(ro / "sub")])
    finally:
        ro.chmod(0o700)
    _one_line(capsys, rc, "--out", "not a writable directory")


def test_out_under_a_file_rejected_before_simulating(tmp_path, capsys, monkeypatch):
    import planner.cli_simulate as cs

    monkeypatch.setattr(cs, "build_context", lambda a: (_ for _ in ()).throw(AssertionError("simulated")))
    f = tmp_path / "file.txt"
    f.write_text("x")
    rc = cli_main(["simulate", "--trace", TRACE, "--quiet", "--out", str(f / "sub")])
    _one_line(capsys, rc, "--out", "not a writable directory")


@pytest.mark.parametrize("value", ["2", "0", "-0.5", "1.0000001", "nan", "x"])
def test_auto_attainment_outside_0_1_rejected_at_parse_time(capsys, value):
    with pytest.raises(SystemExit) as e:
        cli_main(["simulate", "--trace", TRACE, "--quiet", "--auto-attainment", value])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--auto-attainment" in err and "0 < F <= 1" in err and len(err.strip().splitlines()) == 1


def test_auto_attainment_1_accepted_by_the_parser():
    from planner.cli import build_parser

    args = build_parser().parse_args(["simulate", "--trace", TRACE, "--auto-attainment", "1"])
    assert args.auto_attainment == 1.0


@pytest.mark.parametrize(
    "argv, needles",
    [
        # default planner settings of simulate: max_gpu_budget 64, min_replicas 1, 1 GPU per engine
        (["--initial-replicas", "99999"], ("agg=99999", "1 <= N <= 64", "max_gpu_budget=64")),
        (["--initial-replicas", "65"], ("agg=65", "1 <= N <= 64")),
        (["--initial-replicas", "0"], ("agg=0", "1 <= N <= 64")),
        (["--mode", "disagg", "--initial-replicas", "40+30"], ("70 GPUs", "max_gpu_budget=64")),
        (["--planner-set", "max_gpu_budget=8", "--initial-replicas", "9"], ("agg=9", "1 <= N <= 8")),
    ],
)
def test_initial_replicas_out_of_planner_bounds_rejected(capsys, monkeypatch, argv, needles):
    import planner.sim.profile as prof

    monkeypatch.setattr(prof, "profile_engine", lambda *a, **k: (_ for _ in ()).throw(AssertionError("profiled")))
    rc = cli_main(["simulate", "--trace", TRACE, "--quiet", *argv])
    _one_line(capsys, rc, "--initial-replicas", *needles)


def test_initial_replicas_check_accepts_the_bounds():
    from planner.core import PlannerConfig
    from planner.sim.runner import check_initial

    cfg = PlannerConfig(mode="disagg", max_gpu_budget=8)
    check_initial({"prefill": 1, "decode": 7}, cfg)  # 8 GPUs == budget
    check_initial(None, cfg)


PROFILE_GRID = ["--isl", "128,512", "--kv-usage", "0.01,0.1", "--context", "256,1024"]


def test_profile_out_without_suffix_prints_the_written_path(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "500")
    rc = cli_main(["profile", "--out", str(tmp_path / "x"), *PROFILE_GRID])
    err = capsys.readouterr().err
    assert rc == 0, err
    assert (tmp_path / "x.npz").is_file() and not (tmp_path / "x").exists()
    assert f"wrote {tmp_path / 'x.npz'}:" in err


def test_profile_out_with_suffix_is_kept(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "500")
    assert cli_main(["profile", "--out", str(tmp_path / "p.npz"), *PROFILE_GRID]) == 0
    assert f"wrote {tmp_path / 'p.npz'}:" in capsys.readouterr().err
    assert sorted(x.name for x in tmp_path.iterdir()) == ["p.npz"]


@pytest.mark.parametrize(
    "make, needle",
    [
        (lambda t: (t / "d").mkdir() or t / "d", "is a directory"),
        (lambda t: (t / "d.npz").mkdir() or t / "d.npz", "is a directory"),
        (lambda t: (t / "d2.npz").mkdir() or t / "d2", "is a directory"),
        (lambda t: t / "missing" / "p.npz", "parent directory"),
    ],
)
def test_profile_bad_out_rejected_before_the_sweep(tmp_path, capsys, monkeypatch, make, needle):
    import planner.sim.profile as prof

    monkeypatch.setattr(prof, "profile_engine", lambda *a, **k: (_ for _ in ()).throw(AssertionError("profiled")))
    rc = cli_main(["profile", "--out", str(make(tmp_path)), *PROFILE_GRID])
    _one_line(capsys, rc, "--out", needle)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (a device whose writes fail: ENOSPC)")
def test_a_full_disk_under_out_names_the_file_and_keeps_the_results(tmp_path, capsys):
    out = tmp_path / "out"
    rc = cli_main(["simulate", "--trace", TRACE, "--compare", "static:1", "--quiet", "--out", str(out)])
    assert rc == 0
    first = {n: (out / n).read_bytes() for n in ("summary.json", "details.json", "timeline.csv", "report.html")}
    capsys.readouterr()
    # the outputs are written beside their names first: every write of the hidden timeline.csv fails with ENOSPC
    (out / ".timeline.csv.partial").symlink_to("/dev/full")
    rc = cli_main(["simulate", "--trace", TRACE, "--compare", "static:2", "--quiet", "--out", str(out)])
    cap = capsys.readouterr()
    assert rc == 2
    err = cap.err.strip().splitlines()
    assert err == [
        f"dynoplan simulate: error: --out {out}: cannot write {out / 'timeline.csv'}: No space left on device "
        "(results printed to stdout above), expected a writable directory"
    ]
    assert '"static:2"' in cap.out  # the summary JSON on stdout: nothing recorded is lost
    # all or none: the first run's outputs are whole (summary.json was written before the failing file, but
    # only beside its name), and no hidden file is left
    assert {n: (out / n).read_bytes() for n in first} == first
    assert sorted(p.name for p in out.iterdir()) == [
        "details.json",
        "report.html",
        "requests.jsonl",
        "summary.json",
        "timeline.csv",
    ]


def test_an_output_name_taken_by_a_directory_fails_before_any_output_is_replaced(tmp_path, capsys):
    out = tmp_path / "out"
    rc = cli_main(["simulate", "--trace", TRACE, "--compare", "static:1", "--quiet", "--out", str(out)])
    assert rc == 0
    summary = (out / "summary.json").read_bytes()
    capsys.readouterr()
    (out / "report.html").unlink()
    (out / "report.html").mkdir()  # the last output's name is a directory: its rename would fail
    rc = cli_main(["simulate", "--trace", TRACE, "--compare", "static:2", "--quiet", "--out", str(out)])
    cap = capsys.readouterr()
    assert rc == 2 and len(cap.err.strip().splitlines()) == 1
    assert f"cannot write {out / 'report.html'}: Is a directory" in cap.err
    assert (out / "summary.json").read_bytes() == summary  # not replaced by the second run's
    assert not [p for p in out.iterdir() if p.name.endswith(".partial")]


@pytest.mark.parametrize(
    "argv, needle",
    [
        # a slow synthetic rate: the time limit holds whatever --sample-interval-s keeps the samples under their cap
        (
            ["--trace", "synthetic:poisson?rate=1e-9&num_requests=3&seed=1", "--sample-interval-s", "70000"],
            "--trace synthetic:poisson?rate=1e-9&num_requests=3&seed=1: the trace spans",
        ),
        (
            ["--trace", str(AZURE), "--arrival-speedup", "1e-4"],
            "the trace spans 3.50172e+07 s after --arrival-speedup=0.0001",
        ),
    ],
)
def test_a_workload_past_the_time_limit_is_refused_before_simulating(capsys, argv, needle):
    rc = cli_main(["simulate", *argv, "--quiet"])
    _one_line(capsys, rc, needle, "past the simulator's limit of 4.504e+06 s")


def test_a_kv_cache_too_small_to_profile_names_the_flags_simulate_has(capsys):
    # 2 blocks of vLLM's default 64 tokens hold 128 tokens: no context of the default grid (128 ... 16384) fits
    # with 16 decode tokens in 90 % of it; simulate has no --context flag to change the grid
    rc = cli_main(["simulate", "--trace", TRACE, "--num-gpu-blocks", "2", "--quiet"])
    err = _one_line(capsys, rc, "0 length(s) fit the KV cache of 128 tokens", "--num-gpu-blocks or --block-size")
    assert "--profile FILE from dynoplan profile --context" in err


def test_a_planner_section_beside_other_settings_is_refused_naming_them(tmp_path, capsys):
    alone = tmp_path / "alone.yaml"
    alone.write_text("planner:\n  ttft_ms: 300\n")
    assert cli_main(["simulate", "--trace", TRACE, "--config", str(alone), "--compare", "static:1", "--quiet"]) == 0
    capsys.readouterr()
    mixed = tmp_path / "mixed.yaml"
    mixed.write_text("planner:\n  ttft_ms: 300\nitl_ms: 20\n")
    rc = cli_main(["simulate", "--trace", TRACE, "--config", str(mixed), "--compare", "static:1", "--quiet"])
    _one_line(capsys, rc, f"--config {mixed}: planner: a section beside other keys (itl_ms)", "either all under")


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--planner-set", "prefill.min_replicas=2"], "--planner-set prefill_min_replicas=2: mode agg has no prefill"),
        (
            ["--compare", "planner:prefill.min_replicas=2"],
            "policy 'planner:prefill.min_replicas=2': prefill_min_replicas=2: mode agg has no prefill pool",
        ),
        (
            ["--mode", "disagg", "--compare", "planner:agg_max_replicas=3"],
            "agg_max_replicas=3: mode disagg has no agg pool, expected a setting of prefill or decode",
        ),
    ],
)
def test_a_pool_setting_of_a_pool_the_mode_lacks_is_refused(capsys, argv, needle):
    rc = cli_main(["simulate", "--trace", TRACE, *argv, "--quiet"])
    _one_line(capsys, rc, needle)


@pytest.mark.parametrize(
    "flag, value, follows",
    [
        ("--isl", "500,100", "100 follows 500"),
        ("--context", "100,200,200", "200 follows 200"),
        ("--kv-usage", "0.1,0.1", "0.1 follows 0.1"),
    ],
)
def test_a_profile_grid_out_of_order_names_its_flag(tmp_path, capsys, flag, value, follows):
    # was: the sweep's own field after the flags were taken, "isl_tokens=(500, 100): expected strictly increasing..."
    with pytest.raises(SystemExit) as e:
        cli_main(["profile", "--out", str(tmp_path / "p.npz"), flag, value])
    cap = capsys.readouterr()
    assert (e.value.code, cap.out) == (2, "")
    assert cap.err == (
        f"dynoplan profile: error: argument {flag}: {value!r}: expected strictly increasing points, {follows} "
        "(see --help)\n"
    )
    assert not (tmp_path / "p.npz").exists()
