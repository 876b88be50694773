"""Settings *text*: the one reader of every settings file and of every command-line ``KEY=VALUE``.

Every settings input of dynoplan goes through this module before :func:`dynoplan.settings.build` validates
it: the planner's ``--config`` and the operator's ``--planner-defaults-file``, ``--engine-config`` (replay,
simulate, profile, mocker serve), the ``dynoplan up`` stack file, ``--planner-set KEY=VALUE``, the
``planner:k=v`` policies of ``--compare`` and the operator's ``DYNOPLAN_OPERATOR_<FIELD>`` environment.

The value grammar (one for files and command lines alike):

* YAML 1.2 core schema scalars (the YAML 1.2.2 specification, section 10.3 "Core Schema"), not PyYAML's
  YAML 1.1 ones: ``true``/``false`` (also ``True``/``TRUE``...) are booleans, ``null``/``~``/empty is null,
  decimal integers (``-12``, ``007``) are integers, ``1.5``, ``1e3``, ``1.0e+3``, ``.inf`` are floats.
* Decided here, stricter than the core schema: ``0x10``, ``0o17`` and ``1_000`` stay text (a setting that
  needs a number then refuses them as "expected a number/integer"); no implicit dates or timestamps
  (``2023-01-01`` is text); ``yes``/``no``/``on``/``off`` are text; no ``<<`` merge keys.
* A quoted scalar is always text: ``port: "8090"`` is refused as a string where an integer is expected,
  from a file and from ``--planner-set port='"8090"'`` alike.
* A key given twice in one mapping is refused (the line names the dotted key and both line numbers), as
  is a key given twice across repeated ``KEY=VALUE`` flags.

Command-line and environment text has no quotes to tell text from a number, so :func:`text_value` keeps
the text as it is for a setting whose type is text (``mode=off``, ``namespace=123``) and splits a list
setting on commas; every other value is read as one YAML scalar by the rules above and then validated
exactly like a file value (``load_enabled=1`` is refused as ``load_enabled: 1`` is).

Errors are :class:`dynoplan.errors.ConfigError`, one line each, naming the file or flag. The user's view of
these rules: docs/architecture.md "Settings text".
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import yaml

from dynoplan.errors import ConfigError
from dynoplan.fields import FLOAT_TEXT, INT_TEXT

MAPPING = "a YAML or JSON mapping of setting: value"
"""What a settings file holds (the default ``expected`` of the readers' parse errors)."""

_DROPPED = {
    "tag:yaml.org,2002:bool",
    "tag:yaml.org,2002:int",
    "tag:yaml.org,2002:float",
    "tag:yaml.org,2002:null",
    "tag:yaml.org,2002:timestamp",
    "tag:yaml.org,2002:merge",
    "tag:yaml.org,2002:value",
}


class SettingsLoader(yaml.SafeLoader):
    """PyYAML's safe loader with the YAML 1.2 core scalars of the module docstring (no YAML 1.1 booleans,
    sexagesimal, hexadecimal, octal or underscore numbers, timestamps or merge keys), and no aliases: a
    settings file writes its values out (an alias of an alias of ... lets a few hundred bytes expand into
    gigabytes, the "billion laughs" document)."""

    yaml_implicit_resolvers = {
        first: [(tag, rx) for tag, rx in resolvers if tag not in _DROPPED]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()  # type: ignore[no-untyped-call]  # untyped in types-PyYAML
            raise yaml.composer.ComposerError(
                None,
                None,
                f"found the alias *{event.anchor}: aliases are not accepted in settings files, write the value out",
                event.start_mark,
            )
        return super().compose_node(parent, index)


_CORE_TAGS = frozenset(f"tag:yaml.org,2002:{t}" for t in ("str", "int", "float", "bool", "null", "map", "seq"))
"""The tags a settings file may carry (YAML 1.2 core schema): an explicit ``!!binary``, ``!!timestamp``,
``!!set``... builds values no setting takes."""


def _construct_str(loader: SettingsLoader, node: yaml.ScalarNode) -> str:
    """A string scalar, with the UTF-16 surrogate pairs of JSON's ``\\ud83d\\ude00`` escapes joined into one
    character (PyYAML decodes each escape on its own; ``json.dumps`` writes every non-BMP character so)."""
    value = loader.construct_scalar(node)
    if any("\ud800" <= c <= "\udfff" for c in value):
        try:
            value = value.encode("utf-16", "surrogatepass").decode("utf-16")
        except UnicodeDecodeError:  # a lone surrogate: kept, the validation or the consumer names it
            pass
    return value


SettingsLoader.add_constructor("tag:yaml.org,2002:str", _construct_str)
SettingsLoader.add_implicit_resolver(
    "tag:yaml.org,2002:null", re.compile(r"^(?:~|null|Null|NULL|)$"), ["~", "n", "N", ""]
)
SettingsLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)
SettingsLoader.add_implicit_resolver(
    "tag:yaml.org,2002:int", re.compile(f"^(?:{INT_TEXT.pattern})$"), list("-+0123456789")
)
SettingsLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(f"^(?:{FLOAT_TEXT.pattern})$"), list("-+.0123456789")
)


