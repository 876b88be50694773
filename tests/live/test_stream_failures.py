"""Mid-stream continuation ids (hand-computed) and the load generator's failure accounting against real
HTTP servers on loopback (aiohttp) that answer with an SSE error event, a truncated stream, a stop
reason or a non-2xx status."""

from __future__ import annotations

import asyncio
import hashlib
import json

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from hypothesis import given
from hypothesis import strategies as st

from dynoplan.errors import RequestError
from mocker.live.loadgen import LoadgenSettings, client_report, run_load
from mocker.live.protocol import parse_request
from mocker.live.tokenizer import continuation_hash_ids
from mocker.records import TraceRequest


def _chain(parent: int, words: list[int]) -> int:
    h = hashlib.blake2b(parent.to_bytes(8, "little"), digest_size=8)
    h.update(b"".join(w.to_bytes(4, "little") for w in words))
    return int.from_bytes(h.digest(), "little") & 0x7FFFFFFFFFFFFFFF


def test_continuation_keeps_full_prompt_blocks_and_hashes_the_rest_by_hand():
    # prompt 40 tokens in blocks of 16: blocks 0, 1 full (ids 7, 8), block 2 partial (8 prompt tokens, id 9);
    # 30 tokens produced -> 70 tokens -> 5 blocks: block 2 = 8 prompt + outputs 0..7, block 3 = outputs 8..23,
    # block 4 = outputs 24..29
    got = continuation_hash_ids((7, 8, 9), 40, 30, 16)
    m = 0x80000000
    b2 = _chain(8, [9, 0] + [m | j for j in range(0, 8)])
    b3 = _chain(b2, [m | j for j in range(8, 24)])
    b4 = _chain(b3, [m | j for j in range(24, 30)])
    assert got == (7, 8, b2, b3, b4)
    # a prompt of whole blocks keeps every id; the outputs start a new block
    assert continuation_hash_ids((7, 8), 32, 1, 16) == (7, 8, _chain(8, [m | 0]))


def test_the_issue_case_is_a_valid_request_for_the_next_worker():
    # prompt 12000 tokens = 750 ids of 16, 192 tokens produced, 8 left; the original ids were refused
    ids = tuple(range(750))
    body = {"model": "mocker", "input_length": 12192, "max_tokens": 8, "hash_ids": list(ids)}
    with pytest.raises(RequestError, match="fewer than the prompt's 12192"):
        parse_request(body, "completion", served_model="mocker", max_model_len=1 << 20, block_tokens=16)
    body["hash_ids"] = list(continuation_hash_ids(ids, 12000, 192, 16))
    p = parse_request(body, "completion", served_model="mocker", max_model_len=1 << 20, block_tokens=16)
    assert len(p.hash_ids) == 762 and p.hash_ids[:750] == ids  # 12192 / 16 = 762 blocks


@given(isl=st.integers(1, 3000), produced=st.integers(0, 3000), bs=st.integers(1, 64), extra=st.integers(0, 3))
def test_continuation_ids_cover_exactly_the_extended_prompt(isl, produced, bs, extra):
    ids = tuple(range(100, 100 + -(-isl // bs) + extra))
    out = continuation_hash_ids(ids, isl, produced, bs)
    assert len(out) == -(-(isl + produced) // bs)
    assert out[: isl // bs] == ids[: isl // bs]
    # deterministic, and growing the output never changes an earlier block whose content is complete
    assert continuation_hash_ids(ids, isl, produced, bs) == out
    longer = continuation_hash_ids(ids, isl, produced + bs, bs)
    assert longer[: (isl + produced) // bs] == out[: (isl + produced) // bs]


def test_continuation_ids_refuse_bad_input():
    with pytest.raises(ValueError, match="fewer than the prompt's 40 tokens"):
        continuation_hash_ids((1, 2), 40, 1, 16)
    with pytest.raises(ValueError, match="block_tokens=0"):
        continuation_hash_ids((1,), 1, 1, 0)


# ------------------------------------------------------------------------------ loadgen failure accounting
def _chunk(text: str | None, finish: str | None) -> bytes:
    return (
        b"data: "
        + json.dumps({"choices": [{"index": 0, "text": text or "", "finish_reason": finish}]}).encode()
        + b"\n\n"
    )


async def _server(behaviour: dict[int, str]) -> TestServer:
    """A server whose answer depends on max_tokens: 'ok' (all tokens + length), 'stop' (2 tokens + stop),
    'error' (2 tokens then an SSE error event), 'short' (2 tokens, [DONE], no finish), 'http' (503)."""

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        n = body["max_tokens"]
        kind = behaviour[n]
        if kind == "http":
            return web.json_response(
                {"error": {"message": "no ready worker to serve the request", "code": "no_ready_worker"}}, status=503
            )
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        sent = n if kind == "ok" else 2
        for _ in range(sent):
            await resp.write(_chunk("x", None))
        if kind in ("ok", "stop"):
            await resp.write(_chunk("", "length" if kind == "ok" else "stop"))
        if kind == "error":
            await resp.write(
                b'data: {"error": {"message": "all workers failed after 2 tokens", "type": "ServiceUnavailable", '
                b'"param": null, "code": "all_workers_failed"}}\n\n'
            )
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"data": []})

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/v1/models", models)
    srv = TestServer(app)
    await srv.start_server()
    return srv


def test_loadgen_counts_error_events_truncation_and_non_2xx_as_failures_with_reasons():
    behaviour = {5: "ok", 6: "stop", 7: "error", 8: "short", 9: "http"}

    async def go():
        srv = await _server(behaviour)
        try:
            reqs = [TraceRequest(i, 0.0, 10, n) for i, n in enumerate(behaviour)]
            return await run_load(LoadgenSettings(url=str(srv.make_url("")).rstrip("/")), reqs)
        finally:
            await srv.close()

    rep = client_report(asyncio.run(go()))
    assert rep["completed_requests"] == 2  # all 5 tokens; 2 of 6 with finish reason stop
    assert rep["failed_requests"] == 3
    assert rep["errors"] == {"http_503": 1, "stream_error": 1, "truncated_stream": 1}
    assert rep["failures"] == [
        {
            "request_id": 2,
            "reason": "stream_error",
            "tokens": 2,
            "expected_tokens": 7,
            "message": "all_workers_failed: all workers failed after 2 tokens (after 2 of 7 tokens)",
        },
        {
            "request_id": 3,
            "reason": "truncated_stream",
            "tokens": 2,
            "expected_tokens": 8,
            "message": "the stream ended after 2 of 8 tokens with finish reason None",
        },
        {
            "request_id": 4,
            "reason": "http_503",
            "tokens": 0,
            "expected_tokens": 9,
            "message": "no ready worker to serve the request",
        },
    ]
    assert rep["total_output_tokens"] == 5 + 2
