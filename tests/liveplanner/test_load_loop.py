"""The load-based loop inside ``dynoplan up``, driven only by live ForwardPassMetrics from real workers over
ZMQ (throughput loop off, no Prometheus, no profile).

One worker at ``--speedup-ratio 1`` gets 20 req/s of 2000-token prompts: far more prefill than one engine
runs, so its queued prefill tokens grow and the load loop's TTFT estimate (regression of pass time on the
FPM token counts, docs/planner-core.md) exceeds the 200 ms target. The planner must scale up within a
bounded number of load intervals (1 s each) of the load start, at the latest two intervals after its first
over-target estimate (TTFT or ITL), and every request must still complete.
"""

from __future__ import annotations

import threading

import pytest

from tests.liveplanner.stack import UpStack, stack_file, step_trace

pytestmark = pytest.mark.integration

SLOW_WORKER = ["--speedup-ratio", "1", "--num-gpu-blocks", "8192", "--block-size", "16", "--trace-block-size", "16"]
MAX_INTERVALS_TO_SCALE_UP = 15  # 8 regression samples (warm-up) + a queue to build, at one load tick per second


def test_load_loop_scales_up_on_live_fpm(tmp_path):
    cfg = stack_file(
        tmp_path,
        planner={
            "throughput_enabled": False,
            "load_enabled": True,
            "ttft_ms": 200,
            "itl_ms": 50,
            "adjustment_interval_s": 10,
            "load_adjustment_interval_s": 1,
        },
        profile=None,
        prometheus={"enabled": False},
        fleet={"initial": {"agg": 1}, "worker_args": {"agg": SLOW_WORKER}, "drain_grace_s": 1.0},
    )
    with UpStack(cfg) as up:
        assert up.prometheus_url is None and up.spec() == 1
        t_start = up.state_json()["now_s"]
        result: dict = {}
        trace = tmp_path / "overload.jsonl"
        n = step_trace(trace, [(20.0, 25.0)], isl=2000, osl=20)
        th = threading.Thread(target=lambda: result.update(zip(("rc", "rep", "err"), up.loadgen(trace, timeout_s=300))))
        th.start()
        peak = 1
        while th.is_alive():
            s = up.spec()
            peak = max(peak, s or 0)
            th.join(0.5)
        assert result["rc"] == 0, result["err"][-2000:]
        rep = result["rep"]
        assert rep["failed_requests"] == 0 and rep["completed_requests"] == n == 500, rep.get("errors")
        st = up.state_json()
        assert peak >= 2, st["decisions"]
        ups = [d for d in st["decisions"] if d["reason"] in ("scale_up_ttft", "scale_up_itl")]
        assert ups, st["decisions"]
        first_up_t = min(d["t"] for d in ups)
        load_ticks = [t for t in st["ticks"] if "load" in t["loops"] and t["t"] >= t_start]
        assert not any("throughput" in t["loops"] for t in st["ticks"])
        before = [t for t in load_ticks if t["t"] < first_up_t]
        assert len(before) <= MAX_INTERVALS_TO_SCALE_UP, [(t["reason"], t["estimated_ttft_ms"]) for t in before]
        over = [
            i
            for i, t in enumerate(load_ticks)
            if t["estimated_ttft_ms"] is not None and (t["estimated_ttft_ms"] > 200 or t["estimated_itl_ms"] > 50)
        ]
        assert over, "the estimate never exceeded the target: no overload"
        first_up_i = next(i for i, t in enumerate(load_ticks) if t["t"] == first_up_t)
        assert first_up_i - over[0] <= 2, [(t["reason"], t["estimated_ttft_ms"]) for t in load_ticks[: first_up_i + 1]]
        print(
            f"load loop: {len(before)} load intervals from load start to the first scale-up "
            f"({ups[-1]['reason']}), {first_up_i - over[0]} after the first over-target estimate; peak {peak}"
        )
        # the estimates came from the workers' FPM over ZMQ
        assert st["engines"] and {e["pool"] for e in st["engines"]} == {"agg"}
