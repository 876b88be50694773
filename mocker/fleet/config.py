"""Settings of a fixed-fleet replay (:func:`mocker.fleet.run_replay`, ``dynoplan replay``)."""

from __future__ import annotations

from dataclasses import dataclass
from math import inf

from mocker.errors import ConfigError
from mocker.routers import ROUTERS
from mocker.transfer import KvTransferConfig


@dataclass(frozen=True)
class FleetConfig:
    """Fleet settings of :func:`run_replay`, validated at construction (ConfigError listing every problem).

    Disaggregated when ``num_prefill_workers`` and ``num_decode_workers`` are both > 0 (then
    ``num_workers`` is ignored)."""

    num_workers: int = 1
    """Aggregated workers (each ``dp_size`` engine cores)."""
    router: str = "round_robin"
    """round_robin | least_loaded | kv (every pool)"""
    arrival_speedup: float = 1.0
    """Arrival times are divided by this (dimensionless, > 0)."""
    max_time_ms: float | None = None
    """Stop at this virtual time (ms): passes starting later are not run; unfinished requests stay pending."""
    single_step: bool = False
    """Disable fast-forward (one pass at a time; for equivalence tests)."""
    seed: int = 0
    """Seed of the router's tie-breaking generator."""
    num_prefill_workers: int = 0
    """Prefill workers of a disaggregated fleet."""
    num_decode_workers: int = 0
    """Decode workers of a disaggregated fleet."""
    transfer: KvTransferConfig | None = None
    """KV transfer between the pools (disaggregated only; default: no delay, coordinated handoff)."""
    kv_events: bool = False
    """The kv router reads workers' KV events (:mod:`mocker.kv.events`) instead of their caches."""
    kv_event_lag_ms: float = 0.0
    """Delay (ms) before the router sees a KV event."""

    def __post_init__(self) -> None:
        p: list[str] = []
        if not isinstance(self.num_workers, int) or isinstance(self.num_workers, bool) or self.num_workers <= 0:
            p.append(f"num_workers={self.num_workers!r}: expected a positive integer")
        if self.router not in ROUTERS:
            p.append(f"router={self.router!r}: unknown router, expected one of {', '.join(ROUTERS)}")
        if not isinstance(self.arrival_speedup, (int, float)) or isinstance(self.arrival_speedup, bool) \
                or not self.arrival_speedup > 0 or self.arrival_speedup == inf:
            p.append(f"arrival_speedup={self.arrival_speedup!r}: expected a finite number > 0")
        if self.max_time_ms is not None and (not isinstance(self.max_time_ms, (int, float)) or not self.max_time_ms > 0):
            p.append(f"max_time_ms={self.max_time_ms!r}: expected a number > 0 or None")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            p.append(f"seed={self.seed!r}: expected an integer")
        for name in ("num_prefill_workers", "num_decode_workers"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                p.append(f"{name}={v!r}: expected an integer >= 0")
        if not p and (self.num_prefill_workers > 0) != (self.num_decode_workers > 0):
            p.append(f"num_prefill_workers={self.num_prefill_workers}, num_decode_workers={self.num_decode_workers}: "
                     "a disaggregated fleet needs both > 0")
        if p:
            raise ConfigError(p)

    @property
    def disaggregated(self) -> bool:
        return self.num_prefill_workers > 0 and self.num_decode_workers > 0


__all__ = ["FleetConfig"]
