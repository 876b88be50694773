"""The dashboard's recorder (planner.dashboard.DashboardHistory), hand-computed: ticks whose traffic
was unknown plot nothing, outages and scale decisions and worker deaths become time-axis marks."""

from __future__ import annotations

from types import SimpleNamespace as NS

from planner.dashboard import DashboardHistory


def _result(loops, observed_rps, planned_rps=6.0, targets=None, from_=None, decision_id=None):
    obs = None if observed_rps is None else NS(requests_per_second=observed_rps, mean_ttft_ms=100.0, mean_itl_ms=2.0)
    d = NS(
        targets=targets,
        decision_id=decision_id,
        reason=NS(value="scale_up_throughput" if targets else "hold"),
        reasons=[NS(value="scale_up_throughput")] if targets else [],
    )
    diag = NS(
        loops_run=tuple(loops),
        observed=obs,
        predicted_requests_per_second=planned_rps,
        predictor="constant",
        estimated_ttft_ms=float("nan"),
        estimated_itl_ms=float("nan"),
        throughput_replicas={},
        current_replicas=from_,
    )
    return NS(decision=d, diagnostics=diag)


def test_unknown_traffic_ticks_plot_nothing_and_become_one_outage():
    h = DashboardHistory()
    h.record_tick(10.0, _result(["throughput"], 4.0))
    h.record_tick(11.0, _result(["load"], None))  # a load tick in between: not a throughput read
    h.record_tick(12.0, _result(["throughput"], None))  # Prometheus down: the planner holds on a stale plan
    h.record_tick(14.0, _result(["throughput"], None))
    h.record_tick(16.0, _result(["throughput"], 5.0, planned_rps=9.0))
    h.record_tick(18.0, _result(["throughput"], None))  # down again, still down at now = 19
    t = h.ticks
    assert [x["metrics_unknown"] for x in t] == [False, False, True, True, False, True]
    assert [x["predicted_rps"] for x in t] == [6.0, 6.0, None, None, 9.0, None]
    assert h.outages(19.0) == [
        {"start_s": 12.0, "end_s": 16.0, "ongoing": False},
        {"start_s": 18.0, "end_s": 19.0, "ongoing": True},
    ]


def test_marks_name_each_decision_its_direction_and_the_deaths():
    h = DashboardHistory()
    h.record_tick(10.0, _result(["throughput"], 4.0, targets={"agg": 3}, from_={"agg": 1}, decision_id=1))
    h.record_tick(20.0, _result(["throughput"], 1.0, targets={"agg": 2}, from_={"agg": 3}, decision_id=2))
    events = [
        {"t": 15.0, "worker": "agg-2", "pool": "agg", "event": "died"},
        {"t": 12.0, "worker": "agg-3", "pool": "agg", "event": "ready"},
        {"t": 14.0, "worker": "agg-1", "pool": "agg", "event": "died"},
    ]
    m = h.marks(25.0, events)
    assert m["decisions"] == [
        {"t": 10.0, "direction": "up", "label": "agg 1\u21923", "reason": "scale_up_throughput"},
        {"t": 20.0, "direction": "down", "label": "agg 3\u21922", "reason": "scale_up_throughput"},
    ]
    assert m["deaths"] == [{"t": 14.0, "worker": "agg-1", "pool": "agg"}, {"t": 15.0, "worker": "agg-2", "pool": "agg"}]
    assert m["outages"] == []
