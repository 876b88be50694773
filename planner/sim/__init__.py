"""planner.sim: the closed-loop simulation — the one place that wires the mocker fleet and the planner.

Modules: :mod:`~planner.sim.fleet` (pooled dynamic fleet / simulated connector target),
:mod:`~planner.sim.metrics` (simulated frontend metric source), :mod:`~planner.sim.policies` (planner and
baseline policies), :mod:`~planner.sim.loop` (``simulate``), :mod:`~planner.sim.runner` (policy specs,
``static:auto`` search, comparisons), :mod:`~planner.sim.report` (summary, timeline, HTML),
:mod:`~planner.sim.profile` (``dynoplan profile``).
"""
