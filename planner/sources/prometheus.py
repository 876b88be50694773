"""Frontend traffic over one throughput interval, from Prometheus or from the frontend directly.

Figures (docs/architecture.md "Metrics facts"; Dynamo planner's Prometheus client): for each of the frontend
histograms ``dynamo_frontend_time_to_first_token_seconds``, ``..._inter_token_latency_seconds``,
``..._request_duration_seconds``, ``..._input_sequence_tokens``, ``..._output_sequence_tokens`` the
interval mean is ``sum(increase(X_sum{sel}[w])) / sum(increase(X_count{sel}[w]))``; the request count is
``sum(increase(dynamo_frontend_requests_started_total{sel}[w]))``. ``sel`` filters on the ``model``
label and, when configured, a namespace label. Latencies are converted to milliseconds (TTFT, ITL) and
seconds (request duration).

For the traffic sample of the sizing by simulation (:mod:`planner.core.sizing`) the window also carries
histograms as non-cumulative ``(le, count)`` pairs -- ``sum by (le) (increase(X_bucket{sel}[w]))`` of the
input and output length histograms (``isl_buckets``, ``osl_buckets``) and of the frontend's inter-arrival
histogram ``dynoplan_frontend_request_interarrival_seconds`` (``gap_buckets``), differenced between
consecutive bounds -- ``num_inflight``, ``sum(dynamo_frontend_inflight_requests{sel})`` at the query
instant (summed over frontends), and ``arrival_counts``, the requests started per
:data:`~planner.core.sizing.ARRIVAL_BIN_S` bin of the window (the sample's rate profile): a range query of
``sum(dynamo_frontend_requests_started_total{sel})`` at that step over the window, differenced between
consecutive points (a counter reset, a frontend restart, counts 0; a missing point leaves the profile out), and
``cached_prompt_share``, the share of the window's prompt tokens served from the prefix cache,
``sum(increase(dynamo_frontend_cached_tokens_sum{sel}[w])) / sum(increase(dynamo_frontend_input_sequence_tokens_
sum{sel}[w]))`` (tokens over tokens; Dynamo's per-request cached-token histogram, which the frontend fills from
the workers' ``usage.prompt_tokens_details.cached_tokens``), clamped to [0, 1] (``increase`` extrapolates each
series by its own samples) and NaN when the window has no prompt tokens. These
are optional: a frontend that does not export them (an empty result), or
an error answer to those queries (``optional_error``), gives an empty histogram / NaN in an otherwise known
window. ``increase`` extrapolates every bucket of one histogram by
the same factor (they are scraped together), so the buckets' *shares* are exact and their sum is
approximate like the request count.

Unknown is never zero: an unreachable server, an error answer, a timeout or an *empty* result (the
series do not exist) give ``None``. A window with no requests gives ``num_requests == 0`` and NaN means
(PromQL's 0/0), which the planner core reads as "no traffic" (that still allows scale-down).

:class:`DirectScrapeTrafficSource` is the fallback of ``dynoplan up`` when no ``prometheus`` binary is
installed: it scrapes the frontend's ``/metrics`` every ``scrape_interval_s`` and takes differences of
the cumulative ``_sum``/``_count``/``_total``/``_bucket`` values between the newest sample and the sample
closest to ``w`` seconds before it (no extrapolation, unlike PromQL's ``increase``); the in-flight gauge is
the newest sample's; its ``arrival_counts`` difference the samples nearest each bin edge; its
``cached_prompt_share`` is the difference of ``dynamo_frontend_cached_tokens_sum`` over that of
``dynamo_frontend_input_sequence_tokens_sum`` (NaN when either sample lacks the cached-token series).
"""

from __future__ import annotations

import bisect
import collections
import math
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from dynoplan.errors import ConfigError
from dynoplan.fields import HTTP_URL_EXPECTED, is_http_url
from dynoplan.settings import spell
from planner.core import TrafficWindow
from planner.core.sizing import ARRIVAL_BIN_S

