"""Engine cores: one simulated engine (one DP rank), driven by any clock.

The contract every core implements and every driver relies on is in :mod:`mocker.engine.base`
(:class:`EngineCore`, :class:`PassOutcome`, :class:`CoreCapabilities`). Registry (plain dict, no import-time
side effects): ``CORES = {"vllm": VllmCore, "trtllm": TrtllmCore, "sglang": SglangCore}``; :func:`make_engine`
refuses an engine without a registered core with a :class:`ConfigError`.
"""

from __future__ import annotations

from dynoplan.errors import ConfigError
from mocker.config import EngineConfig
from mocker.engine.base import CoreCapabilities, EngineCore, PassOutcome
from mocker.engine.sglang import SglangCore
from mocker.engine.vllm import TrtllmCore, VllmCore

CORES: dict[str, type[VllmCore] | type[SglangCore]] = {"vllm": VllmCore, "trtllm": TrtllmCore, "sglang": SglangCore}


def make_engine(
    cfg: EngineConfig, *, worker_id: int = 0, dp_rank: int = 0, collect_fpm: bool = False
) -> VllmCore | SglangCore:
    """Build the engine core for ``cfg.engine``. Raises ConfigError for an engine without a core yet."""
    core = CORES.get(cfg.engine)
    if core is None:
        raise ConfigError(f"engine={cfg.engine!r}: no simulation core yet, expected one of {', '.join(sorted(CORES))}")
    return core(cfg, worker_id=worker_id, dp_rank=dp_rank, collect_fpm=collect_fpm)


__all__ = [
    "CORES",
    "CoreCapabilities",
    "EngineCore",
    "PassOutcome",
    "SglangCore",
    "TrtllmCore",
    "VllmCore",
    "make_engine",
]
