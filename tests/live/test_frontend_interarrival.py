"""The frontend's inter-arrival histogram: the same bounds as the planner's sample expects, and the gaps it
observes (hand-computed, read back from the real Prometheus text exposition)."""

from __future__ import annotations

import math

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from mocker.live.metrics import GAP_BUCKETS_S, FrontendMetrics
from planner.core.sizing import GAP_BUCKETS_S as PLANNER_GAP_BUCKETS_S

NAME = "dynoplan_frontend_request_interarrival_seconds"


def test_bounds_agree_with_the_planner():
    # the mocker may not import the planner (import-linter), so the bounds are written twice
    assert GAP_BUCKETS_S + (math.inf,) == PLANNER_GAP_BUCKETS_S
    assert GAP_BUCKETS_S[:2] == (0.0, 0.001) and GAP_BUCKETS_S[-1] == 131.072  # le=0: shared timestamps


def _buckets(m: FrontendMetrics, model: str) -> dict[float, float]:
    out = {}
    for fam in text_string_to_metric_families(generate_latest(m.registry).decode()):
        for s in fam.samples:
            if s.name == NAME + "_bucket" and s.labels["model"] == model:
                out[float(s.labels["le"])] = s.value
    return out


def test_gaps_are_observed_between_consecutive_arrivals():
    m = FrontendMetrics("m")
    before = _buckets(m, "m")
    assert len(before) == len(GAP_BUCKETS_S) + 1 and set(before.values()) == {0.0}  # exported at 0 from the start
    # gaps 0.001 (on a bound, exact from t = 0: le is inclusive), 0.0005, 0.003, 0.010, 1.0, 10.0, 200 (> 131 s)
    t = 0.0
    for gap in (None, 0.001, 0.0005, 0.003, 0.010, 1.0, 10.0, 200.0):
        t += gap or 0.0
        m.observe_arrival("m", t)
    m.observe_arrival("other", 5.0)  # another model: its own first arrival, no gap
    b = _buckets(m, "m")
    # cumulative counts: <= 1 ms: 0.0005, 0.001; <= 4 ms: + 0.003; <= 16 ms: + 0.010; <= 1.024 s: + 1.0;
    # <= 16.384 s: + 10.0; +Inf: + 200
    want = {
        0.0: 0,
        0.001: 2,
        0.002: 2,
        0.004: 3,
        0.008: 3,
        0.016: 4,
        0.512: 4,
        1.024: 5,
        8.192: 5,
        16.384: 6,
        131.072: 6,
        math.inf: 7,
    }
    for le, n in want.items():
        assert b[le] == n, (le, b)
    assert _buckets(m, "other") == {}  # one arrival of that model: no gap yet, no series


def test_an_arrival_reported_out_of_order_keeps_the_total_span():
    m = FrontendMetrics("m")
    for t in (0.0, 2.0, 1.5, 3.0):  # the 1.5 s request's body was parsed after the 2.0 s one's
        m.observe_arrival("m", t)
    fam = {
        s.name: s.value
        for f in text_string_to_metric_families(generate_latest(m.registry).decode())
        for s in f.samples
        if s.name.startswith(NAME)
    }
    assert fam[NAME + "_count"] == 3 and fam[NAME + "_sum"] == 3.0  # gaps 2.0, 0 (late), 1.0: span 0 -> 3 s
