"""run_replay pauses the cyclic garbage collector and restores the caller's setting, also on error."""

from __future__ import annotations

import gc

import pytest

from mocker.config import EngineConfig
from mocker.errors import ConfigError
from mocker.fleet import FleetConfig, run_replay
from mocker.records import TraceRequest

REQS = [TraceRequest(i, 10.0 * i, 100, 5, None) for i in range(5)]


@pytest.mark.parametrize("enabled", [True, False])
def test_gc_setting_restored(enabled):
    seen: list[bool] = []
    try:
        gc.enable() if enabled else gc.disable()
        res = run_replay(REQS, EngineConfig(), FleetConfig(num_workers=1),
                         progress=lambda done, n: seen.append(gc.isenabled()))
        assert gc.isenabled() is enabled
    finally:
        gc.enable()
    assert seen and not any(seen)  # paused while replaying
    assert [r.status for r in res.records] == ["finished"] * 5


def test_gc_restored_after_error():
    bad = EngineConfig(block_size=-1)
    with pytest.raises((ConfigError, ValueError)):
        run_replay(REQS, bad, FleetConfig(num_workers=1))
    assert gc.isenabled()
