"""The ForwardPassMetrics wire record (dynoplan.fpm): msgpack round trip, validation on decode, one-line errors,
and the planner's PassObservation built from it without copying its parts."""

import math

import msgspec
import pytest

from dynoplan.errors import ObservationError
from dynoplan.fpm import ForwardPassMetrics, QueuedRequests, ScheduledRequests, convert_fpm, decode_fpm
from planner.core import PassObservation


def test_msgpack_round_trip_keeps_dynamo_field_names_and_values():
    rec = ForwardPassMetrics(
        worker_id=2,
        dp_rank=1,
        wall_time=0.0125,
        scheduled_requests=ScheduledRequests(num_prefill_requests=1, sum_prefill_tokens=512, sum_prefill_kv_tokens=64),
        queued_requests=QueuedRequests(num_decode_requests=3, sum_decode_kv_tokens=4100, var_decode_kv_tokens=2.5),
        timestamp_ms=987.5,
    )
    payload = msgspec.msgpack.encode(rec)
    plain = msgspec.msgpack.decode(payload)
    assert list(plain) == [
        "worker_id",
        "dp_rank",
        "wall_time",
        "scheduled_requests",
        "queued_requests",
        "timestamp_ms",
    ]
    assert plain["scheduled_requests"]["sum_prefill_tokens"] == 512
    assert plain["queued_requests"]["var_decode_kv_tokens"] == 2.5
    assert decode_fpm(payload) == rec


def test_decode_refuses_a_record_that_breaks_its_constraints_in_one_line():
    def enc(**kw):
        return msgspec.msgpack.encode({"worker_id": 0, "dp_rank": 0, "wall_time": 0.01, **kw})

    cases = [
        (enc(wall_time=math.nan), "ForwardPassMetrics.wall_time=nan: expected a number >= 0.0"),
        (enc(dp_rank=-1), "ForwardPassMetrics.dp_rank=-1: expected an integer >= 0"),
        (
            enc(scheduled_requests={"var_prefill_length": -0.5}),
            "ForwardPassMetrics.scheduled_requests.var_prefill_length=-0.5: expected a number >= 0.0",
        ),
        (enc(wall_time="0.01"), "ForwardPassMetrics.wall_time='0.01': expected a number"),
        (msgspec.msgpack.encode([1, 2]), "ForwardPassMetrics=[1, 2]: expected a mapping"),
    ]
    for payload, line in cases:
        with pytest.raises(ObservationError) as e:
            decode_fpm(payload)
        assert str(e.value) == line
    with pytest.raises(
        ObservationError, match=r"^ForwardPassMetrics: MessagePack data is malformed.*expected a msgpack"
    ):
        decode_fpm(b"\xc1")


def test_unknown_fields_of_a_newer_producer_are_ignored():
    payload = msgspec.msgpack.encode({"worker_id": 4, "dp_rank": 0, "wall_time": 0.0, "kv_usage": 0.5})
    assert decode_fpm(payload) == ForwardPassMetrics(4, 0, 0.0)
    assert convert_fpm({"worker_id": 4, "dp_rank": 0, "wall_time": 0, "extra": {}}).wall_time == 0.0


def test_pass_observation_shares_the_records_parts_and_reads_the_same_attributes():
    rec = ForwardPassMetrics(7, 0, 0.02, ScheduledRequests(num_decode_requests=8), QueuedRequests(), 4250.0)
    obs = PassObservation.of(rec, pool="decode")
    assert obs.scheduled_requests is rec.scheduled_requests and obs.queued_requests is rec.queued_requests
    assert (obs.worker_id, obs.dp_rank, obs.wall_time, obs.timestamp_ms) == (7, 0, 0.02, 4250.0)
    assert (obs.pool, obs.timestamp_s) == ("decode", 4.25)  # stamped at the pass end, in seconds
    assert PassObservation.of(rec, pool="decode", timestamp_s=10.0).timestamp_s == 10.0
    assert isinstance(obs, ForwardPassMetrics)
    assert msgspec.structs.replace(obs, pool="agg").pool == "agg"
