"""Wall-clock driver: runs an engine core (which never reads a clock) in real time.

Where the speedup ratio is applied
----------------------------------
Exactly once, inside the core: ``EngineConfig.speedup_ratio`` divides every pass time (docs/architecture.md
"Polynomial timing baseline"). The driver maps core milliseconds 1:1 onto wall milliseconds since the driver
started, so a core built with ``speedup_ratio=R`` streams tokens R times faster than the modelled GPU.
Arrivals are stamped with the wall clock on the same axis. Nothing else is scaled.

The loop (one per DP rank)::

    while the core has work:
        outcome = core.step(now)            # schedules one pass [now, outcome.end_ms]
        sleep until wall >= outcome.end_ms  # arrivals during the pass are added, and join the next step
        deliver outcome's tokens to the request streams, publish the pass's ForwardPassMetrics
        now = max(outcome.end_ms, latest arrival stamp)

``now`` follows the core's own schedule, not the wall time at wake-up, and an arrival stamped at wall
time ``t`` is handed to the core only when the core's timeline reaches ``t`` (the first pass starting at
or after ``t`` considers it, or an idle core starts a pass at ``t``) — the offline fleet's rule. Event-loop
jitter and process overload therefore delay the *delivery* of tokens but never change the simulated
timeline: the engine-side latencies equal an offline replay of the stamped arrivals. When the process
falls behind (overload of the *process*, not of the simulated engine), passes run back to back until the
timeline catches up; ``lag_ms`` records how late each delivery was.
"""

from __future__ import annotations

import asyncio
import collections
import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from dynoplan.fpm import ForwardPassMetrics
from mocker.engine.base import EngineCore, PassOutcome
from mocker.records import RequestRecord, TraceRequest

_log = logging.getLogger(__name__)


@dataclass(slots=True)
class Emission:
    """One event for a request stream: a token (``finished`` False) or the end of the request."""

    time_ms: float
    token_index: int
    finished: bool = False
    status: str = "finished"


@dataclass(slots=True)
class StreamState:
    record: RequestRecord
    queue: asyncio.Queue[Emission]
    delivered: int = 0
    hash_ids: tuple[int, ...] | None = None
    token_times_ms: list[float] = field(default_factory=list)
    """Engine-timeline time of every token delivered (the core fills ``record.token_times_ms`` only when
    finalized, so the driver keeps them and copies them into the record at finish)."""


PassHook = Callable[[int, PassOutcome, list[RequestRecord], float], None]
"""Called after each pass: (dp_rank, outcome, records finished in this pass, lag_ms)."""


def outcome_emissions(outcome: PassOutcome) -> list[int]:
    """Request ids that received one token at ``outcome.end_ms``."""
    return [rid for rid, _ in outcome.emissions]


COARSE_SLEEP_MARGIN_S = 0.002
""":func:`sleep_until_monotonic` sleeps on the event loop's timer until this long before the deadline, then
hands the rest to the waker thread."""


