"""Pass end-time store shared by the engine cores (:mod:`mocker.engine.vllm`, :mod:`mocker.engine.sglang`),
and the Python-float copy of the polynomial's decode-duration table their decode stretches read.

A core records the end time (ms) of every pass it runs in one Python list (``_ends``, pass order): a single
pass appends one float, a fast-forwarded stretch extends it with its ends. Request records keep (pass
index, count) emission ranges; :meth:`PassTimeline._fill_token_times` hands each record its token times at the
end: a request that emitted in one run of consecutive passes (nearly all) gets the slice of that list
(:meth:`RequestRecord.set_token_slice <mocker.records.RequestRecord.set_token_slice>`, copied only when read;
the report reads the list once per core instead), one preempted and re-admitted gets the concatenated slices.
So the per-pass cost is one list append and the per-token cost nothing until a token time is read.
"""

from __future__ import annotations

from typing import Final, Generic, TypeVar

import numpy as np
import numpy.typing as npt

from dynoplan.fpm import ForwardPassMetrics
from mocker.request import TERMINAL, EngineRequest
from mocker.timing import PolynomialTiming

RequestT = TypeVar("RequestT", bound=EngineRequest)
"""The core's request type (:class:`~mocker.request.EngineRequest` or a subclass carrying engine state)."""

_TABLE_GROWTH: Final = 4096
"""Entries :class:`DecodeTable` adds at least when it grows (amortises its calls into the timing model)."""


class PassTimeline(Generic[RequestT]):
    """Mixin: the pass end-time store and the live driver's :meth:`release_finished`.

    The core provides ``all_requests`` (requests with ``state`` and ``all_emit_ranges()``), ``pass_index``
    (passes run so far) and ``fpm`` (collected ForwardPassMetrics), and calls :meth:`_init_pass_timeline`
    in its constructor.
    """

    all_requests: list[RequestT]
    pass_index: int
    fpm: list[ForwardPassMetrics]

    def _init_pass_timeline(self) -> None:
        self._ends: list[float] = []
        """End time (ms) of every pass run so far, from pass ``_ends_base`` on."""
        self._ends_base = 0
        """Pass index of the first kept end time (> 0 only after :meth:`release_finished`)."""

    def pass_end_times(self) -> npt.NDArray[np.float64]:
        """End time (ms) of every pass run so far, indexed by pass number minus ``_ends_base`` (0 unless
        :meth:`release_finished` dropped the ends no live request needs)."""
        return np.array(self._ends, dtype=np.float64)

    def _fill_token_times(self) -> None:
        """Fill ``token_times_ms`` of every record from its emission ranges (finalize, once at the end)."""
        ends = self._ends
        base = self._ends_base
        for r in self.all_requests:
            if not r.emit_ranges:  # the usual case: one run of consecutive passes (emit_start .. emit_last)
                if r.emit_start >= 0:  # handed over as a slice, copied only if read (RequestRecord)
                    r.record.set_token_slice(ends, r.emit_start - base, r.emit_last - base + 1)
                continue
            tt: list[float] = []
            for a, b in r.all_emit_ranges():
                tt += ends[a - base : b - base + 1]
            r.record.token_times_ms = tt

    def release_finished(self) -> list[ForwardPassMetrics]:
        """Forget terminal requests and pass end times no live request needs; return and clear the FPMs.

        For a long-running wall-clock driver (:mod:`mocker.live.driver`) that keeps each request's record and
        token times itself: afterwards ``all_requests`` holds only live requests, the kept pass end times
        start at the earliest pass a live request emitted in (so ``finalize`` stays right for them),
        and ``fpm`` is empty. Returns the ForwardPassMetrics collected since the previous call (oldest
        first). The offline replay never calls it (its records are unchanged). Raises nothing.
        """
        self.all_requests = [r for r in self.all_requests if r.state not in TERMINAL]
        keep = self.pass_index
        for r in self.all_requests:
            ranges = r.all_emit_ranges()
            if ranges:
                keep = min(keep, ranges[0][0])
        if keep > self._ends_base and self._ends:
            self._ends = self._ends[keep - self._ends_base :]
            self._ends_base = keep
        out, self.fpm = self.fpm, []
        return out


class DecodeTable:
    """The decode pass durations of a :class:`~mocker.timing.PolynomialTiming` (ms, ns-rounded, no speed-up)
    as a Python list indexed by active KV tokens: ``values[s] == timing.decode_table(s)[s]`` (the same
    floats), read one by one by the cores' decode-stretch loops without a numpy call per stretch."""

    __slots__ = ("timing", "values")

    def __init__(self, timing: PolynomialTiming) -> None:
        self.timing = timing
        self.values: list[float] = []

    def upto(self, s_max: int) -> list[float]:
        """The values, at least for ``s`` = 0 .. ``s_max`` (grown from the timing's table when short)."""
        values = self.values
        n = len(values)
        if s_max >= n:
            hi = s_max + 1 if s_max + 1 > n + _TABLE_GROWTH else n + _TABLE_GROWTH
            values.extend(self.timing.decode_table(hi - 1)[n:hi].tolist())
        return values


_SHARED_TABLES: dict[float, DecodeTable] = {}
"""One :class:`DecodeTable` per KV capacity (its values depend on nothing else), shared by every core."""


def shared_decode_table(timing: PolynomialTiming) -> DecodeTable:
    """The :class:`DecodeTable` of ``timing``'s KV capacity (made on first use; the cores of a fleet share it)."""
    table = _SHARED_TABLES.get(timing.total_kv_tokens)
    if table is None:
        table = _SHARED_TABLES[timing.total_kv_tokens] = DecodeTable(timing)
    return table


def decode_stretch_ends(
    values: list[float], now: float, s0: int, n: int, k: int, horizon: float, s_cap: int
) -> list[float]:
    """End times (ms) of up to ``k`` decode passes from ``now``: pass ``j`` has ``s0 + n * j`` active KV
    tokens (capped at ``s_cap``) and lasts ``values[tokens]``; each end is the previous end plus that
    duration (the order of the pass-by-pass sums). Stops after the first pass ending at or after
    ``horizon``. ``values`` must cover ``min(s0 + n * (k - 1), s_cap)``."""
    ends: list[float] = []
    t = now
    s = s0
    for _ in range(k):
        t = t + values[s if s < s_cap else s_cap]
        ends.append(t)
        if t >= horizon:
            break
        s += n
    return ends
