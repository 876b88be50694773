"""Worker HTTP API against an in-process server (real aiohttp, real sockets on loopback)."""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from mocker.config import EngineConfig
from mocker.live.worker import Worker, WorkerSettings
from tests.live.cores import factory


def run(coro):
    return asyncio.run(coro)


async def _with_worker(fn, *, speedup=100.0, dp_size=1, cfg=None, **kw):
    cfg = cfg or EngineConfig(
        speedup_ratio=speedup, dp_size=dp_size, num_gpu_blocks=64, block_size=16, trace_block_size=16
    )
    f = factory()
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
        assert d["usage"] == {
            "prompt_tokens": 4,
            "completion_tokens": 5,
            "total_tokens": 9,
            "prompt_tokens_details": {"cached_tokens": 0},  # an empty prefix cache
        }
        assert d["choices"][0]["finish_reason"] == "length"
        assert d["object"] == "text_completion"

    run(_with_worker(body))


def test_chat_streaming_sse_chunks_and_usage():
    async def body(s, w, f):
        r = await s.post(
            "/v1/chat/completions",
            json={
                "model": "mocker",
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 3,
                "stream": True,
                "stream_options": {"include_usage": True},
            },
        )
        assert r.status == 200 and r.headers["Content-Type"].startswith("text/event-stream")
        events = [ln[6:] for ln in (await r.text()).split("\n") if ln.startswith("data: ")]
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
        (rec,) = w.records  # the core itself has released it (release_finished)
        assert rec.input_length == 300 and rec.status == "finished" and f.engines[0].all_requests == []

    run(_with_worker(body))


@pytest.mark.parametrize(
    "payload,param",
    [
        ({"prompt": "x", "max_tokens": 1}, "model"),
        ({"model": "mocker", "max_tokens": 1}, "prompt"),
        ({"model": "mocker", "prompt": "x", "max_tokens": -1}, "max_tokens"),
        ({"model": "mocker", "prompt": "x", "max_tokens": "7"}, "max_tokens"),
        ({"model": "mocker", "prompt": "x", "max_tokens": 10**9}, "max_tokens"),
        ({"model": "mocker", "prompt": 5, "max_tokens": 1}, "prompt"),
        ({"model": "mocker", "prompt": "x", "stream": "yes"}, "stream"),
        ({"model": "mocker", "prompt": ["a", "b"]}, "prompt"),
        ({"model": "mocker", "prompt": "x", "n": 2}, "n"),
    ],
)
def test_bad_requests_get_openai_400(payload, param):
    async def body(s, w, f):
        r = await s.post("/v1/completions", json=payload)
        assert r.status == 400
        e = (await r.json())["error"]
        assert e["type"] == "invalid_request_error" and e["param"] == param and e["message"]
        # the server keeps serving
        ok = await s.post("/v1/completions", json={"model": "mocker", "prompt": "x", "max_tokens": 1})
        assert ok.status == 200
        await ok.read()

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
        await asyncio.gather(
            *[
                s.post("/v1/completions", json={"model": "mocker", "input_length": 10, "max_tokens": 4})
                for _ in range(3)
            ]
        )
        m = await (await s.get("/metrics")).text()
        assert 'vllm:generation_tokens_total{engine="0",model_name="mocker"} 12.0' in m
        assert 'vllm:request_success_total{engine="0",finished_reason="length",model_name="mocker"} 3.0' in m
        assert 'vllm:time_to_first_token_seconds_count{engine="0",model_name="mocker"} 3.0' in m
        # 3 requests x 3 gaps
        assert 'vllm:inter_token_latency_seconds_count{engine="0",model_name="mocker"} 9.0' in m
        assert "vllm:num_requests_waiting" in m and "vllm:kv_cache_usage_perc" in m

    run(_with_worker(body))


