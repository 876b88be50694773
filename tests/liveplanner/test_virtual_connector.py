"""VirtualConnector protocol over real HTTP on loopback: the planner service (in this process, its own
event-loop thread) publishes; :class:`VirtualConnectorClient` waits, reads and completes.

Traffic is the test's input (a scripted source, as the core tests script observations): 6 requests of
ISL 200 per 0.5 s interval = 12 req/s -> 2.4 -> 3 replicas with the test profile (1000 tokens/s/GPU);
1 request per interval = 2 req/s -> 0.4 -> 1 replica.
"""

from __future__ import annotations

import asyncio
import threading

import pytest
import requests

from dynoplan.errors import VirtualConnectorError
from planner.connectors.virtual import VirtualConnector, VirtualConnectorClient
from planner.core import Planner, PlannerConfig, PoolLimits, TrafficWindow, load_profile
from planner.live.service import PlannerService
from tests.infra._proc import wait_until
from tests.liveplanner.stack import write_profile

pytestmark = pytest.mark.integration

TOKEN = "s3cret"


class ScriptedTraffic:
    def __init__(self) -> None:
        self.requests_per_interval = 6.0

    def read(self, window_s: float) -> TrafficWindow:
        n = self.requests_per_interval
        return TrafficWindow(window_s, n, 200.0, 20.0, 10.0, 2.0)


