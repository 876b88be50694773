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

Beyond the reference (each rule can be switched off in :class:`~planner.core.config.PlannerConfig`):

- queueing headroom for prefill (:func:`prefill_utilisation_cap`): arrivals are random, so an engine run
  at 100 % prefill utilisation queues without bound. Modelling one engine's prefill as an M/D/1 queue
  (Poisson arrivals, service time ``S`` = TTFT of one prompt at the predicted ISL), the Pollaczek-Khinchine
  mean wait is ``Wq = rho x S / (2 (1 - rho))``; requiring ``Wq + S <= T`` (T = TTFT target) gives
  ``rho_max = 2 (T - S) / (2 (T - S) + S)``; the prefill requirement is divided by ``rho_max``. With the
  frontend's ISL histogram (``prefill_length_mix``, :func:`size_prefill_over_lengths`) the requirement is
  summed per length class and the queue is M/G/1 (``E[S^2]`` of the per-class prefill times): long-prompt
  traces (Mooncake: median 6.9k, p90 27k tokens) cost far more than their mean prompt, and their long
  services make everyone behind them wait.
- prefill interference in aggregated engines (:func:`size_agg_decode`): every prefill pass stalls the
  decode batch for ``P`` = prefill time of one prompt, so with per-engine arrival rate ``lambda`` a decode
  token's mean gap is ``itl_decode / (1 - lambda x P)`` (the share ``lambda x P`` of the engine's time goes
  to prefill), and its decode token throughput is that of the decode-only profile x ``(1 - lambda x P)``.
  Decode is therefore sized for the ITL budget ``itl_target x (1 - lambda x P)`` and the replicas divided
  by ``(1 - lambda x P)``, where ``lambda = rate / replicas`` depends on the answer (least fixed point).
- the ITL tail of aggregated engines (:func:`agg_itl_miss_share`, :func:`size_agg_itl_tail`): the SLA is on
  each request's *own* mean ITL, and the mean-ITL sizing above lets a short request that meets one or two
  prefill stalls miss it (a 20-token answer that waits behind one 40 ms prefill has a mean gap 2 ms
  higher). Model: prefills arrive at one engine as a Poisson stream of rate ``lambda``, each stalls the
  decode batch for ``P_i`` ms (the prefill time of its prompt, drawn from the input-length distribution),
  the stall-free gap is ``itl_d`` (decode profile at the engine's KV usage). A request with ``o`` output
  tokens (``g = o - 1`` gaps) misses the target ``T`` exactly when its stalls exceed its slack,
  ``P_1 + ... + P_K > (T - itl_d) g``; at that boundary it lives ``g T`` ms, so ``K ~ Poisson(lambda g T)``
  and ``P(miss | o)`` is a compound-Poisson tail (:class:`StallSums`), averaged over the output-length
  distribution. Lengths come from the frontend's ISL/OSL histograms when reported, else an exponential law
  with the predicted mean (the maximum-entropy law for a positive length of known mean, which errs toward
  more short answers). The pool needs the least ``n`` with miss share at ``rate / n`` within
  ``1 - sla_attainment_target``.
- the KV-cache tail of decode engines (:func:`decode_kv_tail_replicas`): the throughput point above may sit
  at a high KV usage whenever the profiled ITL there still meets the target (the default engine's decode
  ITL is 34 ms at 100 % usage), but a request arriving when the cache is full waits to be admitted, and
  in a disaggregated fleet that wait is part of its TTFT. Requests in decode at one engine form an
  M/G/infinity system, so their count is Poisson with mean ``x = lambda x E[D]`` (Little's law; ``D`` =
  OSL x ITL) and the tokens they hold are compound Poisson with mean ``x E[c]`` and variance ``x E[c^2]``
  (``c`` = ISL + mean OSL / 2 over the ISL histogram). Requiring the normal upper ``target`` quantile to fit,
  ``x E[c] + z sqrt(x E[c^2]) <= max_kv_tokens`` with ``z = Phi^-1(sla_attainment_target)``, bounds ``x``;
  the pool needs ``rate x E[D] / x_max`` engines, ``E[D]`` at the profile's ITL at the resulting mean usage.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
from scipy.optimize import brentq
from scipy.special import chdtri, erfc, gammaln, ndtri

from planner.core.config import PlannerConfig
from planner.core.interpolation import DecodeProfile, PerformanceProfile, PrefillProfile
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
                      decode: DecodeProfile, prefill: PrefillProfile | None = None) -> float:
    """actual / expected ITL, expected at the KV usage implied by the observed concurrency.

    ``prefill`` (aggregated engines only): the expected ITL includes the prefill interference of the
    observed arrivals, ``itl / (1 - lambda x P)`` (module docstring), so the factor does not count it twice.
    """
    vals = (observed_itl_ms, num_requests, observed_isl, observed_osl, request_duration_s)
    if not all(math.isfinite(v) for v in vals) or decode_replicas <= 0:
        return math.nan
    context = observed_isl + observed_osl / 2.0
    concurrency = num_requests / decode_replicas * request_duration_s / interval_s
    kv_usage = concurrency * context / decode.max_kv_tokens
    expected = decode.itl_ms_at(kv_usage, context)
    if prefill is not None:
        u = num_requests / interval_s / decode_replicas * prefill.ttft_ms_at(observed_isl) / 1000.0
        expected = expected / (1.0 - u) if u < 1.0 else math.nan
    return observed_itl_ms / expected if expected > 0 else math.nan


