"""Tokenizer, request parsing and KV mirror: pure functions, hand-computed and property checks."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dynoplan.errors import RequestError
from mocker.live.protocol import parse_request
from mocker.live.tokenizer import block_hash_ids, count_tokens, render_chat, tokenize


def test_tokenizer_pieces_by_hand():
    # "Hello, world!" -> "Hell", "o", ",", " worl", "d", "!"
    assert count_tokens("Hello, world!") == 6
    assert len(tokenize("Hello, world!")) == 6
    assert tokenize("abc") == tokenize("abc")  # stable (CRC-32), no per-process salt
    assert count_tokens("") == 0
    assert render_chat([("user", "hi")]) == "<|user|>\nhi\n<|assistant|>\n"


@given(
    st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=80),
    st.lists(st.integers(0, 2**32 - 1), max_size=40),
    st.integers(1, 16),
)
@settings(max_examples=200, deadline=None)
def test_block_ids_are_chained_prefix_ids(prefix, tail, bs):
    a = block_hash_ids(prefix + tail, bs)
    b = block_hash_ids(prefix + [t ^ 1 for t in tail], bs)
    full = len(prefix) // bs  # blocks entirely inside the common prefix
    assert a[:full] == b[:full]
    assert len(a) == -(-(len(prefix) + len(tail)) // bs)
    if tail:  # the block holding the first differing token differs, and so does every later one (chained)
        first_diff = len(prefix) // bs
        assert all(x != y for x, y in zip(a[first_diff:], b[first_diff:]))


def test_block_ids_reject_bad_block_size():
    with pytest.raises(ValueError, match="block_tokens=0"):
        block_hash_ids([1, 2], 0)


def _p(body, kind="completion", mml=1000, bt=16):
    return parse_request(body, kind, served_model="m", max_model_len=mml, block_tokens=bt)


def test_parse_lengths_and_defaults():
    p = _p({"model": "m", "prompt": "Hello, world!"})
    assert (p.input_length, p.output_length, p.stream) == (6, 16, False)  # OpenAI's default max_tokens 16
    assert p.hash_ids is not None and len(p.hash_ids) == 1
    p = _p({"model": "m", "prompt": [5, 6, 7], "max_tokens": 4, "stream": True})
    assert (p.input_length, p.output_length, p.stream) == (3, 4, True)
    p = _p(
        {
            "model": "m",
            "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
            "max_completion_tokens": 9,
        },
        "chat",
    )
    assert p.output_length == 9 and p.input_length == count_tokens(render_chat([("user", "hi")]))
    p = _p({"model": "m", "input_length": 40, "hash_ids": [1, 2, 3]})
    assert p.input_length == 40 and p.hash_ids == (1, 2, 3)


@pytest.mark.parametrize(
    "body,param",
    [
        ({"model": "m", "input_length": 40, "hash_ids": [1, 2]}, "hash_ids"),  # 2 x 16 < 40
        ({"model": "m", "input_length": 0}, "input_length"),
        ({"model": "m", "input_length": 990, "max_tokens": 11}, "max_tokens"),  # 1001 > 1000
        ({"model": "m", "prompt": "x", "min_tokens": 20, "max_tokens": 5}, "min_tokens"),
        ({"model": "m", "prompt": "x", "temperature": "hot"}, "temperature"),
        ({"model": "m", "prompt": "x", "stream_options": []}, "stream_options"),
        ({"model": "m", "prompt": ""}, "prompt"),
        ({"model": "m", "prompt": [1, -2]}, "prompt"),
        ({"model": "m", "prompt": "x", "max_tokens": True}, "max_tokens"),
    ],
)
def test_parse_errors_name_the_field(body, param):
    with pytest.raises(RequestError) as e:
        _p(body)
    assert e.value.param == param and e.value.status == 400


def test_serve_app_stamps_the_socket_read_time():
    """Under serve_app a request carries the time its head was read from the socket: after the client's
    send, no later than the handler's start; aiohttp's own test server gives None (the worker then stamps
    at handler start)."""
    import asyncio
    import time

    import aiohttp
    from aiohttp import web
    from aiohttp.test_utils import TestServer

    from mocker.live.protocol import request_received_monotonic, serve_app

    async def handler(request):
        return web.json_response({"rx": request_received_monotonic(request), "handler": time.monotonic()})

    async def go():
        app = web.Application()
        app.router.add_post("/x", handler)
        bound = asyncio.get_running_loop().create_future()
        task = asyncio.ensure_future(serve_app(app, "127.0.0.1", 0, bound.set_result))
        port = await bound
        try:
            async with aiohttp.ClientSession() as s:
                for _ in range(3):  # the second and third reuse the keep-alive connection
                    sent = time.monotonic()
                    d = await (await s.post(f"http://127.0.0.1:{port}/x", json={})).json()
                    assert d["rx"] is not None and sent <= d["rx"] <= d["handler"]
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        app2 = web.Application()
        app2.router.add_post("/x", handler)
        srv = TestServer(app2)
        await srv.start_server()
        try:
            async with aiohttp.ClientSession() as s:
                d = await (await s.post(str(srv.make_url("/x")), json={})).json()
                assert d["rx"] is None
        finally:
            await srv.close()

    asyncio.run(go())
