"""Trace loaders and synthetic workloads: hand-computed values, error paths, determinism."""

from __future__ import annotations

import csv
import datetime as dt
import math
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dynoplan.errors import TraceError
from mocker.traces import (
    load_azure_csv,
    load_mooncake_jsonl,
    load_trace,
    parse_synthetic_spec,
    scale_arrivals,
    synthesize,
)

ROOT = Path(__file__).resolve().parents[2]
AZURE = ROOT / "examples/traces/azure_llm_conv_2023.csv"
MOONCAKE = ROOT / "examples/traces/mooncake_conversation.jsonl"


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


# ---------------------------------------------------------------------------------------------- Azure
AZ_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def test_azure_small_hand_computed(tmp_path: Path) -> None:
    p = write(
        tmp_path,
        "t.csv",
        AZ_HEADER
        + "2023-11-16 18:15:46.6805900,374,44\n"
        + "2023-11-16 18:15:50.9951690,512,109\n"
        + "2023-11-16 18:15:50.9951699,513,1\n",
    )
    reqs = load_azure_csv(p)
    assert [r.request_id for r in reqs] == [0, 1, 2]
    # 4.314579 s after the first row -> 4314 ms (truncated, as the reference converter does)
    assert [r.arrival_ms for r in reqs] == [0.0, 4314.0, 4314.0]
    assert [(r.input_length, r.output_length) for r in reqs] == [(374, 44), (512, 109), (513, 1)]
    # one fresh id per 512-token block, max(1, ceil(isl/512)): 1, 1, 2 ids, numbered across the file
    assert [r.hash_ids for r in reqs] == [(0,), (1,), (2, 3)]


def test_azure_trace_block_size(tmp_path: Path) -> None:
    p = write(tmp_path, "t.csv", AZ_HEADER + "2023-11-16 18:15:46.0,100,5\n2023-11-16 18:15:47.5,64,5\n")
    reqs = load_azure_csv(p, trace_block_size=32)
    assert [r.hash_ids for r in reqs] == [tuple(range(4)), tuple(range(4, 6))]
    assert reqs[1].arrival_ms == 1500.0


def reference_conversion(path: Path, block: int = 512) -> list[tuple[int, int, int, list[int]]]:
    """The reference tool's CSV -> Mooncake conversion, re-derived independently with datetime."""
    out, t0, hid = [], None, 0
    with open(path) as f:
        for r in csv.DictReader(f):
            ts = dt.datetime.strptime(r["TIMESTAMP"].strip()[:26], "%Y-%m-%d %H:%M:%S.%f")
            t0 = t0 or ts
            isl, osl = int(r["ContextTokens"]), int(r["GeneratedTokens"])
            k = max(1, math.ceil(isl / block))
            out.append((int((ts - t0).total_seconds() * 1000), isl, osl, list(range(hid, hid + k))))
            hid += k
    return out


def test_azure_bundled_trace_matches_reference_conversion() -> None:
    reqs = load_trace(AZURE)
    ref = reference_conversion(AZURE)
    assert len(reqs) == len(ref) == 19366
    mine = [(r.arrival_ms, r.input_length, r.output_length, list(r.hash_ids or ())) for r in reqs]
    assert mine == [(float(a), i, o, h) for a, i, o, h in ref]


@pytest.mark.parametrize(
    "rows, line, field",
    [
        ("2023-11-16 18:15:46.0,374,44\n2023-11-16 18:15:47.0,-3,44\n", 3, "ContextTokens"),
        ("2023-11-16 18:15:46.0,374,44\n2023-11-16 18:15:47.0,12.5,44\n", 3, "ContextTokens"),
        ("2023-11-16 18:15:46.0,374,0\n", 2, "GeneratedTokens"),
        ("2023-11-16 18:15:46.0,374,abc\n", 2, "GeneratedTokens"),
        ("2023-11-16 18:15:46.0,374,44\nyesterday,374,44\n", 3, "TIMESTAMP"),
        ("2023-11-16 18:15:46.0,374,44\n2023-11-16 18:15:45.0,374,44\n", 3, "TIMESTAMP"),
        ("2023-11-16 18:15:46.0,374,44\n2023-11-16 18:15:47.0,374\n", 3, "GeneratedTokens"),
    ],
)
def test_azure_malformed_rows_name_line_and_field(tmp_path: Path, rows: str, line: int, field: str) -> None:
    p = write(tmp_path, "bad.csv", AZ_HEADER + rows)
    with pytest.raises(TraceError) as ei:
        load_trace(p)
    e = ei.value
    assert (e.path, e.line, e.field) == (str(p), line, field)
    assert f"{p}:{line}" in str(e) and field in str(e)


def test_azure_row_with_extra_fields_names_its_line(tmp_path: Path) -> None:
    # a 4-field row under a 3-column header used to be accepted silently
    p = write(tmp_path, "long.csv", AZ_HEADER + "2023-11-16 18:15:46.0,374,44\n2023-11-16 18:15:47,100,10,5\n")
    with pytest.raises(TraceError) as ei:
        load_trace(p)
    assert ei.value.line == 3
    assert f"{p}:3" in str(ei.value) and "row has 4 fields, expected 3" in str(ei.value)


