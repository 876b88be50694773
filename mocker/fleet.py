"""Virtual-time fleet: pools of workers (aggregated, or prefill + decode) replaying requests as fast as the
CPU allows, with workers added and removed while it runs.

Two entry points:

- :class:`Fleet` — the dynamic fleet a driver (the closed-loop simulation, ``planner/sim``) advances tick by
  tick: ``add_worker`` / ``remove_worker`` / ``submit`` / ``advance_until`` / ``finish``, plus the
  observations a planner reads (``take_fpm``, ``pool_counts``, ``engine_states``, ``gpu_seconds``).
- :func:`run_replay` — a fixed fleet replaying a whole trace (``dynoplan replay``); a thin wrapper over
  :class:`Fleet` using its lazy fast path.

Discrete-event loop. Fleet events live in a heap keyed ``(time_ms, seq)`` with ``seq`` from a per-Fleet
counter; time never goes back (asserted). Events: a starting worker becomes ready; a prefill finishes
(disaggregated: the decode worker is chosen, the KV transfer starts); a transfer ends (the request joins the
decode worker). Each worker is an independent engine core per DP rank (:mod:`mocker.engine`), advanced
lazily to the time of the next event that concerns it (only the chosen core for round-robin; every core of
the pool when the router needs their state). Inside a core, passes are events too, fast-forwarded in
stretches (:meth:`VllmCore.advance_until`); ``single_step=True`` runs one pass at a time instead (identical
records, tested).

Semantics shared with the reference replay (Dynamo Mocker 1.6.1): an arrival joins the chosen core's waiting
queue and is considered at the first pass that starts at or after it (an idle core starts a pass at the
arrival); ``duration_ms`` = last finish - first arrival; ``worker_seconds`` = workers * duration (the
reference's ``decode_worker_seconds``; disaggregated: ``prefill_worker_seconds`` + ``decode_worker_seconds``,
each pool's workers * duration).

Disaggregated requests (reference ``disagg.rs`` facts: the prefill request is the original with
``max_output_tokens = 1``; the decode request is the original): the prefill worker computes the prompt and
the first token; at the end of that pass the decode worker is chosen by the decode pool's router, the KV
transfer takes :meth:`KvTransferConfig.transfer_ms` (:mod:`mocker.transfer`), then the request joins the
decode core *prefilled* (:meth:`VllmCore.add_prefilled_request`: no recompute) and emits all its
``output_length`` tokens there, the first at the end of its first decode pass (so TTFT = prefill queue +
prefill + transfer + one decode pass, as the reference reports it). The user's record carries
``prefill_worker_id`` and ``worker_id`` = the decode worker; ``admit_ms`` and ``cached_tokens`` come from
the prefill admission. SGLang pools with the coordinated handoff go destination-first (as the reference): the
decode worker is chosen at arrival and reserves the prompt's KV (:meth:`SglangCore.reserve_prefilled`, waiting
for room, one reservation per pass boundary while busy) before the prefill is dispatched
(:meth:`Fleet._route_decode_first`); TTFT then also includes that wait.

Worker lifecycle (dynamic fleets): ``add_worker(pool, now, delay)`` -> *starting* (GPU time counts from
``now``) -> *ready* at ``now + delay`` (routable; requests that found no ready worker wait in a FIFO fleet
queue and are dispatched then) -> ``remove_worker`` -> *draining* (no new requests; finishes what it
holds, including coordinated-handoff holds) -> *released* when empty, at the end of its last pass (GPU time
stops). Removing a starting worker releases it at once.
"""

from __future__ import annotations

import dataclasses
import gc
from collections import deque
from dataclasses import dataclass
from heapq import heappop, heappush
from math import inf, nextafter
from typing import Any, Callable, Literal, Sequence

from pydantic import Field

from dynoplan.settings import Problems, settings
from mocker.config import EngineConfig
from mocker.engine import make_engine
from mocker.engine.vllm import VllmCore
from mocker.errors import ConfigError, SimulationError
from mocker.kv.manager import engine_block_keys
from mocker.kv.radix import SeqContent
from mocker.kv.events import EventingKvManager, KvEvent, KvEventIndex
from mocker.kv.kvbm import EventingKvbmBlockManager
from mocker.kv.tiers import TierConfig, TierHierarchy
from mocker.records import ForwardPassMetrics, RequestRecord, TraceRequest
from mocker.routers import ROUTERS
from mocker.transfer import KvTransferConfig

POOLS_AGG = ("agg",)
POOLS_DISAGG = ("prefill", "decode")

_READY, _PREFILL_DONE, _ACTIVATE, _RESERVE = 0, 1, 2, 3
# flight phases (disaggregated requests)
_QUEUED, _PREFILL, _WAIT_DECODE, _TRANSFER, _DECODE, _DONE, _CANCELLED, _RESERVING = range(8)


@dataclass(frozen=True)
class PoolCounts:
    """Worker counts of one pool at a moment."""

    requested: int
    """Workers asked for and not being removed: starting + ready."""
    ready: int
    """Workers that receive requests."""
    draining: int
    """Removed workers still finishing what they hold (GPU time still counted)."""
    queued_at_fleet: int
    """Requests waiting at the fleet for a ready worker of this pool."""

    @property
    def starting(self) -> int:
        return self.requested - self.ready


@dataclass(frozen=True)
class EngineState:
    """One DP rank of a ready worker, for saturation / HPA-style policies."""

    pool: str
    worker_id: int
    dp_rank: int
    num_waiting: int
    """Requests queued in the engine (not yet admitted, or preempted)."""
    num_running: int
    """Requests in the running batch."""
    kv_usage: float
    """Active KV blocks / total blocks (0..1), as vLLM's ``kv_cache_usage_perc``."""


def _sg_busy(c: Any) -> bool:
    """An SGLang core that runs passes (a held waiting queue alone does not)."""
    return bool(c.running or c.prefilled or (c.waiting and not c.hold_waiting))


class _Worker:
    __slots__ = ("pool", "worker_id", "cores", "requested_ms", "ready_ms", "drain_ms", "released_ms", "state",
                 "inflight", "holds")

    def __init__(self, pool: str, worker_id: int, cores: list[Any], requested_ms: float, ready_ms: float) -> None:
        self.pool = pool
        self.worker_id = worker_id
        self.cores = cores
        self.requested_ms = requested_ms
        self.ready_ms = ready_ms
        self.drain_ms: float | None = None
        self.released_ms: float | None = None
        self.state = "starting"  # starting | ready | draining | released
        self.inflight: list[_Flight] = []  # prefill pool: requests whose prefill end is not yet seen
        self.holds = 0  # coordinated handoffs holding / reserving KV on this worker


