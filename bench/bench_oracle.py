"""The interval oracle: what a planner that meets the SLA target in *every* interval costs at best (figures only).

``static:auto`` is the smallest static fleet whose attainment over the whole run reaches the target: chosen in
hindsight, it may miss the target in its busiest intervals as long as the quiet ones make up for it. A planner
that sizes each interval for that interval (as the sizing by simulation does, docs/planner-core.md) cannot
borrow from intervals it has not seen. Its cost floor is the *interval oracle*: for each interval of
``adjustment_interval_s`` (180 s), the smallest static fleet whose requests arriving in that interval meet the
target (hindsight, no start-up delay, no forecast error, each fleet replayed through the whole run so that
queues carry over between intervals), summed as GPU-hours. An interval that no replayed fleet serves within the
target (a few requests no fleet serves in time, among the few hundred of an interval) is held to what the
largest replayed fleet achieves there. When the oracle costs more than 1.05 x static:auto,
no interval-wise planner can reach that ratio on the run; the gap between the planner and the oracle is what
forecasting, reaction delay and the sizing's margins cost.

For every aggregated run of bench/bench_quality.py (the same traces, speed-ups, SLAs and envelope), fleets of
1 .. N aggregated workers are replayed with ``dynoplan replay --per-request`` (N: the first fleet that meets the
target in every interval, at most ``--max-workers``), and each request counts as met when it has a first
token within the TTFT target and its own mean ITL within the ITL target (an unfinished request misses), as
the reports count it.

Usage:  nice -n 10 .venv/bin/python bench/bench_oracle.py [--cases a,b,...] [--jobs N] [--quality FILE.json]
        [--json FILE] [--markdown FILE]
        .venv/bin/python bench/bench_oracle.py --render FILE.json [--quality FILE.json]   (no replays)
``--quality`` adds the planner's GPU-h from a bench_quality.py ``--json`` file (e.g. bench/results/quality-after.json).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_quality as bq  # noqa: E402  (the suite's cases: one definition of the runs)

INTERVAL_S = 180.0
"""The planner's default ``adjustment_interval_s``."""
TARGET = 0.995
"""The planner's default ``sla_attainment_target`` (and static:auto's)."""


def _flag(args: list[str], name: str, default: str | None = None) -> str | None:
    return args[args.index(name) + 1] if name in args else default


def replay(case: bq.Case, workers: int, work: Path) -> dict[str, np.ndarray]:
    """Arrival (s), met (bool) per request of ``case``'s trace on ``workers`` aggregated workers."""
    a = case.args
    out = work / f"{case.name}-{workers}.jsonl"
    cmd = [
        *bq.DYNOPLAN,
        "replay",
        "--trace",
        case.trace,
        "--workers",
        str(workers),
        "--quiet",
        "--per-request",
        str(out),
        "--report-json",
        str(work / f"{case.name}-{workers}.json"),
    ]
    for flag in ("--arrival-speedup", "--rate-envelope", "--sla-ttft-ms", "--sla-itl-ms"):
        v = _flag(a, flag)
        if v is not None:
            cmd += [flag, v]
    subprocess.run(cmd, cwd=bq.ROOT, check=True, capture_output=True, text=True)
    ttft_ms, itl_ms = float(_flag(a, "--sla-ttft-ms")), float(_flag(a, "--sla-itl-ms"))
    arr, met = [], []
    with out.open() as f:
        for line in f:
            r = json.loads(line)
            ok = (
                r["status"] == "finished"
                and r["ttft_ms"] is not None
                and r["ttft_ms"] <= ttft_ms
                and (r["itl_ms"] or 0.0) <= itl_ms
            )
            arr.append(r["arrival_ms"] / 1000.0)
            met.append(ok)
    out.unlink()
    return {"arrival_s": np.array(arr), "met": np.array(met, dtype=bool)}


