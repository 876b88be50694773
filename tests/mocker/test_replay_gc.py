"""run_replay pauses the cyclic garbage collector and restores the caller's setting, also on error."""

from __future__ import annotations

import gc

import pytest

from dynoplan.errors import ConfigError
from mocker.config import EngineConfig
from mocker.fleet import FleetConfig, run_replay
from mocker.records import TraceRequest

REQS = [TraceRequest(i, 10.0 * i, 100, 5, None) for i in range(5)]


@pytest.mark.parametrize("enabled", [True, False])
def test_gc_setting_restored(enabled):
    seen: list[bool] = []
    try:
        gc.enable() if enabled else gc.disable()
        res = run_replay(
            REQS, EngineConfig(), FleetConfig(num_workers=1), progress=lambda done, n: seen.append(gc.isenabled())
        )
        assert gc.isenabled() is enabled
    finally:
        gc.enable()
    assert seen and not any(seen)  # paused while replaying
    assert [r.status for r in res.records] == ["finished"] * 5


def test_gc_restored_after_error():
    bad = EngineConfig(engine="trtllm")  # valid settings the disaggregated fleet refuses (inside run_replay)
    with pytest.raises(ConfigError, match="TensorRT-LLM"):
        run_replay(REQS, bad, FleetConfig(num_prefill_workers=1, num_decode_workers=1))
    assert gc.isenabled()


@pytest.mark.parametrize(
    "fleet",
    [
        FleetConfig(num_workers=2),
        FleetConfig(num_prefill_workers=1, num_decode_workers=1),  # coordinated handoff
        FleetConfig(num_workers=2, single_step=True),
    ],
    ids=["agg", "disagg", "single_step"],
)
def test_replay_leaves_no_cyclic_garbage(fleet):
    """The fleet holds no reference cycle (its advance strategy is an int, not a bound method or a closure over
    itself), so reference counting frees the fleet, its cores and every request's engine state: nothing is
    left for the cyclic collector (which used to find ~200k objects after the Azure trace)."""
    gc.collect()
    try:
        gc.set_debug(gc.DEBUG_SAVEALL)  # keep what the collector finds, to name it in a failure
        res = run_replay(REQS, EngineConfig(), fleet)
        gc.collect()
        leaked = sorted({type(o).__name__ for o in gc.garbage})
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert leaked == []
    assert [r.status for r in res.records] == ["finished"] * 5
    assert all(len(r.token_times_ms) == 5 for r in res.records)  # the records outlive the fleet, filled in


def test_gc_counts_start_fresh_after_replay():
    """Re-enabling the collector does not start with a pass over the replay's survivors: they were moved to
    the oldest generation (freeze + unfreeze), so the young-generation count starts at zero."""
    try:
        gc.enable()
        run_replay(REQS, EngineConfig(), FleetConfig(num_workers=1))
        assert gc.isenabled()
        assert gc.get_count()[0] < 50  # only what was allocated since the replay returned
        assert gc.get_freeze_count() == 0  # nothing left frozen
    finally:
        gc.enable()
