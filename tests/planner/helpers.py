"""Shared builders for planner tests: a hand-computable profile and a tiny in-test fleet."""

from __future__ import annotations

import math

import numpy as np

from dynoplan.fpm import QueuedRequests, ScheduledRequests
from planner.core.interpolation import DecodeProfile, PerformanceProfile, PrefillProfile
from planner.core.observations import Observations, PassObservation, PoolState, TrafficWindow


def profile() -> PerformanceProfile:
    """Prefill: 8000 tok/s/GPU at ISL 2000. Decode: ITL = 10 + 40 x usage ms, thpt = 3000 x usage tok/s/GPU at
    any context, so at an ITL target of 30 ms the best point is usage 0.5 -> 1500 tok/s/GPU."""
    return PerformanceProfile(
        PrefillProfile([1000.0, 3000.0], [100.0, 300.0], [10000.0, 6000.0]),
        DecodeProfile(
            [0.0, 1.0],
            [100.0, 100000.0],
            [[10.0, 10.0], [50.0, 50.0]],
            [[0.0, 0.0], [3000.0, 3000.0]],
            max_kv_tokens=200000.0,
            resolution=201,
        ),
    )


def traffic(
    n: float, isl: float = 2000.0, osl: float = 150.0, ttft: float = math.nan, itl: float = math.nan
) -> TrafficWindow:
    return TrafficWindow(180.0, n, isl if n else math.nan, osl if n else math.nan, ttft, itl)


class Fleet:
    """Applies decisions instantly (or not) and reports spec/ready like a connector would."""

    def __init__(self, **spec: int) -> None:
        self.spec = dict(spec)
        self.ready = dict(spec)

    def obs(self, traffic: TrafficWindow | None = None, passes=(), **kw) -> Observations:
        return Observations(
            {p: PoolState(self.spec[p], self.ready[p]) for p in self.spec}, traffic, tuple(passes), **kw
        )

    def apply(self, decision, ready: bool = True) -> None:
        if decision.targets is not None:
            self.spec = dict(decision.targets)
            if ready:
                self.ready = dict(decision.targets)


def decode_pass(worker: int, kv: int, ts: float, wall: float | None = None, pool: str = "decode") -> PassObservation:
    """A decode pass whose wall time follows 4 ms + 2e-7 s/token unless given."""
    w = 0.004 + 2e-7 * kv if wall is None else wall
    n = 1 if kv else 0
    return PassObservation(
        worker,
        0,
        w,
        ScheduledRequests(num_decode_requests=n, sum_decode_kv_tokens=kv),
        QueuedRequests(),
        pool=pool,
        timestamp_s=ts,
    )


def idle_pass(worker: int, ts: float, pool: str = "decode") -> PassObservation:
    return PassObservation(worker, 0, 0.0, ScheduledRequests(), QueuedRequests(), pool=pool, timestamp_s=ts)


def training_passes(ts: float, pool: str = "decode", n: int = 20) -> list[PassObservation]:
    """Earlier passes of engine 0 over a range of sizes (so the regression is identified); an engine's
    state is its latest pass, so these do not change what the engines look like now."""
    kvs = np.linspace(1000, 400000, n).astype(int)
    return [decode_pass(0, int(k), ts - 1.0, pool=pool) for k in kvs]
