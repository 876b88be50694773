"""Worker HTTP API against an in-process server (real aiohttp, real sockets on loopback)."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from mocker.config import EngineConfig
from mocker.live.worker import Worker, WorkerSettings
from tests.live.standin_engine import factory


def run(coro):
    return asyncio.run(coro)


async def _with_worker(fn, *, speedup=100.0, dp_size=1, pass_ms=10.0, **kw):
    cfg = EngineConfig(speedup_ratio=speedup, dp_size=dp_size, num_gpu_blocks=64, block_size=16, trace_block_size=16)
    f = factory(pass_ms)
    w = Worker(WorkerSettings(engine=cfg, port=0, **kw), core_factory=f)
    server = TestServer(w.app, handler_cancellation=True)
    await server.start_server()
    try:
        async with aiohttp.ClientSession(base_url=str(server.make_url(""))) as s:
            return await fn(s, w, f)
    finally:
        await server.close()


def test_completion_non_streaming_counts_tokens():
    async def body(s, w, f):
        r = await s.post("/v1/completions", json={"model": "mocker", "prompt": "hello world", "max_tokens": 5})
        assert r.status == 200
        d = await r.json()
        # "hello world" -> "hell", "o", " worl", "d" = 4 pieces
        assert d["usage"] == {"prompt_tokens": 4, "completion_tokens": 5, "total_tokens": 9}
        assert d["choices"][0]["finish_reason"] == "length"
        assert d["object"] == "text_completion"
    run(_with_worker(body))


def test_chat_streaming_sse_chunks_and_usage():
    async def body(s, w, f):
        r = await s.post("/v1/chat/completions", json={"model": "mocker", "messages": [{"role": "user", "content": "hi"}],
                                                       "max_tokens": 3, "stream": True, "stream_options": {"include_usage": True}})
        assert r.status == 200 and r.headers["Content-Type"].startswith("text/event-stream")
        events = [l[6:] for l in (await r.text()).split("\n") if l.startswith("data: ")]
        assert events[-1] == "[DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        content = [c for c in chunks if c["choices"] and "content" in c["choices"][0]["delta"]]
        assert len(content) == 3
        assert content[0]["choices"][0]["delta"]["role"] == "assistant"
        assert chunks[-2]["choices"][0]["finish_reason"] == "length"
        assert chunks[-1]["usage"]["completion_tokens"] == 3
    run(_with_worker(body))


def test_input_length_extension_sets_prompt_length():
    async def body(s, w, f):
        r = await s.post("/v1/completions", json={"model": "mocker", "input_length": 300, "max_tokens": 2})
        d = await r.json()
        assert d["usage"]["prompt_tokens"] == 300
        assert f.engines[0].cancelled == []
    run(_with_worker(body))


@pytest.mark.parametrize("payload,param", [
    ({"prompt": "x", "max_tokens": 1}, "model"),
    ({"model": "mocker", "max_tokens": 1}, "prompt"),
    ({"model": "mocker", "prompt": "x", "max_tokens": -1}, "max_tokens"),
    ({"model": "mocker", "prompt": "x", "max_tokens": "7"}, "max_tokens"),
    ({"model": "mocker", "prompt": "x", "max_tokens": 10**9}, "max_tokens"),
    ({"model": "mocker", "prompt": 5, "max_tokens": 1}, "prompt"),
    ({"model": "mocker", "prompt": "x", "stream": "yes"}, "stream"),
    ({"model": "mocker", "prompt": ["a", "b"]}, "prompt"),
    ({"model": "mocker", "prompt": "x", "n": 2}, "n"),
])
def test_bad_requests_get_openai_400(payload, param):
    async def body(s, w, f):
        r = await s.post("/v1/completions", json=payload)
        assert r.status == 400
        e = (await r.json())["error"]
        assert e["type"] == "invalid_request_error" and e["param"] == param and e["message"]
        # the server keeps serving
        ok = await s.post("/v1/completions", json={"model": "mocker", "prompt": "x", "max_tokens": 1})
        assert ok.status == 200
    run(_with_worker(body))


def test_invalid_json_unknown_model_and_chat_errors():
    async def body(s, w, f):
        r = await s.post("/v1/completions", data=b"{not json", headers={"Content-Type": "application/json"})
        assert r.status == 400
        r = await s.post("/v1/completions", data=b"[1,2]", headers={"Content-Type": "application/json"})
        assert r.status == 400 and "JSON object" in (await r.json())["error"]["message"]
        r = await s.post("/v1/completions", json={"model": "gpt-x", "prompt": "a"})
        assert r.status == 404 and (await r.json())["error"]["code"] == "model_not_found"
        r = await s.post("/v1/chat/completions", json={"model": "mocker", "messages": []})
        assert r.status == 400 and (await r.json())["error"]["param"] == "messages"
        r = await s.post("/v1/chat/completions", json={"model": "mocker", "messages": [{"content": "x"}]})
        assert r.status == 400
        m = await (await s.get("/metrics")).text()
        assert 'dynoplan_mocker_rejected_requests_total{code="400",model_name="mocker"} 4.0' in m
    run(_with_worker(body))


def test_models_health_ready_info_fpm():
    async def body(s, w, f):
        assert (await (await s.get("/health")).json())["status"] == "ok"
        assert (await s.get("/ready")).status == 200
        models = await (await s.get("/v1/models")).json()
        assert models["data"][0]["id"] == "mocker" and models["data"][0]["max_model_len"] == 64 * 16
        await s.post("/v1/completions", json={"model": "mocker", "prompt": "a b c", "max_tokens": 2})
        fpm = await (await s.get("/fpm")).json()
        assert set(fpm) == {"0", "1"}
        assert any(v is not None and v["wall_time"] > 0 for v in fpm.values())
        info = await (await s.get("/info")).json()
        assert info["fpm_endpoint"].startswith("tcp://127.0.0.1:") and info["dp_size"] == 2
    run(_with_worker(body, dp_size=2))


def test_metrics_engine_names_and_values():
    async def body(s, w, f):
        await asyncio.gather(*[s.post("/v1/completions", json={"model": "mocker", "input_length": 10, "max_tokens": 4})
                               for _ in range(3)])
        m = await (await s.get("/metrics")).text()
        assert 'vllm:generation_tokens_total{engine="0",model_name="mocker"} 12.0' in m
        assert 'vllm:request_success_total{engine="0",finished_reason="length",model_name="mocker"} 3.0' in m
        assert 'vllm:time_to_first_token_seconds_count{engine="0",model_name="mocker"} 3.0' in m
        # 3 requests x 3 gaps; the stand-in's pass is 10 ms / speedup 100 = 0.1 ms
        assert 'vllm:inter_token_latency_seconds_count{engine="0",model_name="mocker"} 9.0' in m
        assert "vllm:num_requests_waiting" in m and "vllm:kv_cache_usage_perc" in m
    run(_with_worker(body))


def test_sglang_metric_names():
    async def body(s, w, f):
        m = await (await s.get("/metrics")).text()
        assert "sglang:num_running_reqs" in m and "sglang:num_queue_reqs" in m and "vllm:" not in m
    cfg_speed = 100.0

    async def go():
        cfg = EngineConfig(engine="sglang", speedup_ratio=cfg_speed, num_gpu_blocks=1024)
        w = Worker(WorkerSettings(engine=cfg, port=0), core_factory=factory())
        server = TestServer(w.app)
        await server.start_server()
        try:
            async with aiohttp.ClientSession(base_url=str(server.make_url(""))) as s:
                await body(s, w, None)
        finally:
            await server.close()
    run(go())


def test_client_disconnect_cancels_request_in_core():
    async def body(s, w, f):
        # 1000 tokens at 10 ms/pass, speedup 1 -> 10 s; disconnect after the first chunk
        r = await s.post("/v1/completions", json={"model": "mocker", "prompt": "x", "max_tokens": 1000, "stream": True})
        await r.content.readline()
        r.close()
        for _ in range(200):
            if f.engines[0].cancelled:
                break
            await asyncio.sleep(0.01)
        assert f.engines[0].cancelled == [1]
        assert not f.engines[0].has_work()
        m = await (await s.get("/metrics")).text()
        assert 'dynoplan_mocker_cancelled_requests_total{engine="0",model_name="mocker"} 1.0' in m
    run(_with_worker(body, speedup=1.0))
