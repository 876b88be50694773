"""The planner's names for the project's exceptions; the tree and its docs are in :mod:`dynoplan.errors`."""

from __future__ import annotations

from dynoplan.errors import ConfigError, ObservationError, ProfileError, TraceError
from dynoplan.errors import DynoplanError as PlannerError

__all__ = ["ConfigError", "ObservationError", "PlannerError", "ProfileError", "TraceError"]
