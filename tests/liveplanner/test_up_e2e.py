"""End to end: ``dynoplan up`` (frontend, workers, planner, real Prometheus), a load step up then down
from ``dynoplan loadgen`` at time compression 2, the dashboard open in real headless Chromium.

Expected from the hand-computable profile (tests/liveplanner/stack.py): 12 req/s x 200 tokens / 1000
tokens/s/GPU = 2.4 -> 3 replicas (= max_replicas); 1.5 req/s -> 0.3 -> 1 replica (hysteresis 10%:
ceil(0.33) = 1 < 3, so the scale-down is not held).
"""

from __future__ import annotations

import threading
import time

import pytest
import requests

from tests.liveplanner.stack import UpStack, stack_file, step_trace

pytestmark = pytest.mark.integration

LAST_Y = (
    "(() => { const d = document.getElementById('replicas').data;"
    " if (!d || !d.length || !d[0].y.length) return null; return d[0].y[d[0].y.length - 1]; })()"
)
MAX_Y = "(() => Math.max(...document.getElementById('replicas').data[0].y))()"
HAS_DATA = (
    "window.dashboardReady === true && window.dashboardState.samples.some(s => s.pools) && "
    "document.getElementById('status').textContent !== 'loading...'"
)
"""The page has rendered real data (not its 'loading...' placeholder)."""
TRACES = (
    "(id => document.getElementById(id).data.map(t => [t.name, t.yaxis || 'y', t.y.filter(v => v !== null).length]))"
)
SHAPES = "(id => document.getElementById(id).layout.shapes.map(s => [s.name, s.line ? s.line.color : null]))"