class _Waker:
    """One daemon thread resolving asyncio futures at ``time.monotonic`` deadlines.

    Why: the event loop's own timers wake late. asyncio rounds every selector timeout *up* to a whole
    millisecond (``EpollSelector.select``: ``math.ceil(timeout * 1e3)``, the ``epoll_wait`` unit), so an
    ``asyncio.sleep(0.0006)`` returns after >= 1 ms — measured here: median overshoot 0.55 ms for a 0.6 ms
    sleep, against 0.16 ms through this thread. At speedup 10 a pass lasts ~0.6 ms of wall time, and
    0.5 ms late is 5 simulated ms on every token and every load-generator send. The thread waits on a
    condition variable (sub-millisecond timed wait, GIL released) and wakes the loop through
    ``call_soon_threadsafe`` (its self-pipe: an fd event, which the selector reports at once)."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._heap: list[tuple[float, int, asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._seq = itertools.count()
        self._thread = threading.Thread(target=self._run, name="live-waker", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        cv, heap = self._cv, self._heap
        while True:
            with cv:
                while True:
                    if heap:
                        d = heap[0][0] - time.monotonic()
                        if d <= 0:
                            break
                        cv.wait(d)
                    else:
                        cv.wait()
                _, _, loop, fut = heapq.heappop(heap)
            try:
                loop.call_soon_threadsafe(_resolve, fut)
            except RuntimeError:  # that loop is closed: nobody waits any more
                pass

    def at(self, deadline_s: float, loop: asyncio.AbstractEventLoop) -> asyncio.Future[None]:
        fut: asyncio.Future[None] = loop.create_future()
        with self._cv:
            heapq.heappush(self._heap, (deadline_s, next(self._seq), loop, fut))
            if self._heap[0][3] is fut:  # a new earliest deadline: re-arm the wait
                self._cv.notify()
        return fut


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


_waker: _Waker | None = None
_waker_lock = threading.Lock()


async def sleep_until_monotonic(deadline_s: float) -> None:
    """Sleep until ``time.monotonic() >= deadline_s`` with sub-millisecond precision (see :class:`_Waker`):
    the loop's timer for all but the last :data:`COARSE_SLEEP_MARGIN_S`, then the waker thread. Returns at
    once for a past deadline. Cancellable."""
    global _waker
    d = deadline_s - time.monotonic()
    if d <= 0:
        return
    if d > COARSE_SLEEP_MARGIN_S:
        await asyncio.sleep(d - COARSE_SLEEP_MARGIN_S)
        if time.monotonic() >= deadline_s:
            return
    if _waker is None:
        with _waker_lock:
            if _waker is None:
                _waker = _Waker()
    await _waker.at(deadline_s, asyncio.get_running_loop())


class WallClock:
    """Milliseconds since construction on ``time.monotonic`` (the only clock the live path reads)."""

    def __init__(self) -> None:
        self._t0 = time.monotonic()

    def now_ms(self) -> float:
        return (time.monotonic() - self._t0) * 1000.0

    def from_monotonic(self, t_s: float) -> float:
        """This clock's ms for a ``time.monotonic()`` reading ``t_s``."""
        return (t_s - self._t0) * 1000.0

    async def sleep_until(self, t_ms: float) -> None:
        """Sleep until this clock reads ``t_ms`` (sub-millisecond precision: :func:`sleep_until_monotonic`)."""
        if t_ms > self.now_ms():
            await sleep_until_monotonic(self._t0 + t_ms / 1000.0)


