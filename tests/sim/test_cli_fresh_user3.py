"""Third fresh-user round of ``dynoplan simulate`` defects (real CLI via main()): each bad input gets one
line naming what the user wrote, and exit 2."""

from __future__ import annotations

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
