"""Warm-start traces: read a request trace and bucket it into throughput-loop intervals.

Formats (chosen by extension; ``fmt`` overrides):

- Azure LLM inference CSV (``.csv``): header ``TIMESTAMP,ContextTokens,GeneratedTokens``; TIMESTAMP is
  ``YYYY-MM-DD HH:MM:SS[.fffffff]`` (fractional digits beyond microseconds are dropped).
- Mooncake JSONL (``.jsonl``): one object per line with ``timestamp`` (ms), ``input_length``,
  ``output_length`` (other keys ignored).

Requests are bucketed by arrival into ``interval_s`` windows starting at the first arrival; each window
becomes a :class:`~planner.core.observations.TrafficWindow` with the request count and mean ISL/OSL (NaN
for empty windows). Reading is I/O done once at start-up by the driver, never inside a tick.
Raises TraceError naming the file, the 1-based line and the field.
"""

from __future__ import annotations

import csv
import json
import math
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import numpy.typing as npt

from planner.core.observations import TrafficWindow
from planner.errors import TraceError

FloatArray = npt.NDArray[np.float64]


def _parse_azure_ts(s: str) -> float:
    s = s.strip()
    if "." in s:
        head, frac = s.split(".", 1)
        s = head + "." + frac[:6]
        return datetime.strptime(s, "%Y-%m-%d %H:%M:%S.%f").replace(tzinfo=UTC).timestamp()
    return datetime.strptime(s, "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC).timestamp()


def read_trace_requests(path: str | Path, fmt: str | None = None) -> tuple[FloatArray, FloatArray, FloatArray]:
    """(arrival_s relative to the first arrival, isl_tokens, osl_tokens) arrays of a trace, sorted by arrival."""
    p = Path(path)
    suffix = p.suffix.lower()
    fmt = fmt or ("azure" if suffix == ".csv" else "mooncake" if suffix in (".jsonl", ".json") else None)
    if fmt not in ("azure", "mooncake"):
        raise TraceError(str(p), None, None, "unknown trace format: expected a .csv (Azure) or .jsonl (Mooncake) file")
    t: list[float] = []
    isl: list[float] = []
    osl: list[float] = []
    try:
        with p.open(newline="") as f:
            if fmt == "azure":
                rows = csv.DictReader(f)
                need = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
                missing = [c for c in need if c not in (rows.fieldnames or [])]
                if missing:
                    raise TraceError(str(p), 1, missing[0], f"missing column (header has {rows.fieldnames})")
                for i, row in enumerate(rows, start=2):
                    for col, conv, dst in (("TIMESTAMP", _parse_azure_ts, t), ("ContextTokens", float, isl),
                                           ("GeneratedTokens", float, osl)):
                        try:
                            dst.append(conv(row[col]))
                        except (TypeError, ValueError):
                            raise TraceError(str(p), i, col, f"cannot parse {row[col]!r}") from None
            else:
                for i, line in enumerate(f, start=1):
                    if not line.strip():
                        continue
                    try:
                        obj = json.loads(line)
                    except json.JSONDecodeError as e:
                        raise TraceError(str(p), i, None, f"invalid JSON: {e.msg}") from None
                    for col, dst, scale in (("timestamp", t, 1e-3), ("input_length", isl, 1.0),
                                            ("output_length", osl, 1.0)):
                        v = obj.get(col) if isinstance(obj, dict) else None
                        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < 0:
                            raise TraceError(str(p), i, col, f"expected a number >= 0, got {v!r}")
                        dst.append(float(v) * scale)
    except OSError as e:
        raise TraceError(str(p), None, None, f"cannot read: {e.strerror}") from None
    if not t:
        raise TraceError(str(p), None, None, "no requests")
    ta, ia, oa = np.asarray(t), np.asarray(isl), np.asarray(osl)
    order = np.argsort(ta, kind="stable")
    ta = ta[order] - ta[order][0]
    return ta, ia[order], oa[order]


def bucket_intervals(arrival_s: FloatArray, isl_tokens: FloatArray, osl_tokens: FloatArray,
                     interval_s: float) -> list[TrafficWindow]:
    """Per-interval request count and mean ISL/OSL (windows [k I, (k+1) I) from time 0)."""
    if len(arrival_s) == 0:
        return []
    idx = np.floor(np.asarray(arrival_s) / interval_s).astype(int)
    n = int(idx.max()) + 1
    cnt = np.bincount(idx, minlength=n).astype(float)
    si = np.bincount(idx, weights=isl_tokens, minlength=n)
    so = np.bincount(idx, weights=osl_tokens, minlength=n)
    out = []
    for k in range(n):
        c = cnt[k]
        out.append(TrafficWindow(interval_s, c, si[k] / c if c else math.nan, so[k] / c if c else math.nan))
    return out


def read_trace_intervals(path: str | Path, interval_s: float, fmt: str | None = None) -> list[TrafficWindow]:
    """Read a trace and bucket it into ``interval_s`` windows (for ``Planner(warm_start=...)``)."""
    return bucket_intervals(*read_trace_requests(path, fmt), interval_s)
