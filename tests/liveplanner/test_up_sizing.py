"""``dynoplan up`` sizes by simulation: the live planner reads the frontend's inter-arrival histogram and
in-flight gauge through Prometheus, and replays samples built from them through fleets of the workers' own
engine.

The stack starts with 2 workers under 12 req/s of ISL 200 / OSL 20. The closed-form sizing of the test
profile (tests/liveplanner/stack.py) asks for ceil(12 x 200 / 1000) = 3 replicas; the simulation of the
workers' engine (``FAST_WORKER``: vLLM polynomial timing at speedup 20) shows one worker meeting the SLA,
so the planner scales *down* to 1 and holds 1 at a measured 12 req/s (test_up_e2e: the closed-form sizing
scales the same stack to 3 under the same load). A look of the sequential verdict replays at least
``sample_size(1 - 0.995)`` = 1083 requests at the forecast rate (planner.core.sizing: 90 s at 12 req/s, not the
3 s window's 36 requests), at most the last look's 8 x as many.
"""

from __future__ import annotations

import math
import threading

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from planner.core.sizing import sequential_looks
from tests.liveplanner.stack import UpStack, stack_file, step_trace

pytestmark = pytest.mark.integration


def _planner_metrics(url: str) -> dict[str, float]:
    text = requests.get(url + "/metrics", timeout=5).text
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}


def test_up_sizes_by_simulation_from_the_frontends_histograms(tmp_path):
    cfg = stack_file(
        tmp_path,
        planner={"simulated_sizing": True, "agg": {"min_replicas": 1, "max_replicas": 3}},
        fleet={
            "initial": {"agg": 2},
            "worker_args": {
                "agg": [
                    "--speedup-ratio",
                    "20",
                    "--num-gpu-blocks",
                    "2048",
                    "--block-size",
                    "16",
                    "--trace-block-size",
                    "16",
                ]
            },
            "drain_grace_s": 1.0,
        },
    )
    trace = tmp_path / "steady.jsonl"
    n = step_trace(trace, [(12.0, 40.0)])
    with UpStack(cfg) as up:
        assert up.prometheus_url, "prometheus is installed: up must start it"
        m0 = _planner_metrics(up.planner_url)
        assert m0["dynoplan_planner_sizing_by_simulation"] == 1.0
        assert up.spec() == 2
        result: dict = {}
        th = threading.Thread(target=lambda: result.update(zip(("rc", "rep", "err"), up.loadgen(trace))))
        th.start()
        try:
            seen: dict[str, float] = {}

            def read_under_load() -> bool:
                m = _planner_metrics(up.planner_url)
                # a throughput window inside the load (its gap histogram holds about 12/s x 3 s gaps) that was sized
                # by simulation (the counter of the decision's evaluations is exported after the tick that read it)
                if (
                    m.get("dynoplan_planner_observed_interarrival_gaps", 0.0) > 12
                    and m.get("dynoplan_planner_sizing_evaluations_total", 0.0) >= 1
                    and not seen
                ):
                    seen.update(m)
                return bool(seen) and up.spec() == 1

            up.wait(read_under_load, 35, "a window with arrival gaps, then the scale-down to 1 under load")
            st = up.state_json()
            down = [d for d in st["decisions"] if d["targets"] == {"agg": 1}]
            assert down and down[-1]["from"] == {"agg": 2} and "scale_down_throughput" in down[-1]["reasons"], st[
                "decisions"
            ]
            t_down = down[-1]["t"]

            def loaded_ticks_after_down() -> list[dict]:
                ticks = up.state_json()["ticks"]
                return [
                    t
                    for t in ticks
                    if "throughput" in t["loops"] and t["t"] > t_down and (t["observed_rps"] or 0.0) > 10.0
                ]

            # two throughput decisions at a measured load at which the closed-form sizing asks for 3 replicas
            up.wait(
                lambda: len(loaded_ticks_after_down()) >= 2, 20, "throughput ticks at > 10 req/s after the scale-down"
            )
            assert th.is_alive(), "the load still runs"
            assert up.spec() == 1
        finally:
            th.join()
        assert result["rc"] == 0, result["err"][-2000:]
        assert result["rep"]["completed_requests"] == n and result["rep"]["failed_requests"] == 0
        st = up.state_json()
        # one worker served the rest of the load: no decision above 1 after the scale-down
        assert up.spec() == 1 and all(d["targets"]["agg"] == 1 for d in st["decisions"] if d["t"] >= t_down)
        # the window the planner read: gaps and the in-flight gauge (a count, not NaN: the frontend exports it)
        assert math.isfinite(seen["dynoplan_planner_observed_inflight_requests"])
        assert seen["dynoplan_planner_observed_inflight_requests"] >= 0
        # its sizing ran by simulation: fleets simulated, each on one look of the sequential verdict (at least
        # sample_size counted requests, at most the last look's, plus the in-flight start state)
        evals = seen["dynoplan_planner_sizing_evaluations_total"]
        assert evals >= 1
        per_fleet = seen["dynoplan_planner_sizing_replayed_requests_total"] / evals
        looks = sequential_looks(1 - 0.995)
        assert 0.9 * looks[0] <= per_fleet <= 1.2 * looks[-1], per_fleet
        m1 = _planner_metrics(up.planner_url)
        assert m1["dynoplan_planner_sizing_evaluations_total"] > evals  # and the later decisions simulated too

        # the frontend's histogram in Prometheus: one gap per request after the first, every one scraped
        def gaps_scraped() -> float | None:
            r = requests.get(
                up.prometheus_url + "/api/v1/query",
                timeout=5,
                params={"query": "sum(dynoplan_frontend_request_interarrival_seconds_count)"},
            ).json()["data"]["result"]
            return float(r[0]["value"][1]) if r else None

        up.wait(lambda: gaps_scraped() == n - 1, 10, "every gap scraped")