def test_metric_names_per_engine_family():
    from prometheus_client import generate_latest

    from mocker.live.metrics import WorkerMetrics

    sg = generate_latest(WorkerMetrics("sglang", "m", 2).registry).decode()
    assert 'sglang:num_running_reqs{engine="1",model_name="m"} 0.0' in sg and "sglang:num_queue_reqs" in sg
    assert "sglang:cache_hit_rate" in sg and "vllm:" not in sg
    trt = generate_latest(WorkerMetrics("trtllm", "m", 1).registry).decode()
    assert "trtllm:num_requests_running" in trt and "trtllm:kv_cache_usage_perc" in trt and "vllm:" not in trt


def test_sglang_worker_serves_with_sglang_names():
    async def body(s, w, f):
        r = await s.post("/v1/completions", json={"model": "mocker", "input_length": 50, "max_tokens": 3})
        assert r.status == 200 and (await r.json())["usage"]["completion_tokens"] == 3
        m = await (await s.get("/metrics")).text()
        assert 'sglang:generation_tokens_total{engine="0",model_name="mocker"} 3.0' in m
        assert 'sglang:num_running_reqs{engine="0",model_name="mocker"}' in m and "vllm:" not in m

    run(_with_worker(body, cfg=EngineConfig(engine="sglang", speedup_ratio=100.0, num_gpu_blocks=4096)))


def test_trtllm_worker_serves_with_trtllm_names():
    async def body(s, w, f):
        r = await s.post("/v1/completions", json={"model": "mocker", "input_length": 50, "max_tokens": 3})
        assert r.status == 200
        m = await (await s.get("/metrics")).text()
        assert 'trtllm:generation_tokens_total{engine="0",model_name="mocker"} 3.0' in m

    run(_with_worker(body, cfg=EngineConfig(engine="trtllm", speedup_ratio=100.0)))


def test_client_disconnect_cancels_request_and_frees_kv():
    async def body(s, w, f):
        # 500 output tokens at speedup 1 take ~3 s; disconnect after the first chunk
        r = await s.post(
            "/v1/completions", json={"model": "mocker", "input_length": 200, "max_tokens": 500, "stream": True}
        )
        assert r.status == 200
        await r.content.readline()
        core = f.engines[0]
        assert core.kv.num_active_blocks() > 0
        r.close()
        for _ in range(200):
            if not core.has_work():
                break
            await asyncio.sleep(0.01)
        assert not core.has_work()
        assert core.all_requests[0].record.status == "cancelled"
        assert core.kv.num_active_blocks() == 0
        core.kv.check_invariants()
        m = await (await s.get("/metrics")).text()
        assert 'dynoplan_mocker_cancelled_requests_total{engine="0",model_name="mocker"} 1.0' in m

    run(_with_worker(body, speedup=1.0))


def test_engine_side_latencies_match_reference_facts_exactly():
    """ISL 374 alone -> TTFT 22.239 ms, next token 5.76 ms later (docs/architecture.md
    "Polynomial timing baseline", checked against the reference). The live driver keeps the core's timeline,
    so the engine-side histograms carry the exact simulated values whatever the event-loop jitter; at
    speedup 4 they are a quarter."""

    async def body(s, w, f):
        r = await s.post("/v1/completions", json={"model": "mocker", "input_length": 374, "max_tokens": 2})
        assert r.status == 200
        (rec,) = w.records
        assert abs((rec.first_token_ms - rec.arrival_ms) - 22.239 / 4) < 0.001
        assert abs((rec.token_times_ms[1] - rec.token_times_ms[0]) - 5.76 / 4) < 0.01
        m = await (await s.get("/metrics")).text()
        ttft_sum = float(
            next(ln for ln in m.splitlines() if ln.startswith("vllm:time_to_first_token_seconds_sum")).split()[-1]
        )
        assert abs(ttft_sum - 0.022239 / 4) < 1e-6

    run(_with_worker(body, cfg=EngineConfig(speedup_ratio=4.0)))