HISTOGRAMS: dict[str, str] = {
    "ttft": "dynamo_frontend_time_to_first_token_seconds",
    "itl": "dynamo_frontend_inter_token_latency_seconds",
    "duration": "dynamo_frontend_request_duration_seconds",
    "isl": "dynamo_frontend_input_sequence_tokens",
    "osl": "dynamo_frontend_output_sequence_tokens",
}
REQUESTS_STARTED = "dynamo_frontend_requests_started_total"
BUCKETED: dict[str, str] = {
    "isl_buckets": "dynamo_frontend_input_sequence_tokens",
    "osl_buckets": "dynamo_frontend_output_sequence_tokens",
    "gap_buckets": "dynoplan_frontend_request_interarrival_seconds",
}
"""``TrafficWindow`` field -> frontend histogram whose buckets it carries (non-cumulative)."""
INFLIGHT = "dynamo_frontend_inflight_requests"
"""The frontend's in-flight gauge (``TrafficWindow.num_inflight``)."""
CACHED_TOKENS = "dynamo_frontend_cached_tokens"
"""The frontend's histogram of cached prompt tokens per request (tokens; ``TrafficWindow.cached_prompt_share`` is
its ``_sum`` over the input-length histogram's ``_sum``)."""


@dataclass(frozen=True, slots=True)
class PrometheusSourceSettings:
    """Where and how to query.

    - ``url``: Prometheus base URL, e.g. ``http://127.0.0.1:9090``.
    - ``model``: value of the frontend's ``model`` label to keep (None = every model).
    - ``namespace`` / ``namespace_label``: an extra label filter (None = none), e.g. a Kubernetes
      namespace label added by the scrape config.
    - ``timeout_s``: per-query HTTP timeout, seconds (default 5).
    - ``bearer_token``: sent as ``Authorization: Bearer ...`` (None = no auth).
    - ``ca_file``: CA bundle to verify an https server (None = system CAs); ``insecure_skip_verify``
      disables verification (tests only).
    """

    url: str
    model: str | None = None
    namespace: str | None = None
    namespace_label: str = "namespace"
    timeout_s: float = 5.0
    bearer_token: str | None = None
    ca_file: str | None = None
    insecure_skip_verify: bool = False

    def __post_init__(self) -> None:
        problems = []
        if not is_http_url(self.url):
            problems.append(f"prometheus.url={spell(self.url)}: {HTTP_URL_EXPECTED}")
        if not (isinstance(self.timeout_s, (int, float)) and self.timeout_s > 0):
            problems.append(f"prometheus.timeout_s={spell(self.timeout_s)}: expected seconds > 0")
        if problems:
            raise ConfigError(problems)


def label_selector(model: str | None, namespace: str | None, namespace_label: str = "namespace") -> str:
    """PromQL label matcher, e.g. ``{model="m",namespace="ns"}`` ('' when there is no filter)."""
    parts = []
    if model is not None:
        parts.append(f'model="{_esc(model)}"')
    if namespace is not None:
        parts.append(f'{namespace_label}="{_esc(namespace)}"')
    return "{" + ",".join(parts) + "}" if parts else ""