def prefill_utilisation_cap(service_ms: float, ttft_target_ms: float, second_moment_ms2: float | None = None) -> float:
    """Highest prefill utilisation of one engine keeping the M/G/1 mean TTFT within the target.

    Pollaczek-Khinchine: ``Wq = lambda E[S^2] / (2 (1 - rho)) = rho c / (2 (1 - rho))`` with
    ``c = E[S^2] / E[S]``; solving ``Wq + E[S] = T`` gives ``rho_max = 2 (T - m) / (2 (T - m) + c)``,
    ``m = service_ms`` (mean service), ``T = ttft_target_ms``, ``E[S^2] = second_moment_ms2`` (default
    ``m^2``: deterministic service, M/D/1, ``c = m``). Returns 1.0 (no cap) when ``m >= T`` (no fleet size
    can meet the target, so adding replicas for it would only grow without bound) or when an input is not
    finite and positive.
    """
    s, t = service_ms, ttft_target_ms
    if not (math.isfinite(s) and math.isfinite(t) and s > 0 and t > 0) or s >= t:
        return 1.0
    m2 = s * s if second_moment_ms2 is None or not math.isfinite(second_moment_ms2) else max(second_moment_ms2, s * s)
    return 2.0 * (t - s) / (2.0 * (t - s) + m2 / s)


def prefill_tail_utilisation_cap(service_ms: float, ttft_target_ms: float, allowed_miss: float,
                                 second_moment_ms2: float | None = None, work_ms: float | None = None) -> float:
    """Highest prefill utilisation of one engine at which the share of prompts waiting longer than the
    TTFT slack ``T - m`` stays within ``allowed_miss`` (the attainment target, not only the mean).

    ``service_ms`` = ``m``: mean TTFT of a prompt on an idle engine (its own prefill, which sets the slack);
    ``work_ms`` = ``m_w`` (default ``m``) and ``second_moment_ms2`` = ``E[S_w^2]`` (default ``m_w^2``): the
    moments of the queue's service, the prompt's token work without the per-pass fixed cost (under load the
    engine packs waiting prompts into full chunked-prefill passes, so the fixed cost is shared:
    :func:`service_moments`). The queue's utilisation is ``rho_w = rho x m_w / m``.

    M/G/1 waiting time, exponential approximation (Cramer-Lundberg form matched to the exact atom and mean):
    ``P(W > t) ~= rho_w x exp(-t / tau)`` with ``P(W > 0) = rho_w`` and ``E[W] = rho_w tau`` equal to the
    Pollaczek-Khinchine mean, so ``tau = E[S_w^2] / (2 m_w (1 - rho_w))``. The cap is the largest ``rho``
    with ``rho_w x exp(-(T - m) x 2 m_w (1 - rho_w) / E[S_w^2]) <= allowed_miss`` (the left side rises with
    ``rho_w``; ``scipy.optimize.brentq``), at most 1. Returns 1.0 when ``m >= T``, ``allowed_miss`` is not in
    (0, 1) or an input is not finite and positive (no cap, as :func:`prefill_utilisation_cap`).
    """
    s, t, eps = service_ms, ttft_target_ms, allowed_miss
    if not (math.isfinite(s) and math.isfinite(t) and s > 0 and t > 0) or s >= t or not (0.0 < eps < 1.0):
        return 1.0
    w = s if work_ms is None or not (math.isfinite(work_ms) and work_ms > 0) else min(work_ms, s)
    m2 = w * w if second_moment_ms2 is None or not math.isfinite(second_moment_ms2) else max(second_moment_ms2, w * w)
    k = (t - s) * 2.0 * w / m2
    # rho_w = eps gives eps x exp(-k (1 - eps)) < eps and rho_w = 1 gives 1 > eps: the root lies between
    rho_w = float(brentq(lambda r: r * math.exp(-k * (1.0 - r)) - eps, eps, 1.0, xtol=1e-9))
    return min(1.0, rho_w * s / w)