def test_request_that_can_never_fit_gets_400_and_server_survives():
    async def body(s, w, f):
        # 64 blocks x 16 tokens = 1024 tokens of KV: prompt 1000 + 100 output exceeds max_model_len
        r = await s.post("/v1/completions", json={"model": "mocker", "input_length": 1000, "max_tokens": 100})
        assert r.status == 400 and (await r.json())["error"]["param"] == "max_tokens"
        r = await s.post(
            "/v1/completions", json={"model": "mocker", "input_length": 1000, "max_tokens": 20, "stream": True}
        )
        assert r.status == 200
        await r.read()

    run(_with_worker(body))


def test_live_engine_timeline_equals_offline_replay_of_stamped_arrivals():
    """The driver's contract: whatever the event-loop jitter, each request's engine-side times are those of
    an offline replay (mocker.fleet) of the same arrivals as the worker stamped them."""
    from mocker.fleet import FleetConfig, run_replay
    from mocker.records import TraceRequest

    cfg = EngineConfig(
        speedup_ratio=20.0, num_gpu_blocks=512, block_size=16, max_num_seqs=8, max_num_batched_tokens=512
    )
    sizes = [(37 + 53 * i % 400, 3 + 7 * i % 25) for i in range(24)]

    async def body(s, w, f):
        async def one(i, isl, osl):
            await asyncio.sleep(0.004 * i)
            r = await s.post(
                "/v1/completions",
                json={"model": "mocker", "input_length": isl, "max_tokens": osl, "stream": i % 2 == 0},
            )
            await r.read()
            assert r.status == 200

        await asyncio.gather(*(one(i, a, b) for i, (a, b) in enumerate(sizes)))
        return list(w.records)

    recs = run(_with_worker(body, cfg=cfg))
    assert len(recs) == len(sizes)
    recs.sort(key=lambda r: (r.arrival_ms, r.request_id))
    offline = run_replay(
        [TraceRequest(r.request_id, r.arrival_ms, r.input_length, r.output_length) for r in recs],
        cfg,
        FleetConfig(num_workers=1),
    ).records
    for live, off in zip(recs, offline):
        assert live.request_id == off.request_id
        assert live.first_token_ms == pytest.approx(off.first_token_ms, abs=1e-6)
        assert live.finish_ms == pytest.approx(off.finish_ms, abs=1e-6)
        assert live.token_times_ms == pytest.approx(off.token_times_ms, abs=1e-6)
        assert live.num_preemptions == off.num_preemptions


def test_fpm_published_over_zmq_per_pass_then_idle_heartbeat():
    import zmq
    import zmq.asyncio

    from dynoplan.fpm import FPM_TOPIC, decode_fpm

    async def body(s, w, f):
        info = await (await s.get("/info")).json()
        ctx = zmq.asyncio.Context()
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, FPM_TOPIC)
        sub.connect(info["fpm_endpoint"])
        try:
            await asyncio.sleep(0.2)  # PUB/SUB join
            r = await s.post("/v1/completions", json={"model": "mocker", "input_length": 100, "max_tokens": 4})
            assert r.status == 200
            got = []
            while True:
                topic, payload = await asyncio.wait_for(sub.recv_multipart(), 5)
                fpm = decode_fpm(payload)
                if fpm.wall_time == 0.0 and not got:
                    continue  # a heartbeat from before the request
                got.append(fpm)
                if fpm.wall_time == 0.0:
                    break
            passes = [g for g in got if g.wall_time > 0]
            # 4 tokens = 4 passes: one prefill pass (100 new tokens), then 3 decode passes
            assert len(passes) == 4
            assert passes[0].scheduled_requests.num_prefill_requests == 1
            assert passes[0].scheduled_requests.sum_prefill_tokens == 100
            assert all(p.scheduled_requests.num_decode_requests == 1 for p in passes[1:])
            assert all(p.worker_id == 7 for p in got)
            hb = got[-1]
            assert hb.scheduled_requests.num_prefill_requests == 0 and hb.queued_requests.num_prefill_requests == 0
        finally:
            sub.close(0)
            ctx.term()

    run(_with_worker(body, worker_id=7, heartbeat_s=0.2))


