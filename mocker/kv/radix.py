"""SGLang-style token pool with a radix prefix cache (metadata only, page-granular).

Model (docs/architecture.md "SGLang mode"; SGLang ``RadixCache`` semantics as modelled by the reference mocker):

- The pool holds ``total_tokens`` token slots in pages of ``page_size`` tokens. A slot is *free*, held
  *privately* by a request (computed but not yet in the tree), or stored in a radix-tree node.
- Tree nodes store page-aligned runs of sequence content. A node is *protected* while some request's
  path to the root passes through it (``lock_ref > 0``) and *evictable* otherwise.
- Conservation (:meth:`RadixCache.check_invariants`)::

      free + evictable + protected + private == total_tokens

- Eviction frees pages of unlocked leaves, least recently used leaf first (``last access`` is a logical
  clock bumped on every match or insert), page by page from the leaf's end, until at least the requested
  number of tokens is free; an emptied leaf may expose its parent as a new leaf candidate. (SGLang keeps
  pages as a chain of nodes whose pages below the tip are older than every other leaf once the tip is the
  oldest, so they go tip-first; the reference replay's partial prefix reuse after retraction shows it.)
- Decode appends one page at a time to a request's own leaf (the node grows instead of gaining a
  one-page child: same eviction order, far fewer nodes).

Sequence content (:class:`SeqContent`): a sequence is a list of segments ``(start position, key)``; the
token at position ``x`` is identified by the key of the segment containing ``x``. Keys are *chained*
(a trace ``hash_id`` key folds in every earlier id, a request-unique key covers only one request), so two
sequences hold equal tokens at ``x`` exactly when their keys at ``x`` are equal, and then their whole
prefixes up to ``x`` are equal too. Trace keys use the same chain as
:func:`mocker.kv.manager.engine_block_keys`, so the KV router's block keys can be matched here.
"""

from __future__ import annotations

import heapq
from bisect import bisect_right
from collections.abc import Callable, Sequence

from dynoplan.errors import SimulationError
from mocker.kv.manager import BlockRuns

CHAIN_SEED = 0x5EED
"""First value of the trace-block key chain (shared with :func:`mocker.kv.manager.engine_block_keys`)."""
UNIQUE_BASE = 1 << 64
"""Request-unique keys are ``UNIQUE_BASE + n``: outside the range of Python ``hash`` values."""


