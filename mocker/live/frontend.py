"""The live frontend: an OpenAI-compatible entry point that discovers workers, routes, and measures.

Discovery
---------
Workers are base URLs (``http://127.0.0.1:8001``). Sources: a static list (``--workers``) and/or a file
(``--workers-file``, one URL per line, ``#`` comments) re-read whenever its modification time changes.
A new URL is probed on ``GET /info`` until it answers (readiness is checked, never a fixed sleep); its
role (aggregated / prefill / decode) and KV-event endpoint come from there. A URL that disappears from
the sources stops receiving new requests; requests already streaming from it finish normally. A worker
that fails is retried elsewhere: before the first token the request is re-sent whole; after ``n`` tokens
the remaining ``max_tokens - n`` are requested from another worker with the prompt extended by the ``n``
tokens already produced (``input_length`` extension; when the request has prompt block ids, ``hash_ids``
is extended to cover them: :func:`mocker.live.tokenizer.continuation_hash_ids`), so the client's stream
loses no token and ends with exactly ``max_tokens``. Such a continuation is counted in
``dynoplan_frontend_stream_continuations_total``, every re-routed leg in ``dynamo_frontend_request_retries_total``.

Failures: a request that cannot be served after it was accepted is answered with an OpenAI error body
(HTTP 503, or the worker's 4xx) when no token was sent yet, else with an SSE error event
(``data: {"error": {...}}`` then ``data: [DONE]``, no finish chunk); the error's ``code`` is its reason,
counted in ``dynoplan_frontend_request_failures_total{reason}`` and logged as one warning line:
``no_ready_worker`` (no worker of the needed role), ``all_workers_failed`` (every candidate failed),
``retries_exhausted`` (more than ``max_retries`` worker failures), ``worker_refused`` (a worker answered a
4xx, not retried), ``internal_error``.

Routing (``--router``)
----------------------
- ``round_robin``: next worker in URL order.
- ``least_loaded``: fewest in-flight requests, then fewest in-flight prompt+output tokens, then URL.
- ``kv``: per (worker, DP rank): cost = (prompt blocks not cached on that rank) + (tokens in flight on that
  rank / tokens per block), lowest wins (ties: URL order, then rank); the request is sent with the
  extension field ``dp_rank`` so the worker runs it on that rank. The cached blocks are the workers' KV
  events (ZMQ SUB, :mod:`mocker.live.publish`) kept in a :class:`mocker.kv.events.KvEventIndex` per
  (worker, rank), matched as the longest leading run of the request's engine block keys — Dynamo's KV
  router cost with overlap weight 1.

Disaggregated pools
-------------------
When prefill and decode workers are present, a request is sent first to a prefill worker with
``max_tokens: 1`` (prompt KV + first token; that token is not streamed), then to a decode worker with
``prefill_done: true`` and the client's ``max_tokens``; the decode worker applies the KV transfer delay,
admits the prompt KV without recomputing it and emits every client token, the first at the end of its first
decode pass — TTFT = prefill queue + prefill + transfer + one decode pass, the offline fleet's and the
reference's disaggregated TTFT (:mod:`mocker.fleet`) (``pd_mode="direct"``). With ``pd_mode="bootstrap"`` both
legs are sent at once: the prefill leg carries ``bootstrap_room``, the decode leg the prefill worker's
``bootstrap_host``/``bootstrap_port`` and the room, and the decode worker waits on that TCP port for the
prefill to finish (:mod:`mocker.live.worker`, "Coordinated bootstrap").

Metrics: :class:`mocker.live.metrics.FrontendMetrics` on ``GET /metrics``. TTFT is measured from the arrival
of the client's request (its head read from the socket) to the first token the frontend receives; ITL between
consecutive tokens it receives; request duration to the last token; the inter-arrival gap
(``dynoplan_frontend_request_interarrival_seconds``) from one accepted request's arrival to the next;
``dynamo_frontend_inflight_requests`` counts requests accepted and not yet answered.

Cached prompt tokens: the frontend's response ``usage`` carries ``prompt_tokens_details.cached_tokens`` and
``dynamo_frontend_cached_tokens`` (Dynamo's histogram, tokens) observes it once per successful request, next to
the input and output lengths. The count is what the worker leg that ran the prefill reported in its own usage
(``usage.prompt_tokens_details.cached_tokens``; the frontend asks that leg for the usage chunk with
``stream_options.include_usage``): the only leg when aggregated, the prefill leg when disaggregated (either
``pd_mode``; after a failed prefill or decode hand-off, the prefill leg the served decode followed), and
never a continuation after a mid-stream failure (its prompt is the extended one). A leg re-sent whole after a
failure before the first token replaces the failed one. A worker that does not report the field, or a leg that
failed mid-stream before its usage chunk, counts 0 cached tokens; a count above the prompt is cut to the prompt.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

import aiohttp
import msgspec
import zmq
import zmq.asyncio
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import Field

from dynoplan.errors import RequestError
from dynoplan.settings import Problems, settings
from mocker.kv.events import KvEventIndex
from mocker.kv.manager import engine_block_keys
from mocker.live.metrics import FrontendMetrics
from mocker.live.protocol import (
    Kind,
    ParsedRequest,
    chunk_body,
    full_body,
    now_s,
    parse_request,
    reported_cached_tokens,
    request_received_monotonic,
    response_id,
    serve_app,
    usage,
    usage_chunk,
)
from mocker.live.publish import KV_TOPIC, decode_kv_event, wire_block_id
from mocker.live.tokenizer import continuation_hash_ids

log = logging.getLogger("dynoplan.frontend")

RouterName = Literal["round_robin", "least_loaded", "kv"]
ROUTERS: tuple[str, ...] = get_args(RouterName)


@settings
class FrontendSettings:
    """Settings of the live frontend (``dynoplan frontend`` flags). Bad values: pydantic's ``ValidationError``
    when constructed directly; the CLI builds them through :func:`dynoplan.settings.check` (ConfigError)."""

    host: str = Field(default="127.0.0.1", description="Bind address.")
    port: int = Field(default=8080, ge=0, le=65535, description="HTTP port (0 = any free port).")
    workers: tuple[str, ...] = Field(default=(), description="Static worker base URLs (http:// or https://).")
    workers_file: str | None = Field(default=None, description="A file of worker URLs, re-read when it changes.")
    router: RouterName = Field(default="round_robin", description="Routing policy: round_robin, least_loaded or kv.")
    model_name: str = Field(default="mocker", description="Served model name.")
    poll_s: float = Field(
        default=0.5, gt=0, description="How often the workers file is checked and unready workers are probed (s)."
    )
    max_retries: int = Field(default=3, ge=0, description="Re-routes per request after worker failures.")
    pd_mode: Literal["direct", "bootstrap"] = Field(
        default="direct",
        description="Disaggregated hand-off: direct (prefill, then decode) or bootstrap (both at once, the "
        "decode worker waits on the prefill worker's bootstrap port); bootstrap needs prefill "
        "workers that have one.",
    )

    def __post_init__(self) -> None:
        p = []
        if not self.workers and not self.workers_file:
            p.append("workers: give --workers URL[,URL...] and/or --workers-file FILE")
        if self.workers_file and not os.path.isfile(self.workers_file):  # later it may vanish (re-read: no workers)
            what = (
                "is a directory"
                if os.path.isdir(self.workers_file)
                else "not a regular file"
                if os.path.exists(self.workers_file)
                else "no such file"
            )
            p.append(
                f"workers_file={self.workers_file!r}: {what}; expected an existing file of worker URLs "
                "(one per line; it may be empty and filled later)"
            )
        for u in self.workers:
            if not u.startswith(("http://", "https://")):
                p.append(f"workers: {u!r} is not an http(s) URL")
        if p:
            raise Problems(p)


@dataclass(eq=False)
class WorkerHandle:
    url: str
    role: str = "unknown"
    worker_id: int = -1
    trace_block_size: int = 512
    block_size: int = 512
    """Engine KV block size (tokens)."""
    kv_block_ids: str = "trace"
    """What the worker's KV events name: ``engine`` block keys (the core's own cache changes,
    :func:`mocker.kv.manager.engine_block_keys`) or ``trace`` prompt block ids (``hash_ids``)."""
    max_model_len: int = 1 << 30
    ready: bool = False
    listed: bool = True
    inflight: int = 0
    inflight_tokens: int = 0
    index_id: int = 0
    """This worker's key in the frontend's KV index (frontend-local: worker ids need not be unique)."""
    dp_size: int = 1
    rank_inflight_tokens: list[int] = field(default_factory=lambda: [0])
    """Prompt + output tokens in flight per DP rank, of the requests sent with a ``dp_rank``."""
    kv_endpoint: str | None = None
    sub_task: asyncio.Task[None] | None = None
    last_event_id: int = 0
    bootstrap_port: int | None = None


class WorkerFailed(Exception):
    pass


@dataclass
class _PrefillUsage:
    """What the leg that ran a request's prefill reported (see the module docstring, "Cached prompt tokens")."""

    cached_tokens: int = 0
    """``usage.prompt_tokens_details.cached_tokens`` of that leg (tokens; 0 = not reported)."""


