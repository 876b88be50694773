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

from collections.abc import Iterator, Sequence

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
    are consumed). The keys live in ``cached``, a dict this pool may share with its owner
    (:class:`BlockKvManager` keeps its referenced keys there too, as positive reference counts, so that a
    prefix lookup is one dict probe): a key of the pool maps to minus its *stamp*, the absolute position of
    its entry (``fifo[i]`` is at ``base + i``, so cutting off the consumed head, once it is half of ``fifo``,
    keeps the stamps); every value <= 0 in ``cached`` is a key of the pool. Removing the newest key pops it off
    ``fifo``; removing any other key blanks its entry to None (lazy deletion: consumption skips it), and once
    the blanks outnumber the keys the blanks and the consumed head are dropped and the keys restamped.
    """

    __slots__ = ("cached", "n", "fifo", "head", "base", "n_stale")

    def __init__(self, cached: dict[int, int] | None = None) -> None:
        self.cached: dict[int, int] = {} if cached is None else cached
        """key -> minus its stamp (<= 0) for the keys of this pool; any other entry (> 0) is the owner's"""
        self.n = 0
        """keys in the pool"""
        self.fifo: list[int | None] = []
        """keys in the order they were added (None: removed)"""
        self.head = 0
        """index in ``fifo`` of the first entry not consumed"""
        self.base = 0
        """stamp of ``fifo[0]``"""
        self.n_stale = 0
        """None entries in ``fifo[head:]``"""

    def __len__(self) -> int:
        return self.n

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, int):
            return False
        v = self.cached.get(key)
        return v is not None and v <= 0

    def __iter__(self) -> Iterator[int]:
        """The keys, oldest first (a snapshot: the pool may change during the iteration)."""
        return iter(self.oldest(self.n))

    def keys(self) -> set[int]:
        """The keys as a set (no order)."""
        return {k for k, v in self.cached.items() if v <= 0}

    def add(self, key: int) -> None:
        """Add ``key`` (not in ``cached``) as the newest."""
        fifo = self.fifo
        self.cached[key] = -(self.base + len(fifo))
        fifo.append(key)
        self.n += 1

    def _unlink(self, key: int) -> None:
        """Take ``key``'s entry out of ``fifo`` (the key's value in ``cached`` is the caller's to change)."""
        fifo = self.fifo
        i = -self.cached[key] - self.base
        self.n -= 1
        if i == len(fifo) - 1:  # the newest (a block freed, then taken again): no blank left behind
            fifo.pop()
            while len(fifo) > self.head and fifo[-1] is None:
                fifo.pop()
                self.n_stale -= 1
            return
        fifo[i] = None
        self.n_stale += 1
        if self.n_stale > self.n + 64:
            self._compact()

    def remove(self, key: int) -> None:
        """Remove ``key`` (in the pool) from the pool and from ``cached``."""
        self._unlink(key)
        del self.cached[key]

    def take(self, key: int) -> None:
        """Remove ``key`` (in the pool) from the pool, leaving it in ``cached`` with one reference (value 1)."""
        self._unlink(key)
        self.cached[key] = 1

    def move_to_newest(self, key: int) -> None:
        """Make ``key`` (in the pool) the newest, as if removed and added again."""
        self.remove(key)
        self.add(key)

    def first(self) -> int:
        """The oldest key (IndexError if the pool is empty)."""
        if not self.n:
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
        del self.cached[k]
        self.n -= 1
        self.head += 1
        if 2 * self.head >= len(self.fifo) and self.head >= 64:
            self._trim()
        return k

    def evict(self, n: int) -> None:
        """Remove the ``n`` oldest keys (IndexError if fewer are in the pool)."""
        if n <= 0:
            return
        cached, fifo = self.cached, self.fifo
        if n > self.n:
            raise IndexError(f"evict({n}) of a FreedOrder holding {self.n}")
        self.n -= n
        i = self.head
        while n:
            k = fifo[i]
            i += 1
            if k is None:
                self.n_stale -= 1
            else:
                del cached[k]
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
        keys = self.oldest(self.n)
        cached = self.cached
        for i, k in enumerate(keys):
            cached[k] = -i
        fifo: list[int | None] = list(keys)
        self.fifo = fifo
        self.head = self.base = self.n_stale = 0

    def check(self) -> None:
        """Raise :class:`SimulationError` if ``fifo`` and ``cached`` disagree: each key's stamp points at its own
        entry in ``fifo[head:]``, whose other entries are the ``n_stale`` blanks."""
        fifo, base, head = self.fifo, self.base, self.head
        n = 0
        for k, v in self.cached.items():
            if v > 0:
                continue
            n += 1
            s = -v
            if not head <= s - base < len(fifo) or fifo[s - base] != k:
                raise SimulationError(f"inactive pool: key {k} stamp {s} is not its FIFO entry")
        blanks = sum(1 for i in range(head, len(fifo)) if fifo[i] is None)
        if n != self.n or blanks != self.n_stale or len(fifo) - head != n + blanks:
            raise SimulationError(f"inactive pool: {blanks} blanks, n_stale {self.n_stale}, {n} keys, n {self.n}")


