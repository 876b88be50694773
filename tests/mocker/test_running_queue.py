"""The running queue after requests finish (VllmCore._drop_finished): survivors keep their admission order,
whether a few finish (removed one by one) or many at once (one filtering pass), on the single-pass path
(step) and on the fast-forward path (advance_until: decode cohort stretches)."""

from __future__ import annotations

import pytest

from mocker.config import EngineConfig
from mocker.engine import VllmCore
from mocker.records import TraceRequest


def _core_with(outputs: list[int]) -> VllmCore:
    core = VllmCore(EngineConfig())
    for i, osl in enumerate(outputs):
        core.add_request(TraceRequest(i, 0.0, 100, osl), 0.0)
    return core


# request i emits outputs[i] tokens; all are admitted in the first pass (token i at pass i - 1 for each)
@pytest.mark.parametrize(
    "outputs",
    [
        [5, 3, 5, 3, 5],  # two finish together (the one-by-one removal)
        [8] * 3 + [4] * 12 + [8] * 3,  # twelve finish together (the filtering pass)
    ],
    ids=["few", "many"],
)
@pytest.mark.parametrize("fast", [False, True], ids=["step", "advance_until"])
def test_survivors_keep_admission_order(outputs, fast):
    core = _core_with(outputs)
    short = min(outputs)
    if fast:
        core.advance_until(core.next_pass_ms + 1e-9)  # the admission pass alone
        # stop right after the pass in which the shortest requests emit their last token
        while core.pass_index < short:
            core.advance_until(core.next_pass_ms + 1e-9)
    else:
        for _ in range(short):
            core.step(core.next_pass_ms)
    core.check_invariants()
    expect = [i for i, osl in enumerate(outputs) if osl > short]
    assert [r.request_id for r in core.running] == expect
    assert core.finished_total == len(outputs) - len(expect)
    # the rest run to the end
    core.advance_until(float("inf"))
    core.finalize()
    assert core.finished_total == len(outputs) and not core.running
    recs = {r.request_id: r.record for r in core.all_requests}
    assert [len(recs[i].token_times_ms) for i in range(len(outputs))] == outputs
