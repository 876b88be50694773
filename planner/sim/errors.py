"""The closed-loop simulation's exception; the tree and its docs are in :mod:`dynoplan.errors`."""

from __future__ import annotations

from dynoplan.errors import SimulationConfigError

__all__ = ["SimulationConfigError"]
