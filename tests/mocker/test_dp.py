"""Data-parallel ranks: a logical worker holds dp_size independent engine cores; routing picks the rank;
records and FPM carry dp_rank; GPU accounting counts dp_size GPUs per worker."""

from __future__ import annotations

import pytest

from mocker.config import EngineConfig
from mocker.fleet import Fleet, FleetConfig, run_replay
from mocker.records import TraceRequest
from mocker.report import build_report
from mocker.transfer import KvTransferConfig


def reqs(n: int, gap: float = 3.0) -> list[TraceRequest]:
    return [TraceRequest(i, gap * i, 300 + 7 * i, 20 + i % 5, (i % 2, i)) for i in range(n)]


def test_round_robin_picks_ranks_and_records_carry_them():
    res = run_replay(reqs(6), EngineConfig(dp_size=2), FleetConfig(num_workers=1), collect_fpm=True)
    assert [r.dp_rank for r in res.records] == [0, 1, 0, 1, 0, 1]
    assert {r.worker_id for r in res.records} == {0}
    assert {f.dp_rank for f in res.fpm} == {0, 1} and {f.worker_id for f in res.fpm} == {0}


def test_ranks_are_independent_cores():
    """One worker with 2 ranks behaves like 2 workers with 1 rank each (same requests per core, same times)."""
    a = run_replay(reqs(30), EngineConfig(dp_size=2), FleetConfig(num_workers=1))
    b = run_replay(reqs(30), EngineConfig(), FleetConfig(num_workers=2))
    assert [r.token_times_ms for r in a.records] == [r.token_times_ms for r in b.records]
    assert [r.dp_rank for r in a.records] == [r.worker_id for r in b.records]
    # GPU-hours: 1 worker x 2 GPUs == 2 workers x 1 GPU
    assert build_report(a)["gpu_hours"] == pytest.approx(build_report(b)["gpu_hours"])


def test_kv_router_books_each_rank_separately():
    res = run_replay(
        [TraceRequest(i, 0.0, 1024, 5, (100 + i, 200 + i)) for i in range(4)],
        EngineConfig(dp_size=2),
        FleetConfig(num_workers=2, router="kv"),
    )
    assert sorted((r.worker_id, r.dp_rank) for r in res.records) == [(0, 0), (0, 1), (1, 0), (1, 1)]


def test_fleet_observations_per_rank_and_gpu_seconds():
    fl = Fleet({"agg": EngineConfig(dp_size=4)})
    fl.add_worker("agg", 0.0)
    assert [(s.worker_id, s.dp_rank) for s in fl.engine_states("agg")] == [(0, 0), (0, 1), (0, 2), (0, 3)]
    assert fl.gpu_seconds(10_000.0) == {"agg": pytest.approx(40.0)}  # 10 s x 4 GPUs
    assert fl.gpu_seconds(10_000.0, {"agg": 8}) == {"agg": pytest.approx(80.0)}


def test_disaggregated_dp_ranks():
    eng = EngineConfig(dp_size=2)
    res = run_replay(
        reqs(8), eng, FleetConfig(num_prefill_workers=1, num_decode_workers=1, transfer=KvTransferConfig(64, 131072))
    )
    assert all(r.status == "finished" for r in res.records)
    # decode ranks round robin in prefill-completion order: each rank gets half
    assert sorted(r.dp_rank for r in res.records) == [0] * 4 + [1] * 4


def test_dp_size_is_bounded_by_max_dp_size():
    from dynoplan.errors import ConfigError
    from mocker.config import MAX_DP_SIZE

    assert MAX_DP_SIZE == 1024
    assert EngineConfig.from_mapping({"dp_size": MAX_DP_SIZE}).dp_size == 1024  # inclusive
    with pytest.raises(ConfigError) as e:  # was accepted: 1e7 ranks ended in a MemoryError traceback
        EngineConfig.from_mapping({"dp_size": 100000}, source="e.yaml")
    assert e.value.problems == ["dp_size=100000: expected <= 1024"]
    assert str(e.value) == "e.yaml: dp_size=100000: expected <= 1024"


def test_a_pool_of_max_engine_cores_is_built():
    from mocker.arguments import MAX_POOL_ENGINE_CORES
    from mocker.config import MAX_DP_SIZE

    # the bound itself runs: 64 workers x 1024 ranks = 65536 engine cores, one request on rank 0 of worker 0
    assert MAX_POOL_ENGINE_CORES == 64 * MAX_DP_SIZE
    res = run_replay(reqs(1), EngineConfig(dp_size=MAX_DP_SIZE), FleetConfig(num_workers=64))
    assert [(r.status, r.worker_id, r.dp_rank) for r in res.records] == [("finished", 0, 0)]
