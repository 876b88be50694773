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


def test_up_disaggregated_scales_prefill_and_decode(tmp_path):
    cfg = stack_file(tmp_path, planner={"mode": "disagg", "prefill": {"min_replicas": 1, "max_replicas": 3},
                                        "decode": {"min_replicas": 1, "max_replicas": 3}},
                     prometheus={"enabled": False},
                     fleet={"initial": {"prefill": 1, "decode": 1}, "drain_grace_s": 1.0,
                            "worker_args": {"prefill": FAST_WORKER, "decode": FAST_WORKER}})
    save_profile(profile_from_arrays({  # decode 100 tok/s/GPU (overwrites the agg profile stack_file wrote)
        "prefill_isl": np.array([50.0, 4000.0]), "prefill_ttft_ms": np.array([20.0, 200.0]),
        "prefill_thpt_per_gpu": np.array([1000.0, 1000.0]),
        "decode_kv_usage": np.array([0.0, 1.0]), "decode_context_length": np.array([10.0, 10000.0]),
        "decode_itl_ms": np.array([[5.0, 5.0], [20.0, 20.0]]),
        "decode_thpt_per_gpu": np.array([[0.0, 0.0], [100.0, 100.0]]),
        "decode_max_kv_tokens": np.array([100000.0])}), tmp_path / "profile.npz")
    trace = tmp_path / "step.jsonl"
    n = step_trace(trace, [(6.0, 24.0), (0.75, 30.0)])  # at compression 2: 12 req/s for 12 s, 1.5 req/s for 15 s
    with UpStack(cfg) as up:
        assert up.prometheus_url is None
        pools = up.state_json()["pools"]
        assert pools == {"prefill": {"spec": 1, "ready": 1}, "decode": {"spec": 1, "ready": 1}}
        result: dict = {}
        th = threading.Thread(target=lambda: result.update(zip(("rc", "rep", "err"), up.loadgen(
            trace, "--time-compression", "2"))))
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
        up.wait(lambda: all(up.state_json()["pools"][p] == {"spec": 1, "ready": 1} for p in seen), 40,
                f"both pools back to 1 ({seen})")
        st = up.state_json()
        reasons = {r for d in st["decisions"] for r in d["reasons"]}
        assert {"scale_up_throughput", "scale_down_throughput"} <= reasons, st["decisions"]
        assert {tuple(sorted(d["targets"])) for d in st["decisions"]} == {("decode", "prefill")}
        # prefill -> decode through the frontend: both roles served requests; on the workers still running
        # (idle now) one generated token per prefill leg and OSL = 20 tokens per decode leg, exactly
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
        print(f"disagg up: spec changes {seen}; successes read per pool {served} of {n} requests")
