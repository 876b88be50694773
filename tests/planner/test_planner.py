"""The Planner state machine: scaling rules, loops, pending guard and the field pain points."""

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.core.config import PlannerConfig, PoolLimits
from planner.core.observations import Observations, PoolState, TrafficWindow
from planner.core.planner import Planner
from planner.core.reasons import Reason
from tests.planner.helpers import Fleet, decode_pass, idle_pass, profile, traffic, training_passes

# The reference planner's rules (docs/architecture.md "Planner facts"): no evaluator is given, so sizing is the
# closed-form reference.
REFERENCE_RULES = dict(load_max_scale_up_factor=1.0, early_sizing_s=None)


def thpt_config(**kw):
    base = dict(predictor="constant", itl_ms=30.0, correction_enabled=False, max_gpu_budget=16, **REFERENCE_RULES)
    base.update(kw)
    return PlannerConfig(**base)


def load_config_(**kw):
    base = dict(
        mode="decode",
        throughput_enabled=False,
        load_enabled=True,
        itl_ms=50.0,
        regression_min_samples=4,
        max_gpu_budget=16,
        **REFERENCE_RULES,
    )
    base.update(kw)
    return PlannerConfig(**base)


# ------------------------------------------------------------------ throughput loop


def test_throughput_loop_sizes_from_profile_and_schedules_ticks():
    pl = Planner(thpt_config(), profile())
    fleet = Fleet(prefill=1, decode=1)
    r = pl.tick(0.0, fleet.obs())
    assert r.decision.reason == Reason.HOLD_WARMING_UP and r.next_tick_s == 180.0
    # 3600 req x 2000 / 180 s / 8000 = 5 prefill; 3600 x 150 / 180 / 1500 = 2 decode
    r = pl.tick(180.0, fleet.obs(traffic(3600)))
    assert r.decision.targets == {"prefill": 5, "decode": 2}
    assert r.decision.decision_id == 1 and r.decision.reason == Reason.SCALE_UP_THROUGHPUT
    assert r.diagnostics.throughput_replicas_exact == pytest.approx({"prefill": 5.0, "decode": 2.0})
    assert r.diagnostics.predicted_requests_per_second == pytest.approx(20.0)
    assert r.next_tick_s == 360.0
    fleet.apply(r.decision)
    r = pl.tick(360.0, fleet.obs(traffic(3600)))
    assert r.decision.targets is None and r.decision.reason == Reason.HOLD_STEADY


def test_correction_factor_applied():
    pl = Planner(thpt_config(correction_enabled=True), profile())
    fleet = Fleet(prefill=5, decode=2)
    pl.tick(0.0, fleet.obs())
    # observed: TTFT 100 ms, ITL 25 ms, mean request duration 5 s
    tw = TrafficWindow(180.0, 3600, 2000.0, 150.0, 100.0, 25.0, 5.0)
    r = pl.tick(180.0, fleet.obs(tw))
    # prefill: expected TTFT 200 ms at ISL 2000, observed 100 -> p_corr 0.5 -> 2.5 -> 3 replicas
    assert pl.p_correction == pytest.approx(0.5)
    # decode: concurrency = 3600/2 x 5 s / 180 = 50; usage = 50 x 2075 / 200000 = 0.51875 -> expected
    # ITL 30.75 ms; d_corr = 25 / 30.75; corrected ITL = 30 / d_corr = 36.9 ms -> usage 0.6725 -> 2017.5 tok/s
    assert pl.d_correction == pytest.approx(25.0 / 30.75)
    assert r.diagnostics.throughput_replicas["prefill"] == 3
    assert r.diagnostics.throughput_replicas_exact["decode"] == pytest.approx(3000.0 / (3000 * 0.6725), rel=5e-3)


def test_zero_traffic_nan_averages_still_scale_down_to_min():
    pl = Planner(thpt_config(), profile())
    fleet = Fleet(prefill=5, decode=2)
    pl.tick(0.0, fleet.obs())
    r = pl.tick(180.0, fleet.obs(traffic(0)))  # count 0, means NaN
    assert r.decision.targets == {"prefill": 1, "decode": 1}
    assert r.decision.reason == Reason.SCALE_DOWN_THROUGHPUT
    assert Reason.RAISED_TO_MIN_REPLICAS in r.decision.reasons


def test_failed_metrics_read_is_unknown_and_holds():
    pl = Planner(thpt_config(), profile())
    fleet = Fleet(prefill=5, decode=2)
    pl.tick(0.0, fleet.obs())
    pl.tick(180.0, fleet.obs(traffic(3600)))
    r = pl.tick(360.0, fleet.obs(None))  # the Prometheus read failed
    assert r.decision.targets is None and r.decision.reason == Reason.HOLD_METRICS_UNKNOWN
    assert pl.throughput._pred_req.values == [3600.0]  # nothing fed: an unknown interval is not zero demand
    r = pl.tick(540.0, Observations(None, traffic(0)))  # the deployment could not be read
    assert r.decision.targets is None and r.decision.reason == Reason.HOLD_METRICS_UNKNOWN


def test_closed_form_reference_flaps_at_steady_load_near_a_threshold():
    # the reference formula has no deadband: decode needs 1800 x 150 / 180 / 1500 = 1.0 replicas, and +-3 % noise
    # around it moves the pool between 1 and 2 at every interval. (The sizing by simulation holds: its deadband
    # is the binomial uncertainty of the sample, tests/planner/test_sizing_sim.py and tests/sim/test_stability.py.)
    pl = Planner(thpt_config(), profile())
    fleet = Fleet(prefill=3, decode=1)
    pl.tick(0.0, fleet.obs())
    noise = [1.03, 0.97, 1.02, 0.98, 1.01, 0.99, 1.03, 0.97] * 5
    flaps = 0
    for k, f in enumerate(noise, start=1):
        before = fleet.spec["decode"]
        fleet.apply(pl.tick(180.0 * k, fleet.obs(traffic(1800 * f))).decision)
        flaps += fleet.spec["decode"] != before
    assert flaps > 10


def test_budget_caps_throughput_result():
    pl = Planner(thpt_config(max_gpu_budget=6), profile())
    fleet = Fleet(prefill=1, decode=1)
    pl.tick(0.0, fleet.obs())
    r = pl.tick(180.0, fleet.obs(traffic(3600)))  # wants 5 + 2 = 7 > 6
    assert sum(r.decision.targets.values()) <= 6
    assert Reason.CAPPED_BY_BUDGET in r.decision.reasons


# ------------------------------------------------------------------ pending guard, external changes