def test_overload_queues_and_shows_in_metrics():
    # Real time (speedup 1): the first two requests decode 400 tokens (~2 s at the default timing) while the
    # other four wait, so the queued state lasts long enough to be seen on a loaded machine; the poll waits
    # on that state (bounded by a deadline), not on a number of iterations.
    cfg = EngineConfig(speedup_ratio=1.0, num_gpu_blocks=256, block_size=16, max_num_seqs=2)

    async def body(s, w, f):
        tasks = [
            asyncio.ensure_future(
                s.post("/v1/completions", json={"model": "mocker", "input_length": 64, "max_tokens": 400})
            )
            for _ in range(6)
        ]

        def gauge(text: str, name: str) -> float:
            return float(next(ln for ln in text.splitlines() if ln.startswith(name + "{")).split()[-1])

        seen: set[tuple[float, float]] = set()
        deadline = time.monotonic() + 60.0
        while time.monotonic() < deadline and not all(t.done() for t in tasks):
            m = await (await s.get("/metrics")).text()
            seen.add((gauge(m, "vllm:num_requests_running"), gauge(m, "vllm:num_requests_waiting")))
            if (2.0, 4.0) in seen:
                break
            await asyncio.sleep(0.01)
        rs = await asyncio.gather(*tasks)
        assert [r.status for r in rs] == [200] * 6
        for r in rs:
            await r.read()
        assert (2.0, 4.0) in seen, seen  # max_num_seqs 2 running, the other 4 queued
        assert all(running <= 2 for running, _ in seen) and all(r + q <= 6 for r, q in seen), seen

    run(_with_worker(body, cfg=cfg))


def test_fuzzed_bodies_never_crash_the_server():
    """Valid bodies with one field replaced by a value of another JSON type, or dropped: every answer is
    200 or an OpenAI-style 4xx, never a 500, and the server keeps serving."""
    import random

    rng = random.Random(1234)
    values = [None, True, False, -1, 0, 1, 7, 10**12, 2.5, -0.5, "", "x", "7", [], [1, 2], ["a"], [[1]], {}, {"a": 1}]
    bases = [
        ("/v1/completions", {"model": "mocker", "prompt": "hi there", "max_tokens": 3, "stream": False}),
        (
            "/v1/completions",
            {"model": "mocker", "input_length": 20, "hash_ids": [1, 2], "max_tokens": 2, "stream": True},
        ),
        (
            "/v1/chat/completions",
            {
                "model": "mocker",
                "messages": [{"role": "user", "content": "yo"}],
                "max_tokens": 2,
                "stream": True,
                "stream_options": {"include_usage": True},
            },
        ),
    ]

    async def body(s, w, f):
        statuses = []
        for i in range(150):
            path, base = bases[i % len(bases)]
            b = dict(base)
            k = rng.choice(
                list(b) + ["n", "temperature", "min_tokens", "max_completion_tokens", "ignore_eos", "prefill_done"]
            )
            if rng.random() < 0.2:
                b.pop(k, None)
            else:
                b[k] = rng.choice(values)
            r = await s.post(path, json=b)
            await r.read()
            statuses.append(r.status)
            assert r.status in (200, 400, 404), (b, r.status)
        assert statuses.count(200) > 10 and statuses.count(400) > 10
        ok = await s.post("/v1/completions", json={"model": "mocker", "prompt": "x", "max_tokens": 1})
        assert ok.status == 200
        await ok.read()
        for core in f.engines:
            assert not core.has_work()
            core.kv.check_invariants()

    run(
        _with_worker(
            body, cfg=EngineConfig(speedup_ratio=200.0, num_gpu_blocks=256, block_size=16, trace_block_size=16)
        )
    )


