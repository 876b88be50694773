"""Simulated metric source: the frontend's Prometheus counters, computed from request records.

A live frontend exports histograms (``dynamo_frontend_time_to_first_token_seconds``, ``..._inter_token_
latency_seconds``, ``..._input_sequence_tokens``, ``..._output_sequence_tokens``, ``..._request_duration_
seconds``) and the counter ``dynamo_frontend_requests_started_total``; the planner reads interval averages
``increase(X_sum[w]) / increase(X_count[w])`` (docs/architecture.md "Metrics facts"). :class:`FrontendCounters`
keeps the same cumulative ``_sum``/``_count`` pairs, observed at the virtual time each event happens:

- requests started and ISL: at arrival;
- TTFT: when the first token is emitted (``first_token_ms``), also counted in an SLA bucket
  (``le=`` the TTFT target) as a Prometheus histogram with a bucket boundary at the target gives; the request's
  cached prompt tokens (``dynamo_frontend_cached_tokens``, ``RequestRecord.cached_tokens``) at the same time;
- inter-arrival gap (histogram ``dynoplan_frontend_request_interarrival_seconds``): at arrival, from the
  previous arrival; in-flight requests (gauge): started minus terminal at the scrape;
- ITL, OSL, request duration: when the request finishes (plus an SLA bucket of per-request mean ITL). A live
  frontend observes each inter-token gap as it is emitted; adding a finished request's ``E2E - TTFT`` to the
  ITL sum and ``tokens - 1`` to its count gives the same totals once the request is done (only the split
  across a window boundary of a request still running differs).

:meth:`FrontendCounters.scrape` at virtual time ``t`` counts only events at or before ``t`` (an engine pass
that started before ``t`` may end after it). :meth:`window` differences two scrapes into a
:class:`planner.core.TrafficWindow` (NaN means when nothing was observed, as Prometheus gives).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

from mocker.records import RequestRecord
from planner.core import TrafficWindow
from planner.core.sizing import GAP_BUCKETS_S


@dataclass(frozen=True, slots=True)
class CounterSnapshot:
    """Cumulative frontend counters at ``t_s`` (sums in ms or tokens as named)."""

    t_s: float
    started: int = 0
    isl_sum_tokens: float = 0.0
    ttft_sum_ms: float = 0.0
    ttft_count: int = 0
    itl_sum_ms: float = 0.0
    itl_count: int = 0
    osl_sum_tokens: float = 0.0
    finished: int = 0
    duration_sum_s: float = 0.0
    ttft_within_sla: int = 0
    """First tokens whose TTFT <= the TTFT target (a histogram's ``le=target`` bucket)."""
    itl_within_sla: int = 0
    """Finished requests whose own mean ITL <= the ITL target (single-token requests count as within)."""
    osl_bucket_counts: tuple[int, ...] = ()
    """Finished requests per output-length bucket (:data:`OSL_BUCKETS_TOKENS`, non-cumulative)."""
    isl_bucket_counts: tuple[int, ...] = ()
    """Started requests per input-length bucket (:data:`ISL_BUCKETS_TOKENS`, non-cumulative)."""
    gap_bucket_counts: tuple[int, ...] = ()
    """Gaps between consecutive arrivals per bucket (:data:`planner.core.sizing.GAP_BUCKETS_S`, non-cumulative)."""
    inflight: int = 0
    """Requests started and not yet terminal at ``t_s`` (the frontend's in-flight gauge)."""
    cached_sum_tokens: float = 0.0
    """Prompt tokens served from the prefix cache, of the requests whose first token came (the
    ``dynamo_frontend_cached_tokens`` histogram's ``_sum``)."""


OSL_BUCKETS_TOKENS: tuple[float, ...] = tuple(float(2**k) for k in range(17)) + (math.inf,)
"""Upper bounds (``le``) of the simulated ``dynamo_frontend_output_sequence_tokens`` histogram: powers of 2
from 1 to 65536 tokens, then +Inf."""
ISL_BUCKETS_TOKENS: tuple[float, ...] = tuple(float(2**k) for k in range(21)) + (math.inf,)
"""Upper bounds of the simulated ``dynamo_frontend_input_sequence_tokens`` histogram: powers of 2 from 1 to
2**20 tokens, then +Inf."""


class FrontendCounters:
    """Cumulative frontend counters fed with records as requests arrive (see module docstring)."""

    def __init__(self, sla_ttft_ms: float = math.inf, sla_itl_ms: float = math.inf) -> None:
        self.sla_ttft_ms = sla_ttft_ms
        self.sla_itl_ms = sla_itl_ms
        self._ttft_ok = 0
        self._itl_ok = 0
        self._started = 0
        self._isl = 0.0
        self._ttft_sum = 0.0
        self._ttft_n = 0
        self._itl_sum = 0.0
        self._itl_n = 0
        self._osl = 0.0
        self._fin = 0
        self._dur = 0.0
        self._cached = 0.0
        self.terminal = 0
        """Requests finished, failed or cancelled at or before the last scrape."""
        self._osl_counts = [0] * len(OSL_BUCKETS_TOKENS)
        self._isl_counts = [0] * len(ISL_BUCKETS_TOKENS)
        self._gap_counts = [0] * len(GAP_BUCKETS_S)
        self._last_arrival_ms: float | None = None
        self._arrivals_ms: list[float] = []
        self._wait_ttft: list[RequestRecord] = []
        self._wait_finish: list[RequestRecord] = []

    def on_arrival(self, rec: RequestRecord) -> None:
        """A request started (``arrival_ms`` <= the next scrape time)."""
        self._started += 1
        self._isl += rec.input_length
        self._isl_counts[bisect.bisect_left(ISL_BUCKETS_TOKENS, rec.input_length)] += 1
        if self._last_arrival_ms is not None:
            gap_s = (rec.arrival_ms - self._last_arrival_ms) / 1000.0
            self._gap_counts[bisect.bisect_left(GAP_BUCKETS_S, gap_s)] += 1
        self._last_arrival_ms = rec.arrival_ms
        self._arrivals_ms.append(rec.arrival_ms)
        self._wait_ttft.append(rec)
        self._wait_finish.append(rec)

    def arrival_counts(self, t0_s: float, t1_s: float, bin_s: float) -> tuple[float, ...]:
        """Arrivals per ``bin_s`` bin of ``(t0_s, t1_s]``, bins ending at ``t1_s``, oldest first (a range query of the
        request counter's increase at step ``bin_s``); a partial oldest bin is left out."""
        k = int((t1_s - t0_s) // bin_s + 1e-9)
        edges = [(t1_s - (k - i) * bin_s) * 1000.0 for i in range(k + 1)]
        idx = [bisect.bisect_right(self._arrivals_ms, e) for e in edges]
        return tuple(float(b - a) for a, b in zip(idx, idx[1:]))

    def scrape(self, t_s: float) -> CounterSnapshot:
        """Counters at virtual time ``t_s`` (events at or before it)."""
        t_ms = t_s * 1000.0
        keep = []
        for r in self._wait_ttft:
            ft = r.first_token_ms
            if ft is not None and ft <= t_ms:
                self._ttft_sum += ft - r.arrival_ms
                self._ttft_n += 1
                self._cached += r.cached_tokens
                if ft - r.arrival_ms <= self.sla_ttft_ms:
                    self._ttft_ok += 1
            elif r.status in ("failed", "cancelled") and r.finish_ms is not None and r.finish_ms <= t_ms:
                pass
            else:
                keep.append(r)
        self._wait_ttft = keep
        keep = []
        for r in self._wait_finish:
            fin = r.finish_ms
            if fin is not None and fin <= t_ms:
                self.terminal += 1
                if r.status == "finished":
                    self._fin += 1
                    self._osl += r.output_length
                    self._osl_counts[bisect.bisect_left(OSL_BUCKETS_TOKENS, r.output_length)] += 1
                    self._dur += (fin - r.arrival_ms) / 1000.0
                    if r.first_token_ms is not None and r.output_length > 1:
                        self._itl_sum += fin - r.first_token_ms
                        self._itl_n += r.output_length - 1
                        if (fin - r.first_token_ms) / (r.output_length - 1) <= self.sla_itl_ms:
                            self._itl_ok += 1
                    else:
                        self._itl_ok += 1
            else:
                keep.append(r)
        self._wait_finish = keep
        return CounterSnapshot(
            t_s,
            self._started,
            self._isl,
            self._ttft_sum,
            self._ttft_n,
            self._itl_sum,
            self._itl_n,
            self._osl,
            self._fin,
            self._dur,
            self._ttft_ok,
            self._itl_ok,
            tuple(self._osl_counts),
            tuple(self._isl_counts),
            tuple(self._gap_counts),
            self._started - self.terminal,
            self._cached,
        )


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else math.nan


def _share(part: float, whole: float) -> float:
    """``part / whole`` clamped to [0, 1] (the two counters are observed at different moments of a request: a
    window can hold the first tokens of requests that started before it); NaN when ``whole`` is 0."""
    return min(1.0, max(0.0, part / whole)) if whole > 0 else math.nan


def window(new: CounterSnapshot, old: CounterSnapshot) -> TrafficWindow:
    """``increase(X_sum) / increase(X_count)`` between two scrapes, as a TrafficWindow over ``new.t_s - old.t_s``."""
    d = new.t_s - old.t_s
    started = new.started - old.started
    return TrafficWindow(
        duration_s=d,
        num_requests=float(started),
        mean_isl_tokens=_ratio(new.isl_sum_tokens - old.isl_sum_tokens, started),
        mean_osl_tokens=_ratio(new.osl_sum_tokens - old.osl_sum_tokens, new.finished - old.finished),
        mean_ttft_ms=_ratio(new.ttft_sum_ms - old.ttft_sum_ms, new.ttft_count - old.ttft_count),
        mean_itl_ms=_ratio(new.itl_sum_ms - old.itl_sum_ms, new.itl_count - old.itl_count),
        mean_request_duration_s=_ratio(new.duration_sum_s - old.duration_sum_s, new.finished - old.finished),
        num_ttft_observed=float(new.ttft_count - old.ttft_count),
        num_ttft_within_sla=float(new.ttft_within_sla - old.ttft_within_sla),
        num_finished=float(new.finished - old.finished),
        num_itl_within_sla=float(new.itl_within_sla - old.itl_within_sla),
        osl_buckets=_bucket_increase(OSL_BUCKETS_TOKENS, new.osl_bucket_counts, old.osl_bucket_counts),
        isl_buckets=_bucket_increase(ISL_BUCKETS_TOKENS, new.isl_bucket_counts, old.isl_bucket_counts),
        gap_buckets=_bucket_increase(GAP_BUCKETS_S, new.gap_bucket_counts, old.gap_bucket_counts),
        num_inflight=float(new.inflight),
        cached_prompt_share=_share(
            new.cached_sum_tokens - old.cached_sum_tokens, new.isl_sum_tokens - old.isl_sum_tokens
        ),
    )


def _bucket_increase(
    bounds: tuple[float, ...], new: tuple[int, ...], old: tuple[int, ...]
) -> tuple[tuple[float, float], ...]:
    """``(le, increase)`` per bucket between two scrapes (empty when either scrape has no histogram)."""
    if not new or len(new) != len(old):
        return ()
    return tuple((le, float(a - b)) for le, a, b in zip(bounds, new, old))


def sla_miss_shares(new: CounterSnapshot, old: CounterSnapshot) -> tuple[float, float]:
    """(share of first tokens over the TTFT target, share of finished requests over the ITL target) between
    two scrapes — ``1 - increase(bucket{le=target}) / increase(count)``; NaN when nothing was observed."""
    nt = new.ttft_count - old.ttft_count
    nf = new.finished - old.finished
    t = 1.0 - (new.ttft_within_sla - old.ttft_within_sla) / nt if nt > 0 else math.nan
    i = 1.0 - (new.itl_within_sla - old.itl_within_sla) / nf if nf > 0 else math.nan
    return t, i
