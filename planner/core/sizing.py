"""Sizing by simulation: the cheapest fleet whose simulated SLA attainment meets the target.

At each throughput decision the planner builds a *traffic sample* of the coming interval from what the
frontend reported (:func:`build_sample`), asks a :class:`FleetEvaluator` (an engine simulation of the
deployment's workers; the core only knows this protocol, the drivers inject one, e.g.
:class:`planner.whatif.EngineFleetEvaluator`) how many sampled requests each candidate fleet serves within
the SLA, and picks the fleet with :class:`SimulatedSizing`. See docs/planner-core.md, "Sizing by
simulation".

The sample (all from :class:`~planner.core.observations.TrafficWindow`, never from a trace file):

- arrivals: a renewal process whose gaps are drawn from the window's inter-arrival histogram (``gap_buckets``; a power
  law inside a bucket, :func:`bucket_slopes`; arrivals that share a timestamp, the histogram's ``le=0`` bucket, come
  as batches of mean size ``1 / (1 - share of zero gaps)`` and Poisson spread), run at the window's own rate profile
  (``arrival_counts``, arrivals per :data:`ARRIVAL_BIN_S`, repeated as needed) scaled so that the mean rate is the
  forecast (predicted count / interval): the renewal process is laid out in the profile's operational time, as a
  time-varying Poisson process is from a homogeneous one. Burstiness is kept at both scales: the gaps' spread within
  seconds, the rate's swings over tens of seconds. Without a gap histogram the gaps are exponential (the
  maximum-entropy law of a positive gap of known mean); without a profile the rate is flat.
- sizes: ISL and OSL drawn independently from the histograms of the windows of the last
  :data:`SIZE_HISTORY_S` pooled (:func:`pool_buckets`; inside a bucket, as for gaps, a power law ``x^s`` whose
  slope ``s`` is the log-log slope of the histogram's density between the neighbouring buckets: the piecewise
  Pareto interpolation of a binned density, which keeps each bucket's weight and follows how fast the density
  falls across buckets; flat in ``log x`` (``s = -1``) where no neighbour says more), then
  scaled to the pooled windows' exact mean length (their ``_sum / _count``); without a histogram, every
  request at the mean.
- prefix-cache hits: every request's prompt starts with a prefix shared by all of them, of
  ``cached_prompt_share`` x the mean ISL tokens on average (the share of prompt tokens the live fleet served from
  its prefix cache over the same pooled windows, ``TrafficWindow.cached_prompt_share``), so that the what-if
  engines hit their prefix caches as often as the live ones (the evaluator turns it into prompt block ids). One
  prefix of the mean length for every request, not a share of each prompt: the windows report a total only, and
  a share of each prompt would put most hits on the longest prompts, the ones whose prefill makes the misses; a
  request shorter than the prefix is capped at its own length, so the sample never has more hits than observed.
  Without a report, no hits (the safe side).
- length: at least ``adjustment_interval_s`` or :data:`SIZE_HISTORY_S`, whichever is shorter, and long enough to
  hold :func:`sample_size` requests, the number the binomial bound below needs to tell a fleet that meets the
  target from one that does not. Not longer than the hour for a longer interval: the sizes describe the last hour
  and the looks stop at what it holds (:class:`planner.core.loops.ThroughputLoop`), so a longer sample would only
  draw more of the same laws (and an interval of 1e5 s drew 200,000 requests).
- start state: the ``num_inflight`` requests the frontend had in flight at the tick arrive evenly spread over
  a warm-up of one mean request duration (by Little's law the span over which the requests now in flight
  arrived), drawn like the others and not counted; the counted requests follow. Released all at once they
  would be a burst of prefills that the running fleet (mostly decoding them) does not have.

Verdicts: with ``k`` misses among ``N`` counted requests and ``a = 1 - target`` allowed, a fleet *passes*
when the one-sided Clopper-Pearson upper bound of its miss share at :data:`CONFIDENCE` is <= ``a``, *fails*
when the lower bound is > ``a``, and is *undecided* between (Clopper & Pearson, Biometrika 26, 1934: the
exact binomial interval, from beta quantiles). The verdict is sequential (:data:`LOOKS`): a fleet undecided on the
first :func:`sample_size` requests is replayed on the sample's longer heads (2, 4, 8 x as many requests, nested:
:meth:`TrafficSample.head`), so that a fleet well inside the target is not held to half of it by the length of
one sample; each look is judged at :func:`look_confidence`, the level at which a fleet exactly at the allowed
share passes at any look with 5 % probability (four looks at 95 % each would pass it 10 % of the time). The goal of a
pool is the least passing count; a pool whose current count is undecided keeps it (no scale-up on a sample that cannot
show a miss, no scale-down without a smaller fleet shown to pass): the deadband is the sample's own uncertainty, not a
tuned margin.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Protocol

import numpy as np
import numpy.typing as npt

from planner.core.reasons import Reason

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

CONFIDENCE = 0.95
"""One-sided confidence of the binomial verdicts (the conventional 95 %, z = 1.645)."""

GAP_BUCKETS_S: tuple[float, ...] = (0.0,) + tuple(0.001 * 2.0**k for k in range(18)) + (math.inf,)
"""Upper bounds (``le``, seconds) of the frontend's inter-arrival histogram
(``dynoplan_frontend_request_interarrival_seconds``): 0 (arrivals that share a timestamp), then 1 ms x powers
of 2 up to 131 s, then +Inf."""

ARRIVAL_BIN_S = 10.0
"""Resolution (seconds) of the window's arrival-rate profile (``TrafficWindow.arrival_counts``): the request
counter's increase per 10 s, the usual Prometheus scrape interval."""

