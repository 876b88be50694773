"""Frontend routing, discovery, disaggregated flow and loadgen, in-process on loopback (real HTTP)."""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from mocker.config import EngineConfig
from mocker.live.frontend import Frontend, FrontendSettings, WorkerHandle
from mocker.live.loadgen import LoadgenSettings, client_report, run_load
from mocker.live.protocol import ParsedRequest
from mocker.live.worker import Worker, WorkerSettings
from mocker.records import TraceRequest
from tests.live.cores import factory


async def start_worker(worker_type="aggregated", speedup=100.0, worker_id=0):
    cfg = EngineConfig(
        speedup_ratio=speedup, num_gpu_blocks=256, block_size=16, trace_block_size=16, worker_type=worker_type
    )
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
                    r = await s.post(
                        url(fsrv) + "/v1/completions", json={"model": "mocker", "input_length": 20, "max_tokens": 3}
                    )
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
    fe = Frontend(FrontendSettings(workers=("http://a", "http://b"), router="kv"))
    h1 = WorkerHandle("http://a", trace_block_size=16, index_id=1)
    h2 = WorkerHandle("http://b", trace_block_size=16, index_id=2, dp_size=2, rank_inflight_tokens=[0, 0])
    fe.kv_index.apply("stored", 1, 0, [1, 2, 3])
    fe.kv_index.apply("stored", 2, 1, [1, 2])
    p = ParsedRequest("completion", "mocker", 64, 4, False, False, (1, 2, 3, 4), {})
    # 4 blocks; a holds the first 3 -> 1 to prefill; b's rank 1 the first 2 -> 2; b's rank 0 nothing -> 4
    assert fe.kv_cost(h1, p) == 1 and fe.kv_cost(h2, p, 1) == 2 and fe.kv_cost(h2, p, 0) == 4
    h1.rank_inflight_tokens[0] = 16 * 4  # a is busier by 4 blocks: 1 + 4 > 2
    assert fe.kv_cost(h1, p) == 5
    fe.handles = {"http://a": h1, "http://b": h2}
    h1.ready = h2.ready = True
    h1.role = h2.role = "aggregated"
    assert fe._pick("aggregated", p, set()) == (h2, 1)
    h2.rank_inflight_tokens[1] = 16 * 3  # b1: 2 + 3 = 5, a: 5, b0: 4 + 0
    assert fe._pick("aggregated", p, set()) == (h2, 0)
    h2.rank_inflight_tokens[0] = 16  # all three cost 5: the first in URL order, then rank
    assert fe._pick("aggregated", p, set()) == (h1, 0)


async def _until(cond, tries=250):
    for _ in range(tries):
        if cond():
            return True
        await asyncio.sleep(0.02)
    return cond()


def test_kv_events_reach_frontend_and_route_repeat_prefix():
    async def go():
        ws = [await start_worker(worker_id=i) for i in range(2)]
        fsrv, fe = await start_frontend([url(w[0]) for w in ws], router="kv")
        try:
            async with aiohttp.ClientSession() as s:
                body = {"model": "mocker", "input_length": 64, "hash_ids": [11, 12, 13, 14], "max_tokens": 2}
                await s.post(url(fsrv) + "/v1/completions", json=body)
                await _until(lambda: any(fe.kv_index.blocks.values()))
                holder = [k for k, v in fe.kv_index.blocks.items() if v]
                # the worker's events are its core's cache changes: the prompt's 4 engine block keys (block 16)
                from mocker.kv.manager import engine_block_keys
                from mocker.live.publish import wire_block_id

                assert len(holder) == 1 and fe.kv_index.blocks[holder[0]] == {
                    wire_block_id(k) for k in engine_block_keys([11, 12, 13, 14], 64, 16, 16)
                }
                for _ in range(3):
                    await s.post(url(fsrv) + "/v1/completions", json=body)
            counts = [len(w[1].records) for w in ws]
            assert sorted(counts) == [0, 4]
        finally:
            await fsrv.close()
            for w in ws:
                await w[0].close()

    asyncio.run(go())


def _core_keys(core):
    """Engine block keys a core's cache holds (the truth the frontend's index must equal)."""
    from mocker.kv.events import RadixEventAdapter, TupleSink

    kv = core.kv
    if hasattr(kv, "root"):
        return set(RadixEventAdapter(kv.page, kv.trace_block_size, TupleSink([])).tree_keys(kv.root))
    return set(kv.active) | set(kv.inactive)


