"""Replay report: hand-computed statistics, goodput, per-request JSONL, determinism, table."""

from __future__ import annotations

import json
import math
import random
from fractions import Fraction
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from mocker.config import EngineConfig
from mocker.records import RequestRecord
from mocker.report import (
    build_report,
    distribution_stats,
    percentile_rounded_rank,
    render_table,
    report_to_json,
    sketch_value,
    write_per_request_jsonl,
)


def make_result(
    records: list[RequestRecord], worker_seconds: float = 80.0, num_workers: int = 2, engine: EngineConfig | None = None
) -> Any:
    from mocker.fleet import ReplayResult

    duration = max((r.finish_ms or 0.0 for r in records), default=0.0)
    return ReplayResult(
        records=records,
        fpm=[],
        duration_ms=duration,
        worker_seconds=worker_seconds,
        num_workers=num_workers,
        engine=engine or EngineConfig(),
    )


def rec(
    i: int,
    arrival: float,
    tokens: list[float],
    *,
    inp: int = 100,
    cached: int = 0,
    status: str = "finished",
    preempt: int = 0,
) -> RequestRecord:
    return RequestRecord(
        request_id=i,
        arrival_ms=arrival,
        input_length=inp,
        output_length=len(tokens),
        worker_id=i % 2,
        admit_ms=arrival + 1 if status == "finished" else None,
        first_token_ms=tokens[0] if tokens else None,
        token_times_ms=list(tokens),
        finish_ms=tokens[-1] if tokens and status == "finished" else None,
        cached_tokens=cached,
        num_preemptions=preempt,
        status=status,
    )


def three() -> list[RequestRecord]:
    return [
        rec(0, 0.0, [10.0, 15.0, 21.0], inp=100),
        rec(1, 5.0, [30.0, 40.0], inp=300, cached=64, preempt=1),
        rec(2, 7.0, [], inp=50, status="pending"),
    ]


def test_hand_computed_report() -> None:
    rep = build_report(make_result(three()))
    assert rep["num_requests"] == 3 and rep["completed_requests"] == 2
    assert rep["total_input_tokens"] == 400 and rep["total_output_tokens"] == 5
    assert rep["duration_ms"] == 40.0
    assert rep["request_throughput_rps"] == pytest.approx(50.0)
    assert rep["input_throughput_tok_s"] == pytest.approx(10_000.0)
    assert rep["output_throughput_tok_s"] == pytest.approx(125.0)
    assert rep["total_throughput_tok_s"] == pytest.approx(10_125.0)
    assert rep["prefix_cache_reused_ratio"] == pytest.approx(0.16)
    assert rep["num_preemptions"] == 1
    assert rep["worker_seconds"] == 80.0 and rep["decode_worker_seconds"] == 80.0
    assert rep["gpu_hours"] == pytest.approx(80.0 / 3600.0)
    # TTFT [10, 25]: median = sorted[round(0.5)] = sorted[1] (half away from zero); population std 7.5
    assert (rep["mean_ttft_ms"], rep["min_ttft_ms"], rep["max_ttft_ms"], rep["median_ttft_ms"], rep["std_ttft_ms"]) == (
        17.5,
        10.0,
        25.0,
        25.0,
        7.5,
    )
    assert (rep["mean_e2e_latency_ms"], rep["min_e2e_latency_ms"], rep["max_e2e_latency_ms"]) == (28.0, 21.0, 35.0)
    assert (rep["min_ttst_ms"], rep["max_ttst_ms"]) == (5.0, 10.0)
    assert (rep["min_tpot_ms"], rep["max_tpot_ms"]) == (5.5, 10.0)  # (21-10)/2 and (40-30)/1
    # ITL: every gap inside a request [5, 6, 10]; the 21 -> 30 jump between requests is not a gap
    assert rep["num_itl_samples"] == 3
    assert (rep["mean_itl_ms"], rep["min_itl_ms"], rep["max_itl_ms"]) == (7.0, 5.0, 10.0)
    # per-token percentiles are DDSketch bucket values of the rounded-rank sample (6 and 10), as in the reference
    assert (rep["median_itl_ms"], rep["p75_itl_ms"]) == (sketch_value(6.0), sketch_value(10.0))
    assert rep["median_itl_ms"] == pytest.approx(6.0, rel=1e-3) and rep["p75_itl_ms"] == pytest.approx(10.0, rel=1e-3)
    assert rep["std_itl_ms"] == pytest.approx(math.sqrt(14 / 3))
    assert rep["mean_output_token_throughput_per_user"] == pytest.approx((200 + 1000 / 6 + 100) / 3)
    assert rep["max_output_token_throughput_per_user"] == pytest.approx(200.0)
    assert "goodput_completed_requests" not in rep
    assert rep["engine"] == "vllm" and rep["num_workers"] == 2