SIZE_HISTORY_S = 3600.0
"""Span of recent windows whose ISL/OSL histograms are pooled for the sample's sizes (one hour). Long prompts are
rare (a few per 180 s window): one window's histogram says little about their share, and the sizing would
follow that noise from window to window; the mix of the last hour is the estimate, the rate is the forecast's."""

PASS, UNDECIDED, FAIL = "pass", "undecided", "fail"


@dataclass(frozen=True, slots=True)
class TrafficSample:
    """Requests to replay through a candidate fleet (shapes: all arrays of length ``len(arrival_s)``).

    ``arrival_s``: arrival times, seconds from the tick, non-decreasing; ``isl_tokens``/``osl_tokens``: prompt
    and output lengths (>= 1); the first ``num_warm`` requests (arrival 0) are the in-flight start state and
    are not counted; ``horizon_s``: the sampled span (warm-up included); ``min_counted``: the counted requests the
    verdicts need (:func:`sample_size`; an evaluator may replay a share of a larger sample that still holds them).
    """

    arrival_s: FloatArray
    isl_tokens: IntArray
    osl_tokens: IntArray
    num_warm: int
    horizon_s: float
    min_counted: int = 0
    interval_s: float = 0.0
    """The span the counted requests cover at least (the decision interval), seconds."""
    warmup_s: float = 0.0
    """When the counted requests start (the in-flight warm-up), seconds from the tick."""
    share_pool: str = ""
    """The pool whose round-robin engine share an evaluator may replay instead of the whole fleet (the pool being
    sized; "" = replay the whole fleet): see :class:`planner.whatif.EngineFleetEvaluator`."""
    cached_tokens: float = 0.0
    """Mean length (tokens) of the prompt prefix that all requests share (module docstring, "prefix-cache hits");
    each request's is at most its ISL. 0 = no shared prefix."""

    @property
    def num_counted(self) -> int:
        return int(len(self.arrival_s) - self.num_warm)

    def head(self, min_counted: int) -> TrafficSample:
        """The sample's first part that holds ``min_counted`` counted requests and spans ``interval_s`` after the
        warm-up (its requests kept): a prefix, so that the looks of a sequential verdict see nested samples. The
        whole sample when it holds no more."""
        w = self.num_warm
        if min_counted >= self.num_counted:
            return replace(self, min_counted=int(min_counted))
        end = max(self.warmup_s + self.interval_s, float(np.nextafter(self.arrival_s[w + min_counted - 1], np.inf)))
        keep = max(int(np.searchsorted(self.arrival_s, end, side="left")), w + min_counted)
        return TrafficSample(
            self.arrival_s[:keep],
            self.isl_tokens[:keep],
            self.osl_tokens[:keep],
            w,
            end,
            int(min_counted),
            self.interval_s,
            self.warmup_s,
            self.share_pool,
            self.cached_tokens,
        )


@dataclass(frozen=True, slots=True)
class SampleOutcome:
    """How many counted requests of a sample missed: the TTFT target, the ITL target (own mean ITL), either."""

    num_requests: int
    ttft_misses: int
    itl_misses: int
    misses: int
    complete: bool = True
    """False when the replay stopped early on a decided FAIL (misses then count those seen by then)."""
    unfinished: int = 0
    """Counted requests not finished when the replay ended (0 when it stopped early): what an overloaded fleet
    leaves queued, where every fleet may miss alike but a larger one still serves more."""

    def misses_of(self, kind: str) -> int:
        """The misses of ``kind``: ``any`` (either target), ``ttft`` or ``itl``."""
        return {"any": self.misses, "ttft": self.ttft_misses, "itl": self.itl_misses}[kind]


class FleetEvaluator(Protocol):
    """Replays a :class:`TrafficSample` through a fleet of ``replicas`` (``{pool: count}``) of the deployment's
    engines with the SLA targets of the planner, and counts the misses of the counted requests. With
    ``stop_allowed``, it may stop as soon as the ``stop_kind`` misses (``any``, ``ttft`` or ``itl``) already certain
    reach :func:`fail_count` (at ``stop_confidence``) of the requests it counts (the verdict is FAIL whatever follows),
    returning them with ``complete=False``."""

    def evaluate(
        self,
        sample: TrafficSample,
        replicas: Mapping[str, int],
        stop_allowed: float | None = None,
        stop_kind: str = "any",
        stop_confidence: float = CONFIDENCE,
    ) -> SampleOutcome: ...


