"""The declarative settings base: every settings class of dynoplan (engine, fleet, planner, stack, operator) is a
pydantic v2 dataclass declared with :func:`settings`, each field's unit, bound, default and source stated once
in ``Field(default=default, description=..., gt=..., ...)``.

What the base fixes for all of them:

* ``extra="forbid"``: an unknown key is an error naming it (with the closest known name, if any);
* strict types: a bool is not an int, ``"5"`` is not a number, ``"false"`` is not a boolean; an int is
  accepted where a float is expected (JSON and YAML write ``1`` for ``1.0``);
* one formatter (:func:`problem_lines`) for every validation error, in the project's one line per problem
  form ``field=value: expected ...`` (nested fields dotted: ``sglang.chunked_prefill_size=0: expected > 0``),
  every problem at once;
* :func:`build` turns a mapping (YAML, JSON, CLI ``KEY=VALUE``) into settings or raises
  :class:`dynoplan.errors.ConfigError` with those lines; :func:`json_schema` exports the JSON Schema that the
  Helm chart's ``values.schema.json`` and the CRDs' ``openAPIV3Schema`` are generated from.

Cross-field checks live in the class (``__post_init__`` or a pydantic ``model_validator``) and raise
:class:`Problems` with every line they find, spelling values with :func:`spell` (as YAML/JSON writes them:
``true``, ``null``, ``"text"``); the formatter passes those lines through unchanged.
"""

from __future__ import annotations

import difflib
import json
import math
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar, dataclass_transform, overload

from pydantic import ConfigDict, Field, TypeAdapter, ValidationError, ValidatorFunctionWrapHandler, field_validator
from pydantic.dataclasses import dataclass as _pydantic_dataclass

from dynoplan.errors import ConfigError

T = TypeVar("T")

CONFIG = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False, arbitrary_types_allowed=True)
"""The validation settings of every dynoplan settings class (see the module docstring)."""


class Problems(ValueError):
    """Raised by a cross-field check with every problem it found; ``lines``: ``field=value: expected ...``."""

    def __init__(self, lines: list[str] | str) -> None:
        self.lines = [lines] if isinstance(lines, str) else list(lines)
        super().__init__("; ".join(self.lines))


# The type checker's view: a dataclass whose fields are declared with Field(default=..., ...) (PEP 681),
# frozen unless frozen=False.
@dataclass_transform(field_specifiers=(Field,), frozen_default=True)
@overload
def settings(cls: type[T], /) -> type[T]: ...
@overload
def settings(*, frozen: bool = True) -> Callable[[type[T]], type[T]]: ...
def settings(cls: Any = None, /, *, frozen: bool = True) -> Any:
    """Declare a settings class: a slotted pydantic dataclass with :data:`CONFIG`, frozen unless
    ``frozen=False``. ``dataclasses.replace`` works on it and validates the new values."""

    def wrap(c: type[T]) -> type[T]:
        return _pydantic_dataclass(c, frozen=frozen, slots=True, config=CONFIG)  # type: ignore[return-value]  # pydantic's stub returns its own dataclass type

    return wrap if cls is None else wrap(cls)


_ADAPTERS: dict[Any, TypeAdapter[Any]] = {}


def _adapter(cls: type[T]) -> TypeAdapter[T]:
    a = _ADAPTERS.get(cls)
    if a is None:
        a = _ADAPTERS[cls] = TypeAdapter(cls)
    return a


