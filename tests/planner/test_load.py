"""Pass-time regressions and per-engine TTFT/ITL estimates against known coefficients."""

import math

import numpy as np
import pytest

from dynoplan.fpm import QueuedRequests, ScheduledRequests
from planner.core.load import (
    PassTimeRegression,
    RegressionFit,
    estimate_engine,
    estimate_itl_ms,
    estimate_ttft_ms,
    latest_passes,
)
from planner.core.observations import PassObservation


def fpm(
    wall, *, prefill=0, decode_kv=0, n_prefill=None, n_decode=None, q_prefill=0, q_n=0, pool="decode", worker=0, ts=0.0
):
    s = ScheduledRequests(
        num_prefill_requests=(1 if prefill else 0) if n_prefill is None else n_prefill,
        sum_prefill_tokens=prefill,
        sum_prefill_kv_tokens=prefill,
        num_decode_requests=(1 if decode_kv else 0) if n_decode is None else n_decode,
        sum_decode_kv_tokens=decode_kv,
    )
    return PassObservation(
        worker,
        0,
        wall,
        s,
        QueuedRequests(num_prefill_requests=q_n, sum_prefill_tokens=q_prefill),
        pool=pool,
        timestamp_s=ts,
    )


def test_prefill_regression_recovers_known_coefficients():
    rng = np.random.default_rng(1)
    r = PassTimeRegression(("sum_prefill_tokens",), min_samples=8)
    for _ in range(400):
        x = int(rng.integers(1, 8192))
        r.add(fpm(0.005 + 1e-5 * x, prefill=x, pool="prefill"))
    f = r.fit()
    assert f.intercept_s == pytest.approx(0.005, rel=1e-9) and f.slope("sum_prefill_tokens") == pytest.approx(
        1e-5, rel=1e-9
    )
    assert not f.degenerate


def test_agg_regression_two_features():
    rng = np.random.default_rng(2)
    r = PassTimeRegression(("sum_prefill_tokens", "sum_decode_kv_tokens"))
    for _ in range(300):
        p, d = int(rng.integers(0, 8192)), int(rng.integers(0, 200000))
        r.add(fpm(0.003 + 1e-5 * p + 2e-7 * d + rng.normal(0, 1e-5), prefill=p, decode_kv=d, pool="agg"))
    f = r.fit()
    assert f.intercept_s == pytest.approx(0.003, abs=5e-5)
    assert f.slope("sum_prefill_tokens") == pytest.approx(1e-5, rel=0.01)
    assert f.slope("sum_decode_kv_tokens") == pytest.approx(2e-7, rel=0.01)


def test_idle_heartbeats_skipped_and_memory_bounded():
    r = PassTimeRegression(("sum_decode_kv_tokens",), n_buckets=4, per_bucket=5, min_samples=3)
    for _ in range(100):
        assert not r.add(fpm(0.0))  # idle heartbeat
    assert len(r) == 0 and r.skipped_idle == 100 and r.fit() is None
    for i in range(1000):
        r.add(fpm(0.01 + 1e-7 * (i % 50), decode_kv=i % 50 + 1))
    assert len(r) <= 4 * 5
    # a flood of small passes cannot evict the big ones (bucketed retention)
    r.add(fpm(0.01 + 1e-7 * 100000, decode_kv=100000))
    for _ in range(1000):
        r.add(fpm(0.01 + 1e-7 * 3, decode_kv=3))
    assert any(x[0][0] == 100000 for b in r._buckets for x in b)
    assert r.fit().slope("sum_decode_kv_tokens") == pytest.approx(1e-7, rel=1e-6)


