"""The live planner service (wall clock): :mod:`planner.live.config` (the stack file),
:mod:`planner.live.service` (tick loop, /api/state, /metrics; the dashboard page is :mod:`planner.dashboard`)."""
