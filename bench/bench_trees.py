"""Engine speed of two checkouts side by side: the replay inside the process, before/after a change.

Runs bench/bench_replay.py's ``--child CASE`` (trace parsing + replay + report, timed inside the process) of
each checkout in turn, alternating A B A B ... so that a drift of the machine's speed hits both alike, and
prints per case the minimum and median seconds of each and the median and range of the pairwise ratio
A/B. Each checkout's code is imported through PYTHONPATH, with its own bytecode cache. Figures only.

Make the other checkout with ``git worktree add /tmp/base REV``.

Usage:  .venv/bin/python bench/bench_trees.py --a . --b /tmp/base [--cases a,d,s] [--pairs 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def child_wall_s(root: Path, case: str, tag: str) -> float:
    """One ``--child`` run of ``root``'s bench_replay.py; its in-process wall seconds."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "child.json"
        env = {**os.environ, "PYTHONPATH": str(root), "PYTHONPYCACHEPREFIX": f"{tempfile.gettempdir()}/pyc-{tag}"}
        cmd = [sys.executable, str(root / "bench" / "bench_replay.py"), "--child", case, "--out", str(out)]
        subprocess.run(cmd, cwd=root, env=env, check=True, capture_output=True)
        return float(json.loads(out.read_text())["wall_s"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", default=".", help="checkout A (default: this one)")
    ap.add_argument("--b", required=True, help="checkout B, the baseline")
    ap.add_argument("--cases", default="a,d,s", help="bench_replay.py cases (default a,d,s)")
    ap.add_argument("--pairs", type=int, default=5, help="A/B pairs per case (default 5)")
    a = ap.parse_args()
    trees = {"A": Path(a.a).resolve(), "B": Path(a.b).resolve()}
    cases = [c for c in a.cases.split(",") if c]
    wall: dict[tuple[str, str], list[float]] = {(c, t): [] for c in cases for t in trees}
    for _ in range(a.pairs):
        for c in cases:
            for t, root in trees.items():
                wall[(c, t)].append(child_wall_s(root, c, t))
    print(f"A = {trees['A']}, B = {trees['B']}, {a.pairs} pairs per case, seconds inside the process")
    for c in cases:
        sa, sb = wall[(c, "A")], wall[(c, "B")]
        ratios = [x / y for x, y in zip(sa, sb, strict=True)]
        print(
            f"{c}: A min {min(sa):.3f} median {statistics.median(sa):.3f}; B min {min(sb):.3f} median "
            f"{statistics.median(sb):.3f}; A/B median {statistics.median(ratios):.3f} "
            f"(min {min(ratios):.3f}, max {max(ratios):.3f})"
        )


if __name__ == "__main__":
    main()
