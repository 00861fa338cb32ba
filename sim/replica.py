"""A simulated OpenAI-compatible LLM replica served over real HTTP (FastAPI + uvicorn).

Endpoints:

* ``POST /v1/chat/completions``: the usual chat-completions body. ``max_completion_tokens`` (or
  ``max_tokens``) is the number of tokens generated (finish reason "length"); without either,
  ``ReplicaConfig.default_output_tokens`` are generated (finish reason "stop"); the extension
  ``hedgerow_output_tokens`` ends the answer earlier with "stop". The prompt's token count is the
  body field ``hedgerow_prompt_tokens`` when present, else about one token per 4 characters of
  the messages' text. ``stream: true`` answers Server-Sent Events of ``chat.completion.chunk``
  objects: the role chunk (``delta: {"role": "assistant", "content": ""}``) written together
  with the first token's chunk, then content chunks (``tokens_per_chunk`` tokens each, text
  ``"tok "`` per token), a chunk with ``finish_reason``, a usage chunk with ``choices: []`` when
  ``stream_options.include_usage`` is true, and ``data: [DONE]``. ``stream: false`` answers one
  ``chat.completion`` object. A bad body is HTTP 422 whose message names the field; with
  ``error_rate`` a random fraction of requests is answered 503 at once.
* ``POST /v1/responses``: the Responses API, driven by the same engine. ``input`` (a string, or a
  list of input items whose ``content`` is a string or a list of parts with ``text``) and
  ``instructions`` give the prompt's length (about one token per 4 characters, or
  ``hedgerow_prompt_tokens``); ``max_output_tokens`` is the number of tokens generated (the
  response is then ``incomplete`` with ``incomplete_details.reason`` ``max_output_tokens``),
  else ``default_output_tokens`` or ``hedgerow_output_tokens`` (``completed``). ``stream: true``
  answers the typed SSE events of OpenAI's API (``event: <type>`` and ``data: {json}``, each with
  its ``sequence_number``): ``response.created`` and ``response.in_progress`` at once,
  ``response.output_item.added`` (a ``message``) and ``response.content_part.added`` (an
  ``output_text`` part) together with the first ``response.output_text.delta``, one delta per
  chunk of tokens (text ``"tok "`` per token), then ``response.output_text.done``,
  ``response.content_part.done``, ``response.output_item.done`` and ``response.completed`` (or
  ``response.incomplete``) whose ``response.usage`` has ``input_tokens``, ``output_tokens`` and
  ``total_tokens``; no ``[DONE]``. ``stream: false`` answers the ``response`` object. Bad bodies
  and ``error_rate`` as for chat.
* ``GET /v1/models``, ``GET /healthz``, ``GET /stats`` (the engine's counters, see
  ``ReplicaEngine.stats``, plus ``name``, ``rejected``, ``perf_model`` (one line naming the
  configuration and its source) and ``perf_model_embedded`` (true when the shared Splitwise CSV
  was not found and the embedded table is in use)).
* ``PUT /slowdown`` with ``{"slowdown": F}`` (a finite number > 0): a change of conditions; every
  service time from the next scheduling step on is multiplied by ``F`` instead (the demo degrades
  or recovers a replica halfway through a run with it). Answers ``{"name", "slowdown"}``; a bad
  value is HTTP 422 naming ``slowdown``. The simulator is a loopback test tool: there is no
  authentication on this or any other endpoint.

Every response echoes the request's ``X-Request-ID`` header and names the replica in
``X-Hedgerow-Replica``. A client that disconnects aborts its request in the engine at once.
(With the installed Starlette, which runs ``StreamingResponse`` under a task group listening for
``http.disconnect`` on ASGI spec < 2.4 as uvicorn reports, the disconnect cancels the body
generator at its current ``await``; its ``finally`` aborts the engine request. Non-streaming
requests race their completion against ``receive()`` returning ``http.disconnect``.)
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import os
import random
import socket
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from hedgerow.sim.engine import EngineClosed, EngineRequest, ReplicaEngine
from hedgerow.sim.perf_model import (
    DEFAULT_HARDWARE,
    DEFAULT_MODEL,
    DEFAULT_TENSOR_PARALLEL,
    EMBEDDED_SOURCE,
    PerfModel,
    load_perf_model,
)

__all__ = ["ReplicaConfig", "ReplicaThread", "create_replica_app", "estimate_prompt_tokens", "serve_replica"]

#: Largest output length a request may ask for.
MAX_OUTPUT_TOKENS = 1_000_000
#: Characters per token when the prompt length is estimated from text (OpenAI's rule of thumb).
CHARS_PER_TOKEN = 4


@dataclass(frozen=True, slots=True)
class ReplicaConfig:
    """Settings of one simulated replica.

    Attributes:
        name: the replica's name (in logs, ``/stats`` and the ``X-Hedgerow-Replica`` header).
        time_scale: factor on every service time (0.1 = ten times faster than the GPU), > 0.
        slowdown: degradation factor on every service time (3.0 = a sick replica), > 0.
        max_batch: largest running batch, >= 1.
        tokens_per_chunk: tokens per SSE chunk after the first token, >= 1.
        error_rate: fraction of requests answered HTTP 503 at once, in [0, 1].
        stall_rate: fraction of requests that stall once mid-stream, in [0, 1].
        stall_s: wall seconds of such a stall, >= 0.
        seed: seed of the replica's random choices (errors, stalls); None = random.
        perf_model_path: the Splitwise CSV; None looks for ``../shared/data/traces/...`` and
            falls back to the embedded table.
        perf_model_name / hardware / tensor_parallel: the perf-model configuration.
        default_output_tokens: output length when the body sets no max tokens (129 = the median
            of the Azure conv trace), >= 1.

    Raises:
        ValueError: a field out of range (the message names it).
    """

    name: str = "replica"
    time_scale: float = 1.0
    slowdown: float = 1.0
    max_batch: int = 64
    tokens_per_chunk: int = 1
    error_rate: float = 0.0
    stall_rate: float = 0.0
    stall_s: float = 0.0
    seed: int | None = None
    perf_model_path: str | None = None
    perf_model_name: str = DEFAULT_MODEL
    hardware: str = DEFAULT_HARDWARE
    tensor_parallel: int = DEFAULT_TENSOR_PARALLEL
    default_output_tokens: int = 129

    def __post_init__(self) -> None:
        def finite(v: float) -> bool:
            return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)

        if not self.name or not isinstance(self.name, str):
            raise ValueError("name must be a non-empty string")
        for field in ("time_scale", "slowdown"):
            v = getattr(self, field)
            if not (finite(v) and v > 0):
                raise ValueError(f"{field} must be a finite number > 0, got {v!r}")
        for field in ("max_batch", "tokens_per_chunk", "default_output_tokens", "tensor_parallel"):
            v = getattr(self, field)
            if not (isinstance(v, int) and not isinstance(v, bool) and v >= 1):
                raise ValueError(f"{field} must be an integer >= 1, got {v!r}")
        for field in ("error_rate", "stall_rate"):
            v = getattr(self, field)
            if not (finite(v) and 0 <= v <= 1):
                raise ValueError(f"{field} must be in [0, 1], got {v!r}")
        if not (finite(self.stall_s) and self.stall_s >= 0):
            raise ValueError(f"stall_s must be a finite number >= 0, got {self.stall_s!r}")
        if self.seed is not None and not isinstance(self.seed, int):
            raise ValueError(f"seed must be an integer or None, got {self.seed!r}")

    def load_perf(self) -> PerfModel:
        """Load the perf model this config names (see ``hedgerow.sim.perf_model.load_perf_model``)."""
        return load_perf_model(
            self.perf_model_path,
            model=self.perf_model_name,
            hardware=self.hardware,
            tensor_parallel=self.tensor_parallel,
        )


_Parsed = TypeVar("_Parsed")


class _BadRequest(Exception):
    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param}: {message}")
        self.param = param


def _error(status: int, message: str, *, type_: str, param: str | None = None) -> JSONResponse:
    return JSONResponse(
        {"error": {"message": message, "type": type_, "param": param, "code": None}}, status_code=status
    )


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _message_text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict):
                raise _BadRequest(f"{where}.content[{j}]", "must be an object")
            text = part.get("text")
            if isinstance(text, str):
                parts.append(text)
        return "".join(parts)
    raise _BadRequest(f"{where}.content", "must be a string, a list of parts, or null")


def estimate_prompt_tokens(messages: list[dict[str, Any]]) -> int:
    """Estimate a prompt's token count from its messages: about one token per 4 characters.

    Args:
        messages: chat messages (``content`` a string, a list of ``{"type": "text", "text": ...}``
            parts, or null).

    Returns:
        ceil(characters / 4), at least 1.
    """
    chars = sum(len(_message_text(m.get("content"), f"messages[{i}]")) for i, m in enumerate(messages))
    return max(1, math.ceil(chars / CHARS_PER_TOKEN))


@dataclass(frozen=True, slots=True)
class _ChatRequest:
    model: str
    prompt_tokens: int
    output_tokens: int
    finish_reason: str
    stream: bool
    include_usage: bool


@dataclass(frozen=True, slots=True)
class _ResponsesRequest:
    model: str
    prompt_tokens: int
    output_tokens: int
    incomplete: bool  # max_output_tokens binds: the response ends incomplete
    stream: bool
    instructions: str | None
    max_output_tokens: int | None


def _input_text(value: Any) -> str:
    """The text of a Responses ``input``: a string, or a list of items (messages with a string or
    parts ``content``, tool outputs with an ``output`` string)."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list) or not value:
        raise _BadRequest("input", "must be a string or a non-empty list of input items")
    texts = []
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise _BadRequest(f"input[{i}]", "must be an object")
        if "content" in item:
            texts.append(_message_text(item["content"], f"input[{i}]"))
        output = item.get("output")
        if isinstance(output, str):
            texts.append(output)
    return "".join(texts)