def test_azure_utf8_bom_header_is_accepted(tmp_path: Path) -> None:
    # Excel's "CSV UTF-8" puts a byte-order mark before the header
    rows = "2023-11-16 18:15:46.0,374,44\r\n2023-11-16 18:15:47.5,100,10\r\n"
    p = tmp_path / "bom.csv"
    p.write_bytes(b"\xef\xbb\xbf" + (AZ_HEADER + rows).encode())
    plain = write(tmp_path, "plain.csv", AZ_HEADER + rows)
    got = load_trace(p)
    assert [(r.arrival_ms, r.input_length, r.output_length) for r in got] == [(0.0, 374, 44), (1500.0, 100, 10)]
    assert got == load_trace(plain)


@pytest.mark.parametrize(
    "isl, osl, field",
    [
        ("99999999999999999999999", "4", "ContextTokens"),  # > int64: used to escape as OverflowError
        ("100000000000", "4", "ContextTokens"),  # fits int64 but ~2e8 hash ids: used to exhaust memory
        ("374", str(2**31), "GeneratedTokens"),
    ],
)
def test_azure_huge_lengths_are_trace_errors(tmp_path: Path, isl: str, osl: str, field: str) -> None:
    p = write(tmp_path, "huge.csv", AZ_HEADER + f"2023-11-16 18:15:46.0,374,44\n2023-11-16 18:15:47.0,{isl},{osl}\n")
    with pytest.raises(TraceError, match=r"expected a positive integer <= 2147483647") as ei:
        load_trace(p)
    assert (ei.value.line, ei.value.field) == (3, field)
    assert len(load_trace(write(tmp_path, "max.csv", AZ_HEADER + f"2023-11-16 18:15:46.0,1,{2**31 - 1}\n"))) == 1


def test_azure_non_utf8_names_line_and_column(tmp_path: Path) -> None:
    p = tmp_path / "latin1.csv"
    p.write_bytes(
        (AZ_HEADER + "2023-11-16 18:15:46.0,374,44\n" * 3000).encode() + b"2023-11-16 18:15:47.0,37\xff4,44\n"
    )
    with pytest.raises(TraceError, match=r"byte 0xff at column 25: expected UTF-8 text") as ei:
        load_trace(p)
    assert ei.value.line == 3002  # was reported as line 0 (the csv reader's count before its first buffer)


def test_azure_missing_column_and_empty(tmp_path: Path) -> None:
    with pytest.raises(TraceError) as ei:
        load_trace(write(tmp_path, "a.csv", "TIMESTAMP,ContextTokens\n2023-11-16 18:15:46.0,3\n"))
    assert (ei.value.line, ei.value.field) == (1, "GeneratedTokens")
    with pytest.raises(TraceError, match="empty file"):
        load_trace(write(tmp_path, "b.csv", ""))
    with pytest.raises(TraceError, match="no data rows"):
        load_trace(write(tmp_path, "c.csv", AZ_HEADER))


def test_missing_file_is_trace_error(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="not found"):
        load_trace(tmp_path / "nope.csv")


@pytest.mark.parametrize("spec", ["", "  "])
def test_empty_trace_spec_says_what_is_expected(spec: str) -> None:
    with pytest.raises(TraceError) as ei:
        load_trace(spec)  # was "'': not a regular file" (the current directory)
    assert str(ei.value) == f"--trace: {spec!r}: expected a trace file path or a synthetic:KIND?... spec"


# ---------------------------------------------------------------------------------------------- Mooncake
def test_mooncake_small_and_aliases(tmp_path: Path) -> None:
    p = write(
        tmp_path,
        "t.jsonl",
        '{"timestamp": 0, "input_length": 1000, "output_length": 10, "hash_ids": [0, 1]}\n'
        "\n"
        '{"created_time": 12.5, "input_tokens": 600, "output_tokens": 3, "hash_ids": [0]}\n'
        '{"timestamp": 20, "input_length": 7, "output_length": 1}\n',
    )
    reqs = load_mooncake_jsonl(p)
    assert [(r.request_id, r.arrival_ms, r.input_length, r.output_length, r.hash_ids) for r in reqs] == [
        (0, 0.0, 1000, 10, (0, 1)),
        (1, 12.5, 512, 3, (0,)),  # clamped to len(hash_ids) * 512, as the reference mocker does
        (2, 20.0, 7, 1, None),
    ]


def test_mooncake_bundled_trace() -> None:
    reqs = load_trace(MOONCAKE)
    assert len(reqs) == 12031
    assert reqs[0].hash_ids == tuple(range(14)) and reqs[0].input_length == 6758 and reqs[0].output_length == 500
    assert reqs[1].hash_ids is not None and reqs[1].hash_ids[0] == 0  # shared first block
    assert all(a.arrival_ms <= b.arrival_ms for a, b in zip(reqs, reqs[1:]))


