"""Smoke tests of the real Prometheus fixture: it scrapes a prometheus_client exporter every 1 s and
PromQL over the scraped series gives the hand-computed values."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import requests
from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server

from tests.infra._proc import free_port, wait_until
from tests.infra.prometheus import PrometheusServer

pytestmark = pytest.mark.integration


@contextmanager
def exporter() -> Iterator[tuple[str, Counter, Histogram]]:
    """A prometheus_client HTTP exporter on a free loopback port with one counter and one histogram."""
    reg = CollectorRegistry()
    requests_total = Counter("dynoplan_infra_requests", "requests seen", registry=reg)
    latency = Histogram("dynoplan_infra_latency_seconds", "latency", buckets=(0.1, 0.5, 1.0), registry=reg)
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=reg)
    try:
        yield f"127.0.0.1:{port}", requests_total, latency
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_scrape_and_query_interval_average(prometheus_factory):
    with exporter() as (target, requests_total, latency):
        prom = prometheus_factory({"exporter": [target]}, scrape_interval_s=1.0)
        prom.wait_for_scrapes(2)  # baseline samples with zero values
        requests_total.inc(10)
        for _ in range(4):
            latency.observe(0.25)
        wait_until(
            lambda: prom.query_scalar("dynoplan_infra_latency_seconds_count") == 4, 15, "histogram count scraped"
        )
        prom.wait_for_scrapes(2)

        assert prom.query_scalar('up{job="exporter"}') == 1.0
        assert prom.query_scalar("dynoplan_infra_requests_total") == 10.0
        assert prom.query_scalar("dynoplan_infra_latency_seconds_sum") == pytest.approx(1.0)
        # The planner's interval average: increase(sum[w]) / increase(count[w]) = 1.0 s / 4 = 0.25 s.
        # Both increases are extrapolated over the same sample timestamps, so the ratio is exact.
        avg = prom.query_scalar(
            "increase(dynoplan_infra_latency_seconds_sum[1m]) / increase(dynoplan_infra_latency_seconds_count[1m])"
        )
        assert avg == pytest.approx(0.25, rel=1e-9)
        # Same with rate(): the window length cancels.
        avg_rate = prom.query_scalar(
            "rate(dynoplan_infra_latency_seconds_sum[1m]) / rate(dynoplan_infra_latency_seconds_count[1m])"
        )
        assert avg_rate == pytest.approx(0.25, rel=1e-9)
        # Median: all 4 observations fall in (0.1, 0.5]; linear interpolation at rank 2 of 4 gives
        # 0.1 + (0.5 - 0.1) * 2/4 = 0.3 s.
        p50 = prom.query_scalar(
            "histogram_quantile(0.5, sum by (le) (rate(dynoplan_infra_latency_seconds_bucket[1m])))"
        )
        assert p50 == pytest.approx(0.3, rel=1e-9)
        # increase() of the counter extrapolates to the window edges: at least the true 10.
        assert prom.query_scalar("increase(dynoplan_infra_requests_total[1m])") >= 10.0


def test_restart_keeps_data_and_set_targets_reloads(prometheus_factory):
    with exporter() as (target_a, count_a, _), exporter() as (target_b, count_b, _):
        count_a.inc(3)
        count_b.inc(5)
        prom: PrometheusServer = prometheus_factory({"a": [target_a]})
        prom.wait_for_scrapes(1)
        assert prom.query_scalar('dynoplan_infra_requests_total{job="a"}') == 3.0
        t_before = time.time()

        prom.stop_process()
        with pytest.raises(requests.ConnectionError):
            requests.get(f"{prom.url}/-/ready", timeout=2)
        prom.start_process()
        # Samples scraped before the restart survive (WAL replay): query at the earlier timestamp.
        r = requests.get(
            f"{prom.url}/api/v1/query",
            params={"query": 'dynoplan_infra_requests_total{job="a"}', "time": f"{t_before:.3f}"},
            timeout=5,
        ).json()
        assert [float(s["value"][1]) for s in r["data"]["result"]] == [3.0]

        prom.set_targets({"a": [target_a], "b": [target_b]})
        prom.wait_for_scrapes(1)
        assert prom.query_scalar("sum(dynoplan_infra_requests_total)") == 8.0
        assert {t["labels"]["job"] for t in prom.active_targets()} == {"a", "b"}


def test_bad_target_is_a_clear_error():
    with pytest.raises(ValueError, match="expected 'host:port'"):
        PrometheusServer(["http://127.0.0.1:9"])


def test_stop_leaves_no_process_and_no_temp_dir():
    import os

    with PrometheusServer.start([]) as prom:
        pid, base_dir = prom.proc.pid, prom.base_dir
        assert prom.active_targets() == []
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert not base_dir.exists()
