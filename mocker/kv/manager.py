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

    ``fifo`` holds the keys in the order they were added, from index ``head`` on (the entries before ``head``
    are consumed); ``live`` maps each key to its *stamp*, the absolute position of its entry (``fifo[i]`` is
    at ``base + i``, so cutting off the consumed head, once it is half of ``fifo``, keeps the stamps).
    Removing the newest key pops it off ``fifo``; removing any other key blanks its entry to None (lazy
    deletion: consumption skips it), and once the blanks outnumber the keys the blanks and the consumed head
    are dropped and the keys restamped.
    """

    __slots__ = ("live", "fifo", "head", "base", "n_stale")

    def __init__(self) -> None:
        self.live: dict[int, int] = {}
        """key -> stamp; ``k in self.live`` is ``k in self`` (for hot loops)"""
        self.fifo: list[int | None] = []
        """keys in the order they were added (None: removed)"""
        self.head = 0
        """index in ``fifo`` of the first entry not consumed"""
        self.base = 0
        """stamp of ``fifo[0]``"""
        self.n_stale = 0
        """None entries in ``fifo[head:]``"""

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
        fifo = self.fifo
        self.live[key] = self.base + len(fifo)
        fifo.append(key)

    def remove(self, key: int) -> None:
        """Remove ``key``; KeyError if absent."""
        live, fifo = self.live, self.fifo
        i = live.pop(key) - self.base
        if i == len(fifo) - 1:  # the newest (a block freed, then taken again): no blank left behind
            fifo.pop()
            while len(fifo) > self.head and fifo[-1] is None:
                fifo.pop()
                self.n_stale -= 1
            return
        fifo[i] = None
        self.n_stale += 1
        if self.n_stale > len(live) + 64:
            self._compact()

    def move_to_newest(self, key: int) -> None:
        """Make ``key`` (in the pool) the newest, as if removed and added again."""
        self.remove(key)
        self.add(key)

    def first(self) -> int:
        """The oldest key (IndexError if the pool is empty)."""
        if not self.live:
            raise IndexError("first() of an empty FreedOrder")
        fifo = self.fifo
        i = self.head
        k = fifo[i]
        while k is None:  # consumed: the blanks at the head
            self.n_stale -= 1
            i += 1
            k = fifo[i]
        self.head = i
        return k

    def oldest(self, n: int) -> list[int]:
        """The ``min(n, len(self))`` oldest keys, oldest first (the pool is not changed)."""
        out: list[int] = []
        if n <= 0:
            return out
        fifo = self.fifo
        for i in range(self.head, len(fifo)):
            k = fifo[i]
            if k is not None:
                out.append(k)
                if len(out) == n:
                    break
        return out

    def pop_oldest(self) -> int:
        """Remove and return the oldest key (IndexError if the pool is empty)."""
        k = self.first()
        del self.live[k]
        self.head += 1
        if 2 * self.head >= len(self.fifo) and self.head >= 64:
            self._trim()
        return k

    def evict(self, n: int) -> None:
        """Remove the ``n`` oldest keys (IndexError if fewer are in the pool)."""
        if n <= 0:
            return
        live, fifo = self.live, self.fifo
        if n > len(live):
            raise IndexError(f"evict({n}) of a FreedOrder holding {len(live)}")
        i = self.head
        while n:
            k = fifo[i]
            i += 1
            if k is None:
                self.n_stale -= 1
            else:
                del live[k]
                n -= 1
        self.head = i
        if 2 * i >= len(fifo) and i >= 64:
            self._trim()

    def _trim(self) -> None:
        """Cut off the consumed head (the stamps stay)."""
        del self.fifo[: self.head]
        self.base += self.head
        self.head = 0

    def _compact(self) -> None:
        """Drop the consumed head and the blanks; restamp the keys from 0 (order kept)."""
        keys = self.oldest(len(self.live))
        live = self.live
        for i, k in enumerate(keys):
            live[k] = i
        fifo: list[int | None] = list(keys)
        self.fifo = fifo
        self.head = self.base = self.n_stale = 0

    def check(self) -> None:
        """Raise :class:`SimulationError` if ``fifo`` and ``live`` disagree: each key's stamp points at its own
        entry in ``fifo[head:]``, whose other entries are the ``n_stale`` blanks."""
        fifo, base, head = self.fifo, self.base, self.head
        for k, s in self.live.items():
            if not head <= s - base < len(fifo) or fifo[s - base] != k:
                raise SimulationError(f"inactive pool: key {k} stamp {s} is not its FIFO entry")
        blanks = sum(1 for i in range(head, len(fifo)) if fifo[i] is None)
        if blanks != self.n_stale or len(fifo) - head != len(self.live) + blanks:
            raise SimulationError(f"inactive pool: {blanks} blanks, n_stale {self.n_stale}, {len(self.live)} keys")


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
        inactive = self.inactive
        live, fifo, base = inactive.live, inactive.fifo, inactive.base
        for k in reversed(keys):
            c = active[k] - 1
            if c:
                active[k] = c
            else:
                del active[k]
                live[k] = base + len(fifo)  # inactive.add(k), inlined (the hot loop of unique content)
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
