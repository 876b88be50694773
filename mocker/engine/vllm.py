"""vLLM-shaped engine core (and the TensorRT-LLM GUARANTEED_NO_EVICT variant), clock-agnostic.

Pass semantics (matched request by request against the reference, Dynamo Mocker 1.6.1):

1. Running requests first, in admission order, while token budget (``max_num_batched_tokens``) remains:
   each is scheduled ``min(known tokens not yet computed, budget)`` tokens (a decoding request: its one
   "dangling" token; a prefilling one: the next chunk). KV blocks are allocated up to the scheduled
   position; when none are left the newest (LIFO) or oldest (FIFO) running request is preempted by
   recompute (KV freed, computed tokens reset, re-queued at the front of waiting), its work this pass undone.
2. If nothing was preempted, waiting requests are admitted in order while ``running < max_num_seqs``:
   admission needs the whole current sequence to fit (blocks for it minus cached blocks already active
   <= free + evictable blocks); TRT-LLM instead reserves ``ceil((prompt + max_output) / block)`` blocks
   and never preempts. A prompt prefix found in the prefix cache is not recomputed (block-aligned, at
   most ``seq_len - 1`` tokens). Prompts that can never fit are rejected (status ``failed``).
3. Pass time = prefill + decode. Prefill: the timing model at ``T = n * (mean ISL - mean prefix)`` over
   the ``n`` requests computing prompt tokens this pass (integer means; 0 ms if none). Decode: only the
   requests that were already decoding (not those that finished their prompt in this pass) contribute:
   ``decode(sum of their sequence lengths / total KV tokens)`` (0 ms if none).
4. At the end of the pass every request whose known tokens are all computed emits one token (a request
   that completes its prompt emits its first token here); requests reaching their output length finish
   and free their KV.

Arrivals join the waiting queue and are considered at the next pass start.

Public API (the core never reads a clock; drivers pass ``now_ms``)::

    core = VllmCore(cfg, worker_id=0)              # or make_engine(cfg, ...)
    rec = core.add_request(trace_request, now_ms)  # -> RequestRecord, filled in as the request runs
    core.cancel(request_id, now_ms) -> bool
    core.has_work() -> bool
    out = core.step(now_ms)   # one pass starting at now_ms -> PassOutcome(start_ms, end_ms,
                              #   emissions [(request_id, token_ms)], finished [ids], admitted, preempted, fpm)
    core.next_pass_ms         # when the next pass would start (end of the previous one)
    core.advance_until(h)     # virtual-time fast path: run every pass that starts before h; stretches of
                              # decode-only passes are computed at once with numpy (identical results)
    core.finalize()           # fill token_times_ms of every record from the pass-end timeline

A live (wall-clock) driver calls ``add_request`` on arrival, ``step(now)`` when the previous pass ended,
sleeps until ``out.end_ms`` and then delivers ``out.emissions``.
"""

from __future__ import annotations

from collections import deque
from heapq import heappop, heappush
from math import inf
from typing import ClassVar, Literal, overload

import numpy as np
import numpy.typing as npt

from dynoplan.errors import ConfigError, SimulationError
from dynoplan.fpm import ForwardPassMetrics, ScheduledRequests
from mocker.config import EngineConfig
from mocker.engine.base import (
    DECODE_STEP,
    FAST_CHUNK_PASSES,
    CoreCapabilities,
    PassOutcome,
    ScheduledWork,
    ScheduleOutcome,
    population_variance,
    queued_requests,
)
from mocker.engine.timeline import PassTimeline, decode_stretch_ends, shared_decode_table
from mocker.kv.kvbm import KvbmBlockManager, make_g1_pool
from mocker.kv.manager import BlockKvManager, engine_block_keys
from mocker.kv.tiers import OnboardTicket, TierConfig, TierHierarchy
from mocker.records import RequestRecord, TraceRequest
from mocker.request import EngineRequest, State
from mocker.timing import PolynomialTiming, TimingModel, decode_pass_ms, decode_pass_ms_array, load_timing, round_ns

# module-level names of the enum members: a global lookup and an ``is`` test in the scheduling loops
_SCHEDULED, _BLOCKED, _PREEMPTED_SELF = (
    ScheduleOutcome.SCHEDULED,
    ScheduleOutcome.BLOCKED,
    ScheduleOutcome.PREEMPTED_SELF,
)
_SCALAR_MAX = 40
_LIST_MAX = 128
"""Longest decode stretch computed pass by pass from the Python-float decode table; longer ones take the
numpy path (cumulative sum over a strided slice of the timing's table), cheaper from about this length."""


class _PassWork:
    """Scheduling state of one pass (made by :meth:`VllmCore._pass`, charged by ``_schedule``, undone by
    ``_preempt``): token budget left, the prefill batch's request count and sums of prompt tokens computed
    by its end and before it (the timing model's inputs), each scheduled request's :class:`ScheduledWork`
    by id, and the ids preempted so far."""

    __slots__ = ("budget", "prefill_n", "prefill_isl_sum", "prefill_prefix_sum", "sched", "preempted")

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.prefill_n = 0
        self.prefill_isl_sum = 0
        self.prefill_prefix_sum = 0
        self.sched: dict[int, ScheduledWork] = {}
        self.preempted: list[int] = []