def test_pending_guard_holds_until_ready_then_proceeds():
    pl = Planner(thpt_config(), profile())
    fleet = Fleet(prefill=1, decode=1)
    pl.tick(0.0, fleet.obs())
    r = pl.tick(180.0, fleet.obs(traffic(3600)))
    fleet.apply(r.decision, ready=False)  # spec set, pods not ready yet
    r = pl.tick(360.0, fleet.obs(traffic(7200)))
    assert r.decision.targets is None and r.decision.reason == Reason.HOLD_PENDING
    fleet.ready = dict(fleet.spec)
    r = pl.tick(540.0, fleet.obs(traffic(7200)))
    assert r.decision.targets == {"prefill": 10, "decode": 4} and r.decision.decision_id == 2


def test_a_withdrawn_decision_is_replanned_at_the_next_tick():
    """A decision the driver could not apply (a 409 on the DGD) is withdrawn: the next tick re-plans at once
    instead of holding hold_pending for pending_timeout_s (1800 s)."""
    pl = Planner(thpt_config(), profile())
    fleet = Fleet(prefill=1, decode=1)
    pl.tick(0.0, fleet.obs())
    r = pl.tick(180.0, fleet.obs(traffic(3600)))
    assert r.decision.targets == {"prefill": 5, "decode": 2} and r.decision.decision_id == 1
    # not applied (the spec stays 1 + 1); without the withdrawal the guard waits for it
    held = Planner(thpt_config(), profile())
    held.tick(0.0, fleet.obs())
    held.tick(180.0, fleet.obs(traffic(3600)))
    assert held.tick(360.0, fleet.obs(traffic(3600))).decision.reason == Reason.HOLD_PENDING
    assert pl.withdraw(2) is False and pl.pending_decision_id == 1  # not the pending decision: nothing changes
    assert pl.withdraw(1) is True and pl.pending_decision_id is None
    r = pl.tick(360.0, fleet.obs(traffic(3600)))
    assert r.decision.targets == {"prefill": 5, "decode": 2} and r.decision.decision_id == 2
    assert r.decision.reason == Reason.SCALE_UP_THROUGHPUT  # re-planned from 1 + 1, not adopted as an edit
    assert pl.withdraw(2) is True


def test_a_withdrawn_scale_up_starts_no_cooldown():
    from planner.core.loops import PendingGuard

    cfg = thpt_config(scale_down_cooldown_s=600.0)
    for withdrawn in (False, True):
        guard = PendingGuard(cfg)
        guard.last_targets = {"prefill": 2, "decode": 2}
        d = guard.publish(100.0, {"prefill": 3, "decode": 2}, {"prefill": 2, "decode": 2})
        if withdrawn:
            assert guard.withdraw(d) and guard.last_targets == {"prefill": 2, "decode": 2}
        goal, reasons = {"prefill": 1, "decode": 2}, {}
        guard.restrict(200.0, goal, {"prefill": 2, "decode": 2}, reasons)
        assert goal == ({"prefill": 1, "decode": 2} if withdrawn else {"prefill": 2, "decode": 2})
        assert reasons == ({} if withdrawn else {"prefill": Reason.HOLD_COOLDOWN})


def test_unready_workers_past_timeout_do_not_freeze_the_planner():
    pl = Planner(thpt_config(pending_timeout_s=500.0), profile())
    fleet = Fleet(prefill=1, decode=1)
    pl.tick(0.0, fleet.obs())
    r = pl.tick(180.0, fleet.obs(traffic(3600)))
    fleet.spec = dict(r.decision.targets)
    fleet.ready = {"prefill": 3, "decode": 2}  # two prefill pods stay unschedulable
    reasons = [pl.tick(180.0 * k, fleet.obs(traffic(3600))).decision.reason for k in (2, 3, 4)]
    assert reasons == [Reason.HOLD_PENDING, Reason.HOLD_PENDING, Reason.PENDING_TIMEOUT_REPLAN]
    # no longer frozen: demand falls and it scales down though the pods never became ready
    r = pl.tick(180.0 * 5, fleet.obs(traffic(360)))
    assert r.decision.targets == {"prefill": 1, "decode": 1}


def test_external_replica_edit_adopted_not_fought():
    pl = Planner(thpt_config(external_change_grace_s=360.0), profile())
    fleet = Fleet(prefill=1, decode=1)
    pl.tick(0.0, fleet.obs())
    fleet.apply(pl.tick(180.0, fleet.obs(traffic(3600))).decision)
    assert fleet.spec == {"prefill": 5, "decode": 2}
    fleet.spec["decode"] = fleet.ready["decode"] = 4  # an operator edits the deployment by hand
    r = pl.tick(360.0, fleet.obs(traffic(3600)))
    assert r.decision.targets is None and r.decision.reason == Reason.ADOPTED_EXTERNAL_CHANGE
    assert r.decision.pool_reasons == {"decode": Reason.ADOPTED_EXTERNAL_CHANGE}
    r = pl.tick(540.0, fleet.obs(traffic(3600)))  # within the grace period: left alone
    assert r.decision.targets is None and r.decision.pool_reasons["decode"] == Reason.HOLD_EXTERNAL_GRACE
    r = pl.tick(900.0, fleet.obs(traffic(3600)))  # later: planned from the adopted state
    # needs 2.0 decode: back to 2
    assert r.decision.targets == {"prefill": 5, "decode": 2} and r.decision.reason == Reason.SCALE_DOWN_THROUGHPUT


def test_external_edit_during_pending_is_adopted():
    pl = Planner(thpt_config(), profile())
    fleet = Fleet(prefill=1, decode=1)
    pl.tick(0.0, fleet.obs())
    pl.tick(180.0, fleet.obs(traffic(3600)))  # decision 1 -> 5/2, never applied
    fleet.spec["prefill"] = 7  # someone else set 7
    r = pl.tick(360.0, fleet.obs(traffic(3600)))
    assert r.decision.reason == Reason.ADOPTED_EXTERNAL_CHANGE and pl.pending_decision_id is None


def test_virtual_connector_acknowledgement():
    pl = Planner(thpt_config(), profile())
    fleet = Fleet(prefill=1, decode=1)
    pl.tick(0.0, fleet.obs())
    r = pl.tick(180.0, fleet.obs(traffic(3600), applied_decision_id=0))
    assert r.decision.decision_id == 1
    fleet.apply(r.decision)
    r = pl.tick(360.0, fleet.obs(traffic(7200), applied_decision_id=0))  # applied but not yet acknowledged
    assert r.decision.reason == Reason.HOLD_PENDING
    r = pl.tick(540.0, fleet.obs(traffic(7200), applied_decision_id=1))
    assert r.decision.decision_id == 2


# ------------------------------------------------------------------ load loop


def steady_passes(ts, kvs, pool="decode"):
    return training_passes(ts, pool) + [decode_pass(i, kv, ts, pool=pool) for i, kv in enumerate(kvs)]


