"""``dynoplan loadgen`` stopped by Ctrl-C (SIGINT) or SIGTERM: real worker and frontend processes on loopback.

What was measured before the signal is reported, not lost: the table, ``--report-json`` and ``--per-request``
hold every request sent until then (those in flight ``cancelled``, counted as failed), then one line on stderr
says so, and the exit status is the shell's 128 + the signal's number.
"""

from __future__ import annotations

import json
import signal
import subprocess

import pytest
import requests

from tests.infra._proc import wait_until
from tests.live.procs import DYNOPLAN, LiveStack

WORKER_FLAGS = ("--speedup-ratio", "5", "--num-gpu-blocks", "2048", "--block-size", "16", "--trace-block-size", "16")
TOTAL = 1000
"""Requests of the trace: at 5 requests/s, 200 s of load, far more than is sent before the signal."""


def _answered(worker_url: str) -> float:
    """Requests the worker finished so far (its ``vllm:request_success_total``, summed over its labels)."""
    text = requests.get(worker_url + "/metrics", timeout=5).text
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("vllm:request_success_total")
    )


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_loadgen_reports_the_requests_it_sent(tmp_path, sig):
    with LiveStack() as st:
        w = st.worker("w", *WORKER_FLAGS)
        fe = st.frontend("fe", "--workers", w)
        report, per_request = tmp_path / "report.json", tmp_path / "per.jsonl"
        log = tmp_path / "loadgen.err"
        with open(log, "w") as err:
            proc = subprocess.Popen(
                [
                    *DYNOPLAN,
                    "loadgen",
                    "--quiet",
                    "--url",
                    fe,
                    "--trace-block-size",
                    "16",
                    "--trace",
                    f"synthetic:poisson?rate=5&num_requests={TOTAL}&isl=uniform:100:200&osl=uniform:20:60&seed=1",
                    "--report-json",
                    str(report),
                    "--per-request",
                    str(per_request),
                ],
                stdout=subprocess.DEVNULL,
                stderr=err,
            )
            try:
                # the state the signal must find: some requests answered, the run far from its end
                wait_until(lambda: _answered(w) >= 10, 120, "10 requests answered", proc, log)
                proc.send_signal(sig)
                rc = proc.wait(timeout=60)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        stderr = log.read_text()
        assert rc == 128 + int(sig), stderr
        assert "Traceback" not in stderr
        records = [json.loads(line) for line in per_request.read_text().splitlines()]
        rep = json.loads(report.read_text())
        sent = len(records)
        assert 10 <= sent < TOTAL
        finished = sum(1 for r in records if r["status"] == "finished")
        cancelled = sum(1 for r in records if r["status"] == "cancelled")
        assert finished >= 10 and finished + cancelled == sent  # nothing failed for another reason
        assert rep["completed_requests"] == finished and rep["failed_requests"] == cancelled
        assert stderr.strip().splitlines()[-1] == (
            f"dynoplan loadgen: interrupted after sending {sent} of {TOTAL} requests ({cancelled} in flight, "
            "reported as failed); the table and the outputs hold the requests sent"
        )