@pytest.mark.parametrize(
    "rows, line, field, msg",
    [
        (
            '{"timestamp": 0, "input_length": 5, "output_length": 1}\n{"timestamp": 1, "input_length": 5\n',
            2,
            None,
            "not valid JSON",
        ),
        ('{"timestamp": 0, "output_length": 1}\n', 1, "input_length", "missing field"),
        ('{"timestamp": 0, "input_length": 5}\n', 1, "output_length", "missing field"),
        ('{"input_length": 5, "output_length": 1}\n', 1, "timestamp", "missing field"),
        ('{"timestamp": 0, "input_length": -5, "output_length": 1}\n', 1, "input_length", "positive integer"),
        ('{"timestamp": 0, "input_length": 5.5, "output_length": 1}\n', 1, "input_length", "positive integer"),
        ('{"timestamp": "soon", "input_length": 5, "output_length": 1}\n', 1, "timestamp", "milliseconds"),
        (
            '{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1, -2]}\n',
            1,
            "hash_ids[1]",
            "-2: expected a non-negative integer",
        ),
        ("[1, 2, 3]\n", 1, None, "JSON object"),
        (
            '{"timestamp": 9, "input_length": 5, "output_length": 1}\n\n'
            '{"timestamp": 3, "input_length": 5, "output_length": 1}\n',
            3,
            "timestamp",
            "arrival order",
        ),
    ],
)
def test_mooncake_malformed_rows(tmp_path: Path, rows: str, line: int, field: str | None, msg: str) -> None:
    p = write(tmp_path, "bad.jsonl", rows)
    with pytest.raises(TraceError, match=msg) as ei:
        load_trace(p)
    assert (ei.value.path, ei.value.line, ei.value.field) == (str(p), line, field)


@pytest.mark.parametrize(
    "row, field",
    [
        ('{"timestamp": 0, "input_length": 100000000000000000000000000, "output_length": 5}', "input_length"),
        ('{"timestamp": 0, "input_length": 5, "output_tokens": 2147483648}', "output_length"),
    ],
)
def test_mooncake_huge_lengths_are_trace_errors(tmp_path: Path, row: str, field: str) -> None:
    with pytest.raises(TraceError, match=r"expected a positive integer <= 2147483647") as ei:
        load_trace(write(tmp_path, "huge.jsonl", row + "\n"))
    assert (ei.value.line, ei.value.field) == (1, field)


def test_mooncake_empty(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="empty"):
        load_trace(write(tmp_path, "e.jsonl", "\n\n"))


def test_format_sniffing(tmp_path: Path) -> None:
    j = write(tmp_path, "trace.txt", '{"timestamp": 0, "input_length": 5, "output_length": 2}\n')
    c = write(tmp_path, "trace.dat", AZ_HEADER + "2023-11-16 18:15:46.0,5,2\n")
    assert load_trace(j)[0].hash_ids is None
    assert load_trace(c)[0].hash_ids == (0,)


# ---------------------------------------------------------------------------------------------- speedup
def test_scale_arrivals() -> None:
    reqs = synthesize(parse_synthetic_spec("synthetic:constant?rate=2&num_requests=3"))
    assert [r.arrival_ms for r in reqs] == [0.0, 500.0, 1000.0]
    assert [r.arrival_ms for r in scale_arrivals(reqs, 4.0)] == [0.0, 125.0, 250.0]
    assert [r.arrival_ms for r in reqs] == [0.0, 500.0, 1000.0]  # input untouched
    with pytest.raises(ValueError, match="arrival_speedup"):
        scale_arrivals(reqs, 0.0)


# ---------------------------------------------------------------------------------------------- synthetic
def test_synthetic_constant_hand_computed() -> None:
    reqs = load_trace("synthetic:constant?rate=4&duration_s=1&isl=1030&osl=7")
    assert [r.arrival_ms for r in reqs] == [0.0, 250.0, 500.0, 750.0]
    assert all(r.input_length == 1030 and r.output_length == 7 for r in reqs)
    assert [r.hash_ids for r in reqs] == [(0, 1, 2), (3, 4, 5), (6, 7, 8), (9, 10, 11)]


def test_synthetic_deterministic_and_seed_sensitive() -> None:
    spec = "synthetic:poisson?rate=20&duration_s=30&isl=lognormal:800:0.6&osl=uniform:5:50"
    a, b = load_trace(spec, seed=7), load_trace(spec, seed=7)
    assert a == b
    assert load_trace(spec, seed=8) != a
    assert load_trace(spec + "&seed=7", seed=99) == a  # an explicit seed in the spec wins


def test_synthetic_poisson_statistics() -> None:
    reqs = load_trace("synthetic:poisson?rate=50&duration_s=400&seed=3")
    gaps = np.diff([r.arrival_ms for r in reqs])
    n = len(reqs)
    assert abs(n - 20000) < 5 * math.sqrt(20000)  # Poisson count: mean 20000, sd ~141
    assert abs(gaps.mean() - 20.0) < 0.5 and abs(gaps.std() / gaps.mean() - 1.0) < 0.05  # exponential: CV 1
    assert reqs[-1].arrival_ms < 400_000


def test_synthetic_gamma_burstiness() -> None:
    reqs = load_trace("synthetic:gamma?rate=10&num_requests=20000&shape=0.25&seed=1")
    gaps = np.diff([r.arrival_ms for r in reqs])
    assert len(reqs) == 20000
    assert abs(gaps.mean() - 100.0) < 5.0
    assert abs(gaps.std() / gaps.mean() - 2.0) < 0.15  # CV = 1/sqrt(shape) = 2


def test_synthetic_length_distributions() -> None:
    reqs = load_trace("synthetic:constant?rate=100&num_requests=20000&isl=lognormal:1000:0.5&osl=uniform:10:20&seed=2")
    isl = np.array([r.input_length for r in reqs])
    osl = np.array([r.output_length for r in reqs])
    assert abs(isl.mean() - 1000) < 15 and isl.min() >= 1
    assert osl.min() == 10 and osl.max() == 20


