"""Fidelity and speed of ``dynoplan``'s offline replay against the reference (Dynamo Mocker 1.6.1 replay).

Runs both simulators side by side, in the same session, on:

  (a)  Azure conversation trace, 4 workers, round_robin, block size 64 (default engine otherwise)
  (b)  Mooncake conversation trace, 8 workers, KV-aware routing (reference ``--router kv_router``)
  (a1) as (a) with 1 worker
  (d)  as (a) disaggregated: 2 prefill + 2 decode workers, KV transfer 64 GB/s x 131072 B/token (not in the
       default --cases; run with --cases d)
  (ds) as (d) with the SGLang engine (reference ``--engine '{"engine":{"backend":"sglang",...}}' --disagg``;
       SGLang's coordinated handoff is destination-first)
  (s)  Azure, 4 workers, SGLang engine; (sk) Mooncake, 4 workers, SGLang, KV-aware routing, 262144 pages
       (with the default 16384 pages the reference itself stops: "effect-free zero-duration pass"; the
       reference needs ~6 minutes). Run through bench/bench_sglang.py (default --cases s there).

and prints, per case: the relative difference of mean/p50/p90/p99 TTFT, ITL and E2E (both reports use the
reference's key names; for (b), whose reference breaks KV-router ties at random, against the mean of several
reference runs, with their own spread), for (a) the share of requests whose TTFT and E2E are both within 0.1%
of the reference's (requests paired by arrival time, ISL and OSL), simulated requests per wall-second of both
and their ratio, and the peak resident memory of each process. Each simulator runs in its own child process
(wall time = trace parsing + replay + report inside the process, the reference's ``outer_wall_s``; peak RSS
and process CPU from ``wait4``, through a small launcher process, :data:`LAUNCHER`; whole-process wall from the
launcher's clock; the min and the median of the runs; our child gets a bytecode cache as the installed reference has,
:func:`bytecode_env`). Figures only, no assertions.

Usage:  .venv/bin/python bench/bench_replay.py [--cases a,b,a1] [--repeat N] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = os.environ.get("REFERENCE_REPLAY", "/work/shared/tools/reference-replay")
TRACES = ROOT / "examples" / "traces"
CASES = {
    "a": dict(
        trace=TRACES / "azure_llm_conv_2023.csv",
        workers=4,
        router="round_robin",
        ref_router="round_robin",
        engine={"block_size": 64},
        tol=0.005,
    ),
    "b": dict(
        trace=TRACES / "mooncake_conversation.jsonl",
        workers=8,
        router="kv",
        ref_router="kv_router",
        engine={},
        tol=0.02,
    ),
    # (d) disaggregated: 2 prefill + 2 decode workers, KV transfer 64 GB/s x 131072 B/token (reference --disagg)
    "d": dict(
        trace=TRACES / "azure_llm_conv_2023.csv",
        workers=4,
        router="round_robin",
        ref_router="round_robin",
        engine={},
        tol=0.01,
        disagg=dict(prefill=2, decode=2, kv_transfer_bandwidth=64, kv_transfer_bytes_per_token=131072),
    ),
    "a1": dict(
        trace=TRACES / "azure_llm_conv_2023.csv",
        workers=1,
        router="round_robin",
        ref_router="round_robin",
        engine={"block_size": 64},
        tol=0.005,
    ),
    "ds": dict(
        trace=TRACES / "azure_llm_conv_2023.csv",
        workers=4,
        router="round_robin",
        ref_router="round_robin",
        engine={"backend": "sglang"},
        tol=0.03,
        disagg=dict(prefill=2, decode=2, kv_transfer_bandwidth=64, kv_transfer_bytes_per_token=131072),
    ),
    "s": dict(
        trace=TRACES / "azure_llm_conv_2023.csv",
        workers=4,
        router="round_robin",
        ref_router="round_robin",
        engine={"backend": "sglang"},
        tol=0.03,
    ),
    "sk": dict(
        trace=TRACES / "mooncake_conversation.jsonl",
        workers=4,
        router="kv",
        ref_router="kv_router",
        engine={"backend": "sglang", "num_gpu_blocks": 262144},
        tol=0.03,
    ),
}
METRICS = [(m, s) for m in ("ttft", "itl", "e2e_latency") for s in ("mean", "median", "p90", "p99")]


# ------------------------------------------------------------------------------------------ child: dynoplan
def child(case: str, out: str) -> None:
    sys.path.insert(0, str(ROOT))
    from mocker.config import EngineConfig
    from mocker.fleet import FleetConfig, run_replay
    from mocker.report import build_report
    from mocker.traces import load_trace

    c = CASES[case]
    t0 = time.perf_counter()
    reqs = load_trace(c["trace"])
    t1 = time.perf_counter()
    if "disagg" in c:
        from mocker.transfer import KvTransferConfig

        d = c["disagg"]
        fc = FleetConfig(
            num_prefill_workers=d["prefill"],
            num_decode_workers=d["decode"],
            router=c["router"],
            transfer=KvTransferConfig(d["kv_transfer_bandwidth"], d["kv_transfer_bytes_per_token"]),
        )
    else:
        fc = FleetConfig(num_workers=c["workers"], router=c["router"])
    res = run_replay(reqs, EngineConfig.from_mapping(c["engine"]), fc)
    t2 = time.perf_counter()
    rep = build_report(res)
    t3 = time.perf_counter()
    rec = res.records
    per = dict(
        arrival=[r.arrival_ms for r in rec],
        isl=[r.input_length for r in rec],
        osl=[r.output_length for r in rec],
        ttft=[r.ttft_ms for r in rec],
        e2e=[r.e2e_ms for r in rec],
    )
    import msgspec  # a dependency of mocker (its trace reader); encodes the output several times faster than json

    Path(out).write_bytes(
        msgspec.json.encode(
            dict(report=rep, per=per, wall_s=t3 - t0, parse_s=t1 - t0, replay_s=t2 - t1, report_s=t3 - t2, n=len(reqs))
        )
    )
    # The process ends as `dynoplan replay` ends, without the interpreter's teardown (the output file is
    # written and closed; mocker.cli_replay.exit_without_teardown).
    from mocker.cli_replay import exit_without_teardown

    exit_without_teardown(0)


def bytecode_env(cache_dir: Path) -> dict[str, str]:
    """Environment for our child: Python bytecode cached under ``cache_dir`` (outside the source tree), as
    the reference's installed package has it (969 .pyc files). Without it a session that sets
    PYTHONDONTWRITEBYTECODE makes every child recompile all mocker modules (about 0.1 s of CPU per run)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(cache_dir)
    return env


