"""FreedOrder (the native pool's inactive keys): least recently freed first, as an OrderedDict FIFO would be."""

from __future__ import annotations

from collections import OrderedDict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mocker.kv.manager import BlockKvManager, FreedOrder


def _pool(keys: list[int]) -> FreedOrder:
    p = FreedOrder()
    for k in keys:
        p.add(k)
    return p


def test_pop_oldest_in_freed_order():
    p = _pool([5, 3, 9, 1])
    assert list(p) == [5, 3, 9, 1] and len(p) == 4 and 9 in p and 7 not in p
    assert p.first() == 5
    assert p.pop_oldest() == 5 and p.pop_oldest() == 3
    assert list(p) == [9, 1]
    p.check()


def test_removed_then_freed_again_is_newest():
    p = _pool([1, 2, 3, 4])
    p.remove(2)  # a blank stays behind 1
    p.add(2)  # freed again: newest
    p.remove(3)
    assert list(p) == [1, 4, 2] and p.oldest(2) == [1, 4]
    p.check()
    assert [p.pop_oldest() for _ in range(3)] == [1, 4, 2]
    assert len(p) == 0
    p.check()
    with pytest.raises(IndexError):
        p.pop_oldest()


def test_remove_newest_leaves_no_stale_entry():
    p = _pool([1, 2, 3])
    p.remove(3)
    p.remove(2)
    assert p.fifo == [1] and p.n_stale == 0
    p.add(3)
    assert list(p) == [1, 3]


def test_move_to_newest_and_evict():
    p = _pool([10, 20, 30, 40])
    p.move_to_newest(10)
    p.move_to_newest(30)
    assert list(p) == [20, 40, 10, 30]
    p.evict(3)
    assert list(p) == [30]
    p.check()
    with pytest.raises(IndexError):
        p.evict(2)


def test_compaction_keeps_order():
    p = _pool(list(range(300)))
    for k in range(0, 298, 2):  # 149 blanks, 151 keys: not yet compacted
        p.remove(k)
    assert len(p.fifo) == 300
    for k in range(1, 200, 2):  # compacted at the 34th (183 blanks > 117 keys + 64), then 66 blanks again
        p.remove(k)
    p.check()
    assert len(p.fifo) == 117 and p.n_stale == 66
    assert list(p) == list(range(201, 298, 2)) + [298, 299]


def test_pool_eviction_order_hand_computed():
    """Release order: a request's tail block is freed first, so evicted first; a re-freed block is newest."""
    kv = BlockKvManager(4)
    kv.allocate_full_many([1, 2])
    kv.allocate_full_many([3, 4])
    kv.release([1, 2], 0)  # inactive: 2, 1
    kv.release([3, 4], 0)  # inactive: 2, 1, 4, 3
    assert list(kv.inactive) == [2, 1, 4, 3]
    assert kv.acquire_prefix([1]) == 1
    kv.release([1], 0)  # 1 is newest again
    assert list(kv.inactive) == [2, 4, 3, 1]
    kv.allocate_private(2)  # evicts 2 then 4
    assert list(kv.inactive) == [3, 1]
    kv.check_invariants()


# operations: (0, k) add k if absent, (1, k) remove k if present, (2, _) pop oldest, (3, n) evict n,
# (4, k) move k to newest if present
_ops = st.lists(st.tuples(st.integers(0, 4), st.integers(0, 40)), max_size=400)


@settings(max_examples=200, deadline=None)
@given(_ops)
def test_matches_ordered_dict(ops):
    p, model = FreedOrder(), OrderedDict[int, None]()
    for op, k in ops:
        if op == 0 and k not in model:
            p.add(k)
            model[k] = None
        elif op == 1 and k in model:
            p.remove(k)
            del model[k]
        elif op == 2 and model:
            assert p.pop_oldest() == model.popitem(last=False)[0]
        elif op == 3:
            n = min(k % 5, len(model))
            p.evict(n)
            for _ in range(n):
                model.popitem(last=False)
        elif op == 4 and k in model:
            p.move_to_newest(k)
            model.move_to_end(k)
        assert len(p) == len(model)
        assert (k in p) == (k in model)
    p.check()
    assert list(p) == list(model)
    assert p.oldest(3) == list(model)[:3]
    assert set(p.keys()) == set(model)
    if model:
        assert p.first() == next(iter(model))


