"""Disaggregated prefill/decode with the SGLang core: decode-side admission of a prefilled request, the
destination-first coordinated handoff (reserve at arrival, prefill, hold, transfer, activate, release), KV
transfer modes on the radix cache, and every hold / reservation released exactly once (cancel, failure,
hypothesis over random workloads)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dynoplan.errors import ConfigError
from mocker.config import EngineConfig
from mocker.fleet import Fleet, FleetConfig, run_replay
from mocker.fleet.handoff import Phase
from mocker.records import TraceRequest
from mocker.transfer import KvTransferConfig

SG = EngineConfig(engine="sglang")
REF_TRANSFER = KvTransferConfig(64, 131072)
SLOW = KvTransferConfig(bandwidth_gbps=0.001, kv_bytes_per_token=131072)  # 1000 tokens: 131.072 s


def fleet(prefill: EngineConfig = SG, decode: EngineConfig = SG, **kw) -> Fleet:  # type: ignore[no-untyped-def]
    fl = Fleet({"prefill": prefill, "decode": decode}, **kw)
    fl.add_worker("prefill", 0.0)
    fl.add_worker("decode", 0.0)
    return fl


def replay(reqs, transfer=REF_TRANSFER, prefill=1, decode=1, eng=SG):  # type: ignore[no-untyped-def]
    return run_replay(reqs, eng, FleetConfig(num_prefill_workers=prefill, num_decode_workers=decode, transfer=transfer))


def _ns(ms: float) -> float:
    return round(ms * 1e6) / 1e6


# ------------------------------------------------------------------------------------------ hand-computed
@pytest.mark.parametrize("handoff", ["coordinated", "direct"])
def test_single_request_ttft_is_prefill_plus_transfer_plus_one_decode_pass(handoff):
    """One prefill + one decode SGLang worker, ISL 374, OSL 4, 64 GB/s x 131072 B/token. By hand
    (docs/architecture.md "Polynomial timing baseline" polynomials; SGLang page 1, so the pool is 16384 tokens):
      prefill(374) = 4.209989e-07 * 374^2 + 1.518344e-02 * 374 + 16.50142 = 22.238914 ms
      transfer     = 374 * 131072 B / 64e9 B/s = 0.765952 ms  -> decode admission at 23.004866 ms
      decode(374)  = -25.74 p^2 + 54.01 p + 5.74, p = 374 / 16384 -> 6.959482 ms
    TTFT = 22.238914 + 0.765952 + 6.959482 = 29.964348 ms (the first token is emitted by the decode worker at
    the end of its first pass, as for vLLM). The reference replay (--disagg, backend sglang) reports exactly
    29.964348 and the last token at 50.862140; the second request (ISL 1000 at 1000 ms: 32.105859 + 2.048 +
    decode(1000)) 1043.094479 and 1060.985032."""
    prefill = 4.209989e-07 * 374**2 + 1.518344e-02 * 374 + 16.50142
    transfer = 374 * 131072 / 64e9 * 1000.0
    p = 374 / 16384
    decode = -25.74 * p * p + 54.01 * p + 5.74
    assert transfer == pytest.approx(0.765952, abs=1e-12)
    res = replay(
        [TraceRequest(0, 0.0, 374, 4, (1,)), TraceRequest(1, 1000.0, 1000, 3, (2, 3))],
        KvTransferConfig(64, 131072, handoff=handoff),
    )
    a, b = res.records
    assert a.first_token_ms == pytest.approx(_ns(prefill) + transfer + _ns(decode), abs=2e-6)
    assert a.first_token_ms == pytest.approx(29.964348, abs=1e-6)
    assert a.token_times_ms[-1] == pytest.approx(50.862140, abs=1e-6) and len(a.token_times_ms) == 4
    assert b.first_token_ms == pytest.approx(1043.094479, abs=1e-6)
    assert b.finish_ms == pytest.approx(1060.985032, abs=1e-6) and len(b.token_times_ms) == 3
    assert a.status == b.status == "finished" and a.prefill_worker_id == 0 and a.worker_id == 0
    assert a.admit_ms == 0.0


def test_busy_destination_reserves_one_request_per_pass_boundary():
    """Reference facts (reference-replay --disagg, backend sglang, 1P + 1D, 64 GB/s): a 2000-token request
    decodes alone; three 91-token requests arrive together at 500 ms. The busy destination reserves them at
    three successive pass ends (508.774, 520.834, 532.897 ms) and each prefill starts only once reserved, so
    their first tokens are at 545.2263, 557.8235, 583.0350 ms (finishes 570.4292, 583.0350, 607.7285). Three
    more arrive together at 5200 ms at an idle destination: all reserved at once, identical timelines."""
    ids = [(1, 2, 3, 4), (10,), (11,), (12,), (13,), (14,), (15,)]
    arr = [0.0, 500.0, 500.0, 500.0, 5200.0, 5200.0, 5200.0]
    isl = [2000, 91, 91, 91, 91, 91, 91]
    osl = [400, 3, 3, 3, 3, 3, 3]
    res = replay([TraceRequest(i, arr[i], isl[i], osl[i], ids[i]) for i in range(7)])
    r = res.records
    assert r[0].first_token_ms == pytest.approx(64.5978, abs=1e-4)
    assert r[0].finish_ms == pytest.approx(5065.2417, abs=1e-4)
    assert sorted(x.first_token_ms for x in r[1:4]) == pytest.approx([545.2263, 557.8235, 583.0350], abs=1e-4)
    assert sorted(x.finish_ms for x in r[1:4]) == pytest.approx([570.4292, 583.0350, 607.7285], abs=1e-4)
    for x in r[4:]:
        assert x.first_token_ms == pytest.approx(5227.4970, abs=1e-4)
        assert x.finish_ms == pytest.approx(5240.7918, abs=1e-4)


@pytest.mark.parametrize("handoff", ["coordinated", "direct"])
def test_destination_missing_charges_only_tokens_the_destination_radix_cache_lacks(handoff):
    """Request 0 (1088 tokens, hash ids 1, 2, 3) leaves its sequence in the decode worker's radix tree. Then
    request 1 (1024 tokens, ids 1, 2) finds all of its prompt there: destination_missing charges nothing,
    full_prompt 1024 x 131072 / 64e9 s = 2.097152 ms; request 2 (1024 tokens, ids 1, 9) shares 512 tokens:
    charged 512 -> 1.048576 ms more than with no transfer delay at all."""
    reqs = [
        TraceRequest(0, 0.0, 1088, 2, (1, 2, 3)),
        TraceRequest(1, 5000.0, 1024, 2, (1, 2)),
        TraceRequest(2, 10000.0, 1024, 2, (1, 9)),
    ]
    out = {}
    for mode in ("full_prompt", "destination_missing"):
        out[mode] = replay(reqs, KvTransferConfig(64, 131072, timing=mode, handoff=handoff)).records
    free = replay(reqs, KvTransferConfig(0.0, 131072, handoff=handoff)).records
    full, miss = out["full_prompt"], out["destination_missing"]
    assert full[0].token_times_ms == miss[0].token_times_ms  # nothing cached on the destination yet
    assert full[1].first_token_ms - miss[1].first_token_ms == pytest.approx(2.097152, abs=1e-6)
    assert miss[1].first_token_ms == pytest.approx(free[1].first_token_ms, abs=1e-9)
    assert miss[2].first_token_ms - free[2].first_token_ms == pytest.approx(1.048576, abs=1e-6)
    assert full[2].first_token_ms - free[2].first_token_ms == pytest.approx(2.097152, abs=1e-6)


# ------------------------------------------------------------------------------------------ holds
def _pools(fl: Fleet) -> list:  # type: ignore[type-arg]
    return fl.cores("prefill") + fl.cores("decode")


def test_destination_reserves_before_the_prefill_and_the_source_holds_after_it():
    fl = fleet(transfer=SLOW)
    rec = fl.submit(TraceRequest(7, 0.0, 1000, 3, (1, 2)), 0.0)
    (src,), (dst,) = fl.cores("prefill"), fl.cores("decode")
    fl.advance_until(1.0)  # prefill running (32.1 ms); the idle destination reserved at arrival
    # the reservation: the prompt's page-rounded footprint (page 1: 1000 tokens), nothing cached there yet
    assert fl.holds_taken == 1 and [r.allocated for r in dst.reserved.values()] == [1000]
    assert dst.kv.private == 1000 and src.external_tokens == 0
    fl.advance_until(100.0)  # prefill done at 32.1 ms: the source holds its prompt; transfer until 131 s
    assert fl.holds_taken == 2 and fl.holds_released == 0
    # the prompt's 1000 tokens are in the source's radix tree (stored by the finished prefill): locked, no
    # private slot needed
    assert src.external_locks == 1 and src.external_tokens == 0 and src.kv.protected_size == 1000
    assert dst.kv.private == 1000
    for c in _pools(fl):
        c.check_invariants()
    fl.finish()
    assert rec.status == "finished" and len(rec.token_times_ms) == 3 and rec.first_token_ms > 131072.0
    assert fl.holds_released == 2
    for c in _pools(fl):
        c.check_invariants()
        assert c.external_tokens == c.external_locks == 0 and c.kv.private == 0 and c.kv.protected_size == 0


PHASES = {
    2001.0: Phase.RESERVING,
    2005.0: Phase.RESERVING,
    2010.0: Phase.PREFILL,
    2020.0: Phase.PREFILL,
    2070.0: Phase.TRANSFER,
    100_000.0: Phase.TRANSFER,
    150_000.0: Phase.DECODE,
}
"""cancel time (ms) -> the cancelled request's fleet phase then: waiting for its reservation, prefilling
(reservation live), transferring (reservation + source hold live), decoding (both released)."""


@pytest.mark.parametrize("cancel_at", list(PHASES))
def test_cancel_releases_every_hold_exactly_once(cancel_at):
    """A busy destination (a 10-token prompt decoding 20000 tokens) and a slow link (1000 tokens: 131 s).
    Three requests arrive together at 2000 ms; the 1000-token one is cancelled in each phase."""
    fl = fleet(transfer=SLOW)
    fl.submit(TraceRequest(0, 0.0, 10, 20000, None), 0.0)
    fl.advance_until(1500.0)
    others = [fl.submit(TraceRequest(1, 2000.0, 91, 3, None), 2000.0)]
    rec = fl.submit(TraceRequest(2, 2000.0, 1000, 5000, None), 2000.0)
    others.append(fl.submit(TraceRequest(3, 2000.0, 91, 3, None), 2000.0))
    at = cancel_at
    fl.advance_until(at)
    flight = fl._where[2]
    assert PHASES[cancel_at] == flight.phase
    live = (flight.hold is not None) + (flight.reserve is not None)
    released = fl.holds_released
    assert fl.cancel(rec, at) is True
    assert fl.holds_released == released + live  # its own holds, once
    assert fl.cancel(rec, at) is False
    assert fl.holds_released == released + live
    assert rec.status == "cancelled" and rec.finish_ms == at
    fl.finish()
    assert rec.status == "cancelled"
    assert fl.holds_taken == fl.holds_released
    assert all(o.status == "finished" for o in others)
    for c in _pools(fl):
        c.check_invariants()
        assert not c.has_work() and c.external_tokens == c.external_locks == 0 and c.kv.private == 0


def test_decode_side_failure_releases_holds_and_fails_the_request():
    """A prompt that fits the prefill worker but can never fit the decode worker (300 tokens): its reservation
    fails at once (before any prefill); the other request takes and releases its reservation and hold."""
    fl = fleet(decode=EngineConfig(engine="sglang", num_gpu_blocks=300), transfer=REF_TRANSFER)
    bad = fl.submit(TraceRequest(0, 0.0, 2000, 5, None), 0.0)
    ok = fl.submit(TraceRequest(1, 1.0, 100, 5, None), 1.0)
    fl.finish()
    assert bad.status == "failed" and bad.first_token_ms is None and bad.prefill_worker_id is None
    assert bad.finish_ms == 0.0
    assert ok.status == "finished" and len(ok.token_times_ms) == 5
    assert fl.holds_taken == fl.holds_released == 2
    for c in _pools(fl):
        c.check_invariants()
        assert c.kv.private == 0 and c.external_tokens == 0


def test_mixed_engine_families_are_refused():
    with pytest.raises(ConfigError, match="same KV layout"):
        Fleet({"prefill": SG, "decode": EngineConfig()})


def test_cli_sglang_disaggregated_replay(tmp_path):
    import json

    from planner.cli import main

    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 374, "output_length": 4, "hash_ids": [1]}\n')
    out = tmp_path / "r.json"
    rc = main(
        [
            "replay",
            "--trace",
            str(trace),
            "--engine",
            "sglang",
            "--prefill-workers",
            "1",
            "--decode-workers",
            "1",
            "--kv-transfer-bandwidth",
            "64",
            "--kv-bytes-per-token",
            "131072",
            "--kv-transfer-timing",
            "destination_missing",
            "--quiet",
            "--report-json",
            str(out),
        ]
    )
    assert rc in (0, None)
    assert json.loads(out.read_text())["mean_ttft_ms"] == pytest.approx(29.964348, abs=1e-6)


# ------------------------------------------------------------------------------------------ properties
@st.composite
def scenarios(draw):
    n = draw(st.integers(1, 12))
    reqs, t = [], 0.0
    for i in range(n):
        t += draw(st.sampled_from([0.0, 0.5, 5.0, 40.0, 300.0]))
        isl = draw(st.integers(1, 1400))
        fam = draw(st.integers(0, 2))
        ids = tuple([fam] + [draw(st.integers(0, 2)) * 100 + i for _ in range(-(-isl // 512) - 1)])
        reqs.append(TraceRequest(i, t, isl, draw(st.integers(1, 60)), ids if draw(st.booleans()) else None))
    # cancel request i some time after its arrival: while queued / reserving, prefilling, transferring, decoding
    cancels = [
        (i, reqs[i].arrival_ms + dt)
        for i, dt in draw(
            st.lists(
                st.tuples(
                    st.integers(0, n - 1),
                    st.sampled_from([0.0, 2.0, 10.0, 25.0, 40.0, 80.0, 400.0]) | st.floats(0.0, 3000.0),
                ),
                max_size=4,
            )
        )
    ]
    return reqs, cancels


@settings(max_examples=70, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    scn=scenarios(),
    p_tokens=st.sampled_from([1500, 2500, 16384]),
    d_tokens=st.sampled_from([1500, 2500, 16384]),
    page=st.sampled_from([1, 4]),
    handoff=st.sampled_from(["coordinated", "direct"]),
    timing=st.sampled_from(["full_prompt", "destination_missing"]),
    bw=st.sampled_from([0.0, 0.5, 64.0]),
    workers=st.sampled_from([(1, 1), (2, 1), (1, 2)]),
)
def test_random_workloads_end_and_conserve_tokens(scn, p_tokens, d_tokens, page, handoff, timing, bw, workers):
    """Every request ends (finished, failed or cancelled), every hold and reservation is released exactly once,
    and both sides' token pools are conserved and empty of holds at the end (cancellations at random times)."""
    reqs, cancels = scn
    pe = EngineConfig(engine="sglang", num_gpu_blocks=p_tokens // page, block_size=page, max_num_seqs=4)
    de = EngineConfig(engine="sglang", num_gpu_blocks=d_tokens // page, block_size=page, max_num_seqs=4)
    fl = Fleet({"prefill": pe, "decode": de}, transfer=KvTransferConfig(bw, 131072, timing=timing, handoff=handoff))  # type: ignore[arg-type]
    for _ in range(workers[0]):
        fl.add_worker("prefill", 0.0)
    for _ in range(workers[1]):
        fl.add_worker("decode", 0.0)
    events = sorted([(q.arrival_ms, 0, i) for i, q in enumerate(reqs)] + [(t, 1, i) for i, t in cancels])
    recs: dict[int, object] = {}
    for t, kind, i in events:
        if kind == 0:
            recs[i] = fl.submit(reqs[i], t)
        elif i in recs:
            fl.cancel(recs[i], t)  # type: ignore[arg-type]
            for c in _pools(fl):
                c.check_invariants()
    fl.finish()
    assert all(r.status in ("finished", "failed", "cancelled") for r in fl.records)
    for r in fl.records:
        if r.status == "finished":
            assert len(r.token_times_ms) == r.output_length
            assert r.token_times_ms == sorted(r.token_times_ms) and r.first_token_ms == r.token_times_ms[0]
    assert fl.holds_taken == fl.holds_released
    if handoff == "coordinated":
        assert fl.holds_taken >= 2 * sum(r.status == "finished" for r in fl.records)
    for c in _pools(fl):
        c.check_invariants()
        kv = c.kv
        assert kv.free + kv.evictable_size + kv.protected_size + kv.private == kv.total_tokens
        assert kv.private == 0 and kv.protected_size == 0 and c.external_tokens == c.external_locks == 0
        assert not c.has_work()


def test_held_waiting_queue_is_not_admitted_and_does_not_spin():
    """A decode core's waiting queue (retracted requests) is held while reservations wait for the core: no
    pass runs for it (no zero-length passes either), and it is admitted once released."""
    from mocker.engine.sglang import SglangCore

    c = SglangCore(SG)
    c.hold_waiting = True
    rec = c.add_request(TraceRequest(0, 0.0, 100, 3, None), 0.0)
    c.advance_until(1000.0)
    assert c.pass_index == 0 and c.num_waiting == 1 and c.has_work() and rec.admit_ms is None
    c.hold_waiting = False
    c.next_pass_ms = 1000.0
    c.advance_until(2000.0)
    assert not c.has_work() and rec.status == "finished" and rec.admit_ms == 1000.0 and len(rec.token_times_ms) == 0
    c.finalize()
    assert len(rec.token_times_ms) == 3 and rec.token_times_ms[0] > 1000.0


def test_reference_azure_prefix_matches_request_by_request():
    """The first 80 requests of the Azure trace (2 prefill + 2 decode SGLang workers, 64 GB/s) reproduce the
    reference replay's first-token times exactly (reference-replay --disagg, backend sglang): spot values."""
    from pathlib import Path

    from mocker.traces import load_trace

    trace = Path(__file__).resolve().parents[2] / "examples" / "traces" / "azure_llm_conv_2023.csv"
    reqs = load_trace(trace)[:80]
    res = replay(reqs, prefill=2, decode=2)
    # (index, first token ms, finish ms) from the reference's per-request records
    for i, first, fin in [(61, 31670.518, 38273.125), (63, 31964.925, 33120.826), (71, 33888.666, 36560.146)]:
        assert res.records[i].first_token_ms == pytest.approx(first, abs=1e-3)
        assert res.records[i].finish_ms == pytest.approx(fin, abs=1e-3)
