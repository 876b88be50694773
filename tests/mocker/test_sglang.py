"""SGLang core: reference timing facts, admission budget with new_token_ratio, lpm order, retraction choice and
prefix preservation, radix LRU eviction of unlocked leaves only, chunked prefill, fleet/CLI wiring."""

from __future__ import annotations

import pytest

from dynoplan.errors import ConfigError, SimulationError
from mocker.config import EngineConfig, SGLangConfig
from mocker.engine import CORES, make_engine
from mocker.engine.sglang import SglangCore
from mocker.fleet import FleetConfig, run_replay
from mocker.kv.radix import RadixCache, SeqContent
from mocker.records import TraceRequest
from mocker.request import State

SG_TOTAL = 16384  # default SGLang pool: 16384 pages of 1 token


def pre(t: int) -> float:
    """The polynomial prefill of docs/architecture.md "Polynomial timing baseline";, written out by hand."""
    return 4.209989e-07 * t * t + 1.518344e-02 * t + 16.50142


def dec(active_tokens: int, total: int = SG_TOTAL) -> float:
    p = active_tokens / total
    return max(1.0, -25.74 * p * p + 54.01 * p + 5.74)


def cfg(**kw) -> EngineConfig:
    sg = kw.pop("sglang", {})
    return EngineConfig(engine="sglang", sglang=SGLangConfig(**sg), **kw)


