"""OpenAI-compatible request parsing, validation and response bodies for the live mocker.

Only what a simulated engine needs is read from a request: the prompt length (from ``prompt`` /
``messages`` text via :mod:`mocker.live.tokenizer`, from a list of token ids, or from the extension field
``input_length``), the output length (``max_tokens`` / ``max_completion_tokens``), ``stream`` and
``stream_options.include_usage``. The simulated model never emits EOS, so every request generates exactly
its ``max_tokens`` tokens — the behaviour of ``ignore_eos: true`` in vLLM, accepted and implied.

Extension fields (not OpenAI, used by ``dynoplan loadgen`` to replay traces faithfully):
``input_length`` (int >= 1, the prompt length in tokens; the prompt text may then be omitted) and
``hash_ids`` (list of ints, one per ``trace_block_size`` prompt tokens, as in Mooncake traces).

Responses' ``usage`` carries ``prompt_tokens_details.cached_tokens`` (OpenAI's field for prefix-cache hits,
in tokens) next to the prompt, completion and total token counts (:func:`usage`).

Errors follow the OpenAI shape ``{"error": {"message", "type", "param", "code"}}`` with HTTP 400
(``invalid_request_error``) or 404 for an unknown model (as vLLM does).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from dynoplan.errors import RequestError
from mocker.live.tokenizer import block_hash_ids, render_chat, tokenize

Kind = Literal["completion", "chat"]

DEFAULT_MAX_TOKENS = 16
"""OpenAI's documented default of ``max_tokens`` for completions; used for chat too (documented here)."""


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    """A validated OpenAI request reduced to what the simulator needs."""

    kind: Kind
    model: str
    input_length: int
    """Prompt tokens."""
    output_length: int
    """Tokens to generate (== max_tokens; the simulated model has no EOS)."""
    stream: bool
    include_usage: bool
    hash_ids: tuple[int, ...] | None
    """Prompt block ids for prefix caching, or None (unique content)."""
    raw: dict[str, Any]
    """The original body (forwarded unchanged by the frontend)."""


def _type_name(v: object) -> str:
    return {
        dict: "object",
        list: "array",
        str: "string",
        bool: "boolean",
        type(None): "null",
        int: "integer",
        float: "number",
    }.get(type(v), type(v).__name__)


def _int_field(body: dict[str, Any], name: str, *, lo: int, hi: int | None = None) -> int | None:
    if name not in body or body[name] is None:
        return None
    v = body[name]
    if isinstance(v, bool) or not isinstance(v, int):
        raise RequestError(f"'{name}' must be an integer, got {_type_name(v)} {json.dumps(v)[:40]}", param=name)
    if v < lo:
        raise RequestError(f"'{name}' must be >= {lo}, got {v}", param=name)
    if hi is not None and v > hi:
        raise RequestError(f"'{name}' must be <= {hi}, got {v}", param=name)
    return v


def _bool_field(body: dict[str, Any], name: str) -> bool:
    v = body.get(name, False)
    if v is None:
        return False
    if not isinstance(v, bool):
        raise RequestError(f"'{name}' must be a boolean, got {_type_name(v)}", param=name)
    return v


def _number_field(body: dict[str, Any], name: str) -> None:
    v = body.get(name)
    if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
        raise RequestError(f"'{name}' must be a number, got {_type_name(v)}", param=name)


def parse_request(body: Any, kind: Kind, *, served_model: str, max_model_len: int, block_tokens: int) -> ParsedRequest:
    """Validate ``body`` (decoded JSON) of a ``/v1/completions`` or ``/v1/chat/completions`` request.

    ``max_model_len``: prompt + max_tokens must not exceed it (tokens). ``block_tokens``: tokens per
    ``hash_ids`` entry derived from text prompts (the worker's ``trace_block_size``).
    Raises :class:`RequestError` (400, or 404 for an unknown model) naming the field.
    """
    if not isinstance(body, dict):
        raise RequestError(f"request body must be a JSON object, got {_type_name(body)}")
    model = _check_model(body, served_model)
    stream, include_usage = _stream_options(body)
    input_length = _int_field(body, "input_length", lo=1)
    if kind == "completion":
        token_ids = _completion_token_ids(body, input_length)
    else:
        token_ids = _chat_token_ids(body, input_length)
    if input_length is None:
        assert token_ids is not None
        input_length = len(token_ids)
        if input_length == 0:
            raise RequestError(
                "the prompt is empty (0 tokens); expected at least 1 token",
                param="prompt" if kind == "completion" else "messages",
            )
    hash_ids = _hash_ids(body, token_ids, input_length, block_tokens)
    max_tokens = _output_length(body, kind, input_length, max_model_len)
    return ParsedRequest(
        kind=kind,
        model=model,
        input_length=input_length,
        output_length=max_tokens,
        stream=stream,
        include_usage=include_usage,
        hash_ids=hash_ids,
        raw=body,
    )