# The launcher: a small Python process, started before this one holds any data, that starts every measured
# child and returns its wait4 figures. Linux carries a process's peak RSS across fork + exec (the kernel keeps
# the larger of the old and new address space's high-water mark), so a child started from this process (which
# grows to hundreds of MiB of reference rows) would report this process's size as its own peak. Started from
# the launcher (about 10 MiB), a child's peak is its own, floored at the launcher's size.
LAUNCHER = """
import json, os, subprocess, sys, tempfile, time
for line in sys.stdin:
    job = json.loads(line)
    t = time.perf_counter()
    with tempfile.TemporaryFile() as errf:  # a file, not a pipe: a chatty child must not block on a full pipe
        p = subprocess.Popen(job["cmd"], stdout=subprocess.DEVNULL, stderr=errf, env=job["env"])
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t
        errf.seek(0)
        err = errf.read().decode(errors="replace")
    print(json.dumps(dict(wall=wall, rc=os.waitstatus_to_exitcode(status), maxrss_kib=ru.ru_maxrss,
                          cpu=ru.ru_utime + ru.ru_stime, err=err[-2000:])), flush=True)
"""


class Launcher:
    """The launcher process (:data:`LAUNCHER`); :meth:`run` starts one child through it."""

    def __init__(self) -> None:
        self._p = subprocess.Popen(
            [sys.executable, "-c", LAUNCHER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )

    def run(self, cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, int, float]:
        """Run ``cmd`` to its end; returns (whole-process wall seconds, peak RSS in MiB, CPU seconds
        user+system), from the launcher's ``wait4``. A failing child ends the benchmark with its stderr."""
        assert self._p.stdin is not None and self._p.stdout is not None
        self._p.stdin.write(json.dumps(dict(cmd=cmd, env=dict(os.environ) if env is None else env)) + "\n")
        self._p.stdin.flush()
        r = json.loads(self._p.stdout.readline())
        if r["rc"] != 0:
            raise SystemExit(f"child failed ({' '.join(cmd[:4])} ...): {r['err']}")
        return r["wall"], r["maxrss_kib"] // 1024, r["cpu"]

    def close(self) -> None:
        assert self._p.stdin is not None
        self._p.stdin.close()
        self._p.wait()


# ------------------------------------------------------------------------------------------ comparison
def per_request_share(mine: dict, ref_rows: list[dict]) -> tuple[float, int]:
    """Share of requests whose TTFT and E2E are both within 0.1% of the reference's.

    Pairs requests by (arrival ms, ISL, OSL); requests identical in all three are interchangeable and are
    paired in order of E2E on both sides."""
    groups: dict[tuple, list[tuple[float, float]]] = defaultdict(list)
    for r in ref_rows:
        groups[(round(r["arrival_time_ms"], 3), r["input_length"], r["output_length"])].append(
            (r["e2e_latency_ms"], r["ttft_ms"])
        )
    mine_groups: dict[tuple, list[tuple[float, float]]] = defaultdict(list)
    for a, i, o, t, e in zip(mine["arrival"], mine["isl"], mine["osl"], mine["ttft"], mine["e2e"]):
        mine_groups[(round(a, 3), i, o)].append((e if e is not None else math.nan, t if t is not None else math.nan))
    ok = total = 0
    for key, refs in groups.items():
        ms = sorted(mine_groups.get(key, []))
        for (re_, rt), (me, mt) in zip(sorted(refs), ms):
            total += 1
            ok += abs(mt - rt) <= 1e-3 * abs(rt) and abs(me - re_) <= 1e-3 * abs(re_)
        total += max(0, len(refs) - len(ms))
    return ok / max(total, 1), total


def main(default_cases: str = "a,b,a1", description: str | None = None) -> None:
    ap = argparse.ArgumentParser(description=description or __doc__.split("\n\n")[0])
    ap.add_argument("--cases", default=default_cases, help=f"comma-separated, of {','.join(CASES)}")
    ap.add_argument("--repeat", type=int, default=1, help="runs per simulator and case; the fastest counts for speed")
    ap.add_argument(
        "--ref-runs-b",
        type=int,
        default=5,
        help="reference runs for (b): its KV router breaks ties at random, so fidelity is measured "
        "against the mean of these runs and their own spread is printed",
    )
    ap.add_argument("--json", help="write all figures here")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a.child, a.out)
        return
    # numpy only here, in the parent: the child's first import is mocker's, as in `dynoplan replay`, so that its
    # process defaults (dynoplan/__init__.py) apply before numpy is loaded
    import numpy as np

    launcher = Launcher()  # first: before this process holds any data (see LAUNCHER)
    results = {}
    tmp = Path(tempfile.mkdtemp(prefix="bench_replay_"))
    env = bytecode_env(tmp / "pycache")
    # compile once, untimed (the reference's bytecode was compiled at install time)
    subprocess.run(
        [
            sys.executable,
            "-c",
            f"import sys; sys.path.insert(0, {str(ROOT)!r}); "
            "import mocker.fleet, mocker.report, mocker.traces, mocker.transfer",
        ],
        env=env,
        check=True,
    )
    for case in a.cases.split(","):
        c = CASES[case]
        best_mine = best_ref = None
        ref_reports: list[dict] = []
        # per run: in-process wall s, whole-process wall s, process CPU s, peak RSS MiB
        runs: dict[str, list[tuple[float, float, float, int]]] = {"mine": [], "ref": []}
        for k in range(max(a.repeat, a.ref_runs_b if case == "b" else 1)):
            mine_out = tmp / f"{case}_mine.json"
            wall_m, rss_m, cpu_m = launcher.run(
                [sys.executable, __file__, "--child", case, "--out", str(mine_out)], env
            )
            mine = json.loads(mine_out.read_text())
            runs["mine"].append((mine["wall_s"], wall_m, cpu_m, rss_m))
            if best_mine is None or mine["wall_s"] < best_mine["wall_s"]:
                best_mine = mine
            ref_json, ref_per = tmp / f"{case}_ref.json", tmp / f"{case}_ref.jsonl"
            cmd = [
                REFERENCE,
                "--trace",
                str(c["trace"]),
                "--workers",
                str(c["workers"]),
                "--router",
                c["ref_router"],
                "--engine",
                json.dumps({"engine": c["engine"]}),
                "--per-request",
                str(ref_per),
                "--json",
                str(ref_json),
            ]
            if "disagg" in c:
                d = c["disagg"]
                cmd[cmd.index("--engine") + 1] = json.dumps(
                    {
                        "engine": {
                            **c["engine"],
                            **{k: d[k] for k in ("kv_transfer_bandwidth", "kv_transfer_bytes_per_token")},
                        }
                    }
                )
                cmd += ["--disagg", "--prefill-workers", str(d["prefill"]), "--decode-workers", str(d["decode"])]
            wall_r, rss_r, cpu_r = launcher.run(cmd)
            ref = json.loads(ref_json.read_text())
            ref_reports.append(ref)
            runs["ref"].append((ref["outer_wall_s"], wall_r, cpu_r, rss_r))
            if best_ref is None or ref["outer_wall_s"] < best_ref[0]["outer_wall_s"]:
                best_ref = (ref, [json.loads(line) for line in ref_per.read_text().splitlines()])
        assert best_mine is not None and best_ref is not None
        mine, (ref, ref_rows) = best_mine, best_ref
        rep = mine["report"]
        keys = [f"{s}_{m}_ms" for m, s in METRICS]
        ref_mean = {k: float(np.mean([r[k] for r in ref_reports])) for k in keys}
        diffs = {k[:-3]: (rep[k] - ref_mean[k]) / ref_mean[k] for k in keys}
        spread = {k[:-3]: (max(r[k] for r in ref_reports) - min(r[k] for r in ref_reports)) / ref_mean[k] for k in keys}
        share, paired = per_request_share(mine["per"], ref_rows)
        n = mine["n"]
        fig = {
            who: {
                stat: dict(zip(("wall_s", "process_wall_s", "process_cpu_s", "peak_rss_mib"), f(np.array(rs).T)))
                for stat, f in (("min", lambda a: a.min(axis=1)), ("median", lambda a: np.median(a, axis=1)))
            }
            for who, rs in runs.items()
        }
        fig = {w: {s: {k: float(v) for k, v in d.items()} for s, d in st.items()} for w, st in fig.items()}
        results[case] = dict(
            rel_diff=diffs,
            max_abs_rel_diff=max(abs(v) for v in diffs.values()),
            tolerance=c["tol"],
            reference_runs=len(ref_reports),
            reference_spread=spread,
            per_request_within_0p1pct=share,
            paired=paired,
            n=n,
            runs=runs,
            figures=fig,
            dynoplan_req_per_s=n / mine["wall_s"],
            reference_req_per_s=n / ref["outer_wall_s"],
            speed_ratio=fig["ref"]["min"]["wall_s"] / fig["mine"]["min"]["wall_s"],
            process_wall_ratio=fig["ref"]["min"]["process_wall_s"] / fig["mine"]["min"]["process_wall_s"],
            cpu_ratio=fig["ref"]["min"]["process_cpu_s"] / fig["mine"]["min"]["process_cpu_s"],
            median_speed_ratio=fig["ref"]["median"]["wall_s"] / fig["mine"]["median"]["wall_s"],
            median_process_wall_ratio=fig["ref"]["median"]["process_wall_s"] / fig["mine"]["median"]["process_wall_s"],
            median_cpu_ratio=fig["ref"]["median"]["process_cpu_s"] / fig["mine"]["median"]["process_cpu_s"],
            dynoplan_wall_s=mine["wall_s"],
            dynoplan_parse_s=mine["parse_s"],
            dynoplan_replay_s=mine["replay_s"],
            dynoplan_report_s=mine["report_s"],
            reference_wall_s=ref["outer_wall_s"],
            reference_internal_wall_s=ref.get("wall_time_ms", float("nan")) / 1000.0,
            dynoplan_peak_rss_mib=max(r[3] for r in runs["mine"]),
            reference_peak_rss_mib=max(r[3] for r in runs["ref"]),
            dynoplan_process_cpu_s=fig["mine"]["min"]["process_cpu_s"],
            reference_process_cpu_s=fig["ref"]["min"]["process_cpu_s"],
            prefix_cache_reused_ratio=(rep.get("prefix_cache_reused_ratio"), ref.get("prefix_cache_reused_ratio")),
        )
        print_case(case, c, results[case])
    launcher.close()
    print_summary(results)
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))


