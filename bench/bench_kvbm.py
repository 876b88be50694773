"""G1 backends and KVBM lower tiers side by side on the Mooncake conversation trace (prefix sharing), KV-aware
routing, a G1 pool small enough to evict.

Rows: ``native`` (LRU inactive pool), ``kvbm`` (lineage-aware, leaves first), ``kvbm+G2`` (per-worker host
tier), ``kvbm+G2+G3+G4`` (a smaller host tier spilling to a shared disk tier and an object tier). Tier
transfers use ``--kv-bytes-per-token`` (default 131072 B/token, the issue's disaggregated benchmark figure)
and the default link bandwidths (EngineConfig: 25 GB/s host<->device, 5 GB/s host<->disk, 1 GB/s object).

Prints per row: wall seconds of the replay (same process, same run; best of ``--repeat``), its ratio to the
``kvbm`` row (tiered cores run one pass at a time in global time order, so they are slower), prefix-cache
reuse (G1 hits), mean and p99 TTFT, and the tier counters (blocks offloaded G1->G2, onboarded per tier, spilled
G2->G3 / G3->G4). The reference replay (Dynamo Mocker 1.6.1) has no KVBM options (``reference-replay --help``
/ ``--show-defaults`` list none), so there is no differential column. Figures only, no assertions.

Usage:  .venv/bin/python bench/bench_kvbm.py [--workers 4] [--num-gpu-blocks 4096] [--repeat 1] [--requests N]
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
    ap.add_argument("--kv-bytes-per-token", type=int, default=131072)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--requests", type=int, default=None, help="replay only the first N requests")
    a = ap.parse_args()
    reqs = load_trace(a.trace)
    if a.requests:
        reqs = reqs[: a.requests]
    base = EngineConfig(num_gpu_blocks=a.num_gpu_blocks)
    kb = a.kv_bytes_per_token
    configs = {
        "native": base,
        "kvbm": base.replace(g1_backend="kvbm"),
        "kvbm+G2": base.replace(g1_backend="kvbm", num_g2_blocks=a.num_gpu_blocks, kv_bytes_per_token=kb),
        "kvbm+G2+G3+G4": base.replace(
            g1_backend="kvbm",
            num_g2_blocks=a.num_gpu_blocks // 2,
            num_g3_blocks=4 * a.num_gpu_blocks,
            g4=True,
            kv_bytes_per_token=kb,
        ),
    }
    rows = {}
    for name, eng in configs.items():
        best = float("inf")
        for _ in range(a.repeat):
            t0 = time.perf_counter()
            res = run_replay(reqs, eng, FleetConfig(num_workers=a.workers, router="kv"))
            best = min(best, time.perf_counter() - t0)
        rows[name] = (best, build_report(res))
        print(f"  {name}: {best:.2f} s", file=sys.stderr, flush=True)
    print(
        f"Mooncake {len(reqs)} requests, {a.workers} workers, kv router, {a.num_gpu_blocks} G1 blocks of "
        f"{base.effective_block_size} tokens, {kb} KV bytes/token"
    )
    print(
        f"{'config':15} {'wall_s':>8} {'vs kvbm':>8} {'reuse':>7} {'ttft_mean':>10} {'ttft_p99':>10} "
        f"{'offload':>9} {'on_G2':>7} {'on_G3':>7} {'on_G4':>7} {'to_G3':>9} {'to_G4':>9}"
    )
    kv_wall = rows["kvbm"][0]
    for name, (w, rep) in rows.items():
        g = lambda k, rep=rep: rep.get(f"kvbm_{k}", "-")  # noqa: E731
        print(
            f"{name:15} {w:8.2f} {w / kv_wall:8.2f} {rep['prefix_cache_reused_ratio']:7.4f} "
            f"{rep['mean_ttft_ms']:10.2f} {rep['p99_ttft_ms']:10.2f} {g('offloaded_blocks'):>9} "
            f"{g('onboarded_blocks_g2'):>7} {g('onboarded_blocks_g3'):>7} {g('onboarded_blocks_g4'):>7} "
            f"{g('spilled_blocks_g3'):>9} {g('spilled_blocks_g4'):>9}"
        )
    print(f"speed ratio native/kvbm wall: {rows['native'][0] / kv_wall:.3f} (>1 = kvbm faster)")
    print("reference: no KVBM options in reference-replay (Dynamo Mocker 1.6.1): no differential comparison")


if __name__ == "__main__":
    main()
