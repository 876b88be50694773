"""SGLang-shaped engine core: token pool + radix prefix cache, clock-agnostic.

Pass semantics (docs/architecture.md "SGLang mode"; SGLang's ``event_loop_normal`` as modelled by the reference
mocker, checked request by request against ``reference-replay --engine '{"engine":{"backend":"sglang"}}'``):

1. Waiting order: ``fifo`` keeps arrival order; ``lpm`` sorts by longest cached prefix (stable), pushing
   requests whose first 32 tokens duplicate an earlier waiting request's (and that have <= 32 cached
   tokens) to the back; with more than 128 waiting requests ``lpm`` falls back to fifo. A request in the
   middle of a chunked prefill always stays first.
2. Admission (``get_new_batch_prefill``): budget ``rem_total = free + evictable - sum over running of
   min(remaining output, clip_max_new_tokens) * new_token_ratio``; ``rem_input = max_prefill_tokens``;
   ``rem_chunk = chunked_prefill_size``. In queue order, while running + admitted < max_num_seqs: a fresh
   (or retracted) request matches its sequence, at most ``len - 1`` tokens, in the radix tree; the rest
   (``extend``; for a chunked request, what its chunks have not computed yet) runs whole when it fits
   ``rem_chunk``, otherwise as a chunk filling the rest of ``rem_chunk`` (page floor). Charged = chunk
   rounded up to a page (the cached prefix is not charged); reserve = min(remaining output, clip) unless
   chunked. Stop at the first request with ``charged + reserve >= rem_total`` or ``charged > rem_input``.
   Allocation locks the matched path, then evicts LRU leaves if the free pool is short; an allocation
   that cannot be met even so stops admission and resets new_token_ratio ("oom").
3. Extend pass (anything admitted): time = prefill(n, mean ISL, mean prefix) (the timing model, as vLLM).
   Chunked requests store their computed prefix in the tree (locked) and go back to the front of the
   waiting queue; requests whose prompt completed emit their first token at the end of the pass and join
   the running batch (a completed prompt's first-token slot is allocated then, as the reference does).
   Running requests get no forward pass in an extend pass.
4. Decode pass (nothing admitted): if ``free + evictable`` cannot hold one more token (page) for every
   running request, retract the running request with the fewest output tokens so far (the first such,
   keeping >= 1): its uncached slots are freed, its tree path unlocked (the cached prefix stays reusable
   until evicted), and it re-queues at the back of waiting keeping its output so far. Then evict LRU
   leaves if the free pool is short, time = decode(sum of sequence lengths / total tokens) and every
   running request emits one token; its new page joins its tree path.
5. new_token_ratio: starts at ``init_new_token_ratio * schedule_conservativeness`` (0.7); after every decode
   pass without a retraction it decreases by ``(init - init * 0.14) / 600``, never below ``init * 0.14``
   (extend passes leave it unchanged, as SGLang only updates it when it schedules a decode batch). A
   retraction sets it to SGLang's ``retract_decode`` estimate over the requests kept:
   ``min(1, (output tokens so far + 20 * kept) / sum of their max output tokens)``; an admission oom resets
   it to init. (Checked against the reference request by request: with these choices the share of Azure
   requests whose TTFT and E2E are within 0.1% of the reference's went from 28% to 68%, bench_sglang.py.)

A finished request stores its whole sequence (page floor) in the tree and unlocks it. Prompts that can
never fit (``prompt + 1 > total tokens``) are rejected (status ``failed``); a request that cannot make
progress on an otherwise idle engine is rejected too (the reference would stall).

Public API: identical to :class:`mocker.engine.vllm.VllmCore` (``add_request``, ``cancel``, ``has_work``,
``step`` -> :class:`PassOutcome`, ``advance_until``, ``finalize``, ``check_invariants``, ``fpm``).
"""

from __future__ import annotations

from collections import deque
from math import inf
from typing import ClassVar, NamedTuple

import numpy as np
import numpy.typing as npt

from dynoplan.errors import SimulationError
from dynoplan.fpm import ForwardPassMetrics, QueuedRequests, ScheduledRequests
from mocker.config import EngineConfig
from mocker.engine.base import FAST_CHUNK_PASSES, CoreCapabilities, PassOutcome, population_variance, queued_requests
from mocker.engine.timeline import PassTimeline, decode_stretch_ends, shared_decode_table
from mocker.kv.radix import UNIQUE_BASE, RadixCache, RadixNode, SeqContent
from mocker.records import RequestRecord, TraceRequest
from mocker.request import EngineRequest, State
from mocker.timing import PolynomialTiming, TimingModel, decode_pass_ms, decode_pass_ms_array, load_timing, round_ns

LPM_FALLBACK_THRESHOLD = 128
"""lpm falls back to fifo above this many waiting requests (reference mocker constant)."""
IN_BATCH_PREFIX_THRESHOLD = 32
"""lpm: prefix length (tokens) under which duplicate in-queue prefixes are deprioritised (SGLang)."""
RETRACT_DECODE_STEPS = 20
"""SGLang ``global_config.retract_decode_steps``: output tokens assumed per kept request after a retraction."""
_LIST_MAX = 128
"""Longest decode stretch computed pass by pass from the Python-float decode table; longer ones take the
numpy path, cheaper from about this length."""


class ExtendWork(NamedTuple):
    """One admitted request's work in an extend pass (tokens)."""

    prompt_len: int
    prefix_tokens: int
    """Leading tokens already computed (cached prefix or earlier chunks): the prefix the prefill model sees."""
    extend_tokens: int
    """Tokens computed by this pass (chunk end - prefix)."""


class SglangRequest(EngineRequest):
    """Scheduling state of one request on an SGLang core (see :class:`EngineRequest` for the base fields).

    ``materialized``: tokens whose KV slots are held; ``allocated``: held slots (page multiple);
    ``cached``: leading tokens stored in the tree on this request's locked path; ``node``: the deepest
    node of that path (None = no KV held).
    """

    __slots__ = ("content", "materialized", "allocated", "cached", "node")

    def __init__(
        self, request_id: int, index: int, prompt_len: int, output_len: int, content: SeqContent, record: RequestRecord
    ) -> None:
        super().__init__(request_id, index, prompt_len, output_len, None, record)
        self.content = content
        self.materialized = 0
        self.allocated = 0
        self.cached = 0
        self.node: RadixNode | None = None


