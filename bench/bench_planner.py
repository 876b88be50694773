"""Per-tick decision time of the planner core, per predictor, over one hour of 5 s ticks.

Scenario: disaggregated mode, both loops on (throughput every 180 s, load every 5 s), the bundled Azure
conversation trace bucketed into 180 s intervals, request counts x ``--scale``, as the throughput loop's
traffic (its ~58 minutes cycle if the hour is longer), and synthetic ForwardPassMetrics: every engine reports
``--passes-per-engine`` passes per tick (wall time from a fixed linear model plus seeded noise) so the
load loop's regressions and estimates run for real. Decisions are applied at once by an in-bench fleet.

Prints, per predictor: p50 / p99 / max of all ticks, p50 / p99 of the throughput-loop ticks (where the
predictor runs) and the ratio of the all-tick p99 to the ``constant`` predictor's (the reference measured in
this same run). Targets: p99 < 50 ms for constant/Kalman, < 500 ms for ARIMA/Prophet/auto.
``prophet:3`` is Prophet with ``prophet_refit_every=3`` (one staggered fit per throughput tick instead of
three).
Figures only, no assertions.

``--mode agg``: one aggregated pool instead, the traffic windows carrying SLA buckets and ISL/OSL histograms
so the ITL-tail rule, its calibration and the attainment feedback run as in ``dynoplan simulate``.

Usage:  .venv/bin/python bench/bench_planner.py [--predictors constant,kalman,arima,prophet,prophet:3,auto]
                                                [--hours 1] [--passes-per-engine 50] [--scale 8] [--repeat 1]
                                                [--mode disagg|agg] [--json OUT]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import time
from pathlib import Path

import numpy as np

from dynoplan.fpm import QueuedRequests, ScheduledRequests
from planner.arguments import warm_start_windows
from planner.core import (
    Observations,
    PassObservation,
    Planner,
    PlannerConfig,
    PoolState,
    TrafficWindow,
)
from planner.core.interpolation import DecodeProfile, PerformanceProfile, PrefillProfile

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT / "examples" / "traces" / "azure_llm_conv_2023.csv"


def bench_profile() -> PerformanceProfile:
    """A smooth synthetic engine: prefill slows with ISL, decode ITL grows with KV usage and context."""
    isl = np.array([128.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0])
    prefill = PrefillProfile(isl, 16.5 + 0.0152 * isl + 4.2e-7 * isl**2, 12000.0 / (1 + isl / 8192.0))
    kv = np.linspace(0.0, 1.0, 21)
    ctx = np.array([256.0, 1024.0, 4096.0, 16384.0])
    itl = 5.74 + 54.01 * kv[:, None] - 25.74 * kv[:, None] ** 2 + 0.0002 * ctx[None, :]
    thpt = kv[:, None] * 500000.0 / ctx[None, :] / (itl / 1000.0) + 1.0
    return PerformanceProfile(prefill, DecodeProfile(kv, ctx, itl, thpt, 500000.0))


def make_passes(
    rng: np.random.Generator, spec: dict[str, int], now_s: float, per_engine: int, load: float
) -> tuple[PassObservation, ...]:
    out = []
    for pool, n in spec.items():
        for w in range(n):
            for i in range(per_engine):
                ts = now_s - 5.0 + 5.0 * (i + 1) / per_engine
                if pool == "agg":  # one pass carries a prompt chunk and the decode batch
                    tok = int(rng.integers(0, 4096) * min(1.0, load / max(n, 1)))
                    kv = int(rng.integers(1000, 300000) * min(1.0, load / max(n, 1) / 4.0))
                    wall = 0.004 + 1.1e-5 * tok + 1.5e-7 * kv + rng.normal(0, 2e-4)
                    s = ScheduledRequests(
                        num_prefill_requests=1 if tok else 0,
                        sum_prefill_tokens=tok,
                        sum_prefill_kv_tokens=tok,
                        num_decode_requests=max(1, kv // 1200),
                        sum_decode_kv_tokens=kv,
                    )
                    q = QueuedRequests(num_prefill_requests=int(load), sum_prefill_tokens=int(load * 900 / max(n, 1)))
                elif pool == "prefill":
                    tok = int(rng.integers(0, 8192) * min(1.0, load / max(n, 1)))
                    wall = 0.0 if tok == 0 else 0.005 + 1.1e-5 * tok + rng.normal(0, 2e-4)
                    s = ScheduledRequests(
                        num_prefill_requests=1 if tok else 0, sum_prefill_tokens=tok, sum_prefill_kv_tokens=tok
                    )
                    q = QueuedRequests(num_prefill_requests=int(load), sum_prefill_tokens=int(load * 900 / max(n, 1)))
                else:
                    kv = int(rng.integers(1000, 300000) * min(1.0, load / max(n, 1) / 4.0))
                    wall = 0.0 if kv == 0 else 0.004 + 1.5e-7 * kv + rng.normal(0, 2e-4)
                    s = ScheduledRequests(num_decode_requests=max(1, kv // 1200) if kv else 0, sum_decode_kv_tokens=kv)
                    q = QueuedRequests()
                out.append(PassObservation(w, 0, max(0.0, wall), s, q, pool=pool, timestamp_s=ts))
    return tuple(out)


def run(predictor: str, hours: float, per_engine: int, scale: float, mode: str = "disagg") -> dict[str, float]:
    name, _, refit = predictor.partition(":")  # "prophet:3" = prophet refitted every 3rd interval
    cfg = PlannerConfig(
        predictor=name,
        load_enabled=True,
        max_gpu_budget=16,
        ttft_ms=500.0,
        itl_ms=50.0,
        prophet_refit_every=int(refit or 1),
        mode=mode,
    )
    intervals = warm_start_windows(TRACE, cfg.adjustment_interval_s)
    pl = Planner(cfg, bench_profile())
    rng = np.random.default_rng(20261130)
    spec = {"prefill": 1, "decode": 1} if mode == "disagg" else {"agg": 2}
    all_ms: list[float] = []
    thpt_ms: list[float] = []
    now = 0.0
    end = hours * 3600.0
    while now <= end + 1e-9:
        k = int(now // cfg.adjustment_interval_s)
        w = intervals[(k - 1) % len(intervals)] if k > 0 else None
        traffic = (
            None
            if w is None
            else TrafficWindow(
                cfg.adjustment_interval_s,
                w.num_requests * scale,
                w.mean_isl_tokens,
                w.mean_osl_tokens,
                300.0,
                20.0,
                8.0,
            )
        )
        if traffic is not None and mode == "agg":
            # agg: the frontend's SLA buckets (0.2 % ITL misses) and length histograms, so the attainment feedback,
            # the ITL-tail rule and its calibration run as they do in `dynoplan simulate`
            n = traffic.num_requests
            traffic = dataclasses.replace(
                traffic,
                num_ttft_observed=n,
                num_ttft_within_sla=n,
                num_finished=n,
                num_itl_within_sla=n - round(0.002 * n),
                isl_buckets=((256.0, 0.2 * n), (1024.0, 0.4 * n), (4096.0, 0.3 * n), (16384.0, 0.1 * n)),
                osl_buckets=((16.0, 0.1 * n), (128.0, 0.3 * n), (512.0, 0.5 * n), (2048.0, 0.1 * n)),
            )
        load = (w.num_requests * scale / 180.0) if w is not None else 1.0
        obs = Observations(
            {p: PoolState(n, n) for p, n in spec.items()}, traffic, make_passes(rng, spec, now, per_engine, load)
        )
        t0 = time.perf_counter()
        r = pl.tick(now, obs)
        dt = (time.perf_counter() - t0) * 1000.0
        all_ms.append(dt)
        if "throughput" in r.diagnostics.loops_run:
            thpt_ms.append(dt)
        if r.decision.targets is not None:
            spec = dict(r.decision.targets)
        now = r.next_tick_s
    a, t = np.array(all_ms), np.array(thpt_ms) if thpt_ms else np.array([math.nan])
    return {
        "ticks": float(a.size),
        "p50_ms": float(np.percentile(a, 50)),
        "p99_ms": float(np.percentile(a, 99)),
        "max_ms": float(a.max()),
        "thpt_ticks": float(len(thpt_ms)),
        "thpt_p50_ms": float(np.percentile(t, 50)),
        "thpt_p99_ms": float(np.percentile(t, 99)),
        "final_fleet": "/".join(str(v) for v in spec.values()),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--predictors",
        default="constant,kalman,arima,prophet,prophet:3,auto",
        help="comma list; NAME:K = prophet_refit_every K",
    )
    ap.add_argument("--hours", type=float, default=1.0)
    ap.add_argument("--passes-per-engine", type=int, default=50)
    ap.add_argument("--scale", type=float, default=8.0, help="multiply the trace's request counts (default 8)")
    ap.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="runs per predictor; the run with the lowest p99 is shown (damps noise on a shared machine)",
    )
    ap.add_argument(
        "--mode",
        choices=("disagg", "agg"),
        default="disagg",
        help="disagg (default) or agg (adds SLA buckets and length histograms: ITL-tail rule and calibration)",
    )
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    names = [x.strip() for x in args.predictors.split(",") if x.strip()]
    if "constant" not in names:
        names.insert(0, "constant")
    load_before = os.getloadavg()[0]
    results = {}
    for n in names:
        runs = [run(n, args.hours, args.passes_per_engine, args.scale, args.mode) for _ in range(max(1, args.repeat))]
        results[n] = min(runs, key=lambda r: r["p99_ms"])
    target = {"constant": 50.0, "kalman": 50.0}
    ref = results["constant"]["p99_ms"]
    print(
        f"planner tick time ({args.mode}), {args.hours:g} h of 5 s ticks, "
        f"{args.passes_per_engine} FPM passes/engine/tick, "
        f"throughput loop every 180 s, Azure conv trace x{args.scale:g}, best of {max(1, args.repeat)} run(s); "
        f"1-min load average {load_before:.2f} before / {os.getloadavg()[0]:.2f} after on {os.cpu_count()} CPUs"
    )
    print(
        f"{'predictor':<10} {'ticks':>6} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'thpt p50':>9} {'thpt p99':>9} "
        f"{'p99/const':>9} {'target':>7} {'fleet':>9}"
    )
    for n, r in results.items():
        tgt = target.get(n.partition(":")[0], 500.0)
        ok = "ok" if r["p99_ms"] < tgt else "MISS"
        print(
            f"{n:<10} {int(r['ticks']):>6} {r['p50_ms']:>8.2f} {r['p99_ms']:>8.2f} {r['max_ms']:>8.1f} "
            f"{r['thpt_p50_ms']:>9.2f} {r['thpt_p99_ms']:>9.2f} {r['p99_ms'] / ref:>9.2f} "
            f"{'<' + format(tgt, 'g'):>5} {ok:<4}"
            f"{r['final_fleet']:>5}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
