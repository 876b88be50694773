"""Fast-forward (decode cohort + numpy stretches) against one-pass-at-a-time on larger seeded workloads."""

from __future__ import annotations

import numpy as np
import pytest

from mocker.config import EngineConfig
from mocker.fleet import FleetConfig, run_replay
from mocker.records import TraceRequest


def workload(n: int, seed: int, rate_per_s: float) -> list[TraceRequest]:
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1000.0 / rate_per_s, n))
    out = []
    for i in range(n):
        isl = int(rng.integers(50, 3000))
        fam = int(rng.integers(0, 5))
        ids = tuple([fam, fam + 100] + [10_000 + 10 * i + k for k in range(-(-isl // 512))])[: -(-isl // 512)]
        out.append(TraceRequest(i, float(t[i]), isl, int(rng.integers(1, 400)), ids))
    return out


@pytest.mark.parametrize(
    "eng,workers,router",
    [
        (EngineConfig(), 2, "round_robin"),
        (EngineConfig(num_gpu_blocks=300, block_size=16), 1, "round_robin"),  # heavy preemption (LIFO)
        (EngineConfig(num_gpu_blocks=300, block_size=16, preemption_mode="fifo"), 1, "round_robin"),
        (EngineConfig(engine="trtllm", num_gpu_blocks=400), 2, "kv"),
        (EngineConfig(max_num_seqs=8, max_num_batched_tokens=1024), 3, "least_loaded"),
    ],
)
def test_fast_equals_single_step_on_seeded_workloads(eng, workers, router):
    reqs = workload(250, seed=7, rate_per_s=40.0)
    fast = run_replay(reqs, eng, FleetConfig(num_workers=workers, router=router))
    slow = run_replay(reqs, eng, FleetConfig(num_workers=workers, router=router, single_step=True))
    assert list(fast.records) == list(slow.records)
    assert all(r.status in ("finished", "failed") for r in fast.records)
    if eng.num_gpu_blocks == 300:
        assert sum(r.num_preemptions for r in fast.records) > 0  # the scenario does exercise preemption


@pytest.mark.parametrize(
    "eng,handoff",
    [
        (EngineConfig(), "coordinated"),
        (EngineConfig(num_gpu_blocks=400, block_size=16), "coordinated"),  # KV pressure on both pools
        (EngineConfig(), "direct"),
    ],
)
def test_fast_equals_single_step_disaggregated(eng, handoff):
    """The disaggregated fleet (prefill-only passes, KV transfer, decode cores advanced to every prefill end and
    activation: many one-pass cohort stretches) gives the same records fast-forwarded as one pass at a time."""
    from mocker.transfer import KvTransferConfig

    reqs = workload(250, seed=11, rate_per_s=40.0)
    tr = KvTransferConfig(64, 131072, handoff=handoff)
    cfg = dict(num_prefill_workers=2, num_decode_workers=2, router="round_robin", transfer=tr)
    fast = run_replay(reqs, eng, FleetConfig(**cfg))
    slow = run_replay(reqs, eng, FleetConfig(**cfg, single_step=True))
    assert list(fast.records) == list(slow.records)
    assert all(r.status in ("finished", "failed") for r in fast.records)
    assert sum(r.status == "finished" for r in fast.records) > 200
