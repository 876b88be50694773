"""The engine-core contract: what every core (:mod:`mocker.engine.vllm`, :mod:`mocker.engine.sglang`) offers
and every driver (the virtual-time fleet :mod:`mocker.fleet`, the wall-clock driver :mod:`mocker.live.driver`)
relies on, plus the helpers the cores share.

- :class:`EngineCore`: the Protocol (times in ms of the driving clock; a core never reads a clock).
- :class:`CoreCapabilities`: what a core can do beyond the Protocol, declared (a class attribute
  ``capabilities``) instead of probed with ``hasattr`` or method identity.
- :class:`PassOutcome`: the result of one :meth:`EngineCore.step`.
- :class:`ScheduleOutcome` and :class:`ScheduledWork`: one request's scheduling within a pass (vLLM core).
- :func:`population_variance`, :func:`queued_requests`: the ForwardPassMetrics arithmetic both cores use.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import ClassVar, NamedTuple, Protocol

from dynoplan.fpm import ForwardPassMetrics, QueuedRequests
from mocker.records import RequestRecord, TraceRequest

FAST_CHUNK_PASSES = 4096
"""Most passes a decode stretch computes at once (bounds the numpy arrays of one fast-forward)."""


@dataclass(frozen=True, slots=True)
class CoreCapabilities:
    """What a core supports beyond :class:`EngineCore` (drivers read these, never probe methods)."""

    block_keys: bool
    """``add_request`` / ``add_prefilled_request`` take ``block_keys=``: the prompt's engine block keys when
    the driver already has them (:func:`mocker.kv.manager.engine_block_keys`; the disaggregated fleet reuses
    the prefill core's keys). False: the core derives its own KV identity (SGLang's radix content)."""
    radix_handoff: bool
    """Disaggregated handoff holds are token slots and radix-tree locks (``hold_tokens`` / ``release_hold``,
    destination-first ``reserve_prefilled``; :class:`mocker.engine.sglang.SglangCore`). False: KV blocks
    of the block manager (``kv.acquire_prefix`` / ``kv.allocate_private``, ``external_private_blocks``)."""


@dataclass(slots=True)
class PassOutcome:
    """Result of one engine pass (times in ms of the driving clock)."""

    start_ms: float
    end_ms: float
    emissions: list[tuple[int, float]] = field(default_factory=list)
    """(request_id, token time) for every token emitted at ``end_ms``."""
    finished: list[int] = field(default_factory=list)
    admitted: list[int] = field(default_factory=list)
    preempted: list[int] = field(default_factory=list)
    rejected: list[int] = field(default_factory=list)
    fpm: ForwardPassMetrics | None = None


class ScheduleOutcome(Enum):
    """What scheduling one request in a pass did (:meth:`mocker.engine.vllm.VllmCore._schedule`)."""

    SCHEDULED = 0
    """Its tokens for this pass are scheduled (KV allocated, budget charged)."""
    BLOCKED = 1
    """Nothing scheduled (budget or KV short): the pass stops scheduling."""
    PREEMPTED_SELF = 2
    """Making room preempted the request itself: it is back in the waiting queue."""


class ScheduledWork(NamedTuple):
    """One request's work in the current pass (tokens)."""

    used_tokens: int
    """Tokens computed this pass (budget charged)."""
    prompt_tokens: int
    """Of which prompt tokens (0: a decode step)."""
    prompt_before: int
    """Prompt tokens computed before this pass (the prefix the prefill model sees); read only when
    ``prompt_tokens > 0``."""


DECODE_STEP = ScheduledWork(1, 0, 0)
"""A decode step: one token, no prompt (shared: ``prompt_before`` is not read for it)."""


class EngineCore(Protocol):
    """One simulated engine (one DP rank), driven by any clock. Times in ms of the driver's clock.

    A driver calls ``add_request`` on arrival and either ``step(now)`` once per pass (live: then sleeps until
    ``out.end_ms`` and delivers ``out.emissions``) or ``advance_until(h)`` (virtual time: every pass starting
    before ``h``, decode stretches fast-forwarded with identical results), then ``finalize()``.
    """

    capabilities: ClassVar[CoreCapabilities]
    worker_id: int
    dp_rank: int
    next_pass_ms: float
    """When the next pass would start (the end of the previous one)."""
    fpm: list[ForwardPassMetrics]
    """Per-pass metrics collected so far (``collect_fpm=True``)."""
    finished_total: int
    preemptions_total: int

    def add_request(self, req: TraceRequest, now_ms: float, record: RequestRecord | None = None) -> RequestRecord:
        """Queue a request arriving at ``now_ms``; returns its record, filled in as it runs."""
        ...

    def add_prefilled_request(
        self, req: TraceRequest, now_ms: float, record: RequestRecord | None = None
    ) -> RequestRecord:
        """Disaggregated decode side: queue a request whose prompt KV and first token a prefill worker computed."""
        ...

    def cancel(self, request_id: int, now_ms: float) -> bool:
        """Cancel a live request (frees its KV); False if unknown or already terminal."""
        ...

    def has_work(self) -> bool: ...

    def step(self, now_ms: float) -> PassOutcome:
        """Run one pass starting at ``now_ms`` (>= :attr:`next_pass_ms`; SimulationError otherwise)."""
        ...

    def advance_until(self, horizon_ms: float) -> None: ...

    def advance_single_step(self, horizon_ms: float) -> None:
        """:meth:`advance_until` one pass at a time (the reference mode of the equivalence tests)."""
        ...

    def release_finished(self) -> list[ForwardPassMetrics]:
        """Forget finished requests and the pass end times no live request needs; returns and forgets the FPMs."""
        ...

    def finalize(self) -> None:
        """Fill ``token_times_ms`` of every record from the pass timeline (once, at the end)."""
        ...

    @property
    def num_running(self) -> int: ...

    @property
    def num_waiting(self) -> int: ...

    def active_blocks(self) -> int:
        """KV blocks (pages) held by requests, shared prefix blocks once."""
        ...

    def check_invariants(self) -> None:
        """Raise SimulationError unless KV is conserved and the queues are consistent."""
        ...


def population_variance(xs: list[int]) -> float:
    """Population variance of ``xs`` (0.0 for fewer than two values), as ForwardPassMetrics' ``var_*`` fields."""
    if len(xs) < 2:
        return 0.0
    m = sum(xs) / len(xs)
    return sum((x - m) ** 2 for x in xs) / len(xs)


def queued_requests(prefill_lens: list[int], decode_lens: list[int]) -> QueuedRequests:
    """The ``queued_requests`` of a ForwardPassMetrics: waiting prompts (their lengths, tokens) and queued
    decodes (preempted / retracted / transferred requests: their sequence lengths, tokens)."""
    return QueuedRequests(
        num_prefill_requests=len(prefill_lens),
        sum_prefill_tokens=sum(prefill_lens),
        var_prefill_length=population_variance(prefill_lens),
        num_decode_requests=len(decode_lens),
        sum_decode_kv_tokens=sum(decode_lens),
        var_decode_kv_tokens=population_variance(decode_lens),
    )


__all__ = [
    "DECODE_STEP",
    "FAST_CHUNK_PASSES",
    "CoreCapabilities",
    "EngineCore",
    "PassOutcome",
    "ScheduleOutcome",
    "ScheduledWork",
    "population_variance",
    "queued_requests",
]
