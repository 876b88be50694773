"""``g1_backend=kvbm``: a G1 block pool whose inactive pool is lineage-aware (evict leaves before ancestors).

The native pool (:class:`mocker.kv.manager.BlockKvManager`) evicts the least recently freed inactive block,
which can evict a prefix block while a block chained after it stays cached — a block nobody can hit any more,
as prefix matching stops at the first miss. KVBM's inactive pool instead evicts only *leaves*: inactive
blocks with no cached child, least recently freed first. An inactive block met at the head of the eviction
order while it still has cached children is moved to the back (an ancestor outlives its descendants; the
order among leaves stays least-recently-freed, and the common case stays O(1)). If no inactive block is a leaf
(every inactive block has an active descendant), the oldest inactive block is evicted anyway and its
children are orphaned, so that :meth:`available` stays exact (free + every inactive block).

Lineage: a block's parent is the block before it in the same prompt. The manager learns it from the keys a
request registers in one call and, at the latest, from :meth:`release` (keys in block order) — a block can
only be evicted after its release, so every evictable block's lineage is known by then. A duplicate block
held privately is skipped in a request's key list, so the recorded "parent" may be a further ancestor; the
eviction rule (descendants before ancestors) holds either way.

Optional listener (:class:`mocker.kv.events.KvListener`): ``on_stored([(hash, parent hash or None)])`` when
blocks are registered, ``on_removed([hash])`` when they are evicted; with no listener nothing is called.
The engine core uses this class exactly like the native pool (same methods, same invariant).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, TypeGuard

from dynoplan.errors import SimulationError
from mocker.kv.events import CacheChange, TupleSink
from mocker.kv.manager import BlockKvManager

if TYPE_CHECKING:  # pragma: no cover
    from mocker.config import EngineConfig
    from mocker.kv.events import KvListener


class KvbmBlockManager(BlockKvManager):
    """Lineage-aware G1 pool of ``num_blocks`` blocks (see module docstring). Raises
    :class:`SimulationError` on an allocation beyond :meth:`available` (a scheduler bug)."""

    __slots__ = ("parent", "children", "listener", "evicted", "offload_sink")

    def __init__(self, num_blocks: int, enable_prefix_caching: bool = True, listener: KvListener | None = None) -> None:
        super().__init__(num_blocks, enable_prefix_caching)
        self.parent: dict[int, int] = {}
        """cached key -> cached parent key (absent = root or unknown)"""
        self.children: dict[int, set[int]] = {}
        """cached key -> its cached children"""
        self.listener = listener
        self.evicted = 0
        """blocks evicted so far (count)"""
        self.offload_sink: list[int] | None = None
        """KVBM lower tiers: every evicted cached block's key is appended here (the engine core sends them to
        G2, :mod:`mocker.kv.tiers`); None = off."""

    # ------------------------------------------------------------------ lineage
    def _link(self, key: int, parent: int | None) -> None:
        if parent is None or key in self.parent or parent == key:
            return
        if parent in self.cached:
            self.parent[key] = parent
            self.children.setdefault(parent, set()).add(key)

    def _register(self, keys: Sequence[int], first_parent: int | None) -> None:
        prev = first_parent
        for k in keys:
            self._link(k, prev)
            prev = k
        if self.listener is not None and keys:
            self.listener.on_stored([(k, self.parent.get(k)) for k in keys])

    def _evict_one(self) -> int:
        inactive, children = self.inactive, self.children
        for _ in range(inactive.n):
            k = inactive.first()
            if k not in children:  # a leaf (children holds only non-empty sets)
                inactive.remove(k)
                break
            inactive.move_to_newest(k)  # an ancestor of cached blocks outlives them
        else:
            if not inactive.n:
                raise SimulationError("KV block allocation without capacity (scheduler did not check available())")
            k = inactive.pop_oldest()  # no inactive leaf: oldest inactive, children orphaned
            for c in children.pop(k):
                del self.parent[c]
        p = self.parent.pop(k, None)
        if p is not None:
            sib = children[p]
            sib.discard(k)
            if not sib:
                del children[p]
        self.evicted += 1
        if self.offload_sink is not None:
            self.offload_sink.append(k)
        return k

    def _take_fresh(self) -> None:
        if self.free > 0:
            self.free -= 1
        else:
            k = self._evict_one()
            if self.listener is not None:
                self.listener.on_removed([k])

    def _take_many(self, n: int) -> None:
        take = min(n, self.free)
        self.free -= take
        if n - take > self.free + self.inactive.n:
            raise SimulationError(f"KV allocation of {n} blocks exceeds available {take + self.inactive.n}")
        removed = [self._evict_one() for _ in range(n - take)]
        if removed and self.listener is not None:
            self.listener.on_removed(removed)

    # ------------------------------------------------------------------ BlockKvManager API
    def _is_new(self, key: int | None) -> TypeGuard[int]:
        return key is not None and self.caching and key not in self.cached

    def allocate_full(self, key: int | None) -> bool:
        self._take_fresh()
        if self._is_new(key):
            self.cached[key] = 1
            self._register([key], None)
            return True
        self.private_in_use += 1
        return False

    def allocate_full_many(self, keys: Sequence[int]) -> list[int]:
        if len(keys) > self.available():
            raise SimulationError("KV block allocation without capacity (scheduler did not check available())")
        registered: list[int] = []
        cached, caching = self.cached, self.caching
        parent, children = self.parent, self.children
        removed: list[int] | None = [] if self.listener is not None else None
        prev: int | None = None
        for key in keys:
            if self.free > 0:
                self.free -= 1
            else:
                ev = self._evict_one()
                if removed is not None:
                    removed.append(ev)
            if caching and key not in cached:
                cached[key] = 1
                registered.append(key)
                # parent: the previous key of the same call when still cached (a new key has no lineage yet)
                if prev is not None and prev != key and prev in cached:
                    parent[key] = prev
                    ch = children.get(prev)
                    if ch is None:
                        children[prev] = {key}
                    else:
                        ch.add(key)
            else:
                self.private_in_use += 1
            prev = key
        if removed and self.listener is not None:  # removed is a list only with a listener
            self.listener.on_removed(removed)
        if registered and self.listener is not None:
            self.listener.on_stored([(k, self.parent.get(k)) for k in registered])
        return registered

    def promote_private(self, key: int | None) -> bool:
        if self._is_new(key):
            self.private_in_use -= 1
            self.cached[key] = 1
            self._register([key], None)
            return True
        return False

    def allocate_private(self, n: int) -> None:
        if n <= 0:
            return
        self._take_many(n)
        self.private_in_use += n

    def release(self, keys: list[int], n_private: int) -> None:
        prev = None
        for k in keys:  # learn lineage (block order)
            if k not in self.parent and prev is not None:
                self._link(k, prev)
            prev = k
        super().release(keys, n_private)

    def check_invariants(self) -> None:
        """Base conservation check, plus: lineage only between cached blocks, children map == parent map."""
        super().check_invariants()
        cached = self.cached
        for k, p in self.parent.items():
            if k not in cached or p not in cached or k not in self.children.get(p, ()):
                raise SimulationError(f"kvbm lineage broken: block {k} parent {p}")
        n = sum(len(c) for c in self.children.values())
        if n != len(self.parent):
            raise SimulationError(f"kvbm lineage: {n} child links != {len(self.parent)} parent links")


def make_g1_pool(cfg: EngineConfig) -> BlockKvManager:
    """The G1 block pool ``cfg.g1_backend`` names for a vLLM / TRT-LLM core (lower tiers, when configured, are
    attached by the core: :meth:`mocker.engine.vllm.VllmCore.attach_tiers`)."""
    if cfg.g1_backend == "native":
        return BlockKvManager(cfg.num_gpu_blocks, cfg.enable_prefix_caching)
    return KvbmBlockManager(cfg.num_gpu_blocks, cfg.enable_prefix_caching)


class EventingKvbmBlockManager(KvbmBlockManager):
    """A :class:`KvbmBlockManager` exposing its changes as ``events`` (list of (kind, hash, parent hash)),
    the interface the fleet's KV-event path drains (:class:`mocker.kv.events.EventingKvManager`'s)."""

    __slots__ = ("events",)

    def __init__(self, num_blocks: int, enable_prefix_caching: bool = True) -> None:
        self.events: list[CacheChange] = []
        super().__init__(num_blocks, enable_prefix_caching, listener=TupleSink(self.events))
