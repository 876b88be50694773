"""Reports of closed-loop runs: per-policy summary, rich table, ``summary.json``, ``timeline.csv``,
per-request JSONL and a self-contained ``report.html`` (plotly.js inlined, no network).

Definitions (docs/architecture.md "Reports"):

- SLA attainment: share of *all* requests (unfinished ones count as misses) whose TTFT <= the TTFT target
  and whose own mean ITL ``(finish - first token) / (output tokens - 1)`` <= the ITL target (single-token
  requests pass the ITL check) — the reference replay's goodput rule; ``ttft_attainment`` and
  ``itl_attainment`` apply one check each.
- goodput: requests meeting the SLA per second of the run.
- GPU-hours: every worker from the moment it is requested until it is released (start-up and drain
  included), times its GPUs.
- mean replicas per pool: requested-worker time / run duration; max replicas: most workers requested
  at once; scale events: applied decisions that changed a pool's target.
"""

from __future__ import annotations

import csv
import html
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dynoplan.outputs import write_together
from mocker.records import RequestRecord
from planner.sim.loop import SimRun


def sla_flags(
    records: Sequence[RequestRecord], ttft_ms: float, itl_ms: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(both, ttft_ok, itl_ok) boolean arrays, one entry per record (see module docstring)."""
    n = len(records)
    ttft = np.full(n, np.inf)
    itl = np.full(n, np.inf)
    for k, r in enumerate(records):
        if r.status != "finished" or r.first_token_ms is None or r.finish_ms is None:
            continue
        ttft[k] = r.first_token_ms - r.arrival_ms
        itl[k] = (r.finish_ms - r.first_token_ms) / (r.output_length - 1) if r.output_length > 1 else 0.0
    t_ok = ttft <= ttft_ms
    i_ok = itl <= itl_ms
    return t_ok & i_ok, t_ok, i_ok


def _pct(x: np.ndarray, q: float) -> float:
    x = x[np.isfinite(x)]
    return float(np.percentile(x, q)) if x.size else math.nan


def _max_concurrent(spans: Sequence[tuple[str, int, float, float, float | None]], pool: str, end_ms: float) -> int:
    ev = []
    for p, _, a, _, b in spans:
        if p == pool:
            end = b if b is not None else end_ms
            ev.append((a, 1, 1))
            # at one instant: releases first, then requests, then the release of a worker that existed only
            # at that instant (a zero-length run, e.g. its only request failed on arrival) so it is counted
            ev.append((end, 2 if end <= a else 0, -1))
    ev.sort(key=lambda e: (e[0], e[1]))
    cur = best = 0
    for _, _, d in ev:
        cur += d
        best = max(best, cur)
    return best


def summarize(run: SimRun) -> dict[str, Any]:
    """The per-policy summary (keys of the issue's ``summary.json`` schema first, then extras)."""
    s = run.settings
    ok, t_ok, i_ok = sla_flags(run.records, s.sla_ttft_ms, s.sla_itl_ms)
    n = max(1, len(run.records))
    ttft = np.array([r.ttft_ms if r.ttft_ms is not None else np.nan for r in run.records], dtype=float)
    itl = np.array(
        [
            (r.finish_ms - r.first_token_ms) / (r.output_length - 1)
            if r.finish_ms is not None and r.first_token_ms is not None and r.output_length > 1
            else np.nan
            for r in run.records
        ],
        dtype=float,
    )
    end_ms = run.duration_s * 1000.0
    gpu_h = sum(run.gpu_seconds.values()) / 3600.0
    dur = max(run.duration_s, 1e-9)
    mean_rep = {}
    for p in run.pools:
        if run.duration_s > 0:
            t = sum(((b if b is not None else end_ms) - a) for q, _, a, _, b in run.worker_spans if q == p) / 1000.0
            mean_rep[p] = round(t / dur, 6)
        else:  # a zero-length run: the fleet that existed at its only instant
            mean_rep[p] = float(_max_concurrent(run.worker_spans, p, end_ms))
    return {
        "sla_attainment": round(float(ok.sum()) / n, 6),
        "ttft_attainment": round(float(t_ok.sum()) / n, 6),
        "itl_attainment": round(float(i_ok.sum()) / n, 6),
        "gpu_hours": round(gpu_h, 6),
        "p99_ttft_ms": round(_pct(ttft, 99), 4),
        "p99_itl_ms": round(_pct(itl, 99), 4),
        "mean_replicas": mean_rep,
        "max_replicas": {p: _max_concurrent(run.worker_spans, p, end_ms) for p in run.pools},
        "scale_events": len(run.decisions),
        "p50_ttft_ms": round(_pct(ttft, 50), 4),
        "p50_itl_ms": round(_pct(itl, 50), 4),
        "goodput_rps": round(float(ok.sum()) / dur, 6),
        "num_requests": len(run.records),
        "num_finished": sum(1 for r in run.records if r.status == "finished"),
        "duration_s": round(run.duration_s, 6),
        "gpu_hours_by_pool": {p: round(run.gpu_seconds.get(p, 0.0) / 3600.0, 6) for p in run.pools},
    }


def _clean(x: Any) -> Any:
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


SUMMARY_KEYS: tuple[str, ...] = (
    "sla_attainment",
    "ttft_attainment",
    "itl_attainment",
    "gpu_hours",
    "p99_ttft_ms",
    "p99_itl_ms",
    "mean_replicas",
    "max_replicas",
    "scale_events",
)
"""Per-policy keys of ``summary.json`` — exactly the issue's schema, in its order."""


def summary_document(runs: Sequence[SimRun]) -> dict[str, Any]:
    """Every policy's full summary: ``{"policies": {name: summarize(run)}}``."""
    return _clean({"policies": {r.policy: summarize(r) for r in runs}})


def schema_summary(doc: Mapping[str, Any]) -> dict[str, Any]:
    """``doc`` cut to the issue's ``summary.json`` schema (:data:`SUMMARY_KEYS` per policy)."""
    return {"policies": {n: {k: s[k] for k in SUMMARY_KEYS} for n, s in doc["policies"].items()}}


def render_table(doc: Mapping[str, Any], title: str = "dynoplan simulate") -> Any:
    """A rich Table of the summary document (one row per policy)."""
    from rich.table import Table

    t = Table(title=title)
    for col in (
        "policy",
        "SLA att.",
        "TTFT att.",
        "ITL att.",
        "goodput rps",
        "p50/p99 TTFT ms",
        "p50/p99 ITL ms",
        "GPU-h",
        "mean replicas",
        "max replicas",
        "scale events",
    ):
        # never cut a cell (a variant's name "planner:prefill_ttft_…", a figure): fold it over lines
        t.add_column(
            col,
            justify="left" if col == "policy" else "right",
            overflow="fold",
            min_width=min(24, max((len(n) for n in doc["policies"]), default=6)) if col == "policy" else None,
        )

    def f(x: Any, d: int = 1) -> str:
        return "-" if x is None else f"{x:.{d}f}"

    for name, s in doc["policies"].items():
        t.add_row(
            name,
            f"{100 * s['sla_attainment']:.2f}%",
            f"{100 * s['ttft_attainment']:.2f}%",
            f"{100 * s['itl_attainment']:.2f}%",
            f(s["goodput_rps"], 2),
            f"{f(s['p50_ttft_ms'])} / {f(s['p99_ttft_ms'])}",
            f"{f(s['p50_itl_ms'], 2)} / {f(s['p99_itl_ms'], 2)}",
            f"{s['gpu_hours']:.3f}",
            " ".join(f"{p}={v:.2f}" for p, v in s["mean_replicas"].items()),
            " ".join(f"{p}={v}" for p, v in s["max_replicas"].items()),
            str(s["scale_events"]),
        )
    return t


def write_outputs(runs: Sequence[SimRun], out_dir: str | Path, meta: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Write into ``out_dir`` (created): ``summary.json`` (the issue's schema), ``details.json`` (every
    summary column, the run's settings ``meta`` and each policy's applied decisions), ``timeline.csv``,
    ``requests.jsonl`` (one line per request and policy, a ``policy`` field; token times left out to keep
    it small) and ``report.html``. All or none (:func:`dynoplan.outputs.write_together`): each is written to a
    hidden ``.NAME.partial`` beside it, and the five are renamed into place only once all are written, so a failed
    write leaves an earlier run's outputs whole (never half of two runs). Returns the full summary document.
    Raises OSError; its ``filename`` is the output being written (also when the failing call was a write, which
    names none: a full disk)."""
    from mocker.report import per_request_row

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    doc = summary_document(runs)

    def summary(p: Path) -> None:
        p.write_text(json.dumps(schema_summary(doc), indent=2) + "\n")

    def details(p: Path) -> None:
        full = {**doc, "run": dict(meta or {}), "decisions": {r.policy: r.decisions for r in runs}}
        p.write_text(json.dumps(_clean(full), indent=2) + "\n")

    def timeline(p: Path) -> None:
        cols: list[str] = ["policy"]
        for r in runs:
            for row in r.timeline:
                for k in row:
                    if k not in cols:
                        cols.append(k)
        with p.open("w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=cols, restval="", lineterminator="\n")
            w.writeheader()
            for r in runs:
                for row in r.timeline:
                    w.writerow({"policy": r.policy, **{k: _csv(v) for k, v in row.items()}})

    def requests(p: Path) -> None:
        with p.open("w") as fh:
            for r in runs:
                for rec in r.records:
                    row = per_request_row(rec)
                    row.pop("token_times_ms", None)
                    fh.write(json.dumps({"policy": r.policy, **_clean(row)}, separators=(",", ":")) + "\n")

    def html_report(p: Path) -> None:
        p.write_text(render_html(runs, doc))

    write_together(
        [
            (out / "summary.json", summary),
            (out / "details.json", details),
            (out / "timeline.csv", timeline),
            (out / "requests.jsonl", requests),
            (out / "report.html", html_report),
        ]
    )
    return doc


def _csv(v: Any) -> Any:
    if isinstance(v, float):
        return "" if not math.isfinite(v) else repr(round(v, 6))
    return v


# ---------------------------------------------------------------------------------------------- HTML
PLOTS: tuple[tuple[str, str], ...] = (
    ("plot-replicas", "Replicas per pool (requested) and request rate"),
    ("plot-rate", "Observed vs predicted request rate (req/s)"),
    ("plot-ttft", "Observed mean TTFT per sample interval vs target (ms)"),
    ("plot-itl", "Observed mean ITL per sample interval vs target (ms)"),
    ("plot-queue", "Waiting requests (engines + fleet queue)"),
    ("plot-kv", "Mean KV-cache usage of ready engines"),
)


def _series(run: SimRun, key: str) -> list[Any]:
    return [_clean(row.get(key)) for row in run.timeline]


def figure_data(runs: Sequence[SimRun]) -> dict[str, Any]:
    """Plotly traces and layouts per plot id (one trace per policy and series; x = timeline seconds)."""
    s0 = runs[0].settings if runs else None
    figs: dict[str, Any] = {
        pid: {
            "data": [],
            "layout": {
                "title": {"text": title},
                "xaxis": {"title": {"text": "time (s)"}},
                "height": 340,
                "margin": {"t": 40, "b": 40},
            },
        }
        for pid, title in PLOTS
    }
    for run in runs:
        x = _series(run, "t_s")
        hover = [html.escape(str(row.get("reason", ""))) for row in run.timeline]
        for p in run.pools:
            figs["plot-replicas"]["data"].append(
                {
                    "type": "scatter",
                    "mode": "lines",
                    "line": {"shape": "hv"},
                    "name": f"{run.policy} {p}",
                    "x": x,
                    "y": _series(run, f"{p}_replicas"),
                    "text": hover,
                    "hovertemplate": "%{y} replicas<br>%{text}<extra>%{fullData.name}</extra>",
                }
            )
        figs["plot-rate"]["data"].append(
            {
                "type": "scatter",
                "mode": "lines",
                "name": f"{run.policy} observed",
                "x": x,
                "y": _series(run, "observed_rps"),
            }
        )
        if any(v is not None for v in _series(run, "predicted_rps")):
            figs["plot-rate"]["data"].append(
                {
                    "type": "scatter",
                    "mode": "lines",
                    "line": {"dash": "dot"},
                    "name": f"{run.policy} predicted",
                    "x": x,
                    "y": _series(run, "predicted_rps"),
                }
            )
        figs["plot-ttft"]["data"].append(
            {
                "type": "scatter",
                "mode": "lines",
                "name": run.policy,
                "x": x,
                "y": _series(run, "observed_ttft_ms"),
                "text": hover,
            }
        )
        figs["plot-itl"]["data"].append(
            {
                "type": "scatter",
                "mode": "lines",
                "name": run.policy,
                "x": x,
                "y": _series(run, "observed_itl_ms"),
                "text": hover,
            }
        )
        figs["plot-queue"]["data"].append(
            {"type": "scatter", "mode": "lines", "name": run.policy, "x": x, "y": _series(run, "waiting_requests")}
        )
        figs["plot-kv"]["data"].append(
            {"type": "scatter", "mode": "lines", "name": run.policy, "x": x, "y": _series(run, "kv_usage_mean")}
        )
    if runs:
        x = _series(runs[0], "t_s")
        figs["plot-replicas"]["data"].append(
            {
                "type": "scatter",
                "mode": "lines",
                "name": "observed req/s",
                "yaxis": "y2",
                "line": {"color": "rgba(120,120,120,0.5)"},
                "x": x,
                "y": _series(runs[0], "observed_rps"),
            }
        )
        figs["plot-replicas"]["layout"]["yaxis2"] = {"overlaying": "y", "side": "right", "title": {"text": "req/s"}}
    if s0 is not None and runs:
        xs = [0, runs[0].duration_s]
        figs["plot-ttft"]["data"].append(
            {
                "type": "scatter",
                "mode": "lines",
                "name": "TTFT target",
                "x": xs,
                "y": [s0.sla_ttft_ms] * 2,
                "line": {"dash": "dash", "color": "red"},
            }
        )
        figs["plot-itl"]["data"].append(
            {
                "type": "scatter",
                "mode": "lines",
                "name": "ITL target",
                "x": xs,
                "y": [s0.sla_itl_ms] * 2,
                "line": {"dash": "dash", "color": "red"},
            }
        )
    return figs


def render_html(runs: Sequence[SimRun], doc: Mapping[str, Any]) -> str:
    """One self-contained HTML page: summary table + plots; plotly.js inlined (works offline)."""
    from plotly.offline import get_plotlyjs

    figs = figure_data(runs)
    head = [
        "policy",
        "SLA attainment",
        "TTFT att.",
        "ITL att.",
        "GPU-hours",
        "p99 TTFT ms",
        "p99 ITL ms",
        "mean replicas",
        "max replicas",
        "scale events",
    ]
    rows = []
    for name, s in doc["policies"].items():
        cells = [
            name,
            f"{100 * s['sla_attainment']:.2f}%",
            f"{100 * s['ttft_attainment']:.2f}%",
            f"{100 * s['itl_attainment']:.2f}%",
            f"{s['gpu_hours']:.3f}",
            str(s["p99_ttft_ms"]),
            str(s["p99_itl_ms"]),
            ", ".join(f"{p}={v:.2f}" for p, v in s["mean_replicas"].items()),
            ", ".join(f"{p}={v}" for p, v in s["max_replicas"].items()),
            str(s["scale_events"]),
        ]
        rows.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
    table = (
        "<table id='summary'><thead><tr>"
        + "".join(f"<th>{html.escape(h)}</th>" for h in head)
        + "</tr></thead><tbody>"
        + "".join(rows)
        + "</tbody></table>"
    )
    divs = "\n".join(f"<div id='{pid}' class='plot'></div>" for pid, _ in PLOTS)
    data = json.dumps(figs, separators=(",", ":"), allow_nan=False).replace("</", "<\\/")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>dynoplan simulate report</title>
<style>body{{font-family:sans-serif;margin:1.5em}} table{{border-collapse:collapse}} \
td,th{{border:1px solid #ccc;padding:3px 8px;text-align:right}} td:first-child{{text-align:left}} \
.plot{{width:100%}}</style>
<script>{get_plotlyjs()}</script></head>
<body><h1>dynoplan simulate</h1>
{table}
{divs}
<script>
const FIGS = {data};
window.plotsDrawn = 0;
Promise.all(Object.entries(FIGS).map(([id, f]) => \
Plotly.newPlot(id, f.data, f.layout, {{responsive: true, displaylogo: false}}).then(() => window.plotsDrawn++)))
  .then(() => {{ window.plotReady = true; }});
</script>
</body></html>
"""