def test_load_scales_up_only_when_all_engines_over_sla():
    pl = Planner(load_config_(), None)
    fleet = Fleet(decode=2)
    pl.tick(0.0, fleet.obs())
    # ITL = 4 + 0.0002 x kv ms: 300k -> 64 ms (over 50), 100k -> 24 ms
    r = pl.tick(5.0, fleet.obs(passes=steady_passes(5.0, [300000, 100000])))
    assert r.decision.targets is None and r.decision.pool_reasons["decode"] == Reason.HOLD_WITHIN_SLA
    assert r.diagnostics.estimated_itl_ms == pytest.approx(64.0, rel=1e-6)
    r = pl.tick(10.0, fleet.obs(passes=steady_passes(10.0, [300000, 260000])))
    assert r.decision.targets == {"decode": 3} and r.decision.reason == Reason.SCALE_UP_ITL  # +1 only


def test_load_scales_down_only_when_n_minus_1_absorb():
    pl = Planner(load_config_(), None)
    fleet = Fleet(decode=2)
    pl.tick(0.0, fleet.obs())
    # both at 30 ms (< 50 x 0.8) but one engine with 2 x 130k = 260k -> 56 ms: cannot absorb
    r = pl.tick(5.0, fleet.obs(passes=steady_passes(5.0, [130000, 130000])))
    assert r.decision.targets is None and r.decision.pool_reasons["decode"] == Reason.HOLD_WITHIN_SLA
    # 2 x 80k = 160k -> 36 ms: absorbed
    r = pl.tick(10.0, fleet.obs(passes=steady_passes(10.0, [80000, 80000])))
    assert r.decision.targets == {"decode": 1} and r.decision.reason == Reason.SCALE_DOWN_CONSOLIDATED


def test_load_zero_traffic_idle_heartbeats_scale_down_to_min_one_step_per_interval():
    pl = Planner(load_config_(), None)
    fleet = Fleet(decode=3)
    pl.tick(0.0, fleet.obs())
    sizes = []
    for k in range(1, 6):
        t = 5.0 * k
        r = pl.tick(t, fleet.obs(passes=[idle_pass(i, t) for i in range(fleet.spec["decode"])]))
        fleet.apply(r.decision)
        sizes.append(fleet.spec["decode"])
    assert sizes == [2, 1, 1, 1, 1]  # no regression needed for zero load; stops at min_replicas


def test_fpm_source_failure_holds():
    pl = Planner(load_config_(), None)
    fleet = Fleet(decode=3)
    pl.tick(0.0, fleet.obs())
    r = pl.tick(5.0, fleet.obs(passes=(), passes_ok=False))
    assert r.decision.reason == Reason.HOLD_METRICS_UNKNOWN
    r = pl.tick(10.0, fleet.obs(passes=()))  # no engine ever reported: unknown, not idle
    assert r.decision.reason == Reason.HOLD_METRICS_UNKNOWN


def test_degenerate_regression_never_scales_up_unboundedly():
    pl = Planner(load_config_(decode=PoolLimits(1, 6, 1)), None)
    fleet = Fleet(decode=2)
    pl.tick(0.0, fleet.obs())
    # bigger passes took less time: a negative slope (e.g. a clock glitch or mixed hardware)
    bad = [decode_pass(0, kv, 4.0, wall=0.5 - 1e-6 * kv) for kv in range(10000, 400000, 20000)]
    now = [decode_pass(w, 390000, 5.0, wall=0.5 - 1e-6 * 390000) for w in (0, 1)]
    r = pl.tick(5.0, fleet.obs(passes=bad + now))
    assert pl.regression("decode").degenerate
    assert r.decision.targets is None and r.decision.reason == Reason.HOLD_REGRESSION_DEGENERATE
    # even a valid fit with absurd queues moves +1 per interval and stops at max_replicas
    pl = Planner(load_config_(decode=PoolLimits(1, 6, 1)), None)
    fleet = Fleet(decode=2)
    pl.tick(0.0, fleet.obs())
    sizes = []
    for k in range(1, 12):
        t = 5.0 * k
        passes = training_passes(t) + [decode_pass(i, 10**9, t) for i in range(fleet.spec["decode"])]
        fleet.apply(pl.tick(t, fleet.obs(passes=passes)).decision)
        sizes.append(fleet.spec["decode"])
    assert sizes == [3, 4, 5, 6, 6, 6, 6, 6, 6, 6, 6]


def test_load_regression_warming_up_holds():
    pl = Planner(load_config_(regression_min_samples=50), None)
    fleet = Fleet(decode=2)
    pl.tick(0.0, fleet.obs())
    r = pl.tick(5.0, fleet.obs(passes=[decode_pass(0, 300000, 5.0), decode_pass(1, 300000, 5.0)]))
    assert r.decision.reason == Reason.HOLD_REGRESSION_WARMING_UP


def test_throughput_result_is_the_floor_under_the_load_loop():
    cfg = PlannerConfig(
        mode="decode",
        predictor="constant",
        itl_ms=30.0,
        correction_enabled=False,
        load_enabled=True,
        regression_min_samples=4,
        max_gpu_budget=16,
    )
    pl = Planner(cfg, profile())
    fleet = Fleet(decode=3)
    pl.tick(0.0, fleet.obs())
    # throughput: 3000 x 150 / 180 / 1500 = 1.67 -> 2 decode replicas is the floor; the band
    # ceil(1.67 x 1.1) = 2 lets the load loop consolidate to it
    t = 180.0
    r = pl.tick(t, fleet.obs(traffic(3000), passes=[idle_pass(i, t) for i in range(3)]))
    fleet.apply(r.decision)
    assert fleet.spec == {"decode": 2} and r.decision.reason == Reason.SCALE_DOWN_CONSOLIDATED
    r = pl.tick(185.0, fleet.obs(passes=[idle_pass(i, 185.0) for i in range(2)]))  # idle, but the floor is 2
    assert r.decision.targets is None and r.decision.reason == Reason.HOLD_THROUGHPUT_FLOOR
    # demand doubles: throughput floor 4 raises the pool at once, not +1
    r = pl.tick(360.0, fleet.obs(traffic(7200), passes=[idle_pass(i, 360.0) for i in range(2)]))
    assert r.decision.targets == {"decode": 4} and r.decision.reason == Reason.RAISED_TO_THROUGHPUT_FLOOR


def test_load_loop_does_not_consolidate_below_the_throughput_floor():
    cfg = PlannerConfig(
        mode="decode",
        predictor="constant",
        itl_ms=30.0,
        correction_enabled=False,
        load_enabled=True,
        regression_min_samples=4,
        max_gpu_budget=16,
    )
    pl = Planner(cfg, profile())
    fleet = Fleet(decode=3)
    pl.tick(0.0, fleet.obs())
    # idle engines before any full throughput interval: no scale-down (the early sizing only scales up)
    r = pl.tick(5.0, fleet.obs(passes=[idle_pass(i, 5.0) for i in range(3)]))
    assert r.decision.targets is None and r.decision.reason == Reason.HOLD_THROUGHPUT_FLOOR
    # requirement 3600 x 150 / 180 / 1500 = 2.0: the idle engines consolidate to 2, not below
    r = pl.tick(180.0, fleet.obs(traffic(3600), passes=[idle_pass(i, 180.0) for i in range(3)]))
    assert r.decision.targets == {"decode": 2}
    fleet.apply(r.decision)
    r = pl.tick(185.0, fleet.obs(passes=[idle_pass(i, 185.0) for i in range(2)]))
    assert r.decision.targets is None and r.decision.reason == Reason.HOLD_THROUGHPUT_FLOOR


