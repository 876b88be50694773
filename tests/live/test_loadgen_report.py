"""The loadgen's client-side report and table: only what a client measures, and coalesced token reads named."""

from __future__ import annotations

from rich.console import Console

from mocker.live.loadgen import LoadgenResult, client_report
from mocker.records import RequestRecord
from mocker.report import render_table


def _rec(rid: int, arrival: float, times: list[float]) -> RequestRecord:
    return RequestRecord(
        rid,
        arrival,
        100,
        len(times),
        admit_ms=arrival,
        first_token_ms=times[0],
        token_times_ms=list(times),
        finish_ms=times[-1],
        status="finished",
    )


def _text(table) -> str:  # type: ignore[no-untyped-def]
    c = Console(record=True, width=120)
    c.print(table)
    return c.export_text()


def test_coalesced_itl_ratio_hand_computed() -> None:
    # request 0: gaps 0, 5, 0 (two reads carried two tokens each); request 1: gaps 4, 4 -> 2 of 5 gaps coalesced
    res = LoadgenResult(records=[_rec(0, 0.0, [10.0, 10.0, 15.0, 15.0]), _rec(1, 1.0, [20.0, 24.0, 28.0])], wall_s=1.0)
    rep = client_report(res)
    assert rep["coalesced_itl_ratio"] == 2 / 5
    assert rep["num_itl_samples"] == 5 and rep["min_itl_ms"] == 0.0
    res = LoadgenResult(records=[_rec(0, 0.0, [10.0, 12.0]), _rec(1, 0.0, [3.0])], wall_s=1.0)
    assert client_report(res)["coalesced_itl_ratio"] == 0.0


def test_client_table_has_no_fleet_rows() -> None:
    rep = client_report(LoadgenResult(records=[_rec(0, 0.0, [10.0, 14.0, 18.0])], wall_s=1.0))
    client = _text(render_table(rep, title="dynoplan loadgen (client-side)", client_side=True))
    assert "dynoplan loadgen (client-side)" in client and "dynoplan replay" not in client
    for gone in (
        "engine / workers",
        "x 0",
        "simulated duration",
        "prefix cache reuse",
        "preemptions",
        "worker-seconds",
    ):
        assert gone not in client, gone
    assert "duration (s)" in client and "TTFT" in client and "ITL" in client
    offline = _text(render_table(rep))  # the replay table keeps its rows
    assert "dynoplan replay" in offline and "worker-seconds" in offline and "simulated duration" in offline
