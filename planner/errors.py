"""Exception hierarchy of the planner package.

    PlannerError                 root: the CLI catches it and prints one line, exit code 2
    ├── ConfigError              invalid planner configuration (every problem collected at once)
    ├── ProfileError             a performance profile (.npz / profiler results dir) that cannot be used
    ├── TraceError               a warm-start trace that cannot be read (names file, line and field)
    └── ObservationError         an observation that breaks its documented contract (e.g. a negative
                                 replica count); a *missing* reading is never an error, it is ``None``

Errors carry structured fields (``problems``, ``path``, ``line``, ``field``) and a readable message.
Drivers translate them at their boundary (CLI: one line, exit 2; operator: a status condition).
"""

from __future__ import annotations


class PlannerError(Exception):
    """Root of every error the planner raises on purpose."""


class ConfigError(PlannerError, ValueError):
    """Invalid configuration.

    ``problems`` lists every problem found, each naming the field, the value and what was expected.
    """

    def __init__(self, problems: list[str] | str, *, source: str | None = None) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        self.source = source
        where = f"{source}: " if source else ""
        super().__init__(where + "; ".join(self.problems))


class ProfileError(PlannerError, ValueError):
    """A performance profile that cannot be loaded or used: names the file and the array."""

    def __init__(self, path: str, message: str) -> None:
        self.path = path
        super().__init__(f"{path}: {message}")


class TraceError(PlannerError, ValueError):
    """A warm-start trace that cannot be read: names the file, the 1-based line number and the field."""

    def __init__(self, path: str, line: int | None, field: str | None, message: str) -> None:
        self.path, self.line, self.field = path, line, field
        loc = path + (f":{line}" if line is not None else "")
        fld = f" field {field!r}:" if field else ""
        super().__init__(f"{loc}:{fld} {message}")


class ObservationError(PlannerError, ValueError):
    """An observation that violates its contract (a driver bug or a corrupt source), naming the field."""
