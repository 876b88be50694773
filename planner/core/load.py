"""Load-based estimates from ForwardPassMetrics: pass-time regressions, per-engine TTFT and ITL.

Regressions (docs/architecture.md "Planner facts"): pass wall time (s) is linear in the tokens the pass touches,

- prefill engines: ``wall_time = a + b x sum_prefill_tokens``
- decode engines:  ``wall_time = a + c x sum_decode_kv_tokens``
- agg engines:     ``wall_time = a + s x [sum_prefill_tokens > 0] + b x sum_prefill_tokens + c x sum_decode_kv_tokens``

The agg step ``s`` is the fixed cost of a pass that carries prefill work (a prefill pass's own intercept
is not a decode pass's: the mocker's prefill polynomial has 16.5 ms at zero tokens against ~5.7 ms for a
decode-only pass); without it the single intercept is a compromise that overstates the decode-only pass,
which the ITL estimate rests on, by ~40 % (synthetic 10 req/s, lognormal ISL: 8.1 vs 5.75 ms). It is
fitted only when both kinds of pass were seen and kept only when positive (else 0).

fitted by least squares (``numpy.linalg.lstsq``) over a bounded, bucketed sample: samples are filed
into ``n_buckets`` log2-spaced buckets of total tokens, each keeping its ``per_bucket`` most recent
samples, so memory is bounded and a long run of same-sized passes cannot crowd out the rest of the
range. With several features each feature has its own set of buckets, chosen by the first feature the
pass carries (agg: passes with prefill tokens, decode-only passes): otherwise the far more numerous
decode-only passes evict the few prefill-carrying passes of the same total size, and the prefill slope
rests on one or two samples (seen on Azure 1x: slope 3.6e-4 s/token, 18x the true one).
Idle heartbeats (``wall_time == 0``) are skipped. A slope that is not positive, or a feature that
never varied, is *degenerate*: estimates needing it are unknown (``None``), never "free", so a bad fit
cannot cause unbounded scale-up.

Estimates for one engine from its latest pass:

- TTFT of a new request of ``isl`` tokens: its prompt waits behind the queued prefill tokens ``Q``;
  ``Q + isl`` tokens are processed in passes of ``C = max_num_batched_tokens`` (minus one token per
  running decode request on agg engines): ``floor((Q+isl)/C)`` full passes plus one partial pass, each
  costing the regression's predicted wall time.
  When the fit is degenerate for this prediction (a slope it needs is unidentified: typically an engine
  saturated by a flood, whose passes are all full chunks, so prefill and decode tokens vary together), the
  TTFT is ``(Q + isl) / r`` with ``r`` the engine's measured prefill tokens per second of pass time (below):
  a saturated engine spends its time on those passes, so ``r`` is its prefill throughput; an engine that is
  not saturated also runs decode-only passes, which makes ``r`` low and the estimate high (the safe side).
  While the fit is still warming up (too few samples) the TTFT stays unknown.
- ITL: what the SLA measures is a request's own *mean* inter-token latency over its decode, i.e. the
  mean time between two of its decode passes. Decode engines: one decode pass over the running + queued
  decode KV tokens, ``T_d = a + c x KV``. Agg engines interleave prefill work with decode: if prefill
  tokens reach the engine at ``r`` tokens per second of engine time (observed from its recent passes:
  ``sum prefill tokens / sum wall time``), a share ``u = b x r`` of the engine's time goes to prefill, so
  over a request's decode lifetime the mean pass interval is ``T_d / (1 - u)`` (equivalently: each decode
  step also carries ``r x T`` prefill tokens, ``T = T_d + b x r x T``). A pass cannot carry more than
  the chunk budget ``C_eff = C - running decode requests``, so the estimate is capped at
  ``T_d + b x C_eff`` (the saturated engine, every pass a full chunk), which is also what ``u >= 1`` gives.
"""

from __future__ import annotations

import math
import operator
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from dynoplan.fpm import ForwardPassMetrics
from planner.core.observations import PassObservation

FEATURES_BY_POOL: dict[str, tuple[str, ...]] = {
    "prefill": ("sum_prefill_tokens",),
    "decode": ("sum_decode_kv_tokens",),
    "agg": ("sum_prefill_tokens", "sum_decode_kv_tokens"),
}