def print_case(case: str, c: dict, r: dict) -> None:
    fleet = (
        f"{c['disagg']['prefill']} prefill + {c['disagg']['decode']} decode workers"
        if "disagg" in c
        else f"{c['workers']} worker(s)"
    )
    print(f"\n== ({case}) {Path(c['trace']).name}, {fleet}, router {c['router']}, engine {c['engine'] or 'defaults'}")
    print(f"{'metric':<12}{'mean':>10}{'p50':>10}{'p90':>10}{'p99':>10}   (relative difference dynoplan vs reference)")
    for m in ("ttft", "itl", "e2e_latency"):
        row = [r["rel_diff"][f"{s}_{m}"] for s in ("mean", "median", "p90", "p99")]
        print(f"{m:<12}" + "".join(f"{v * 100:>9.3f}%" for v in row))
    if r["reference_runs"] > 1:
        print(
            f"{'ref spread':<12}"
            + "".join(
                f"{r['reference_spread'][f'{s}_{m}'] * 100:>9.3f}%"
                for m in ("ttft",)
                for s in ("mean", "median", "p90", "p99")
            )
            + "   (ttft)"
        )
        for m in ("itl", "e2e_latency"):
            print(
                f"{'':<12}"
                + "".join(f"{r['reference_spread'][f'{s}_{m}'] * 100:>9.3f}%" for s in ("mean", "median", "p90", "p99"))
                + f"   ({m})"
            )
        print(
            f"(differences above are against the mean of {r['reference_runs']} reference runs; 'ref spread' = "
            "(max - min) / mean over those runs)"
        )
    verdict = "OK" if r["max_abs_rel_diff"] <= r["tolerance"] else "OVER"
    print(
        f"max |diff| {r['max_abs_rel_diff'] * 100:.3f}% (target {r['tolerance'] * 100:.1f}%: {verdict});"
        f" per-request TTFT&E2E within 0.1%: {r['per_request_within_0p1pct'] * 100:.2f}% of {r['paired']}"
    )
    p = r["prefix_cache_reused_ratio"]
    print(f"prefix_cache_reused_ratio dynoplan {p[0]:.4f} reference {p[1]:.4f}")
    print(
        f"speed: dynoplan {r['dynoplan_req_per_s']:.0f} req/s ({r['dynoplan_wall_s']:.2f} s = "
        f"parse {r['dynoplan_parse_s']:.2f}"
        f" + replay {r['dynoplan_replay_s']:.2f} + report {r['dynoplan_report_s']:.2f}), reference "
        f"{r['reference_req_per_s']:.0f} req/s ({r['reference_wall_s']:.2f} s), ratio {r['speed_ratio']:.2f}"
    )
    f = r["figures"]
    for label, key in (
        ("in-process wall", "wall_s"),
        ("whole-process wall", "process_wall_s"),
        ("whole-process CPU", "process_cpu_s"),
    ):
        m, rf = f["mine"], f["ref"]
        print(
            f"{label + ' s':<22} dynoplan min {m['min'][key]:.2f} median {m['median'][key]:.2f}, reference min "
            f"{rf['min'][key]:.2f} median {rf['median'][key]:.2f}; ratio min {rf['min'][key] / m['min'][key]:.2f} "
            f"median {rf['median'][key] / m['median'][key]:.2f}"
        )
    print(
        f"peak RSS (max over {len(r['runs']['mine'])} runs): dynoplan {r['dynoplan_peak_rss_mib']} MiB, "
        f"reference {r['reference_peak_rss_mib']} MiB"
    )


def print_summary(results: dict) -> None:
    """One line per case: fidelity, then the speed ratios reference / dynoplan (min of the runs; median in
    parentheses) in-process wall, whole-process wall and whole-process CPU, and peak RSS."""
    print(
        "\ncase  max|diff|  within-0.1%  req/s ours/ref   wall ratio    proc-wall ratio  CPU ratio     "
        "RSS MiB (ours/ref)"
    )
    for case, r in results.items():
        print(
            f"{case:<5} {r['max_abs_rel_diff'] * 100:>8.3f}%  {r['per_request_within_0p1pct'] * 100:>10.2f}%  "
            f"{r['dynoplan_req_per_s']:>6.0f}/{r['reference_req_per_s']:<6.0f}  "
            f"{r['speed_ratio']:>5.2f} ({r['median_speed_ratio']:.2f})  "
            f"{r['process_wall_ratio']:>5.2f} ({r['median_process_wall_ratio']:.2f})     "
            f"{r['cpu_ratio']:>5.2f} ({r['median_cpu_ratio']:.2f})  "
            f"{r['dynoplan_peak_rss_mib']}/{r['reference_peak_rss_mib']}"
        )


if __name__ == "__main__":
    main()
