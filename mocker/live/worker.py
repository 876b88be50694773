"""The live mocker worker: an OpenAI-compatible HTTP server over simulated engine cores (wall clock).

Endpoints
---------
``POST /v1/completions``, ``POST /v1/chat/completions`` (SSE when ``stream``), ``GET /v1/models``,
``GET /health`` (process up), ``GET /ready`` (engine loops running; 503 before), ``GET /metrics``
(Prometheus text, :class:`mocker.live.metrics.WorkerMetrics`), ``GET /fpm`` (latest ForwardPassMetrics
per DP rank, JSON), ``GET /info`` (worker id, role, engine, block sizes, ZMQ endpoints),
``GET /kv_state`` (engine block keys cached per rank and the last KV event id, for router resynchronisation),
``GET /records`` (finished requests on the engine timeline, ms since the worker started).

Each DP rank has its own core and :class:`mocker.live.driver.RankDriver`; a request goes to the rank its
extension field ``dp_rank`` names (a KV-aware router's choice; out of range = 400), else to the rank with the
fewest outstanding requests (lowest index on ties). Speedup: see :mod:`mocker.live.driver`.

KV events (ZMQ PUB, :mod:`mocker.live.publish`) are the cores' real cache changes, drained after every pass:
a native vLLM/TRT-LLM pool with prefix caching and a KVBM G1 pool record their stores and evictions
(:class:`mocker.kv.events.EventingKvManager`, :class:`mocker.kv.kvbm.EventingKvbmBlockManager`); the
SGLang radix cache reports token ranges entering and leaving its tree, mapped to whole pages
(:class:`mocker.kv.events.RadixEventAdapter`). Blocks are named by engine block keys
(:func:`mocker.kv.manager.engine_block_keys` of the prompt, sent as :func:`mocker.live.publish.wire_block_id`).

Disaggregated roles (``EngineConfig.worker_type``): a ``prefill`` worker computes the prompt and the first
token only (output length forced to 1); a ``decode`` worker receives requests whose prompt KV was
transferred (extension field ``prefill_done: true``): it waits the modelled KV transfer time
(``prompt tokens * kv_bytes_per_token / kv_transfer_bandwidth``; docs/architecture.md "KV transfer", 0 = off; not
divided by the speedup ratio, as the offline fleet and the reference) and
then admits it with the core's ``add_prefilled_request`` (prompt KV present, no prefill pass, as the
offline fleet's decode side, :mod:`mocker.fleet`): it emits ``max_tokens`` tokens, the first at the end of
its admission pass (a decode pass).

Coordinated bootstrap (prefill role with ``bootstrap_port``): the frontend sends the request to the
prefill worker (``bootstrap_room: R``) and to the decode worker (``prefill_done: true``,
``bootstrap_host``, ``bootstrap_port``, ``bootstrap_room: R``) at the same time. The decode worker opens a
TCP connection to the prefill worker's bootstrap port and sends one JSON line ``{"room": R}``; the prefill
worker answers one JSON line ``{"room": R, "status": "ready"|"failed", "input_length": n}`` once the
prompt of room R has its first token (at once if that already happened). The decode worker then applies
the transfer delay and admits the request. Rooms are kept for ``BOOTSTRAP_ROOM_TTL_S`` seconds.

Usage: a response's ``usage`` (the unary body; the streamed usage chunk when ``stream_options.include_usage``)
reports ``prompt_tokens_details.cached_tokens`` (the OpenAI field, as vLLM fills it): the request record's
``cached_tokens``, the prompt tokens served from the prefix cache at its first admission (0 for an engine
without prefix caching; on a decode worker, whatever its core counted when it admitted the transferred prompt).

Client disconnect cancels the request in the core, which frees its KV blocks (aiohttp handler
cancellation is enabled for this server).
"""

from __future__ import annotations

import asyncio
import collections
import json
from collections.abc import Callable
from typing import Any, NamedTuple

import msgspec
import zmq
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import Field

