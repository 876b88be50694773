"""``TrafficWindow.cached_prompt_share`` from both traffic sources: ``PrometheusTrafficSource`` (a real
Prometheus scraping the frontend) and ``DirectScrapeTrafficSource`` (the frontend's ``/metrics``), against a
live frontend + worker (real processes) whose prefix-cache hits are hand-computed, and against exporters of
hand-set values for the edge cases (a share above 1, a frontend without the cached-token histogram, an
error answer to that query).

Every wait polls the state it needs (samples in Prometheus, observations on the frontend); the direct
source is scraped by hand (``scrape_once``) at the points the test chooses, so its two samples bracket the
requests exactly.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time

import pytest
import requests

from planner.sources.prometheus import (
    DirectScrapeTrafficSource,
    PrometheusSourceSettings,
    PrometheusTrafficSource,
    cached_share,
    cached_share_query,
)
from tests.infra._proc import wait_until
from tests.live.procs import LiveStack
from tests.liveplanner.test_sources import _refusing_proxy, _serve_registry

pytestmark = pytest.mark.integration

CACHED_SUM = "dynamo_frontend_cached_tokens_sum"
ISL_SUM = "dynamo_frontend_input_sequence_tokens_sum"


def test_query_shape_and_the_clamp():
    assert cached_share_query(180, '{model="m"}') == (
        'sum(increase(dynamo_frontend_cached_tokens_sum{model="m"}[180000ms])) / '
        'sum(increase(dynamo_frontend_input_sequence_tokens_sum{model="m"}[180000ms]))'
    )
    assert cached_share(0.25) == 0.25 and cached_share(1.0000001) == 1.0 and cached_share(-1e-12) == 0.0
    for unknown in (None, math.nan, math.inf):  # no series; 0 / 0 and x / 0: no prompt tokens in the window
        assert math.isnan(cached_share(unknown))


def _samples(prom, series: str) -> float:
    """How many samples Prometheus holds of ``series`` (one series) over the last hour."""
    return prom.query_scalar(f"count_over_time({series}[1h])") or 0.0


def test_a_live_frontend_gives_the_share_of_cached_prompt_tokens(prometheus_factory):
    """Two 1024-token prompts (64 blocks of 16) through a live frontend and worker; the second shares the
    first's first 32 blocks, which its worker holds: 512 of the 2048 prompt tokens are cached, share 0.25."""
    with LiveStack() as st:
        w = st.worker(
            "w", "--speedup-ratio", "50", "--num-gpu-blocks", "512", "--block-size", "16", "--trace-block-size", "16"
        )
        fe = st.frontend("fe", "--workers", w)
        prom = prometheus_factory({"frontend": [fe.removeprefix("http://")]}, scrape_interval_s=0.25)
        sel = '{model="mocker"}'
        wait_until(lambda: _samples(prom, CACHED_SUM + sel) >= 2, 30, "two scrapes before any request")
        direct = DirectScrapeTrafficSource(fe, model="mocker")
        assert direct.scrape_once(), direct.last_error
        t0 = time.time()
        first = list(range(1000, 1064))
        second = first[:32] + list(range(2000, 2032))
        cached = []
        for ids in (first, second):
            r = requests.post(
                fe + "/v1/completions",
                json={"model": "mocker", "input_length": 1024, "hash_ids": ids, "max_tokens": 4},
                timeout=30,
            )
            assert r.status_code == 200, r.text
            cached.append(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"])
        assert cached == [0, 512]

        def on_frontend(name: str) -> float:
            text = requests.get(fe + "/metrics", timeout=5).text
            return next(float(ln.split()[-1]) for ln in text.splitlines() if ln.startswith(name + sel))

        wait_until(lambda: on_frontend(ISL_SUM) == 2048 and on_frontend(CACHED_SUM) == 512, 10, "both observed")
        assert direct.scrape_once(), direct.last_error
        wait_until(
            lambda: (
                prom.query_scalar(f"sum({CACHED_SUM}{sel})") == 512
                and prom.query_scalar(f"sum({ISL_SUM}{sel})") == 2048
            ),
            30,
            "the requests scraped",
        )
        window = time.time() - t0 + 5.0  # reaches back to the samples at 0
        src = PrometheusTrafficSource(PrometheusSourceSettings(url=prom.url, model="mocker"))
        tw = src.read(window)
        assert tw is not None, src.last_error
        # both _sum series are sampled at the same instants: increase() extrapolates them by one factor
        assert tw.cached_prompt_share == pytest.approx(512 / 2048, rel=1e-9) and src.optional_error is None
        dw = direct.read(window)
        assert dw is not None and dw.cached_prompt_share == 0.25  # differences of exact sums
        # a window without requests: no prompt tokens, so the share is unknown (NaN), not 0
        assert direct.scrape_once()
        quiet_d = direct.read(1e-3)  # the last two samples (nearest 1 ms apart), both after the requests
        assert quiet_d is not None and quiet_d.num_requests == 0 and math.isnan(quiet_d.cached_prompt_share)
        quiet: list = []

        def quiet_window() -> bool:  # Prometheus holds a second of samples after the requests
            q = src.read(1.0)
            if q is None or q.num_requests != 0:
                return False
            quiet.append(q)
            return True

        wait_until(quiet_window, 30, "a Prometheus window after the requests")
        assert math.isnan(quiet[-1].cached_prompt_share) and src.optional_error is None


def test_the_share_is_clamped_unknown_without_the_series_and_optional(prometheus_factory):
    """Hand-set exporters: model "over" reports 3000 cached of 2048 prompt tokens (a misaligned pair): clamped
    to 1; model "old" (a frontend without ``dynamo_frontend_cached_tokens``): NaN in a known window; an error
    answer to the share's query: NaN, the reason in ``optional_error``, the other extras kept."""
    from prometheus_client import CollectorRegistry, Counter, Histogram

    from mocker.live.metrics import FrontendMetrics

    over = FrontendMetrics("over")
    old = CollectorRegistry()
    for name in (
        "time_to_first_token_seconds",
        "inter_token_latency_seconds",
        "request_duration_seconds",
        "input_sequence_tokens",
        "output_sequence_tokens",
    ):
        Histogram("dynamo_frontend_" + name, "x", ["model"], registry=old).labels("old")
    old_started = Counter("dynamo_frontend_requests_started", "x", ["model"], registry=old).labels("old")
    t_over, s_over = _serve_registry(over.registry)
    t_old, s_old = _serve_registry(old)
    loop = asyncio.new_event_loop()
    th = threading.Thread(target=loop.run_forever, daemon=True)
    th.start()
    runner = None
    try:
        prom = prometheus_factory({"frontend": [t_over, t_old]}, scrape_interval_s=0.25)
        wait_until(
            lambda: (
                _samples(prom, CACHED_SUM + '{model="over"}') >= 2 and _samples(prom, ISL_SUM + '{model="old"}') >= 2
            ),
            30,
            "two scrapes of both exporters at 0",
        )
        directs = {m: DirectScrapeTrafficSource("http://" + t, model=m) for m, t in (("over", t_over), ("old", t_old))}
        assert all(d.scrape_once() for d in directs.values())
        t0 = time.time()
        for _ in range(2):
            over.started.labels("over").inc()
            over.isl.labels("over").observe(1024)
            over.osl.labels("over").observe(8)
            old_started.inc()
        over.cached_tokens.labels("over").observe(3000)
        wait_until(
            lambda: (
                prom.query_scalar(f'sum({CACHED_SUM}{{model="over"}})') == 3000
                and prom.query_scalar('sum(dynamo_frontend_requests_started_total{model="old"})') == 2
            ),
            30,
            "the values scraped",
        )
        assert all(d.scrape_once() for d in directs.values())
        window = time.time() - t0 + 5.0
        src = {m: PrometheusTrafficSource(PrometheusSourceSettings(url=prom.url, model=m)) for m in ("over", "old")}
        got = {m: s.read(window) for m, s in src.items()}
        assert all(g is not None for g in got.values()), {m: s.last_error for m, s in src.items()}
        assert got["over"].cached_prompt_share == 1.0 and src["over"].optional_error is None
        assert math.isnan(got["old"].cached_prompt_share) and src["old"].optional_error is None
        assert got["old"].num_requests > 0  # the window itself is known
        d_over, d_old = directs["over"].read(window), directs["old"].read(window)
        assert d_over is not None and d_over.cached_prompt_share == 1.0  # 3000 / 2048 exactly, clamped
        assert d_old is not None and d_old.num_requests == 2 and math.isnan(d_old.cached_prompt_share)
        # the share's query answered with an error: optional, like the histograms and the in-flight gauge
        runner, purl = asyncio.run_coroutine_threadsafe(_refusing_proxy(prom.url, "cached_tokens"), loop).result(10)
        via = PrometheusTrafficSource(PrometheusSourceSettings(url=purl, model="over"))
        tw = via.read(window)
        assert tw is not None and math.isnan(tw.cached_prompt_share)
        assert via.optional_error is not None and "503" in via.optional_error, via.optional_error
        assert [le for le, c in tw.isl_buckets if c] == [1024.0] and tw.num_inflight == 0.0  # the others kept
        assert tw.num_requests > 0 and tw.mean_isl_tokens == pytest.approx(1024, rel=1e-9)
    finally:
        if runner is not None:
            asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        th.join(5)
        s_over.shutdown()  # type: ignore[attr-defined]
        s_old.shutdown()  # type: ignore[attr-defined]