def test_no_oscillation_in_load_loop_near_threshold():
    pl = Planner(load_config_(), None)
    fleet = Fleet(decode=2)
    pl.tick(0.0, fleet.obs())
    changes = 0
    total_kv = 250000  # one engine alone: 54 ms (over); split in two: 29 ms each
    for k in range(1, 60):
        t = 5.0 * k
        n = fleet.spec["decode"]
        wobble = 1.0 + (0.04 if k % 2 else -0.04)
        kvs = [int(total_kv * wobble / n)] * n
        before = dict(fleet.spec)
        fleet.apply(pl.tick(t, fleet.obs(passes=steady_passes(t, kvs))).decision)
        changes += fleet.spec != before
    assert changes == 0


# ------------------------------------------------------------------ modes, determinism, diagnostics


@pytest.mark.parametrize(
    "mode,spec,expected",
    [
        ("prefill", {"prefill": 1}, {"prefill": 5}),
        ("decode", {"decode": 1}, {"decode": 2}),
        ("agg", {"agg": 1}, {"agg": 5}),  # max(prefill 5, decode 2)
    ],
)
def test_modes(mode, spec, expected):
    pl = Planner(thpt_config(mode=mode), profile())
    fleet = Fleet(**spec)
    pl.tick(0.0, fleet.obs())
    assert pl.tick(180.0, fleet.obs(traffic(3600))).decision.targets == expected


def test_missing_profile_half_is_a_config_error():
    from dynoplan.errors import ConfigError
    from planner.core.interpolation import PerformanceProfile

    with pytest.raises(ConfigError, match="needs a decode profile"):
        Planner(thpt_config(), PerformanceProfile(profile().prefill, None))


def run_sequence(seed_traffic):
    pl = Planner(thpt_config(predictor="kalman"), profile())
    fleet = Fleet(prefill=1, decode=1)
    out = [pl.tick(0.0, fleet.obs()).diagnostics.to_dict()]
    for k, n in enumerate(seed_traffic, start=1):
        r = pl.tick(180.0 * k, fleet.obs(traffic(n)))
        fleet.apply(r.decision)
        out.append(r.diagnostics.to_dict())
    return json.dumps(out, sort_keys=True)


def test_deterministic_and_json_diagnostics():
    seq = [3600, 3000, 4200, 0, 1800, 5400, 3600, 3600]
    a, b = run_sequence(seq), run_sequence(seq)
    assert a == b
    rows = json.loads(a)
    assert rows[1]["decision"]["reason"] == "scale_up_throughput" and rows[1]["predictor"] == "kalman"


def test_warm_start_from_trace_primes_predictors():
    from planner.arguments import warm_start_windows

    hist = warm_start_windows("examples/traces/azure_llm_conv_2023.csv", 180.0)
    pl = Planner(thpt_config(predictor="constant"), profile(), warm_start=hist)
    assert pl.throughput._pred_req.predict_next() == hist[-1].num_requests
    assert len(pl.throughput._pred_req.values) == len(hist)


def test_metrics_on_a_registry_passed_in():
    from prometheus_client import CollectorRegistry, generate_latest

    from planner.core.metrics import PlannerMetrics

    reg = CollectorRegistry()
    m = PlannerMetrics(reg)
    pl = Planner(thpt_config(), profile())
    fleet = Fleet(prefill=1, decode=1)
    m.update(pl.tick(0.0, fleet.obs()))
    r = pl.tick(180.0, fleet.obs(traffic(3600, ttft=120.0, itl=20.0)))
    m.update(r)
    assert reg.get_sample_value("dynamo_planner_num_prefill_replicas") == 1.0
    assert reg.get_sample_value("dynamo_planner_predicted_num_prefill_replicas") == 5.0
    assert reg.get_sample_value("dynamo_planner_predicted_num_decode_replicas") == 2.0
    assert reg.get_sample_value("dynamo_planner_observed_requests_per_second") == 20.0
    assert reg.get_sample_value("dynamo_planner_observed_ttft_ms") == 120.0
    assert reg.get_sample_value("dynamo_planner_predicted_requests_per_second") == 20.0
    assert reg.get_sample_value("dynamo_planner_gpu_hours") == pytest.approx(2 * 180 / 3600)
    assert reg.get_sample_value("dynamo_planner_decisions_total") == 1.0
    assert (
        reg.get_sample_value(
            "dynamo_planner_decision_reason", {"dynamo_planner_decision_reason": "scale_up_throughput"}
        )
        == 1.0
    )
    assert b"dynamo_planner_estimated_itl_ms" in generate_latest(reg)
    assert math.isnan(reg.get_sample_value("dynamo_planner_estimated_itl_ms"))


def test_agg_load_loop_uses_both_features():
    from dynoplan.fpm import QueuedRequests, ScheduledRequests
    from planner.core.observations import PassObservation

    pl = Planner(
        PlannerConfig(
            mode="agg",
            throughput_enabled=False,
            load_enabled=True,
            regression_min_samples=4,
            ttft_ms=500.0,
            itl_ms=50.0,
        ),
        None,
    )
    fleet = Fleet(agg=2)
    pl.tick(0.0, fleet.obs())

    def p(worker, pre, kv, ts, q=0, qn=0):
        wall = 0.003 + 1e-5 * pre + 2e-7 * kv
        return PassObservation(
            worker,
            0,
            wall,
            ScheduledRequests(
                num_prefill_requests=1 if pre else 0,
                sum_prefill_tokens=pre,
                num_decode_requests=10,
                sum_decode_kv_tokens=kv,
            ),
            QueuedRequests(num_prefill_requests=qn, sum_prefill_tokens=q),
            pool="agg",
            timestamp_s=ts,
        )

    train = [
        p(0, pre, kv, 4.0)
        for pre, kv in (
            (0, 1000),
            (4000, 1000),
            (8000, 50000),
            (2000, 100000),
            (6000, 20000),
            (1000, 150000),
            (3000, 5000),
        )
    ]
    # queues of 60000 prompt tokens: TTFT ~ 8 passes x ~(3 + 81.8 + 2) ms = ~700 ms > 500 on both engines
    now = [p(w, 8000, 10000, 5.0, q=60000, qn=30) for w in (0, 1)]
    r = pl.tick(5.0, fleet.obs(passes=train + now))
    fit = pl.regression("agg")
    assert fit.slope("sum_prefill_tokens") == pytest.approx(1e-5) and fit.slope(
        "sum_decode_kv_tokens"
    ) == pytest.approx(2e-7)
    assert r.decision.targets == {"agg": 3} and r.decision.reason == Reason.SCALE_UP_TTFT
    est = {e.worker_id: e for e in r.diagnostics.engines}
    assert est[0].queued_prefill_tokens == 60000 and est[0].estimated_ttft_ms > 500.0
    # ITL: decode-only pass (3 + 2 ms at 10000 KV tokens) over 1 - prefill share of the engine's time.
    # worker 1 reported one 85 ms pass of 8000 prefill tokens: u = 1e-5 x 8000 / 0.085
    assert est[1].estimated_itl_ms == pytest.approx(5.0 / (1 - 0.08 / 0.085), rel=1e-6)
    # worker 0: its latest pass (the one running at the sampling instant) is left out of the rate; the other
    # seven: 24000 prefill tokens over 7 x 3 ms + 0.24 s + 327000 x 2e-7 s = 0.3264 s of passes
    assert est[0].estimated_itl_ms == pytest.approx(5.0 / (1 - 0.24 / 0.3264), rel=1e-6)
    # both below the full-chunk pass the old estimate charged every decode step (3 + 81.82 + 2 ms)
    assert max(e.estimated_itl_ms for e in est.values()) < 3 + 1e-5 * (8192 - 10) * 1000 + 2.0


