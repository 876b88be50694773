"""Metric sources against real processes: a live frontend + worker, a real Prometheus, the workers'
ZMQ FPM stream.

Exactness: Prometheus' ``increase`` extrapolates to the window edges, but ``_sum`` and ``_count`` of one
histogram are scraped at the same instants and extrapolated by the same factor, so the interval *means*
(ISL, OSL, TTFT, ...) equal the exact means of the requests in the window; only the request count is
approximate (within 10% here). The direct-scrape fallback differences cumulative values without
extrapolation, so its means must agree with Prometheus' to float precision.
"""

from __future__ import annotations

import math
import time

import pytest
import requests
from aiohttp import ClientSession, web

from dynoplan.errors import ConfigError
from planner.sources.fpm import FpmSubscriber
from planner.sources.prometheus import (
    REQUESTS_STARTED,
    DirectScrapeTrafficSource,
    PrometheusSourceSettings,
    PrometheusTrafficSource,
    interval_queries,
    label_selector,
)
from tests.infra._proc import free_port, wait_until
from tests.live.procs import LiveStack

pytestmark = pytest.mark.integration

WORKER = ("--speedup-ratio", "20", "--num-gpu-blocks", "2048", "--block-size", "16", "--trace-block-size", "16")


def test_queries_and_selector_shape():
    assert label_selector("m", None) == '{model="m"}'
    assert label_selector("m", "ns", "k8s_ns") == '{model="m",k8s_ns="ns"}'
    assert label_selector(None, None) == ""
    q = interval_queries(180, '{model="m"}')
    assert q["ttft"] == (
        'sum(increase(dynamo_frontend_time_to_first_token_seconds_sum{model="m"}[180000ms])) / '
        'sum(increase(dynamo_frontend_time_to_first_token_seconds_count{model="m"}[180000ms]))'
    )
    assert q["num_requests"] == 'sum(increase(dynamo_frontend_requests_started_total{model="m"}[180000ms]))'


def test_settings_errors_name_the_field():
    with pytest.raises(ConfigError) as e:
        PrometheusSourceSettings(url="localhost:9090", timeout_s=0)
    assert 'prometheus.url="localhost:9090"' in str(e.value) and "prometheus.timeout_s=0" in str(e.value)


def test_unreachable_is_unknown_not_zero():
    url = f"http://127.0.0.1:{free_port()}"
    src = PrometheusTrafficSource(PrometheusSourceSettings(url=url, timeout_s=1))
    assert src.read(10.0) is None and src.last_error == f"cannot connect to {url}: Connection refused"


def test_silent_server_is_unknown_after_the_timeout():
    import socket

    with socket.socket() as s:  # accepts connections (backlog) but never answers
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
        src = PrometheusTrafficSource(PrometheusSourceSettings(url=url, timeout_s=0.3))
        assert src.read(10.0) is None and src.last_error == f"no answer from {url} within timeout_s=0.3"


async def _token_proxy(target: str, token: str) -> tuple[web.AppRunner, str]:
    """A reverse proxy that demands ``Authorization: Bearer token`` in front of a real Prometheus."""
    session = ClientSession()

    async def handle(request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != f"Bearer {token}":
            return web.Response(status=401, text="unauthorized")
        async with session.get(target + request.path_qs) as r:
            return web.Response(status=r.status, body=await r.read(), content_type="application/json")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    app.on_cleanup.append(lambda _: session.close())
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}"


