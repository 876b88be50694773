"""Frontend routing, discovery, disaggregated flow and loadgen, in-process on loopback (real HTTP)."""

from __future__ import annotations

import asyncio
import json

import aiohttp
from aiohttp.test_utils import TestServer

from mocker.config import EngineConfig
from mocker.live.frontend import Frontend, FrontendSettings
from mocker.live.loadgen import LoadgenSettings, client_report, run_load
from mocker.live.protocol import ParsedRequest
from mocker.live.frontend import WorkerHandle
from mocker.live.worker import Worker, WorkerSettings
from mocker.records import TraceRequest
from tests.live.cores import factory


async def start_worker(worker_type="aggregated", speedup=100.0, worker_id=0):
    cfg = EngineConfig(speedup_ratio=speedup, num_gpu_blocks=256, block_size=16, trace_block_size=16, worker_type=worker_type)
    f = factory()
    w = Worker(WorkerSettings(engine=cfg, port=0, worker_id=worker_id), core_factory=f)
    srv = TestServer(w.app, handler_cancellation=True)
    await srv.start_server()
    return srv, w, f


async def start_frontend(urls=(), workers_file=None, router="round_robin"):
    fe = Frontend(FrontendSettings(port=0, workers=tuple(urls), workers_file=workers_file, router=router, poll_s=0.05))
    srv = TestServer(fe.app, handler_cancellation=True)
    await srv.start_server()
    for _ in range(200):
        if sum(h.ready for h in fe.handles.values()) == len(fe._read_sources()):
            break
        await asyncio.sleep(0.02)
    return srv, fe


def url(srv) -> str:
    return str(srv.make_url("")).rstrip("/")


def test_round_robin_spreads_and_metrics():
    async def go():
        ws = [await start_worker(worker_id=i) for i in range(2)]
        fsrv, fe = await start_frontend([url(w[0]) for w in ws])
        try:
            async with aiohttp.ClientSession() as s:
                for _ in range(4):
                    r = await s.post(url(fsrv) + "/v1/completions", json={"model": "mocker", "input_length": 20, "max_tokens": 3})
                    assert r.status == 200
                    assert (await r.json())["usage"]["completion_tokens"] == 3
                m = await (await s.get(url(fsrv) + "/metrics")).text()
            per_worker = [len(w[1].records) for w in ws]
            assert per_worker == [2, 2]
            assert 'dynamo_frontend_requests_started_total{model="mocker"} 4.0' in m
            assert 'dynamo_frontend_time_to_first_token_seconds_count{model="mocker"} 4.0' in m
            assert 'dynamo_frontend_inter_token_latency_seconds_count{model="mocker"} 8.0' in m
            assert 'dynamo_frontend_input_sequence_tokens_sum{model="mocker"} 80.0' in m
            assert 'dynamo_frontend_output_sequence_tokens_sum{model="mocker"} 12.0' in m
        finally:
            await fsrv.close()
            for w in ws:
                await w[0].close()
    asyncio.run(go())


def test_kv_router_prefers_cached_prefix():
    h1, h2 = WorkerHandle("http://a", trace_block_size=16), WorkerHandle("http://b", trace_block_size=16)
    h1.cached = {1, 2, 3}
    p = ParsedRequest("completion", "mocker", 64, 4, False, False, (1, 2, 3, 4), {})
    # 4 blocks; a holds the first 3 -> 1 to prefill; b -> 4
    assert Frontend.kv_cost(h1, p) == 1 and Frontend.kv_cost(h2, p) == 4
    h1.inflight_tokens = 16 * 4  # a is busier by 4 blocks: 1 + 4 > 4
    assert Frontend.kv_cost(h1, p) == 5


def test_kv_events_reach_frontend_and_route_repeat_prefix():
    async def go():
        ws = [await start_worker(worker_id=i) for i in range(2)]
        fsrv, fe = await start_frontend([url(w[0]) for w in ws], router="kv")
        try:
            async with aiohttp.ClientSession() as s:
                body = {"model": "mocker", "input_length": 64, "hash_ids": [11, 12, 13, 14], "max_tokens": 2}
                await s.post(url(fsrv) + "/v1/completions", json=body)
                for _ in range(100):
                    if any(h.cached for h in fe.handles.values()):
                        break
                    await asyncio.sleep(0.02)
                holder = [h for h in fe.handles.values() if h.cached]
                assert len(holder) == 1 and holder[0].cached == {11, 12, 13, 14}
                for _ in range(3):
                    await s.post(url(fsrv) + "/v1/completions", json=body)
            counts = [len(w[1].records) for w in ws]
            assert sorted(counts) == [0, 4]
        finally:
            await fsrv.close()
            for w in ws:
                await w[0].close()
    asyncio.run(go())


