"""Third fresh-user round of ``dynoplan simulate`` defects (real CLI via main()): each bad input gets one
line naming what the user wrote, and exit 2."""

from __future__ import annotations

import pytest

from planner.cli import main as cli_main

TINY = "synthetic:constant?rate=1&num_requests=20&isl=100&osl=10"


def _err(capsys, rc: int) -> str:
    """The one stderr line of a user-error exit (code 2, no traceback)."""
    err = capsys.readouterr().err
    assert rc == 2, err
    assert len(err.strip().splitlines()) == 1, err
    return err.strip()


def test_compare_variant_changing_the_mode_is_refused_naming_the_run_mode(capsys):
    rc = cli_main(["simulate", "--trace", TINY, "--compare", "planner:mode=disagg"])
    assert _err(capsys, rc) == (
        "dynoplan simulate: error: policy 'planner:mode=disagg': mode='disagg': a --compare variant cannot "
        "change the run's mode, expected mode=agg (the run's --mode agg) or no mode"
    )


def test_compare_variant_repeating_the_run_mode_is_accepted(capsys):
    rc = cli_main(["simulate", "--trace", TINY, "--mode", "agg", "--compare", "planner:mode=agg", "--quiet"])
    assert rc == 0, capsys.readouterr().err


# ------------------------------------------------------------------ integer settings bounded by int64
BIG = "99999999999999999999"  # > 2**63 - 1


def test_num_gpu_blocks_flag_above_int64_is_refused_naming_the_flag(capsys):
    with pytest.raises(SystemExit) as e:  # an argparse type error exits from the parser
        cli_main(["simulate", "--trace", TINY, "--num-gpu-blocks", BIG])
    assert _err(capsys, e.value.code) == (
        f"dynoplan simulate: error: argument --num-gpu-blocks: '{BIG}': expected a positive integer "
        "<= 9223372036854775807 (see --help)"
    )


def test_num_gpu_blocks_in_the_engine_file_above_int64_is_refused(tmp_path, capsys):
    eng = tmp_path / "eng.yaml"
    eng.write_text(f"num_gpu_blocks: {BIG}\n")
    rc = cli_main(["simulate", "--trace", TINY, "--engine-config", str(eng)])
    assert _err(capsys, rc) == (
        f"dynoplan simulate: error: --engine-config {eng}: num_gpu_blocks={BIG}: expected <= 9223372036854775807"
    )


def test_kv_tokens_of_blocks_times_block_size_above_int64_are_refused(capsys):
    rc = cli_main(["simulate", "--trace", TINY, "--num-gpu-blocks", str(2**62), "--block-size", "2"])
    assert _err(capsys, rc) == (
        "dynoplan simulate: error: num_gpu_blocks=4611686018427387904: 4611686018427387904 blocks x "
        "block_size=2 = 9223372036854775808 KV tokens; expected at most 9223372036854775807 tokens"
    )


def test_planner_point_count_above_int64_is_refused(capsys):
    rc = cli_main(["simulate", "--trace", TINY, "--planner-set", "predictor_min_points=99999999999999999999999"])
    assert _err(capsys, rc) == (
        "dynoplan simulate: error: --planner-set predictor_min_points=99999999999999999999999: "
        "expected <= 9223372036854775807"
    )


def test_regression_buckets_past_the_int64_token_range_are_refused(capsys):
    rc = cli_main(["simulate", "--trace", TINY, "--planner-set", "regression_buckets=65"])
    assert _err(capsys, rc) == ("dynoplan simulate: error: --planner-set regression_buckets=65: expected <= 64")


def test_compare_variant_with_non_utf8_bytes_is_one_line(capsys, tmp_path):
    # argv keeps the byte 0xe9 as the lone surrogate U+DCE9 (what pydantic's JSON parser choked on)
    spec = "planner:ttft_ms=" + b"\xe9".decode("utf-8", "surrogateescape")
    rc = cli_main(["simulate", "--trace", TINY, "--out", str(tmp_path / "o"), "--compare", spec])
    assert _err(capsys, rc).endswith(": its text: byte 0xe9 at offset 16: expected UTF-8 text")


def test_a_dotted_pool_key_in_a_file_is_told_to_nest_not_offered_itself(capsys, tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("agg.max_replicas: 3\n")
    rc = cli_main(["simulate", "--trace", TINY, "--out", str(tmp_path / "o"), "--config", str(cfg)])
    assert _err(capsys, rc) == (
        f"dynoplan simulate: error: --config {cfg}: agg.max_replicas: unknown setting "
        "(in a file, write it under its section: agg: {max_replicas: ...})"
    )