def _esc(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"')


def _duration(window_s: float) -> str:
    return f"{max(1, int(round(window_s * 1000)))}ms"


def interval_queries(window_s: float, selector: str = "") -> dict[str, str]:
    """The PromQL of every figure over a window of ``window_s`` seconds (see the module docstring)."""
    w = _duration(window_s)
    out = {
        k: f"sum(increase({m}_sum{selector}[{w}])) / sum(increase({m}_count{selector}[{w}]))"
        for k, m in HISTOGRAMS.items()
    }
    out["num_requests"] = f"sum(increase({REQUESTS_STARTED}{selector}[{w}]))"
    return out


def bucket_queries(window_s: float, selector: str = "") -> dict[str, str]:
    """``{TrafficWindow field: PromQL}`` of the bucketed histograms (:data:`BUCKETED`) over ``window_s``:
    ``sum by (le) (increase(X_bucket{sel}[w]))``, one series per bound (cumulative counts)."""
    w = _duration(window_s)
    return {k: f"sum by (le) (increase({m}_bucket{selector}[{w}]))" for k, m in BUCKETED.items()}


def cached_share_query(window_s: float, selector: str = "") -> str:
    """``sum(increase(dynamo_frontend_cached_tokens_sum{sel}[w])) / sum(increase(dynamo_frontend_input_sequence_
    tokens_sum{sel}[w]))``: the share of the window's prompt tokens served from the prefix cache (tokens over
    tokens; the definition of ``TrafficWindow.cached_prompt_share``). Both ``_sum`` series of one frontend are
    sampled at the same scrapes, so ``increase`` extrapolates them alike and the ratio keeps the exact share."""
    w = _duration(window_s)
    cached, prompt = CACHED_TOKENS + "_sum", HISTOGRAMS["isl"] + "_sum"
    return f"sum(increase({cached}{selector}[{w}])) / sum(increase({prompt}{selector}[{w}]))"


def cached_share(share: float | None) -> float:
    """``TrafficWindow.cached_prompt_share`` from a cached / prompt token ratio: NaN when unknown (None: no such
    series) or not finite (0 / 0 or x / 0: no prompt tokens in the window), else clamped to [0, 1] (``increase``
    extrapolates each series over its own samples, and a frontend may observe a request's cached and prompt
    tokens at different moments, so a window can hold one of them and not the other: the ratio can overshoot 1
    a little)."""
    if share is None or not math.isfinite(share):
        return math.nan
    return min(1.0, max(0.0, float(share)))


def inflight_query(selector: str = "") -> str:
    """``sum(dynamo_frontend_inflight_requests{sel})``: requests in flight now, over every frontend."""
    return f"sum({INFLIGHT}{selector})"


def arrival_profile_query(selector: str = "") -> str:
    """``sum(dynamo_frontend_requests_started_total{sel})``: the started-requests counter over every frontend, queried
    as a range at the profile's step (:func:`profile_from_counter` differences it)."""
    return f"sum({REQUESTS_STARTED}{selector})"


def profile_from_counter(
    points: Iterable[tuple[float, float]], start_s: float, bin_s: float, n_bins: int
) -> tuple[float, ...]:
    """Requests started per bin from a counter's values at ``start_s + k * bin_s`` (``k = 0 .. n_bins``, seconds):
    ``n_bins`` differences of consecutive points, a negative one (a counter reset) as 0. Empty when a point is
    missing or not finite (the profile is then unknown, not flat). ``points``: (time s, value) pairs, any order."""
    by_k: dict[int, float] = {}
    for t, v in points:
        k = round((float(t) - start_s) / bin_s)
        if 0 <= k <= n_bins and abs(float(t) - (start_s + k * bin_s)) < 1e-3 * bin_s:
            by_k[k] = float(v)
    if n_bins <= 0 or len(by_k) != n_bins + 1 or not all(math.isfinite(v) for v in by_k.values()):
        return ()
    return tuple(max(0.0, by_k[k + 1] - by_k[k]) for k in range(n_bins))


def non_cumulative(cumulative: Iterable[tuple[float | str, float]]) -> tuple[tuple[float, float], ...]:
    """Prometheus ``le`` buckets (cumulative counts, any order, +Inf included) -> ``(le, count)`` pairs in
    increasing ``le`` with the count of each bucket alone (differences of consecutive bounds; a negative
    difference, which extrapolated increases of a bucket pair can give by rounding, counts 0). Empty when
    there are no buckets or a count is not finite (no data)."""
    pairs = sorted((float(le), float(c)) for le, c in cumulative)
    if not pairs or not all(math.isfinite(c) for _, c in pairs):
        return ()
    if len({le for le, _ in pairs}) != len(pairs):
        raise ValueError(f"duplicate le bounds in {pairs!r}")
    out, prev = [], 0.0
    for le, c in pairs:
        out.append((le, max(0.0, c - prev)))
        prev = max(prev, c)
    return tuple(out)


def window_from_values(
    window_s: float,
    v: dict[str, float],
    buckets: Mapping[str, tuple[tuple[float, float], ...]] | None = None,
    num_inflight: float = math.nan,
    arrival_counts: tuple[float, ...] = (),
    cached_prompt_share: float = math.nan,
) -> TrafficWindow:
    """A TrafficWindow from figures in Prometheus units (seconds, tokens); ms conversion here. ``buckets``:
    ``{isl_buckets|osl_buckets|gap_buckets: non-cumulative pairs}``; ``num_inflight``: the in-flight gauge
    (NaN = not reported; a negative value, which a gauge cannot hold, is clamped to 0); ``arrival_counts``: requests
    started per profile bin, oldest first (empty = unknown); ``cached_prompt_share``: cached over prompt tokens
    (NaN = unknown; clamped to [0, 1] by :func:`cached_share`)."""
    n = v["num_requests"]
    extra: dict[str, Any] = {k: tuple(b) for k, b in (buckets or {}).items() if b}
    if arrival_counts:
        extra["arrival_counts"] = tuple(arrival_counts)
    if math.isfinite(num_inflight):
        extra["num_inflight"] = max(0.0, float(num_inflight))
    share = cached_share(cached_prompt_share)
    if not math.isnan(share):
        extra["cached_prompt_share"] = share
    if n <= 0:
        return TrafficWindow(window_s, max(0.0, n), **extra)
    return TrafficWindow(
        duration_s=window_s,
        num_requests=n,
        mean_isl_tokens=v["isl"],
        mean_osl_tokens=v["osl"],
        mean_ttft_ms=v["ttft"] * 1000.0,
        mean_itl_ms=v["itl"] * 1000.0,
        mean_request_duration_s=v["duration"],
        **extra,
    )


class PrometheusTrafficSource:
    """Reads a :class:`~planner.core.TrafficWindow` from a Prometheus server (prometheus-api-client).

    :meth:`read` is blocking (HTTP); the live service calls it in a worker thread. ``last_error`` holds
    the reason of the last ``None``.
    """

    def __init__(self, settings: PrometheusSourceSettings) -> None:
        from prometheus_api_client import PrometheusConnect

        self.settings = settings
        headers = {"Authorization": f"Bearer {settings.bearer_token}"} if settings.bearer_token else None
        from urllib3.util.retry import Retry

        # no client-side retries: a failed read is "unknown" for this tick; the next tick reads again
        self._prom = PrometheusConnect(
            url=settings.url,
            headers=headers,
            disable_ssl=settings.insecure_skip_verify,
            timeout=settings.timeout_s,
            retry=Retry(total=0, raise_on_status=False),
        )
        if settings.ca_file and not settings.insecure_skip_verify:
            self._prom._session.verify = settings.ca_file
        self.selector = label_selector(settings.model, settings.namespace, settings.namespace_label)
        self.last_error: str | None = None
        self.optional_error: str | None = None
        """Why the last read's histograms / in-flight gauge are missing (the window itself was read)."""

    def query(self, promql: str) -> float | None:
        """One instant query -> its single value (NaN kept), None when the result is empty.

        Raises whatever the client raises on a transport/HTTP error.
        """
        res = self._prom.custom_query(promql, timeout=self.settings.timeout_s)
        if not res:
            return None
        return float(res[0]["value"][1])

    def query_buckets(self, promql: str) -> tuple[tuple[float, float], ...]:
        """An instant query of ``sum by (le) (...)`` -> non-cumulative ``(le, count)`` pairs (empty result:
        ``()``). Raises whatever the client raises on a transport/HTTP error."""
        res = self._prom.custom_query(promql, timeout=self.settings.timeout_s)
        return non_cumulative((r["metric"]["le"], r["value"][1]) for r in res if "le" in r.get("metric", {}))

    def query_profile(self, end_s: float, window_s: float, bin_s: float = ARRIVAL_BIN_S) -> tuple[float, ...]:
        """Requests started per ``bin_s`` bin (whole seconds) of the ``window_s`` seconds before ``end_s`` (epoch
        seconds, rounded to a whole second as the client sends it), oldest first: :func:`profile_from_counter` of a
        range query (empty when the window holds no whole bin or a point is missing). Raises whatever the client
        raises on a transport/HTTP error."""
        import datetime

        n_bins = int(window_s // bin_s)
        if n_bins <= 0:
            return ()
        end_s = float(round(end_s))
        start_s = end_s - n_bins * bin_s

        def at(t: float) -> datetime.datetime:
            return datetime.datetime.fromtimestamp(t, tz=datetime.UTC)

        res = self._prom.custom_query_range(
            arrival_profile_query(self.selector),
            start_time=at(start_s),
            end_time=at(end_s),
            step=f"{bin_s:g}s",
            timeout=self.settings.timeout_s,
        )
        if len(res) != 1:
            return ()
        return profile_from_counter(((float(t), float(v)) for t, v in res[0]["values"]), start_s, bin_s, n_bins)

    def read(self, window_s: float) -> TrafficWindow | None:
        """The last ``window_s`` seconds of frontend traffic, or None when unknown (see module doc)."""
        end_s = time.time()
        values: dict[str, float] = {}
        try:
            for key, q in interval_queries(window_s, self.selector).items():
                val = self.query(q)
                if val is None:
                    self.last_error = f"empty result for {q}"
                    return None
                values[key] = val
        except Exception as e:  # noqa: BLE001 - any transport or server error is "unknown"
            self.last_error = self._reason(e)
            return None
        self.last_error = None
        buckets: dict[str, tuple[tuple[float, float], ...]] = {}
        inflight: float | None = None
        profile: tuple[float, ...] = ()
        share: float | None = None
        self.optional_error = None
        try:  # the sample's extras: a failure leaves them out of a window that is otherwise known
            for k, q in bucket_queries(window_s, self.selector).items():
                buckets[k] = self.query_buckets(q)
            inflight = self.query(inflight_query(self.selector))
            profile = self.query_profile(end_s, window_s)
            share = self.query(cached_share_query(window_s, self.selector))
        except Exception as e:  # noqa: BLE001
            self.optional_error = self._reason(e)
        return window_from_values(
            window_s, values, buckets, math.nan if inflight is None else inflight, profile, cached_share(share)
        )

    def _reason(self, e: BaseException) -> str:
        """One line on why a read failed; a TLS verification failure says which option fixes it."""
        import requests

        text = str(e)
        if isinstance(e, requests.exceptions.SSLError) or "CERTIFICATE_VERIFY_FAILED" in text:
            m = re.search(r"certificate verify failed:?\s*([^(']*)", text)
            detail = "certificate verify failed" + (f": {m.group(1).strip()}" if m and m.group(1).strip() else "")
            ca = f"the CA file {self.settings.ca_file!r}" if self.settings.ca_file else "the system CAs"
            return (
                f"TLS: {detail} for {self.settings.url} with {ca}; set prometheus.ca_file to the PEM CA "
                "bundle that signed the server's certificate"
            )
        m_status = re.match(r"HTTP Status Code (\d+)", text)  # prometheus_api_client's HTTP error answer
        status = int(m_status.group(1)) if m_status else None
        if status in (401, 403):
            tok = "the configured prometheus.bearer_token" if self.settings.bearer_token else "no bearer token"
            return (
                f"HTTP {status} from {self.settings.url} with {tok}: expected the server's token in "
                "prometheus.bearer_token"
            )
        if isinstance(e, requests.exceptions.Timeout) or "timed out" in text:  # without retries urllib3 wraps it
            return f"no answer from {self.settings.url} within timeout_s={self.settings.timeout_s:g}"
        if isinstance(e, requests.exceptions.ConnectionError):
            m = re.search(r"\[Errno -?\d+\] ([^'\")\]]+)", text)
            return f"cannot connect to {self.settings.url}: {m.group(1).strip() if m else type(e).__name__}"
        return f"{type(e).__name__}: {text[:200]}"


def parse_cumulative(text: str, model: str | None) -> dict[str, float]:
    """Sum of every ``<histogram>_sum``/``_count``, ``requests_started_total``, in-flight gauge and
    ``dynamo_frontend_cached_tokens_sum`` sample of the frontend exposition ``text`` (matching ``model`` when
    given), and of every bucket of the :data:`BUCKETED` histograms. Keys are metric sample names,
    ``<histogram>_bucket|<le>`` for buckets."""
    from prometheus_client.parser import text_string_to_metric_families

    wanted = {m + s for m in HISTOGRAMS.values() for s in ("_sum", "_count")} | {
        REQUESTS_STARTED,
        INFLIGHT,
        CACHED_TOKENS + "_sum",
    }
    bucketed = {m + "_bucket" for m in BUCKETED.values()}
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if model is not None and s.labels.get("model") != model:
                continue
            key = s.name if s.name in wanted else (f"{s.name}|{s.labels['le']}" if s.name in bucketed else None)
            if key is not None:
                out[key] = out.get(key, 0.0) + float(s.value)
    return out


class DirectScrapeTrafficSource:
    """Fallback without Prometheus: scrapes ``frontend_url``/metrics in a background thread.

    ``scrape_interval_s`` (default 1 s) between samples; samples older than ``keep_s`` are dropped.
    ``clock`` (default ``time.time``) is injectable for tests. Call :meth:`start` then :meth:`read`;
    :meth:`close` stops the thread.
    """

    def __init__(
        self,
        frontend_url: str,
        model: str | None = None,
        scrape_interval_s: float = 1.0,
        keep_s: float = 3600.0,
        timeout_s: float = 2.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.url = frontend_url.rstrip("/") + "/metrics"
        self.model = model
        self.scrape_interval_s = scrape_interval_s
        self.keep_s = keep_s
        self.timeout_s = timeout_s
        self.clock = clock
        self.samples: collections.deque[tuple[float, dict[str, float]]] = collections.deque()
        self.last_error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def scrape_once(self) -> bool:
        import requests

        try:
            r = requests.get(self.url, timeout=self.timeout_s)
            r.raise_for_status()
            vals = parse_cumulative(r.text, self.model)
        except Exception as e:  # noqa: BLE001
            self.last_error = f"{type(e).__name__}: {str(e)[:200]}"
            return False
        now = self.clock()
        with self._lock:
            self.samples.append((now, vals))
            while self.samples and now - self.samples[0][0] > self.keep_s:
                self.samples.popleft()
        self.last_error = None
        return True

    def start(self) -> DirectScrapeTrafficSource:
        def loop() -> None:
            while not self._stop.is_set():
                self.scrape_once()
                self._stop.wait(self.scrape_interval_s)

        self._thread = threading.Thread(target=loop, name="direct-scrape", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def read(self, window_s: float) -> TrafficWindow | None:
        """Differences between the newest sample and the one nearest ``window_s`` before it; None when
        the newest sample is stale (> 3 scrape intervals old) or there are fewer than two samples."""
        with self._lock:
            samples = list(self.samples)
        if len(samples) < 2:
            return None
        t1, new = samples[-1]
        if self.clock() - t1 > 3 * self.scrape_interval_s + self.timeout_s:
            return None
        t0, old = min(samples[:-1], key=lambda s: abs((t1 - s[0]) - window_s))

        def d(name: str) -> float:
            return max(0.0, new.get(name, math.nan) - old.get(name, math.nan))

        if REQUESTS_STARTED not in new:
            return None
        v: dict[str, Any] = {"num_requests": d(REQUESTS_STARTED)}
        for k, m in HISTOGRAMS.items():
            c = d(m + "_count")
            v[k] = d(m + "_sum") / c if c > 0 else math.nan
        buckets = {}
        for k, m in BUCKETED.items():
            prefix = m + "_bucket|"
            les = [key[len(prefix) :] for key in new if key.startswith(prefix)]
            buckets[k] = non_cumulative((le, d(prefix + le)) for le in les)
        share: float | None = None
        cached, prompt = CACHED_TOKENS + "_sum", HISTOGRAMS["isl"] + "_sum"
        if cached in new and cached in old and d(prompt) > 0:  # absent series / no prompt tokens: unknown
            share = d(cached) / d(prompt)
        return window_from_values(
            window_s, v, buckets, new.get(INFLIGHT, math.nan), self.profile(samples, t1, window_s), cached_share(share)
        )

    def profile(
        self, samples: list[tuple[float, dict[str, float]]], end_s: float, window_s: float, bin_s: float = ARRIVAL_BIN_S
    ) -> tuple[float, ...]:
        """Requests started per ``bin_s`` bin of the ``window_s`` seconds before ``end_s``, oldest first: the counter
        of the sample nearest each bin edge, differenced (empty when a bin edge has no sample within one scrape
        interval, or the window holds no whole bin)."""
        n_bins = int(window_s // bin_s)
        if n_bins <= 0:
            return ()
        start_s = end_s - n_bins * bin_s
        times = [t for t, _ in samples]  # in scrape order, increasing
        points = []
        for k in range(n_bins + 1):
            edge = start_s + k * bin_s
            i = bisect.bisect_left(times, edge)
            j = min((x for x in (i - 1, i) if 0 <= x < len(times)), key=lambda x: abs(times[x] - edge))
            t, vals = samples[j]
            if abs(t - edge) > self.scrape_interval_s or REQUESTS_STARTED not in vals:
                return ()
            points.append((edge, vals[REQUESTS_STARTED]))
        return profile_from_counter(points, start_s, bin_s, n_bins)
