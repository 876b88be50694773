"""Block KV manager: conservation, reference counts, LRU eviction, prefix matching, hash-id mapping."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dynoplan.errors import SimulationError
from mocker.kv import BlockKvManager, engine_block_keys


def test_allocate_release_and_reuse_from_inactive_pool():
    kv = BlockKvManager(8)
    keys = engine_block_keys((1, 2), 1024, 256)  # 4 full blocks
    reg = kv.allocate_full_many(keys)
    assert reg == keys and kv.num_active_blocks() == 4 and kv.free == 4
    kv.check_invariants()
    assert kv.match_prefix(keys) == (4, 4)
    kv.release(reg, 0)
    assert kv.num_active_blocks() == 0 and len(kv.inactive) == 4 and kv.available() == 8
    assert kv.match_prefix(keys) == (4, 0)  # still cached, now inactive
    for k in keys[:2]:
        kv.acquire_cached(k)
    assert kv.match_prefix(keys) == (4, 2)
    kv.check_invariants()


def test_lru_eviction_takes_tail_of_least_recently_freed_first():
    kv = BlockKvManager(4)
    a = engine_block_keys((1,), 512, 256)  # 2 blocks
    b = engine_block_keys((2,), 512, 256)
    kv.release(kv.allocate_full_many(a), 0)
    kv.release(kv.allocate_full_many(b), 0)
    kv.allocate_private(1)  # evicts a's tail block first (a was freed first, tail before head)
    assert kv.match_prefix(a) == (1, 0)
    assert kv.match_prefix(b) == (2, 0)
    kv.allocate_private(1)
    assert kv.match_prefix(a) == (0, 0)
    kv.check_invariants()


def test_shared_blocks_are_reference_counted():
    kv = BlockKvManager(8)
    keys = engine_block_keys((5,), 512, 128)
    kv.allocate_full_many(keys)
    for k in keys:
        kv.acquire_cached(k)  # a second request shares them
    kv.release(keys, 0)
    assert kv.num_active_blocks() == 4
    kv.release(keys, 0)
    assert kv.num_active_blocks() == 0 and len(kv.inactive) == 4


def test_duplicate_content_allocated_again_is_private():
    kv = BlockKvManager(8)
    keys = engine_block_keys((5,), 512, 256)
    kv.allocate_full_many(keys)
    assert kv.allocate_full_many(keys) == []  # already cached: the copies are private
    assert kv.private_in_use == 2
    kv.check_invariants()


def test_over_allocation_is_a_bug():
    kv = BlockKvManager(2)
    kv.allocate_private(2)
    with pytest.raises(SimulationError):
        kv.allocate_private(1)
    with pytest.raises(SimulationError):
        kv.allocate_full_many([1])


def test_caching_off_never_matches():
    kv = BlockKvManager(8, enable_prefix_caching=False)
    keys = engine_block_keys((5,), 512, 256)
    assert kv.allocate_full_many(keys) == []
    assert kv.match_prefix(keys) == (0, 0)


@pytest.mark.parametrize("bs", [16, 64, 128, 512])
def test_hash_ids_of_512_tokens_map_to_engine_blocks(bs):
    a = engine_block_keys((10, 11, 12), 1400, bs)
    b = engine_block_keys((10, 11, 99), 1400, bs)
    c = engine_block_keys((77, 11, 12), 1400, bs)
    assert len(a) == 1400 // bs
    per = 512 // bs
    # identical first two trace blocks -> identical first 2*per engine blocks, then different
    assert a[: 2 * per] == b[: 2 * per]
    assert a[2 * per :] != b[2 * per :] or len(a) == 2 * per
    assert all(x != y for x, y in zip(a, b[2 * per :]))
    # chained: a different first id changes every later key, even where later ids agree
    assert not set(a) & set(c)
    assert len(set(a)) == len(a)


def test_engine_block_larger_than_trace_block():
    a = engine_block_keys((1, 2, 3, 4), 2048, 1024)
    b = engine_block_keys((1, 2, 3, 9), 2048, 1024)
    c = engine_block_keys((1, 9, 3, 4), 2048, 1024)
    assert len(a) == 2 and a[0] == b[0] and a[1] != b[1]
    assert a[0] != c[0]


def test_hash_ids_too_short_for_prompt():
    with pytest.raises(ValueError, match="input_length=1025"):
        engine_block_keys((1, 2), 1025, 64)
    assert engine_block_keys(None, 100, 64) is None


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["full", "priv", "release", "acquire"]), st.integers(0, 5)), max_size=60))
def test_blocks_conserved_under_random_operations(ops):
    kv = BlockKvManager(16)
    held: list[tuple[list[int], int]] = []
    for op, x in ops:
        if op == "full":
            keys = engine_block_keys((x, x + 1), 1024, 256)[: 1 + x % 4]
            hits, _ = kv.match_prefix(keys)
            for k in keys[:hits]:
                kv.acquire_cached(k)
            rest = keys[hits:]
            if len(rest) <= kv.available():
                reg = kv.allocate_full_many(rest)
                held.append((keys[:hits] + reg, len(rest) - len(reg)))
            else:
                kv.release(keys[:hits], 0)
        elif op == "priv" and x <= kv.available():
            kv.allocate_private(x)
            held.append(([], x))
        elif op == "release" and held:
            keys, n = held.pop(x % len(held))
            kv.release(keys, n)
        kv.check_invariants()
    for keys, n in held:
        kv.release(keys, n)
    kv.check_invariants()
    assert kv.num_active_blocks() == 0 and kv.available() == 16
