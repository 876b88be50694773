"""Virtual-time fleet: pools of workers (aggregated, or prefill + decode) replaying requests as fast as the
CPU allows, with workers added and removed while it runs.

Two entry points:

- :class:`Fleet` — the dynamic fleet a driver (the closed-loop simulation, ``planner/sim``) advances tick by
  tick: ``add_worker`` / ``remove_worker`` / ``submit`` / ``advance_until`` / ``finish``, plus the
  observations a planner reads (``take_fpm``, ``pool_counts``, ``engine_states``, ``gpu_seconds``).
- :func:`run_replay` — a fixed fleet replaying a whole trace (``dynoplan replay``, settings
  :class:`FleetConfig`); a thin wrapper over :class:`Fleet` using its lazy fast path.

Modules, one concern each: :mod:`~mocker.fleet.fleet` (the event loop, worker lifecycle, observations),
:mod:`~mocker.fleet.pools` (pools, workers, observation records), :mod:`~mocker.fleet.routing` (request
entry, dispatch, cancel, KV events for the router), :mod:`~mocker.fleet.handoff` (disaggregated prefill ->
decode handoff), :mod:`~mocker.fleet.replay` (fixed-fleet replay), :mod:`~mocker.fleet.config`
(:class:`FleetConfig`).
"""

from __future__ import annotations

from mocker.fleet.config import FleetConfig
from mocker.fleet.fleet import Fleet
from mocker.fleet.pools import POOLS_AGG, POOLS_DISAGG, EngineState, PoolCounts
from mocker.fleet.replay import ReplayResult, run_replay

__all__ = [
    "POOLS_AGG",
    "POOLS_DISAGG",
    "EngineState",
    "Fleet",
    "FleetConfig",
    "PoolCounts",
    "ReplayResult",
    "run_replay",
]
