"""What a driver hands the planner each tick: plain frozen data, no behaviour.

- :class:`PassObservation`: one engine pass on one DP rank, the wire record :class:`dynoplan.fpm.ForwardPassMetrics`
  (Dynamo's field names, docs/architecture.md "Metrics facts"; ``wall_time`` in seconds, 0 = idle heartbeat)
  plus the ``pool`` the engine belongs to and the observer's receive time ``timestamp_s``.
  :meth:`PassObservation.from_mapping` validates any msgpack/JSON-shaped dict or attribute object.
- :class:`TrafficWindow`: frontend aggregates over the last throughput interval (Prometheus:
  increase(X_sum[w]) / increase(X_count[w])). ``mean_*`` are NaN when nothing was observed.
- :class:`PoolState`: replicas requested (spec) and ready for one pool.
- :class:`Observations`: one tick's input. ``None`` anywhere means *unknown* (the read failed), which the
  planner never treats as zero demand.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dynoplan.errors import ObservationError
from dynoplan.fpm import ForwardPassMetrics, convert_fpm


class PassObservation(ForwardPassMetrics, frozen=True, kw_only=True):
    """One engine pass as the planner observed it: the wire record (:class:`dynoplan.fpm.ForwardPassMetrics`,
    whose fields the core reads: ``wall_time`` seconds, 0.0 = idle heartbeat, skipped by the regressions)
    plus ``pool``, the pool the engine belongs to (the driver knows), and ``timestamp_s``, when the observer
    received it on the driver's clock (seconds; 0.0 = the tick time). ``timestamp_ms`` stays the producer's
    own stamp; the core reads ``timestamp_s`` only.

    Construction does not validate (it is the simulation's hot path); records from outside go through
    :meth:`from_mapping`, or :func:`dynoplan.fpm.decode_fpm` and then :meth:`of`."""

    pool: str
    """The pool of the engine that ran the pass (``prefill``, ``decode`` or ``agg``; passes of a pool the
    planner does not manage are ignored)."""
    timestamp_s: float = 0.0
    """When the observer received the pass, seconds on the driver's clock (0.0 = the tick time)."""

    @classmethod
    def of(cls, fpm: ForwardPassMetrics, *, pool: str, timestamp_s: float | None = None) -> PassObservation:
        """``fpm`` observed in ``pool`` at ``timestamp_s`` (seconds; default ``fpm.timestamp_ms / 1000``).
        Its parts are shared, not copied (they are frozen)."""
        return cls(
            fpm.worker_id,
            fpm.dp_rank,
            fpm.wall_time,
            fpm.scheduled_requests,
            fpm.queued_requests,
            fpm.timestamp_ms,
            pool=pool,
            timestamp_s=fpm.timestamp_ms / 1000.0 if timestamp_s is None else timestamp_s,
        )

    @classmethod
    def from_mapping(cls, obj: Any, *, pool: str, timestamp_s: float | None = None) -> PassObservation:
        """A mapping (msgpack/JSON-shaped) or any object with the Dynamo field names, validated by
        :func:`dynoplan.fpm.convert_fpm` (missing parts default to zero counts), then :meth:`of`. Raises
        :class:`ObservationError` naming the field, its value and what was expected
        (``ForwardPassMetrics.wall_time=-1: expected a number >= 0.0``)."""
        return cls.of(convert_fpm(obj), pool=pool, timestamp_s=timestamp_s)


@dataclass(frozen=True, slots=True)
class TrafficWindow:
    """Frontend aggregates over the ``duration_s`` ending at the tick.

    ``mean_*`` are NaN (not 0) when there were no requests; ``mean_request_duration_s`` is optional (used
    for the expected-ITL correction factor and the sample's warm-up; estimated as TTFT + OSL x ITL when absent).

    SLA buckets (optional, NaN = not reported): ``num_ttft_observed`` first tokens in the window, of which
    ``num_ttft_within_sla`` had TTFT <= the TTFT target (a histogram's ``le=target`` bucket);
    ``num_finished`` requests finished, of which ``num_itl_within_sla`` had their own mean ITL <= the ITL
    target (reported on the planner's metrics and dashboards).

    ``osl_buckets`` (optional): the output-length histogram of the requests finished in the window, as
    ``(le_tokens, count)`` pairs with increasing upper bounds and *non-cumulative* counts (the increase of
    each ``dynamo_frontend_output_sequence_tokens_bucket`` minus the previous bound's); the last bound may
    be ``inf``. Used by the sizing by simulation (the sample's output lengths). ``isl_buckets``: the
    same for the input lengths of the requests started in the window (``dynamo_frontend_input_sequence_tokens``);
    the sample's prompt lengths.

    ``gap_buckets`` (optional): the histogram of the gaps between consecutive arrivals in the window, as
    ``(le_s, count)`` pairs like the others (``dynoplan_frontend_request_interarrival_seconds``, bounds
    :data:`planner.core.sizing.GAP_BUCKETS_S`); ``num_inflight``: requests in flight at the end of the window
    (``dynamo_frontend_inflight_requests``; NaN = not reported). Both feed the traffic sample of the sizing by
    simulation (:mod:`planner.core.sizing`). ``arrival_counts`` (optional): requests started per consecutive
    :data:`planner.core.sizing.ARRIVAL_BIN_S` bin of the window, oldest first (the request counter's increase
    per scrape step), the window's rate profile.

    ``cached_prompt_share`` (optional, NaN = not reported): the share of the window's prompt tokens served from
    the prefix cache, ``increase(dynamo_frontend_cached_tokens_sum) / increase(dynamo_frontend_input_sequence_
    tokens_sum)`` (the frontend's per-request cached-token histogram, from the responses' ``usage.prompt_tokens_
    details.cached_tokens``), in [0, 1]. The traffic sample gives each request a shared prefix of this share of the
    mean prompt (:mod:`planner.core.sizing`), so that the what-if fleet sees the prefix-cache hits the live one has.
    """

    duration_s: float
    num_requests: float
    mean_isl_tokens: float = math.nan
    mean_osl_tokens: float = math.nan
    mean_ttft_ms: float = math.nan
    mean_itl_ms: float = math.nan
    mean_request_duration_s: float = math.nan
    num_ttft_observed: float = math.nan
    num_ttft_within_sla: float = math.nan
    num_finished: float = math.nan
    num_itl_within_sla: float = math.nan
    osl_buckets: tuple[tuple[float, float], ...] = ()
    isl_buckets: tuple[tuple[float, float], ...] = ()
    gap_buckets: tuple[tuple[float, float], ...] = ()
    num_inflight: float = math.nan
    arrival_counts: tuple[float, ...] = ()
    cached_prompt_share: float = math.nan

    def __post_init__(self) -> None:
        if not (math.isfinite(self.duration_s) and self.duration_s > 0):
            raise ObservationError(f"TrafficWindow.duration_s={self.duration_s!r}: expected seconds > 0")
        if not (math.isnan(self.num_inflight) or self.num_inflight >= 0):
            raise ObservationError(f"TrafficWindow.num_inflight={self.num_inflight!r}: expected a count >= 0 or NaN")
        if not (math.isnan(self.cached_prompt_share) or 0.0 <= self.cached_prompt_share <= 1.0):
            raise ObservationError(
                f"TrafficWindow.cached_prompt_share={self.cached_prompt_share!r}: expected a share in [0, 1] or NaN"
            )
        for name in ("osl_buckets", "isl_buckets", "gap_buckets"):
            prev = -1.0 if name == "gap_buckets" else 0.0  # gaps have an le=0 bucket (shared timestamps)
            for le, n in getattr(self, name):
                if not (le > prev and math.isfinite(n) and n >= 0):
                    raise ObservationError(
                        f"TrafficWindow.{name}: bucket ({le!r}, {n!r}): expected an upper bound "
                        f"> {prev!r} and a count >= 0"
                    )
                prev = le
        for total, ok in (("num_ttft_observed", "num_ttft_within_sla"), ("num_finished", "num_itl_within_sla")):
            t, k = getattr(self, total), getattr(self, ok)
            if not math.isnan(k) and not (k >= 0 and (math.isnan(t) or k <= t)):
                raise ObservationError(f"TrafficWindow.{ok}={k!r}: expected 0 <= value <= {total}={t!r}")

    def attainment(self) -> tuple[float, float]:
        """(TTFT, ITL) shares within the SLA in this window; NaN where not reported or nothing observed."""

        def share(ok: float, total: float) -> float:
            return ok / total if math.isfinite(ok) and math.isfinite(total) and total > 0 else math.nan

        return (
            share(self.num_ttft_within_sla, self.num_ttft_observed),
            share(self.num_itl_within_sla, self.num_finished),
        )

    @property
    def requests_per_second(self) -> float:
        return self.num_requests / self.duration_s if math.isfinite(self.num_requests) else math.nan


@dataclass(frozen=True, slots=True)
class PoolState:
    """One pool as the driver sees it: ``replicas`` requested in the deployment (spec),
    ``ready_replicas`` serving (``None`` = readiness unknown: the spec count is then taken as ready) and
    ``draining_replicas`` removed but still finishing their requests, holding their GPUs (counted by the GPU
    budget; a driver that cannot see them reports 0)."""

    replicas: int
    ready_replicas: int | None = None
    draining_replicas: int = 0

    def __post_init__(self) -> None:
        if not (isinstance(self.replicas, int) and self.replicas >= 0):
            raise ObservationError(f"PoolState.replicas={self.replicas!r}: expected an integer >= 0")
        if self.ready_replicas is not None and not (isinstance(self.ready_replicas, int) and self.ready_replicas >= 0):
            raise ObservationError(
                f"PoolState.ready_replicas={self.ready_replicas!r}: expected an integer >= 0 or None"
            )
        if not (isinstance(self.draining_replicas, int) and self.draining_replicas >= 0):
            raise ObservationError(f"PoolState.draining_replicas={self.draining_replicas!r}: expected an integer >= 0")


@dataclass(frozen=True, slots=True)
class Observations:
    """Everything observed since the previous tick.

    - ``pools``: pool name -> :class:`PoolState`; ``None`` = the deployment could not be read (hold).
    - ``traffic``: the last throughput interval's aggregates; ``None`` = unknown (read failed) — only
      consulted when the throughput loop is due.
    - ``passes``: the passes received since the previous tick (any order; may be empty).
      ``passes_ok=False`` = the FPM source failed (the load loop holds instead of seeing silence).
    - ``applied_decision_id``: the last decision id the connector reports as applied (VirtualConnector
      protocol), ``None`` when the connector applies synchronously and does not acknowledge.
    """

    pools: Mapping[str, PoolState] | None
    traffic: TrafficWindow | None = None
    passes: tuple[PassObservation, ...] = ()
    passes_ok: bool = True
    applied_decision_id: int | None = None
