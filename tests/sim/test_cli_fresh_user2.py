"""Second fresh-user round of ``dynoplan simulate`` / ``dynoplan profile`` defects (real CLI via main())."""

from __future__ import annotations

import json

import pytest

from planner.cli import main as cli_main

TRACE = "synthetic:poisson?rate=2&duration_s=20&isl=256&osl=16&seed=1"
PROFILE_GRID = ["--isl", "128,512", "--kv-usage", "0.01,0.1", "--context", "256,1024"]


def _one_line(capsys, rc: int, *needles: str) -> str:
    cap = capsys.readouterr()
    err = cap.err
    assert rc == 2, err
    assert len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err
    for n in needles:
        assert n in err, err
    return cap.out


@pytest.fixture(scope="module")
def profile(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("prof") / "p.npz"
    assert cli_main(["profile", "--out", str(out), *PROFILE_GRID]) == 0
    return str(out)


# ------------------------------------------------------------------ 1. profile --out must not overwrite inputs
@pytest.mark.parametrize("flag, name, out", [("--timing", "tm.npz", "tm.npz"), ("--timing", "tm.npz", "tm"),
                                             ("--engine-config", "eng.npz", "eng")])
def test_profile_out_naming_an_input_is_refused_before_running(tmp_path, capsys, flag, name, out):
    src = tmp_path / name
    src.write_bytes(b"not touched\x00")
    rc = cli_main(["profile", "--out", str(tmp_path / out), flag, str(src), *PROFILE_GRID])
    _one_line(capsys, rc, "--out", flag, str(src))
    assert src.read_bytes() == b"not touched\x00"
