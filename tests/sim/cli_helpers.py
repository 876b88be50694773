"""Shared pieces of the ``dynoplan simulate`` / ``profile`` CLI tests: a short synthetic trace, a small
profile grid and the one-line-error check."""

from __future__ import annotations

TRACE = "synthetic:poisson?rate=2&duration_s=20&isl=256&osl=16&seed=1"
PROFILE_GRID = ["--isl", "128,512", "--kv-usage", "0.01,0.1", "--context", "256,1024"]


def one_line(capsys, rc: int, *needles: str) -> str:
    """Assert a user-error exit: code 2, exactly one stderr line, no traceback, every needle in it; returns stdout."""
    cap = capsys.readouterr()
    err = cap.err
    assert rc == 2, err
    assert len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err
    for n in needles:
        assert n in err, err
    return cap.out