def _model(body: Any) -> str:
    """The ``model`` of a request body (a JSON object); raises ``_BadRequest`` naming the field."""
    if not isinstance(body, dict):
        raise _BadRequest("body", "must be a JSON object")
    model = body.get("model")
    if model is None:
        raise _BadRequest("model", "is required")
    if not isinstance(model, str) or not model:
        raise _BadRequest("model", "must be a non-empty string")
    return model


def _check_output_fields(body: dict[str, Any], fields: tuple[str, ...]) -> None:
    """Each of ``fields`` present in ``body`` is a token count in [1, MAX_OUTPUT_TOKENS]."""
    for field in fields:
        v = body.get(field)
        if v is not None and not (_is_int(v) and 1 <= v <= MAX_OUTPUT_TOKENS):
            raise _BadRequest(field, f"must be an integer in [1, {MAX_OUTPUT_TOKENS}], got {v!r}")


def _stream_flag(body: dict[str, Any]) -> bool:
    """``stream`` of a body: a boolean, absent or null meaning false."""
    stream = body.get("stream", False)
    if stream is None:
        return False
    if not isinstance(stream, bool):
        raise _BadRequest("stream", f"must be a boolean, got {stream!r}")
    return stream


def _prompt_override(body: dict[str, Any]) -> int | None:
    """``hedgerow_prompt_tokens`` of a body (an integer >= 0), or None when absent."""
    prompt_tokens = body.get("hedgerow_prompt_tokens")
    if prompt_tokens is not None and not (_is_int(prompt_tokens) and prompt_tokens >= 0):
        raise _BadRequest("hedgerow_prompt_tokens", f"must be an integer >= 0, got {prompt_tokens!r}")
    return prompt_tokens


