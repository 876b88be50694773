"""Routers of the virtual-time fleet: which aggregated worker gets an arriving request.

Registry (plain dict): ``ROUTERS = {"round_robin": RoundRobinRouter, "least_loaded": LeastLoadedRouter,
"kv": KvRouter}``. A router sees the engine cores (one per DP rank of every ready worker of a pool, in
readiness order) as they are at the arrival time (the fleet advances them first when ``needs_state`` is
true) and returns an index into that list. The list may change between calls (workers added, removed);
routers keep per-core state keyed by ``(worker_id, dp_rank)``, never by position.

- round_robin: request k (in arrival order) -> core k mod N, N = cores offered now (the reference's order).
- least_loaded: fewest active KV blocks plus blocks of queued prompts, then fewest requests, then lowest id.
- kv: Dynamo KV router cost (overlap_score_weight 1.0, temperature 0):
  ``logit_w = prefill_blocks_w + decode_blocks_w`` with ``prefill_blocks_w = (prompt tokens the router has
  sent to w that are not prefilled yet + ISL - overlap_w * block) / block`` and ``decode_blocks_w`` = unique
  prompt blocks of the requests routed to w and not finished, plus this request's blocks not among them
  (the router's own bookkeeping, like Dynamo's ActiveSequences); ``overlap_w`` = leading prompt blocks
  found in w's prefix cache (active or inactive, what the KV events report). The lowest logit wins; ties
  are broken by the fleet's seeded generator (Dynamo picks randomly among ties).

  Cost per arrival: the book counts blocks per trace block (one run of ``trace_block_size // block_size``
  engine blocks, :class:`mocker.kv.manager.BlockRuns`), so scoring a prompt of R trace blocks on N cores
  takes about N x R dictionary operations and no per-key work, and booking/releasing a request R; the
  overlap walk (:meth:`BlockKvManager.match_prefix_runs <mocker.kv.manager.BlockKvManager.match_prefix_runs>`)
  stops at the first block a core does not hold.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from dynoplan.errors import SimulationError
from mocker.engine.sglang import SglangCore
from mocker.engine.vllm import VllmCore
from mocker.kv.events import KvEventIndex
from mocker.kv.manager import BlockRuns, engine_block_runs
from mocker.records import RequestRecord, TraceRequest
from mocker.request import State


class Router(Protocol):
    needs_state: bool

    def choose(self, req: TraceRequest, now_ms: float, workers: Sequence[VllmCore | SglangCore]) -> int: ...


class RoundRobinRouter:
    needs_state = False

    def __init__(self, num_workers: int, seed: int = 0) -> None:
        self.n = num_workers
        self.k = 0

    def choose(self, req: TraceRequest, now_ms: float, workers: Sequence[VllmCore | SglangCore]) -> int:
        w = self.k % (len(workers) or self.n)
        self.k += 1
        return w


def _queued_prefill_tokens(w: VllmCore | SglangCore) -> int:
    t = 0
    for r in w.waiting:
        t += r.seq_len
    for r in w.running:
        if r.state == State.PREFILLING:
            t += r.seq_len - r.computed
    return t


class LeastLoadedRouter:
    needs_state = True

    def __init__(self, num_workers: int, seed: int = 0) -> None:
        self.n = num_workers

    def choose(self, req: TraceRequest, now_ms: float, workers: Sequence[VllmCore | SglangCore]) -> int:
        best, best_key = 0, None
        for i, w in enumerate(workers):
            bs = w.block_size
            queued_blocks = sum(-(-r.seq_len // bs) for r in w.waiting)
            key = (w.active_blocks() + queued_blocks, len(w.running) + len(w.waiting), i)
            if best_key is None or key < best_key:
                best, best_key = i, key
        return best


class _Booking:
    """One request on the router's book of a core: the record it watches (prefill ends at the first token,
    the blocks are released at the finish), and what the request added to the book."""

    __slots__ = ("record", "full_bases", "tail_base", "tail_len", "new_tokens", "n_unique", "prefilled")

    record: RequestRecord
    """set by :meth:`KvRouter.on_routed` (the fleet makes the record after the choice)"""

    def __init__(
        self, full_bases: list[int], tail_base: int | None, tail_len: int, new_tokens: int, n_unique: int
    ) -> None:
        self.full_bases = full_bases
        """bases of the prompt's whole runs (:class:`mocker.kv.manager.BlockRuns`)"""
        self.tail_base = tail_base
        """base of the last run when it is partial (None: every run is whole)"""
        self.tail_len = tail_len
        """blocks of that partial run (0 without one)"""
        self.new_tokens = new_tokens
        """prompt tokens to prefill (ISL - overlap x block size at routing time)"""
        self.n_unique = n_unique
        """blocks of content the router cannot name (a prompt without ``hash_ids``)"""
        self.prefilled = False