def service_moments(demand: Demand, p_corr: float, prefill: PrefillProfile) -> tuple[float, float, float]:
    """(E[S] ms, E[S_w] ms, E[S_w^2] ms^2) of one prompt's prefill time ``S = prefill.ttft_ms_at(isl) x
    min(1, p_corr)`` and of its token work ``S_w = max(S - a, 0)``, ``a = prefill.pass_overhead_ms x
    min(1, p_corr)`` (the per-pass fixed cost), over the input lengths of ``demand``
    (:func:`length_distribution` of its ISL histogram at the predicted mean; without a histogram, the mean
    ISL only)."""
    f = min(1.0, p_corr)
    a = prefill.pass_overhead_ms * f
    if not demand.isl_buckets:
        m = prefill.ttft_ms_at(demand.isl_tokens) * f
        mw = max(m - a, 0.0)
        return m, mw, mw * mw
    v, w = length_distribution(demand.isl_buckets, demand.isl_tokens)
    svc = prefill.ttft_ms_of(v) * f
    work = np.maximum(svc - a, 0.0)
    return float(w @ svc), float(w @ work), float(w @ (work * work))


def size_prefill_over_lengths(demand: Demand, interval_s: float, p_corr: float, prefill: PrefillProfile,
                              gpus_per_engine: int) -> tuple[float, float, float]:
    """Prefill replicas summed over the input-length distribution (``demand.isl_buckets``,
    :func:`length_distribution`), with the service-time moments for the M/G/1 cap.

    ``replicas = sum_b share_b x next_req x isl_b / I x min(1, p_corr) / thpt_per_gpu(isl_b) / gpus_per_engine``
    (the reference formula per length class: a long prompt costs its own throughput, not the mean's);
    service ``S_b = prefill.ttft_ms_at(isl_b) x min(1, p_corr)``. Returns (replicas, E[S] ms, E[S^2] ms^2).
    """
    v, w = length_distribution(demand.isl_buckets, demand.isl_tokens)
    f = min(1.0, p_corr)
    thpt = np.array([prefill.thpt_per_gpu_at(float(x)) for x in v])
    exact = float(np.sum(w * demand.num_requests * v / interval_s / thpt)) * f / gpus_per_engine
    svc = prefill.ttft_ms_of(v) * f
    return exact, float(w @ svc), float(w @ (svc * svc))


@dataclass(frozen=True)
class Demand:
    """Predicted demand for the next interval: request count, mean ISL/OSL (tokens), optional mix."""

    num_requests: float
    isl_tokens: float
    osl_tokens: float
    mix: tuple[LengthBucket, ...] = ()
    osl_buckets: tuple[tuple[float, float], ...] = ()
    """Observed output-length histogram, ``(le_tokens, count)`` non-cumulative (TrafficWindow.osl_buckets)."""
    isl_buckets: tuple[tuple[float, float], ...] = ()
    """Observed input-length histogram, same form (TrafficWindow.isl_buckets)."""

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
        exact = (demand.num_requests * demand.osl_tokens / interval_s / pt.thpt_per_gpu / gpus_per_engine
                 if pt.thpt_per_gpu > 0 else math.inf)  # no throughput at the only usable point: infeasible
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