from dynoplan.errors import DynoplanError, RequestError
from dynoplan.fpm import FPM_TOPIC
from dynoplan.settings import settings
from mocker.config import EngineConfig
from mocker.engine.base import EngineCore, PassOutcome
from mocker.kv.events import CacheChange, EventingKvManager, RadixEventAdapter, TupleSink
from mocker.kv.kvbm import EventingKvbmBlockManager, KvbmBlockManager
from mocker.kv.manager import BlockKvManager
from mocker.kv.radix import RadixCache
from mocker.live.driver import RankDriver, StreamState, WallClock, outcome_emissions
from mocker.live.metrics import WorkerMetrics
from mocker.live.protocol import (
    Kind,
    ParsedRequest,
    chunk_body,
    full_body,
    now_s,
    parse_request,
    request_received_monotonic,
    response_id,
    serve_app,
    usage,
    usage_chunk,
)
from mocker.live.publish import KV_TOPIC, KvEventBatch, Publisher, idle_fpm, wire_block_id
from mocker.live.tokenizer import output_piece
from mocker.records import RequestRecord, TraceRequest
from mocker.transfer import KvTransferConfig

BOOTSTRAP_ROOM_TTL_S = 60.0
"""How long a prefill worker remembers a finished bootstrap room (s)."""

CoreFactory = Callable[[EngineConfig, int, int], EngineCore]
"""(config, worker_id, dp_rank) -> a fresh engine core."""


@settings
class WorkerSettings:
    """Settings of one live worker process (``mocker serve`` flags). Bad values: pydantic's ``ValidationError``
    when constructed directly; the CLI builds them through :func:`dynoplan.settings.check` (ConfigError)."""

    engine: EngineConfig = Field(default_factory=EngineConfig, description="The simulated engine (one per DP rank).")
    host: str = Field(default="127.0.0.1", description="Bind address.")
    port: int = Field(default=8000, ge=0, le=65535, description="HTTP port (0 = any free port).")
    model_name: str = Field(
        default="mocker", description="Served model name (/v1/models; requests for another model get 404)."
    )
    worker_id: int = Field(default=0, description="Worker id reported in ForwardPassMetrics and KV events.")
    max_model_len: int | None = Field(
        default=None,
        ge=2,
        description="Max prompt + output tokens; None = the KV capacity of one rank (a longer request "
        "could never run).",
    )
    fpm_endpoint: str | None = Field(
        default="tcp://127.0.0.1:0",
        description="ZMQ PUB endpoint of ForwardPassMetrics (None = off; port 0 = any free port).",
    )
    kv_events_endpoint: str | None = Field(
        default="tcp://127.0.0.1:0", description="ZMQ PUB endpoint of KV events (None = off)."
    )
    heartbeat_s: float = Field(default=1.0, gt=0, description="Idle FPM heartbeat period (s).")
    kv_bytes_per_token: int = Field(
        default=0, ge=0, description="Decode role: KV bytes per prompt token for the transfer delay (0 = no delay)."
    )
    kv_transfer_bandwidth_gbps: float = Field(
        default=0.0, ge=0, description="Decode role: transfer bandwidth in GB/s (1e9 bytes/s; 0 = no delay)."
    )
    keep_records: int = Field(default=200_000, ge=0, description="Finished records kept for GET /records.")
    bootstrap_port: int | None = Field(
        default=None,
        ge=0,
        le=65535,
        description="Prefill role: TCP port of the bootstrap handoff server (0 = any free port; None = off).",
    )


def default_core_factory(cfg: EngineConfig, worker_id: int, dp_rank: int) -> EngineCore:
    from mocker.engine import make_engine  # lazy: the engine core (developer A's package)

    return make_engine(cfg, worker_id=worker_id, dp_rank=dp_rank, collect_fpm=True)


class _Handoff(NamedTuple):
    """The disaggregation fields of one request (validated by ``Worker._handoff_fields``).

    ``prefill_done``: the prompt was prefilled elsewhere (decode side); ``room``: the bootstrap room id or
    None; ``dp_rank``: the DP rank asked for, None = least outstanding; ``bootstrap``: ``(host, port)`` of
    the prefill worker's bootstrap server and the room, given exactly when ``room`` is set and ``prefill_done``.
    """

    prefill_done: bool
    room: int | None
    dp_rank: int | None
    bootstrap: tuple[str, int, int] | None