def test_negative_or_unidentifiable_slope_is_degenerate():
    r = PassTimeRegression(("sum_prefill_tokens",), min_samples=4)
    for x in (1000, 2000, 3000, 4000, 5000):
        r.add(fpm(0.1 - 1e-5 * x, prefill=x, pool="prefill"))  # longer passes for fewer tokens
    f = r.fit()
    assert f.degenerate and math.isnan(f.slope("sum_prefill_tokens"))
    assert estimate_ttft_ms(f, 50000, 1000, 8192) is None  # unknown, not "free" and not infinite
    r2 = PassTimeRegression(("sum_prefill_tokens",), min_samples=4)
    for _ in range(6):
        r2.add(fpm(0.05, prefill=2048, pool="prefill"))  # never varied: slope not identifiable
    assert r2.fit().degenerate


def test_ttft_estimate_simulates_chunked_queue():
    f = RegressionFit(("sum_prefill_tokens",), 0.005, (1e-5,), 100)
    # 20000 queued + 4000 new = 24000 tokens in 8192-token passes: 2 full (0.08692 s each) + 7616 (0.08116 s)
    assert estimate_ttft_ms(f, 20000, 4000, 8192) == pytest.approx(255.0)
    assert estimate_ttft_ms(f, 0, 1000, 8192) == pytest.approx(15.0)
    assert estimate_ttft_ms(None, 0, 1000, 8192) is None


def test_itl_estimate_and_agg_chunk():
    f = RegressionFit(("sum_decode_kv_tokens",), 0.004, (2e-7,), 100)
    assert estimate_itl_ms(f, 100000) == pytest.approx(24.0)
    a = RegressionFit(("sum_prefill_tokens", "sum_decode_kv_tokens"), 0.004, (1e-5, 2e-7), 100)
    # agg, no prefill work arriving: the decode-only pass, 4 + 0.2 x 100 = 24 ms
    assert estimate_itl_ms(a, 100000, 0.0, 8192) == pytest.approx(24.0)
    # agg, 20000 prefill tokens per engine-second: prefill share u = 1e-5 x 20000 = 0.2, so the mean pass
    # interval over a request's decode is 24 / (1 - 0.2) = 30 ms (each 30 ms step also carries 600 prefill
    # tokens = 6 ms), not a whole 8192-token chunk per pass (24 + 81.92 ms)
    assert estimate_itl_ms(a, 100000, 20000.0, 8192) == pytest.approx(30.0)
    # saturated (u = 1e-5 x 150000 = 1.5 >= 1): every pass carries a full chunk of C - 192 running requests
    assert estimate_itl_ms(a, 100000, 150000.0, 8192, 192) == pytest.approx(24.0 + 80.0)
    # near saturation the rate formula would exceed the full-chunk pass: capped (24 / 0.05 = 480 > 104)
    assert estimate_itl_ms(a, 100000, 95000.0, 8192, 192) == pytest.approx(24.0 + 80.0)
    # a degenerate prefill slope with prefill work arriving: unknown, never "free"
    d = RegressionFit(("sum_prefill_tokens", "sum_decode_kv_tokens"), 0.004, (math.nan, 2e-7), 100)
    assert estimate_itl_ms(d, 100000, 20000.0) is None
    assert estimate_itl_ms(d, 100000, 0.0) == pytest.approx(24.0)
    # agg TTFT: the chunk budget shrinks by one token per running decode request (8192 - 192 = 8000)
    assert estimate_ttft_ms(a, 12000, 4000, 8192, decode_kv_tokens=0, num_decode_requests=192) == pytest.approx(
        2 * (4 + 80.0)
    )


def test_engine_estimate_and_latest_pass():
    f = RegressionFit(("sum_prefill_tokens",), 0.005, (1e-5,), 100)
    old = fpm(0.05, prefill=4000, q_prefill=99999, q_n=9, pool="prefill", ts=1.0)
    new = fpm(0.05, prefill=4000, q_prefill=20000, q_n=5, pool="prefill", ts=2.0)
    latest = latest_passes([new, old])
    assert latest[(0, 0)] is new
    e = estimate_engine("prefill", new, f, 4000, 8192)
    assert e.estimated_ttft_ms == pytest.approx(255.0) and not e.idle and e.estimated_itl_ms is None
    idle = estimate_engine("prefill", fpm(0.0, pool="prefill"), None, 4000, 8192)
    assert idle.idle and idle.estimated_ttft_ms == 0.0  # zero load needs no regression
    scaled = estimate_engine("prefill", new, f, 4000, 8192, load_scale=2.0)
    assert scaled.queued_prefill_tokens == 40000