def _expected(err: Mapping[str, Any]) -> str:
    """What a pydantic error type says was expected, in the project's words."""
    t, ctx = err["type"], err.get("ctx") or {}
    simple = {
        "int_type": "expected an integer",
        "int_from_float": "expected an integer",
        "int_parsing": "expected an integer",
        "float_type": "expected a number",
        "float_parsing": "expected a number",
        "finite_number": "expected a finite number",
        "bool_type": "expected a boolean (true/false)",
        "bool_parsing": "expected a boolean (true/false)",
        "string_type": "expected a string",
        "dict_type": "expected a mapping",
        "model_type": "expected a mapping",
        "dataclass_type": "expected a mapping",
        "dataclass_exact_type": "expected a mapping",
        "list_type": "expected a list",
        "tuple_type": "expected a list",
        "none_required": "expected null",
    }
    if t in simple:
        return simple[t]
    bounds = {
        "greater_than": ("gt", ">"),
        "greater_than_equal": ("ge", ">="),
        "less_than": ("lt", "<"),
        "less_than_equal": ("le", "<="),
    }
    if t in bounds:
        key, op = bounds[t]
        return f"expected {op} {ctx.get(key)}"
    if t in ("literal_error", "enum"):
        return f"expected one of {ctx.get('expected')}"
    if t in ("too_short", "too_long"):
        n = ctx.get("min_length") if t == "too_short" else ctx.get("max_length")
        return f"expected {'at least' if t == 'too_short' else 'at most'} {n} items"
    if t == "string_pattern_mismatch":
        return f"expected text matching {ctx.get('pattern')}"
    msg = str(err.get("msg", ""))
    for prefix in ("Value error, ", "Assertion failed, "):
        if msg.startswith(prefix):
            msg = msg[len(prefix) :]
    return msg if msg.startswith("expected") else f"expected {msg[:1].lower()}{msg[1:]}"