def test_workers_file_join_and_leave_lose_no_request(tmp_path):
    async def go():
        a = await start_worker(speedup=10.0, worker_id=0)
        b = await start_worker(speedup=10.0, worker_id=1)
        wf = tmp_path / "workers.txt"
        wf.write_text(url(a[0]) + "\n")
        fsrv, fe = await start_frontend(workers_file=str(wf), router="least_loaded")
        try:
            async with aiohttp.ClientSession() as s:
                async def one():
                    r = await s.post(url(fsrv) + "/v1/completions", json={"model": "mocker", "input_length": 8, "max_tokens": 30, "stream": True})
                    text = await r.text()
                    return sum(1 for l in text.split("\n") if l.startswith("data: {") and '"finish_reason":null' in l)
                first = [asyncio.ensure_future(one()) for _ in range(3)]
                await asyncio.sleep(0.05)
                wf.write_text(url(b[0]) + "\n")  # a leaves, b joins, with a's requests in flight
                for _ in range(100):
                    if fe.handles.get(url(b[0])) and fe.handles[url(b[0])].ready:
                        break
                    await asyncio.sleep(0.02)
                second = [asyncio.ensure_future(one()) for _ in range(3)]
                got = await asyncio.gather(*first, *second)
            assert got == [30] * 6
            assert len(a[1].records) == 3 and len(b[1].records) == 3
            assert url(a[0]) not in fe.handles  # drained and dropped
        finally:
            await fsrv.close()
            await a[0].close()
            await b[0].close()
    asyncio.run(go())


def test_disaggregated_prefill_then_decode():
    async def go():
        pw = await start_worker("prefill", worker_id=0)
        dw = await start_worker("decode", worker_id=1)
        fsrv, fe = await start_frontend([url(pw[0]), url(dw[0])])
        try:
            async with aiohttp.ClientSession() as s:
                r = await s.post(url(fsrv) + "/v1/chat/completions", json={"model": "mocker", "messages": [{"role": "user", "content": "hi there"}],
                                                                          "max_tokens": 6, "stream": True})
                lines = [json.loads(l[6:]) for l in (await r.text()).split("\n") if l.startswith("data: {")]
            toks = [c for c in lines if c["choices"] and c["choices"][0]["delta"].get("content") is not None]
            assert len(toks) == 6
            (prec,) = pw[1].records
            (drec,) = dw[1].records
            assert prec.output_length == 1 and len(prec.token_times_ms) == 1
            assert drec.output_length == 5 and drec.input_length == prec.input_length
        finally:
            await fsrv.close()
            for w in (pw, dw):
                await w[0].close()
    asyncio.run(go())


def test_loadgen_measures_against_worker():
    async def go():
        w = await start_worker(speedup=100.0)
        try:
            reqs = [TraceRequest(i, i * 10.0, 32, 5, None) for i in range(10)]
            res = await run_load(LoadgenSettings(url=url(w[0]), time_compression=10.0), reqs)
            rep = client_report(res)
            assert rep["completed_requests"] == 10 and rep["failed_requests"] == 0
            assert rep["total_output_tokens"] == 50 and rep["num_itl_samples"] == 40
            # engine TTFT of a lone 32-token prompt: prefill(32) = 16.99 ms / speedup 100 = 0.17 ms; the client
            # sees it plus HTTP and delivery, never less
            assert rep["min_ttft_ms"] >= 0.169
            assert all(k in rep for k in ("mean_ttft_ms", "p99_itl_ms", "mean_e2e_latency_ms", "duration_ms"))
            from rich.console import Console

            from mocker.report import render_table
            con = Console(file=__import__("io").StringIO(), width=120)
            con.print(render_table(rep))  # the loadgen prints the offline report's table
            assert "TTFT" in con.file.getvalue()
        finally:
            await w[0].close()
    asyncio.run(go())


def test_frontend_rejects_bad_requests_like_workers():
    async def go():
        w = await start_worker()
        fsrv, fe = await start_frontend([url(w[0])])
        try:
            async with aiohttp.ClientSession() as s:
                r = await s.post(url(fsrv) + "/v1/completions", json={"model": "mocker", "prompt": "x", "max_tokens": -3})
                assert r.status == 400 and (await r.json())["error"]["param"] == "max_tokens"
                r = await s.post(url(fsrv) + "/v1/chat/completions", json={"model": "mocker", "messages": "hi"})
                assert r.status == 400 and (await r.json())["error"]["param"] == "messages"
                r = await s.post(url(fsrv) + "/v1/completions", json={"model": "mocker", "prompt": "hello", "max_tokens": 2})
                assert r.status == 200 and (await r.json())["usage"]["completion_tokens"] == 2
            assert len(w[1].records) == 1
        finally:
            await fsrv.close()
            await w[0].close()
    asyncio.run(go())


