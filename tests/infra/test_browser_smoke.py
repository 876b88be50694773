"""Smoke tests of headless chromium over CDP: a local page with plotly.js inlined renders the
expected number of points without console errors, and errors on a broken page are caught."""

from __future__ import annotations

import plotly.offline
import pytest

from tests.infra.browser import HeadlessChromium, JavaScriptError, serve_directory

pytestmark = pytest.mark.integration

N_POINTS = 37


def plot_page(n: int) -> str:
    xs = list(range(n))
    ys = [x * x for x in xs]
    return f"""<!doctype html><html><head><meta charset="utf-8">
<script>{plotly.offline.get_plotlyjs()}</script></head><body>
<div id="plot" style="width:800px;height:500px"></div>
<script>
Plotly.newPlot('plot', [{{x: {xs}, y: {ys}, mode: 'markers', type: 'scatter'}}])
  .then(() => {{ window.plotReady = true; }});
</script></body></html>"""


def test_plotly_page_renders_points_without_errors(chromium: HeadlessChromium, tmp_path):
    (tmp_path / "index.html").write_text(plot_page(N_POINTS))
    with serve_directory(tmp_path) as base:
        page = chromium.open(f"{base}/index.html", wait_for="window.plotReady === true")
        try:
            assert page.errors() == []
            assert page.evaluate("document.getElementById('plot').data[0].x.length") == N_POINTS
            # Rendered SVG markers, one per point.
            assert page.evaluate("document.querySelectorAll('#plot .scatterlayer .point').length") == N_POINTS
            assert page.evaluate("document.getElementById('plot').data[0].y[6]") == 36
            shot = page.screenshot(tmp_path / "plot.png")
            assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        finally:
            page.close()


def test_console_errors_exceptions_and_missing_resources_are_reported(chromium: HeadlessChromium, tmp_path):
    (tmp_path / "broken.html").write_text("""<!doctype html><html><body>
<script src="/missing.js"></script>
<script>console.error('boom', 42); window.done = true; undefinedFunction();</script>
</body></html>""")
    with serve_directory(tmp_path) as base:
        page = chromium.open(f"{base}/broken.html", wait_for="window.done === true")
        try:
            errors = page.errors()
            assert any("boom 42" in e for e in errors), errors
            assert any("undefinedFunction is not defined" in e for e in errors), errors
            assert any("404" in e for e in errors), errors
            with pytest.raises(JavaScriptError, match="nope"):
                page.evaluate("(() => { throw new Error('nope') })()")
        finally:
            page.close()


def test_close_leaves_no_process_and_no_profile_dir():
    import os

    with HeadlessChromium() as browser:
        pid, profile = browser.proc.pid, browser.profile_dir
        assert "Chrome" in browser.version()["Browser"]
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert not profile.exists()