def test_kv_router_routes_to_the_dp_rank_holding_the_prefix():
    """A worker with 2 DP ranks: two different prompts sent together land on different ranks (the second sees
    the first's load); the frontend's index then holds each prompt's blocks under its rank, equal to that
    rank's core cache; repeats of each prompt go to the rank holding it."""
    from mocker.live.publish import wire_block_id

    async def go():
        cfg = EngineConfig(speedup_ratio=100.0, num_gpu_blocks=256, block_size=16, trace_block_size=16, dp_size=2)
        f = factory()
        w = Worker(WorkerSettings(engine=cfg, port=0), core_factory=f)
        wsrv = TestServer(w.app, handler_cancellation=True)
        await wsrv.start_server()
        fsrv, fe = await start_frontend([url(wsrv)], router="kv")
        h = fe.handles[url(wsrv)]
        a = {"model": "mocker", "input_length": 96, "hash_ids": [1, 2, 3, 4, 5, 6], "max_tokens": 4}
        b = {"model": "mocker", "input_length": 96, "hash_ids": [7, 8, 9, 10, 11, 12], "max_tokens": 4}
        try:
            assert h.dp_size == 2
            async with aiohttp.ClientSession() as s:
                post = lambda body: s.post(url(fsrv) + "/v1/completions", json=body)  # noqa: E731
                r1, r2 = await asyncio.gather(post(a), post(b))
                assert r1.status == r2.status == 200
                rank_of = {rec.request_id: rec.dp_rank for rec in w.records}
                assert sorted(rank_of.values()) == [0, 1]
                truth = [{wire_block_id(k) for k in _core_keys(c)} for c in f.engines]
                assert await _until(lambda: [fe.kv_index.cached(h.index_id, r) for r in (0, 1)] == truth)
                assert all(len(t) == 6 for t in truth) and not truth[0] & truth[1]
                from mocker.kv.manager import engine_block_keys

                a_keys = {wire_block_id(k) for k in engine_block_keys(a["hash_ids"], 96, 16, 16)}
                a_rank = 0 if truth[0] == a_keys else 1
                assert truth[a_rank] == a_keys
                n0 = len(w.records)
                for _ in range(3):
                    assert (await post(a)).status == 200
                    assert (await post(b)).status == 200
                new = list(w.records)[n0:]
                assert len(new) == 6
                assert [r.dp_rank for r in new] == [a_rank, 1 - a_rank] * 3
                assert sum(r.cached_tokens for r in new) == 6 * 96 - 6 * 16  # all but the last block: prefix hits
        finally:
            await fsrv.close()
            await wsrv.close()

    asyncio.run(go())


