"""KVBM lower tiers: processor-shared links (hand-computed times) and G3 -> G2 -> G1 staging."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dynoplan.errors import ConfigError
from dynoplan.settings import build
from mocker.kv.tiers import ProcessorSharingLink, TierConfig, TierHierarchy

MB = 1_000_000


def test_one_megabyte_at_one_gb_per_s_takes_one_ms():
    link = ProcessorSharingLink("x", 1.0)
    link.submit(0.0, MB, "a")
    assert link.next_completion_ms() == pytest.approx(1.0)
    assert link.advance(5.0) == [(pytest.approx(1.0), "a")]
    assert link.in_flight == 0


def test_ten_simultaneous_equal_transfers_finish_together_at_ten_times():
    link = ProcessorSharingLink("x", 1.0)
    for i in range(10):
        link.submit(0.0, MB, i)
    assert link.advance(9.999) == []
    done = link.advance(100.0)
    assert [tag for _, tag in done] == list(range(10))
    assert all(t == pytest.approx(10.0) for t, _ in done)


def test_later_arrival_speeds_up_when_earlier_finishes():
    # A: 1 MB at t=0 alone until 0.5 ms (0.5 MB left); then A and B share 0.5 GB/s each:
    # A finishes at 0.5 + 0.5MB/(0.5 GB/s) = 1.5 ms, B has 0.5 MB done; alone again: 1.5 + 0.5 = 2.0 ms
    # (2.5 ms if it had kept half the link).
    link = ProcessorSharingLink("x", 1.0)
    link.submit(0.0, MB, "A")
    assert link.advance(0.5) == []
    link.submit(0.5, MB, "B")
    done = link.advance(10.0)
    assert [tag for _, tag in done] == ["A", "B"]
    assert done[0][0] == pytest.approx(1.5)
    assert done[1][0] == pytest.approx(2.0)


def test_zero_bandwidth_is_instantaneous_and_negative_is_config_error():
    link = ProcessorSharingLink("x", 0)
    link.submit(3.0, MB, "a")
    assert link.advance(3.0) == [(3.0, "a")]
    with pytest.raises(ConfigError, match=r"bandwidth=-1: expected a number >= 0"):
        ProcessorSharingLink("x", -1)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 5), st.integers(1, 4 * MB)), min_size=1, max_size=12))
def test_link_conserves_work(arrivals):
    """Work conservation: the link is busy from the first arrival until the last finish except when idle;
    the last finish equals the single-server FIFO makespan (same total work, same busy periods)."""
    arrivals = sorted(arrivals)
    link = ProcessorSharingLink("x", 1.0)  # 1e6 bytes per ms
    finished = []
    for t, n in arrivals:
        finished += link.advance(t)
        link.submit(t, n, (t, n))
    finished += link.advance(1e9)
    assert len(finished) == len(arrivals)
    fifo_end = 0.0
    for t, n in arrivals:
        fifo_end = max(fifo_end, t) + n / MB
    assert max(f for f, _ in finished) == pytest.approx(fifo_end, rel=1e-9, abs=1e-9)
    for f, (t, n) in finished:  # never faster than alone on the link
        assert f >= t + n / MB - 1e-9


def cfg(**kw):
    base = dict(
        bytes_per_block=MB,
        num_g2_blocks=4,
        offload_batch_size=2,
        bw_g1_g2_gbps=1.0,
        bw_g2_g1_gbps=1.0,
        bw_g2_g3_gbps=1.0,
        bw_g3_g2_gbps=1.0,
        bw_g3_g4_gbps=1.0,
        bw_g4_g2_gbps=1.0,
    )
    base.update(kw)
    return TierConfig(**base)


def test_offload_batches_and_g2_lru_spills_to_g3():
    events = []
    h = TierHierarchy(cfg(num_g3_blocks=8), 1, listener=lambda *e: events.append((e[0], e[1], list(e[3]))))
    assert h.offload(0.0, 0, [1]) == 0  # below the batch size: queued
    assert h.offload(0.0, 0, [2, 3]) == 1  # batch [1, 2] starts; 3 waits
    h.advance(1.999)
    assert list(h.g2[0]) == []
    h.advance(2.0)  # 2 blocks = 2 MB at 1 GB/s
    assert list(h.g2[0]) == [1, 2]
    h.offload(2.0, 0, [4, 5, 6], flush=True)  # [3,4] and [5,6] share the link: both land at 2 + 4 = 6 ms
    h.advance(6.0)
    assert list(h.g2[0]) == [3, 4, 5, 6]  # 1, 2 evicted LRU, sent to G3 (2 MB at 1 GB/s)
    assert ("removed", "G2", [1, 2]) in events
    h.advance(8.0)
    assert list(h.g3) == [1, 2]
    h.check_invariants()


def test_g3_hit_is_staged_through_g2_before_onboarding_to_g1():
    h = TierHierarchy(cfg(num_g3_blocks=8), 1)
    h.g2[0].update({10: None})
    h.g3.update({11: None, 12: None})
    t = h.onboard(100.0, 0, [10, 11, 12, 13])
    assert t is not None and t.keys == [10, 11, 12] and t.from_tier == {"G2": 1, "G3": 2}
    # staging: 2 blocks G3->G2 = 2 ms -> staged at 102; then 3 blocks G2->G1 = 3 ms -> done at 105
    assert h.advance(104.9) == []
    assert t.staged_ms == pytest.approx(102.0)
    assert list(h.g2[0]) == [10, 11, 12]  # G3 blocks now resident in G2
    assert h.advance(105.0) == [t]
    assert t.done_ms == pytest.approx(105.0)


def test_g2_only_hit_goes_straight_to_g1_and_miss_returns_none():
    h = TierHierarchy(cfg(), 2)
    h.g2[1].update({7: None})
    assert h.onboard(0.0, 0, [7]) is None  # G2 is per worker
    t = h.onboard(0.0, 1, [7, 8])
    assert t.staged_ms == 0.0 and h.advance(1.0) == [t] and t.done_ms == pytest.approx(1.0)


def test_g4_hit_stages_through_g2_concurrently_with_g3():
    h = TierHierarchy(cfg(num_g3_blocks=4, g4=True, bw_g4_g2_gbps=0.5), 1)
    h.g3.update({1: None})
    h.g4.add(2)
    t = h.onboard(0.0, 0, [1, 2])
    # G3->G2 1 MB at 1 GB/s = 1 ms; G4->G2 1 MB at 0.5 GB/s = 2 ms (separate links, concurrent);
    # staged at 2, then 2 MB G2->G1 = 2 ms
    h.run_until_idle()
    assert t.staged_ms == pytest.approx(2.0) and t.done_ms == pytest.approx(4.0)


def test_tier_config_errors_name_field_and_value():
    with pytest.raises(ConfigError) as e:
        build(TierConfig, {"bytes_per_block": 0, "num_g3_blocks": 5, "offload_batch_size": -1, "bw_g2_g3_gbps": -2})
    assert e.value.problems == [
        "bytes_per_block=0: expected > 0",
        "offload_batch_size=-1: expected > 0",
        "bw_g2_g3_gbps=-2: expected >= 0.0",
    ]
    with pytest.raises(ConfigError) as e:  # the cross-field rule, once every field is valid
        build(TierConfig, {"bytes_per_block": 1, "num_g3_blocks": 5})
    assert e.value.problems == ["num_g2_blocks=0: G3/G4 hits stage through G2; expected num_g2_blocks > 0"]


def _trace(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        "".join(
            f'{{"timestamp": {100 * i}, "input_length": 1024, "output_length": 3, "hash_ids": [{i % 3}, {50 + i}]}}\n'
            for i in range(12)
        )
    )
    return trace


def test_cli_kvbm_flags_run_and_errors_are_one_line(tmp_path, capsys):
    from planner.cli import main

    trace = _trace(tmp_path)
    out = tmp_path / "r.jsonl"
    assert main(
        [
            "replay",
            "--trace",
            str(trace),
            "--workers",
            "2",
            "--router",
            "kv",
            "--quiet",
            "--g1-backend",
            "kvbm",
            "--per-request",
            str(out),
        ]
    ) in (0, None)
    assert len(out.read_text().splitlines()) == 12
    for flags, msg in (
        (["--num-g2-blocks", "8"], 'g1_backend="native": lower KV tiers configured (num_g2_blocks=8)'),
        (["--g1-backend", "kvbm", "--g4"], "num_g2_blocks=0: G3/G4 hits stage through G2"),
        (["--tier-bandwidth", "g2_g1=-3"], "--tier-bandwidth 'g2_g1=-3': expected LINK=GBPS"),
        # was: accepted, the last value kept
        (
            ["--g1-backend", "kvbm", "--tier-bandwidth", "g1_g2=5", "--tier-bandwidth", "g1_g2=6"],
            "--tier-bandwidth g1_g2: given twice ('g1_g2=5' and 'g1_g2=6'), expected each link once",
        ),
    ):
        capsys.readouterr()
        assert main(["replay", "--trace", str(trace), "--quiet", *flags]) == 2
        err = capsys.readouterr().err
        assert msg in err and len(err.strip().splitlines()) == 1


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["off", "on", "flush"]),
            st.integers(0, 1),
            st.floats(0, 3),
            st.lists(st.integers(0, 15), min_size=1, max_size=5),
        ),
        max_size=30,
    ),
    st.integers(1, 4),
    st.integers(0, 6),
    st.booleans(),
)
def test_random_offload_onboard_keep_capacity_and_order(ops, g2, g3, g4):
    """Random offloads/onboards on 2 workers: capacities hold, every ticket completes with
    start <= staged <= done, and a ticket onboards exactly the leading run found below G1 at its start."""
    h = TierHierarchy(cfg(num_g2_blocks=g2, num_g3_blocks=g3, g4=g4, offload_batch_size=2), 2)
    t, tickets = 0.0, []
    for kind, w, dt, keys in ops:
        t += dt
        if kind == "on":
            h.advance(t)  # transfers landing by t count (onboard advances first too)
            expect = len(h.lookup(w, keys))
            tk = h.onboard(t, w, keys)
            assert (tk is None) == (expect == 0)
            if tk is not None:
                assert tk.keys == list(keys[:expect]) and sum(tk.from_tier.values()) == expect
                tickets.append(tk)
        else:
            h.offload(t, w, keys, flush=kind == "flush")
        h.check_invariants()
    h.run_until_idle()
    h.check_invariants()
    for tk in tickets:
        assert tk.done_ms is not None and tk.start_ms <= tk.staged_ms <= tk.done_ms
    assert all(link.in_flight == 0 for link in h.links.values())
