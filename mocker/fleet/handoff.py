"""Disaggregated serving in a :class:`mocker.fleet.Fleet`: a request's flight from the prefill pool to the
decode pool (:class:`Flight`, :class:`Phase`) and the KV handoff between them (:class:`HandoffLayer`).

Facts of the reference replay (Dynamo Mocker 1.6.1, ``disagg.rs``): the prefill request is the original with
``max_output_tokens = 1``; the decode request is the original. At the end of the prefill pass the decode
router picks the destination, the KV transfer takes :meth:`KvTransferConfig.transfer_ms`
(:mod:`mocker.transfer`), then the request joins the decode core prefilled (``add_prefilled_request``: no
recompute). With the coordinated handoff the source holds the prompt's KV and the destination reserves room
for it until the transfer ends (vLLM: source first, :meth:`HandoffLayer._take_holds`); SGLang pools go
destination-first: the destination is chosen at arrival and reserves before the prefill is dispatched
(:meth:`HandoffLayer._route_decode_first`). Every hold and reservation is released exactly once.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from enum import Enum
from math import inf, nextafter
from typing import TYPE_CHECKING, Any, Final

from dynoplan.errors import SimulationError
from mocker.engine import CORES
from mocker.engine.sglang import SglangCore
from mocker.fleet.pools import EVENT_ACTIVATE, EVENT_PREFILL_DONE, EVENT_RESERVE, Core, FleetEvent, FleetWorker, Pool
from mocker.kv.manager import engine_block_keys
from mocker.kv.radix import SeqContent
from mocker.records import RequestRecord, TraceRequest
from mocker.timing import kv_transfer_ms
from mocker.transfer import KvTransferConfig

if TYPE_CHECKING:
    from mocker.kv.events import KvEventIndex

Hold = tuple[Core, FleetWorker, Any, int]
"""A KV hold or reservation: (core, its worker, pinned block keys / SGLang tree node or reservation, private
blocks or token slots)."""


class Phase(Enum):
    """Where a disaggregated request is."""

    QUEUED = 0
    """Waiting at the fleet for a prefill worker (or, SGLang destination-first, reserved and not dispatched)."""
    PREFILL = 1
    WAIT_DECODE = 2
    """Prefill done, no decode worker yet: in the decode pool's fleet queue."""
    TRANSFER = 3
    DECODE = 4
    DONE = 5
    """Ended outside the decode pool (rejected on the prefill worker, or its prompt can never fit)."""
    CANCELLED = 6
    RESERVING = 7
    """SGLang destination-first: waiting for its destination's reservation."""


# The members as Final module globals, compared with ``is`` (interpreted, a global lookup costs a tenth of an enum
# attribute lookup, Python 3.11; compiled, a Final global is a C static)
PHASE_QUEUED: Final = Phase.QUEUED
PHASE_PREFILL: Final = Phase.PREFILL
PHASE_WAIT_DECODE: Final = Phase.WAIT_DECODE
PHASE_TRANSFER: Final = Phase.TRANSFER
PHASE_DECODE: Final = Phase.DECODE
PHASE_DONE: Final = Phase.DONE
PHASE_CANCELLED: Final = Phase.CANCELLED
PHASE_RESERVING: Final = Phase.RESERVING


class Flight:
    """A disaggregated request between pools."""

    __slots__ = ("rid", "req", "rec", "prec", "pcore", "pkeys", "dcore", "phase", "hold", "reserve")

    def __init__(self, rid: int, req: TraceRequest, rec: RequestRecord) -> None:
        self.rid = rid
        self.req = req
        self.rec = rec
        self.prec: RequestRecord | None = None
        self.pcore: Any = None
        self.pkeys: list[int] | SeqContent | None = None
        """The prompt on the prefill core (coordinated handoff): the prefix-cache keys of its full blocks
        (vLLM), its content (SGLang)."""
        self.dcore: Any = None
        self.phase = PHASE_QUEUED
        self.hold: Hold | None = None  # the source's hold on the prompt's KV
        self.reserve: Hold | None = None  # reserved on the destination


def sglang_busy(c: Any) -> bool:
    """An SGLang core that runs passes (a held waiting queue alone does not)."""
    return bool(c.running or c.prefilled or (c.waiting and not c.hold_waiting))


