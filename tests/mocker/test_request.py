"""Request lifecycle state machine."""

from __future__ import annotations

import pytest

from dynoplan.errors import InvalidTransition, SimulationError
from mocker.records import RequestRecord
from mocker.request import ALLOWED, EngineRequest, State, check_transition


def make() -> EngineRequest:
    return EngineRequest(1, 0, 100, 10, None, RequestRecord(1, 0.0, 100, 10))


def test_happy_path_with_chunks_and_preemption():
    r = make()
    for s in (
        State.PREFILLING,
        State.PREFILLING,
        State.DECODING,
        State.PREEMPTED,
        State.PREFILLING,
        State.DECODING,
        State.FINISHED,
    ):
        r.transition(s)
    assert r.state == State.FINISHED


@pytest.mark.parametrize(
    "old,new",
    [
        (State.WAITING, State.DECODING),
        (State.WAITING, State.FINISHED),
        (State.DECODING, State.PREFILLING),
        (State.DECODING, State.WAITING),
        (State.FINISHED, State.DECODING),
        (State.CANCELLED, State.WAITING),
        (State.PREEMPTED, State.DECODING),
        (State.FAILED, State.PREFILLING),
        (State.FINISHED, State.CANCELLED),
    ],
)
def test_invalid_transitions_raise(old, new):
    with pytest.raises(InvalidTransition, match=f"{old.name} -> {new.name}"):
        check_transition(old, new, 7)


def test_invalid_transition_is_a_simulation_error_naming_the_request():
    r = make()
    with pytest.raises(SimulationError, match="request 1"):
        r.transition(State.DECODING)
    assert r.state == State.WAITING  # unchanged


def test_terminal_states_have_no_exit_and_every_live_state_can_be_cancelled():
    for s in (State.FINISHED, State.CANCELLED, State.FAILED):
        assert not ALLOWED[s]
    for s in (State.WAITING, State.PREFILLING, State.DECODING, State.PREEMPTED):
        assert State.CANCELLED in ALLOWED[s]


def test_emit_ranges_merge_contiguous_passes():
    r = make()
    for p in (3, 4, 5, 9, 10, 12):
        r.note_emit(p)
    assert r.all_emit_ranges() == [(3, 5), (9, 10), (12, 12)]