class _RouterWorkerView:
    """The KV router's own book of one core (as Dynamo's router keeps ActiveSequences): the set of prompt
    blocks of the requests routed there and not finished, and the prompt tokens still to prefill.

    The block set is kept per run of :class:`mocker.kv.manager.BlockRuns` (the engine blocks of one trace
    block, keys ``base .. base + run - 1``), not per key: ``full[base]`` counts the bookings holding the whole
    run, ``part[base]`` lists the lengths of the partial last runs booked. Every booking holds a leading part
    of each of its runs, so the set holds the first ``cover(base)`` keys of a run: ``run`` when some booking
    holds it whole, else the longest partial length. ``n_blocks`` is the size of the set (the sum of covers),
    kept on every booking and release; :meth:`missing_blocks` counts a prompt's keys outside the set in one
    operation per run. The same counts as a per-key reference count dict (:meth:`check_invariants`), with
    ``run`` times fewer dictionary operations. All cores of a pool share one engine configuration, so ``run``
    is one value per router.
    """

    __slots__ = ("full", "part", "n_blocks", "unique", "prefill_tokens", "entries")

    def __init__(self) -> None:
        self.full: dict[int, int] = {}
        self.part: dict[int, list[int]] = {}
        self.n_blocks = 0
        self.unique = 0
        self.prefill_tokens = 0
        self.entries: list[_Booking] = []

    def _cover(self, base: int, run: int) -> int:
        if base in self.full:
            return run
        p = self.part.get(base)
        return max(p) if p else 0

    def refresh(self, run: int) -> None:
        """Settle the bookings whose record shows a first token (prefill done) or a finish (released)."""
        entries = self.entries
        ended = False
        for b in entries:
            rec = b.record
            if not b.prefilled and rec.first_token_ms is not None:
                b.prefilled = True
                self.prefill_tokens -= b.new_tokens
            if rec.finish_ms is not None:
                ended = True
        if not ended:
            return
        keep = []
        for b in entries:
            if b.record.finish_ms is None:
                keep.append(b)
                continue
            if not b.prefilled:
                self.prefill_tokens -= b.new_tokens
            self._release(b, run)
        self.entries = keep

    def book(self, b: _Booking, run: int) -> None:
        """Add a routed request's blocks and prefill tokens (:meth:`KvRouter.on_routed`)."""
        full, part = self.full, self.part
        n_blocks = self.n_blocks
        for base in b.full_bases:
            c = full.get(base, 0)
            if not c:
                p = part.get(base)
                n_blocks += run - (max(p) if p else 0)
            full[base] = c + 1
        tb = b.tail_base
        if tb is not None:
            tl = b.tail_len
            p = part.get(tb)
            if p is None:
                p = part[tb] = []
            if tb not in full:
                old = max(p) if p else 0
                if tl > old:
                    n_blocks += tl - old
            p.append(tl)
        self.n_blocks = n_blocks
        self.unique += b.n_unique
        self.prefill_tokens += b.new_tokens
        self.entries.append(b)

    def _release(self, b: _Booking, run: int) -> None:
        full, part = self.full, self.part
        n_blocks = self.n_blocks
        for base in b.full_bases:
            c = full[base] - 1
            if c:
                full[base] = c
            else:
                del full[base]
                p = part.get(base)
                n_blocks -= run - (max(p) if p else 0)
        tb = b.tail_base
        if tb is not None:
            p = part[tb]
            old = max(p)
            p.remove(b.tail_len)
            if tb not in full:
                n_blocks -= old - (max(p) if p else 0)
            if not p:
                del part[tb]
        self.n_blocks = n_blocks
        self.unique -= b.n_unique

    def missing_blocks(self, full_bases: list[int], tail_base: int | None, tail_len: int, run: int) -> int:
        """Blocks of a prompt (its whole runs, then its partial last run) not in the book's block set."""
        full, part = self.full, self.part
        missing = 0
        if part:
            for base in full_bases:
                if base not in full:
                    p = part.get(base)
                    missing += run - (max(p) if p else 0)
        else:  # one dictionary operation per run (the keys are wide ints: hashing them is most of the cost)
            for base in full_bases:
                if base not in full:
                    missing += run
        if tail_base is not None:
            c = self._cover(tail_base, run)
            if c < tail_len:
                missing += tail_len - c
        return missing

    def check_invariants(self, run: int) -> None:
        """Raise :class:`SimulationError` unless the book equals the per-key reference count of its bookings
        (``n_blocks`` = number of distinct keys, every count = bookings holding the run or partial length)."""
        keys: dict[int, int] = {}
        full: dict[int, int] = {}
        part: dict[int, list[int]] = {}
        for b in self.entries:
            for base in b.full_bases:
                full[base] = full.get(base, 0) + 1
                for k in range(base, base + run):
                    keys[k] = keys.get(k, 0) + 1
            if b.tail_base is not None:
                part.setdefault(b.tail_base, []).append(b.tail_len)
                for k in range(b.tail_base, b.tail_base + b.tail_len):
                    keys[k] = keys.get(k, 0) + 1
        if full != self.full or {k: sorted(v) for k, v in part.items()} != {k: sorted(v) for k, v in self.part.items()}:
            raise SimulationError("KV router book: run counts differ from its bookings")
        if self.n_blocks != len(keys):
            raise SimulationError(f"KV router book: n_blocks {self.n_blocks} != {len(keys)} distinct keys booked")
        if self.unique != sum(b.n_unique for b in self.entries):
            raise SimulationError("KV router book: unique blocks differ from its bookings")