def test_time_going_backwards_is_an_observation_error():
    from dynoplan.errors import DynoplanError, ObservationError

    pl = Planner(thpt_config(), profile())
    fleet = Fleet(prefill=1, decode=1)
    pl.tick(100.0, fleet.obs())
    with pytest.raises(ObservationError, match="now_s=50.0: expected >= the previous tick's 100.0") as ei:
        pl.tick(50.0, fleet.obs())
    assert isinstance(ei.value, DynoplanError)


def test_early_tick_is_not_due_and_keeps_schedule():
    pl = Planner(thpt_config(), profile())
    fleet = Fleet(prefill=1, decode=1)
    pl.tick(0.0, fleet.obs())
    r = pl.tick(60.0, fleet.obs(traffic(3600)))
    assert r.decision.reason == Reason.HOLD_NOT_DUE and r.next_tick_s == 180.0 and r.diagnostics.loops_run == ()


def test_rebalance_decrease_first_then_increase_on_a_follow_up_tick():
    pl = Planner(thpt_config(max_gpu_budget=6), profile())
    fleet = Fleet(prefill=4, decode=2)
    pl.tick(0.0, fleet.obs())
    # 1440 req x 2000 / 180 / 8000 = 2.0 prefill; 1440 x 750 / 180 / 1500 = 4.0 decode -> goal 2P + 4D = 6 GPUs,
    # but raising decode before prefill shrinks would hold 4P + 4D = 8 GPUs
    r = pl.tick(180.0, fleet.obs(traffic(1440, osl=750.0)))
    assert r.decision.targets == {"prefill": 2, "decode": 2}
    assert r.decision.reason == Reason.SCALE_DOWN_THROUGHPUT and Reason.REBALANCE_DECREASE_FIRST in r.decision.reasons
    assert r.next_tick_s == 185.0  # follow up after one load interval, not at 360
    fleet.apply(r.decision)
    r = pl.tick(185.0, fleet.obs())
    assert r.decision.targets == {"prefill": 2, "decode": 4} and r.next_tick_s == 360.0


def test_scale_down_cooldown_after_scale_up():
    pl = Planner(thpt_config(scale_down_cooldown_s=400.0), profile())
    fleet = Fleet(prefill=1, decode=1)
    pl.tick(0.0, fleet.obs())
    fleet.apply(pl.tick(180.0, fleet.obs(traffic(3600))).decision)  # up to 5/2 at t=180
    r = pl.tick(360.0, fleet.obs(traffic(360)))  # demand collapses 180 s later: within the cooldown
    assert r.decision.targets is None and r.decision.reason == Reason.HOLD_COOLDOWN
    r = pl.tick(720.0, fleet.obs(traffic(360)))  # 540 s after the scale-up
    assert r.decision.targets == {"prefill": 1, "decode": 1}


def test_missing_pool_in_observation_is_unknown():
    pl = Planner(thpt_config(), profile())
    pl.tick(0.0, Observations({"prefill": PoolState(1, 1), "decode": PoolState(1, 1)}))
    r = pl.tick(180.0, Observations({"prefill": PoolState(1, 1)}, traffic(3600)))
    assert r.decision.targets is None and r.decision.reason == Reason.HOLD_METRICS_UNKNOWN


def test_load_loop_does_not_scale_down_before_the_first_throughput_floor():
    # same passes as test_load_scales_down_only_when_n_minus_1_absorb (2 x 80k -> absorbed: the load loop
    # alone scales 2 -> 1); with the throughput loop on and its first interval not yet run, it holds
    pl = Planner(load_config_(throughput_enabled=True, predictor="constant", correction_enabled=False), profile())
    fleet = Fleet(decode=2)
    pl.tick(0.0, fleet.obs())
    r = pl.tick(10.0, fleet.obs(passes=steady_passes(10.0, [80000, 80000])))
    assert r.decision.targets is None and r.decision.pool_reasons["decode"] == Reason.HOLD_THROUGHPUT_FLOOR


def test_engines_that_fall_silent_are_idle_and_zero_traffic_scales_down_to_the_minimum():
    # the engines reported passes, then the traffic stopped: an engine with no work runs no passes and sends no
    # ForwardPassMetrics. With the FPM feed healthy that is idleness, not missing data (engine_stale_s = 30 s)
    pl = Planner(load_config_(), None)
    fleet = Fleet(decode=3)
    pl.tick(0.0, fleet.obs())
    fleet.apply(pl.tick(5.0, fleet.obs(passes=[decode_pass(i, 1000, 5.0) for i in range(3)])).decision)
    sizes = []
    for t in (40.0, 45.0, 50.0, 55.0):
        r = pl.tick(t, fleet.obs(passes=()))
        fleet.apply(r.decision)
        sizes.append((fleet.spec["decode"], r.decision.reason))
    assert sizes == [
        (2, Reason.SCALE_DOWN_CONSOLIDATED),
        (1, Reason.SCALE_DOWN_CONSOLIDATED),
        (1, Reason.HOLD_WITHIN_SLA),
        (1, Reason.HOLD_WITHIN_SLA),
    ]
    # a broken feed is still unknown
    assert pl.tick(60.0, fleet.obs(passes=(), passes_ok=False)).decision.reason == Reason.HOLD_METRICS_UNKNOWN