@pytest.mark.parametrize(
    "sla, good",
    [
        ({"sla_ttft_ms": 20.0}, 1),  # TTFT 10 ok, 25 not
        ({"sla_ttft_ms": 25.0}, 2),  # <= is inclusive
        ({"sla_itl_ms": 6.0}, 1),  # mean ITL 5.5 ok, 10 not
        ({"sla_e2e_ms": 30.0}, 1),  # E2E 21 ok, 35 not
        ({"sla_ttft_ms": 30.0, "sla_itl_ms": 10.0, "sla_e2e_ms": 35.0}, 2),
        ({"sla_ttft_ms": 1.0}, 0),
    ],
)
def test_goodput(sla: dict[str, float], good: int) -> None:
    rep = build_report(make_result(three()), **sla)
    assert rep["goodput_completed_requests"] == good
    assert rep["sla_attainment"] == pytest.approx(good / 3)
    assert rep["goodput_request_throughput_rps"] == pytest.approx(good / 0.04)
    for k in ("sla_ttft_ms", "sla_itl_ms", "sla_e2e_ms"):
        assert rep[k] == sla.get(k)


def test_goodput_itl_skipped_for_single_token_requests() -> None:
    recs = [rec(0, 0.0, [10.0]), rec(1, 0.0, [10.0, 100.0])]
    rep = build_report(make_result(recs), sla_itl_ms=5.0)
    assert rep["goodput_completed_requests"] == 1
    assert rep["goodput_output_throughput_tok_s"] == pytest.approx(1 / 0.1)


def test_bad_sla_is_value_error() -> None:
    with pytest.raises(ValueError, match="sla_ttft_ms"):
        build_report(make_result(three()), sla_ttft_ms=-1.0)


def test_empty_report_is_zeros() -> None:
    rep = build_report(make_result([rec(0, 0.0, [], status="pending")], worker_seconds=0.0))
    assert rep["completed_requests"] == 0 and rep["num_requests"] == 1
    assert rep["mean_ttft_ms"] == 0.0 and rep["p99_itl_ms"] == 0.0 and rep["prefix_cache_reused_ratio"] == 0.0
    json.loads(report_to_json(rep))


def rounded_rank_oracle(values: list[float], p: float) -> float:
    """Exact-arithmetic oracle: index = floor((n-1)*p/100 + 1/2)."""
    s = sorted(values)
    x = Fraction(len(s) - 1) * Fraction(p) / 100
    return s[min(math.floor(x + Fraction(1, 2)), len(s) - 1)]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(0, 1e6, allow_nan=False), min_size=1, max_size=60),
    st.sampled_from([50.0, 75.0, 90.0, 95.0, 99.0]),
)
def test_percentile_matches_rounded_rank_oracle(values: list[float], p: float) -> None:
    assert percentile_rounded_rank(np.sort(np.array(values)), p) == rounded_rank_oracle(values, p)


def test_sketch_value_matches_reference_report() -> None:
    # Reference (Dynamo Mocker 1.6.1) Azure 4-worker run: the rounded-rank median gap was
    # 5.8805959997698665 ms and the report says median_itl_ms = 5.876727682014374.
    assert sketch_value(5.8805959997698665) == 5.876727682014374
    assert sketch_value(0.0) == 0.0


