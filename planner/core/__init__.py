"""planner.core: the planner's pure decision logic (observations in, decision + diagnostics out).

No I/O inside a tick and no clock: every time is an argument (``now_s``, seconds on the driver's
clock, virtual in the closed-loop simulation, wall in the operator). Imports nothing from mocker, kopf
or kubernetes (import-linter contract).

Public API
----------
Configuration (:mod:`planner.core.config`)
    ``PlannerConfig(...)``, ``PoolLimits(min_replicas, max_replicas, gpus_per_engine)``,
    ``config_from_mapping(data) -> PlannerConfig``, ``load_config(path, overrides) -> PlannerConfig``,
    ``add_config_arguments(parser)``, ``config_from_args(args) -> PlannerConfig``
Observations (:mod:`planner.core.observations`)
    ``Observations(pools, traffic=None, passes=(), passes_ok=True, applied_decision_id=None)``,
    ``PoolState(replicas, ready_replicas=None)``, ``TrafficWindow(duration_s, num_requests, mean_isl_tokens,
    mean_osl_tokens, mean_ttft_ms, mean_itl_ms, mean_request_duration_s, ...)``,
    ``PassObservation(worker_id, dp_rank, wall_time, scheduled_requests, queued_requests, timestamp_ms, *,
    pool, timestamp_s)`` (+ ``.of(fpm, pool=...)``, ``.from_mapping(obj, pool=...)``): a
    :class:`dynoplan.fpm.ForwardPassMetrics` (with its ``ScheduledRequests``, ``QueuedRequests``) plus its pool
    and receive time
The planner (:mod:`planner.core.planner`)
    ``Planner(config, profile=None, warm_start=(), evaluator=None).tick(now_s, observations) -> TickResult``;
    ``TickResult(decision, diagnostics, next_tick_s)``; ``Decision(targets, decision_id, reason, reasons,
    pool_reasons)``; ``Diagnostics`` (``.to_dict()``); ``Reason`` (str Enum of machine-readable reasons)
Profiles (:mod:`planner.core.interpolation`)
    ``load_profile(path) -> PerformanceProfile`` (.npz or Dynamo profiler results dir), ``save_profile``,
    ``profile_from_arrays``, ``PrefillProfile``, ``DecodeProfile``, ``PerformanceProfile``
Warm start (:mod:`planner.core.traces`)
    ``bucket_intervals(arrival_s, isl_tokens, osl_tokens, interval_s) -> list[TrafficWindow]`` (the drivers
    read the trace file: :func:`planner.arguments.warm_start_windows`)
Metrics (:mod:`planner.core.metrics`)
    ``PlannerMetrics(registry, labels=None).update(tick_result)``
Sizing by simulation (:mod:`planner.core.sizing`)
    ``FleetEvaluator`` (protocol the drivers implement with the engine simulation, :mod:`planner.whatif`),
    ``TrafficSample``, ``build_sample``, ``SimulatedSizing``, ``verdict``, ``sample_size``
Loops (:mod:`planner.core.loops`)
    ``ThroughputLoop``, ``LoadLoop``, ``PendingGuard``
Building blocks (for tests and tools)
    predictors ``make_predictor(name, config)``; sizing ``size_prefill``, ``size_decode``; load
    ``PassTimeRegression``, ``estimate_ttft_ms``, ``estimate_itl_ms``; budget ``apply_limits``.

Errors: :mod:`dynoplan.errors` (``DynoplanError`` root; ``ConfigError``, ``ProfileError``, ``TraceError``,
``ObservationError``).
"""

from planner.core.config import (
    PlannerConfig,
    PoolLimits,
    add_config_arguments,
    config_from_args,
    config_from_mapping,
    load_config,
)
from planner.core.interpolation import (
    DecodeProfile,
    PerformanceProfile,
    PrefillProfile,
    load_profile,
    profile_from_arrays,
    save_profile,
)
from planner.core.observations import (
    Observations,
    PassObservation,
    PoolState,
    TrafficWindow,
)
from planner.core.planner import Decision, Diagnostics, Planner, TickResult
from planner.core.reasons import Reason
from planner.core.traces import bucket_intervals

__all__ = [
    "Decision",
    "DecodeProfile",
    "Diagnostics",
    "Observations",
    "PassObservation",
    "PerformanceProfile",
    "Planner",
    "PlannerConfig",
    "PoolLimits",
    "PoolState",
    "PrefillProfile",
    "Reason",
    "TickResult",
    "TrafficWindow",
    "add_config_arguments",
    "bucket_intervals",
    "config_from_args",
    "config_from_mapping",
    "load_config",
    "load_profile",
    "profile_from_arrays",
    "save_profile",
]