def test_from_mapping_validates_dicts_and_stamps_the_pool_and_receive_time():
    d = {
        "worker_id": 3,
        "dp_rank": 1,
        "wall_time": 0.02,
        "timestamp_ms": 1500.0,
        "scheduled_requests": {"num_decode_requests": 4, "sum_decode_kv_tokens": 9000},
        "queued_requests": {"num_prefill_requests": 2, "sum_prefill_tokens": 700},
    }
    p = PassObservation.from_mapping(d, pool="decode")
    assert (
        p.worker_id,
        p.dp_rank,
        p.pool,
        p.timestamp_s,  # 1500 ms on the producer's clock, in seconds, when no receive time is given
        p.scheduled_requests.sum_decode_kv_tokens,
        p.scheduled_requests.num_prefill_requests,  # absent: 0
        p.queued_requests.sum_prefill_tokens,
    ) == (3, 1, "decode", 1.5, 9000, 0, 700)
    assert PassObservation.from_mapping(d, pool="agg", timestamp_s=7.25).timestamp_s == 7.25
    from dynoplan.errors import ObservationError

    bad = [
        ({"worker_id": 1, "dp_rank": 0, "wall_time": -1}, "ForwardPassMetrics.wall_time=-1: expected a number >= 0.0"),
        ({"worker_id": 1, "dp_rank": 0}, "ForwardPassMetrics.wall_time: required"),
        ({"worker_id": True, "dp_rank": 0, "wall_time": 0.1}, "ForwardPassMetrics.worker_id=True: expected an integer"),
        (
            {**d, "queued_requests": {"sum_prefill_tokens": -5}},
            "ForwardPassMetrics.queued_requests.sum_prefill_tokens=-5: expected an integer >= 0",
        ),
    ]
    for obj, line in bad:
        with pytest.raises(ObservationError) as e:
            PassObservation.from_mapping(obj, pool="decode")
        assert str(e.value) == line


def test_from_mapping_reads_attribute_objects():
    class Part:
        num_prefill_requests = 2
        sum_prefill_tokens = 640

    class Fpm:
        worker_id, dp_rank, wall_time, timestamp_ms = 5, 0, 0.031, 250.0
        scheduled_requests = Part()

    p = PassObservation.from_mapping(Fpm(), pool="prefill")
    assert (p.worker_id, p.wall_time, p.scheduled_requests.sum_prefill_tokens, p.timestamp_s) == (5, 0.031, 640, 0.25)
    assert p.queued_requests == QueuedRequests()


def test_agg_prefill_passes_not_evicted_by_decode_only_passes():
    # 20 prefill-carrying passes of ~4000 tokens, then 500 decode-only passes of the same total size (log2
    # bucket 12): with one bucket set per feature the prefill samples stay and the slope is recovered
    r = PassTimeRegression(("sum_prefill_tokens", "sum_decode_kv_tokens"), per_bucket=32, min_samples=8)
    rng = np.random.default_rng(5)
    for _ in range(20):
        x = int(rng.integers(2000, 4000))
        r.add(fpm(0.005 + 2e-5 * x, prefill=x, pool="agg"))
    for _ in range(500):
        kv = int(rng.integers(2048, 32768))
        r.add(fpm(0.005 + 5e-8 * kv, decode_kv=kv, pool="agg"))
    f = r.fit()
    assert f.slope("sum_prefill_tokens") == pytest.approx(2e-5, rel=1e-6)
    assert f.slope("sum_decode_kv_tokens") == pytest.approx(5e-8, rel=1e-6)
    assert sum(1 for b in r._buckets for x, _ in b if x[0] > 0) == 20