@pytest.mark.parametrize("engine", ["vllm-native", "vllm-kvbm", "sglang"])
def test_frontend_index_equals_the_workers_cache_through_evictions(engine):
    """Real KV events from the cache itself (native pool, KVBM pool, SGLang radix tree): after a request
    finishes the frontend's index holds exactly the worker's cached blocks; prompts beyond the cache's
    capacity evict the first one and its removed events reach the frontend (index == cache again)."""
    from mocker.kv.manager import engine_block_keys
    from mocker.live.publish import wire_block_id

    kw = dict(speedup_ratio=100.0, num_gpu_blocks=24, block_size=16, trace_block_size=32)
    cfg = {
        "vllm-native": EngineConfig(**kw),
        "vllm-kvbm": EngineConfig(g1_backend="kvbm", **kw),
        "sglang": EngineConfig(engine="sglang", **kw),
    }[engine]

    async def go():
        f = factory()
        w = Worker(WorkerSettings(engine=cfg, port=0), core_factory=f)
        wsrv = TestServer(w.app, handler_cancellation=True)
        await wsrv.start_server()
        fsrv, fe = await start_frontend([url(wsrv)], router="kv")
        h = fe.handles[url(wsrv)]
        core = f.engines[0]
        truth = lambda: {wire_block_id(k) for k in _core_keys(core)}  # noqa: E731
        try:
            async with aiohttp.ClientSession() as s:
                first = [100, 101, 102]
                r = await s.post(
                    url(fsrv) + "/v1/completions",
                    json={"model": "mocker", "input_length": 96, "hash_ids": first, "max_tokens": 3},
                )
                assert r.status == 200
                want = {wire_block_id(k) for k in engine_block_keys(first, 96, 16, 32)}
                assert await _until(lambda: fe.kv_index.cached(h.index_id, 0) == truth())
                assert want <= fe.kv_index.cached(
                    h.index_id, 0
                )  # the prompt's 6 blocks (output blocks: unique, if any)
                for i in range(1, 6):  # 5 more distinct 6-block prompts: 36 > 24 blocks
                    ids = [100 * i + 1000 + j for j in range(3)]
                    r = await s.post(
                        url(fsrv) + "/v1/completions",
                        json={"model": "mocker", "input_length": 96, "hash_ids": ids, "max_tokens": 3},
                    )
                    assert r.status == 200
                assert await _until(lambda: fe.kv_index.cached(h.index_id, 0) == truth())
                assert not want <= fe.kv_index.cached(h.index_id, 0)  # evicted: removed events arrived
                assert h.last_event_id == w._kv_event_id
        finally:
            await fsrv.close()
            await wsrv.close()

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
                    r = await s.post(
                        url(fsrv) + "/v1/completions",
                        json={"model": "mocker", "input_length": 8, "max_tokens": 30, "stream": True},
                    )
                    text = await r.text()
                    return sum(
                        1 for ln in text.split("\n") if ln.startswith("data: {") and '"finish_reason":null' in ln
                    )

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
                r = await s.post(
                    url(fsrv) + "/v1/chat/completions",
                    json={
                        "model": "mocker",
                        "messages": [{"role": "user", "content": "hi there"}],
                        "max_tokens": 6,
                        "stream": True,
                    },
                )
                lines = [json.loads(ln[6:]) for ln in (await r.text()).split("\n") if ln.startswith("data: {")]
            toks = [c for c in lines if c["choices"] and c["choices"][0]["delta"].get("content") is not None]
            assert len(toks) == 6
            (prec,) = pw[1].records
            (drec,) = dw[1].records
            assert prec.output_length == 1 and len(prec.token_times_ms) == 1
            # the decode worker emits every client token (the prefill leg's token is not the client's)
            assert drec.output_length == 6 and len(drec.token_times_ms) == 6 and drec.input_length == prec.input_length
        finally:
            await fsrv.close()
            for w in (pw, dw):
                await w[0].close()

    asyncio.run(go())


