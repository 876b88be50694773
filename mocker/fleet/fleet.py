"""The virtual-time fleet (:class:`Fleet`): pools of workers replaying requests as fast as the CPU allows,
with workers added and removed while it runs. Routing is :mod:`mocker.fleet.routing`, the disaggregated
handoff :mod:`mocker.fleet.handoff`, pools and workers :mod:`mocker.fleet.pools`.

Discrete-event loop. Fleet events live in a heap keyed ``(time_ms, seq)`` with ``seq`` from a per-Fleet
counter; time never goes back (asserted). Events (:class:`FleetEvent`): a starting worker becomes ready; a
prefill finishes (disaggregated: the decode worker is chosen, the KV transfer starts); a transfer ends (the
request joins the decode worker). Each worker is an independent engine core per DP rank
(:mod:`mocker.engine`), advanced lazily to the time of the next event that concerns it (only the chosen core
for round-robin; every core of the pool when the router needs their state). Inside a core, passes are events
too, fast-forwarded in stretches (``advance_until``); ``single_step=True`` runs one pass at a time instead
(identical records, tested).

``duration_ms`` = last finish - first arrival; ``worker_seconds`` = workers * duration (the reference's
``decode_worker_seconds``; disaggregated: ``prefill_worker_seconds`` + ``decode_worker_seconds``, each pool's
workers * duration).

Worker lifecycle (dynamic fleets): ``add_worker(pool, now, delay)`` -> *starting* (GPU time counts from
``now``) -> *ready* at ``now + delay`` (routable; requests that found no ready worker wait in a FIFO fleet
queue and are dispatched then) -> ``remove_worker`` -> *draining* (no new requests; finishes what it
holds, including coordinated-handoff holds) -> *released* when empty, at the end of its last pass (GPU time
stops). Removing a starting worker releases it at once.
"""

from __future__ import annotations

from heapq import heappop, heappush
from math import inf
from typing import Any, Final

from dynoplan.errors import ConfigError, SimulationError
from dynoplan.fpm import ForwardPassMetrics
from mocker.config import EngineConfig
from mocker.engine import make_engine
from mocker.engine.vllm import VllmCore
from mocker.fleet.pools import (
    EVENT_ACTIVATE,
    EVENT_PREFILL_DONE,
    EVENT_READY,
    POOLS_DISAGG,
    Core,
    EngineState,
    FleetEvent,
    FleetWorker,
    Pool,
    PoolCounts,
)
from mocker.fleet.routing import RoutingLayer
from mocker.kv.events import EventingKvManager, KvEventIndex
from mocker.kv.kvbm import EventingKvbmBlockManager
from mocker.kv.tiers import TierConfig, TierHierarchy
from mocker.records import RequestRecord
from mocker.routers import ROUTERS, KvRouter
from mocker.transfer import KvTransferConfig

# Advance strategies of Fleet._adv (ints, not callables: a stored bound method or closure over the fleet would
# make the fleet a reference cycle, left to the cyclic garbage collector)
ADV_CORE: Final = 0
ADV_LAZY: Final = 1
ADV_HANDOFF: Final = 2
ADV_SINGLE_STEP: Final = 3
ADV_TIERS: Final = 4
ADV_CLOSED: Final = 5