def _check_duplicates(root: yaml.Node | None, source: str) -> None:
    """Refuse, under ``root`` (a composed node), a key given twice in one mapping (``-`` and ``_`` spell the
    same key: ``ttft-ms`` after ``ttft_ms`` is the same setting again) and an explicit tag outside the core
    schema (``!!binary``, ``!!timestamp``): ConfigError naming the dotted key and the line(s)."""
    stack: list[tuple[yaml.Node, str]] = [(root, "")] if root is not None else []
    while stack:
        node, path = stack.pop()
        if node.tag not in _CORE_TAGS:
            tag = node.tag.replace("tag:yaml.org,2002:", "!!")
            raise ConfigError(
                f"line {node.start_mark.line + 1}: {path or 'the document'}: the tag {tag} is not accepted in "
                "settings files, expected a plain value, list or mapping",
                source=source,
            )
        if isinstance(node, yaml.SequenceNode):
            stack += [(item, f"{path}.{i}" if path else str(i)) for i, item in enumerate(node.value)]
        elif isinstance(node, yaml.MappingNode):
            seen: dict[str, tuple[str, int]] = {}
            for k, v in node.value:
                key, line = str(k.value), k.start_mark.line + 1
                dotted = f"{path}.{key}" if path else key
                same = key.replace("-", "_")
                if same in seen:
                    first, first_line = seen[same]
                    as_ = "" if first == key else f" as {first!r}"
                    raise ConfigError(
                        f"line {line}: duplicate key {dotted!r} (first at line {first_line}{as_}), "
                        "expected each setting once",
                        source=source,
                    )
                seen[same] = (key, line)
                if k.tag not in _CORE_TAGS:
                    stack.append((k, dotted))
                stack.append((v, dotted))


def _parse_error(e: yaml.YAMLError, source: str, what: str, expected: str) -> ConfigError:
    """One line for a YAML parser error: where (1-based line and column), what, and the context."""
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    context, cmark = getattr(e, "context", None), getattr(e, "context_mark", None)
    if context and cmark is not None and cmark is not mark:
        context += f" started at line {cmark.line + 1}, column {cmark.column + 1}"
    return ConfigError(
        f"cannot parse {what}{where}: {problem}" + (f" ({context})" if context else "") + f"; expected {expected}",
        source=source,
    )


def load_text(text: str, source: str, what: str = "settings file", expected: str = MAPPING) -> Any:
    """The one YAML document of ``text`` (JSON is YAML too) read with :class:`SettingsLoader`; None when
    empty. Raises ConfigError (``source`` prefixed): a parser error (``cannot parse {what} at line L, column
    C: ...; expected {expected}``), a key given twice.

    JSON indented with tabs, which YAML refuses as indentation, is read too: in valid JSON a tab can only be
    whitespace between tokens (never raw inside a string), so it is read as a space (lines and columns
    unchanged)."""
    try:
        return _load(text, source)
    except yaml.YAMLError as e:
        if "\t" in text and _is_json(text):
            try:
                return _load(text.replace("\t", " "), source)
            except yaml.YAMLError:
                pass
        raise _parse_error(e, source, what, expected) from None


def _is_json(text: str) -> bool:
    import json

    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def _load(text: str, source: str) -> Any:
    """:func:`load_text` without the error translation: raises yaml.YAMLError, or ConfigError (a key given
    twice)."""
    loader = SettingsLoader(text)  # the reader refuses control characters here already
    try:
        root = loader.get_single_node()
        _check_duplicates(root, source)
        return loader.construct_document(root) if root is not None else None
    finally:
        loader.dispose()


MAX_SETTINGS_BYTES = 16 << 20
"""Most bytes a settings file (stack, planner config, engine config, model config) may hold: 16 MiB, some thousand
times the largest one the project ships. A path with no end (``/dev/zero``, ``/dev/urandom``) is refused after this
much instead of filling the memory; a pipe (``<(printf ...)``) is still read, to its end or to the bound."""


def read_text(path: str | Path, source: str | None = None, what: str = "settings file") -> str:
    """The text of the file ``path``, read once (a pipe such as ``<(printf ...)`` works too), at most
    :data:`MAX_SETTINGS_BYTES`. Raises ConfigError naming ``source`` (default: the path): ``cannot read {what}:
    ...`` (not found, a directory, no permission, longer than the bound, not UTF-8: the byte and its offset)."""
    src = source if source is not None else str(path)
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_SETTINGS_BYTES + 1)
    except OSError as e:  # not found, a directory, no permission
        raise ConfigError(f"cannot read {what}: {e.strerror or e}", source=src) from None
    if len(raw) > MAX_SETTINGS_BYTES:
        raise ConfigError(
            f"cannot read {what}: more than {MAX_SETTINGS_BYTES >> 20} MiB; expected YAML or JSON text of a few KiB",
            source=src,
        )
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:  # a binary or Latin-1 file
        raise ConfigError(
            f"cannot read {what}: byte 0x{raw[e.start]:02x} at offset {e.start}: expected UTF-8 text", source=src
        ) from None