@settings(max_examples=300, deadline=None)
@given(st.floats(1e-6, 1e9), st.floats(1e-6, 1e9))
def test_sketch_value_relative_error_and_monotone(x: float, y: float) -> None:
    assert abs(sketch_value(x) - x) <= 1e-3 * x * (1 + 1e-12)
    lo, hi = sorted((x, y))
    assert sketch_value(lo) <= sketch_value(hi)


def test_distribution_stats_known_sample() -> None:
    s = distribution_stats(range(1, 101))  # 1..100: n-1 = 99
    assert s["median"] == 51.0  # index round(49.5) = 50 -> value 51
    assert s["p90"] == 90.0  # index round(89.1) = 89 -> 90
    assert s["p99"] == 99.0  # index round(98.01) = 98 -> 99
    assert s["std"] == pytest.approx(math.sqrt((100**2 - 1) / 12))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.just(0.0), st.floats(0.0, 1e7)), min_size=1, max_size=300), st.booleans())
def test_distribution_stats_bit_identical_to_numpy(values: list[float], sketch: bool) -> None:
    # the in-place statistics (report._stats_in_place) equal numpy's own partition / mean / std, bit for bit
    from mocker.report import _rounded_rank

    a = np.array(values)
    q = sketch_value if sketch else float
    part = np.partition(a, sorted({_rounded_rank(a.size, p) for p in (50, 75, 90, 95, 99)}))
    expected = [
        float(a.mean()),
        float(a.min()),
        float(a.max()),
        *(q(float(part[_rounded_rank(a.size, p)])) for p in (50, 75, 90, 95, 99)),
        float(a.std()),
    ]
    assert list(distribution_stats(values, sketch=sketch).values()) == expected
    assert list(distribution_stats(a, sketch=sketch).values()) == expected and a.tolist() == values  # a unchanged


@pytest.mark.parametrize("n", [1, 7, 8191, 8192, 8193, 3 * 8192 + 5, 1_000_003])
def test_block_sums_are_numpys_sum(n: int) -> None:
    # report._sum_blocks adds block by block what np.add.reduce adds over the whole array, bit for bit
    from mocker.report import _sum_blocks

    rng = np.random.default_rng(n)
    a = rng.random(n) * 10.0 ** rng.uniform(-3, 6, n)

    def squared(block: np.ndarray, out: np.ndarray) -> None:
        np.multiply(block, block, out=out)

    assert _sum_blocks(a, squared) == float(np.add.reduce(a * a))
    assert _sum_blocks(a[3:], squared) == float(np.add.reduce(a[3:] * a[3:]))  # a view at an offset too


@pytest.mark.parametrize("zero_gaps", [False, True])
def test_per_token_stats_bit_identical_to_numpy_on_long_samples(zero_gaps: bool) -> None:
    # ITL and per-user throughput over > 8192 gaps (several summation blocks), with and without zero gaps,
    # equal the statistics of the materialised arrays (numpy's partition / mean / std)
    from mocker.report import _rounded_rank

    rng = np.random.default_rng(7)
    recs = []
    for i in range(80):
        gaps = rng.exponential(8.0, int(rng.integers(1, 1200)))
        if zero_gaps:
            gaps[rng.random(gaps.size) < 0.05] = 0.0
        tokens = (i * 50.0 + rng.exponential(100.0) + np.concatenate([[0.0], np.cumsum(gaps)])).tolist()
        recs.append(rec(i, i * 50.0, tokens))
    rep = build_report(make_result(recs))
    itl = np.concatenate([np.maximum(np.diff(r.token_times_ms), 0.0) for r in recs])
    per_user = 1000.0 / itl[itl > 0.0]
    assert itl.size > 3 * 8192 and (per_user.size < itl.size) == zero_gaps
    for name, a in (("itl_ms", itl), ("output_token_throughput_per_user", per_user)):
        ranks = [_rounded_rank(a.size, p) for p in (50, 75, 90, 95, 99)]
        part = np.partition(a, sorted(set(ranks)))
        expected = [float(a.mean()), float(a.min()), float(a.max())]
        expected += [sketch_value(float(part[r])) for r in ranks] + [float(a.std())]
        keys = ("mean", "min", "max", "median", "p75", "p90", "p95", "p99", "std")
        assert [rep[f"{k}_{name}"] for k in keys] == expected, name


