"""Cached prompt tokens end to end, in-process on loopback (real aiohttp servers and sockets): the worker's
``usage.prompt_tokens_details.cached_tokens``, the frontend's copy of it in its own usage and its
``dynamo_frontend_cached_tokens`` histogram, for aggregated and disaggregated pools and after worker failures.

Hand-computed prefix hits (engine block 16 tokens = trace block 16 tokens, prefix caching on, vLLM and SGLang
alike): a prompt of 64 tokens with ids [1, 2, 3, 4] on an empty cache hits 0; the same prompt again hits 48 (the
whole prompt is cached, but the engine must compute at least its last token, so it recomputes the last block:
64 - 16); a 70-token prompt with ids [1, 2, 3, 4, 5] then hits its 4 full cached blocks, 64 tokens.
"""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from mocker.config import EngineConfig
from mocker.live.frontend import Frontend, FrontendSettings
from mocker.live.worker import Worker, WorkerSettings
from tests.live.cores import factory

A64 = {"model": "mocker", "input_length": 64, "hash_ids": [1, 2, 3, 4], "max_tokens": 3}
B70 = {"model": "mocker", "input_length": 70, "hash_ids": [1, 2, 3, 4, 5], "max_tokens": 3}


def _cfg(engine: str = "vllm", worker_type: str = "aggregated") -> EngineConfig:
    return EngineConfig(
        engine=engine,
        speedup_ratio=100.0,
        num_gpu_blocks=256,
        block_size=16,
        trace_block_size=16,
        worker_type=worker_type,
    )


async def _worker(cfg: EngineConfig, **kw) -> tuple[TestServer, Worker]:
    w = Worker(WorkerSettings(engine=cfg, port=0, **kw), core_factory=factory())
    srv = TestServer(w.app, handler_cancellation=True)
    await srv.start_server()
    return srv, w


def url(srv: TestServer) -> str:
    return str(srv.make_url("")).rstrip("/")


async def _frontend(urls: list[str], **kw) -> tuple[TestServer, Frontend]:
    fe = Frontend(FrontendSettings(port=0, workers=tuple(urls), poll_s=0.05, **kw))
    srv = TestServer(fe.app, handler_cancellation=True)
    await srv.start_server()
    assert await _until(lambda: len(fe.handles) == len(urls) and all(h.ready for h in fe.handles.values()))
    return srv, fe


async def _until(cond, tries: int = 500) -> bool:
    for _ in range(tries):
        if cond():
            return True
        await asyncio.sleep(0.01)
    return cond()


async def _post(s: aiohttp.ClientSession, base: str, body: dict, stream: bool) -> dict:
    """The response's usage object: the unary body's, or the streamed usage chunk's (``include_usage``)."""
    if not stream:
        r = await s.post(base + "/v1/completions", json=body)
        assert r.status == 200, await r.text()
        return (await r.json())["usage"]
    r = await s.post(base + "/v1/completions", json=dict(body, stream=True, stream_options={"include_usage": True}))
    assert r.status == 200, await r.text()
    events = [ln[6:] for ln in (await r.text()).split("\n") if ln.startswith("data: ")]
    assert events[-1] == "[DONE]"
    (u,) = [json.loads(e)["usage"] for e in events[:-1] if json.loads(e).get("usage") is not None]
    return u


