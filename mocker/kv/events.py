"""KV events: what a worker reports as blocks enter and leave its cache tiers, the listener interface block
pools call, the router-side index built from the events, and a KV-aware router fed only by that index.

Event fields follow Dynamo's KV events: ``stored`` (block hash, parent hash, tier) when a block enters a
worker's cache tier, ``removed`` (block hash, tier) when it leaves. Tiers: ``G1`` device (the engine's
block pool), ``G2`` host, ``G3`` disk, ``G4`` object (:mod:`mocker.kv.tiers`). A KV-aware router reads these
events instead of the workers' caches — the offline fleet with ``Fleet(..., kv_events=True)``, optionally
``kv_event_lag_ms`` late (it may then route on a prefix already evicted or miss one just stored, as a real
router does), and the live frontend (:mod:`mocker.live.frontend`) from the workers' ZMQ event streams.

Pieces:

* :class:`KvEvent` — one cache change of one (worker, DP rank, tier), stamped with the time it was drained.
* :class:`KvListener` — what a block pool calls: ``on_stored([(hash, parent hash or None)])`` and
  ``on_removed([hash])``. Only called when a listener is set (:class:`mocker.kv.kvbm.KvbmBlockManager`,
  :class:`ListeningBlockKvManager`), so the default pool pays nothing.
* :class:`TupleSink` — a listener appending ``(kind, hash, parent)`` tuples to a list;
  :class:`EventingKvManager` is the native pool with such a sink as ``.events`` (the interface the fleet's
  and the live worker's event paths drain).
* :class:`KvEventLog` — a listener that buffers events of one (worker, DP rank, tier) and stamps them when a
  driver drains them (virtual time, never a clock).
* :class:`RadixEventAdapter` — turns the SGLang radix cache's token-range changes
  (:class:`mocker.kv.radix.RadixCache` ``listener``) into block events named by engine block keys.
* :class:`KvEventIndex` — the router's view: replays events at least ``lag_ms`` old into per-(worker, rank,
  tier) block sets (or applies them at once: :meth:`KvEventIndex.apply`). With lag 0 and events drained
  before each routing decision, the index equals the caches (invariant tested with hypothesis).
* :class:`EventKvRouter` — picks a worker by cost = overlap-weighted prefill blocks + decode blocks
  (Dynamo KV router's cost with ``overlap_score_weight`` 1.0), reading overlaps from the index instead of
  worker state; ties go to the lowest worker id.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

from mocker.kv.manager import BlockKvManager

if TYPE_CHECKING:  # pragma: no cover
    from mocker.kv.radix import RadixNode, SeqContent

TIERS: tuple[str, ...] = ("G1", "G2", "G3", "G4")

CacheChange = tuple[Literal["stored", "removed"], int, int | None]
"""One change of a cache as a :class:`TupleSink` records it: (kind, block hash, parent hash or None)."""


@dataclass(frozen=True, slots=True)
class KvEvent:
    """One cache change of one engine core (one DP rank of one worker)."""

    kind: str
    """``stored`` or ``removed``."""
    block_hash: int
    parent_hash: int | None
    """The previous block of the same prompt when the pool saw it (None otherwise)."""
    worker_id: int
    dp_rank: int
    time_ms: float
    """When the driver drained it (an upper bound of when it happened)."""
    tier: str = "G1"


class KvListener(Protocol):
    """Receiver of a block pool's cache changes (metadata only)."""

    def on_stored(self, blocks: Sequence[tuple[int, int | None]]) -> None:
        """``blocks``: (block hash, parent hash or None) of blocks registered in the cache, in order."""

    def on_removed(self, blocks: Sequence[int]) -> None:
        """``blocks``: hashes of blocks evicted from the cache."""


class TupleSink:
    """A :class:`KvListener` appending ``(kind, hash, parent hash or None)`` tuples to ``events``."""

    __slots__ = ("events",)

    def __init__(self, events: list[CacheChange]) -> None:
        self.events = events

    def on_stored(self, blocks: Sequence[tuple[int, int | None]]) -> None:
        self.events.extend(("stored", h, p) for h, p in blocks)

    def on_removed(self, blocks: Sequence[int]) -> None:
        self.events.extend(("removed", h, None) for h in blocks)