def test_synthetic_shared_prefix_groups() -> None:
    reqs = load_trace("synthetic:constant?rate=10&num_requests=200&isl=2000&prefix_groups=3&prefix_len=1100&seed=4")
    heads = {r.hash_ids[:2] for r in reqs if r.hash_ids}  # 1100 tokens -> 2 whole 512-token blocks shared
    assert heads == {(0, 1), (2, 3), (4, 5)}
    tails = [h for r in reqs for h in (r.hash_ids or ())[2:]]
    assert len(tails) == len(set(tails)) and min(tails) >= 6  # everything else unique
    assert all(len(r.hash_ids or ()) == 4 for r in reqs)


@pytest.mark.parametrize(
    "spec, field",
    [
        ("synthetic:weibull?rate=1&num_requests=3", "arrival"),
        ("synthetic:poisson?num_requests=3", "rate"),
        ("synthetic:poisson?rate=-1&num_requests=3", "rate"),
        ("synthetic:poisson?rate=1", "duration_s"),
        ("synthetic:poisson?rate=1&num_requests=0", "num_requests"),
        ("synthetic:poisson?rate=1&num_requests=3&isl=lognormal:10", "isl"),
        ("synthetic:poisson?rate=1&num_requests=3&osl=0", "osl"),
        ("synthetic:poisson?rate=1&num_requests=3&shape=2", "shape"),
        ("synthetic:poisson?rate=1&num_requests=3&color=red", "color"),
        ("synthetic:poisson?rate=1&num_requests=3&prefix_groups=2", "prefix_len"),  # the missing one is named
        ("synthetic:poisson?rate=1&num_requests=3&prefix_len=100", "prefix_groups"),
        # size bounds (duration_s=1e300 used to end in a numpy "Maximum allowed dimension exceeded" traceback)
        ("synthetic:poisson?rate=5&duration_s=1e300", "duration_s"),
        ("synthetic:poisson?rate=5&num_requests=10000001", "num_requests"),
        ("synthetic:poisson?rate=5&num_requests=20000000&duration_s=2000001", "duration_s"),
        ("synthetic:poisson?rate=1&num_requests=3&isl=3000000000", "isl"),
        ("synthetic:poisson?rate=1&num_requests=3&osl=uniform:1:3000000000", "osl"),
        ("synthetic:poisson?rate=1&num_requests=3&isl=lognormal:3e9:0.1", "isl"),
    ],
)
def test_synthetic_bad_specs(spec: str, field: str) -> None:
    with pytest.raises(TraceError) as ei:
        load_trace(spec)
    assert ei.value.field == field and field in str(ei.value)


