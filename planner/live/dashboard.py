"""The live dashboard page served by the planner at ``/``.

Plotly.js comes from the installed ``plotly`` Python package (``package_data/plotly.min.js``), served at
``/static/plotly.min.js``: the page needs no network. The page polls ``/api/state`` every
``config.poll_ms`` (default 1000 ms) and redraws with ``Plotly.react``:

- ``#replicas``: replicas per pool over time (spec solid, ready dotted);
- ``#load``: observed vs predicted requests/s (throughput loop ticks);
- ``#latency``: observed TTFT and ITL (frontend interval means) and the load loop's estimates, with the
  SLA targets as dashed lines;
- ``#queues``: per-engine queued prefill and decode requests (latest ForwardPassMetrics);
- ``#decisions``: the recent decisions with their reasons; ``#events``: fleet events.

For tests and tools the page sets ``window.dashboardReady = true`` after its first render,
``window.dashboardUpdates`` (render count) and ``window.dashboardState`` (the last state).
"""

from __future__ import annotations

from pathlib import Path


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
<script src="/static/plotly.min.js"></script></head>
<body>
<h1>dynoplan planner</h1><div id="status">loading...</div>
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
function render(st) {
  const cfg = st.config, pools = cfg.pools;
  const rep = [];
  pools.forEach((p, i) => {
    const xs = [], spec = [], ready = [];
    st.samples.forEach(s => { if (s.pools && s.pools[p]) { xs.push(ts(s.t)); spec.push(s.pools[p].spec); ready.push(s.pools[p].ready); } });
    rep.push({x: xs, y: spec, name: p + " replicas", mode: "lines", line: {shape: "hv", color: COLORS[i]}});
    rep.push({x: xs, y: ready, name: p + " ready", mode: "lines", line: {shape: "hv", dash: "dot", color: COLORS[i]}});
  });
  Plotly.react("replicas", rep, layout("Replicas per pool", "replicas", {yaxis: {title: {text: "replicas"}, rangemode: "tozero", dtick: 1}}));
  const tk = st.ticks.filter(t => t.loops.indexOf("throughput") >= 0);
  Plotly.react("load", [
    {x: tk.map(t => ts(t.t)), y: tk.map(t => t.observed_rps), name: "observed req/s", mode: "lines+markers"},
    {x: tk.map(t => ts(t.t)), y: tk.map(t => t.predicted_rps), name: "predicted req/s (next)", mode: "lines+markers", line: {dash: "dash"}}
  ], layout("Observed vs predicted load", "requests/s"));
  const all = st.ticks, x0 = st.samples.length ? ts(st.samples[0].t) : ts(st.now_s), x1 = ts(st.now_s);
  Plotly.react("latency", [
    {x: tk.map(t => ts(t.t)), y: tk.map(t => t.observed_ttft_ms), name: "TTFT (observed)", mode: "lines+markers", line: {color: COLORS[0]}},
    {x: tk.map(t => ts(t.t)), y: tk.map(t => t.observed_itl_ms), name: "ITL (observed)", mode: "lines+markers", line: {color: COLORS[1]}},
    {x: all.map(t => ts(t.t)), y: all.map(t => t.estimated_ttft_ms), name: "TTFT (load estimate)", mode: "markers", marker: {color: COLORS[0], symbol: "x"}},
    {x: all.map(t => ts(t.t)), y: all.map(t => t.estimated_itl_ms), name: "ITL (load estimate)", mode: "markers", marker: {color: COLORS[1], symbol: "x"}},
    {x: [x0, x1], y: [cfg.ttft_ms, cfg.ttft_ms], name: "TTFT target", mode: "lines", line: {dash: "dash", color: COLORS[0]}},
    {x: [x0, x1], y: [cfg.itl_ms, cfg.itl_ms], name: "ITL target", mode: "lines", line: {dash: "dash", color: COLORS[1]}}
  ], layout("TTFT / ITL vs targets", "ms"));
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
  window.dashboardState = st; window.dashboardUpdates += 1; window.dashboardReady = true;
}
async function poll() {
  let delay = 1000;
  try {
    const r = await fetch("/api/state", {cache: "no-store"});
    if (r.ok) { const st = await r.json(); delay = st.config.poll_ms || 1000; render(st); }
  } catch (e) { document.getElementById("status").textContent = "planner unreachable, retrying"; }
  setTimeout(poll, delay);
}
poll();
</script></body></html>
"""