class KvEventLog:
    """A :class:`KvListener` buffering events of one (worker, DP rank, tier) until :meth:`drain`."""

    __slots__ = ("worker_id", "dp_rank", "tier", "_buf", "emitted")

    def __init__(self, worker_id: int, dp_rank: int = 0, tier: str = "G1") -> None:
        if tier not in TIERS:
            raise ValueError(f"tier={tier!r}: expected one of {', '.join(TIERS)}")
        self.worker_id, self.dp_rank, self.tier = worker_id, dp_rank, tier
        self._buf: list[CacheChange] = []
        self.emitted = 0

    def on_stored(self, blocks: Sequence[tuple[int, int | None]]) -> None:
        self._buf.extend(("stored", h, p) for h, p in blocks)

    def on_removed(self, blocks: Sequence[int]) -> None:
        self._buf.extend(("removed", h, None) for h in blocks)

    def drain(self, now_ms: float) -> list[KvEvent]:
        """Every buffered change as :class:`KvEvent` stamped ``now_ms`` (emission order)."""
        w, r, tier = self.worker_id, self.dp_rank, self.tier
        out = [
            KvEvent(kind=k, block_hash=h, parent_hash=p, worker_id=w, dp_rank=r, time_ms=now_ms, tier=tier)
            for k, h, p in self._buf
        ]
        self._buf.clear()
        self.emitted += len(out)
        return out


def tier_listener_adapter(logs: Callable[[str, int], KvEventLog]) -> Callable[[str, str, int, Sequence[int]], None]:
    """Adapt :class:`mocker.kv.tiers.TierHierarchy`'s listener (kind, tier, worker, keys) to event logs;
    ``logs(tier, worker)`` returns the log of that tier (worker -1 = shared tier)."""

    def listen(kind: str, tier: str, worker: int, keys: Sequence[int]) -> None:
        log = logs(tier, worker)
        if kind == "stored":
            log.on_stored([(k, None) for k in keys])
        else:
            log.on_removed(keys)

    return listen


class ListeningBlockKvManager(BlockKvManager):
    """The native pool (:class:`BlockKvManager`, unchanged policy: least recently freed first) reporting its
    cache changes to ``listener``. Evicted keys are read before the allocation that evicts them (the
    native order is the inactive pool's order), registered keys are the methods' return values."""

    __slots__ = ("listener",)

    def __init__(self, num_blocks: int, enable_prefix_caching: bool = True, listener: KvListener | None = None) -> None:
        super().__init__(num_blocks, enable_prefix_caching)
        self.listener = listener

    def _about_to_evict(self, n: int) -> None:
        if n > 0 and self.listener is not None:
            self.listener.on_removed(self.inactive.oldest(n))

    def allocate_full(self, key: int | None) -> bool:
        self._about_to_evict(0 if self.free > 0 else 1)
        ok = super().allocate_full(key)
        if ok and key is not None and self.listener is not None:  # ok: key was registered (not None)
            self.listener.on_stored([(key, None)])
        return ok

    def allocate_full_many(self, keys: Sequence[int]) -> list[int]:
        # evictions interleave with registrations; a key evicted and re-registered in the same call is
        # reported removed then stored, which replays to the same final state
        self._about_to_evict(len(keys) - self.free)
        reg = super().allocate_full_many(keys)
        if reg and self.listener is not None:
            pos = {k: i for i, k in enumerate(keys)}
            self.listener.on_stored([(k, keys[pos[k] - 1] if pos[k] else None) for k in reg])
        return reg

    def promote_private(self, key: int | None) -> bool:
        ok = super().promote_private(key)
        if ok and key is not None and self.listener is not None:  # ok: key was registered (not None)
            self.listener.on_stored([(key, None)])
        return ok

    def allocate_private(self, n: int) -> None:
        if n > self.free:
            self._about_to_evict(min(n - self.free, self.inactive.n))
        super().allocate_private(n)


class EventingKvManager(ListeningBlockKvManager):
    """The native pool recording every cache change as ``events``: a list of (kind, block hash, parent hash)
    tuples that the driver (offline fleet, live worker) drains and clears."""

    __slots__ = ("events",)

    def __init__(self, num_blocks: int, enable_prefix_caching: bool = True) -> None:
        self.events: list[CacheChange] = []
        super().__init__(num_blocks, enable_prefix_caching, listener=TupleSink(self.events))


