"""Pass end-time store shared by the engine cores (:mod:`mocker.engine.vllm`, :mod:`mocker.engine.sglang`).

A core records the end time (ms, float64) of every pass it runs: single passes append to a Python list
(``_ends_py``), fast-forwarded stretches append whole numpy chunks after flushing that list, so the timeline
stays in pass order. Request records keep (pass index, count) emission ranges and read their token times
from :meth:`PassTimeline.pass_end_times` at the end, which keeps the per-pass cost to one list append.
"""

from __future__ import annotations

from typing import Generic, TypeVar

import numpy as np
import numpy.typing as npt

from dynoplan.fpm import ForwardPassMetrics
from mocker.request import TERMINAL, EngineRequest

RequestT = TypeVar("RequestT", bound=EngineRequest)
"""The core's request type (:class:`~mocker.request.EngineRequest` or a subclass carrying engine state)."""


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
        self._ends_py: list[float] = []
        self._ends_chunks: list[npt.NDArray[np.float64]] = []
        self._ends_base = 0
        """Pass index of the first kept end time (> 0 only after :meth:`release_finished`)."""

    def _flush_ends(self) -> None:
        """Move the single-pass end times into a numpy chunk (before a chunk is appended or the ends read)."""
        if self._ends_py:
            self._ends_chunks.append(np.array(self._ends_py, dtype=np.float64))
            self._ends_py = []

    def pass_end_times(self) -> npt.NDArray[np.float64]:
        """End time (ms) of every pass run so far, indexed by pass number minus ``_ends_base`` (0 unless
        :meth:`release_finished` dropped the ends no live request needs)."""
        self._flush_ends()
        if not self._ends_chunks:
            return np.zeros(0)
        if len(self._ends_chunks) > 1:
            self._ends_chunks = [np.concatenate(self._ends_chunks)]
        return self._ends_chunks[0]

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
        self._flush_ends()
        if keep > self._ends_base and self._ends_chunks:
            ends = np.concatenate(self._ends_chunks) if len(self._ends_chunks) > 1 else self._ends_chunks[0]
            self._ends_chunks = [ends[keep - self._ends_base :].copy()]
            self._ends_base = keep
        out, self.fpm = self.fpm, []
        return out