def _output_tokens(limit: int | None, wanted: int | None, default_output_tokens: int) -> tuple[int, bool]:
    """Tokens to generate, and whether the client's ``limit`` cut the answer short.

    ``wanted`` (``hedgerow_output_tokens``, else ``default_output_tokens``) is the answer's natural
    length; a ``limit`` (``max_tokens`` and the like) not above ``wanted`` ends it at the limit.
    """
    if limit is None:
        return (wanted if wanted is not None else default_output_tokens), False
    if wanted is not None and wanted < limit:
        return wanted, False
    return limit, True


def _parse_responses_body(body: Any, default_output_tokens: int) -> _ResponsesRequest:
    model = _model(body)
    if body.get("input") is None:
        raise _BadRequest("input", "is required")
    text = _input_text(body["input"])
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise _BadRequest("instructions", f"must be a string or null, got {instructions!r}")
    _check_output_fields(body, ("max_output_tokens", "hedgerow_output_tokens"))
    stream = _stream_flag(body)
    prompt_tokens = _prompt_override(body)
    if prompt_tokens is None:
        chars = len(text) + len(instructions or "")
        prompt_tokens = max(1, math.ceil(chars / CHARS_PER_TOKEN))
    limit = body.get("max_output_tokens")
    output, incomplete = _output_tokens(limit, body.get("hedgerow_output_tokens"), default_output_tokens)
    return _ResponsesRequest(model, prompt_tokens, output, incomplete, stream, instructions, limit)