def size_agg_decode(demand: Demand, interval_s: float, d_corr: float, itl_target_ms: float, decode: DecodeProfile,
                    prefill: PrefillProfile, gpus_per_engine: int, sizing: str = "mean",
                    percentile: float = 90.0, max_replicas: float = 1e6) -> PoolSizing:
    """Decode replicas of an aggregated pool, counting prefill interference (module docstring).

    ``f(n) = size_decode(itl_target x (1 - u)) / (1 - u)``, ``u = load / n`` with ``load = rate x P`` (engine-seconds of prefill
    per second) falls as ``n`` grows; the answer is the least ``n > load`` with ``f(n) <= n``, found by
    doubling then bisection (relative tolerance 1e-6). Capped at ``max_replicas`` when no ``n`` qualifies.
    """
    base = size_decode(demand, interval_s, d_corr, itl_target_ms, decode, gpus_per_engine, sizing, percentile)
    if demand.num_requests <= 0 or not math.isfinite(base.replicas_exact):
        return base
    load = demand.num_requests / interval_s * prefill.ttft_ms_at(demand.isl_tokens) / 1000.0

    def f(n: float) -> PoolSizing:
        u = load / n
        r = size_decode(demand, interval_s, d_corr, itl_target_ms * (1.0 - u), decode, gpus_per_engine, sizing,
                        percentile)
        # the engine decodes only a share 1 - u of the time: its token throughput shrinks by that share too
        return PoolSizing(r.replicas_exact / (1.0 - u), r.replicas, r.thpt_per_gpu * (1.0 - u), r.meets_itl)

    lo = max(base.replicas_exact, load)  # f(lo) > lo or lo == load: infeasible at or below lo
    hi = max(lo * 2.0, _EPS)
    res = f(hi)
    while res.replicas_exact > hi and hi < max_replicas:
        lo, hi = hi, hi * 2.0
        res = f(hi)
    if res.replicas_exact > hi:
        return PoolSizing(max_replicas, ceil_replicas(max_replicas), res.thpt_per_gpu, False)
    while hi - lo > 1e-6 * hi:
        mid = 0.5 * (lo + hi)
        r = f(mid)
        if r.replicas_exact <= mid:
            hi, res = mid, r
        else:
            lo = mid
    return PoolSizing(hi, ceil_replicas(hi), res.thpt_per_gpu, res.meets_itl)  # thpt: effective (x (1 - u))


TAIL_POINTS = 64
"""Equal-probability points of the exponential length law used when no histogram is reported."""
STALL_EXACT_K = 32
"""Stall sums of up to this many prefills are computed exactly on a lattice; more use the normal law."""
STALL_GRID = 128
"""Lattice steps per longest stall (stalls are rounded to the nearest lattice point)."""


def length_distribution(buckets: Sequence[tuple[float, float]], mean_tokens: float) -> tuple[np.ndarray, np.ndarray]:
    """(lengths in tokens, shares summing to 1) from a frontend histogram, or an exponential law.

    From ``buckets`` (``(le, count)``, non-cumulative): one point per non-empty bucket at the geometric middle
    of its bounds (``sqrt(lo x le)``, ``lo`` = the previous bound, at least 1; an ``inf`` bucket at ``2 lo``),
    all scaled so their weighted mean equals ``mean_tokens`` (the histogram gives the shape, the predictor
    the level, as the ``mix`` sizing does). Without a histogram: ``1 + (m - 1) x Exp(1)`` at the midpoints
    of :data:`TAIL_POINTS` equal-probability slices, ``m = max(1, mean_tokens)``.
    """
    m = max(1.0, float(mean_tokens))
    vals, wts = [], []
    lo = 1.0
    for le, n in buckets:
        if n > 0:
            hi = le if math.isfinite(le) else 2.0 * max(lo, 1.0)
            vals.append(math.sqrt(max(lo, 1.0) * max(hi, 1.0)))
            wts.append(float(n))
        lo = le
    if vals:
        v, w = np.array(vals), np.array(wts)
        w = w / w.sum()
        mean = float(w @ v)
        return (v * (m / mean) if mean > 0 else v), w
    q = (np.arange(TAIL_POINTS) + 0.5) / TAIL_POINTS
    return 1.0 + (m - 1.0) * -np.log1p(-q), np.full(TAIL_POINTS, 1.0 / TAIL_POINTS)


