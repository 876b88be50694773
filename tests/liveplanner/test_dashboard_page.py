"""The dashboard page in headless Chromium on a hand-made state (planner.dashboard.add_routes served by a
real aiohttp server): the latency axes' tick labels read as milliseconds, close decision labels are staggered."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace as NS

from aiohttp import web

from planner.core import PlannerConfig
from planner.dashboard import DashboardHistory, add_routes
from tests.liveplanner.test_dashboard_history import _result

TICKS = "(sel => Array.from(document.querySelectorAll(sel)).map(t => t.textContent))"


def _history(ttft_ms: list[float], itl_ms: float) -> DashboardHistory:
    h = DashboardHistory()
    for i, ttft in enumerate(ttft_ms):
        t = 100.0 + 10.0 * i
        h.record_sample(t, {"agg": NS(replicas=1, ready_replicas=1)})
        r = _result(["throughput"], 4.0)
        r.diagnostics.observed.mean_ttft_ms, r.diagnostics.observed.mean_itl_ms = ttft, itl_ms
        h.record_tick(t, r)
    # two decisions 10 s apart (of a 290 s axis), a third far from them
    for t, tgt, frm, did in ((200.0, 3, 1, 1), (210.0, 4, 3, 2), (350.0, 2, 4, 3)):
        h.record_tick(t, _result(["throughput"], 4.0, targets={"agg": tgt}, from_={"agg": frm}, decision_id=did))
    for tk in h.ticks:
        tk["observed_itl_ms"] = itl_ms
    return h


class _Server:
    def __init__(self, state: dict) -> None:
        self.state, self.url = state, None
        self.ready = threading.Event()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        assert self.ready.wait(30)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)

        async def state_of(request):  # type: ignore[no-untyped-def]
            return self.state

        async def start() -> None:
            app = web.Application()
            add_routes(app, state_of)
            self.runner = web.AppRunner(app)
            await self.runner.setup()
            site = web.TCPSite(self.runner, "127.0.0.1", 0)
            await site.start()
            self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/"
            self.ready.set()

        self.loop.run_until_complete(start())
        self.loop.run_forever()

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)


def test_latency_ticks_read_as_milliseconds_and_close_decision_labels_do_not_overprint(chromium):
    cfg = PlannerConfig(mode="agg", ttft_ms=200.0, itl_ms=20.0)
    # TTFT from 30 ms to 1.5 s (about 1.7 decades): 1-2-5 ticks with units; ITL 15-25 ms around its 20 ms target
    # (a narrow span: plotly's own ticks, as full values)
    h = _history([30.0, 80.0, 200.0, 600.0, 1500.0] * 6, 15.0)
    h.ticks[-1]["observed_itl_ms"] = 25.0
    srv = _Server(h.state(390.0, 100.0, cfg, poll_ms=60000))
    try:
        page = chromium.open(srv.url, wait_for="window.dashboardReady === true")
        try:
            ttft = page.evaluate(f"{TICKS}('#latency .ytick text')")
            itl = page.evaluate(f"{TICKS}('#latency .y2tick text')")
            assert ttft and itl, (ttft, itl)
            assert all(t.endswith(" ms") for t in ttft + itl), (ttft, itl)
            # every tick is a 1-2-5 value within the axis range (plotly leaves out those outside it)
            assert set(ttft) <= {"20 ms", "50 ms", "100 ms", "200 ms", "500 ms", "1000 ms", "2000 ms"}, ttft
            assert {"100 ms", "200 ms", "500 ms", "1000 ms"} <= set(ttft), ttft  # the 200 ms target reads "200 ms"
            vals = [float(t.removesuffix(" ms")) for t in itl]
            # plotly's linear-style ticks of a narrow log range (2 ms apart here), each a full value,
            # the target among them
            assert len(vals) >= 3 and vals == sorted(vals) and min(vals) >= 10 and max(vals) <= 30 and 20.0 in vals, itl
            notes = page.evaluate(
                "document.getElementById('replicas').layout.annotations.map(a => [a.text, a.y, a.yanchor])"
            )
            assert notes == [
                ["agg 1\u21923", 1, "bottom"],
                ["agg 3\u21924", 1, "top"],
                ["agg 4\u21922", 1, "bottom"],
            ], notes
            # and drawn apart: the two close labels' boxes do not overlap
            boxes = page.evaluate(
                "Array.from(document.querySelectorAll('#replicas .annotation')).map(a => "
                "{const r = a.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]})"
            )
            a, b = boxes[0], boxes[1]
            assert a[3] <= b[1] or b[3] <= a[1] or a[2] <= b[0] or b[2] <= a[0], boxes
            assert page.errors() == []
        finally:
            page.close()
    finally:
        srv.close()