def _parse_body(body: Any, default_output_tokens: int) -> _ChatRequest:
    model = _model(body)
    messages = body.get("messages")
    if messages is None:
        raise _BadRequest("messages", "is required")
    if not isinstance(messages, list) or not messages:
        raise _BadRequest("messages", "must be a non-empty list of messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise _BadRequest(f"messages[{i}]", "must be an object")
        if not isinstance(m.get("role"), str):
            raise _BadRequest(f"messages[{i}].role", "is required and must be a string")
    _check_output_fields(body, ("max_completion_tokens", "max_tokens", "hedgerow_output_tokens"))
    n = body.get("n")
    if n is not None and n != 1:
        raise _BadRequest("n", f"only n=1 is supported, got {n!r}")
    stream = _stream_flag(body)
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise _BadRequest("stream_options", "must be an object or null")
    include_usage = (options or {}).get("include_usage", False)
    if not isinstance(include_usage, bool):
        raise _BadRequest("stream_options.include_usage", f"must be a boolean, got {include_usage!r}")
    override = _prompt_override(body)
    estimated = estimate_prompt_tokens(messages)  # validates the message contents either way
    prompt_tokens = estimated if override is None else override
    limit = body.get("max_completion_tokens")
    if limit is None:
        limit = body.get("max_tokens")
    output, cut = _output_tokens(limit, body.get("hedgerow_output_tokens"), default_output_tokens)
    return _ChatRequest(model, prompt_tokens, output, "length" if cut else "stop", stream, include_usage)


class _RequestIdMiddleware:
    """Pure ASGI middleware: echo ``X-Request-ID`` and name the replica on every response."""

    def __init__(self, app: Any, replica_name: str) -> None:
        self.app = app
        self.name = replica_name.encode()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = next((v for k, v in scope.get("headers", []) if k == b"x-request-id"), None)

        async def send_with_headers(message: Any) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                if rid is not None:
                    headers.append((b"x-request-id", rid))
                headers.append((b"x-hedgerow-replica", self.name))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)


def _event_stream(events: AsyncIterator[str]) -> StreamingResponse:
    """An SSE response streaming ``events`` (chat chunks or Responses events), unbuffered by proxies."""
    return StreamingResponse(
        events, media_type="text/event-stream", headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    )


def _sse(obj: Any) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


