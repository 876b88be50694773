"""Request lifecycle inside one engine core: states, allowed transitions, and the mutable per-request state.

States and transitions (anything else raises :class:`dynoplan.errors.InvalidTransition`)::

    WAITING ──admit──> PREFILLING ──first token──> DECODING ──last token──> FINISHED
       │                 │  ▲ (more chunks)           │
       │                 │  └──────┐                  │
       │                 ├──preempt──> PREEMPTED <────┤  (recompute: KV freed, re-queued at the front)
       │                 │               │ └──admit──> PREFILLING
       │                 └──last token (output of 1)──> FINISHED
       └── cancel (from any non-terminal state) ──> CANCELLED;  FAILED: rejected (prompt can never fit)

:class:`EngineRequest` is plain mutable data (``__slots__``) owned by one engine core; the per-request
output record (:class:`mocker.records.RequestRecord`) is filled in as it runs.
"""

from __future__ import annotations

from enum import IntEnum

from dynoplan.errors import InvalidTransition
from mocker.records import RequestRecord


class State(IntEnum):
    WAITING = 0
    PREFILLING = 1
    DECODING = 2
    PREEMPTED = 3
    FINISHED = 4
    CANCELLED = 5
    FAILED = 6


TERMINAL = frozenset({State.FINISHED, State.CANCELLED, State.FAILED})

ALLOWED: dict[State, frozenset[State]] = {
    State.WAITING: frozenset({State.PREFILLING, State.CANCELLED, State.FAILED}),
    State.PREFILLING: frozenset({State.PREFILLING, State.DECODING, State.PREEMPTED, State.FINISHED, State.CANCELLED}),
    State.DECODING: frozenset({State.FINISHED, State.PREEMPTED, State.CANCELLED}),
    State.PREEMPTED: frozenset({State.PREFILLING, State.CANCELLED, State.FAILED}),
    State.FINISHED: frozenset(),
    State.CANCELLED: frozenset(),
    State.FAILED: frozenset(),
}


def check_transition(old: State, new: State, request_id: int | None = None) -> None:
    """Raise :class:`InvalidTransition` unless ``old -> new`` is allowed."""
    if new not in ALLOWED[old]:
        who = f"request {request_id}: " if request_id is not None else ""
        raise InvalidTransition(f"{who}invalid lifecycle transition {old.name} -> {new.name}")


class EngineRequest:
    """Mutable scheduling state of one request on one engine.

    Token counts: ``seq_len = prompt_len + generated``; ``computed`` = tokens whose KV is computed (after the
    first token the newest token is "dangling", computed in the next pass); ``alloc_tokens`` = tokens covered
    by allocated KV blocks. ``block_keys`` = prefix-cache keys of the prompt's full blocks (None = content
    unique to this request, never shared).
    """

    __slots__ = (
        "request_id",
        "index",
        "prompt_len",
        "output_len",
        "block_keys",
        "state",
        "computed",
        "generated",
        "alloc_tokens",
        "hashed_held",
        "private_blocks",
        "reserved_blocks",
        "record",
        "emit_ranges",
        "emit_start",
        "emit_last",
        "arrival_ms",
        "run_seq",
        "co",
        "co_p0",
        "co_g0",
        "co_a0",
        "co_ver",
    )

    def __init__(
        self,
        request_id: int,
        index: int,
        prompt_len: int,
        output_len: int,
        block_keys: list[int] | None,
        record: RequestRecord,
    ) -> None:
        self.request_id = request_id
        self.index = index
        self.prompt_len = prompt_len
        self.output_len = max(1, output_len)
        self.block_keys = block_keys
        self.state = State.WAITING
        self.computed = 0
        self.generated = 0
        self.alloc_tokens = 0
        self.hashed_held: list[int] = []
        """Prefix-cache keys of blocks this request holds a reference on (in block order)."""
        self.private_blocks = 0
        """Blocks held that are not in the prefix cache (partial, generated or duplicate content)."""
        self.reserved_blocks = 0
        """TRT-LLM GUARANTEED_NO_EVICT reservation (blocks)."""
        self.record = record
        self.emit_ranges: list[tuple[int, int]] = []
        """Closed ranges [a, b] of this worker's pass indices in which a token was emitted."""
        self.emit_start = -1
        self.emit_last = -2
        self.arrival_ms = record.arrival_ms
        self.run_seq = 0
        """Order of (latest) admission: the running queue is sorted by it."""
        # decode-cohort membership (fast path): counters are lazy, valid as of pass co_p0
        self.co = False
        self.co_p0 = 0
        self.co_g0 = 0
        self.co_a0 = 0
        self.co_ver = 0

    @property
    def seq_len(self) -> int:
        return self.prompt_len + self.generated

    def transition(self, new: State) -> None:
        check_transition(self.state, new, self.request_id)
        self.state = new

    def note_emit(self, pass_index: int) -> None:
        """Record that a token was emitted at the end of pass ``pass_index`` (this worker's counter)."""
        if pass_index == self.emit_last + 1 and self.emit_start >= 0:
            self.emit_last = pass_index
            return
        if self.emit_start >= 0:
            self.emit_ranges.append((self.emit_start, self.emit_last))
        self.emit_start = self.emit_last = pass_index

    def all_emit_ranges(self) -> list[tuple[int, int]]:
        out = list(self.emit_ranges)
        if self.emit_start >= 0:
            out.append((self.emit_start, self.emit_last))
        return out
