"""The mocker's names for the project's exceptions; the tree and its docs are in :mod:`dynoplan.errors`."""

from __future__ import annotations

from dynoplan.errors import ConfigError, InvalidTransition, SimulationError, TraceError
from dynoplan.errors import DynoplanError as MockerError

__all__ = ["ConfigError", "InvalidTransition", "MockerError", "SimulationError", "TraceError"]