def test_prometheus_and_direct_scrape_agree_with_the_load(prometheus_factory):
    import asyncio
    import threading

    with LiveStack() as st:
        w = st.worker("w", *WORKER, "--worker-id", "1")
        fe = st.frontend("fe", "--workers", w)
        prom = prometheus_factory({"frontend": [fe.removeprefix("http://")]}, scrape_interval_s=0.5)
        prom.wait_for_scrapes(2)
        direct = DirectScrapeTrafficSource(fe, model="mocker", scrape_interval_s=0.25).start()
        try:
            t0 = time.time()
            n = 40
            rc, rep, err = st.loadgen(
                "--url",
                fe,
                "--trace-block-size",
                "16",
                "--trace",
                f"synthetic:poisson?rate=40&num_requests={n}&isl=uniform:100:600&osl=uniform:5:40&seed=7",
            )
            assert rc == 0 and rep["completed_requests"] == n, err
            prom.wait_for_scrapes(3)
            time.sleep(0.6)
            window = time.time() - t0 + 10.0  # reaches back before the first request (Prometheus started earlier)
            src = PrometheusTrafficSource(PrometheusSourceSettings(url=prom.url, model="mocker"))
            tw = src.read(window)
            assert tw is not None, src.last_error
            dw = direct.read(window)
            assert dw is not None, direct.last_error
            assert dw.num_requests == n  # no extrapolation
            # PromQL increase() extrapolates the sampled increase (last - first sample in the window) towards
            # the window's edges by at most 1.1 scrape intervals on each side (Prometheus extrapolatedRate);
            # bound it from the raw samples instead of a fixed tolerance (the series may span only a few s).
            raw = prom.client().custom_query(f'{REQUESTS_STARTED}{{model="mocker"}}[{int(window) + 1}s]')
            assert len(raw) == 1, raw
            samples = [(float(t), float(v)) for t, v in raw[0]["values"]]
            assert samples[-1][1] == n
            sampled = samples[-1][1] - samples[0][1]
            span_s = samples[-1][0] - samples[0][0]
            assert span_s > 0
            slack_s = 2 * 1.1 * prom.scrape_interval_s + prom.scrape_interval_s  # + one scrape between queries
            assert sampled * (1 - 1e-9) <= tw.num_requests <= sampled * (span_s + slack_s) / span_s
            isl = prom.query_scalar("dynamo_frontend_input_sequence_tokens_sum") / n
            osl = rep["total_output_tokens"] / n
            for w_ in (tw, dw):
                assert w_.mean_isl_tokens == pytest.approx(isl, rel=1e-9)
                assert w_.mean_osl_tokens == pytest.approx(osl, rel=1e-9)
            for f in ("mean_ttft_ms", "mean_itl_ms", "mean_request_duration_s"):
                assert getattr(tw, f) == pytest.approx(getattr(dw, f), rel=1e-6), f
                assert getattr(tw, f) > 0
            # the live frontend's inter-arrival histogram: one gap per request after the first; all answered
            assert sum(c for _, c in dw.gap_buckets) == n - 1 and sum(c for _, c in dw.isl_buckets) == n
            tw_gaps = sum(c for _, c in tw.gap_buckets)
            assert (n - 1) * (1 - 1e-9) <= tw_gaps <= (n - 1) * (span_s + slack_s) / span_s
            for (le_t, c_t), (le_d, c_d) in zip(tw.gap_buckets, dw.gap_buckets, strict=True):
                assert le_t == le_d and c_t / tw_gaps == pytest.approx(c_d / (n - 1), abs=1e-9)
            # the gaps' total is the span of the arrivals, which a Poisson trace of 40 req/s puts near 1 s
            assert (
                0.2 < prom.query_scalar('sum(dynoplan_frontend_request_interarrival_seconds_sum{model="mocker"})') < 5
            )
            assert tw.num_inflight == 0.0 and dw.num_inflight == 0.0
            # a model nobody serves: empty result = unknown
            other = PrometheusTrafficSource(PrometheusSourceSettings(url=prom.url, model="nobody"))
            assert other.read(window) is None and "empty result" in other.last_error
            # a quiet window: zero requests (known), NaN means
            time.sleep(2.5)
            quiet = src.read(1.5)
            assert quiet is not None and quiet.num_requests == 0 and math.isnan(quiet.mean_ttft_ms)
            # bearer token through an authenticating proxy in front of the real server
            loop = asyncio.new_event_loop()
            th = threading.Thread(target=loop.run_forever, daemon=True)
            th.start()
            runner, purl = asyncio.run_coroutine_threadsafe(_token_proxy(prom.url, "tok"), loop).result(10)
            try:
                ok = PrometheusTrafficSource(PrometheusSourceSettings(url=purl, model="mocker", bearer_token="tok"))
                got = ok.read(window)
                assert got is not None and got.mean_isl_tokens == pytest.approx(isl, rel=1e-9)
                bad = PrometheusTrafficSource(PrometheusSourceSettings(url=purl, model="mocker", bearer_token="nope"))
                assert bad.read(window) is None and bad.last_error == (
                    f"HTTP 401 from {purl} with the configured prometheus.bearer_token: expected the server's token "
                    "in prometheus.bearer_token"
                )
                none = PrometheusTrafficSource(PrometheusSourceSettings(url=purl, model="mocker"))
                assert none.read(window) is None and none.last_error.startswith(f"HTTP 401 from {purl} with no bearer")
            finally:
                asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
                loop.call_soon_threadsafe(loop.stop)
                th.join(5)
        finally:
            direct.close()


