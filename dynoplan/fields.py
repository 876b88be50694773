"""Field types and bounds shared by the settings of every component (engine, fleet, planner, stack,
operator), so that a bound or a check is defined once and worded the same wherever a value is refused.

Kept apart from :mod:`dynoplan.settings` (the validation machinery): a settings module states a field's
type with these (``Field(le=MAX_INT64)``, ``url: HttpUrl``) and nothing else.
"""

from __future__ import annotations

import math
import re
from typing import Annotated

from pydantic import AfterValidator, Field

MAX_INT64 = 2**63 - 1
"""Largest integer setting accepted where no tighter bound applies (9223372036854775807): the largest
numpy ``int64`` and C ``ssize_t`` on a 64-bit machine. Block, token and point counts reach numpy int64
arrays (the engines' decode look-ahead, :func:`numpy.minimum` against the KV pool), ``collections.deque``
``maxlen`` and ``range``; a larger value fails there with an OverflowError in the middle of a run, or, as a
count no run reaches, silently disables what it gates."""

INT_TEXT = re.compile(r"[-+]?[0-9]+")
"""An integer as text (full match): ASCII digits with an optional sign, the YAML 1.2 core schema's decimal
integer (docs/architecture.md "Settings text"). Python's ``int()`` also takes ``1_000``, newlines and
other Unicode white space around it, and non-ASCII digits (``int("١٢") == 12``); a setting or a flag takes
none of them."""
FLOAT_TEXT = re.compile(
    r"[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN)"
)
"""A number as text (full match): the YAML 1.2 core schema's float (``1e3``, ``.5``, ``-2.``, ``.inf``,
``.nan``), of which :data:`INT_TEXT` is a part (docs/architecture.md "Settings text"). Not ``1_000.5``,
``inf`` or ``nan`` (which Python's ``float()`` takes)."""


def int_text(text: str) -> int:
    """``text`` (:data:`INT_TEXT`, with spaces or tabs around it as YAML allows) as an int; ValueError for
    any other text."""
    t = text.strip(" \t")
    if INT_TEXT.fullmatch(t) is None:
        raise ValueError(f"{text!r} is not an integer")
    return int(t)


def float_text(text: str) -> float:
    """``text`` (:data:`FLOAT_TEXT`) as a float (``.inf`` -> inf, ``-.inf`` -> -inf, ``.nan`` -> nan);
    spaces or tabs around it are allowed, as in YAML; ValueError for any other text."""
    t = text.strip(" \t")
    if FLOAT_TEXT.fullmatch(t) is None:
        raise ValueError(f"{text!r} is not a number")
    low = t.lower()
    if low.endswith(".inf"):
        return -math.inf if low.startswith("-") else math.inf
    if low == ".nan":
        return math.nan
    return float(t)


HTTP_URL_PATTERN = r"^https?://"
"""What an HTTP(S) URL setting must start with (the JSON Schema ``pattern`` of :data:`HttpUrl`)."""
HTTP_URL_EXPECTED = "expected an http:// or https:// URL"
"""The one wording of a refused HTTP(S) URL (settings fields, flags and :mod:`planner.sources.prometheus`)."""


def is_http_url(value: object) -> bool:
    """True when ``value`` is text starting with ``http://`` or ``https://`` (:data:`HTTP_URL_PATTERN`)."""
    return isinstance(value, str) and value.startswith(("http://", "https://"))


def _http_url(value: str) -> str:
    if not is_http_url(value):
        raise ValueError(HTTP_URL_EXPECTED)
    return value


HttpUrl = Annotated[str, AfterValidator(_http_url), Field(json_schema_extra={"pattern": HTTP_URL_PATTERN})]
"""A settings field holding an http:// or https:// URL; refused as ``field='ftp://x': expected an http://
or https:// URL`` (:data:`HTTP_URL_EXPECTED`). The schema keeps ``pattern: ^https?://`` for helm and the
apiserver."""