class SglangCore(PassTimeline[SglangRequest]):
    """One simulated SGLang engine (one DP rank). See the module docstring for semantics."""

    capabilities: ClassVar[CoreCapabilities] = CoreCapabilities(block_keys=False, radix_handoff=True)

    def __init__(
        self,
        cfg: EngineConfig,
        *,
        worker_id: int = 0,
        dp_rank: int = 0,
        collect_fpm: bool = False,
        timing: TimingModel | None = None,
    ) -> None:
        self.cfg = cfg
        s = cfg.sglang
        self.worker_id = worker_id
        self.dp_rank = dp_rank
        self.block_size = cfg.effective_block_size
        self.page = self.block_size
        self.trace_block_size = cfg.trace_block_size
        self.kv = RadixCache(cfg.total_kv_tokens, self.page, cfg.trace_block_size)
        self.total_kv_tokens = self.kv.total_tokens
        self.num_blocks = cfg.num_gpu_blocks
        self.caching = cfg.enable_prefix_caching
        self.max_seqs = cfg.max_num_seqs
        self.speedup = float(cfg.speedup_ratio)
        self.timing: TimingModel = timing if timing is not None else load_timing(cfg)
        self._poly_timing = self.timing if isinstance(self.timing, PolynomialTiming) else None
        """The timing as the reference polynomial (its decode durations come from a table), else None."""
        self._monotone_decode = self._poly_timing is not None
        self._dtable = (
            shared_decode_table(self._poly_timing) if self._poly_timing is not None and self.speedup == 1.0 else None
        )
        """The polynomial's decode durations as Python floats (speed-up 1 only), else None."""
        self.lpm = s.schedule_policy == "lpm"
        self.chunk_size = s.chunked_prefill_size
        self.max_prefill = s.max_prefill_tokens
        self.clip = s.clip_max_new_tokens
        self.init_ratio = s.init_new_token_ratio * s.schedule_conservativeness
        self.min_ratio = self.init_ratio * s.min_new_token_ratio_factor
        self.ratio_step = (self.init_ratio - self.min_ratio) / s.new_token_ratio_decay_steps
        self.new_token_ratio = self.init_ratio
        self.collect_fpm = collect_fpm
        self.fpm: list[ForwardPassMetrics] = []
        self.waiting: deque[SglangRequest] = deque()
        self.prefilled: deque[SglangRequest] = deque()
        """Disaggregated decode side: requests whose prompt KV arrived from a prefill worker, waiting for
        decode-side admission (:meth:`add_prefilled_request`), in activation order."""
        self.running: list[SglangRequest] = []
        self.requests: dict[int, SglangRequest] = {}
        self.all_requests: list[SglangRequest] = []
        self.next_pass_ms = 0.0
        self.pass_index = 0
        self.preemptions_total = 0
        self.finished_total = 0
        self._init_pass_timeline()
        self._added = 0
        """Requests ever added: the next request's index (``all_requests`` may be released)."""
        self.external_tokens = 0
        """Private token slots held for a driver (disaggregated handoff holds and reservations, :mod:`mocker.fleet`)."""
        self.external_locks = 0
        """Tree paths locked for a driver (a source's hold on its computed prompt)."""
        self.hold_waiting = False
        """Set by a disaggregated driver while reservations wait for this (decode) core: the waiting queue
        (retracted requests) is not admitted meanwhile, incoming prompts go first (the reference replay
        re-admits a decode worker's retracted requests only once its reservation backlog is gone)."""
        self.reserved: dict[int, SglangRequest] = {}
        """Destination reservations (:meth:`reserve_prefilled`) not yet activated, by request id."""
        self._reserve_retry: tuple[TraceRequest, int, SeqContent] | None = None
        """The request, index and content of the last :meth:`reserve_prefilled` that did not fit: a driver
        retries its head reservation at every capacity change, and the content stays the same meanwhile."""

    # ================================================================== public API
    def add_request(self, req: TraceRequest, now_ms: float, record: RequestRecord | None = None) -> RequestRecord:
        """Queue a request arriving at ``now_ms``. Returns its record (filled in as it runs).

        Raises SimulationError for a duplicate id, ValueError when ``hash_ids`` is too short.
        """
        if req.request_id in self.requests:
            raise SimulationError(f"request {req.request_id} is already active on worker {self.worker_id}")
        if record is None:
            record = RequestRecord(
                request_id=req.request_id,
                arrival_ms=now_ms,
                input_length=req.input_length,
                output_length=req.output_length,
            )
        record.worker_id = self.worker_id
        record.dp_rank = self.dp_rank
        idx = self._added
        self._added += 1
        content = SeqContent.for_request(
            req.hash_ids if self.caching else None, req.input_length, UNIQUE_BASE + idx, self.trace_block_size
        )
        r = SglangRequest(req.request_id, idx, req.input_length, req.output_length, content, record)
        if not self.running and not self.waiting and not self.prefilled:
            self.next_pass_ms = max(self.next_pass_ms, now_ms)
        self.requests[r.request_id] = r
        self.all_requests.append(r)
        self.waiting.append(r)
        return record

    def reserve_prefilled(self, req: TraceRequest, record: RequestRecord) -> SglangRequest | None:
        """Destination-first handoff (SGLang disaggregation, reference replay ``ReserveDestination``): reserve
        KV for the prompt of a request that a prefill worker will compute, before its prefill starts. The
        prompt's cached prefix in this core's tree is shared (locked) and private slots cover the rest of its
        page-rounded footprint, evicting unlocked leaves LRU-first; no headroom for decode is kept (as the
        reference). Returns the reserved request (pass it to :meth:`add_prefilled_request` once transferred,
        or to :meth:`release_hold` to cancel), or None when free + evictable cannot hold it now (nothing
        changed). ``reserved.cached`` = prompt tokens the destination already held (what
        ``destination_missing`` does not charge). Raises SimulationError when the prompt can never fit."""
        isl = req.input_length
        page = self.page
        footprint = -(-isl // page) * page
        if footprint > self.total_kv_tokens:
            raise SimulationError(f"prompt of {isl} tokens exceeds the KV pool of {self.total_kv_tokens} tokens")
        kv = self.kv
        idx = self._added
        retry = self._reserve_retry
        if retry is not None and retry[0] is req and retry[1] == idx:
            content = retry[2]
        else:
            content = SeqContent.for_request(
                req.hash_ids if self.caching else None, isl, UNIQUE_BASE + idx, self.trace_block_size
            )
        matched = kv.match_len(content, isl) if self.caching else 0
        if footprint - matched > kv.free + kv.evictable_size:
            self._reserve_retry = (req, idx, content)
            return None
        if self.caching:
            matched, node = kv.match_and_lock(content, isl)
        else:
            node = kv.root
        need = footprint - matched
        if need > kv.free + kv.evictable_size:  # the matched prefix itself was evictable room
            kv.dec_lock(node)
            self._reserve_retry = (req, idx, content)
            return None
        self._reserve_retry = None
        if need > kv.free:
            kv.evict(need - kv.free)
        kv.take(need)
        self._added += 1
        r = SglangRequest(req.request_id, idx, isl, req.output_length, content, record)
        # prefilled form (as add_prefilled_request): prompt P-1 computed + the prefill worker's first token
        r.prompt_len -= 1
        r.generated = 1
        r.output_len += 1
        r.node = node
        r.cached = matched
        r.allocated = footprint
        self.reserved[r.request_id] = r
        return r

    def add_prefilled_request(
        self,
        req: TraceRequest,
        now_ms: float,
        record: RequestRecord | None = None,
        reserved: SglangRequest | None = None,
    ) -> RequestRecord:
        """Disaggregated decode side: queue a request whose prompt KV and first token were computed by a
        prefill worker (the transfer has ended). Nothing is recomputed: at the first pass that starts at or
        after ``now_ms`` with room for it, it is admitted straight into the running batch (its prompt slots
        allocated, the destination's cached prefix shared) and that pass decodes it, as SGLang's decode
        worker does (no extend pass); it emits ``output_length`` tokens here, the first at the end of that
        pass (reference, ISL 374 alone at 64 GB/s x 131072 B/token: admitted at 23.004866 ms, first token
        29.964348 = + one decode pass at 374 of 16384 tokens).

        Admission (in arrival order, while running < max_num_seqs): the prompt's uncached pages plus one
        page per running request (this one included) for the pass's new tokens must fit free + evictable;
        a head that does not fit waits (requests behind it too). A prompt that can never fit is rejected
        (``failed``). Raises SimulationError for a duplicate id, ValueError when ``hash_ids`` is too short.

        ``reserved`` (from :meth:`reserve_prefilled`): the reservation becomes the request's KV (prompt
        materialized there), and it joins the running batch at that pass without any capacity check.
        """
        if reserved is not None:
            r = self.reserved.pop(reserved.request_id)
            if r.request_id in self.requests:
                raise SimulationError(f"request {r.request_id} is already active on worker {self.worker_id}")
            rec = r.record
            rec.worker_id = self.worker_id
            rec.dp_rank = self.dp_rank
            r.materialized = r.computed = r.seq_len
            if not self.running and not self.waiting and not self.prefilled:
                self.next_pass_ms = max(self.next_pass_ms, now_ms)
            self.requests[r.request_id] = r
            self.all_requests.append(r)
            self.prefilled.append(r)
            return rec
        record = self.add_request(req, now_ms, record)
        r = self.waiting.pop()
        # as VllmCore.add_prefilled_request: prompt P-1 computed + 1 "generated" token (the prefill worker's
        # first token) whose KV the first decode pass computes, so decode passes run at P, P+1, ... tokens
        r.prompt_len -= 1
        r.generated = 1
        r.output_len += 1
        self.prefilled.append(r)
        return record

    def cancel(self, request_id: int, now_ms: float) -> bool:
        """Cancel a live request (frees its KV slots, unlocks its tree path). False if unknown/terminal."""
        r = self.requests.get(request_id)
        if r is None:
            return False
        if r in self.running:
            self.running.remove(r)
        elif r in self.prefilled:
            self.prefilled.remove(r)
        else:
            self.waiting.remove(r)
        self._release(r)
        r.transition(State.CANCELLED)
        r.record.status = "cancelled"
        r.record.finish_ms = now_ms
        del self.requests[request_id]
        return True

    def has_work(self) -> bool:
        return bool(self.running or self.waiting or self.prefilled)

    def step(self, now_ms: float) -> PassOutcome:
        """Run one pass starting at ``now_ms`` (>= the end of the previous pass)."""
        if now_ms < self.next_pass_ms:
            raise SimulationError(f"clock went back: pass at {now_ms} ms before previous end {self.next_pass_ms} ms")
        out = self._pass(now_ms, True)
        assert out is not None
        return out

    def advance_until(self, horizon_ms: float) -> None:
        """Run every pass that starts before ``horizon_ms``, fast-forwarding stretches of decode passes."""
        while (
            self.running or self.prefilled or (self.waiting and not self.hold_waiting)
        ) and self.next_pass_ms < horizon_ms:
            if not self._stretch(horizon_ms):
                self._pass(self.next_pass_ms, False)

    def advance_single_step(self, horizon_ms: float) -> None:
        """Like :meth:`advance_until`, one pass at a time (reference mode for equivalence tests)."""
        while (
            self.running or self.prefilled or (self.waiting and not self.hold_waiting)
        ) and self.next_pass_ms < horizon_ms:
            self._pass(self.next_pass_ms, False)

    def finalize(self) -> None:
        """Fill ``token_times_ms`` of every record from the pass timeline (call once at the end)."""
        self._fill_token_times()

    # ------------------------------------------------------------------ metrics for routers / live worker
    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting) + len(self.prefilled)

    def active_blocks(self) -> int:
        """Pages held by requests (private + locked tree pages)."""
        return self.kv.active_tokens() // self.page

    def check_invariants(self) -> None:
        """Raise SimulationError unless tokens are conserved (free + used == total) and the queues and
        per-request holdings are consistent (no request both waiting and running)."""
        self.kv.check_invariants()
        run_ids = {id(r) for r in self.running}
        wait_ids = {id(r) for r in self.waiting}
        pre_ids = {id(r) for r in self.prefilled}
        if run_ids & wait_ids or pre_ids & (run_ids | wait_ids):
            raise SimulationError("a request is in two of waiting, prefilled and running")
        if (
            len(run_ids) != len(self.running)
            or len(wait_ids) != len(self.waiting)
            or len(pre_ids) != len(self.prefilled)
        ):
            raise SimulationError("a request appears twice in a queue")
        if self.external_tokens < 0 or self.external_locks < 0:
            raise SimulationError(
                f"negative external holds: {self.external_tokens} tokens, {self.external_locks} locks"
            )
        private = self.external_tokens
        for r in self.reserved.values():
            if r.node is None or r.materialized or r.allocated % self.page or r.cached > r.allocated:
                raise SimulationError(f"reservation of request {r.request_id} inconsistent")
            private += r.allocated - r.cached
        for r in list(self.running) + list(self.waiting) + list(self.prefilled):
            if r.node is None:
                if r.materialized or r.allocated or r.cached:
                    raise SimulationError(f"request {r.request_id} holds KV without a tree path")
                continue
            if not (r.cached <= r.materialized <= r.allocated) or r.allocated % self.page or r.cached % self.page:
                raise SimulationError(
                    f"request {r.request_id}: cached {r.cached} materialized {r.materialized} "
                    f"allocated {r.allocated} inconsistent"
                )
            private += r.allocated - r.cached
        if private != self.kv.private:
            raise SimulationError(f"private slots held by requests and holds {private} != pool count {self.kv.private}")
        for r in self.running:
            if r.state not in (State.PREFILLING, State.DECODING) or r.node is None:
                raise SimulationError(f"running request {r.request_id} in state {r.state.name}")
        if len(self.running) > self.max_seqs:
            raise SimulationError(f"{len(self.running)} running > max_num_seqs {self.max_seqs}")

    # ================================================================== KV helpers
    def _release(self, r: SglangRequest) -> None:
        """Free uncached slots and unlock the tree path (retraction, cancel, rejection)."""
        if r.node is None:
            return
        kv = self.kv
        kv.give_back(r.allocated - r.cached)
        kv.dec_lock(r.node)
        r.node = None
        r.materialized = r.allocated = r.cached = 0

    def _cache_prefix(self, r: SglangRequest, as_tail: bool) -> None:
        """Store the request's materialized pages beyond ``cached`` in the tree; move the lock there."""
        page = self.page
        aligned = r.materialized // page * page
        if aligned <= r.cached:
            return
        kv = self.kv
        old = r.node
        assert old is not None
        new, dup = kv.insert(r.content, old, r.cached, aligned, as_tail)
        added = aligned - r.cached
        kv.give_back(dup)
        kv.to_tree(added - dup)
        if new is not old:
            kv.inc_lock(new)
            kv.dec_lock(old)
            r.node = new
        r.cached = aligned

    def _finish_kv(self, r: SglangRequest) -> None:
        """A finished request stores its sequence (page floor) in the tree and unlocks it."""
        if r.node is None:
            return
        page = self.page
        complete = min(r.seq_len, r.materialized) // page * page
        kv = self.kv
        extra = r.allocated - max(complete, r.cached)
        if extra > 0:
            kv.give_back(extra)
            r.allocated -= extra
        r.materialized = complete if complete > r.cached else r.cached
        self._cache_prefix(r, True)
        kv.dec_lock(r.node)
        r.node = None
        r.materialized = r.allocated = r.cached = 0

    # ================================================================== driver holds (disaggregation)
    def hold_tokens(self, content: SeqContent | None, tokens: int) -> tuple[RadixNode | None, int]:
        """Hold ``tokens`` token slots for a driver (:mod:`mocker.fleet` coordinated handoff): with ``content``
        (a source's hold on the prompt it just computed) the cached prefix of ``content[:tokens]`` is locked
        in the tree (so it cannot be evicted; nothing else is) and private slots cover the rest; without it
        (a destination's reservation) all are private slots, evicting unlocked leaves LRU-first if the free
        pool is short. The private slots are capped at free + evictable. Returns ``(locked node or None,
        private slots)`` for :meth:`release_hold`. Raises nothing."""
        kv = self.kv
        node: RadixNode | None = None
        matched = 0
        if content is not None and self.caching:
            matched, node = kv.match_and_lock(content, tokens)
            if matched == 0:
                kv.dec_lock(node)
                node = None
            else:
                self.external_locks += 1
        n = -(-(tokens - matched) // self.page) * self.page
        cap = kv.free + kv.evictable_size
        if n > cap:
            n = cap // self.page * self.page
        if n > kv.free:
            kv.evict(n - kv.free)
        kv.take(n)
        self.external_tokens += n
        return node, n

    def release_hold(self, node: RadixNode | SglangRequest | None, private_tokens: int) -> None:
        """Release a hold taken by :meth:`hold_tokens`, or a reservation from :meth:`reserve_prefilled` (the
        reserved request, ``private_tokens`` ignored), exactly once: the caller forgets it."""
        if isinstance(node, SglangRequest):
            del self.reserved[node.request_id]
            self._release(node)
            return
        kv = self.kv
        kv.give_back(private_tokens)
        self.external_tokens -= private_tokens
        if node is not None:
            kv.dec_lock(node)
            self.external_locks -= 1

    def _admit_prefilled(self) -> None:
        """Decode-side admission of transferred requests (:meth:`add_prefilled_request`), in order."""
        kv = self.kv
        page = self.page
        q = self.prefilled
        running = self.running
        while q and len(running) < self.max_seqs:
            r = q[0]
            if r.node is not None:  # its reservation already holds the prompt's KV
                q.popleft()
                r.transition(State.PREFILLING)
                running.append(r)
                continue
            n = r.seq_len
            if self.caching:
                matched, node = kv.match_and_lock(r.content, n)
            else:
                matched, node = 0, kv.root
            need = -(-n // page) * page - matched
            if need + page * (len(running) + 1) > kv.free + kv.evictable_size:
                kv.dec_lock(node)
                return
            if need > kv.free:
                kv.evict(need - kv.free)
            kv.take(need)
            q.popleft()
            r.node = node
            r.cached = matched
            r.allocated = matched + need
            r.materialized = r.computed = n
            r.transition(State.PREFILLING)
            running.append(r)

    # ================================================================== the pass
    def _policy(self) -> None:
        waiting = self.waiting
        if not self.lpm or len(waiting) > LPM_FALLBACK_THRESHOLD or len(waiting) < 2:
            return
        page = self.page
        dup_len = -(-IN_BATCH_PREFIX_THRESHOLD // page) * page
        seen: set[tuple[int, ...]] = set()
        scored = []
        # a request in the middle of a chunked prefill holds KV and continues first (SGLang's chunked_req)
        head = [r for r in waiting if r.materialized]
        for i, r in enumerate(waiting):
            if r.materialized:
                continue
            plen = self.kv.match_len(r.content, r.seq_len)
            dep = False
            if plen <= IN_BATCH_PREFIX_THRESHOLD and r.seq_len >= dup_len:
                ident = r.content.prefix_identity(dup_len)
                if ident in seen:
                    dep = True
                else:
                    seen.add(ident)
            scored.append((dep, -plen, i, r))
        scored.sort(key=lambda t: (t[0], t[1], t[2]))
        self.waiting = deque(head + [t[3] for t in scored])

    def _admit(self, now: float) -> tuple[list[SglangRequest], list[ExtendWork], bool, list[int]]:
        """get_new_batch_prefill: returns (admitted, their ExtendWork, oom, rejected ids)."""
        if self.hold_waiting:
            return [], [], False, []
        kv = self.kv
        clip = self.clip
        ratio = self.new_token_ratio
        reserved = 0.0
        for r in self.running:
            rem = r.output_len - r.generated
            reserved += (rem if rem < clip else clip) * ratio
        rem_total = float(kv.free + kv.evictable_size) - reserved
        rem_input = float(self.max_prefill)
        rem_chunk = float(self.chunk_size)
        page = self.page
        can_run: list[SglangRequest] = []
        items: list[ExtendWork] = []
        rejected: list[int] = []
        oom = False
        waiting = self.waiting
        slots = self.max_seqs - len(self.running)
        while len(can_run) < slots and waiting:
            r = waiting[0]
            seq_len = r.seq_len
            if r.materialized == 0 and seq_len + 1 > self.total_kv_tokens:
                waiting.popleft()
                self._reject(r, now)
                rejected.append(r.request_id)
                continue
            if r.materialized == 0 and self.caching:
                cached_prefix = kv.match_len(r.content, seq_len - 1)
            else:
                cached_prefix = 0
            start = r.materialized if r.materialized > cached_prefix else cached_prefix
            extend = seq_len - start
            if extend == 0:
                break
            if extend <= rem_chunk:
                chunk = extend
            else:  # fill what is left of this pass's chunk budget (page floor)
                chunk = int(rem_chunk) // page * page
                if chunk == 0:
                    break
            charged = float(-(-chunk // page) * page)
            if chunk < extend:
                reserve = 0
            else:
                rem = r.output_len - r.generated
                reserve = rem if rem < clip else clip
            if charged + reserve >= rem_total:
                break
            if charged > rem_input or charged > rem_chunk:
                break
            chunk_end = start + chunk
            if r.materialized > 0:
                prefix_len = start
                need = -(-chunk_end // page) * page - r.allocated
                if need > kv.free:
                    kv.evict(need - kv.free)
                    if need > kv.free:
                        oom = True
                        break
                kv.take(need)
                r.allocated += need
            else:
                if self.caching:
                    matched, node = kv.match_and_lock(r.content, chunk_end)
                else:
                    matched, node = 0, kv.root
                need = -(-chunk_end // page) * page - matched
                if need > kv.free + kv.evictable_size:
                    kv.dec_lock(node)
                    oom = True
                    break
                if need > kv.free:
                    kv.evict(need - kv.free)
                kv.take(need)
                r.node = node
                r.cached = matched
                r.allocated = matched + need
                prefix_len = matched if matched < start else start
                if r.record.admit_ms is None:
                    r.record.admit_ms = now
                    r.record.cached_tokens = prefix_len
                if r.state is State.WAITING or r.state is State.PREEMPTED:
                    r.transition(State.PREFILLING)
            r.materialized = chunk_end
            waiting.popleft()
            items.append(ExtendWork(r.prompt_len, prefix_len, chunk_end - prefix_len))
            can_run.append(r)
            rem_total -= charged + reserve
            rem_input -= charged
            rem_chunk -= charged
            if rem_chunk <= 0:
                break
        return can_run, items, oom, rejected

    def _retract_check(self, reqs: list[SglangRequest]) -> list[SglangRequest]:
        """Retract the shortest-output requests until one more page each fits (taken out of ``reqs``; returned,
        for the back of the queue; new_token_ratio set to SGLang's retract_decode estimate, module
        docstring step 5); evict if the pool is short."""
        kv = self.kv
        page = self.page
        retracted: list[SglangRequest] = []
        if page == 1:
            need = 0
            for r in reqs:
                need += r.prompt_len + r.generated + 1 - r.allocated
        else:
            need = sum(-(-(r.seq_len + 1) // page) * page - r.allocated for r in reqs)
        while kv.free + kv.evictable_size < need and len(reqs) > 1:
            victim = min(reqs, key=lambda x: x.generated)
            reqs.remove(victim)
            need -= -(-(victim.seq_len + 1) // page) * page - victim.allocated
            self._release(victim)
            victim.transition(State.PREEMPTED)
            victim.record.num_preemptions += 1
            self.preemptions_total += 1
            retracted.append(victim)
        if retracted:
            dec = 0
            mx = 0
            for r in reqs:
                dec += r.generated
                mx += r.output_len
            self.new_token_ratio = min(1.0, (dec + RETRACT_DECODE_STEPS * len(reqs)) / mx)
        if kv.free < need:
            kv.evict(need - kv.free)
        return retracted

    def _decode_tokens(self, reqs: list[SglangRequest], end: float, p: int) -> tuple[list[int], list[SglangRequest]]:
        """Every request in ``reqs`` emits one token at ``end`` (pass ``p``); returns (finished, emitters)."""
        kv = self.kv
        page = self.page
        finished: list[int] = []
        emitters: list[SglangRequest] = []
        decoding = State.DECODING
        for r in reqs:
            if r.prompt_len + r.generated + 1 > r.allocated:
                if kv.free < page:
                    continue  # cannot grow (lone request larger than the pool); handled by the caller
                kv.free -= page
                kv.private += page
                r.allocated += page
            r.materialized += 1
            g = r.generated = r.generated + 1
            r.computed = r.materialized
            if p == r.emit_last + 1 and r.emit_start >= 0:
                r.emit_last = p
            else:
                r.note_emit(p)
            emitters.append(r)
            if g == 1 or (g == 2 and r.record.first_token_ms is None):  # g == 2: a prefilled request
                r.record.first_token_ms = end
            if g >= r.output_len:
                r.transition(State.FINISHED)
                self._finish_kv(r)
                rec = r.record
                rec.finish_ms = end
                rec.status = "finished"
                self.finished_total += 1
                del self.requests[r.request_id]
                finished.append(r.request_id)
            else:
                if r.state is not decoding:
                    r.transition(State.DECODING)
                if r.materialized - r.cached >= page:
                    node = r.node
                    assert node is not None  # a running request holds its prefix's node
                    if (
                        page == 1
                        and node.content is r.content
                        and node.lock_ref == 1
                        and not node.children
                        and node.start + node.length == r.cached
                    ):
                        node.length += 1  # the decode page extends its own leaf
                        kv.clock += 1
                        node.time = kv.clock
                        r.cached += 1
                        kv.private -= 1
                        kv.protected_size += 1
                    else:
                        self._cache_prefix(r, True)
        return finished, emitters

    def _pass(self, now: float, want_outcome: bool) -> PassOutcome | None:
        """One pass starting at ``now`` (module docstring, steps 1-5), in named steps. Returns the outcome
        when ``want_outcome``."""
        self._policy()
        if self.prefilled:
            self._admit_prefilled()
        can_run, items, oom, rejected = self._admit(now)
        if oom:
            self.new_token_ratio = self.init_ratio
        p = self.pass_index
        dec_lens: list[int] = []
        if can_run:
            end, finished, emitters, retracted = self._extend_pass(now, p, can_run, items, dec_lens)
        elif self.running:
            end, finished, emitters, retracted = self._decode_pass(now, p, rejected, dec_lens)
        else:
            self._idle_pass(now, rejected)
            end, finished, emitters, retracted = now, [], [], []
        self.waiting.extend(retracted)  # retracted requests re-queue at the back (SGLang retract_decode)
        if not can_run and not retracted:
            nr = self.new_token_ratio - self.ratio_step
            self.new_token_ratio = nr if nr > self.min_ratio else self.min_ratio
        fpm = self._make_fpm(now, end, items, dec_lens) if self.collect_fpm else None
        if fpm is not None:
            self.fpm.append(fpm)
        self._ends.append(end)
        self.pass_index = p + 1
        self.next_pass_ms = end
        if not want_outcome:
            return None
        return PassOutcome(
            now,
            end,
            [(r.request_id, end) for r in emitters],
            finished,
            [r.request_id for r in can_run],
            [r.request_id for r in retracted],
            rejected,
            fpm,
        )

    def _extend_pass(
        self, now: float, p: int, can_run: list[SglangRequest], items: list[ExtendWork], dec_lens: list[int]
    ) -> tuple[float, list[int], list[SglangRequest], list[SglangRequest]]:
        """Step 3: pass ``p`` computes the admitted ``can_run`` (prefill time of the timing model); chunked
        requests store their prefix and return to the front of the queue, completed prompts emit their first
        token and join the running batch. Appends the emitters' sequence lengths to ``dec_lens`` (FPM only).
        Returns (end ms, finished ids, emitters, retracted)."""
        bc = len(can_run)
        total_isl = sum(r.materialized for r in can_run)
        total_pre = sum(it.prefix_tokens for it in items)
        pf = round_ns(self.timing.prefill_ms(bc, total_isl // bc, total_pre // bc))
        if self.speedup != 1.0 and pf > 0:
            pf = round_ns(pf / self.speedup)
        end = now + pf
        newly: list[SglangRequest] = []
        chunked: list[SglangRequest] = []
        for r in can_run:
            r.computed = r.materialized
            if r.materialized < r.seq_len:
                self._cache_prefix(r, False)
                chunked.append(r)
            else:
                newly.append(r)
        for r in reversed(chunked):
            self.waiting.appendleft(r)
        if self.collect_fpm:
            dec_lens.extend(r.seq_len for r in newly)
        if not newly:
            return end, [], [], []
        retracted = self._retract_check(newly)
        finished, emitters = self._decode_tokens(newly, end, p)
        self.running.extend(r for r in newly if r.state is not State.FINISHED)
        return end, finished, emitters, retracted

    def _decode_pass(
        self, now: float, p: int, rejected: list[int], dec_lens: list[int]
    ) -> tuple[float, list[int], list[SglangRequest], list[SglangRequest]]:
        """Step 4: retract if one more page each does not fit, then every running request decodes one token
        in pass ``p`` (decode time of the timing model). A lone request that outgrew the whole pool is
        rejected (id appended to ``rejected``). Appends the sequence lengths to ``dec_lens`` (FPM only).
        Returns (end ms, finished ids, emitters, retracted)."""
        running = self.running
        retracted = self._retract_check(running)
        s = 0
        for r in running:
            s += r.prompt_len + r.generated
        n = len(running)
        if self.collect_fpm:
            dec_lens.extend(r.seq_len for r in running)
        end = now + self._decode_ms(min(s, self.total_kv_tokens), n)
        finished, emitters = self._decode_tokens(running, end, p)
        if len(emitters) < n:
            # a lone request that outgrew the whole pool can never continue: reject it
            for r in running:
                if r not in emitters and r.state is not State.FINISHED:
                    self._release(r)
                    self._reject(r, end)
                    rejected.append(r.request_id)
        if finished or rejected:
            self.running = [r for r in running if r.state is State.DECODING or r.state is State.PREFILLING]
        return end, finished, emitters, retracted

    def _idle_pass(self, now: float, rejected: list[int]) -> None:
        """Nothing admitted and nothing running: the queue head cannot be admitted on an idle engine, so it
        never will be (rejected, id appended to ``rejected``) — unless a driver's handoff holds take the room:
        then SimulationError (:mod:`mocker.fleet` stalls the core on it and resumes it at the release)."""
        if (
            ((self.waiting and not self.hold_waiting) or self.prefilled)
            and not rejected
            and (self.external_tokens or self.external_locks)
        ):
            raise SimulationError(f"worker {self.worker_id}: the queue head does not fit while handoff holds are live")
        if self.waiting and not rejected and not self.hold_waiting:
            r = self.waiting.popleft()
            self._release(r)
            self._reject(r, now)
            rejected.append(r.request_id)
        elif self.prefilled and not rejected:
            r = self.prefilled.popleft()
            self._release(r)
            self._reject(r, now)
            rejected.append(r.request_id)

    def _reject(self, r: SglangRequest, now: float) -> None:
        if r.state is State.PREFILLING or r.state is State.DECODING:
            r.transition(State.PREEMPTED)  # the lifecycle only fails a request from a queue state
        r.transition(State.FAILED)
        r.record.status = "failed"
        r.record.finish_ms = now
        del self.requests[r.request_id]

    def _queued(self, include_prefilled: bool) -> QueuedRequests:
        """The FPM's queue: waiting prompts, and retracted (plus, with ``include_prefilled``, transferred)
        requests as queued decodes."""
        qp = [r.prompt_len for r in self.waiting if r.generated == 0]
        qd = [r.seq_len for r in self.waiting if r.generated > 0]
        if include_prefilled:
            qd += [r.seq_len for r in self.prefilled]
        return queued_requests(qp, qd)

    def _make_fpm(self, now: float, end: float, items: list[ExtendWork], dec_lens: list[int]) -> ForwardPassMetrics:
        pre = [it for it in items if it.extend_tokens > 0]
        pre_len = [it.prompt_len for it in pre]
        return ForwardPassMetrics(
            worker_id=self.worker_id,
            dp_rank=self.dp_rank,
            wall_time=(end - now) / 1000.0,
            scheduled_requests=ScheduledRequests(
                num_prefill_requests=len(pre),
                sum_prefill_tokens=sum(it.extend_tokens for it in pre),
                var_prefill_length=population_variance(pre_len),
                sum_prefill_kv_tokens=sum(it.prefix_tokens for it in pre),
                num_decode_requests=len(dec_lens),
                sum_decode_kv_tokens=sum(dec_lens),
                var_decode_kv_tokens=population_variance(dec_lens),
            ),
            queued_requests=self._queued(True),
            timestamp_ms=end,
        )

    # ================================================================== fast path
    def _stretch(self, horizon: float) -> bool:
        """Run a stretch of decode passes at once when nothing but token counts can change: no admission
        (checked pass by pass with the exact float budget), no retraction, no finish, page size 1.
        Bulk LRU eviction frees the same leaves as pass-by-pass eviction would. False if not applicable.
        Steps: :meth:`_stretch_bound` (passes without retraction or finish, before the horizon),
        :meth:`_stretch_admission_pass` (the first pass that would admit the queue head),
        :meth:`_stretch_ends`, then :meth:`_stretch_apply` and :meth:`_stretch_finish`."""
        bound = self._stretch_bound(horizon)
        if bound is None:
            return False
        k, s0, cap0 = bound
        waiting = self.waiting
        running = self.running  # the stretch's batch (finished members stay in this list, for the FPM)
        n = len(running)
        if waiting and n < self.max_seqs and not self.hold_waiting:
            k = self._stretch_admission_pass(k, n, cap0)
            if k < 1:
                return False
        now = self.next_pass_ms
        ends = self._stretch_ends(now, s0, n, k, horizon)
        k = len(ends)
        end = ends[-1]
        self._stretch_apply(k)
        rt, step, lo = self.new_token_ratio, self.ratio_step, self.min_ratio
        for _ in range(k):  # one decrement per decode pass, floored (as pass by pass)
            rt = rt - step
            if rt < lo:
                rt = lo
        self.new_token_ratio = rt
        self._stretch_finish(end)
        if self.collect_fpm:
            self._stretch_fpm(now, np.array(ends), running, s0)
        self._ends += ends
        self.pass_index += k
        self.next_pass_ms = end
        return True

    def _stretch_bound(self, horizon: float) -> tuple[int, int, int] | None:
        """(passes, active tokens in the first, free + evictable tokens) of the longest stretch with no
        retraction and no finish before its last pass, at most :data:`FAST_CHUNK_PASSES` and (monotone
        decode time) not far beyond ``horizon``; None when not applicable (page size
        not 1, transferred requests waiting, a running request not decoding)."""
        running = self.running
        n = len(running)
        if n == 0 or self.page != 1 or self.prefilled:
            return None
        k_cap = 1 << 60
        s0 = 0
        decoding = State.DECODING
        for r in running:
            if r.state is not decoding or r.node is None:
                return None
            g = r.generated
            rem = r.output_len - g
            if rem < k_cap:
                k_cap = rem
            s0 += r.prompt_len + g
        # the stretch may end with the pass in which the first request finishes
        kv = self.kv
        cap0 = kv.free + kv.evictable_size
        k_ret = (cap0 - n) // n + 1  # passes j with cap0 - n*j >= n need no retraction
        if k_ret < k_cap:
            k_cap = k_ret
        if k_cap > FAST_CHUNK_PASSES:
            k_cap = FAST_CHUNK_PASSES
        if k_cap < 1:
            return None
        total = self.total_kv_tokens
        if horizon != inf and self._monotone_decode:
            # decode time grows with active tokens, so no pass of the stretch is shorter than the first
            d0 = self._decode_ms(s0 if s0 < total else total, n)
            k_h = int((horizon - self.next_pass_ms) / max(d0, 1e-9)) + 2
            if k_h < k_cap:
                k_cap = k_h
        return k_cap, s0, cap0

    def _stretch_admission_pass(self, k: int, n: int, cap0: int) -> int:
        """The first of the next ``k`` decode passes at whose start :meth:`_admit` would admit the waiting
        head (its budget computed exactly as there, same float order), ``k`` if none; 0 when the head's
        admission cannot be predicted this way (lpm with several waiting, a head that never fits, nothing
        to extend).

        Pass ``j`` (new_token_ratio ``rt_j``: ``j`` floored decrements) admits when ``need < (cap0 - n j) -
        res_j`` with ``res_j`` the float sum, in running order, of ``min(rem_i - j, clip) * rt_j``. Its exact
        value is ``rt_j * S_j`` with the integer ``S_j = sum_i min(rem_i - j, clip)`` (kept from pass to pass:
        ``S_{j+1} = S_j - #{i: rem_i <= clip + j}``), and the float sum is within far less than ``margin`` of
        it; only a pass whose test falls inside the margin computes the float sum itself, so the decision is
        that of the pass-by-pass sum at O(n log n + k) instead of O(n k)."""
        waiting = self.waiting
        if self.lpm and len(waiting) > 1:
            return 0
        h = waiting[0]
        if h.seq_len + 1 > self.total_kv_tokens:
            return 0
        if h.materialized == 0 and self.caching:
            cp = self.kv.match_len(h.content, h.seq_len - 1)
        else:
            cp = 0
        extend = h.seq_len - (h.materialized if h.materialized > cp else cp)
        if extend == 0:
            return 0
        chunk = extend if extend <= self.chunk_size else min(self.chunk_size, extend)
        charged = float(chunk)
        clip = self.clip
        if chunk < extend:
            reserve = 0
        else:
            rem = h.output_len - h.generated
            reserve = rem if rem < clip else clip
        need_h = charged + reserve
        if charged > self.max_prefill or charged > self.chunk_size:
            return k
        rems = [r.output_len - r.generated for r in self.running]  # >= k: no request finishes before pass k
        srt = sorted(rems)
        s_j = 0
        for x in rems:
            s_j += x if x < clip else clip
        m = 0  # requests with rem_i <= clip + j (their term drops by one after pass j): srt[:m]
        rt, step, lo = self.new_token_ratio, self.ratio_step, self.min_ratio
        for j in range(k):
            if j:
                rt = rt - step
                if rt < lo:
                    rt = lo
            while m < n and srt[m] <= clip + j:
                m += 1
            budget = float(cap0 - n * j)
            est = rt * s_j
            margin = 1e-9 * (abs(budget) + est + 1.0)
            if need_h < budget - est - margin:
                return j
            if need_h < budget - est + margin:  # too close to call: the float sum itself
                res = 0.0
                for rem in rems:
                    x = rem - j
                    res += (x if x < clip else clip) * rt
                if need_h < budget - res:
                    return j
            s_j -= m
        return k

    def _decode_ms(self, s: int, n: int) -> float:
        """Duration (ms) of a decode pass: ``n`` running requests, ``s`` (<= the pool) active tokens
        (:func:`decode_pass_ms`; read from the decode table when there is one)."""
        table = self._dtable
        if table is not None:
            return table.upto(s)[s]
        return decode_pass_ms(self.timing, s, n, self.speedup)

    def _stretch_ends(self, now: float, s0: int, n: int, k: int, horizon: float) -> list[float]:
        """End times (ms) of up to ``k`` decode passes from ``now`` (``s0`` active tokens in the first, ``n``
        more in each next, capped at the pool), the last being the first to end at or after ``horizon``;
        each end is the previous plus the pass duration, as pass by pass."""
        total = self.total_kv_tokens
        table = self._dtable
        if table is not None and k <= _LIST_MAX:
            s_last = s0 + n * (k - 1)
            ends = decode_stretch_ends(table.upto(s_last if s_last < total else total), now, s0, n, k, horizon, total)
        elif table is None and k <= 48:
            ends = []
            t = now
            for j in range(k):
                sj = s0 + n * j
                t = t + decode_pass_ms(self.timing, sj if sj < total else total, n, self.speedup)
                ends.append(t)
                if t >= horizon:
                    break
        else:
            sv = np.minimum(s0 + n * np.arange(k, dtype=np.int64), total)
            acc = np.empty(k + 1)
            acc[0] = now
            acc[1:] = decode_pass_ms_array(self.timing, sv, n, self.speedup)
            ends_a = np.cumsum(acc)[1:]
            if horizon != inf:
                ends_a = ends_a[: 1 + int(np.searchsorted(ends_a[:-1], horizon, side="left"))]
            ends = ends_a.tolist()
        return ends

    def _stretch_apply(self, k: int) -> None:
        """``k`` decode passes' tokens for every running request: ``n * k`` token slots taken (evicting LRU
        leaves when short), counters and emission ranges advanced, each new page joining the request's tree
        path (its own leaf extended in place when it is the only holder)."""
        running = self.running
        kv = self.kv
        p = self.pass_index
        last = p + k - 1
        need = len(running) * k
        if kv.free < need:
            kv.evict(need - kv.free)
        kv.take(need)
        kv.clock += 1
        clock = kv.clock
        moved = 0
        for r in running:
            r.generated += k
            r.materialized += k
            r.allocated += k
            r.computed = r.materialized
            if r.emit_last == p - 1 and r.emit_start >= 0:
                r.emit_last = last
            else:
                if r.emit_start >= 0:
                    r.emit_ranges.append((r.emit_start, r.emit_last))
                r.emit_start, r.emit_last = p, last
            node = r.node
            assert node is not None  # a running request holds its prefix's node
            if (
                node.content is r.content
                and node.lock_ref == 1
                and not node.children
                and node.start + node.length == r.cached
            ):
                node.length += k
                node.time = clock
                r.cached += k
                moved += k
            else:
                self._cache_prefix(r, True)
        if moved:
            kv.private -= moved
            kv.protected_size += moved

    def _stretch_finish(self, end: float) -> None:
        """Requests that reached their output length in the stretch finish at ``end`` (its last pass)."""
        running = self.running
        done = False
        for r in running:
            if r.generated >= r.output_len:
                r.transition(State.FINISHED)
                self._finish_kv(r)
                rec = r.record
                rec.finish_ms = end
                rec.status = "finished"
                self.finished_total += 1
                del self.requests[r.request_id]
                done = True
        if done:
            decoding = State.DECODING
            self.running = [r for r in running if r.state is decoding]

    def _stretch_fpm(self, now: float, ends: npt.NDArray[np.float64], batch: list[SglangRequest], s0: int) -> None:
        """One ForwardPassMetrics per pass of the stretch (``batch``: its decoding requests, those finished in
        it included; ``s0`` active tokens in the first pass). The lengths' variance is shift-invariant."""
        k = len(ends)
        n = len(batch)
        starts = np.concatenate(([now], ends[:-1]))
        var_dec = population_variance([r.seq_len - k for r in batch])
        queued = self._queued(False)
        for j in range(k):
            self.fpm.append(
                ForwardPassMetrics(
                    worker_id=self.worker_id,
                    dp_rank=self.dp_rank,
                    wall_time=float(ends[j] - starts[j]) / 1000.0,
                    scheduled_requests=ScheduledRequests(
                        num_decode_requests=n, sum_decode_kv_tokens=s0 + n * j, var_decode_kv_tokens=var_dec
                    ),
                    queued_requests=queued,
                    timestamp_ms=float(ends[j]),
                )
            )