async def _histogram(s: aiohttp.ClientSession, base: str, name: str) -> dict[str, float]:
    """``{sample name (with le for buckets): value}`` of one histogram of model "mocker" on ``base``/metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    text = await (await s.get(base + "/metrics")).text()
    out = {}
    for fam in text_string_to_metric_families(text):
        if fam.name == name:
            for smp in fam.samples:
                if smp.labels.get("model") == "mocker":
                    key = smp.name + (f"|{smp.labels['le']}" if "le" in smp.labels else "")
                    out[key] = smp.value
    return out


async def _observed(s: aiohttp.ClientSession, fe_url: str, n: int) -> dict[str, float]:
    """The frontend's cached-token histogram once it has ``n`` observations (polled: the frontend observes a
    request after its last byte went out)."""
    name = "dynamo_frontend_cached_tokens"
    h: dict[str, float] = {}
    for _ in range(500):
        h = await _histogram(s, fe_url, name)
        if h.get(name + "_count") == n:
            return h
        await asyncio.sleep(0.01)
    raise AssertionError(f"{name}_count never reached {n}: {h}")


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_worker_usage_reports_the_prefix_cache_hits_unary_and_streamed(engine):
    async def go():
        srv, w = await _worker(_cfg(engine))
        try:
            async with aiohttp.ClientSession() as s:
                got = [
                    await _post(s, url(srv), A64, stream=False),  # empty cache
                    await _post(s, url(srv), B70, stream=True),  # A's 4 full blocks
                    await _post(s, url(srv), A64, stream=False),  # all cached: the last block is recomputed
                ]
        finally:
            await srv.close()
        assert [u["prompt_tokens_details"] for u in got] == [{"cached_tokens": c} for c in (0, 64, 48)]
        # the other fields are as before
        assert [(u["prompt_tokens"], u["completion_tokens"], u["total_tokens"]) for u in got] == [
            (64, 3, 67),
            (70, 3, 73),
            (64, 3, 67),
        ]
        # the reported count is the request record's (prompt tokens cached at first admission)
        assert [r.cached_tokens for r in w.records] == [0, 64, 48]

    asyncio.run(go())


def test_frontend_reports_and_observes_the_workers_cached_tokens():
    """Aggregated pool of one worker: the frontend's usage carries the worker's count, streamed or unary (the
    frontend asks the worker for its usage chunk either way), and the histogram's sum is their sum."""

    async def go():
        wsrv, w = await _worker(_cfg())
        fsrv, fe = await _frontend([url(wsrv)])
        try:
            async with aiohttp.ClientSession() as s:
                got = [
                    await _post(s, url(fsrv), A64, stream=True),
                    await _post(s, url(fsrv), B70, stream=False),
                    await _post(s, url(fsrv), A64, stream=True),
                ]
                # a streamed request without include_usage is observed too (the worker leg still reports)
                r = await s.post(url(fsrv) + "/v1/completions", json=dict(A64, stream=True))
                assert r.status == 200 and '"usage"' not in await r.text()
                h = await _observed(s, url(fsrv), 4)
        finally:
            await fsrv.close()
            await wsrv.close()
        assert [u["prompt_tokens_details"]["cached_tokens"] for u in got] == [0, 64, 48]
        assert [r.cached_tokens for r in w.records] == [0, 64, 48, 48]
        name = "dynamo_frontend_cached_tokens"
        assert h[name + "_sum"] == 0 + 64 + 48 + 48
        # TOKEN_BUCKETS (the input-length histogram's bounds), cumulative: 0 <= 1, 48 <= 64, 64 <= 64
        assert (h[name + "_bucket|1.0"], h[name + "_bucket|32.0"], h[name + "_bucket|64.0"]) == (1, 1, 4)
        assert h[name + "_bucket|+Inf"] == 4

    asyncio.run(go())


@pytest.mark.parametrize("pd_mode", ["direct", "bootstrap"])
def test_disaggregated_the_prefill_legs_count_is_reported(pd_mode):
    """Prefill + decode: the count is the prefill worker's (it ran the prompt), in either hand-off mode."""

    async def go():
        psrv, pw = await _worker(_cfg(worker_type="prefill"), worker_id=0, bootstrap_port=0)
        dsrv, dw = await _worker(_cfg(worker_type="decode"), worker_id=1)
        fsrv, fe = await _frontend([url(psrv), url(dsrv)], pd_mode=pd_mode)
        try:
            async with aiohttp.ClientSession() as s:
                got = [
                    await _post(s, url(fsrv), A64, stream=True),
                    await _post(s, url(fsrv), B70, stream=False),
                    await _post(s, url(fsrv), A64, stream=False),
                ]
                h = await _observed(s, url(fsrv), 3)
        finally:
            await fsrv.close()
            await psrv.close()
            await dsrv.close()
        if pd_mode == "bootstrap":
            assert pw.bootstrap_served == 3
        assert [r.cached_tokens for r in pw.records] == [0, 64, 48]
        assert [(r.input_length, r.output_length) for r in dw.records] == [(64, 3), (70, 3), (64, 3)]
        # the decode core counts hits of its own when it admits a transferred prompt, not the same ones (so a
        # count read from the decode leg would fail the checks below)
        assert [r.cached_tokens for r in dw.records] != [0, 64, 48]
        assert [u["prompt_tokens_details"]["cached_tokens"] for u in got] == [0, 64, 48]
        assert [u["completion_tokens"] for u in got] == [3, 3, 3]
        assert h["dynamo_frontend_cached_tokens_sum"] == 112

    asyncio.run(go())


