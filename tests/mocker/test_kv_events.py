"""KV events: stored/removed block events from the block manager, the router's event-built index, lag."""

from __future__ import annotations

import pytest

from mocker.config import EngineConfig
from mocker.errors import ConfigError
from mocker.fleet import Fleet
from mocker.kvevents import EventingKvManager, KvEventIndex
from mocker.records import TraceRequest


def test_manager_reports_stores_and_lru_evictions():
    kv = EventingKvManager(4)
    assert kv.allocate_full_many([11, 12, 13]) == [11, 12, 13]
    assert kv.events == [("stored", 11, None), ("stored", 12, 11), ("stored", 13, 12)]
    kv.events.clear()
    kv.release([11, 12, 13], 0)          # still cached (inactive): no event; 13 is freed first, 11 last
    assert kv.events == []
    kv.allocate_private(3)               # 1 free block + evicts the two oldest inactive blocks
    assert kv.events == [("removed", 13, None), ("removed", 12, None)]
    kv.events.clear()
    assert kv.allocate_full(21) is True  # nothing free: evicts the last inactive block (11), registers 21
    assert kv.events == [("removed", 11, None), ("stored", 21, None)]
    kv.check_invariants()


def _run(kv_events: bool, lag: float, reqs: list[TraceRequest], seed: int = 0) -> tuple[Fleet, list]:
    fl = Fleet({"agg": EngineConfig(num_gpu_blocks=96, block_size=16)}, router="kv", seed=seed, kv_events=kv_events,
               kv_event_lag_ms=lag)
    for _ in range(3):
        fl.add_worker("agg", 0.0)
    recs = [fl.submit(r, r.arrival_ms) for r in reqs]
    fl.finish()
    return fl, recs


REQS = [TraceRequest(i, 40.0 * i, 300 + (i % 5) * 100, 8, (i % 4, 50 + i % 3, 100 + i)) for i in range(60)]


def test_lag_zero_event_router_routes_exactly_as_reading_the_caches():
    _, direct = _run(False, 0.0, REQS)
    fl, ev = _run(True, 0.0, REQS)
    assert [(r.worker_id, r.token_times_ms) for r in ev] == [(r.worker_id, r.token_times_ms) for r in direct]
    index = fl._kv_index["agg"]
    assert index.applied > 0
    # the index equals every core's cache once the last events are drained
    fl._drain_kv_events(fl.pools["agg"], float("inf"))
    for c in fl.cores("agg"):
        assert index.blocks.get((c.worker_id, c.dp_rank), set()) == set(c.kv.active) | set(c.kv.inactive)


def test_a_lagging_router_misses_a_fresh_prefix():
    a = TraceRequest(0, 0.0, 1024, 2, (7, 8))
    b = TraceRequest(1, 2000.0, 1024, 2, (7, 8))   # same prompt after a finished: only the cache remembers it
    picks_now, picks_late = set(), set()
    for seed in range(8):
        _, (ra, rb) = _run(True, 0.0, [a, b], seed)
        picks_now.add(rb.worker_id == ra.worker_id)
        _, (ra, rb) = _run(True, 1e9, [a, b], seed)
        picks_late.add(rb.worker_id == ra.worker_id)
    assert picks_now == {True}          # sees the cached prefix
    assert picks_late == {True, False}  # blind: ties broken by the seed


def test_kv_event_settings_are_checked():
    with pytest.raises(ConfigError, match="kv_event_lag_ms=-1"):
        Fleet({"agg": EngineConfig()}, kv_event_lag_ms=-1)
    with pytest.raises(ConfigError, match="SGLang"):
        Fleet({"agg": EngineConfig(engine="sglang")}, kv_events=True)
    with pytest.raises(ValueError):
        KvEventIndex(-1.0)