class RadixEventAdapter:
    """Listener of :class:`mocker.kv.radix.RadixCache` (``listener(kind, content, start, end)``: tokens
    ``[start, end)`` of sequence ``content`` entered or left the tree) reporting whole pages to a
    :class:`KvListener` as engine block keys.

    A page is reported when it lies inside one trace-keyed prompt segment of the content: its key is
    ``chained trace key * q + page index within the trace block`` with ``q = trace_block_size // page_size`` —
    exactly :func:`mocker.kv.manager.engine_block_keys` of a prompt holding it (the radix cache's own
    ``match_prefix`` decodes the same map), so a router matching a request's engine block keys finds it.
    Pages holding request-unique tokens (output, or content without ``hash_ids``) are nobody else's prefix
    and are not reported; neither is anything when ``trace_block_size % page_size != 0`` (no such map).
    Each reported page is held at most once by the tree (equal page keys mean equal prefixes, one path),
    so replaying the events gives the set of cached prefix pages exactly.
    """

    __slots__ = ("page", "q", "sink", "unique_base")

    def __init__(self, page_size: int, trace_block_size: int, sink: KvListener, unique_base: int = 1 << 64) -> None:
        self.page = page_size
        self.q = trace_block_size // page_size if trace_block_size % page_size == 0 else 0
        self.sink = sink
        self.unique_base = unique_base

    def page_keys(self, content: SeqContent | None, start: int, end: int) -> list[int]:
        """Engine block keys of the reportable pages in tokens ``[start, end)`` of ``content`` (None: the
        tree's root, which holds no tokens)."""
        q, page = self.q, self.page
        if not q or end <= start or content is None:
            return []
        out = []
        bounds, keys, ub = content.bounds, content.keys, self.unique_base
        nseg = len(bounds)
        tbs = q * page
        pos = start - start % page
        i = 0
        while pos < end:
            while i + 1 < nseg and bounds[i + 1] <= pos:
                i += 1
            seg_end = bounds[i + 1] if i + 1 < nseg else None
            k = keys[i]
            if (seg_end is None or pos + page <= seg_end) and k < ub and nseg > 1 and pos >= start:
                out.append(k * q + (pos % tbs) // page)
            pos += page
        return out

    def tree_keys(self, root: RadixNode) -> list[int]:
        """Engine block keys of every reportable page held in the tree below ``root`` (a snapshot: what
        replaying every event so far gives)."""
        out: list[int] = []
        stack = list(root.children.values())
        while stack:
            n = stack.pop()
            out.extend(self.page_keys(n.content, n.start, n.start + n.length))
            stack.extend(n.children.values())
        return out

    def __call__(self, kind: str, content: SeqContent | None, start: int, end: int) -> None:
        keys = self.page_keys(content, start, end)
        if not keys:
            return
        if kind == "stored":
            self.sink.on_stored([(k, None) for k in keys])
        else:
            self.sink.on_removed(keys)


class KvEventIndex:
    """Router-side index of cached blocks per (worker, DP rank, tier), fed by events ``lag_ms`` late
    (:meth:`publish` + :meth:`catch_up`), or at once (:meth:`apply`, :meth:`replace`: the live frontend,
    whose events arrive when they arrive). Raises ValueError for a negative or non-numeric lag."""

    def __init__(self, lag_ms: float = 0.0) -> None:
        if isinstance(lag_ms, bool) or not isinstance(lag_ms, (int, float)) or not lag_ms >= 0:
            raise ValueError(f"kv_event_lag_ms={lag_ms!r}: expected a number >= 0 (ms)")
        self.lag_ms = float(lag_ms)
        self.blocks: dict[tuple[int, int, str], set[int]] = {}
        self._queue: deque[KvEvent] = deque()
        self.applied = 0

    def publish(self, events: Sequence[KvEvent]) -> None:
        """Queue events (publication order; times non-decreasing)."""
        self._queue.extend(events)

    def catch_up(self, now_ms: float) -> None:
        """Apply every queued event published at or before ``now_ms - lag_ms``."""
        q, limit = self._queue, now_ms - self.lag_ms
        while q and q[0].time_ms <= limit:
            e = q.popleft()
            key = (e.worker_id, e.dp_rank, e.tier)
            s = self.blocks.get(key)
            if s is None:
                s = self.blocks[key] = set()
            if e.kind == "stored":
                s.add(e.block_hash)
            else:
                s.discard(e.block_hash)
            self.applied += 1

    def apply(self, kind: str, worker_id: int, dp_rank: int, blocks: Iterable[int], tier: str = "G1") -> None:
        """Apply one event now: ``kind`` ``stored`` / ``removed`` of ``blocks``, or ``cleared`` (all gone).
        Raises ValueError for another kind."""
        key = (worker_id, dp_rank, tier)
        s = self.blocks.get(key)
        if s is None:
            s = self.blocks[key] = set()
        if kind == "stored":
            s.update(blocks)
        elif kind == "removed":
            s.difference_update(blocks)
        elif kind == "cleared":
            s.clear()
        else:
            raise ValueError(f"kind={kind!r}: expected 'stored', 'removed' or 'cleared'")
        self.applied += 1

    def replace(self, worker_id: int, dp_rank: int, blocks: Iterable[int], tier: str = "G1") -> None:
        """Set the blocks of one (worker, rank, tier) from a snapshot."""
        self.blocks[(worker_id, dp_rank, tier)] = set(blocks)

    def forget(self, worker_id: int) -> None:
        """Drop every rank and tier of a worker (it left)."""
        for key in [k for k in self.blocks if k[0] == worker_id]:
            del self.blocks[key]

    @property
    def pending(self) -> int:
        """Events published but not applied yet."""
        return len(self._queue)

    def cached(self, worker_id: int, dp_rank: int = 0, tier: str = "G1") -> set[int]:
        """The blocks the index believes are in that tier (a live set: do not modify)."""
        return self.blocks.get((worker_id, dp_rank, tier), set())

    def overlap(self, worker_id: int, keys: Iterable[int], dp_rank: int = 0, tier: str = "G1") -> int:
        """Leading blocks of ``keys`` the index believes the worker's rank holds in ``tier``."""
        s = self.blocks.get((worker_id, dp_rank, tier))
        if not s:
            return 0
        n = 0
        for k in keys:
            if k not in s:
                break
            n += 1
        return n


OverlapFn = Callable[[int, Sequence[int]], int]
"""overlap(worker_id, keys) -> leading cached blocks."""


class EventKvRouter:
    """KV-aware worker choice: minimise ``overlap_weight * (request blocks - overlap) + decode blocks``.

    ``overlap`` is a function (worker, keys) -> cached leading blocks: :meth:`KvEventIndex.overlap` for the
    event-fed router, a worker's own ``match_prefix`` for the state-reading one, so both share this code.
    ``decode_blocks[w]`` is the router's own count of blocks of requests it sent to w and not yet finished
    (Dynamo tracks active blocks router-side, not from workers). Source of the cost: Dynamo KV router docs
    (cost = overlap_score_weight * prefill blocks + decode blocks, lowest wins).
    """

    def __init__(self, num_workers: int, overlap: OverlapFn, overlap_weight: float = 1.0) -> None:
        self.overlap = overlap
        self.overlap_weight = overlap_weight
        self.decode_blocks = [0] * num_workers

    def choose(self, keys: Sequence[int]) -> int:
        """Worker id for a request with prompt block ``keys`` (ties: lowest id)."""
        n = len(keys)
        best, best_cost = 0, None
        for w, load in enumerate(self.decode_blocks):
            cost = self.overlap_weight * (n - self.overlap(w, keys)) + load
            if best_cost is None or cost < best_cost:
                best, best_cost = w, cost
        return best

    def on_dispatch(self, worker_id: int, blocks: int) -> None:
        self.decode_blocks[worker_id] += blocks

    def on_finish(self, worker_id: int, blocks: int) -> None:
        self.decode_blocks[worker_id] -= blocks


__all__ = [
    "TIERS",
    "KvListener",
    "KvEvent",
    "KvEventLog",
    "KvEventIndex",
    "TupleSink",
    "ListeningBlockKvManager",
    "EventingKvManager",
    "RadixEventAdapter",
    "EventKvRouter",
    "tier_listener_adapter",
]