def osl_distribution(demand: Demand) -> tuple[np.ndarray, np.ndarray]:
    """Output lengths of the next interval's requests: :func:`length_distribution` of ``demand.osl_buckets``
    at the predicted mean OSL."""
    return length_distribution(demand.osl_buckets, demand.osl_tokens)


class StallSums:
    """Survival function of the total stall ``S_k = P_1 + ... + P_k`` of ``k`` independent prefills whose
    stall ``P`` (ms) takes ``stalls_ms[i]`` with share ``shares[i]``.

    ``k <= STALL_EXACT_K``: exact k-fold convolution on a lattice of step ``max(stalls) / STALL_GRID``, each
    stall rounded to the nearest lattice point (a sum is off by at most ``k / 2`` steps); larger ``k``: the
    normal law of the sum (mean ``k m``, variance ``k v``; central limit theorem).
    """

    def __init__(self, stalls_ms: np.ndarray, shares: np.ndarray) -> None:
        p = np.asarray(stalls_ms, dtype=float)
        w = np.asarray(shares, dtype=float)
        w = w / w.sum()
        self.mean_ms = float(w @ p)
        self.var_ms2 = float(w @ (p - self.mean_ms) ** 2)
        self.step_ms = max(float(p.max()), 1e-9) / STALL_GRID
        pmf = np.bincount(np.rint(p / self.step_ms).astype(int), weights=w, minlength=STALL_GRID + 1)
        width = STALL_EXACT_K * STALL_GRID + 1
        cdf = np.ones((STALL_EXACT_K + 1, width))  # cdf[k, j] = P(S_k <= j x step)
        cur = np.array([1.0])
        for k in range(1, STALL_EXACT_K + 1):
            cur = np.convolve(cur, pmf)
            c = np.minimum(np.cumsum(cur), 1.0)
            cdf[k, :c.size] = c[:width]
        self._cdf = cdf

    def sf(self, k: np.ndarray, slack_ms: float) -> np.ndarray:
        """``P(S_k > slack_ms)`` for each count in ``k`` (non-negative integers)."""
        k = np.asarray(k)
        if slack_ms < 0:
            return np.ones(k.shape)
        j = min(int(slack_ms / self.step_ms + 1e-9), self._cdf.shape[1] - 1)
        exact = 1.0 - self._cdf[np.minimum(k, STALL_EXACT_K), j]
        big = k > STALL_EXACT_K
        if not big.any():
            return exact
        kb = k[big].astype(float)
        if self.var_ms2 > 0:
            z = (slack_ms - kb * self.mean_ms) / np.sqrt(2.0 * kb * self.var_ms2)
            approx = 0.5 * erfc(z)
        else:
            approx = (kb * self.mean_ms > slack_ms).astype(float)
        out = exact.copy()
        out[big] = approx
        return out


