"""The simulate HTML report in real headless chromium: loads offline with no console errors, and every
plot holds one point per timeline sample per policy."""

from __future__ import annotations

import csv

import pytest

from planner.cli import main as cli_main
from planner.sim.report import PLOTS
from tests.infra.browser import HeadlessChromium, serve_directory

pytestmark = pytest.mark.integration

TRACE = "synthetic:poisson?rate=3&duration_s=180&isl=600&osl=40&seed=5"


def test_report_html_renders_all_plots_with_expected_points(chromium: HeadlessChromium, tmp_path):
    out = tmp_path / "out"
    assert (
        cli_main(
            [
                "simulate",
                "--trace",
                TRACE,
                "--quiet",
                "--compare",
                "planner",
                "static:1",
                "hpa",
                "--planner-set",
                "adjustment_interval_s=60",
                "--startup-delay-s",
                "20",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    with (out / "timeline.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    per_policy = {p: sum(1 for r in rows if r["policy"] == p) for p in ("planner", "static:1", "hpa")}
    assert all(n > 10 for n in per_policy.values())
    with serve_directory(out) as base:
        page = chromium.open(f"{base}/report.html", wait_for="window.plotReady === true")
        try:
            assert page.errors() == []
            assert page.evaluate("window.plotsDrawn") == len(PLOTS)
            names = page.evaluate("document.getElementById('plot-replicas').data.map(t => t.name)")
            assert names == ["planner agg", "static:1 agg", "hpa agg", "observed req/s"]
            lengths = page.evaluate("document.getElementById('plot-replicas').data.map(t => t.x.length)")
            assert lengths == [per_policy["planner"], per_policy["static:1"], per_policy["hpa"], per_policy["planner"]]
            for pid in ("plot-queue", "plot-kv"):
                got = page.evaluate(f"document.getElementById('{pid}').data.map(t => t.y.length)")
                assert got == [per_policy["planner"], per_policy["static:1"], per_policy["hpa"]]
            # rendered SVG: one line path per trace in the replicas plot
            assert page.evaluate("document.querySelectorAll('#plot-replicas .scatterlayer .trace').length") == 4
            # the TTFT plot has the target line spanning the run
            tgt = page.evaluate("document.getElementById('plot-ttft').data.slice(-1)[0].y")
            assert tgt == [500, 500]
            # no network: the page has no external script or link
            assert page.evaluate("Array.from(document.querySelectorAll('script[src],link[href]')).length") == 0
            rows_html = page.evaluate("document.querySelectorAll('#summary tbody tr').length")
            assert rows_html == 3
        finally:
            page.close()