class BlockKvManager:
    """Block pool of ``num_blocks`` blocks with optional prefix caching.

    Methods never read a clock. Raises :class:`SimulationError` on an allocation that was not checked with
    :meth:`available` first (a scheduler bug).
    """

    __slots__ = ("num_blocks", "caching", "free", "cached", "inactive", "private_in_use")

    def __init__(self, num_blocks: int, enable_prefix_caching: bool = True) -> None:
        self.num_blocks = num_blocks
        self.caching = enable_prefix_caching
        self.free = num_blocks
        self.cached: dict[int, int] = {}
        """cached key -> its reference count (>= 1: active) or minus its stamp in ``inactive`` (<= 0: inactive);
        one dict for both, so that a prefix lookup or a registration check is one probe"""
        self.inactive = FreedOrder(self.cached)
        """cached keys with no reference, least recently freed first (next to evict)"""
        self.private_in_use = 0

    @property
    def active(self) -> dict[int, int]:
        """The active cached keys and their reference counts (a new dict: for inspection, not for hot loops)."""
        return {k: v for k, v in self.cached.items() if v > 0}

    # ------------------------------------------------------------------ queries
    def available(self) -> int:
        """Blocks obtainable for new content now: free + evictable inactive (blocks)."""
        return self.free + self.inactive.n

    def num_active_blocks(self) -> int:
        """Blocks referenced by running requests (cached-active + private)."""
        return len(self.cached) - self.inactive.n + self.private_in_use

    def usage(self) -> float:
        """Active share of the pool (0..1), like ``vllm:kv_cache_usage_perc``."""
        return self.num_active_blocks() / self.num_blocks

    def match_prefix(self, keys: Sequence[int] | None) -> tuple[int, int]:
        """Leading blocks of ``keys`` present in the cache: (total hits, hits that are currently active)."""
        if not keys or not self.caching:
            return 0, 0
        hits = act = 0
        cached = self.cached
        for k in keys:
            v = cached.get(k)
            if v is None:
                break
            if v > 0:
                act += 1
            hits += 1
        return hits, act

    def match_prefix_runs(self, runs: BlockRuns) -> int:
        """Leading blocks of ``runs.key_list()`` present in the cache (active or inactive): the total hits of
        :meth:`match_prefix` (the KV router's overlap; the key list is built once per prompt, for all cores,
        and not at all while no core holds the first block, key ``bases[0]``)."""
        if not self.caching or not runs.n:
            return 0
        cached = self.cached
        if runs.bases[0] not in cached:
            return 0
        hits = 0
        for k in runs.key_list():
            if k not in cached:
                break
            hits += 1
        return hits

    # ------------------------------------------------------------------ mutations
    def _take_fresh(self) -> None:
        if self.free > 0:
            self.free -= 1
        elif self.inactive.n:
            self.inactive.pop_oldest()
        else:
            raise SimulationError("KV block allocation without capacity (scheduler did not check available())")

    def acquire_cached(self, key: int) -> None:
        """Take a reference on a cached block found by :meth:`match_prefix`."""
        v = self.cached[key]
        if v > 0:
            self.cached[key] = v + 1
        else:
            self.inactive.take(key)

    def acquire_prefix(self, keys: Sequence[int]) -> int:
        """:meth:`match_prefix` then :meth:`acquire_cached` on each hit, in one pass over ``keys``. Returns the
        number of leading blocks now referenced (0 without prefix caching)."""
        if not self.caching:
            return 0
        hits = 0
        cached, inactive = self.cached, self.inactive
        for k in keys:
            v = cached.get(k)
            if v is None:
                break
            if v > 0:
                cached[k] = v + 1
            else:
                inactive.take(k)
            hits += 1
        return hits

    def allocate_full(self, key: int | None) -> bool:
        """Allocate a fresh block for completed content ``key``. Returns True if it was registered in the
        cache (caller then holds a reference on ``key``), False if it is private (duplicate or uncached)."""
        self._take_fresh()
        if key is not None and self.caching and key not in self.cached:
            self.cached[key] = 1
            return True
        self.private_in_use += 1
        return False

    def allocate_full_many(self, keys: Sequence[int]) -> list[int]:
        """:meth:`allocate_full` for several blocks; returns the keys registered (the rest are private)."""
        cached, inactive = self.cached, self.inactive
        caching = self.caching
        n = len(keys)
        if caching and n > 1 and n <= self.free + inactive.n:
            # the common case, in bulk: distinct keys cached nowhere (so no eviction below can touch one of
            # them) -> the same evictions (least recently freed first) and registrations as the loop below
            j = 0
            for key in keys:
                if key in cached:  # cached, or repeated in ``keys``
                    break
                cached[key] = 1
                j += 1
            if j == n:
                take = n if n <= self.free else self.free
                self.free -= take
                inactive.evict(n - take)
                return list(keys)
            for i in range(j):  # undone: the loop below registers them
                del cached[keys[i]]
        registered: list[int] = []
        for key in keys:
            if self.free > 0:
                self.free -= 1
            elif inactive.n:
                inactive.pop_oldest()
            else:
                raise SimulationError("KV block allocation without capacity (scheduler did not check available())")
            if caching and key not in cached:
                cached[key] = 1
                registered.append(key)
            else:
                self.private_in_use += 1
        return registered

    def promote_private(self, key: int | None) -> bool:
        """A private block held by a request became full with content ``key``: register it in the cache if
        that content is not cached yet. Returns True if registered (private count decreases by one)."""
        if key is not None and self.caching and key not in self.cached:
            self.private_in_use -= 1
            self.cached[key] = 1
            return True
        return False

    def allocate_private(self, n: int) -> None:
        """Allocate ``n`` private blocks (evicting inactive cached blocks LRU-first when nothing is free)."""
        if n <= 0:
            return
        if n > self.free + self.inactive.n:
            raise SimulationError(f"KV allocation of {n} blocks exceeds available {self.available()}")
        take = min(n, self.free)
        self.free -= take
        self.inactive.evict(n - take)
        self.private_in_use += n

    def release(self, keys: list[int], n_private: int) -> None:
        """Drop a request's references: cached keys (in block order; the tail is freed first so that it is
        evicted first) and ``n_private`` private blocks."""
        cached = self.cached
        inactive = self.inactive
        fifo, base = inactive.fifo, inactive.base
        freed = 0
        for k in reversed(keys):
            c = cached[k] - 1
            if c > 0:
                cached[k] = c
            elif c == 0:
                cached[k] = -(base + len(fifo))  # inactive.add(k), inlined (the hot loop of unique content)
                fifo.append(k)
                freed += 1
            else:  # an inactive key (value <= 0): released twice, a scheduler bug
                inactive.n += freed
                raise SimulationError(f"KV release of block {k}, which no request references")
        inactive.n += freed
        self.private_in_use -= n_private
        self.free += n_private

    def check_invariants(self) -> None:
        """Raise :class:`SimulationError` if blocks are not conserved or counts are inconsistent."""
        n_inactive = self.inactive.n
        n_active = len(self.cached) - n_inactive
        total = self.free + n_active + n_inactive + self.private_in_use
        if total != self.num_blocks:
            raise SimulationError(
                f"KV blocks not conserved: free {self.free} + active {n_active} + inactive "
                f"{n_inactive} + private {self.private_in_use} = {total} != {self.num_blocks}"
            )
        if self.free < 0 or self.private_in_use < 0:
            raise SimulationError(f"negative KV counts: free {self.free}, private {self.private_in_use}")
        self.inactive.check()
