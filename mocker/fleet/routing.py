"""Routing glue of a :class:`mocker.fleet.Fleet`: requests enter the entry pool (``agg`` or ``prefill``)
through its router (:mod:`mocker.routers`), wait in the fleet queue while no worker is ready, are cancelled
wherever they are, and the ``kv`` router's index is fed the workers' KV events (:mod:`mocker.kv.events`).

Semantics shared with the reference replay (Dynamo Mocker 1.6.1): an arrival joins the chosen core's waiting
queue and is considered at the first pass that starts at or after it (an idle core starts a pass at the
arrival). The router sees the cores of ready workers in readiness order; a router that reads core state
(``needs_state``) sees every core advanced to the arrival first, otherwise only the chosen core is advanced.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from typing import Any

from mocker.engine.sglang import SglangCore
from mocker.engine.vllm import VllmCore
from mocker.fleet.handoff import (
    PHASE_CANCELLED,
    PHASE_DECODE,
    PHASE_PREFILL,
    PHASE_QUEUED,
    PHASE_RESERVING,
    PHASE_TRANSFER,
    PHASE_WAIT_DECODE,
    Flight,
    HandoffLayer,
)
from mocker.fleet.pools import Core, Pool
from mocker.kv.events import EventingKvManager, KvEvent
from mocker.kv.kvbm import EventingKvbmBlockManager
from mocker.records import RequestRecord, TraceRequest


class RoutingLayer(HandoffLayer):
    """Request entry, dispatch and cancel of :class:`mocker.fleet.Fleet` (its base class; the fleet's
    attributes it reads are declared here, set by ``Fleet.__init__``)."""

    records: list[RequestRecord]
    _where: list[Any]
    _heap: list[Any]
    _draining: list[Any]
    _clock: float

    # ---------------------------------------------------------------- implemented by Fleet
    def _events_to(self, t: float) -> None:
        """Process fleet events up to ``t`` (``Fleet._events_to``)."""
        raise NotImplementedError

    def _check_draining(self, t: float) -> None:
        """Release the draining workers that hold nothing any more (``Fleet._check_draining``)."""
        raise NotImplementedError

    def submit(self, req: TraceRequest, now_ms: float) -> RequestRecord:
        """Route ``req`` arriving at ``now_ms`` among the ready workers of the entry pool (agg or prefill); with
        none ready it waits in the fleet queue (FIFO). Returns its record (``arrival_ms = now_ms``)."""
        if self._heap or self.disagg or self._draining or now_ms < self._clock:
            self._events_to(now_ms)
        else:
            self._clock = now_ms
        rec = RequestRecord(
            request_id=req.request_id, arrival_ms=now_ms, input_length=req.input_length, output_length=req.output_length
        )
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
            self._add_routed(p, c, ireq, now_ms, rec)
            self._where.append(c)
            if p.on_routed is not None:
                p.on_routed(rec)
            return rec
        if self.disagg:
            fl = Flight(rid, ireq, rec)
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
        if p.needs_state:
            for c in cores:
                self._adv(c, t)
            if self._kv_index:
                self._drain_kv_events(p, t)
        if self.disagg:
            fl: Flight = item
            q = fl.req
            preq = TraceRequest(q.request_id, q.arrival_ms, q.input_length, 1, q.hash_ids)
            c = cores[p.router.choose(preq, t, cores)]
            if not p.needs_state:
                self._adv(c, t)
            prec = RequestRecord(
                request_id=rid, arrival_ms=rec.arrival_ms, input_length=preq.input_length, output_length=1
            )
            fl.prec = prec
            fl.pcore = c
            fl.phase = PHASE_PREFILL
            self._add_routed(p, c, preq, t, prec)
            if self._coordinated:  # the prompt as the prefill core keeps it, for the source's hold (_take)
                if isinstance(c, SglangCore):
                    sr = c.requests.get(rid)
                    if sr is not None:
                        fl.pkeys = sr.content
                else:
                    er = c.requests.get(rid)
                    if er is not None:
                        fl.pkeys = er.block_keys
            rec.prefill_worker_id = c.worker_id
            p.by_id[c.worker_id].inflight.append(fl)
            if p.on_routed is not None:
                p.on_routed(prec)
            if t < self._pf_to:
                self._pf_to = t
        else:
            c = cores[p.router.choose(item, t, cores)]
            if not p.needs_state:
                self._adv(c, t)
            self._add_routed(p, c, item, t, rec)
            self._where[rid] = c
            if p.on_routed is not None:
                p.on_routed(rec)

    def _add_routed(self, p: Pool, c: Core, req: TraceRequest, t: float, rec: RequestRecord) -> None:
        """``c.add_request(req, t, rec)`` for the core ``c`` the pool's router chose, handing a vLLM core with
        prefix caching the prompt's keys when the router is the KV router (it computed them to choose:
        :meth:`KvRouter.prompt_keys`; the pool's one engine config, so they are what ``add_request`` would
        compute again), unless the prompt can never fit the core (rejected without keys: none are built)."""
        kr = p.kv_router
        if kr is not None and isinstance(c, VllmCore) and c.kv.caching and c.prompt_fits(req.input_length):
            c.add_request(req, t, rec, kr.prompt_keys())
        else:
            c.add_request(req, t, rec)

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
        fl: Flight = where
        if fl.phase is PHASE_QUEUED:
            self.entry.queue = deque(x for x in self.entry.queue if x[2] != rid)
            self._release_holds(fl, now_ms)  # SGLang: the destination's reservation
        elif fl.phase is PHASE_PREFILL:
            self._adv(fl.pcore, now_ms)
            fl.pcore.cancel(rid, now_ms)
            w = self.pools["prefill"].by_id[fl.pcore.worker_id]
            if fl in w.inflight:
                w.inflight.remove(fl)
            self._release_holds(fl, now_ms)  # SGLang: the destination's reservation
        elif fl.phase is PHASE_RESERVING:
            pass  # still waiting for its destination's reservation: skipped when its turn comes
        elif fl.phase is PHASE_WAIT_DECODE:
            self.pools["decode"].queue = deque(x for x in self.pools["decode"].queue if x is not fl)
        elif fl.phase is PHASE_TRANSFER:
            self._release_holds(fl, now_ms)
        elif fl.phase is PHASE_DECODE:
            self._adv(fl.dcore, now_ms)
            if not fl.dcore.cancel(rid, now_ms):
                return False
        else:
            return False
        fl.phase = PHASE_CANCELLED
        record.status = "cancelled"
        record.finish_ms = now_ms
        self._check_draining(now_ms)
        return True

    def _drain_kv_events(self, p: Pool, t: float) -> None:
        """Stamp the pool's new KV events at ``t`` (the cores were just advanced to it) and let the router's
        index catch up to ``t - lag``."""
        index = self._kv_index.get(p.name)
        if index is None:
            return
        for w in p.workers:
            for c in w.cores:
                kv = c.kv
                assert isinstance(kv, (EventingKvManager, EventingKvbmBlockManager))  # swapped in by add_worker
                ev = kv.events
                if ev:
                    index.publish([KvEvent(k, h, par, w.worker_id, c.dp_rank, t) for k, h, par in ev])
                    ev.clear()
        index.catch_up(t)


__all__ = ["RoutingLayer"]
