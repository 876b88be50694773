"""Wall-clock driver: runs an engine core (which never reads a clock) in real time.

Where the speedup ratio is applied
----------------------------------
Exactly once, inside the core: ``EngineConfig.speedup_ratio`` divides every pass time (DESIGN.md timing
facts). The driver maps core milliseconds 1:1 onto wall milliseconds since the driver started, so a core
built with ``speedup_ratio=R`` streams tokens R times faster than the modelled GPU. Arrivals are stamped
with the wall clock on the same axis. Nothing else is scaled.

The loop (one per DP rank)::

    while the core has work:
        outcome = core.step(now)            # schedules one pass [now, outcome.end_ms]
        sleep until wall >= outcome.end_ms  # arrivals during the pass are added, and join the next step
        deliver outcome's tokens to the request streams, publish the pass's ForwardPassMetrics
        now = max(outcome.end_ms, latest arrival stamp)

``now`` follows the core's own schedule, not the wall time at wake-up: event-loop jitter then delays the
delivery of a token but never shifts the simulated timeline, so the engine-side latencies equal an
offline replay of the same arrivals. When the process falls behind (overload of the *process*, not of the
simulated engine), passes run back to back until the timeline catches up; ``lag_ms`` records how late
each delivery was.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Iterable, Protocol

from mocker.records import ForwardPassMetrics, RequestRecord, TraceRequest


class PassLike(Protocol):
    """What the driver reads from the core's step outcome."""

    end_ms: float


class EngineCore(Protocol):
    """The clock-free engine core contract (implemented by ``mocker.engine``)."""

    def add_request(self, req: TraceRequest, now_ms: float) -> RequestRecord: ...

    def cancel(self, request_id: int, now_ms: float) -> Any: ...

    def has_work(self) -> bool: ...

    def step(self, now_ms: float) -> Any: ...


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
    queue: "asyncio.Queue[Emission]"
    delivered: int = 0
    hash_ids: tuple[int, ...] | None = None
    token_times_ms: list[float] = field(default_factory=list)
    """Engine-timeline time of every token delivered (the core fills ``record.token_times_ms`` only when
    finalized, so the driver keeps them and copies them into the record at finish)."""


PassHook = Callable[[int, Any, list[RequestRecord], float], None]
"""Called after each pass: (dp_rank, outcome, records finished in this pass, lag_ms)."""


def outcome_emissions(outcome: Any) -> Iterable[int]:
    """Request ids that received one token at ``outcome.end_ms``."""
    em = getattr(outcome, "emitted", None)
    if em is None:
        em = getattr(outcome, "emissions", None)
    if em is None:
        em = getattr(outcome, "tokens", ())
    return [e if isinstance(e, int) else getattr(e, "request_id", e[0]) for e in em]


def outcome_finished(outcome: Any) -> Iterable[int]:
    return list(getattr(outcome, "finished", ()) or ())


def outcome_rejected(outcome: Any) -> Iterable[int]:
    """Requests the core refused (a prompt that can never fit in its KV cache)."""
    return list(getattr(outcome, "rejected", ()) or ())


def outcome_fpm(outcome: Any) -> ForwardPassMetrics | None:
    return getattr(outcome, "fpm", None)


class WallClock:
    """Milliseconds since construction on ``time.monotonic`` (the only clock the live path reads)."""

    def __init__(self) -> None:
        self._t0 = time.monotonic()

    def now_ms(self) -> float:
        return (time.monotonic() - self._t0) * 1000.0

    async def sleep_until(self, t_ms: float) -> None:
        d = t_ms - self.now_ms()
        if d > 0:
            await asyncio.sleep(d / 1000.0)


class RankDriver:
    """Drives one DP rank's core on ``clock``. Start with :meth:`start`; submit with :meth:`submit`."""

    def __init__(self, core: EngineCore, dp_rank: int, clock: WallClock, on_pass: PassHook | None = None) -> None:
        self.core = core
        self.dp_rank = dp_rank
        self.clock = clock
        self.on_pass = on_pass
        self.streams: dict[int, StreamState] = {}
        self._wake = asyncio.Event()
        self._core_ms = 0.0
        self._last_arrival_ms = 0.0
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

    @property
    def outstanding(self) -> int:
        """Requests submitted and not yet finished or cancelled."""
        return len(self.streams)

    def submit(self, req: TraceRequest) -> StreamState:
        """Add ``req`` now (its ``arrival_ms`` is replaced by the wall-clock stamp). Returns its stream."""
        t = max(self.clock.now_ms(), self._last_arrival_ms)
        self._last_arrival_ms = t
        stamped = TraceRequest(req.request_id, t, req.input_length, req.output_length, req.hash_ids)
        record = self.core.add_request(stamped, t)
        st = StreamState(record=record, queue=asyncio.Queue(), hash_ids=req.hash_ids)
        self.streams[req.request_id] = st
        self._wake.set()
        return st

    def cancel(self, request_id: int) -> None:
        """Cancel a request (client gone): the core frees its KV. Unknown or finished ids are ignored."""
        if self.streams.pop(request_id, None) is None:
            return
        t = max(self.clock.now_ms(), self._last_arrival_ms)
        self.core.cancel(request_id, t)

    # -------------------------------------------------------------- loop
    async def _run(self) -> None:
        while True:
            if not self.core.has_work():
                self._wake.clear()
                await self._wake.wait()
                continue
            now = max(self._core_ms, self._last_arrival_ms)
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
            for rid in [*outcome_finished(outcome), *outcome_rejected(outcome)]:
                st = self.streams.pop(rid, None)
                if st is not None:
                    if len(st.record.token_times_ms) < len(st.token_times_ms):
                        st.record.token_times_ms = st.token_times_ms
                    finished_records.append(st.record)
                    st.queue.put_nowait(Emission(end, st.delivered, finished=True, status=st.record.status))
            kept = getattr(self.core, "fpm", None)
            if isinstance(kept, list):
                kept.clear()  # the core appends every FPM when collecting; the live worker streams them instead
            fpm = outcome_fpm(outcome)
            if fpm is not None:
                self.latest_fpm = fpm
            if self.on_pass is not None:
                self.on_pass(self.dp_rank, outcome, finished_records, lag)
            if end <= now and not emitted and not finished_records:
                # a pass that made no progress: yield instead of spinning
                await asyncio.sleep(0.001)
            else:
                await asyncio.sleep(0)
