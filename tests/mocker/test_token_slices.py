"""Token times handed over as slices of an engine core's pass end list (``RequestRecord.set_token_slice``): the
record reads like one holding its own list, and the report gives the same bytes whichever form a record holds."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mocker.config import EngineConfig
from mocker.records import RequestRecord, token_slice
from mocker.report import build_report


def _result(records: list[RequestRecord]) -> Any:
    from mocker.fleet import ReplayResult

    return ReplayResult(
        records=records,
        fpm=[],
        duration_ms=max((r.finish_ms or 0.0 for r in records), default=0.0),
        worker_seconds=10.0,
        num_workers=1,
        engine=EngineConfig(),
    )


def test_a_slice_reads_as_the_list_and_is_copied_once() -> None:
    ends = [1.0, 2.5, 4.0, 7.5, 9.0]
    r = RequestRecord(0, 0.0, 10, 3)
    r.set_token_slice(ends, 1, 4)
    assert r.num_tokens == 3
    assert token_slice(r) == (ends, 1, 4)  # not copied by counting
    first = r.token_times_ms
    assert first == [2.5, 4.0, 7.5]
    assert token_slice(r) is None  # the list is the record's own from the first read
    assert r.token_times_ms is first  # the same list on every read, as an attribute
    ends[2] = -1.0  # the core's list is no longer shared
    assert r.token_times_ms == [2.5, 4.0, 7.5]


def test_setting_the_list_drops_the_slice() -> None:
    r = RequestRecord(1, 0.0, 10, 2)
    r.set_token_slice([1.0, 2.0, 3.0], 0, 2)
    r.token_times_ms = [5.0]
    assert token_slice(r) is None
    assert r.token_times_ms == [5.0] and r.num_tokens == 1


def test_equality_and_repr_do_not_depend_on_the_form() -> None:
    a = RequestRecord(2, 1.0, 10, 2, first_token_ms=3.0, finish_ms=4.0, status="finished")
    b = RequestRecord(2, 1.0, 10, 2, first_token_ms=3.0, finish_ms=4.0, status="finished", token_times_ms=[3.0, 4.0])
    a.set_token_slice([0.0, 3.0, 4.0], 1, 3)
    assert a == b and repr(a) == repr(b)
    assert repr(b).startswith("RequestRecord(request_id=2, arrival_ms=1.0, input_length=10, output_length=2, ")
    b.status = "cancelled"
    assert a != b
    assert RequestRecord(3, 0.0, 1, 1).token_times_ms == []  # no tokens: an empty list of its own


@pytest.fixture(params=[65536, 3], ids=["flush-65536", "flush-3"])
def flush_tokens(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> int:
    """The report's conversion block (``mocker.report._FLUSH_TOKENS``): as shipped, and small enough that runs of
    records holding their own lists are converted in several blocks."""
    import mocker.report

    monkeypatch.setattr(mocker.report, "_FLUSH_TOKENS", request.param)
    return int(request.param)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(st.floats(0.0, 1e6, allow_nan=False), min_size=1, max_size=40),
    st.lists(st.tuples(st.integers(0, 39), st.integers(1, 8), st.booleans()), min_size=1, max_size=12),
)
def test_the_report_is_the_same_with_slices_or_lists(
    flush_tokens: int, ends: list[float], spec: list[tuple[int, int, bool]]
) -> None:
    """Records whose tokens are slices of one or two pass end lists, mixed with records holding their own lists
    (in any order): the report's JSON is byte-identical to that of the same records all holding lists."""
    ends = sorted(ends)
    other = [x + 0.5 for x in ends]  # a second core's pass ends
    lazy: list[RequestRecord] = []
    eager: list[RequestRecord] = []
    for i, (a, n, as_slice) in enumerate(spec):
        src = other if i % 3 == 2 else ends
        a = min(a, len(src) - 1)
        b = min(len(src), a + n)
        tokens = src[a:b]
        kw = dict(admit_ms=0.0, first_token_ms=tokens[0], finish_ms=tokens[-1], status="finished")
        r_lazy = RequestRecord(i, 0.0, 100, len(tokens), **kw)  # type: ignore[arg-type]
        if as_slice:
            r_lazy.set_token_slice(src, a, b)
        else:
            r_lazy.token_times_ms = list(tokens)
        lazy.append(r_lazy)
        eager.append(RequestRecord(i, 0.0, 100, len(tokens), token_times_ms=list(tokens), **kw))  # type: ignore[arg-type]
    got = json.dumps(build_report(_result(lazy), sla_ttft_ms=1e5, sla_itl_ms=1e4))
    assert got == json.dumps(build_report(_result(eager), sla_ttft_ms=1e5, sla_itl_ms=1e4))
    assert lazy == eager


def test_a_replay_hands_the_cores_pass_ends_over_as_slices() -> None:
    """The usual case of a replay: every record that emitted in one run of passes holds a slice until read, and
    reading every record gives the same report."""
    from mocker.fleet import FleetConfig, run_replay
    from mocker.records import TraceRequest

    reqs = [TraceRequest(i, 50.0 * i, 200 + 37 * i, 5 + i % 7) for i in range(40)]
    res = run_replay(reqs, EngineConfig(), FleetConfig(num_workers=2))
    sliced = [r for r in res.records if token_slice(r) is not None]
    assert len(sliced) == 40
    before = json.dumps(build_report(res))
    assert all(len(r.token_times_ms) == r.output_length for r in res.records)
    assert all(token_slice(r) is None for r in res.records)
    assert json.dumps(build_report(res)) == before