def agg_itl_miss_share(rate_per_engine_s: float, decode_itl_ms: float, stalls: StallSums, itl_target_ms: float,
                       osl_tokens: np.ndarray, shares: np.ndarray) -> float:
    """Share of requests whose own mean ITL exceeds ``itl_target_ms`` on one aggregated engine (module docstring).

    ``rate_per_engine_s``: prefills (requests) per second reaching the engine; ``decode_itl_ms``: the
    stall-free decode gap; ``stalls``: the stall law of one prefill (:class:`StallSums`);
    ``osl_tokens``/``shares``: the output-length distribution. For ``o`` output tokens (``g = o - 1`` gaps)
    the count of stalls in its boundary life ``g x T`` is ``K ~ Poisson(rate x g x T)`` and it misses when
    ``S_K > (T - itl_d) x g``: ``sum_k Poisson(k) x stalls.sf(k, slack)`` (``k`` up to mean + 12 sd + 12).
    A request with one output token has no gap (never misses). Returns the share with a gap when
    ``decode_itl_ms >= itl_target_ms``.
    """
    t = itl_target_ms
    gaps = np.maximum(np.asarray(osl_tokens, dtype=float) - 1.0, 0.0)
    w = np.asarray(shares, dtype=float)
    w = w / w.sum()
    if decode_itl_ms >= t:
        return float(w[gaps > 0].sum())
    if rate_per_engine_s <= 0:
        return 0.0
    total = 0.0
    for g, wi in zip(gaps, w):
        if g <= 0 or wi <= 0:
            continue
        mu = rate_per_engine_s * g * t / 1000.0
        k = np.arange(int(math.ceil(mu + 12.0 * math.sqrt(mu) + 12.0)) + 1)
        pmf = np.exp(k * math.log(mu) - mu - gammaln(k + 1.0)) if mu > 0 else (k == 0).astype(float)
        total += wi * float(pmf @ stalls.sf(k, (t - decode_itl_ms) * g))
    return total


def agg_itl_miss_model(demand: Demand, interval_s: float, d_corr: float, itl_target_ms: float, decode: DecodeProfile,
                       prefill: PrefillProfile) -> Callable[[float], float] | None:
    """The predicted ITL miss share of an aggregated pool as a function of its replicas ``n`` for ``demand``
    (the model of :func:`size_agg_itl_tail`, whose docstring gives it); None when there is no demand or even
    an unloaded engine cannot meet the target (the rule does not apply)."""
    if demand.num_requests <= 0 or not demand.known:
        return None
    rate = demand.num_requests / interval_s
    isl, osl_mean = demand.isl_tokens, max(1.0, demand.osl_tokens)
    context = isl + osl_mean / 2.0
    corr = d_corr if math.isfinite(d_corr) and d_corr > 0 else 1.0
    if decode.itl_ms_at(0.0, context) * corr >= itl_target_ms:
        return None
    isl_v, isl_w = length_distribution(demand.isl_buckets, isl)
    stalls = StallSums(prefill.ttft_ms_of(isl_v), isl_w)
    osl, w = osl_distribution(demand)

    def miss(n: float) -> float:
        lam = rate / n
        usage = lam * osl_mean * itl_target_ms / 1000.0 * context / decode.max_kv_tokens
        return agg_itl_miss_share(lam, decode.itl_ms_at(usage, context) * corr, stalls, itl_target_ms, osl, w)

    return miss


def agg_itl_tail_calibration(miss: Callable[[float], float], replicas: float, observed_misses: float, finished: float,
                             max_factor: float = 2.0) -> float:
    """How much more capacity ``replicas`` engines showed than the ITL-tail model credits them with, from one
    window of observations: ``c >= 1`` with ``miss(replicas x c) = u``, where ``u`` is the exact one-sided 95 %
    Poisson upper bound of the observed miss share (``chi2.ppf(0.95, 2 (k + 1)) / 2 / finished`` for ``k``
    observed misses). 1.0 when the model predicts no more than ``u`` (it is not pessimistic here: the
    attainment headroom deals with the other direction) or there is nothing to judge; at most ``max_factor``.
    The sizing divides the model's requirement by ``c`` (:func:`size_pool`)."""
    if not (finished > 0 and replicas > 0 and math.isfinite(observed_misses)):
        return 1.0
    # chdtri(df, 0.05) = chi2.ppf(0.95, df) (scipy.special: no scipy.stats import, ~0.75 s, inside a tick)
    u = float(chdtri(2.0 * (max(observed_misses, 0.0) + 1.0), 0.05)) / 2.0 / finished
    if miss(replicas) <= u:
        return 1.0
    if miss(replicas * max_factor) > u:
        return max_factor
    return float(brentq(lambda c: miss(replicas * c) - u, 1.0, max_factor, xtol=1e-4))