async def _wait_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def create_replica_app(config: ReplicaConfig, perf: PerfModel | None = None) -> FastAPI:
    """Build the ASGI app of one simulated replica.

    Args:
        config: the replica's settings.
        perf: a loaded perf model; None loads the one ``config`` names.

    Returns:
        A FastAPI app; its lifespan starts and stops the ``ReplicaEngine`` (``app.state.engine``).

    Raises:
        PerfModelError: the perf model cannot be loaded.
    """
    perf = perf if perf is not None else config.load_perf()
    rng = random.Random(config.seed)
    counters = {"rejected": 0, "requests": 0, "invalid": 0}

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine = ReplicaEngine(
            perf,
            max_batch=config.max_batch,
            time_scale=config.time_scale,
            slowdown=config.slowdown,
            tokens_per_chunk=config.tokens_per_chunk,
            stall_rate=config.stall_rate,
            stall_s=config.stall_s,
            seed=None if config.seed is None else config.seed + 1,
        )
        app.state.engine = engine
        async with engine:
            yield

    app = FastAPI(
        title=f"hedgerow replica {config.name}", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None
    )
    app.state.config = config
    app.state.perf = perf

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [{"id": perf.model, "object": "model", "created": 0, "owned_by": "hedgerow-sim"}],
        }

    @app.get("/stats")
    async def stats(request: Request) -> dict[str, Any]:
        return {
            "name": config.name,
            **counters,
            **request.app.state.engine.stats(),
            "perf_model": perf.describe(),
            "perf_model_embedded": perf.source == EMBEDDED_SOURCE,
        }

    @app.put("/slowdown")
    async def set_slowdown(request: Request) -> Any:
        try:
            body = json.loads(await request.body())
        except ValueError as exc:
            return _error(422, f"body: is not valid JSON ({exc})", type_="invalid_request_error", param="body")
        value = body.get("slowdown") if isinstance(body, dict) else None
        try:
            request.app.state.engine.set_slowdown(value)
        except ValueError as exc:
            return _error(422, str(exc), type_="invalid_request_error", param="slowdown")
        return {"name": config.name, "slowdown": request.app.state.engine.slowdown}

    async def admit(request: Request, parse: Callable[[Any, int], _Parsed]) -> _Parsed | JSONResponse:
        """The request's body parsed by ``parse``, or the error response to answer instead (bad
        JSON or a bad field: 422 naming it; a simulated overload: 503)."""
        counters["requests"] += 1
        try:
            try:
                body = json.loads(await request.body())
            except ValueError as exc:
                raise _BadRequest("body", f"is not valid JSON ({exc})") from None
            parsed = parse(body, config.default_output_tokens)
        except _BadRequest as exc:
            counters["invalid"] += 1
            return _error(422, str(exc), type_="invalid_request_error", param=exc.param)
        if config.error_rate > 0 and rng.random() < config.error_rate:
            counters["rejected"] += 1
            return _error(503, f"replica {config.name} is overloaded (simulated error)", type_="server_error")
        return parsed

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        chat = await admit(request, _parse_body)
        if isinstance(chat, JSONResponse):
            return chat
        engine: ReplicaEngine = request.app.state.engine
        rid = request.headers.get("x-request-id")
        completion_id = f"chatcmpl-{uuid.uuid4().hex[:24]}"
        created = int(time.time())
        if chat.stream:
            return _event_stream(_stream(engine, chat, rid, completion_id, created))
        return await _complete(request, engine, chat, rid, completion_id, created)

    @app.post("/v1/responses")
    async def responses(request: Request) -> Any:
        wanted = await admit(request, _parse_responses_body)
        if isinstance(wanted, JSONResponse):
            return wanted
        engine: ReplicaEngine = request.app.state.engine
        rid = request.headers.get("x-request-id")
        shape = _ResponseShape(wanted)
        if wanted.stream:
            return _event_stream(_stream_response(engine, wanted, rid, shape))
        generated = await _generate_all(request, engine, wanted.prompt_tokens, wanted.output_tokens, rid)
        if generated is None:
            return _aborted()
        return shape.response("incomplete" if wanted.incomplete else "completed", generated)

    app.add_middleware(_RequestIdMiddleware, replica_name=config.name)
    return app


