"""`dynoplan replay` run as a user runs it: error paths (one stderr line, exit 2) and end-to-end outputs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from planner.cli import main

ROOT = Path(__file__).resolve().parents[1]
SMALL = (
    "synthetic:poisson?rate=40&num_requests=150&isl=uniform:50:3000&osl=uniform:1:60&prefix_groups=3&prefix_len=1024"
)


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        rc = main(["replay", *argv])
    except SystemExit as e:  # argparse errors exit through parser.error
        rc = int(e.code or 0)
    out, err = capsys.readouterr()
    return rc, out, err


def assert_one_line_error(rc: int, err: str, *needles: str) -> None:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2, err
    assert len(lines) == 1, err
    assert "Traceback" not in err
    assert lines[0].startswith("dynoplan replay: error: ")
    for n in needles:
        assert n in lines[0], lines[0]


def csv_trace(tmp_path: Path, rows: str) -> Path:
    p = tmp_path / "t.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + rows)
    return p


# ---------------------------------------------------------------------------------------------- user mistakes
def test_missing_trace_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = cli(capsys, "--trace", str(tmp_path / "nope.csv"))
    assert_one_line_error(rc, err, "nope.csv", "not found")


def test_missing_trace_flag(capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = cli(capsys)
    assert_one_line_error(rc, err, "--trace")


def test_malformed_csv_row(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = csv_trace(tmp_path, "2023-11-16 18:15:46.0,374,44\n2023-11-16 18:15:47.0,-5,44\n")
    rc, _, err = cli(capsys, "--trace", str(p))
    assert_one_line_error(rc, err, f"{p}:3", "ContextTokens", "-5")


def test_malformed_jsonl_row(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "t.jsonl"
    p.write_text('{"timestamp": 0, "input_length": 10, "output_length": 2}\n{"timestamp": 1, "output_length": 2}\n')
    rc, _, err = cli(capsys, "--trace", str(p))
    assert_one_line_error(rc, err, f"{p}:2", "input_length", "missing")


@pytest.mark.parametrize(
    "ids, field, value",
    [
        ('[1, "a"]', "'hash_ids[1]'", "'a'"),
        ("[0, 1.5]", "'hash_ids[1]'", "1.5"),
        ("[-1]", "'hash_ids[0]'", "-1"),
        ('"x"', "'hash_ids'", "'x'"),
    ],
)
def test_a_bad_hash_id_is_named_with_its_index_and_value(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], ids: str, field: str, value: str
) -> None:
    p = tmp_path / "t.jsonl"
    p.write_text(f'{{"timestamp": 0, "input_length": 1000, "output_length": 2, "hash_ids": {ids}}}\n')
    rc, _, err = cli(capsys, "--trace", str(p), "--quiet")
    assert_one_line_error(rc, err, f"{p}:1", f"field {field} {value}: expected a")


def test_bad_synthetic_spec(capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = cli(capsys, "--trace", "synthetic:poisson?rate=0&num_requests=5")
    assert_one_line_error(rc, err, "rate")


@pytest.mark.parametrize(
    "yaml_text, needles",
    [
        ("engine: [unclosed\n", ("cannot parse engine config file at line 2, column 1",)),
        ("num_gpu_blocks: -4\n", ("num_gpu_blocks=-4: expected > 0",)),
        ("num_gpu_blocks: true\n", ("num_gpu_blocks=true: expected an integer",)),  # a bool is not an int
        ("engine: {backend: tpu}\n", ("engine=\"tpu\": expected one of 'vllm', 'trtllm' or 'sglang'",)),
        ("colour: blue\n", ("colour: unknown setting",)),
        ("num_gpu_blcks: 8\n", ("num_gpu_blcks: unknown setting (did you mean num_gpu_blocks?)",)),
        ("- 1\n- 2\n", ("mapping",)),
        ("engine: {block_size: 16}\nblock_size: 32\n", ("block_size", "both under engine:", "16", "32")),
        ("engine: {backend: vllm, max_num_seqs: 4}\nbackend: sglang\n", ("backend", "both under engine:")),
        # quoted booleans are strings (a non-empty "false" used to read as true)
        ('enable_prefix_caching: "false"\n', ('enable_prefix_caching="false"', "expected a boolean (true/false)")),
        ("enable_chunked_prefill: 0\n", ("enable_chunked_prefill=0", "expected a boolean")),
        # the same finiteness rule as the --speedup-ratio flag
        ("speedup_ratio: .inf\n", ("speedup_ratio=.inf: expected a finite number",)),
        ("speedup_ratio: .nan\n", ("speedup_ratio=.nan: expected a finite number",)),
        ("speedup_ratio: 0\n", ("speedup_ratio=0: expected > 0",)),
        ("bw_g1_g2_gbps: .inf\n", ("bw_g1_g2_gbps=.inf: expected a finite number",)),
        ("gpu_memory_fraction: .nan\n", ("gpu_memory_fraction=.nan: expected a finite number",)),
        ("gpu_memory_fraction: 1.5\n", ("gpu_memory_fraction=1.5: expected <= 1",)),
        (
            "engine: {backend: sglang, sglang: {init_new_token_ratio: .inf}}\n",
            ("engine.sglang.init_new_token_ratio=.inf: expected a finite number",),
        ),
        (
            "engine: {backend: sglang, sglang: {schedule_conservativeness: -1}}\n",
            ("sglang.schedule_conservativeness=-1: expected >= 0.0",),
        ),
        (
            "engine: {backend: sglang, sglang: {chunked_prefill_size: 0}}\n",
            ("sglang.chunked_prefill_size=0: expected > 0",),
        ),
    ],
)
def test_bad_engine_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], yaml_text: str, needles: tuple[str, ...]
) -> None:
    y = tmp_path / "engine.yaml"
    y.write_text(yaml_text)
    rc, _, err = cli(capsys, "--trace", SMALL, "--engine-config", str(y))
    assert_one_line_error(rc, err, "engine.yaml", *needles)


def test_engine_config_nested_and_flat_without_overlap_still_merge() -> None:
    from mocker.config import EngineConfig

    cfg = EngineConfig.from_mapping({"engine": {"backend": "vllm", "block_size": 16}, "max_num_seqs": 4})
    assert (cfg.engine, cfg.block_size, cfg.max_num_seqs) == ("vllm", 16, 4)


def test_planner_profile_as_timing_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    prof = tmp_path / "planner.npz"
    assert (
        main(["profile", "--out", str(prof), "--isl", "128,512", "--kv-usage", "0.01,0.1", "--context", "256,1024"])
        == 0
    )
    capsys.readouterr()
    rc, _, err = cli(capsys, "--trace", SMALL, "--quiet", "--timing", str(prof))
    assert_one_line_error(
        rc,
        err,
        "planner.npz",
        "looks like a planner performance profile",
        "engine timing profile",
        "decode_active_kv_tokens, decode_context_length, decode_itl",
        "simulate --profile",
    )
    other = tmp_path / "other.npz"
    import numpy as np

    np.savez(other, prefill_isl=np.array([1.0]))
    rc, _, err = cli(capsys, "--trace", SMALL, "--quiet", "--timing", str(other))
    assert_one_line_error(rc, err, "other.npz", "missing arrays prefill_ttft_ms")
    assert "planner performance profile" not in err


def test_engine_config_missing_or_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = cli(capsys, "--trace", SMALL, "--engine-config", str(tmp_path / "none.yaml"))
    assert_one_line_error(rc, err, "none.yaml", "cannot read engine config file: No such file or directory")
    rc, _, err = cli(capsys, "--trace", SMALL, "--engine-config", str(tmp_path))
    assert_one_line_error(rc, err, str(tmp_path), "cannot read engine config")


@pytest.mark.parametrize(
    "argv, needles",
    [
        (["--router", "random"], ("--router", "invalid choice", "'random'")),
        (["--engine", "tpu"], ("--engine", "invalid choice", "'tpu'")),
        (["--workers", "0"], ("--workers", "positive integer")),
        (["--workers", "-3"], ("--workers", "positive integer")),
        (["--workers", "two"], ("--workers", "'two'")),
        (["--block-size", "0"], ("--block-size",)),
        (["--arrival-speedup", "0"], ("--arrival-speedup", "> 0")),
        (["--arrival-speedup", "nan"], ("--arrival-speedup",)),
        (["--sla-ttft-ms", "-1"], ("--sla-ttft-ms", "> 0")),
        (["--preemption-mode", "random"], ("--preemption-mode",)),
        (["--max-num-batched-tokens", "16"], ("max_num_batched_tokens=16", "block_size=64")),
        (["--timing", "missing.npz"], ("timing='missing.npz'", "not found")),
        (["--timing", "cubic"], ("timing='cubic'",)),
    ],
)
def test_bad_flags(capsys: pytest.CaptureFixture[str], argv: list[str], needles: tuple[str, ...]) -> None:
    rc, _, err = cli(capsys, "--trace", SMALL, *argv)
    assert_one_line_error(rc, err, *needles)


def test_real_process_error_has_no_traceback(tmp_path: Path) -> None:
    p = csv_trace(tmp_path, "2023-11-16 18:15:46.0,374,44\nnot-a-time,374,44\n")
    proc = subprocess.run(
        [sys.executable, "-m", "planner.cli", "replay", "--trace", str(p), "--workers", "2"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "Traceback" not in proc.stderr
    assert f"{p}:3" in proc.stderr and "TIMESTAMP" in proc.stderr


@pytest.mark.parametrize("quiet", [True, False])
def test_real_process_outputs_complete(tmp_path: Path, capsys: pytest.CaptureFixture[str], quiet: bool) -> None:
    # the console entry point ends the process without the interpreter's teardown (os._exit): every output
    # is complete and equal to an in-process run's, the table on a pipe included, and the exit code kept
    out = ["--report-json", str(tmp_path / "p.json"), "--per-request", str(tmp_path / "p.jsonl")]
    proc = subprocess.run(
        [sys.executable, "-m", "planner.cli", "replay", "--trace", SMALL, "--workers", "2", *out]
        + (["--quiet"] if quiet else []),
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    rc, table, _ = cli(capsys, "--trace", SMALL, "--workers", "2", "--report-json", str(tmp_path / "i.json"))
    assert rc == 0 and (proc.stdout == "" if quiet else proc.stdout == table and "latency (ms)" in table)
    assert (tmp_path / "p.json").read_bytes() == (tmp_path / "i.json").read_bytes()
    rows = (tmp_path / "p.jsonl").read_bytes().splitlines()
    assert len(rows) == 150 and [json.loads(r)["request_id"] for r in rows] == list(range(150))
    if not os.path.exists("/dev/full"):
        return
    bad = subprocess.run(
        [sys.executable, "-m", "planner.cli", "replay", "--trace", SMALL, "--quiet"]
        + ["--per-request", "/dev/full"],  # every write fails (a full disk): the report goes to stdout, exit 2
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert bad.returncode == 2 and "report printed to stdout" in bad.stderr
    assert json.loads(bad.stdout)["completed_requests"] == 150


def test_flags_override_yaml(tmp_path: Path) -> None:
    from mocker.arguments import engine_config_from_args
    from planner.cli import build_parser

    y = tmp_path / "e.yaml"
    y.write_text("engine:\n  backend: vllm\n  num_gpu_blocks: 100\n  block_size: 16\n  max_num_seqs: 8\n")
    args = build_parser().parse_args(
        [
            "replay",
            "--trace",
            "x",
            "--engine-config",
            str(y),
            "--max-num-seqs",
            "4",
            "--no-prefix-caching",
            "--trace-block-size",
            "64",
        ]
    )
    cfg = engine_config_from_args(args)
    assert (cfg.num_gpu_blocks, cfg.block_size, cfg.max_num_seqs) == (100, 16, 4)
    assert cfg.enable_prefix_caching is False and cfg.enable_chunked_prefill is True
    assert cfg.trace_block_size == 64


# ---------------------------------------------------------------------------------------------- end to end
def run_ok(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    rc, out, err = cli(capsys, *argv)
    assert rc == 0, err
    return out


def test_end_to_end_outputs_and_determinism(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    outs = []
    for k in range(2):
        rj, pr = tmp_path / f"r{k}.json", tmp_path / f"p{k}.jsonl"
        out = run_ok(
            capsys,
            "--trace",
            SMALL,
            "--workers",
            "3",
            "--router",
            "kv",
            "--seed",
            "5",
            "--sla-ttft-ms",
            "500",
            "--sla-itl-ms",
            "50",
            "--report-json",
            str(rj),
            "--per-request",
            str(pr),
        )
        outs.append((rj.read_bytes(), pr.read_bytes()))
        assert "TTFT" in out and "requests (completed / total)" in out
    assert outs[0] == outs[1]  # byte-identical report JSON and per-request JSONL
    rep = json.loads(outs[0][0])
    assert rep["num_requests"] == 150 and rep["completed_requests"] == 150
    assert rep["num_workers"] == 3 and 0 <= rep["goodput_completed_requests"] <= 150
    rows = [msgspec.json.decode(x) for x in outs[0][1].splitlines()]
    assert [r["request_id"] for r in rows] == list(range(150))
    assert {r["worker_id"] for r in rows} <= {0, 1, 2}
    assert sum(r["num_output_tokens"] for r in rows) == rep["total_output_tokens"]
    assert all(r["status"] == "finished" and r["ttft_ms"] > 0 for r in rows)


@pytest.mark.parametrize("flag", ["--report-json", "--per-request"])
def test_an_output_that_is_a_directory_is_refused_before_the_replay(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, flag: str
) -> None:
    import mocker.fleet

    # was: the whole replay ran, the other output replaced, then exit 2
    monkeypatch.setattr(mocker.fleet, "run_replay", lambda *a, **k: pytest.fail("replayed"))
    prev = tmp_path / "prev.json"
    prev.write_text("earlier\n")
    other = "--per-request" if flag == "--report-json" else "--report-json"
    rc, out, err = cli(capsys, "--trace", SMALL, "--quiet", flag, str(tmp_path), other, str(prev))
    assert (rc, out, err) == (
        2,
        "",
        f"dynoplan replay: error: {flag} {tmp_path}: is a directory, expected a file path\n",
    )
    assert prev.read_text() == "earlier\n"


@pytest.mark.skipif(not os.path.isdir("/sys"), reason="needs sysfs (no file can be created in /sys, even as root)")
def test_an_output_in_a_directory_that_takes_no_file_is_refused_before_the_replay(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import mocker.fleet

    monkeypatch.setattr(mocker.fleet, "run_replay", lambda *a, **k: pytest.fail("replayed"))
    rc, out, err = cli(capsys, "--trace", SMALL, "--quiet", "--per-request", "/sys/r.jsonl")
    assert (rc, out) == (2, "")
    assert err == (
        "dynoplan replay: error: --per-request /sys/r.jsonl: cannot create a file in /sys: Permission denied, "
        "expected a writable directory\n"
    )


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (a device whose writes fail: ENOSPC)")
@pytest.mark.parametrize("full", ["--report-json", "--per-request"])
def test_a_failed_write_replaces_no_earlier_output_and_prints_the_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], full: str
) -> None:
    prev = {"--report-json": tmp_path / "r.json", "--per-request": tmp_path / "req.jsonl"}
    run_ok(
        capsys,
        "--trace",
        SMALL,
        "--quiet",
        "--report-json",
        str(prev["--report-json"]),
        "--per-request",
        str(prev["--per-request"]),
    )
    before = {f: p.read_bytes() for f, p in prev.items()}
    # the other output is a file of the earlier run; this one a device whose every write fails (a full disk)
    other = next(f for f in prev if f != full)
    rc, out, err = cli(
        capsys, "--trace", SMALL, "--quiet", "--workers", "3", full, "/dev/full", other, str(prev[other])
    )
    # was: the earlier run's other file replaced by this run's, then exit 2
    assert (rc, err) == (
        2,
        f"dynoplan replay: error: cannot write {full} /dev/full: No space left on device (report printed to stdout; "
        "no output replaced)\n",
    )
    assert json.loads(out)["completed_requests"] == 150  # --quiet: stdout is exactly the report
    assert {f: p.read_bytes() for f, p in prev.items()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json", "req.jsonl"]  # no hidden file left


def test_outputs_replace_the_earlier_ones_whole_through_a_link_and_into_a_device(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "kept.jsonl"
    target.write_text("earlier\n")
    target.chmod(0o600)
    link = tmp_path / "link.jsonl"
    link.symlink_to(target)
    run_ok(capsys, "--trace", SMALL, "--quiet", "--per-request", str(link), "--report-json", os.devnull)
    # the link is kept and its file replaced, with its permission bits; /dev/null is written in place, still a device
    assert link.is_symlink() and target.read_bytes().count(b"\n") == 150 and (target.stat().st_mode & 0o777) == 0o600
    assert Path(os.devnull).is_char_device()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept.jsonl", "link.jsonl"]


def test_arrival_speedup_and_max_time(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = "synthetic:constant?rate=2&num_requests=40&isl=200&osl=5"
    base, fast, cut = tmp_path / "base.jsonl", tmp_path / "fast.jsonl", tmp_path / "cut.json"
    run_ok(capsys, "--trace", spec, "--quiet", "--per-request", str(base))
    run_ok(capsys, "--trace", spec, "--quiet", "--arrival-speedup", "4", "--per-request", str(fast))
    b = [msgspec.json.decode(x) for x in base.read_bytes().splitlines()]
    f = [msgspec.json.decode(x) for x in fast.read_bytes().splitlines()]
    assert [r["arrival_ms"] for r in b] == [500.0 * i for i in range(40)]
    assert [r["arrival_ms"] for r in f] == [125.0 * i for i in range(40)]
    # stop at 10 simulated seconds: arrivals at 0..9.5 s exist, the later ones never arrive
    run_ok(capsys, "--trace", spec, "--quiet", "--max-time-s", "10", "--report-json", str(cut))
    rep = json.loads(cut.read_text())
    assert rep["num_requests"] == 40
    assert 0 < rep["completed_requests"] <= 20 and rep["duration_ms"] <= 10_000.0


def test_prompts_that_never_fit_are_reported_on_stderr(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # 2 blocks x 64 tokens = 128 tokens of KV cache; the 600-token prompts can never be admitted
    rj = tmp_path / "r.json"
    rc, out, err = cli(
        capsys,
        "--trace",
        "synthetic:constant?rate=2&num_requests=3&isl=600&osl=20",
        "--num-gpu-blocks",
        "2",
        "--quiet",
        "--report-json",
        str(rj),
    )
    assert rc == 0 and out == ""
    assert err == (
        "dynoplan replay: warning: 3 of 3 requests failed: prompt + output tokens that can never fit in a "
        "worker's KV cache (largest failed request: 600 prompt + 20 output = 620 tokens; num_gpu_blocks=2 "
        "x block_size=64 = 128 tokens); "
        "they count as not completed\n"
    )
    rep = json.loads(rj.read_text())
    assert (rep["num_requests"], rep["completed_requests"]) == (3, 0)
    rc, out, err = cli(
        capsys, "--trace", "synthetic:constant?rate=2&num_requests=3&isl=600&osl=20", "--num-gpu-blocks", "2"
    )
    ttft_row = next(ln for ln in out.splitlines() if "TTFT" in ln)
    assert [c.strip() for c in ttft_row.split("\u2502")[1:-1]] == ["TTFT"] + ["-"] * 6  # was 0.00 ms everywhere
    rc, out, err = cli(
        capsys, "--trace", "synthetic:constant?rate=2&num_requests=3&isl=100&osl=20", "--num-gpu-blocks", "4", "--quiet"
    )
    assert (rc, err) == (0, "")  # 100 + 20 tokens fit in 256: no warning


def test_a_short_prompt_with_a_long_output_is_named_with_both(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 100 prompt tokens fit in 16 x 64 = 1024; with 5000 output tokens the sequence outgrows the cache while
    # decoding and is refused: the note names prompt and output, not a 100-token "prompt that can never fit"
    t = tmp_path / "t.jsonl"
    t.write_text(
        '{"timestamp": 0, "input_length": 100, "output_length": 5000}\n'
        '{"timestamp": 10, "input_length": 1000, "output_length": 10}\n'
    )
    rc, out, err = cli(capsys, "--trace", str(t), "--num-gpu-blocks", "16", "--block-size", "64", "--quiet")
    assert (rc, out) == (0, "")
    assert err == (
        "dynoplan replay: warning: 1 of 2 requests failed: prompt + output tokens that can never fit in a "
        "worker's KV cache (largest failed request: 100 prompt + 5000 output = 5100 tokens; "
        "num_gpu_blocks=16 x block_size=64 = 1024 tokens); they count as not completed\n"
    )
    rc, out, err = cli(
        capsys,
        "--trace",
        "synthetic:constant?rate=2&num_requests=2&isl=300&osl=2",
        "--max-num-batched-tokens",
        "256",
        "--no-chunked-prefill",
        "--quiet",
    )
    assert rc == 0 and "or a prompt above max_num_batched_tokens=256 (chunked prefill off)" in err


def test_engine_config_not_utf8_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    y = tmp_path / "latin1.yaml"
    y.write_bytes(b"block_size: 16\n# caf\xe9\n")
    rc, out, err = cli(capsys, "--trace", SMALL, "--quiet", "--engine-config", str(y))
    assert_one_line_error(
        rc, err, str(y), "cannot read engine config file: byte 0xe9 at offset 20: expected UTF-8 text"
    )  # was a traceback


# ---------------------------------------------------------------------------------------------- output paths
def test_per_request_onto_the_trace_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = csv_trace(tmp_path, "2023-11-16 18:15:46.0,374,44\n")
    before = trace.read_bytes()
    for flag in ("--per-request", "--report-json"):
        rc, _, err = cli(capsys, "--trace", str(trace), "--quiet", flag, str(trace))
        assert_one_line_error(rc, err, flag, str(trace), "is the --trace file", "expected a different output file")
    link = tmp_path / "link.csv"  # another name of the same file
    link.symlink_to(trace)
    rc, _, err = cli(capsys, "--trace", str(trace), "--quiet", "--per-request", str(link))
    assert_one_line_error(rc, err, "--per-request", "is the --trace file")
    assert trace.read_bytes() == before


@pytest.mark.parametrize("flag", ["--report-json", "--per-request"])
def test_empty_output_path_is_refused(capsys: pytest.CaptureFixture[str], flag: str) -> None:
    # was exit 0 with nothing written (simulate --out '' is refused the same way)
    rc, out, err = cli(capsys, "--trace", SMALL, "--quiet", flag, "")
    assert_one_line_error(rc, err, f"{flag} '': empty, expected a file path")
    assert out == ""


@pytest.mark.parametrize("input_flag", ["--rate-envelope", "--engine-config"])
@pytest.mark.parametrize("flag", ["--report-json", "--per-request"])
def test_output_onto_another_input_names_that_input_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str, input_flag: str
) -> None:
    # was "is the input trace env.csv" for the envelope and the engine config alike
    src = tmp_path / "in.file"
    src.write_text("time_s,multiplier\n0,1\n" if input_flag == "--rate-envelope" else "block_size: 16\n")
    before = src.read_bytes()
    rc, _, err = cli(capsys, "--trace", SMALL, "--quiet", input_flag, str(src), flag, str(src))
    assert_one_line_error(rc, err, f"{flag} {src}: is the {input_flag} file {src}", "expected a different output")
    assert "trace" not in err
    assert src.read_bytes() == before


def test_report_and_per_request_on_one_file_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "o.json"
    rc, _, err = cli(capsys, "--trace", SMALL, "--quiet", "--report-json", str(out), "--per-request", str(out))
    assert_one_line_error(rc, err, "--per-request", "same file as --report-json")
    assert not out.exists()


@pytest.mark.parametrize("flag", ["--report-json", "--per-request"])
def test_output_under_missing_directory_is_refused_not_created(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str
) -> None:
    target = tmp_path / "nonexist" / "dir" / "r.json"
    rc, _, err = cli(capsys, "--trace", SMALL, "--quiet", flag, str(target))
    assert_one_line_error(rc, err, flag, str(target), "does not exist", "expected an existing directory")
    assert not (tmp_path / "nonexist").exists()


@pytest.mark.parametrize("flag", ["--workers", "--prefill-workers", "--decode-workers"])
def test_worker_count_upper_bound(capsys: pytest.CaptureFixture[str], flag: str) -> None:
    from mocker.arguments import MAX_WORKERS

    rc, _, err = cli(capsys, "--trace", SMALL, flag, str(MAX_WORKERS + 1))
    assert_one_line_error(rc, err, flag, f"'{MAX_WORKERS + 1}'", f"between 1 and {MAX_WORKERS}")
    rc, _, err = cli(capsys, "--trace", SMALL, flag, "100000")
    assert_one_line_error(rc, err, flag, "'100000'")


def test_flag_abbreviations_are_unrecognized(capsys: pytest.CaptureFixture[str]) -> None:
    # --mode used to be taken as an abbreviation of --model-config
    rc, _, err = cli(capsys, "--trace", SMALL, "--mode", "disagg")
    assert rc == 2 and "unrecognized arguments: --mode disagg" in err and "Traceback" not in err
    rc, _, err = cli(capsys, "--trace", SMALL, "--work", "2")
    assert rc == 2 and "unrecognized arguments: --work" in err


@pytest.mark.parametrize("command", ["replay", "simulate"])
def test_a_mistyped_flag_is_reported_by_the_subcommand_given_it(
    capsys: pytest.CaptureFixture[str], command: str
) -> None:
    with pytest.raises(SystemExit) as ei:
        main([command, "--trace", SMALL, "--sla-tfft-ms", "3"])
    err = capsys.readouterr().err
    assert ei.value.code == 2
    assert err == f"dynoplan {command}: error: unrecognized arguments: --sla-tfft-ms 3 (see --help)\n"


@pytest.mark.parametrize(
    "argv, needles",
    [
        # 3 requests at 1e-9 req/s: the last arrival about 1.7e9 s after the start (the seed fixes it)
        (["--trace", "synthetic:poisson?rate=1e-9&num_requests=3&seed=1"], ["--trace synthetic:poisson"]),
        # the bundled Azure trace spans 3501.72 s; at 1e-4 times its rate, 3.50172e+07 s
        (
            ["--trace", str(ROOT / "examples/traces/azure_llm_conv_2023.csv"), "--arrival-speedup", "1e-4"],
            ["after --arrival-speedup=0.0001", "the last arrival is at 3.50172e+07 s"],
        ),
    ],
)
def test_a_workload_past_the_time_limit_is_refused_before_replaying(
    capsys: pytest.CaptureFixture[str], argv: list[str], needles: list[str]
) -> None:
    rc, _, err = cli(capsys, *argv, "--quiet")
    assert_one_line_error(rc, err, *needles, "past the simulator's limit of 4.504e+06 s", "expected at most")


# ---------------------------------------------------------------------------------------------- flags without effect
DISAGG_ONLY = "only for a disaggregated fleet; expected --prefill-workers and --decode-workers, or none of these flags"
KV_SIZE_ONLY = (
    "only for a disaggregated fleet or KVBM lower tiers; expected --prefill-workers and --decode-workers, "
    "or --num-g2-blocks, or none of these flags"
)
KVBM = ["--g1-backend", "kvbm", "--num-g2-blocks", "8", "--kv-bytes-per-token", "100"]


@pytest.mark.parametrize(
    "argv, message",
    [
        # each was exit 0 with the flag ignored
        (
            ["--kv-event-lag-ms", "5"],
            "--kv-event-lag-ms 5: only with --kv-events (the delay before the kv router sees a KV event); "
            "expected --kv-events or no --kv-event-lag-ms",
        ),
        (  # the default value given counts: the flag is refused, whatever its value
            ["--router", "kv", "--kv-event-lag-ms", "0"],
            "--kv-event-lag-ms 0: only with --kv-events (the delay before the kv router sees a KV event); "
            "expected --kv-events or no --kv-event-lag-ms",
        ),
        (
            ["--kv-events"],
            "--kv-events with --router round_robin: only the kv router reads the workers' KV events; "
            "expected --router kv or no --kv-events",
        ),
        (
            ["--kv-events", "--router", "least_loaded", "--kv-event-lag-ms", "2.5"],
            "--kv-events with --router least_loaded: only the kv router reads the workers' KV events; "
            "expected --router kv or no --kv-events",
        ),
        (["--handoff", "coordinated"], f"--handoff coordinated: {DISAGG_ONLY}"),
        (["--kv-transfer-timing", "full_prompt"], f"--kv-transfer-timing full_prompt: {DISAGG_ONLY}"),
        (
            ["--handoff", "direct", "--kv-transfer-timing", "destination_missing"],
            f"--kv-transfer-timing destination_missing, --handoff direct: {DISAGG_ONLY}",
        ),
        (["--kv-transfer-bandwidth", "0"], f"--kv-transfer-bandwidth 0: {DISAGG_ONLY}"),
        # the KVBM lower tiers take a KV size, not a handoff
        ([*KVBM, "--handoff", "direct"], f"--handoff direct: {DISAGG_ONLY}"),
        (["--kv-cache-dtype", "fp8"], f"--kv-cache-dtype fp8: {KV_SIZE_ONLY}"),
        (["--kv-bytes-per-token", "100"], f"--kv-bytes-per-token 100: {KV_SIZE_ONLY}"),
        # a dtype only reads a config.json; a byte count has none
        (
            [*KVBM, "--kv-cache-dtype", "auto"],
            "--kv-cache-dtype auto: only with --model-config (it sets the bytes per KV value of the model's "
            "config.json); expected --model-config or no --kv-cache-dtype",
        ),
        (
            ["--prefill-workers", "1", "--decode-workers", "1", "--kv-bytes-per-token", "5", "--kv-cache-dtype", "fp8"],
            "--kv-cache-dtype fp8: only with --model-config (it sets the bytes per KV value of the model's "
            "config.json); expected --model-config or no --kv-cache-dtype",
        ),
    ],
)
def test_a_flag_without_its_prerequisite_is_refused(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    assert cli(capsys, "--trace", SMALL, "--quiet", *argv) == (2, "", f"dynoplan replay: error: {message}\n")


def test_the_transfer_flags_at_their_defaults_change_nothing_in_a_disaggregated_fleet(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the flags lost their argparse defaults (to tell given from not given); not given = the same defaults
    disagg = ["--prefill-workers", "1", "--decode-workers", "2", "--kv-transfer-bandwidth", "8"]
    disagg += ["--kv-bytes-per-token", "4096", "--quiet"]
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    assert cli(capsys, "--trace", SMALL, *disagg, "--per-request", str(a))[0] == 0
    defaults = ["--kv-transfer-timing", "full_prompt", "--handoff", "coordinated"]
    assert cli(capsys, "--trace", SMALL, *disagg, *defaults, "--per-request", str(b))[0] == 0
    assert a.read_bytes() == b.read_bytes()
    direct = tmp_path / "c.jsonl"
    assert cli(capsys, "--trace", SMALL, *disagg, "--handoff", "direct", "--per-request", str(direct))[0] == 0
    assert direct.read_bytes() != a.read_bytes()  # the flag is read: the other handoff path changes the timeline


@pytest.mark.parametrize("second", [SMALL, "other.csv"])
def test_trace_given_twice_is_refused_naming_both(capsys: pytest.CaptureFixture[str], second: str) -> None:
    # was: the last --trace replayed, the first silently dropped
    assert cli(capsys, "--trace", SMALL, "--quiet", f"--trace={second}") == (
        2,
        "",
        f"dynoplan replay: error: argument --trace: given twice ({SMALL!r} and {second!r}), expected it once "
        "(see --help)\n",
    )


def test_a_synthetic_spec_with_an_empty_item_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    # was: replayed as rate=1&duration_s=10, the stray '&' dropped
    spec = "synthetic:poisson?rate=1&&duration_s=10"
    assert cli(capsys, "--trace", spec, "--quiet") == (
        2,
        "",
        f"dynoplan replay: error: {spec}: item 2 '' is empty (a doubled '&', or one at an end); expected "
        "key=value items joined by '&'\n",
    )


DP_BOUND = "expected a DP size between 1 and 1024 (ranks per worker, each at least one GPU) (see --help)"
CORES = (
    "engine cores in one pool (each DP rank is a scheduler and KV cache built up front, and at least one GPU); "
    "expected at most 65536: fewer workers or a smaller DP size"
)


@pytest.mark.parametrize(
    "argv, message",
    [
        # 1e5 ranks were built (0.33 GB); 1e7 ended in a MemoryError traceback after filling 8 GB
        (["--dp-size", "100000"], f"argument --dp-size: '100000': {DP_BOUND}"),
        (["--dp-size", "1025"], f"argument --dp-size: '1025': {DP_BOUND}"),
        # 4.1e6 cores: a MemoryError traceback after two minutes
        (["--workers", "4096", "--dp-size", "1000"], f"--workers=4096 x --dp-size=1000 = 4096000 {CORES}"),
        (["--workers", "65", "--dp-size", "1024"], f"--workers=65 x --dp-size=1024 = 66560 {CORES}"),
        (
            ["--prefill-workers", "1", "--decode-workers", "129", "--dp-size", "512"],
            f"--decode-workers=129 x --dp-size=512 = 66048 {CORES}",
        ),
    ],
)
def test_absurd_dp_sizes_are_refused_before_any_work(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    assert cli(capsys, "--trace", SMALL, "--quiet", *argv) == (2, "", f"dynoplan replay: error: {message}\n")


def test_the_engine_configs_dp_size_is_bounded_too(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "e.yaml"
    cfg.write_text("dp_size: 100000\n")
    assert cli(capsys, "--trace", SMALL, "--quiet", "--engine-config", str(cfg)) == (
        2,
        "",
        f"dynoplan replay: error: --engine-config {cfg}: dp_size=100000: expected <= 1024\n",
    )
    cfg.write_text("dp_size: 512\n")
    assert cli(capsys, "--trace", SMALL, "--quiet", "--engine-config", str(cfg), "--workers", "200") == (
        2,
        "",
        f"dynoplan replay: error: --workers=200 x dp_size=512 (--engine-config {cfg}) = 102400 {CORES}\n",
    )


def test_a_jsonl_trace_with_a_non_utf8_byte_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # was: replayed, the stray byte in the unknown field "note" unnoticed
    p = tmp_path / "t.jsonl"
    p.write_bytes(b'{"timestamp": 0, "input_length": 10, "output_length": 2, "note": "\xff"}\n')
    assert cli(capsys, "--trace", str(p), "--quiet") == (
        2,
        "",
        f"dynoplan replay: error: {p}:1: byte 0xff at column 67: expected UTF-8 text\n",
    )


SPEEDUP_WHY = (
    "pass times are divided by it and rounded to whole nanoseconds: the shortest pass, 1 ms, lasts 1 ns at 1e6 and "
    "rounds to 0 ns from 2e6 on"
)


@pytest.mark.parametrize("command", ["replay", "simulate", "profile", "mocker serve"])
@pytest.mark.parametrize("ratio", ["2e6", "3e7", "1e8"])
def test_a_speedup_ratio_that_rounds_passes_to_zero_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, ratio: str
) -> None:
    # was: replay accepted it (every pass 0 ns long), simulate and profile a ZeroDivisionError traceback (a 0 ITL)
    args = {
        "replay": ["replay", "--trace", SMALL, "--quiet"],
        "simulate": ["simulate", "--trace", SMALL, "--quiet"],
        "profile": ["profile", "--out", str(tmp_path / "p.npz")],
        "mocker serve": ["mocker", "serve"],
    }[command]
    with pytest.raises(SystemExit) as e:
        main([*args, "--speedup-ratio", ratio])
    out, err = capsys.readouterr()
    assert (e.value.code, out) == (2, "")
    assert err == (
        f"dynoplan {command}: error: argument --speedup-ratio: {ratio!r}: expected at most 1000000 ({SPEEDUP_WHY}) "
        "(see --help)\n"
    )
    assert not (tmp_path / "p.npz").exists()


def test_an_engine_config_files_speedup_ratio_is_bounded_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / "e.yaml"
    cfg.write_text("speedup_ratio: 1e8\n")
    profile = ["profile", "--out", str(tmp_path / "p")]
    for cmd in (["replay", "--trace", SMALL, "--quiet"], ["simulate", "--trace", SMALL, "--quiet"], profile):
        rc = main([*cmd, "--engine-config", str(cfg)])
        out, err = capsys.readouterr()
        assert (rc, out) == (2, "")
        assert err == (
            f"dynoplan {cmd[0]}: error: --engine-config {cfg}: speedup_ratio=100000000.0: expected <= 1000000.0 "
            f"({SPEEDUP_WHY})\n"
        )


def test_at_the_largest_speedup_ratio_the_shortest_pass_lasts_one_nanosecond() -> None:
    from mocker.config import MAX_SPEEDUP_RATIO, EngineConfig
    from mocker.timing import DECODE_MIN_MS, round_ns

    # the decode floor (1 ms) over the bound is 1e-6 ms = 1 ns: the clock's resolution; at 2e6, 0.5 ns rounds to 0
    assert MAX_SPEEDUP_RATIO == DECODE_MIN_MS * 1e6
    assert round_ns(DECODE_MIN_MS / MAX_SPEEDUP_RATIO) == pytest.approx(1e-6, rel=1e-9)
    assert round_ns(DECODE_MIN_MS / 1.999e6) > 0 and round_ns(DECODE_MIN_MS / 2e6) == 0.0
    assert EngineConfig(speedup_ratio=1e6).speedup_ratio == 1e6


def test_a_replay_at_the_largest_speedup_ratio_has_positive_pass_times(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "r.json"
    rc, _, err = cli(capsys, "--trace", SMALL, "--quiet", "--speedup-ratio", "1e6", "--report-json", str(out))
    assert (rc, err) == (0, "")
    report = json.loads(out.read_text())
    # the shortest pass of this replay, 5.85 ms at speedup 1, is 6 ns: every token gap is positive
    assert report["min_itl_ms"] == pytest.approx(6e-6, rel=1e-6) and report["mean_ttft_ms"] > 0


@pytest.mark.parametrize("flag", ["--report-json", "--per-request"])
def test_an_output_to_dev_stdout_on_a_pipe_is_written_in_place(flag: str) -> None:
    # was: /dev/stdout on a pipe resolves to /proc/PID/fd/pipe:[N], a name that exists nowhere, and the check tried to
    # create a file beside it: "cannot create a file in /proc/PID/fd: No such file or directory" (exit 2)
    p = subprocess.run(
        [sys.executable, "-m", "planner.cli", "replay", "--trace", SMALL, "--quiet", flag, "/dev/stdout"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert (p.returncode, p.stderr) == (0, "")
    if flag == "--report-json":  # --quiet: the report written to the pipe is stdout's only content
        assert json.loads(p.stdout)["completed_requests"] == 150
    else:  # the report, then one line per request through the same pipe
        lines = p.stdout.splitlines()
        assert sum(1 for ln in lines if ln.startswith('{"request_id"')) == 150


def test_an_output_path_ending_in_a_slash_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # was: exit 0, and a file named after the would-be directory
    out = f"{tmp_path}/newdir/"
    rc, stdout, err = cli(capsys, "--trace", SMALL, "--quiet", "--report-json", out)
    assert (rc, stdout) == (2, "")
    assert err == f"dynoplan replay: error: --report-json {out}: ends in '/' (a directory), expected a file path\n"
    assert list(tmp_path.iterdir()) == []
