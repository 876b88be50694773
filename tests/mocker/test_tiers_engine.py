"""KVBM lower tiers wired into the vLLM core and the aggregated fleet: offload of evicted G1 blocks, onboarding
at admission (hand-computed TTFT), G3 shared between workers, conservation under random workloads, bad input."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from math import inf

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import mocker
from dynoplan.errors import ConfigError
from dynoplan.settings import build
from mocker.config import EngineConfig
from mocker.engine import make_engine
from mocker.fleet import Fleet, FleetConfig, run_replay
from mocker.kv.tiers import TierConfig
from mocker.records import TraceRequest
from mocker.report import build_report

# One engine block = one trace hash id = 16 tokens; 16 tokens x 15625 B/token = 250 kB per block, so 4 blocks
# = 1 MB = 1 ms at 1 GB/s (docs/architecture.md "KVBM tiers": 1 MB at 1 GB/s takes 1 ms).
BASE = dict(
    g1_backend="kvbm",
    num_gpu_blocks=8,
    block_size=16,
    trace_block_size=16,
    offload_batch_size=4,
    kv_bytes_per_token=15625,
    bw_g1_g2_gbps=1.0,
    bw_g2_g1_gbps=1.0,
    bw_g2_g3_gbps=1.0,
    bw_g3_g2_gbps=1.0,
)
# Polynomial prefill (docs/architecture.md "Polynomial timing baseline"), rounded to ns:
# T = 16 new tokens -> 4.209989e-07*16^2 + 1.518344e-02*16 + 16.50142 = 16.744462815 -> 16.744463 ms;
# T = 80 -> 17.718789593 -> 17.71879 ms.
PREFILL_16_MS = 16.744463
PREFILL_80_MS = 17.71879

A = TraceRequest(0, 0.0, 64, 1, (1, 2, 3, 4))  # 4 full blocks, cached in G1 after it finishes
C = TraceRequest(1, 1000.0, 128, 1, tuple(range(10, 18)))  # 8 blocks: evicts A's 4 -> offloaded to G2
B = TraceRequest(2, 2000.0, 80, 1, (1, 2, 3, 4, 5))  # A's prefix + 1 block: onboards A's 4 blocks


def _run_core(cfg: EngineConfig, reqs):
    core = make_engine(cfg)
    recs = []
    for q in reqs:
        core.advance_until(q.arrival_ms)
        recs.append(core.add_request(q, q.arrival_ms))
        core.check_invariants()
    core.advance_until(inf)
    core.check_invariants()
    core.finalize()
    return core, recs


def test_onboard_from_g2_waits_bytes_over_bandwidth_and_skips_that_prefill():
    core, (ra, rc, rb) = _run_core(EngineConfig(**BASE, num_g2_blocks=16), [A, C, B])
    # B: no G1 hit; A's 4 blocks in G2 -> onboarded: 4 x 250 kB = 1 MB over G2->G1 at 1 GB/s = 1 ms; then one
    # prefill pass computing the remaining 16 tokens (prefix 64 onboarded, not charged)
    assert rb.first_token_ms - rb.arrival_ms == pytest.approx(1.0 + PREFILL_16_MS, abs=1e-9)
    assert rb.admit_ms == B.arrival_ms and rb.cached_tokens == 0 and rb.status == "finished"
    h = core.tiers
    assert h.onboarded_blocks == {"G2": 4, "G3": 0, "G4": 0} and h.onboard_tickets == 1
    # offloads: A's 4 blocks (evicted by C), C's 4 evicted by B's onboarding blocks (2 batches of 4 sent);
    # B's 5th block evicts one more, still queued (batch not full)
    assert h.offloaded_blocks == 8 and len(h._pending_offload[0]) == 1
    assert core.kv.private_in_use == 0 and not core.kv.active and core.kv.available() == 8
    # without lower tiers B recomputes its whole prompt
    _, (_, _, rb0) = _run_core(EngineConfig(**BASE), [A, C, B])
    assert rb0.first_token_ms - rb0.arrival_ms == pytest.approx(PREFILL_80_MS, abs=1e-9)
    # the other requests never touch a lower tier: identical records
    _, (ra0, rc0, _) = _run_core(EngineConfig(**BASE), [A, C, B])
    assert (ra.token_times_ms, rc.token_times_ms) == (ra0.token_times_ms, rc0.token_times_ms)


def test_live_step_driver_idles_until_the_ticket_then_same_timeline():
    core = make_engine(EngineConfig(**BASE, num_g2_blocks=16))
    recs, pending, now = [], [A, C, B], 0.0
    while pending or core.has_work():
        if pending and (not core.has_work() or pending[0].arrival_ms <= core.next_pass_ms):
            q = pending.pop(0)
            now = max(now, q.arrival_ms)
            recs.append(core.add_request(q, q.arrival_ms))
            continue
        out = core.step(core.next_pass_ms)
        core.check_invariants()
        if not out.emissions and not out.admitted and out.end_ms > out.start_ms:
            assert out.start_ms == B.arrival_ms and out.end_ms == pytest.approx(B.arrival_ms + 1.0)  # idle wait
    rb = recs[2]
    assert rb.first_token_ms - rb.arrival_ms == pytest.approx(1.0 + PREFILL_16_MS, abs=1e-9)


def test_replay_report_counts_tiers_and_keeps_existing_keys():
    eng = EngineConfig(**BASE, num_g2_blocks=16)
    res = run_replay([A, C, B], eng, FleetConfig(num_workers=1))
    rep = build_report(res)
    assert rep["kvbm_onboarded_blocks_g2"] == 4 and rep["kvbm_onboarded_tokens"] == 64
    assert rep["kvbm_offloaded_blocks"] == 8 and rep["kvbm_onboard_requests"] == 1
    assert rep["kvbm_onboarded_blocks_g3"] == rep["kvbm_onboarded_blocks_g4"] == rep["kvbm_spilled_blocks_g3"] == 0
    rb = res.records[2]
    assert rb.first_token_ms - rb.arrival_ms == pytest.approx(1.0 + PREFILL_16_MS, abs=1e-9)
    base = build_report(run_replay([A, C, B], EngineConfig(**BASE), FleetConfig(num_workers=1)))
    assert not any(k.startswith("kvbm") for k in base)
    assert [k for k in rep if not k.startswith("kvbm")] == list(base)  # same keys, same order; kvbm_* appended


@pytest.mark.parametrize("g3, g4, tier", [(16, False, "g3"), (4, True, "g4")])
def test_g3_is_shared_worker_1_reuses_worker_0_prefix(g3, g4, tier):
    def trace():
        fill = lambda i, base: TraceRequest(i, 1000.0 * i, 64, 1, tuple(range(base, base + 4)))  # noqa: E731
        return [
            dataclasses.replace(A, request_id=0),
            fill(1, 100),
            dataclasses.replace(C, request_id=2, arrival_ms=2000.0),
            fill(3, 200),
            TraceRequest(4, 4000.0, 128, 1, tuple(range(20, 28))),
            dataclasses.replace(B, request_id=5, arrival_ms=5000.0),
        ]

    # worker 0 (even requests): A cached; C evicts A -> A in w0's G2; E evicts C's 8 -> G2 (4 blocks) overflows:
    # A's 4 (then C's first 4) spill G2 -> G3. B goes to worker 1: nothing in its G1/G2, A's 4 blocks in G3
    # -> staged G3->G2 (1 MB at 1 GB/s = 1 ms), then G2->G1 (1 ms): TTFT = 2 ms + prefill of 16 tokens.
    # With a 4-block G3 and G4 on, C's spilled blocks push A's out of G3 into G4 (G3->G4, 1 GB/s default):
    # B stages them G4->G2 (1 ms at the 1 GB/s default) instead; same total.
    res = run_replay(
        trace(), EngineConfig(**BASE, num_g2_blocks=4, num_g3_blocks=g3, g4=g4), FleetConfig(num_workers=2)
    )
    assert [r.worker_id for r in res.records] == [0, 1, 0, 1, 0, 1]
    rb = res.records[5]
    assert rb.first_token_ms - rb.arrival_ms == pytest.approx(2.0 + PREFILL_16_MS, abs=1e-9)
    assert res.kvbm[f"kvbm_onboarded_blocks_{tier}"] == 4
    # spills to G3: A's 4 + C's 4 from worker 0; at B's staging, worker 1's G2 (4 blocks) also receives the 4
    # filler blocks B's onboarding evicted, pushing A's staged blocks out again (sent to G3 unless already
    # there). With the 4-block G3: A's 4 go on to G4 when C's arrive, then C's 4 when A's come back.
    assert res.kvbm["kvbm_spilled_blocks_g3"] == (12 if g4 else 8)
    assert res.kvbm["kvbm_spilled_blocks_g4"] == (8 if g4 else 0)
    # G2 only (per worker): worker 1 cannot see worker 0's host memory -> B recomputes
    res2 = run_replay(trace(), EngineConfig(**BASE, num_g2_blocks=4), FleetConfig(num_workers=2))
    rb2 = res2.records[5]
    assert rb2.first_token_ms - rb2.arrival_ms == pytest.approx(PREFILL_80_MS, abs=1e-9)
    assert res2.kvbm["kvbm_onboarded_tokens"] == 0


def test_cancel_while_onboarding_frees_its_blocks():
    fl = Fleet({"agg": EngineConfig(**BASE, num_g2_blocks=16)})
    fl.add_worker("agg", 0.0)
    recs = [fl.submit(q, q.arrival_ms) for q in (A, C)]
    rb = fl.submit(B, B.arrival_ms)
    fl.advance_until(B.arrival_ms + 0.5)  # B holds 4 private blocks, its ticket lands at +1 ms
    core = fl.cores("agg")[0]
    assert len(core._onboarding) == 1 and core.kv.private_in_use == 4
    assert fl.cancel(rb, B.arrival_ms + 0.5)
    core.check_invariants()
    assert core.kv.private_in_use == 0 and rb.status == "cancelled" and not core.has_work()
    fl.finish()
    assert [r.status for r in recs] == ["finished", "finished"]
    core.check_invariants()


def test_tier_config_defaults_come_from_engine_config():
    eng = EngineConfig()
    tc = TierConfig(bytes_per_block=1)
    for f in dataclasses.fields(TierConfig):
        if f.name != "bytes_per_block":
            assert getattr(tc, f.name) == getattr(eng, f.name), f.name
    tc2 = TierConfig.from_engine(EngineConfig(**BASE, num_g2_blocks=5, num_g3_blocks=7, bw_g3_g4_gbps=0.25))
    assert (tc2.bytes_per_block, tc2.num_g2_blocks, tc2.num_g3_blocks, tc2.bw_g3_g4_gbps) == (16 * 15625, 5, 7, 0.25)
    with pytest.raises(ConfigError, match=r"offload_batch_size=0: expected > 0"):
        build(TierConfig, {"bytes_per_block": 1, "offload_batch_size": 0})


@pytest.mark.parametrize(
    "flags, msg",
    [
        (["--num-g3-blocks", "5"], 'g1_backend="native": lower KV tiers configured (num_g3_blocks=5)'),
        (["--g1-backend", "kvbm", "--num-g2-blocks", "8"], "kv_bytes_per_token=null: KVBM tier transfers"),
        (
            ["--g1-backend", "kvbm", "--num-g3-blocks", "8", "--kv-bytes-per-token", "100"],
            "num_g2_blocks=0: G3/G4 hits stage through G2",
        ),
        (
            [
                "--g1-backend",
                "kvbm",
                "--num-g2-blocks",
                "8",
                "--kv-bytes-per-token",
                "100",
                "--prefill-workers",
                "1",
                "--decode-workers",
                "1",
            ],
            "num_g2_blocks=8: KVBM lower tiers are wired into aggregated fleets only",
        ),
        (
            ["--engine", "sglang", "--g1-backend", "kvbm", "--num-g2-blocks", "8", "--kv-bytes-per-token", "100"],
            'g1_backend="kvbm": modelled for the vllm and trtllm block pools',
        ),
        (
            ["--engine", "trtllm", "--g1-backend", "kvbm", "--num-g2-blocks", "8", "--kv-bytes-per-token", "100"],
            'engine="trtllm" with lower KV tiers (num_g2_blocks=8): onboarding is wired into the vLLM core only',
        ),
        (["--kv-bytes-per-token", "100"], "--kv-bytes-per-token 100: only for a disaggregated fleet or KVBM"),
        (
            ["--g1-backend", "kvbm", "--num-g2-blocks", "8", "--kv-bytes-per-token", "100", "--model-config", "x.json"],
            "--kv-bytes-per-token and --model-config: give one of them, not both",
        ),
        (
            ["--workers", "3", "--prefill-workers", "2", "--decode-workers", "2"],
            "--workers=3 with --prefill-workers/--decode-workers: give the aggregated or the disaggregated fleet",
        ),
    ],
)
def test_cli_tier_errors_are_one_line(tmp_path, capsys, flags, msg):
    from planner.cli import main

    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 64, "output_length": 2, "hash_ids": [1]}\n')
    assert main(["replay", "--trace", str(trace), "--quiet", *flags]) == 2
    err = capsys.readouterr().err
    assert msg in err and len(err.strip().splitlines()) == 1


def test_cli_tiers_run_and_report_keys(tmp_path):
    import json

    from planner.cli import main

    trace = tmp_path / "t.jsonl"
    trace.write_text(
        "".join(
            f'{{"timestamp": {t:.0f}, "input_length": {q.input_length}, "output_length": 1, '
            f'"hash_ids": {list(q.hash_ids)}}}\n'
            for t, q in ((q.arrival_ms, q) for q in (A, C, B))
        )
    )
    out = tmp_path / "r.json"
    assert main(
        [
            "replay",
            "--trace",
            str(trace),
            "--quiet",
            "--g1-backend",
            "kvbm",
            "--num-gpu-blocks",
            "8",
            "--block-size",
            "16",
            "--trace-block-size",
            "16",
            "--num-g2-blocks",
            "16",
            "--offload-batch-size",
            "4",
            "--kv-bytes-per-token",
            "15625",
            "--tier-bandwidth",
            "g2_g1=1",
            "--tier-bandwidth",
            "g1_g2=1",
            "--report-json",
            str(out),
        ]
    ) in (0, None)
    rep = json.loads(out.read_text())
    assert rep["kvbm_onboarded_blocks_g2"] == 4 and rep["kvbm_offloaded_blocks"] == 8


# ------------------------------------------------------------------------------------------ properties
@st.composite
def workloads(draw):
    n = draw(st.integers(1, 40))
    t = 0.0
    reqs = []
    for i in range(n):
        t += draw(st.sampled_from([0.0, 0.5, 3.0, 20.0, 200.0]))
        nb = draw(st.integers(1, 10))
        root = draw(st.integers(0, 3))  # few roots: prompts share prefixes
        ids = [root] + [draw(st.integers(0, 2)) * 10 + j for j in range(1, nb)]
        isl = 16 * (nb - 1) + draw(st.integers(1, 16))  # partial last block sometimes
        reqs.append(TraceRequest(i, t, isl, draw(st.integers(1, 6)), tuple(ids)))
    return reqs


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    workloads(),
    st.integers(1, 3),
    st.integers(12, 30),
    st.integers(1, 16),
    st.integers(0, 12),
    st.booleans(),
    st.integers(1, 4),
    st.sampled_from([0.0, 0.25, 1.0, 25.0]),
    st.sampled_from([0.5, 1.0, 5.0]),
    st.booleans(),
)
def test_random_workloads_with_tiers_conserve_blocks_and_finish(
    reqs, workers, g1, g2, g3, g4, batch, bw_on, bw_disk, exact
):
    eng = EngineConfig(
        **{
            **BASE,
            "num_gpu_blocks": g1,
            "offload_batch_size": batch,
            "bw_g2_g1_gbps": bw_on,
            "bw_g3_g2_gbps": bw_disk,
            "bw_g2_g3_gbps": bw_disk,
        },
        num_g2_blocks=g2,
        num_g3_blocks=g3,
        g4=g4 and g2 > 0,
        bw_g4_g2_gbps=0.5,
        max_num_seqs=4,
        max_num_batched_tokens=64,
    )
    fl = Fleet({"agg": eng}, router="kv" if workers > 1 else "round_robin", single_step=exact)
    for _ in range(workers):
        fl.add_worker("agg", 0.0)
    recs = []
    for q in reqs:
        fl.advance_until(q.arrival_ms)
        for c in fl.cores("agg"):
            c.check_invariants()  # G1 conservation incl. onboarding holders; G2/G3 within capacity
        recs.append(fl.submit(q, q.arrival_ms))
    fl.finish()
    h = fl._tiers
    for c in fl.cores("agg"):
        c.check_invariants()
        assert not c.has_work() and c.kv.private_in_use == 0 and not c.kv.active
        assert c.kv.available() == g1
    h.check_invariants()
    for q, r in zip(reqs, recs):
        if r.status == "failed":  # a prompt that can never fit the G1 pool
            assert -(-(q.input_length + 1) // 16) > g1 or -(-q.input_length // 16) > g1
            continue
        assert r.status == "finished" and len(r.token_times_ms) == q.output_length
        assert r.token_times_ms == sorted(r.token_times_ms) and r.first_token_ms >= q.arrival_ms
    st_ = fl.tier_stats()
    assert st_["kvbm_onboarded_tokens"] == 16 * (
        st_["kvbm_onboarded_blocks_g2"] + st_["kvbm_onboarded_blocks_g3"] + st_["kvbm_onboarded_blocks_g4"]
    )
    event(
        f"onboarded from G2 {st_['kvbm_onboarded_blocks_g2'] > 0}, G3 {st_['kvbm_onboarded_blocks_g3'] > 0}, "
        f"G4 {st_['kvbm_onboarded_blocks_g4'] > 0}"
    )
    if not g3:
        assert st_["kvbm_onboarded_blocks_g3"] == 0 and st_["kvbm_spilled_blocks_g3"] == 0


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads(), st.integers(1, 3))
def test_tiers_that_are_never_hit_change_nothing(reqs, workers):
    """A G1 pool that never evicts: the tiered path (one pass at a time, fleet in global time order) gives
    byte-identical records to the same kvbm fleet without lower tiers (fast-forwarded)."""
    eng = EngineConfig(**{**BASE, "num_gpu_blocks": 4096})
    on = run_replay(reqs, eng.replace(num_g2_blocks=8, num_g3_blocks=8), FleetConfig(num_workers=workers, router="kv"))
    off = run_replay(reqs, eng, FleetConfig(num_workers=workers, router="kv"))
    assert on.records == off.records
    assert on.kvbm["kvbm_offloaded_blocks"] == 0 and on.kvbm["kvbm_onboard_requests"] == 0


@pytest.mark.parametrize("bw_onboard_gbps", [1.0, 0.01])  # 1 MB: 1 ms (shorter than a pass) or 100 ms (~6 passes)
def test_decode_stretches_stop_for_an_onboarding_ticket_same_records_as_one_pass_at_a_time(
    monkeypatch, request, bw_onboard_gbps
):
    """D decodes (fast-forwarded stretches) while B's onboarding ticket is in flight on the same core: the
    stretch stops at the next tier event, so B joins at the first pass start after its ticket, exactly as
    when every pass is run alone (D's evictions go G1->G2, a link B's onboarding does not use, and G2 is
    large enough that nothing spills)."""
    from mocker.engine.vllm import VllmCore

    D = TraceRequest(3, 1500.0, 16, 40, (50,))
    B2 = dataclasses.replace(B, request_id=2, arrival_ms=1600.0)
    reqs = [A, C, D, B2]
    eng = EngineConfig(**{**BASE, "bw_g2_g1_gbps": bw_onboard_gbps}, num_g2_blocks=64)
    exact = run_replay(reqs, eng, FleetConfig(num_workers=1, single_step=True))
    stretches = []
    orig = VllmCore._co_stretch

    def counting(self, horizon):
        ran = orig(self, horizon)
        stretches.append((ran, horizon, bool(self._onboarding)))
        return ran

    monkeypatch.setattr(VllmCore, "_co_stretch", counting)
    fast = run_replay(reqs, eng, FleetConfig(num_workers=1))
    assert fast.records == exact.records and fast.kvbm == exact.kvbm
    rb, rd = fast.records[3], fast.records[2]
    assert fast.kvbm["kvbm_onboarded_blocks_g2"] == 4
    assert rd.first_token_ms < rb.arrival_ms < rb.first_token_ms < rd.finish_ms  # B onboarded during D's decode
    assert rb.first_token_ms - rb.admit_ms >= 1.0 / bw_onboard_gbps
    if bw_onboard_gbps < 1:  # stretches ran while the ticket was in flight, bounded by the next tier event
        if mocker.COMPILED:  # a compiled core calls its own methods directly: the spy runs on the sources
            node = f"{__file__}::{request.node.name}"
            env = {**os.environ, "DYNOPLAN_PURE_PYTHON": "1"}
            cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", node]
            run = subprocess.run(cmd, env=env, capture_output=True, text=True)
            assert run.returncode == 0, run.stdout[-2000:]  # 5 if the node were not collected
        else:
            assert any(ran and onb and horizon < inf for ran, horizon, onb in stretches)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads(), st.integers(0, 24), st.integers(0, 24))
def test_dynamic_fleet_with_tiers_adds_and_removes_workers(reqs, add_at, remove_at):
    """Workers added (a new G2 and G1<->G2 links in the shared hierarchy) and removed (drained) mid-run with
    G2/G3 on: every request finishes, blocks are conserved, the removed worker is released empty."""
    eng = EngineConfig(**{**BASE, "num_gpu_blocks": 16}, num_g2_blocks=8, num_g3_blocks=16, max_num_seqs=4)
    fl = Fleet({"agg": eng}, router="kv")
    fl.add_worker("agg", 0.0)
    fl.add_worker("agg", 0.0)
    removed = None
    recs = []
    for i, q in enumerate(reqs):
        if i == add_at:
            fl.add_worker("agg", q.arrival_ms, startup_delay_ms=5.0)
        if i == remove_at and removed is None:
            removed = fl.remove_worker("agg", q.arrival_ms, worker_id=0)
        recs.append(fl.submit(q, q.arrival_ms))
    fl.finish()
    assert fl._tiers is not None and len(fl._tiers.g2) == len(fl.cores("agg"))
    for c in fl.cores("agg"):
        c.check_invariants()
        assert not c.has_work() and c.kv.private_in_use == 0 and not c.kv.active
    assert all(r.status in ("finished", "failed") for r in recs)
    if removed is not None:
        assert fl.worker_ids("agg", "released") == [0]
