"""The load generator: replays a workload against any OpenAI-compatible endpoint and measures client-side.

Arrivals: request ``i`` is sent at ``arrival_ms / time_compression`` after the start (a compression of 10
replays a 10-minute trace in one minute). ``max_concurrency`` bounds requests in flight (0 = unbounded,
which keeps arrivals exactly as the trace says); a request that waits for a slot is sent late, and the
wait is reported as ``mean_client_queue_ms``.

Prompts (``prompt_mode``): ``length`` sends the extension fields ``input_length`` and ``hash_ids`` (exact
lengths and prefix sharing against dynoplan workers and frontends) plus ``ignore_eos: true``; ``text``
sends a generated text prompt of about ``input_length`` tokens (for servers without the extension; the
prompt length is then the server tokenizer's). Every request asks for ``max_tokens = output_length``
and streams.

Measurement, per request on ``time.monotonic``: arrival = when the request is sent; every received token
chunk is one token time; finish = last token.

A request counts as completed only when it got every token it asked for (``max_tokens``), or fewer with a
finish reason other than ``length`` (e.g. ``stop``: the server's model ended it). Otherwise it failed, with
one of these reasons (the report's ``errors`` counts them, ``failures`` lists each failed request with its
reason, message and token counts): ``http_<status>`` (a non-2xx answer; message: the error body's),
``stream_error`` (an SSE ``data: {"error": ...}`` event; message: its ``code`` and ``message``),
``truncated_stream`` (the stream ended short of ``max_tokens`` without a stop reason), ``no_tokens``,
``timeout``, or the client exception's name (connection errors). Client-side TTFT / ITL / E2E ... are then computed by
:func:`mocker.report.build_report` — the same definitions and key names as the offline replay report,
in milliseconds of wall time (at a server speedup ratio R they read R times smaller than simulated
time; ``scale_ms`` multiplies them back for comparisons).

Block size: ``hash_ids`` are in ``--trace-block-size`` tokens per entry, and the workers take their own
``trace_block_size``. A dynoplan worker publishes its value on ``GET /v1/models`` (an extension field of the model
entry, ``trace_block_size``), a dynoplan frontend its ready workers' when they agree; in ``length`` mode
``dynoplan loadgen`` refuses a run whose block size differs (:func:`probe_server`), one line and exit 2,
instead of sending requests that every worker would refuse. A server that publishes none is not checked.

Stopped early (Ctrl-C or SIGTERM to ``dynoplan loadgen``): nothing more is sent, the requests in flight are
cancelled (status ``cancelled``, counted as failed), and the table, ``--report-json`` and ``--per-request`` are
written for every request sent until then; a line on stderr says how many of the trace's were sent, and the exit
status is 128 + the signal's number (130, 143), as a shell reports a process ended by it.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args
from urllib.parse import urlsplit

import aiohttp
from pydantic import Field

from dynoplan.settings import Problems, settings
from mocker.config import EngineConfig
from mocker.live.driver import sleep_until_monotonic
from mocker.records import RequestRecord, TraceRequest

PromptMode = Literal["length", "text"]
PROMPT_MODES: tuple[str, ...] = get_args(PromptMode)
_JSON = {"Content-Type": "application/json"}
SEND_LEAD_S = 0.05
"""A request's task is created this long before its send time and waits for it itself."""
Endpoint = Literal["completions", "chat"]
ENDPOINTS: tuple[str, ...] = get_args(Endpoint)


@settings
class LoadgenSettings:
    """Settings of the load generator (``dynoplan loadgen`` flags). Bad values: pydantic's ``ValidationError``
    when constructed directly; the CLI builds them through :func:`dynoplan.settings.check` (ConfigError)."""

    url: str = Field(description="Base URL of the OpenAI-compatible server, e.g. http://127.0.0.1:8080.")
    model: str = Field(default="mocker", min_length=1, description="Model name to request (not empty).")
    endpoint: Endpoint = Field(default="completions", description="API to call: completions or chat.")
    time_compression: float = Field(
        default=1.0, gt=0, description="Arrival times are divided by this (dimensionless, > 0)."
    )
    max_concurrency: int = Field(default=0, ge=0, description="Max requests in flight; 0 = unbounded.")
    prompt_mode: PromptMode = Field(
        default="length", description="length: send input_length/hash_ids extension fields; text: a generated prompt."
    )
    request_timeout_s: float = Field(
        default=600.0, gt=0, description="Per-request timeout (s); a timed-out request counts as failed."
    )

    def __post_init__(self) -> None:
        parts = urlsplit(self.url)
        try:
            parts.port  # noqa: B018 - raises ValueError on a port that is not a number from 0 to 65535
            bad_port = False
        except ValueError:
            bad_port = True
        if parts.scheme not in ("http", "https") or not parts.hostname or bad_port:
            raise Problems(f"url={self.url!r}: expected an http(s) base URL with a host, e.g. http://127.0.0.1:8080")


