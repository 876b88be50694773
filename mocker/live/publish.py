"""ZMQ PUB publishers of the live worker: ForwardPassMetrics and KV-cache events (msgpack via msgspec).

Wire format (both sockets): two-frame messages ``[topic, msgpack(payload)]``.

- topic :data:`dynoplan.fpm.FPM_TOPIC` (``b"fpm"``): a :class:`dynoplan.fpm.ForwardPassMetrics` per engine pass
  and DP rank; when a rank has run no pass for ``heartbeat_s`` seconds an idle heartbeat (``wall_time ==
  0.0``, zero counts) is sent, so subscribers can tell "idle" from "gone" (Dynamo's FPM convention).
- topic ``b"kv"``: a :class:`KvEventBatch` (``stored`` / ``removed`` prompt block ids, DP rank, a per-worker
  increasing ``event_id`` so a subscriber can detect a gap and resynchronise from ``GET /kv_state``).

Subscribers decode with :func:`dynoplan.fpm.decode_fpm` / :func:`decode_kv_event`.
"""

from __future__ import annotations

from typing import Literal

import msgspec
import zmq

from dynoplan.fpm import ForwardPassMetrics

KV_TOPIC = b"kv"


WIRE_ID_MASK = (1 << 64) - 1


def wire_block_id(key: int) -> int:
    """A block key as sent in :class:`KvEventBatch` (unsigned 64-bit, msgpack's integer range): ``key mod 2**64``.

    Engine block keys (:func:`mocker.kv.manager.engine_block_keys`) are Python ints that can exceed 64 bits
    (chained hash x engine blocks per trace block); producers and routers both apply this map."""
    return key & WIRE_ID_MASK


class KvEventBatch(msgspec.Struct, frozen=True):
    """The wire message of topic ``kv``: a run of blocks of prompt content one DP rank's cache gained
    (``stored``) or lost (``removed``), one ``event_id`` for the run. (In-process, one block's change is a
    :class:`mocker.kv.events.KvEvent`, what the virtual-time fleet feeds its router.)

    ``block_ids``: the engine block keys the core cached or evicted (:func:`mocker.kv.manager.engine_block_keys`,
    as :func:`wire_block_id`; the worker's ``/info`` says ``kv_block_ids: engine``). A producer that can only
    name request-level prompt block ids (``hash_ids``) says ``kv_block_ids: trace``.
    """

    worker_id: int
    dp_rank: int
    event_id: int
    kind: Literal["stored", "removed", "cleared"]
    block_ids: list[int]


_ENC = msgspec.msgpack.Encoder()
_KV_DEC = msgspec.msgpack.Decoder(KvEventBatch)


def decode_kv_event(payload: bytes) -> KvEventBatch:
    return _KV_DEC.decode(payload)


def idle_fpm(worker_id: int, dp_rank: int, timestamp_ms: float) -> ForwardPassMetrics:
    """An idle heartbeat: wall_time 0.0 and nothing scheduled or queued (the parts' zero defaults)."""
    return ForwardPassMetrics(worker_id=worker_id, dp_rank=dp_rank, wall_time=0.0, timestamp_ms=timestamp_ms)


class Publisher:
    """A bound ZMQ PUB socket. ``endpoint`` like ``tcp://127.0.0.1:5557`` (port 0 = pick a free one)."""

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], endpoint: str) -> None:
        self.sock = ctx.socket(zmq.PUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SNDHWM, 100_000)
        if endpoint.endswith(":0"):
            port = self.sock.bind_to_random_port(endpoint.rsplit(":", 1)[0])
            self.endpoint = endpoint.rsplit(":", 1)[0] + f":{port}"
        else:
            self.sock.bind(endpoint)
            self.endpoint = endpoint
        self.sent = 0
        self.dropped = 0

    def publish(self, topic: bytes, obj: msgspec.Struct) -> None:
        try:
            self.sock.send_multipart([topic, _ENC.encode(obj)], flags=zmq.NOBLOCK)
            self.sent += 1
        except zmq.Again:  # no subscriber keeps up: PUB drops, the engine never blocks
            self.dropped += 1

    def close(self) -> None:
        self.sock.close(0)
