"""KV events: what a worker reports as blocks enter and leave its prefix cache, and the router-side index
built from them.

A worker (one engine core) emits :class:`KvEvent` ``stored`` when a prompt block is registered in its prefix
cache and ``removed`` when a cached block is evicted (field names as Dynamo's KV events: block hash, parent
hash, tier; only tier ``G1`` = device memory exists here). The KV-aware router can read these events instead
of the workers' caches (``Fleet(..., kv_events=True)``), optionally ``kv_event_lag_ms`` late, which is how a
real router sees the fleet: it may route on a prefix that was already evicted, or miss one just stored.

:class:`EventingKvManager` wraps the block manager of :mod:`mocker.kv.manager` without changing its
behaviour: registrations are the keys the manager's methods report as registered; evictions are the oldest
inactive blocks (the manager's documented LRU-first order), read before the allocation that evicts them.
Events are stamped by the driver when it drains them (the fleet: the time the core was advanced to), so with
lag 0 the index equals the cache at routing time.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from itertools import islice
from typing import Sequence

from mocker.kv.manager import BlockKvManager


@dataclass(frozen=True, slots=True)
class KvEvent:
    """One cache change of one engine core."""

    kind: str
    """``stored`` or ``removed``."""
    block_hash: int
    parent_hash: int | None
    """The previous block of the same prompt when the manager saw it (None otherwise)."""
    worker_id: int
    dp_rank: int
    time_ms: float
    """When the driver drained it (an upper bound of when it happened)."""
    tier: str = "G1"


class EventingKvManager(BlockKvManager):
    """A :class:`BlockKvManager` that also records (kind, block hash, parent hash) of every cache change."""

    __slots__ = ("events",)

    def __init__(self, num_blocks: int, enable_prefix_caching: bool = True) -> None:
        super().__init__(num_blocks, enable_prefix_caching)
        self.events: list[tuple[str, int, int | None]] = []

    def _evictions(self, n: int) -> None:
        """Record the ``n`` oldest inactive blocks as removed (call before an allocation of n beyond free)."""
        if n > 0:
            self.events.extend(("removed", k, None) for k in islice(self.inactive, n))

    def allocate_full(self, key: int | None) -> bool:
        self._evictions(0 if self.free > 0 else 1)
        ok = super().allocate_full(key)
        if ok:
            self.events.append(("stored", key, None))  # type: ignore[arg-type]
        return ok

    def allocate_full_many(self, keys: Sequence[int]) -> list[int]:
        self._evictions(len(keys) - self.free)
        reg = super().allocate_full_many(keys)
        if reg:
            parent: dict[int, int | None] = {}
            prev = None
            for k in keys:
                parent[k] = prev
                prev = k
            self.events.extend(("stored", k, parent.get(k)) for k in reg)
        return reg

    def promote_private(self, key: int | None) -> bool:
        ok = super().promote_private(key)
        if ok:
            self.events.append(("stored", key, None))  # type: ignore[arg-type]
        return ok

    def allocate_private(self, n: int) -> None:
        if n > self.free:
            self._evictions(min(n, self.free + len(self.inactive)) - self.free)
        super().allocate_private(n)


class KvEventIndex:
    """The router's view of every core's cached blocks, built from events seen ``lag_ms`` late."""

    def __init__(self, lag_ms: float = 0.0) -> None:
        if not lag_ms >= 0:
            raise ValueError(f"kv_event_lag_ms={lag_ms!r}: expected a number >= 0")
        self.lag_ms = float(lag_ms)
        self.blocks: dict[tuple[int, int], set[int]] = {}
        self._queue: deque[KvEvent] = deque()
        self.applied = 0

    def push(self, events: Sequence[KvEvent]) -> None:
        """Queue events (in drain order, time non-decreasing)."""
        self._queue.extend(events)

    def catch_up(self, now_ms: float) -> None:
        """Apply every queued event stamped at or before ``now_ms - lag_ms``."""
        q = self._queue
        limit = now_ms - self.lag_ms
        while q and q[0].time_ms <= limit:
            e = q.popleft()
            s = self.blocks.setdefault((e.worker_id, e.dp_rank), set())
            if e.kind == "stored":
                s.add(e.block_hash)
            else:
                s.discard(e.block_hash)
            self.applied += 1

    def match_prefix(self, worker_id: int, dp_rank: int, keys: Sequence[int]) -> int:
        """Leading blocks of ``keys`` the index believes the core holds."""
        s = self.blocks.get((worker_id, dp_rank))
        if not s:
            return 0
        n = 0
        for k in keys:
            if k not in s:
                break
            n += 1
        return n
