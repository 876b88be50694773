"""Workloads in: trace loaders and seeded synthetic workloads, all producing ``list[TraceRequest]``.

Formats
-------
- **Azure LLM inference CSV** (Azure/AzurePublicDataset, columns ``TIMESTAMP, ContextTokens,
  GeneratedTokens``). Arrival = integer milliseconds since the first row, computed exactly as the
  reference tool does (timestamp truncated to microseconds, ``int(seconds * 1000)``). The CSV carries no
  content, so every request gets ``max(1, ceil(ISL / trace_block_size))`` fresh hash ids, numbered
  consecutively across the file from 0 (no prefix sharing) — the same ids the reference tool
  (``../shared/tools/reference-replay``) writes when it converts the CSV, so both simulators see identical
  input.
- **Mooncake JSONL** (kvcache-ai/Mooncake FAST'25 traces): one JSON object per line with ``timestamp``
  (ms), ``input_length``, ``output_length`` and optional ``hash_ids`` (one id per ``trace_block_size``
  prompt tokens; equal leading ids = shared prefix). Aliases accepted: ``created_time`` for
  ``timestamp``, ``input_tokens`` / ``output_tokens`` for the lengths. Timestamps are milliseconds since
  the trace start, used as given (not rebased), at most :data:`MAX_TRACE_TIMESTAMP_MS`; Unix epoch
  milliseconds (>= :data:`EPOCH_MS_THRESHOLD`) are refused with a message saying so. Blank lines are skipped.
  A leading UTF-8 byte-order mark is not content and is skipped, as the CSV reader's ``utf-8-sig`` does.
  As in the reference mocker (``Trace::from_mooncake``), an ``input_length`` larger than
  ``len(hash_ids) * trace_block_size`` is clamped to that capacity.
- **Synthetic**: ``synthetic:KIND?key=value&...`` — see :func:`parse_synthetic_spec`.

Validation (both file formats): a malformed row raises :class:`~dynoplan.errors.TraceError` naming the
file, the 1-based line number and the field: unparsable JSON or timestamp, a missing field, a length that
is not a positive integer, a negative or non-finite timestamp, or a timestamp earlier than the previous
row's, and an ambiguous field: a CSV column named twice in the header, a JSON field given twice in one
object (JSON allows it and decoders silently keep one) or together with its alias. Rows must be in
arrival order; dynoplan does **not** sort them, because silently reordering a trace changes request
identity and usually means the file is damaged. An empty file is an error too.
"""

from __future__ import annotations

import codecs
import collections
import csv
import datetime as _dt
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, NoReturn

import msgspec
import numpy as np

from dynoplan.errors import TraceError
from dynoplan.fields import float_text, int_text
from mocker.records import TraceRequest

__all__ = [
    "DEFAULT_TRACE_BLOCK_SIZE",
    "LengthDist",
    "RateEnvelope",
    "SyntheticWorkload",
    "apply_rate_envelope",
    "load_azure_csv",
    "load_mooncake_jsonl",
    "load_trace",
    "parse_rate_envelope",
    "parse_synthetic_spec",
    "scale_arrivals",
    "synthesize",
]

DEFAULT_TRACE_BLOCK_SIZE = 512
"""Tokens per trace hash id (Mooncake release format; reference ``--trace-block-size`` default)."""

MAX_TRACE_TOKENS = 2**31 - 1
"""Largest accepted prompt or output length in a trace row (tokens). A bound, not a model limit: token
counts are held in int64 numpy arrays and the Azure loader allocates ``ceil(ISL / trace_block_size)``
hash ids per request, so an unbounded length would overflow or exhaust memory instead of failing with a
line-precise error. 2**31 - 1 is far above any context window in use."""

MAX_SYNTHETIC_REQUESTS = 10_000_000
"""Largest synthetic workload (requests: ``num_requests``, or ``rate * duration_s`` when that is smaller).
A memory bound: each request holds its hash-id tuple and per-request records (the bundled one-hour
Azure trace has 19,366 requests); beyond it numpy fails with a traceback or the machine runs out of
memory."""

MAX_LOGNORMAL_SIGMA = 3.0
"""Largest log-space sigma of a ``lognormal:MEAN:SIGMA`` length. The mean of a lognormal is carried by draws
about sigma standard deviations above its median (mu = ln(MEAN) - sigma**2 / 2), which a workload meets
ever more rarely as sigma grows: over seeds, 1,000 draws average about 0.98 MEAN at sigma 2, 0.85 MEAN at 3,
0.65 MEAN at 3.5, and at sigma 100 every draw rounds to 1 token. Beyond 3 the spec's MEAN would not be the
workload's mean, so it is refused."""

_AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
_MOONCAKE_ALIASES: dict[str, tuple[str, ...]] = {
    "timestamp": ("timestamp", "created_time"),
    "input_length": ("input_length", "input_tokens"),
    "output_length": ("output_length", "output_tokens"),
}


# ---------------------------------------------------------------------------------------------- dispatch
MAX_TRACE_TIMESTAMP_MS = 2.0**52 * 1e-6
"""Largest accepted Mooncake timestamp, ms (about 4.5e9 ms = 52 days). Simulated times are float64
milliseconds and pass durations are rounded to whole nanoseconds (:func:`mocker.timing.round_ns`); a float64
``t`` resolves steps of ``t * 2**-52``, which stays below 1 ns = 1e-6 ms only while ``t < 2**52 * 1e-6``
ms. Later timestamps would silently merge the engine's pass times (a 1e308 ms trace reports every latency
as 0.00)."""


def time_limit_problem(last_arrival_ms: float) -> str | None:
    """Why a workload whose last arrival (after any speed-up or envelope) is at ``last_arrival_ms`` cannot be
    simulated -- the end of a one-line message after the span and what made it -- or None when it
    can (at most :data:`MAX_TRACE_TIMESTAMP_MS`). A file's timestamps are refused as they are read; this is the
    check of the span a slow synthetic rate or an ``--arrival-speedup`` below 1 gives."""
    if last_arrival_ms <= MAX_TRACE_TIMESTAMP_MS:
        return None
    lim = MAX_TRACE_TIMESTAMP_MS / 1000.0
    return (
        f"past the simulator's limit of {lim:.4g} s (about 52 days: float64 ms resolve the engine's nanosecond "
        f"pass times only up to there); expected at most {lim:.4g} s"
    )


EPOCH_MS_THRESHOLD = 1e12
"""A timestamp at or above this many ms reads as Unix epoch milliseconds (1e12 ms after 1970-01-01 is
2001-09-09T01:46:40Z), not milliseconds since the trace start: refused with that diagnosis."""


def load_trace(
    spec: str | Path, *, trace_block_size: int = DEFAULT_TRACE_BLOCK_SIZE, seed: int | None = None
) -> list[TraceRequest]:
    """Load a workload from a file path or a ``synthetic:...`` spec.

    Files ending in ``.csv`` are Azure CSV, ``.jsonl``/``.json`` Mooncake JSONL; any other name is sniffed
    (first non-blank byte after a UTF-8 byte-order mark, if any, ``{`` = JSONL, otherwise CSV). ``seed`` is the
    default seed of a synthetic spec that does not give its own ``seed=``. Raises :class:`TraceError` (file not
    found, malformed rows, bad synthetic parameters) or :class:`ValueError` for a non-positive ``trace_block_size``.
    """
    if not isinstance(trace_block_size, int) or isinstance(trace_block_size, bool) or trace_block_size <= 0:
        raise TraceError(str(spec), None, "trace_block_size", f"{trace_block_size!r}: expected a positive integer")
    s = str(spec)
    if not s.strip():
        raise TraceError("--trace", None, None, f"{s!r}: expected a trace file path or a synthetic:KIND?... spec")
    if s.startswith("synthetic:"):
        return synthesize(parse_synthetic_spec(s, default_seed=seed), trace_block_size=trace_block_size)
    path = Path(s)
    if not path.is_file():
        what = (
            "trace file not found" if not path.exists() else "is a directory" if path.is_dir() else "not a regular file"
        )
        raise TraceError(
            s, None, None, f"{what}; expected a trace file (Azure CSV or Mooncake JSONL) or a synthetic:KIND?... spec"
        )
    suffix = path.suffix.lower()
    if suffix == ".csv":
        return load_azure_csv(path, trace_block_size=trace_block_size)
    if suffix in (".jsonl", ".json"):
        return load_mooncake_jsonl(path, trace_block_size=trace_block_size)
    with path.open("rb") as f:
        head = f.read(4096).removeprefix(codecs.BOM_UTF8).lstrip()
    if head.startswith(b"{"):
        return load_mooncake_jsonl(path, trace_block_size=trace_block_size)
    return load_azure_csv(path, trace_block_size=trace_block_size)


