"""The simulator's time limit after a run: a replay whose last request finishes past
``MAX_TRACE_TIMESTAMP_MS`` (a tiny ``speedup_ratio`` or KV transfer bandwidth) is refused, naming the setting,
instead of reporting times float64 cannot resolve (or inf, which JSON cannot hold)."""

from __future__ import annotations

import math

import pytest

from dynoplan.errors import ConfigError
from mocker.config import EngineConfig
from mocker.fleet import FleetConfig, run_replay
from mocker.fleet.config import run_end_problem
from mocker.records import TraceRequest
from mocker.traces import MAX_TRACE_TIMESTAMP_MS
from mocker.transfer import KvTransferConfig
from tests.test_cli_replay import assert_one_line_error, cli

TRACE = "synthetic:poisson?rate=2&num_requests=50&seed=1"


def _reqs(n: int = 6) -> list[TraceRequest]:
    return [TraceRequest(i, i * 100.0, 300, 20, (i,)) for i in range(n)]


def test_run_end_problem_at_and_past_the_limit():
    e = EngineConfig()
    assert run_end_problem(MAX_TRACE_TIMESTAMP_MS, [e]) is None  # the limit itself is simulable
    assert run_end_problem(0.0, [e]) is None
    past = math.nextafter(MAX_TRACE_TIMESTAMP_MS, math.inf)
    msg = run_end_problem(past, [e])
    assert msg is not None and msg.startswith("the last request finished at 4.504e+06 s of simulated time (the fleet")
    assert msg.endswith("expected at most 4.504e+06 s")
    assert run_end_problem(math.nan, [e]) is not None  # a NaN end is no end
    assert "finished at inf s" in (run_end_problem(math.inf, [e]) or "")


def test_run_end_problem_names_what_stretches_time():
    slow = EngineConfig(speedup_ratio=1e-20)
    t = KvTransferConfig(bandwidth_gbps=1e-300, kv_bytes_per_token=1000)
    # 5e9 ms = 5e6 s; each cause once, though both pools share the engine settings
    msg = run_end_problem(5e9, [slow, slow.replace(worker_type="decode")], t)
    assert msg is not None
    assert msg.startswith(
        "the last request finished at 5e+06 s of simulated time (with speedup_ratio=1e-20, "
        "bandwidth_gbps=1e-300, kv_bytes_per_token=1000), past the simulator's limit of 4.504e+06 s"
    )
    # a transfer that takes no time (bandwidth 0) is not a cause
    assert "bandwidth" not in (run_end_problem(5e9, [slow], KvTransferConfig()) or "")


def test_run_replay_refuses_a_run_past_the_limit_and_scales_with_the_speedup():
    rq = _reqs()
    # every pass time is divided by speedup_ratio (then rounded to ns): at 1e-6 the run ends at L ms, within
    # the limit; at 1e-20 it would end at L * 1e14 ms, past it
    ok = run_replay(rq, EngineConfig(speedup_ratio=1e-6), FleetConfig())
    last_ms = max(r.finish_ms for r in ok.records if r.finish_ms is not None)
    assert 1e6 < last_ms <= MAX_TRACE_TIMESTAMP_MS
    with pytest.raises(ConfigError) as exc:
        run_replay(rq, EngineConfig(speedup_ratio=1e-20), FleetConfig())
    # arrivals are 100 ms apart: negligible beside the stretched pass times (relative 1e-14)
    assert f"finished at {last_ms * 1e14 / 1000.0:.4g} s of simulated time (with speedup_ratio=1e-20)" in str(exc.value)


@pytest.mark.parametrize("ratio", ["1e-300", "1e-20"])
def test_cli_replay_tiny_speedup_is_one_line_and_keeps_the_earlier_report(tmp_path, capsys, ratio):
    out = tmp_path / "r.json"
    out.write_text("earlier\n")
    rc, _, err = cli(capsys, "--trace", TRACE, "--speedup-ratio", ratio, "--report-json", str(out), "--quiet")
    assert_one_line_error(rc, err, f"(with speedup_ratio={float(ratio):g}), past the simulator's limit")
    assert out.read_text() == "earlier\n"


def test_cli_replay_tiny_kv_transfer_bandwidth_is_one_line(capsys):
    rc, _, err = cli(
        capsys,
        *("--trace", TRACE, "--prefill-workers", "1", "--decode-workers", "1", "--quiet"),
        *("--kv-transfer-bandwidth", "1e-300", "--kv-bytes-per-token", "1000"),
    )
    assert_one_line_error(rc, err, "(with bandwidth_gbps=1e-300, kv_bytes_per_token=1000), past the simulator's")
