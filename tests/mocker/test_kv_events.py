"""KV events: the event stream reconstructs the cache exactly; an event-fed KV router routes like one reading
worker state (lag 0) and still completes everything with a lag."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mocker.config import EngineConfig
from mocker.engine import make_engine
from mocker.kv.events import EventKvRouter, KvEventIndex, KvEventLog, ListeningBlockKvManager, tier_listener_adapter
from mocker.kv.kvbm import KvbmBlockManager
from mocker.kv.manager import engine_block_keys
from mocker.kv.tiers import TierConfig, TierHierarchy
from mocker.records import TraceRequest
from tests.mocker.test_properties import _check, engines, workloads

POOLS = {"native": ListeningBlockKvManager, "kvbm": KvbmBlockManager}


def _core(eng, backend, worker_id=0):
    core = make_engine(eng, worker_id=worker_id)
    log = KvEventLog(worker_id)
    core.kv = POOLS[backend](eng.num_gpu_blocks, eng.enable_prefix_caching, listener=log)
    return core, log


def _cache(kv):
    return set(kv.active) | set(kv.inactive)


@settings(max_examples=70, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads(), engines(), st.sampled_from(["native", "kvbm"]))
def test_replaying_events_reconstructs_exactly_the_cached_blocks(reqs, eng, backend):
    core, log = _core(eng, backend)
    index = KvEventIndex(0)
    recs = []

    def sync(now):
        index.publish(log.drain(now))
        index.catch_up(now)
        assert index.cached(0) == _cache(core.kv)

    for r in sorted(reqs, key=lambda r: r.arrival_ms):
        core.advance_until(r.arrival_ms)
        sync(r.arrival_ms)
        recs.append(core.add_request(r, r.arrival_ms))
    while core.has_work():
        out = core.step(core.next_pass_ms)
        sync(out.end_ms)
    core.finalize()
    _check(recs)
    sync(math.inf)


def test_events_carry_parent_hash_and_tier():
    log = KvEventLog(3, dp_rank=1)
    kv = KvbmBlockManager(4, listener=log)
    keys = engine_block_keys((7,), 512, 256)
    kv.allocate_full_many(keys)
    kv.release(keys, 0)
    kv.allocate_private(4)
    ev = log.drain(12.5)
    assert [(e.kind, e.block_hash, e.parent_hash) for e in ev] == [
        ("stored", keys[0], None),
        ("stored", keys[1], keys[0]),
        ("removed", keys[1], None),
        ("removed", keys[0], None),
    ]  # leaf first
    assert {(e.worker_id, e.dp_rank, e.tier, e.time_ms) for e in ev} == {(3, 1, "G1", 12.5)}
    assert log.drain(13.0) == [] and log.emitted == 4


def test_lower_tier_events_reach_the_index():
    logs = {}
    h = TierHierarchy(
        TierConfig(
            bytes_per_block=1_000_000,
            num_g2_blocks=1,
            num_g3_blocks=4,
            offload_batch_size=1,
            bw_g1_g2_gbps=0,
            bw_g2_g3_gbps=0,
        ),
        1,
        listener=tier_listener_adapter(lambda t, w: logs.setdefault((t, w), KvEventLog(w, tier=t))),
    )
    h.offload(0.0, 0, [1, 2])
    h.advance(0.0)
    index = KvEventIndex()
    for log in logs.values():
        index.publish(log.drain(0.0))
    index.catch_up(0.0)
    assert index.cached(0, tier="G2") == {2} and index.cached(-1, tier="G3") == {1}


def test_lag_delays_what_the_router_sees_and_bad_lag_is_rejected():
    log = KvEventLog(0)
    kv = ListeningBlockKvManager(4, listener=log)
    kv.allocate_full_many([5, 6])
    index = KvEventIndex(lag_ms=10)
    index.publish(log.drain(100.0))
    index.catch_up(109.9)
    assert index.overlap(0, [5, 6]) == 0 and index.pending == 2
    index.catch_up(110.0)
    assert index.overlap(0, [5, 6, 7]) == 2 and index.pending == 0
    # -1.0 when mocker.kv is compiled (mypyc converts an int argument declared float)
    with pytest.raises(ValueError, match=r"kv_event_lag_ms=-1(\.0)?: expected a number >= 0"):
        KvEventIndex(-1)


def _route_workload(reqs, eng, n_workers, lag_ms, compare_state):
    """Drive n vLLM cores; route each arrival with the event-fed router (and, when compare_state, check a
    router reading the cores' pools directly picks the same worker). Returns (choices, records)."""
    bs = eng.effective_block_size
    cores, logs = zip(*[_core(eng, "native", w) for w in range(n_workers)])
    index = KvEventIndex(lag_ms)
    ev_router = EventKvRouter(n_workers, index.overlap)
    st_router = EventKvRouter(n_workers, lambda w, keys: cores[w].kv.match_prefix(keys)[0])
    inflight, choices, recs = [], [], []
    for r in sorted(reqs, key=lambda r: (r.arrival_ms, r.request_id)):
        now = r.arrival_ms
        for c, log in zip(cores, logs):
            c.advance_until(now)
            index.publish(log.drain(now))
        index.catch_up(now)
        for item in list(inflight):
            w, blocks, rec = item
            if rec.finish_ms is not None and rec.finish_ms <= now:
                ev_router.on_finish(w, blocks)
                st_router.on_finish(w, blocks)
                inflight.remove(item)
        keys = engine_block_keys(r.hash_ids, r.input_length, bs) or []
        w = ev_router.choose(keys)
        if compare_state:
            assert st_router.choose(keys) == w
        blocks = -(-(r.input_length + r.output_length) // bs)
        ev_router.on_dispatch(w, blocks)
        st_router.on_dispatch(w, blocks)
        rec = cores[w].add_request(r, now)
        inflight.append((w, blocks, rec))
        choices.append(w)
        recs.append(rec)
    for c in cores:
        while c.has_work():
            c.step(c.next_pass_ms)
        c.finalize()
    return choices, recs


def _shared_prefix_workload(n=60):
    out = []
    for i in range(n):
        fam = i % 4
        out.append(TraceRequest(i, i * 40.0, 1024 + 64 * (i % 5), 20, (fam, 1000 + i, 2000 + i)))
    return out


def test_event_router_with_lag_zero_routes_like_the_state_router():
    eng = EngineConfig(num_gpu_blocks=120, block_size=64)
    choices, recs = _route_workload(_shared_prefix_workload(), eng, 3, 0.0, compare_state=True)
    _check(recs)
    assert len(set(choices)) == 3  # load is spread
    # requests of one prefix family keep landing where the family is cached once warmed
    assert sum(1 for r in recs if r.cached_tokens) > 30


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads(), engines(), st.integers(1, 3))
def test_event_router_lag_zero_equals_state_router_hypothesis(reqs, eng, n):
    _route_workload(reqs, eng, n, 0.0, compare_state=True)


@pytest.mark.parametrize("lag_ms", [5.0, 250.0])
def test_event_router_with_lag_completes_everything(lag_ms):
    eng = EngineConfig(num_gpu_blocks=120, block_size=64)
    choices, recs = _route_workload(_shared_prefix_workload(), eng, 3, lag_ms, compare_state=False)
    _check(recs)
    assert all(r.status == "finished" for r in recs) and len(recs) == 60


def test_cli_kv_events_flags(tmp_path):
    from planner.cli import main

    trace = tmp_path / "t.jsonl"
    trace.write_text(
        "".join(
            f'{{"timestamp": {100 * i}, "input_length": 1024, "output_length": 3, "hash_ids": [{i % 3}, {50 + i}]}}\n'
            for i in range(12)
        )
    )
    outs = []
    for extra in ([], ["--kv-events"], ["--kv-events", "--kv-event-lag-ms", "0"]):
        out = tmp_path / f"r{len(outs)}.jsonl"
        assert main(
            [
                "replay",
                "--trace",
                str(trace),
                "--workers",
                "3",
                "--router",
                "kv",
                "--quiet",
                "--per-request",
                str(out),
                *extra,
            ]
        ) in (0, None)
        outs.append(out.read_text())
    assert outs[0] == outs[1] == outs[2]  # lag 0: the events router routes as the cache-reading one


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads(), engines())
def test_eventing_kvbm_pool_events_replay_to_its_cache(reqs, eng):
    """The fleet-format (``kv.events`` tuples) kvbm pool: replaying its events gives exactly its cache."""
    from mocker.kv.kvbm import EventingKvbmBlockManager

    core = make_engine(eng)
    core.kv = EventingKvbmBlockManager(eng.num_gpu_blocks, eng.enable_prefix_caching)
    seen: set[int] = set()

    def replay():
        for kind, h, _ in core.kv.events:
            (seen.add if kind == "stored" else seen.discard)(h)
        core.kv.events.clear()
        assert seen == _cache(core.kv)

    for r in sorted(reqs, key=lambda r: r.arrival_ms):
        core.advance_until(r.arrival_ms)
        replay()
        core.add_request(r, r.arrival_ms)
    while core.has_work():
        core.step(core.next_pass_ms)
        replay()


def test_fleet_kv_events_keep_the_kvbm_pool_and_route_as_cache_reading():

    from mocker.fleet import FleetConfig, run_replay
    from mocker.kv.kvbm import EventingKvbmBlockManager

    reqs = _shared_prefix_workload()
    eng = EngineConfig(num_gpu_blocks=120, block_size=64, g1_backend="kvbm")
    a = run_replay(reqs, eng, FleetConfig(num_workers=3, router="kv"))
    b = run_replay(reqs, eng, FleetConfig(num_workers=3, router="kv", kv_events=True))
    assert list(a.records) == list(b.records)
    _check(b.records)
    # the pool the fleet swaps in for events is still the lineage-aware one
    from mocker.fleet import Fleet

    fl = Fleet({"agg": eng}, router="kv", kv_events=True)
    fl.add_worker("agg", 0.0)
    assert all(type(c.kv) is EventingKvbmBlockManager for p in fl.pools.values() for w in p.workers for c in w.cores)