class Worker:
    """One worker process's state: drivers, metrics, publishers, HTTP app."""

    def __init__(self, settings: WorkerSettings, core_factory: CoreFactory | None = None) -> None:
        self.s = settings
        self.cfg = settings.engine
        self.core_factory = core_factory or default_core_factory
        self.metrics = WorkerMetrics(self.cfg.engine, settings.model_name, self.cfg.dp_size)
        self.clock = WallClock()
        self.drivers: list[RankDriver] = []
        self.ready = False
        self._next_rid = 0
        self.max_model_len = settings.max_model_len or self.cfg.total_kv_tokens
        self.records: collections.deque[RequestRecord] = collections.deque(maxlen=settings.keep_records)
        self._zmq: zmq.Context[zmq.Socket[bytes]] | None = None
        self.fpm_pub: Publisher | None = None
        self.kv_pub: Publisher | None = None
        self._kv_event_id = 0
        self._kv_events: list[list[CacheChange] | None] = []
        """Per rank: the core's recorded cache changes (kind, engine block key, parent), drained after each
        pass; None = the core has no prefix cache to report."""
        self._kv_snapshot: list[Callable[[], list[int]] | None] = []
        """Per rank: the engine block keys the core's cache holds now."""
        self._first_token_seen: set[int] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self._child_cache: dict[int, dict[str, Any]] = {}
        self.rooms: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._room_of: dict[int, int] = {}
        self._bootstrap_server: asyncio.base_events.Server | None = None
        self.bootstrap_port: int | None = None
        self.bootstrap_served = 0
        self.app = self._make_app()

    # ------------------------------------------------------------------ lifecycle
    def _make_app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        app.router.add_get("/ready", self._ready)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/fpm", self._fpm)
        app.router.add_get("/info", self._info)
        app.router.add_get("/kv_state", self._kv_state)
        app.router.add_get("/records", self._records)
        app.on_startup.append(self._startup)
        app.on_cleanup.append(self._cleanup)
        return app

    async def _startup(self, app: web.Application) -> None:
        cores = [self.core_factory(self.cfg, self.s.worker_id, rank) for rank in range(self.cfg.dp_size)]
        self._zmq = zmq.Context()
        if self.s.fpm_endpoint:
            self.fpm_pub = Publisher(self._zmq, self.s.fpm_endpoint)
        if self.s.kv_events_endpoint:
            self.kv_pub = Publisher(self._zmq, self.s.kv_events_endpoint)
        for core in cores:
            self._attach_kv_events(core)
        for rank, core in enumerate(cores):
            d = RankDriver(core, rank, self.clock, on_pass=self._on_pass)
            d.start()
            self.drivers.append(d)
            self.metrics.kv_blocks_total.labels(self.s.model_name, str(rank)).set(self.cfg.num_gpu_blocks)
        self._tasks.append(asyncio.get_running_loop().create_task(self._heartbeat()))
        if self.s.bootstrap_port is not None and self.cfg.worker_type == "prefill":
            self._bootstrap_server = await asyncio.start_server(
                self._bootstrap_conn, self.s.host, self.s.bootstrap_port
            )
            self.bootstrap_port = self._bootstrap_server.sockets[0].getsockname()[1]
        self.ready = True

    async def _cleanup(self, app: web.Application) -> None:
        self.ready = False
        if self._bootstrap_server is not None:
            self._bootstrap_server.close()
        for t in self._tasks:
            t.cancel()
        for d in self.drivers:
            await d.stop()
        for p in (self.fpm_pub, self.kv_pub):
            if p is not None:
                p.close()
        if self._zmq is not None:
            self._zmq.term()

    def _attach_kv_events(self, core: Any) -> None:
        """Make a fresh core's cache report its real changes (the offline fleet's kv_events path): a native
        vLLM/TRT-LLM pool with prefix caching is swapped for :class:`EventingKvManager`, a KVBM G1 pool for
        :class:`EventingKvbmBlockManager` (both empty, same policy); the SGLang radix cache gets a
        :class:`RadixEventAdapter` listener. Other cores (no prefix cache) report nothing."""
        kv = getattr(core, "kv", None)
        events: list[CacheChange] | None = None
        snap: Callable[[], list[int]] | None = None
        if self.kv_pub is not None:
            if (type(kv) is BlockKvManager or type(kv) is KvbmBlockManager) and kv.caching:
                kv = core.kv = (EventingKvManager if type(kv) is BlockKvManager else EventingKvbmBlockManager)(
                    kv.num_blocks, kv.caching
                )
            if isinstance(kv, (EventingKvManager, EventingKvbmBlockManager)):
                events = kv.events
                snap = lambda kv=kv: list(kv.cached)  # noqa: E731 (every cached key, active or inactive)
            elif type(kv) is RadixCache:
                events = []
                ad = RadixEventAdapter(kv.page, self.cfg.trace_block_size, TupleSink(events))
                kv.listener = ad
                snap = lambda kv=kv, ad=ad: ad.tree_keys(kv.root)  # noqa: E731
        self._kv_events.append(events)
        self._kv_snapshot.append(snap)

    # ------------------------------------------------------------------ engine hooks
    def _children(self, rank: int) -> dict[str, Any]:
        """Per-rank labelled metric children, looked up once (``labels()`` is too slow for every pass)."""
        c = self._child_cache.get(rank)
        if c is None:
            m, name, r = self.metrics, self.s.model_name, str(rank)
            c = {
                k: getattr(m, k).labels(name, r)
                for k in (
                    "running",
                    "waiting",
                    "kv_active_tokens",
                    "kv_usage",
                    "pass_time",
                    "passes",
                    "lag",
                    "generation_tokens",
                    "prompt_tokens",
                    "ttft",
                    "itl",
                    "e2e",
                    "queue_time",
                    "prompt_len",
                    "gen_len",
                    "prefix_queries",
                    "prefix_hits",
                    "preemptions",
                )
            }
            c["success"] = m.request_success.labels(name, r, "length")
            c["hit_rate"] = m.cache_hit_rate.labels(name, r) if m.cache_hit_rate is not None else None
            self._child_cache[rank] = c
        return c

    def _on_pass(self, rank: int, outcome: PassOutcome, finished: list[RequestRecord], lag_ms: float) -> None:
        c = self._children(rank)
        fpm = outcome.fpm
        core = self.drivers[rank].core if rank < len(self.drivers) else None
        if core is not None:
            # the core's own state after the pass (exact: blocks include shared prefix blocks once)
            c["running"].set(core.num_running)
            c["waiting"].set(core.num_waiting + len(self.drivers[rank]._pending))
            blocks = core.active_blocks()
            c["kv_active_tokens"].set(blocks * self.cfg.effective_block_size)
            c["kv_usage"].set(blocks / self.cfg.num_gpu_blocks)
        if fpm is not None:
            c["pass_time"].inc(max(0.0, fpm.wall_time))
            if self.fpm_pub is not None:
                self.fpm_pub.publish(FPM_TOPIC, fpm)
        c["passes"].inc()
        c["lag"].observe(lag_ms / 1000.0)
        emitted = outcome_emissions(outcome)
        c["generation_tokens"].inc(len(emitted))
        drv = self.drivers[rank] if rank < len(self.drivers) else None
        ev = self._kv_events[rank] if rank < len(self._kv_events) else None
        if ev:
            self._publish_core_kv_events(rank, ev)
        for rid in emitted:  # first token out -> its prompt blocks are cached on this rank
            if rid in self._first_token_seen or drv is None:
                continue
            st = drv.streams.get(rid)
            if st is None:
                continue
            self._first_token_seen.add(rid)
            c["prompt_tokens"].inc(st.record.input_length)
            room = self._room_of.pop(rid, None)
            if room is not None:
                self._resolve_room(room, "ready", st.record.input_length)
        for rec in finished:
            self._first_token_seen.discard(rec.request_id)
            self._observe_finished(rank, rec)

    def _publish_core_kv_events(self, rank: int, events: list[CacheChange]) -> None:
        """Publish the core's recorded cache changes (engine block keys), one KvEventBatch per run of one kind,
        in the order they happened; then forget them."""
        if not events:
            return
        if self.kv_pub is not None:
            i = 0
            while i < len(events):
                kind = events[i][0]
                j = i
                while j < len(events) and events[j][0] == kind:
                    j += 1
                self._kv_event_id += 1
                self.kv_pub.publish(
                    KV_TOPIC,
                    KvEventBatch(
                        self.s.worker_id,
                        rank,
                        self._kv_event_id,
                        kind,
                        [wire_block_id(e[1]) for e in events[i:j]],
                    ),
                )
                i = j
        events.clear()

    def _cached_keys(self, rank: int) -> list[int]:
        """Wire ids of the engine block keys a rank's cache holds now (after publishing its pending changes,
        so the snapshot and the event id agree)."""
        ev = self._kv_events[rank] if rank < len(self._kv_events) else None
        if ev:
            self._publish_core_kv_events(rank, ev)
        snap = self._kv_snapshot[rank] if rank < len(self._kv_snapshot) else None
        return [wire_block_id(k) for k in snap()] if snap is not None else []

    def _observe_finished(self, rank: int, rec: RequestRecord) -> None:
        self.records.append(rec)
        if rec.status != "finished" or rec.first_token_ms is None or rec.finish_ms is None:
            return
        c = self._children(
            rank
        )  # labelled children looked up once per rank (labels() per ITL sample was ~10% of the process)
        c["success"].inc()
        c["ttft"].observe((rec.first_token_ms - rec.arrival_ms) / 1000.0)
        tt = rec.token_times_ms
        observe = c["itl"].observe
        for a, b in zip(tt, tt[1:]):
            observe((b - a) / 1000.0)
        c["e2e"].observe((rec.finish_ms - rec.arrival_ms) / 1000.0)
        if rec.admit_ms is not None:
            c["queue_time"].observe((rec.admit_ms - rec.arrival_ms) / 1000.0)
        c["prompt_len"].observe(rec.input_length)
        c["gen_len"].observe(len(tt))
        c["prefix_queries"].inc(rec.input_length)
        c["prefix_hits"].inc(rec.cached_tokens)
        if rec.num_preemptions:
            c["preemptions"].inc(rec.num_preemptions)
        if c["hit_rate"] is not None:
            q = c["prefix_queries"]._value.get()
            h = c["prefix_hits"]._value.get()
            c["hit_rate"].set(h / q if q else 0.0)

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(self.s.heartbeat_s)
            now = self.clock.now_ms()
            for d in self.drivers:
                if not d.has_work() and now - d.last_pass_wall_ms >= self.s.heartbeat_s * 1000.0:
                    hb = idle_fpm(self.s.worker_id, d.dp_rank, now)
                    d.latest_fpm = hb
                    name, r = self.s.model_name, str(d.dp_rank)
                    self.metrics.running.labels(name, r).set(0)
                    self.metrics.waiting.labels(name, r).set(0)
                    self.metrics.kv_usage.labels(name, r).set(0.0)
                    self.metrics.kv_active_tokens.labels(name, r).set(0)
                    if self.fpm_pub is not None:
                        self.fpm_pub.publish(FPM_TOPIC, hb)

    # ------------------------------------------------------------------ HTTP
    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def _ready(self, request: web.Request) -> web.Response:
        if not self.ready:
            return web.json_response({"status": "starting"}, status=503)
        return web.json_response({"status": "ready", "worker_id": self.s.worker_id})

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "object": "list",
                "data": [
                    {
                        "id": self.s.model_name,
                        "object": "model",
                        "created": 0,
                        "owned_by": "dynoplan-mocker",
                        "max_model_len": self.max_model_len,
                        # dynoplan extension: tokens per hash_ids entry this worker takes (loadgen checks its own)
                        "trace_block_size": self.cfg.trace_block_size,
                    }
                ],
            }
        )

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _fpm(self, request: web.Request) -> web.Response:
        out = {
            str(d.dp_rank): (msgspec.to_builtins(d.latest_fpm) if d.latest_fpm is not None else None)
            for d in self.drivers
        }
        return web.json_response(out)

    async def _info(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "worker_id": self.s.worker_id,
                "worker_type": self.cfg.worker_type,
                "engine": self.cfg.engine,
                "model": self.s.model_name,
                "dp_size": self.cfg.dp_size,
                "block_size": self.cfg.effective_block_size,
                "trace_block_size": self.cfg.trace_block_size,
                "num_gpu_blocks": self.cfg.num_gpu_blocks,
                "speedup_ratio": self.cfg.speedup_ratio,
                "max_model_len": self.max_model_len,
                "fpm_endpoint": self.fpm_pub.endpoint if self.fpm_pub else None,
                "kv_events_endpoint": self.kv_pub.endpoint if self.kv_pub else None,
                "outstanding": [d.outstanding for d in self.drivers],
                "bootstrap_port": self.bootstrap_port,
                "kv_block_ids": "engine",
            }
        )

    async def _kv_state(self, request: web.Request) -> web.Response:
        ranks = {str(i): self._cached_keys(i) for i in range(len(self.drivers))}
        return web.json_response({"event_id": self._kv_event_id, "ranks": ranks})

    async def _records(self, request: web.Request) -> web.Response:
        return web.Response(
            body=msgspec.json.encode([_record_dict(r) for r in self.records]), content_type="application/json"
        )

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, "completion")

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, "chat")

    def _error(self, e: RequestError) -> web.Response:
        self.metrics.rejected.labels(self.s.model_name, str(e.status)).inc()
        return web.json_response(e.body(), status=e.status)

    async def _serve(self, request: web.Request, kind: Kind) -> web.StreamResponse:
        received_ms = self._arrival_ms(request)
        if not self.ready:
            return web.json_response(
                RequestError("worker is not ready", status=503, type_="ServiceUnavailable").body(), status=503
            )
        try:
            p, h = await self._read_request(request, kind)
        except RequestError as e:
            return self._error(e)
        output_length = p.output_length
        if self.cfg.worker_type == "prefill":
            output_length = 1
        elif self.cfg.worker_type == "decode" and h.prefill_done:
            waited = await self._await_prompt_kv(p, h, received_ms)
            if isinstance(waited, web.Response):
                return waited
            received_ms = waited
        self._next_rid += 1
        rid = self._next_rid
        drv = (
            self.drivers[h.dp_rank]
            if h.dp_rank is not None
            else min(self.drivers, key=lambda d: (d.outstanding, d.dp_rank))
        )
        try:
            st = drv.submit(
                TraceRequest(rid, 0.0, p.input_length, output_length, p.hash_ids),
                prefilled=self.cfg.worker_type == "decode" and h.prefill_done,
                arrival_ms=received_ms,
            )
        except (DynoplanError, ValueError) as e:  # the core refused the request: a 400, never a crash
            return self._error(RequestError(f"request refused by the engine: {e}"))
        if h.room is not None and self.cfg.worker_type == "prefill":
            self._room_of[rid] = h.room
            self.rooms.setdefault(h.room, asyncio.get_running_loop().create_future())
        created = now_s()
        oid = response_id(p.kind, rid)
        done = False
        try:
            if p.stream:
                resp = await self._stream_tokens(request, p, st, oid, created)
                done = True
                return resp if resp is not None else self._refused(p)
            n = 0
            while True:
                em = await st.queue.get()
                if em.finished:
                    break
                n += 1
            done = True
            if n == 0:
                return self._refused(p)
            text = "".join(output_piece(i) for i in range(n))
            u = usage(p.input_length, n, st.record.cached_tokens)
            return web.json_response(full_body(p.kind, oid, p.model, created, text, "length", u))
        finally:
            room_left = self._room_of.pop(rid, None)
            if room_left is not None:
                self._resolve_room(room_left, "failed", p.input_length)
            if not done and rid in drv.streams:  # client went away (handler cancelled or write failed): free the KV
                drv.cancel(rid)
                self.metrics.cancelled.labels(self.s.model_name, str(drv.dp_rank)).inc()
                self._first_token_seen.discard(rid)
                self.records.append(st.record)

    def _arrival_ms(self, request: web.Request) -> float:
        """The request's arrival on the engine timeline (ms, ``self.clock``).

        When the request's head was read from the socket (serve_app), not when this handler got to run,
        two event-loop iterations later (behind the token writers); before the body is read and parsed
        either way.
        """
        received_ms = self.clock.now_ms()
        rx = request_received_monotonic(request)
        if rx is not None:
            received_ms = min(received_ms, self.clock.from_monotonic(rx))
        return received_ms

    async def _read_request(self, request: web.Request, kind: Kind) -> tuple[ParsedRequest, _Handoff]:
        """Read and validate the JSON body: the OpenAI fields (:func:`parse_request`) and the
        disaggregation fields (:meth:`_handoff_fields`). Raises RequestError (400) naming the field."""
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError, ValueError):
            raise RequestError("request body is not valid JSON") from None
        p = parse_request(
            body,
            kind,
            served_model=self.s.model_name,
            max_model_len=self.max_model_len,
            block_tokens=self.cfg.trace_block_size,
        )
        return p, self._handoff_fields(body)

    def _handoff_fields(self, body: dict[str, Any]) -> _Handoff:
        """``prefill_done`` (bool, default False), ``bootstrap_room`` (int >= 0), ``dp_rank`` (one of this
        worker's DP ranks) and, for a decode request with a room, ``bootstrap_host`` (str) and
        ``bootstrap_port`` (1..65535). Raises RequestError (400) naming the first bad field."""
        prefill_done = body.get("prefill_done", False)
        if not isinstance(prefill_done, bool):
            raise RequestError("'prefill_done' must be a boolean", param="prefill_done")
        room = body.get("bootstrap_room")
        if room is not None and (isinstance(room, bool) or not isinstance(room, int) or room < 0):
            raise RequestError("'bootstrap_room' must be a non-negative integer", param="bootstrap_room")
        want_rank = body.get("dp_rank")
        if want_rank is not None and (
            isinstance(want_rank, bool) or not isinstance(want_rank, int) or not 0 <= want_rank < len(self.drivers)
        ):
            raise RequestError(
                f"'dp_rank' must be an integer in 0..{len(self.drivers) - 1} (this worker's DP ranks), "
                f"got {want_rank!r}",
                param="dp_rank",
            )
        bootstrap: tuple[str, int, int] | None = None
        if room is not None and prefill_done:
            b_host, b_port = body.get("bootstrap_host"), body.get("bootstrap_port")
            if (
                not isinstance(b_host, str)
                or isinstance(b_port, bool)
                or not isinstance(b_port, int)
                or not 0 < b_port < 65536
            ):
                raise RequestError(
                    "a decode request with 'bootstrap_room' needs 'bootstrap_host' (string) and "
                    "'bootstrap_port' (1..65535)",
                    param="bootstrap_port",
                )
            bootstrap = (b_host, b_port, room)
        return _Handoff(prefill_done, room, want_rank, bootstrap)

    async def _await_prompt_kv(self, p: ParsedRequest, h: _Handoff, received_ms: float) -> float | web.Response:
        """Decode side of a prefilled request: wait for the prefill worker's bootstrap room (when given),
        then for the prompt KV transfer (:meth:`_transfer_delay_s`); returns the arrival time (ms) on the
        engine timeline, or the 502 response when the room's prefill did not succeed."""
        if h.bootstrap is not None:
            status = await self._await_bootstrap(*h.bootstrap)
            if status != "ready":
                return web.json_response(
                    RequestError(f"prefill of bootstrap room {h.room} {status}", status=502, type_="BadGateway").body(),
                    status=502,
                )
            received_ms = self.clock.now_ms()  # the prompt KV is ready now
        received_ms += self._transfer_delay_s(p.input_length) * 1000.0  # arrives after the transfer
        await self.clock.sleep_until(received_ms)
        return received_ms

    async def _stream_tokens(
        self, request: web.Request, p: ParsedRequest, st: StreamState, oid: str, created: int
    ) -> web.StreamResponse | None:
        """Stream ``st``'s tokens as server-sent events (one write per batch of queued tokens), then the
        finish chunk, the usage chunk (``include_usage``; its ``prompt_tokens_details.cached_tokens`` is the
        record's ``cached_tokens``) and ``[DONE]``; None when the engine finished the request without a token
        (nothing was sent: the caller answers 400)."""
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        n = 0
        finished = False
        q = st.queue
        while not finished:
            ems = [await q.get()]
            while not q.empty():  # tokens queued while this handler waited go out in one write
                ems.append(q.get_nowait())
            out = []
            for em in ems:
                if em.finished:
                    finished = True
                    break
                chunk = chunk_body(p.kind, oid, p.model, created, output_piece(em.token_index), None, first=n == 0)
                n += 1
                out.append(b"data: " + msgspec.json.encode(chunk) + b"\n\n")
            if out:
                if not resp.prepared:
                    await resp.prepare(request)  # headers go out with the first token, so a refusal can still be a 400
                await resp.write(b"".join(out))
        if n == 0:
            return None
        fin = chunk_body(p.kind, oid, p.model, created, None if p.kind == "chat" else "", "length")
        tail = b"data: " + msgspec.json.encode(fin) + b"\n\n"
        if p.include_usage:
            tail += (
                b"data: "
                + msgspec.json.encode(
                    usage_chunk(p.kind, oid, p.model, created, usage(p.input_length, n, st.record.cached_tokens))
                )
                + b"\n\n"
            )
        await resp.write(tail + b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    # ------------------------------------------------------------------ bootstrap handoff
    def _resolve_room(self, room: int, status: str, input_length: int) -> None:
        fut = self.rooms.setdefault(room, asyncio.get_running_loop().create_future())
        if not fut.done():
            fut.set_result({"room": room, "status": status, "input_length": input_length})
        asyncio.get_running_loop().call_later(BOOTSTRAP_ROOM_TTL_S, self.rooms.pop, room, None)

    async def _bootstrap_conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Prefill side: answer one ``{"room": R}`` line when room R's prompt is done."""
        try:
            line = await asyncio.wait_for(reader.readline(), 10.0)
            msg = json.loads(line)
            room = msg["room"]
            if isinstance(room, bool) or not isinstance(room, int):
                raise ValueError(room)
            fut = self.rooms.setdefault(room, asyncio.get_running_loop().create_future())
            res = await asyncio.wait_for(asyncio.shield(fut), BOOTSTRAP_ROOM_TTL_S)
            writer.write(json.dumps(res).encode() + b"\n")
            await writer.drain()
            self.bootstrap_served += 1
        except (TimeoutError, ValueError, KeyError, TypeError, ConnectionError):
            try:
                writer.write(b'{"status": "failed"}\n')
            except ConnectionError:
                pass
        finally:
            writer.close()

    async def _await_bootstrap(self, host: str, port: int, room: int) -> str:
        """Decode side: wait for the prefill worker's answer about ``room``; 'ready' or a failure reason."""
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 10.0)
        except (TimeoutError, OSError) as e:
            return f"unreachable ({e})"
        try:
            writer.write(json.dumps({"room": room}).encode() + b"\n")
            await writer.drain()
            line = await asyncio.wait_for(reader.readline(), BOOTSTRAP_ROOM_TTL_S)
            res = json.loads(line) if line else {"status": "failed"}
            return str(res.get("status", "failed"))
        except (TimeoutError, OSError, ValueError) as e:
            return f"failed ({e})"
        finally:
            writer.close()

    def _refused(self, p: ParsedRequest) -> web.Response:
        return self._error(
            RequestError(
                f"the request needs {p.input_length} prompt tokens (+ output) of KV cache, "
                "more than this engine can ever hold "
                f"({self.cfg.num_gpu_blocks} blocks of {self.cfg.effective_block_size} tokens)",
                param="max_tokens",
            )
        )

    def _transfer_delay_s(self, prompt_tokens: int) -> float:
        if self.s.kv_bytes_per_token <= 0 or self.s.kv_transfer_bandwidth_gbps <= 0:
            return 0.0
        # Not divided by the speedup ratio: the offline fleet's model (mocker.transfer), checked against the
        # reference (Dynamo Mocker 1.6.1 --disagg, speedup_ratio 10, ISL 374, 131072 B/token at 64 GB/s: decode
        # admitted 0.765952 ms after the prefill pass, the unscaled transfer time; TTFT 3.565769 ms).
        return (
            KvTransferConfig(self.s.kv_transfer_bandwidth_gbps, self.s.kv_bytes_per_token).transfer_ms(prompt_tokens)
            / 1000.0
        )


def _record_dict(r: RequestRecord) -> dict[str, Any]:
    return {
        "request_id": r.request_id,
        "arrival_ms": r.arrival_ms,
        "input_length": r.input_length,
        "output_length": r.output_length,
        "dp_rank": r.dp_rank,
        "admit_ms": r.admit_ms,
        "first_token_ms": r.first_token_ms,
        "finish_ms": r.finish_ms,
        "token_times_ms": r.token_times_ms,
        "cached_tokens": r.cached_tokens,
        "num_preemptions": r.num_preemptions,
        "status": r.status,
    }


async def serve(
    settings: WorkerSettings, core_factory: CoreFactory | None = None, on_bound: Callable[[int], None] | None = None
) -> None:
    """Run a worker until cancelled. ``on_bound(port)`` is called once the socket listens."""
    w = Worker(settings, core_factory)
    await serve_app(w.app, settings.host, settings.port, on_bound)
