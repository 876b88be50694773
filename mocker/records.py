"""Plain data shared by the engine core, the fleets and the reports.

- :class:`TraceRequest` — one request of a workload (input).
- :class:`RequestRecord` — what happened to one request (output; times in ms of the driving clock).

The per-pass record the engines emit, ForwardPassMetrics, is the project's wire record: :mod:`dynoplan.fpm`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a workload.

    ``hash_ids``: one id per ``trace_block_size`` tokens of prompt (Mooncake); equal ids mean equal
    content, so shared leading ids are a shared prefix. ``None`` = unique content (no prefix sharing).
    """

    request_id: int
    arrival_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...] | None = None


_FIELDS = (
    "request_id",
    "arrival_ms",
    "input_length",
    "output_length",
    "worker_id",
    "dp_rank",
    "admit_ms",
    "first_token_ms",
    "token_times_ms",
    "finish_ms",
    "cached_tokens",
    "num_preemptions",
    "status",
    "prefill_worker_id",
)


class RequestRecord:
    """The life of one request, filled in by the engine as it runs. Times in ms of the driving clock.

    Fields (constructor arguments in this order, all but the first four with defaults): ``request_id``,
    ``arrival_ms``, ``input_length``, ``output_length``, ``worker_id`` (-1), ``dp_rank`` (0), ``admit_ms`` (first
    admission into the running batch), ``first_token_ms``, ``token_times_ms`` (emission time of every output token,
    the first one included), ``finish_ms``, ``cached_tokens`` (prompt tokens served from the prefix cache at first
    admission), ``num_preemptions``, ``status`` (pending | finished | cancelled | failed) and ``prefill_worker_id``
    (disaggregated fleets: the prefill worker; ``worker_id`` is then the decode worker). Equality compares every
    field, as a dataclass's does.

    ``token_times_ms`` is a list like any other field, but an engine core may hand it over as a *slice* of its pass
    end times, not yet copied (:meth:`set_token_slice`; ``mocker.engine.timeline``): the list is made on the first
    read, and :func:`token_slice` gives the report the slice itself, so that a replay's report reads the cores' pass
    ends once instead of one float object per token (docs/architecture.md "Where the replay's time goes").
    """

    __slots__ = (
        "request_id",
        "arrival_ms",
        "input_length",
        "output_length",
        "worker_id",
        "dp_rank",
        "admit_ms",
        "first_token_ms",
        "_token_times",
        "_token_slice",
        "finish_ms",
        "cached_tokens",
        "num_preemptions",
        "status",
        "prefill_worker_id",
    )

    def __init__(
        self,
        request_id: int,
        arrival_ms: float,
        input_length: int,
        output_length: int,
        worker_id: int = -1,
        dp_rank: int = 0,
        admit_ms: float | None = None,
        first_token_ms: float | None = None,
        token_times_ms: list[float] | None = None,
        finish_ms: float | None = None,
        cached_tokens: int = 0,
        num_preemptions: int = 0,
        status: str = "pending",
        prefill_worker_id: int | None = None,
    ) -> None:
        self.request_id = request_id
        self.arrival_ms = arrival_ms
        self.input_length = input_length
        self.output_length = output_length
        self.worker_id = worker_id
        self.dp_rank = dp_rank
        self.admit_ms = admit_ms
        self.first_token_ms = first_token_ms
        self._token_times: list[float] | None = [] if token_times_ms is None else token_times_ms
        self._token_slice: tuple[list[float], int, int] | None = None
        self.finish_ms = finish_ms
        self.cached_tokens = cached_tokens
        self.num_preemptions = num_preemptions
        self.status = status
        self.prefill_worker_id = prefill_worker_id

    @property
    def token_times_ms(self) -> list[float]:
        """Emission time (ms) of every output token, the first one included (the same list on every read)."""
        tt = self._token_times
        if tt is None:
            src = self._token_slice
            assert src is not None  # one of the two is always set
            ends, a, b = src
            tt = self._token_times = ends[a:b]
            self._token_slice = None
        return tt

    @token_times_ms.setter
    def token_times_ms(self, value: list[float]) -> None:
        self._token_times = value
        self._token_slice = None

    def set_token_slice(self, ends: list[float], a: int, b: int) -> None:
        """The token times are ``ends[a:b]`` (``0 <= a <= b <= len(ends)``), not copied until read; ``ends`` must not
        change in ``[a, b)`` afterwards (an engine core's pass end times only grow)."""
        self._token_times = None
        self._token_slice = (ends, a, b)

    @property
    def num_tokens(self) -> int:
        """``len(token_times_ms)``, without making the list."""
        tt = self._token_times
        if tt is not None:
            return len(tt)
        src = self._token_slice
        assert src is not None
        return src[2] - src[1]

    @property
    def ttft_ms(self) -> float | None:
        return None if self.first_token_ms is None else self.first_token_ms - self.arrival_ms

    @property
    def e2e_ms(self) -> float | None:
        return None if self.finish_ms is None else self.finish_ms - self.arrival_ms

    def _values(self) -> tuple[object, ...]:
        return tuple(getattr(self, f) for f in _FIELDS)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        assert isinstance(other, RequestRecord)
        return self._values() == other._values()

    __hash__ = None  # type: ignore[assignment]  # mutable, compared by value: unhashable, as a dataclass

    def __repr__(self) -> str:
        return f"RequestRecord({', '.join(f'{f}={getattr(self, f)!r}' for f in _FIELDS)})"


def token_slice(record: RequestRecord) -> tuple[list[float], int, int] | None:
    """``(ends, a, b)`` when ``record``'s token times are still the slice ``ends[a:b]`` handed over by an engine core
    (:meth:`RequestRecord.set_token_slice`), else None (read ``record.token_times_ms``)."""
    return record._token_slice
