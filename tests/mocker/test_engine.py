"""Engine core: reference timing facts, batching, chunking, admission, preemption, prefix hits, TRT-LLM."""

from __future__ import annotations

import pytest

from dynoplan.errors import ConfigError
from mocker.config import EngineConfig
from mocker.engine import TrtllmCore, VllmCore, make_engine
from mocker.records import TraceRequest

TOTAL = 16384 * 64  # default vLLM KV tokens


def pre(t: int) -> float:
    """The polynomial prefill of docs/architecture.md "Polynomial timing baseline";, written out by hand."""
    return 4.209989e-07 * t * t + 1.518344e-02 * t + 16.50142


def dec(active_tokens: int, total: int = TOTAL) -> float:
    p = active_tokens / total
    return max(1.0, -25.74 * p * p + 54.01 * p + 5.74)


def run(core: VllmCore, reqs: list[TraceRequest]):
    recs = {}
    for r in sorted(reqs, key=lambda r: r.arrival_ms):
        core.advance_until(r.arrival_ms)
        recs[r.request_id] = core.add_request(r, r.arrival_ms)
        core.check_invariants()
    core.advance_until(float("inf"))
    core.check_invariants()
    core.finalize()
    return recs


def req(i, t, isl, osl, hashes=None):
    if hashes is None:
        hashes = tuple(range(1000 * (i + 1), 1000 * (i + 1) + -(-isl // 512)))
    return TraceRequest(i, float(t), isl, osl, hashes)


def test_reference_fact_isl_374_alone():
    recs = run(VllmCore(EngineConfig()), [req(0, 0, 374, 44)])
    r = recs[0]
    assert r.ttft_ms == pytest.approx(22.239, abs=1e-3)  # reference: 22.238914
    assert r.token_times_ms[1] - r.token_times_ms[0] == pytest.approx(5.76, abs=1e-2)
    # decode p counts the sequence incl. the first token: 375 tokens of 16384*64
    assert r.token_times_ms[1] - r.token_times_ms[0] == pytest.approx(dec(375), abs=1e-6)
    assert len(r.token_times_ms) == 44 and r.status == "finished"
    assert r.finish_ms == r.token_times_ms[-1]


def test_simultaneous_prefills_batch_with_mean_isl():
    recs = run(VllmCore(EngineConfig()), [req(0, 0, 374, 3), req(1, 0, 500, 3)])
    # one pass: T = 2 * ((374 + 500) // 2) = 874 new tokens; both first tokens at its end
    assert recs[0].first_token_ms == pytest.approx(pre(874), abs=1e-6)
    assert recs[1].first_token_ms == recs[0].first_token_ms


def test_arrival_joins_next_pass_and_mixed_pass_time():
    recs = run(VllmCore(EngineConfig()), [req(0, 0, 374, 10), req(1, 30, 1000, 3)])
    a, b = recs[0], recs[1]
    # A's passes: 22.239, +dec(375), +dec(376) -> the pass that starts after t=30 is at 33.7576
    boundary = pre(374) + dec(375) + dec(376)
    assert b.admit_ms == pytest.approx(boundary, abs=1e-5)
    # mixed pass: prefill(1000) + decode of A only (A's sequence: 374 + 3 tokens)
    assert b.first_token_ms == pytest.approx(boundary + pre(1000) + dec(377), abs=1e-5)
    assert b.first_token_ms in a.token_times_ms


@pytest.mark.parametrize("chunked", [True, False])
def test_chunked_prefill_on_off(chunked):
    cfg = EngineConfig(max_num_batched_tokens=1000, enable_chunked_prefill=chunked)
    recs = run(VllmCore(cfg), [req(0, 0, 600, 2), req(1, 0, 600, 2)])
    a, b = recs[0], recs[1]
    if chunked:
        # pass 1: A 600 + B chunk 400 -> T = 2 * (1000 // 2 - 0)
        assert a.first_token_ms == pytest.approx(pre(1000), abs=1e-5)
        # pass 2: B's last 200 (prefix 400) + A's decode
        assert b.first_token_ms == pytest.approx(pre(1000) + pre(200) + dec(601), abs=1e-5)
    else:
        # B does not fit the remaining budget (400 < 600): it waits for pass 2
        assert a.first_token_ms == pytest.approx(pre(600), abs=1e-5)
        assert b.admit_ms == a.first_token_ms
        assert b.first_token_ms == pytest.approx(pre(600) + pre(600) + dec(601), abs=1e-5)


def test_chunking_of_a_long_prompt_matches_reference():
    recs = run(VllmCore(EngineConfig()), [req(0, 0, 100, 50), req(1, 10, 10000, 2)])
    # reference: B's first token at 243.975242 (chunks 8191 + 1809, A decoding alongside)
    assert recs[1].first_token_ms == pytest.approx(243.975242, abs=1e-6)


def test_non_chunked_prompt_larger_than_budget_is_rejected():
    cfg = EngineConfig(max_num_batched_tokens=1000, enable_chunked_prefill=False)
    recs = run(VllmCore(cfg), [req(0, 0, 1500, 2), req(1, 0, 100, 2)])
    assert recs[0].status == "failed" and recs[1].status == "finished"


@pytest.mark.parametrize("core_type", [VllmCore, TrtllmCore])
def test_prompt_that_can_never_fit_builds_no_block_keys(core_type):
    # ISL 2**31 - 1 built 134M engine block keys (GBs) before admission refused the prompt; now none
    cfg = EngineConfig(num_gpu_blocks=10, block_size=16)
    core = core_type(cfg)
    big = req(0, 0, 161, 2)  # 11 blocks > 10: can never fit
    fits = req(1, 0, 100, 2)
    core.add_request(big, 0.0, block_keys=list(range(10)))  # given keys are not kept either
    core.add_request(fits, 0.0)
    assert core.requests[0].block_keys is None and core.requests[1].block_keys is not None
    assert not core.prompt_fits(161) and core.prompt_fits(160)
    core.advance_until(float("inf"))
    core.finalize()
    recs = {r.request_id: r.record for r in core.all_requests}
    assert recs[0].status == "failed" and recs[1].status == "finished"


def test_max_num_seqs_limits_admission():
    cfg = EngineConfig(max_num_seqs=2)
    recs = run(VllmCore(cfg), [req(0, 0, 100, 5), req(1, 0, 100, 50), req(2, 0, 100, 5)])
    assert recs[0].admit_ms == recs[1].admit_ms == 0.0
    assert recs[2].admit_ms == recs[0].finish_ms  # a slot frees only when A finishes


def test_kv_capacity_limits_admission():
    cfg = EngineConfig(num_gpu_blocks=10, block_size=16)
    recs = run(VllmCore(cfg), [req(0, 0, 100, 5), req(1, 0, 100, 5)])  # 7 blocks each
    assert recs[1].admit_ms == recs[0].finish_ms
    assert recs[0].num_preemptions == recs[1].num_preemptions == 0


@pytest.mark.parametrize("mode", ["lifo", "fifo"])
def test_preemption_order(mode):
    # 4 blocks of 16: A and B (31 tokens, 2 blocks each) fill the pool; at 33 tokens each needs a third block
    cfg = EngineConfig(num_gpu_blocks=4, block_size=16, preemption_mode=mode)
    core = VllmCore(cfg)
    recs = run(core, [req(0, 0, 31, 20), req(1, 0, 31, 20)])
    a, b = recs[0], recs[1]
    assert a.status == b.status == "finished"
    if mode == "lifo":
        assert a.num_preemptions == 0 and b.num_preemptions >= 1
        assert a.finish_ms < b.finish_ms
    else:
        assert a.num_preemptions >= 1 and b.num_preemptions == 0
        assert b.finish_ms < a.finish_ms
    assert core.preemptions_total == a.num_preemptions + b.num_preemptions


def test_prefix_hit_reduces_prefill():
    shared = (7, 8)
    recs = run(VllmCore(EngineConfig()), [req(0, 0, 1024, 2, shared), req(1, 1000, 1024, 2, shared)])
    a, b = recs[0], recs[1]
    assert a.cached_tokens == 0
    # 16 cached blocks of 64, but at least one token is recomputed: 15 blocks = 960 tokens
    assert b.cached_tokens == 960
    assert a.ttft_ms == pytest.approx(pre(1024), abs=1e-5)
    assert b.ttft_ms == pytest.approx(pre(64), abs=1e-5)


def test_prefix_caching_off_gives_no_hits():
    shared = (7, 8)
    recs = run(
        VllmCore(EngineConfig(enable_prefix_caching=False)), [req(0, 0, 1024, 2, shared), req(1, 1000, 1024, 2, shared)]
    )
    assert recs[1].cached_tokens == 0


def test_trtllm_guaranteed_no_evict_caps_running_at_28():
    cfg = EngineConfig(engine="trtllm", num_gpu_blocks=7319)  # TRT-LLM default block size 32
    core = make_engine(cfg)
    assert isinstance(core, TrtllmCore) and core.block_size == 32
    for i in range(40):
        core.add_request(TraceRequest(i, 0.0, 1096, 7000, None), 0.0)
    peak = 0
    now = 0.0
    for _ in range(300):
        out = core.step(now)
        now = out.end_ms
        peak = max(peak, core.num_running)
        core.check_invariants()
        assert not out.preempted
    assert peak == 28  # ceil((1096 + 7000) / 32) = 253 blocks each; 28 * 253 <= 7319 < 29 * 253


def test_step_api_reports_emissions_and_cancel_frees_kv():
    core = VllmCore(EngineConfig())
    core.add_request(TraceRequest(5, 0.0, 374, 3, None), 0.0)
    core.add_request(TraceRequest(6, 0.0, 200, 100, None), 0.0)
    out = core.step(0.0)
    assert out.start_ms == 0.0 and out.end_ms == pytest.approx(pre(2 * 287), abs=1e-5)
    assert sorted(rid for rid, _ in out.emissions) == [5, 6]
    assert all(t == out.end_ms for _, t in out.emissions)
    assert sorted(out.admitted) == [5, 6]
    assert core.cancel(6, out.end_ms)
    assert not core.cancel(6, out.end_ms)
    core.check_invariants()
    assert core.kv.num_active_blocks() == 6  # only request 5's blocks: ceil(374/64)
    while core.has_work():
        out = core.step(out.end_ms)
    core.check_invariants()
    assert core.kv.num_active_blocks() == 0


def test_clock_cannot_go_back():
    from dynoplan.errors import SimulationError

    core = VllmCore(EngineConfig())
    core.add_request(TraceRequest(0, 0.0, 100, 3, None), 0.0)
    out = core.step(0.0)
    with pytest.raises(SimulationError):
        core.step(out.end_ms - 1.0)


def test_engine_without_a_core_is_a_config_error(monkeypatch):
    from mocker import engine as engine_pkg

    monkeypatch.setattr(engine_pkg, "CORES", {"vllm": VllmCore})
    with pytest.raises(ConfigError, match="engine='trtllm'"):
        make_engine(EngineConfig(engine="trtllm"))
    assert isinstance(make_engine(EngineConfig()), VllmCore)


def test_fpm_records_per_pass():
    core = VllmCore(EngineConfig(), collect_fpm=True)
    run(core, [req(0, 0, 374, 4), req(1, 10, 500, 2)])
    assert len(core.fpm) == core.pass_index
    first = core.fpm[0]
    assert first.scheduled_requests.num_prefill_requests == 1
    assert first.scheduled_requests.sum_prefill_tokens == 374
    assert first.wall_time == pytest.approx(pre(374) / 1000.0, abs=1e-9)
    mixed = core.fpm[1]
    assert mixed.scheduled_requests.num_prefill_requests == 1
    assert mixed.scheduled_requests.num_decode_requests == 1
    assert mixed.scheduled_requests.sum_decode_kv_tokens == 375
