"""Warm-start traces: a request trace's arrivals bucketed into throughput-loop intervals.

The trace itself is read by the drivers with the one trace reader (:func:`mocker.traces.load_trace`, via
:func:`planner.arguments.warm_start_windows`; the core imports nothing from mocker) and handed here as
arrays: requests are bucketed by arrival into ``interval_s`` windows starting at time 0; each window
becomes a :class:`~planner.core.observations.TrafficWindow` with the request count and mean ISL/OSL (NaN
for empty windows). Done once at start-up by the driver, never inside a tick.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from planner.core.observations import TrafficWindow

FloatArray = npt.NDArray[np.float64]


def bucket_intervals(
    arrival_s: FloatArray, isl_tokens: FloatArray, osl_tokens: FloatArray, interval_s: float
) -> list[TrafficWindow]:
    """Per-interval request count and mean ISL/OSL (windows [k I, (k+1) I) from time 0).

    ``arrival_s`` (seconds since the trace start, >= 0), ``isl_tokens``, ``osl_tokens``: arrays of one length
    N; ``interval_s`` > 0. Returns ``floor(max(arrival_s) / interval_s) + 1`` windows (none for N = 0)."""
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