def req(i, t, isl, osl, hashes=None):
    if hashes is None:
        hashes = tuple(range(1000 * (i + 1), 1000 * (i + 1) + -(-isl // 512)))
    return TraceRequest(i, float(t), isl, osl, hashes)


def run(core: SglangCore, reqs: list[TraceRequest]):
    recs = {}
    for r in sorted(reqs, key=lambda r: r.arrival_ms):
        core.advance_until(r.arrival_ms)
        recs[r.request_id] = core.add_request(r, r.arrival_ms)
        core.check_invariants()
    core.advance_until(float("inf"))
    core.check_invariants()
    core.finalize()
    return recs


# ---------------------------------------------------------------------------------------------- wiring
def test_registered_and_built_by_make_engine():
    assert CORES["sglang"] is SglangCore
    core = make_engine(cfg())
    assert isinstance(core, SglangCore)
    assert (
        core.page == 1 and core.total_kv_tokens == SG_TOTAL
    )  # page size 1 by default (docs/architecture.md "Engine defaults")
    assert make_engine(cfg(block_size=16)).page == 16


def test_bad_policy_is_a_config_error_naming_the_field():
    with pytest.raises(ConfigError, match=r"sglang.schedule_policy=\"sjf\": expected one of 'fifo' or 'lpm'"):
        EngineConfig.from_mapping({"engine": "sglang", "sglang": {"schedule_policy": "sjf"}})


# ---------------------------------------------------------------------------------------------- timing facts
def test_reference_fact_isl_374_alone():
    """Reference replay (sglang, Azure request 0): TTFT 22.238914, TTST 6.962706, E2E 324.544643 ms."""
    r = run(SglangCore(cfg()), [req(0, 0, 374, 44)])[0]
    assert r.ttft_ms == pytest.approx(22.238914, abs=1e-6)
    assert r.token_times_ms[1] - r.token_times_ms[0] == pytest.approx(6.962706, abs=1e-6)
    assert r.token_times_ms[1] - r.token_times_ms[0] == pytest.approx(dec(375), abs=1e-6)
    assert r.e2e_ms == pytest.approx(324.544643, abs=1e-5)
    assert len(r.token_times_ms) == 44 and r.status == "finished"


def test_extend_pass_runs_before_decode_and_running_requests_wait():
    """A arrives alone; B arrives while A decodes: B's prefill pass carries no decode for A."""
    core = SglangCore(cfg())
    a = core.add_request(req(0, 0, 374, 10), 0.0)
    out1 = core.step(0.0)  # A's extend pass
    assert out1.end_ms == pytest.approx(pre(374), abs=1e-6)
    core.add_request(req(1, out1.end_ms, 500, 5), out1.end_ms)
    out2 = core.step(out1.end_ms)  # B admitted: extend pass, A gets no token
    assert out2.admitted == [1] and [rid for rid, _ in out2.emissions] == [1]
    assert out2.end_ms - out2.start_ms == pytest.approx(pre(500), abs=1e-6)
    out3 = core.step(out2.end_ms)  # decode pass: both, context 375 + 501
    assert sorted(rid for rid, _ in out3.emissions) == [0, 1]
    assert out3.end_ms - out3.start_ms == pytest.approx(dec(375 + 501), abs=1e-6)
    assert a.first_token_ms == out1.end_ms


# ---------------------------------------------------------------------------------------------- admission budget
@pytest.mark.parametrize(
    "osl_b,conservativeness,admitted", [(300, 1.0, True), (349, 1.0, True), (350, 1.0, False), (300, 2.0, False)]
)
def test_admission_budget_uses_new_token_ratio(osl_b, conservativeness, admitted):
    """Pool 1000 tokens. Pass 1 (extend): A (100 prompt, 500 out) prefills and holds 101 slots; an extend pass
    leaves new_token_ratio at 0.7c. Pass 2 budget: rem_total = free 899 - min(499, 4096) * 0.7c; B needs
    prompt 200 + min(osl_b, 4096) < rem_total (c=1: 549.7)."""
    core = SglangCore(cfg(num_gpu_blocks=1000, sglang={"schedule_conservativeness": conservativeness}))
    core.add_request(req(0, 0, 100, 500), 0.0)
    o1 = core.step(0.0)
    ratio = 0.7 * conservativeness
    assert core.new_token_ratio == ratio
    assert core.kv.free == 899
    rem_total = 899 - 499 * ratio
    core.add_request(req(1, o1.end_ms, 200, osl_b), o1.end_ms)
    o2 = core.step(o1.end_ms)
    assert (200 + osl_b < rem_total) is admitted
    assert (o2.admitted == [1]) is admitted


def test_new_token_ratio_decays_linearly_to_floor():
    core = SglangCore(cfg())
    core.add_request(req(0, 0, 10, 700), 0.0)
    for _ in range(650):  # 1 extend pass + 649 decode passes
        core.step(core.next_pass_ms)
    assert core.new_token_ratio == pytest.approx(0.7 * 0.14, rel=1e-9)  # floor reached after 600 decodes
    core2 = SglangCore(cfg())
    core2.add_request(req(0, 0, 10, 700), 0.0)
    for _ in range(300):
        core2.step(core2.next_pass_ms)
    assert core2.new_token_ratio == pytest.approx(0.7 - 299 * (0.7 - 0.098) / 600, rel=1e-9)


def test_clip_max_new_tokens_caps_the_reserve():
    """A's 10000-token output reserves only clip 4096 * ratio; B (prompt 100, out 10) fits in 16384 - ..."""
    core = SglangCore(cfg())
    core.add_request(req(0, 0, 100, 10000), 0.0)
    o1 = core.step(0.0)
    ratio = core.new_token_ratio
    rem_total = (SG_TOTAL - 101) - 4096 * ratio
    core.add_request(req(1, o1.end_ms, 100, 10), o1.end_ms)
    assert rem_total > 110
    assert core.step(o1.end_ms).admitted == [1]


# ---------------------------------------------------------------------------------------------- policies
def _warm_then_queue(policy: str) -> list[int]:
    """Cache hash ids [1, 2] (1024 tokens), then queue P (no overlap), Q ([1,2,3]: 1024 cached),
    R ([1]: 512 cached) at once; return the admission order."""
    core = SglangCore(cfg(sglang={"schedule_policy": policy}))
    run(core, [req(0, 0, 1024, 1, (1, 2))])
    t = core.next_pass_ms
    for r in (req(1, t, 512, 5, (9,)), req(2, t, 1536, 5, (1, 2, 3)), req(3, t, 512, 5, (1,))):
        core.add_request(r, t)
    out = core.step(t)
    return out.admitted


def test_lpm_admits_longest_cached_prefix_first():
    assert _warm_then_queue("lpm") == [2, 3, 1]


def test_fifo_keeps_arrival_order():
    assert _warm_then_queue("fifo") == [1, 2, 3]


def test_prefix_hit_saves_compute_and_budget():
    """Q reuses 1024 cached tokens: its prefill computes only 512 (T = 1536 - 1024)."""
    core = SglangCore(cfg())
    run(core, [req(0, 0, 1024, 1, (1, 2))])
    t = core.next_pass_ms
    rec = core.add_request(req(1, t, 1536, 2, (1, 2, 3)), t)
    out = core.step(t)
    assert out.end_ms - t == pytest.approx(pre(512), abs=1e-6)
    assert rec.cached_tokens == 1024


# ---------------------------------------------------------------------------------------------- retraction
def test_retraction_picks_shortest_output_and_keeps_its_prefix_cached():
    """Pool 300, reserve clipped to 10. A and B (100 + 200 each) start at 0; C (20 + 200) joins later with
    fewer output tokens. When one more token per request no longer fits, C is retracted: it re-queues at
    the back of waiting, its slots stay in the tree (evictable), A and B keep running."""
    core = SglangCore(cfg(num_gpu_blocks=300, sglang={"clip_max_new_tokens": 10}))
    core.add_request(req(0, 0, 100, 200), 0.0)
    core.add_request(req(1, 0, 100, 200), 0.0)
    o = core.step(0.0)
    assert o.admitted == [0, 1]
    for _ in range(10):
        o = core.step(o.end_ms)
    c = core.add_request(req(2, o.end_ms, 20, 200), o.end_ms)
    o = core.step(o.end_ms)
    assert o.admitted == [2]
    retract = None
    while retract is None:
        held_before = core.requests[2].materialized
        o = core.step(o.end_ms)
        core.check_invariants()
        if o.preempted:
            retract = o
    assert retract.preempted == [2]
    assert [r.request_id for r in core.running] == [0, 1]
    assert core.waiting[-1].request_id == 2 and core.requests[2].state == State.PREEMPTED
    assert c.num_preemptions == 1
    # its cached prefix survives in the tree (minus the few slots evicted for this pass's decode)
    content = core.requests[2].content
    assert core.kv.match_len(content, held_before) >= held_before - 2
    assert core.kv.evictable_size >= held_before - 2


def test_new_token_ratio_after_retraction_is_sglangs_estimate():
    """A and B (100 + 200 each) decode in lockstep in a 300-token pool until one more token each no longer
    fits: A is retracted (tie on output length: the first) and the ratio becomes
    min(1, (B's output tokens before the pass + 20 * 1) / 200), not decayed in that pass."""
    core = SglangCore(cfg(num_gpu_blocks=300, sglang={"clip_max_new_tokens": 10}))
    for i in range(2):
        core.add_request(req(i, 0, 100, 200), 0.0)
    o = core.step(0.0)
    while not o.preempted:
        o = core.step(o.end_ms)
    assert o.preempted == [0]
    b_before = core.requests[1].generated - 1
    assert b_before == 50
    assert core.new_token_ratio == pytest.approx((b_before + 20) / 200, rel=1e-12)


def test_every_request_finishes_under_memory_pressure():
    reqs = [req(i, 5 * i, 80 + 7 * i, 60 + 11 * i) for i in range(12)]
    recs = run(SglangCore(cfg(num_gpu_blocks=400, sglang={"clip_max_new_tokens": 10})), reqs)
    assert all(r.status == "finished" and len(r.token_times_ms) == r.output_length for r in recs.values())
    assert sum(r.num_preemptions for r in recs.values()) > 0


def test_prompt_larger_than_pool_is_rejected():
    recs = run(SglangCore(cfg(num_gpu_blocks=100)), [req(0, 0, 150, 5), req(1, 0, 50, 5)])
    assert recs[0].status == "failed" and recs[1].status == "finished"


# ---------------------------------------------------------------------------------------------- chunking
def test_chunked_prefill_in_8192_token_chunks():
    """20000-token prompt: chunks 8192, 8192, 3616; mean ISL/prefix per pass give T = the chunk."""
    core = SglangCore(cfg(num_gpu_blocks=32768))
    r = run(core, [req(0, 0, 20000, 1)])[0]
    assert r.first_token_ms == pytest.approx(pre(8192) + pre(8192) + pre(3616), abs=1e-5)
    assert core.pass_index == 3


def test_chunk_size_is_configurable():
    core = SglangCore(cfg(num_gpu_blocks=32768, sglang={"chunked_prefill_size": 4096, "max_prefill_tokens": 4096}))
    r = run(core, [req(0, 0, 10000, 1)])[0]
    assert r.first_token_ms == pytest.approx(2 * pre(4096) + pre(1808), abs=1e-5)


# ---------------------------------------------------------------------------------------------- radix cache
def _store(cache: RadixCache, key: int, n: int):
    return _store_content(cache, SeqContent([0], [key]), n)


def test_radix_evicts_unlocked_leaves_lru_only():
    cache = RadixCache(100, 1)
    x = _store(cache, 1, 30)
    y = _store(cache, 2, 30)
    _store(cache, 3, 30)  # stays locked
    cache.dec_lock(x)  # x unlocked first (older), then y
    cache.dec_lock(y)
    assert (cache.free, cache.evictable_size, cache.protected_size) == (10, 60, 30)
    assert cache.evict(15) == 15  # pages from the end of the least recently used leaf: x
    assert cache.match_len(SeqContent([0], [1]), 30) == 15 and cache.match_len(SeqContent([0], [2]), 30) == 30
    assert cache.evict(20) == 20  # the rest of x (15), then 5 pages of y
    assert cache.match_len(SeqContent([0], [1]), 30) == 0 and cache.match_len(SeqContent([0], [2]), 30) == 25
    assert cache.evict(1000) == 25  # only y was left evictable; the locked node survives
    assert (cache.free, cache.evictable_size, cache.protected_size) == (70, 0, 30)
    cache.check_invariants()


def test_radix_touch_refreshes_lru_order():
    cache = RadixCache(100, 1)
    x = _store(cache, 1, 30)
    y = _store(cache, 2, 30)
    cache.dec_lock(x)
    cache.dec_lock(y)
    _, n = cache.match_and_lock(SeqContent([0], [1]), 30)  # x used again: now the most recent
    cache.dec_lock(n)
    assert cache.evict(30) == 30
    assert cache.match_len(SeqContent([0], [1]), 30) == 30 and cache.match_len(SeqContent([0], [2]), 30) == 0


def test_radix_decode_pages_extend_the_own_leaf_and_evict_from_the_end():
    cache = RadixCache(100, 1)
    content = SeqContent([0], [7])
    node = _store_content(cache, content, 20)
    cache.take(5)
    same, dup = cache.insert(content, node, 20, 25, True)  # decode pages extend the request's own leaf
    cache.to_tree(5)
    assert same is node and node.length == 25 and dup == 0
    cache.dec_lock(node)
    assert cache.evict(3) == 3 and node.length == 22  # newest pages go first
    assert cache.match_len(content, 25) == 22
    assert cache.evict(100) == 22
    cache.check_invariants()


def test_radix_parent_becomes_a_leaf_after_its_child_is_evicted():
    cache = RadixCache(4096, 1)
    a = SeqContent.for_request((1, 2), 1024, 10)
    b = SeqContent.for_request((1, 3), 1024, 11)
    na = _store_content(cache, a, 1024)
    cache.dec_lock(na)
    nb = _store_content(cache, b, 1024)  # splits a's node at 512: shared parent, two children
    cache.dec_lock(nb)
    assert cache.evict(512) == 512  # a's own half (least recently used leaf)
    assert cache.match_len(a, 1024) == 512 and cache.match_len(b, 1024) == 1024
    assert cache.evict(1024) == 1024  # b's half, then the shared parent, now a leaf
    assert cache.evictable_size == 0 and cache.free == 4096
    cache.check_invariants()


def test_radix_shared_prefix_split_and_duplicate_accounting():
    cache = RadixCache(4096, 1)
    a = SeqContent.for_request((1, 2), 1024, 10)
    b = SeqContent.for_request((1, 3), 1024, 11)
    na = _store_content(cache, a, 1024)
    matched, nb0 = cache.match_and_lock(b, 1024)
    assert matched == 512  # shares hash id 1 only: the node is split at 512
    cache.take(512)
    nb, dup = cache.insert(b, nb0, 512, 1024, False)
    cache.to_tree(512 - dup)
    cache.inc_lock(nb)
    cache.dec_lock(nb0)
    assert dup == 0 and cache.protected_size == 1536 and cache.free == 4096 - 1536
    cache.dec_lock(na)
    cache.dec_lock(nb)
    assert cache.evictable_size == 1536
    cache.check_invariants()


def _store_content(cache, content, n):
    """What a request does: match and lock its cached prefix, allocate the rest, store it, move the lock."""
    matched, node = cache.match_and_lock(content, n)
    cache.take(n - matched)
    new, dup = cache.insert(content, node, matched, n, False)
    cache.to_tree(n - matched - dup)
    cache.give_back(dup)
    cache.inc_lock(new)
    cache.dec_lock(node)
    return new


def test_radix_rejects_overallocation():
    cache = RadixCache(10, 1)
    with pytest.raises(SimulationError, match="exceeds free"):
        cache.take(11)


def test_page_size_rounds_prefix_matches_down():
    cache = RadixCache(4096, 16)
    a = SeqContent.for_request((1,), 500, 10)
    _store_content(cache, a, 496)
    b = SeqContent.for_request((1,), 500, 11)
    assert cache.match_len(b, 500) == 496  # 31 full pages of 16


# ---------------------------------------------------------------------------------------------- fleet / determinism
def test_fleet_replay_runs_and_is_deterministic():
    reqs = [req(i, 40 * i, 200 + (i * 37) % 800, 20 + (i * 13) % 80, (i % 3, i)) for i in range(60)]
    engine = cfg(num_gpu_blocks=3000)
    a = run_replay(reqs, engine, FleetConfig(num_workers=2, router="kv"))
    b = run_replay(reqs, engine, FleetConfig(num_workers=2, router="kv"))
    assert list(a.records) == list(b.records)
    assert all(r.status == "finished" for r in a.records)
    s = run_replay(reqs, engine, FleetConfig(num_workers=2, router="kv", single_step=True))
    assert list(a.records) == list(s.records)


def test_fpm_collected_per_pass():
    core = SglangCore(cfg(), collect_fpm=True)
    run(core, [req(0, 0, 374, 4)])
    assert len(core.fpm) == 4
    f0 = core.fpm[0].scheduled_requests
    assert (f0.num_prefill_requests, f0.sum_prefill_tokens, f0.num_decode_requests) == (1, 374, 1)
    f1 = core.fpm[1].scheduled_requests
    assert (f1.num_prefill_requests, f1.num_decode_requests, f1.sum_decode_kv_tokens) == (0, 1, 375)
    assert core.fpm[1].wall_time == pytest.approx(dec(375) / 1000, abs=1e-9)


def test_cancel_frees_slots():
    core = SglangCore(cfg())
    core.add_request(req(0, 0, 374, 50), 0.0)
    o = core.step(0.0)
    assert core.cancel(0, o.end_ms) is True and core.cancel(0, o.end_ms) is False
    core.check_invariants()
    assert core.kv.private == 0 and core.kv.protected_size == 0
    assert core.kv.free + core.kv.evictable_size == SG_TOTAL


def test_second_request_fills_the_rest_of_the_chunk_budget():
    """Reference (Mooncake, t=0 on one worker): ISL 2290 and 6760 arrive together; the first extend pass
    computes 2290 + a 5902-token chunk = 8192 tokens (169.137 ms), the second the last 858 tokens."""
    core = SglangCore(cfg(num_gpu_blocks=262144))
    recs = run(core, [req(0, 0, 2290, 5), req(1, 0, 6760, 5)])
    assert recs[0].first_token_ms == pytest.approx(169.137, abs=1e-3)
    assert recs[0].first_token_ms == pytest.approx(pre(8192), abs=1e-6)
    assert recs[1].first_token_ms == pytest.approx(pre(8192) + pre(858), abs=1e-6)


def test_cached_prefix_is_not_charged_to_the_budget():
    """Pool 2000. Warm 1024 tokens of ids (1, 2); the next request (1536 = ids 1, 2, 3, out 100) is charged
    only its 512 uncached tokens: 512 + 100 < 2000 - 0 reserved, and it reuses 1024 tokens."""
    core = SglangCore(cfg(num_gpu_blocks=2000))
    run(core, [req(0, 0, 1024, 1, (1, 2))])
    t = core.next_pass_ms
    rec = core.add_request(req(1, t, 1536, 100, (1, 2, 3)), t)
    out = core.step(t)
    assert out.admitted == [1] and rec.cached_tokens == 1024
    # a fully cached prompt still computes its last token (match capped at len - 1)
    t = core.next_pass_ms
    while core.has_work():
        t = core.step(core.next_pass_ms).end_ms
    rec2 = core.add_request(req(2, t, 1024, 1, (1, 2)), t)
    out = core.step(t)
    assert rec2.cached_tokens == 1023 and out.end_ms - t == pytest.approx(pre(1), abs=1e-6)


# ---------------------------------------------------------------------------------------------- command line
def _cli(argv: list[str]) -> int:
    from planner.cli import main  # the `dynoplan` entry point

    try:
        return main(argv)
    except SystemExit as e:  # argparse errors exit through parser.error
        return int(e.code or 0)


def test_cli_replay_engine_sglang_page_size(tmp_path, capsys):
    trace = tmp_path / "t.csv"
    trace.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n"
        "2023-11-16 18:15:50.9951690,396,109\n"
    )
    out = tmp_path / "r.json"
    rc = _cli(
        [
            "replay",
            "--trace",
            str(trace),
            "--engine",
            "sglang",
            "--page-size",
            "16",
            "--report-json",
            str(out),
            "--quiet",
        ]
    )
    assert rc == 0
    import json

    rep = json.loads(out.read_text())
    assert rep["completed_requests"] == 2
    assert rep["mean_ttft_ms"] == pytest.approx((pre(374) + pre(396)) / 2, abs=1e-6)  # each alone
    rc = _cli(["replay", "--trace", str(trace), "--engine", "sglang", "--page-size", "0"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "--page-size" in err and "'0'" in err and len(err.splitlines()) == 1