def test_fpm_subscriber_tags_pool_keeps_latest_and_drops_stale():
    with LiveStack() as st:
        w = st.worker("w", *WORKER, "--worker-id", "7", "--heartbeat-s", "60")
        info = requests.get(w + "/info", timeout=5).json()
        fake_now = [time.time()]
        sub = FpmSubscriber(stale_s=5.0, clock=lambda: fake_now[0])
        try:
            sub.set_endpoints({info["fpm_endpoint"]: "agg"})
            got: list = []

            def some_passes() -> bool:
                requests.post(
                    w + "/v1/completions",
                    json={"model": "mocker", "prompt": "hi", "max_tokens": 4, "input_length": 100},
                    timeout=10,
                )
                got.extend(sub.drain())
                return any(p.wall_time > 0 for p in got)

            wait_until(some_passes, 30, "ForwardPassMetrics over ZMQ")
            time.sleep(0.3)  # the last passes of the (finished) request are delivered before the clock moves
            got.extend(sub.drain())
            assert {p.pool for p in got} == {"agg"} and {p.worker_id for p in got} == {7}
            assert all(p.timestamp_s == fake_now[0] for p in got)
            assert sum(p.scheduled_requests.sum_prefill_tokens for p in got) >= 100
            assert set(sub.latest()) == {(7, 0)}
            fake_now[0] += 4.0
            assert set(sub.latest()) == {(7, 0)}  # 4 s < stale_s: kept
            fake_now[0] += 2.0  # nothing received for 6 s on the subscriber's clock (heartbeat every 60 s)
            assert sub.latest() == {}
            # a new pass brings the engine back; the worker then leaves the fleet: forgotten at once
            got.clear()
            wait_until(some_passes, 30, "more passes")
            assert set(sub.latest()) == {(7, 0)}
            sub.set_endpoints({})
            wait_until(lambda: sub.latest() == {}, 10, "engines of a removed endpoint dropped")
        finally:
            sub.close()


def _serve_registry(registry) -> tuple[str, object]:  # type: ignore[no-untyped-def]
    from prometheus_client import start_http_server

    port = free_port()
    server, _thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    return f"127.0.0.1:{port}", server


def test_histograms_and_inflight_read_back_from_a_real_prometheus(prometheus_factory):
    """The sample's inputs: bucket increases of the gap, ISL and OSL histograms, and the in-flight gauge summed
    over frontends, from two exporters of the frontend's own metric definitions with hand-set values."""
    from mocker.live.metrics import FrontendMetrics

    a, b = FrontendMetrics("mocker"), FrontendMetrics("mocker")
    b.inflight.labels("other")  # another model on frontend b: filtered out by the selector
    ta, sa = _serve_registry(a.registry)
    tb, sb = _serve_registry(b.registry)
    direct = None
    try:
        prom = prometheus_factory({"frontend": [ta, tb]}, scrape_interval_s=0.5)
        prom.wait_for_scrapes(3)  # every series sampled at 0 before anything happens
        direct = DirectScrapeTrafficSource("http://" + ta, model="mocker", scrape_interval_s=0.25).start()
        wait_until(lambda: len(direct.samples) >= 2, 10, "direct scrapes at 0")
        t0 = time.time()
        # frontend a: gaps 0.001 (on a bound), 0.0005, 0.003, 0.010, 1.0, 10, 200 s; frontend b: none
        t = 0.0
        for gap in (None, 0.001, 0.0005, 0.003, 0.010, 1.0, 10.0, 200.0):
            t += gap or 0.0
            a.observe_arrival("mocker", t)
        for isl, osl in ((100, 20), (100, 20), (700, 300), (5000, 1)):
            a.isl.labels("mocker").observe(isl)
            a.osl.labels("mocker").observe(osl)
        a.inflight.labels("mocker").inc(2)
        b.inflight.labels("mocker").inc(3)
        b.inflight.labels("other").inc(7)
        wait_until(
            lambda: prom.query_scalar('sum(dynoplan_frontend_request_interarrival_seconds_count{model="mocker"})') == 7,
            20,
            "gaps scraped",
        )
        prom.wait_for_scrapes(2)
        time.sleep(0.5)  # direct scrapes after the last change
        window = time.time() - t0 + 5.0  # reaches back to samples before the first observation
        src = PrometheusTrafficSource(PrometheusSourceSettings(url=prom.url, model="mocker"))
        tw = src.read(window)
        assert tw is not None, src.last_error
        dw = direct.read(window)
        assert dw is not None, direct.last_error
        gaps = {0.001: 2, 0.004: 1, 0.016: 1, 1.024: 1, 16.384: 1, math.inf: 1}  # hand-computed
        isls = {128: 2, 1024: 1, 8192: 1}
        osls = {32: 2, 1: 1, 512: 1}
        for got, want, n_bounds in ((tw.gap_buckets, gaps, 20), (tw.isl_buckets, isls, 17), (tw.osl_buckets, osls, 17)):
            assert (
                [le for le, _ in got] == sorted(le for le, _ in got) and len(got) == n_bounds and got[-1][0] == math.inf
            )
            total = sum(c for _, c in got)
            n = sum(want.values())
            # increase() extrapolates the series of one target by one factor: the shares are exact, the total is
            # n times (span + at most 1.1 scrape intervals + one scrape between queries) / span
            assert n * (1 - 1e-9) <= total <= n * (window + 2 * 1.1 * 0.5 + 0.5) / (window - 2 * 0.5)
            for le, c in got:
                assert c / total == pytest.approx(want.get(le, 0) / n, abs=1e-12), (le, got)
        # the direct scrape differences exact cumulative counts of frontend a (no extrapolation)
        assert {le: c for le, c in dw.gap_buckets if c} == gaps
        assert {le: c for le, c in dw.isl_buckets if c} == isls and {le: c for le, c in dw.osl_buckets if c} == osls
        assert tw.num_inflight == 5.0  # 2 + 3 over both frontends, not model "other"'s 7
        assert dw.num_inflight == 2.0  # frontend a alone
        # a window after the burst: no new gap, still 5 in flight (a gauge, not an increase)
        time.sleep(1.5)
        quiet = src.read(1.0)
        assert quiet is not None and quiet.num_requests == 0 and quiet.num_inflight == 5.0
        assert sum(c for _, c in quiet.gap_buckets) == 0
    finally:
        if direct is not None:
            direct.close()
        sa.shutdown()  # type: ignore[attr-defined]
        sb.shutdown()  # type: ignore[attr-defined]