class Frontend:
    def __init__(self, settings: FrontendSettings) -> None:
        self.s = settings
        self.metrics = FrontendMetrics(settings.model_name)
        self.handles: dict[str, WorkerHandle] = {}
        self.kv_index = KvEventIndex()
        """Cached engine block keys per (worker ``index_id``, DP rank), from the workers' KV events."""
        self._next_index_id = 0
        self._rr = 0
        self._rid = 0
        self._room = 0
        self._file_mtime: float | None = None
        self._urls: set[str] | None = None
        self._session: aiohttp.ClientSession | None = None
        self._zctx: zmq.asyncio.Context | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.app = web.Application(client_max_size=64 * 1024 * 1024)
        self.app.router.add_post("/v1/completions", self._completions)
        self.app.router.add_post("/v1/chat/completions", self._chat)
        self.app.router.add_get("/v1/models", self._models)
        self.app.router.add_get("/health", self._health)
        self.app.router.add_get("/ready", self._ready)
        self.app.router.add_get("/metrics", self._metrics)
        self.app.router.add_get("/workers", self._workers)
        self.app.on_startup.append(self._startup)
        self.app.on_cleanup.append(self._cleanup)

    # ------------------------------------------------------------------ discovery
    async def _startup(self, app: web.Application) -> None:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=None, sock_connect=5)
        )
        self._zctx = zmq.asyncio.Context()
        self._sync_sources()
        self._tasks.append(asyncio.get_running_loop().create_task(self._discovery_loop()))

    async def _cleanup(self, app: web.Application) -> None:
        for t in self._tasks:
            t.cancel()
        for h in self.handles.values():
            if h.sub_task:
                h.sub_task.cancel()
        if self._session:
            await self._session.close()
        if self._zctx:
            self._zctx.destroy(0)

    def _read_sources(self) -> list[str]:
        urls = list(self.s.workers)
        if self.s.workers_file:
            try:
                text = Path(self.s.workers_file).read_text()
            except (FileNotFoundError, IsADirectoryError, PermissionError):
                text = ""
            for line in text.splitlines():
                line = line.split("#", 1)[0].strip()
                if line:
                    urls.append(line.rstrip("/"))
        return list(dict.fromkeys(u.rstrip("/") for u in urls))

    def _sync_sources(self, reread: bool = True) -> None:
        if reread or self._urls is None:
            self._urls = set(self._read_sources())
        urls = self._urls
        for u in urls:
            h = self.handles.get(u)
            if h is None:
                self._next_index_id += 1
                self.handles[u] = WorkerHandle(u, index_id=self._next_index_id)
            else:
                h.listed = True
        for u, h in list(self.handles.items()):
            if u not in urls:
                h.listed = False  # drains: no new requests; in-flight ones continue
                if h.inflight == 0:
                    if h.sub_task:
                        h.sub_task.cancel()
                    self.kv_index.forget(h.index_id)
                    del self.handles[u]
        self._update_worker_gauge()

    def _update_worker_gauge(self) -> None:
        counts: dict[str, int] = {"aggregated": 0, "prefill": 0, "decode": 0}
        for h in self.handles.values():
            if h.ready and h.listed and h.role in counts:
                counts[h.role] += 1
        for role, n in counts.items():
            self.metrics.workers.labels(role).set(n)

    async def _discovery_loop(self) -> None:
        while True:
            if self.s.workers_file:
                try:
                    mtime = os.stat(self.s.workers_file).st_mtime_ns
                except FileNotFoundError:
                    mtime = -1
                if mtime != self._file_mtime:
                    self._file_mtime = mtime
                    self._sync_sources()
                else:
                    self._sync_sources(reread=False)  # drop drained workers
            await asyncio.gather(*(self._probe(h) for h in list(self.handles.values()) if not h.ready and h.listed))
            self._update_worker_gauge()
            await asyncio.sleep(self.s.poll_s)

    async def _probe(self, h: WorkerHandle) -> None:
        assert self._session is not None
        try:
            async with self._session.get(h.url + "/info", timeout=aiohttp.ClientTimeout(total=2)) as r:
                if r.status != 200:
                    return
                info = await r.json()
        except (TimeoutError, aiohttp.ClientError, OSError):
            return
        h.role = info.get("worker_type", "aggregated")
        h.worker_id = int(info.get("worker_id", -1))
        h.trace_block_size = int(info.get("trace_block_size", 512))
        h.block_size = int(info.get("block_size", h.trace_block_size))
        h.kv_block_ids = str(info.get("kv_block_ids", "trace"))
        h.max_model_len = int(info.get("max_model_len", h.max_model_len))
        h.dp_size = max(1, int(info.get("dp_size", 1)))
        if len(h.rank_inflight_tokens) != h.dp_size:
            h.rank_inflight_tokens = [0] * h.dp_size
        h.kv_endpoint = info.get("kv_events_endpoint")
        h.bootstrap_port = info.get("bootstrap_port")
        if h.kv_endpoint and h.sub_task is None and self.s.router == "kv":
            joined = asyncio.Event()
            h.sub_task = asyncio.get_running_loop().create_task(self._subscribe(h, joined))
            try:  # route to it only once its KV state is known (else the first events could be missed)
                await asyncio.wait_for(joined.wait(), 5.0)
            except TimeoutError:
                pass
        h.ready = True

    async def _subscribe(self, h: WorkerHandle, joined: asyncio.Event) -> None:
        """Follow a worker's KV events. A SUB socket receives only after its connection is up (ZMQ's
        "slow joiner"), so the connection is awaited through a socket monitor before the snapshot
        (``GET /kv_state``) is taken; an event-id gap later triggers a new snapshot."""
        assert self._zctx is not None and self._session is not None and h.kv_endpoint is not None
        sock = self._zctx.socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SUBSCRIBE, KV_TOPIC)
        mon = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
        sock.connect(h.kv_endpoint)
        try:
            try:
                await asyncio.wait_for(mon.recv_multipart(), 5.0)
            except TimeoutError:
                pass
            sock.disable_monitor()
            mon.close(0)
            await asyncio.sleep(0.01)  # the subscription message follows the handshake
            await self._resync(h)
            joined.set()
            while True:
                _topic, payload = await sock.recv_multipart()
                ev = decode_kv_event(payload)
                if h.last_event_id and ev.event_id != h.last_event_id + 1:
                    await self._resync(h)  # a gap: PUB dropped something
                    continue
                h.last_event_id = ev.event_id
                self.kv_index.apply(ev.kind, h.index_id, ev.dp_rank, ev.block_ids)
        except asyncio.CancelledError:
            pass
        finally:
            sock.close(0)

    async def _resync(self, h: WorkerHandle) -> None:
        assert self._session is not None
        try:
            async with self._session.get(h.url + "/kv_state", timeout=aiohttp.ClientTimeout(total=5)) as r:
                st = await r.json()
            self.kv_index.forget(h.index_id)
            for rank, ids in st["ranks"].items():
                self.kv_index.replace(h.index_id, int(rank), ids)
            h.last_event_id = int(st["event_id"])
        except (TimeoutError, aiohttp.ClientError, OSError, KeyError, ValueError):
            h.last_event_id = 0

    # ------------------------------------------------------------------ routing
    def _candidates(self, role: str, exclude: set[str]) -> list[WorkerHandle]:
        return sorted(
            (h for h in self.handles.values() if h.ready and h.listed and h.role == role and h.url not in exclude),
            key=lambda h: h.url,
        )

    def _pick(self, role: str, p: ParsedRequest, exclude: set[str]) -> tuple[WorkerHandle, int | None] | None:
        """(worker, DP rank or None = the worker chooses) for the next leg, or None if no worker is ready."""
        c = self._candidates(role, exclude)
        if not c:
            return None
        if self.s.router == "round_robin":
            self._rr += 1
            return c[self._rr % len(c)], None
        if self.s.router == "least_loaded":
            return min(c, key=lambda h: (h.inflight, h.inflight_tokens)), None
        best: tuple[WorkerHandle, int] | None = None
        best_cost = 0.0
        for h in c:  # URL order, then rank: the first of equal costs wins
            for rank in range(h.dp_size):
                cost = self.kv_cost(h, p, rank)
                if best is None or cost < best_cost:
                    best, best_cost = (h, rank), cost
        return best

    def kv_cost(self, h: WorkerHandle, p: ParsedRequest, rank: int = 0) -> float:
        """Blocks to prefill on ``rank`` of ``h`` (prompt blocks after the longest leading run the KV index
        holds for that rank) + that rank's in-flight tokens in blocks."""
        ids: Any = p.hash_ids or ()
        bs = max(1, h.trace_block_size)
        if h.kv_block_ids == "engine" and p.hash_ids:
            bs = max(1, h.block_size)
            try:
                ids = [
                    wire_block_id(k)
                    for k in engine_block_keys(p.hash_ids, p.input_length, bs, h.trace_block_size) or ()
                ]
            except ValueError:  # hash_ids shorter than the prompt: no match possible
                ids = ()
        n_blocks = -(-p.input_length // bs)
        overlap = self.kv_index.overlap(h.index_id, ids, rank)
        load = h.rank_inflight_tokens[rank] if rank < len(h.rank_inflight_tokens) else 0
        return (n_blocks - min(overlap, n_blocks)) + load / bs

    def _pool_roles(self) -> tuple[str, str | None]:
        """(role for the first leg, role for the decode leg or None) given the workers present."""
        ready = {h.role for h in self.handles.values() if h.ready and h.listed}
        if "prefill" in ready and "decode" in ready:
            return "prefill", "decode"
        if "aggregated" in ready:
            return "aggregated", None
        if "decode" in ready:  # decode workers alone can serve whole requests
            return "decode", None
        return "aggregated", None

    # ------------------------------------------------------------------ HTTP
    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def _ready(self, request: web.Request) -> web.Response:
        n = sum(1 for h in self.handles.values() if h.ready and h.listed)
        return web.json_response({"status": "ready" if n else "no workers", "workers": n}, status=200 if n else 503)

    async def _models(self, request: web.Request) -> web.Response:
        model: dict[str, object] = {"id": self.s.model_name, "object": "model", "created": 0, "owned_by": "dynoplan"}
        # dynoplan extension: the tokens per hash_ids entry that requests must use, when every routable worker (ready
        # and listed, as /ready counts) takes the same (the request check below uses the routed worker's); loadgen
        # compares its --trace-block-size with it
        sizes = {h.trace_block_size for h in self.handles.values() if h.ready and h.listed}
        if len(sizes) == 1:
            model["trace_block_size"] = sizes.pop()
        return web.json_response({"object": "list", "data": [model]})

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _workers(self, request: web.Request) -> web.Response:
        return web.json_response(
            [
                {
                    "url": h.url,
                    "role": h.role,
                    "ready": h.ready,
                    "listed": h.listed,
                    "inflight": h.inflight,
                    "cached_blocks": sum(len(self.kv_index.cached(h.index_id, r)) for r in range(h.dp_size)),
                }
                for h in sorted(self.handles.values(), key=lambda h: h.url)
            ]
        )

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, "completion")

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, "chat")

    async def _serve(self, request: web.Request, kind: Kind) -> web.StreamResponse:
        t0 = (
            request_received_monotonic(request) or time.monotonic()
        )  # the request's arrival (socket read), see serve_app
        model = self.s.model_name
        try:
            try:
                body = await request.json()
            except (json.JSONDecodeError, UnicodeDecodeError, ValueError):
                raise RequestError("request body is not valid JSON") from None
            mml = min((h.max_model_len for h in self.handles.values() if h.ready), default=1 << 30)
            p = parse_request(body, kind, served_model=model, max_model_len=mml, block_tokens=self._block_tokens())
        except RequestError as e:
            self.metrics.requests.labels(model, kind, "stream", "rejected").inc()
            return web.json_response(e.body(), status=e.status)
        self.metrics.started.labels(model).inc()
        self.metrics.observe_arrival(model, t0)
        self.metrics.inflight.labels(model).inc()
        self._rid += 1
        oid = response_id(p.kind, self._rid)
        created = now_s()
        resp: web.StreamResponse | None = None
        times: list[float] = []
        texts: list[str] = []
        prefill = _PrefillUsage()
        status = "error"
        try:
            if p.stream:
                resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
            async for piece in self._generate(p, prefill):
                times.append(time.monotonic())
                if resp is not None:
                    if not resp.prepared:
                        await resp.prepare(request)
                    chunk = chunk_body(p.kind, oid, model, created, piece, None, first=len(times) == 1)
                    await resp.write(b"data: " + msgspec.json.encode(chunk) + b"\n\n")
                else:
                    texts.append(piece)
            status = "success"
            u = usage(p.input_length, len(times), prefill.cached_tokens)
            if resp is not None:
                if not resp.prepared:
                    await resp.prepare(request)
                fin = chunk_body(p.kind, oid, model, created, None if p.kind == "chat" else "", "length")
                tail = b"data: " + msgspec.json.encode(fin) + b"\n\n"
                if p.include_usage:
                    tail += b"data: " + msgspec.json.encode(usage_chunk(p.kind, oid, model, created, u)) + b"\n\n"
                await resp.write(tail + b"data: [DONE]\n\n")
                await resp.write_eof()
                return resp
            return web.json_response(full_body(p.kind, oid, model, created, "".join(texts), "length", u))
        except (asyncio.CancelledError, ConnectionResetError):
            status = "cancelled"
            raise
        except Exception as exc:  # noqa: BLE001 - every failure of an accepted request is answered and counted
            err = (
                exc
                if isinstance(exc, RequestError)
                else RequestError(
                    f"internal error: {type(exc).__name__}: {exc}",
                    status=500,
                    type_="InternalServerError",
                    code="internal_error",
                )
            )
            if err.code is None:
                err.code = "request_error"
            self.metrics.failures.labels(model, err.code).inc()
            log.warning(
                "request %s failed after %d of %d tokens (%s): %s",
                oid,
                len(times),
                p.output_length,
                err.code,
                err.message,
            )
            if resp is not None and resp.prepared:
                try:
                    await resp.write(b"data: " + msgspec.json.encode(err.body()) + b"\n\ndata: [DONE]\n\n")
                except ConnectionResetError:
                    status = "cancelled"
                return resp
            return web.json_response(err.body(), status=err.status)
        finally:
            self.metrics.inflight.labels(model).dec()
            self.metrics.requests.labels(model, kind, "stream" if p.stream else "unary", status).inc()
            if status == "success" and times:
                m = self.metrics
                m.ttft.labels(model).observe(times[0] - t0)
                for a, b in zip(times, times[1:]):
                    m.itl.labels(model).observe(b - a)
                m.duration.labels(model).observe(times[-1] - t0)
                m.isl.labels(model).observe(p.input_length)
                m.osl.labels(model).observe(len(times))
                m.cached_tokens.labels(model).observe(prefill.cached_tokens)

    def _block_tokens(self) -> int:
        for h in self.handles.values():
            if h.ready:
                return h.trace_block_size
        return 512

    async def _generate(self, p: ParsedRequest, prefill: _PrefillUsage) -> AsyncIterator[str]:
        """Yield the text of each output token, in order, surviving worker failures (see module doc). Every leg
        that starts the request (aggregated, or the prefill leg) asks for the usage chunk and writes its cached
        prompt tokens into ``prefill``; continuation and decode legs do not."""
        first_role, decode_role = self._pool_roles()
        produced = 0
        prefilled = False  # disaggregated: the prefill leg finished (its token is not the client's, see module doc)
        failed: set[str] = set()
        retries = 0
        while produced < p.output_length:
            first = produced == 0 and not prefilled  # this leg runs the prompt's prefill
            disagg = decode_role is not None and first
            role = first_role if (first or decode_role is None) else decode_role
            picked = self._pick(role, p, failed)
            if picked is None:
                if produced == 0 and not failed:
                    raise RequestError(
                        "no ready worker to serve the request",
                        status=503,
                        type_="ServiceUnavailable",
                        code="no_ready_worker",
                    )
                raise RequestError(
                    f"all workers failed after {produced} tokens ({retries} worker failures)",
                    status=503,
                    type_="ServiceUnavailable",
                    code="all_workers_failed",
                )
            h, rank = picked
            body = dict(p.raw)
            body.pop("stream_options", None)
            if first:  # its usage chunk reports the prompt's prefix-cache hits (a failed first leg's count is void)
                body["stream_options"] = {"include_usage": True}
                prefill.cached_tokens = 0
            body["stream"] = True
            remaining = p.output_length - produced
            if produced or prefilled:
                # a later leg: the prompt is given by length (text is not needed by a simulated engine)
                body.pop("prompt", None)
                body["messages"] = None
                if role == "decode":  # disaggregated decode leg: the prompt KV comes from the prefill worker
                    body["prefill_done"] = True
                    body["input_length"] = p.input_length
                else:  # continuation after a worker failure: the prompt now includes the tokens produced
                    body["input_length"] = p.input_length + produced
                    body.pop("hash_ids", None)
                    if p.hash_ids is not None:
                        # a valid request for the next worker: its block ids cover the extended prompt
                        try:
                            body["hash_ids"] = list(
                                continuation_hash_ids(p.hash_ids, p.input_length, produced, h.trace_block_size)
                            )
                        except ValueError:  # ids of another block size (a text prompt hashed for other workers)
                            pass  # no ids: unique content, always valid
            want = 1 if disagg else remaining
            body["max_tokens"] = want
            body.pop("max_completion_tokens", None)
            body.pop("dp_rank", None)
            if rank is not None:
                body["dp_rank"] = rank
            if disagg and self.s.pd_mode == "bootstrap" and h.bootstrap_port:
                d = self._pick("decode", p, failed)
                if d is not None:
                    try:
                        async for piece in self._bootstrap_legs(h, d[0], p, body, d[1], prefill):
                            produced += 1
                            yield piece
                        return
                    except WorkerFailed:
                        failed.add(h.url if produced == 0 else d[0].url)
                        retries += 1
                        self.metrics.retries.labels(self.s.model_name).inc()
                        if retries > self.s.max_retries:
                            raise RequestError(
                                f"gave up after {retries} worker failures",
                                status=503,
                                type_="ServiceUnavailable",
                                code="retries_exhausted",
                            ) from None
                        continue
            if produced:
                self.metrics.continuations.labels(self.s.model_name).inc()
            try:
                async for piece in self._stream_from(h, p, body, want, prefill if first else None):
                    if disagg:  # the prefill leg's token: the decode worker emits all the client's tokens
                        prefilled = True
                        continue
                    produced += 1
                    yield piece
            except WorkerFailed as e:
                log.info("worker %s failed after %d of %d tokens of a request: %s", h.url, produced, p.output_length, e)
                failed.add(h.url)
                retries += 1
                self.metrics.retries.labels(self.s.model_name).inc()
                if retries > self.s.max_retries:
                    raise RequestError(
                        f"gave up after {retries} worker failures",
                        status=503,
                        type_="ServiceUnavailable",
                        code="retries_exhausted",
                    ) from None
                continue

    async def _bootstrap_legs(
        self,
        ph: WorkerHandle,
        dh: WorkerHandle,
        p: ParsedRequest,
        p_body: dict[str, Any],
        d_rank: int | None = None,
        prefill: _PrefillUsage | None = None,
    ) -> AsyncIterator[str]:
        """Send the prefill and the decode leg at once; drain the prefill's token, yield the decode's (all
        ``output_length`` of them: the decode worker admits the handed-off prompt and emits every token). The
        prefill leg's reported cached prompt tokens go to ``prefill``."""
        self._room += 1
        room = self._room
        p_body = dict(p_body, bootstrap_room=room)
        d_body = dict(p.raw)
        d_body.pop("stream_options", None)
        d_body.pop("prompt", None)
        d_body.pop("max_completion_tokens", None)
        d_body.pop("dp_rank", None)
        if d_rank is not None:
            d_body["dp_rank"] = d_rank
        host = ph.url.split("://", 1)[1].rsplit(":", 1)[0]
        d_body.update(
            messages=None,
            stream=True,
            prefill_done=True,
            input_length=p.input_length,
            max_tokens=p.output_length,
            bootstrap_room=room,
            bootstrap_host=host,
            bootstrap_port=ph.bootstrap_port,
        )
        queue: asyncio.Queue[Any] = asyncio.Queue()
        done = object()

        async def decode_leg() -> None:
            try:
                async for piece in self._stream_from(dh, p, d_body, p.output_length):
                    queue.put_nowait(piece)
                queue.put_nowait(done)
            except BaseException as e:  # handed to the consumer, which re-raises it
                queue.put_nowait(e)

        task = asyncio.get_running_loop().create_task(decode_leg())
        try:
            async for _ in self._stream_from(ph, p, p_body, 1, prefill):
                pass
            while True:
                item = await queue.get()
                if item is done:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            if not task.done():
                task.cancel()

    async def _stream_from(
        self, h: WorkerHandle, p: ParsedRequest, body: dict[str, Any], want: int, prefill: _PrefillUsage | None = None
    ) -> AsyncIterator[str]:
        """Yield the text of each token one leg streams from ``h``; WorkerFailed when it fails or ends short of
        ``want`` tokens. ``prefill``: where the leg's usage chunk, if any, writes its cached prompt tokens
        (:func:`mocker.live.protocol.reported_cached_tokens`, at most the prompt's ``input_length``)."""
        assert self._session is not None
        url = h.url + ("/v1/completions" if p.kind == "completion" else "/v1/chat/completions")
        tokens = p.input_length + want
        rank_any = body.get("dp_rank")
        rank = rank_any if isinstance(rank_any, int) and 0 <= rank_any < len(h.rank_inflight_tokens) else None
        h.inflight += 1
        h.inflight_tokens += tokens
        if rank is not None:
            h.rank_inflight_tokens[rank] += tokens
        got = 0
        try:
            async with self._session.post(url, json=body) as r:
                if r.status >= 400:
                    try:
                        err = await r.json()
                        msg = err["error"]["message"]
                    except Exception:
                        msg = f"worker answered HTTP {r.status}"
                    if r.status < 500:
                        raise RequestError(
                            f"worker {h.url} refused the request: {msg}", status=r.status, code="worker_refused"
                        )
                    raise WorkerFailed(msg)
                async for line in r.content:
                    if not line.startswith(b"data: "):
                        continue
                    data = line[6:].strip()
                    if data == b"[DONE]":
                        break
                    d = json.loads(data)
                    if "error" in d:
                        raise WorkerFailed(d["error"].get("message", "worker error"))
                    if prefill is not None and d.get("usage") is not None:
                        prefill.cached_tokens = min(reported_cached_tokens(d["usage"]), p.input_length)
                    ch = d.get("choices") or []
                    if not ch or ch[0].get("finish_reason") is not None:
                        continue
                    piece = ch[0].get("text") if p.kind == "completion" else ch[0].get("delta", {}).get("content")
                    if piece is None:
                        continue
                    got += 1
                    yield piece
            if got < want:
                raise WorkerFailed(f"stream from {h.url} ended after {got} of {want} tokens")
        except (TimeoutError, aiohttp.ClientError, ConnectionResetError) as e:
            raise WorkerFailed(f"{h.url}: {e}") from None
        finally:
            h.inflight -= 1
            h.inflight_tokens -= tokens
            if rank is not None:
                h.rank_inflight_tokens[rank] -= tokens
            if not h.listed and h.inflight == 0:
                self._sync_sources(reread=False)


async def serve(settings: FrontendSettings, on_bound: Callable[[int], None] | None = None) -> None:
    fe = Frontend(settings)
    await serve_app(fe.app, settings.host, settings.port, on_bound)