class ServiceThread:
    def __init__(self, svc: PlannerService) -> None:
        self.svc = svc
        self.loop = asyncio.new_event_loop()
        self.port: int | None = None
        started = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(self.loop)
            self.port = self.loop.run_until_complete(svc.start())
            started.set()
            self.loop.run_forever()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        assert started.wait(30)
        self.url = f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.svc.stop(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture
def virtual_planner(tmp_path):
    cfg = PlannerConfig(
        mode="agg",
        adjustment_interval_s=0.5,
        load_adjustment_interval_s=0.25,
        predictor="constant",
        correction_enabled=False,
        agg=PoolLimits(1, 3),
        pending_timeout_s=3.0,
    )
    planner = Planner(cfg, load_profile(write_profile(tmp_path / "p.npz")))
    traffic = ScriptedTraffic()
    conn = VirtualConnector(("agg",), {"agg": 1}, token=TOKEN, state_file=tmp_path / "virtual.json")
    st = ServiceThread(PlannerService(planner, conn, traffic, None, port=0, sample_s=0.1))
    try:
        yield st, traffic, tmp_path
    finally:
        st.stop()


def test_token_required(virtual_planner):
    st, _, _ = virtual_planner
    for token in (None, "wrong"):
        with pytest.raises(VirtualConnectorError) as e:
            VirtualConnectorClient(st.url, token=token).get()
        assert e.value.status == 401
    r = requests.post(st.url + "/v1/virtual/decision/1/complete", timeout=5)
    assert r.status_code == 401 and r.headers["WWW-Authenticate"] == "Bearer"
    # the dashboard and state are not part of the protocol and stay readable
    assert requests.get(st.url + "/api/state", timeout=5).status_code == 200


def test_wait_get_complete_and_timeout(virtual_planner):
    st, traffic, tmp_path = virtual_planner
    c = VirtualConnectorClient(st.url, token=TOKEN)
    d1 = c.wait(after=0, timeout_s=20)
    assert d1 is not None and d1.decision_id == 1 and d1.targets == {"agg": 3}
    assert d1.reason == "scale_up_throughput" and d1.acknowledged_id is None and d1.replicas == {"agg": 1}
    assert c.get().decision_id == 1
    # unacknowledged: no new decision (hold_pending) although traffic keeps asking for 3
    assert c.wait(after=1, timeout_s=1.0) is None
    assert requests.get(st.url + "/api/state", timeout=5).json()["last_reason"] == "hold_pending"
    with pytest.raises(VirtualConnectorError) as e:
        c.complete(2)
    assert e.value.status == 409
    assert c.complete(1) == 1
    with pytest.raises(VirtualConnectorError) as e:
        c.complete(1)
    assert e.value.status == 409
    info = c.get()
    assert info.acknowledged_id == 1 and info.replicas == {"agg": 3}
    # load drops: the next decision scales down
    traffic.requests_per_interval = 1.0
    d2 = c.wait(after=1, timeout_s=20)
    assert d2 is not None and d2.decision_id == 2 and d2.targets == {"agg": 1} and d2.reason == "scale_down_throughput"
    # never completed: after pending_timeout_s (3 s) the planner proceeds with a reason
    d3 = c.wait(after=2, timeout_s=30)
    assert d3 is not None and d3.decision_id == 3 and d3.targets == {"agg": 1}
    st_json = requests.get(st.url + "/api/state", timeout=5).json()
    assert "pending_timeout_replan" in st_json["decisions"][0]["reasons"]
    metrics = requests.get(st.url + "/metrics", timeout=5).text
    assert "dynoplan_planner_pending_timeouts_total 1.0" in metrics
    # bad bodies are refused with the field named
    r = requests.post(
        st.url + "/v1/virtual/decision/3/complete",
        json={"replicas": {"agg": -1}},
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=5,
    )
    assert r.status_code == 400 and "replicas.agg=-1" in r.json()["error"]
    # a change made outside the planner is reported and adopted (not overwritten)
    assert c.report_replicas({"agg": 2}).replicas == {"agg": 2}
    wait_until(
        lambda: any(
            t["reason"] == "adopted_external_change"
            for t in requests.get(st.url + "/api/state", timeout=5).json()["ticks"]
        ),
        10,
        "adopted",
    )
    # decision ids survive a planner restart (state file)
    saved = VirtualConnector(("agg",), {"agg": 1}, state_file=tmp_path / "virtual.json")
    assert saved.info.decision_id >= 3 and saved.to_wire_id(1) == saved.info.decision_id + 1


def test_client_unreachable_planner_is_a_connector_error():
    from tests.infra._proc import free_port

    url = f"http://127.0.0.1:{free_port()}"
    c = VirtualConnectorClient(url, token=TOKEN, timeout_s=1)
    for call in (c.get, lambda: c.wait(after=0, timeout_s=1), lambda: c.complete(1), lambda: c.report_replicas({})):
        with pytest.raises(VirtualConnectorError) as e:
            call()
        assert e.value.status == 0 and str(e.value) == f"VirtualConnector: cannot connect: {url} (ConnectionError)"


def test_wait_rejects_bad_query(virtual_planner):
    st, _, _ = virtual_planner
    r = requests.get(
        st.url + "/v1/virtual/decision/wait",
        params={"after": "x"},
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=5,
    )
    assert r.status_code == 400


def test_openapi_document_matches_the_served_routes():
    from pathlib import Path

    import yaml
    from aiohttp import web

    doc = yaml.safe_load((Path(__file__).resolve().parents[2] / "docs" / "virtual-connector.openapi.yaml").read_text())
    documented = {(m.upper(), path) for path, ops in doc["paths"].items() for m in ops}
    app = web.Application()
    VirtualConnector(("agg",), {"agg": 1}).add_routes(app)
    served = {(r.method, r.resource.canonical) for r in app.router.routes() if r.method != "HEAD"}
    assert served == documented


def test_openapi_document_is_valid_and_real_answers_follow_its_schemas(virtual_planner):
    """The document passes openapi-spec-validator, and every status and body the running planner returns is
    a documented response of that route whose body validates against the documented schema."""
    from pathlib import Path

    import yaml
    from openapi_schema_validator import OAS30Validator
    from openapi_spec_validator import validate

    doc = yaml.safe_load((Path(__file__).resolve().parents[2] / "docs" / "virtual-connector.openapi.yaml").read_text())
    validate(doc)
    st, traffic, _ = virtual_planner
    auth = {"Authorization": f"Bearer {TOKEN}"}

    def check(method: str, route: str, path: str, **kw) -> requests.Response:  # type: ignore[no-untyped-def]
        r = requests.request(method, st.url + path, timeout=40, **kw)
        responses = doc["paths"][route][method.lower()]["responses"]
        assert str(r.status_code) in responses, (method, path, r.status_code, r.text)
        spec = responses[str(r.status_code)]
        if "$ref" in spec:
            spec = doc["components"]["responses"][spec["$ref"].rsplit("/", 1)[1]]
        content = spec.get("content")
        if content is None:
            assert r.content == b"", (method, path, r.status_code)
        else:
            schema = {**content["application/json"]["schema"], "components": doc["components"]}
            OAS30Validator(schema).validate(r.json())
        return r

    assert check("GET", "/v1/virtual/decision", "/v1/virtual/decision").status_code == 401
    assert check("GET", "/v1/virtual/decision", "/v1/virtual/decision", headers=auth).json()["decision_id"] in (None, 1)
    w = "/v1/virtual/decision/wait"
    assert check("GET", w, w + "?after=x", headers=auth).status_code == 400
    assert check("GET", w, w + "?timeout_s=301", headers=auth).status_code == 400
    d = check("GET", w, w + "?after=0&timeout_s=20", headers=auth).json()
    assert d["decision_id"] == 1 and d["targets"] == {"agg": 3}
    assert check("GET", w, w + "?after=1&timeout_s=0.5", headers=auth).status_code == 204
    c = "/v1/virtual/decision/{id}/complete"
    assert check("POST", c, "/v1/virtual/decision/2/complete", headers=auth, json={}).status_code == 409
    assert (
        check("POST", c, "/v1/virtual/decision/1/complete", headers=auth, json={"replicas": {"agg": "x"}}).status_code
        == 400
    )
    assert check("POST", c, "/v1/virtual/decision/1/complete", headers=auth, data="{not json").status_code == 400
    assert check("POST", c, "/v1/virtual/decision/1/complete", headers=auth, json={"replicas": {"agg": 3}}).json() == {
        "acknowledged_id": 1
    }
    assert check("POST", c, "/v1/virtual/decision/1/complete", headers=auth).status_code == 409
    rp = "/v1/virtual/replicas"
    assert check("PUT", rp, rp, headers=auth, json={"replicas": {"decode": 1}}).status_code == 400
    assert check("PUT", rp, rp, headers=auth, json={"replicas": {"agg": 2}}).json()["replicas"] == {"agg": 2}
