"""Core.release_finished (long-running wall-clock drivers): forgets terminal requests, drops the pass end times
no live request needs and drains the FPM list, without changing anything the remaining requests get."""

from __future__ import annotations

import pytest

from mocker.config import EngineConfig
from mocker.engine import make_engine
from mocker.records import TraceRequest


def _run(engine: str, release_until_pass: int):  # type: ignore[no-untyped-def]
    cfg = EngineConfig(engine=engine, num_gpu_blocks=64, block_size=16, trace_block_size=16)
    core = make_engine(cfg, collect_fpm=True)
    reqs = [
        TraceRequest(i, 3.0 * i, 30 + 7 * i, 2 + 5 * (i % 3), tuple(100 * j + i % 2 for j in range(1, 7)))
        for i in range(8)
    ]
    recs, drained, released_at = {}, [], []
    now, k = 0.0, 0
    while k < len(reqs) or core.has_work():
        if not core.has_work():
            now = max(now, reqs[k].arrival_ms)
        while k < len(reqs) and reqs[k].arrival_ms <= now:
            recs[reqs[k].request_id] = core.add_request(reqs[k], reqs[k].arrival_ms)
            k += 1
        now = core.step(now).end_ms
        if core.pass_index <= release_until_pass:
            drained += core.release_finished()
            released_at.append(core.pass_index)
    core.finalize()
    return core, recs, drained


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_release_keeps_live_requests_timeline_and_drains(engine):
    ref, ref_recs, _ = _run(engine, -1)  # never released: the offline path
    n_passes = ref.pass_index
    assert len(ref.fpm) == n_passes and len(ref.all_requests) == 8
    core, recs, drained = _run(engine, n_passes // 2)
    assert core.pass_index == n_passes
    # every FPM came out exactly once, in order: drained ones, then the ones collected after the last release
    assert drained + core.fpm == ref.fpm
    live_at_release = [r.request_id for r in core.all_requests]
    assert 0 < len(live_at_release) < 8  # some finished and were forgotten, some were still running
    assert core._ends_base > 0 and core.pass_end_times().size == n_passes - core._ends_base
    assert all(r.state.name == "FINISHED" for r in ref.all_requests)
    for rid, rec in recs.items():
        want = ref_recs[rid]
        # scheduling is unchanged: admission, first token, finish, preemptions identical
        assert (rec.admit_ms, rec.first_token_ms, rec.finish_ms, rec.num_preemptions, rec.status) == (
            want.admit_ms,
            want.first_token_ms,
            want.finish_ms,
            want.num_preemptions,
            want.status,
        )
        if rid in live_at_release:  # still held at the last release: finalize gives every token time
            assert rec.token_times_ms == want.token_times_ms and len(rec.token_times_ms) == want.output_length


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_release_when_idle_forgets_everything(engine):
    core, _, _ = _run(engine, 10**9)
    assert core.all_requests == [] and core.requests == {} and core.fpm == []
    assert core.pass_end_times().size == 0 and core._ends_base == core.pass_index