def scale_arrivals(requests: Sequence[TraceRequest], arrival_speedup: float) -> list[TraceRequest]:
    """Arrival times divided by ``arrival_speedup`` (> 0; 2.0 = twice the request rate).

    Returns new requests (the input is not modified). Raises ValueError on a non-positive ratio.
    """
    if not (
        isinstance(arrival_speedup, (int, float))
        and not isinstance(arrival_speedup, bool)
        and arrival_speedup > 0
        and math.isfinite(arrival_speedup)
    ):
        raise ValueError(f"arrival_speedup={arrival_speedup!r}: expected a finite number > 0")
    if arrival_speedup == 1.0:
        return list(requests)
    return [
        TraceRequest(r.request_id, r.arrival_ms / arrival_speedup, r.input_length, r.output_length, r.hash_ids)
        for r in requests
    ]


# ---------------------------------------------------------------------------------------------- Azure CSV
def load_azure_csv(path: str | Path, *, trace_block_size: int = DEFAULT_TRACE_BLOCK_SIZE) -> list[TraceRequest]:
    """Load an Azure LLM inference trace CSV (``TIMESTAMP, ContextTokens, GeneratedTokens``).

    Returns one request per data row, ``request_id`` = 0-based row index, ``arrival_ms`` = integer ms since
    the first row, ``hash_ids`` = fresh consecutive ids (``max(1, ceil(ISL / trace_block_size))`` each).
    Raises :class:`TraceError` naming file, line (header = line 1) and column on any malformed row.
    Columns are converted vectorised (numpy); only when that fails are rows re-checked one by one to
    name the offending line.
    """
    p = str(path)
    try:
        f = open(path, newline="", encoding="utf-8-sig")  # noqa: SIM115  closed by the `with f:` below; only open() is guarded
    except FileNotFoundError:
        raise TraceError(p, None, None, "trace file not found") from None
    with f:
        reader = csv.reader(f)
        try:
            header = next(reader)
            rows = [r for r in reader if r and (len(r) > 1 or r[0].strip())]
        except StopIteration:
            raise TraceError(
                p, None, None, "empty file: expected a header row TIMESTAMP,ContextTokens,GeneratedTokens"
            ) from None
        except UnicodeDecodeError:
            raise _not_utf8(path) from None
        except csv.Error as e:
            raise TraceError(p, reader.line_num, None, f"unreadable CSV: {e}") from None
    norm = [h.strip().lower() for h in header]
    cols: list[int] = []
    for name in _AZURE_COLUMNS:
        if norm.count(name.lower()) > 1:
            at = [str(i + 1) for i, h in enumerate(norm) if h == name.lower()]
            raise TraceError(
                p,
                1,
                name,
                f"column given {len(at)} times in the header (columns {', '.join(at)} of "
                f"{','.join(header)!r}), expected each column once",
            )
        if name.lower() not in norm:
            raise TraceError(
                p,
                1,
                name,
                f"missing column; header is {','.join(header)!r}, expected columns {', '.join(_AZURE_COLUMNS)}",
            )
        cols.append(norm.index(name.lower()))
    if not rows:
        raise TraceError(p, None, None, "no requests: the file has a header but no data rows")
    i_ts, i_isl, i_osl = cols
    if any(len(r) != len(header) for r in rows):  # a short or long row: name its line
        _azure_check_rows(p, cols, header)
    stamps, offsets_min = _strip_utc_offsets(p, [r[i_ts].strip() for r in rows])
    isl_text = [r[i_isl] for r in rows]
    osl_text = [r[i_osl] for r in rows]
    try:
        if not (_int_column(isl_text) and _int_column(osl_text)):
            raise ValueError
        isl_a = np.asarray(isl_text).astype(np.int64)
        osl_a = np.asarray(osl_text).astype(np.int64)
        ok = bool(
            (isl_a > 0).all()
            and (osl_a > 0).all()
            and (isl_a <= MAX_TRACE_TOKENS).all()
            and (osl_a <= MAX_TRACE_TOKENS).all()
        )
    except (ValueError, OverflowError):
        ok = False
    if not ok:
        _azure_check_rows(p, cols, header)
    try:
        ts_us = np.array(stamps, dtype="datetime64[us]").astype(np.int64)
    except ValueError:
        _azure_check_rows(p, cols, header)
        raise  # pragma: no cover - _azure_check_rows always raises here
    # numpy also reads forms the row-by-row formats refuse (a bare number such as epoch milliseconds is a
    # year to numpy): anything outside the calendar years 1..9999 goes to the slow path, which names the row
    if ts_us.size and (ts_us.min() < _MIN_DATETIME_US or ts_us.max() > _MAX_DATETIME_US):
        _azure_check_rows(p, cols, header)
    if offsets_min is not None:  # local time with a UTC offset -> UTC
        ts_us = ts_us - offsets_min * 60_000_000
    # Same float operations as the reference converter: int((ts - t0).total_seconds() * 1000).
    rel_us = ts_us - ts_us[0]
    arrival = np.trunc((rel_us / 1e6) * 1000.0)
    back = np.flatnonzero(np.diff(arrival) < 0)
    if back.size:
        _azure_check_rows(p, cols, header)
    ids_per_req = np.maximum(1, -(-isl_a // trace_block_size))
    ends = np.cumsum(ids_per_req)
    starts = ends - ids_per_req
    return [
        TraceRequest(i, a, isl, osl, tuple(range(s, e)))
        for i, (a, isl, osl, s, e) in enumerate(
            zip(arrival.tolist(), isl_a.tolist(), osl_a.tolist(), starts.tolist(), ends.tolist())
        )
    ]


_NOT_INT_CHAR = re.compile(r"[^0-9+\- \t]")
"""A character outside the alphabet of :data:`~dynoplan.fields.INT_TEXT` with the spaces or tabs around it
that :func:`~dynoplan.fields.int_text` allows."""


def _int_column(texts: list[str]) -> bool:
    """True when every text of a CSV column is written in the characters of the shared integer grammar
    (:func:`~dynoplan.fields.int_text`: ASCII digits, a sign, spaces or tabs around). Over that alphabet
    numpy's ``astype(np.int64)`` (Python's ``int()``) takes exactly the texts ``int_text`` takes, so the
    vectorised conversion then reads the column by the shared grammar; otherwise (``1_000``, non-ASCII digits
    such as ``１００``, other white space, all of which ``int()`` takes) the caller's row-by-row check names
    the row. One pass over the joined text: about 1 ms for the bundled 19,366-row trace."""
    joined = "".join(texts)
    return joined.isascii() and (joined.isdigit() or _NOT_INT_CHAR.search(joined) is None)


_UTC_OFFSET = re.compile(
    r"^(\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}(?::\d{2}(?:\.\d*)?)?)\s*(Z|[+-]\d{2}(?::?\d{2})?)$", re.IGNORECASE
)
"""An ISO 8601 timestamp with a UTC designator: ``Z``, ``+HH``, ``+HHMM`` or ``+HH:MM`` (ISO 8601-1:2019 4.3.13)."""


def _split_utc_offset(text: str) -> tuple[str, int | None]:
    """(local date-time truncated to microseconds, its UTC offset in minutes or None when it has none)."""
    m = _UTC_OFFSET.match(text)
    if m is None:
        return text[:26], None
    z = m.group(2).replace(":", "")
    if z.upper() == "Z":
        return m.group(1)[:26], 0
    sign = -1 if z[0] == "-" else 1
    return m.group(1)[:26], sign * (int(z[1:3]) * 60 + int(z[3:5] or 0))


def _strip_utc_offsets(path: str, raw: list[str]) -> tuple[list[str], np.ndarray | None]:
    """The stamps without their UTC offsets and the offsets (minutes, one per row; None when no stamp has
    one). Raises TraceError when only some stamps carry an offset (their instants would be ambiguous)."""
    if not any(s and (s[-1] in "Zz" or "+" in s or s.count("-") > 2) for s in raw):
        return [s[:26] for s in raw], None
    split = [_split_utc_offset(s) for s in raw]
    have = [o is not None for _, o in split]
    if not any(have):
        return [b for b, _ in split], None
    if not all(have):
        k = have.index(False) if have[0] else have.index(True)
        raise TraceError(
            path,
            None,
            "TIMESTAMP",
            f"data row {k + 1}: {raw[k]!r}: some timestamps have a UTC offset "
            "and some do not, expected all with an offset (e.g. +00:00) or none",
        )
    return [b for b, _ in split], np.array([o for _, o in split], dtype=np.int64)


_MIN_DATETIME_US = -62135596800 * 1_000_000
"""0001-01-01 00:00:00 UTC in microseconds since the Unix epoch (Python's ``datetime.min``)."""
_MAX_DATETIME_US = 253402300799 * 1_000_000 + 999_999
"""9999-12-31 23:59:59.999999 UTC in microseconds since the Unix epoch (Python's ``datetime.max``)."""


def _azure_check_rows(path: str, cols: list[int], header: list[str]) -> None:
    """Slow path: re-read the CSV row by row and raise a TraceError for the first bad row."""
    i_ts, i_isl, i_osl = cols
    epoch = _dt.datetime(1970, 1, 1)
    prev_us: int | None = None
    t0: int | None = None
    prev_ms = 0.0
    prev_text = ""
    with open(path, newline="", encoding="utf-8-sig") as f:
        reader = csv.reader(f)
        next(reader)
        for row in reader:
            if not row or (len(row) == 1 and not row[0].strip()):
                continue
            line = reader.line_num
            if len(row) <= max(cols):
                missing = _AZURE_COLUMNS[[c >= len(row) for c in cols].index(True)]
                raise TraceError(
                    path, line, missing, f"missing value (row has {len(row)} fields, expected {len(header)})"
                )
            if len(row) != len(header):
                raise TraceError(
                    path,
                    line,
                    None,
                    f"row has {len(row)} fields, expected {len(header)} (as the header {','.join(header)!r})",
                )
            _positive_int(row[i_isl], path, line, "ContextTokens")
            _positive_int(row[i_osl], path, line, "GeneratedTokens")
            s, offset_min = _split_utc_offset(row[i_ts].strip())
            for fmt in ("%Y-%m-%d %H:%M:%S.%f", "%Y-%m-%d %H:%M:%S", "%Y-%m-%dT%H:%M:%S.%f", "%Y-%m-%dT%H:%M:%S"):
                try:
                    d = _dt.datetime.strptime(s, fmt)
                    break
                except ValueError:
                    continue
            else:
                hint = " (a bare number such as Unix epoch milliseconds is not a timestamp here)" if s.isdigit() else ""
                raise TraceError(
                    path,
                    line,
                    "TIMESTAMP",
                    f"{s!r}: unparsable timestamp{hint}, expected 'YYYY-MM-DD HH:MM:SS.ffffff'",
                )
            delta = d - epoch
            us = (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds - (offset_min or 0) * 60_000_000
            t0 = us if t0 is None else t0
            ms = float(int((us - t0) / 1e6 * 1000.0))
            text = row[i_ts].strip()
            if prev_us is not None and ms < prev_ms:
                # each stamp as its row gives it (UTC offset included: +02:00 at 18:15 is before +00:00 at 17:00)
                raise TraceError(
                    path,
                    line,
                    "TIMESTAMP",
                    f"{text!r} is earlier than the previous row's {prev_text!r}; rows must be in arrival order "
                    "(dynoplan does not reorder traces)",
                )
            prev_us, prev_ms, prev_text = us, ms, text
    raise TraceError(path, None, None, "malformed trace (could not locate the bad row)")


# ---------------------------------------------------------------------------------------------- Mooncake
class _MooncakeRow(msgspec.Struct):
    """Typed fast path; any row it rejects is re-checked by :func:`_mooncake_check_row` for a precise error."""

    timestamp: Annotated[float, msgspec.Meta(ge=0)] | None = None
    created_time: Annotated[float, msgspec.Meta(ge=0)] | None = None
    input_length: Annotated[int, msgspec.Meta(gt=0, le=MAX_TRACE_TOKENS)] | None = None
    input_tokens: Annotated[int, msgspec.Meta(gt=0, le=MAX_TRACE_TOKENS)] | None = None
    output_length: Annotated[int, msgspec.Meta(gt=0, le=MAX_TRACE_TOKENS)] | None = None
    output_tokens: Annotated[int, msgspec.Meta(gt=0, le=MAX_TRACE_TOKENS)] | None = None
    hash_ids: Annotated[list[Annotated[int, msgspec.Meta(ge=0)]], msgspec.Meta(min_length=1)] | None = None


def load_mooncake_jsonl(path: str | Path, *, trace_block_size: int = DEFAULT_TRACE_BLOCK_SIZE) -> list[TraceRequest]:
    """Load a Mooncake-format JSONL trace.

    Returns one request per non-blank line, ``request_id`` = 0-based request index, ``arrival_ms`` = the
    row's timestamp (ms, as given), ``hash_ids`` as given (``None`` when absent = unique content).
    Raises :class:`TraceError` naming file, 1-based line and field on any malformed row, and file, line and
    column of the first byte that is not UTF-8 (anywhere in the file, unknown fields included; a column counts
    the file's bytes, a byte-order mark's too, as for a CSV). A leading UTF-8 byte-order mark is skipped.
    """
    p = str(path)
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise TraceError(p, None, None, "trace file not found") from None
    # The typed decoder skips an unknown field's value (or key) without checking that it is UTF-8, so a stray
    # byte there would pass unnoticed: the file is checked once (ASCII, the usual case, in one fast scan).
    if not data.isascii():
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            raise _not_utf8(p, data) from None
    # a byte-order mark (U+FEFF, which some editors write first: Windows Notepad, Excel's "CSV UTF-8") is not
    # content: skipped, as the CSV readers' utf-8-sig does
    data = data.removeprefix(codecs.BOM_UTF8)
    decode = msgspec.json.Decoder(_MooncakeRow).decode
    out: list[TraceRequest] = []
    lines: list[int] = []
    with_hash_ids = extra_quotes = 0
    for lineno, raw in enumerate(data.split(b"\n"), start=1):
        if not raw.strip():
            continue
        try:
            row = decode(raw)
        except msgspec.DecodeError:
            _mooncake_check_row(raw, p, lineno)
            raise  # pragma: no cover - the check always raises for a row the fast path rejected
        ts, isl, osl, hids = row.timestamp, row.input_length, row.output_length, row.hash_ids
        if ts is None or isl is None or osl is None:  # an alias or a missing field: this row checked in full
            _mooncake_check_keys(row, raw, p, lineno)
            extra_quotes += raw.count(b'"') - (6 if hids is None else 8)
            ts = ts if ts is not None else row.created_time
            isl = isl if isl is not None else row.input_tokens
            osl = osl if osl is not None else row.output_tokens
            if ts is None or isl is None or osl is None:
                _mooncake_check_row(raw, p, lineno)
        if not math.isfinite(ts):
            _mooncake_check_row(raw, p, lineno)
        hash_ids = None
        if hids is not None:
            with_hash_ids += 1
            hash_ids = tuple(hids)
            cap = len(hash_ids) * trace_block_size
            if isl > cap:
                isl = cap
        lines.append(lineno)
        out.append(TraceRequest(len(out), ts, isl, osl, hash_ids))
    if not out:
        raise TraceError(p, None, None, "no requests: the file is empty")
    # A field given twice (the decoder keeps the last) or with its alias must be refused. A row of the common
    # shape (timestamp, input_length, output_length and perhaps hash_ids, numbers only) has exactly the
    # quotes of its keys, so a file whose quote count is that sum holds no row with another key: only a file
    # off that shape (other keys, strings, a key twice) is re-read row by row (one vectorised count here).
    quotes = np.count_nonzero(np.frombuffer(data, dtype=np.uint8) == ord('"'))
    if quotes != 6 * len(out) + 2 * with_hash_ids + extra_quotes:
        _mooncake_check_all_keys(data, decode, p)
    arrival = np.fromiter((r.arrival_ms for r in out), dtype=np.float64, count=len(out))
    _check_monotone(arrival, lines, p, "timestamp")
    _check_timestamp_bound(arrival, lines, p, "timestamp")
    return out


_MOONCAKE_KEYS = tuple((k, f'"{k}"'.encode()) for names in _MOONCAKE_ALIASES.values() for k in names) + (
    ("hash_ids", b'"hash_ids"'),
)
"""Every field the Mooncake reader takes, with its quoted form as it appears in a row's bytes."""


def _mooncake_check_all_keys(data: bytes, decode: Any, p: str) -> None:
    """Re-read every row and check its keys (:func:`_mooncake_check_keys`); every row decoded before, so
    ``decode`` succeeds."""
    for lineno, raw in enumerate(data.split(b"\n"), start=1):
        if raw.strip():
            _mooncake_check_keys(decode(raw), raw, p, lineno)


def _mooncake_check_keys(row: _MooncakeRow, raw: bytes, p: str, lineno: int) -> None:
    """Raise a TraceError for a row that gives a field and its alias (both non-null) or a field twice (JSON
    allows it; decoders silently keep one). A row whose quotes are just those of its non-null fields' keys
    holds no key twice; otherwise a full parse with every key pair (:func:`json.loads`) runs only when the
    row's bytes hold a quoted field name twice."""
    for name, (primary, alias) in _MOONCAKE_ALIASES.items():
        if getattr(row, primary) is not None and getattr(row, alias) is not None:
            raise TraceError(
                p, lineno, name, f"given twice, as {primary!r} and its alias {alias!r}: expected one of them"
            )
    given = sum(getattr(row, name) is not None for name, _ in _MOONCAKE_KEYS)
    if raw.count(b'"') != 2 * given and any(raw.count(quoted) > 1 for _, quoted in _MOONCAKE_KEYS):
        _mooncake_check_duplicates(raw, p, lineno)


def _mooncake_check_duplicates(raw: bytes, p: str, lineno: int) -> None:
    """Raise a TraceError when the row's top-level object holds one of the reader's fields more than once."""
    try:
        pairs = json.loads(raw, object_pairs_hook=tuple)  # an object as its (key, value) pairs; arrays are lists
    except ValueError:
        return  # not JSON (or not UTF-8): the caller's check names it
    if not isinstance(pairs, tuple):
        return  # not an object: the caller's check names it
    seen = collections.Counter(k for k, _ in pairs)
    for name, _ in _MOONCAKE_KEYS:
        if seen[name] > 1:
            raise TraceError(p, lineno, name, f"given {seen[name]} times in the object, expected each field once")


def _cut(v: Any) -> str:
    """A value of a JSON row as its message shows it, cut to 80 characters (a pasted list can be long): JSON's own
    words for the literals (``true``, ``false``, ``null``, which Python's repr spells ``True`` / ``None``), JSON
    text for a list or an object, ``repr`` for a string (quoted as the field names are) and a number."""
    if v is None or isinstance(v, (bool, list, dict)):
        r = msgspec.json.encode(v).decode()
    else:
        r = repr(v)
    return r if len(r) <= 80 else r[:77] + "..."


def _json_error_field(raw: bytes, message: str) -> tuple[str | None, str]:
    """(the key whose value a JSON decode error is at, the message): msgspec's ``(byte N)`` at the start of a
    value after ``"key":`` names that key, and a ``NaN`` / ``Infinity`` there (not JSON) is said to be one;
    (None, the decoder's message) elsewhere."""
    plain = f"not valid JSON: {message}"
    m = re.search(r"\(byte (\d+)\)", message)
    if m is None:
        return None, plain
    pos = int(m.group(1))
    key = re.search(rb'"([^"\\]{1,64})"\s*:\s*(-?)$', raw[:pos])  # the decoder stops after a minus sign
    if key is None:
        return None, plain
    word = re.match(rb"-?(NaN|Infinity|inf|nan)", raw[pos - len(key.group(2)) :])
    if word is not None:
        return key.group(1).decode(
            "utf-8", "replace"
        ), f"{word.group(0).decode()}: not a JSON number, expected a finite number"
    return key.group(1).decode("utf-8", "replace"), plain


def _mooncake_check_row(raw: bytes, p: str, lineno: int) -> NoReturn:
    """Slow path: decode one row generically and raise a TraceError naming the bad field."""
    _mooncake_check_duplicates(raw, p, lineno)
    try:
        row = msgspec.json.decode(raw)
    except msgspec.DecodeError as e:
        raise TraceError(p, lineno, *_json_error_field(raw, str(e))) from None
    if not isinstance(row, dict):
        raise TraceError(p, lineno, None, f"expected a JSON object, got {type(row).__name__}")
    ts = _mooncake_field(row, "timestamp", p, lineno)
    if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts) or ts < 0:
        raise TraceError(p, lineno, "timestamp", f"{_cut(ts)}: expected a finite number of milliseconds >= 0")
    for name in ("input_length", "output_length"):
        v = _mooncake_field(row, name, p, lineno)
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0 or v > MAX_TRACE_TOKENS:
            raise TraceError(p, lineno, name, f"{_cut(v)}: expected a positive integer <= {MAX_TRACE_TOKENS}")
    hids = row.get("hash_ids")
    if hids is not None:
        if not isinstance(hids, list):
            raise TraceError(p, lineno, "hash_ids", f"{_cut(hids)}: expected a list of non-negative integers")
        for k, h in enumerate(hids):
            if not (isinstance(h, int) and not isinstance(h, bool) and h >= 0):
                raise TraceError(
                    p, lineno, f"hash_ids[{k}]", f"{_cut(h)}: expected a non-negative integer (a prompt block id)"
                )
        if not hids:
            raise TraceError(p, lineno, "hash_ids", "empty list: expected one id per trace block of the prompt")
    raise TraceError(p, lineno, None, "malformed row")


def _mooncake_field(row: dict[str, Any], name: str, path: str, line: int) -> Any:
    primary, alias = _MOONCAKE_ALIASES[name]
    if row.get(primary) is not None and row.get(alias) is not None:
        raise TraceError(path, line, name, f"given twice, as {primary!r} and its alias {alias!r}: expected one of them")
    for alias in _MOONCAKE_ALIASES[name]:
        if alias in row:
            return row[alias]
    alts = " or ".join(repr(a) for a in _MOONCAKE_ALIASES[name])
    raise TraceError(path, line, name, f"missing field (expected {alts})")


# ---------------------------------------------------------------------------------------------- helpers
def _not_utf8(path: str | Path, data: bytes | None = None) -> TraceError:
    """A TraceError naming the line and byte of the first non-UTF-8 byte of ``data``, the file's bytes (None:
    read again from ``path``, as for the text readers, which only know the offset inside their read buffer)."""
    if data is None:
        data = Path(path).read_bytes()
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        col = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        return TraceError(str(path), line, None, f"byte 0x{data[e.start]:02x} at column {col}: expected UTF-8 text")
    return TraceError(str(path), None, None, "expected UTF-8 text")  # pragma: no cover - caller saw a decode error


def _positive_int(text: str, path: str, line: int, field: str) -> int:
    try:
        v = int_text(text)
    except ValueError:
        raise TraceError(path, line, field, f"{text!r}: expected a positive integer") from None
    if v <= 0 or v > MAX_TRACE_TOKENS:
        raise TraceError(path, line, field, f"{v}: expected a positive integer <= {MAX_TRACE_TOKENS}")
    return v


def _check_timestamp_bound(arrival: np.ndarray, lines: list[int], path: str, field: str) -> None:
    """TraceError for the first timestamp above :data:`MAX_TRACE_TIMESTAMP_MS` (``arrival`` in row order),
    diagnosing Unix epoch milliseconds (:data:`EPOCH_MS_THRESHOLD`)."""
    over = np.flatnonzero(arrival > MAX_TRACE_TIMESTAMP_MS)
    if not over.size:
        return
    i = int(over[0])
    t = float(arrival[i])
    if EPOCH_MS_THRESHOLD <= t < 1e15:  # up to year 33658: a plausible wall-clock time
        when = _dt.datetime.fromtimestamp(t / 1000.0, tz=_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        raise TraceError(
            path,
            lines[i],
            field,
            f"{t:.6g} ms looks like Unix epoch milliseconds ({when}); expected milliseconds since the "
            f"trace start (subtract the first row's timestamp), at most {MAX_TRACE_TIMESTAMP_MS:.4g} ms",
        )
    raise TraceError(
        path,
        lines[i],
        field,
        f"{t:.6g} ms: expected milliseconds since the trace start, at most {MAX_TRACE_TIMESTAMP_MS:.4g} ms "
        f"(about 52 days; float64 ms resolve the engine's nanosecond pass times only up to there)",
    )


def _check_monotone(arrival: np.ndarray, lines: list[int], path: str, field: str) -> None:
    if len(arrival) > 1:
        back = np.flatnonzero(np.diff(arrival) < 0)
        if back.size:
            i = int(back[0]) + 1
            raise TraceError(
                path,
                lines[i],
                field,
                f"arrival {arrival[i]:g} ms is earlier than the previous row's {arrival[i - 1]:g} ms; "
                "rows must be in arrival order (dynoplan does not reorder traces)",
            )


# ---------------------------------------------------------------------------------------------- synthetic
@dataclass(frozen=True, slots=True)
class LengthDist:
    """A token-length distribution: ``fixed`` (a), ``uniform`` (integers in [a, b]) or ``lognormal``
    (arithmetic mean a tokens, log-space sigma b; mu = ln(a) - b^2/2 so the mean is a). Samples are
    rounded to integers and clipped to [1, MAX_TRACE_TOKENS]; a, b <= MAX_TRACE_TOKENS for fixed/uniform
    and the lognormal mean, and the lognormal sigma b <= :data:`MAX_LOGNORMAL_SIGMA` (a larger sigma puts
    the mean in draws a workload never makes: at sigma 100 every draw is 1 token)."""

    kind: str
    a: float
    b: float = 0.0

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.kind == "fixed":
            return np.full(n, int(self.a), dtype=np.int64)
        if self.kind == "uniform":
            return rng.integers(int(self.a), int(self.b), size=n, endpoint=True, dtype=np.int64)
        mu = math.log(self.a) - self.b * self.b / 2.0
        return np.clip(np.rint(rng.lognormal(mu, self.b, size=n)), 1, MAX_TRACE_TOKENS).astype(np.int64)

    @classmethod
    def parse(cls, text: str, field: str, spec: str) -> LengthDist:
        parts = text.split(":")
        swapped = ""
        try:
            if len(parts) == 1:
                v = int_text(parts[0])
                if v <= 0 or v > MAX_TRACE_TOKENS:
                    raise ValueError
                return cls("fixed", v)
            kind, nums = parts[0], [float_text(x) for x in parts[1:]]
            if (
                kind == "uniform"
                and len(nums) == 2
                and nums[0] >= 1
                and MAX_TRACE_TOKENS >= nums[1] >= nums[0]
                and all(x == int(x) for x in nums)
            ):
                return cls("uniform", nums[0], nums[1])
            if kind == "uniform" and len(nums) == 2 and MAX_TRACE_TOKENS >= nums[0] > nums[1] >= 1:
                swapped = f"MIN {nums[0]:g} above MAX {nums[1]:g}, expected MIN <= MAX"
            if (
                kind == "lognormal"
                and len(nums) == 2
                and MAX_TRACE_TOKENS >= nums[0] >= 1
                and MAX_LOGNORMAL_SIGMA >= nums[1] >= 0
                and all(math.isfinite(x) for x in nums)
            ):
                return cls("lognormal", nums[0], nums[1])
        except ValueError:
            pass
        if swapped:
            raise TraceError(spec, None, field, f"{text!r}: {swapped}")
        raise TraceError(
            spec,
            None,
            field,
            f"{text!r}: expected a positive integer, 'uniform:MIN:MAX' or "
            f"'lognormal:MEAN:SIGMA' (tokens, at most {MAX_TRACE_TOKENS}; SIGMA from 0 to {MAX_LOGNORMAL_SIGMA:g})",
        )


@dataclass(frozen=True, slots=True)
class SyntheticWorkload:
    """A seeded synthetic workload (see :func:`parse_synthetic_spec` for the text form)."""

    arrival: str = "poisson"
    """``constant`` (gaps of exactly 1/rate), ``poisson`` (exponential gaps) or ``gamma`` (gamma gaps)."""
    rate_rps: float = 1.0
    """Mean arrival rate (requests per second)."""
    duration_s: float | None = None
    """Arrivals in [0, duration_s); at least one of duration_s / num_requests must be set."""
    num_requests: int | None = None
    """Maximum number of requests."""
    shape: float = 1.0
    """Gamma shape k (gaps ~ Gamma(k, 1/(k*rate)): mean 1/rate, CV 1/sqrt(k)); 1.0 = Poisson."""
    isl: LengthDist = LengthDist("fixed", 1000)
    """Input sequence length (tokens)."""
    osl: LengthDist = LengthDist("fixed", 200)
    """Output sequence length (tokens)."""
    prefix_groups: int = 0
    """Number of shared-prefix groups (0 = none); each request joins one uniformly at random."""
    prefix_len: int = 0
    """Shared prefix length in tokens, rounded down to whole trace blocks."""
    seed: int = 0
    """Seed of the numpy Generator (PCG64); same spec + seed -> identical workload."""


_SYN_KEYS = {"rate", "duration_s", "num_requests", "shape", "isl", "osl", "prefix_groups", "prefix_len", "seed"}


def parse_synthetic_spec(spec: str, *, default_seed: int | None = None) -> SyntheticWorkload:
    """Parse ``synthetic:KIND?key=value&...``.

    KIND: ``constant`` | ``poisson`` | ``gamma``. Keys: ``rate`` (req/s, required), ``duration_s`` and/or
    ``num_requests`` (at least one), ``shape`` (gamma only, default 1), ``isl`` / ``osl`` (``N``,
    ``uniform:MIN:MAX`` or ``lognormal:MEAN:SIGMA``; defaults 1000 / 200), ``prefix_groups`` and
    ``prefix_len`` (shared prefixes), ``seed`` (default: ``default_seed``, else 0).
    Example: ``synthetic:poisson?rate=5&duration_s=600&isl=lognormal:1000:0.5&osl=200&seed=1``.
    Raises :class:`TraceError` naming the bad key, or the item that is empty or has no key (``rate=1&&seed=2``,
    a trailing ``&``, ``&=5``).
    """
    body = spec[len("synthetic:") :] if spec.startswith("synthetic:") else spec
    kind, _, query = body.partition("?")
    if kind not in ("constant", "poisson", "gamma"):
        raise TraceError(
            spec, None, "arrival", f"{kind!r}: unknown arrival process, expected constant, poisson or gamma"
        )
    # items are read literally: "&" separates them and the first "=" splits key from value. No URL decoding
    # (urllib's parse_qsl turned '+' into a space, so rate=1e+3 was refused as '1e 3', and %XX into its character,
    # so isl=1%300 ran as isl=100); the values are numbers and length laws, which need neither
    params: dict[str, str] = {}
    for i, item in enumerate(query.split("&") if query else (), start=1):
        k, _, v = item.partition("=")
        if not k.strip():
            what = "without a key" if item.strip() else "blank" if item else "empty (a doubled '&', or one at an end)"
            raise TraceError(spec, None, None, f"item {i} {item!r} is {what}; expected key=value items joined by '&'")
        if k not in _SYN_KEYS:
            raise TraceError(spec, None, k, f"unknown parameter, expected one of {', '.join(sorted(_SYN_KEYS))}")
        if k in params:
            raise TraceError(spec, None, k, f"given twice ({params[k]!r} and {v!r}), expected each key once")
        params[k] = v

    def num(key: str, conv: Any, ok: Any, expect: str, default: Any = None) -> Any:
        if key not in params:
            return default
        try:
            v = conv(params[key])
        except ValueError:
            v = None
        if v is None or not ok(v):
            raise TraceError(spec, None, key, f"{params[key]!r}: expected {expect}")
        return v

    pos_float = lambda v: math.isfinite(v) and v > 0  # noqa: E731
    rate = num("rate", float_text, pos_float, "a number > 0 (requests per second)")
    if rate is None:
        raise TraceError(spec, None, "rate", "missing: expected rate=R (requests per second)")
    duration_s = num("duration_s", float_text, pos_float, "a number of seconds > 0")
    n = num("num_requests", int_text, lambda v: v > 0, "a positive integer")
    if duration_s is None and n is None:
        raise TraceError(spec, None, "duration_s", "missing: give duration_s=S and/or num_requests=N")
    expected_n = min(n if n is not None else math.inf, rate * duration_s if duration_s is not None else math.inf)
    if expected_n > MAX_SYNTHETIC_REQUESTS:
        about = f"about {expected_n:.3g}" if math.isfinite(expected_n) else "more than 1e+308"
        if n is not None and n == expected_n:
            key, given = "num_requests", repr(params["num_requests"])
        else:  # the product of two fields: both named (a rate of 1e308 is as much at fault as the duration)
            key, given = "duration_s", f"{params['duration_s']!r} x rate {params['rate']!r}"
        raise TraceError(
            spec,
            None,
            key,
            f"{given}: {about} requests; expected at most {MAX_SYNTHETIC_REQUESTS:,} (num_requests, or rate x "
            "duration_s)",
        )
    shape = num("shape", float_text, pos_float, "a number > 0", 1.0)
    if "shape" in params and kind != "gamma":
        raise TraceError(spec, None, "shape", f"only meaningful for gamma arrivals, not {kind}")
    isl = LengthDist.parse(params["isl"], "isl", spec) if "isl" in params else LengthDist("fixed", 1000)
    osl = LengthDist.parse(params["osl"], "osl", spec) if "osl" in params else LengthDist("fixed", 200)
    groups = num("prefix_groups", int_text, lambda v: v >= 0, "an integer >= 0", 0)
    plen = num("prefix_len", int_text, lambda v: v >= 0, "an integer >= 0 (tokens)", 0)
    if "prefix_groups" in params and groups == 0:
        raise TraceError(
            spec,
            None,
            "prefix_groups",
            "prefix_groups=0: expected an integer >= 1 (or leave out "
            "prefix_groups and prefix_len for no shared prefixes)",
        )
    if "prefix_len" in params and plen == 0:
        raise TraceError(
            spec,
            None,
            "prefix_len",
            "prefix_len=0: expected an integer >= 1 (tokens; or leave out "
            "prefix_groups and prefix_len for no shared prefixes)",
        )
    if (groups > 0) != (plen > 0):
        missing = "prefix_len" if groups > 0 else "prefix_groups"
        raise TraceError(spec, None, missing, f"{missing} missing: prefix_groups and prefix_len must be given together")
    seed = num("seed", int_text, lambda v: v >= 0, "an integer >= 0", default_seed if default_seed is not None else 0)
    return SyntheticWorkload(kind, rate, duration_s, n, shape, isl, osl, groups, plen, seed)


def synthesize(w: SyntheticWorkload, *, trace_block_size: int = DEFAULT_TRACE_BLOCK_SIZE) -> list[TraceRequest]:
    """Generate the requests of ``w``: first arrival at 0 ms, then gaps from the arrival process.

    Draw order is fixed (gaps, ISL, OSL, prefix groups) from one ``numpy.random.default_rng(w.seed)``, so
    the result is a pure function of ``w`` and ``trace_block_size``. Hash ids: the first
    ``prefix_len // trace_block_size`` blocks of a request in group g are the group's ids (shared by the
    whole group; a prompt shorter than the prefix is all prefix); every other block gets a fresh id. Raises
    :class:`TraceError` for a ``prefix_len`` shorter than one block, or if it would produce
    no request, or more than :data:`MAX_SYNTHETIC_REQUESTS` (checked while the gaps are drawn: a gamma
    ``shape`` far below 1 puts many times rate x duration_s arrivals before ``duration_s``).
    """
    if 0 < w.prefix_len < trace_block_size:  # the shared prefix would round down to no block: no sharing at all
        raise TraceError(
            "synthetic",
            None,
            "prefix_len",
            f"prefix_len={w.prefix_len}: shorter than one trace block (trace_block_size={trace_block_size} tokens), "
            f"so nothing would be shared; expected at least {trace_block_size}",
        )
    rng = np.random.default_rng(w.seed)
    mean_gap_ms = 1000.0 / w.rate_rps
    limit_n = w.num_requests
    horizon_ms = None if w.duration_s is None else w.duration_s * 1000.0
    if limit_n is None:
        assert horizon_ms is not None
        est = int(horizon_ms / mean_gap_ms * 1.2) + 16
    else:
        est = limit_n
    gaps_parts: list[np.ndarray] = []
    total = 0.0
    count = 0
    while True:
        if w.arrival == "constant":
            g = np.full(est, mean_gap_ms)
        elif w.arrival == "poisson":
            g = rng.exponential(mean_gap_ms, size=est)
        else:
            g = rng.gamma(w.shape, mean_gap_ms / w.shape, size=est)
        gaps_parts.append(g)
        count += est
        total += float(g.sum())
        if (limit_n is not None and count >= limit_n) or (horizon_ms is not None and total >= horizon_ms):
            break
        if count > MAX_SYNTHETIC_REQUESTS:  # every arrival drawn so far falls before duration_s: too many
            _too_many_arrivals(w, count)
        est = max(16, est // 2)
    gaps = np.concatenate(gaps_parts)
    arrival = np.concatenate(([0.0], np.cumsum(gaps)[:-1]))
    if limit_n is not None:
        arrival = arrival[:limit_n]
    if horizon_ms is not None:
        arrival = arrival[arrival < horizon_ms]
    n = len(arrival)
    if n == 0:
        raise TraceError("synthetic", None, None, "the workload has no requests")
    if n > MAX_SYNTHETIC_REQUESTS:
        _too_many_arrivals(w, n)
    isl = w.isl.sample(rng, n)
    osl = w.osl.sample(rng, n)
    groups = rng.integers(0, w.prefix_groups, size=n) if w.prefix_groups > 0 else None
    shared_blocks = w.prefix_len // trace_block_size
    next_id = w.prefix_groups * shared_blocks
    out: list[TraceRequest] = []
    for i, (a, il, ol) in enumerate(zip(arrival.tolist(), isl.tolist(), osl.tolist())):
        k = max(1, -(-il // trace_block_size))
        if groups is not None:
            s = min(shared_blocks, k)
            base = int(groups[i]) * shared_blocks
            ids = tuple(range(base, base + s)) + tuple(range(next_id, next_id + k - s))
            next_id += k - s
        else:
            ids = tuple(range(next_id, next_id + k))
            next_id += k
        out.append(TraceRequest(i, a, il, ol, ids))
    return out


def _too_many_arrivals(w: SyntheticWorkload, count: int) -> NoReturn:
    """Raise the TraceError of a workload whose arrival process puts more than MAX_SYNTHETIC_REQUESTS
    arrivals before ``duration_s`` (a gamma shape far below 1: most gaps are almost 0, so the count is not
    rate x duration_s), naming the parameters."""
    params = f"rate={w.rate_rps:g}, duration_s={w.duration_s:g}" + (
        f", shape={w.shape:g}" if w.arrival == "gamma" else ""
    )
    raise TraceError(
        "synthetic",
        None,
        "shape" if w.arrival == "gamma" else "duration_s",
        f"{w.arrival} arrivals with {params} put at least {count:,} requests before duration_s "
        f"(rate x duration_s = {w.rate_rps * (w.duration_s or 0.0):.3g}); expected at most "
        f"{MAX_SYNTHETIC_REQUESTS:,} (a larger gamma shape, or num_requests)",
    )


# ---------------------------------------------------------------------------------------------- rate envelope
_ENVELOPE_KEYS = ("period_s", "low", "high", "phase_s", "duration_s")
_ENVELOPE_FORM = (
    "periodic:period_s=P,low=A,high=B[,phase_s=S][,duration_s=D] or a CSV file with the header time_s,multiplier"
)
MAX_RATE_MULTIPLIER = 1e9
"""Largest rate-envelope multiplier; a positive multiplier is at least ``1 / MAX_RATE_MULTIPLIER`` (0 is a
silent stretch). m divides the trace's gaps by m: at 1e9 a one-second gap becomes one nanosecond, the
engine's time resolution (:func:`mocker.timing.round_ns`), and at 1e-9 one millisecond becomes 11.6 days;
farther out arrivals only merge or leave the trace's time bound, and from about 1e154 (or below 1e-300) the
warp's float64 arithmetic overflows (``m * m``, ``x / m``). With these bounds and envelope times of at most
:data:`MAX_ENVELOPE_S` every step of the warp stays finite."""
MIN_RATE_MULTIPLIER = 1.0 / MAX_RATE_MULTIPLIER
"""Smallest positive rate-envelope multiplier (see :data:`MAX_RATE_MULTIPLIER`)."""
MAX_ENVELOPE_S = MAX_TRACE_TIMESTAMP_MS / 1000.0
"""Largest CSV ``time_s`` and periodic ``period_s`` of a rate envelope (seconds): the trace timestamp bound
:data:`MAX_TRACE_TIMESTAMP_MS` (about 52 days), past which warped arrivals are refused anyway; it keeps the
CSV's integral table (time x multiplier) finite and the periodic inverse's 64 halvings below the float64
spacing of the times it returns."""
_MULTIPLIER_RANGE = f"from {MIN_RATE_MULTIPLIER:g} to {MAX_RATE_MULTIPLIER:g}"
_BISECTION_STEPS = 64
"""Halvings of the periodic envelope's inverse bracket (width <= 2 * period / pi): 64 bring it below the
float64 spacing of any time the bracket can hold."""


@dataclass(frozen=True, slots=True)
class RateEnvelope:
    """A request-rate multiplier m(t) over the trace's clock (t in seconds from the trace origin, after
    ``--arrival-speedup``), applied by :func:`apply_rate_envelope`.

    ``periodic``: a raised cosine between ``low`` and ``high`` of period ``period_s``:
    m(t) = low + (high - low) * (1 - cos(2 pi (t + phase_s) / period_s)) / 2, so phase_s = 0 starts at the
    low point and phase_s = period_s / 2 at the peak. ``csv``: piecewise-linear through the points
    (``times_s[i]``, ``multipliers[i]``), first point at 0 s, constant after the last point.
    ``duration_s`` (periodic only): the warped trace is repeated to cover and then cut at this many seconds.
    Build one with :func:`parse_rate_envelope`.
    """

    kind: str
    """``periodic`` or ``csv``."""
    period_s: float = 0.0
    low: float = 1.0
    high: float = 1.0
    phase_s: float = 0.0
    duration_s: float | None = None
    times_s: tuple[float, ...] = ()
    multipliers: tuple[float, ...] = ()
    source: str = "--rate-envelope"
    """What error messages name (``--rate-envelope`` or ``--rate-envelope FILE``)."""

    def multiplier(self, t_s: Any) -> np.ndarray:
        """m(t) at the times ``t_s`` (seconds, array-like, >= 0)."""
        t = np.asarray(t_s, dtype=np.float64)
        if self.kind == "periodic":
            return (
                self.low
                + (self.high - self.low) * (1.0 - np.cos(2.0 * math.pi * (t + self.phase_s) / self.period_s)) / 2.0
            )
        return np.interp(t, np.asarray(self.times_s), np.asarray(self.multipliers))  # constant past the ends

    def integral(self, t_s: Any) -> np.ndarray:
        """M(t) = the integral of m over [0, t] (seconds x multiplier), closed form: for the raised cosine
        M(t) = (low + high)/2 t - (high - low)/2 P/(2 pi) [sin(2 pi (t + S)/P) - sin(2 pi S/P)]; for the CSV
        the exact trapezoid of each linear piece."""
        t = np.asarray(t_s, dtype=np.float64)
        if self.kind == "periodic":
            p, s = self.period_s, self.phase_s
            mean, amp = (self.low + self.high) / 2.0, (self.high - self.low) / 2.0
            w = 2.0 * math.pi / p
            return mean * t - amp / w * (np.sin(w * (t + s)) - math.sin(w * s))
        knots, m, cum = self._csv_tables()
        k = np.clip(np.searchsorted(knots, t, side="right") - 1, 0, len(knots) - 1)
        u = t - knots[k]
        slope = self._csv_slopes()[k]
        return cum[k] + m[k] * u + 0.5 * slope * u * u

    def inverse_integral(self, x: Any) -> np.ndarray:
        """The warped time t' with M(t') = x (the smallest such t' where m is 0 over a stretch), for x >= 0
        (seconds). CSV: the root of each piece's quadratic, in the cancellation-free form
        u = 2r / (m_k + sqrt(m_k^2 + 2 a r)). Periodic: bisection inside [(x - c)/mean, (x + c)/mean],
        c = (high - low) P / (2 pi) bounding the sine term."""
        x = np.asarray(x, dtype=np.float64)
        if self.kind == "periodic":
            mean = (self.low + self.high) / 2.0
            c = (self.high - self.low) * self.period_s / (2.0 * math.pi)
            lo = np.maximum(0.0, (x - c) / mean)
            hi = (x + c) / mean
            if c > 0:
                for _ in range(_BISECTION_STEPS):
                    mid = (lo + hi) / 2.0
                    below = self.integral(mid) < x
                    lo = np.where(below, mid, lo)
                    hi = np.where(below, hi, mid)
            return np.where(x > 0, hi, 0.0)
        knots, m, cum = self._csv_tables()
        k = np.clip(np.searchsorted(cum, x, side="right") - 1, 0, len(knots) - 1)
        r = x - cum[k]
        slope = self._csv_slopes()[k]
        root = np.sqrt(np.maximum(m[k] * m[k] + 2.0 * slope * r, 0.0))
        with np.errstate(divide="ignore", invalid="ignore"):
            u = np.where(r > 0, 2.0 * r / (m[k] + root), 0.0)
        return knots[k] + u

    @property
    def horizon_s(self) -> float | None:
        """The warped time the envelope asks to cover: ``duration_s`` (periodic), the last CSV time (csv; None
        when the CSV has a single point at 0 s)."""
        if self.kind == "periodic":
            return self.duration_s
        return self.times_s[-1] if self.times_s[-1] > 0 else None

    def _csv_tables(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        knots = np.asarray(self.times_s, dtype=np.float64)
        m = np.asarray(self.multipliers, dtype=np.float64)
        cum = np.concatenate(([0.0], np.cumsum(np.diff(knots) * (m[:-1] + m[1:]) / 2.0)))
        return knots, m, cum

    def _csv_slopes(self) -> np.ndarray:
        knots = np.asarray(self.times_s, dtype=np.float64)
        m = np.asarray(self.multipliers, dtype=np.float64)
        return np.concatenate((np.diff(m) / np.diff(knots), [0.0]))  # constant after the last point


def parse_rate_envelope(spec: str) -> RateEnvelope:
    """Parse ``--rate-envelope SPEC``: ``periodic:period_s=P,low=A,high=B[,phase_s=S][,duration_s=D]``
    (0 < P <= :data:`MAX_ENVELOPE_S` s, 0 <= A <= B, B > 0, S any finite number of seconds, D > 0 s) or the
    path of a CSV file with the header ``time_s,multiplier`` (first row at time_s 0, times strictly
    increasing and at most :data:`MAX_ENVELOPE_S`, multipliers >= 0, the last one > 0 since it holds for
    ever after). Every multiplier (A, B, the CSV's) is 0 or from :data:`MIN_RATE_MULTIPLIER` to
    :data:`MAX_RATE_MULTIPLIER` (B and the CSV's last not 0). Numbers are read by the shared grammar
    (:func:`dynoplan.fields.float_text`: not ``1_0`` or non-ASCII digits). Raises :class:`TraceError`
    naming the field (and the CSV line), the value and what was expected.
    """
    src = "--rate-envelope"
    if not isinstance(spec, str) or not spec.strip():
        raise TraceError(src, None, None, f"{spec!r}: expected {_ENVELOPE_FORM}")
    if spec.startswith("periodic:"):
        return _parse_periodic(spec[len("periodic:") :])
    path = Path(spec)
    if not path.is_file():
        kind = re.match(r"^([A-Za-z_]+):", spec)
        if kind and not path.exists():
            raise TraceError(
                src, None, None, f"{spec!r}: unknown envelope kind {kind.group(1)!r}, expected {_ENVELOPE_FORM}"
            )
        what = "file not found" if not path.exists() else "not a regular file"
        raise TraceError(src, None, None, f"{spec}: {what}, expected {_ENVELOPE_FORM}")
    return _load_envelope_csv(path)


def _parse_periodic(body: str) -> RateEnvelope:
    src = "--rate-envelope"
    params: dict[str, str] = {}
    for item in body.split(","):
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or not key:
            raise TraceError(
                src,
                None,
                None,
                f"periodic item {item!r}: expected KEY=VALUE with KEY one of {', '.join(_ENVELOPE_KEYS)}",
            )
        if key not in _ENVELOPE_KEYS:
            raise TraceError(src, None, key, f"unknown parameter, expected one of {', '.join(_ENVELOPE_KEYS)}")
        if key in params:
            raise TraceError(src, None, key, f"given twice ({params[key]!r} and {value!r}), expected each key once")
        params[key] = value.strip()

    def num(key: str, ok: Any, expect: str, default: float | None = None) -> float | None:
        if key not in params:
            return default
        try:
            v = float_text(params[key])
        except ValueError:
            v = math.nan
        if not (math.isfinite(v) and ok(v)):
            raise TraceError(src, None, key, f"{params[key]!r}: expected {expect}")
        return v

    for key in ("period_s", "low", "high"):
        if key not in params:
            raise TraceError(src, None, key, f"missing: expected {_ENVELOPE_FORM.split(' or ')[0]}")
    period = num("period_s", lambda v: 0 < v <= MAX_ENVELOPE_S, f"a number of seconds > 0 and <= {MAX_ENVELOPE_S:g}")
    low = num("low", _in_multiplier_range, f"a multiplier >= 0 (0, or {_MULTIPLIER_RANGE})")
    high = num("high", lambda v: v > 0 and _in_multiplier_range(v), f"a multiplier > 0 ({_MULTIPLIER_RANGE})")
    assert period is not None and low is not None and high is not None
    if high < low:
        raise TraceError(src, None, "high", f"{params['high']!r}: expected a multiplier >= low ({params['low']})")
    phase = num("phase_s", lambda v: True, "a finite number of seconds", 0.0)
    duration = num("duration_s", lambda v: v > 0, "a number of seconds > 0")
    assert phase is not None
    return RateEnvelope("periodic", period_s=period, low=low, high=high, phase_s=phase, duration_s=duration)


def _load_envelope_csv(path: Path) -> RateEnvelope:
    src = f"--rate-envelope {path}"
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            reader = csv.reader(f)
            rows = [(reader.line_num, r) for r in reader if r and (len(r) > 1 or r[0].strip())]
    except UnicodeDecodeError:
        e = _not_utf8(path)
        raise TraceError(src, e.line, None, str(e).split(": ", 1)[-1].strip()) from None
    except OSError as e:
        raise TraceError(src, None, None, f"cannot read: {e.strerror or e}") from None
    except csv.Error as e:
        raise TraceError(src, None, None, f"unreadable CSV: {e}") from None
    if not rows or [h.strip().lower() for h in rows[0][1]] != ["time_s", "multiplier"]:
        got = ",".join(rows[0][1]) if rows else ""
        raise TraceError(src, rows[0][0] if rows else None, None, f"header {got!r}: expected time_s,multiplier")
    if len(rows) < 2:
        raise TraceError(src, None, None, "no rows after the header: expected at least the row at time_s 0")
    times: list[float] = []
    mults: list[float] = []
    for line, row in rows[1:]:
        if len(row) != 2:
            raise TraceError(src, line, None, f"row has {len(row)} fields, expected 2 (time_s,multiplier)")
        t = _finite(row[0])
        if t is None or not 0 <= t <= MAX_ENVELOPE_S:
            raise TraceError(
                src,
                line,
                "time_s",
                f"{row[0].strip()!r}: expected a finite number of seconds >= 0 and <= {MAX_ENVELOPE_S:g}",
            )
        if not times and t != 0:
            raise TraceError(src, line, "time_s", f"{row[0].strip()!r}: expected the first row at time_s 0")
        if times and t <= times[-1]:
            raise TraceError(
                src,
                line,
                "time_s",
                f"{row[0].strip()!r}: expected a time after the previous row's "
                f"{times[-1]:g} s (rows in increasing time)",
            )
        m = _finite(row[1])
        if m is None or not _in_multiplier_range(m):
            raise TraceError(
                src,
                line,
                "multiplier",
                f"{row[1].strip()!r}: expected a finite number >= 0 (0, or {_MULTIPLIER_RANGE})",
            )
        times.append(t)
        mults.append(m)
    if mults[-1] <= 0:
        raise TraceError(
            src,
            rows[-1][0],
            "multiplier",
            f"{rows[-1][1][1].strip()!r}: expected the last multiplier "
            "> 0 (it holds after the last row, and a zero rate there never ends)",
        )
    return RateEnvelope("csv", times_s=tuple(times), multipliers=tuple(mults), source=src)


def _in_multiplier_range(m: float) -> bool:
    """0, or a multiplier from :data:`MIN_RATE_MULTIPLIER` to :data:`MAX_RATE_MULTIPLIER`."""
    return m == 0 or MIN_RATE_MULTIPLIER <= m <= MAX_RATE_MULTIPLIER


def _finite(text: str) -> float | None:
    try:
        v = float_text(text)
    except ValueError:
        return None
    return v if math.isfinite(v) else None


def apply_rate_envelope(requests: Sequence[TraceRequest], envelope: RateEnvelope) -> list[TraceRequest]:
    """Time-warp ``requests`` (in arrival order) by ``envelope``: arrival t (seconds) moves to t' with
    M(t') = t, M the integral of m, so requests that arrive at local rate r arrive at r m(t') and each
    request keeps its ISL, OSL and hash ids (the burstiness of the trace is kept locally, stretched or
    compressed with the rate).

    Repetition: when ``envelope.horizon_s`` is set (periodic ``duration_s``; a CSV's last time) and the
    warped trace ends before it, the trace is repeated end to end in its own clock, copy k shifted by
    k x (span + mean gap), span = last - first arrival, until the warped copies cover the horizon; the
    result is then cut at the horizon (arrivals at or after it dropped). A periodic ``duration_s`` also
    cuts a trace that is longer than it. Copy k's hash ids are offset by k x (largest hash id + 1), so
    copies never share a prefix with each other (within a copy, shared prefixes are kept); request ids
    are renumbered 0.. in arrival order.

    Returns new requests. Raises :class:`TraceError` when a repetition is needed but the trace spans no
    time (one instant), or would give more than MAX_SYNTHETIC_REQUESTS requests.
    """
    if not requests:
        return []
    n = len(requests)
    t = np.fromiter((r.arrival_ms for r in requests), dtype=np.float64, count=n) / 1000.0
    first, last = float(t.min()), float(t.max())
    horizon = envelope.horizon_s
    copies, cut = 1, None
    if horizon is not None:
        need = float(envelope.integral(horizon))  # the trace time the horizon's warped span consumes
        if envelope.kind == "periodic":
            cut = horizon
        if last < need:
            cut = horizon
            if last <= first:
                raise TraceError(
                    envelope.source,
                    None,
                    "duration_s" if envelope.kind == "periodic" else "time_s",
                    f"{horizon:g}: the trace would be repeated to cover it, but all its arrivals fall "
                    f"at {first:g} s, expected a trace spanning some time",
                )
            period = (last - first) * n / (n - 1)  # span + mean gap: copy k+1 starts one mean gap after copy k
            copies = max(1, math.ceil((need - first) / period))
            if n * copies > MAX_SYNTHETIC_REQUESTS:
                field = "duration_s" if envelope.kind == "periodic" else "time_s"
                raise TraceError(
                    envelope.source,
                    None,
                    field,
                    f"{horizon:g}: {copies} copies of the {n}-request "
                    f"trace, about {n * copies:.3g} requests; expected at most "
                    f"{MAX_SYNTHETIC_REQUESTS:,}",
                )
    else:
        period = 0.0
    ids = [h for r in requests if r.hash_ids for h in r.hash_ids]
    id_stride = (max(ids) + 1) if ids else 0
    src_t = np.concatenate([t + k * period for k in range(copies)]) if copies > 1 else t
    warped_ms = envelope.inverse_integral(src_t) * 1000.0
    cut_ms = None if cut is None else cut * 1000.0
    kept = warped_ms if cut_ms is None else warped_ms[warped_ms < cut_ms]
    if kept.size and not float(kept.max()) <= MAX_TRACE_TIMESTAMP_MS:
        raise TraceError(
            envelope.source,
            None,
            None,
            f"the warp moves the trace's last arrival to {float(kept.max()):.4g} ms; expected at most "
            f"{MAX_TRACE_TIMESTAMP_MS:.4g} ms (about 52 days, the trace time bound): a multiplier near 0 "
            "stretches the trace past it",
        )
    out: list[TraceRequest] = []
    for k in range(copies):
        shift = k * id_stride
        for i, r in enumerate(requests):
            a = float(warped_ms[k * n + i])
            if cut_ms is not None and a >= cut_ms:
                continue
            hids = r.hash_ids if (shift == 0 or r.hash_ids is None) else tuple(h + shift for h in r.hash_ids)
            out.append(TraceRequest(len(out), a, r.input_length, r.output_length, hids))
    return out