class RankDriver:
    """Drives one DP rank's core on ``clock``. Start with :meth:`start`; submit with :meth:`submit`."""

    def __init__(
        self,
        core: EngineCore,
        dp_rank: int,
        clock: WallClock,
        on_pass: PassHook | None = None,
        batch_lag_ms: float = 2.0,
    ) -> None:
        self.core = core
        self.dp_rank = dp_rank
        self.clock = clock
        self.on_pass = on_pass
        self.hook_errors = 0
        """Passes whose ``on_pass`` hook raised (logged; the engine keeps running)."""
        self.streams: dict[int, StreamState] = {}
        self._wake = asyncio.Event()
        self.batch_lag_ms = batch_lag_ms
        """Delivery lag (wall ms) beyond which passes are batched between event-loop yields."""
        self._last_yield_ms = 0.0
        self._pending: collections.deque[TraceRequest] = collections.deque()
        self._prefilled: set[int] = set()
        """Pending request ids whose prompt KV was handed off by a prefill worker (disaggregated decode)."""
        self._core_ms = 0.0
        self._last_arrival_ms = 0.0
        self._pass_start_ms = 0.0
        """Start (core ms) of the pass in flight or last run: no stamp goes below it (see :meth:`submit`)."""
        self._task: asyncio.Task[None] | None = None
        self.passes = 0
        self.max_lag_ms = 0.0
        self.sum_lag_ms = 0.0
        self.latest_fpm: ForwardPassMetrics | None = None
        self.last_pass_wall_ms = 0.0

    # -------------------------------------------------------------- public
    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"rank-driver-{self.dp_rank}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    def has_work(self) -> bool:
        """Requests pending or in the core."""
        return bool(self._pending) or self.core.has_work()

    @property
    def outstanding(self) -> int:
        """Requests submitted and not yet finished or cancelled."""
        return len(self.streams)

    def submit(self, req: TraceRequest, prefilled: bool = False, arrival_ms: float | None = None) -> StreamState:
        """Queue ``req`` (its ``arrival_ms`` is replaced by the wall-clock stamp). Returns its stream.

        ``arrival_ms``: the stamp to use (this clock's ms) — the worker passes the time the HTTP request
        reached its handler, so time spent reading and parsing the body under load does not delay the
        arrival on the engine timeline; default: now. Stamps never go back (a stamp earlier than the
        previous one is raised to it), so arrivals reach the core in order; nor earlier than the start of
        the pass in flight (offline, such an arrival would have joined that pass; here it joins the next one,
        so it is stamped at the pass start), which keeps the live engine timeline equal to an offline replay
        of the stamped arrivals.

        The core receives it when its timeline reaches the stamp (see the module docstring). ``prefilled``:
        a disaggregated decode request whose prompt KV arrived from a prefill worker; it is admitted with the
        core's ``add_prefilled_request`` (prompt KV present, no prefill pass: the offline fleet's P/D rule,
        :mod:`mocker.fleet`).
        """
        t = max(
            self.clock.now_ms() if arrival_ms is None else float(arrival_ms), self._last_arrival_ms, self._pass_start_ms
        )
        self._last_arrival_ms = t
        stamped = TraceRequest(req.request_id, t, req.input_length, req.output_length, req.hash_ids)
        record = RequestRecord(
            request_id=req.request_id, arrival_ms=t, input_length=req.input_length, output_length=req.output_length
        )
        st = StreamState(record=record, queue=asyncio.Queue(), hash_ids=req.hash_ids)
        self.streams[req.request_id] = st
        if prefilled:
            self._prefilled.add(req.request_id)
        self._pending.append(stamped)
        self._wake.set()
        return st

    def cancel(self, request_id: int) -> None:
        """Cancel a request (client gone): the core frees its KV. Unknown or finished ids are ignored."""
        st = self.streams.pop(request_id, None)
        if st is None:
            return
        for i, r in enumerate(self._pending):
            if r.request_id == request_id:
                del self._pending[i]
                self._prefilled.discard(request_id)
                st.record.status = "cancelled"
                return
        self.core.cancel(request_id, max(self._core_ms, st.record.arrival_ms))

    def _admit_due(self, now: float) -> None:
        """Hand the core every pending arrival stamped at or before ``now``."""
        pend = self._pending
        while pend and pend[0].arrival_ms <= now:
            req = pend.popleft()
            st = self.streams.get(req.request_id)
            if req.request_id in self._prefilled:
                self._prefilled.discard(req.request_id)
                if st is not None:
                    st.record = self.core.add_prefilled_request(req, req.arrival_ms, st.record)
                continue
            if st is None:
                continue
            st.record = self.core.add_request(req, req.arrival_ms, st.record)

    # -------------------------------------------------------------- loop
    async def _run(self) -> None:
        while True:
            if not self.core.has_work():
                if not self._pending:
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                self._core_ms = max(self._core_ms, self._pending[0].arrival_ms)  # an idle core starts at the arrival
            now = self._core_ms
            self._admit_due(now)
            self._pass_start_ms = now
            outcome = self.core.step(now)
            end = float(outcome.end_ms)
            await self.clock.sleep_until(end)
            lag = max(0.0, self.clock.now_ms() - end)
            self.passes += 1
            self.sum_lag_ms += lag
            self.max_lag_ms = max(self.max_lag_ms, lag)
            self._core_ms = end
            self.last_pass_wall_ms = self.clock.now_ms()
            finished_records: list[RequestRecord] = []
            emitted = outcome_emissions(outcome)
            for rid in emitted:
                st = self.streams.get(rid)
                if st is not None:
                    st.token_times_ms.append(end)
                    st.queue.put_nowait(Emission(end, st.delivered))
                    st.delivered += 1
            done_ids = [rid for rid in [*outcome.finished, *outcome.rejected] if rid in self.streams]
            for rid in done_ids:
                st = self.streams[rid]
                if len(st.record.token_times_ms) < len(st.token_times_ms):
                    st.record.token_times_ms = st.token_times_ms
                finished_records.append(st.record)
            if done_ids or self.passes % 64 == 0:
                # the live worker streams FPMs and keeps records itself: the core forgets finished requests,
                # the pass end times no live request needs and its collected FPMs (memory stays bounded)
                self.core.release_finished()
            fpm = outcome.fpm
            if fpm is not None:
                self.latest_fpm = fpm
            if self.on_pass is not None:  # streams of this pass's finished requests are still registered here
                try:
                    self.on_pass(self.dp_rank, outcome, finished_records, lag)
                except Exception:  # a failing observer (metrics, FPM/KV publishing) must not stop the engine
                    self.hook_errors += 1
                    _log.exception("pass hook failed on dp_rank %d (engine keeps running)", self.dp_rank)
            for rid in done_ids:
                st = self.streams.pop(rid, None)
                if st is not None:
                    st.queue.put_nowait(Emission(end, st.delivered, finished=True, status=st.record.status))
            if end <= now and not emitted and not finished_records:
                # a pass that made no progress: yield instead of spinning
                await asyncio.sleep(0.001)
            elif lag < self.batch_lag_ms or self.clock.now_ms() - self._last_yield_ms >= self.batch_lag_ms:
                # on time: let the streams write each token now. Behind: run passes back to back for up to
                # batch_lag_ms before yielding, so each stream writes its queued tokens in one send
                # (fewer syscalls per token) and the process catches up instead of falling further behind.
                self._last_yield_ms = self.clock.now_ms()
                await asyncio.sleep(0)