@dataclass(frozen=True, slots=True)
class RequestFailure:
    """Why one request failed (see the module docstring for the reasons)."""

    request_id: int
    reason: str
    message: str
    tokens: int
    """Tokens received before the failure."""
    expected_tokens: int
    """``max_tokens`` asked for."""


@dataclass
class LoadgenResult:
    """Duck-compatible with what :func:`mocker.report.build_report` reads from a replay result."""

    records: list[RequestRecord]
    errors: dict[str, int] = field(default_factory=dict)
    failures: list[RequestFailure] = field(default_factory=list)
    client_queue_ms: list[float] = field(default_factory=list)
    wall_s: float = 0.0
    worker_seconds: float = 0.0
    num_workers: int = 0
    engine: EngineConfig = field(default_factory=EngineConfig)
    interrupted_by: int | None = None
    """The signal (SIGINT, SIGTERM) that stopped the run before every request was sent and answered, or None:
    ``records`` then holds the requests sent until then, those still in flight ``cancelled``."""


def text_prompt(n_tokens: int, request_id: int) -> str:
    """About ``n_tokens`` tokens of text (4-letter words, unique per request)."""
    return " ".join(f"w{(request_id * 7919 + i) % 1000:03d}" for i in range(max(1, n_tokens)))


def request_body(s: LoadgenSettings, r: TraceRequest) -> dict[str, Any]:
    body: dict[str, Any] = {"model": s.model, "max_tokens": r.output_length, "stream": True, "ignore_eos": True}
    if s.prompt_mode == "length":
        body["input_length"] = r.input_length
        if r.hash_ids is not None:
            body["hash_ids"] = list(r.hash_ids)
    else:
        prompt = text_prompt(r.input_length // 2, r.request_id)  # "wNNN " ~ 2 tokens per word here
        if s.endpoint == "completions":
            body["prompt"] = prompt
        else:
            body["messages"] = [{"role": "user", "content": prompt}]
    return body


TOKEN, FINISH, ERROR, OTHER = "token", "finish", "error", "other"


def classify_event(data: bytes, chat: bool) -> tuple[str, str | None]:
    """What one SSE ``data:`` payload is: ``(TOKEN, None)`` an output token chunk, ``(FINISH, reason)`` a chunk
    carrying a finish reason, ``(ERROR, "code: message")`` an error event, ``(OTHER, None)`` anything else
    (usage chunk, ``[DONE]``, a role-only chat delta, a payload that is not JSON)."""
    if b'"finish_reason":null' in data and (not chat or b'"content":' in data):
        return TOKEN, None  # fast path: a compact token chunk (dynoplan, vLLM)
    if data == b"[DONE]":
        return OTHER, None
    try:
        d = json.loads(data)
    except ValueError:
        return OTHER, None
    if not isinstance(d, dict):
        return OTHER, None
    if d.get("error") is not None:
        err = d["error"]
        if isinstance(err, dict):
            code = err.get("code") or err.get("type") or "error"
            return ERROR, f"{code}: {err.get('message', '')}"
        return ERROR, str(err)
    ch = d.get("choices") or []
    if not ch:
        return OTHER, None
    fr = ch[0].get("finish_reason")
    if fr is not None:
        return FINISH, str(fr)
    if not chat or "content" in (ch[0].get("delta") or {}):
        return TOKEN, None
    return OTHER, None


def _fail(
    rec: RequestRecord, errors: dict[str, int], failures: list[RequestFailure] | None, reason: str, message: str
) -> None:
    rec.status = "failed"
    errors[reason] = errors.get(reason, 0) + 1
    if failures is not None:
        failures.append(
            RequestFailure(rec.request_id, reason, message[:300], len(rec.token_times_ms), rec.output_length)
        )


async def _one(
    session: aiohttp.ClientSession,
    s: LoadgenSettings,
    r: TraceRequest,
    t0: float,
    rec: RequestRecord,
    errors: dict[str, int],
    payload: bytes | None = None,
    failures: list[RequestFailure] | None = None,
) -> None:
    """Send one request and time its tokens. The stream is read in whatever pieces the socket delivers
    (``iter_any``), not line by line: every token in one piece arrived together and gets that piece's
    time, and the per-line awaits of ``StreamReader.readline`` (half this process's CPU at 10k tokens/s,
    profiled) are gone. The stream is read to its end, past ``[DONE]``, so the keep-alive connection goes
    back to the pool instead of being closed (a fresh TCP connect would otherwise precede many sends)."""
    path = "/v1/completions" if s.endpoint == "completions" else "/v1/chat/completions"
    if payload is None:
        payload = json.dumps(request_body(s, r)).encode()
    chat = s.endpoint == "chat"
    times = rec.token_times_ms
    error: str | None = None
    finish: str | None = None
    try:
        async with session.post(
            s.url.rstrip("/") + path,
            data=payload,
            headers=_JSON,
            timeout=aiohttp.ClientTimeout(total=s.request_timeout_s),
        ) as resp:
            if not 200 <= resp.status < 300:
                body = (await resp.read())[:2000]
                try:
                    msg = str(json.loads(body)["error"]["message"])
                except (ValueError, KeyError, TypeError):
                    msg = body.decode(errors="replace")
                _fail(rec, errors, failures, f"http_{resp.status}", msg)
                return
            buf = b""
            async for piece in resp.content.iter_any():
                now = (time.monotonic() - t0) * 1000.0
                if b"\r" in piece:
                    piece = piece.replace(b"\r\n", b"\n")
                buf += piece
                *events, buf = buf.split(b"\n\n")
                for ev in events:
                    for line in ev.split(b"\n"):
                        if not line.startswith(b"data: "):
                            continue
                        kind, detail = classify_event(line[6:].strip(), chat)
                        if kind == TOKEN:
                            times.append(now)
                        elif kind == FINISH:
                            finish = detail
                        elif kind == ERROR and error is None:
                            error = detail
        if rec.token_times_ms:
            rec.first_token_ms = rec.token_times_ms[0]
            rec.finish_ms = rec.token_times_ms[-1]
        n, want = len(times), r.output_length
        if error is not None:
            _fail(rec, errors, failures, "stream_error", f"{error} (after {n} of {want} tokens)")
        elif n == 0:
            _fail(rec, errors, failures, "no_tokens", f"the stream ended without a token (finish reason {finish})")
        elif n < want and (finish is None or finish == "length"):
            _fail(
                rec,
                errors,
                failures,
                "truncated_stream",
                f"the stream ended after {n} of {want} tokens with finish reason {finish}",
            )
        else:
            rec.status = "finished"
    except TimeoutError:
        _fail(rec, errors, failures, "timeout", f"no complete answer within {s.request_timeout_s:g} s")
    except (aiohttp.ClientError, OSError) as e:
        _fail(rec, errors, failures, type(e).__name__, str(e))


async def _warm_up(session: aiohttp.ClientSession, s: LoadgenSettings) -> None:
    """Open one keep-alive connection (``GET /v1/models``) before the clock starts, so the first request
    does not pay a TCP connect that the later ones (reusing pooled connections) do not. Any answer or
    failure is fine: the run itself reports errors."""
    try:
        async with session.get(s.url.rstrip("/") + "/v1/models", timeout=aiohttp.ClientTimeout(total=5)) as r:
            await r.read()
    except (TimeoutError, aiohttp.ClientError, OSError):
        pass


CONNECT_TIMEOUT_S = 5.0
"""How long :func:`probe_server` waits for the server's first answer (s)."""


def _published_block_size(status: int, body: bytes) -> int | None:
    """The ``trace_block_size`` of the first model entry of a ``GET /v1/models`` answer (a dynoplan extension: the
    tokens per ``hash_ids`` entry the server's workers take; a frontend publishes it when all its ready workers
    agree); None for another status, a body that is not such JSON, or no such positive integer."""
    if status != 200:
        return None
    try:
        doc = json.loads(body)
    except ValueError:
        return None
    data = doc.get("data") if isinstance(doc, dict) else None
    first = data[0] if isinstance(data, list) and data and isinstance(data[0], dict) else {}
    value = first.get("trace_block_size")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


async def probe_server(url: str, timeout_s: float = CONNECT_TIMEOUT_S) -> tuple[str | None, int | None]:
    """One ``GET /v1/models`` to the server at base ``url``, before a run: (why it cannot be reached, or None when
    it answers at all -- any HTTP status: only reaching it matters, the run reports request errors itself; the
    ``trace_block_size`` it publishes, :func:`_published_block_size`, or None). The reason is one line, e.g.
    ``Connection refused``, ``no answer within 5 s``: a dead URL is one error, not a whole trace of failed requests;
    and a block size the workers do not take is refused before anything is sent."""
    try:
        async with (
            aiohttp.ClientSession() as session,
            session.get(url.rstrip("/") + "/v1/models", timeout=aiohttp.ClientTimeout(total=timeout_s)) as r,
        ):
            return None, _published_block_size(r.status, await r.read())
    except TimeoutError:
        return f"no answer within {timeout_s:g} s", None
    except aiohttp.ClientConnectorError as e:
        errno = getattr(e.os_error, "errno", None)  # asyncio's strerror reads "Connect call failed (...)"
        return (os.strerror(errno) if errno else " ".join(str(e).split())), None
    except (aiohttp.ClientError, OSError) as e:
        return f"{type(e).__name__}: {' '.join(str(e).split())}", None


async def run_load(
    s: LoadgenSettings, requests: Sequence[TraceRequest], progress: Any = None, *, stop_on_signals: bool = False
) -> LoadgenResult:
    """Send ``requests`` on their (compressed) schedule; returns per-request client-side records.

    ``progress``: optional callable ``progress(done, total)`` called as requests finish. ``stop_on_signals``: SIGINT
    and SIGTERM stop the run instead of ending the process (the command line's use): nothing more is sent, the
    requests in flight are cancelled (status ``cancelled``, their tokens so far kept), and the result holds every
    request sent, with :attr:`LoadgenResult.interrupted_by` set, so that what was measured can still be reported.
    """
    sem = asyncio.Semaphore(s.max_concurrency) if s.max_concurrency > 0 else None
    records: list[RequestRecord] = []
    errors: dict[str, int] = {}
    failures: list[RequestFailure] = []
    queue_ms: list[float] = []
    done = 0
    total = len(requests)
    base = requests[0].arrival_ms if requests else 0.0
    stopped: list[int] = []
    tasks: list[asyncio.Future[None]] = []
    connector = aiohttp.TCPConnector(limit=s.max_concurrency or 0, force_close=False)
    async with aiohttp.ClientSession(connector=connector) as session:
        await _warm_up(session, s)
        t0 = time.monotonic()

        async def go(r: TraceRequest, due_ms: float, payload: bytes) -> None:
            nonlocal done
            await sleep_until_monotonic(t0 + due_ms / 1000.0)  # this task sends itself: no scheduling hop at due time
            if sem is not None:
                await sem.acquire()
            try:
                sent = (time.monotonic() - t0) * 1000.0
                queue_ms.append(max(0.0, sent - due_ms))
                rec = RequestRecord(r.request_id, sent, r.input_length, r.output_length, admit_ms=sent)
                records.append(rec)
                try:
                    await _one(session, s, r, t0, rec, errors, payload, failures)
                except asyncio.CancelledError:  # in flight when the run was stopped
                    rec.status = "cancelled"
                    raise
            finally:
                if sem is not None:
                    sem.release()
                done += 1
                if progress is not None:
                    progress(done, total)

        async def schedule() -> None:
            for r in requests:
                due = (r.arrival_ms - base) / s.time_compression
                payload = json.dumps(request_body(s, r)).encode()  # encoded before the send time, not at it
                # the request's task starts SEND_LEAD_S early and sleeps to its due time itself (sub-ms,
                # sleep_until_monotonic): at the due time it sends at once, instead of waiting for the loop to
                # run this scheduler, then create and first-schedule a task, behind the streams' reads
                await asyncio.sleep(max(0.0, t0 + due / 1000.0 - SEND_LEAD_S - time.monotonic()))
                tasks.append(asyncio.ensure_future(go(r, due, payload)))

        scheduler = asyncio.ensure_future(schedule())

        def stop(signum: int) -> None:
            if not stopped:
                stopped.append(signum)
            scheduler.cancel()
            for t in tasks:
                t.cancel()

        loop = asyncio.get_running_loop()
        signums = (signal.SIGINT, signal.SIGTERM) if stop_on_signals else ()
        for signum in signums:
            loop.add_signal_handler(signum, stop, signum)
        try:
            try:
                await scheduler
            except asyncio.CancelledError:
                if not stopped:  # cancelled from outside, not by a signal: the caller's cancellation
                    raise
            # a task cancelled by a signal ends with CancelledError: gathered as a result, not raised; any other
            # exception of a task is raised as it was
            for res in await asyncio.gather(*tasks, return_exceptions=True):
                if isinstance(res, BaseException) and not isinstance(res, asyncio.CancelledError):
                    raise res
        finally:
            for signum in signums:
                loop.remove_signal_handler(signum)
        wall = time.monotonic() - t0
    records.sort(key=lambda r: r.request_id)
    failures.sort(key=lambda f: f.request_id)
    return LoadgenResult(
        records=records,
        errors=errors,
        failures=failures,
        client_queue_ms=queue_ms,
        wall_s=wall,
        interrupted_by=stopped[0] if stopped else None,
    )


def scaled(result: LoadgenResult, scale_ms: float) -> LoadgenResult:
    """A copy with every time multiplied by ``scale_ms`` (e.g. the server's speedup ratio)."""
    out = []
    for r in result.records:
        c = RequestRecord(
            r.request_id,
            r.arrival_ms * scale_ms,
            r.input_length,
            r.output_length,
            admit_ms=None if r.admit_ms is None else r.admit_ms * scale_ms,
            first_token_ms=None if r.first_token_ms is None else r.first_token_ms * scale_ms,
            token_times_ms=[t * scale_ms for t in r.token_times_ms],
            finish_ms=None if r.finish_ms is None else r.finish_ms * scale_ms,
            status=r.status,
        )
        out.append(c)
    return LoadgenResult(
        records=out,
        errors=dict(result.errors),
        failures=list(result.failures),
        client_queue_ms=[q * scale_ms for q in result.client_queue_ms],
        wall_s=result.wall_s,
        interrupted_by=result.interrupted_by,
    )


def client_report(result: LoadgenResult) -> dict[str, Any]:
    """The offline report's keys (``mocker.report.build_report``) plus loadgen keys: ``failed_requests``,
    ``errors`` (count by reason), ``failures`` (each failed request: ``request_id``, ``reason``, ``message``,
    ``tokens`` received, ``expected_tokens``), ``mean_client_queue_ms``, ``wall_time_s``, ``output_tokens_per_wall_s``.

    ``coalesced_itl_ratio``: the share of ITL samples that are 0 ms because both tokens arrived in the
    same network read (unresolvable by the client; see the loadgen table note).

    Server-side fields a client cannot observe keep the offline report's shape with neutral values:
    prefix-cache ratios and preemptions 0, worker-seconds / GPU-hours 0, engine fields of a default config.
    """
    from mocker.report import build_report

    rep = build_report(result)
    rep["failed_requests"] = sum(1 for r in result.records if r.status != "finished")
    rep["errors"] = dict(sorted(result.errors.items()))
    rep["failures"] = [
        {
            "request_id": f.request_id,
            "reason": f.reason,
            "message": f.message,
            "tokens": f.tokens,
            "expected_tokens": f.expected_tokens,
        }
        for f in result.failures
    ]
    rep["mean_client_queue_ms"] = (
        sum(result.client_queue_ms) / len(result.client_queue_ms) if result.client_queue_ms else 0.0
    )
    rep["wall_time_s"] = result.wall_s
    toks = sum(len(r.token_times_ms) for r in result.records)
    rep["output_tokens_per_wall_s"] = toks / result.wall_s if result.wall_s > 0 else 0.0
    gaps = sum(max(0, len(r.token_times_ms) - 1) for r in result.records)
    same = sum(sum(1 for a, b in zip(r.token_times_ms, r.token_times_ms[1:]) if b == a) for r in result.records)
    rep["coalesced_itl_ratio"] = same / gaps if gaps else 0.0
    """Share of inter-token gaps where both tokens came in one network read: the client cannot resolve
    their interval and the ITL samples record 0 ms (a server faster than the client's reads, e.g. a high
    speedup ratio). TPOT, the per-request mean, is unaffected."""
    return rep
