"""Test helper: a core factory for the live worker that keeps the real engine cores it builds."""

from __future__ import annotations

from typing import Any

from mocker.config import EngineConfig
from mocker.engine import make_engine


def factory() -> Any:
    engines: list[Any] = []

    def make(cfg: EngineConfig, worker_id: int, dp_rank: int) -> Any:
        e = make_engine(cfg, worker_id=worker_id, dp_rank=dp_rank, collect_fpm=True)
        engines.append(e)
        return e

    make.engines = engines  # type: ignore[attr-defined]
    return make
