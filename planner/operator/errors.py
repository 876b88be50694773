"""The operator's exceptions; the tree and its docs are in :mod:`dynoplan.errors`."""

from __future__ import annotations

from dynoplan.errors import OperatorError, SettingsError, SpecError

__all__ = ["OperatorError", "SettingsError", "SpecError"]
