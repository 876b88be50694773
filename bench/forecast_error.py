"""The planner's forecast error per interval, read from ``dynoplan simulate --out DIR`` timelines: figures only.

For each ``DIR/timeline.csv`` (the ``planner`` rows; samples every ``--sample-interval-s``, 10 s by default) and each
whole adjustment interval (``--interval-s``, default 180 s, the planner's default ``adjustment_interval_s``):

- ``obs / fc``: the interval's mean observed request rate (``observed_rps``) over the forecast for it
  (``predicted_rps``, its median over the interval's samples);
- ``rms error``: the root mean square of ``obs / fc - 1`` over the intervals;
- ``renewal sd``: the relative standard deviation an interval's count would have from the arrival process's own
  noise at that rate, ``sqrt(D / (rate x interval))``, with ``D`` the dispersion (variance / mean, at least 1) of the
  interval's 10 s counts; a lower bound of the noise at the interval's scale for arrivals bursty beyond 10 s;
- ``excess sd``: ``sqrt(max(0, rms^2 - renewal^2))``, the error the arrival noise does not explain (trends, regime
  changes, and the predictor's own estimation noise).

Usage:  .venv/bin/python bench/forecast_error.py [--interval-s 180] DIR [DIR ...]
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
from pathlib import Path


def interval_ratios(timeline: Path, interval_s: float) -> list[tuple[float, float]]:
    """(obs / fc, renewal sd) per whole interval of the planner rows of ``timeline`` that has a forecast."""
    per: dict[int, list[tuple[float, float]]] = {}
    times: list[float] = []
    with timeline.open(newline="") as f:
        for r in csv.DictReader(f):
            if r["policy"] != "planner":
                continue
            t = float(r["t_s"])
            times.append(t)
            if r["observed_rps"] and r["predicted_rps"]:
                per.setdefault(max(0, math.ceil(t / interval_s) - 1), []).append(
                    (float(r["observed_rps"]), float(r["predicted_rps"]))
                )
    if len(times) < 2:
        return []
    step = statistics.median(b - a for a, b in zip(times, times[1:]))  # the timeline's sample interval (s)
    out = []
    for k in sorted(per):
        v = per[k]
        obs = statistics.fmean(o for o, _ in v)
        fc = statistics.median(p for _, p in v)
        if len(v) < 0.8 * interval_s / step or fc <= 0 or obs <= 0:
            continue  # a partial interval (the run's first or last)
        counts = [o * step for o, _ in v]
        m = statistics.fmean(counts)
        d = max(1.0, statistics.pvariance(counts) / m)
        out.append((obs / fc, math.sqrt(d / (obs * interval_s))))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dirs", nargs="+", metavar="DIR", help="dynoplan simulate --out directories")
    ap.add_argument("--interval-s", type=float, default=180.0)
    a = ap.parse_args()
    print("| run | intervals | rms error | renewal sd | excess sd | mean error | obs / fc per interval |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for d in a.dirs:
        rs = interval_ratios(Path(d) / "timeline.csv", a.interval_s)
        if not rs:
            print(f"| {Path(d).name} | 0 | - | - | - | - | - |")
            continue
        rms = math.sqrt(statistics.fmean((r - 1) ** 2 for r, _ in rs))
        noise = math.sqrt(statistics.fmean(n * n for _, n in rs))
        excess = math.sqrt(max(0.0, rms * rms - noise * noise))
        mean = statistics.fmean(r - 1 for r, _ in rs)
        each = " ".join(f"{r:.2f}" for r, _ in rs)
        print(f"| {Path(d).name} | {len(rs)} | {rms:.3f} | {noise:.3f} | {excess:.3f} | {mean:+.3f} | {each} |")


if __name__ == "__main__":
    main()
