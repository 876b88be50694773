"""``dynoplan profile``: sweep the simulated engine and write the planner's ``.npz`` profile.

Prefill over ISL, decode over KV usage x context length (:mod:`planner.sim.profile`), with the same
engine flags as ``dynoplan replay`` — ``--timing FILE.npz`` profiles a calibrated timing model.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

from dynoplan.errors import SimulationConfigError
from dynoplan.fields import float_text, int_text
from mocker.arguments import engine_config_from_args, positive_int, use_one_line_errors
from planner.arguments import add_engine_arguments, check_out_not_inputs
from planner.core import save_profile


def _increasing(text: str, vals: tuple[Any, ...]) -> tuple[Any, ...]:
    """``vals`` when strictly increasing (a grid the planner interpolates on); else the argparse error naming the
    first point out of order, so the flag is named (was: the sweep's own field, ``isl_tokens=(500, 100)``)."""
    for a, b in zip(vals, vals[1:]):
        if b <= a:
            raise argparse.ArgumentTypeError(f"{text!r}: expected strictly increasing points, {b:g} follows {a:g}")
    return vals


def _int_list(text: str) -> tuple[int, ...]:
    """argparse type of a grid flag (--isl, --context): at least 2 positive integers, comma-separated, strictly
    increasing (the planner interpolates between grid points)."""
    try:
        vals = tuple(int_text(x.strip()) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated integers") from None
    if any(v <= 0 for v in vals):
        raise argparse.ArgumentTypeError(f"{text!r}: expected positive integers (tokens)")
    if len(vals) < 2:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected at least 2 comma-separated points (the planner interpolates between them)"
        )
    return _increasing(text, vals)


def _float_list(text: str) -> tuple[float, ...]:
    """argparse type of --kv-usage: at least 2 fractions 0 < F < 1, comma-separated, strictly increasing."""
    try:
        vals = tuple(float_text(x.strip()) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated numbers") from None
    if any(not 0 < v < 1 for v in vals):
        raise argparse.ArgumentTypeError(f"{text!r}: expected fractions 0 < F < 1")
    if len(vals) < 2:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected at least 2 comma-separated points (the planner interpolates between them)"
        )
    return _increasing(text, vals)


def out_path(text: str) -> Path:
    """The file ``--out`` names: ``text`` with ``.npz`` appended when it does not end in it (numpy's
    ``savez`` rule, so the printed path is the written one). Raises SimulationConfigError when the path or
    its ``.npz`` form is an existing directory or its parent is not a directory."""
    if not text.strip() or Path(text).name in ("", ".npz"):
        raise SimulationConfigError(f"--out {text!r}: no file name, expected a FILE.npz path")
    p = Path(text if text.endswith(".npz") else text + ".npz")
    for q in (Path(text), p):
        if q.is_dir():
            raise SimulationConfigError(f"--out {q}: is a directory, expected a FILE.npz path")
    parent = p.parent
    if not parent.is_dir():
        raise SimulationConfigError(f"--out {text}: parent directory {parent} does not exist or is not a directory")
    return p


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``profile`` flags on ``parser`` (argparse errors become one stderr line, exit 2)."""
    use_one_line_errors(parser, "dynoplan profile")
    # a grid value that starts with '-' ("--isl -5,100") reaches the flag's type check (which names the flag
    # and the value) instead of being taken for an unknown option; argparse's own rule only covers "-5" / "-.5"
    parser._negative_number_matcher = re.compile(r"^-\.?\d[\d.,eE+-]*$")
    parser.add_argument(
        "--out",
        required=True,
        metavar="FILE.npz",
        help="profile to write ('.npz' is appended when missing, as numpy does; not a directory)",
    )
    parser.add_argument("--isl", type=_int_list, metavar="N,N,...", help="prefill ISL grid (tokens)")
    parser.add_argument("--kv-usage", type=_float_list, metavar="F,F,...", help="decode KV-usage grid (fractions)")
    parser.add_argument("--context", type=_int_list, metavar="N,N,...", help="decode context-length grid (tokens)")
    parser.add_argument(
        "--gpus-per-engine", type=positive_int, default=1, metavar="N", help="GPUs per engine (default 1)"
    )
    add_engine_arguments(parser)


def run(args: argparse.Namespace) -> int:
    """Sweep the engine and write ``--out``; returns 0 (raises SimulationConfigError / ConfigError)."""
    # rich (~0.1 s) and the engines the sweep drives: only when a profile runs, not for `profile --help`
    from rich.console import Console

    from planner.sim.profile import ProfileSweep, profile_engine

    out = out_path(args.out)  # before the sweep: a bad --out must not cost the profile
    check_out_not_inputs(
        str(out),
        {
            f: getattr(args, a, None)
            for f, a in (
                ("--timing", "timing"),
                ("--engine-config", "engine_config"),
                ("--model-config", "model_config"),
            )
        },
        outputs={out.name: str(out)},
    )
    engine = engine_config_from_args(args)
    kw = {
        k: v
        for k, v in (("isl_tokens", args.isl), ("kv_usage", args.kv_usage), ("context_tokens", args.context))
        if v is not None
    }
    prof = profile_engine(engine, ProfileSweep(gpus_per_engine=args.gpus_per_engine, **kw))
    try:
        save_profile(prof, out)
    except OSError as e:
        raise SimulationConfigError(f"--out {out}: cannot write: {e.strerror or e}") from None
    pre, dec = prof.prefill, prof.decode
    assert pre is not None and dec is not None  # an engine sweep measures both halves
    Console(stderr=True).print(
        f"wrote {out}: prefill {pre.isl.size} ISL points, decode {dec.kv_usage.size}x{dec.context_length.size} grid"
    )
    return 0
