"""The project's exception tree, in one module.

    DynoplanError                root: a CLI catches it, prints one line and exits 2
    ├── ConfigError              invalid settings (engine, fleet, planner, stack, operator); ``problems`` lists
    │   │                        every problem at once, each ``field=value: expected ...``
    │   ├── SimulationConfigError  an invalid closed-loop simulation setting or policy spec
    │   └── AicSpecError           a malformed ``aic:model=...,system=...`` timing spec
    ├── TraceError               a trace file that cannot be read (names file, 1-based line and field)
    ├── ProfileError             a performance profile (.npz / profiler results) that cannot be used
    ├── ObservationError         an observation that breaks its documented contract (a driver bug or a corrupt
    │                            source); a *missing* reading is never an error, it is ``None``
    ├── SimulationError          an internal invariant of the simulation broke (a bug, not a user mistake)
    │   └── InvalidTransition    a request lifecycle transition that is not allowed
    ├── OperatorError            the Kubernetes operator's errors
    │   ├── SpecError            a DGD / DynoPlanner spec the operator cannot act on (a status condition)
    │   └── SettingsError        invalid operator settings
    ├── RequestError             a bad OpenAI request to a live worker or frontend (an HTTP error body)
    └── VirtualConnectorError    an error answer of the VirtualConnector HTTP API, or the planner unreachable

Errors carry structured fields (``problems``, ``path``, ``line``, ``field``) and a readable message; drivers
translate them at their boundary (CLI: one line, exit 2; operator: a status condition; HTTP: an error body).
"""

from __future__ import annotations

from typing import Any


class DynoplanError(Exception):
    """Root of every error dynoplan raises on purpose."""


class ConfigError(DynoplanError, ValueError):
    """Invalid configuration. ``problems``: every problem found, each naming the field, the value and what was
    expected; ``source``: the file or flag the values came from (prefixed to the message)."""

    def __init__(self, problems: list[str] | str, *, source: str | None = None) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        self.source = source
        where = f"{source}: " if source else ""
        super().__init__(where + "; ".join(self.problems))


class SimulationConfigError(ConfigError):
    """An invalid simulation setting or policy spec (``problems`` names each field, value and expectation)."""


class AicSpecError(ConfigError):
    """A malformed ``aic:`` timing spec, naming the key."""


class TraceError(DynoplanError, ValueError):
    """A trace file that cannot be read: names the file, the 1-based line number and the field."""

    def __init__(self, path: str, line: int | None, field: str | None, message: str) -> None:
        self.path, self.line, self.field = path, line, field
        loc = path + (f":{line}" if line is not None else "")
        fld = f" field {field!r}" if field else ""
        super().__init__(f"{loc}:{fld} {message}")


class ProfileError(DynoplanError, ValueError):
    """A performance profile that cannot be loaded or used: names the file and the array."""

    def __init__(self, path: str, message: str) -> None:
        self.path = path
        super().__init__(f"{path}: {message}")


class ObservationError(DynoplanError, ValueError):
    """An observation that violates its contract (a driver bug or a corrupt source), naming the field."""


class SimulationError(DynoplanError, RuntimeError):
    """An internal invariant of the simulation broke. This is a bug in dynoplan."""


class InvalidTransition(SimulationError):
    """A request lifecycle transition that the state machine does not allow."""


class OperatorError(DynoplanError):
    """Root of the operator's errors."""


class SpecError(OperatorError):
    """A resource spec that cannot be acted on. ``problems``: one line per invalid field."""

    def __init__(self, resource: str, problems: list[str] | str) -> None:
        self.resource = resource
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__(f"{resource}: " + "; ".join(self.problems))


class SettingsError(OperatorError, ConfigError):
    """Invalid operator settings; ``problems`` lists every invalid field."""

    def __init__(self, problems: list[str]) -> None:
        ConfigError.__init__(self, problems, source="operator settings")


class RequestError(DynoplanError):
    """A bad request: rendered as an OpenAI error body with ``status``."""

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        status: int = 400,
        type_: str = "invalid_request_error",
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message, self.param, self.status, self.type, self.code = message, param, status, type_, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class VirtualConnectorError(DynoplanError):
    """An HTTP error answer of the VirtualConnector API (``status``, server message), or ``status`` 0 when the
    planner could not be reached at all (refused, timed out: e.g. while it restarts; retry later)."""

    def __init__(self, status: int, message: str) -> None:
        self.status = status
        super().__init__(f"VirtualConnector HTTP {status}: {message}" if status else f"VirtualConnector: {message}")
