"""Errors of the operator.

    PlannerError (planner.errors)
     └── OperatorError
          ├── SpecError        -- a DGD / DynoPlanner spec the operator cannot act on (status condition,
          │                       never a retry loop); fields: resource, problems
          └── SettingsError    -- invalid OperatorSettings (CLI: one line, exit 2)
"""

from __future__ import annotations

from planner.errors import PlannerError


class OperatorError(PlannerError):
    """Root of the operator's errors."""


class SpecError(OperatorError):
    """A resource spec that cannot be acted on. ``problems``: one line per invalid field."""

    def __init__(self, resource: str, problems: list[str] | str) -> None:
        self.resource = resource
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__(f"{resource}: " + "; ".join(self.problems))


class SettingsError(OperatorError):
    """Invalid operator settings; ``problems`` lists every invalid field."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("operator settings: " + "; ".join(self.problems))