async def _fake_worker(mode: str, seen: list[dict]) -> TestServer:
    """An aggregated worker that fails every request: ``short`` streams 2 tokens then a usage chunk reporting
    32 cached tokens and ``[DONE]`` (a stream that ends short), ``error`` 2 tokens then an SSE error event,
    ``http`` a 503 before any token. ``seen`` collects the request bodies."""

    def chunk(obj: dict) -> bytes:
        return b"data: " + json.dumps(obj).encode() + b"\n\n"

    async def completions(request: web.Request) -> web.StreamResponse:
        seen.append(await request.json())
        if mode == "http":
            return web.json_response({"error": {"message": "overloaded"}}, status=503)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for _ in range(2):
            await resp.write(chunk({"choices": [{"index": 0, "text": "x", "finish_reason": None}]}))
        if mode == "short":
            u = {"prompt_tokens": 64, "completion_tokens": 2, "total_tokens": 66}
            await resp.write(chunk({"choices": [], "usage": dict(u, prompt_tokens_details={"cached_tokens": 32})}))
        else:
            await resp.write(chunk({"error": {"message": "engine died", "code": "internal_error"}}))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def info(request: web.Request) -> web.Response:
        return web.json_response({"worker_type": "aggregated", "trace_block_size": 16, "block_size": 16})

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/info", info)
    srv = TestServer(app)
    await srv.start_server()
    return srv


@pytest.mark.parametrize(
    "mode,want",
    [
        ("short", 32),  # the leg that produced the first token reported 32 before it failed: that count
        ("error", 0),  # it failed before its usage chunk: not reported = 0, not the continuation's hits
        ("http", 48),  # it failed before the first token: the request was re-sent whole, that leg's count
    ],
)
def test_after_a_worker_failure_the_count_is_the_first_token_legs(mode, want):
    """A failing worker takes the request first; a real worker, which already holds the prompt's blocks,
    continues it (``short``/``error``: from token 2, a 66-token prompt whose first 4 blocks it holds) or serves
    it whole (``http``: the same 64-token prompt, 48 cached)."""

    async def go():
        seen: list[dict] = []
        fake = await _fake_worker(mode, seen)
        wsrv, w = await _worker(_cfg())
        fsrv, fe = await _frontend([url(fake), url(wsrv)])
        try:
            async with aiohttp.ClientSession() as s:
                warm = await _post(s, url(wsrv), A64, stream=False)  # straight to the real worker
                assert warm["prompt_tokens_details"]["cached_tokens"] == 0
                order = [h.url for h in fe._candidates("aggregated", set())]
                fe._rr = order.index(url(fake)) - 1  # round robin's next pick is the failing worker
                got = await _post(s, url(fsrv), A64, stream=True)
                h = await _observed(s, url(fsrv), 1)
                retries = fe.metrics.retries.labels("mocker")._value.get()
                continuations = fe.metrics.continuations.labels("mocker")._value.get()
        finally:
            await fsrv.close()
            await wsrv.close()
            await fake.close()
        assert seen[0]["stream_options"] == {"include_usage": True}  # the frontend asked the first leg for usage
        assert got["completion_tokens"] == 3 and retries == 1
        assert got["prompt_tokens_details"] == {"cached_tokens": want}
        assert h["dynamo_frontend_cached_tokens_sum"] == want
        warm_rec, served = w.records
        if mode == "http":
            assert continuations == 0 and (served.input_length, served.cached_tokens) == (64, 48)
        else:  # the continuation leg had prefix hits of its own, which are not the request's
            assert continuations == 1 and (served.input_length, served.cached_tokens) == (66, 64)

    asyncio.run(go())
