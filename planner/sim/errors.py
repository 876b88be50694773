"""Errors of the closed-loop simulation (all :class:`planner.errors.PlannerError`: the CLI prints one line)."""

from __future__ import annotations

from planner.errors import ConfigError


class SimulationConfigError(ConfigError):
    """An invalid simulation setting or policy spec (``problems`` names each field, value and expectation)."""
