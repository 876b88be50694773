"""A worker SIGKILLed while it streams N requests, on a running ``dynoplan up`` stack (real frontend and
worker processes, the real ``dynoplan loadgen``), for both prompt modes of the load generator:

- with a second worker: the frontend continues each of the N streams there (the prompt extended by the
  tokens already sent, with block ids covering it), so every request of the run completes with exactly its
  ``max_tokens``; the frontend counts N continuations and no failure, the load generator no failure;
- with no other worker: each of the N requests fails, and the frontend (``request_failures_total{reason}``)
  and the load generator (``errors`` / ``failures``) report the same N failures with the same reason.

N is read from the victim just before the kill, once all the run's requests are admitted (a burst, none
arriving later) and every one of them has produced tokens; the output lengths are long enough that none
finishes before the kill.
"""

from __future__ import annotations

import os
import signal
import threading

import pytest
import requests

from tests.liveplanner.stack import UpStack, samples, stack_file, step_trace, total

pytestmark = pytest.mark.integration

SLOW_WORKER = ["--speedup-ratio", "1", "--num-gpu-blocks", "2048", "--block-size", "16", "--trace-block-size", "16"]
BURST = 12
"""Requests of the run, all sent within 12 ms."""
ISL, OSL = 200, 600
"""200 prompt tokens = 12.5 blocks of 16 (a partial last block); 600 output tokens last seconds at speedup 1."""


def _run(tmp_path, replicas: int, prompt_mode: str):
    cfg = stack_file(
        tmp_path,
        planner={"agg": {"min_replicas": replicas, "max_replicas": replicas}},
        fleet={"initial": {"agg": replicas}, "worker_args": {"agg": SLOW_WORKER}, "drain_grace_s": 1.0},
        prometheus={"enabled": False},
    )
    trace = tmp_path / "burst.jsonl"
    assert step_trace(trace, [(1000.0, BURST / 1000.0)], isl=ISL, osl=OSL) == BURST
    up = UpStack(cfg)
    try:
        fleet = up.fleet()["workers"]
        assert len(fleet) == replicas
        victim = fleet[0]
        result: dict = {}
        th = threading.Thread(
            target=lambda: result.update(zip(("rc", "rep", "err"), up.loadgen(trace, "--prompt-mode", prompt_mode)))
        )
        th.start()

        def all_streaming() -> bool:
            routed = requests.get(up.frontend_url + "/workers", timeout=2).json()
            if sum(w["inflight"] for w in routed) != BURST:
                return False  # not every request is routed yet
            m = samples(victim["url"])
            on_victim = next(w["inflight"] for w in routed if w["url"] == victim["url"])
            running = total(m, "vllm:num_requests_running")
            state["n"], state["gen"] = on_victim, total(m, "vllm:generation_tokens_total")
            # every request on the victim runs (none waits) and has produced tokens: at least one decode pass
            # emitted a token to each of them after they all ran
            if running != on_victim or total(m, "vllm:num_requests_waiting") != 0:
                state.pop("gen0", None)
                return False
            state.setdefault("gen0", state["gen"])
            return on_victim >= 1 and state["gen"] >= state["gen0"] + 2 * on_victim

        state: dict = {}
        up.wait(all_streaming, 60, "every request of the burst streaming")
        n = state["n"]
        assert total(samples(victim["url"]), "vllm:request_success_total") == 0  # none finished before the kill
        os.kill(victim["pid"], signal.SIGKILL)
        th.join(300)
        assert not th.is_alive()
        fe = samples(up.frontend_url)
        return n, result, fe
    finally:
        up.stop()


@pytest.mark.parametrize("prompt_mode", ["length", "text"])
def test_killed_worker_streams_continue_elsewhere_with_every_token(tmp_path, prompt_mode):
    n, result, fe = _run(tmp_path, 2, prompt_mode)
    rep = result["rep"]
    counts = {
        "victim_streams": n,
        "loadgen_completed": rep["completed_requests"],
        "loadgen_failed": rep["failed_requests"],
        "loadgen_output_tokens": rep["total_output_tokens"],
        "frontend_success": total(fe, "dynamo_frontend_requests_total", status="success"),
        "frontend_error": total(fe, "dynamo_frontend_requests_total", status="error"),
        "frontend_continuations": total(fe, "dynoplan_frontend_stream_continuations_total"),
        "frontend_retries": total(fe, "dynamo_frontend_request_retries_total"),
        "frontend_failures": total(fe, "dynoplan_frontend_request_failures_total"),
    }
    print(f"\nmid-stream kill, 2 workers, prompt mode {prompt_mode}: {counts}")
    assert result["rc"] == 0, (rep.get("failures"), result["err"][-2000:])
    assert 1 <= n < BURST  # least_loaded split the burst over both workers
    assert counts == {
        "victim_streams": n,
        "loadgen_completed": BURST,
        "loadgen_failed": 0,
        "loadgen_output_tokens": BURST * OSL,
        "frontend_success": BURST,
        "frontend_error": 0,
        "frontend_continuations": n,
        "frontend_retries": n,
        "frontend_failures": 0,
    }
    assert rep["failures"] == [] and rep["errors"] == {}


@pytest.mark.parametrize("prompt_mode", ["length", "text"])
def test_killed_worker_without_a_spare_fails_its_streams_and_both_sides_say_why(tmp_path, prompt_mode):
    n, result, fe = _run(tmp_path, 1, prompt_mode)
    rep = result["rep"]
    counts = {
        "victim_streams": n,
        "loadgen_completed": rep["completed_requests"],
        "loadgen_failed": rep["failed_requests"],
        "loadgen_errors": rep["errors"],
        "frontend_success": total(fe, "dynamo_frontend_requests_total", status="success"),
        "frontend_error": total(fe, "dynamo_frontend_requests_total", status="error"),
        "frontend_failures_all_workers_failed": total(
            fe, "dynoplan_frontend_request_failures_total", reason="all_workers_failed"
        ),
        "frontend_failures": total(fe, "dynoplan_frontend_request_failures_total"),
    }
    print(f"\nmid-stream kill, 1 worker, prompt mode {prompt_mode}: {counts}")
    assert n == BURST  # the only worker held the whole burst
    assert result["rc"] == 1  # the loadgen exits 1 when requests failed
    assert counts == {
        "victim_streams": BURST,
        "loadgen_completed": 0,
        "loadgen_failed": BURST,
        "loadgen_errors": {"stream_error": BURST},
        "frontend_success": 0,
        "frontend_error": BURST,
        "frontend_failures_all_workers_failed": BURST,
        "frontend_failures": BURST,
    }
    assert len(rep["failures"]) == BURST
    for f in rep["failures"]:
        assert f["reason"] == "stream_error" and f["message"].startswith(
            "all_workers_failed: all workers failed after "
        )
        assert 1 <= f["tokens"] < OSL and f["expected_tokens"] == OSL
