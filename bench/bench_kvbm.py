"""G1 backends side by side: ``native`` (LRU inactive pool) vs ``kvbm`` (lineage-aware, leaves first) on the
Mooncake conversation trace (prefix sharing), KV-aware routing, a pool small enough to evict.

Prints per backend: wall seconds of the replay (same process, same run), the kvbm/native speed ratio,
prefix-cache reuse, mean and p99 TTFT and the blocks evicted (kvbm). Figures only, no assertions.

Usage:  .venv/bin/python bench/bench_kvbm.py [--workers 4] [--num-gpu-blocks 4096] [--repeat 3]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mocker.config import EngineConfig  # noqa: E402
from mocker.fleet import FleetConfig, run_replay  # noqa: E402
from mocker.report import build_report  # noqa: E402
from mocker.traces import load_trace  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trace", default=str(ROOT / "examples" / "traces" / "mooncake_conversation.jsonl"))
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--num-gpu-blocks", type=int, default=4096)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    reqs = load_trace(a.trace)
    rows = {}
    for backend in ("native", "kvbm"):
        eng = EngineConfig(num_gpu_blocks=a.num_gpu_blocks, g1_backend=backend)
        best = float("inf")
        for _ in range(a.repeat):
            t0 = time.perf_counter()
            res = run_replay(reqs, eng, FleetConfig(num_workers=a.workers, router="kv"))
            best = min(best, time.perf_counter() - t0)
        rep = build_report(res)
        rows[backend] = (best, rep)
    print(f"{'backend':8} {'wall_s':>8} {'reuse':>8} {'ttft_mean':>10} {'ttft_p99':>10}")
    for b, (w, rep) in rows.items():
        print(f"{b:8} {w:8.3f} {rep['prefix_cache_reused_ratio']:8.4f} {rep['mean_ttft_ms']:10.2f} {rep['p99_ttft_ms']:10.2f}")
    print(f"speed ratio native/kvbm wall: {rows['native'][0] / rows['kvbm'][0]:.3f} (>1 = kvbm faster)")


if __name__ == "__main__":
    main()
