"""The load loop's agg ITL estimate against the per-request mean ITL the SLA measures, in the simulator.

A fixed fleet of two aggregated engines (load loop on, scaling disabled by min = max = 2) serves a steady
Poisson load; every 5 s tick the planner estimates each busy engine's ITL from its pass-time regression and
the prefill work observed in its relayed passes. The mean of those estimates over the steady middle of the
run must be within 30 % of the mean over requests of each request's own mean inter-token latency."""

from __future__ import annotations

import statistics

import pytest

from mocker.config import EngineConfig
from mocker.traces import load_trace
from planner.core import Planner, PlannerConfig
from planner.core.config import PoolLimits
from planner.sim.loop import SimSettings, simulate
from planner.sim.policies import PlannerPolicy


class _Recording(PlannerPolicy):
    estimates: list[float]

    def tick(self, view):  # type: ignore[no-untyped-def]
        if self._planner is None:
            rec = self.estimates
            base = Planner

            class P(base):  # type: ignore[misc, valid-type]
                def tick(self, now_s, observations):  # type: ignore[no-untyped-def]
                    r = super().tick(now_s, observations)
                    if 60.0 <= now_s <= 240.0:
                        rec.extend(
                            e.estimated_itl_ms
                            for e in r.diagnostics.engines
                            if e.estimated_itl_ms is not None and not e.idle
                        )
                    return r

            self._planner = P(self.config, self.profile, self.warm_start)
            self._start_s = view.now_s
        return super().tick(view)


@pytest.mark.parametrize("rate,isl,osl", [(4, "1000", 200), (8, "3000", 200)])
def test_agg_itl_estimate_tracks_observed_mean_itl(rate, isl, osl):
    reqs = load_trace(f"synthetic:poisson?rate={rate}&duration_s=300&isl={isl}&osl={osl}&seed=3")
    cfg = PlannerConfig(
        mode="agg", throughput_enabled=False, load_enabled=True, agg=PoolLimits(2, 2), itl_ms=1000.0, ttft_ms=10000.0
    )
    pol = _Recording("planner", cfg, None, (), {"agg": 2})
    pol.estimates = []
    run = simulate(reqs, {"agg": EngineConfig()}, pol, SimSettings(startup_delay_s=0.0))
    observed = [
        (r.token_times_ms[-1] - r.token_times_ms[0]) / (len(r.token_times_ms) - 1)
        for r in run.records
        if len(r.token_times_ms) > 1 and 60_000.0 < r.arrival_ms < 240_000.0
    ]
    assert len(pol.estimates) > 30 and len(observed) > 300
    est, obs = statistics.mean(pol.estimates), statistics.mean(observed)
    assert est == pytest.approx(obs, rel=0.30), (est, obs)
