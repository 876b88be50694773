"""Corrupt input files found by a fresh-user pass: each is one line on stderr naming the file and exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from planner.cli import main as cli_main

SYNTHETIC = "synthetic:poisson?rate=3&duration_s=10"


def _not_a_zip(tmp_path: Path) -> str:
    f = tmp_path / "fake.npz"
    f.write_bytes(b"PK\x03\x04garbage")  # a zip signature, then nothing a zip reader can use
    return str(f)


def _one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def _profile_error(capsys: pytest.CaptureFixture[str], profile: str) -> str:
    """The one error line of ``simulate --profile PROFILE`` (exit 2)."""
    rc = cli_main(["simulate", "--trace", SYNTHETIC, "--compare", "planner", "--profile", profile, "--quiet"])
    assert rc == 2
    return _one_error_line(capsys)


def test_a_corrupt_planner_profile_is_one_line(tmp_path, capsys):
    f = _not_a_zip(tmp_path)
    line = _profile_error(capsys, f)
    assert line == f"dynoplan simulate: error: --profile {f}: cannot read .npz: File is not a zip file"


def test_a_missing_planner_profile_names_the_flag(tmp_path, capsys):
    f = str(tmp_path / "missing.npz")
    assert _profile_error(capsys, f) == f"dynoplan simulate: error: --profile {f}: no such file or directory"


def test_a_text_file_as_planner_profile_is_not_an_npz(tmp_path, capsys):
    # numpy reads a file that is neither .npz nor .npy as a pickle, and refuses it in pickle's words
    f = tmp_path / "notes.npz"
    f.write_text("hello\n")
    assert _profile_error(capsys, str(f)) == (
        f"dynoplan simulate: error: --profile {f}: not an .npz archive (expected a profile written by dynoplan profile)"
    )


NOT_NPZ = (
    "not a NumPy .npz archive; expected an engine timing profile (.npz), 'polynomial' or 'aic:model=...,system=...'"
)


def test_a_nan_in_a_planner_profile_names_the_array_and_its_index(tmp_path, capsys):
    import numpy as np

    f = tmp_path / "nan.npz"
    np.savez(
        f,
        prefill_isl=[128.0, 512.0],
        prefill_ttft_ms=[20.0, 60.0],
        prefill_thpt_per_gpu=[6000.0, 8000.0],
        decode_kv_usage=[0.01, 0.1],
        decode_context_length=[256.0, 1024.0],
        decode_itl_ms=[[6.0, 6.5], [np.nan, 8.0]],
        decode_thpt_per_gpu=[[100.0, 110.0], [900.0, 950.0]],
        decode_max_kv_tokens=[1048576],
    )
    # was: "array 'decode_itl_ms': expected finite values, non-empty" (which value, and it was not empty)
    assert _profile_error(capsys, str(f)) == (
        f"dynoplan simulate: error: --profile {f}: array 'decode_itl_ms'[1, 0] = nan: expected finite values > 0"
    )


def test_a_corrupt_engine_timing_profile_is_one_line(tmp_path, capsys):
    f = _not_a_zip(tmp_path)
    assert cli_main(["replay", "--trace", SYNTHETIC, "--timing", f, "--quiet"]) == 2
    line = _one_error_line(capsys)
    # was: "cannot read profile: File is not a zip file"
    assert line == f"dynoplan replay: error: timing={f!r}: {NOT_NPZ}"


@pytest.mark.parametrize(
    "name, content",
    [
        # were: "expected 'polynomial', a path to a .npz profile or ..." (it is a path) for the first two, and
        # numpy's "cannot read profile: Cannot load file containing pickled data when allow_pickle=False"
        ("notes.txt", b"hello\n"),
        ("profile.json", b'{"prefill_isl": [128, 512]}\n'),
        ("notes.npz", b"hello\n"),
        ("array.npz", b"\x93NUMPY\x01\x00v\x00"),  # the start of a single .npy array, not an archive
    ],
)
def test_a_file_that_is_not_an_npz_archive_as_timing_is_one_line(tmp_path, capsys, name, content):
    f = tmp_path / name
    f.write_bytes(content)
    rc = cli_main(["replay", "--trace", SYNTHETIC, "--timing", str(f), "--quiet"])
    cap = capsys.readouterr()
    assert (rc, cap.out, cap.err) == (2, "", f"dynoplan replay: error: timing={str(f)!r}: {NOT_NPZ}\n")


def test_a_directory_as_timing_is_named_a_directory(tmp_path, capsys):
    d = tmp_path / "adir.npz"
    d.mkdir()
    rc = cli_main(["replay", "--trace", SYNTHETIC, "--timing", str(d), "--quiet"])
    cap = capsys.readouterr()
    # was: "profile file not found" (it exists)
    assert (rc, cap.out, cap.err) == (
        2,
        "",
        f"dynoplan replay: error: timing={str(d)!r}: is a directory; expected 'polynomial', a path to a .npz profile "
        "or 'aic:model=...,system=...'\n",
    )


def test_an_npz_archive_named_without_npz_as_timing_says_to_rename_it(tmp_path, capsys):
    import numpy as np

    f = tmp_path / "profile.dat"
    with f.open("wb") as out:
        np.savez(out, prefill_isl=np.array([128.0, 512.0]))  # to a file object: numpy adds no .npz
    rc = cli_main(["replay", "--trace", SYNTHETIC, "--timing", str(f), "--quiet"])
    cap = capsys.readouterr()
    assert (rc, cap.out) == (2, "")
    assert cap.err == (
        f"dynoplan replay: error: timing={str(f)!r}: a .npz archive named without .npz; expected 'polynomial', a "
        "path to a .npz profile or 'aic:model=...,system=...' (rename it to end in .npz)\n"
    )


def test_a_text_file_as_timing_in_an_engine_config_names_the_file(tmp_path, capsys):
    t = tmp_path / "t.json"
    t.write_text('{"a": 1}\n')
    e = tmp_path / "engine.yaml"
    e.write_text(f"timing: {t}\n")
    rc = cli_main(["replay", "--trace", SYNTHETIC, "--engine-config", str(e), "--quiet"])
    cap = capsys.readouterr()
    assert (rc, cap.out, cap.err) == (
        2,
        "",
        f"dynoplan replay: error: --engine-config {e}: timing={str(t)!r}: {NOT_NPZ}\n",
    )


def test_an_epoch_millisecond_warm_start_csv_is_refused_not_replayed(tmp_path, capsys):
    # a bare number is a year to numpy: unrefused, the warm start spanned 54,000 years and never finished
    f = tmp_path / "epoch.csv"
    f.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n1700158546680,374,44\n1700158556680,374,44\n")
    rc = cli_main(["simulate", "--trace", SYNTHETIC, "--compare", "throughput-only", "--warm-start", str(f), "--quiet"])
    assert rc == 2
    line = _one_error_line(capsys)
    assert "epoch.csv:2: field 'TIMESTAMP' '1700158546680': unparsable timestamp" in line
    assert line.startswith("dynoplan simulate: error: --warm-start")
