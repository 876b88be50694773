"""The live dashboard: one page, one state recorder, two drivers.

Drivers: ``dynoplan up`` / ``dynoplan planner`` (:class:`planner.live.service.PlannerService`, one
planner, page at ``/``) and the Kubernetes operator (:mod:`planner.operator.dashboard`, one planner per
DynoPlanner, page at ``/?planner=<namespace>/<name>``, reached with ``kubectl port-forward``). Both
record with :class:`DashboardHistory` and serve :data:`DASHBOARD_HTML` with :func:`add_routes`; the
state JSON has the same shape in both (:meth:`DashboardHistory.state`).

Plotly.js comes from the installed ``plotly`` Python package (``package_data/plotly.min.js``), served at
``/static/plotly.min.js``: the page needs no network. The page polls ``/api/state`` every
``config.poll_ms`` (default 1000 ms) and redraws with ``Plotly.react``:

- ``#replicas``: replicas per pool over time (spec solid, ready dotted);
- ``#load``: observed requests/s (frontend, last interval) and the predictor's forecast of the next interval, the
  rate the throughput loop sized for, at its ticks;
- ``#latency``: TTFT (top axis) and ITL (bottom axis), each on its own log scale (a 1 ms ITL and its 50 ms
  target both readable): frontend interval means, the load loop's estimates when it runs, and the SLA
  targets as dashed lines; every tick label is a full value in ms (1-2-5 per decade, decades only over more
  than 3 decades), not plotly's bare ``2``/``5`` minor labels;

Every series is named for what it is, and a series without any data is left out (its legend entry too).
The time charts mark events on their time axis (:meth:`DashboardHistory.marks`): scale decisions (dotted
vertical lines, green up / orange down; a label close to the previous one is staggered a level lower), worker deaths (red lines) and metric outages (grey bands over the
throughput ticks whose traffic read was unknown; the lines of those ticks have gaps instead of the last
value drawn through: their observed, forecast and planned values are null).
- ``#queues``: per-engine queued prefill and decode requests (latest ForwardPassMetrics);
- ``#decisions``: the recent decisions with their reasons; ``#events``: fleet events.

The page fetches ``api/state`` with its own query string (so ``?planner=ns/name`` selects the
operator's planner). For tests and tools the page sets ``window.dashboardReady = true`` after its first
render, ``window.dashboardUpdates`` (render count) and ``window.dashboardState`` (the last state).
"""

from __future__ import annotations

import collections
import json
import math
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from aiohttp import web


