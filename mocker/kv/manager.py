"""A paged KV-cache block pool with prefix caching (vLLM-style), metadata only.

Blocks are counted, not stored. A block is either *cached* (identified by a prefix-cache key: the chained
hash of its content and all content before it) or *private* (a partial block, generated tokens, or a
duplicate of content already cached). Cached blocks carry reference counts; when the last reference goes,
the block joins the *inactive* pool, still reusable by a later prefix hit, and is evicted least-recently
freed first when a fresh block is needed. Invariant (see :meth:`check_invariants`)::

    free + active cached + inactive cached + private in use == num_gpu_blocks

Trace content: a Mooncake ``hash_ids`` entry stands for ``trace_block_size`` (512) tokens of identical
content (docs/architecture.md "Prefix reuse"). :func:`engine_block_keys` re-chunks them into engine blocks of any size:
engine block j covers tokens [j*B, (j+1)*B); its key chains the previous key with the trace ids it overlaps
and its offset, so equal keys mean equal content and equal prefix.
"""

from __future__ import annotations

from collections.abc import Iterator, KeysView, Sequence

from dynoplan.errors import SimulationError


class BlockRuns:
    """The prefix-cache keys of a prompt's full engine blocks (:func:`engine_block_keys`) as runs of
    consecutive integers: key ``j`` (``0 <= j < n``) is ``bases[j // run] + j % run``.

    With ``trace_block_size % block_size == 0`` a run is the ``run = trace_block_size // block_size`` engine
    blocks of one trace block and its base is a multiple of ``run``, so two runs with different bases never
    share a key; otherwise each key is a run of its own (``run = 1``). Every run holds ``run`` keys except
    possibly the last, which holds ``n - (len(bases) - 1) * run`` (1..run). Consumers that count blocks per
    run (the KV router's book, :meth:`RadixCache.match_prefix_runs <mocker.kv.radix.RadixCache.match_prefix_runs>`)
    do ``len(bases)`` operations instead of ``n``.
    """

    __slots__ = ("bases", "run", "n", "_keys")

    def __init__(self, bases: list[int], run: int, n: int) -> None:
        self.bases = bases
        self.run = run
        self.n = n
        self._keys: list[int] | None = None

    def key_list(self) -> list[int]:
        """The ``n`` keys, in block order (equal to :func:`engine_block_keys`). Built on the first call and
        the same list afterwards: callers must not mutate it."""
        keys = self._keys
        if keys is None:
            if self.run == 1:
                keys = self.bases
            else:
                # one comprehension, not range(base, base + run) per run: the keys are wider than 64 bits and
                # CPython's range over such ints is about three times slower than adding the offsets
                sub = range(self.run)
                keys = [base + s for base in self.bases for s in sub]
                del keys[self.n :]
            self._keys = keys
        return keys


