"""Hypothesis invariants over random workloads and engine settings.

- every request terminates (finished, or failed when it can never fit);
- KV blocks are conserved and queues stay consistent after every event (check_invariants);
- time is monotone: arrival <= admission <= first token <= ... <= finish;
- the fast-forward fleet gives exactly the records of one-pass-at-a-time stepping;
- the same input gives identical records.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mocker.config import EngineConfig
from mocker.engine import make_engine
from mocker.fleet import FleetConfig, run_replay
from mocker.records import TraceRequest


@st.composite
def workloads(draw):
    n = draw(st.integers(1, 14))
    t = 0.0
    out = []
    for i in range(n):
        t += draw(st.sampled_from([0.0, 0.0, 3.0, 17.5, 80.0, 400.0]))
        isl = draw(st.integers(1, 1500))
        osl = draw(st.integers(1, 90))
        family = draw(st.integers(0, 3))  # shared prefixes between requests of the same family
        ids = tuple([family] + [10_000 + i * 10 + k for k in range(-(-isl // 512) - 1)])
        out.append(TraceRequest(i, t, isl, osl, ids if draw(st.booleans()) else None))
    return out


@st.composite
def engines(draw):
    kind = draw(st.sampled_from(["vllm", "vllm", "trtllm"]))
    bs = draw(st.sampled_from([16, 32, 64]))
    return EngineConfig(
        engine=kind,
        block_size=bs,
        num_gpu_blocks=draw(st.integers(8, 200)),
        max_num_seqs=draw(st.integers(1, 8)),
        max_num_batched_tokens=draw(st.sampled_from([64, 256, 2048, 8192])),
        enable_chunked_prefill=draw(st.booleans()),
        enable_prefix_caching=draw(st.booleans()),
        preemption_mode=draw(st.sampled_from(["lifo", "fifo"])),
        speedup_ratio=draw(st.sampled_from([1.0, 3.0])),
    )


def _check(records):
    for r in records:
        assert r.status in ("finished", "failed"), r
        if r.status == "finished":
            tt = r.token_times_ms
            assert len(tt) == r.output_length
            assert r.arrival_ms <= r.admit_ms <= tt[0] == r.first_token_ms
            assert all(a <= b for a, b in zip(tt, tt[1:]))
            assert tt[-1] == r.finish_ms


SETTINGS = settings(max_examples=70, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(workloads(), engines(), st.integers(1, 3), st.sampled_from(["round_robin", "least_loaded", "kv"]))
def test_fast_forward_equals_single_step(reqs, eng, workers, router):
    fast = run_replay(reqs, eng, FleetConfig(num_workers=workers, router=router))
    slow = run_replay(reqs, eng, FleetConfig(num_workers=workers, router=router, single_step=True))
    _check(fast.records)
    assert list(fast.records) == list(slow.records)
    assert fast.duration_ms == slow.duration_ms


@SETTINGS
@given(workloads(), engines())
def test_invariants_hold_after_every_event(reqs, eng):
    core = make_engine(eng)
    recs = []
    for r in sorted(reqs, key=lambda r: r.arrival_ms):
        core.advance_until(r.arrival_ms)
        core.check_invariants()
        recs.append(core.add_request(r, r.arrival_ms))
    last_end = core.next_pass_ms
    while core.has_work():
        out = core.step(core.next_pass_ms)
        assert out.end_ms >= out.start_ms >= last_end  # the clock never goes back
        last_end = out.end_ms
        core.check_invariants()
    core.finalize()
    _check(recs)
    assert core.kv.num_active_blocks() == 0 and core.kv.available() == eng.num_gpu_blocks
    assert core.reserved_blocks == 0


@settings(max_examples=25, deadline=None)
@given(workloads(), engines())
def test_deterministic(reqs, eng):
    a = run_replay(reqs, eng, FleetConfig(num_workers=2, router="kv", seed=5))
    b = run_replay(reqs, eng, FleetConfig(num_workers=2, router="kv", seed=5))
    assert list(a.records) == list(b.records)