@dataclass(frozen=True)
class RegressionFit:
    """Fitted pass-time model: ``wall_time_s = intercept_s + sum(slopes_s_per_token[i] x x[i])``.

    A slope is NaN when degenerate (not positive or not identifiable); see :attr:`degenerate`.
    """

    features: tuple[str, ...]
    intercept_s: float
    slopes_s_per_token: tuple[float, ...]
    n_samples: int
    prefill_pass_s: float = 0.0
    """Fixed extra cost (s) of a pass carrying prefill tokens, on top of the intercept (agg fits)."""

    @property
    def degenerate(self) -> bool:
        return any(not math.isfinite(s) for s in self.slopes_s_per_token)

    def slope(self, feature: str) -> float:
        return self.slopes_s_per_token[self.features.index(feature)]

    def predict_s(self, **tokens: float) -> float:
        """Predicted pass time (s, >= 0) for the given feature token counts; NaN if a needed slope is NaN."""
        t = self.intercept_s
        if self.prefill_pass_s and float(tokens.get("sum_prefill_tokens", 0.0)) > 0:
            t += self.prefill_pass_s
        for f, s in zip(self.features, self.slopes_s_per_token, strict=True):
            x = float(tokens.get(f, 0.0))
            if x == 0.0:
                continue
            if not math.isfinite(s):
                return math.nan
            t += s * x
        return max(0.0, t)


class PassTimeRegression:
    """Online least-squares regression of pass wall time on token counts, bounded and bucketed."""

    def __init__(
        self, features: Sequence[str], *, n_buckets: int = 16, per_bucket: int = 32, min_samples: int = 8
    ) -> None:
        self.features = tuple(features)
        self._get = operator.attrgetter(*self.features)
        self.n_buckets = n_buckets
        self.min_samples = min_samples
        self._buckets: list[deque[tuple[tuple[float, ...], float]]] = [
            deque(maxlen=per_bucket) for _ in range(n_buckets * len(self.features))
        ]
        self._fit: RegressionFit | None = None
        self._dirty = True
        self.skipped_idle = 0

    def __len__(self) -> int:
        return sum(len(b) for b in self._buckets)

    def add(self, pass_: ForwardPassMetrics) -> bool:
        """File one pass; False when skipped (idle heartbeat or non-finite wall time). Hot path: one call
        per engine pass (hundreds per load tick), so it avoids generic helpers."""
        w = pass_.wall_time
        if not (0.0 < w < math.inf):
            self.skipped_idle += 1
            return False
        x = self._get(pass_.scheduled_requests)
        if len(self.features) == 1:
            x = (x,)
        self._buckets[self._bucket(x)].append((x, w))
        self._dirty = True
        return True

    def _bucket(self, x: Sequence[float]) -> int:
        """Bucket of token counts ``x``: feature set (first feature > 0) x log2 of the total tokens."""
        total = sum(x)
        b = min(self.n_buckets - 1, int(math.log2(1.0 + total))) if total > 0 else 0
        first = next((i for i, v in enumerate(x) if v > 0), 0)
        return first * self.n_buckets + b

    def add_sample(self, x: Sequence[float], wall_time_s: float) -> bool:
        """File one (token counts, wall time in s) sample; False when the wall time is not positive."""
        if not (math.isfinite(wall_time_s) and wall_time_s > 0):
            self.skipped_idle += 1
            return False
        xs = tuple(max(0.0, float(v)) for v in x)
        self._buckets[self._bucket(xs)].append((xs, float(wall_time_s)))
        self._dirty = True
        return True

    def fit(self) -> RegressionFit | None:
        """The current fit, or None with fewer than ``min_samples`` samples."""
        if not self._dirty:
            return self._fit
        self._dirty = False
        rows = [r for b in self._buckets for r in b]
        if len(rows) < self.min_samples:
            self._fit = None
            return None
        X = np.array([r[0] for r in rows], dtype=float)
        y = np.array([r[1] for r in rows], dtype=float)
        varying = [bool(np.ptp(X[:, j]) > 0) for j in range(X.shape[1])]
        cols = [j for j, v in enumerate(varying) if v]
        base = [np.ones(len(rows))] + [X[:, j] for j in cols]
        step = 0.0
        if len(self.features) > 1 and self.features[0] == "sum_prefill_tokens":
            ind = (X[:, 0] > 0).astype(float)
            if 0 < ind.sum() < len(rows):  # both prefill-carrying and decode-only passes seen
                coef, *_ = np.linalg.lstsq(np.column_stack(base + [ind]), y, rcond=None)
                step = float(coef[-1])
        if step > 0:
            coef = coef[:-1]
        else:
            step = 0.0
            coef, *_ = np.linalg.lstsq(np.column_stack(base), y, rcond=None)
        slopes = [math.nan] * len(self.features)
        for k, j in enumerate(cols):
            c = float(coef[1 + k])
            slopes[j] = c if c > 0 else math.nan
        self._fit = RegressionFit(self.features, float(coef[0]), tuple(slopes), len(rows), step)
        return self._fit


