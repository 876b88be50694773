"""Hypothesis: random workloads against the SGLang core (tokens conserved after every pass, no request both
waiting and running, every request terminates, determinism, fast-forward == one pass at a time)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mocker.config import EngineConfig, SGLangConfig
from mocker.engine.sglang import SglangCore
from mocker.records import TraceRequest

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def workloads(draw):
    n = draw(st.integers(1, 14))
    reqs = []
    t = 0.0
    for i in range(n):
        t += draw(st.sampled_from([0.0, 1.0, 7.5, 30.0, 200.0]))
        isl = draw(st.integers(1, 1500))
        osl = draw(st.integers(1, 120))
        share = draw(st.integers(0, 3))  # small alphabet of leading ids -> shared prefixes
        ids = tuple([share] + [draw(st.integers(0, 2)) * 100 + i for _ in range(-(-isl // 512) - 1)])
        reqs.append(TraceRequest(i, t, isl, osl, ids if draw(st.booleans()) else None))
    return reqs


@st.composite
def engines(draw):
    return EngineConfig(
        engine="sglang",
        num_gpu_blocks=draw(st.sampled_from([300, 900, 2500, 16384])),
        block_size=draw(st.sampled_from([None, 1, 4, 16])),
        max_num_seqs=draw(st.sampled_from([2, 8, 256])),
        enable_prefix_caching=draw(st.booleans()),
        sglang=SGLangConfig(
            schedule_policy=draw(st.sampled_from(["fifo", "lpm"])),
            chunked_prefill_size=draw(st.sampled_from([64, 512, 8192])),
            max_prefill_tokens=draw(st.sampled_from([128, 16384])),
            clip_max_new_tokens=draw(st.sampled_from([8, 4096])),
            schedule_conservativeness=draw(st.sampled_from([0.3, 1.0, 2.0])),
        ),
    )


def drive(cfg: EngineConfig, reqs: list[TraceRequest], check: bool, single: bool = False):
    core = SglangCore(cfg)
    recs = []
    for r in reqs:
        if single:
            core.advance_single_step(r.arrival_ms)
        else:
            core.advance_until(r.arrival_ms)
        recs.append(core.add_request(r, r.arrival_ms))
    guard = 0
    while core.has_work():
        core.step(core.next_pass_ms) if single or check else core.advance_until(float("inf"))
        if check:
            core.check_invariants()
        guard += 1
        assert guard < 200_000, "no termination"
    core.finalize()
    return core, recs


@SETTINGS
@given(workloads(), engines())
def test_tokens_conserved_and_every_request_terminates(reqs, cfg):
    core, recs = drive(cfg, reqs, check=True)
    kv = core.kv
    assert kv.private == 0 and kv.protected_size == 0
    assert kv.free + kv.evictable_size == kv.total_tokens
    for r in recs:
        assert r.status in ("finished", "failed")
        if r.status == "finished":
            assert len(r.token_times_ms) == r.output_length
            assert r.token_times_ms == sorted(r.token_times_ms)
            assert r.first_token_ms == r.token_times_ms[0] and r.finish_ms == r.token_times_ms[-1]
        else:  # refused: can never fit this engine (pool or per-pass prefill budget)
            assert r.finish_ms is not None and len(r.token_times_ms) < r.output_length


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads(), engines())
def test_deterministic_and_fast_forward_equals_single_pass(reqs, cfg):
    _, a = drive(cfg, reqs, check=False)
    _, b = drive(cfg, reqs, check=False)
    _, c = drive(cfg, reqs, check=False, single=True)
    assert list(a) == list(b)
    assert list(a) == list(c)