class VllmCore(PassTimeline[EngineRequest]):
    """One simulated vLLM engine (one DP rank). See the module docstring for semantics and API."""

    capabilities: ClassVar[CoreCapabilities] = CoreCapabilities(block_keys=True, radix_handoff=False)
    no_evict = False  # TRT-LLM GUARANTEED_NO_EVICT overrides

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
        self.worker_id = worker_id
        self.dp_rank = dp_rank
        self.block_size = cfg.effective_block_size
        self.num_blocks = cfg.num_gpu_blocks
        self.total_kv_tokens = cfg.total_kv_tokens
        self.max_batched = cfg.max_num_batched_tokens
        self.max_seqs = cfg.max_num_seqs
        self.chunked = cfg.enable_chunked_prefill
        self.lifo = cfg.preemption_mode == "lifo"
        self.speedup = float(cfg.speedup_ratio)
        self.trace_block_size = cfg.trace_block_size
        self.kv = (
            BlockKvManager(cfg.num_gpu_blocks, cfg.enable_prefix_caching)
            if cfg.g1_backend == "native"
            else make_g1_pool(cfg)
        )
        self.timing: TimingModel = timing if timing is not None else load_timing(cfg)
        self._poly_timing = self.timing if isinstance(self.timing, PolynomialTiming) else None
        """The timing as the reference polynomial (its decode durations have a table), else None."""
        self._monotone_decode = self._poly_timing is not None
        self._dtable = (
            shared_decode_table(self._poly_timing) if self._poly_timing is not None and self.speedup == 1.0 else None
        )
        """The polynomial's decode durations as Python floats (speed-up 1 only), else None."""
        self.collect_fpm = collect_fpm
        self.fpm: list[ForwardPassMetrics] = []
        self.waiting: deque[EngineRequest] = deque()
        self.running: list[EngineRequest] = []
        self.requests: dict[int, EngineRequest] = {}
        """Live (non-terminal) requests by id."""
        self.all_requests: list[EngineRequest] = []
        self.next_pass_ms = 0.0
        self.pass_index = 0
        self.reserved_blocks = 0
        self.external_private_blocks = 0
        """Private blocks held for a driver (disaggregated handoff holds and reservations, :mod:`mocker.fleet`)."""
        self.preemptions_total = 0
        self.finished_total = 0
        self._init_pass_timeline()
        self._added = 0
        """Requests ever added: the next request's index (``all_requests`` may be released)."""
        self._run_seq = 0
        """Admissions so far: the next admitted request's ``run_seq`` (its order in the running batch)."""
        # decode cohort (fast path only): see _co_prepare
        self._co_ok = not collect_fpm and (self.lifo or self.no_evict)
        self._co_n = 0
        self._co_c = 0
        self._co_hist = [0] * self.block_size
        self._co_heap: list[tuple[int, int, int, EngineRequest]] = []
        # KVBM lower tiers (off: tiers is None and nothing below costs more than that check)
        self.tiers: TierHierarchy | None = None
        """G2/G3/G4 hierarchy this core offloads to and onboards from (:mod:`mocker.kv.tiers`); None = off."""
        self.tier_slot = 0
        """This core's worker id in :attr:`tiers` (its G2 and G1<->G2 links)."""
        self._onboarding: list[tuple[OnboardTicket, EngineRequest]] = []
        """Admitted requests waiting for their onboarding ticket (they hold their G1 blocks)."""
        self._evicted: list[int] = []
        self._idle_at: float | None = None
        """Start of the idle wait for an onboarding transfer (None when not idling)."""
        if cfg.has_lower_tiers:
            self.attach_tiers(TierHierarchy(TierConfig.from_engine(cfg), 0))

    # ================================================================== public API
    def add_request(
        self, req: TraceRequest, now_ms: float, record: RequestRecord | None = None, block_keys: list[int] | None = None
    ) -> RequestRecord:
        """Queue a request arriving at ``now_ms``. Returns its record (filled in as it runs). ``block_keys``:
        the prompt's keys when the caller already has them (they must equal :func:`engine_block_keys` for this
        core's block sizes; never mutated); computed here otherwise."""
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
        keys = None
        # a prompt that can never fit is rejected at its first admission look, before any key is read: none
        # are built (or kept), so an ISL of 2**31 - 1 does not build 134M keys (GBs) only to be refused
        if self.kv.caching and req.hash_ids is not None and self.prompt_fits(req.input_length):
            keys = block_keys
            if keys is None:
                keys = engine_block_keys(req.hash_ids, req.input_length, self.block_size, self.trace_block_size)
        r = EngineRequest(req.request_id, self._added, req.input_length, req.output_length, keys, record)
        self._added += 1
        if not self.running and not self.waiting:
            if self._idle_at is None:
                self.next_pass_ms = max(self.next_pass_ms, now_ms)
            else:  # idling for an onboarding transfer: the arrival starts a pass now (not later than the wake-up)
                self.next_pass_ms = min(self.next_pass_ms, max(now_ms, self._idle_at))
        self.requests[r.request_id] = r
        self.all_requests.append(r)
        self.waiting.append(r)
        return record

    def prompt_fits(self, prompt_len: int) -> bool:
        """Whether a prompt of ``prompt_len`` tokens can ever fit this core's KV cache: one that needs more
        blocks than the cache holds is rejected at admission (:meth:`_admission`; TensorRT-LLM's reserves even
        more) without its block keys being looked at, so :meth:`add_request` builds none for it."""
        return -(-prompt_len // self.block_size) <= self.num_blocks

    def add_prefilled_request(
        self, req: TraceRequest, now_ms: float, record: RequestRecord | None = None, block_keys: list[int] | None = None
    ) -> RequestRecord:
        """Disaggregated decode side: queue a request whose prompt KV and first token were computed by a
        prefill worker. Nothing is recomputed: at admission its blocks for prompt + that token are allocated
        (prefix-cache hits shared) and the pass computes only the token's KV, as a decode request; it then
        emits ``output_length`` tokens here, the first at the end of its admission pass (as the reference's
        decode worker: 374-token prompt admitted at 23.0049 ms -> first token at 28.7641 ms)."""
        record = self.add_request(req, now_ms, record, block_keys)
        r = self.requests[req.request_id]
        # Internally: prompt P-1 computed + 1 "generated" token whose KV is not (the last prompt token's), so the
        # first pass is a decode at P tokens (the reference's decode pass lengths P, P+1, ...) and emits g == 2.
        r.prompt_len -= 1
        r.computed = r.prompt_len
        r.generated = 1
        r.output_len += 1
        return record

    def cancel(self, request_id: int, now_ms: float) -> bool:
        """Cancel a live request (frees its KV). Returns False if unknown or already terminal."""
        r = self.requests.get(request_id)
        if r is None:
            return False
        self._co_sync_all()
        if self._onboarding and self._tier_forget(r, now_ms):
            pass
        elif r.state in (State.WAITING, State.PREEMPTED):
            self.waiting.remove(r)
        else:
            self.running.remove(r)
            self._free(r)
        r.transition(State.CANCELLED)
        r.record.status = "cancelled"
        r.record.finish_ms = now_ms
        del self.requests[request_id]
        return True

    def has_work(self) -> bool:
        return bool(self.running or self.waiting or self._onboarding)

    def step(self, now_ms: float) -> PassOutcome:
        """Run one pass starting at ``now_ms`` (>= the end of the previous pass)."""
        if now_ms < self.next_pass_ms:
            raise SimulationError(f"clock went back: pass at {now_ms} ms before previous end {self.next_pass_ms} ms")
        self._co_sync_all()
        if self.tiers is not None:
            return self._tier_pass(now_ms, True)
        return self._pass(now_ms, True)

    def advance_until(self, horizon_ms: float) -> None:
        """Run every pass that starts before ``horizon_ms`` (virtual time), fast-forwarding decode stretches."""
        if self.tiers is not None:
            return self._tier_advance(horizon_ms)
        if self._co_ok:
            while (self.running or self.waiting) and self.next_pass_ms < horizon_ms:
                if not self._co_stretch(horizon_ms):
                    self._pass(self.next_pass_ms, False, True)
            return
        while (self.running or self.waiting) and self.next_pass_ms < horizon_ms:
            if not self._stretch(horizon_ms):
                self._pass(self.next_pass_ms, False)

    def advance_single_step(self, horizon_ms: float) -> None:
        """Like :meth:`advance_until` but one pass at a time (reference mode for equivalence tests)."""
        if self.tiers is not None:
            self._co_sync_all()
            while (self.running or self.waiting or self._onboarding) and self.next_pass_ms < horizon_ms:
                self._tier_pass(self.next_pass_ms, False)
            return
        self._co_sync_all()
        while (self.running or self.waiting) and self.next_pass_ms < horizon_ms:
            self._pass(self.next_pass_ms, False)

    def release_finished(self) -> list[ForwardPassMetrics]:
        """:meth:`PassTimeline.release_finished` after bringing fast-forwarded cohorts up to date."""
        self._co_sync_all()
        return super().release_finished()

    def finalize(self) -> None:
        """Fill ``token_times_ms`` of every record from the pass timeline (call once at the end)."""
        self._co_sync_all()
        self._fill_token_times()

    # ------------------------------------------------------------------ metrics for routers / live worker
    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting) + len(self._onboarding)

    def active_blocks(self) -> int:
        return self.kv.num_active_blocks()

    def check_invariants(self) -> None:
        """Raise SimulationError if KV blocks are not conserved or queues are inconsistent."""
        self._co_sync_all()
        self.kv.check_invariants()
        run_ids = {id(r) for r in self.running}
        wait_ids = {id(r) for r in self.waiting}
        if run_ids & wait_ids:
            raise SimulationError("a request is both waiting and running")
        if len(run_ids) != len(self.running) or len(wait_ids) != len(self.waiting):
            raise SimulationError("a request appears twice in a queue")
        held = sum(r.private_blocks for r in self.running) + self.external_private_blocks
        for _, r in self._onboarding:
            held += r.private_blocks
            if r.state not in (State.WAITING, State.PREEMPTED) or id(r) in run_ids or id(r) in wait_ids:
                raise SimulationError(f"onboarding request {r.request_id} in state {r.state.name} or also queued")
            if len(r.hashed_held) + r.private_blocks != -(-r.alloc_tokens // self.block_size):
                raise SimulationError(
                    f"onboarding request {r.request_id} holds KV for {r.alloc_tokens} tokens "
                    f"in {len(r.hashed_held) + r.private_blocks} blocks"
                )
        if self.tiers is not None:
            self.tiers.check_invariants()
        if held != self.kv.private_in_use:
            raise SimulationError(f"private blocks held by requests {held} != pool count {self.kv.private_in_use}")
        for r in self.running:
            if r.state not in (State.PREFILLING, State.DECODING):
                raise SimulationError(f"running request {r.request_id} in state {r.state.name}")
            nb = len(r.hashed_held) + r.private_blocks
            if nb != -(-r.alloc_tokens // self.block_size):
                raise SimulationError(f"request {r.request_id} holds {nb} blocks for {r.alloc_tokens} tokens")
        for r in self.waiting:
            if r.state not in (State.WAITING, State.PREEMPTED) or r.hashed_held or r.private_blocks:
                raise SimulationError(f"waiting request {r.request_id} in state {r.state.name} holding KV")
        if len(self.running) > self.max_seqs:
            raise SimulationError(f"{len(self.running)} running > max_num_seqs {self.max_seqs}")
        if self.no_evict and self.reserved_blocks > self.num_blocks:
            raise SimulationError(f"reserved {self.reserved_blocks} blocks > {self.num_blocks}")

    # ================================================================== admission policy
    def _cached_prefix(self, r: EngineRequest) -> tuple[int, int]:
        """(cached tokens usable, of which blocks are currently active) for a waiting request."""
        if r.block_keys is None:
            return 0, 0
        hits, act = self.kv.match_prefix(r.block_keys)
        if hits == 0:
            return 0, 0
        bs = self.block_size
        cached = min(hits * bs, ((r.seq_len - 1) // bs) * bs)
        return cached, min(act, cached // bs)

    def _admission(self, r: EngineRequest) -> tuple[int, int]:
        """(decision, cached prompt tokens): decision -1 reject (can never fit), 0 wait, 1 admit."""
        need_total = -(-r.seq_len // self.block_size)
        if need_total > self.num_blocks or (not self.chunked and r.prompt_len > self.max_batched):
            return -1, 0
        cached, act = self._cached_prefix(r)
        return (1 if need_total - act <= self.kv.available() else 0), cached

    # ================================================================== the pass
    def _schedule(self, w: _PassWork, r: EngineRequest, from_waiting: bool, cached: int) -> ScheduleOutcome:
        """Schedule ``r``'s next tokens in pass ``w`` (``from_waiting``: at admission, ``cached`` prompt tokens
        hit in the prefix cache): up to the budget, KV allocated up to the new position, preempting victims
        when blocks run out (module docstring, step 1)."""
        before = r.computed if r.computed > 0 else r.computed + cached
        prompt_len = r.prompt_len
        prompt_before = before if before < prompt_len else prompt_len
        seq_len = prompt_len + r.generated
        remaining = seq_len - before
        budget = w.budget
        if not self.chunked and prompt_len - prompt_before > 0 and prompt_len - prompt_before > budget:
            return _BLOCKED
        desired = remaining if remaining < budget else budget
        if desired == 0 and remaining > 0:
            return _BLOCKED
        target = before + desired
        bs = self.block_size
        kv = self.kv
        keys = r.block_keys
        if from_waiting and cached:
            n_c = cached // bs
            assert keys is not None  # a prefix-cache hit was looked up by the prompt's block keys
            for k in keys[:n_c]:
                kv.acquire_cached(k)
            r.hashed_held = list(keys[:n_c])
            r.alloc_tokens = cached
        held = len(r.hashed_held) + r.private_blocks
        need = -(-target // bs) - held
        if need > 0:
            while need > kv.available():
                victim = self._pick_victim()
                if victim is None:
                    target = before
                    need = 0
                    break
                self._preempt(victim, w)
                if victim is r:
                    return _PREEMPTED_SELF
            if target == before and desired > 0:
                return _BLOCKED
            # a partial block that becomes a full prompt block joins the prefix cache
            if (
                keys is not None
                and r.alloc_tokens % bs
                and held * bs <= prompt_len
                and held * bs <= target
                and r.private_blocks
                and kv.promote_private(keys[held - 1])
            ):
                r.private_blocks -= 1
                r.hashed_held.append(keys[held - 1])
            n_full = 0
            if keys is not None:
                full_end = (target if target < prompt_len else prompt_len) // bs
                n_full = full_end - held if full_end - held < need else need
                if n_full > 0:
                    reg = kv.allocate_full_many(keys[held : held + n_full])
                    r.hashed_held.extend(reg)
                    r.private_blocks += n_full - len(reg)
                else:
                    n_full = 0
            if need - n_full > 0:
                kv.allocate_private(need - n_full)
                r.private_blocks += need - n_full
        elif keys is not None and r.alloc_tokens % bs and target > r.alloc_tokens:
            # growing inside the last partial block; it may become a full prompt block
            last = held - 1
            if (
                (last + 1) * bs <= target
                and (last + 1) * bs <= prompt_len
                and r.private_blocks
                and kv.promote_private(keys[last])
            ):
                r.private_blocks -= 1
                r.hashed_held.append(keys[last])
        if target > r.alloc_tokens:
            r.alloc_tokens = target
        r.computed = target
        used = target - before
        prompt_after = target if target < prompt_len else prompt_len
        prompt_tokens = prompt_after - prompt_before
        w.sched[r.request_id] = ScheduledWork(used, prompt_tokens, prompt_before)
        if prompt_tokens > 0:
            w.prefill_n += 1
            w.prefill_isl_sum += prompt_after
            w.prefill_prefix_sum += prompt_before
        w.budget = budget - used
        return _SCHEDULED

    def _pick_victim(self) -> EngineRequest | None:
        if self.no_evict or not self.running:
            return None
        return self.running[-1] if self.lifo else self.running[0]

    def _preempt(self, v: EngineRequest, w: _PassWork) -> None:
        """Preempt ``v`` by recompute (KV freed, re-queued first) and undo its work in pass ``w``."""
        self.running.remove(v)
        self._free(v)
        v.computed = 0
        v.alloc_tokens = 0
        v.transition(State.PREEMPTED)
        v.record.num_preemptions += 1
        self.preemptions_total += 1
        self.waiting.appendleft(v)
        w.preempted.append(v.request_id)
        undone = w.sched.pop(v.request_id, None)
        if undone is not None:
            w.budget += undone.used_tokens
            if undone.prompt_tokens > 0:
                w.prefill_n -= 1
                w.prefill_isl_sum -= undone.prompt_before + undone.prompt_tokens
                w.prefill_prefix_sum -= undone.prompt_before

    def _free(self, r: EngineRequest) -> None:
        self.kv.release(r.hashed_held, r.private_blocks)
        r.hashed_held = []
        r.private_blocks = 0
        if r.reserved_blocks:
            self.reserved_blocks -= r.reserved_blocks
            r.reserved_blocks = 0

    def _on_admit(self, r: EngineRequest, cached: int, now_ms: float) -> None:
        rec = r.record
        if rec.admit_ms is None:
            rec.admit_ms = now_ms
            rec.cached_tokens = cached

    # ================================================================== KVBM lower tiers (tiers is not None)
    # Hooks (module mocker.kv.tiers has the tier model): a cached block the kvbm pool evicts is queued for G2
    # (the pool appends it to _evicted; sent at the end of the pass, at its start time, batched by the
    # hierarchy); at admission, after the G1 prefix hits, the leading run of the prompt's next blocks found in
    # G2/G3/G4 is onboarded: the request takes its G1 blocks at once (hits + private blocks for the run) and
    # waits outside the queues; when the ticket is done it joins the running batch at the next pass start
    # with those tokens computed (its onboarded blocks join the prefix cache), so they are never charged as
    # prefill. Decode stretches are fast-forwarded as without tiers, up to the next tier event while a ticket
    # of this core is in flight (a lower bound of its completion: processor sharing only delays transfers), so
    # a ticket is seen at the first pass start after it, exactly; blocks evicted inside a stretch are sent at
    # the stretch's start (tier_exact=True: one pass at a time, each eviction sent at its own pass's start).

    def attach_tiers(self, tiers: TierHierarchy, slot: int | None = None) -> None:
        """Offload to / onboard from ``tiers`` as its worker ``slot`` (default: a new worker of ``tiers``).
        Raises ConfigError unless the G1 pool is the kvbm pool."""
        if not isinstance(self.kv, KvbmBlockManager):
            raise ConfigError(f"g1_backend={self.cfg.g1_backend!r}: lower KV tiers need g1_backend='kvbm'")
        self.tiers = tiers
        self.tier_slot = tiers.add_worker() if slot is None else slot
        self.tier_exact = False
        """True: one pass at a time (no decode stretches), every offload sent at its own pass's start."""
        self._evicted = []
        self.kv.offload_sink = self._evicted

    def _tier_advance(self, horizon_ms: float) -> None:
        while (self.running or self.waiting or self._onboarding) and self.next_pass_ms < horizon_ms:
            self.tier_step(horizon_ms)

    def tier_step(self, horizon_ms: float) -> None:
        """Run the pass (or the idle wake-up) due at :attr:`next_pass_ms`, or a decode stretch starting then
        (passes starting before ``horizon_ms``). The fleet driver of a shared hierarchy calls the core whose
        next pass is earliest, so every tier operation happens in time order."""
        tiers = self.tiers
        assert tiers is not None
        if self.tier_exact:
            self._tier_pass(self.next_pass_ms, False)
            return
        now = self.next_pass_ms
        tiers.advance(now)
        self._idle_at = None
        if self._onboarding:
            self._tier_join()
            e = tiers.next_event_ms()
            if e is not None and e < horizon_ms:
                horizon_ms = e  # no ticket of this core can complete before it
        if not self.running and not self.waiting:
            self._tier_idle(now, False)
        elif self._co_ok:
            if not self._co_stretch(horizon_ms):
                self._pass(now, False, True)
        elif not self._stretch(horizon_ms):
            self._pass(now, False)
        ev = self._evicted
        if ev:
            tiers.offload(now, self.tier_slot, ev)
            ev.clear()

    @overload
    def _tier_pass(self, now: float, want: Literal[True]) -> PassOutcome: ...
    @overload
    def _tier_pass(self, now: float, want: bool) -> PassOutcome | None: ...
    def _tier_pass(self, now: float, want: bool) -> PassOutcome | None:
        tiers = self.tiers
        assert tiers is not None
        tiers.advance(now)
        self._idle_at = None
        if self._onboarding:
            self._tier_join()
        if self.running or self.waiting:
            out = self._pass(now, want)
        else:
            out = self._tier_idle(now, want)
        ev = self._evicted
        if ev:
            tiers.offload(now, self.tier_slot, ev)
            ev.clear()
        return out

    def _tier_idle(self, now: float, want: bool) -> PassOutcome | None:
        """Nothing can run before an onboarding transfer lands: wait until the next tier event (no pass)."""
        assert self.tiers is not None  # called from _tier_pass
        t = self.tiers.next_event_ms()
        if t is None:
            raise SimulationError(
                f"worker {self.worker_id}: requests wait for onboarding but no tier transfer is in flight"
            )
        self._idle_at = now
        self.next_pass_ms = t if t > now else now
        return PassOutcome(now, self.next_pass_ms) if want else None

    def _tier_onboard(self, r: EngineRequest, cached: int, now: float) -> bool:
        """Admission of ``r`` (it fits; ``cached`` G1-hit tokens): start onboarding the leading run of its next
        prompt blocks found below G1. False when there is none (admit as usual)."""
        keys = r.block_keys
        if keys is None or r.computed:
            return False
        bs = self.block_size
        n_c = cached // bs
        lim = (r.prompt_len + r.generated - 1) // bs  # the last token is always computed (as for G1 hits)
        if lim > len(keys):
            lim = len(keys)
        if n_c >= lim:
            return False
        assert self.tiers is not None  # called with lower tiers attached only
        ticket = self.tiers.onboard(now, self.tier_slot, keys[n_c:lim])
        if ticket is None:
            return False
        m = len(ticket.keys)
        kv = self.kv
        for k in keys[:n_c]:
            kv.acquire_cached(k)
        r.hashed_held = list(keys[:n_c])
        kv.allocate_private(m)  # within available: admission checked the whole sequence
        r.private_blocks = m
        r.alloc_tokens = (n_c + m) * bs
        self._on_admit(r, cached, now)
        self._onboarding.append((ticket, r))
        return True

    def _tier_join(self) -> None:
        """Requests whose onboarding is done join the running batch (room permitting), done order."""
        done = [(x[0].done_ms, x) for x in self._onboarding if x[0].done_ms is not None]
        if not done:
            return
        done.sort(key=lambda d: d[0])
        kv, running = self.kv, self.running
        for _, item in done:
            if len(running) >= self.max_seqs:
                break
            self._onboarding.remove(item)
            r = item[1]
            n_c = len(r.hashed_held)
            assert r.block_keys is not None  # onboarding is by block keys
            for k in r.block_keys[n_c : n_c + r.private_blocks]:
                if kv.promote_private(k):  # not cached meanwhile by another request: joins the prefix cache
                    r.private_blocks -= 1
                    r.hashed_held.append(k)
            r.computed = r.alloc_tokens
            self._run_seq += 1
            r.run_seq = self._run_seq
            r.transition(State.PREFILLING)
            running.append(r)

    def _tier_forget(self, r: EngineRequest, now: float) -> bool:
        """Cancel of an onboarding request: free its blocks (its transfer completes unobserved)."""
        for item in self._onboarding:
            if item[1] is r:
                self._onboarding.remove(item)
                self._free(r)
                r.alloc_tokens = 0
                if self._idle_at is not None:  # freed blocks may let a waiting request in now
                    self.next_pass_ms = min(self.next_pass_ms, max(now, self._idle_at))
                return True
        return False

    @overload
    def _pass(self, now: float, want_outcome: Literal[True], cohort: bool = False) -> PassOutcome: ...
    @overload
    def _pass(self, now: float, want_outcome: bool, cohort: bool = False) -> PassOutcome | None: ...
    def _pass(self, now: float, want_outcome: bool, cohort: bool = False) -> PassOutcome | None:
        """One pass starting at ``now`` (module docstring, steps 1-4), in named steps; ``cohort``: the decode
        cohort's members (a prefix of ``running``) take part lazily. Returns the outcome when ``want_outcome``."""
        co_n = self._co_prepare() if cohort else 0
        w = _PassWork(self.max_batched - co_n)
        emitters: list[EngineRequest] = []
        # cohort members each compute their dangling token and emit (lazily): the sum of their sequence lengths
        s_dec, n_dec = self._schedule_running(w, co_n, emitters, self._co_c + co_n * self.pass_index if co_n else 0)
        admitted: list[int] = []
        rejected: list[int] = []
        if not w.preempted:
            s_dec, n_dec = self._admit_waiting(w, now, emitters, admitted, rejected, s_dec, n_dec)
        else:
            emitters, s_dec, n_dec = self._emitters_after_preemption(w)
        dec = self._decode_ms(s_dec, n_dec) if n_dec else 0.0
        end = (now + self._prefill_ms(w)) + dec
        if (
            not co_n
            and not w.sched
            and not rejected
            and not admitted
            and not w.preempted
            and (self.running or self.waiting or self._onboarding)
        ):
            if self._onboarding:  # KVBM: what is left waits for onboarding transfers
                return self._tier_idle(now, want_outcome)
            raise SimulationError(f"worker {self.worker_id}: pass at {now} ms made no progress")
        fpm = self._make_fpm(now, end, w.sched) if self.collect_fpm else None
        p = self.pass_index
        done: list[EngineRequest] = []
        if co_n:
            if w.preempted:
                raise SimulationError("preemption in a cohort pass (the pre-check should have excluded it)")
            self._finish_cohort_members(p, end, done)
        self._emit(emitters, p, end, done)
        if done:
            self._drop_finished(done)
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
            [r.request_id for r in done],
            admitted,
            w.preempted,
            rejected,
            fpm,
        )

    def _schedule_running(self, w: _PassWork, co_n: int, emitters: list[EngineRequest], s_dec: int) -> tuple[int, int]:
        """Step 1: the running requests after the cohort's ``co_n`` members, in order, while budget remains.
        Appends the requests that will emit to ``emitters``; returns (sum of the sequence lengths, count) of
        the decoding ones, starting from the cohort's ``s_dec`` and ``co_n``."""
        running = self.running
        sched = w.sched
        n_dec = co_n
        i = co_n
        decoding = State.DECODING
        bs = self.block_size
        kv = self.kv
        while i < len(running) and w.budget > 0:
            r = running[i]
            if r.state is decoding and (r.alloc_tokens % bs or kv.free > 0):
                # common case inlined: a decoding request computes its one dangling token and will emit
                seq_len = r.prompt_len + r.generated
                if not r.alloc_tokens % bs:
                    kv.free -= 1
                    kv.private_in_use += 1
                    r.private_blocks += 1
                r.alloc_tokens = r.computed = seq_len
                sched[r.request_id] = DECODE_STEP
                w.budget -= 1
                emitters.append(r)
                s_dec += seq_len
                n_dec += 1
                i += 1
                continue
            out = self._schedule(w, r, False, 0)
            if out is _SCHEDULED:
                i += 1
                seq_len = r.prompt_len + r.generated
                if r.computed == seq_len:
                    emitters.append(r)
                    if sched[r.request_id].prompt_tokens == 0 and r.generated > 0:
                        s_dec += seq_len
                        n_dec += 1
            elif out is _BLOCKED:
                break
        return s_dec, n_dec

    def _admit_waiting(
        self,
        w: _PassWork,
        now: float,
        emitters: list[EngineRequest],
        admitted: list[int],
        rejected: list[int],
        s_dec: int,
        n_dec: int,
    ) -> tuple[int, int]:
        """Step 2 (nothing preempted): admit waiting requests in order while ``running < max_num_seqs`` and
        they fit; prompts that can never fit are rejected. Appends to ``emitters`` / ``admitted`` /
        ``rejected``; returns the decoding (sum of sequence lengths, count) updated."""
        waiting = self.waiting
        running = self.running
        sched = w.sched
        while waiting and len(running) < self.max_seqs:
            r = waiting[0]
            decision, cached = self._admission(r)
            if decision < 0:
                waiting.popleft()
                self._reject(r, now)
                rejected.append(r.request_id)
                continue
            if decision == 0:
                break
            if self.tiers is not None and self._tier_onboard(r, cached, now):
                waiting.popleft()
                continue
            if self._schedule(w, r, True, cached) is not _SCHEDULED:
                break
            waiting.popleft()
            running.append(r)
            self._run_seq += 1
            r.run_seq = self._run_seq
            r.transition(State.PREFILLING)
            self._on_admit(r, cached, now)
            self._reserve(r)
            admitted.append(r.request_id)
            seq_len = r.prompt_len + r.generated
            if r.computed == seq_len:
                emitters.append(r)
                if sched[r.request_id].prompt_tokens == 0 and r.generated > 0:
                    s_dec += seq_len
                    n_dec += 1
        return s_dec, n_dec

    def _emitters_after_preemption(self, w: _PassWork) -> tuple[list[EngineRequest], int, int]:
        """Step 2 (something preempted: no admission): preemptions removed requests from the batch, so who
        emits is recomputed in running order. Returns (emitters, decoding sum of sequence lengths, count)."""
        emitters: list[EngineRequest] = []
        s_dec = n_dec = 0
        sched = w.sched
        for r in self.running:
            work = sched.get(r.request_id)
            if work is not None and r.computed == r.prompt_len + r.generated:
                emitters.append(r)
                if work.prompt_tokens == 0 and r.generated > 0:
                    s_dec += r.prompt_len + r.generated
                    n_dec += 1
        return emitters, s_dec, n_dec

    def _prefill_ms(self, w: _PassWork) -> float:
        """Step 3, prefill part: the timing model over the requests computing prompt tokens this pass
        (integer mean ISL and mean prefix), rounded to ns, divided by the speedup; 0 ms if none."""
        bc = w.prefill_n
        if not bc:
            return 0.0
        pf = round_ns(self.timing.prefill_ms(bc, w.prefill_isl_sum // bc, w.prefill_prefix_sum // bc))
        if self.speedup != 1.0 and pf > 0:
            pf = round_ns(pf / self.speedup)
        return pf

    def _finish_cohort_members(self, p: int, end: float, done: list[EngineRequest]) -> None:
        """Step 4 for the cohort: members whose last token is emitted by pass ``p`` finish at ``end``
        (appended to ``done``)."""
        heap = self._co_heap
        fin_state = State.FINISHED
        while heap and heap[0][0] <= p:
            _, _, ver, r = heappop(heap)
            if ver != r.co_ver:
                continue
            self._co_leave(r, p + 1)
            r.transition(fin_state)
            self._finish(r, end)
            done.append(r)

    def _emit(self, emitters: list[EngineRequest], p: int, end: float, done: list[EngineRequest]) -> None:
        """Step 4: every emitter gets one token at ``end`` (pass ``p``); those reaching their output length
        finish (appended to ``done``), the others decode from now on."""
        decoding = State.DECODING
        for r in emitters:
            g = r.generated + 1
            r.generated = g
            if r.emit_last == p - 1 and r.emit_start >= 0:
                r.emit_last = p
            else:
                r.note_emit(p)
            if g == 1 or (g == 2 and r.record.first_token_ms is None):  # g == 2: a prefilled request
                r.record.first_token_ms = end
            if g >= r.output_len:
                r.transition(State.FINISHED)
                self._finish(r, end)
                done.append(r)
            elif r.state is not decoding:
                r.transition(decoding)

    # ================================================================== decode cohort (fast path)
    # Running requests that decode pass after pass form a "cohort" whose per-request counters are lazy:
    # a member joined at pass p0 with g0 tokens generated has generated g0 + (P - p0) after P passes,
    # emits at every pass in between, needs a new KV block at passes j with j = p0 - prompt - g0 + 1 (mod
    # block size) and finishes at pass p0 + output - g0 - 1. The cohort keeps the sum of its members'
    # sequence lengths (affine in the pass index), a histogram of block-crossing phases and a heap of
    # finishing passes, so a decode pass or a whole decode stretch costs O(1) per member-free event.
    # Members are always a prefix of the running queue. Anything that needs exact per-request state
    # (preemption, a live step, cancel, invariants, finalize) first materialises the cohort.

    def _co_join(self, r: EngineRequest, p0: int) -> None:
        g0 = r.generated
        r.co = True
        r.co_p0, r.co_g0, r.co_a0 = p0, g0, r.alloc_tokens
        r.co_ver += 1
        self._co_n += 1
        self._co_c += r.prompt_len + g0 - p0
        self._co_hist[(p0 - r.prompt_len - g0 + 1) % self.block_size] += 1
        heappush(self._co_heap, (p0 + r.output_len - g0 - 1, r.run_seq, r.co_ver, r))

    def _co_leave(self, r: EngineRequest, p_after: int) -> None:
        """Materialise ``r``'s counters as of ``p_after`` completed passes and take it out of the cohort."""
        d = p_after - r.co_p0
        if d > 0:
            bs = self.block_size
            g = r.co_g0 + d
            r.generated = g
            new_alloc = r.prompt_len + g - 1
            r.private_blocks += (new_alloc - 1) // bs - (r.co_a0 - 1) // bs
            r.alloc_tokens = r.computed = new_alloc
            last = p_after - 1
            if r.emit_last == r.co_p0 - 1 and r.emit_start >= 0:
                r.emit_last = last
            else:
                if r.emit_start >= 0:
                    r.emit_ranges.append((r.emit_start, r.emit_last))
                r.emit_start, r.emit_last = r.co_p0, last
        r.co = False
        r.co_ver += 1
        self._co_n -= 1
        self._co_c -= r.prompt_len + r.co_g0 - r.co_p0
        self._co_hist[(r.co_p0 - r.prompt_len - r.co_g0 + 1) % self.block_size] -= 1

    def _co_sync_all(self) -> None:
        if not self._co_n:
            return
        p = self.pass_index
        for r in self.running:
            if r.co:
                self._co_leave(r, p)
        self._co_heap = []

    def _co_grow(self) -> None:
        """Let the decoding requests right after the cohort (in running order) join it."""
        running, p, decoding = self.running, self.pass_index, State.DECODING
        i = self._co_n
        while i < len(running) and running[i].state is decoding and not running[i].co:
            self._co_join(running[i], p)
            i += 1

    def _co_prepare(self) -> int:
        """Start a pass with the cohort: allocate its blocks for this pass; 0 (cohort materialised) when this
        pass could preempt or the budget is short."""
        self._co_grow()
        n = self._co_n
        if n == 0:
            return 0
        kv, bs = self.kv, self.block_size
        c = self._co_hist[self.pass_index % bs]
        avail = kv.available()
        rest = self.max_batched - n
        if rest < 0:
            self._co_sync_all()
            return 0
        need = c
        if need <= avail:
            for r in self.running[n:]:  # non-members must not be able to force a preemption either
                tgt = r.prompt_len + r.generated
                if r.computed + rest < tgt:
                    tgt = r.computed + rest
                nb = -(-tgt // bs) - len(r.hashed_held) - r.private_blocks
                if nb > 0:
                    need += nb
        if need > avail:
            self._co_sync_all()
            return 0
        if c:
            kv.allocate_private(c)
        return n

    def _co_stretch(self, horizon: float) -> bool:
        """:meth:`_stretch` for a batch made only of cohort members: no per-request work."""
        running = self.running
        n = len(running)
        if n == 0 or n > self.max_batched:
            return False
        waiting = self.waiting
        if waiting and n < self.max_seqs and self._admission(waiting[0])[0] != 0:
            return False
        if self._co_n != n:
            self._co_grow()
            if self._co_n != n:
                return False
        heap = self._co_heap
        while heap[0][2] != heap[0][3].co_ver:
            heappop(heap)
        p = self.pass_index
        k_cap = heap[0][0] - p + 1
        bs, kv, hist = self.block_size, self.kv, self._co_hist
        avail = kv.available()
        if n * (-(-k_cap // bs)) > avail:
            tot = k = 0
            while k < k_cap:
                c = hist[(p + k) % bs]
                if tot + c > avail:
                    break
                tot += c
                k += 1
            k_cap = k
        if k_cap < 1:
            return False
        now = self.next_pass_ms
        s0 = self._co_c + n * p
        ends = self._decode_ends(now, s0, n, k_cap, horizon)
        k = len(ends)
        end = ends[-1]
        # blocks allocated over passes p .. p+k-1: full phase cycles plus a partial one
        full, part = divmod(k, bs)
        new_blocks = full * n
        if part:
            a = p % bs
            new_blocks += sum(hist[a : a + part]) if a + part <= bs else sum(hist[a:]) + sum(hist[: a + part - bs])
        kv.allocate_private(new_blocks)
        p_after = p + k
        done: list[EngineRequest] = []
        fin_state = State.FINISHED
        while heap and heap[0][0] <= p_after - 1:
            _, _, ver, r = heappop(heap)
            if ver != r.co_ver:
                continue
            self._co_leave(r, p_after)
            r.transition(fin_state)
            self._finish(r, end)
            done.append(r)
        if done:
            self._drop_finished(done)
        self._ends += ends
        self.pass_index = p_after
        self.next_pass_ms = end
        return True

    def _reserve(self, r: EngineRequest) -> None:
        pass

    def _reject(self, r: EngineRequest, now: float) -> None:
        r.transition(State.FAILED)
        r.record.status = "failed"
        r.record.finish_ms = now
        del self.requests[r.request_id]

    def _finish(self, r: EngineRequest, end: float) -> None:
        self._free(r)
        rec = r.record
        rec.finish_ms = end
        rec.status = "finished"
        self.finished_total += 1
        del self.requests[r.request_id]

    def _drop_finished(self, done: list[EngineRequest]) -> None:
        """Take the just-finished requests ``done`` out of the running queue, keeping its order. Usually one or
        two finish at a time: ``list.remove`` each (a C-level scan, several times faster than rebuilding the
        list in Python for a batch of a hundred); many at once: one filtering pass."""
        if len(done) <= 8:
            running = self.running
            for r in done:
                running.remove(r)
        else:
            self.running = [r for r in self.running if r.state is not State.FINISHED]

    def _make_fpm(self, now: float, end: float, sched: dict[int, ScheduledWork]) -> ForwardPassMetrics:
        pre_len: list[int] = []
        pre_new = pre_kv = 0
        dec_kv: list[int] = []
        byid = {r.request_id: r for r in self.running}
        for rid, (used, pt, pb) in sched.items():
            r = byid.get(rid) or self.requests.get(rid)
            if r is None:
                r = next(x for x in self.all_requests if x.request_id == rid)
            if pt > 0:
                pre_len.append(r.prompt_len)
                pre_new += used
                pre_kv += pb
            elif r.state != State.FINISHED:
                dec_kv.append(r.seq_len)
        qp = [r.prompt_len for r in self.waiting if r.state == State.WAITING]
        qd = [r.seq_len for r in self.waiting if r.state == State.PREEMPTED]
        return ForwardPassMetrics(
            worker_id=self.worker_id,
            dp_rank=self.dp_rank,
            wall_time=(end - now) / 1000.0,
            scheduled_requests=ScheduledRequests(
                num_prefill_requests=len(pre_len),
                sum_prefill_tokens=pre_new,
                var_prefill_length=population_variance(pre_len),
                sum_prefill_kv_tokens=pre_kv,
                num_decode_requests=len(dec_kv),
                sum_decode_kv_tokens=sum(dec_kv),
                var_decode_kv_tokens=population_variance(dec_kv),
            ),
            queued_requests=queued_requests(qp, qd),
            timestamp_ms=end,
        )

    # ================================================================== fast path
    def _decode_ms(self, s: int, n: int) -> float:
        """Duration (ms) of a pass's decode part: ``n`` decoding requests, ``s`` active KV tokens
        (:func:`decode_pass_ms`; read from the decode table when there is one)."""
        table = self._dtable
        if table is not None and s <= 2 * self.total_kv_tokens:
            return table.upto(s)[s]
        return decode_pass_ms(self.timing, s, n, self.speedup)

    def _decode_ends(self, now: float, s0: int, n: int, k_cap: int, horizon: float) -> list[float]:
        """End times (ms) of the passes of a decode stretch: ``n`` requests, ``s0`` active KV tokens in the
        first pass starting at ``now``, ``n`` more in each next one; at most ``k_cap`` (>= 1) passes (and at
        most ``FAST_CHUNK_PASSES``), the last being the first to end at or after ``horizon``. Each end is the
        previous end plus the pass duration, so the figures are those of running the passes one by one."""
        timing, speed = self.timing, self.speedup
        # the polynomial's durations come from its table (bit-identical to decode_pass_ms), read at s0, s0 + n,
        # ...; the table is capped at twice the KV capacity (shared prefixes can exceed it)
        table = self._dtable
        cap = 2 * self.total_kv_tokens
        k_try = k_cap
        if k_cap > _SCALAR_MAX and horizon != inf and self._monotone_decode:
            # decode time grows with active KV tokens, so no pass is shorter than the first: an upper bound on
            # the passes starting before the horizon (bounds the table's growth; the loop stops at the horizon)
            if table is not None and s0 <= cap:
                vals = table.values  # the list while it covers s0, else the timing's own table (no growth)
                d0 = vals[s0] if s0 < len(vals) else float(table.timing.decode_table(s0)[s0])
            else:
                d0 = decode_pass_ms(timing, s0, n, speed)
            k_try = min(k_cap, int((horizon - now) / max(d0, 1e-9)) + 2)
        if k_try > FAST_CHUNK_PASSES:
            k_try = FAST_CHUNK_PASSES
        s_last = s0 + n * (k_try - 1)
        if table is not None and s_last <= cap:
            if k_try <= _LIST_MAX:
                return decode_stretch_ends(table.upto(s_last), now, s0, n, k_try, horizon, s_last)
        elif k_try <= _SCALAR_MAX:
            ends: list[float] = []
            t = now
            for j in range(k_try):
                t = t + decode_pass_ms(timing, s0 + n * j, n, speed)
                ends.append(t)
                if t >= horizon:
                    break
            return ends
        acc = np.empty(k_try + 1)
        acc[0] = now
        if table is not None and s_last <= cap:
            acc[1:] = table.timing.decode_table(s_last)[s0 : s_last + 1 : n]
        else:
            acc[1:] = decode_pass_ms_array(timing, s0 + n * np.arange(k_try, dtype=np.int64), n, speed)
        ends_a = acc.cumsum()[1:]  # array methods, not np.cumsum / np.searchsorted: no Python-level wrapper per call
        k = 1 + int(ends_a[:-1].searchsorted(horizon, side="left")) if horizon != inf else k_try
        out: list[float] = ends_a[:k].tolist()
        return out

    def _stretch(self, horizon: float) -> bool:
        """Run a stretch of identical-shape decode-only passes at once. False if not applicable now."""
        running = self.running
        n = len(running)
        if n == 0 or n > self.max_batched:
            return False
        waiting = self.waiting
        if waiting and n < self.max_seqs and self._admission(waiting[0])[0] != 0:
            return False
        k_cap = 1 << 60
        s0 = 0
        decoding = State.DECODING
        for r in running:
            if r.state is not decoding:
                return False
            g = r.generated
            if r.output_len - g < k_cap:
                k_cap = r.output_len - g
            s0 += r.prompt_len + g
        bs = self.block_size
        avail = self.kv.available()
        # blocks needed by k passes: per request ceil((len+k-1)/bs) - ceil((len-1)/bs) <= ceil(k/bs)
        if n * (-(-k_cap // bs)) > avail:
            lens = np.fromiter((r.prompt_len + r.generated for r in running), dtype=np.int64, count=n)
            base = -(-(lens - 1) // bs)
            lo, hi = 0, k_cap
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if int((-(-(lens + mid - 1) // bs) - base).sum()) <= avail:
                    lo = mid
                else:
                    hi = mid - 1
            k_cap = lo
        if k_cap < 2:
            return False
        now = self.next_pass_ms
        ends = self._decode_ends(now, s0, n, k_cap, horizon)
        k = len(ends)
        if k < 2:
            return False
        p = self.pass_index
        # apply: tokens, KV growth, emission ranges
        new_blocks = 0
        last = p + k - 1
        prev = p - 1
        done: list[EngineRequest] = []
        for r in running:
            old_alloc = r.alloc_tokens
            g = r.generated + k
            r.generated = g
            new_alloc = r.prompt_len + g - 1
            nb = (new_alloc - 1) // bs - (old_alloc - 1) // bs  # ceil(a/bs) == (a-1)//bs + 1
            if nb:
                r.private_blocks += nb
                new_blocks += nb
            r.alloc_tokens = r.computed = new_alloc
            if r.emit_last == prev and r.emit_start >= 0:
                r.emit_last = last
            else:
                if r.emit_start >= 0:
                    r.emit_ranges.append((r.emit_start, r.emit_last))
                r.emit_start, r.emit_last = p, last
            if g >= r.output_len:
                done.append(r)
        self.kv.allocate_private(new_blocks)
        end = ends[-1]
        if self.collect_fpm:
            self._stretch_fpm(now, np.array(ends), s0 + n * np.arange(k, dtype=np.int64))
        if done:
            for r in done:
                r.transition(State.FINISHED)
                self._finish(r, end)
            self._drop_finished(done)
        self._ends += ends
        self.pass_index = p + k
        self.next_pass_ms = end
        return True

    def _stretch_fpm(self, now: float, ends: npt.NDArray[np.float64], s: npt.NDArray[np.int64]) -> None:
        n = len(self.running)
        starts = np.concatenate(([now], ends[:-1]))
        lens = np.array([r.prompt_len + r.generated for r in self.running], dtype=np.float64)
        var_dec = float(np.var(lens)) if n > 1 else 0.0  # a common shift does not change the variance
        qp = [r.prompt_len for r in self.waiting if r.state == State.WAITING]
        qd = [r.seq_len for r in self.waiting if r.state == State.PREEMPTED]
        queued = queued_requests(qp, qd)
        for j in range(len(ends)):
            self.fpm.append(
                ForwardPassMetrics(
                    worker_id=self.worker_id,
                    dp_rank=self.dp_rank,
                    wall_time=float(ends[j] - starts[j]) / 1000.0,
                    scheduled_requests=ScheduledRequests(
                        num_decode_requests=n, sum_decode_kv_tokens=int(s[j]), var_decode_kv_tokens=var_dec
                    ),
                    queued_requests=queued,
                    timestamp_ms=float(ends[j]),
                )
            )


class TrtllmCore(VllmCore):
    """TensorRT-LLM GUARANTEED_NO_EVICT: capacity-first admission reserving
    ``ceil((prompt + max_output) / block_size)`` blocks per request (docs/architecture.md "TensorRT-LLM mode":
    7319 blocks, block 32, ISL 1096, max output 7000 -> 253 blocks each -> at most 28 running); never preempts."""

    no_evict = True

    def _admission(self, r: EngineRequest) -> tuple[int, int]:
        need = -(-(r.prompt_len + r.output_len) // self.block_size)
        if need > self.num_blocks or (not self.chunked and r.prompt_len > self.max_batched):
            return -1, 0
        if self.reserved_blocks + need > self.num_blocks:
            return 0, 0
        cached, act = self._cached_prefix(r)
        return (1 if -(-r.seq_len // self.block_size) - act <= self.kv.available() else 0), cached

    def _reserve(self, r: EngineRequest) -> None:
        need = -(-(r.prompt_len + r.output_len) // self.block_size)
        r.reserved_blocks = need
        self.reserved_blocks += need