async def _stream(
    engine: ReplicaEngine, chat: _ChatRequest, rid: str | None, completion_id: str, created: int
) -> AsyncIterator[str]:
    """SSE body of one streamed completion; aborts the engine request however it ends."""
    base = {"id": completion_id, "object": "chat.completion.chunk", "created": created, "model": chat.model}
    req: EngineRequest | None = None
    try:
        req = engine.submit(chat.prompt_tokens, chat.output_tokens, rid)
        first = True
        while True:
            item = await req.chunks.get()
            if isinstance(item, EngineClosed):
                return  # stream ends without [DONE]: the client sees a truncated stream
            if item.stall_before_s > 0:
                await asyncio.sleep(item.stall_before_s)
            content = {
                **base,
                "choices": [
                    {"index": 0, "delta": {"content": "tok " * item.tokens}, "logprobs": None, "finish_reason": None}
                ],
            }
            if first:
                role = {
                    **base,
                    "choices": [
                        {
                            "index": 0,
                            "delta": {"role": "assistant", "content": ""},
                            "logprobs": None,
                            "finish_reason": None,
                        }
                    ],
                }
                yield _sse(role) + _sse(content)
                first = False
            else:
                yield _sse(content)
            if item.finished:
                break
        yield _sse(
            {**base, "choices": [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": chat.finish_reason}]}
        )
        if chat.include_usage:
            yield _sse({**base, "choices": [], "usage": _usage(chat.prompt_tokens, req.generated)})
        yield "data: [DONE]\n\n"
    finally:
        if req is not None:
            engine.abort(req)


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


async def _complete(
    request: Request, engine: ReplicaEngine, chat: _ChatRequest, rid: str | None, completion_id: str, created: int
) -> Any:
    """Non-streaming completion: wait for every token, aborting if the client goes away."""
    generated = await _generate_all(request, engine, chat.prompt_tokens, chat.output_tokens, rid)
    if generated is None:
        return _aborted()
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": created,
        "model": chat.model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "tok " * generated},
                "logprobs": None,
                "finish_reason": chat.finish_reason,
            }
        ],
        "usage": _usage(chat.prompt_tokens, generated),
    }


def _aborted() -> JSONResponse:
    """The 503 of a non-streaming request whose client left or whose replica is stopping."""
    return _error(503, "request aborted (client disconnected or replica stopping)", type_="server_error")


