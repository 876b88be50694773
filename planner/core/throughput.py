"""The reference throughput sizing: replicas from predicted demand and the performance profile.

This is the closed-form sizing of the Dynamo Planner (docs/planner-core.md, "Closed-form sizing"), used by the
``throughput-only`` baseline, ``static:peak``, and the throughput loop when no engine model is given or
``simulated_sizing`` is off; the planner's own sizing simulates the engines (:mod:`planner.core.sizing`).
``I`` = adjustment interval (s):

- correction factors: ``p_corr = observed_ttft_ms / prefill.ttft_ms_at(observed_isl)``;
  ``d_corr = observed_itl_ms / decode.itl_ms_at(kv_usage, isl + osl/2)`` with
  ``kv_usage = concurrency x (isl + osl/2) / max_kv_tokens`` and
  ``concurrency = num_req / decode_replicas x request_duration_s / I`` (Little's law per engine).
  Beyond the reference, factors are clamped to [0.1, 10] and a non-finite one keeps the previous value.
- prefill: ``replicas = ceil(next_req x next_isl / I x min(1, p_corr) / thpt_per_gpu(isl) / gpus_per_engine)``
- decode: ``corrected_itl = itl_target / d_corr``; ``thpt = best decode thpt/GPU meeting corrected_itl
  at context isl + osl/2``; ``replicas = ceil(next_req x next_osl / I / thpt / gpus_per_engine)``.
- agg (one pool doing both): the larger of the prefill and decode requirements.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from planner.core.config import PlannerConfig
from planner.core.interpolation import DecodeProfile, PerformanceProfile, PrefillProfile

CORRECTION_MIN, CORRECTION_MAX = 0.1, 10.0
_EPS = 1e-9


def ceil_replicas(x: float) -> int:
    """ceil with a 1e-9 tolerance so that 2.0000000001 from float noise stays 2; NaN/neg -> 0."""
    if not math.isfinite(x) or x <= 0:
        return 0
    return int(math.ceil(x - _EPS))


def clamp_correction(value: float, previous: float) -> float:
    """A finite positive factor clamped to [0.1, 10]; otherwise ``previous``."""
    if not math.isfinite(value) or value <= 0:
        return previous
    return min(max(value, CORRECTION_MIN), CORRECTION_MAX)


def prefill_correction(observed_ttft_ms: float, observed_isl: float, prefill: PrefillProfile) -> float:
    """actual / expected TTFT (NaN when either is unknown)."""
    if not (math.isfinite(observed_ttft_ms) and math.isfinite(observed_isl)):
        return math.nan
    expected = prefill.ttft_ms_at(observed_isl)
    return observed_ttft_ms / expected if expected > 0 else math.nan


def decode_correction(
    observed_itl_ms: float,
    num_requests: float,
    observed_isl: float,
    observed_osl: float,
    request_duration_s: float,
    decode_replicas: int,
    interval_s: float,
    decode: DecodeProfile,
) -> float:
    """actual / expected ITL, expected at the KV usage implied by the observed concurrency."""
    vals = (observed_itl_ms, num_requests, observed_isl, observed_osl, request_duration_s)
    if not all(math.isfinite(v) for v in vals) or decode_replicas <= 0:
        return math.nan
    context = observed_isl + observed_osl / 2.0
    concurrency = num_requests / decode_replicas * request_duration_s / interval_s
    kv_usage = concurrency * context / decode.max_kv_tokens
    expected = decode.itl_ms_at(kv_usage, context)
    return observed_itl_ms / expected if expected > 0 else math.nan


@dataclass(frozen=True)
class Demand:
    """Predicted demand for the next interval: request count, mean ISL/OSL (tokens), the observed histograms."""

    num_requests: float
    isl_tokens: float
    osl_tokens: float
    osl_buckets: tuple[tuple[float, float], ...] = ()
    """Observed output-length histogram, ``(le_tokens, count)`` non-cumulative (TrafficWindow.osl_buckets)."""
    isl_buckets: tuple[tuple[float, float], ...] = ()
    """Observed input-length histogram, same form (TrafficWindow.isl_buckets)."""

    @property
    def known(self) -> bool:
        return math.isfinite(self.num_requests) and (
            self.num_requests <= 0 or (math.isfinite(self.isl_tokens) and math.isfinite(self.osl_tokens))
        )


@dataclass(frozen=True)
class PoolSizing:
    """Result of sizing one pool: fractional replicas (before ceil) and the integer requirement."""

    replicas_exact: float
    replicas: int
    thpt_per_gpu: float
    meets_itl: bool = True


def size_prefill(
    demand: Demand, interval_s: float, p_corr: float, prefill: PrefillProfile, gpus_per_engine: int
) -> PoolSizing:
    """Prefill replicas for ``demand`` (formula in the module docstring)."""
    if demand.num_requests <= 0:
        return PoolSizing(0.0, 0, math.nan)
    thpt = prefill.thpt_per_gpu_at(demand.isl_tokens)
    exact = demand.num_requests * demand.isl_tokens / interval_s * min(1.0, p_corr) / thpt / gpus_per_engine
    return PoolSizing(exact, ceil_replicas(exact), thpt)


def size_decode(
    demand: Demand, interval_s: float, d_corr: float, itl_target_ms: float, decode: DecodeProfile, gpus_per_engine: int
) -> PoolSizing:
    """Decode replicas for ``demand`` (formula in the module docstring)."""
    if demand.num_requests <= 0:
        return PoolSizing(0.0, 0, math.nan)
    corrected_itl = itl_target_ms / d_corr if d_corr > 0 else itl_target_ms
    pt = decode.best_thpt_per_gpu(corrected_itl, demand.isl_tokens + demand.osl_tokens / 2.0)
    exact = (
        demand.num_requests * demand.osl_tokens / interval_s / pt.thpt_per_gpu / gpus_per_engine
        if pt.thpt_per_gpu > 0
        else math.inf
    )  # no throughput at the only usable point: infeasible
    return PoolSizing(exact, ceil_replicas(exact), pt.thpt_per_gpu, pt.meets_itl)


def size_pool(
    pool: str,
    demand: Demand,
    config: PlannerConfig,
    profile: PerformanceProfile,
    p_corr: float = 1.0,
    d_corr: float = 1.0,
) -> float:
    """Fractional replicas ``pool`` needs for ``demand`` over ``config.adjustment_interval_s``: prefill for
    prefill/agg pools, decode for decode/agg pools, the larger of the two for agg. 0.0 when the profile lacks
    the halves the pool needs; ``max_gpu_budget // gpus_per_engine`` when no throughput meets the target."""
    cfg, interval = config, config.adjustment_interval_s
    g = cfg.limits(pool).gpus_per_engine
    parts = []
    if pool in ("prefill", "agg") and profile.prefill is not None:
        parts.append(size_prefill(demand, interval, p_corr, profile.prefill, g).replicas_exact)
    if pool in ("decode", "agg") and profile.decode is not None:
        parts.append(size_decode(demand, interval, d_corr, cfg.itl_ms, profile.decode, g).replicas_exact)
    x = max(parts) if parts else 0.0
    # infeasible (no throughput meets the target): everything the GPU budget allows, never "0 replicas"
    return x if math.isfinite(x) else float(cfg.max_gpu_budget // g)
