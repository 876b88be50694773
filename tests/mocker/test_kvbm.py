"""g1_backend=kvbm: lineage-aware inactive pool (leaves evicted before their ancestors)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dynoplan.errors import SimulationError
from mocker.engine import make_engine
from mocker.kv.kvbm import KvbmBlockManager
from mocker.kv.manager import BlockKvManager
from tests.mocker.test_properties import _check, engines, workloads


def _stranded_setup(kv):
    """a cached by R1; R2 holds a private copy of a plus b (child of a); R1 frees a, then R2 frees b.
    Least-recently-freed order is a, b; lineage order is b (leaf) first."""
    a, b = 101, 102
    assert kv.allocate_full_many([a]) == [a]  # R1
    assert kv.allocate_full_many([a, b]) == [b]  # R2: a is a duplicate (private), b registered
    kv.release([a], 0)  # R1 done: a inactive first
    kv.release([b], 1)  # R2 done: b inactive, its private copy freed
    kv.check_invariants()
    return a, b


def test_native_evicts_the_parent_first_and_strands_the_child():
    kv = BlockKvManager(3)
    a, b = _stranded_setup(kv)
    kv.allocate_private(2)  # 1 free + 1 eviction
    assert a not in kv.inactive and b in kv.inactive
    assert kv.match_prefix([a, b]) == (0, 0)  # b is cached but unreachable


def test_kvbm_evicts_the_leaf_before_its_ancestor():
    kv = KvbmBlockManager(3)
    a, b = _stranded_setup(kv)
    assert kv.parent == {b: a}
    kv.allocate_private(2)
    assert b not in kv.inactive and a in kv.inactive
    assert kv.match_prefix([a, b]) == (1, 0)
    kv.allocate_private(1)  # a is now a leaf: evicted next
    assert kv.match_prefix([a, b]) == (0, 0) and kv.evicted == 2
    kv.check_invariants()


def test_kvbm_tree_order_leaves_by_release_time_then_parents():
    # root r with two branches: r-x-x2 (R1) and r-y (R2, shares r). R1 frees first, then R2.
    kv = KvbmBlockManager(4)
    r, x, x2, y = 1, 2, 3, 4
    assert kv.allocate_full_many([r, x, x2]) == [r, x, x2]
    kv.acquire_cached(r)
    assert kv.allocate_full_many([y]) == [y]
    kv.release([r, x, x2], 0)  # x2 (seq 1), x (seq 2); r still held by R2
    kv.release([r, y], 0)  # y (seq 3), r (seq 4); lineage y->r learned here
    assert kv.parent == {x: r, x2: x, y: r}
    order = []
    for _ in range(4):
        before = set(kv.inactive)
        kv.allocate_private(1)
        order += list(before - set(kv.inactive))
        kv.check_invariants()
    assert order == [x2, x, y, r]
    with pytest.raises(SimulationError):
        kv.allocate_private(1)


def test_no_leaf_falls_back_to_oldest_and_orphans_children():
    kv = KvbmBlockManager(3)
    a, b = 1, 2
    kv.allocate_full_many([a])
    kv.allocate_full_many([a, b])  # private a, b child of a (active)
    kv.release([a], 0)  # a inactive but has an active child: not a leaf
    assert kv.available() == 1 and kv.free == 0
    kv.allocate_private(1)  # a evicted anyway (available() stays exact), b orphaned
    assert a not in kv.inactive and kv.parent == {} and kv.children == {}
    kv.check_invariants()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads(), engines())
def test_vllm_core_on_kvbm_pool_completes_and_conserves(reqs, eng):
    """The vLLM core drives the kvbm pool through the same API: every request terminates, blocks are
    conserved and lineage stays consistent after every pass."""
    core = make_engine(eng)
    core.kv = KvbmBlockManager(eng.num_gpu_blocks, eng.enable_prefix_caching)
    recs = []
    for r in sorted(reqs, key=lambda r: r.arrival_ms):
        core.advance_until(r.arrival_ms)
        core.check_invariants()
        recs.append(core.add_request(r, r.arrival_ms))
    while core.has_work():
        core.step(core.next_pass_ms)
        core.check_invariants()
    core.finalize()
    _check(recs)
    assert core.kv.num_active_blocks() == 0 and core.kv.available() == eng.num_gpu_blocks


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.lists(st.integers(0, 5), min_size=1, max_size=6)), max_size=40))
def test_kvbm_random_requests_never_strand_a_child_while_a_leaf_is_evictable(ops):
    """Random prompts (chains over a small alphabet, so they share prefixes) allocated then released; the
    pool never evicts a block that still has a cached child unless no inactive leaf existed."""
    kv = KvbmBlockManager(12)
    held: list[tuple[list[int], int]] = []
    for free_first, chain in ops:
        keys, prev = [], 0
        for c in chain:
            prev = hash((prev, c))
            keys.append(prev)
        for _ in range(min(free_first, len(held))):
            k, p = held.pop(0)
            kv.release(k, p)
        hits, act = kv.match_prefix(keys)
        if len(keys) - act > kv.available():  # inactive hits leave the evictable pool when acquired
            continue
        for k in keys[:hits]:
            kv.acquire_cached(k)
        inactive_before = list(kv.inactive)
        leaves = {k for k in inactive_before if not kv.children.get(k)}
        reg = kv.allocate_full_many(keys[hits:])
        evicted = set(inactive_before) - set(kv.inactive) - set(keys)
        if evicted and leaves:
            assert evicted & leaves, (evicted, leaves)
        held.append((keys[:hits] + reg, len(keys) - hits - len(reg)))
        kv.check_invariants()
    for k, p in held:
        kv.release(k, p)
    kv.check_invariants()
    assert kv.available() == 12


def test_g1_backend_config_errors_and_engine_pool_choice():
    from dynoplan.errors import ConfigError
    from mocker.config import EngineConfig

    with pytest.raises(
        ConfigError,
        match=r'g1_backend="native": lower KV tiers configured \(num_g2_blocks=64, g4=true\); '
        r'expected g1_backend="kvbm"',
    ):
        EngineConfig.from_mapping({"num_g2_blocks": 64, "g4": True})
    with pytest.raises(ConfigError, match=r"g1_backend=\"lru\": expected one of 'native' or 'kvbm'"):
        EngineConfig.from_mapping({"g1_backend": "lru"})
    with pytest.raises(ConfigError, match=r"num_g2_blocks=0: G3/G4 hits stage through G2"):
        EngineConfig.from_mapping({"g1_backend": "kvbm", "num_g3_blocks": 10})
    with pytest.raises(ConfigError, match=r"bw_g2_g1_gbps=-1: expected >= 0.0"):
        EngineConfig.from_mapping({"g1_backend": "kvbm", "bw_g2_g1_gbps": -1})
    with pytest.raises(ConfigError, match=r'g1_backend="kvbm": modelled for the vllm and trtllm'):
        EngineConfig.from_mapping({"engine": "sglang", "g1_backend": "kvbm"})
    assert type(make_engine(EngineConfig()).kv) is BlockKvManager
    assert type(make_engine(EngineConfig(g1_backend="kvbm", engine="trtllm")).kv) is KvbmBlockManager
    with pytest.raises(ConfigError, match=r"kv_bytes_per_token=null: KVBM tier transfers move block_size x "):
        EngineConfig.from_mapping({"g1_backend": "kvbm", "num_g2_blocks": 8})
    core = make_engine(EngineConfig(g1_backend="kvbm", num_g2_blocks=8, kv_bytes_per_token=2))
    assert core.tiers is not None and core.tiers.cfg.bytes_per_block == 64 * 2 and core.kv.offload_sink == []
    cfg = EngineConfig.from_mapping({"engine": {"backend": "vllm", "g1_backend": "kvbm"}})
    assert cfg.g1_backend == "kvbm"