class KvRouter:
    needs_state = True
    overlap_score_weight = 1.0
    track_active_blocks = True
    """False: the decode-blocks term is left out (Dynamo's prefill router in a disaggregated fleet)."""

    def __init__(self, num_workers: int, seed: int = 0) -> None:
        self.n = num_workers
        self.rng: Any = np.random.default_rng(seed)
        """Any, not Generator: numpy's stubs type ``integers(n)`` as ``int`` but it returns ``numpy.int64``, which
        compiled code (docs/architecture.md "Compiled modules") would refuse where an ``int`` is declared."""
        self.views: dict[tuple[int, int], _RouterWorkerView] = {}
        """The router's book per engine core, keyed (worker_id, dp_rank): cores come and go with the fleet."""
        self._cores_ref: object = None  # the core list seen last (the fleet builds a new list on every change)
        self._cores_views: list[_RouterWorkerView] = []
        self._run = 1
        """Blocks per run of the requests booked (:class:`mocker.kv.manager.BlockRuns`; one engine config)."""
        self._pending: tuple[_RouterWorkerView, _Booking] | None = None
        self._runs: BlockRuns | None = None
        """The prompt's keys as runs, of the request :meth:`choose` placed last (None: no ``hash_ids``)."""
        self.index: KvEventIndex | None = None
        """A :class:`mocker.kv.events.KvEventIndex`: prefix overlaps come from KV events instead of the cores."""

    def choose(self, req: TraceRequest, now_ms: float, workers: Sequence[VllmCore | SglangCore]) -> int:
        w0 = workers[0]
        bs = w0.block_size
        runs = engine_block_runs(req.hash_ids, req.input_length, bs, w0.trace_block_size) if req.hash_ids else None
        self._runs = runs
        tail_base: int | None = None
        tail_len = 0
        if runs is None:
            run = self._run
            full_bases: list[int] = []
            n_unique = -(-req.input_length // bs)
        else:
            run = self._run = runs.run
            full_bases = runs.bases
            n_unique = 0  # the router tracks full-block hashes only (Dynamo's sequence hashes for tracking)
            if full_bases:
                last = runs.n - (len(full_bases) - 1) * run
                if last != run:
                    tail_base, tail_len = full_bases[-1], last
                    full_bases = full_bases[:-1]
        if workers is not self._cores_ref or len(workers) != len(self._cores_views):  # the fleet's core list changed
            views = self.views
            cv = []
            for w in workers:
                view = views.get((w.worker_id, w.dp_rank))
                if view is None:
                    view = views[(w.worker_id, w.dp_rank)] = _RouterWorkerView()
                cv.append(view)
            self._cores_ref, self._cores_views = workers, cv
        chosen_views = self._cores_views
        index = self.index
        keys: list[int] | None = None
        isl = req.input_length
        weight = self.overlap_score_weight
        track = self.track_active_blocks
        logits = []
        overlaps = []
        for w, view in zip(workers, chosen_views, strict=True):
            view.refresh(run)
            if runs is None or not runs.n:
                overlap = 0
            elif index is None:
                overlap = w.kv.match_prefix_runs(runs)
            else:
                if keys is None:
                    keys = runs.key_list()
                overlap = index.overlap(w.worker_id, keys, w.dp_rank)
            overlaps.append(overlap)
            prefill_tokens = view.prefill_tokens + isl - overlap * bs
            decode_blocks = (
                view.n_blocks + view.unique + view.missing_blocks(full_bases, tail_base, tail_len, run) + n_unique
                if track
                else 0
            )
            logits.append(weight * prefill_tokens / bs + decode_blocks)
        m = min(logits)
        best = [i for i, v in enumerate(logits) if v == m]
        choice = best[0] if len(best) == 1 else best[int(self.rng.integers(len(best)))]
        self._pending = (
            chosen_views[choice],
            _Booking(full_bases, tail_base, tail_len, isl - overlaps[choice] * bs, n_unique),
        )
        return choice

    def prompt_keys(self) -> list[int] | None:
        """The prefix-cache keys of the prompt :meth:`choose` placed last, for the cores' block sizes (all cores
        of a pool share one engine config): what :func:`mocker.kv.manager.engine_block_keys` gives, handed to
        the chosen core's ``add_request`` so that it does not compute them again. None without ``hash_ids``.
        The list is shared (:meth:`BlockRuns.key_list`): not to be mutated."""
        runs = self._runs
        return None if runs is None else runs.key_list()

    def on_routed(self, record: RequestRecord) -> None:
        """Book the request just placed by :meth:`choose` (its record tells when prefill and decode end)."""
        if self._pending is None:
            return
        view, booking = self._pending
        self._pending = None
        booking.record = record
        view.book(booking, self._run)


ROUTERS: dict[str, type] = {"round_robin": RoundRobinRouter, "least_loaded": LeastLoadedRouter, "kv": KvRouter}
