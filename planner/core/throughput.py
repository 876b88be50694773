"""Throughput-based sizing: replicas from predicted demand and the performance profile.

Formulas (Dynamo Planner design, DESIGN.md "Planner facts"), ``I`` = adjustment interval (s):

- correction factors: ``p_corr = observed_ttft_ms / prefill.ttft_ms_at(observed_isl)``;
  ``d_corr = observed_itl_ms / decode.itl_ms_at(kv_usage, isl + osl/2)`` with
  ``kv_usage = concurrency x (isl + osl/2) / max_kv_tokens`` and
  ``concurrency = num_req / decode_replicas x request_duration_s / I`` (Little's law per engine).
  Beyond the reference, factors are clamped to [0.1, 10] and a non-finite one keeps the previous value.
- prefill: ``replicas = ceil(next_req x next_isl / I x min(1, p_corr) / thpt_per_gpu(isl) / gpus_per_engine)``
- decode: ``corrected_itl = itl_target / d_corr``; ``thpt = best decode thpt/GPU meeting corrected_itl
  at context isl + osl/2``; ``replicas = ceil(next_req x next_osl / I / thpt / gpus_per_engine)``.
- agg (one pool doing both): the larger of the prefill and decode requirements.

Sizing modes (``config.sizing``): ``mean`` evaluates throughput/GPU at the mean ISL/OSL (reference);
``percentile`` evaluates it at the chosen percentile of the observed request mix (token volume still
next_req x mean); ``mix`` sums the GPU-seconds each bucket of the mix needs,
``sum_b share_b x next_req x len_b / I / thpt(len_b)``, with bucket lengths scaled so their mean equals
the predicted mean. With no mix observed, all modes reduce to ``mean``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from planner.core.interpolation import DecodeProfile, PrefillProfile
from planner.core.observations import LengthBucket

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


def decode_correction(observed_itl_ms: float, num_requests: float, observed_isl: float, observed_osl: float,
                      request_duration_s: float, decode_replicas: int, interval_s: float,
                      decode: DecodeProfile) -> float:
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
    """Predicted demand for the next interval: request count, mean ISL/OSL (tokens), optional mix."""

    num_requests: float
    isl_tokens: float
    osl_tokens: float
    mix: tuple[LengthBucket, ...] = ()

    @property
    def known(self) -> bool:
        return math.isfinite(self.num_requests) and (
            self.num_requests <= 0 or (math.isfinite(self.isl_tokens) and math.isfinite(self.osl_tokens)))


def weighted_percentile(values: Sequence[float], weights: Sequence[float], q: float) -> float:
    """Inverted-CDF weighted percentile (``q`` in 0..100) of ``values``."""
    v, w = np.asarray(values, dtype=float), np.asarray(weights, dtype=float)
    order = np.argsort(v, kind="stable")
    v, w = v[order], w[order]
    cdf = np.cumsum(w) / w.sum()
    i = int(np.searchsorted(cdf, q / 100.0 - 1e-12, side="left"))
    return float(v[min(i, v.size - 1)])


def _mix_arrays(demand: Demand) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    mix = [b for b in demand.mix if b.num_requests > 0 and math.isfinite(b.isl_tokens) and math.isfinite(b.osl_tokens)]
    if not mix:
        return None
    w = np.array([b.num_requests for b in mix], dtype=float)
    w = w / w.sum()
    isl = np.array([b.isl_tokens for b in mix], dtype=float)
    osl = np.array([b.osl_tokens for b in mix], dtype=float)
    # scale the observed shape to the predicted means
    mi, mo = float(w @ isl), float(w @ osl)
    if mi > 0 and math.isfinite(demand.isl_tokens):
        isl = isl * (demand.isl_tokens / mi)
    if mo > 0 and math.isfinite(demand.osl_tokens):
        osl = osl * (demand.osl_tokens / mo)
    return w, isl, osl


@dataclass(frozen=True)
class PoolSizing:
    """Result of sizing one pool: fractional replicas (before ceil) and the integer requirement."""

    replicas_exact: float
    replicas: int
    thpt_per_gpu: float
    """Throughput/GPU used (mean/percentile modes) or the effective one (mix mode)."""
    meets_itl: bool = True


def size_prefill(demand: Demand, interval_s: float, p_corr: float, prefill: PrefillProfile, gpus_per_engine: int,
                 sizing: str = "mean", percentile: float = 90.0) -> PoolSizing:
    """Prefill replicas for ``demand`` (formula in the module docstring)."""
    if demand.num_requests <= 0:
        return PoolSizing(0.0, 0, math.nan)
    factor = min(1.0, p_corr)
    mix = _mix_arrays(demand) if sizing != "mean" else None
    if mix is None:
        thpt = prefill.thpt_per_gpu_at(demand.isl_tokens)
        exact = demand.num_requests * demand.isl_tokens / interval_s * factor / thpt / gpus_per_engine
    elif sizing == "percentile":
        w, isl, _ = mix
        thpt = prefill.thpt_per_gpu_at(weighted_percentile(isl, w, percentile))
        exact = demand.num_requests * demand.isl_tokens / interval_s * factor / thpt / gpus_per_engine
    else:
        w, isl, _ = mix
        gpu_s = sum(float(wi) * demand.num_requests * li / interval_s / prefill.thpt_per_gpu_at(li)
                    for wi, li in zip(w, isl))
        exact = gpu_s * factor / gpus_per_engine
        thpt = demand.num_requests * demand.isl_tokens / interval_s / gpu_s if gpu_s > 0 else math.nan
    return PoolSizing(exact, ceil_replicas(exact), thpt)


def size_decode(demand: Demand, interval_s: float, d_corr: float, itl_target_ms: float, decode: DecodeProfile,
                gpus_per_engine: int, sizing: str = "mean", percentile: float = 90.0) -> PoolSizing:
    """Decode replicas for ``demand`` (formula in the module docstring)."""
    if demand.num_requests <= 0:
        return PoolSizing(0.0, 0, math.nan)
    corrected_itl = itl_target_ms / d_corr if d_corr > 0 else itl_target_ms
    mix = _mix_arrays(demand) if sizing != "mean" else None
    if mix is None or sizing == "percentile":
        if mix is None:
            context = demand.isl_tokens + demand.osl_tokens / 2.0
        else:
            w, isl, osl = mix
            context = weighted_percentile(isl + osl / 2.0, w, percentile)
        pt = decode.best_thpt_per_gpu(corrected_itl, context)
        exact = demand.num_requests * demand.osl_tokens / interval_s / pt.thpt_per_gpu / gpus_per_engine
        return PoolSizing(exact, ceil_replicas(exact), pt.thpt_per_gpu, pt.meets_itl)
    w, isl, osl = mix
    gpu_s, met = 0.0, True
    for wi, li, lo in zip(w, isl, osl):
        pt = decode.best_thpt_per_gpu(corrected_itl, li + lo / 2.0)
        met = met and pt.meets_itl
        gpu_s += float(wi) * demand.num_requests * lo / interval_s / pt.thpt_per_gpu
    exact = gpu_s / gpus_per_engine
    thpt = demand.num_requests * demand.osl_tokens / interval_s / gpu_s if gpu_s > 0 else math.nan
    return PoolSizing(exact, ceil_replicas(exact), thpt, met)