@settings(max_examples=40, deadline=None)
@given(
    kind=st.sampled_from(["constant", "poisson", "gamma"]),
    rate=st.floats(0.1, 100),
    n=st.integers(1, 300),
    seed=st.integers(0, 2**32),
    groups=st.integers(0, 4),
)
def test_synthetic_invariants(kind: str, rate: float, n: int, seed: int, groups: int) -> None:
    spec = f"synthetic:{kind}?rate={rate}&num_requests={n}&isl=uniform:1:3000&osl=uniform:1:100&seed={seed}"
    if groups:
        spec += f"&prefix_groups={groups}&prefix_len=1024"
    reqs = load_trace(spec)
    assert len(reqs) == n and [r.request_id for r in reqs] == list(range(n))
    assert reqs[0].arrival_ms == 0.0
    assert all(a.arrival_ms <= b.arrival_ms for a, b in zip(reqs, reqs[1:]))
    for r in reqs:
        assert r.hash_ids is not None and len(r.hash_ids) == max(1, -(-r.input_length // 512))
        assert r.input_length >= 1 and r.output_length >= 1
    assert reqs == load_trace(spec)


mooncake_rows = st.lists(
    st.tuples(
        st.integers(0, 5000),  # gap to previous timestamp (ms)
        st.integers(1, 20000),  # input_length
        st.integers(1, 2000),  # output_length
        st.booleans(),  # with hash_ids?
        st.sampled_from(
            [("timestamp", "input_length", "output_length"), ("created_time", "input_tokens", "output_tokens")]
        ),
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=50, deadline=None)
@given(mooncake_rows)
def test_mooncake_round_trip(rows: list[tuple[int, int, int, bool, tuple[str, str, str]]]) -> None:
    import json as _json
    import tempfile

    t, next_id, lines, expect = 0, 0, [], []
    for gap, isl, osl, with_ids, (kt, ki, ko) in rows:
        t += gap
        obj: dict[str, object] = {kt: t, ki: isl, ko: osl}
        ids = None
        if with_ids:
            k = -(-isl // 512)
            ids = tuple(range(next_id, next_id + k))
            next_id += k
            obj["hash_ids"] = list(ids)
        lines.append(_json.dumps(obj))
        expect.append((float(t), isl, osl, ids))
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "t.jsonl"
        p.write_text("\n".join(lines) + "\n")
        got = load_trace(p)
    assert [(r.arrival_ms, r.input_length, r.output_length, r.hash_ids) for r in got] == expect
    assert [r.request_id for r in got] == list(range(len(rows)))


def test_synthetic_size_bounds_are_inclusive_and_lognormal_is_clipped() -> None:
    # rate x duration_s within the bound even though num_requests alone is above it: the smaller one counts
    w = parse_synthetic_spec("synthetic:constant?rate=1&duration_s=3&num_requests=10000001&isl=2147483647")
    reqs = synthesize(w)
    assert [r.arrival_ms for r in reqs] == [0.0, 1000.0, 2000.0] and {r.input_length for r in reqs} == {2**31 - 1}
    # a heavy lognormal tail never yields a length above the trace bound (or an int64 overflow)
    w = parse_synthetic_spec("synthetic:constant?rate=1&num_requests=200&osl=lognormal:2000000000:3&seed=3")
    osl = [r.output_length for r in synthesize(w)]
    assert max(osl) == 2**31 - 1 and min(osl) >= 1


def test_synthetic_zero_prefix_groups_or_len_says_at_least_one() -> None:
    # both given: "must be given together" was wrong; the zero is the mistake
    with pytest.raises(TraceError) as ei:
        load_trace("synthetic:constant?rate=2&duration_s=120&prefix_groups=0&prefix_len=100")
    assert ei.value.field == "prefix_groups" and "prefix_groups=0: expected an integer >= 1" in str(ei.value)
    assert "together" not in str(ei.value)
    with pytest.raises(TraceError) as ei:
        load_trace("synthetic:constant?rate=2&duration_s=120&prefix_groups=3&prefix_len=0")
    assert ei.value.field == "prefix_len" and "prefix_len=0: expected an integer >= 1" in str(ei.value)


def test_synthetic_prefix_shorter_than_a_block_is_refused() -> None:
    # 100 tokens // 512-token blocks = 0 shared blocks: the prefix groups would share nothing
    spec = "synthetic:constant?rate=2&num_requests=4&prefix_groups=2&prefix_len="
    with pytest.raises(TraceError) as ei:
        load_trace(spec + "100")
    assert ei.value.field == "prefix_len"
    assert "prefix_len=100: shorter than one trace block (trace_block_size=512 tokens)" in str(ei.value)
    assert str(ei.value).endswith("expected at least 512")
    # one block exactly: accepted, and the requests of a group share their first hash id
    reqs = load_trace(spec + "16", trace_block_size=16)
    by_group: dict[int, set[int]] = {}
    for r in reqs:
        by_group.setdefault(r.hash_ids[0], set()).add(r.request_id)
    assert sum(len(v) for v in by_group.values()) == 4 and len(by_group) <= 2


def test_mooncake_timestamps_are_bounded_and_epoch_ms_is_diagnosed(tmp_path: Path) -> None:
    from mocker.traces import EPOCH_MS_THRESHOLD, MAX_TRACE_TIMESTAMP_MS

    assert pytest.approx(4_503_599_627.370496) == MAX_TRACE_TIMESTAMP_MS  # 2**52 ns in ms
    # float64 ms still resolve 1 ns (1e-6 ms) at the bound, no longer at twice it
    assert np.spacing(MAX_TRACE_TIMESTAMP_MS) < 1e-6 < np.spacing(2 * MAX_TRACE_TIMESTAMP_MS)
    row = '{{"timestamp": {}, "input_length": 10, "output_length": 5}}\n'
    f = tmp_path / "t.jsonl"
    f.write_text(row.format(0) + row.format(4_503_599_627))  # just inside: accepted
    assert [r.arrival_ms for r in load_trace(f)] == [0.0, 4_503_599_627.0]
    f.write_text(row.format(0) + row.format("1e308"))
    with pytest.raises(
        TraceError,
        match=r"t.jsonl:2: field 'timestamp' 1e\+308 ms: expected milliseconds since the "
        r"trace start, at most 4.504e\+09 ms",
    ):
        load_trace(f)
    f.write_text(row.format(1_700_000_000_000) + row.format(1_700_000_001_000))
    assert EPOCH_MS_THRESHOLD <= 1_700_000_000_000
    with pytest.raises(
        TraceError,
        match=r"t.jsonl:1: field 'timestamp' 1.7e\+12 ms looks like Unix epoch milliseconds "
        r"\(2023-11-14T22:13:20Z\); expected milliseconds since the trace start",
    ):
        load_trace(f)


def test_azure_epoch_millisecond_timestamps_are_refused_naming_the_row(tmp_path):
    # numpy reads a bare number as a year; the row-by-row check names it (1.7e12 ms would be a 54,000-year trace)
    f = tmp_path / "epoch.csv"
    f.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n1700158546680,374,44\n1700158546690,374,44\n")
    with pytest.raises(
        TraceError, match=r"epoch.csv:2: field 'TIMESTAMP' '1700158546680': unparsable timestamp \(a bare"
    ):
        load_trace(str(f))


# ---------------------------------------------------------------------------------------------- fresh-user findings
def test_gamma_arrivals_beyond_the_request_bound_are_refused_while_drawn() -> None:
    # shape 1e-10: almost every gap is 0, so the draw never reached duration_s (it ran out of memory)
    with pytest.raises(TraceError) as ei:
        load_trace("synthetic:gamma?rate=2&duration_s=60&shape=1e-10")
    msg = str(ei.value)
    assert ei.value.field == "shape"
    assert "rate=2, duration_s=60, shape=1e-10" in msg and "expected at most 10,000,000" in msg
    # a small shape that stays under the bound still gives its (bursty, larger than rate x duration) count
    assert len(load_trace("synthetic:gamma?rate=2&duration_s=60&shape=0.01&seed=1")) > 0


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ("synthetic:poisson?rate=２&duration_s=60", "rate"),
        ("synthetic:poisson?rate=2&duration_s=6_0", "duration_s"),
        ("synthetic:poisson?rate=2&duration_s=60&isl=1_00", "isl"),
        ("synthetic:poisson?rate=2&duration_s=60&osl=uniform:1:1_0", "osl"),
        ("synthetic:poisson?rate=2&duration_s=60&isl=lognormal:１00:0.5", "isl"),
        ("synthetic:poisson?rate=2&num_requests=1_0", "num_requests"),
        ("synthetic:poisson?rate=2&num_requests=10&seed=٣", "seed"),
        ("synthetic:poisson?rate=2&num_requests=10&prefix_groups=1_0&prefix_len=512", "prefix_groups"),
    ],
)
def test_synthetic_numbers_take_the_settings_grammar_only(spec: str, field: str) -> None:
    with pytest.raises(TraceError) as ei:
        load_trace(spec)
    assert ei.value.field == field, str(ei.value)


def test_synthetic_numbers_in_the_grammar_still_read() -> None:
    w = parse_synthetic_spec("synthetic:poisson?rate=2e0&duration_s=.5e2&isl=uniform:1e1:20&osl=lognormal:200:0.5")
    assert (w.rate_rps, w.duration_s, w.isl.a, w.isl.b, w.osl.a) == (2.0, 50.0, 10.0, 20.0, 200.0)


def test_lognormal_sigma_beyond_the_bound_is_refused() -> None:
    from mocker.traces import MAX_LOGNORMAL_SIGMA

    # sigma 100: mu = ln(1000) - 5000, every draw rounded to 1 token, not a mean of 1000
    with pytest.raises(TraceError, match=r"field 'isl' 'lognormal:1000:100': .*SIGMA from 0 to 3\)"):
        load_trace("synthetic:poisson?rate=2&num_requests=2&isl=lognormal:1000:100")
    with pytest.raises(TraceError, match="field 'osl'"):
        load_trace("synthetic:poisson?rate=2&num_requests=2&osl=lognormal:1000:3.01")
    # at the bound the mean still holds roughly (0.85 MEAN over 1,000 draws), below it closely
    reqs = load_trace(f"synthetic:constant?rate=1&num_requests=4000&isl=lognormal:1000:{MAX_LOGNORMAL_SIGMA}&seed=2")
    assert 500 < np.mean([r.input_length for r in reqs]) < 1500
    reqs = load_trace("synthetic:constant?rate=1&num_requests=4000&isl=lognormal:1000:1.5&seed=2")
    assert 900 < np.mean([r.input_length for r in reqs]) < 1100


@pytest.mark.parametrize("bad", ["1_000", "１００", "\u0661\u0662", "1\x0b", "1.0", " 1_0 "])
@pytest.mark.parametrize("column", ["ContextTokens", "GeneratedTokens"])
def test_azure_token_columns_take_the_settings_grammar_only(tmp_path: Path, bad: str, column: str) -> None:
    # numpy's astype(np.int64) (Python's int()) took 1_000 and non-ASCII digits
    row = {"ContextTokens": "374", "GeneratedTokens": "44", column: bad}
    f = write(
        tmp_path,
        "t.csv",
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.0,5,6\n"
        f'2023-11-16 18:15:47.0,"{row["ContextTokens"]}","{row["GeneratedTokens"]}"\n',
    )
    with pytest.raises(TraceError) as ei:
        load_azure_csv(f)
    assert (ei.value.line, ei.value.field) == (3, column) and repr(bad) in str(ei.value)


def test_azure_token_columns_still_take_signs_and_spaces(tmp_path: Path) -> None:
    f = write(
        tmp_path,
        "t.csv",
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.0, +374 ,\t44\n2023-11-16 18:15:47.0,0012,7\n",
    )
    assert [(r.input_length, r.output_length) for r in load_azure_csv(f)] == [(374, 44), (12, 7)]


def test_a_uniform_length_with_min_above_max_says_so() -> None:
    with pytest.raises(TraceError, match=r"'uniform:10:5': MIN 10 above MAX 5, expected MIN <= MAX") as ei:
        load_trace("synthetic:poisson?rate=1&duration_s=10&isl=uniform:10:5")
    assert ei.value.field == "isl"
    # a bound out of range is still the general message
    with pytest.raises(TraceError, match=r"expected a positive integer, 'uniform:MIN:MAX'"):
        load_trace("synthetic:poisson?rate=1&duration_s=10&osl=uniform:0:5")


@pytest.mark.parametrize(
    "row, field, msg",
    [
        ('{"timestamp": NaN, "input_length": 10, "output_length": 5}', "timestamp", "NaN: not a JSON number"),
        ('{"timestamp": 0, "input_length": -Infinity, "output_length": 5}', "input_length", "-Infinity: not a JSON"),
        # an error between values names no field: the decoder's own message
        ('{"timestamp": 0, "input_length": 10 "output_length": 5}', None, r"not valid JSON: .*\(byte 36\)"),
    ],
)
def test_a_non_json_number_names_its_field(tmp_path: Path, row: str, field: str | None, msg: str) -> None:
    p = write(tmp_path, "bad.jsonl", row + "\n")
    with pytest.raises(TraceError, match=msg) as ei:
        load_trace(p)
    assert (ei.value.line, ei.value.field) == (1, field)


EMPTY = "empty (a doubled '&', or one at an end)"


@pytest.mark.parametrize(
    "query, item",
    [
        # each was accepted: parse_qsl drops an empty item, so a mistyped spec ran as if it were well formed
        ("rate=1&&duration_s=10", f"item 2 '' is {EMPTY}"),
        ("rate=1&duration_s=10&", f"item 3 '' is {EMPTY}"),
        ("&rate=1&duration_s=10", f"item 1 '' is {EMPTY}"),
        ("rate=1& &duration_s=10", "item 2 ' ' is blank"),
        ("rate=1&=5&duration_s=10", "item 2 '=5' is without a key"),  # was "field '' unknown parameter"
    ],
)
def test_synthetic_empty_items_are_refused(query: str, item: str) -> None:
    spec = f"synthetic:poisson?{query}"
    with pytest.raises(TraceError) as ei:
        load_trace(spec)
    assert str(ei.value) == f"{spec}: {item}; expected key=value items joined by '&'"
    assert ei.value.field is None and ei.value.line is None


@pytest.mark.parametrize("kind", ["missing", "directory", "device"])
def test_a_trace_path_that_is_no_file_says_what_it_is_and_what_was_expected(tmp_path: Path, kind: str) -> None:
    # was: "DIR: not a regular file" and "-: trace file not found", neither saying what a trace is
    path = {"missing": str(tmp_path / "nope.csv"), "directory": str(tmp_path), "device": os.devnull}[kind]
    what = {"missing": "trace file not found", "directory": "is a directory", "device": "not a regular file"}[kind]
    with pytest.raises(TraceError) as ei:
        load_trace(path)
    assert str(ei.value) == (
        f"{path}: {what}; expected a trace file (Azure CSV or Mooncake JSONL) or a synthetic:KIND?... spec"
    )


def test_synthetic_values_are_read_literally() -> None:
    # was: parse_qsl URL-decoded every value: '+' became a space (rate=1e+1 refused as '1e 1') and %30 became '0'
    # (isl=1%300 ran as isl=100)
    plus = load_trace("synthetic:constant?rate=1e+1&duration_s=1&isl=50&osl=5")
    ten = load_trace("synthetic:constant?rate=10&duration_s=1&isl=50&osl=5")
    assert [(r.arrival_ms, r.input_length, r.output_length) for r in plus] == [
        (r.arrival_ms, r.input_length, r.output_length) for r in ten
    ]
    assert [r.arrival_ms for r in ten] == [100.0 * i for i in range(10)]
    spec = "synthetic:poisson?rate=1&duration_s=10&isl=1%300"
    with pytest.raises(TraceError) as ei:
        load_trace(spec)
    assert ei.value.field == "isl"
    assert str(ei.value).startswith(f"{spec}: field 'isl' '1%300': expected a positive integer")


def test_synthetic_spec_without_a_query_still_names_the_missing_rate() -> None:
    # an empty query has no items to refuse: the first missing key is named as before
    for spec in ("synthetic:poisson", "synthetic:poisson?"):
        with pytest.raises(TraceError) as ei:
            load_trace(spec)
        assert ei.value.field == "rate"


ROW = b'{"timestamp": 0, "input_length": 100, "output_length": 10'


@pytest.mark.parametrize(
    "second_row, column",
    [
        # each was accepted: the typed decoder skips an unknown field without checking its bytes
        (ROW + b', "note": "a\xffb"}', len(ROW + b', "note": "a') + 1),  # in an unknown field's value
        (ROW + b', "no\xfete": 1}', len(ROW + b', "no') + 1),  # in an unknown key
        (ROW + b', "hash_ids": [1], "\xc3": 2}', len(ROW + b', "hash_ids": [1], "') + 1),  # a cut 2-byte sequence
        (b"\xff" + ROW + b"}", 1),  # before the object (was reported as "not valid JSON")
    ],
)
def test_mooncake_non_utf8_names_file_line_and_column(tmp_path: Path, second_row: bytes, column: int) -> None:
    p = tmp_path / "t.jsonl"
    p.write_bytes(ROW + b"}\n" + second_row + b"\n")
    with pytest.raises(TraceError) as ei:
        load_trace(p)
    bad = second_row[column - 1]
    assert str(ei.value) == f"{p}:2: byte 0x{bad:02x} at column {column}: expected UTF-8 text"
    assert (ei.value.line, ei.value.field) == (2, None)


@pytest.mark.parametrize("name", ["bom.jsonl", "bom.txt"])  # by its suffix and sniffed
def test_mooncake_utf8_bom_is_not_content(tmp_path: Path, name: str) -> None:
    # Windows Notepad writes a byte-order mark first; it was "t.jsonl:1: not valid JSON: ... invalid character
    # (byte 0)" (and a sniffed file was read as a CSV)
    text = (
        b'{"timestamp": 0, "input_length": 1000, "output_length": 10, "hash_ids": [7, 8]}\r\n'
        b'{"created_time": 250.5, "input_tokens": 600, "output_tokens": 3, "note": "caf\xc3\xa9"}\n'
    )
    bom = tmp_path / name
    bom.write_bytes(b"\xef\xbb\xbf" + text)
    plain = tmp_path / f"plain{Path(name).suffix}"
    plain.write_bytes(text)
    got = load_trace(bom)
    assert [(r.request_id, r.arrival_ms, r.input_length, r.output_length, r.hash_ids) for r in got] == [
        (0, 0.0, 1000, 10, (7, 8)),
        (1, 250.5, 600, 3, None),
    ]
    assert got == load_trace(plain)


def test_mooncake_bom_counts_in_a_first_line_column(tmp_path: Path) -> None:
    # a column counts the file's bytes, the mark's three too, as the CSV reader's message does
    p = tmp_path / "t.jsonl"
    p.write_bytes(b"\xef\xbb\xbf" + ROW + b', "note": "a\xffb"}\n')
    with pytest.raises(TraceError) as ei:
        load_trace(p)
    assert str(ei.value) == f"{p}:1: byte 0xff at column 73: expected UTF-8 text"  # 70 without the mark
    c = tmp_path / "t.csv"
    c.write_bytes(b"\xef\xbb\xbfTIMESTAMP,Cont\xffextTokens,GeneratedTokens\n2023-11-16 18:15:46.0,374,44\n")
    with pytest.raises(TraceError) as ei:
        load_trace(c)
    assert str(ei.value) == f"{c}:1: byte 0xff at column 18: expected UTF-8 text"  # 15 without the mark


def test_mooncake_utf8_text_in_an_unknown_field_is_accepted(tmp_path: Path) -> None:
    p = tmp_path / "t.jsonl"
    p.write_bytes(ROW + ', "note": "café ✓"}\n'.encode())
    assert [(r.arrival_ms, r.input_length, r.output_length) for r in load_trace(p)] == [(0.0, 100, 10)]


@pytest.mark.parametrize(
    "spec, field, says",
    [
        # was: "field 'duration_s' '10': about inf requests", the duration blamed for the rate's excess
        (
            "synthetic:poisson?rate=1e308&duration_s=10",
            "duration_s",
            "field 'duration_s' '10' x rate '1e308': more than 1e+308 requests; expected at most 10,000,000 "
            "(num_requests, or rate x duration_s)",
        ),
        (
            "synthetic:poisson?rate=1e9&duration_s=10",
            "duration_s",
            "field 'duration_s' '10' x rate '1e9': about 1e+10 requests; expected at most 10,000,000",
        ),
        # the count asked for outright is named alone (with a duration too, the smaller of the two counts is drawn)
        (
            "synthetic:poisson?rate=10&num_requests=20000000",
            "num_requests",
            "field 'num_requests' '20000000': about 2e+07 requests; expected at most 10,000,000",
        ),
    ],
)
def test_too_many_synthetic_requests_name_the_fields_that_make_the_count(spec: str, field: str, says: str) -> None:
    with pytest.raises(TraceError) as ei:
        load_trace(spec)
    assert ei.value.field == field
    assert says in str(ei.value)


OK_ROW = '"timestamp": 0, "input_length": 5, "output_length": 2'


@pytest.mark.parametrize(
    "row, says",
    [
        # was: Python's spelling of the JSON literals (True, None) in a message about a JSON file
        ('"timestamp": true, "input_length": 5, "output_length": 2', "field 'timestamp' true: expected a finite"),
        ('"timestamp": 0, "input_length": false, "output_length": 2', "field 'input_length' false: expected a"),
        ('"timestamp": 0, "input_length": 5, "output_length": null', "field 'output_length' null: expected a"),
        (OK_ROW + ', "hash_ids": [4, true]', "field 'hash_ids[1]' true: expected a non-negative integer"),
        (OK_ROW + ', "hash_ids": {"a": [1, null]}', "field 'hash_ids' {\"a\":[1,null]}: expected a list"),
        # strings keep their quotes as the field names do
        ('"timestamp": "x", "input_length": 5, "output_length": 2', "field 'timestamp' 'x': expected a finite"),
    ],
)
def test_a_json_row_s_bad_value_is_shown_in_json_words(tmp_path: Path, row: str, says: str) -> None:
    f = tmp_path / "t.jsonl"
    f.write_text("{" + row + "}\n")
    with pytest.raises(TraceError) as ei:
        load_trace(str(f))
    assert f"t.jsonl:1: {says}" in str(ei.value)


def test_an_azure_row_out_of_order_is_named_with_both_stamps_as_written(tmp_path: Path) -> None:
    # 18:15:40 at +02:00 is 16:15:40 UTC, before the first row's 18:15:46 UTC; was: the stamp shown without its
    # offset ('2023-11-16 18:15:40.000000', which reads as later) and the previous one not shown
    f = tmp_path / "o.csv"
    f.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900+00:00,374,44\n"
        "2023-11-16 18:15:40.0000000+02:00,374,44\n"
    )
    with pytest.raises(TraceError) as ei:
        load_trace(str(f))
    assert str(ei.value) == (
        f"{f}:3: field 'TIMESTAMP' '2023-11-16 18:15:40.0000000+02:00' is earlier than the previous row's "
        "'2023-11-16 18:15:46.6805900+00:00'; rows must be in arrival order (dynoplan does not reorder traces)"
    )
    # an offset that puts the second row after the first: 17:15:50 at -01:00 is 18:15:50 UTC, 3.319 s later
    f.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900+00:00,374,44\n"
        "2023-11-16 17:15:50.0000000-01:00,374,44\n"
    )
    assert [r.arrival_ms for r in load_trace(str(f))] == [0.0, 3319.0]