def test_a_flooded_agg_engine_with_a_degenerate_fit_still_scales_up_on_its_measured_ttft():
    """Every pass a full chunk (a flood): prefill tokens are C minus the decode rows, so the two features move
    together and the decode slope comes out negative (unidentified). The ITL estimate is unknown, the TTFT
    falls back to the measured prefill rate, and a TTFT known to violate on every engine scales up; before,
    the unknown ITL held the planner at hold_regression_degenerate for as long as the flood lasted."""
    from dynoplan.fpm import QueuedRequests, ScheduledRequests
    from planner.core.observations import PassObservation

    cfg = load_config_(mode="agg", ttft_ms=300.0, itl_ms=10_000.0, max_gpu_budget=8)
    pl = Planner(cfg, None)
    fleet = Fleet(agg=1)
    pl.tick(0.0, fleet.obs())

    def flood_pass(n_dec: int, ts: float) -> PassObservation:
        pre, kv = 8192 - n_dec, 6000 * n_dec
        wall = 0.02 + 2e-5 * pre - 1e-8 * kv  # the decode term fits negative
        return PassObservation(
            0,
            0,
            wall,
            ScheduledRequests(
                num_prefill_requests=2, sum_prefill_tokens=pre, num_decode_requests=n_dec, sum_decode_kv_tokens=kv
            ),
            QueuedRequests(num_prefill_requests=40, sum_prefill_tokens=240_000),
            pool="agg",
            timestamp_s=ts,
        )

    passes = [flood_pass(n, 4.5 + 0.01 * n) for n in range(0, 40, 4)]
    r = pl.tick(cfg.load_adjustment_interval_s, fleet.obs(passes=passes))
    fit = pl.regression("agg")
    assert fit is not None and math.isnan(fit.slope("sum_decode_kv_tokens"))
    [est] = r.diagnostics.engines
    assert est.estimated_itl_ms is None
    counted = passes[:-1]  # the latest pass of the tick is left out of the rate (inspection paradox)
    rate = sum(p.scheduled_requests.sum_prefill_tokens for p in counted) / sum(p.wall_time for p in counted)
    isl = 240_000 / 40  # no frontend ISL: the mean queued prompt
    assert est.estimated_ttft_ms == pytest.approx((240_000 + isl) / rate * 1000.0)
    assert est.estimated_ttft_ms > 300.0 * 2
    # the step is proportional, at most x2 (load_max_scale_up_factor 1 in REFERENCE_RULES: +1)
    assert r.decision.reason == Reason.SCALE_UP_TTFT and r.decision.targets == {"agg": 2}


# ------------------------------------------------------------------ loop clocks
def test_loop_clock_far_behind_catches_up_in_one_step():
    from planner.core.planner import _next_due

    assert _next_due(5.0, 12.0, 5.0) == 15.0  # a few intervals: added one at a time, as always
    assert _next_due(0.0, 1e6, 1e-9) > 1e6  # 1e15 intervals behind: one step, not 1e15 additions
    assert 1.0 < _next_due(1.0, 1.0, 1e-20) < 1.0 + 1e-6  # below the clock's resolution: still ahead of now


def test_tiny_load_interval_does_not_stall_a_tick():
    import time

    pl = Planner(thpt_config(load_adjustment_interval_s=1e-12), profile())  # the load loop off: its clock idle
    fleet = Fleet(prefill=1, decode=1)
    pl.tick(0.0, fleet.obs())
    t0 = time.perf_counter()
    r = pl.tick(180.0, fleet.obs(traffic(3600)))
    assert r.decision.targets == {"prefill": 5, "decode": 2}
    assert time.perf_counter() - t0 < 10.0
    on = Planner(load_config_(load_adjustment_interval_s=1e-20), profile())  # the load loop on, interval < ulp
    on.tick(0.0, Fleet(decode=1).obs())
    assert on.tick(1.0, Fleet(decode=1).obs()).next_tick_s > 1.0


# ------------------------------------------------------------------ early checks of the forecast


def test_the_forecast_test_is_the_poisson_lower_bound_hand_computed():
    from scipy.stats import chi2

    from planner.core.loops import forecast_exceeded

    # 50 arrivals in 30 s against a forecast of 1/s (30 expected): P(N >= 50 | 30) = 5.2e-4 < 0.01, and the least
    # rate they support is the 1 % Poisson lower bound chi2.ppf(0.01, 2 x 50) / 2 / 30 s = 1.1677 requests/s
    assert forecast_exceeded([50], 30.0, 1.0) == pytest.approx(chi2.ppf(0.01, 100) / 2 / 30.0, rel=1e-12)
    assert forecast_exceeded([50], 30.0, 1.0) == pytest.approx(1.167748, abs=1e-6)
    assert forecast_exceeded([42], 30.0, 1.0) is None  # P(N >= 42 | 30) = 0.022: the forecast stands
    assert forecast_exceeded([0], 30.0, 0.0) is None  # nothing arrived
    assert forecast_exceeded([1], 30.0, 0.0) == pytest.approx(-math.log(0.99) / 30.0)  # forecast 0: any arrival


@settings(max_examples=300, deadline=None)
@given(
    n=st.integers(0, 5000),
    span_s=st.sampled_from([10.0, 30.0, 60.0, 150.0]),
    rate=st.floats(0.0, 100.0, allow_nan=False),
)
def test_the_forecast_test_agrees_with_the_poisson_tail(n, span_s, rate):
    from scipy.stats import poisson

    from planner.core.loops import FORECAST_TEST_LEVEL, forecast_exceeded

    lo = forecast_exceeded([n], span_s, rate)
    tail = poisson.sf(n - 1, rate * span_s) if n > 0 else 1.0  # P(N >= n)
    if lo is None:
        assert n == 0 or tail >= FORECAST_TEST_LEVEL * (1 - 1e-9)
    else:
        assert tail < FORECAST_TEST_LEVEL * (1 + 1e-9)
        assert lo >= rate * (1 - 1e-9)  # the bound is above the forecast exactly when the test rejects it
        assert poisson.sf(n - 1, lo * span_s) == pytest.approx(FORECAST_TEST_LEVEL, rel=1e-6)


def test_the_stretches_a_check_tests_hand_computed():
    from planner.core.loops import trailing_stretches

    assert trailing_stretches(0) == ()
    assert trailing_stretches(1) == (1,)
    assert trailing_stretches(3) == (1, 2, 3)  # an early check 30 s after its sizing (10 s bins)
    assert trailing_stretches(4) == (1, 2, 4)
    assert trailing_stretches(18) == (1, 2, 4, 8, 16, 18)  # the last check of a 180 s interval


