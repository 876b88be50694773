"""ForwardPassMetrics from the workers' ZMQ PUB streams (msgpack, topic :data:`dynoplan.fpm.FPM_TOPIC`).

Wire format (docs/architecture.md "Metrics facts"; the live mocker's :mod:`mocker.live.publish` emits it): two-frame
messages ``[b"fpm", msgpack(ForwardPassMetrics)]`` with Dynamo's field names, the record of :mod:`dynoplan.fpm`.
Each message is validated by :func:`dynoplan.fpm.decode_fpm` and observed as a
:class:`planner.core.PassObservation` (a message that breaks the record's constraints is counted in ``errors``
and skipped).

:class:`FpmSubscriber` keeps one SUB socket per worker endpoint (so each message is tagged with the
worker's pool), collects passes in a background thread, and offers

- :meth:`FpmSubscriber.drain`: passes received since the previous drain (bounded buffer), stamped with
  the receive time (``timestamp_s``, the subscriber's clock) — the core's stale-engine logic then works
  on one clock;
- :meth:`FpmSubscriber.latest`: the latest pass per (worker_id, dp_rank) received within ``stale_s``
  seconds (older entries are dropped: the engine is gone or silent; live workers send an idle heartbeat
  every second);
- :meth:`FpmSubscriber.set_endpoints`: the current ``{endpoint: pool}`` (workers come and go; the
  engines of an endpoint that is removed are forgotten at once).
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable

import zmq

from dynoplan.errors import ObservationError
from dynoplan.fpm import FPM_TOPIC, decode_fpm
from planner.core import PassObservation


class FpmSubscriber:
    """See the module docstring. ``max_buffer`` bounds passes held between drains (oldest dropped)."""

    def __init__(self, stale_s: float = 10.0, max_buffer: int = 50_000, clock: Callable[[], float] = time.time) -> None:
        self.stale_s = stale_s
        self.clock = clock
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._socks: dict[str, tuple[zmq.Socket[bytes], str]] = {}
        self._wanted: dict[str, str] = {}
        self._buf: collections.deque[PassObservation] = collections.deque(maxlen=max_buffer)
        self._latest: dict[tuple[int, int], tuple[PassObservation, float]] = {}
        self._ep_engines: dict[str, set[tuple[int, int]]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.errors = 0
        self.received = 0
        self.ok = True
        self._thread = threading.Thread(target=self._run, name="fpm-subscriber", daemon=True)
        self._thread.start()

    def set_endpoints(self, endpoints: dict[str, str]) -> None:
        """Subscribe to exactly these ``{zmq endpoint: pool}`` (applied by the receive thread)."""
        with self._lock:
            self._wanted = dict(endpoints)

    def _sync(self) -> None:
        with self._lock:
            wanted = dict(self._wanted)
        for ep in [e for e in self._socks if e not in wanted or wanted[e] != self._socks[e][1]]:
            self._socks.pop(ep)[0].close(0)
            with self._lock:  # the worker left: forget its engines now rather than after stale_s
                for key in self._ep_engines.pop(ep, set()):
                    self._latest.pop(key, None)
        for ep, pool in wanted.items():
            if ep not in self._socks:
                s = self._ctx.socket(zmq.SUB)
                s.setsockopt(zmq.LINGER, 0)
                s.setsockopt(zmq.SUBSCRIBE, FPM_TOPIC)
                s.connect(ep)
                self._socks[ep] = (s, pool)

    def _run(self) -> None:
        poller = zmq.Poller()
        registered: set[str] = set()
        while not self._stop.is_set():
            try:
                self._sync()
                for ep in registered - set(self._socks):
                    registered.discard(ep)
                poller = zmq.Poller()
                for s, _ in self._socks.values():
                    poller.register(s, zmq.POLLIN)
                registered = set(self._socks)
                events = dict(poller.poll(200))
                by_sock = {s: (ep, pool) for ep, (s, pool) in self._socks.items()}
                for s in events:
                    for _ in range(1000):
                        try:
                            frames = s.recv_multipart(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        self._ingest(frames, *by_sock[s])
                self.ok = True
            except zmq.ZMQError:
                self.errors += 1
                self.ok = False
                time.sleep(0.2)

    def _ingest(self, frames: list[bytes], endpoint: str, pool: str) -> None:
        if len(frames) != 2 or frames[0] != FPM_TOPIC:
            return
        try:
            fpm = decode_fpm(frames[1])
        except ObservationError:  # a corrupt message is counted and skipped
            self.errors += 1
            return
        now = self.clock()
        p = PassObservation.of(fpm, pool=pool, timestamp_s=now)
        with self._lock:
            self.received += 1
            self._buf.append(p)
            self._latest[(p.worker_id, p.dp_rank)] = (p, now)
            self._ep_engines.setdefault(endpoint, set()).add((p.worker_id, p.dp_rank))

    def drain(self) -> tuple[PassObservation, ...]:
        """Passes received since the previous call (oldest first)."""
        with self._lock:
            out = tuple(self._buf)
            self._buf.clear()
        return out

    def latest(self) -> dict[tuple[int, int], PassObservation]:
        """Latest pass per (worker_id, dp_rank), dropping those older than ``stale_s``."""
        now = self.clock()
        with self._lock:
            for k in [k for k, (_, t) in self._latest.items() if now - t > self.stale_s]:
                del self._latest[k]
            return {k: p for k, (p, _) in self._latest.items()}

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        for s, _ in self._socks.values():
            s.close(0)
        self._socks.clear()