def test_kv_transfer_delay_formula():
    """docs/architecture.md "KV transfer": time = tokens * kv_bytes_per_token / bandwidth, NOT divided by the
    speedup (the offline fleet and the reference at speedup_ratio 10: 374 tokens x 131072 B at 64 GB/s =
    0.765952 ms)."""
    cfg = EngineConfig(speedup_ratio=10.0, worker_type="decode")
    w = Worker(WorkerSettings(engine=cfg, kv_bytes_per_token=1_000_000, kv_transfer_bandwidth_gbps=1.0))
    assert w._transfer_delay_s(1000) == pytest.approx(1.0)  # 1e9 bytes at 1e9 B/s = 1 s
    w = Worker(WorkerSettings(engine=cfg, kv_bytes_per_token=131072, kv_transfer_bandwidth_gbps=64.0))
    assert w._transfer_delay_s(374) == pytest.approx(0.765952e-3, abs=1e-12)
    assert Worker(WorkerSettings(engine=cfg))._transfer_delay_s(1000) == 0.0  # bandwidth 0 disables


def test_kv_usage_gauge_is_active_blocks_over_capacity():
    cfg = EngineConfig(speedup_ratio=1.0, num_gpu_blocks=100, block_size=16)

    async def body(s, w, f):
        # 200-token prompt: 13 blocks (ceil(201/16) once the first output token is appended)
        r = await s.post(
            "/v1/completions", json={"model": "mocker", "input_length": 200, "max_tokens": 400, "stream": True}
        )
        await r.content.readline()
        await r.content.readline()
        await asyncio.sleep(0.05)
        m = await (await s.get("/metrics")).text()
        core = f.engines[0]
        usage = float(next(ln for ln in m.splitlines() if ln.startswith("vllm:kv_cache_usage_perc{")).split()[-1])
        running = float(next(ln for ln in m.splitlines() if ln.startswith("vllm:num_requests_running{")).split()[-1])
        assert running == 1.0
        assert 13 / 100 <= usage <= core.active_blocks() / 100 + 1e-9
        r.close()

    run(_with_worker(body, cfg=cfg))


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_core_holds_no_finished_request_state_after_many_requests(engine):
    """A long-running worker's core forgets finished requests, their pass end times and its FPM list
    (core.release_finished, called by the driver): memory does not grow with the number served."""
    cfg = EngineConfig(engine=engine, speedup_ratio=200.0, num_gpu_blocks=64, block_size=16, trace_block_size=16)

    async def body(s, w, f):
        n = 12
        rs = await asyncio.gather(
            *[
                s.post("/v1/completions", json={"model": "mocker", "input_length": 40 + i, "max_tokens": 3 + i % 4})
                for i in range(n)
            ]
        )
        assert [r.status for r in rs] == [200] * n
        bodies = [await r.json() for r in rs]
        assert sum(b["usage"]["completion_tokens"] for b in bodies) == sum(3 + i % 4 for i in range(n))
        core = f.engines[0]
        assert len(w.records) == n and all(r.status == "finished" for r in w.records)
        assert core.all_requests == [] and core.requests == {} and core.fpm == []
        assert core.pass_end_times().size == 0 and core._ends_base == core.pass_index > 0
        # the records the worker kept are whole: every token time of the engine timeline is there
        assert sorted(len(r.token_times_ms) for r in w.records) == sorted(3 + i % 4 for i in range(n))

    run(_with_worker(body, cfg=cfg))