def engine_block_runs(
    hash_ids: Sequence[int] | None, input_length: int, block_size: int, trace_block_size: int = 512
) -> BlockRuns | None:
    """Prefix-cache keys of the *full* engine blocks of a prompt, as :class:`BlockRuns`.

    Args:
        hash_ids: one id per ``trace_block_size`` prompt tokens (None = unique content, returns None).
        input_length: prompt length (tokens). Only blocks fully inside the prompt get a key.
        block_size: engine block size (tokens).
    Returns: runs of ``input_length // block_size`` keys, or None. Raises ValueError when ``hash_ids`` covers
    fewer than ``input_length`` tokens.
    """
    if hash_ids is None:
        return None
    if len(hash_ids) * trace_block_size < input_length:
        raise ValueError(
            f"hash_ids covers {len(hash_ids) * trace_block_size} tokens, less than input_length={input_length}"
        )
    n = input_length // block_size
    prev = 0x5EED
    if trace_block_size % block_size == 0:
        # q engine blocks per trace block; key = chained trace hash * q + sub-block index
        q = trace_block_size // block_size
        bases: list[int] = []
        for m in range(-(-n // q)):
            prev = hash((prev, hash_ids[m]))
            bases.append(prev * q)
        return BlockRuns(bases, q, n)
    keys: list[int] = []
    for j in range(n):
        lo = j * block_size
        hi = lo + block_size - 1
        a, b = lo // trace_block_size, hi // trace_block_size
        ids = tuple(hash_ids[a : b + 1])
        prev = hash((prev, ids, lo % trace_block_size))
        keys.append(prev)
    return BlockRuns(keys, 1, n)


def engine_block_keys(
    hash_ids: Sequence[int] | None, input_length: int, block_size: int, trace_block_size: int = 512
) -> list[int] | None:
    """Prefix-cache keys of the *full* engine blocks of a prompt.

    Args:
        hash_ids: one id per ``trace_block_size`` prompt tokens (None = unique content, returns None).
        input_length: prompt length (tokens). Only blocks fully inside the prompt get a key.
        block_size: engine block size (tokens).
    Returns: ``input_length // block_size`` keys (ints), or None. Raises ValueError when ``hash_ids`` covers
    fewer than ``input_length`` tokens. The keys of :func:`engine_block_runs`.
    """
    runs = engine_block_runs(hash_ids, input_length, block_size, trace_block_size)
    return None if runs is None else runs.key_list()


class FreedOrder:
    """The inactive pool's keys, least recently freed first: what an ``OrderedDict[int, None]`` used as a FIFO
    gives (add newest, remove any, pop oldest), for less work per key (no linked node per key; popping the
    oldest is one dict deletion).

    ``live`` holds the keys; ``fifo`` holds them in the order they were added, from index ``head`` on (the
    entries before ``head`` are consumed). Removing the newest key pops it off ``fifo``; removing any other
    key leaves its entry behind, *stale* (lazy deletion). A key's stale entries all precede its live one
    (the live one is the key's last entry), so ``ghosts`` counts, per key, its stale entries still in
    ``fifo``: an entry met at the head whose key has a ghost count is stale. The consumed head is cut off
    once it is half of ``fifo``; stale entries are dropped once they outnumber the keys.
    """

    __slots__ = ("live", "fifo", "head", "ghosts", "n_ghosts")

    def __init__(self) -> None:
        self.live: dict[int, None] = {}
        """the keys; ``k in self.live`` is ``k in self`` (for hot loops)"""
        self.fifo: list[int] = []
        """keys in the order they were added (live and stale entries)"""
        self.head = 0
        """index in ``fifo`` of the first entry not consumed"""
        self.ghosts: dict[int, int] = {}
        """key -> number of its stale entries in ``fifo[head:]`` (>= 1)"""
        self.n_ghosts = 0
        """sum of ``ghosts`` (entries)"""

    def __len__(self) -> int:
        return len(self.live)

    def __contains__(self, key: object) -> bool:
        return key in self.live

    def __iter__(self) -> Iterator[int]:
        """The keys, oldest first (a snapshot: the pool may change during the iteration)."""
        return iter(self.oldest(len(self.live)))

    def keys(self) -> KeysView[int]:
        """The keys as a set-like view (no order)."""
        return self.live.keys()

    def add(self, key: int) -> None:
        """Add ``key`` (not in the pool) as the newest."""
        self.live[key] = None
        self.fifo.append(key)

    def remove(self, key: int) -> None:
        """Remove ``key``; KeyError if absent."""
        del self.live[key]
        fifo = self.fifo
        if fifo[-1] == key:  # its live entry is its last one: the newest (a block freed, then taken again)
            fifo.pop()
            return
        ghosts = self.ghosts
        ghosts[key] = ghosts.get(key, 0) + 1
        self.n_ghosts += 1
        if self.n_ghosts > len(self.live) + 64:
            self._compact()

    def move_to_newest(self, key: int) -> None:
        """Make ``key`` (in the pool) the newest, as if removed and added again."""
        self.remove(key)
        self.add(key)

    def _skip_stale(self) -> int:
        """Consume the stale entries at the head; returns ``head`` (then the oldest key's entry)."""
        fifo, ghosts = self.fifo, self.ghosts
        i = self.head
        k = fifo[i]
        while k in ghosts:
            c = ghosts[k] - 1
            if c:
                ghosts[k] = c
            else:
                del ghosts[k]
            self.n_ghosts -= 1
            i += 1
            k = fifo[i]
        self.head = i
        return i

    def first(self) -> int:
        """The oldest key (IndexError if the pool is empty)."""
        if not self.live:
            raise IndexError("first() of an empty FreedOrder")
        return self.fifo[self._skip_stale() if self.n_ghosts else self.head]

    def oldest(self, n: int) -> list[int]:
        """The ``min(n, len(self))`` oldest keys, oldest first (the pool is not changed)."""
        if n <= 0:
            return []
        h = self.head
        if not self.n_ghosts:
            return self.fifo[h : h + n]
        out: list[int] = []
        seen = dict(self.ghosts)  # stale entries left to meet, per key
        for i in range(h, len(self.fifo)):
            k = self.fifo[i]
            c = seen.get(k, 0)
            if c:
                seen[k] = c - 1
            else:
                out.append(k)
                if len(out) == n:
                    break
        return out

    def pop_oldest(self) -> int:
        """Remove and return the oldest key (IndexError if the pool is empty)."""
        if not self.live:
            raise IndexError("pop_oldest() of an empty FreedOrder")
        i = self._skip_stale() if self.n_ghosts else self.head
        k = self.fifo[i]
        del self.live[k]
        self.head = i + 1
        if 2 * self.head >= len(self.fifo) and self.head >= 64:
            self._trim()
        return k

    def evict(self, n: int) -> None:
        """Remove the ``n`` oldest keys (IndexError if fewer are in the pool)."""
        if n <= 0:
            return
        if n > len(self.live):
            raise IndexError(f"evict({n}) of a FreedOrder holding {len(self.live)}")
        fifo, live = self.fifo, self.live
        if self.n_ghosts:
            for _ in range(n):
                i = self._skip_stale()
                del live[fifo[i]]
                self.head = i + 1
        else:
            i = self.head
            for j in range(i, i + n):
                del live[fifo[j]]
            self.head = i + n
        if 2 * self.head >= len(fifo) and self.head >= 64:
            self._trim()

    def _trim(self) -> None:
        """Cut off the consumed head."""
        del self.fifo[: self.head]
        self.head = 0

    def _compact(self) -> None:
        """Drop every consumed or stale entry (order kept)."""
        self.fifo = self.oldest(len(self.live))
        self.head = 0
        self.ghosts = {}
        self.n_ghosts = 0

    def check(self) -> None:
        """Raise :class:`SimulationError` if ``fifo``, ``ghosts`` and ``live`` disagree: every key of ``live``
        has exactly one entry in ``fifo[head:]`` beyond its ghost count, every other key none."""
        counts: dict[int, int] = {}
        for i in range(self.head, len(self.fifo)):
            k = self.fifo[i]
            counts[k] = counts.get(k, 0) + 1
        for k, c in counts.items():
            if c != self.ghosts.get(k, 0) + (k in self.live):
                raise SimulationError(f"inactive pool: key {k} has {c} FIFO entries, ghosts {self.ghosts.get(k)}")
        if any(k not in counts for k in self.live) or any(k not in counts for k in self.ghosts):
            raise SimulationError("inactive pool: a key without a FIFO entry")
        if self.n_ghosts != sum(self.ghosts.values()) or any(c <= 0 for c in self.ghosts.values()):
            raise SimulationError(f"inactive pool: n_ghosts {self.n_ghosts} != {sum(self.ghosts.values())}")


class BlockKvManager:
    """Block pool of ``num_blocks`` blocks with optional prefix caching.

    Methods never read a clock. Raises :class:`SimulationError` on an allocation that was not checked with
    :meth:`available` first (a scheduler bug).
    """

    __slots__ = ("num_blocks", "caching", "free", "active", "inactive", "private_in_use")

    def __init__(self, num_blocks: int, enable_prefix_caching: bool = True) -> None:
        self.num_blocks = num_blocks
        self.caching = enable_prefix_caching
        self.free = num_blocks
        self.active: dict[int, int] = {}
        """cached key -> reference count (>= 1)"""
        self.inactive = FreedOrder()
        """cached keys with no reference, least recently freed first (next to evict)"""
        self.private_in_use = 0

    # ------------------------------------------------------------------ queries
    def available(self) -> int:
        """Blocks obtainable for new content now: free + evictable inactive (blocks)."""
        return self.free + len(self.inactive.live)

    def num_active_blocks(self) -> int:
        """Blocks referenced by running requests (cached-active + private)."""
        return len(self.active) + self.private_in_use

    def usage(self) -> float:
        """Active share of the pool (0..1), like ``vllm:kv_cache_usage_perc``."""
        return self.num_active_blocks() / self.num_blocks

    def match_prefix(self, keys: Sequence[int] | None) -> tuple[int, int]:
        """Leading blocks of ``keys`` present in the cache: (total hits, hits that are currently active)."""
        if not keys or not self.caching:
            return 0, 0
        hits = act = 0
        active, inactive = self.active, self.inactive.live
        for k in keys:
            if k in active:
                act += 1
            elif k not in inactive:
                break
            hits += 1
        return hits, act

    def match_prefix_runs(self, runs: BlockRuns) -> int:
        """Leading blocks of ``runs.key_list()`` present in the cache (active or inactive): the total hits of
        :meth:`match_prefix` (the KV router's overlap; the key list is built once per prompt, for all cores,
        and not at all while no core holds the first block, key ``bases[0]``)."""
        if not self.caching or not runs.n:
            return 0
        active, inactive = self.active, self.inactive.live
        first = runs.bases[0]
        if first not in active and first not in inactive:
            return 0
        hits = 0
        for k in runs.key_list():
            if k not in active and k not in inactive:
                break
            hits += 1
        return hits

    # ------------------------------------------------------------------ mutations
    def _take_fresh(self) -> None:
        if self.free > 0:
            self.free -= 1
        elif len(self.inactive.live):
            self.inactive.pop_oldest()
        else:
            raise SimulationError("KV block allocation without capacity (scheduler did not check available())")

    def acquire_cached(self, key: int) -> None:
        """Take a reference on a cached block found by :meth:`match_prefix`."""
        active = self.active
        if key in active:
            active[key] += 1
        else:
            self.inactive.remove(key)
            active[key] = 1

    def acquire_prefix(self, keys: Sequence[int]) -> int:
        """:meth:`match_prefix` then :meth:`acquire_cached` on each hit, in one pass over ``keys`` (the same
        dict operations in the same order). Returns the number of leading blocks now referenced (0 without
        prefix caching)."""
        if not self.caching:
            return 0
        hits = 0
        active, inactive = self.active, self.inactive
        cached = inactive.live
        for k in keys:
            if k in active:
                active[k] += 1
            elif k in cached:
                inactive.remove(k)
                active[k] = 1
            else:
                break
            hits += 1
        return hits

    def allocate_full(self, key: int | None) -> bool:
        """Allocate a fresh block for completed content ``key``. Returns True if it was registered in the
        cache (caller then holds a reference on ``key``), False if it is private (duplicate or uncached)."""
        self._take_fresh()
        if key is not None and self.caching and key not in self.active and key not in self.inactive.live:
            self.active[key] = 1
            return True
        self.private_in_use += 1
        return False

    def allocate_full_many(self, keys: Sequence[int]) -> list[int]:
        """:meth:`allocate_full` for several blocks; returns the keys registered (the rest are private)."""
        active, inactive = self.active, self.inactive
        cached = inactive.live
        caching = self.caching
        n = len(keys)
        if caching and n > 1 and n <= self.free + len(cached):
            # the common case, in bulk: distinct keys cached nowhere (so no eviction below can touch one of
            # them) -> the same evictions (least recently freed first) and registrations as the loop below
            j = 0
            for key in keys:
                if key in active or key in cached:  # cached, or repeated in ``keys``
                    break
                active[key] = 1
                j += 1
            if j == n:
                take = n if n <= self.free else self.free
                self.free -= take
                inactive.evict(n - take)
                return list(keys)
            for i in range(j):  # undone: the loop below registers them
                del active[keys[i]]
        registered: list[int] = []
        for key in keys:
            if self.free > 0:
                self.free -= 1
            elif len(cached):
                inactive.pop_oldest()
            else:
                raise SimulationError("KV block allocation without capacity (scheduler did not check available())")
            if caching and key not in active and key not in cached:
                active[key] = 1
                registered.append(key)
            else:
                self.private_in_use += 1
        return registered

    def promote_private(self, key: int | None) -> bool:
        """A private block held by a request became full with content ``key``: register it in the cache if
        that content is not cached yet. Returns True if registered (private count decreases by one)."""
        if key is not None and self.caching and key not in self.active and key not in self.inactive.live:
            self.private_in_use -= 1
            self.active[key] = 1
            return True
        return False

    def allocate_private(self, n: int) -> None:
        """Allocate ``n`` private blocks (evicting inactive cached blocks LRU-first when nothing is free)."""
        if n <= 0:
            return
        if n > self.free + len(self.inactive.live):
            raise SimulationError(f"KV allocation of {n} blocks exceeds available {self.available()}")
        take = min(n, self.free)
        self.free -= take
        self.inactive.evict(n - take)
        self.private_in_use += n

    def release(self, keys: list[int], n_private: int) -> None:
        """Drop a request's references: cached keys (in block order; the tail is freed first so that it is
        evicted first) and ``n_private`` private blocks."""
        active = self.active
        live, fifo = self.inactive.live, self.inactive.fifo
        for k in reversed(keys):
            c = active[k] - 1
            if c:
                active[k] = c
            else:
                del active[k]
                live[k] = None  # self.inactive.add(k), inlined (the hot loop of unique content)
                fifo.append(k)
        self.private_in_use -= n_private
        self.free += n_private

    def check_invariants(self) -> None:
        """Raise :class:`SimulationError` if blocks are not conserved or counts are inconsistent."""
        total = self.free + len(self.active) + len(self.inactive.live) + self.private_in_use
        if total != self.num_blocks:
            raise SimulationError(
                f"KV blocks not conserved: free {self.free} + active {len(self.active)} + inactive "
                f"{len(self.inactive.live)} + private {self.private_in_use} = {total} != {self.num_blocks}"
            )
        if self.free < 0 or self.private_in_use < 0:
            raise SimulationError(f"negative KV counts: free {self.free}, private {self.private_in_use}")
        if any(c <= 0 for c in self.active.values()):
            raise SimulationError("active cached block with non-positive reference count")
        if not self.active.keys().isdisjoint(self.inactive.keys()):
            raise SimulationError("a cached block is both active and inactive")
        self.inactive.check()
