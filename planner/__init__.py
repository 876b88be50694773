"""planner: SLA-driven autoscaling decisions for LLM serving fleets.

``planner.core`` is pure decision logic (observations in, decision and diagnostics out; no I/O, no clock).
Drivers around it (closed-loop simulation, local stack, Kubernetes operator) own time and effects.
"""

__version__ = "0.1.0"