def sample_size(allowed_miss: float, confidence: float = CONFIDENCE) -> int:
    """Counted requests the sample needs: ``ceil(2 z^2 / a)`` with ``z = Phi^-1(confidence)``.

    Derivation: a fleet whose true miss share is ``a / 2`` must be able to pass. With ``mu = N a / 2``
    expected misses, the upper bound is about ``mu + z sqrt(mu)``, which is <= ``N a = 2 mu`` when
    ``mu >= z^2``, i.e. ``N >= 2 z^2 / a`` (a = 0.5 %: 1083 requests; a = 0.1 %: 5412)."""
    if not 0 < allowed_miss < 1:
        raise ValueError(f"allowed_miss={allowed_miss!r}: expected 0 < value < 1")
    from scipy.stats import norm  # here, not at module level: scipy.stats costs ~0.5 s of start-up

    z = float(norm.ppf(confidence))
    return int(math.ceil(2.0 * z * z / allowed_miss))


def miss_bounds(misses: int, n: int, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """One-sided Clopper-Pearson (lower, upper) bounds of a miss share from ``misses`` of ``n`` (0 <= misses <= n)."""
    if n <= 0:
        return 0.0, 1.0
    from scipy.special import betaincinv  # here, not at module level: scipy costs start-up time

    # the q-quantile of Beta(a, b) is the inverse regularized incomplete beta function at q; scipy.stats.beta.ppf
    # gives the same floats (tests/planner/test_sizing_sim.py checks it bit for bit) but spends ~0.2 ms a call on
    # argument handling, and the per-look confidence's calibration makes thousands of calls
    alpha = 1.0 - confidence
    lo = 0.0 if misses == 0 else float(betaincinv(misses, n - misses + 1, alpha))
    hi = 1.0 if misses >= n else float(betaincinv(misses + 1, n - misses, confidence))
    return lo, hi


def fail_count(n: int, allowed_miss: float, confidence: float = CONFIDENCE) -> int:
    """Fewest misses of ``n`` whose verdict is FAIL (lower bound above ``allowed_miss``); ``n + 1`` if none."""
    lo, hi = 0, n + 1
    while lo < hi:  # the lower bound grows with the misses
        mid = (lo + hi) // 2
        if mid <= n and miss_bounds(mid, n, confidence)[0] > allowed_miss:
            hi = mid
        else:
            lo = mid + 1
    return lo


def verdict(misses: int, n: int, allowed_miss: float, confidence: float = CONFIDENCE) -> str:
    """:data:`PASS`, :data:`FAIL` or :data:`UNDECIDED` (module docstring)."""
    lo, hi = miss_bounds(misses, n, confidence)
    if hi <= allowed_miss:
        return PASS
    if lo > allowed_miss:
        return FAIL
    return UNDECIDED


def pass_count(n: int, allowed_miss: float, confidence: float = CONFIDENCE) -> int:
    """Most misses of ``n`` whose verdict is PASS (upper bound <= ``allowed_miss``); -1 if none."""
    lo, hi = -1, n
    while lo < hi:  # the upper bound grows with the misses
        mid = (lo + hi + 1) // 2
        if miss_bounds(mid, n, confidence)[1] <= allowed_miss:
            lo = mid
        else:
            hi = mid - 1
    return lo


LOOKS = 4
"""Looks of a sequential verdict (:func:`sequential_looks`): the sample doubles from one look to the next, 1, 2, 4
and 8 x :func:`sample_size`. A fleet undecided on the first sample (its miss share near the allowed one) is
replayed on the next, longer one. At the first look a fleet whose true miss share is about ``a / 2`` can pass (the
derivation of :func:`sample_size`); at look ``j``, with ``N_j = 2^j x 2 z^2 / a`` and the pass condition
``N p + z sqrt(N p) <= N a``, one at ``r a`` with ``2^(j+1) (1 - r)^2 = r``: r = 0.50, 0.61, 0.70, 0.78. So the
margin the sample's size imposes shrinks from half the allowed misses to a fifth, at up to 15 x the replay of a
single look, paid only by the fleets next to the boundary; each further doubling buys less (r -> 1 as
``1 - 1 / sqrt(2^(j+1))``) and doubles the decision time."""


def sequential_looks(allowed_miss: float, looks: int = LOOKS, confidence: float = CONFIDENCE) -> tuple[int, ...]:
    """Counted requests at each look: ``sample_size(allowed_miss) x 2^j``, j = 0 .. looks - 1."""
    base = sample_size(allowed_miss, confidence)
    return tuple(base << j for j in range(max(1, int(looks))))


def _binom_support(n: int, p: float) -> tuple[int, FloatArray]:
    """(first k, pmf) of Binomial(n, p) over the counts whose probability exceeds 1e-16 (the rest is dropped)."""
    from scipy.stats import binom  # here, not at module level: scipy.stats costs ~0.5 s of start-up

    lo = max(0, int(binom.ppf(1e-16, n, p)) - 1)
    hi = min(n, int(binom.isf(1e-16, n, p)) + 1)
    k = np.arange(lo, hi + 1)
    return lo, binom.pmf(k, n, p)


def false_pass(allowed_miss: float, looks: Sequence[int], look_confidence: float) -> float:
    """Probability that a fleet whose true miss share is exactly ``allowed_miss`` passes at one of the ``looks``
    (nested samples of that many counted requests, misses independent Bernoulli, stopping at the first decided
    verdict), each look judged at ``look_confidence``. Exact: the distribution of the misses of the paths still
    undecided is carried from look to look and convolved with the binomial increment."""
    a = float(allowed_miss)
    lo, dist = 0, np.ones(1)
    prev, passed = 0, 0.0
    for n in looks:
        k0, inc = _binom_support(int(n) - prev, a)
        dist, lo = np.convolve(dist, inc), lo + k0
        prev = int(n)
        kp, kf = pass_count(prev, a, look_confidence), fail_count(prev, a, look_confidence)
        ks = lo + np.arange(dist.size)
        passed += float(dist[ks <= kp].sum())
        keep = (ks > kp) & (ks < kf)
        if not keep.any():
            break
        first = int(np.argmax(keep))
        dist, lo = dist[keep], lo + first
    return passed


@lru_cache(maxsize=64)
def look_confidence(allowed_miss: float, looks: tuple[int, ...], confidence: float = CONFIDENCE) -> float:
    """Per-look confidence of a sequential verdict: the least (to 1e-6) at which :func:`false_pass` is at most
    ``1 - confidence``, so that over all its looks the verdict keeps the error rate of a single look at
    ``confidence`` (a repeated significance test calibrated as Pocock's, Biometrika 64, 1977, here exactly for
    binomial misses). Between ``confidence`` (one look) and the Bonferroni ``1 - (1 - confidence) / len(looks)``,
    which always suffices. E.g. a = 0.5 %, looks of 1083 x 1, 2, 4, 8: 0.972, a false pass of 4.6 %
    (tests/planner/test_sizing_sim.py checks the bound)."""
    if len(looks) <= 1:
        return confidence
    alpha = 1.0 - confidence
    lo, hi = confidence, 1.0 - alpha / len(looks)
    if false_pass(allowed_miss, looks, lo) <= alpha:
        return lo
    while hi - lo > 1e-6:
        mid = 0.5 * (lo + hi)
        if false_pass(allowed_miss, looks, mid) <= alpha:
            hi = mid
        else:
            lo = mid
    return hi


def _bucket_edges(buckets: Sequence[tuple[float, float]]) -> tuple[FloatArray, FloatArray, FloatArray] | None:
    """(lower, upper, weight) per bucket of a non-cumulative histogram ``(le, count)``; the +Inf bucket spans
    ``(lo, 2 lo]``. None without counts."""
    les = np.array([b[0] for b in buckets], dtype=float)
    cnt = np.array([b[1] for b in buckets], dtype=float)
    if cnt.size == 0 or not np.isfinite(cnt).all() or cnt.sum() <= 0:
        return None
    lo = np.concatenate([[0.0], les[:-1]])
    hi = np.where(np.isfinite(les), les, 2.0 * np.maximum(lo, 1.0))
    return lo, hi, cnt / cnt.sum()


def bucket_slopes(edges: tuple[FloatArray, FloatArray, FloatArray]) -> FloatArray:
    """Log-log slope of the density inside each bucket of a histogram's ``edges`` (:func:`_bucket_edges`; a first
    bucket from 0 taken from ``le / 2``), for :func:`_draw`: the central difference of ``log(density)`` over
    ``log(bucket midpoint)`` between the nearest non-empty buckets on either side (the bucket itself where a side
    has none), density = weight / width, midpoint = geometric mean of the bounds; -1 (log-uniform) for an empty
    bucket or one with no non-empty neighbour.

    A power law ``x^s`` inside a bucket is the piecewise Pareto interpolation of a binned density; ``s = -1`` is
    log-uniform (flat in ``log x``). Heavy-tailed prompt lengths fall faster than ``1/x`` inside their top buckets
    (the bundled Mooncake trace: ``s`` = -2.1 to -2.5 above 16k tokens), and a log-uniform draw there puts too
    many prompts near the bucket's upper bound, the ones that miss the TTFT target (docs/planner-core.md, "Sizing
    by simulation")."""
    lo, hi, w = edges
    lo = np.where(lo > 0, lo, hi / 2.0)
    dens = w / (hi - lo)
    logd = np.log(np.where(dens > 0, dens, 1.0))
    logm = 0.5 * (np.log(lo) + np.log(hi))
    full = np.flatnonzero(dens > 0)
    slopes = np.full(w.size, -1.0)
    for k in full:
        left = full[full < k]
        right = full[full > k]
        a = int(left[-1]) if left.size else int(k)
        b = int(right[0]) if right.size else int(k)
        if a != b:
            slopes[k] = (logd[b] - logd[a]) / (logm[b] - logm[a])
    return slopes


def _power_mean(lo: FloatArray, hi: FloatArray, s: FloatArray) -> FloatArray:
    """Mean of the density ``x^s`` on ``(lo, hi]`` per bucket: ``int x^(s+1) / int x^s``."""

    def integral(e: FloatArray) -> FloatArray:  # int_lo^hi x^(e-1) dx
        small = np.abs(e) < 1e-9
        safe = np.where(small, 1.0, e)
        out: FloatArray = np.where(small, np.log(hi / lo), (hi**safe - lo**safe) / safe)
        return out

    out: FloatArray = integral(s + 2.0) / integral(s + 1.0)
    return out


def _draw(
    rng: np.random.Generator, edges: tuple[FloatArray, FloatArray, FloatArray], n: int
) -> tuple[FloatArray, float]:
    """``n`` values from a histogram's ``edges``: a bucket by its weight, then inside it the power law of
    :func:`bucket_slopes` (inverse CDF; the first bucket from ``le / 2``, since a zero bound has no logarithm),
    and the histogram's mean under the same law (so that rescaling does not depend on ``n``)."""
    lo, hi, w = edges
    lo = np.where(lo > 0, lo, hi / 2.0)
    s = bucket_slopes(edges)
    k = rng.choice(len(w), size=n, p=w)
    u = rng.random(n)
    lk, hk, e = lo[k], hi[k], s[k] + 1.0
    small = np.abs(e) < 1e-9
    safe = np.where(small, 1.0, e)
    x = np.where(small, lk * (hk / lk) ** u, (lk**safe + u * (hk**safe - lk**safe)) ** (1.0 / safe))
    return np.clip(x, lk, hk), float(np.dot(w, _power_mean(lo, hi, s)))


def pool_buckets(histograms: Sequence[Sequence[tuple[float, float]]]) -> tuple[tuple[float, float], ...]:
    """Bucket-wise sum of non-cumulative histograms with the same bounds (others are skipped; empty ones too)."""
    out: dict[float, float] = {}
    bounds: tuple[float, ...] | None = None
    for h in histograms:
        if not h:
            continue
        b = tuple(le for le, _ in h)
        if bounds is None:
            bounds = b
        if b != bounds:
            continue
        for le, c in h:
            out[le] = out.get(le, 0.0) + c
    return tuple((le, out[le]) for le in bounds) if bounds else ()


def _lengths(rng: np.random.Generator, buckets: Sequence[tuple[float, float]], n: int, mean: float) -> IntArray:
    """Integer token lengths >= 1 drawn from ``buckets`` and scaled by ``mean`` / the histogram's mean; all at
    ``mean`` without a histogram."""
    edges = _bucket_edges(buckets) if buckets else None
    if edges is None:
        return np.full(n, max(1, int(round(mean))), dtype=np.int64)
    x, m = _draw(rng, edges, n)
    if m > 0:
        x = x * (mean / m)
    return np.maximum(1, np.rint(x)).astype(np.int64)


def _warp(op: FloatArray, rate_per_s: float, profile: Sequence[float], bin_s: float) -> FloatArray:
    """Real times of arrivals at operational times ``op`` (unit rate): ``t = Lambda^-1(op)`` with the intensity
    ``rate x p_j`` in bin ``j`` of the profile normalised to mean 1 and repeated cyclically; ``op / rate`` when
    the profile is empty or has no arrivals."""
    c = np.asarray(profile, dtype=float)
    if c.size == 0 or not np.isfinite(c).all() or c.sum() <= 0 or not (bin_s > 0):
        return op / rate_per_s
    lam = rate_per_s * c / c.mean()  # requests/s per bin
    edges = np.concatenate([[0.0], np.cumsum(lam * bin_s)])  # Lambda at the bin edges of one cycle
    cycle = edges[-1]
    k, rem = np.divmod(op, cycle)
    j = np.clip(np.searchsorted(edges, rem, side="right") - 1, 0, c.size - 1)
    # rem falls in a bin with lam > 0 (a zero-rate bin has zero width in operational time)
    t_s: FloatArray = k * (c.size * bin_s) + j * bin_s + (rem - edges[j]) / np.where(lam[j] > 0, lam[j], np.inf)
    return t_s


def build_sample(
    rate_per_s: float,
    mean_isl_tokens: float,
    mean_osl_tokens: float,
    *,
    min_horizon_s: float,
    min_requests: int,
    isl_buckets: Sequence[tuple[float, float]] = (),
    osl_buckets: Sequence[tuple[float, float]] = (),
    gap_buckets: Sequence[tuple[float, float]] = (),
    num_inflight: int = 0,
    warmup_s: float = 0.0,
    rate_profile: Sequence[float] = (),
    profile_bin_s: float = ARRIVAL_BIN_S,
    cached_prompt_share: float = 0.0,
    seed: Sequence[int] = (0,),
) -> TrafficSample:
    """The traffic sample of the module docstring.

    ``rate_per_s`` > 0 (requests/s), mean lengths in tokens (finite, > 0), ``min_horizon_s`` > 0 and
    ``min_requests`` >= 1 set the length (``max(min_horizon_s, min_requests / rate)``), buckets as
    ``TrafficWindow`` carries them, ``num_inflight`` requests spread evenly over the first ``warmup_s`` seconds
    (the start state; not counted; the counted requests start at ``warmup_s``), ``rate_profile`` arrivals per
    ``profile_bin_s`` bin (relative rates; any scale), ``cached_prompt_share`` in [0, 1] (the shared prefix's
    mean length is this share of ``mean_isl_tokens``; NaN or out of range counts as 0), ``seed`` for
    :class:`numpy.random.SeedSequence`. Gaps, ISLs and OSLs come from three independent streams and are
    rescaled by the laws' means, not the draws': the same seed at a higher rate gives the same requests,
    compressed in time, plus more of them (common random numbers, so that sizing at two loads compares like
    with like). Raises ValueError on a rate or mean that is not a
    positive finite number."""
    for name, v in (
        ("rate_per_s", rate_per_s),
        ("mean_isl_tokens", mean_isl_tokens),
        ("mean_osl_tokens", mean_osl_tokens),
        ("min_horizon_s", min_horizon_s),
    ):
        if not (math.isfinite(v) and v > 0):
            raise ValueError(f"{name}={v!r}: expected a finite number > 0")
    g_rng, i_rng, o_rng = (np.random.default_rng(s) for s in np.random.SeedSequence(list(seed)).spawn(3))
    horizon = max(min_horizon_s, min_requests / rate_per_s)
    n = int(math.ceil(rate_per_s * horizon)) + 1
    zero = sum(c for le, c in gap_buckets if le <= 0.0)
    positive = [(le, c) for le, c in gap_buckets if le > 0.0]
    if len(rate_profile) and positive:
        # gaps longer than a profile bin are the profile's (a silent stretch is a run of empty bins): the renewal
        # law covers the gaps within bins. A 20-minute silence otherwise enters as one huge gap whose weight in
        # the mean crushes every other gap, and the sample becomes one extreme burst
        lows = [0.0] + [le for le, _ in positive[:-1]]
        positive = [(le, c) for (le, c), lo in zip(positive, lows, strict=True) if lo < profile_bin_s]
    edges = _bucket_edges(positive) if positive and sum(c for _, c in positive) >= 2 else None
    # arrivals sharing a timestamp (a zero gap) come in batches: b requests per batch on average, the batch
    # sizes 1 + Poisson(b - 1) (what a clock that stamps every arrival of a tick alike makes of a Poisson
    # stream); the gaps between batches from the positive part of the histogram
    b = (zero + sum(c for _, c in positive)) / sum(c for _, c in positive) if edges is not None else 1.0
    nb = int(math.ceil(n / b)) + 1
    if edges is None:
        gaps, mean_gap = g_rng.exponential(1.0, nb), 1.0
    else:
        gaps, mean_gap = _draw(g_rng, edges, nb)
    sizes = 1 + g_rng.poisson(b - 1.0, nb) if b > 1.0 else np.ones(nb, dtype=np.int64)
    # operational time: one request per unit on average; the first batch one gap after the tick (a renewal
    # process seen from an arbitrary instant starts with a residual gap; a full gap is the simple choice)
    op = np.repeat(np.cumsum(gaps / mean_gap * b), sizes)[:n]
    arrivals = _warp(op, rate_per_s, rate_profile, profile_bin_s)
    arrivals = arrivals[arrivals < horizon]
    warm = max(0, int(num_inflight))
    warmup_s = max(0.0, float(warmup_s)) if math.isfinite(warmup_s) else 0.0
    # in-flight requests first in each stream's order of use would shift the counted requests' sizes with the
    # in-flight count: they take the draws after the counted ones
    isl = _lengths(i_rng, isl_buckets, len(arrivals) + warm, mean_isl_tokens)
    osl = _lengths(o_rng, osl_buckets, len(arrivals) + warm, mean_osl_tokens)
    isl = np.concatenate([isl[len(arrivals) :], isl[: len(arrivals)]])
    osl = np.concatenate([osl[len(arrivals) :], osl[: len(arrivals)]])
    arr = np.concatenate([np.arange(warm) * (warmup_s / warm) if warm else np.zeros(0), warmup_s + arrivals])
    share = cached_prompt_share if 0.0 <= cached_prompt_share <= 1.0 else 0.0  # NaN fails both comparisons
    return TrafficSample(
        arr,
        isl,
        osl,
        warm,
        float(horizon + warmup_s),
        int(min_requests),
        float(min_horizon_s),
        warmup_s,
        cached_tokens=float(share * mean_isl_tokens),
    )


@dataclass
class PoolPlan:
    """One pool's outcome of :meth:`SimulatedSizing.plan`: ``goal`` replicas, the ``reason``, the least
    passing count ``required`` and the current count's verdict."""

    goal: int
    reason: Reason
    required: int
    current_verdict: str


@dataclass(frozen=True)
class _LimitBar:
    """What the fleet at the limits achieves, when it does not pass (:meth:`SimulatedSizing._limit_bar`)."""

    look: int
    """The look it was measured on (the one its sequential verdict ended at)."""
    miss_share: float
    """Upper Clopper-Pearson bound of its miss share, at least ``allowed_miss``."""
    unfinished_share: float
    """Upper Clopper-Pearson bound of its share of requests unfinished at the sample's end."""


@dataclass
class SimulatedSizing:
    """Candidate search over fleets for one sample (a decision); evaluations are cached per fleet and look.

    ``pools``: the planned pools, ``("agg",)`` or ``("prefill", "decode")``; ``limits``: ``{pool: (lo, hi)}``
    replica bounds of the search; ``allowed_miss``: ``1 - target``; ``looks``: the counted requests of each look
    of the sequential verdict (:func:`sequential_looks`; the sample must hold the last; default one look of
    ``sample.min_counted``). A fleet's verdict is that of the first look that decides it, each judged at
    :func:`look_confidence`; undecided after the last look, it is undecided. The sizing assumes that attainment
    does not fall when a pool grows (the search brackets the least passing count by doubling, then bisects).
    """

    evaluator: FleetEvaluator
    sample: TrafficSample
    pools: tuple[str, ...]
    limits: Mapping[str, tuple[int, int]]
    allowed_miss: float
    looks: tuple[int, ...] = ()
    evaluations: int = 0
    _cache: dict[tuple[tuple[int, ...], str, int, str], SampleOutcome] = field(default_factory=dict)
    """Outcomes by (fleet, share pool, look, "" for a complete replay or the kind an early stop decided)."""
    _views: list[TrafficSample] = field(init=False, repr=False)
    """The sample's head for each look."""
    confidence: float = field(init=False)
    """The per-look confidence (:func:`look_confidence` of ``looks``)."""

    def __post_init__(self) -> None:
        if not self.looks:
            self.looks = (self.sample.min_counted,)
        self._views = [self.sample.head(m) for m in self.looks]
        self.confidence = look_confidence(self.allowed_miss, tuple(self.looks))

    def outcome(
        self, counts: Mapping[str, int], kind: str = "any", decide: bool = True, look: int = 0, pool: str | None = None
    ) -> SampleOutcome:
        """The misses on fleet ``counts`` (cached) of the ``look``-th sample. ``decide``: the evaluator may stop
        once the ``kind`` misses already make the verdict FAIL (an undersized fleet's long queues are the costliest
        to replay); such an outcome counts only the misses seen by then. ``pool``: the pool being sized, whose
        engine share the evaluator may replay (the only pool when there is one; None in a disaggregated fleet:
        the pair, replayed whole)."""
        fleet = tuple(int(counts[p]) for p in self.pools)
        share = pool if pool is not None else (self.pools[0] if len(self.pools) == 1 else "")
        key = (fleet, share, look)
        full = self._cache.get((*key, ""))
        if full is not None:
            return full
        ck = (*key, kind if decide else "")
        if ck not in self._cache:
            o = self.evaluator.evaluate(
                replace(self._views[look], share_pool=share),
                dict(zip(self.pools, fleet, strict=True)),
                stop_allowed=self.allowed_miss if decide else None,
                stop_kind=kind,
                stop_confidence=self.confidence,
            )
            self.evaluations += 1
            self._cache[(*key, "" if o.complete else kind)] = o
            ck = (*key, "" if o.complete else kind)
        return self._cache[ck]

    def decide(self, counts: Mapping[str, int], kind: str, pool: str | None = None) -> tuple[str, SampleOutcome]:
        """The sequential verdict of fleet ``counts`` on its ``kind`` misses, with the outcome of the deciding (or
        last) look (``pool`` as for :meth:`outcome`)."""
        v, o, _ = self._decide(counts, kind, pool)
        return v, o

    def _decide(self, counts: Mapping[str, int], kind: str, pool: str | None = None) -> tuple[str, SampleOutcome, int]:
        """:meth:`decide` with the index of the look its verdict ended at."""
        for look in range(len(self.looks)):
            o = self.outcome(counts, kind, look=look, pool=pool)
            v = verdict(o.misses_of(kind), o.num_requests, self.allowed_miss, self.confidence)
            if v != UNDECIDED:
                break
        return v, o, look

    def _verdict(self, counts: Mapping[str, int], kind: str, pool: str | None = None) -> str:
        return self.decide(counts, kind, pool)[0]

    def least_passing(self, pool: str, others: Mapping[str, int], kind: str, start: int) -> int:
        """Least count of ``pool`` (others fixed) whose ``kind`` misses pass.

        When not even the pool's upper limit passes (prompts no fleet serves in time, a target beyond the
        engine), the bar becomes what the limit achieves (:meth:`_limit_bar`): the least count whose misses are not
        significantly above the limit's (its lower Clopper-Pearson bound within the limit's upper bound), and whose
        unfinished requests are not significantly more than the limit's (the same test), is returned, so replicas
        that do not reduce misses measurably are not bought. The second test is for a load beyond the limit's
        capacity: there every fleet misses every request of the sample, and only the requests still queued at the
        end tell that a larger fleet serves more."""
        lo, hi = self.limits[pool]
        start = min(max(start, lo), hi)
        n = self._search(pool, others, kind, start, lo, hi)
        if n < hi or self._verdict({**others, pool: hi}, kind, pool) == PASS:
            return n
        return self._search(pool, others, kind, start, lo, hi, self._limit_bar({**others, pool: hi}, kind, pool))

    def _limit_bar(self, limit: Mapping[str, int], kind: str, pool: str | None = None) -> _LimitBar:
        """The bar of a target out of reach, from the fleet at the limit, on the look its sequential verdict ended
        at (the most requests it was judged on; an earlier look may show it within the target by chance): the
        upper Clopper-Pearson bounds of its ``kind`` miss share (at least ``allowed_miss``) and of its unfinished
        share."""
        look = self._decide(limit, kind, pool)[2]
        o = self.outcome(limit, kind, decide=False, look=look, pool=pool)
        return _LimitBar(
            look,
            max(self.allowed_miss, miss_bounds(o.misses_of(kind), o.num_requests)[1]),
            miss_bounds(o.unfinished, o.num_requests)[1],
        )

    def _as_good_as_limit(self, counts: Mapping[str, int], kind: str, bar: _LimitBar, pool: str | None = None) -> bool:
        """Whether fleet ``counts`` is not significantly worse than the limit whose :meth:`_limit_bar` is ``bar``:
        on the bar's look, the lower bounds of its miss and unfinished shares within the bar's."""
        o = self.outcome(counts, kind, decide=False, look=bar.look, pool=pool)
        return (
            miss_bounds(o.misses_of(kind), o.num_requests)[0] <= bar.miss_share
            and miss_bounds(o.unfinished, o.num_requests)[0] <= bar.unfinished_share
        )

    def _search(
        self,
        pool: str,
        others: Mapping[str, int],
        kind: str,
        start: int,
        lo: int,
        hi: int,
        bar: _LimitBar | None = None,
    ) -> int:
        """Least ``n`` in ``[lo, hi]`` passing (``hi`` when none does): doubling steps from ``start``, then
        bisection. With ``bar`` (the target out of reach: :meth:`least_passing`), the least ``n`` as good as the
        limit instead."""

        def ok(n: int) -> bool:
            if bar is None:
                return self._verdict({**others, pool: n}, kind, pool) == PASS
            return n >= hi or self._as_good_as_limit({**others, pool: n}, kind, bar, pool)

        if ok(start):
            good, step = start, 1
            while good - step >= lo and ok(good - step):
                good -= step
                step *= 2
            bad = max(lo - 1, good - step)
        else:
            bad, step = start, 1
            while bad < hi and not ok(min(hi, bad + step)):
                bad = min(hi, bad + step)
                step *= 2
            if bad >= hi:
                return hi
            good = min(hi, bad + step)
        while good - bad > 1:
            mid = (good + bad) // 2
            if ok(mid):
                good = mid
            else:
                bad = mid
        return good

    def plan(self, current: Mapping[str, int]) -> dict[str, PoolPlan]:
        """Goals per pool against ``current`` replicas (module docstring; disaggregated: each pool sized with
        the other at its upper limit on the misses it causes -- TTFT for prefill, any for decode, since a full
        decode cache delays first tokens too -- then the pair is checked and the pool whose SLA it misses
        more grows while the pair fails and, when not even both limits pass, while it is significantly worse
        than the limits' pair (the bar of :meth:`least_passing`); whether both limits pass is decode's own verdict
        with prefill at its limit when that passed, the limits' pair replayed only otherwise)."""
        cur = {p: min(max(int(current[p]), self.limits[p][0]), self.limits[p][1]) for p in self.pools}
        if self.pools == ("agg",):
            req = {"agg": self.least_passing("agg", {}, "any", cur["agg"])}
            verdicts = {"agg": self._verdict(cur, "any")}
        else:
            ample = {p: self.limits[p][1] for p in self.pools}
            req = {
                "prefill": self.least_passing("prefill", {"decode": ample["decode"]}, "ttft", cur["prefill"]),
                "decode": self.least_passing("decode", {"prefill": ample["prefill"]}, "any", cur["decode"]),
            }
            verdicts = {
                "prefill": self._verdict({"prefill": cur["prefill"], "decode": ample["decode"]}, "ttft", "prefill"),
                "decode": self._verdict({"prefill": ample["prefill"], "decode": cur["decode"]}, "any", "decode"),
            }
        goal = {}
        reasons = {}
        for p in self.pools:
            if req[p] < cur[p]:
                goal[p], reasons[p] = req[p], Reason.SCALE_DOWN_THROUGHPUT
            elif req[p] > cur[p] and verdicts[p] == FAIL:
                goal[p], reasons[p] = req[p], Reason.SCALE_UP_THROUGHPUT
            elif req[p] > cur[p]:
                goal[p], reasons[p] = cur[p], Reason.HOLD_WITHIN_SLA
            else:
                goal[p], reasons[p] = cur[p], Reason.HOLD_STEADY
        if len(self.pools) == 2:
            # the pair: grow the pool whose SLA it misses more while it fails (each pool alone passed). When not
            # even both pools at their limits pass, the bar is what that pair achieves, as in least_passing: growth
            # stops once the pair is not significantly worse than the limits (else a target out of reach would buy
            # every replica the limits allow)
            bar: _LimitBar | None = None
            reachable: bool | None = None
            decode_alone = {"prefill": self.limits["prefill"][1], "decode": req["decode"]}
            while True:
                v, o = self.decide(goal, "any")
                if v != FAIL:
                    break
                if reachable is None:
                    # the limits' pair passes when decode's own sizing passed (prefill at its limit): growing decode
                    # to its limit does not raise the misses (the search's assumption), so that verdict, already
                    # made, answers without replaying the largest fleet there is (0.76 of a 1.9 s decision at 96
                    # req/s, docs/planner-core.md "Speed"); only when it did not pass is the limits' pair replayed
                    top = {p: self.limits[p][1] for p in self.pools}
                    reachable = (
                        self._verdict(decode_alone, "any", "decode") == PASS or self._verdict(top, "any") == PASS
                    )
                    bar = None if reachable else self._limit_bar(top, "any")
                if bar is not None and self._as_good_as_limit(goal, "any", bar):
                    break
                p = "prefill" if o.ttft_misses >= o.itl_misses else "decode"
                if goal[p] >= self.limits[p][1]:
                    p = "decode" if p == "prefill" else "prefill"
                    if goal[p] >= self.limits[p][1]:
                        break
                goal[p] += 1
                req[p] = max(req[p], goal[p])
                reasons[p] = Reason.SCALE_UP_THROUGHPUT if goal[p] > cur[p] else reasons[p]
        return {p: PoolPlan(goal[p], reasons[p], req[p], verdicts[p]) for p in self.pools}