class _TwoDictPool:
    """The pool as two structures, as it was written before the one-dict layout: referenced keys with their counts,
    and the unreferenced keys in an OrderedDict FIFO (least recently freed first)."""

    def __init__(self, n: int) -> None:
        self.free, self.private = n, 0
        self.active: dict[int, int] = {}
        self.inactive = OrderedDict[int, None]()

    def _take(self) -> None:
        if self.free:
            self.free -= 1
        else:
            self.inactive.popitem(last=False)

    def available(self) -> int:
        return self.free + len(self.inactive)

    def acquire_prefix(self, keys: list[int]) -> int:
        hits = 0
        for k in keys:
            if k in self.active:
                self.active[k] += 1
            elif k in self.inactive:
                del self.inactive[k]
                self.active[k] = 1
            else:
                break
            hits += 1
        return hits

    def allocate_full_many(self, keys: list[int]) -> list[int]:
        reg = []
        for k in keys:
            self._take()
            if k in self.active or k in self.inactive:
                self.private += 1
            else:
                self.active[k] = 1
                reg.append(k)
        return reg

    def release(self, keys: list[int], n_private: int) -> None:
        for k in reversed(keys):
            self.active[k] -= 1
            if not self.active[k]:
                del self.active[k]
                self.inactive[k] = None
        self.private -= n_private
        self.free += n_private


# requests over 12 contents: (0, i, n) admit request i with a prompt of n blocks of contents i..i+n-1 (prefix hits
# first, then the rest allocated), (1, i, _) release request i
_reqs = st.lists(st.tuples(st.integers(0, 1), st.integers(0, 7), st.integers(1, 5)), max_size=120)


@settings(max_examples=200, deadline=None)
@given(_reqs, st.integers(4, 16))
def test_one_dict_pool_matches_the_two_structure_model(ops, num_blocks):
    """``cached`` (counts > 0, minus stamps <= 0) behaves as a refcount dict beside an LRU of freed keys: the same
    hits, registrations, evictions and inactive order on any sequence of admissions and releases."""
    kv, model = BlockKvManager(num_blocks), _TwoDictPool(num_blocks)
    held: dict[int, tuple[list[int], int]] = {}
    for op, i, n in ops:
        if op == 0 and i not in held:
            keys = list(range(i, i + n))
            if kv.available() < n:
                assert model.available() < n
                continue
            hits = kv.acquire_prefix(keys)
            assert hits == model.acquire_prefix(keys) and kv.match_prefix(keys)[0] >= hits
            reg = kv.allocate_full_many(keys[hits:])
            assert reg == model.allocate_full_many(keys[hits:])
            held[i] = (keys[:hits] + reg, n - hits - len(reg))
        elif op == 1 and i in held:
            keys, n_private = held.pop(i)
            kv.release(keys, n_private)
            model.release(keys, n_private)
        kv.check_invariants()
        assert kv.active == model.active and list(kv.inactive) == list(model.inactive)
        assert kv.free == model.free and kv.private_in_use == model.private
        assert kv.num_active_blocks() == len(model.active) + model.private


def test_releasing_a_block_no_request_references_is_a_scheduler_bug():
    # the one dict holds inactive keys as stamps <= 0: a second release must not count one down into a false stamp
    from dynoplan.errors import SimulationError

    kv = BlockKvManager(4)
    kv.allocate_full_many([1, 2])
    kv.release([1, 2], 0)
    with pytest.raises(SimulationError, match="block 2, which no request references"):
        kv.release([1, 2], 0)
    kv.check_invariants()
    assert list(kv.inactive) == [2, 1]