def test_disaggregated_decode_admits_prefilled_and_ttft_matches_offline():
    """The decode worker admits the handed-off prompt (core.add_prefilled_request): its passes carry no
    prefill tokens, and TTFT = prefill + transfer + one decode pass, as the offline disaggregated replay.

    Hand check (reference Dynamo Mocker 1.6.1 --disagg facts, tests/mocker/test_disagg.py): ISL 374 OSL 4 alone,
    64 GB/s, 131072 B/token: prefill pass 22.238914 ms, transfer 374*131072/64e9 s = 0.765952 ms, decode
    admitted at 23.004866 ms, first token 28.764127 ms (one decode pass of 5.759261 ms at 374 KV tokens).
    At speedup 10 the engine passes are divided by 10, the transfer is not (reference at speedup_ratio 10: TTFT
    3.565769 ms = 2.2238914 + 0.765952 + 0.5759261).
    """
    from mocker.fleet import FleetConfig, run_replay
    from mocker.transfer import KvTransferConfig

    speedup = 10.0
    off = run_replay(
        [TraceRequest(0, 0.0, 374, 4, None)],
        EngineConfig(speedup_ratio=speedup),
        FleetConfig(num_prefill_workers=1, num_decode_workers=1, transfer=KvTransferConfig(64, 131072)),
    )
    (orec,) = off.records
    assert orec.first_token_ms == pytest.approx(3.565769, abs=1e-6)

    async def go():
        ws = []
        for wid, role in enumerate(("prefill", "decode")):
            w = Worker(
                WorkerSettings(
                    engine=EngineConfig(speedup_ratio=speedup, worker_type=role),
                    port=0,
                    worker_id=wid,
                    kv_bytes_per_token=131072,
                    kv_transfer_bandwidth_gbps=64.0,
                ),
                core_factory=factory(),
            )
            srv = TestServer(w.app, handler_cancellation=True)
            await srv.start_server()
            ws.append((srv, w))
        (psrv, pw), (dsrv, dw) = ws
        fpms = []
        drv = dw.drivers[0]
        hook = drv.on_pass

        def on_pass(rank, outcome, finished, lag):  # type: ignore[no-untyped-def]
            fpms.append(outcome.fpm)
            hook(rank, outcome, finished, lag)

        drv.on_pass = on_pass
        fsrv, fe = await start_frontend([url(psrv), url(dsrv)])
        try:
            async with aiohttp.ClientSession() as s:
                t0 = time.monotonic()
                r = await s.post(
                    url(fsrv) + "/v1/completions",
                    json={"model": "mocker", "input_length": 374, "max_tokens": 4, "stream": True},
                )
                ttft_client_ms = None
                async for line in r.content:
                    if line.startswith(b"data: {") and ttft_client_ms is None:
                        ttft_client_ms = (time.monotonic() - t0) * 1000.0
                assert r.status == 200
            (prec,) = pw.records
            (drec,) = dw.records
            # decode side: 4 passes, all decode, none with prefill tokens; KV tokens 374, 375, 376, 377
            assert len(fpms) == 4 and len(drec.token_times_ms) == 4
            assert all(
                f.scheduled_requests.num_prefill_requests == 0 and f.scheduled_requests.sum_prefill_tokens == 0
                for f in fpms
            )
            assert all(f.scheduled_requests.num_decode_requests == 1 for f in fpms)
            assert [f.scheduled_requests.sum_decode_kv_tokens for f in fpms] == [374, 375, 376, 377]
            prefill_ms = prec.first_token_ms - prec.arrival_ms
            decode_first_ms = drec.first_token_ms - drec.arrival_ms
            assert prefill_ms == pytest.approx(22.238914 / speedup, abs=1e-6)
            assert decode_first_ms == pytest.approx((28.764127 - 23.004866) / speedup, abs=1e-6)
            # the decode arrival is stamped after the transfer sleep: at least the transfer after the prefill's token
            # (both workers' clocks start within this test, so only the lower bound holds across processes' clocks)
            transfer_ms = 374 * 131072 / 64e9 * 1000.0
            # the engine-side legs add up to the offline TTFT; the client sees it plus HTTP hops, never less
            assert prefill_ms + transfer_ms + decode_first_ms == pytest.approx(
                orec.first_token_ms - orec.arrival_ms, abs=1e-6
            )
            assert ttft_client_ms >= orec.first_token_ms - orec.arrival_ms
        finally:
            await fsrv.close()
            for srv, _ in ws:
                await srv.close()

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
                r = await s.post(
                    url(fsrv) + "/v1/completions", json={"model": "mocker", "prompt": "x", "max_tokens": -3}
                )
                assert r.status == 400 and (await r.json())["error"]["param"] == "max_tokens"
                r = await s.post(url(fsrv) + "/v1/chat/completions", json={"model": "mocker", "messages": "hi"})
                assert r.status == 400 and (await r.json())["error"]["param"] == "messages"
                r = await s.post(
                    url(fsrv) + "/v1/completions", json={"model": "mocker", "prompt": "hello", "max_tokens": 2}
                )
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
            res = await run_load(
                LoadgenSettings(url=url(fsrv), endpoint="chat", prompt_mode="text", max_concurrency=2), reqs
            )
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
        cfg_p = EngineConfig(
            speedup_ratio=100.0, num_gpu_blocks=256, block_size=16, trace_block_size=16, worker_type="prefill"
        )
        cfg_d = EngineConfig(
            speedup_ratio=100.0, num_gpu_blocks=256, block_size=16, trace_block_size=16, worker_type="decode"
        )
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
                rs = await asyncio.gather(
                    *[
                        s.post(
                            url(fsrv) + "/v1/completions",
                            json={"model": "mocker", "input_length": 50 + i, "max_tokens": 4},
                        )
                        for i in range(3)
                    ]
                )
                bodies = [await r.json() for r in rs]
            assert [b["usage"]["completion_tokens"] for b in bodies] == [4, 4, 4]
            assert pw.bootstrap_served == 3  # every decode leg waited on the prefill worker's bootstrap port
            assert sorted(r.input_length for r in pw.records) == [50, 51, 52]
            assert sorted((r.input_length, r.output_length) for r in dw.records) == [
                (50, 4),
                (51, 4),
                (52, 4),
            ]  # every client token
            # a decode leg naming a room no prefill will ever finish does not hang the decode worker forever:
            # a bad bootstrap port is an immediate 502
            async with aiohttp.ClientSession() as s:
                r = await s.post(
                    url(ds) + "/v1/completions",
                    json={
                        "model": "mocker",
                        "input_length": 10,
                        "max_tokens": 2,
                        "prefill_done": True,
                        "bootstrap_room": 99,
                        "bootstrap_host": "127.0.0.1",
                        "bootstrap_port": 9,
                    },
                )
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
                r = await s.post(
                    url(fsrv) + "/v1/completions",
                    json={"model": "mocker", "input_length": 100, "max_tokens": 2000, "stream": True},
                )
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