class _Pool:
    __slots__ = ("name", "cfg", "router", "needs_state", "on_routed", "workers", "ready", "cores", "queue",
                 "next_id", "by_id")

    def __init__(self, name: str, cfg: EngineConfig, router: Any) -> None:
        self.name = name
        self.cfg = cfg
        self.router = router
        self.needs_state: bool = router.needs_state
        self.on_routed: Callable[[RequestRecord], None] | None = getattr(router, "on_routed", None)
        self.workers: list[_Worker] = []
        self.ready: list[_Worker] = []
        self.cores: list[Any] = []  # ranks of ready workers, in readiness order: what the router sees
        self.queue: deque[Any] = deque()
        self.next_id = 0
        self.by_id: dict[int, _Worker] = {}

    def rebuild(self) -> None:
        self.cores = [c for w in self.ready for c in w.cores]


class _Flight:
    """A disaggregated request between pools."""

    __slots__ = ("rid", "req", "rec", "prec", "pcore", "pkeys", "dcore", "phase", "hold", "reserve")

    def __init__(self, rid: int, req: TraceRequest, rec: RequestRecord) -> None:
        self.rid = rid
        self.req = req
        self.rec = rec
        self.prec: RequestRecord | None = None
        self.pcore: Any = None
        self.pkeys: list[int] | None = None  # prefix-cache keys of the prompt's full blocks on the prefill core
        self.dcore: Any = None
        self.phase = _QUEUED
        self.hold: tuple[Any, _Worker, list[int], int] | None = None     # (core, worker, pinned keys, private)
        self.reserve: tuple[Any, _Worker, list[int], int] | None = None  # reserved on the destination