async def _generate_all(
    request: Request, engine: ReplicaEngine, prompt_tokens: int, output_tokens: int, rid: str | None
) -> int | None:
    """Run one request through the engine to its last token, for a non-streaming answer.

    Returns:
        The tokens generated; None when the client disconnected or the engine stopped first
        (the engine request is aborted either way on return).
    """
    req = engine.submit(prompt_tokens, output_tokens, rid)

    async def collect() -> bool:
        while True:
            item = await req.chunks.get()
            if isinstance(item, EngineClosed):
                return False
            if item.finished:
                return True

    collector = asyncio.ensure_future(collect())
    watcher = asyncio.ensure_future(_wait_disconnect(request))
    try:
        await asyncio.wait({collector, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (collector, watcher):
            task.cancel()
        engine.abort(req)
    if not collector.done() or collector.cancelled() or not collector.result():
        return None
    return req.generated


class _ResponseShape:
    """The JSON objects of one Responses API answer (ids, the response object, its output item)."""

    def __init__(self, wanted: _ResponsesRequest) -> None:
        self.wanted = wanted
        self.response_id = f"resp_{uuid.uuid4().hex}"
        self.item_id = f"msg_{uuid.uuid4().hex}"
        self.created_at = int(time.time())

    def part(self, text: str) -> dict[str, Any]:
        """An ``output_text`` content part."""
        return {"type": "output_text", "annotations": [], "logprobs": [], "text": text}

    def item(self, status: str, text: str | None) -> dict[str, Any]:
        """The ``message`` output item (``content`` empty while ``text`` is None)."""
        content = [] if text is None else [self.part(text)]
        return {"id": self.item_id, "type": "message", "status": status, "content": content, "role": "assistant"}

    def response(self, status: str, generated: int | None) -> dict[str, Any]:
        """The ``response`` object: ``in_progress`` (``generated`` None: no output, no usage),
        ``completed`` or ``incomplete`` with the output message and usage."""
        wanted = self.wanted
        done = generated is not None
        usage = None
        if generated is not None:
            usage = {
                "input_tokens": wanted.prompt_tokens,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": generated,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": wanted.prompt_tokens + generated,
            }
        return {
            "id": self.response_id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "background": False,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": wanted.instructions,
            "max_output_tokens": wanted.max_output_tokens,
            "model": wanted.model,
            "output": [self.item(status, "tok " * (generated or 0))] if done else [],
            "parallel_tool_calls": True,
            "previous_response_id": None,
            "reasoning": {"effort": None, "summary": None},
            "store": False,
            "temperature": 1.0,
            "text": {"format": {"type": "text"}},
            "tool_choice": "auto",
            "tools": [],
            "top_p": 1.0,
            "truncation": "disabled",
            "usage": usage,
            "user": None,
            "metadata": {},
        }


async def _stream_response(
    engine: ReplicaEngine, wanted: _ResponsesRequest, rid: str | None, shape: _ResponseShape
) -> AsyncIterator[str]:
    """SSE body of one streamed Responses API answer; aborts the engine request however it ends."""
    sequence = itertools.count()

    def event(kind: str, **fields: Any) -> str:
        data = {"type": kind, "sequence_number": next(sequence), **fields}
        return f"event: {kind}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"

    where = {"item_id": shape.item_id, "output_index": 0, "content_index": 0}
    req: EngineRequest | None = None
    try:
        req = engine.submit(wanted.prompt_tokens, wanted.output_tokens, rid)
        in_progress = shape.response("in_progress", None)
        yield event("response.created", response=in_progress) + event("response.in_progress", response=in_progress)
        first = True
        while True:
            item = await req.chunks.get()
            if isinstance(item, EngineClosed):
                return  # the stream ends without response.completed: the client sees a truncated stream
            if item.stall_before_s > 0:
                await asyncio.sleep(item.stall_before_s)
            opened = ""
            if first:  # the message and its part open in the same write as the first delta
                opened = event("response.output_item.added", output_index=0, item=shape.item("in_progress", None))
                opened += event("response.content_part.added", **where, part=shape.part(""))
                first = False
            yield opened + event("response.output_text.delta", **where, delta="tok " * item.tokens, logprobs=[])
            if item.finished:
                break
        status = "incomplete" if wanted.incomplete else "completed"
        text = "tok " * req.generated
        yield (
            event("response.output_text.done", **where, text=text, logprobs=[])
            + event("response.content_part.done", **where, part=shape.part(text))
            + event("response.output_item.done", output_index=0, item=shape.item(status, text))
            + event(f"response.{status}", response=shape.response(status, req.generated))
        )
    finally:
        if req is not None:
            engine.abort(req)


def _uvicorn_config(app: FastAPI, host: str, port: int, graceful_s: float) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        lifespan="on",
        timeout_graceful_shutdown=graceful_s,  # type: ignore[arg-type]  # uvicorn awaits it as a float timeout
        access_log=False,
    )


def _bind(host: str, port: int) -> socket.socket:
    """Bind a listening TCP socket (so bind errors surface here as OSError, not SystemExit).

    The socket is created with ``proto=IPPROTO_TCP`` on purpose: asyncio sets ``TCP_NODELAY``
    only on accepted sockets whose ``proto`` is TCP, and without it Nagle's algorithm plus the
    client's delayed ACK hold small SSE writes back by ~40 ms.
    """
    sock = None
    try:
        family, type_, proto, _, addr = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
        )[0]
        sock = socket.socket(family, type_, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind(addr)
        sock.listen(2048)
        return sock
    except OSError as exc:
        if sock is not None:
            sock.close()
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        raise OSError(f"cannot listen on {host}:{port}: {reason}") from None


def serve_replica(config: ReplicaConfig, host: str = "127.0.0.1", port: int = 8000, *, announce: bool = True) -> None:
    """Run one replica with uvicorn until interrupted (blocking; log level warning).

    Args:
        config: the replica's settings.
        host: interface to bind (loopback by default).
        port: TCP port; 0 picks a free one (the ready line names it).
        announce: print ``replica NAME listening on http://HOST:PORT/v1 (...)`` once ready.

    Raises:
        PerfModelError: the perf model cannot be loaded.
        OSError: the address cannot be bound (the message names it).
    """
    app = create_replica_app(config)
    sock = _bind(host, port)
    server = uvicorn.Server(_uvicorn_config(app, host, port, 2.0))

    async def main() -> None:
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started and not task.done():
            await asyncio.sleep(0.02)
        if server.started and announce:
            print(
                f"replica {config.name} listening on http://{host}:{sock.getsockname()[1]}/v1 "
                f"({app.state.perf.describe()})",
                flush=True,
            )
        await task

    try:
        asyncio.run(main())
    finally:
        sock.close()


class ReplicaThread:
    """Run one replica's uvicorn server in a background thread (for tests and in-process demos).

    Args:
        config: the replica's settings.
        host: interface to bind.
        port: TCP port; 0 picks a free one.
        perf: a loaded perf model to share between replicas (None loads it from ``config``).

    Use ``with ReplicaThread(cfg) as rep: httpx.get(rep.base_url + "/models")``; ``base_url``
    ends in ``/v1``; ``url`` is the server root.

    Raises:
        RuntimeError: the server did not start within ``start_timeout_s`` (from ``start``).
    """

    def __init__(
        self, config: ReplicaConfig, host: str = "127.0.0.1", port: int = 0, perf: PerfModel | None = None
    ) -> None:
        self.config = config
        self.app = create_replica_app(config, perf)
        self.server = uvicorn.Server(_uvicorn_config(self.app, host, port, 1.0))
        self.host = host
        self.requested_port = port
        self.port: int | None = None
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def _run(self) -> None:
        try:
            assert self._sock is not None, "start() binds the socket before the thread runs"
            asyncio.run(self.server.serve(sockets=[self._sock]))
        except BaseException as exc:
            self._error = exc

    def start(self, start_timeout_s: float = 10.0) -> ReplicaThread:
        """Bind, start the server and wait until it listens; returns self.

        Raises:
            OSError: the address cannot be bound.
            RuntimeError: the server did not start in time.
        """
        self._sock = _bind(self.host, self.requested_port)
        self.port = int(self._sock.getsockname()[1])
        self._thread = threading.Thread(target=self._run, name=f"replica-{self.config.name}", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + start_timeout_s
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"replica {self.config.name} did not start on {self.host}: {self._error!r}")
            time.sleep(0.01)
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        """Ask the server to exit and wait for its thread (idempotent)."""
        self.server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                print(f"warning: replica {self.config.name} thread did not stop in {timeout_s}s", file=sys.stderr)
            self._thread = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    @property
    def url(self) -> str:
        """Server root, e.g. ``http://127.0.0.1:41234``."""
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        """OpenAI base URL (``.../v1``) for ``hedgerow.client.Upstream``."""
        return f"{self.url}/v1"

    def __enter__(self) -> ReplicaThread:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
