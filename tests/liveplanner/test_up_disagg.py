"""A disaggregated stack through ``dynoplan up``: prefill and decode pools of real ``mocker serve``
workers, the frontend's prefill -> decode flow, the throughput loop scaling both pools (direct scraping,
no Prometheus).

Profile (hand-computable): prefill 1000 prompt tokens/s/GPU at any ISL; decode 100 output tokens/s/GPU at
full KV usage with ITL 5..20 ms (always under the 50 ms target, so decode is sized at full usage). With
ISL 200 and OSL 20: prefill = ceil(rps x 200 / 1000 / rho) with the M/D/1 cap rho = 2(T-S)/(2(T-S)+S) =
0.97 (S = 26.8 ms prefill at ISL 200, T = 500 ms), decode = ceil(rps x 20 / 100). At 12 req/s: prefill
ceil(2.47) = 3, decode ceil(2.4) = 3; at 1.5 req/s: 1 and 1.

The prefill leg of each request generates exactly one token (``max_tokens: 1``) and the decode leg all 20:
on an idle worker ``generation_tokens = successes x 1`` (prefill) or ``x 20`` (decode), exactly.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from planner.core import profile_from_arrays, save_profile
from tests.liveplanner.stack import FAST_WORKER, UpStack, stack_file, step_trace

pytestmark = pytest.mark.integration


def _worker_counts(url: str) -> dict[str, float] | None:
    try:
        text = requests.get(url + "/metrics", timeout=2).text
    except requests.RequestException:
        return None
    out = {"success": 0.0, "generation_tokens": 0.0}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.endswith("request_success_total"):
                out["success"] += s.value
            elif s.name.endswith(":generation_tokens_total"):
                out["generation_tokens"] += s.value
    return out


POINTS = (
    "(() => Object.fromEntries(['replicas', 'load', 'latency', 'queues'].map(id => [id,"
    " document.getElementById(id).data.map(t => t.y.filter(v => v !== null && !Number.isNaN(v)).length)])))()"
)


def test_up_disaggregated_scales_prefill_and_decode(tmp_path, chromium):
    cfg = stack_file(
        tmp_path,
        planner={
            "mode": "disagg",
            "prefill": {"min_replicas": 1, "max_replicas": 3},
            "decode": {"min_replicas": 1, "max_replicas": 3},
        },
        prometheus={"enabled": False},
        fleet={
            "initial": {"prefill": 1, "decode": 1},
            "drain_grace_s": 1.0,
            "worker_args": {"prefill": FAST_WORKER, "decode": FAST_WORKER},
        },
    )
    save_profile(
        profile_from_arrays(
            {  # decode 100 tok/s/GPU (overwrites the agg profile stack_file wrote)
                "prefill_isl": np.array([50.0, 4000.0]),
                "prefill_ttft_ms": np.array([20.0, 200.0]),
                "prefill_thpt_per_gpu": np.array([1000.0, 1000.0]),
                "decode_kv_usage": np.array([0.0, 1.0]),
                "decode_context_length": np.array([10.0, 10000.0]),
                "decode_itl_ms": np.array([[5.0, 5.0], [20.0, 20.0]]),
                "decode_thpt_per_gpu": np.array([[0.0, 0.0], [100.0, 100.0]]),
                "decode_max_kv_tokens": np.array([100000.0]),
            }
        ),
        tmp_path / "profile.npz",
    )
    trace = tmp_path / "step.jsonl"
    n = step_trace(trace, [(6.0, 24.0), (0.75, 30.0)])  # at compression 2: 12 req/s for 12 s, 1.5 req/s for 15 s
    with UpStack(cfg) as up:
        assert up.prometheus_url is None
        pools = up.state_json()["pools"]
        assert pools == {"prefill": {"spec": 1, "ready": 1}, "decode": {"spec": 1, "ready": 1}}
        result: dict = {}
        th = threading.Thread(
            target=lambda: result.update(zip(("rc", "rep", "err"), up.loadgen(trace, "--time-compression", "2")))
        )
        th.start()
        seen: dict[str, list[int]] = {"prefill": [1], "decode": [1]}
        counts: dict[str, tuple[str, dict[str, float]]] = {}  # worker name -> (pool, last counters read)
        t_end = None
        while True:
            st = up.state_json()
            for p in seen:
                s = st["pools"][p]["spec"]
                if s != seen[p][-1]:
                    seen[p].append(s)
            for w in up.fleet()["workers"]:
                c = _worker_counts(w["url"])
                if c is not None:
                    counts[w["name"]] = (w["pool"], c)
            if not th.is_alive():
                t_end = t_end or time.monotonic()
                if all(seen[p][-1] == 1 for p in seen) or time.monotonic() > t_end + 40:
                    break
            time.sleep(0.3)
        th.join()
        assert result["rc"] == 0, result["err"][-2000:]
        rep = result["rep"]
        assert rep["completed_requests"] == n and rep["failed_requests"] == 0, rep.get("errors")
        assert max(seen["prefill"]) == 3 and max(seen["decode"]) == 3, seen
        up.wait(
            lambda: all(up.state_json()["pools"][p] == {"spec": 1, "ready": 1} for p in seen),
            40,
            f"both pools back to 1 ({seen})",
        )
        st = up.state_json()
        reasons = {r for d in st["decisions"] for r in d["reasons"]}
        assert {"scale_up_throughput", "scale_down_throughput"} <= reasons, st["decisions"]
        assert {tuple(sorted(d["targets"])) for d in st["decisions"]} == {("decode", "prefill")}
        # prefill -> decode through the frontend: both roles served requests; on the workers still running
        # (idle now) one generated token per prefill leg and OSL = 20 tokens per decode leg, exactly
        up.wait(lambda: len(up.fleet()["workers"]) == 2, 60, "the drained workers stopped")
        live = {w["name"]: w for w in up.fleet()["workers"]}
        assert sorted(w["pool"] for w in live.values()) == ["decode", "prefill"]
        for name, w in live.items():
            c = _worker_counts(w["url"])
            assert c is not None and c["success"] > 0, (name, c)
            per = 1 if w["pool"] == "prefill" else 20
            assert c["generation_tokens"] == c["success"] * per, (name, c)
        served = {p: sum(c["success"] for pool, c in counts.values() if pool == p) for p in seen}
        assert 0 < served["prefill"] <= n and 0 < served["decode"] <= n, served
        assert sum(1 for pool, _ in counts.values() if pool == "prefill") >= 3, counts.keys()
        # the dashboard in real headless Chromium: no console error, every plot holds points, it updates live
        page = chromium.open(up.planner_url + "/", wait_for="window.dashboardReady === true")
        try:
            pts = page.evaluate(POINTS)
            names = page.evaluate("document.getElementById('replicas').data.map(t => t.name)")
            assert names == [
                "prefill replicas (requested)",
                "prefill ready (serving)",
                "decode replicas (requested)",
                "decode ready (serving)",
            ], names
            assert all(k > 0 for k in pts["replicas"]), pts
            assert page.evaluate("Math.max(...document.getElementById('replicas').data[0].y)") == 3
            assert page.evaluate("Math.max(...document.getElementById('replicas').data[2].y)") == 3
            assert pts["load"][0] > 0 and pts["latency"][0] > 0, pts  # observed req/s and TTFT
            assert page.evaluate("document.getElementById('queues').data[0].x.length") == 2  # one engine per pool
            assert page.evaluate("document.querySelectorAll('#decisions tbody tr').length") == len(st["decisions"])
            u0 = page.evaluate("window.dashboardUpdates")
            page.wait_for(f"window.dashboardUpdates >= {u0 + 2}", timeout_s=15)
            n0 = pts["replicas"][0]
            page.wait_for(f"document.getElementById('replicas').data[0].x.length > {n0}", timeout_s=15)
            assert page.errors() == []
        finally:
            page.close()
        print(
            f"dashboard: points per plot {pts}; disagg up: spec changes {seen}; "
            f"successes read per pool {served} of {n} requests"
        )