def _check_model(body: dict[str, Any], served_model: str) -> str:
    """The request's ``model`` (a required string); RequestError 404 when it is not ``served_model``
    (an empty ``served_model`` accepts any name)."""
    model = body.get("model")
    if model is None:
        raise RequestError("'model' is a required property", param="model")
    if not isinstance(model, str):
        raise RequestError(f"'model' must be a string, got {_type_name(model)}", param="model")
    if served_model and model != served_model:
        raise RequestError(
            f"The model `{model}` does not exist.",
            param="model",
            status=404,
            type_="NotFoundError",
            code="model_not_found",
        )
    return model


def _stream_options(body: dict[str, Any]) -> tuple[bool, bool]:
    """``(stream, stream_options.include_usage)`` after checking the sampling fields' types.

    ``n`` must be 1 when given; ``temperature``/``top_p``/``presence_penalty``/``frequency_penalty``
    numbers; ``stream``/``ignore_eos`` booleans; ``stream_options`` an object. RequestError otherwise.
    """
    _int_field(body, "n", lo=1, hi=1)
    for name in ("temperature", "top_p", "presence_penalty", "frequency_penalty"):
        _number_field(body, name)
    stream = _bool_field(body, "stream")
    _bool_field(body, "ignore_eos")
    so = body.get("stream_options")
    include_usage = False
    if so is not None:
        if not isinstance(so, dict):
            raise RequestError(f"'stream_options' must be an object, got {_type_name(so)}", param="stream_options")
        include_usage = _bool_field(so, "include_usage")
    return stream, include_usage


def _completion_token_ids(body: dict[str, Any], input_length: int | None) -> list[int] | None:
    """The token ids of a completion's ``prompt`` (text tokenized, or a list of ids; a one-element list
    is unwrapped); None when there is no prompt and ``input_length`` is given. RequestError for a missing
    prompt without ``input_length``, several prompts or any other shape."""
    prompt = body.get("prompt")
    if prompt is None and input_length is None:
        raise RequestError("'prompt' is a required property", param="prompt")
    if prompt is None:
        return None
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return tokenize(prompt)
    if isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in prompt):
        return list(prompt)
    if isinstance(prompt, list) and len(prompt) > 1 and all(isinstance(t, (str, list)) for t in prompt):
        raise RequestError(
            "batched prompts (a list of several prompts) are not supported; send one prompt per request",
            param="prompt",
        )
    raise RequestError(
        f"'prompt' must be a string or a list of non-negative token ids, got {_type_name(prompt)}",
        param="prompt",
    )


def _chat_token_ids(body: dict[str, Any], input_length: int | None) -> list[int] | None:
    """The token ids of a chat's rendered ``messages`` (:func:`render_chat` of ``(role, content)`` pairs);
    None when there are no messages and ``input_length`` is given. RequestError for missing messages
    without ``input_length``, an empty or non-array value, or a malformed message."""
    messages = body.get("messages")
    if messages is None and input_length is None:
        raise RequestError("'messages' is a required property", param="messages")
    if messages is None:
        return None
    if not isinstance(messages, list) or not messages:
        raise RequestError("'messages' must be a non-empty array of {role, content} objects", param="messages")
    rendered: list[tuple[str, str]] = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise RequestError(f"'messages[{i}]' must be an object with a string 'role'", param=f"messages[{i}]")
        rendered.append((m["role"], _message_text(i, m.get("content", ""))))
    return tokenize(render_chat(rendered))