def test_a_frontend_without_the_new_series_gives_a_known_window(prometheus_factory):
    """An older frontend (no inter-arrival histogram, no in-flight gauge): the window is known, its gap histogram
    empty and num_inflight NaN (the sample then draws Poisson arrivals and starts empty)."""
    from prometheus_client import CollectorRegistry, Counter, Histogram

    r = CollectorRegistry()
    for name in (
        "time_to_first_token_seconds",
        "inter_token_latency_seconds",
        "request_duration_seconds",
        "input_sequence_tokens",
        "output_sequence_tokens",
    ):
        Histogram("dynamo_frontend_" + name, "x", ["model"], registry=r).labels("mocker").observe(1.0)
    Counter("dynamo_frontend_requests_started", "x", ["model"], registry=r).labels("mocker").inc()
    target, server = _serve_registry(r)
    try:
        prom = prometheus_factory({"frontend": [target]}, scrape_interval_s=0.5)
        prom.wait_for_scrapes(3)
        src = PrometheusTrafficSource(PrometheusSourceSettings(url=prom.url, model="mocker"))
        tw = src.read(5.0)
        assert tw is not None, src.last_error
        assert tw.gap_buckets == () and math.isnan(tw.num_inflight)
        assert [le for le, _ in tw.isl_buckets][:2] == [
            0.005,
            0.01,
        ]  # prometheus_client's default bounds, read as given
        assert src.optional_error is None
        # a server that answers the bucket queries with an error: the window is still known, without histograms
        import asyncio
        import threading

        loop = asyncio.new_event_loop()
        th = threading.Thread(target=loop.run_forever, daemon=True)
        th.start()
        runner, purl = asyncio.run_coroutine_threadsafe(_refusing_proxy(prom.url, "_bucket"), loop).result(10)
        try:
            via = PrometheusTrafficSource(PrometheusSourceSettings(url=purl, model="mocker"))
            got = via.read(5.0)
            assert got is not None and got.num_requests == tw.num_requests and got.isl_buckets == ()
            assert via.optional_error is not None and "503" in via.optional_error, via.optional_error
        finally:
            asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
            loop.call_soon_threadsafe(loop.stop)
            th.join(5)
    finally:
        server.shutdown()  # type: ignore[attr-defined]


async def _refusing_proxy(target: str, refuse: str) -> tuple[web.AppRunner, str]:
    """A reverse proxy in front of a real Prometheus that answers 503 to every query containing ``refuse``."""
    session = ClientSession()

    async def handle(request: web.Request) -> web.Response:
        if refuse in request.query.get("query", ""):
            return web.Response(status=503, text="unavailable")
        async with session.get(target + request.path_qs) as r:
            return web.Response(status=r.status, body=await r.read(), content_type="application/json")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    app.on_cleanup.append(lambda _: session.close())
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}"