def test_frontend_without_workers_answers_503():
    async def go():
        fe = Frontend(FrontendSettings(port=0, workers=("http://127.0.0.1:9",), poll_s=0.05))
        srv = TestServer(fe.app)
        await srv.start_server()
        try:
            async with aiohttp.ClientSession() as s:
                assert (await s.get(url(srv) + "/ready")).status == 503
                r = await s.post(url(srv) + "/v1/completions", json={"model": "mocker", "prompt": "x", "max_tokens": 2})
                assert r.status == 503 and "no ready worker" in (await r.json())["error"]["message"]
        finally:
            await srv.close()
    asyncio.run(go())


def test_loadgen_chat_text_mode_through_frontend():
    async def go():
        w = await start_worker(speedup=100.0)
        fsrv, fe = await start_frontend([url(w[0])])
        try:
            reqs = [TraceRequest(i, i * 5.0, 40, 3 + i, None) for i in range(5)]
            res = await run_load(LoadgenSettings(url=url(fsrv), endpoint="chat", prompt_mode="text", max_concurrency=2), reqs)
            rep = client_report(res)
            assert rep["completed_requests"] == 5 and rep["total_output_tokens"] == sum(3 + i for i in range(5))
            # text prompts: the worker tokenized them (not the 40-token extension field)
            assert all(r.input_length != 40 for r in w[1].records)
        finally:
            await fsrv.close()
            await w[0].close()
    asyncio.run(go())


def test_disaggregated_bootstrap_handoff():
    async def go():
        cfg_p = EngineConfig(speedup_ratio=100.0, num_gpu_blocks=256, block_size=16, trace_block_size=16, worker_type="prefill")
        cfg_d = EngineConfig(speedup_ratio=100.0, num_gpu_blocks=256, block_size=16, trace_block_size=16, worker_type="decode")
        pw = Worker(WorkerSettings(engine=cfg_p, port=0, worker_id=0, bootstrap_port=0), core_factory=factory())
        dw = Worker(WorkerSettings(engine=cfg_d, port=0, worker_id=1), core_factory=factory())
        ps, ds = TestServer(pw.app, handler_cancellation=True), TestServer(dw.app, handler_cancellation=True)
        await ps.start_server()
        await ds.start_server()
        fe = Frontend(FrontendSettings(port=0, workers=(url(ps), url(ds)), poll_s=0.05, pd_mode="bootstrap"))
        fsrv = TestServer(fe.app, handler_cancellation=True)
        await fsrv.start_server()
        try:
            for _ in range(200):
                if all(h.ready for h in fe.handles.values()):
                    break
                await asyncio.sleep(0.02)
            assert fe.handles[url(ps)].bootstrap_port == pw.bootstrap_port and pw.bootstrap_port
            async with aiohttp.ClientSession() as s:
                rs = await asyncio.gather(*[s.post(url(fsrv) + "/v1/completions", json={"model": "mocker", "input_length": 50 + i, "max_tokens": 4})
                                            for i in range(3)])
                bodies = [await r.json() for r in rs]
            assert [b["usage"]["completion_tokens"] for b in bodies] == [4, 4, 4]
            assert pw.bootstrap_served == 3  # every decode leg waited on the prefill worker's bootstrap port
            assert sorted(r.input_length for r in pw.records) == [50, 51, 52]
            assert sorted((r.input_length, r.output_length) for r in dw.records) == [(50, 3), (51, 3), (52, 3)]
            # a decode leg naming a room no prefill will ever finish does not hang the decode worker forever:
            # a bad bootstrap port is an immediate 502
            async with aiohttp.ClientSession() as s:
                r = await s.post(url(ds) + "/v1/completions", json={"model": "mocker", "input_length": 10, "max_tokens": 2, "prefill_done": True,
                                                                   "bootstrap_room": 99, "bootstrap_host": "127.0.0.1", "bootstrap_port": 9})
                assert r.status == 502 and "unreachable" in (await r.json())["error"]["message"]
        finally:
            await fsrv.close()
            await ps.close()
            await ds.close()
    asyncio.run(go())


def test_client_disconnect_at_frontend_cancels_on_worker():
    async def go():
        w = await start_worker(speedup=1.0)
        fsrv, fe = await start_frontend([url(w[0])])
        try:
            async with aiohttp.ClientSession() as s:
                r = await s.post(url(fsrv) + "/v1/completions", json={"model": "mocker", "input_length": 100, "max_tokens": 2000, "stream": True})
                assert r.status == 200
                await r.content.readline()
                core = w[2].engines[0]
                assert core.has_work()
                r.close()
                for _ in range(300):
                    if not core.has_work():
                        break
                    await asyncio.sleep(0.01)
            assert not core.has_work() and core.kv.num_active_blocks() == 0
            assert core.all_requests[0].record.status == "cancelled"
            assert fe.metrics.requests.labels("mocker", "completion", "stream", "cancelled")._value.get() == 1
        finally:
            await fsrv.close()
            await w[0].close()
    asyncio.run(go())
