"""Engine cores: one simulated engine (one DP rank), driven by any clock.

Registry (plain dict, no import-time side effects): ``CORES = {"vllm": VllmCore, "trtllm": TrtllmCore,
"sglang": SglangCore}``. A core implements :class:`EngineCore`; :func:`make_engine` refuses an engine
without a registered core with a :class:`ConfigError`.

See :mod:`mocker.engine.vllm` for the per-pass API shared by the virtual-time fleet and the live worker.
"""

from __future__ import annotations

from typing import Protocol

from mocker.config import EngineConfig
from mocker.engine.sglang import SglangCore
from mocker.engine.vllm import PassOutcome, TrtllmCore, VllmCore
from mocker.errors import ConfigError
from mocker.records import RequestRecord, TraceRequest


class EngineCore(Protocol):
    """What drivers (virtual-time fleet, live worker) need from an engine core. Times in ms."""

    worker_id: int

    def add_request(self, req: TraceRequest, now_ms: float) -> RequestRecord: ...

    def cancel(self, request_id: int, now_ms: float) -> bool: ...

    def has_work(self) -> bool: ...

    def step(self, now_ms: float) -> PassOutcome: ...

    def advance_until(self, horizon_ms: float) -> None: ...


CORES: dict[str, type[VllmCore] | type[SglangCore]] = {"vllm": VllmCore, "trtllm": TrtllmCore, "sglang": SglangCore}


def make_engine(cfg: EngineConfig, *, worker_id: int = 0, dp_rank: int = 0, collect_fpm: bool = False) -> VllmCore | SglangCore:
    """Build the engine core for ``cfg.engine``. Raises ConfigError for an engine without a core yet."""
    cfg.validate()
    core = CORES.get(cfg.engine)
    if core is None:
        raise ConfigError(f"engine={cfg.engine!r}: no simulation core yet, expected one of {', '.join(sorted(CORES))}")
    return core(cfg, worker_id=worker_id, dp_rank=dp_rank, collect_fpm=collect_fpm)


__all__ = ["CORES", "EngineCore", "PassOutcome", "TrtllmCore", "VllmCore", "make_engine"]