def _runs(counts):
    """Sums of the maximal runs of non-zero bins, in order."""
    out, cur = [], 0.0
    for c in (*counts, 0.0):
        if c:
            cur += c
        elif cur:
            out.append(cur)
            cur = 0.0
    return out


def test_the_rate_profile_reads_back_bin_by_bin_from_prometheus_and_the_direct_scrape(prometheus_factory):
    """``arrival_counts`` (the sample's rate profile): 5 requests started, then, two bins or more later, 3; each
    burst lands in one bin of either source (a counter jumps between two scrapes); a window reaching back before
    Prometheus's first sample gives no profile (unknown), not a flat one."""
    from mocker.live.metrics import FrontendMetrics
    from planner.sources.prometheus import profile_from_counter

    # the differencing by hand: a reset counts 0, a missing point leaves the profile out
    assert profile_from_counter([(30, 6), (0, 1), (10, 4), (20, 2)], 0, 10, 3) == (3.0, 0.0, 4.0)
    assert profile_from_counter([(0, 1), (20, 2), (30, 6)], 0, 10, 3) == ()
    a = FrontendMetrics("mocker")
    ta, sa = _serve_registry(a.registry)
    direct = None
    try:
        prom = prometheus_factory({"frontend": [ta]}, scrape_interval_s=0.25)
        prom.wait_for_scrapes(3)
        t_first = time.time()
        direct = DirectScrapeTrafficSource("http://" + ta, model="mocker", scrape_interval_s=0.25).start()
        wait_until(lambda: len(direct.samples) >= 2, 10, "direct scrapes at 0")
        src = PrometheusTrafficSource(PrometheusSourceSettings(url=prom.url, model="mocker"))
        sel = '{model="mocker"}'
        time.sleep(1.5)
        a.started.labels("mocker").inc(5)
        wait_until(lambda: prom.query_scalar(f"sum({REQUESTS_STARTED}{sel})") == 5, 10, "first burst scraped")
        time.sleep(2.5)  # two whole 1 s bins or more between the bursts
        a.started.labels("mocker").inc(3)
        wait_until(lambda: prom.query_scalar(f"sum({REQUESTS_STARTED}{sel})") == 8, 10, "second burst scraped")
        time.sleep(1.5)
        end = time.time()
        window = end - t_first - 0.5  # inside what Prometheus sampled
        got = src.query_profile(end, window, bin_s=1.0)
        assert len(got) == int(window) and _runs(got) == [5.0, 3.0], got
        with direct._lock:
            samples = list(direct.samples)
        dwindow = samples[-1][0] - samples[0][0] - 0.3  # bins end at the newest sample; all inside the samples
        dgot = direct.profile(samples, samples[-1][0], dwindow, bin_s=1.0)
        # every bin edge has a sample within one scrape interval unless the scrape thread stalled (a gap of more
        # than two intervals): then the profile is unknown, by design
        stalled = any(b[0] - a[0] > 2 * direct.scrape_interval_s for a, b in zip(samples, samples[1:]))
        if stalled:
            assert dgot == (), dgot
        else:
            assert len(dgot) == int(dwindow) and _runs(dgot) == [5.0, 3.0], dgot
        assert src.query_profile(end, end - t_first + 30.0, bin_s=1.0) == ()  # before the first sample: unknown
        assert direct.profile(samples, samples[-1][0], 60.0, bin_s=1.0) == ()
        # read() carries the profile at the planner's 10 s bins once the window holds one
        wait_until(lambda: time.time() - t_first >= 11.0, 20, "eleven seconds of samples")
        tw = src.read(10.5)
        assert tw is not None and len(tw.arrival_counts) == 1 and tw.arrival_counts[0] in (0.0, 3.0, 5.0, 8.0), tw
        direct.close()  # the samples stay as they are: read() and the check below see the same ones
        samples2 = list(direct.samples)
        direct.clock = lambda: samples2[-1][0]  # read() refuses a stale newest sample; here it is the last one
        dw = direct.read(10.5)
        recent = [x for x in samples2 if x[0] >= samples2[-1][0] - 11.0]
        stalled = any(b[0] - a[0] > 2 * direct.scrape_interval_s for a, b in zip(recent, recent[1:]))
        assert dw is not None, direct.last_error
        if stalled:
            assert dw.arrival_counts == (), dw
        else:
            assert len(dw.arrival_counts) == 1 and dw.arrival_counts[0] in (0.0, 3.0, 5.0, 8.0), dw
    finally:
        if direct is not None:
            direct.close()
        sa.shutdown()  # type: ignore[attr-defined]
