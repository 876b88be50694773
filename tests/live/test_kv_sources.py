"""KV events from the caches that needed a hook: the SGLang radix cache (token ranges -> engine block keys)
and the KVBM G1 pool. Replaying the events gives exactly the blocks the cache holds, through evictions."""

from __future__ import annotations

import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mocker.config import EngineConfig
from mocker.engine import make_engine
from mocker.kv.events import RadixEventAdapter, TupleSink
from mocker.kv.manager import engine_block_keys
from mocker.kv.radix import RadixCache, SeqContent
from mocker.records import TraceRequest


def _replay(events, into):
    for kind, k, _ in events:
        if kind == "stored":
            assert k not in into  # a page is held at most once
            into.add(k)
        else:
            assert k in into
            into.discard(k)
    events.clear()


def test_radix_adapter_maps_pages_to_engine_block_keys():
    """Page 16, trace block 64 (q = 4): a 150-token prompt of 3 trace blocks has 9 full engine blocks
    (engine_block_keys), of which the first 8 lie in trace-keyed segments of whole pages (tokens 0..128) and
    the 9th (128..144) in the last, partial trace block, still inside the prompt -> 9 keys; the page 144..160
    straddles the prompt end and is not reported."""
    ev: list = []
    ad = RadixEventAdapter(16, 64, TupleSink(ev))
    c = SeqContent.for_request([5, 6, 7], 150, unique_key=(1 << 64) + 1, trace_block_size=64)
    assert ad.page_keys(c, 0, 160) == engine_block_keys([5, 6, 7], 150, 16, 64)
    assert ad.page_keys(c, 32, 64) == engine_block_keys([5, 6, 7], 150, 16, 64)[2:4]
    assert ad.page_keys(SeqContent.for_request(None, 150, unique_key=(1 << 64) + 2), 0, 160) == []
    assert RadixEventAdapter(16, 24, TupleSink(ev)).page_keys(c, 0, 160) == []  # 24 % 16: no key map
    ad("stored", c, 0, 64)
    ad("removed", c, 48, 64)
    keys = engine_block_keys([5, 6, 7], 150, 16, 64)
    assert ev == [("stored", k, None) for k in keys[:4]] + [("removed", keys[3], None)]


def test_radix_cache_listener_reports_inserts_and_evictions():
    kv = RadixCache(64, page_size=16, trace_block_size=64)
    ev: list = []
    ad = RadixEventAdapter(16, 64, TupleSink(ev))
    kv.listener = ad
    held: set[int] = set()
    a = SeqContent.for_request([1, 2], 128, unique_key=(1 << 64) + 1, trace_block_size=64)
    kv.take(64)
    _, root = kv.match_and_lock(a, 64)
    node, dup = kv.insert(a, root, 0, 64, False)
    kv.to_tree(64 - dup)
    kv.inc_lock(node)
    kv.dec_lock(root)
    _replay(ev, held)
    assert held == set(engine_block_keys([1, 2], 128, 16, 64)[:4]) == set(ad.tree_keys(kv.root))
    kv.dec_lock(node)
    assert kv.evict(16) == 16  # one page from the leaf's end
    _replay(ev, held)
    assert held == set(engine_block_keys([1, 2], 128, 16, 64)[:3]) == set(ad.tree_keys(kv.root))
    kv.evict(64)
    _replay(ev, held)
    assert held == set() == set(ad.tree_keys(kv.root))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(
            st.lists(st.integers(0, 5), min_size=1, max_size=6),
            st.integers(1, 40),
            st.integers(1, 12),
            st.floats(0, 50),
        ),
        min_size=1,
        max_size=25,
    ),
    st.sampled_from([(4, 16), (8, 32), (16, 16)]),
    st.integers(12, 40),
)
def test_sglang_core_events_replay_to_the_radix_tree(prompts, sizes, num_blocks):
    """An SGLang core under KV pressure (chunked prefill, retraction, eviction): after every pass the replayed
    events equal the tree's reportable pages."""
    page, tbs = sizes
    cfg = EngineConfig(
        engine="sglang", num_gpu_blocks=num_blocks, block_size=page, trace_block_size=tbs, max_num_batched_tokens=64
    )
    core = make_engine(cfg)
    ev: list = []
    ad = RadixEventAdapter(page, tbs, TupleSink(ev))
    core.kv.listener = ad
    held: set[int] = set()
    t = 0.0
    reqs = []
    for i, (ids, extra, osl, gap) in enumerate(prompts):
        t += gap
        isl = min(len(ids) * tbs, (len(ids) - 1) * tbs + extra)
        if isl + osl > cfg.total_kv_tokens:
            continue
        # chained ids: prompts that share leading ids share their prefix
        reqs.append(TraceRequest(i, t, isl, osl, tuple(ids)))
    for r in reqs:
        core.advance_until(r.arrival_ms)
        _replay(ev, held)
        assert held == set(ad.tree_keys(core.kv.root))
        core.add_request(r, r.arrival_ms)
    while core.has_work():
        core.step(core.next_pass_ms)
        _replay(ev, held)
        assert held == set(ad.tree_keys(core.kv.root))
    core.finalize()
    assert math.isfinite(t)


def test_kvbm_pool_events_replay_to_its_cache():
    from mocker.kv.kvbm import EventingKvbmBlockManager

    kv = EventingKvbmBlockManager(6)
    held: set[int] = set()
    a = engine_block_keys((1, 2, 3), 48, 16, 16)
    b = engine_block_keys((1, 9, 8, 7), 64, 16, 16)
    kv.allocate_full_many(a)
    kv.release(a, 0)
    kv.allocate_full_many(b[kv.match_prefix(b)[0] :])
    _replay(kv.events, held)
    assert held == set(kv.active) | set(kv.inactive)
    kv.allocate_private(2)  # b[1:] active, a inactive: two of a evicted (leaves first)
    _replay(kv.events, held)
    assert held == set(kv.active) | set(kv.inactive)
    assert held == set(kv.active) | set(kv.inactive) and len(kv.inactive) == 1 and kv.evicted == 2
