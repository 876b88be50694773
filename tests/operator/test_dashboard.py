"""The operator's driver of the live dashboard (planner/operator/dashboard.py): which planner a request
selects, the 404 messages, and that the page is the one `dynoplan up` serves."""

from __future__ import annotations

import asyncio

from aiohttp.test_utils import TestClient, TestServer

from planner.core import PoolState
from planner.dashboard import DASHBOARD_HTML, DashboardHistory
from planner.operator.dashboard import make_app


class Loop:
    """Stands in for a PlannerLoop: only ``dashboard_state`` is read by the dashboard."""

    def __init__(self, name: str, state: dict | None) -> None:
        self.name, self.state = name, state

    def dashboard_state(self) -> dict | None:
        return self.state


def fetch(loops, path: str) -> tuple[int, object]:
    async def go():
        async with TestClient(TestServer(make_app(loops))) as client:
            r = await client.get(path)
            body = await (r.json() if r.content_type == "application/json" else r.text())
            return r.status, body

    return asyncio.run(go())


def test_one_planner_is_served_without_a_query():
    loops = {("ns", "a"): Loop("a", {"who": "a"})}
    assert fetch(loops, "/api/state") == (200, {"who": "a"})
    assert fetch(loops, "/api/state?planner=ns/a") == (200, {"who": "a"})
    assert fetch(loops, "/api/planners") == (200, {"planners": ["ns/a"]})


def test_two_planners_need_a_query_and_unknown_ones_are_named():
    loops = {("ns", "a"): Loop("a", {"who": "a"}), ("ns", "b"): Loop("b", {"who": "b"})}
    assert fetch(loops, "/api/state?planner=ns/b") == (200, {"who": "b"})
    status, body = fetch(loops, "/api/state")
    assert status == 404 and "2 planners run here" in body["error"] and "ns/a, ns/b" in body["error"]
    status, body = fetch(loops, "/api/state?planner=other/x")
    assert status == 404 and body["error"] == "planner 'other/x' is not running here (running: ns/a, ns/b)"


def test_a_planner_without_a_valid_spec_yet_is_a_404_with_the_reason():
    status, body = fetch({("ns", "a"): Loop("a", None)}, "/api/state")
    assert status == 404 and body["error"] == "planner ns/a has not read its spec yet"


def test_the_page_is_the_live_planners_page_with_relative_urls():
    status, html = fetch({}, "/")
    assert status == 200 and html == DASHBOARD_HTML
    # relative URLs: the page works behind kubectl port-forward and keeps its ?planner= query
    assert 'fetch("api/state" + window.location.search' in html and 'src="static/plotly.min.js"' in html


def test_history_records_replicas_with_unknown_targets_kept_as_gaps():
    h = DashboardHistory(history_points=3)
    h.record_sample(1.0, {"agg": PoolState(1, 1)})
    h.record_sample(2.0, {"agg": PoolState(3, 1)})
    h.record_sample(3.0, None)  # the DGD could not be read: a gap, the last known pools kept for the status line
    h.record_sample(4.0, {"agg": PoolState(2, 2)})
    assert [s["t"] for s in h.samples] == [2.0, 3.0, 4.0]  # history_points bounds the series
    assert [s["pools"] for s in h.samples] == [{"agg": {"spec": 3, "ready": 1}}, None, {"agg": {"spec": 2, "ready": 2}}]