def load_file(
    path: str | Path, source: str | None = None, what: str = "settings file", expected: str = MAPPING
) -> dict[str, Any]:
    """A settings file (YAML or JSON) as a mapping (an empty file is ``{}``): :func:`read_text` then
    :func:`load_text` (``what`` and ``expected`` word their messages). Raises ConfigError naming ``source``
    (default: the path), also when the document is not a mapping."""
    src = source if source is not None else str(path)
    data = load_text(read_text(path, src, what), src, what, expected)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"expected a mapping of setting: value at the top level, got {_kind(data)}", source=src)
    return data


_SHOWN_CHARS = 60
"""Characters of a top-level scalar that a message shows: a file that is not YAML (a CSV given as a config) is
one scalar of the whole file."""


def _kind(v: Any) -> str:
    if isinstance(v, list):
        return "a list"
    if v is None:
        return "null"
    text = repr(v)
    if len(text) > _SHOWN_CHARS:
        text = f"{text[:_SHOWN_CHARS]}... ({len(str(v))} characters)"
    return f"the scalar {text}"


def scalar(text: str) -> Any:
    """``text`` read as one YAML scalar by the rules of the module docstring (``"1e3"`` -> 1000.0,
    ``"true"`` -> True, ``"0x10"`` -> ``"0x10"``); text that is not a single plain or quoted scalar (a
    flow list, a mapping, a parser error) is returned as it is, for the validation to name."""
    try:
        value = load_text(text, "value", "value")
    except ConfigError:
        return text
    return value if value is None or isinstance(value, (str, int, float, bool)) else text


def field_kinds(cls: Any, prefix: str = "") -> dict[str, str]:
    """Setting name (``prefix`` + field name) -> the base type name of its annotation, for every field of the
    settings dataclass ``cls`` (annotations are strings under ``from __future__ import annotations``:
    ``"float | None"`` -> ``"float"``, ``"tuple[str, ...]"`` -> ``"tuple"``, ``"Mode"`` -> ``"Mode"``): the
    ``kind`` of :func:`text_value`."""
    return {prefix + f.name: str(f.type).split("|")[0].strip().split("[")[0] for f in dataclasses.fields(cls)}


def text_value(text: str, kind: str) -> Any:
    """Command-line or environment ``text`` as the value of a setting whose annotation's base type is
    ``kind`` (``"int"``, ``"float"``, ``"bool"``, ``"str"``, ``"tuple"``, a Literal alias such as
    ``"Mode"``; ``""`` unknown): the text itself for a text setting, a list of :func:`scalar` items for a
    list setting (``a,b``; an empty item, ``a,,b`` or ``a,b,``, stays the empty text ``""`` for the
    validation to refuse; empty text is the empty list), else :func:`scalar`."""
    if kind not in ("int", "float", "bool", "tuple", ""):
        return text
    if kind == "tuple":
        return [scalar(x.strip()) if x.strip() else "" for x in text.split(",")] if text.strip() else []
    return scalar(text.strip())


def check_utf8(text: str, what: str) -> None:
    """Refuse text that came from non-UTF-8 bytes (argv and the environment keep them as lone surrogates):
    ConfigError ``{what}: byte 0x.. at offset N: expected UTF-8 text``."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        code = ord(text[e.start])  # surrogateescape keeps byte b as the code point 0xDC00 + b
        byte = f"byte 0x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"code point U+{code:04X}"
        raise ConfigError(f"{what}: {byte} at offset {e.start}: expected UTF-8 text") from None


def assignments(items: Iterable[str], flag: str, name: Callable[[str], str] | None = None) -> dict[str, str]:
    """Repeated ``flag KEY=VALUE`` items as ``{KEY: VALUE}`` text (both stripped; ``-`` in a key read as
    ``_``, or each key spelled by ``name``: one spelling per setting, e.g.
    :func:`planner.core.config.setting_name`). Raises ConfigError: an item without ``=`` or with an empty
    key (``expected KEY=VALUE``), bytes that are not UTF-8 (naming the key), a key given twice in any
    spelling."""
    spell_key = name or (lambda k: k.replace("-", "_"))
    out: dict[str, str] = {}
    given: dict[str, str] = {}
    for item in items:
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or not key:
            check_utf8(item, flag)
            raise ConfigError(f"{flag} {item!r}: expected KEY=VALUE")
        check_utf8(key, flag)
        check_utf8(value, f"{flag} {key}")
        k = spell_key(key)
        if k in out:
            raise ConfigError(
                f"{flag} {item.strip()}: {key} given twice (first {given[k]}), expected each setting once"
            )
        out[k], given[k] = value.strip(), item.strip()
    return out