def size_agg_itl_tail(demand: Demand, interval_s: float, d_corr: float, itl_target_ms: float, allowed_miss: float,
                      decode: DecodeProfile, prefill: PrefillProfile, max_replicas: float = 1e6) -> float:
    """Fractional aggregated replicas whose predicted ITL miss share (:func:`agg_itl_miss_share`) is at most
    ``allowed_miss`` for ``demand`` (module docstring).

    Per engine at ``n`` replicas: ``lambda = rate / n``; KV usage from Little's law at the boundary
    (``lambda x mean OSL x T`` requests of ``ISL + OSL/2`` tokens over ``max_kv_tokens``); stall-free gap
    ``decode.itl_ms_at(usage, ISL + OSL/2) x d_corr``; stalls ``prefill.ttft_ms_at(isl)`` over the input
    lengths (:func:`length_distribution` of ``demand.isl_buckets`` at the predicted mean ISL); output lengths
    by :func:`osl_distribution`. The miss share falls with ``n``: doubling then bisection (relative tolerance
    1e-4). Returns 0.0 (rule does not apply) when there is no demand or even an unloaded engine cannot meet
    the target, and ``max_replicas`` when no size up to it does.
    """
    miss = agg_itl_miss_model(demand, interval_s, d_corr, itl_target_ms, decode, prefill)
    if miss is None:
        return 0.0
    lo, hi = 0.0, 1.0
    while miss(hi) > allowed_miss:
        lo, hi = hi, hi * 2.0
        if hi >= max_replicas:
            return max_replicas if miss(max_replicas) > allowed_miss else _bisect(miss, lo, max_replicas, allowed_miss)
    return _bisect(miss, lo, hi, allowed_miss)


def decode_kv_tail_replicas(demand: Demand, interval_s: float, d_corr: float, decode: DecodeProfile,
                            allowed_miss: float) -> float:
    """Fractional decode engines whose KV cache holds the requests in decode at all but a share
    ``allowed_miss`` of the time (module docstring: M/G/infinity count, compound-Poisson tokens, normal
    upper quantile). Per engine the mean count may be at most
    ``x_max = ((-z sqrt(E[c^2]) + sqrt(z^2 E[c^2] + 4 E[c] K)) / (2 E[c]))^2`` (``K`` = ``max_kv_tokens``,
    ``z = Phi^-1(1 - allowed_miss)``, ``c`` = ISL + mean OSL / 2 in tokens over :func:`length_distribution`
    of the ISL histogram); the answer is ``rate x OSL x ITL / 1000 / x_max`` with ITL (ms) =
    ``decode.itl_ms_at(x_max E[c] / K, E[c]) x d_corr``. 0.0 when there is no demand or no target
    (``allowed_miss`` not in (0, 1)); units: ``interval_s`` seconds, lengths tokens."""
    if demand.num_requests <= 0 or not demand.known or not 0 < allowed_miss < 1:
        return 0.0
    osl = max(1.0, float(demand.osl_tokens))
    isl_v, isl_w = length_distribution(demand.isl_buckets, demand.isl_tokens)
    w = isl_w / isl_w.sum()
    ctx = isl_v + osl / 2.0
    m1, m2 = float(w @ ctx), float(w @ ctx ** 2)
    cap = float(decode.max_kv_tokens)
    z = max(0.0, float(ndtri(1.0 - allowed_miss)))
    root = (-z * math.sqrt(m2) + math.sqrt(z * z * m2 + 4.0 * m1 * cap)) / (2.0 * m1)
    x_max = root * root
    corr = d_corr if math.isfinite(d_corr) and d_corr > 0 else 1.0
    itl_ms = decode.itl_ms_at(min(1.0, x_max * m1 / cap), m1) * corr
    return demand.num_requests / interval_s * osl * itl_ms / 1000.0 / x_max


def _bisect(f: Callable[[float], float], lo: float, hi: float, target: float) -> float:
    """Least ``x`` in (lo, hi] with ``f(x) <= target`` for decreasing ``f`` (``f(hi) <= target``), to 1e-4 x hi."""
    while hi - lo > 1e-4 * hi:
        mid = 0.5 * (lo + hi)
        if f(mid) <= target:
            hi = mid
        else:
            lo = mid
    return hi