token_lists = st.lists(st.lists(st.floats(0.01, 50.0), min_size=1, max_size=20), min_size=1, max_size=25)


@settings(max_examples=60, deadline=None)
@given(token_lists, st.randoms(use_true_random=False))
def test_report_invariants(gap_lists: list[list[float]], rnd: random.Random) -> None:
    recs = []
    for i, gaps in enumerate(gap_lists):
        arrival = float(i * 3)
        times = list(np.cumsum([arrival + gaps[0]] + gaps[1:]))
        recs.append(rec(i, arrival, [float(t) for t in times], inp=10 + i, cached=i % 3))
    rep = build_report(make_result(recs))
    n_tok = [len(r.token_times_ms) for r in recs]
    assert rep["total_output_tokens"] == sum(n_tok)
    assert rep["num_itl_samples"] == sum(n - 1 for n in n_tok)
    span = sum(r.token_times_ms[-1] - r.token_times_ms[0] for r in recs)
    if rep["num_itl_samples"]:
        assert rep["mean_itl_ms"] * rep["num_itl_samples"] == pytest.approx(span)
    for name in ("ttft", "ttst", "tpot", "itl", "e2e_latency"):
        vals = [rep[f"{k}_{name}_ms"] for k in ("min", "median", "p75", "p90", "p95", "p99", "max")]
        if name == "itl":  # sketch percentiles: ordered, and within 0.1% of the exact sample range
            assert vals[1:-1] == sorted(vals[1:-1])
            assert vals[0] * (1 - 1e-3 - 1e-12) <= vals[1] and vals[-2] <= vals[-1] * (1 + 1e-3 + 1e-12)
        else:
            assert vals == sorted(vals)
        assert (
            vals[0] <= rep[f"mean_{name}_ms"] * (1 + 1e-12) + 1e-12
            and rep[f"mean_{name}_ms"] <= vals[-1] * (1 + 1e-12) + 1e-12
        )
    # order of records never changes the report
    shuffled = recs[:]
    rnd.shuffle(shuffled)
    assert report_to_json(build_report(make_result(shuffled))) == report_to_json(rep)


def test_per_request_jsonl(tmp_path: Path) -> None:
    recs = three()
    p = tmp_path / "out" / "req.jsonl"
    write_per_request_jsonl(list(reversed(recs)), p)
    rows = [msgspec.json.decode(line) for line in p.read_bytes().splitlines()]
    assert [r["request_id"] for r in rows] == [0, 1, 2]
    r0 = rows[0]
    assert list(r0) == [
        "request_id",
        "status",
        "worker_id",
        "dp_rank",
        "prefill_worker_id",
        "input_length",
        "output_length",
        "num_output_tokens",
        "cached_tokens",
        "num_preemptions",
        "arrival_ms",
        "admit_ms",
        "first_token_ms",
        "finish_ms",
        "ttft_ms",
        "ttst_ms",
        "itl_ms",
        "e2e_ms",
        "token_times_ms",
    ]
    assert (r0["ttft_ms"], r0["ttst_ms"], r0["itl_ms"], r0["e2e_ms"]) == (10.0, 5.0, 5.5, 21.0)
    assert r0["token_times_ms"] == [10.0, 15.0, 21.0] and r0["admit_ms"] == 1.0
    assert rows[1]["cached_tokens"] == 64 and rows[1]["num_preemptions"] == 1
    assert rows[2]["status"] == "pending" and rows[2]["ttft_ms"] is None and rows[2]["e2e_ms"] is None
    # deterministic bytes
    q = tmp_path / "again.jsonl"
    write_per_request_jsonl(recs, q)
    assert p.read_bytes() == q.read_bytes()


def test_table_renders() -> None:
    rep = build_report(make_result(three()), sla_ttft_ms=20.0)
    con = Console(record=True, width=140)
    con.print(render_table(rep))
    text = con.export_text()
    for needle in ("TTFT", "ITL", "E2E", "17.50", "2 / 3", "SLA attainment", "33.33%", "TTFT <= 20 ms"):
        assert needle in text