class Fleet(RoutingLayer):
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

    def __init__(
        self,
        engines: dict[str, EngineConfig],
        *,
        router: str = "round_robin",
        routers: dict[str, str] | None = None,
        transfer: KvTransferConfig | None = None,
        seed: int = 0,
        collect_fpm: bool = False,
        single_step: bool = False,
        kv_events: bool = False,
        kv_event_lag_ms: float = 0.0,
    ) -> None:
        routers = dict(routers or {})
        _check_fleet_args(engines, router, routers, transfer, seed, kv_events, kv_event_lag_ms)
        self.disagg = "prefill" in engines
        self.transfer = transfer if transfer is not None else KvTransferConfig()
        self.collect_fpm = collect_fpm
        self.single_step = single_step
        self.seed = seed
        self.pools: dict[str, Pool] = _build_pools(engines, router, routers, seed)
        self.entry = self.pools["prefill" if self.disagg else "agg"]
        self.kv_events = kv_events
        self._kv_index: dict[str, KvEventIndex] = {}
        if kv_events:
            for name, pool in self.pools.items():
                if isinstance(pool.router, KvRouter):
                    pool.router.index = self._kv_index[name] = KvEventIndex(kv_event_lag_ms)
        self._heap: list[tuple[float, int, FleetEvent, Any]] = []
        self._seq = 0
        self._clock = -inf
        self._draining: list[FleetWorker] = []
        self._where: list[Any] = []  # by internal request id: the agg core, or the Flight
        self.records: list[RequestRecord] = []
        """Every submitted request's record, in submit order."""
        self._fpm_taken: dict[int, int] = {}
        self._fin_scanned = 0
        self._pending_ids: list[int] = []
        self._init_handoff()
        self._adv_mode = self._advance_strategy()
        """How :meth:`_adv` advances a core (an ``ADV_*`` constant; :meth:`_advance_strategy`)."""
        self._tiers: TierHierarchy | None = None
        """KVBM lower tiers (G2 per core, shared G3/G4), shared by every core of the fleet; None = off."""
        self._tier_cores: list[VllmCore] = []
        if any(c.has_lower_tiers for c in engines.values()):
            self._init_tiers(engines)

    def _advance_strategy(self) -> int:
        """The cheapest correct way to advance a core: one pass at a time (``single_step``); tolerating
        handoff holds (coordinated disaggregation, :meth:`_advance_handoff`); skipping no-op calls
        (disaggregated, :meth:`_advance_lazy`); else the core's own ``advance_until``."""
        if self.single_step:
            return ADV_SINGLE_STEP
        if self._coordinated:
            return ADV_HANDOFF
        if self.disagg:
            return ADV_LAZY
        return ADV_CORE

    def _adv(self, c: Core, h: float) -> None:
        """Advance core ``c`` to ``h`` (every pass starting before it) the way :attr:`_adv_mode` says."""
        mode = self._adv_mode
        if mode == ADV_HANDOFF:
            self._advance_handoff(c, h)
        elif mode == ADV_LAZY:
            self._advance_lazy(c, h)
        elif mode == ADV_CORE:
            c.advance_until(h)
        elif mode == ADV_TIERS:
            self._tier_sync(h)
        elif mode == ADV_SINGLE_STEP:
            self._advance_guarded(c, h, c.advance_single_step)
        else:
            raise SimulationError(f"advance to {h} ms: the fleet is closed (Fleet.close)")

    def _init_tiers(self, engines: dict[str, EngineConfig]) -> None:
        """KVBM lower tiers on (aggregated fleets only; ConfigError otherwise): one hierarchy shared by every
        core, advanced in global time order (:meth:`_tier_sync`)."""
        if self.disagg:
            raise ConfigError(
                f"num_g2_blocks={engines['prefill'].num_g2_blocks}: KVBM lower tiers are wired into "
                "aggregated fleets only; expected no lower tiers with prefill/decode pools"
            )
        self._tiers = TierHierarchy(TierConfig.from_engine(engines["agg"]), 0)
        self._adv_mode = ADV_TIERS

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
        return {
            "kvbm_offloaded_blocks": h.offloaded_blocks,
            "kvbm_onboarded_blocks_g2": on["G2"],
            "kvbm_onboarded_blocks_g3": on["G3"],
            "kvbm_onboarded_blocks_g4": on["G4"],
            "kvbm_onboarded_tokens": (on["G2"] + on["G3"] + on["G4"]) * bs,
            "kvbm_onboard_requests": h.onboard_tickets,
            "kvbm_spilled_blocks_g3": h.spilled_blocks["G3"],
            "kvbm_spilled_blocks_g4": h.spilled_blocks["G4"],
        }

    # ================================================================== clock
    def _tick(self, t: float) -> None:
        if t < self._clock:
            raise SimulationError(f"fleet clock went back: {t} ms < {self._clock} ms")
        self._clock = t

    def _push(self, t: float, kind: FleetEvent, obj: Any) -> None:
        self._seq += 1
        heappush(self._heap, (t, self._seq, kind, obj))

    # ================================================================== workers
    def _pool(self, pool: str) -> Pool:
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
                c.kv = (EventingKvManager if cfg.g1_backend == "native" else EventingKvbmBlockManager)(
                    cfg.num_gpu_blocks, cfg.enable_prefix_caching
                )
        if self._tiers is not None:  # after any pool swap: the core's kvbm pool sends its evictions to G2
            for c in cores:
                assert isinstance(c, VllmCore)  # EngineConfig allows lower tiers with the vllm core only
                c.attach_tiers(self._tiers)
                c.tier_exact = self.single_step  # single_step: one pass at a time, exact offload times
                self._tier_cores.append(c)
        w = FleetWorker(pool, wid, cores, float(now_ms), float(now_ms) + float(startup_delay_ms))
        p.workers.append(w)
        p.by_id[wid] = w
        if startup_delay_ms == 0:
            self._make_ready(w, float(now_ms))
        else:
            self._push(w.ready_ms, EVENT_READY, w)
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
            named = p.by_id.get(worker_id)
            if named is None or named.state not in ("starting", "ready"):
                raise ConfigError(f"worker_id={worker_id!r}: not a starting or ready worker of pool {pool!r}")
            w = named
        if w.state == "ready":
            p.ready.remove(w)
            p.rebuild()
        w.state = "draining"
        w.drain_ms = float(now_ms)
        self._draining.append(w)
        self._check_draining(now_ms)
        return w.worker_id

    def _make_ready(self, w: FleetWorker, t: float) -> None:
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

    def _worker_idle(self, w: FleetWorker) -> bool:
        return (
            not w.holds
            and not w.inflight
            and not any(c.has_work() for c in w.cores)
            and not any(self._pending_res.get(id(c)) for c in w.cores)
        )

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
            if kind is EVENT_READY:
                if obj.state == "starting":
                    self._make_ready(obj, et)
            elif kind is EVENT_PREFILL_DONE:
                self._on_prefill_done(obj, et)
            elif kind is EVENT_ACTIVATE:
                self._activate(obj, et)
            else:
                self._on_reserve(obj, et)
        if self._draining:
            self._check_draining(t)

    def advance_until(self, t_ms: float) -> None:
        """Process fleet events (readiness, prefill ends and handoffs, releases) and advance every core of
        every live worker to ``t_ms`` (all passes starting before it), so observations are current."""
        self._events_to(t_ms)
        for p in self.pools.values():
            for w in p.ready:
                for c in w.cores:
                    self._adv(c, t_ms)

    def close(self) -> None:
        """Mark the fleet closed: it cannot advance after this (records and results stay valid; an advance
        raises SimulationError). Raises nothing."""
        self._adv_mode = ADV_CLOSED

    def finish(self, until_ms: float = inf) -> None:
        """Run everything submitted to completion (or until ``until_ms``: passes starting later are not run,
        later handoffs not made), then fill every record's token times. Requests still queued at the fleet
        with no worker ever becoming ready stay ``pending``."""
        self._events_to(until_ms)
        for p in self.pools.values():
            for w in p.workers:
                for c in w.cores:
                    self._adv(c, until_ms)
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
        return PoolCounts(
            requested=starting + len(p.ready), ready=len(p.ready), draining=draining, queued_at_fleet=len(p.queue)
        )

    def engine_states(self, pool: str) -> list[EngineState]:
        """Per DP rank of each ready worker (readiness order): queue, batch and KV usage as of the last time
        the core was advanced (call :meth:`advance_until` first for current values)."""
        p = self._pool(pool)
        return [
            EngineState(
                pool, w.worker_id, c.dp_rank, c.num_waiting, c.num_running, c.active_blocks() / c.cfg.num_gpu_blocks
            )
            for w in p.ready
            for c in w.cores
        ]

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


