"""Exception hierarchy of the mocker package.

    MockerError                  root: the CLI catches it and prints one line, exit code 2
    ├── ConfigError              invalid engine / fleet configuration (all problems collected at once)
    ├── TraceError               malformed trace file (names file, line number and field)
    └── SimulationError          an internal invariant broke (a bug, not a user mistake)
        └── InvalidTransition    a request lifecycle transition that is not allowed
"""

from __future__ import annotations


class MockerError(Exception):
    """Root of every error the mocker raises on purpose."""


class ConfigError(MockerError, ValueError):
    """Invalid configuration.

    ``problems`` lists every problem found, each naming the field, the value and what was expected.
    """

    def __init__(self, problems: list[str] | str, *, source: str | None = None) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        self.source = source
        where = f"{source}: " if source else ""
        super().__init__(where + "; ".join(self.problems))


class TraceError(MockerError, ValueError):
    """A trace file that cannot be read: names the file, the 1-based line number and the field."""

    def __init__(self, path: str, line: int | None, field: str | None, message: str) -> None:
        self.path, self.line, self.field = path, line, field
        loc = path + (f":{line}" if line is not None else "")
        fld = f" field {field!r}" if field else ""
        super().__init__(f"{loc}:{fld} {message}".replace(": ", ": ", 1))


class SimulationError(MockerError, RuntimeError):
    """An internal invariant of the simulation broke. This is a bug in dynoplan."""


class InvalidTransition(SimulationError):
    """A request lifecycle transition that the state machine does not allow."""