def test_the_forecast_test_scans_the_latest_stretches_hand_computed():
    from scipy.special import gammaincinv

    from planner.core.loops import forecast_exceeded, rate_lower_bound

    # 8 arrivals per 10 s bin for 50 s, then 30 in the last bin, against a forecast of 1/s. The whole 60 s (70
    # against 60) does not reject it: its bound at 0.01 / 4 is 0.813 /s. The last bin (30 against 10) does: four
    # stretches (1, 2, 4, 6 bins) at 0.0025 each, and the largest bound is the last bin's,
    # gammaincinv(30, 0.0025) / 10 s = 1.6896 /s (last 2 bins: 38 in 20 s -> 1.1485; last 4: 54 in 40 s -> 0.8913)
    counts = [8.0] * 5 + [30.0]
    assert rate_lower_bound(70, 60.0, 0.0025) == pytest.approx(0.813256, abs=1e-6)
    assert rate_lower_bound(38, 20.0, 0.0025) == pytest.approx(1.148513, abs=1e-6)
    assert forecast_exceeded(counts, 10.0, 1.0) == pytest.approx(gammaincinv(30, 0.0025) / 10.0, rel=1e-12)
    assert forecast_exceeded(counts, 10.0, 1.0) == pytest.approx(1.689557, abs=1e-6)
    assert forecast_exceeded(counts, 10.0, 1.7) is None  # above every stretch's bound: the forecast stands
    # the same 70 arrivals spread evenly: no stretch rejects
    assert forecast_exceeded([70.0 / 6] * 6, 10.0, 1.0) is None
    assert forecast_exceeded([], 10.0, 1.0) is None


@settings(max_examples=200, deadline=None)
@given(
    counts=st.lists(st.integers(0, 200), min_size=1, max_size=18),
    rate=st.floats(0.0, 20.0, allow_nan=False),
    disp=st.floats(1.0, 10.0, allow_nan=False),
)
def test_the_scan_rejects_exactly_when_a_stretch_rejects_at_its_share_of_the_level(counts, rate, disp):
    from scipy.stats import gamma

    from planner.core.loops import FORECAST_TEST_LEVEL, forecast_exceeded, rate_lower_bound, trailing_stretches

    lengths = trailing_stretches(len(counts))
    level = FORECAST_TEST_LEVEL / len(lengths)
    lo = forecast_exceeded([float(c) for c in counts], 10.0, rate, dispersion=disp)
    tails = [
        gamma.cdf(rate * k * 10.0 / disp, sum(counts[-k:]) / disp) if sum(counts[-k:]) > 0 else 1.0 for k in lengths
    ]
    if lo is None:
        assert all(t >= level * (1 - 1e-9) for t in tails)
    else:
        assert any(t < level * (1 + 1e-9) for t in tails)
        assert lo >= rate * (1 - 1e-9)
        assert lo == max(rate_lower_bound(sum(counts[-k:]), k * 10.0, level, disp) for k in lengths)
    # more arrivals in the latest bin never lower the result (a larger count's bound is larger)
    more = forecast_exceeded([float(c) for c in counts[:-1]] + [counts[-1] + 50.0], 10.0, rate, dispersion=disp)
    assert lo is None or (more is not None and more >= lo * (1 - 1e-12))


def _window(per_bin: list[float]) -> TrafficWindow:
    """A 180 s window with ``per_bin`` arrivals per 10 s bin (18 bins), ISL 2000 / OSL 150."""
    n = float(sum(per_bin))
    return TrafficWindow(180.0, n, 2000.0, 150.0, arrival_counts=tuple(per_bin))


def test_early_checks_resize_on_a_surge_after_the_full_sizing_and_hold_at_the_forecast():
    pl = Planner(thpt_config(early_sizing_s=30.0), profile())
    fleet = Fleet(prefill=5, decode=2)
    pl.tick(0.0, fleet.obs())
    r = pl.tick(30.0, fleet.obs(_window([0.0] * 15 + [200.0] * 3)))  # the first early sizing: 600 in 30 s
    assert r.diagnostics.loops_run == ("early_throughput",) and r.next_tick_s == 60.0
    r = pl.tick(180.0, fleet.obs(_window([200.0] * 18)))  # full: 3600 / 180 s = 20 /s -> 5 prefill, 2 decode
    assert r.decision.targets is None and r.next_tick_s == 210.0
    # arrivals at the forecast rate: checks at 210 ... 330, none sizes again; the next full sizing at 360
    for t in (210.0, 240.0, 270.0, 300.0, 330.0):
        r = pl.tick(t, fleet.obs(_window([200.0] * 18)))
        assert r.diagnostics.loops_run == ("early_throughput",) and r.decision.targets is None
    assert r.next_tick_s == 360.0
    r = pl.tick(360.0, fleet.obs(_window([200.0] * 18)))
    assert r.diagnostics.loops_run == ("throughput",) and r.decision.targets is None
    # twice the forecast in the 30 s since that sizing: 400 arrivals in each of its 3 bins. The window's dispersion
    # reads the step as variance: 200^2 / (2 x 17) = 1176.5 over a mean of 233.3 = 5.042. The stretches of 1, 2, 3
    # bins at 0.01 / 3 each bound the rate at 28.88, 31.92 and 33.32 /s (gammaincinv(1200 / 5.042, 0.01 / 3) x
    # 5.042 / 30 s): the largest, 33.321 /s -> 5998 requests an interval -> 5998 x 2000 / 180 / 8000 = 8.33 -> 9
    # prefill, 5998 x 150 / 180 / 1500 = 3.33 -> 4 decode
    r = pl.tick(390.0, fleet.obs(_window([200.0] * 15 + [400.0] * 3)))
    assert r.decision.targets == {"prefill": 9, "decode": 4}
    assert r.decision.reason == Reason.SCALE_UP_THROUGHPUT
    assert r.diagnostics.predicted_requests_per_second == pytest.approx(33.321, abs=1e-3)
    fleet.apply(r.decision)
    # half the forecast: the checks only scale up, so nothing is removed before the next full sizing
    r = pl.tick(420.0, fleet.obs(_window([100.0] * 18)))
    assert r.decision.targets is None


def test_a_full_sizing_makes_the_check_it_falls_on_against_its_new_forecast():
    def run(early_sizing_s):
        pl = Planner(thpt_config(early_sizing_s=early_sizing_s), profile())
        fleet = Fleet(prefill=5, decode=2)
        pl.tick(0.0, fleet.obs())
        if early_sizing_s is not None:
            pl.tick(30.0, fleet.obs(_window([0.0] * 15 + [200.0] * 3)))
            for t in (60.0, 90.0, 120.0, 150.0):
                pl.tick(t, fleet.obs(_window([200.0] * 18)))
        # the interval ends in a surge: 4200 arrivals, the constant forecast 4200 / 180 s = 23.3 /s
        return pl.tick(180.0, fleet.obs(_window([200.0] * 15 + [400.0] * 3)))

    # checks every 30 s: the latest 30 s (1200 arrivals) reject 23.3 /s; the stretches' largest bound is 33.321 /s,
    # as at the early check above -> 5998 an interval -> 9 prefill, 4 decode
    r = run(30.0)
    assert r.diagnostics.loops_run == ("throughput",)
    assert r.diagnostics.predicted_requests_per_second == pytest.approx(33.321, abs=1e-3)
    assert r.decision.targets == {"prefill": 9, "decode": 4}
    # without early checks the forecast stands: 4200 x 2000 / 180 / 8000 = 5.83 -> 6 prefill, 4200 x 150 / 180 /
    # 1500 = 2.33 -> 3 decode
    r = run(None)
    assert r.diagnostics.predicted_requests_per_second == pytest.approx(4200.0 / 180.0)
    assert r.decision.targets == {"prefill": 6, "decode": 3}


