"""The closed loop's fleet: ``mocker.fleet.Fleet`` (pooled, aggregated or disaggregated) behind the narrow API
the loop and policies use (``add_worker``, ``remove_worker``, ``submit``, ``advance_until``, ``finish``,
``take_fpm``, ``pool_counts``, ``gpu_seconds``, ``engine_states``, ``worker_spans``).

Worker life cycle (docs/architecture.md "Simulated connector"; implemented by ``mocker.fleet.Fleet``):

- ``add_worker(pool, now_ms, startup_delay_ms)``: the worker costs GPU time from ``now_ms`` and becomes
  routable at ``now_ms + startup_delay_ms`` (model load time);
- ``remove_worker``: a worker still starting is cancelled at once (released at ``now_ms``); a ready one
  stops receiving requests at once, finishes (drains) what it holds, and is released when its last pass
  ends;
- ``submit``: routes among ready workers; with no ready worker the request waits in the fleet queue and
  is dispatched, in arrival order, when a worker becomes ready.

GPU time of a worker = (released or now) - requested, times its GPUs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dynoplan.fpm import ForwardPassMetrics
from mocker.config import EngineConfig
from mocker.fleet import EngineState, PoolCounts
from mocker.records import RequestRecord, TraceRequest


class PooledFleet:
    """Adapter of ``mocker.fleet.Fleet`` (pooled, aggregated or disaggregated) to this module's API:
    :class:`mocker.fleet.EngineState` per DP rank of each ready worker and :class:`mocker.fleet.PoolCounts`
    (the fleet's own), ``take_fpm(max_per_worker)``, ``worker_spans()``."""

    def __init__(self, fleet: Any) -> None:
        self.fleet = fleet

    def add_worker(self, pool: str, now_ms: float, startup_delay_ms: float = 0.0) -> int:
        return int(self.fleet.add_worker(pool, now_ms, startup_delay_ms))

    def remove_worker(self, pool: str, now_ms: float, worker_id: int | None = None) -> int:
        return int(self.fleet.remove_worker(pool, now_ms, worker_id))

    def submit(self, req: TraceRequest, now_ms: float) -> RequestRecord:
        return self.fleet.submit(req, now_ms)

    def advance_until(self, t_ms: float) -> None:
        self.fleet.advance_until(t_ms)

    def finish(self) -> None:
        self.fleet.finish()

    def take_fpm(self, max_per_worker: int | None = None) -> list[tuple[str, ForwardPassMetrics]]:
        return list(self.fleet.take_fpm())

    def pool_counts(self, pool: str) -> PoolCounts:
        return self.fleet.pool_counts(pool)

    def engine_states(self, pool: str) -> list[EngineState]:
        return list(self.fleet.engine_states(pool))

    def gpu_seconds(self, now_ms: float, gpus_per_worker: Mapping[str, int] | None = None) -> dict[str, float]:
        return dict(self.fleet.gpu_seconds(now_ms, dict(gpus_per_worker or {}) or None))

    def worker_spans(self) -> list[tuple[str, int, float, float, float | None]]:
        out = []
        for name, p in self.fleet.pools.items():
            for w in p.workers:
                out.append((name, int(w.worker_id), float(w.requested_ms), float(w.ready_ms), w.released_ms))
        return out


def make_fleet(
    engines: Mapping[str, EngineConfig],
    *,
    router: str = "round_robin",
    seed: int = 0,
    collect_fpm: bool = False,
    single_step: bool = False,
    transfer: Any = None,
) -> PooledFleet:
    """The pooled fleet for ``engines`` ({"agg": cfg} or {"prefill": cfg, "decode": cfg}): ``mocker.fleet.Fleet``
    behind :class:`PooledFleet`. Raises the fleet's errors for a bad engine configuration or router."""
    from mocker.fleet import Fleet

    kw: dict[str, Any] = {"transfer": transfer} if transfer is not None else {}
    return PooledFleet(
        Fleet(dict(engines), router=router, seed=seed, collect_fpm=collect_fpm, single_step=single_step, **kw)
    )


__all__ = ["PooledFleet", "make_fleet"]