def _message_text(i: int, content: Any) -> str:
    """The text of message ``i``'s ``content``: a string, None (= ""), or an array of
    ``{"type": "text", "text": string}`` parts joined; RequestError naming the part otherwise."""
    if content is None:
        content = ""
    if isinstance(content, list):
        parts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise RequestError(
                    f'\'messages[{i}].content[{j}]\' must be {{"type": "text", "text": string}}',
                    param=f"messages[{i}].content",
                )
            parts.append(part["text"])
        content = "".join(parts)
    if not isinstance(content, str):
        raise RequestError(
            f"'messages[{i}].content' must be a string or an array of text parts, got {_type_name(content)}",
            param=f"messages[{i}].content",
        )
    return content


def _hash_ids(
    body: dict[str, Any], token_ids: list[int] | None, input_length: int, block_tokens: int
) -> tuple[int, ...] | None:
    """The prompt's KV block hashes: the body's ``hash_ids`` (non-negative integers covering at least
    ``input_length`` tokens at ``block_tokens`` per id), else derived from ``token_ids`` when they are the
    whole prompt (:func:`block_hash_ids`), else None. RequestError for a bad or too short ``hash_ids``."""
    raw_h = body.get("hash_ids")
    if raw_h is None:
        if token_ids is not None and len(token_ids) == input_length:
            return block_hash_ids(token_ids, block_tokens)
        return None
    if not isinstance(raw_h, list) or not all(isinstance(h, int) and not isinstance(h, bool) and h >= 0 for h in raw_h):
        raise RequestError("'hash_ids' must be an array of non-negative integers", param="hash_ids")
    hash_ids = tuple(raw_h)
    if len(hash_ids) * block_tokens < input_length:
        raise RequestError(
            f"'hash_ids' has {len(hash_ids)} ids of {block_tokens} tokens = {len(hash_ids) * block_tokens} tokens, "
            f"fewer than the prompt's {input_length}; expected at least ceil(prompt / {block_tokens}) ids "
            f"(the server's trace block size is {block_tokens} tokens)",
            param="hash_ids",
        )
    return hash_ids


def _output_length(body: dict[str, Any], kind: Kind, input_length: int, max_model_len: int) -> int:
    """The completion's token budget: ``max_completion_tokens`` (chat, when given) or ``max_tokens``,
    default ``DEFAULT_MAX_TOKENS``. RequestError when prompt + budget exceeds ``max_model_len`` tokens or
    ``min_tokens`` exceeds the budget."""
    mt_name = (
        "max_completion_tokens" if kind == "chat" and body.get("max_completion_tokens") is not None else "max_tokens"
    )
    max_tokens = _int_field(body, mt_name, lo=1)
    if max_tokens is None:
        max_tokens = DEFAULT_MAX_TOKENS
    if input_length + max_tokens > max_model_len:
        raise RequestError(
            f"This model's maximum context length is {max_model_len} tokens. However, you requested "
            f"{input_length + max_tokens} tokens ({input_length} in the prompt, {max_tokens} for the completion). "
            f"Please reduce the prompt or '{mt_name}'.",
            param=mt_name,
        )
    min_tokens = _int_field(body, "min_tokens", lo=0)
    if min_tokens is not None and min_tokens > max_tokens:
        raise RequestError(f"'min_tokens' ({min_tokens}) must be <= '{mt_name}' ({max_tokens})", param="min_tokens")
    return max_tokens