class SeqContent:
    """Content identity of one sequence (prompt then output), as segments ``(start, key)``.

    ``bounds[i]`` is the first position of segment ``i`` (``bounds[0] == 0``), ``keys[i]`` its key.
    """

    __slots__ = ("bounds", "keys")

    def __init__(self, bounds: list[int], keys: list[int]) -> None:
        self.bounds = bounds
        self.keys = keys

    @classmethod
    def for_request(
        cls, hash_ids: Sequence[int] | None, prompt_len: int, unique_key: int, trace_block_size: int = 512
    ) -> SeqContent:
        """Prompt tokens from trace ``hash_ids`` (one per ``trace_block_size`` tokens; ``None`` = unique
        content), then output tokens unique to the request (key ``unique_key``).

        Raises ValueError when ``hash_ids`` covers fewer than ``prompt_len`` tokens.
        """
        if hash_ids is None or prompt_len == 0:
            return cls([0], [unique_key])
        if len(hash_ids) * trace_block_size < prompt_len:
            raise ValueError(
                f"hash_ids covers {len(hash_ids) * trace_block_size} tokens, less than input_length={prompt_len}"
            )
        bounds: list[int] = []
        keys: list[int] = []
        prev = CHAIN_SEED
        for m in range(-(-prompt_len // trace_block_size)):
            prev = hash((prev, hash_ids[m]))
            bounds.append(m * trace_block_size)
            keys.append(prev)
        bounds.append(prompt_len)
        keys.append(unique_key)
        return cls(bounds, keys)

    def key_at(self, pos: int) -> int:
        b = self.bounds
        if len(b) == 1:
            return self.keys[0]
        return self.keys[bisect_right(b, pos) - 1]

    def page_id(self, pos: int, page: int) -> object:
        """Identity of the page of ``page`` tokens starting at ``pos`` (hashable)."""
        b = self.bounds
        if len(b) == 1:
            return self.keys[0] if page == 1 else (self.keys[0], pos)
        i = bisect_right(b, pos) - 1
        if page == 1:
            return self.keys[i]
        parts: list[object] = [self.keys[i], pos]
        end = pos + page
        i += 1
        while i < len(b) and b[i] < end:
            parts.append(b[i])
            parts.append(self.keys[i])
            i += 1
        return tuple(parts)

    def common(self, other: SeqContent, pos: int, length: int) -> int:
        """Tokens equal in both sequences from ``pos`` on, at most ``length``."""
        if self is other:
            return length
        ba, ka, bb, kb = self.bounds, self.keys, other.bounds, other.keys
        ia = bisect_right(ba, pos) - 1
        ib = bisect_right(bb, pos) - 1
        x, end = pos, pos + length
        na, nb = len(ba), len(bb)
        while x < end:
            if ka[ia] != kb[ib]:
                return x - pos
            ea = ba[ia + 1] if ia + 1 < na else end
            eb = bb[ib + 1] if ib + 1 < nb else end
            x = ea if ea < eb else eb
            if x >= end:
                return length
            if x == ea:
                ia += 1
            if x == eb:
                ib += 1
        return length

    def prefix_identity(self, n_tokens: int) -> tuple[int, ...]:
        """Hashable identity of the first ``n_tokens`` tokens."""
        parts: list[int] = []
        for s, k in zip(self.bounds, self.keys, strict=True):
            if s >= n_tokens:
                break
            parts.append(s)
            parts.append(k)
        return tuple(parts)


class RadixNode:
    """One tree node: ``length`` tokens of ``content`` starting at position ``start`` (its depth)."""

    __slots__ = ("parent", "children", "content", "start", "length", "lock_ref", "time", "uid")

    def __init__(
        self, parent: RadixNode | None, content: SeqContent | None, start: int, length: int, time: int, uid: int
    ) -> None:
        self.parent = parent
        self.children: dict[object, RadixNode] = {}
        self.content = content
        self.start = start
        self.length = length
        self.lock_ref = 0
        self.time = time
        self.uid = uid


class RadixCache:
    """Token pool + radix tree. Never reads a clock (LRU order is a logical counter).

    Raises :class:`SimulationError` on an allocation beyond the free pool (a scheduler bug).
    """

    def __init__(self, total_tokens: int, page_size: int = 1, trace_block_size: int = 512) -> None:
        self.trace_block_size = trace_block_size
        if page_size < 1:
            raise SimulationError(f"page_size={page_size}: expected >= 1")
        self.page = page_size
        self.total_tokens = (total_tokens // page_size) * page_size
        self.free = self.total_tokens
        """Free token slots (whole pages)."""
        self.evictable_size = 0
        self.protected_size = 0
        self.private = 0
        """Slots held by requests outside the tree."""
        self.clock = 0
        self._uid = 0
        self.root = RadixNode(None, None, 0, 0, 0, 0)
        self.root.lock_ref = 1  # never evictable
        self._heap: list[tuple[int, int, RadixNode]] = []
        self.listener: Callable[[str, SeqContent | None, int, int], None] | None = None
        """Optional ``listener(kind, content, start, end)``: tokens ``[start, end)`` of ``content`` were
        ``stored`` in / ``removed`` from the tree (KV events, :class:`mocker.kv.events.RadixEventAdapter`)."""

    # ------------------------------------------------------------------ queries
    def available(self) -> int:
        """Free slots (tokens)."""
        return self.free

    def used_tokens(self) -> int:
        """Slots not free (tokens): private + protected + evictable."""
        return self.total_tokens - self.free

    def active_tokens(self) -> int:
        """Slots held by requests (private + protected tree tokens)."""
        return self.private + self.protected_size

    def match_len(self, content: SeqContent, max_tokens: int) -> int:
        """Read-only: tokens of ``content[:max_tokens]`` (page-aligned) present in the tree."""
        page = self.page
        limit = (max_tokens // page) * page
        node = self.root
        pos = 0
        while pos < limit:
            child = node.children.get(content.page_id(pos, page))
            if child is None:
                break
            n = child.length if child.length < limit - pos else limit - pos
            cc = child.content
            assert cc is not None  # only the root has no content
            c = cc.common(content, pos, n)
            c = (c // page) * page
            pos += c
            if c < child.length:
                break
            node = child
        return pos

    def match_prefix(self, keys: Sequence[int] | None) -> tuple[int, int]:
        """KV-router view: leading pages of a prompt, given as :func:`mocker.kv.manager.engine_block_keys`
        keys for this page size, present in the tree: (pages, 0). Keys are decoded back to trace-block
        keys, which needs ``trace_block_size % page_size == 0``; otherwise (0, 0) (no overlap known)."""
        if not keys:
            return 0, 0
        page = self.page
        tbs = self.trace_block_size
        if tbs % page:
            return 0, 0
        q = tbs // page
        n_tokens = len(keys) * page
        bounds = list(range(0, n_tokens, tbs))
        content = SeqContent(bounds + [n_tokens], [keys[m * q] // q for m in range(len(bounds))] + [-1])
        return self.match_len(content, n_tokens) // page, 0

    def match_prefix_runs(self, runs: BlockRuns) -> int:
        """:meth:`match_prefix` of ``runs.key_list()`` (pages), read from the runs: with ``runs.run`` pages per
        trace block, the trace-block keys are ``base // run`` directly, without the key list."""
        if not runs.n:
            return 0
        page = self.page
        tbs = self.trace_block_size
        if tbs % page:
            return 0
        q = tbs // page
        if runs.run != q:  # runs for another page size (not this tree's)
            return self.match_prefix(runs.key_list())[0]
        n_tokens = runs.n * page
        bounds = list(range(0, n_tokens, tbs))
        content = SeqContent(bounds + [n_tokens], [b // q for b in runs.bases] + [-1])
        return self.match_len(content, n_tokens) // page

    # ------------------------------------------------------------------ locks
    def inc_lock(self, node: RadixNode) -> None:
        root = self.root
        while node is not root:
            if node.lock_ref == 0:
                self.evictable_size -= node.length
                self.protected_size += node.length
            node.lock_ref += 1
            parent = node.parent
            assert parent is not None  # a node below the root has a parent
            node = parent

    def dec_lock(self, node: RadixNode) -> None:
        root = self.root
        while node is not root:
            if node.lock_ref <= 0:
                raise SimulationError("radix dec_lock on an unlocked node")
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self.evictable_size += node.length
                self.protected_size -= node.length
                if not node.children:
                    heapq.heappush(self._heap, (node.time, node.uid, node))
            parent = node.parent
            assert parent is not None  # a node below the root has a parent
            node = parent

    # ------------------------------------------------------------------ tree edits
    def _new_node(self, parent: RadixNode, content: SeqContent, start: int, length: int) -> RadixNode:
        self._uid += 1
        self.clock += 1
        n = RadixNode(parent, content, start, length, self.clock, self._uid)
        parent.children[content.page_id(start, self.page)] = n
        return n

    def _split(self, child: RadixNode, at: int) -> RadixNode:
        """Split ``child`` after ``at`` tokens; returns the new upper node (same lock, same time)."""
        parent = child.parent
        assert parent is not None and child.content is not None
        self._uid += 1
        mid = RadixNode(parent, child.content, child.start, at, child.time, self._uid)
        mid.lock_ref = child.lock_ref
        page = self.page
        parent.children[child.content.page_id(child.start, page)] = mid
        child.start += at
        child.length -= at
        child.parent = mid
        mid.children[child.content.page_id(child.start, page)] = child
        return mid

    def match_and_lock(self, content: SeqContent, max_tokens: int) -> tuple[int, RadixNode]:
        """Match ``content[:max_tokens]`` (page-aligned), touch the path, split a partially matched node,
        lock the deepest matched node. Returns (matched tokens, node)."""
        page = self.page
        limit = (max_tokens // page) * page
        self.clock += 1
        now = self.clock
        node = self.root
        pos = 0
        while pos < limit:
            child = node.children.get(content.page_id(pos, page))
            if child is None:
                break
            n = child.length if child.length < limit - pos else limit - pos
            cc = child.content
            assert cc is not None  # only the root has no content
            c = cc.common(content, pos, n)
            c = (c // page) * page
            if c == 0:
                break
            if c < child.length:
                child = self._split(child, c)
            self._touch(child, now)
            pos += c
            node = child
            if c < n:
                break
        self.inc_lock(node)
        return pos, node

    def _touch(self, node: RadixNode, now: int) -> None:
        node.time = now
        if node.lock_ref == 0 and not node.children:
            heapq.heappush(self._heap, (now, node.uid, node))

    def insert(self, content: SeqContent, node: RadixNode, pos: int, end: int, as_tail: bool) -> tuple[RadixNode, int]:
        """Insert ``content[pos:end]`` (page-aligned) below ``node`` (at depth ``pos``, locked by the
        caller). Returns (deepest node, tokens that were already cached). The caller moves the lock to
        the returned node and frees its duplicate slots. ``as_tail``: decode pages, appended to the
        caller's own leaf when it is that (unshared, childless) leaf's continuation."""
        page = self.page
        self.clock += 1
        now = self.clock
        dup = 0
        while pos < end:
            child = node.children.get(content.page_id(pos, page))
            if child is None:
                if (
                    as_tail
                    and node is not self.root
                    and node.content is content
                    and not node.children
                    and node.lock_ref == 1
                    and node.start + node.length == pos
                ):
                    add = end - pos
                    node.length += add
                    node.time = now
                    self.protected_size += add
                    if self.listener is not None:
                        self.listener("stored", content, pos, end)
                    return node, dup
                new = self._new_node(node, content, pos, end - pos)
                new.lock_ref = 0
                self.evictable_size += new.length  # caller locks it next (moves it to protected)
                heapq.heappush(self._heap, (new.time, new.uid, new))
                if self.listener is not None:
                    self.listener("stored", content, pos, end)
                return new, dup
            n = child.length if child.length < end - pos else end - pos
            cc = child.content
            assert cc is not None  # only the root has no content
            c = cc.common(content, pos, n)
            c = (c // page) * page
            if c == 0:
                raise SimulationError("radix insert: page identity collision")
            if c < child.length:
                child = self._split(child, c)
            self._touch(child, now)
            dup += c
            pos += c
            node = child
        return node, dup

    # ------------------------------------------------------------------ pool
    def take(self, n_tokens: int) -> None:
        """Move ``n_tokens`` free slots to private use (after :meth:`evict` made room)."""
        if n_tokens > self.free:
            raise SimulationError(f"token pool allocation of {n_tokens} exceeds free {self.free}")
        self.free -= n_tokens
        self.private += n_tokens

    def give_back(self, n_tokens: int) -> None:
        """Return ``n_tokens`` private slots to the free pool."""
        self.private -= n_tokens
        self.free += n_tokens

    def to_tree(self, n_tokens: int) -> None:
        """``n_tokens`` private slots now belong to a (locked) tree node."""
        self.private -= n_tokens

    def evict(self, num_tokens: int) -> int:
        """Free at least ``num_tokens`` slots (fewer if nothing more is evictable) from unlocked leaves,
        least recently used first. Returns tokens freed."""
        freed = 0
        heap = self._heap
        page = self.page
        while freed < num_tokens and heap:
            t, _, node = heap[0]
            if node.time != t or node.lock_ref or node.children or node.parent is None or node.length == 0:
                heapq.heappop(heap)
                continue
            # pages go one at a time from the end of the leaf (SGLang: one node per page, tip first;
            # the pages below the tip are older than every other leaf, so they follow it)
            k = -(-(num_tokens - freed) // page) * page
            if k < node.length:
                node.length -= k
                if self.listener is not None:
                    self.listener("removed", node.content, node.start + node.length, node.start + node.length + k)
                self.evictable_size -= k
                self.free += k
                freed += k
                continue
            heapq.heappop(heap)
            if node.length:
                if self.listener is not None:
                    self.listener("removed", node.content, node.start, node.start + node.length)
                self.evictable_size -= node.length
                self.free += node.length
                freed += node.length
            parent, nc = node.parent, node.content
            assert parent is not None and nc is not None  # an evictable leaf is not the root
            del parent.children[nc.page_id(node.start, page)]
            node.parent = None
            node.length = 0
            if parent is not self.root and parent.lock_ref == 0 and not parent.children:
                heapq.heappush(heap, (parent.time, parent.uid, parent))
        return freed

    # ------------------------------------------------------------------ checks
    def check_invariants(self) -> None:
        """Raise SimulationError unless slots are conserved and node sizes/locks are consistent."""
        total = self.free + self.evictable_size + self.protected_size + self.private
        if total != self.total_tokens:
            raise SimulationError(
                f"token pool not conserved: free {self.free} + evictable {self.evictable_size} + protected "
                f"{self.protected_size} + private {self.private} = {total} != {self.total_tokens}"
            )
        if min(self.free, self.evictable_size, self.protected_size, self.private) < 0:
            raise SimulationError("negative token pool count")
        ev = pr = 0
        stack = list(self.root.children.values())
        while stack:
            n = stack.pop()
            if n.lock_ref < 0:
                raise SimulationError("negative lock_ref")
            if n.length <= 0 or n.length % self.page:
                raise SimulationError(f"bad radix node length {n.length}")
            if n.lock_ref:
                pr += n.length
            else:
                ev += n.length
            child_locks = sum(c.lock_ref for c in n.children.values())
            if child_locks > n.lock_ref:
                raise SimulationError("a radix node is locked less than its children")
            stack.extend(n.children.values())
        if ev != self.evictable_size or pr != self.protected_size:
            raise SimulationError(
                f"radix sizes drifted: evictable {ev} vs {self.evictable_size}, protected {pr} vs {self.protected_size}"
            )