class HandoffLayer:
    """The disaggregated part of :class:`mocker.fleet.Fleet` (prefill ends, decode routing, KV holds and
    transfers, the advance strategies that tolerate holds): the first of its base classes
    (``Fleet`` -> :class:`~mocker.fleet.routing.RoutingLayer` -> ``HandoffLayer``, single inheritance, which
    mypyc compiles to native classes). State set up by :meth:`_init_handoff`; the fleet's attributes it reads
    are declared here, set by ``Fleet.__init__``."""

    disagg: bool
    transfer: KvTransferConfig
    pools: dict[str, Pool]
    entry: Pool
    _kv_index: dict[str, KvEventIndex]

    # ---------------------------------------------------------------- implemented by the subclasses
    def _adv(self, c: Core, h: float) -> None:
        """Advance core ``c`` to ``h`` with the fleet's strategy (``Fleet._adv``)."""
        raise NotImplementedError

    def _push(self, t: float, kind: FleetEvent, obj: Any) -> None:
        """Schedule a fleet event (``Fleet._push``)."""
        raise NotImplementedError

    def _dispatch(self, item: Any, rec: RequestRecord, rid: int, t: float) -> None:
        """Route a request to the entry pool (:meth:`RoutingLayer._dispatch`)."""
        raise NotImplementedError

    def _drain_kv_events(self, p: Pool, t: float) -> None:
        """Feed the pool's KV events to its router's index (:meth:`RoutingLayer._drain_kv_events`)."""
        raise NotImplementedError

    def _init_handoff(self) -> None:
        """Handoff state: hold counters, the SGLang/coordinated/destination-first switches, reservation queues."""
        self._pf_to = -inf  # prefill cores advanced to this time
        self.holds_taken = 0
        """Coordinated handoffs: holds + reservations taken (each is released exactly once)."""
        self.holds_released = 0
        self._sg = self.disagg and CORES[self.pools["decode"].cfg.engine].capabilities.radix_handoff
        """SGLang pools: holds are token slots and radix-tree locks (SglangCore.hold_tokens)."""
        self._coordinated = self.disagg and self.transfer.handoff == "coordinated"
        self._dst_first = self._sg and self._coordinated
        """SGLang coordinated handoff: the destination reserves before the prefill starts (module docstring)."""
        self._pending_res: dict[int, deque[Flight]] = {}  # id(decode core) -> flights waiting to reserve
        self._res_event: set[int] = set()  # id(decode core) with a RESERVE event outstanding
        self._stalled: set[Any] = set()
        self._core_holds: dict[int, int] = {}  # id(core) -> live holds / reservations on it
        tr = self.transfer  # read once (a pydantic settings object): _transfer_ms
        self._xfer_gbps = float(tr.bandwidth_gbps)
        self._xfer_bytes = tr.kv_bytes_per_token or 0
        self._charge_missing = tr.timing == "destination_missing"

    def _transfer_ms(self, prompt_tokens: int, hit_tokens: int) -> float:
        """KV transfer time (ms) of a prompt whose first ``hit_tokens`` the destination already holds:
        ``transfer.transfer_ms(transfer.charged_tokens(prompt_tokens, hit_tokens))`` (:mod:`mocker.transfer`)."""
        charged = prompt_tokens - hit_tokens if self._charge_missing else prompt_tokens
        return kv_transfer_ms(charged, self._xfer_bytes, self._xfer_gbps)

    def _collect_prefill(self, t: float) -> None:
        """Advance prefill cores to ``t``; every prefill seen ending becomes a PREFILL_DONE event."""
        self._pf_to = t
        for w in self.pools["prefill"].workers:
            if w.state == "released" or w.state == "starting":
                continue
            for c in w.cores:
                self._adv(c, t)
            if w.inflight:
                keep = []
                for fl in w.inflight:
                    prec = fl.prec
                    assert prec is not None  # a request in flight on a prefill worker has its prefill record
                    if prec.finish_ms is not None:
                        self._push(prec.finish_ms, EVENT_PREFILL_DONE, fl)
                    else:
                        keep.append(fl)
                w.inflight = keep

    def _on_prefill_done(self, fl: Flight, t: float) -> None:
        if fl.phase is not PHASE_PREFILL:
            return
        rec, prec = fl.rec, fl.prec
        assert prec is not None
        if rec.admit_ms is None:
            rec.admit_ms = prec.admit_ms
        rec.cached_tokens = prec.cached_tokens
        rec.num_preemptions += prec.num_preemptions
        if prec.status != "finished":  # rejected on the prefill worker (prompt can never fit)
            rec.status = prec.status
            rec.finish_ms = prec.finish_ms
            fl.phase = PHASE_DONE
            self._release_holds(fl, t)  # SGLang: the destination's reservation
            return
        if self._dst_first:
            self._transfer_reserved(fl, t)
        else:
            self._route_decode(fl, t)

    def _pick_decode(self, fl: Flight, t: float) -> Core | None:
        """The decode core the decode router picks for ``fl`` at ``t`` (cores advanced to ``t`` first when the
        router reads their state, KV events drained for the KV index), or None when the decode pool is empty:
        ``fl`` then waits in the pool's queue for a worker to join."""
        p = self.pools["decode"]
        cores = p.cores
        if not cores:
            fl.phase = PHASE_WAIT_DECODE
            p.queue.append(fl)
            return None
        if p.needs_state:
            for c in cores:
                self._adv(c, t)
            if self._kv_index:
                self._drain_kv_events(p, t)
        return cores[p.router.choose(fl.req, t, cores)]

    def _route_decode(self, fl: Flight, t: float) -> None:
        p = self.pools["decode"]
        c = self._pick_decode(fl, t)
        if c is None:
            return
        coordinated = self._coordinated
        if coordinated or self._charge_missing:
            self._adv(c, t)
        fl.dcore = c
        if p.on_routed is not None:
            p.on_routed(fl.rec)
        req = fl.req
        hit = 0
        if self._charge_missing and req.hash_ids is not None:
            hit = self._destination_hit_tokens(c, req)
        delay = self._transfer_ms(req.input_length, hit)
        fl.phase = PHASE_TRANSFER
        if coordinated:
            # the destination reserves at its next pass boundary (now if idle); the transfer starts then
            start = c.next_pass_ms if c.next_pass_ms > t else t
            self._take_holds(fl, c)
            self._push(start + delay, EVENT_ACTIVATE, fl)
        elif delay == 0.0:
            self._activate(fl, t)
        else:
            self._push(t + delay, EVENT_ACTIVATE, fl)

    def _destination_hit_tokens(self, c: Any, req: TraceRequest) -> int:
        """Leading prompt tokens the destination core already caches (block/page aligned; 0 without prefix
        caching): what ``destination_missing`` does not charge."""
        if self._sg:
            if not c.caching:
                return 0
            content = SeqContent.for_request(req.hash_ids, req.input_length, -1, c.trace_block_size)
            return c.kv.match_len(content, req.input_length)
        if not c.kv.caching:
            return 0
        keys = engine_block_keys(req.hash_ids, req.input_length, c.block_size, c.trace_block_size)
        return min(c.kv.match_prefix(keys)[0] * c.block_size, req.input_length)

    # ---------------------------------------------------------------- SGLang: destination first
    def _route_decode_first(self, fl: Flight, t: float) -> None:
        """SGLang coordinated handoff, step 1 (at arrival): the decode router picks the destination, which
        reserves prompt + 1 tokens at once when idle, else at its next pass boundary, one reservation per
        boundary while it is busy (reference replay: three requests arriving together at a busy decode
        worker reserved at three successive pass ends, at an idle one all at the arrival); the prefill is
        dispatched once reserved."""
        p = self.pools["decode"]
        c = self._pick_decode(fl, t)
        if c is None:
            return
        assert isinstance(c, SglangCore)  # destination-first is the SGLang handoff
        self._adv(c, t)
        fl.dcore = c
        if p.on_routed is not None:
            p.on_routed(fl.rec)
        fl.phase = PHASE_RESERVING
        pend = self._pending_res.get(id(c))
        if pend is None:
            pend = self._pending_res[id(c)] = deque()
        pend.append(fl)
        c.hold_waiting = True
        if len(pend) == 1 and id(c) not in self._res_event:
            self._on_reserve(c, t)

    def _on_reserve(self, c: Any, t: float) -> None:
        """Try the pending reservations of decode core ``c`` at ``t``, in arrival order (the head blocks the
        rest): one at a pass boundary of a busy core, as many as fit while it stays idle; mid-pass, wait for
        the pass end. A head that does not fit is retried at the next boundary (busy core) or when capacity
        is released on the core (idle core, :meth:`_give`). At most one ``FleetEvent.RESERVE`` event per core is
        outstanding."""
        key = id(c)
        self._res_event.discard(key)
        pend = self._pending_res[key]
        self._adv(c, t)
        busy = sglang_busy(c) and c not in self._stalled
        if busy and c.next_pass_ms > t:  # mid-pass: wait for its end
            self._res_event.add(key)
            self._push(c.next_pass_ms, EVENT_RESERVE, c)
            return
        while pend:
            fl = pend[0]
            if fl.phase is not PHASE_RESERVING:  # cancelled meanwhile
                pend.popleft()
                continue
            if not self._grant_reservation(fl, t):
                break
            pend.popleft()
            busy = sglang_busy(c) and c not in self._stalled
            if busy:
                break
        if not pend and c.hold_waiting:  # backlog gone: retracted requests may be admitted again
            c.hold_waiting = False
            if c.waiting and not c.running and not c.prefilled and c.next_pass_ms < t:
                c.next_pass_ms = t
        if pend and busy:  # the next boundary is the end of the pass starting now: look just after it started
            self._res_event.add(key)
            self._push(nextafter(t, inf), EVENT_RESERVE, c)

    def _kick_reservations(self, c: Any, t: float) -> None:
        """Capacity changed on decode core ``c``: retry its pending reservations at ``t`` (via the event heap)."""
        key = id(c)
        if self._pending_res.get(key) and key not in self._res_event:
            self._res_event.add(key)
            self._push(t, EVENT_RESERVE, c)

    def _grant_reservation(self, fl: Flight, t: float) -> bool:
        """Reserve the destination for ``fl`` (:meth:`SglangCore.reserve_prefilled`) and dispatch its prefill.
        False when it does not fit now. A prompt that can never fit fails the request (True: it leaves the
        queue)."""
        c = fl.dcore
        try:
            r = c.reserve_prefilled(fl.req, fl.rec)
        except SimulationError:  # larger than the destination's whole pool
            fl.phase = PHASE_DONE
            fl.rec.status = "failed"
            fl.rec.finish_ms = t
            return True
        if r is None:
            return False
        w = self.pools["decode"].by_id[c.worker_id]
        w.holds += 1
        self._core_holds[id(c)] = self._core_holds.get(id(c), 0) + 1
        self.holds_taken += 1
        fl.reserve = (c, w, r, 0)
        fl.phase = PHASE_QUEUED
        p = self.entry
        if p.cores:
            self._dispatch(fl, fl.rec, fl.rid, t)
        else:
            p.queue.append((fl, fl.rec, fl.rid))
        return True

    def _transfer_reserved(self, fl: Flight, t: float) -> None:
        """SGLang coordinated handoff, step 2 (prefill done): the source holds the prompt's KV and the transfer
        to the already reserved destination starts at once; step 3 is :meth:`_activate`."""
        src = fl.pcore
        fl.hold = self._take(src, self.pools["prefill"].by_id[src.worker_id], fl.req.input_length, fl.pkeys)
        # destination_missing: what the destination lacked when it reserved (its cached prefix is locked since)
        hit = fl.reserve[2].cached if fl.reserve is not None else 0
        fl.phase = PHASE_TRANSFER
        self._push(t + self._transfer_ms(fl.req.input_length, hit), EVENT_ACTIVATE, fl)

    def _take_holds(self, fl: Flight, dst: Any) -> None:
        """vLLM coordinated handoff (source-first): the source holds the prompt's KV blocks, then the
        destination reserves blocks for prompt + first token. Each is capped by what is available. (SGLang
        orders them destination-first: :meth:`_route_decode_first`.)"""
        src = fl.pcore
        isl = fl.req.input_length
        fl.hold = self._take(src, self.pools["prefill"].by_id[src.worker_id], isl, fl.pkeys)
        fl.reserve = self._take(dst, self.pools["decode"].by_id[dst.worker_id], isl + 1, None)

    def _take(self, core: Core, w: FleetWorker, tokens: int, keys: list[int] | SeqContent | None) -> Hold:
        """Hold ``tokens`` of KV on ``core``: the source pins its prompt's cached blocks (``keys``, just
        released by the finished prefill request, so nothing else is evicted) plus private blocks for the rest;
        a reservation is private blocks. Capped by what is available. SGLang cores: token slots and a tree
        lock (:meth:`SglangCore.hold_tokens`; ``keys`` is then the prompt's content)."""
        held: Any
        if isinstance(core, SglangCore):  # self._sg (both pools are of one family)
            assert not isinstance(keys, list)  # an SGLang core's prompt content
            held, n = core.hold_tokens(keys, tokens)
        else:
            kv = core.kv
            n = -(-tokens // core.block_size)
            held = []
            if keys:
                assert isinstance(keys, list)  # a vLLM core's prompt keys
                hits = kv.acquire_prefix(keys)
                if hits:
                    held = keys[:hits]
                    n -= hits
            if n > kv.free:
                avail = kv.available()
                if n > avail:
                    n = avail
            kv.allocate_private(n)
            core.external_private_blocks += n
        w.holds += 1
        self._core_holds[id(core)] = self._core_holds.get(id(core), 0) + 1
        self.holds_taken += 1
        return core, w, held, n

    def _give(self, h: Hold, t: float) -> None:
        core, w, pinned, n = h
        if isinstance(core, SglangCore):  # self._sg (both pools are of one family)
            core.release_hold(pinned, n)
        else:
            core.kv.release(pinned, n)
            core.external_private_blocks -= n
        self._core_holds[id(core)] -= 1
        w.holds -= 1
        self.holds_released += 1
        if core in self._stalled:  # capacity came back: the idle core's next pass starts now
            self._stalled.discard(core)
            if core.next_pass_ms < t:
                core.next_pass_ms = t
        if self._dst_first:
            self._kick_reservations(core, t)

    def _advance_lazy(self, c: Core, h: float) -> None:
        """``c.advance_until(h)``, skipping the call when no pass of ``c`` starts before ``h`` or it holds no
        request (a no-op then)."""
        if c.next_pass_ms < h and (c.running or c.waiting or (isinstance(c, SglangCore) and c.prefilled)):
            c.advance_until(h)

    def _advance_handoff(self, c: Core, h: float) -> None:
        """:meth:`_advance_guarded` with ``c.advance_until``, skipping the call when it is a no-op (no pass of
        ``c`` starts before ``h``, or it holds no request). The disaggregated fleet advances cores at every
        arrival, prefill end and activation, mostly to where they already are or while they are idle (about
        three in four prefill-core advances on the Azure trace)."""
        if (
            c.next_pass_ms < h
            and (c.running or c.waiting or (isinstance(c, SglangCore) and c.prefilled))
            and c not in self._stalled
        ):
            try:
                c.advance_until(h)
            except SimulationError:
                if self._core_holds.get(id(c)) and not c.running:
                    self._stalled.add(c)
                    return
                raise

    def _advance_guarded(self, c: Core, h: float, advance: Callable[[float], None]) -> None:
        """Advance ``c``; a core with nothing running whose waiting request does not fit only because of
        handoff holds/reservations idles (stalled) until one is released, instead of failing."""
        if c in self._stalled:
            return
        try:
            advance(h)
        except SimulationError:
            if self._core_holds.get(id(c)) and not c.running:
                self._stalled.add(c)
                return
            raise

    def _release_holds(self, fl: Flight, t: float) -> None:
        """Release the flight's reservation and hold (each at most once: the fields are cleared)."""
        if fl.reserve is not None:
            self._give(fl.reserve, t)
            fl.reserve = None
        if fl.hold is not None:
            self._give(fl.hold, t)
            fl.hold = None

    def _activate(self, fl: Flight, t: float) -> None:
        if fl.phase is not PHASE_TRANSFER:
            return
        c = fl.dcore
        self._adv(c, t)
        if self._dst_first:  # SGLang: the reservation becomes the request's KV (no second admission check)
            h = fl.reserve
            assert h is not None
            fl.reserve = None
            fl.phase = PHASE_DECODE
            c.add_prefilled_request(fl.req, t, fl.rec, reserved=h[2])
            self._core_holds[id(c)] -= 1
            h[1].holds -= 1
            self.holds_released += 1
            self._kick_reservations(c, t)
            if fl.hold is not None:
                self._give(fl.hold, t)
                fl.hold = None
            return
        if fl.reserve is not None:  # the reservation becomes the request's own allocation at admission
            self._give(fl.reserve, t)
            fl.reserve = None
        fl.phase = PHASE_DECODE
        keys = fl.pkeys  # the prefill core's prompt keys: reused when the decode core would compute the same
        if (
            keys is not None
            and c.capabilities.block_keys
            and c.block_size == fl.pcore.block_size
            and c.trace_block_size == fl.pcore.trace_block_size
        ):
            c.add_prefilled_request(fl.req, t, fl.rec, keys)
        else:
            c.add_prefilled_request(fl.req, t, fl.rec)
        if fl.hold is not None:  # the source releases after the destination activated
            self._give(fl.hold, t)
            fl.hold = None


__all__ = ["Flight", "HandoffLayer", "Hold", "Phase", "sglang_busy"]