# ---------------------------------------------------------------------------------------------- bodies
def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    """An OpenAI ``usage`` object (all counts in tokens). ``cached_tokens``: the prompt tokens served from the
    prefix cache, reported as ``prompt_tokens_details.cached_tokens`` (OpenAI's field, which vLLM fills too);
    the live frontend reads it from the worker leg that ran the prefill (:mod:`mocker.live.frontend`)."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def reported_cached_tokens(u: Any) -> int:
    """``usage.prompt_tokens_details.cached_tokens`` of a decoded ``usage`` object ``u`` (tokens); 0 when the
    field is absent, null or not a non-negative integer (a worker that does not report it has no cache hits
    as far as the frontend can tell)."""
    details = u.get("prompt_tokens_details") if isinstance(u, dict) else None
    n = details.get("cached_tokens") if isinstance(details, dict) else None
    return n if isinstance(n, int) and not isinstance(n, bool) and n >= 0 else 0


def chunk_body(
    kind: Kind, rid: str, model: str, created: int, text: str | None, finish_reason: str | None, *, first: bool = False
) -> dict[str, Any]:
    """One SSE chunk (``text_completion`` or ``chat.completion.chunk``)."""
    if kind == "completion":
        return {
            "id": rid,
            "object": "text_completion",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}],
        }
    delta: dict[str, Any] = {}
    if first:
        delta["role"] = "assistant"
    if text is not None:
        delta["content"] = text
    return {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
    }


def usage_chunk(kind: Kind, rid: str, model: str, created: int, u: dict[str, Any]) -> dict[str, Any]:
    obj = "text_completion" if kind == "completion" else "chat.completion.chunk"
    return {"id": rid, "object": obj, "created": created, "model": model, "choices": [], "usage": u}


def full_body(
    kind: Kind, rid: str, model: str, created: int, text: str, finish_reason: str, u: dict[str, Any]
) -> dict[str, Any]:
    """A non-streaming response body."""
    if kind == "completion":
        choice: dict[str, Any] = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        return {
            "id": rid,
            "object": "text_completion",
            "created": created,
            "model": model,
            "choices": [choice],
            "usage": u,
        }
    choice = {
        "index": 0,
        "message": {"role": "assistant", "content": text},
        "logprobs": None,
        "finish_reason": finish_reason,
    }
    return {"id": rid, "object": "chat.completion", "created": created, "model": model, "choices": [choice], "usage": u}


def response_id(kind: Kind, n: int) -> str:
    return f"{'cmpl' if kind == 'completion' else 'chatcmpl'}-{n:016x}"


def now_s() -> int:
    """``created`` timestamp (Unix seconds) of response bodies."""
    return int(time.time())


class _StampingRequestHandler(RequestHandler):
    """aiohttp's connection protocol, also noting when the bytes completing a request's head were read
    (``rx_monotonic``, ``time.monotonic`` seconds). aiohttp (Python < 3.12) runs the handler two event-loop
    iterations after that read (``start()`` resumes, then a new task), each behind every callback already
    ready — on a worker streaming tokens to dozens of clients, the stream writers woken by the last pass."""

    __slots__ = ("rx_monotonic",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.rx_monotonic: float | None = None

    def data_received(self, data: bytes) -> None:
        t = time.monotonic()
        queue = getattr(self, "_messages", None)  # aiohttp's parsed-request queue (absent: no stamps, no harm)
        n = len(queue) if queue is not None else 0
        super().data_received(data)
        if queue is not None and len(queue) > n:  # a request head was completed by these bytes
            self.rx_monotonic = t


class _StampingServer(web.Server):
    def __call__(self) -> RequestHandler:
        return _StampingRequestHandler(self, loop=self._loop, **self._kwargs)


class _StampingAppRunner(web.AppRunner):
    async def _make_server(self) -> web.Server:
        srv = await super()._make_server()
        srv.__class__ = _StampingServer  # same object, connection protocol swapped (Server has no __slots__)
        return srv


def request_received_monotonic(request: web.BaseRequest) -> float | None:
    """``time.monotonic()`` when the request's head was read from its socket, when served by
    :func:`serve_app` (None under another runner, e.g. aiohttp's test server). Without HTTP pipelining (no
    OpenAI client pipelines) the connection's latest head is this request's."""
    return getattr(request.protocol, "rx_monotonic", None)


async def serve_app(app: web.Application, host: str, port: int, on_bound: Callable[[int], None] | None = None) -> None:
    """Serve ``app`` on ``host:port`` (0 = any free port) until cancelled, then clean up.

    ``on_bound(port)`` is called once the socket listens, with the port actually bound. Used by the worker
    and the frontend. Requests carry their socket receive time (:func:`request_received_monotonic`).
    """
    runner = _StampingAppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()  # runs the app's on_startup (the frontend opens its client session here)
    try:  # a bind failure (port in use) must still run on_cleanup: no "Unclosed client session" noise
        site = web.TCPSite(runner, host, port, reuse_address=True)
        await site.start()
        bound = int(runner.addresses[0][1])  # (host, port, ...) of the listening socket, any event loop
        if on_bound is not None:
            on_bound(bound)
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