@pytest.mark.parametrize("trace_block_size", [16, 512])  # 512/16: engine keys beyond 64 bits -> wire ids
def test_kv_events_replay_to_the_cores_cached_blocks(trace_block_size):
    """KV events come from the core's block pool (real stores and evictions, engine block keys): replaying
    every published event in order gives exactly the set of blocks the core's cache holds (active + evictable),
    through evictions (64 blocks; 6 prompts of 25 distinct blocks, two sharing a prefix)."""
    import zmq
    import zmq.asyncio

    from mocker.live.publish import KV_TOPIC, decode_kv_event, wire_block_id

    async def body(s, w, f):
        info = await (await s.get("/info")).json()
        assert info["kv_block_ids"] == "engine"
        ctx = zmq.asyncio.Context()
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, KV_TOPIC)
        sub.connect(info["kv_events_endpoint"])
        try:
            await asyncio.sleep(0.2)  # PUB/SUB join
            cached: set[int] = set()
            last_id = 0
            kinds = set()
            prompts = [[1000 * i + j for j in range(25)] for i in range(5)] + [
                [0 + j for j in range(20)] + [7, 8, 9, 10, 11]
            ]
            for ids in prompts:  # one at a time: each one's blocks are cached after it finishes
                r = await s.post(
                    "/v1/completions", json={"model": "mocker", "input_length": 400, "hash_ids": ids, "max_tokens": 3}
                )
                assert r.status == 200
            await asyncio.sleep(0.1)
            while True:
                try:
                    _, payload = await asyncio.wait_for(sub.recv_multipart(), 0.5)
                except TimeoutError:
                    break
                ev = decode_kv_event(payload)
                assert ev.event_id == last_id + 1  # no gap
                last_id = ev.event_id
                kinds.add(ev.kind)
                if ev.kind == "stored":
                    assert not cached & set(ev.block_ids)
                    cached.update(ev.block_ids)
                else:
                    assert set(ev.block_ids) <= cached
                    cached.difference_update(ev.block_ids)
            core = f.engines[0]
            truth = {wire_block_id(k) for k in (*core.kv.active, *core.kv.inactive)}
            assert kinds == {"stored", "removed"}  # evictions happened (6 x 25 blocks > 64)
            assert cached == truth and len(truth) <= 64
            st = await (await s.get("/kv_state")).json()
            assert set(st["ranks"]["0"]) == truth and st["event_id"] == last_id
        finally:
            sub.close(0)
            ctx.term()

    run(
        _with_worker(
            body,
            cfg=EngineConfig(speedup_ratio=100.0, num_gpu_blocks=64, block_size=16, trace_block_size=trace_block_size),
        )
    )


def test_driver_uses_the_receipt_stamp_and_keeps_arrivals_in_order():
    """RankDriver.submit(arrival_ms=...): the worker's HTTP receipt time is the arrival on the engine timeline
    (parsing under load does not shift it); a stamp earlier than the previous one is raised to it (order kept);
    the engine-side TTFT of a lone request is still exactly one prefill pass from that stamp."""
    from mocker.engine import make_engine
    from mocker.live.driver import RankDriver, WallClock
    from mocker.records import TraceRequest

    async def go():
        clock = WallClock()
        core = make_engine(EngineConfig(speedup_ratio=100.0, num_gpu_blocks=256, block_size=16), collect_fpm=True)
        drv = RankDriver(core, 0, clock)
        drv.start()
        try:
            await asyncio.sleep(0.05)
            t_recv = clock.now_ms() - 20.0  # received 20 ms ago (e.g. the body took that long to read)
            a = drv.submit(TraceRequest(1, 0.0, 100, 2, None), arrival_ms=t_recv)
            b = drv.submit(TraceRequest(2, 0.0, 100, 2, None), arrival_ms=t_recv - 5.0)
            assert a.record.arrival_ms == t_recv and b.record.arrival_ms == t_recv  # never earlier than a's
            c = drv.submit(TraceRequest(3, 0.0, 100, 2, None))
            assert c.record.arrival_ms >= t_recv + 20.0
            for st in (a, b, c):
                while not (await st.queue.get()).finished:
                    pass
            # the engine timeline is the offline one of the stamped arrivals (a and b together at t_recv)
            off = make_engine(EngineConfig(speedup_ratio=100.0, num_gpu_blocks=256, block_size=16))
            recs = [off.add_request(TraceRequest(i, 0.0, 100, 2, None), 0.0) for i in (1, 2)]
            off.advance_until(c.record.arrival_ms - t_recv)
            recs.append(off.add_request(TraceRequest(3, 0.0, 100, 2, None), c.record.arrival_ms - t_recv))
            off.advance_until(float("inf"))
            for live, o in zip((a, b, c), recs):
                assert live.record.first_token_ms - t_recv == pytest.approx(o.first_token_ms, abs=1e-6)
        finally:
            await drv.stop()

    run(go())


