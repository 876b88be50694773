"""Plain data shared by the engine core, the fleets and the reports.

- :class:`TraceRequest` — one request of a workload (input).
- :class:`RequestRecord` — what happened to one request (output; times in ms of the driving clock).

The per-pass record the engines emit, ForwardPassMetrics, is the project's wire record: :mod:`dynoplan.fpm`.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a workload.

    ``hash_ids``: one id per ``trace_block_size`` tokens of prompt (Mooncake); equal ids mean equal
    content, so shared leading ids are a shared prefix. ``None`` = unique content (no prefix sharing).
    """

    request_id: int
    arrival_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...] | None = None


@dataclass(slots=True)
class RequestRecord:
    """The life of one request, filled in by the engine as it runs. Times in ms of the driving clock."""

    request_id: int
    arrival_ms: float
    input_length: int
    output_length: int
    worker_id: int = -1
    dp_rank: int = 0
    admit_ms: float | None = None
    """First admission into the running batch."""
    first_token_ms: float | None = None
    token_times_ms: list[float] = field(default_factory=list)
    """Emission time of every output token (the first one included)."""
    finish_ms: float | None = None
    cached_tokens: int = 0
    """Prompt tokens served from the prefix cache at first admission."""
    num_preemptions: int = 0
    status: str = "pending"
    """pending | finished | cancelled | failed"""
    prefill_worker_id: int | None = None
    """Disaggregated fleets: the prefill worker (``worker_id`` is then the decode worker)."""

    @property
    def ttft_ms(self) -> float | None:
        return None if self.first_token_ms is None else self.first_token_ms - self.arrival_ms

    @property
    def e2e_ms(self) -> float | None:
        return None if self.finish_ms is None else self.finish_ms - self.arrival_ms
