"""Pools and workers of a :class:`mocker.fleet.Fleet`: the observation records a planner reads
(:class:`PoolCounts`, :class:`EngineState`), the fleet's bookkeeping of one worker (:class:`FleetWorker`, its
lifecycle starting -> ready -> draining -> released) and of one pool (:class:`Pool`: its router, workers,
routable cores and fleet queue), and the kinds of events on the fleet's heap (:class:`FleetEvent`)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any, Final

from mocker.config import EngineConfig
from mocker.engine.sglang import SglangCore
from mocker.engine.vllm import VllmCore
from mocker.records import RequestRecord
from mocker.routers import KvRouter, Router

if TYPE_CHECKING:
    from mocker.fleet.handoff import Flight

Core = VllmCore | SglangCore
"""An engine core of a worker (one DP rank; TrtllmCore is a VllmCore). Compiled, attribute reads and method
calls on it are native (a type test per class), not Python attribute lookups."""

POOLS_AGG = ("agg",)
POOLS_DISAGG = ("prefill", "decode")


class FleetEvent(Enum):
    """Kinds of events on the fleet's heap (keyed ``(time_ms, seq)``; the kind is never compared)."""

    READY = 0
    """A starting worker becomes routable."""
    PREFILL_DONE = 1
    """A disaggregated request's prefill ended: the handoff to the decode pool starts."""
    ACTIVATE = 2
    """A KV transfer ended: the request joins its decode core."""
    RESERVE = 3
    """SGLang destination-first handoff: retry a decode core's pending reservations."""


# The members as Final module globals, which the event loop reads (and compares with ``is``): interpreted, a
# global lookup costs a tenth of an enum attribute lookup (Python 3.11: ~0.01 vs ~0.12 us), several per request;
# compiled (docs/architecture.md "Compiled modules"), a Final global is a C static.
EVENT_READY: Final = FleetEvent.READY
EVENT_PREFILL_DONE: Final = FleetEvent.PREFILL_DONE
EVENT_ACTIVATE: Final = FleetEvent.ACTIVATE
EVENT_RESERVE: Final = FleetEvent.RESERVE


@dataclass(frozen=True)
class PoolCounts:
    """Worker counts of one pool at a moment."""

    requested: int
    """Workers asked for and not being removed: starting + ready."""
    ready: int
    """Workers that receive requests."""
    draining: int
    """Removed workers still finishing what they hold (GPU time still counted)."""
    queued_at_fleet: int
    """Requests waiting at the fleet for a ready worker of this pool."""

    @property
    def starting(self) -> int:
        return self.requested - self.ready


@dataclass(frozen=True)
class EngineState:
    """One DP rank of a ready worker, for saturation / HPA-style policies."""

    pool: str
    worker_id: int
    dp_rank: int
    num_waiting: int
    """Requests queued in the engine (not yet admitted, or preempted)."""
    num_running: int
    """Requests in the running batch."""
    kv_usage: float
    """Active KV blocks / total blocks (0..1), as vLLM's ``kv_cache_usage_perc``."""


class FleetWorker:
    """One worker of a pool: its engine cores (one per DP rank), lifecycle times (ms) and state."""

    __slots__ = (
        "pool",
        "worker_id",
        "cores",
        "requested_ms",
        "ready_ms",
        "drain_ms",
        "released_ms",
        "state",
        "inflight",
        "holds",
    )

    def __init__(self, pool: str, worker_id: int, cores: list[Core], requested_ms: float, ready_ms: float) -> None:
        self.pool = pool
        self.worker_id = worker_id
        self.cores = cores
        self.requested_ms = requested_ms
        self.ready_ms = ready_ms
        self.drain_ms: float | None = None
        self.released_ms: float | None = None
        self.state = "starting"  # starting | ready | draining | released
        self.inflight: list[Flight] = []  # prefill pool: requests whose prefill end is not yet seen
        self.holds = 0  # coordinated handoffs holding / reserving KV on this worker


class Pool:
    """One pool (``agg``, ``prefill`` or ``decode``): its engine config, router, workers, the cores of its ready
    workers (what the router sees) and the fleet queue of requests waiting for a ready worker."""

    __slots__ = (
        "name",
        "cfg",
        "router",
        "needs_state",
        "on_routed",
        "kv_router",
        "workers",
        "ready",
        "cores",
        "queue",
        "next_id",
        "by_id",
    )

    def __init__(self, name: str, cfg: EngineConfig, router: Router) -> None:
        self.name = name
        self.cfg = cfg
        self.router = router
        self.needs_state: bool = router.needs_state
        self.on_routed: Callable[[RequestRecord], None] | None = getattr(router, "on_routed", None)
        self.kv_router: KvRouter | None = router if isinstance(router, KvRouter) else None
        """The router when it is the KV router (it computes the prompts' keys: :meth:`KvRouter.prompt_keys`)."""
        self.workers: list[FleetWorker] = []
        self.ready: list[FleetWorker] = []
        self.cores: list[Core] = []  # ranks of ready workers, in readiness order: what the router sees
        self.queue: deque[Any] = deque()
        self.next_id = 0
        self.by_id: dict[int, FleetWorker] = {}

    def rebuild(self) -> None:
        """Recompute :attr:`cores` after the ready workers changed."""
        self.cores = [c for w in self.ready for c in w.cores]


__all__ = [
    "EVENT_ACTIVATE",
    "EVENT_PREFILL_DONE",
    "EVENT_READY",
    "EVENT_RESERVE",
    "POOLS_AGG",
    "POOLS_DISAGG",
    "EngineState",
    "FleetEvent",
    "Pool",
    "PoolCounts",
    "FleetWorker",
]