def _check_fleet_args(
    engines: dict[str, EngineConfig],
    router: str,
    routers: dict[str, str],
    transfer: KvTransferConfig | None,
    seed: int,
    kv_events: bool,
    kv_event_lag_ms: float,
) -> None:
    """Validate :class:`Fleet`'s arguments: one ConfigError listing every argument problem, then each engine
    config's own validation, then the disaggregated pools' compatibility (no TensorRT-LLM; the same KV layout
    on both pools)."""
    p: list[str] = []
    names = tuple(engines) if isinstance(engines, dict) else ()
    if set(names) not in ({"agg"}, {"prefill", "decode"}):
        p.append(f"engines={sorted(names)!r}: expected pools {{'agg'}} or {{'prefill', 'decode'}}")
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
        p.append("kv_events=true: needs the vLLM / TensorRT-LLM block manager (not the SGLang radix cache yet)")
    if transfer is not None and not isinstance(transfer, KvTransferConfig):
        p.append(f"transfer={transfer!r}: expected a KvTransferConfig")
    if p:
        raise ConfigError(p)
    if "prefill" in engines:
        for name in POOLS_DISAGG:
            if engines[name].engine == "trtllm":
                raise ConfigError(
                    f"engine=trtllm ({name} pool): disaggregated serving is not supported for "
                    "TensorRT-LLM (the reference rejects it too); use vllm"
                )
        fams = {name: engines[name].engine == "sglang" for name in POOLS_DISAGG}
        if fams["prefill"] != fams["decode"]:
            raise ConfigError(
                f"engines prefill={engines['prefill'].engine!r}, decode={engines['decode'].engine!r}: "
                "a disaggregated fleet needs the same KV layout on both pools (both sglang, or "
                "both vllm)"
            )


def _build_pools(engines: dict[str, EngineConfig], router: str, routers: dict[str, str], seed: int) -> dict[str, Pool]:
    """One :class:`Pool` per engine config, each with its router (``routers`` overrides ``router``) seeded
    with ``seed``; the decode pool's ``kv`` router gives no prefix-overlap credit and the prefill pool's does
    not track active blocks, as Dynamo's (``router_track_active_blocks = false``)."""
    pools: dict[str, Pool] = {}
    for name, cfg in engines.items():
        rname = routers.get(name, router)
        r = ROUTERS[rname](0, seed)
        if name == "decode" and rname == "kv":
            r.overlap_score_weight = 0.0  # Dynamo's decode router: no prefix-overlap credit
        if name == "prefill" and rname == "kv":
            r.track_active_blocks = False  # Dynamo's prefill router: router_track_active_blocks = false
        pools[name] = Pool(name, cfg, r)
    return pools


__all__ = ["Fleet"]