@dataclass(frozen=True)
class EngineEstimate:
    """One engine's latest state and estimates (``None`` = unknown: no or degenerate regression)."""

    pool: str
    worker_id: int
    dp_rank: int
    idle: bool
    """No request running or queued in the latest pass (zero load: needs no regression)."""
    queued_prefill_tokens: int
    queued_prefill_requests: int
    decode_kv_tokens: int
    """Running + queued decode KV tokens."""
    num_decode_requests: int
    estimated_ttft_ms: float | None
    estimated_itl_ms: float | None


def estimate_ttft_ms(
    fit: RegressionFit | None,
    queued_prefill_tokens: float,
    isl_tokens: float,
    max_num_batched_tokens: int,
    decode_kv_tokens: float = 0.0,
    num_decode_requests: int = 0,
) -> float | None:
    """TTFT (ms) of a new ``isl_tokens`` request behind ``queued_prefill_tokens`` (module docstring)."""
    if fit is None or "sum_prefill_tokens" not in fit.features:
        return None
    total = max(0.0, queued_prefill_tokens) + max(0.0, isl_tokens)
    if total <= 0:
        return 0.0
    decode_rows = num_decode_requests if "sum_decode_kv_tokens" in fit.features else 0
    chunk = float(max(1, max_num_batched_tokens - decode_rows))
    full, rest = int(total // chunk), total - chunk * int(total // chunk)
    extra = {"sum_decode_kv_tokens": decode_kv_tokens} if "sum_decode_kv_tokens" in fit.features else {}
    t = full * fit.predict_s(sum_prefill_tokens=chunk, **extra)
    if rest > 0:
        t += fit.predict_s(sum_prefill_tokens=rest, **extra)
    return t * 1000.0 if math.isfinite(t) else None


def estimate_itl_ms(
    fit: RegressionFit | None,
    decode_kv_tokens: float,
    prefill_tokens_per_s: float = 0.0,
    max_num_batched_tokens: int = 8192,
    num_decode_requests: int = 0,
    prefill_passes_per_s: float = 0.0,
) -> float | None:
    """Expected per-request mean ITL (ms) on one engine (module docstring).

    ``decode_kv_tokens``: running + queued decode KV tokens; ``prefill_tokens_per_s``: prefill tokens the
    engine computes per second of pass wall time (agg only; ignored by a decode-only fit);
    ``prefill_passes_per_s``: prefill-carrying passes per second of pass wall time (each costs the fit's
    ``prefill_pass_s``); ``max_num_batched_tokens``: chunk budget C. Returns ``T_d / (1 - u)`` with
    ``u = b x r + s x prefill_passes_per_s``, capped at ``T_d + s + b x (C - num_decode_requests)``, or None
    when the fit is missing or degenerate."""
    if fit is None or "sum_decode_kv_tokens" not in fit.features:
        return None
    t_d = fit.predict_s(sum_decode_kv_tokens=max(0.0, decode_kv_tokens))
    if not math.isfinite(t_d):
        return None
    r = max(0.0, float(prefill_tokens_per_s))
    if "sum_prefill_tokens" in fit.features and r > 0:
        b = fit.slope("sum_prefill_tokens")
        if not math.isfinite(b):
            return None
        chunk = float(max(1, max_num_batched_tokens - max(0, num_decode_requests)))
        cap = t_d + fit.prefill_pass_s + b * chunk
        u = b * r + fit.prefill_pass_s * max(0.0, float(prefill_passes_per_s))
        t_d = min(cap, t_d / (1.0 - u)) if u < 1.0 else cap
    return t_d * 1000.0


def prefill_rate_tokens_per_s(passes: Iterable[ForwardPassMetrics]) -> tuple[float, float] | None:
    """(prefill tokens, prefill-carrying passes) per second of pass wall time over ``passes`` (one engine's
    recent passes); None when no wall time was observed."""
    tok = n = wall = 0.0
    for p in passes:
        tok += p.scheduled_requests.sum_prefill_tokens
        n += p.scheduled_requests.sum_prefill_tokens > 0
        wall += p.wall_time
    return (tok / wall, n / wall) if wall > 0 else None


def latest_passes(passes: Iterable[PassObservation]) -> dict[tuple[int, int], PassObservation]:
    """Latest pass per (worker_id, dp_rank): the largest ``timestamp_s``, later in the input on ties."""
    out: dict[tuple[int, int], PassObservation] = {}
    for p in passes:
        k = (p.worker_id, p.dp_rank)
        if k not in out or p.timestamp_s >= out[k].timestamp_s:
            out[k] = p
    return out


def estimate_engine(
    pool: str,
    p: ForwardPassMetrics,
    fit: RegressionFit | None,
    isl_tokens: float,
    max_num_batched_tokens: int,
    load_scale: float = 1.0,
    prefill_rate: tuple[float, float] | None = None,
) -> EngineEstimate:
    """Estimates for the engine whose latest pass is ``p``; ``load_scale`` multiplies its queue, KV tokens
    and prefill arrival rate (used to ask "could fewer engines absorb this load?").
    ``prefill_rate``: the engine's observed (prefill tokens, prefill passes) per second of pass time
    (:func:`prefill_rate_tokens_per_s` over its recent passes); None = from ``p`` alone."""
    s, q = p.scheduled_requests, p.queued_requests
    q_tokens = q.sum_prefill_tokens * load_scale
    kv = (s.sum_decode_kv_tokens + q.sum_decode_kv_tokens) * load_scale
    n_dec = int(round((s.num_decode_requests + q.num_decode_requests) * load_scale))
    if prefill_rate is None:
        prefill_rate = prefill_rate_tokens_per_s([p]) or (0.0, 0.0)
    idle = (s.num_prefill_requests + s.num_decode_requests + q.num_prefill_requests + q.num_decode_requests) == 0 and (
        p.wall_time == 0 or (s.sum_prefill_tokens + s.sum_decode_kv_tokens) == 0
    )
    ttft = itl = None
    if pool in ("prefill", "agg"):
        ttft = 0.0 if idle else estimate_ttft_ms(fit, q_tokens, isl_tokens, max_num_batched_tokens, kv, n_dec)
        if ttft is None and fit is not None and prefill_rate[0] > 0:  # degenerate fit: the measured rate
            ttft = (max(0.0, q_tokens) + max(0.0, isl_tokens)) / prefill_rate[0] * 1000.0
    if pool in ("decode", "agg"):
        itl = (
            0.0
            if idle
            else estimate_itl_ms(
                fit, kv, prefill_rate[0] * load_scale, max_num_batched_tokens, n_dec, prefill_rate[1] * load_scale
            )
        )
    return EngineEstimate(
        pool,
        p.worker_id,
        p.dp_rank,
        idle,
        int(round(q_tokens)),
        q.num_prefill_requests,
        int(round(kv)),
        n_dec,
        ttft,
        itl,
    )


def guess_isl_tokens(passes: Iterable[ForwardPassMetrics]) -> float:
    """Mean prompt length seen in FPM (queued, else scheduled), for when the frontend mean is unknown."""
    tok = n = 0.0
    for p in passes:
        q, s = p.queued_requests, p.scheduled_requests
        if q.num_prefill_requests:
            tok, n = tok + q.sum_prefill_tokens, n + q.num_prefill_requests
        elif s.num_prefill_requests:
            tok, n = tok + (s.sum_prefill_kv_tokens or s.sum_prefill_tokens), n + s.num_prefill_requests
    return tok / n if n else 0.0