def spell(v: Any) -> str:
    """``v`` spelled as the user wrote it in YAML or JSON: ``true``, ``false``, ``null``, strings quoted
    (``"1e3"`` is text, ``1000.0`` a number), ``.inf``/``-.inf``/``.nan``; a mapping or list longer than 80
    characters is cut with ``...``, a string longer than 1000 (a pasted file, say) likewise."""
    if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
        return ".nan" if math.isnan(v) else (".inf" if v > 0 else "-.inf")
    try:
        text = json.dumps(v, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(v)
    if isinstance(v, (dict, list, tuple)) and len(text) > 80:
        return text[:77] + "..."
    return text[:997] + '..."' if isinstance(v, str) and len(text) > 1000 else text  # a 5 MB value is not echoed


def problem_lines(
    err: ValidationError,
    *,
    prefix: str = "",
    known: Mapping[str, list[str]] | None = None,
    nullable: frozenset[str] = frozenset(),
) -> list[str]:
    """One ``field=value: expected ...`` line per problem of ``err``, in the order pydantic found them.

    ``prefix`` is prepended to every field path (``"sglang."``); ``known`` maps a dotted parent path (``""``
    for the top level) to the names valid there, for the "did you mean" hint of an unknown key (otherwise
    the hint is left out); ``nullable``: the dotted paths (without ``prefix``) of fields that also take ``null``
    (:func:`nullable_fields`), whose type errors say so (``expected a number or null``). Lines raised by a
    cross-field check (:class:`Problems`) are kept as they are."""
    out: list[str] = []
    errors = err.errors(include_url=False)
    # a list whose items are invalid is not also "too short": pydantic counts only the valid items
    bad_items = {tuple(e["loc"][:-1]) for e in errors if len(e["loc"]) > 1 and isinstance(e["loc"][-1], int)}
    for e in errors:
        if e["type"] == "too_short" and tuple(e["loc"]) in bad_items:
            continue
        ctx = e.get("ctx") or {}
        if isinstance(ctx.get("error"), Problems):
            out += [prefix + line for line in ctx["error"].lines]
            continue
        loc = [str(x) for x in e["loc"] if x not in ("__root__",)]
        path = prefix + ".".join(loc)
        if e["type"] in ("extra_forbidden", "unexpected_keyword_argument"):
            parent, name = ".".join(loc[:-1]), loc[-1] if loc else ""
            hint = ""
            if known is not None and parent in known:
                close = difflib.get_close_matches(name, known[parent], n=1)
                hint = f" (did you mean {prefix}{parent + '.' if parent else ''}{close[0]}?)" if close else ""
            out.append(f"{path}: unknown setting{hint}")
        elif e["type"] in ("missing", "missing_argument", "missing_keyword_only_argument"):
            out.append(f"{path}: required")
        elif not loc:  # a model-level check that raised a plain ValueError
            out.append(prefix + _expected(e).removeprefix("expected "))
        else:
            also = " or null" if e["type"] in _TYPE_ERRORS and ".".join(loc) in nullable else ""
            out.append(f"{path}={spell(e.get('input'))}: {_expected(e)}{also}")
    return out


_TYPE_ERRORS = frozenset(
    ("int_type", "int_from_float", "int_parsing", "float_type", "float_parsing", "bool_type", "bool_parsing")
)
"""Pydantic error types of a value of the wrong kind (not out of its bounds): the ones a ``null`` would mend."""


def _fields(cls: Any, path: str = "") -> Iterator[tuple[str, str, Any]]:
    """``(parent path, field name, type hint)`` for every field of ``cls`` and, depth first, of the settings
    classes nested in it (the parent path is dotted, ``""`` at the top level)."""
    import dataclasses
    import typing

    if not dataclasses.is_dataclass(cls):
        return
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints.get(f.name)
        yield path, f.name, tp
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            yield from _fields(tp, f"{path}.{f.name}" if path else f.name)


def nullable_fields(cls: Any) -> frozenset[str]:
    """Dotted paths of the fields of ``cls`` (and of its nested settings classes) whose type admits ``None``
    (``float | None``: ``null`` in a file, off)."""
    import types
    import typing

    return frozenset(
        f"{parent}.{name}" if parent else name
        for parent, name, tp in _fields(cls)
        if typing.get_origin(tp) in (typing.Union, types.UnionType) and type(None) in typing.get_args(tp)
    )


def field_names(cls: Any) -> dict[str, list[str]]:
    """Dotted parent path -> field names valid there, for every nested settings class of ``cls``."""
    out: dict[str, list[str]] = {}
    for parent, name, _ in _fields(cls):
        out.setdefault(parent, []).append(name)
    return out


def build(cls: type[T], data: Any, *, source: str | None = None, prefix: str = "") -> T:
    """Validate ``data`` (a mapping of field name to value, nested mappings for nested settings) into a
    ``cls``. Raises :class:`ConfigError` (``source`` prefixed) with every problem, one line each."""
    if isinstance(data, cls):
        return data
    if not isinstance(data, Mapping):
        raise ConfigError(f"{prefix.rstrip('.') or 'settings'}={spell(data)}: expected a mapping", source=source)
    try:
        text = json.dumps(data)
    except (TypeError, ValueError) as e:
        raise ConfigError(
            f"{prefix.rstrip('.') or 'settings'}: {e}; expected plain values (numbers, text, lists, mappings)",
            source=source,
        ) from None
    try:
        # JSON mode: strict types still hold (a bool is not an int, "5" is not a number), while nested
        # mappings become nested settings and lists become tuples, as a YAML or JSON file writes them.
        return _adapter(cls).validate_json(text)
    except ValidationError as e:
        raise ConfigError(
            problem_lines(e, prefix=prefix, known=field_names(cls), nullable=nullable_fields(cls)), source=source
        ) from None


_UPPER_BOUNDS = frozenset(("less_than", "less_than_equal"))
"""Pydantic error types of a value above a field's upper bound (``lt`` / ``le``)."""


def upper_bound_why(field: str, why: str) -> Any:
    """A validator to assign in a settings class body (``_why = upper_bound_why("x", "...")``): ``field``'s own
    checks, unchanged, except that the line of a value above its upper bound (``le``/``lt`` in its ``Field``) ends
    with `` (why)``: ``x=5: expected <= 4 (why)``, so the user reads the reason where the bound is refused. The
    bound itself stays declared once, in the ``Field`` (and so in the JSON Schema)."""

    def check(cls: Any, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        try:
            return handler(value)
        except ValidationError as e:
            errors = e.errors(include_url=False)
            if len(errors) == 1 and errors[0]["type"] in _UPPER_BOUNDS:
                raise ValueError(f"{_expected(errors[0])} ({why})") from None
            raise

    return field_validator(field, mode="wrap")(classmethod(check))


def check(make: Callable[[], T], *, source: str | None = None, prefix: str = "") -> T:
    """Call ``make()`` (a settings constructor) and turn its ValidationError into :class:`ConfigError`."""
    try:
        return make()
    except ValidationError as e:
        raise ConfigError(problem_lines(e, prefix=prefix), source=source) from None


def json_schema(cls: Any) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12, pydantic's serialization of defaults) of a settings class."""
    return _adapter(cls).json_schema()