def test_up_scales_up_then_down_through_local_connector(tmp_path, chromium):
    cfg = stack_file(tmp_path)
    # trace time: 6 req/s for 24 s then 0.75 req/s for 30 s; at compression 2: 12 req/s for 12 s, 1.5 req/s for 15 s
    trace = tmp_path / "step.jsonl"
    n = step_trace(trace, [(6.0, 24.0), (0.75, 30.0)])
    with UpStack(cfg) as up:
        assert up.prometheus_url, "prometheus is installed: up must start it"
        assert up.spec() == 1
        page = chromium.open(up.planner_url + "/", wait_for=HAS_DATA)
        try:
            assert page.evaluate(LAST_Y) == 1
            result: dict = {}
            th = threading.Thread(
                target=lambda: result.update(zip(("rc", "rep", "err"), up.loadgen(trace, "--time-compression", "2")))
            )
            th.start()
            seen = [1]
            change_checked = False
            while th.is_alive() or seen[-1] != 1:
                s = up.spec()
                if s is not None and s != seen[-1]:
                    seen.append(s)
                    if not change_checked:  # the first replica change reaches the chart within a few seconds
                        page.wait_for(f"{LAST_Y} === {s}", timeout_s=5)
                        change_checked = True
                assert len(seen) < 20, seen
                if not th.is_alive() and time.monotonic() > result.setdefault("t_end", time.monotonic()) + 40:
                    break
                time.sleep(0.2)
            th.join()
            assert result["rc"] == 0, (result.get("rep", {}).get("errors"), result["err"][-2000:])
            rep = result["rep"]
            assert rep["completed_requests"] == n and rep["failed_requests"] == 0, rep.get("errors")
            assert max(seen) == 3 and seen[-1] == 1, seen
            st = up.state_json()
            reasons = [d["reason"] for d in st["decisions"]][::-1]
            assert "scale_up_throughput" in reasons and "scale_down_throughput" in reasons, st["decisions"]
            assert reasons.index("scale_up_throughput") < len(reasons) - 1 - reasons[::-1].index(
                "scale_down_throughput"
            )
            assert st["pools"]["agg"] == {"spec": 1, "ready": 1}
            # FPM reached the planner over ZMQ: per-engine state of the serving worker. The engines view is
            # refreshed at the planner's ticks, so the removed worker's engine may still be listed for up to one
            # tick after spec/ready read 1 (it is dropped from the feed when it drains, stale after 5 s at most)
            deadline = time.monotonic() + 10.0
            while [e["pool"] for e in st["engines"]] != ["agg"] and time.monotonic() < deadline:
                time.sleep(0.5)
                st = up.state_json()
            assert [e["pool"] for e in st["engines"]] == ["agg"]
            assert page.evaluate("document.getElementById('queues').data[0].x.length") >= 1
            # Prometheus and the dashboard show the same replica counts (now and the peak)
            page.wait_for(f"{LAST_Y} === 1", timeout_s=5)
            prom = up.prometheus_url

            def q(expr: str) -> float | None:
                r = requests.get(prom + "/api/v1/query", params={"query": expr}, timeout=5).json()["data"]["result"]
                return float(r[0]["value"][1]) if r else None

            sel = '{pool="agg",kind="spec"}'
            up.wait(lambda: q(f"dynoplan_planner_replicas{sel}") == 1, 10, "prometheus sees 1 replica")
            assert q(f"dynoplan_planner_replicas{sel}") == page.evaluate(LAST_Y) == 1
            assert q(f"max_over_time(dynoplan_planner_replicas{sel}[10m])") == page.evaluate(MAX_Y) == 3
            up.wait(lambda: q("dynamo_planner_num_decode_replicas") == 1, 10, "core gauge after the next tick")
            assert q("max_over_time(dynamo_planner_num_decode_replicas[10m])") == 3
            # the frontend served every request; the workers that were drained are gone
            up.wait(lambda: q("sum(dynamo_frontend_requests_started_total)") == n, 10, "last requests scraped")
            assert len([w for w in up.fleet()["workers"]]) == 1
            # --- what a newcomer reads: every series named for what it is, none empty, TTFT and ITL apart,
            # the decisions marked on the time axis
            page.wait_for(f"window.dashboardState.decisions.length === {len(st['decisions'])}", timeout_s=10)
            load = page.evaluate(f"{TRACES}('load')")
            assert [n for n, _, _ in load] == [
                "observed req/s (frontend, last interval)",
                "forecast req/s, next interval (constant): what the throughput loop sized for",
            ], load
            assert all(k > 0 for _, _, k in load), load
            lat = page.evaluate(f"{TRACES}('latency')")
            # the load loop is off: its estimates have no data and are not listed
            assert [(n, ax) for n, ax, _ in lat] == [
                ("TTFT observed (frontend interval mean)", "y"),
                ("TTFT target", "y"),
                ("ITL observed (frontend interval mean)", "y2"),
                ("ITL target", "y2"),
            ], lat
            assert all(k > 0 for _, _, k in lat), lat
            doms = page.evaluate("(l => [l.yaxis.domain, l.yaxis2.domain])(document.getElementById('latency').layout)")
            assert doms[1][1] < doms[0][0], doms  # ITL's axis lies below TTFT's, with its own scale
            marks = [m for m in page.evaluate(f"{SHAPES}('replicas')") if m[0] and m[0].startswith("decision ")]
            ups = [d for d in st["decisions"] if sum(d["targets"].values()) > sum(d["from"].values())]
            downs = [d for d in st["decisions"] if sum(d["targets"].values()) < sum(d["from"].values())]
            assert len(marks) == len(st["decisions"]) and ups and downs, (marks, st["decisions"])
            assert sorted(c for _, c in marks) == sorted(["#2ca02c"] * len(ups) + ["#ff7f0e"] * len(downs))
            notes = page.evaluate("document.getElementById('replicas').layout.annotations.map(a => a.text)")
            assert "agg 1\u21923" in notes or "agg 1\u21922" in notes, notes
            print(
                f"\ndashboard: load series {[n for n, _, _ in load]}, latency series {[(n, ax) for n, ax, _ in lat]}, "
                f"{len(ups)} scale-up and {len(downs)} scale-down marks"
            )
            print(f"dashboard screenshot: {page.screenshot(tmp_path / 'dashboard.png')}")
            assert page.errors() == []
        finally:
            page.close()