class Fleet:
    """A virtual-time fleet of engine pools. See the module docstring for semantics.

    ``engines``: ``{"agg": cfg}`` (aggregated) or ``{"prefill": cfg_p, "decode": cfg_d}`` (disaggregated;
    each cfg's ``dp_size`` = DP ranks per worker). ``router``: default router of every pool (``ROUTERS``
    names); ``routers``: per-pool override, e.g. ``{"decode": "least_loaded"}`` (the decode pool's ``kv``
    router uses overlap weight 0, as Dynamo's decode router). ``transfer``: KV transfer of a disaggregated
    fleet (default: no delay, coordinated handoff). ``seed``: routers' tie-breaking generator.
    ``collect_fpm``: keep per-pass ForwardPassMetrics (read with :meth:`take_fpm`). ``single_step``: no
    fast-forward (equivalence tests). ``kv_events`` / ``kv_event_lag_ms``: the ``kv`` router reads the
    workers' KV events (seen ``kv_event_lag_ms`` late) instead of their caches (:mod:`mocker.kv.events`).

    API (times in ms of the virtual clock, never decreasing across calls; a call with an earlier time raises
    SimulationError)::

        add_worker(pool, now_ms, startup_delay_ms=0.0) -> worker_id      # per-pool ids 0, 1, 2, ...
        remove_worker(pool, now_ms, worker_id=None) -> worker_id         # None: newest starting, else least loaded
        submit(req, now_ms) -> RequestRecord                             # filled in as the request runs
        cancel(record, now_ms) -> bool                                   # releases every hold/reservation once
        advance_until(t_ms)                                              # fleet events and every core up to t
        finish()                                                         # run everything submitted to completion
        take_fpm() -> list[tuple[pool, ForwardPassMetrics]]              # passes since the last call, by time
        take_finished() -> list[RequestRecord]                           # terminal since the last call, by finish
        pool_counts(pool) -> PoolCounts
        engine_states(pool) -> list[EngineState]                         # per DP rank of each ready worker
        gpu_seconds(now_ms, gpus_per_worker=None) -> {pool: GPU-seconds} # default GPUs/worker = dp_size
        records -> list[RequestRecord]                                   # in submit order
        completed -> int                                                 # requests finished (not failed)

    Errors: ConfigError for a bad configuration or an unknown pool / worker; SimulationError when time goes
    back.
    """

    def __init__(self, engines: dict[str, EngineConfig], *, router: str = "round_robin",
                 routers: dict[str, str] | None = None, transfer: KvTransferConfig | None = None, seed: int = 0,
                 collect_fpm: bool = False, single_step: bool = False, kv_events: bool = False,
                 kv_event_lag_ms: float = 0.0) -> None:
        p: list[str] = []
        names = tuple(engines) if isinstance(engines, dict) else ()
        if set(names) not in ({"agg"}, {"prefill", "decode"}):
            p.append(f"engines={sorted(names)!r}: expected pools {{'agg'}} or {{'prefill', 'decode'}}")
        routers = dict(routers or {})
        for pool_name, r in [("*", router), *routers.items()]:
            if r not in ROUTERS:
                p.append(f"router={r!r} (pool {pool_name}): unknown router, expected one of {', '.join(ROUTERS)}")
        for k in routers:
            if k not in names:
                p.append(f"routers[{k!r}]: no such pool, expected one of {', '.join(names)}")
        if not isinstance(seed, int) or isinstance(seed, bool):
            p.append(f"seed={seed!r}: expected an integer")
        if not (isinstance(kv_event_lag_ms, (int, float)) and 0 <= kv_event_lag_ms < inf):
            p.append(f"kv_event_lag_ms={kv_event_lag_ms!r}: expected a finite number of ms >= 0")
        if kv_events and isinstance(engines, dict) and any(c.engine == "sglang" for c in engines.values()):
            p.append("kv_events=True: needs the vLLM / TensorRT-LLM block manager (not the SGLang radix cache yet)")
        if transfer is not None and not isinstance(transfer, KvTransferConfig):
            p.append(f"transfer={transfer!r}: expected a KvTransferConfig")
        if p:
            raise ConfigError(p)
        for cfg in engines.values():
            cfg.validate()
        self.disagg = "prefill" in engines
        if self.disagg:
            for name in POOLS_DISAGG:
                if engines[name].engine == "trtllm":
                    raise ConfigError(f"engine=trtllm ({name} pool): disaggregated serving is not supported for "
                                      "TensorRT-LLM (the reference rejects it too); use vllm")
            fams = {name: engines[name].engine == "sglang" for name in POOLS_DISAGG}
            if fams["prefill"] != fams["decode"]:
                raise ConfigError(f"engines prefill={engines['prefill'].engine!r}, decode={engines['decode'].engine!r}: "
                                  "a disaggregated fleet needs the same KV layout on both pools (both sglang, or "
                                  "both vllm)")
        self.transfer = transfer if transfer is not None else KvTransferConfig()
        self.collect_fpm = collect_fpm
        self.single_step = single_step
        self.seed = seed
        self.pools: dict[str, _Pool] = {}
        for name, cfg in engines.items():
            rname = routers.get(name, router)
            r = ROUTERS[rname](0, seed)
            if name == "decode" and rname == "kv":
                r.overlap_score_weight = 0.0  # Dynamo's decode router: no prefix-overlap credit
            if name == "prefill" and rname == "kv":
                r.track_active_blocks = False  # Dynamo's prefill router: router_track_active_blocks = false
            self.pools[name] = _Pool(name, cfg, r)
        self.entry = self.pools["prefill" if self.disagg else "agg"]
        self.kv_events = kv_events
        self._kv_index: dict[str, KvEventIndex] = {}
        if kv_events:
            for name, pool in self.pools.items():
                if isinstance(pool.router, ROUTERS["kv"]):
                    pool.router.index = self._kv_index[name] = KvEventIndex(kv_event_lag_ms)
        self._heap: list[tuple[float, int, int, Any]] = []
        self._seq = 0
        self._clock = -inf
        self._draining: list[_Worker] = []
        self._where: list[Any] = []  # by internal request id: the agg core, or the _Flight
        self.records: list[RequestRecord] = []
        """Every submitted request's record, in submit order."""
        self._fpm_taken: dict[int, int] = {}
        self._fin_scanned = 0
        self._pending_ids: list[int] = []
        self._pf_to = -inf  # prefill cores advanced to this time
        self.holds_taken = 0
        """Coordinated handoffs: holds + reservations taken (each is released exactly once)."""
        self.holds_released = 0
        self._sg = self.disagg and self.pools["decode"].cfg.engine == "sglang"
        """SGLang pools: holds are token slots and radix-tree locks (SglangCore.hold_tokens)."""
        self._coordinated = self.disagg and self.transfer.handoff == "coordinated"
        self._dst_first = self._sg and self._coordinated
        """SGLang coordinated handoff: the destination reserves before the prefill starts (module docstring)."""
        self._pending_res: dict[int, deque[_Flight]] = {}  # id(decode core) -> flights waiting to reserve
        self._res_event: set[int] = set()  # id(decode core) with a _RESERVE event outstanding
        self._stalled: set[Any] = set()
        self._core_holds: dict[int, int] = {}  # id(core) -> live holds / reservations on it
        if single_step:
            self._adv = lambda c, h: self._advance_guarded(c, h, c.advance_single_step)
        elif self.disagg and self.transfer.handoff == "coordinated":
            self._adv = self._advance_handoff
        elif self.disagg:
            self._adv = self._advance_lazy
        else:
            self._adv = lambda c, h: c.advance_until(h)
        self._tiers: TierHierarchy | None = None
        """KVBM lower tiers (G2 per core, shared G3/G4), shared by every core of the fleet; None = off."""
        self._tier_cores: list[Any] = []
        if any(c.has_lower_tiers for c in engines.values()):
            if self.disagg:
                raise ConfigError(f"num_g2_blocks={engines['prefill'].num_g2_blocks}: KVBM lower tiers are wired into "
                                  "aggregated fleets only; expected no lower tiers with prefill/decode pools")
            self._tiers = TierHierarchy(TierConfig.from_engine(engines["agg"]), 0)
            self._adv = lambda c, h: self._tier_sync(h)

    # ================================================================== KVBM lower tiers
    def _tier_sync(self, h: float) -> None:
        """Lower tiers on: the hierarchy is shared, so the cores run their passes one at a time in global time
        order up to ``h`` (earliest next pass first, ties in worker order): every offload and onboard then
        happens in time order, and worker 2 sees in G3 what worker 1 spilled there earlier."""
        cores = self._tier_cores
        while True:
            best = None
            bt = h
            for c in cores:
                if c.next_pass_ms < bt and (c.running or c.waiting or c._onboarding):
                    best, bt = c, c.next_pass_ms
            if best is None:
                return
            best.tier_step(h)

    def tier_stats(self) -> dict[str, int] | None:
        """KVBM tier counters (None without lower tiers): blocks offloaded G1->G2, onboarded to G1 per tier
        they were found in (and as tokens), spilled G2->G3 and G3->G4, and onboarding requests."""
        h = self._tiers
        if h is None:
            return None
        bs = self.entry.cfg.effective_block_size
        on = h.onboarded_blocks
        return {"kvbm_offloaded_blocks": h.offloaded_blocks, "kvbm_onboarded_blocks_g2": on["G2"],
                "kvbm_onboarded_blocks_g3": on["G3"], "kvbm_onboarded_blocks_g4": on["G4"],
                "kvbm_onboarded_tokens": (on["G2"] + on["G3"] + on["G4"]) * bs,
                "kvbm_onboard_requests": h.onboard_tickets, "kvbm_spilled_blocks_g3": h.spilled_blocks["G3"],
                "kvbm_spilled_blocks_g4": h.spilled_blocks["G4"]}

    # ================================================================== clock
    def _tick(self, t: float) -> None:
        if t < self._clock:
            raise SimulationError(f"fleet clock went back: {t} ms < {self._clock} ms")
        self._clock = t

    def _push(self, t: float, kind: int, obj: Any) -> None:
        self._seq += 1
        heappush(self._heap, (t, self._seq, kind, obj))

    # ================================================================== workers
    def _pool(self, pool: str) -> _Pool:
        p = self.pools.get(pool)
        if p is None:
            raise ConfigError(f"pool={pool!r}: no such pool, expected one of {', '.join(self.pools)}")
        return p

    def add_worker(self, pool: str, now_ms: float, startup_delay_ms: float = 0.0) -> int:
        """Request a worker for ``pool`` at ``now_ms``; it becomes routable at ``now_ms + startup_delay_ms``
        (GPU time counts from ``now_ms``). Returns its worker id (per pool, 0, 1, 2, ...)."""
        p = self._pool(pool)
        if not (isinstance(startup_delay_ms, (int, float)) and startup_delay_ms >= 0 and startup_delay_ms < inf):
            raise ConfigError(f"startup_delay_ms={startup_delay_ms!r}: expected a finite number >= 0")
        self._events_to(now_ms)
        wid = p.next_id
        p.next_id += 1
        cfg = p.cfg
        cores = [make_engine(cfg, worker_id=wid, dp_rank=r, collect_fpm=self.collect_fpm) for r in range(cfg.dp_size)]
        if self.kv_events:
            for c in cores:  # a fresh core: swap its empty block manager for the event-recording one
                c.kv = (EventingKvManager if cfg.g1_backend == "native" else EventingKvbmBlockManager)(cfg.num_gpu_blocks, cfg.enable_prefix_caching)
        if self._tiers is not None:  # after any pool swap: the core's kvbm pool sends its evictions to G2
            for c in cores:
                c.attach_tiers(self._tiers)
                c.tier_exact = self.single_step  # single_step: one pass at a time, exact offload times
            self._tier_cores += cores
        w = _Worker(pool, wid, cores, float(now_ms), float(now_ms) + float(startup_delay_ms))
        p.workers.append(w)
        p.by_id[wid] = w
        if startup_delay_ms == 0:
            self._make_ready(w, float(now_ms))
        else:
            self._push(w.ready_ms, _READY, w)
        return wid

    def remove_worker(self, pool: str, now_ms: float, worker_id: int | None = None) -> int:
        """Stop routing to a worker at once; it drains what it holds and is released when empty.

        ``worker_id=None`` picks the newest not-yet-ready worker, else the least loaded ready one (fewest
        running + waiting requests over its ranks; newest on ties). Returns the removed worker's id. Raises
        ConfigError when the pool has no such (or no removable) worker."""
        p = self._pool(pool)
        self._events_to(now_ms)
        if worker_id is None:
            starting = [w for w in p.workers if w.state == "starting"]
            if starting:
                w = starting[-1]
            elif p.ready:
                for x in p.ready:
                    for c in x.cores:
                        self._adv(c, now_ms)
                w = min(reversed(p.ready), key=lambda x: sum(c.num_running + c.num_waiting for c in x.cores))
            else:
                raise ConfigError(f"pool {pool!r}: no worker to remove")
        else:
            w = p.by_id.get(worker_id)  # type: ignore[assignment]
            if w is None or w.state not in ("starting", "ready"):
                raise ConfigError(f"worker_id={worker_id!r}: not a starting or ready worker of pool {pool!r}")
        if w.state == "ready":
            p.ready.remove(w)
            p.rebuild()
        w.state = "draining"
        w.drain_ms = float(now_ms)
        self._draining.append(w)
        self._check_draining(now_ms)
        return w.worker_id

    def _make_ready(self, w: _Worker, t: float) -> None:
        p = self.pools[w.pool]
        w.state = "ready"
        p.ready.append(w)
        p.rebuild()
        q = p.queue
        while q and p.cores:
            item = q.popleft()
            if p.name == "decode":
                (self._route_decode_first if self._dst_first else self._route_decode)(item, t)
            else:
                self._dispatch(item[0], item[1], item[2], t)

    def _worker_idle(self, w: _Worker) -> bool:
        return (not w.holds and not w.inflight and not any(c.has_work() for c in w.cores)
                and not any(self._pending_res.get(id(c)) for c in w.cores))

    def _check_draining(self, t: float) -> None:
        """Advance draining workers to ``t``; release those that hold nothing, at the end of their last pass."""
        keep = []
        for w in self._draining:
            for c in w.cores:
                self._adv(c, t)
            if self._worker_idle(w):
                w.released_ms = max([w.drain_ms or 0.0] + [c.next_pass_ms for c in w.cores])
                w.state = "released"
            else:
                keep.append(w)
        self._draining = keep

    # ================================================================== requests
    def submit(self, req: TraceRequest, now_ms: float) -> RequestRecord:
        """Route ``req`` arriving at ``now_ms`` among the ready workers of the entry pool (agg or prefill); with
        none ready it waits in the fleet queue (FIFO). Returns its record (``arrival_ms = now_ms``)."""
        if self._heap or self.disagg or self._draining or now_ms < self._clock:
            self._events_to(now_ms)
        else:
            self._clock = now_ms
        rec = RequestRecord(request_id=req.request_id, arrival_ms=now_ms, input_length=req.input_length,
                            output_length=req.output_length)
        records = self.records
        rid = len(records)
        records.append(rec)
        ireq = req if req.request_id == rid else dataclasses.replace(req, request_id=rid)
        p = self.entry
        cores = p.cores
        if not self.disagg and cores:  # the aggregated fast path (inlined _dispatch)
            if p.needs_state:
                for c in cores:
                    self._adv(c, now_ms)
                if self._kv_index:
                    self._drain_kv_events(p, now_ms)
                c = cores[p.router.choose(ireq, now_ms, cores)]
            else:
                c = cores[p.router.choose(ireq, now_ms, cores)]
                self._adv(c, now_ms)
            c.add_request(ireq, now_ms, rec)
            self._where.append(c)
            if p.on_routed is not None:
                p.on_routed(rec)
            return rec
        if self.disagg:
            fl = _Flight(rid, ireq, rec)
            self._where.append(fl)
            if self._dst_first:  # SGLang coordinated: the destination reserves before the prefill starts
                self._route_decode_first(fl, now_ms)
                return rec
            item: Any = fl
        else:
            self._where.append(None)
            item = ireq
        if p.cores:
            self._dispatch(item, rec, rid, now_ms)
        else:
            p.queue.append((item, rec, rid))
        return rec

    def _dispatch(self, item: Any, rec: RequestRecord, rid: int, t: float) -> None:
        p = self.entry
        cores = p.cores
        adv = self._adv
        if p.needs_state:
            for c in cores:
                adv(c, t)
            if self._kv_index:
                self._drain_kv_events(p, t)
        if self.disagg:
            fl: _Flight = item
            q = fl.req
            preq = TraceRequest(q.request_id, q.arrival_ms, q.input_length, 1, q.hash_ids)
            c = cores[p.router.choose(preq, t, cores)]
            if not p.needs_state:
                adv(c, t)
            prec = RequestRecord(request_id=rid, arrival_ms=rec.arrival_ms, input_length=preq.input_length,
                                 output_length=1)
            fl.prec = prec
            fl.pcore = c
            fl.phase = _PREFILL
            c.add_request(preq, t, prec)
            er = c.requests.get(rid) if self._coordinated else None
            if er is not None:
                fl.pkeys = er.content if self._sg else er.block_keys
            rec.prefill_worker_id = c.worker_id
            p.by_id[c.worker_id].inflight.append(fl)
            if p.on_routed is not None:
                p.on_routed(prec)
            if t < self._pf_to:
                self._pf_to = t
        else:
            c = cores[p.router.choose(item, t, cores)]
            if not p.needs_state:
                adv(c, t)
            c.add_request(item, t, rec)
            self._where[rid] = c
            if p.on_routed is not None:
                p.on_routed(rec)

    def cancel(self, record: RequestRecord, now_ms: float) -> bool:
        """Cancel a submitted request wherever it is (fleet queue, prefill, transfer, decode). Every KV hold
        and reservation it has is released exactly once. Returns False if it already ended."""
        self._events_to(now_ms)
        rid = next((i for i, r in enumerate(self.records) if r is record), None)
        if rid is None or record.status != "pending":
            return False
        where = self._where[rid]
        if not self.disagg:
            if where is None:
                self.entry.queue = deque(x for x in self.entry.queue if x[2] != rid)
            else:
                self._adv(where, now_ms)
                if not where.cancel(rid, now_ms):
                    return False
            record.status = "cancelled"
            record.finish_ms = now_ms
            return True
        fl: _Flight = where
        if fl.phase == _QUEUED:
            self.entry.queue = deque(x for x in self.entry.queue if x[2] != rid)
            self._release_holds(fl, now_ms)  # SGLang: the destination's reservation
        elif fl.phase == _PREFILL:
            self._adv(fl.pcore, now_ms)
            fl.pcore.cancel(rid, now_ms)
            w = self.pools["prefill"].by_id[fl.pcore.worker_id]
            if fl in w.inflight:
                w.inflight.remove(fl)
            self._release_holds(fl, now_ms)  # SGLang: the destination's reservation
        elif fl.phase == _RESERVING:
            pass  # still waiting for its destination's reservation: skipped when its turn comes
        elif fl.phase == _WAIT_DECODE:
            self.pools["decode"].queue = deque(x for x in self.pools["decode"].queue if x is not fl)
        elif fl.phase == _TRANSFER:
            self._release_holds(fl, now_ms)
        elif fl.phase == _DECODE:
            self._adv(fl.dcore, now_ms)
            if not fl.dcore.cancel(rid, now_ms):
                return False
        else:
            return False
        fl.phase = _CANCELLED
        record.status = "cancelled"
        record.finish_ms = now_ms
        self._check_draining(now_ms)
        return True

    def _drain_kv_events(self, p: _Pool, t: float) -> None:
        """Stamp the pool's new KV events at ``t`` (the cores were just advanced to it) and let the router's
        index catch up to ``t - lag``."""
        index = self._kv_index.get(p.name)
        if index is None:
            return
        for w in p.workers:
            for c in w.cores:
                ev = c.kv.events
                if ev:
                    index.publish([KvEvent(k, h, par, w.worker_id, c.dp_rank, t) for k, h, par in ev])
                    ev.clear()
        index.catch_up(t)

    # ================================================================== disaggregation
    def _collect_prefill(self, t: float) -> None:
        """Advance prefill cores to ``t``; every prefill seen ending becomes a PREFILL_DONE event."""
        self._pf_to = t
        adv = self._adv
        for w in self.pools["prefill"].workers:
            if w.state == "released" or w.state == "starting":
                continue
            for c in w.cores:
                adv(c, t)
            if w.inflight:
                keep = []
                for fl in w.inflight:
                    if fl.prec.finish_ms is not None:  # type: ignore[union-attr]
                        self._push(fl.prec.finish_ms, _PREFILL_DONE, fl)  # type: ignore[union-attr]
                    else:
                        keep.append(fl)
                w.inflight = keep

    def _on_prefill_done(self, fl: _Flight, t: float) -> None:
        if fl.phase != _PREFILL:
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
            fl.phase = _DONE
            self._release_holds(fl, t)  # SGLang: the destination's reservation
            return
        if self._dst_first:
            self._transfer_reserved(fl, t)
        else:
            self._route_decode(fl, t)

    def _pick_decode(self, fl: _Flight, t: float) -> Any | None:
        """The decode core the decode router picks for ``fl`` at ``t`` (cores advanced to ``t`` first when the
        router reads their state, KV events drained for the KV index), or None when the decode pool is empty:
        ``fl`` then waits in the pool's queue for a worker to join."""
        p = self.pools["decode"]
        cores = p.cores
        if not cores:
            fl.phase = _WAIT_DECODE
            p.queue.append(fl)
            return None
        if p.needs_state:
            adv = self._adv
            for c in cores:
                adv(c, t)
            if self._kv_index:
                self._drain_kv_events(p, t)
        return cores[p.router.choose(fl.req, t, cores)]

    def _route_decode(self, fl: _Flight, t: float) -> None:
        p = self.pools["decode"]
        c = self._pick_decode(fl, t)
        if c is None:
            return
        tr = self.transfer
        coordinated = tr.handoff == "coordinated"
        if coordinated or tr.timing == "destination_missing":
            self._adv(c, t)
        fl.dcore = c
        if p.on_routed is not None:
            p.on_routed(fl.rec)
        req = fl.req
        hit = 0
        if tr.timing == "destination_missing" and req.hash_ids is not None:
            hit = self._destination_hit_tokens(c, req)
        delay = tr.transfer_ms(tr.charged_tokens(req.input_length, hit))
        fl.phase = _TRANSFER
        if coordinated:
            # the destination reserves at its next pass boundary (now if idle); the transfer starts then
            start = c.next_pass_ms if c.next_pass_ms > t else t
            self._take_holds(fl, c)
            self._push(start + delay, _ACTIVATE, fl)
        elif delay == 0.0:
            self._activate(fl, t)
        else:
            self._push(t + delay, _ACTIVATE, fl)

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
    def _route_decode_first(self, fl: _Flight, t: float) -> None:
        """SGLang coordinated handoff, step 1 (at arrival): the decode router picks the destination, which
        reserves prompt + 1 tokens at once when idle, else at its next pass boundary, one reservation per
        boundary while it is busy (reference replay: three requests arriving together at a busy decode
        worker reserved at three successive pass ends, at an idle one all at the arrival); the prefill is
        dispatched once reserved."""
        p = self.pools["decode"]
        c = self._pick_decode(fl, t)
        if c is None:
            return
        self._adv(c, t)
        fl.dcore = c
        if p.on_routed is not None:
            p.on_routed(fl.rec)
        fl.phase = _RESERVING
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
        is released on the core (idle core, :meth:`_give`). At most one ``_RESERVE`` event per core is
        outstanding."""
        key = id(c)
        self._res_event.discard(key)
        pend = self._pending_res[key]
        self._adv(c, t)
        busy = _sg_busy(c) and c not in self._stalled
        if busy and c.next_pass_ms > t:  # mid-pass: wait for its end
            self._res_event.add(key)
            self._push(c.next_pass_ms, _RESERVE, c)
            return
        while pend:
            fl = pend[0]
            if fl.phase != _RESERVING:  # cancelled meanwhile
                pend.popleft()
                continue
            if not self._grant_reservation(fl, t):
                break
            pend.popleft()
            busy = _sg_busy(c) and c not in self._stalled
            if busy:
                break
        if not pend and c.hold_waiting:  # backlog gone: retracted requests may be admitted again
            c.hold_waiting = False
            if c.waiting and not c.running and not c.prefilled and c.next_pass_ms < t:
                c.next_pass_ms = t
        if pend and busy:  # the next boundary is the end of the pass starting now: look just after it started
            self._res_event.add(key)
            self._push(nextafter(t, inf), _RESERVE, c)

    def _kick_reservations(self, c: Any, t: float) -> None:
        """Capacity changed on decode core ``c``: retry its pending reservations at ``t`` (via the event heap)."""
        key = id(c)
        if self._pending_res.get(key) and key not in self._res_event:
            self._res_event.add(key)
            self._push(t, _RESERVE, c)

    def _grant_reservation(self, fl: _Flight, t: float) -> bool:
        """Reserve the destination for ``fl`` (:meth:`SglangCore.reserve_prefilled`) and dispatch its prefill.
        False when it does not fit now. A prompt that can never fit fails the request (True: it leaves the
        queue)."""
        c = fl.dcore
        try:
            r = c.reserve_prefilled(fl.req, fl.rec)
        except SimulationError:  # larger than the destination's whole pool
            fl.phase = _DONE
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
        fl.phase = _QUEUED
        p = self.entry
        if p.cores:
            self._dispatch(fl, fl.rec, fl.rid, t)
        else:
            p.queue.append((fl, fl.rec, fl.rid))
        return True

    def _transfer_reserved(self, fl: _Flight, t: float) -> None:
        """SGLang coordinated handoff, step 2 (prefill done): the source holds the prompt's KV and the transfer
        to the already reserved destination starts at once; step 3 is :meth:`_activate`."""
        c = fl.dcore
        tr = self.transfer
        src = fl.pcore
        fl.hold = self._take(src, self.pools["prefill"].by_id[src.worker_id], fl.req.input_length, fl.pkeys)
        # destination_missing: what the destination lacked when it reserved (its cached prefix is locked since)
        hit = fl.reserve[2].cached if fl.reserve is not None else 0  # type: ignore[union-attr]
        fl.phase = _TRANSFER
        self._push(t + tr.transfer_ms(tr.charged_tokens(fl.req.input_length, hit)), _ACTIVATE, fl)

    def _take_holds(self, fl: _Flight, dst: Any) -> None:
        """vLLM coordinated handoff (source-first): the source holds the prompt's KV blocks, then the
        destination reserves blocks for prompt + first token. Each is capped by what is available. (SGLang
        orders them destination-first: :meth:`_route_decode_first`.)"""
        src = fl.pcore
        isl = fl.req.input_length
        fl.hold = self._take(src, self.pools["prefill"].by_id[src.worker_id], isl, fl.pkeys)
        fl.reserve = self._take(dst, self.pools["decode"].by_id[dst.worker_id], isl + 1, None)

    def _take(self, core: Any, w: _Worker, tokens: int, keys: list[int] | None) -> tuple[Any, _Worker, list[int], int]:
        """Hold ``tokens`` of KV on ``core``: the source pins its prompt's cached blocks (``keys``, just
        released by the finished prefill request, so nothing else is evicted) plus private blocks for the rest;
        a reservation is private blocks. Capped by what is available. SGLang cores: token slots and a tree
        lock (:meth:`SglangCore.hold_tokens`; ``keys`` is then the prompt's content)."""
        if self._sg:
            held, n = core.hold_tokens(keys, tokens)
        else:
            kv = core.kv
            n = -(-tokens // core.block_size)
            held = []
            if keys:
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

    def _give(self, h: tuple[Any, _Worker, list[int], int], t: float) -> None:
        core, w, pinned, n = h
        if self._sg:
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

    def _advance_lazy(self, c: Any, h: float) -> None:
        """``c.advance_until(h)``, skipping the call when no pass of ``c`` starts before ``h`` or it holds no
        request (a no-op then)."""
        if c.next_pass_ms < h and (c.running or c.waiting or (self._sg and c.prefilled)):
            c.advance_until(h)

    def _advance_handoff(self, c: Any, h: float) -> None:
        """:meth:`_advance_guarded` with ``c.advance_until``, skipping the call when it is a no-op (no pass of
        ``c`` starts before ``h``, or it holds no request). The disaggregated fleet advances cores at every
        arrival, prefill end and activation, mostly to where they already are or while they are idle (about
        three in four prefill-core advances on the Azure trace)."""
        if c.next_pass_ms < h and (c.running or c.waiting or (self._sg and c.prefilled)) and c not in self._stalled:
            try:
                c.advance_until(h)
            except SimulationError:
                if self._core_holds.get(id(c)) and not c.running:
                    self._stalled.add(c)
                    return
                raise

    def _advance_guarded(self, c: Any, h: float, advance: Callable[[float], None]) -> None:
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

    def _release_holds(self, fl: _Flight, t: float) -> None:
        """Release the flight's reservation and hold (each at most once: the fields are cleared)."""
        if fl.reserve is not None:
            self._give(fl.reserve, t)
            fl.reserve = None
        if fl.hold is not None:
            self._give(fl.hold, t)
            fl.hold = None

    def _activate(self, fl: _Flight, t: float) -> None:
        if fl.phase != _TRANSFER:
            return
        c = fl.dcore
        self._adv(c, t)
        if self._dst_first:  # SGLang: the reservation becomes the request's KV (no second admission check)
            h = fl.reserve
            assert h is not None
            fl.reserve = None
            fl.phase = _DECODE
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
        fl.phase = _DECODE
        keys = fl.pkeys  # the prefill core's prompt keys: reused when the decode core would compute the same
        if (keys is not None and type(c).add_prefilled_request is VllmCore.add_prefilled_request
                and c.block_size == fl.pcore.block_size and c.trace_block_size == fl.pcore.trace_block_size):
            c.add_prefilled_request(fl.req, t, fl.rec, keys)
        else:
            c.add_prefilled_request(fl.req, t, fl.rec)
        if fl.hold is not None:  # the source releases after the destination activated
            self._give(fl.hold, t)
            fl.hold = None

    # ================================================================== time
    def _events_to(self, t: float) -> None:
        """Process fleet events up to ``t`` (inclusive), advancing only the cores they concern."""
        self._tick(t)
        heap = self._heap
        disagg = self.disagg
        if not heap and not disagg and not self._draining:
            return
        while True:
            if disagg:
                top = heap[0][0] if heap else inf
                b = top if top < t else t
                if b > self._pf_to:
                    self._collect_prefill(b)
            if not heap or heap[0][0] > t:
                break
            et, _, kind, obj = heappop(heap)
            if kind == _READY:
                if obj.state == "starting":
                    self._make_ready(obj, et)
            elif kind == _PREFILL_DONE:
                self._on_prefill_done(obj, et)
            elif kind == _ACTIVATE:
                self._activate(obj, et)
            else:
                self._on_reserve(obj, et)
        if self._draining:
            self._check_draining(t)

    def advance_until(self, t_ms: float) -> None:
        """Process fleet events (readiness, prefill ends and handoffs, releases) and advance every core of
        every live worker to ``t_ms`` (all passes starting before it), so observations are current."""
        self._events_to(t_ms)
        adv = self._adv
        for p in self.pools.values():
            for w in p.ready:
                for c in w.cores:
                    adv(c, t_ms)

    def close(self) -> None:
        """Drop the fleet's references to itself (its advance strategy is a bound method or a closure over the
        fleet), so that a fleet nobody references any more is freed at once by reference counting. Without it
        the whole fleet (cores, every request's engine state, KV pools: ~200k objects after the Azure trace)
        is a reference cycle left to the cyclic garbage collector, whose first pass then cost ~0.25 s. The
        fleet cannot advance after this (records and results stay valid). Raises nothing."""
        self._adv = None  # type: ignore[assignment]

    def finish(self, until_ms: float = inf) -> None:
        """Run everything submitted to completion (or until ``until_ms``: passes starting later are not run,
        later handoffs not made), then fill every record's token times. Requests still queued at the fleet
        with no worker ever becoming ready stay ``pending``."""
        self._events_to(until_ms)
        adv = self._adv
        for p in self.pools.values():
            for w in p.workers:
                for c in w.cores:
                    adv(c, until_ms)
        if self._draining:
            self._check_draining(until_ms)
        for p in self.pools.values():
            for w in p.workers:
                for c in w.cores:
                    c.finalize()

    # ================================================================== observations
    @property
    def completed(self) -> int:
        """Requests that finished (all their tokens emitted) so far."""
        pool = self.pools["decode" if self.disagg else "agg"]
        return sum(c.finished_total for w in pool.workers for c in w.cores)

    def take_finished(self) -> list[RequestRecord]:
        """Records that reached a terminal status (finished, failed, cancelled) since the last call, ordered by
        (finish_ms, submit order). Call :meth:`advance_until` first (cores advance lazily). ``token_times_ms``
        is filled only by :meth:`finish`; meanwhile a record's mean ITL is
        ``(finish_ms - first_token_ms) / (output_length - 1)``."""
        recs = self.records
        start = self._fin_scanned
        pend = self._pending_ids
        pend.extend(range(start, len(recs)))
        self._fin_scanned = len(recs)
        done: list[tuple[float, int]] = []
        keep: list[int] = []
        for i in pend:
            r = recs[i]
            if r.status != "pending":
                done.append((r.finish_ms if r.finish_ms is not None else -inf, i))
            else:
                keep.append(i)
        self._pending_ids = keep
        done.sort()
        return [recs[i] for _, i in done]

    def take_fpm(self) -> list[tuple[str, ForwardPassMetrics]]:
        """(pool, ForwardPassMetrics) of every pass run since the last call, ordered by (pass end time, pool,
        worker_id, dp_rank). Needs ``collect_fpm=True`` (else always empty). Passes are run lazily: call
        :meth:`advance_until` first to include every pass up to now."""
        out: list[tuple[float, str, int, int, int, ForwardPassMetrics]] = []
        for name, p in self.pools.items():
            for w in p.workers:
                for c in w.cores:
                    key = id(c)
                    start = self._fpm_taken.get(key, 0)
                    fpm = c.fpm
                    for k in range(start, len(fpm)):
                        f = fpm[k]
                        out.append((f.timestamp_ms, name, w.worker_id, c.dp_rank, k, f))
                    self._fpm_taken[key] = len(fpm)
        out.sort(key=lambda x: x[:5])
        return [(x[1], x[5]) for x in out]

    def pool_counts(self, pool: str) -> PoolCounts:
        """Worker counts and fleet-queue length of ``pool`` now."""
        p = self._pool(pool)
        starting = sum(1 for w in p.workers if w.state == "starting")
        draining = sum(1 for w in p.workers if w.state == "draining")
        return PoolCounts(requested=starting + len(p.ready), ready=len(p.ready), draining=draining,
                          queued_at_fleet=len(p.queue))

    def engine_states(self, pool: str) -> list[EngineState]:
        """Per DP rank of each ready worker (readiness order): queue, batch and KV usage as of the last time
        the core was advanced (call :meth:`advance_until` first for current values)."""
        p = self._pool(pool)
        return [EngineState(pool, w.worker_id, c.dp_rank, c.num_waiting, c.num_running,
                            c.active_blocks() / c.cfg.num_gpu_blocks) for w in p.ready for c in w.cores]

    def gpu_seconds(self, now_ms: float, gpus_per_worker: dict[str, int] | None = None) -> dict[str, float]:
        """GPU-seconds per pool up to ``now_ms``: every worker from its request until its release (or now),
        times its GPUs (default: ``dp_size`` of the pool's engine)."""
        out: dict[str, float] = {}
        for name, p in self.pools.items():
            g = (gpus_per_worker or {}).get(name, p.cfg.dp_size)
            total = 0.0
            for w in p.workers:
                end = w.released_ms if w.released_ms is not None and w.released_ms <= now_ms else now_ms
                if end > w.requested_ms:
                    total += end - w.requested_ms
            out[name] = total / 1000.0 * g
        return out

    def worker_ids(self, pool: str, state: str | None = None) -> list[int]:
        """Ids of the pool's workers (optionally only those in ``state``: starting|ready|draining|released)."""
        return [w.worker_id for w in self._pool(pool).workers if state is None or w.state == state]

    def cores(self, pool: str) -> list[Any]:
        """Every engine core (all ranks, all workers ever added) of ``pool``, in worker order."""
        return [c for w in self._pool(pool).workers for c in w.cores]


# ====================================================================== fixed-fleet replay
@settings
class FleetConfig:
    """Fleet settings of :func:`run_replay`, validated at construction (pydantic's ``ValidationError`` when
    constructed directly; :func:`dynoplan.settings.check` / ``build`` give ConfigError listing every problem).

    Disaggregated when ``num_prefill_workers`` and ``num_decode_workers`` are both > 0 (then
    ``num_workers`` is ignored)."""

    num_workers: int = Field(1, gt=0, description="Aggregated workers (each dp_size engine cores).")
    router: Literal["round_robin", "least_loaded", "kv"] = Field(
        "round_robin", description="Router of every pool (mocker.routers.ROUTERS).")
    arrival_speedup: float = Field(1.0, gt=0, description="Arrival times are divided by this (dimensionless, finite, > 0).")
    max_time_ms: float | None = Field(
        None, gt=0, description="Stop at this virtual time (ms): passes starting later are not run; unfinished "
                                "requests stay pending. None = run to completion.")
    single_step: bool = Field(False, description="Disable fast-forward (one pass at a time; for equivalence tests).")
    seed: int = Field(0, description="Seed of the router's tie-breaking generator.")
    num_prefill_workers: int = Field(0, ge=0, description="Prefill workers of a disaggregated fleet.")
    num_decode_workers: int = Field(0, ge=0, description="Decode workers of a disaggregated fleet.")
    transfer: KvTransferConfig | None = Field(
        None, description="KV transfer between the pools (disaggregated only; None: no delay, coordinated handoff).")
    kv_events: bool = Field(
        False, description="The kv router reads workers' KV events (mocker.kv.events) instead of their caches.")
    kv_event_lag_ms: float = Field(0.0, ge=0, description="Delay before the router sees a KV event (ms, finite, >= 0).")

    def __post_init__(self) -> None:
        if (self.num_prefill_workers > 0) != (self.num_decode_workers > 0):
            raise Problems(f"num_prefill_workers={self.num_prefill_workers}, num_decode_workers="
                           f"{self.num_decode_workers}: a disaggregated fleet needs both > 0")

    @property
    def disaggregated(self) -> bool:
        return self.num_prefill_workers > 0 and self.num_decode_workers > 0


@dataclass
class ReplayResult:
    records: list[RequestRecord]
    """One per input request, in input order."""
    fpm: list[ForwardPassMetrics]
    """Per-pass metrics (empty unless collect_fpm=True), grouped by worker (prefill pool first), in time
    order per worker."""
    duration_ms: float
    """First arrival -> last finish (ms); 0 when nothing finished."""
    worker_seconds: float
    """Sum over workers of their lifetime (= workers * duration, s)."""
    num_workers: int
    engine: EngineConfig
    prefill_worker_seconds: float = 0.0
    """Disaggregated: prefill workers * duration (s); 0 for an aggregated fleet."""
    num_prefill_workers: int = 0
    num_decode_workers: int = 0
    kvbm: dict[str, int] | None = None
    """KVBM lower-tier counters (:meth:`Fleet.tier_stats`; extra report keys), None without lower tiers."""


def run_replay(requests: Sequence[TraceRequest], engine: EngineConfig, fleet: FleetConfig, *,
               progress: Callable[[int, int], None] | None = None,
               collect_fpm: bool = False) -> ReplayResult:
    """Replay ``requests`` through a fixed fleet: ``fleet.num_workers`` aggregated engines configured by
    ``engine``, or ``num_prefill_workers`` + ``num_decode_workers`` (``engine`` with ``worker_type``
    prefill / decode). Uses :class:`Fleet`'s lazy fast path (cores advanced only when an event concerns them).

    Raises ConfigError on an invalid configuration (e.g. an engine without a core).

    The cyclic garbage collector is paused while it runs (restored after, also on error): the replay builds
    long-lived objects (records, requests, heaps) but no cyclic garbage, so the collector's repeated scans
    of them were pure overhead (about 6% of the Azure disaggregated replay). The fleet is closed
    (:meth:`Fleet.close`) before returning, so reference counting frees it, and what the replay returns goes
    straight to the collector's oldest generation when the collector is re-enabled.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _run_replay(requests, engine, fleet, progress, collect_fpm)
    finally:
        if was_enabled:
            # What the replay leaves (records and their token-time lists: millions of references) is long-lived.
            # freeze + unfreeze moves every tracked object to the oldest generation without a scan, so
            # re-enabling does not start with a young-generation pass over all of it (~0.1 s on the Azure trace;
            # the collector would promote the survivors there anyway). Objects of the caller move with them:
            # they are still collected, by the next full collection.
            gc.freeze()
            gc.unfreeze()
            gc.enable()


def _run_replay(requests: Sequence[TraceRequest], engine: EngineConfig, fleet: FleetConfig,
                progress: Callable[[int, int], None] | None, collect_fpm: bool) -> ReplayResult:
    engine.validate()
    n = len(requests)
    if fleet.disaggregated:
        pools = {"prefill": engine.replace(worker_type="prefill"), "decode": engine.replace(worker_type="decode")}
        counts = {"prefill": fleet.num_prefill_workers, "decode": fleet.num_decode_workers}
    else:
        pools = {"agg": engine}
        counts = {"agg": fleet.num_workers}
    fl = Fleet(pools, router=fleet.router, transfer=fleet.transfer, seed=fleet.seed, collect_fpm=collect_fpm,
               single_step=fleet.single_step, kv_events=fleet.kv_events, kv_event_lag_ms=fleet.kv_event_lag_ms)
    stop = inf if fleet.max_time_ms is None else float(fleet.max_time_ms)
    speed = float(fleet.arrival_speedup)
    order = sorted(range(n), key=lambda i: (requests[i].arrival_ms, i))
    t0 = 0.0
    if order:
        a0 = requests[order[0]].arrival_ms
        t0 = min(0.0, a0 / speed if speed != 1.0 else float(a0))
    for name, k in counts.items():
        for _ in range(k):
            fl.add_worker(name, t0)
    records: list[RequestRecord | None] = [None] * n
    every = max(1, n // 100)
    submit = fl.submit
    for done, i in enumerate(order):
        req = requests[i]
        t = req.arrival_ms / speed if speed != 1.0 else float(req.arrival_ms)
        if t >= stop:
            break
        records[i] = submit(req, t)
        if progress is not None and done % every == 0:
            progress(fl.completed, n)
    fl.finish(stop)
    out: list[RequestRecord] = []
    for i, rec in enumerate(records):
        if rec is None:
            q = requests[i]
            rec = RequestRecord(request_id=q.request_id, arrival_ms=q.arrival_ms / speed, input_length=q.input_length,
                                output_length=q.output_length)
        out.append(rec)
    finishes = [r.finish_ms for r in out if r.finish_ms is not None and r.status == "finished"]
    first = min((r.arrival_ms for r in out), default=0.0)
    duration = (max(finishes) - first) if finishes else 0.0
    fpm: list[ForwardPassMetrics] = []
    if collect_fpm:
        for name in pools:
            for c in fl.cores(name):
                fpm.extend(c.fpm)
    if progress is not None:
        progress(fl.completed, n)
    nw = sum(counts.values())
    kvbm = fl.tier_stats()
    fl.close()
    return ReplayResult(records=out, fpm=fpm, duration_ms=duration, worker_seconds=nw * duration / 1000.0,
                        num_workers=nw, engine=engine,
                        prefill_worker_seconds=counts.get("prefill", 0) * duration / 1000.0,
                        num_prefill_workers=counts.get("prefill", 0), num_decode_workers=counts.get("decode", 0),
                        kvbm=kvbm)
