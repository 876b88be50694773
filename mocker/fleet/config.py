"""Settings of a fixed-fleet replay (:func:`mocker.fleet.run_replay`, ``dynoplan replay``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from pydantic import Field

from dynoplan.settings import Problems, settings
from mocker.config import EngineConfig
from mocker.traces import MAX_TRACE_TIMESTAMP_MS, time_limit_problem
from mocker.transfer import KvTransferConfig


@settings
class FleetConfig:
    """Fleet settings of :func:`run_replay`, validated at construction (pydantic's ``ValidationError`` when
    constructed directly; :func:`dynoplan.settings.check` / ``build`` give ConfigError listing every problem).

    Disaggregated when ``num_prefill_workers`` and ``num_decode_workers`` are both > 0 (then
    ``num_workers`` is ignored)."""

    num_workers: int = Field(default=1, gt=0, description="Aggregated workers (each dp_size engine cores).")
    router: Literal["round_robin", "least_loaded", "kv"] = Field(
        default="round_robin", description="Router of every pool (mocker.routers.ROUTERS)."
    )
    arrival_speedup: float = Field(
        default=1.0, gt=0, description="Arrival times are divided by this (dimensionless, finite, > 0)."
    )
    max_time_ms: float | None = Field(
        default=None,
        gt=0,
        description="Stop at this virtual time (ms): passes starting later are not run; unfinished "
        "requests stay pending. None = run to completion.",
    )
    single_step: bool = Field(
        default=False, description="Disable fast-forward (one pass at a time; for equivalence tests)."
    )
    seed: int = Field(default=0, description="Seed of the router's tie-breaking generator.")
    num_prefill_workers: int = Field(default=0, ge=0, description="Prefill workers of a disaggregated fleet.")
    num_decode_workers: int = Field(default=0, ge=0, description="Decode workers of a disaggregated fleet.")
    transfer: KvTransferConfig | None = Field(
        default=None,
        description="KV transfer between the pools (disaggregated only; None: no delay, coordinated handoff).",
    )
    kv_events: bool = Field(
        default=False, description="The kv router reads workers' KV events (mocker.kv.events) instead of their caches."
    )
    kv_event_lag_ms: float = Field(
        default=0.0, ge=0, description="Delay before the router sees a KV event (ms, finite, >= 0)."
    )

    def __post_init__(self) -> None:
        if (self.num_prefill_workers > 0) != (self.num_decode_workers > 0):
            raise Problems(
                f"num_prefill_workers={self.num_prefill_workers}, num_decode_workers="
                f"{self.num_decode_workers}: a disaggregated fleet needs both > 0"
            )

    @property
    def disaggregated(self) -> bool:
        return self.num_prefill_workers > 0 and self.num_decode_workers > 0


def run_end_problem(
    end_ms: float, engines: Iterable[EngineConfig], transfer: KvTransferConfig | None = None
) -> str | None:
    """Why a run whose last request finished at ``end_ms`` (simulated ms, from the trace start) cannot be
    reported -- one line naming the settings that stretch simulated time and their values -- or None when
    ``end_ms`` is within the simulator's limit (:data:`mocker.traces.MAX_TRACE_TIMESTAMP_MS`: past it
    float64 ms no longer resolve the nanosecond pass times, and at ~1e308 they overflow to inf).

    The limit on arrivals (:func:`mocker.traces.time_limit_problem`) is checked before a run; this is the
    check after it, of what the engine and the KV transfer made of them: a ``speedup_ratio`` of 1e-20
    divides every pass time by 1e-20, a ``bandwidth_gbps`` of 1e-300 makes each handoff ~1e300 ms. A NaN
    ``end_ms`` is a problem too. ``engines``: every pool's engine settings (``speedup_ratio`` and ``timing``
    are named when not the default); ``transfer``: the KV transfer of a disaggregated fleet, or None."""
    if end_ms <= MAX_TRACE_TIMESTAMP_MS:
        return None
    causes: list[str] = []
    for e in engines:
        for text in (
            f"speedup_ratio={e.speedup_ratio:g}" if e.speedup_ratio != 1.0 else "",
            f"timing={e.timing}" if e.timing != "polynomial" else "",
        ):
            if text and text not in causes:
                causes.append(text)
    if transfer is not None and transfer.enabled:
        causes.append(f"bandwidth_gbps={transfer.bandwidth_gbps:g}, kv_bytes_per_token={transfer.kv_bytes_per_token}")
    made = f" (with {', '.join(causes)})" if causes else " (the fleet served the trace that slowly)"
    return f"the last request finished at {end_ms / 1000.0:.4g} s of simulated time{made}, {time_limit_problem(end_ms)}"


__all__ = ["FleetConfig", "run_end_problem"]