def size_pool(pool: str, demand: Demand, config: PlannerConfig, profile: PerformanceProfile, p_corr: float = 1.0,
              d_corr: float = 1.0, headroom: tuple[float, float] = (1.0, 1.0), itl_tail_calibration: float = 1.0) -> float:
    """Fractional replicas ``pool`` needs for ``demand`` over ``config.adjustment_interval_s``, with every
    sizing rule the config enables: prefill (x 1/``prefill_utilisation_cap`` when ``prefill_queueing``) for
    prefill/agg pools, decode (with prefill interference for agg when ``agg_prefill_interference``) for
    decode/agg pools (agg: at least :func:`size_agg_itl_tail` when ``agg_itl_tail`` and an SLA-attainment
    target are set; and at least :func:`decode_kv_tail_replicas` when ``decode_kv_tail`` and a target are
    set); the larger of the two for agg. ``headroom``: (TTFT, ITL) factors multiplying the
    prefill and decode parts. 0.0 when the profile lacks the halves the pool needs; ``max_gpu_budget //
    gpus_per_engine`` when no throughput meets the target."""
    cfg, interval = config, config.adjustment_interval_s
    g = cfg.limits(pool).gpus_per_engine
    parts = []
    if pool in ("prefill", "agg") and profile.prefill is not None:
        spread = cfg.prefill_length_mix and demand.isl_buckets and cfg.sizing == "mean" and demand.num_requests > 0
        if spread:
            x, service, second = size_prefill_over_lengths(demand, interval, p_corr, profile.prefill, g)
        else:
            x = size_prefill(demand, interval, p_corr, profile.prefill, g, cfg.sizing, cfg.sizing_percentile).replicas_exact
            service = profile.prefill.ttft_ms_at(demand.isl_tokens) * min(1.0, p_corr)
            second = service * service
        if cfg.prefill_queueing and demand.num_requests > 0:
            cap = prefill_utilisation_cap(service, cfg.ttft_ms, second)
            if cfg.prefill_ttft_tail and cfg.sla_attainment_target is not None:
                # the tail at the attainment target, with the service spread of the ISL histogram when reported
                m, mw, m2w = service_moments(demand, p_corr, profile.prefill)
                cap = min(cap, prefill_tail_utilisation_cap(m, cfg.ttft_ms, 1.0 - cfg.sla_attainment_target, m2w, mw))
            x /= cap
        parts.append(x * headroom[0])
    if pool in ("decode", "agg") and profile.decode is not None:
        if pool == "agg" and cfg.agg_prefill_interference and profile.prefill is not None:
            x = size_agg_decode(demand, interval, d_corr, cfg.itl_ms, profile.decode, profile.prefill, g,
                                cfg.sizing, cfg.sizing_percentile).replicas_exact
        else:
            x = size_decode(demand, interval, d_corr, cfg.itl_ms, profile.decode, g, cfg.sizing,
                            cfg.sizing_percentile).replicas_exact
        if (pool == "agg" and cfg.agg_itl_tail and cfg.sla_attainment_target is not None
                and profile.prefill is not None and math.isfinite(x)):
            x = max(x, size_agg_itl_tail(demand, interval, d_corr, cfg.itl_ms, 1.0 - cfg.sla_attainment_target,
                                         profile.decode, profile.prefill, float(cfg.max_gpu_budget // g))
                    / itl_tail_calibration)
        if cfg.decode_kv_tail and cfg.sla_attainment_target is not None and math.isfinite(x):
            x = max(x, decode_kv_tail_replicas(demand, interval, d_corr, profile.decode,
                                               1.0 - cfg.sla_attainment_target) / g)
        parts.append(x * headroom[1])
    x = max(parts) if parts else 0.0
    # infeasible (no throughput meets the target): everything the GPU budget allows, never "0 replicas"
    return x if math.isfinite(x) else float(cfg.max_gpu_budget // g)
