"""Behaviour-identity check: sha256 of replay records, replay reports and simulate summaries on the bench cases.

A restructuring or a speed-up must leave every output byte-identical. This script runs ``dynoplan replay``
on the cases of bench/bench_replay.py and bench/bench_sglang.py (a, a1, b, d, ds, s, sk), once more with
``--single-step`` on (a1), and ``dynoplan simulate`` with two policies on the Azure trace, and prints the
sha256 of each output file (of ``report.html`` without the plotly.js bundle it inlines: :func:`sha`).
``--save FILE`` writes the digests as JSON; ``--check FILE`` compares against a saved set and exits 1 naming
every digest that changed.

Usage:  .venv/bin/python bench/identity.py [--cases a,a1,...] [--save FILE | --check FILE]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Relative to ROOT (every command runs there): simulate's details.json records the trace path as given, so
# the digests do not depend on where the checkout is.
AZURE = "examples/traces/azure_llm_conv_2023.csv"
MOONCAKE = "examples/traces/mooncake_conversation.jsonl"
DISAGG = [
    "--prefill-workers",
    "2",
    "--decode-workers",
    "2",
    "--kv-transfer-bandwidth",
    "64",
    "--kv-bytes-per-token",
    "131072",
]
# The same fleets as bench/bench_replay.py's CASES, as CLI flags.
REPLAY_CASES: dict[str, list[str]] = {
    "a": ["--trace", AZURE, "--workers", "4", "--router", "round_robin", "--block-size", "64"],
    "a1": ["--trace", AZURE, "--workers", "1", "--router", "round_robin", "--block-size", "64"],
    "a1-single-step": [
        "--trace",
        AZURE,
        "--workers",
        "1",
        "--router",
        "round_robin",
        "--block-size",
        "64",
        "--single-step",
    ],
    "b": ["--trace", MOONCAKE, "--workers", "8", "--router", "kv"],
    "d": ["--trace", AZURE, "--router", "round_robin", *DISAGG],
    "ds": ["--trace", AZURE, "--router", "round_robin", "--engine", "sglang", *DISAGG],
    "s": ["--trace", AZURE, "--workers", "4", "--router", "round_robin", "--engine", "sglang"],
    "sk": ["--trace", MOONCAKE, "--workers", "4", "--router", "kv", "--engine", "sglang", "--num-gpu-blocks", "262144"],
}
SIMULATE_CASES: dict[str, list[str]] = {
    "simulate-agg": [
        "--trace",
        AZURE,
        "--sla-ttft-ms",
        "200",
        "--sla-itl-ms",
        "10",
        "--compare",
        "planner",
        "static:2",
        "hpa",
    ],
    "simulate-disagg": [
        "--trace",
        AZURE,
        "--mode",
        "disagg",
        "--sla-ttft-ms",
        "200",
        "--sla-itl-ms",
        "10",
        "--compare",
        "throughput-only",
        "static:1+1",
    ],
}


def sha(path: Path) -> str:
    """sha256 of the file; of ``report.html`` with the inlined plotly.js bundle (the installed plotly's own bytes,
    planner/sim/report.py) replaced by a fixed marker, so that the digest covers what dynoplan wrote."""
    data = path.read_bytes()
    if path.name == "report.html":
        from plotly.offline import get_plotlyjs

        data = data.replace(get_plotlyjs().encode(), b"<plotly.js>")
    return hashlib.sha256(data).hexdigest()


def run(cmd: list[str]) -> None:
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stderr[-3000:]}")


def digests(cases: list[str]) -> dict[str, str]:
    dynoplan = str(Path(sys.executable).parent / "dynoplan")
    out: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        for case in cases:
            t = time.perf_counter()
            if case in REPLAY_CASES:
                rep, per = d / f"{case}.report.json", d / f"{case}.records.jsonl"
                run(
                    [
                        dynoplan,
                        "replay",
                        *REPLAY_CASES[case],
                        "--report-json",
                        str(rep),
                        "--per-request",
                        str(per),
                        "--quiet",
                    ]
                )
                out[f"{case}/report"], out[f"{case}/records"] = sha(rep), sha(per)
            else:
                o = d / case
                run([dynoplan, "simulate", *SIMULATE_CASES[case], "--out", str(o), "--quiet"])
                for f in sorted(o.rglob("*")):
                    if f.is_file():
                        out[f"{case}/{f.relative_to(o)}"] = sha(f)
            print(f"{case}: {time.perf_counter() - t:.1f} s", file=sys.stderr, flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--cases",
        default=",".join([*REPLAY_CASES, *SIMULATE_CASES]),
        help="comma-separated, of " + ",".join([*REPLAY_CASES, *SIMULATE_CASES]),
    )
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--save", help="write the digests here (JSON)")
    g.add_argument("--check", help="compare against digests saved with --save; exit 1 on any difference")
    a = ap.parse_args()
    cases = [c for c in a.cases.split(",") if c]
    bad = [c for c in cases if c not in REPLAY_CASES and c not in SIMULATE_CASES]
    if bad:
        ap.error(f"--cases={','.join(bad)}: expected some of {','.join([*REPLAY_CASES, *SIMULATE_CASES])}")
    got = digests(cases)
    for k, v in got.items():
        print(f"{v}  {k}")
    if a.save:
        Path(a.save).write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    if a.check:
        want = json.loads(Path(a.check).read_text())
        changed = [k for k in got if want.get(k) != got[k]]
        for k in changed:
            print(f"CHANGED {k}: {want.get(k)} -> {got[k]}")
        if changed:
            raise SystemExit(1)
        print(f"identical: {len(got)} digests")


if __name__ == "__main__":
    main()
