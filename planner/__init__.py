"""planner: SLA-driven autoscaling decisions for LLM serving fleets.

``planner.core`` is pure decision logic (observations in, decision and diagnostics out; no I/O, no clock).
Drivers around it (closed-loop simulation, local stack, Kubernetes operator) own time and effects.
"""

import dynoplan  # noqa: F401  (first: its process defaults precede any numpy import, dynoplan/__init__.py)

__version__ = "0.1.0"