def test_driver_stamp_never_before_the_pass_in_flight():
    """A receipt stamp earlier than the start of the pass in flight is raised to that start (offline, it
    would have joined that pass; live it joins the next), so the live timeline stays the offline one."""
    from mocker.engine import make_engine
    from mocker.live.driver import RankDriver, WallClock
    from mocker.records import TraceRequest

    async def go():
        clock = WallClock()
        core = make_engine(EngineConfig(speedup_ratio=1.0, num_gpu_blocks=2048, block_size=16), collect_fpm=True)
        drv = RankDriver(core, 0, clock)
        drv.start()
        try:
            a = drv.submit(TraceRequest(1, 0.0, 64, 400, None))
            await a.queue.get()  # first token out: decode passes are running
            await asyncio.sleep(0.02)
            start = drv._pass_start_ms
            assert start > a.record.arrival_ms
            b = drv.submit(TraceRequest(2, 0.0, 64, 2, None), arrival_ms=a.record.arrival_ms)
            assert b.record.arrival_ms >= start
            drv.cancel(1)
            while not (await b.queue.get()).finished:
                pass
        finally:
            await drv.stop()

    run(go())


def test_driver_keeps_running_when_a_pass_hook_raises():
    """A failing observer (metrics / FPM / KV-event publishing) is counted and logged; the engine goes on and
    every request still finishes with all its tokens."""
    from mocker.engine import make_engine
    from mocker.live.driver import RankDriver, WallClock
    from mocker.records import TraceRequest

    calls = []

    def bad_hook(rank, outcome, finished, lag):
        calls.append(rank)
        raise RuntimeError("publisher down")

    async def go():
        clock = WallClock()
        core = make_engine(EngineConfig(speedup_ratio=100.0, num_gpu_blocks=256, block_size=16))
        drv = RankDriver(core, 0, clock, on_pass=bad_hook)
        drv.start()
        try:
            streams = [drv.submit(TraceRequest(i, 0.0, 50, 3, None)) for i in (1, 2)]
            for st in streams:
                while not (await st.queue.get()).finished:
                    pass
            assert [st.record.status for st in streams] == ["finished", "finished"]
            assert [len(st.record.token_times_ms) for st in streams] == [3, 3]
            assert drv.hook_errors == len(calls) >= 3  # one prefill pass + two decode passes at least
        finally:
            await drv.stop()

    run(go())


def test_dp_rank_field_picks_the_rank_and_bad_values_are_400():
    async def body(s, w, f):
        for bad in (2, -1, True, "1", 1.0):
            r = await s.post(
                "/v1/completions", json={"model": "mocker", "input_length": 8, "max_tokens": 2, "dp_rank": bad}
            )
            assert r.status == 400
            err = (await r.json())["error"]
            assert err["param"] == "dp_rank" and "0..1" in err["message"]
        for rank in (1, 1, 0, 1):
            r = await s.post(
                "/v1/completions", json={"model": "mocker", "input_length": 8, "max_tokens": 2, "dp_rank": rank}
            )
            assert r.status == 200
        assert [r.dp_rank for r in w.records] == [
            1,
            1,
            0,
            1,
        ]  # one at a time: the least-loaded choice would be 0 each time

    run(_with_worker(body, dp_size=2))
