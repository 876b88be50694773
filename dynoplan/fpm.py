"""ForwardPassMetrics (FPM), the one definition of the wire record an engine emits per pass and DP rank.

Field names and meaning are Dynamo's (docs/architecture.md "Metrics facts"), so the same consumers read a
real deployment: :class:`ForwardPassMetrics` holds ``worker_id``, ``dp_rank``, ``wall_time`` (seconds; 0.0 =
idle heartbeat), :class:`ScheduledRequests` (the requests in the pass) and :class:`QueuedRequests` (those
waiting after it), plus ``timestamp_ms``, the end of the pass on the producer's clock. Token counts are
tokens, ``var_*`` fields are population variances in tokens squared.

The engine cores (``mocker.engine``) build these records, the live worker publishes them as two-frame ZMQ
messages ``[FPM_TOPIC, msgpack(ForwardPassMetrics)]`` (``mocker/live/publish.py``), and the planner reads
them (``planner/sources/fpm.py``, in simulation ``planner/sim/loop.py``) into its own
``planner.core.observations.PassObservation``, the record plus the pool and the receive time.

Constraints (``msgspec.Meta``) are checked where a record enters from outside, by :func:`decode_fpm` and
:func:`convert_fpm`, never on construction (the engine's hot path): counts, token sums, variances and
``wall_time`` are >= 0 (NaN is refused), ``dp_rank`` >= 0. Unknown fields are ignored (a newer producer may
send more). Both raise :class:`dynoplan.errors.ObservationError` with one line naming the field, the value
and what was expected, e.g. ``ForwardPassMetrics.wall_time=-1: expected a number >= 0``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any

import msgspec

from dynoplan.errors import ObservationError

FPM_TOPIC = b"fpm"
"""The ZMQ topic (first frame) of a ForwardPassMetrics message."""

Count = Annotated[int, msgspec.Meta(ge=0)]
"""A number of requests or tokens (>= 0)."""
Variance = Annotated[float, msgspec.Meta(ge=0)]
"""A population variance of lengths in tokens, tokens squared (>= 0)."""


class ScheduledRequests(msgspec.Struct, frozen=True):
    """The requests in one pass (Dynamo's ``scheduled_requests``); every field defaults to 0."""

    num_prefill_requests: Count = 0
    """Requests computing prompt tokens in this pass."""
    sum_prefill_tokens: Count = 0
    """Prompt tokens newly computed in this pass (cached and earlier-chunk tokens excluded)."""
    var_prefill_length: Variance = 0.0
    """Population variance of those requests' prompt lengths (tokens squared)."""
    sum_prefill_kv_tokens: Count = 0
    """Prompt tokens of those requests already in the KV cache before this pass (cached prefix and earlier
    chunks): the context the newly computed tokens attend to."""
    num_decode_requests: Count = 0
    """Requests generating one output token in this pass."""
    sum_decode_kv_tokens: Count = 0
    """KV tokens (prompt + generated so far) of the decoding requests."""
    var_decode_kv_tokens: Variance = 0.0
    """Population variance of the decoding requests' KV lengths (tokens squared)."""


class QueuedRequests(msgspec.Struct, frozen=True):
    """The requests waiting after one pass (Dynamo's ``queued_requests``); every field defaults to 0."""

    num_prefill_requests: Count = 0
    """Requests waiting for their prompt to be computed."""
    sum_prefill_tokens: Count = 0
    """Prompt tokens those waiting requests still have to compute."""
    var_prefill_length: Variance = 0.0
    """Population variance of the waiting prompts' lengths (tokens squared)."""
    num_decode_requests: Count = 0
    """Requests waiting to resume decoding (preempted)."""
    sum_decode_kv_tokens: Count = 0
    """KV tokens those requests need back."""
    var_decode_kv_tokens: Variance = 0.0
    """Population variance of their KV lengths (tokens squared)."""


class ForwardPassMetrics(msgspec.Struct, frozen=True):
    """One engine pass on one DP rank, as it goes over the wire (Dynamo's ForwardPassMetrics field names)."""

    worker_id: int
    """The engine's worker id (the producer's own numbering)."""
    dp_rank: Annotated[int, msgspec.Meta(ge=0)]
    """Data-parallel rank of the engine within its worker."""
    wall_time: Annotated[float, msgspec.Meta(ge=0)]
    """Pass duration in seconds; 0.0 = idle heartbeat (no pass ran; consumers skip it in regressions)."""
    scheduled_requests: ScheduledRequests = msgspec.field(default_factory=ScheduledRequests)
    queued_requests: QueuedRequests = msgspec.field(default_factory=QueuedRequests)
    timestamp_ms: float = 0.0
    """End of the pass on the producer's clock, ms (virtual time in a simulation; 0.0 = not stamped)."""


_DECODER = msgspec.msgpack.Decoder(ForwardPassMetrics)
_PATH = re.compile(r" - at `\$((?:\.\w+)*)`$")
_MISSING = re.compile(r"^Object missing required field `(\w+)`")
_TYPES = {"float": "a number", "int": "an integer", "object": "a mapping", "str": "text", "bool": "a boolean"}


def _value_at(obj: Any, path: list[str]) -> Any:
    for name in path:
        obj = obj.get(name) if isinstance(obj, Mapping) else getattr(obj, name, None)
    return obj


def _problem(err: msgspec.ValidationError, obj: Any) -> str:
    """msgspec's message ``Expected `float` >= 0.0 - at `$.wall_time``` as the project's one line
    ``ForwardPassMetrics.wall_time=-1: expected a number >= 0.0`` (the value read back from ``obj``)."""
    msg = str(err)
    m = _PATH.search(msg)
    path = [p for p in m.group(1).split(".") if p] if m else []
    what = msg[: m.start()] if m else msg
    missing = _MISSING.match(what)
    if missing:
        return "ForwardPassMetrics." + ".".join([*path, missing.group(1)]) + ": required"
    expected = re.sub(r"`(\w+)`", lambda t: _TYPES.get(t.group(1), t.group(1)), what.split(", got ")[0])
    expected = expected[:1].lower() + expected[1:]
    field = ".".join(["ForwardPassMetrics", *path])
    return f"{field}={_value_at(obj, path)!r}: {expected}"


def convert_fpm(obj: Any) -> ForwardPassMetrics:
    """``obj`` (a mapping as msgpack or JSON decode it, or any object with the Dynamo field names as
    attributes) validated into a :class:`ForwardPassMetrics`. Missing parts and part fields default to
    0; ``worker_id``, ``dp_rank`` and ``wall_time`` are required. Raises :class:`ObservationError` naming the
    first field that breaks the module docstring's constraints, its value and what was expected."""
    try:
        return msgspec.convert(obj, ForwardPassMetrics, from_attributes=True)
    except msgspec.ValidationError as e:
        raise ObservationError(_problem(e, obj)) from None


def decode_fpm(payload: bytes) -> ForwardPassMetrics:
    """The msgpack ``payload`` of an FPM message, validated into a :class:`ForwardPassMetrics`. Raises
    :class:`ObservationError` naming the field (as :func:`convert_fpm`) or saying the bytes are not msgpack."""
    try:
        return _DECODER.decode(payload)
    except msgspec.ValidationError as e:
        try:  # the value to name in the message (the bytes may be malformed after the bad field)
            obj = msgspec.msgpack.decode(payload)
        except msgspec.DecodeError:
            obj = None
        raise ObservationError(_problem(e, obj)) from None
    except msgspec.DecodeError as e:
        raise ObservationError(f"ForwardPassMetrics: {e}: expected a msgpack map") from None
