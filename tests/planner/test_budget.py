"""GPU budget and replica limits: hand cases and the never-exceeded property (hypothesis)."""

from hypothesis import given, settings
from hypothesis import strategies as st

from planner.core.budget import apply_limits, gpus
from planner.core.config import PlannerConfig, PoolLimits


def cfg(budget=8, pg=1, dg=1, pmin=1, dmin=1, pmax=None, dmax=None, min_budget=0):
    return PlannerConfig(
        max_gpu_budget=budget,
        min_gpu_budget=min_budget,
        prefill=PoolLimits(pmin, pmax, pg),
        decode=PoolLimits(dmin, dmax, dg),
    )


def test_clamp_to_min_and_max():
    r = apply_limits({"prefill": 0, "decode": 9}, {"prefill": 1, "decode": 1}, cfg(budget=100, dmax=4))
    assert r.targets == {"prefill": 1, "decode": 4}
    assert set(r.reasons) == {"raised_to_min_replicas", "capped_by_max_replicas"}


def test_over_budget_scaled_proportionally():
    # want 6 prefill x 1 GPU + 6 decode x 2 GPUs = 18 > 12: scale 2/3 -> 4 + 4 (4 + 8 = 12)
    r = apply_limits({"prefill": 6, "decode": 6}, {"prefill": 1, "decode": 1}, cfg(budget=12, dg=2))
    assert r.goal == {"prefill": 4, "decode": 4} and "capped_by_budget" in r.reasons
    assert gpus(r.targets, cfg(budget=12, dg=2)) <= 12


def test_rebalance_decreases_first():
    c = cfg(budget=6)
    # move from 4P+2D to 2P+4D: applying the decode increase first would hold 8 GPUs
    r = apply_limits({"prefill": 2, "decode": 4}, {"prefill": 4, "decode": 2}, c)
    assert r.targets == {"prefill": 2, "decode": 2} and r.goal == {"prefill": 2, "decode": 4}
    assert "rebalance_decrease_first" in r.reasons
    # once the decrease is reflected, the increase follows
    assert apply_limits(r.goal, r.targets, c).targets == {"prefill": 2, "decode": 4}


def test_min_gpu_budget_raises_smallest_pool():
    r = apply_limits({"prefill": 1, "decode": 1}, {"prefill": 1, "decode": 1}, cfg(budget=8, min_budget=4))
    assert r.targets == {"prefill": 2, "decode": 2} and "raised_to_min_gpu_budget" in r.reasons


def test_current_over_budget_only_decreases():
    r = apply_limits({"prefill": 5, "decode": 5}, {"prefill": 6, "decode": 1}, cfg(budget=6))
    assert r.targets["prefill"] <= 6 and r.targets["decode"] <= 1


@st.composite
def scenario(draw):
    pg, dg = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    pmin, dmin = draw(st.integers(0, 2)), draw(st.integers(0, 2))
    budget = draw(st.integers(pmin * pg + dmin * dg, 40))
    pmax = draw(st.one_of(st.none(), st.integers(pmin, 12)))
    dmax = draw(st.one_of(st.none(), st.integers(dmin, 12)))
    min_budget = draw(st.integers(0, budget))
    c = cfg(budget, pg, dg, pmin, dmin, pmax, dmax, min_budget)
    current = {"prefill": draw(st.integers(0, 12)), "decode": draw(st.integers(0, 12))}
    desired = {"prefill": draw(st.integers(0, 30)), "decode": draw(st.integers(0, 30))}
    return c, current, desired


@settings(max_examples=400, deadline=None)
@given(scenario())
def test_budget_never_exceeded_even_mid_rebalance(sc):
    c, current, desired = sc
    r = apply_limits(desired, current, c)
    g = {"prefill": c.prefill.gpus_per_engine, "decode": c.decode.gpus_per_engine}
    worst = sum(max(current[p], r.targets[p]) * g[p] for p in g)
    if gpus(current, c) <= c.max_gpu_budget:
        assert worst <= c.max_gpu_budget  # whatever order the pools change in
    else:
        assert all(r.targets[p] <= current[p] for p in g)
    assert gpus(r.goal, c) <= c.max_gpu_budget
    for p, lim in (("prefill", c.prefill), ("decode", c.decode)):
        assert r.goal[p] >= lim.min_replicas
        assert lim.max_replicas is None or r.goal[p] <= lim.max_replicas
    # repeated application converges to the goal within two steps when starting inside the budget
    if gpus(current, c) <= c.max_gpu_budget:
        nxt = apply_limits(desired, r.targets, c)
        assert nxt.targets == r.goal


def test_a_scale_up_waits_for_the_gpus_a_draining_worker_still_holds():
    # budget 4: prefill 2 + decode 1 run, one decode worker drains (the connector removed it; its GPU is held until
    # its requests finish). The goal 3 prefill + 1 decode fits the budget, but raising prefill now would hold 5 GPUs
    r = apply_limits({"prefill": 3, "decode": 1}, {"prefill": 2, "decode": 1}, cfg(budget=4), {"decode": 1})
    assert r.targets == {"prefill": 2, "decode": 1} and "rebalance_decrease_first" in r.reasons
    assert r.goal == {"prefill": 3, "decode": 1}
    # once drained, the increase follows
    assert apply_limits({"prefill": 3, "decode": 1}, {"prefill": 2, "decode": 1}, cfg(budget=4)).targets["prefill"] == 3


@settings(max_examples=400, deadline=None)
@given(scenario(), st.integers(0, 6), st.integers(0, 6))
def test_budget_holds_at_every_instant_counting_draining_workers(sc, dp, dd):
    c, current, desired = sc
    drain = {"prefill": dp, "decode": dd}
    r = apply_limits(desired, current, c, drain)
    g = {"prefill": c.prefill.gpus_per_engine, "decode": c.decode.gpus_per_engine}
    held = sum(drain[p] * g[p] for p in g)
    worst = sum(max(current[p], r.targets[p]) * g[p] for p in g) + held
    if gpus(current, c) + held <= c.max_gpu_budget:
        assert worst <= c.max_gpu_budget
    else:
        assert all(r.targets[p] <= current[p] for p in g)