def test_a_full_sizing_with_no_check_before_it_tests_the_latest_early_sizing_span():
    # early checks on, but no early tick ran before the full sizing (a driver that ticks only at the interval):
    # the span tested is early_sizing_s itself, the latest 3 bins, at the window's dispersion -- the same test,
    # bound (33.321 /s) and fleet (9 + 4) as after a run of early checks (the test above)
    pl = Planner(thpt_config(early_sizing_s=30.0), profile())
    fleet = Fleet(prefill=5, decode=2)
    pl.tick(0.0, fleet.obs())
    r = pl.tick(180.0, fleet.obs(_window([200.0] * 15 + [400.0] * 3)))
    assert r.diagnostics.loops_run == ("throughput",)
    assert r.diagnostics.predicted_requests_per_second == pytest.approx(33.321, abs=1e-3)
    assert r.decision.targets == {"prefill": 9, "decode": 4}


def test_a_check_span_longer_than_the_window_tests_the_bins_the_window_has():
    from scipy.special import gammaincinv

    from planner.core.loops import _check

    # 30 s asked of a 20 s window (2 bins, 100 then 400): the stretches are the latest bin and both, at 0.01 / 2
    # each, dispersion 1 (fewer than 3 bins). Latest bin: gammaincinv(400, 0.005) / 10 s = 35.036 /s; both:
    # gammaincinv(500, 0.005) / 20 s = 22.214 /s. Against 10 /s both reject and the larger is the result; against
    # 30 /s only the latest bin does
    w = TrafficWindow(20.0, 500.0, 2000.0, 150.0, arrival_counts=(100.0, 400.0))
    assert float(gammaincinv(400, 0.005)) / 10.0 == pytest.approx(35.03625, abs=1e-5)
    assert float(gammaincinv(500, 0.005)) / 20.0 == pytest.approx(22.21409, abs=1e-5)
    assert _check(w, 30.0, 10.0) == pytest.approx(35.03625, abs=1e-5)
    assert _check(w, 30.0, 30.0) == pytest.approx(35.03625, abs=1e-5)
    assert _check(w, 30.0, 36.0) is None


def test_the_dispersion_index_hand_computed():
    from planner.core.loops import dispersion_index

    # [0, 20, 0, 20]: successive differences 20, 20, 20 -> 3 x 400 / (2 x 3) = 200 over a mean of 10 -> 20
    assert dispersion_index([0.0, 20.0, 0.0, 20.0]) == pytest.approx(20.0)
    # a ramp 10 ... 50: differences 10 -> 4 x 100 / (2 x 4) = 50 over a mean of 30 -> 5/3; the plain sample
    # variance (250) would give 8.3 and read the trend as burstiness
    assert dispersion_index([10.0, 20.0, 30.0, 40.0, 50.0]) == pytest.approx(5.0 / 3.0)
    assert dispersion_index([10.0, 10.0, 10.0]) == 1.0  # under-dispersed: never sharper than Poisson
    assert dispersion_index([0.0, 0.0, 0.0, 0.0]) == 1.0  # nothing arrived
    assert dispersion_index([5.0, 50.0]) == 1.0  # fewer than 3 bins


def test_the_forecast_test_scales_the_poisson_count_by_the_dispersion_hand_computed():
    from scipy.stats import poisson

    from planner.core.loops import forecast_exceeded

    # 50 arrivals in 30 s at a forecast of 1/s rejects it for Poisson arrivals (P = 5.2e-4, above); at dispersion 2
    # the count is 25 against a mean of 15: P(N >= 25 | 15) = 0.0112 >= 0.01, the forecast stands
    assert poisson.sf(24, 15.0) == pytest.approx(0.011165, abs=1e-6)
    assert forecast_exceeded([50], 30.0, 1.0, dispersion=2.0) is None
    # 80 at dispersion 2: 40 against 15 rejects; the bound gammaincinv(40, 0.01) x 2 / 30 s
    assert forecast_exceeded([80], 30.0, 1.0, dispersion=2.0) == pytest.approx(1.784669, abs=1e-6)
    # dispersion below 1 (or not finite) is the Poisson test
    assert forecast_exceeded([50], 30.0, 1.0, dispersion=0.5) == forecast_exceeded([50], 30.0, 1.0)
    assert forecast_exceeded([50], 30.0, 1.0, dispersion=math.nan) == forecast_exceeded([50], 30.0, 1.0)


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(1, 3000),
    rate=st.floats(0.0, 50.0, allow_nan=False),
    disp=st.floats(1.0, 20.0, allow_nan=False),
)
def test_the_dispersed_forecast_test_agrees_with_the_gamma_tail(n, rate, disp):
    from scipy.stats import gamma

    from planner.core.loops import FORECAST_TEST_LEVEL, forecast_exceeded

    span_s = 30.0
    lo = forecast_exceeded([n], span_s, rate, dispersion=disp)
    tail = gamma.cdf(rate * span_s / disp, n / disp)  # P(N >= n / d) for the scaled Poisson count, continuous in n
    if lo is None:
        assert tail >= FORECAST_TEST_LEVEL * (1 - 1e-9)
    else:
        assert tail < FORECAST_TEST_LEVEL * (1 + 1e-9)
        assert lo >= rate * (1 - 1e-9)
        assert gamma.cdf(lo * span_s / disp, n / disp) == pytest.approx(FORECAST_TEST_LEVEL, rel=1e-6)


def test_early_checks_hold_a_surge_that_bursty_traffic_explains():
    pl = Planner(thpt_config(early_sizing_s=30.0), profile())
    fleet = Fleet(prefill=5, decode=2)
    pl.tick(0.0, fleet.obs())
    pl.tick(30.0, fleet.obs(_window([0.0] * 15 + [200.0] * 3)))
    # the full sizing sees 3600 arrivals as bursts, 0 and 400 per bin alternating: forecast 20 /s at dispersion
    # 400^2 / 2 / 200 = 400
    r = pl.tick(180.0, fleet.obs(_window([0.0, 400.0] * 9)))
    assert r.diagnostics.loops_run == ("throughput",) and r.decision.targets is None
    # twice the forecast in the next 30 s (1200 against 600) re-sizes smooth traffic (the test above); for this
    # traffic it is 3 against 1.5 bursts: P(N >= 3 | 1.5) = 0.19, the forecast stands
    r = pl.tick(210.0, fleet.obs(_window([0.0, 400.0] * 7 + [0.0] + [400.0] * 3)))
    assert r.diagnostics.loops_run == ("early_throughput",) and r.decision.targets is None
