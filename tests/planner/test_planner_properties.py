"""Planner-level property: whatever the demand and however the connector applies decisions (all pools,
some pools, late, or not at all), no published decision can push the fleet over the GPU budget."""

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from planner.core.budget import gpus
from planner.core.config import PlannerConfig, PoolLimits
from planner.core.observations import Observations, PoolState
from planner.core.planner import Planner
from tests.planner.helpers import profile, traffic

step = st.tuples(
    st.one_of(st.none(), st.integers(0, 20000)),  # requests in the interval; None = read failed
    st.sampled_from(["all", "prefill", "decode", "none", "ready_later"]),  # how the connector applies it
)


@settings(max_examples=60, deadline=None)
@given(
    pg=st.integers(1, 3),
    dg=st.integers(1, 3),
    extra=st.integers(0, 12),
    steps=st.lists(step, min_size=3, max_size=25),
    p0=st.integers(1, 3),
    d0=st.integers(1, 3),
)
def test_no_decision_ever_exceeds_the_budget(pg, dg, extra, steps, p0, d0):
    budget = pg + dg + extra
    cfg = PlannerConfig(
        predictor="constant",
        itl_ms=30.0,
        correction_enabled=False,
        max_gpu_budget=budget,
        prefill=PoolLimits(1, None, pg),
        decode=PoolLimits(1, None, dg),
        pending_timeout_s=360.0,
    )
    spec = {"prefill": p0, "decode": d0}
    while gpus(spec, cfg) > budget:
        spec = {p: max(1, n - 1) for p, n in spec.items()}
    ready = dict(spec)
    pl = Planner(cfg, profile())
    pl.tick(0.0, Observations({p: PoolState(spec[p], ready[p]) for p in spec}))
    for k, (n, how) in enumerate(steps, start=1):
        obs = Observations({p: PoolState(spec[p], ready[p]) for p in spec}, None if n is None else traffic(n))
        r = pl.tick(180.0 * k, obs)
        assert r.next_tick_s > 180.0 * k and math.isfinite(r.next_tick_s)
        t = r.decision.targets
        if t is None:
            continue
        assert r.decision.reason is not None and r.decision.decision_id is not None
        worst = sum(max(spec[p], t[p]) * cfg.limits(p).gpus_per_engine for p in spec)
        assert worst <= budget, (spec, t)
        if how == "all":
            spec, ready = dict(t), dict(t)
        elif how in ("prefill", "decode"):
            spec[how] = ready[how] = t[how]
        elif how == "ready_later":
            spec = dict(t)
            ready = {p: min(spec[p], ready[p]) for p in spec}
        assert gpus(spec, cfg) <= budget
