"""Machine-readable decision reasons (``Reason``, a str Enum: the value is the wire/metric name)."""

from __future__ import annotations

from enum import Enum


class Reason(str, Enum):  # noqa: UP042  # StrEnum would change str() of a member (the value, not "Reason.X")
    # actions
    SCALE_UP_THROUGHPUT = "scale_up_throughput"
    """Throughput loop: predicted demand needs more replicas."""
    SCALE_DOWN_THROUGHPUT = "scale_down_throughput"
    """Throughput loop: predicted demand fits fewer replicas (beyond the hysteresis band)."""
    SCALE_UP_TTFT = "scale_up_ttft"
    """Load loop: every engine's estimated TTFT is over the SLA."""
    SCALE_UP_ITL = "scale_up_itl"
    """Load loop: every engine's estimated ITL is over the SLA."""
    SCALE_DOWN_CONSOLIDATED = "scale_down_consolidated"
    """Load loop: every engine under SLA x sensitivity and N-1 replicas absorb the load."""
    RAISED_TO_THROUGHPUT_FLOOR = "raised_to_throughput_floor"
    """Both loops on: the throughput result is the floor under the load loop."""
    # limits
    CAPPED_BY_BUDGET = "capped_by_budget"
    CAPPED_BY_MAX_REPLICAS = "capped_by_max_replicas"
    RAISED_TO_MIN_REPLICAS = "raised_to_min_replicas"
    RAISED_TO_MIN_GPU_BUDGET = "raised_to_min_gpu_budget"
    REBALANCE_DECREASE_FIRST = "rebalance_decrease_first"
    # state machine
    PENDING_TIMEOUT_REPLAN = "pending_timeout_replan"
    """The previous decision was not reflected in ready replicas within pending_timeout_s: re-planned."""
    ADOPTED_EXTERNAL_CHANGE = "adopted_external_change"
    """Replicas were changed by someone else: adopted as the current state, not reverted."""
    # holds
    HOLD_STEADY = "hold_steady"
    HOLD_THROUGHPUT_FLOOR = "hold_throughput_floor"
    """Both loops on: the load loop would scale down, but the throughput result is the floor."""
    HOLD_WITHIN_SLA = "hold_within_sla"
    """Load loop: every engine within the SLA; sizing by simulation: the current fleet is undecided (its sample
    neither passes nor fails the target), so it is kept."""
    HOLD_COOLDOWN = "hold_cooldown"
    HOLD_EXTERNAL_GRACE = "hold_external_grace"
    HOLD_PENDING = "hold_pending"
    HOLD_METRICS_UNKNOWN = "hold_metrics_unknown"
    HOLD_REGRESSION_WARMING_UP = "hold_regression_warming_up"
    HOLD_REGRESSION_DEGENERATE = "hold_regression_degenerate"
    HOLD_WARMING_UP = "hold_warming_up"
    HOLD_NOT_DUE = "hold_not_due"

    def __str__(self) -> str:
        return self.value


ACTION_REASONS = frozenset(
    {
        Reason.SCALE_UP_THROUGHPUT,
        Reason.SCALE_DOWN_THROUGHPUT,
        Reason.SCALE_UP_TTFT,
        Reason.SCALE_UP_ITL,
        Reason.SCALE_DOWN_CONSOLIDATED,
        Reason.RAISED_TO_THROUGHPUT_FLOOR,
    }
)