def oracle(case: bq.Case, work: Path, max_workers: int) -> dict[str, Any]:
    """The interval oracle of one run (module docstring)."""
    met: dict[int, np.ndarray] = {}
    """Requests that met the SLA per interval, by fleet size."""
    whole: dict[int, float] = {}
    n = 0
    while n < max_workers:
        n += 1
        r = replay(case, n, work)
        w = np.floor(r["arrival_s"] / INTERVAL_S).astype(int)
        if n == 1:  # every fleet replays the same trace: the same requests in the same intervals
            nw = int(w.max()) + 1
            reqs = np.bincount(w, minlength=nw).astype(float)
            duration_h = float(r["arrival_s"].max()) / 3600.0
        met[n] = np.bincount(w, weights=r["met"], minlength=nw)
        whole[n] = float(r["met"].mean())
        if np.all(reqs - met[n] <= (1.0 - TARGET) * reqs):
            break
    missed = {k: reqs - m for k, m in met.items()}
    # an interval no replayed fleet serves within the target (requests no fleet serves in time) is held to what the
    # largest fleet achieves there, as the planner's own sizing does when its limit cannot pass
    bar = np.maximum((1.0 - TARGET) * reqs, missed[n])
    need = np.full(nw, n)
    for k in sorted(met, reverse=True):  # the least fleet meeting the bar in each interval
        need = np.where(missed[k] <= bar, k, need)
    # attainment of the oracle: each interval's requests on its chosen fleet
    met_oracle = np.array([met[k] for k in sorted(met)])[need - 1, np.arange(nw)]
    static_auto = next((k for k in sorted(whole) if whole[k] >= TARGET), None)
    span_h = np.full(nw, INTERVAL_S / 3600.0)
    span_h[-1] = duration_h - (nw - 1) * INTERVAL_S / 3600.0
    gpu_h = float((need * span_h).sum())
    res: dict[str, Any] = {
        "intervals": nw,
        "need": need.tolist(),
        "whole_attainment": whole,
        "oracle_gpu_h": gpu_h,
        "oracle_attainment": float(met_oracle.sum() / reqs.sum()),
        "static_auto": static_auto,
        "arrival_span_h": duration_h,
    }
    if static_auto is not None:
        res["static_auto_gpu_h"] = static_auto * duration_h
        res["ratio"] = gpu_h / res["static_auto_gpu_h"]
        res["static_auto_missed_intervals"] = int(np.sum(need > static_auto))
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", help="comma-separated aggregated runs of bench_quality.py (default: all of them)")
    ap.add_argument("--jobs", type=int, default=1, help="runs in parallel (default 1)")
    ap.add_argument("--max-workers", type=int, default=24, help="largest fleet replayed per run (default 24)")
    ap.add_argument("--quality", metavar="FILE.json", help="a bench_quality.py --json file: add the planner's GPU-h")
    ap.add_argument("--json", metavar="FILE", help="write the results as JSON")
    ap.add_argument("--markdown", metavar="FILE", help="also write the table to FILE")
    ap.add_argument("--render", metavar="FILE.json", help="print the table of an earlier --json file (no replays)")
    args = ap.parse_args()
    if args.jobs < 1:
        ap.error(f"--jobs {args.jobs}: expected an integer >= 1")
    quality = {}
    if args.quality:
        try:
            quality = json.loads(Path(args.quality).read_text())["runs"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            ap.error(f"--quality {args.quality}: expected a bench_quality.py --json file ({type(e).__name__}: {e})")
    if args.render:
        try:
            results = json.loads(Path(args.render).read_text())
        except (OSError, ValueError) as e:
            ap.error(f"--render {args.render}: expected a bench_oracle.py --json file ({type(e).__name__}: {e})")
        report(results, quality, None, args.markdown)
        return
    work = Path(tempfile.mkdtemp(prefix="bench_oracle_"))
    gap = work / "azure_gap20min.jsonl"
    cases = [c for c in bq.build_cases(str(gap)) if c.name.endswith("-agg")]
    if args.cases:
        wanted = args.cases.split(",")
        unknown = [w for w in wanted if w not in [c.name for c in cases]]
        if unknown:
            ap.error(f"--cases {','.join(unknown)}: unknown run, expected some of {','.join(c.name for c in cases)}")
        cases = [c for c in cases if c.name in wanted]
    if any(c.name == "gap-agg" for c in cases):
        bq.build_gap_trace(gap)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futs = {c.name: pool.submit(oracle, c, work, args.max_workers) for c in cases}
        results = {name: f.result() for name, f in futs.items()}
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str) + "\n")
    report(results, quality, time.perf_counter() - t0, args.markdown)


def report(results: dict[str, Any], quality: dict[str, Any], wall_s: float | None, markdown: str | None) -> None:
    """Print (and write to ``markdown``) the table of ``results``; the planner's GPU-h from ``quality`` runs."""
    wall = f", wall {wall_s:.0f} s" if wall_s is not None else ""
    lines = [
        f"Interval oracle (`bench/bench_oracle.py`), interval {INTERVAL_S:.0f} s, target {100 * TARGET:.1f} %{wall}",
        "",
        "| run | static:auto | its attainment | intervals it misses | oracle GPU-h | oracle / static:auto | "
        "planner GPU-h | planner / oracle |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in results.items():
        sa = r["static_auto"]
        r["whole_attainment"] = {int(k): v for k, v in r["whole_attainment"].items()}
        q = quality.get(name, {}).get("policies", {}).get("planner") if quality else None
        pg = q["gpu_hours"] if q else math.nan
        lines.append(
            f"| {name} | {sa if sa is not None else '-'} | "
            f"{100 * r['whole_attainment'].get(sa, math.nan):.2f} % | "
            f"{r.get('static_auto_missed_intervals', '-')} of {r['intervals']} | {r['oracle_gpu_h']:.3f} | "
            f"{r.get('ratio', math.nan):.2f} | {pg:.3f} | {pg / r['oracle_gpu_h']:.2f} |"
        )
    text = "\n".join(lines)
    print(text)
    if markdown:
        Path(markdown).write_text(text + "\n")


if __name__ == "__main__":
    main()