def _f(x: Any) -> Any:
    """JSON-safe float (NaN/inf -> None)."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


class DashboardHistory:
    """What the page plots, recorded by a driver on its own clock (Unix seconds in the state JSON).

    ``samples``: replicas per pool (spec / ready) over time; ``ticks``: one entry per planner tick (loops
    run, observed and predicted load, observed TTFT/ITL, load-loop estimates); ``decisions``: published
    decisions (newest last, at most 200); ``engines``: per-engine queues of the latest passes.
    """

    def __init__(self, history_points: int = 3600) -> None:
        self.samples: collections.deque[dict[str, Any]] = collections.deque(maxlen=history_points)
        self.ticks: collections.deque[dict[str, Any]] = collections.deque(maxlen=history_points)
        self.decisions: collections.deque[dict[str, Any]] = collections.deque(maxlen=200)
        self.last_pools: dict[str, Any] | None = None
        self.engines: list[dict[str, Any]] = []

    def record_sample(self, t: float, pools: Mapping[str, Any] | None) -> None:
        """Replicas per pool at ``t`` (``PoolState`` values; None = unknown, e.g. the target is missing)."""
        if pools is not None:
            self.last_pools = {p: {"spec": s.replicas, "ready": s.ready_replicas} for p, s in pools.items()}
        self.samples.append({"t": t, "pools": self.last_pools if pools is not None else None})

    def record_tick(self, t: float, result: Any) -> None:
        """One ``TickResult`` at ``t``: the tick series and, when it published targets, the decision."""
        d, diag = result.decision, result.diagnostics
        if d.targets is not None and d.decision_id is not None:
            self.decisions.append(
                {
                    "t": t,
                    "decision_id": d.decision_id,
                    "targets": dict(d.targets),
                    "from": dict(diag.current_replicas or {}),
                    "reason": d.reason.value,
                    "reasons": [r.value for r in d.reasons],
                }
            )
        obs_t = diag.observed
        thpt = "throughput" in diag.loops_run
        unknown = thpt and obs_t is None  # the traffic read failed: the plan is stale, nothing is plotted
        planned = None if unknown else _f(diag.predicted_requests_per_second)
        self.ticks.append(
            {
                "t": t,
                "loops": list(diag.loops_run),
                "reason": d.reason.value,
                "metrics_unknown": unknown,
                "observed_rps": _f(obs_t.requests_per_second) if obs_t is not None else None,
                "observed_ttft_ms": _f(obs_t.mean_ttft_ms) if obs_t is not None else None,
                "observed_itl_ms": _f(obs_t.mean_itl_ms) if obs_t is not None else None,
                "predicted_rps": planned,
                "predictor": getattr(diag, "predictor", None),
                "estimated_ttft_ms": _f(diag.estimated_ttft_ms),
                "estimated_itl_ms": _f(diag.estimated_itl_ms),
                "throughput_replicas": dict(diag.throughput_replicas),
            }
        )

    def record_engines(self, latest: Mapping[tuple[int, int], Any]) -> None:
        """Per-engine queues from the latest ForwardPassMetrics, keyed (worker id, DP rank)."""
        self.engines = [
            {
                "worker_id": wid,
                "dp_rank": rank,
                "pool": p.pool,
                "running_prefill": p.scheduled_requests.num_prefill_requests,
                "running_decode": p.scheduled_requests.num_decode_requests,
                "queued_prefill": p.queued_requests.num_prefill_requests,
                "queued_prefill_tokens": p.queued_requests.sum_prefill_tokens,
                "queued_decode": p.queued_requests.num_decode_requests,
                "wall_time_ms": p.wall_time * 1000.0,
            }
            for (wid, rank), p in sorted(latest.items())
        ]

    def outages(self, now_s: float) -> list[dict[str, Any]]:
        """Metric outages: runs of throughput ticks whose traffic was unknown, as ``{"start_s", "end_s",
        "ongoing"}`` (start: the first unknown tick; end: the next throughput tick with known traffic, or
        ``now_s`` while it lasts)."""
        out: list[dict[str, Any]] = []
        cur: dict[str, Any] | None = None
        for tk in self.ticks:
            if "throughput" not in tk["loops"]:
                continue
            if tk.get("metrics_unknown"):
                if cur is None:
                    cur = {"start_s": tk["t"], "end_s": now_s, "ongoing": True}
                    out.append(cur)
            elif cur is not None:
                cur["end_s"], cur["ongoing"] = tk["t"], False
                cur = None
        return out

    def marks(self, now_s: float, fleet_events: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """Events for the charts' time axis: ``decisions`` ``{"t", "direction": "up"|"down"|"rebalance",
        "label"}``, ``deaths`` ``{"t", "worker", "pool"}`` (fleet events ``died``), ``outages``
        (:meth:`outages`)."""
        decisions = []
        for d in self.decisions:
            before, after = sum(d["from"].values()), sum(d["targets"].values())
            direction = "up" if after > before else "down" if after < before else "rebalance"
            label = ", ".join(f"{p} {d['from'].get(p, '?')}→{n}" for p, n in d["targets"].items())
            decisions.append({"t": d["t"], "direction": direction, "label": label, "reason": d["reason"]})
        deaths = [
            {"t": e["t"], "worker": e.get("worker"), "pool": e.get("pool")}
            for e in (fleet_events or [])
            if e.get("event") == "died"
        ]
        return {"decisions": decisions, "deaths": sorted(deaths, key=lambda e: e["t"]), "outages": self.outages(now_s)}

    def state(
        self, now_s: float, started_s: float, cfg: Any, poll_ms: int, last_result: Any = None, **extra: Any
    ) -> dict[str, Any]:
        """The page's data (JSON-safe): ``cfg`` is the planner's ``PlannerConfig``; ``extra`` adds keys
        (``traffic_error``, ``fleet``, ``fleet_events``, ``title``...)."""
        return {
            "now_s": now_s,
            "started_s": started_s,
            "config": {
                "mode": cfg.mode,
                "pools": list(cfg.pools),
                "ttft_ms": cfg.ttft_ms,
                "itl_ms": cfg.itl_ms,
                "adjustment_interval_s": cfg.adjustment_interval_s,
                "load_adjustment_interval_s": cfg.load_adjustment_interval_s,
                "throughput_enabled": cfg.throughput_enabled,
                "load_enabled": cfg.load_enabled,
                "pending_timeout_s": cfg.pending_timeout_s,
                "poll_ms": poll_ms,
            },
            "marks": self.marks(now_s, extra.get("fleet_events")),
            "pools": self.last_pools,
            "samples": list(self.samples),
            "ticks": list(self.ticks),
            "decisions": list(self.decisions)[::-1],
            "engines": self.engines,
            "last_reason": last_result.decision.reason.value if last_result else None,
            "pending_decision_id": last_result.diagnostics.pending_decision_id if last_result else None,
            **extra,
        }


def add_routes(app: web.Application, state_of: Callable[[web.Request], Awaitable[dict[str, Any] | str]]) -> None:
    """``GET /`` (the page), ``/static/plotly.min.js`` and ``/api/state`` (``state_of(request)``: the state,
    or a string saying why there is none, answered as 404 ``{"error": ...}``)."""

    async def index(request: web.Request) -> web.Response:
        return web.Response(text=DASHBOARD_HTML, content_type="text/html")

    async def plotly(request: web.Request) -> web.FileResponse:
        return web.FileResponse(
            plotly_js_path(), headers={"Content-Type": "application/javascript", "Cache-Control": "max-age=3600"}
        )

    async def state(request: web.Request) -> web.Response:
        st = await state_of(request)
        if isinstance(st, str):
            return web.json_response({"error": st}, status=404)
        return web.json_response(st, dumps=dumps)

    app.router.add_get("/", index)
    app.router.add_get("/static/plotly.min.js", plotly)
    app.router.add_get("/api/state", state)


def dumps(obj: Any) -> str:
    """JSON with NaN/inf as null and paths as strings."""
    return json.dumps(_clean(obj), allow_nan=False, default=_json_default)


def _clean(x: Any) -> Any:
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def _json_default(o: Any) -> Any:
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def plotly_js_path() -> Path:
    """Path of ``plotly.min.js`` inside the installed plotly package. Raises FileNotFoundError."""
    import plotly

    p = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    if not p.exists():
        raise FileNotFoundError(f"{p}: plotly.min.js missing from the plotly package")
    return p


DASHBOARD_HTML = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>dynoplan planner</title>
<link rel="icon" href="data:,">
<style>
body{font-family:system-ui,sans-serif;margin:12px;background:#fafafa;color:#222}
h1{font-size:18px;margin:4px 0} .row{display:flex;flex-wrap:wrap;gap:8px}
.plot{width:calc(50% - 8px);min-width:420px;height:330px;background:#fff;border:1px solid #ddd}
table{border-collapse:collapse;font-size:12px;background:#fff} td,th{border:1px solid #ddd;padding:2px 6px}
#status{font-size:13px;margin:4px 0 8px}
</style>
<script src="static/plotly.min.js"></script></head>
<body>
<h1 id="title">dynoplan planner</h1><div id="status">loading...</div>
<div class="row"><div id="replicas" class="plot"></div><div id="load" class="plot"></div>
<div id="latency" class="plot"></div><div id="queues" class="plot"></div></div>
<h2 style="font-size:15px">Recent decisions</h2>
<table id="decisions"><thead><tr><th>time</th><th>id</th><th>from</th><th>to</th><th>reason</th><th>all reasons</th></tr></thead><tbody></tbody></table>
<h2 style="font-size:15px">Fleet events</h2>
<table id="events"><thead><tr><th>time</th><th>worker</th><th>pool</th><th>event</th></tr></thead><tbody></tbody></table>
<script>
"use strict";
window.dashboardReady = false; window.dashboardUpdates = 0; window.dashboardState = null;
const COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd"];
function ts(t) { return new Date(t * 1000); }
function layout(title, ytitle, extra) {
  return Object.assign({title: {text: title, font: {size: 14}, x: 0.01, xanchor: "left"}, margin: {l: 50, r: 10, t: 30, b: 40},
    xaxis: {type: "date"}, yaxis: {title: {text: ytitle}, rangemode: "tozero"}, legend: {orientation: "h", y: -0.3}}, extra || {});
}
function esc(s) { return String(s).replace(/[&<>]/g, c => ({"&": "&amp;", "<": "&lt;", ">": "&gt;"}[c])); }
function present(traces) {  // a series without any data is not drawn, nor listed in the legend
  return traces.filter(tr => tr.always || tr.y.some(v => v !== null && v !== undefined))
    .map(tr => { const c = Object.assign({}, tr); delete c.always; return c; });
}
const LABEL_GAP = 0.06;  // fraction of the time axis a decision label needs (about 70 px of 1200)
const LABEL_LEVELS = [{y: 1, yanchor: "bottom"}, {y: 1, yanchor: "top"}, {y: 0.86, yanchor: "top"}];
function logTicks(values, unit) {
  // a log axis whose every tick label reads as a full value with its unit ("200 ms", not plotly's bare "2"
  // for 2 x 10^k): data spanning 0.7 decade or more gets 1-2-5 per decade (decades only over more than 3),
  // a narrower span plotly's own ticks, formatted as full values too (tickformat applies to every log tick)
  const v = values.filter(x => x !== null && x !== undefined && x > 0 && isFinite(x));
  const full = {tickformat: ".3~r", ticksuffix: " " + unit};
  if (!v.length) return full;
  const mn = Math.log10(Math.min(...v)), mx = Math.log10(Math.max(...v));
  if (mx - mn < 0.7) return full;
  const lo = Math.floor(mn), hi = Math.ceil(mx), steps = hi - lo > 3 ? [1] : [1, 2, 5], vals = [];
  for (let e = lo; e <= hi; e++) steps.forEach(k => vals.push(k * Math.pow(10, e)));
  return Object.assign(full, {tickmode: "array", tickvals: vals,
                              ticktext: vals.map(x => String(+x.toPrecision(3)) + " " + unit)});
}
function marks(st, withText) {  // events on the time axis: decisions, worker deaths, metric outages
  const m = st.marks || {decisions: [], deaths: [], outages: []}, shapes = [], notes = [];
  m.outages.forEach(o => {
    shapes.push({type: "rect", xref: "x", yref: "paper", x0: ts(o.start_s), x1: ts(o.end_s), y0: 0, y1: 1,
                 fillcolor: "#999", opacity: 0.25, line: {width: 0}, layer: "below", name: "metrics outage"});
    if (withText) notes.push({x: ts(o.start_s), y: 1, xref: "x", yref: "paper", yanchor: "bottom", xanchor: "left", showarrow: false,
                 text: o.ongoing ? "metrics unknown" : "metrics gap", font: {size: 10, color: "#666"}});
  });
  // a label closer than LABEL_GAP of the time span to the previous one goes one level lower (above the plot,
  // then inside its top), so marks seconds apart do not overprint each other's labels
  const t0 = st.samples.length ? st.samples[0].t : st.now_s, near = Math.max(1, st.now_s - t0) * LABEL_GAP;
  let prevT = null, level = 0;
  m.decisions.forEach(d => {
    const c = d.direction === "up" ? "#2ca02c" : d.direction === "down" ? "#ff7f0e" : "#9467bd";
    shapes.push({type: "line", xref: "x", yref: "paper", x0: ts(d.t), x1: ts(d.t), y0: 0, y1: 1, line: {color: c, width: 1, dash: "dot"},
                 name: "decision " + d.label});
    level = prevT !== null && d.t - prevT < near ? (level + 1) % LABEL_LEVELS.length : 0;
    prevT = d.t;
    if (withText) notes.push(Object.assign({x: ts(d.t), xref: "x", yref: "paper", showarrow: false, text: d.label,
                 font: {size: 9, color: c}}, LABEL_LEVELS[level]));
  });
  m.deaths.forEach(e => {
    shapes.push({type: "line", xref: "x", yref: "paper", x0: ts(e.t), x1: ts(e.t), y0: 0, y1: 1, line: {color: "#d62728", width: 2},
                 name: "died " + e.worker});
    if (withText) notes.push({x: ts(e.t), y: 0.92, xref: "x", yref: "paper", showarrow: false, text: "\u2715 " + esc(e.worker) + " died",
                 font: {size: 9, color: "#d62728"}});
  });
  return {shapes: shapes, annotations: notes};
}
function render(st) {
  const cfg = st.config, pools = cfg.pools, mk = marks(st, true);
  const rep = [];
  pools.forEach((p, i) => {
    const xs = [], spec = [], ready = [];
    st.samples.forEach(s => { if (s.pools && s.pools[p]) { xs.push(ts(s.t)); spec.push(s.pools[p].spec); ready.push(s.pools[p].ready); } });
    rep.push({x: xs, y: spec, name: p + " replicas (requested)", mode: "lines", line: {shape: "hv", color: COLORS[i]}});
    rep.push({x: xs, y: ready, name: p + " ready (serving)", mode: "lines", line: {shape: "hv", dash: "dot", color: COLORS[i]}});
  });
  Plotly.react("replicas", rep, layout("Replicas per pool", "replicas",
    Object.assign({yaxis: {title: {text: "replicas"}, rangemode: "tozero", dtick: 1}}, mk)));
  const tk = st.ticks.filter(t => t.loops.indexOf("throughput") >= 0), tx = tk.map(t => ts(t.t));
  const last = tk.filter(t => t.predictor).slice(-1)[0], pred = last ? last.predictor : "predictor";
  Plotly.react("load", present([
    {x: tx, y: tk.map(t => t.observed_rps), name: "observed req/s (frontend, last interval)", mode: "lines+markers"},
    {x: tx, y: tk.map(t => t.predicted_rps), name: "forecast req/s, next interval (" + pred + "): what the throughput loop sized for",
     mode: "lines+markers", line: {dash: "dash"}}
  ]), layout("Load: observed and forecast", "requests/s", mk));
  const all = st.ticks, x0 = st.samples.length ? ts(st.samples[0].t) : ts(st.now_s), x1 = ts(st.now_s);
  const lat = present([
    {x: tx, y: tk.map(t => t.observed_ttft_ms), name: "TTFT observed (frontend interval mean)", mode: "lines+markers", line: {color: COLORS[0]}},
    {x: all.map(t => ts(t.t)), y: all.map(t => t.estimated_ttft_ms), name: "TTFT load-loop estimate", mode: "markers", marker: {color: COLORS[0], symbol: "x"}},
    {x: [x0, x1], y: [cfg.ttft_ms, cfg.ttft_ms], name: "TTFT target", mode: "lines", line: {dash: "dash", color: COLORS[0]}, always: true},
    {x: tx, y: tk.map(t => t.observed_itl_ms), name: "ITL observed (frontend interval mean)", mode: "lines+markers", line: {color: COLORS[1]}, yaxis: "y2"},
    {x: all.map(t => ts(t.t)), y: all.map(t => t.estimated_itl_ms), name: "ITL load-loop estimate", mode: "markers", marker: {color: COLORS[1], symbol: "x"}, yaxis: "y2"},
    {x: [x0, x1], y: [cfg.itl_ms, cfg.itl_ms], name: "ITL target", mode: "lines", line: {dash: "dash", color: COLORS[1]}, yaxis: "y2", always: true}
  ]), onAxis = ax => [].concat(...lat.filter(tr => (tr.yaxis || "y") === ax).map(tr => tr.y));
  Plotly.react("latency", lat, layout("TTFT (top) and ITL (bottom), each on its own log axis", "TTFT ms", Object.assign({
    xaxis: {type: "date", anchor: "y2"},
    yaxis: Object.assign({title: {text: "TTFT ms"}, type: "log", domain: [0.55, 1], anchor: "x"}, logTicks(onAxis("y"), "ms")),
    yaxis2: Object.assign({title: {text: "ITL ms"}, type: "log", domain: [0, 0.42], anchor: "x"}, logTicks(onAxis("y2"), "ms"))},
    marks(st, false))));
  const en = st.engines, names = en.map(e => e.pool + " w" + e.worker_id + "/r" + e.dp_rank);
  Plotly.react("queues", [
    {x: names, y: en.map(e => e.queued_prefill), type: "bar", name: "queued prefill"},
    {x: names, y: en.map(e => e.queued_decode), type: "bar", name: "queued decode"},
    {x: names, y: en.map(e => e.running_decode + e.running_prefill), type: "bar", name: "scheduled"}
  ], {title: {text: "Per-engine queues (latest pass)", font: {size: 14}, x: 0.01, xanchor: "left"}, margin: {l: 50, r: 10, t: 30, b: 60},
      barmode: "group", yaxis: {title: {text: "requests"}, rangemode: "tozero"}, legend: {orientation: "h"}});
  const tb = document.querySelector("#decisions tbody");
  tb.innerHTML = st.decisions.slice(0, 30).map(d => "<tr><td>" + ts(d.t).toLocaleTimeString() + "</td><td>" + d.decision_id +
    "</td><td>" + esc(JSON.stringify(d.from)) + "</td><td>" + esc(JSON.stringify(d.targets)) + "</td><td>" + esc(d.reason) +
    "</td><td>" + esc(d.reasons.join(", ")) + "</td></tr>").join("");
  const ev = document.querySelector("#events tbody");
  ev.innerHTML = (st.fleet_events || []).slice(0, 30).map(e => "<tr><td>" + ts(e.t).toLocaleTimeString() + "</td><td>" +
    esc(e.worker) + "</td><td>" + esc(e.pool) + "</td><td>" + esc(e.event) + "</td></tr>").join("");
  const cur = pools.map(p => st.pools && st.pools[p] ? p + ": " + st.pools[p].spec + " (ready " + st.pools[p].ready + ")" : p + ": unknown").join(", ");
  document.getElementById("status").textContent = "mode " + cfg.mode + " | " + cur + " | last reason: " + (st.last_reason || "-") +
    (st.pending_decision_id ? " | pending decision " + st.pending_decision_id : "") + (st.traffic_error ? " | metrics: " + st.traffic_error : "");
  if (st.title) { document.getElementById("title").textContent = st.title; document.title = st.title; }
  window.dashboardState = st; window.dashboardUpdates += 1; window.dashboardReady = true;
}
async function poll() {
  let delay = 1000;
  try {
    const r = await fetch("api/state" + window.location.search, {cache: "no-store"});
    if (r.ok) { const st = await r.json(); delay = st.config.poll_ms || 1000; render(st); }
    else { document.getElementById("status").textContent = "state: HTTP " + r.status + " " + (await r.text()); }
  } catch (e) { document.getElementById("status").textContent = "planner unreachable, retrying"; }
  setTimeout(poll, delay);
}
poll();
</script></body></html>
"""
