"""Live mocker benchmarks (prints figures; asserts nothing about time).

1. Agreement, live vs offline: the same trace slice through one live worker process at speedup R
   (arrivals compressed by R by the load generator) and through the offline replay at speedup 1.
   Live times are multiplied by R to read simulated milliseconds. Two live views are printed:
   - engine side: the worker's own request records (``GET /records``; the core's timeline, arrivals
     stamped by the wall clock when the HTTP request reaches the worker);
   - client side: the load generator's measurements (HTTP + event-loop delivery included).
   A third column replays offline the arrivals *as the worker stamped them*: the live engine timeline
   must equal it (the driver never shifts the simulated timeline), so any residual of the live engine
   against the trace replay is arrival-stamp drift — the load generator sending late and the worker's
   busy event loop reading requests late — which queueing then amplifies in TTFT. Client-side residual
   on top is delivery lag of the worker process (``dynoplan_mocker_driver_lag_seconds``), which grows
   with CPU contention on the machine.
2. Capacity: one worker at a high speedup, Poisson load at increasing request rates; for each rate the
   engine-side and client-side mean TTFT/ITL, the driver's mean lag and the streamed tokens per wall
   second. The sustainable rate is the highest one at which the client-side mean ITL stays within 25%
   of the engine-side one and the driver delivers tokens within 5 ms of the simulated timeline on average
   (beyond it, the process's own overhead, not the simulated engine, sets latency).

3. ``--sensitivity``: the offline replay alone with every arrival delayed by a random exponential amount —
   how much TTFT p90/p99 move for a given arrival jitter (the scale of residual the live drift explains).

Usage: ``nice -n -5 .venv/bin/python bench/bench_live.py [--trace FILE] [--requests N] [--speedup R]
[--repeat K] [--sensitivity] [--skip-capacity]``
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import requests as http
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mocker.config import EngineConfig  # noqa: E402
from mocker.fleet import FleetConfig, run_replay  # noqa: E402
from mocker.live.loadgen import LoadgenResult  # noqa: E402
from mocker.records import RequestRecord, TraceRequest  # noqa: E402
from mocker.report import build_report  # noqa: E402
from mocker.traces import load_trace  # noqa: E402

DYNOPLAN = [sys.executable, "-m", "planner.cli"]
KEYS = [f"{s}_{d}_ms" for d in ("ttft", "itl", "e2e_latency") for s in ("mean", "median", "p90", "p99")]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Proc:
    def __init__(self, argv: list[str], log: Path) -> None:
        with open(log, "ab") as f:
            # its own process group (stopped with killpg) but the bench's session: with the kernel's autogroup
            # scheduling (sched_autogroup_enabled=1 here) CPU is shared fairly between *sessions* and a nice
            # value only ranks processes within one, so a worker in a new session would escape `nice -n -5`
            # and compete as one more equal group on a loaded machine (measured: mean driver lag 26 ms wall)
            self.p = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, process_group=0, cwd=ROOT)

    def stop(self) -> None:
        if self.p.poll() is None:
            os.killpg(self.p.pid, signal.SIGTERM)
            try:
                self.p.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.p.pid, signal.SIGKILL)
                self.p.wait()


def start_worker(tmp: Path, speedup: float, extra: list[str]) -> tuple[Proc, str]:
    port = free_port()
    w = Proc(
        DYNOPLAN
        + [
            "mocker",
            "serve",
            "--port",
            str(port),
            "--speedup-ratio",
            str(speedup),
            "--fpm-endpoint",
            "off",
            "--kv-events-endpoint",
            "off",
            *extra,
        ],
        tmp / f"worker-{port}.log",
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if http.get(url + "/ready", timeout=1).status_code == 200:
                return w, url
        except http.RequestException:
            pass
        if w.p.poll() is not None:
            raise RuntimeError((tmp / f"worker-{port}.log").read_text())
        time.sleep(0.05)
    raise RuntimeError("worker not ready")


def run_loadgen(url: str, trace: str, compression: float, n: int, out: Path, tbs: int, scale: float) -> dict[str, Any]:
    subprocess.run(
        DYNOPLAN
        + [
            "loadgen",
            "--quiet",
            "--url",
            url,
            "--trace",
            trace,
            "--time-compression",
            str(compression),
            "--max-requests",
            str(n),
            "--trace-block-size",
            str(tbs),
            "--scale-ms",
            str(scale),
            "--report-json",
            str(out),
        ],
        check=False,
        cwd=ROOT,
        timeout=3600,
    )
    return json.loads(out.read_text())


def engine_side(url: str, scale: float) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    raw = http.get(url + "/records", timeout=30).json()
    recs = []
    for d in raw:
        r = RequestRecord(
            d["request_id"],
            d["arrival_ms"] * scale,
            d["input_length"],
            d["output_length"],
            admit_ms=None if d["admit_ms"] is None else d["admit_ms"] * scale,
            first_token_ms=None if d["first_token_ms"] is None else d["first_token_ms"] * scale,
            token_times_ms=[t * scale for t in d["token_times_ms"]],
            finish_ms=None if d["finish_ms"] is None else d["finish_ms"] * scale,
            cached_tokens=d["cached_tokens"],
            num_preemptions=d["num_preemptions"],
            status=d["status"],
        )
        recs.append(r)
    if recs:  # rebase to the first arrival, as the offline replay's clock starts at the trace's origin
        t0 = min(r.arrival_ms for r in recs)
        for r in recs:
            r.arrival_ms -= t0
            r.admit_ms = None if r.admit_ms is None else r.admit_ms - t0
            r.first_token_ms = None if r.first_token_ms is None else r.first_token_ms - t0
            r.finish_ms = None if r.finish_ms is None else r.finish_ms - t0
            r.token_times_ms = [t - t0 for t in r.token_times_ms]
    return build_report(LoadgenResult(records=recs)), raw  # type: ignore[arg-type]


def agreement(args: argparse.Namespace, tmp: Path, console: Console) -> dict[str, float]:
    """One live-vs-offline run: prints the table, returns the live-engine and live-client relative
    differences (%) of TTFT p90/p99 against the offline trace replay, and the mean driver lag (wall ms)."""
    reqs = load_trace(args.trace, trace_block_size=args.trace_block_size)[: args.requests]
    t0 = time.perf_counter()
    off = build_report(
        run_replay(reqs, EngineConfig(trace_block_size=args.trace_block_size), FleetConfig(num_workers=1))
    )
    off_s = time.perf_counter() - t0
    w, url = start_worker(tmp, args.speedup, ["--trace-block-size", str(args.trace_block_size)])
    try:
        t1 = time.perf_counter()
        cli = run_loadgen(
            url, args.trace, args.speedup, args.requests, tmp / "agree.json", args.trace_block_size, args.speedup
        )
        live_s = time.perf_counter() - t1
        eng, raw = engine_side(url, args.speedup)
        info = http.get(url + "/metrics", timeout=5).text
    finally:
        w.stop()
    # the offline replay of the arrivals exactly as the live worker stamped them (x R, rebased): the live
    # engine timeline must equal it; any residual against the trace replay is arrival-stamp drift
    t0s = min(d["arrival_ms"] for d in raw)
    stamped = [
        TraceRequest(i, (d["arrival_ms"] - t0s) * args.speedup, d["input_length"], d["output_length"], None)
        for i, d in enumerate(sorted(raw, key=lambda d: (d["arrival_ms"], d["request_id"])))
    ]
    off_st = build_report(
        run_replay(stamped, EngineConfig(trace_block_size=args.trace_block_size), FleetConfig(num_workers=1))
    )
    lag = _metric_mean(info, "dynoplan_mocker_driver_lag_seconds")
    tab = Table(
        title=f"live (speedup {args.speedup:g}, x{args.speedup:g} to simulated ms) vs offline — "
        f"{args.requests} requests of {Path(args.trace).name}, 1 worker"
    )
    for c in (
        "metric",
        "offline (trace)",
        "live engine",
        "diff",
        "live client",
        "diff",
        "offline (live arrivals)",
        "engine diff",
    ):
        tab.add_column(c, justify="right")
    for k in ["completed_requests", "total_output_tokens", *KEYS]:
        o, e, c, os_ = off[k], eng[k], cli[k], off_st[k]
        tab.add_row(k, _f(o), _f(e), _rel(e, o), _f(c), _rel(c, o), _f(os_), _rel(e, os_))
    console.print(tab)
    late = [
        a - b
        for a, b in zip(
            sorted((d["arrival_ms"] - t0s) * args.speedup for d in raw),
            sorted(r.arrival_ms - reqs[0].arrival_ms for r in reqs),
        )
    ]
    console.print(f"arrival stamps vs trace (simulated ms): mean {sum(late) / len(late):+.2f}, max {max(late):+.2f}")
    console.print(
        f"offline replay {off_s:.2f} s CPU; live run {live_s:.1f} s wall; mean driver lag "
        f"{lag * 1000:.3f} ms wall ({lag * 1000 * args.speedup:.2f} simulated ms); failed client requests "
        f"{cli['failed_requests']}"
    )
    out = {
        f"{side} {k}": (src[k] - off[k]) / off[k] * 100
        for side, src in (("engine", eng), ("client", cli))
        for k in ("p90_ttft_ms", "p99_ttft_ms")
    }
    out["driver lag ms"] = lag * 1000
    return out


def sensitivity(args: argparse.Namespace, console: Console) -> None:
    """How far the *offline* replay's TTFT p90/p99 move when every arrival is delayed by a random
    exponential amount (no live process involved): the scale of the live residual a given arrival jitter
    explains. 12 seeds per mean delay; delays in wall ms at the live speedup (x speedup in simulated ms)."""
    import numpy as np

    reqs = load_trace(args.trace, trace_block_size=args.trace_block_size)[: args.requests]
    eng = EngineConfig(trace_block_size=args.trace_block_size)
    base = build_report(run_replay(reqs, eng, FleetConfig(num_workers=1)))
    tab = Table(
        title="offline replay with arrivals delayed by exp(mean) — TTFT diffs vs the undelayed replay, 12 seeds"
    )
    for c in ("mean delay (wall ms)", "p90 median", "p90 min .. max", "p99 median", "p99 min .. max"):
        tab.add_column(c, justify="right")
    for mean_ms in (0.25, 0.5, 1.0, 2.0):
        rows = []
        for seed in range(12):
            d = np.random.default_rng(seed).exponential(mean_ms * args.speedup, len(reqs))
            moved = sorted((r.arrival_ms + x, r.request_id, r) for r, x in zip(reqs, d))
            jr = [TraceRequest(i, a, r.input_length, r.output_length, r.hash_ids) for i, (a, _, r) in enumerate(moved)]
            rep = build_report(run_replay(jr, eng, FleetConfig(num_workers=1)))
            rows.append([(rep[k] - base[k]) / base[k] * 100 for k in ("p90_ttft_ms", "p99_ttft_ms")])
        a = np.array(rows)
        tab.add_row(
            f"{mean_ms:g}",
            f"{np.median(a[:, 0]):+.2f}%",
            f"{a[:, 0].min():+.2f} .. {a[:, 0].max():+.2f}",
            f"{np.median(a[:, 1]):+.2f}%",
            f"{a[:, 1].min():+.2f} .. {a[:, 1].max():+.2f}",
        )
    console.print(tab)


def capacity(args: argparse.Namespace, tmp: Path, console: Console) -> None:
    speed = args.capacity_speedup
    tab = Table(title=f"single-worker capacity at speedup {speed:g} (ISL 512, OSL 128, Poisson; latencies in wall ms)")
    for c in (
        "req/s",
        "completed",
        "engine TTFT",
        "client TTFT",
        "engine ITL",
        "client ITL",
        "ITL ratio",
        "driver lag",
        "tokens/s streamed",
        "passes/s",
    ):
        tab.add_column(c, justify="right")
    best = None
    for rate in args.rates:
        n = int(max(50, rate * args.capacity_seconds))
        w, url = start_worker(tmp, speed, ["--max-num-seqs", "1024"])
        try:
            spec = f"synthetic:poisson?rate={rate}&num_requests={n}&isl=512&osl=128&seed=1"
            cli = run_loadgen(url, spec, 1.0, n, tmp / f"cap-{rate}.json", 512, 1.0)
            eng, _ = engine_side(url, 1.0)
            m = http.get(url + "/metrics", timeout=5).text
        finally:
            w.stop()
        lag = _metric_mean(m, "dynoplan_mocker_driver_lag_seconds") * 1000
        passes = _metric_value(m, "dynoplan_mocker_forward_passes_total")
        ratio = cli["mean_itl_ms"] / eng["mean_itl_ms"] if eng["mean_itl_ms"] else float("nan")
        tps = cli["total_output_tokens"] / cli["wall_time_s"]
        tab.add_row(
            f"{rate:g}",
            f"{cli['completed_requests']}/{n}",
            f"{eng['mean_ttft_ms']:.3f}",
            f"{cli['mean_ttft_ms']:.3f}",
            f"{eng['mean_itl_ms']:.3f}",
            f"{cli['mean_itl_ms']:.3f}",
            f"{ratio:.2f}",
            f"{lag:.3f}",
            f"{tps:.0f}",
            f"{passes / cli['wall_time_s']:.0f}",
        )
        if ratio <= 1.25 and lag <= 5.0 and cli["failed_requests"] == 0:
            best = (rate, tps)
    console.print(tab)
    if best:
        console.print(
            "highest sustainable rate (client ITL within 25% of engine ITL, mean driver lag <= 5 ms): "
            f"{best[0]:g} req/s, {best[1]:.0f} streamed tokens/s"
        )
    else:
        console.print("no rate met the 25% criterion")


def _metric_value(text: str, name: str) -> float:
    return sum(
        float(ln.split()[-1]) for ln in text.splitlines() if ln.startswith(name + "{") or ln.startswith(name + " ")
    )


def _metric_mean(text: str, name: str) -> float:
    c = _metric_value(text, name + "_count")
    return _metric_value(text, name + "_sum") / c if c else 0.0


def _f(v: Any) -> str:
    return f"{v:.3f}" if isinstance(v, float) else str(v)


def _rel(a: Any, b: Any) -> str:
    try:
        return f"{(a - b) / b * 100:+.2f}%" if b else "-"
    except TypeError:
        return "-"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", default=str(ROOT / "examples/traces/azure_llm_conv_2023.csv"))
    ap.add_argument("--requests", type=int, default=600)
    ap.add_argument("--trace-block-size", type=int, default=512)
    ap.add_argument("--speedup", type=float, default=10.0)
    ap.add_argument("--capacity-speedup", type=float, default=10.0)
    ap.add_argument("--rates", type=float, nargs="+", default=[5, 10, 20, 40, 80])
    ap.add_argument("--capacity-seconds", type=float, default=6.0)
    ap.add_argument("--skip-agreement", action="store_true")
    ap.add_argument("--skip-capacity", action="store_true")
    ap.add_argument(
        "--repeat", type=int, default=1, help="agreement runs (the machine's load varies: quote the spread)"
    )
    ap.add_argument("--sensitivity", action="store_true", help="also: offline TTFT p90/p99 under random arrival delays")
    args = ap.parse_args()
    console = Console(width=170)
    with tempfile.TemporaryDirectory(prefix="bench-live-") as d:
        if not args.skip_agreement:
            runs = [agreement(args, Path(d), console) for _ in range(args.repeat)]
            if args.repeat > 1:
                tab = Table(
                    title=f"{args.repeat} live runs vs the offline trace replay "
                    "(TTFT diffs in %, driver lag in wall ms)"
                )
                tab.add_column("")
                for i in range(args.repeat):
                    tab.add_column(f"run {i + 1}", justify="right")
                tab.add_column("median", justify="right")
                tab.add_column("min .. max", justify="right")
                for k in runs[0]:
                    v = sorted(r[k] for r in runs)
                    med = v[len(v) // 2] if len(v) % 2 else (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2
                    tab.add_row(k, *(f"{r[k]:+.2f}" for r in runs), f"{med:+.2f}", f"{v[0]:+.2f} .. {v[-1]:+.2f}")
                console.print(tab)
        if args.sensitivity:
            sensitivity(args, console)
        if not args.skip_capacity:
            capacity(args, Path(d), console)


if __name__ == "__main__":
    main()
