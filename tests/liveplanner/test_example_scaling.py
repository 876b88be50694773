"""The shipped example (examples/live-scaling): its stack file on free ports, with the profile its header
says to write and the load its README documents, scales the stack up and then down again, as the README
says it does. Real processes throughout (up, frontend, workers, planner, Prometheus, loadgen)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
import time

import pytest
import requests
import yaml

from tests.infra._proc import REPO_ROOT
from tests.liveplanner.stack import DYNOPLAN, UpStack

pytestmark = pytest.mark.integration

EXAMPLE = REPO_ROOT / "examples" / "live-scaling"


def test_generator_writes_the_shipped_load():
    sys.path.insert(0, str(EXAMPLE))
    try:
        import make_load  # noqa: PLC0415 - the example's own script
    finally:
        sys.path.remove(str(EXAMPLE))
    assert (EXAMPLE / "load.jsonl").read_text() == "\n".join(make_load.lines()) + "\n"
    assert len(make_load.lines()) == 2 * 40 + 12 * 120 + 2 * 120


def test_example_scales_up_then_down_under_its_documented_load(tmp_path):
    doc = yaml.safe_load((EXAMPLE / "stack.yaml").read_text())
    # the README's profile command (the flags of the stack's workers), into this test's directory
    flags = doc["fleet"]["worker_args"]["agg"]
    subprocess.run(
        DYNOPLAN + ["profile", "--out", str(tmp_path / "profile.npz"), *flags],
        check=True,
        capture_output=True,
        timeout=300,
    )
    doc.update(
        profile=str(tmp_path / "profile.npz"),
        state_dir=str(tmp_path / "state"),
        service={"port": 0},
        frontend={**doc["frontend"], "port": 0},
    )
    cfg = tmp_path / "stack.yaml"
    cfg.write_text(yaml.safe_dump(doc))
    with UpStack(cfg) as up:
        assert up.prometheus_url and up.spec() == 1
        result: dict = {}
        # the README's load command: loadgen --trace examples/live-scaling/load.jsonl --trace-block-size 16
        load = tmp_path / "load.jsonl"  # a copy: the loadgen's report goes next to its trace
        shutil.copyfile(EXAMPLE / "load.jsonl", load)
        th = threading.Thread(target=lambda: result.update(zip(("rc", "rep", "err"), up.loadgen(load, timeout_s=900))))
        t0 = time.monotonic()
        th.start()
        timeline = [(0.0, 1)]
        while th.is_alive() or timeline[-1][1] != 1:
            try:
                s = up.spec()
            except requests.exceptions.Timeout:  # the planner busy with a sizing on a loaded machine: poll again
                s = None
            if s is not None and s != timeline[-1][1]:
                timeline.append((round(time.monotonic() - t0, 1), s))
            if not th.is_alive() and time.monotonic() > result.setdefault("t_end", time.monotonic()) + 120:
                break
            time.sleep(0.5)
        th.join()
        rep = result["rep"]
        print(
            f"\nexample live-scaling: replicas over time (s since the load started, spec) {timeline}; "
            f"loadgen {rep['completed_requests']}/{rep['num_requests']} completed, "
            f"p99 TTFT {rep['p99_ttft_ms']:.0f} ms, "
            f"p99 ITL {rep['p99_itl_ms']:.1f} ms"
        )
        assert result["rc"] == 0 and rep["failed_requests"] == 0, rep.get("failures")
        peak = max(s for _, s in timeline)
        assert peak >= 2, timeline  # scaled up under the 10 req/s phase
        assert timeline[-1][1] == 1, timeline  # and back down once it ended
        st = up.state_json()
        reasons = {d["reason"] for d in st["decisions"]}
        assert "scale_up_throughput" in reasons and "scale_down_throughput" in reasons, st["decisions"]
