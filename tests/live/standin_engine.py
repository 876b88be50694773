"""A trivial clock-free engine used only until the real core is wired: every pass admits all waiting
requests, costs ``pass_ms / speedup`` and gives every running request one token."""

from __future__ import annotations

from dataclasses import dataclass, field

from mocker.config import EngineConfig
from mocker.records import ForwardPassMetrics, QueuedRequests, RequestRecord, ScheduledRequests, TraceRequest


@dataclass
class Outcome:
    end_ms: float
    emitted: list[int]
    finished: list[int]
    fpm: ForwardPassMetrics


@dataclass
class StandinEngine:
    cfg: EngineConfig
    worker_id: int = 0
    dp_rank: int = 0
    pass_ms: float = 10.0
    waiting: list[RequestRecord] = field(default_factory=list)
    running: list[RequestRecord] = field(default_factory=list)
    cancelled: list[int] = field(default_factory=list)

    def add_request(self, req: TraceRequest, now_ms: float) -> RequestRecord:
        rec = RequestRecord(req.request_id, req.arrival_ms, req.input_length, req.output_length,
                            worker_id=self.worker_id, dp_rank=self.dp_rank)
        self.waiting.append(rec)
        return rec

    def cancel(self, request_id: int, now_ms: float) -> None:
        for q in (self.waiting, self.running):
            for r in q:
                if r.request_id == request_id:
                    q.remove(r)
                    r.status = "cancelled"
                    self.cancelled.append(request_id)
                    return

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def step(self, now_ms: float) -> Outcome:
        end = now_ms + self.pass_ms / self.cfg.speedup_ratio
        n_prefill = len(self.waiting)
        for r in self.waiting:
            r.admit_ms = now_ms
        self.running += self.waiting
        self.waiting = []
        emitted, finished = [], []
        for r in list(self.running):
            r.token_times_ms.append(end)
            if r.first_token_ms is None:
                r.first_token_ms = end
            emitted.append(r.request_id)
            if len(r.token_times_ms) >= r.output_length:
                r.finish_ms = end
                r.status = "finished"
                finished.append(r.request_id)
                self.running.remove(r)
        fpm = ForwardPassMetrics(self.worker_id, self.dp_rank, (end - now_ms) / 1000.0,
                                 ScheduledRequests(num_prefill_requests=n_prefill, num_decode_requests=len(emitted) - n_prefill),
                                 QueuedRequests(), timestamp_ms=end)
        return Outcome(end, emitted, finished, fpm)


def factory(pass_ms: float = 10.0):
    engines: list[StandinEngine] = []

    def make(cfg: EngineConfig, worker_id: int, dp_rank: int) -> StandinEngine:
        e = StandinEngine(cfg, worker_id, dp_rank, pass_ms)
        engines.append(e)
        return e

    make.engines = engines  # type: ignore[attr-defined]
    return make
