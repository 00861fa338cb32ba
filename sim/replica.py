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
from fastapi.responses import JSONResponse

from hedgerow.sim._replica_answers import (
    ResponseShape,
    aborted,
    complete_chat,
    error_response,
    event_stream,
    generate_all,
    stream_chat,
    stream_response,
)
from hedgerow.sim._replica_requests import (
    BadRequest,
    estimate_prompt_tokens,
    parse_chat_body,
    parse_responses_body,
)
from hedgerow.sim.engine import ReplicaEngine
from hedgerow.sim.perf_model import (
    DEFAULT_HARDWARE,
    DEFAULT_MODEL,
    DEFAULT_TENSOR_PARALLEL,
    EMBEDDED_SOURCE,
    PerfModel,
    load_perf_model,
)

__all__ = [
    "ReplicaConfig",
    "ReplicaThread",
    "create_replica_app",
    "estimate_prompt_tokens",
    "serve_replica",
]


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
            return error_response(422, f"body: is not valid JSON ({exc})", type_="invalid_request_error", param="body")
        value = body.get("slowdown") if isinstance(body, dict) else None
        try:
            request.app.state.engine.set_slowdown(value)
        except ValueError as exc:
            return error_response(422, str(exc), type_="invalid_request_error", param="slowdown")
        return {"name": config.name, "slowdown": request.app.state.engine.slowdown}

    async def admit(request: Request, parse: Callable[[Any, int], _Parsed]) -> _Parsed | JSONResponse:
        """The request's body parsed by ``parse``, or the error response to answer instead (bad
        JSON or a bad field: 422 naming it; a simulated overload: 503)."""
        counters["requests"] += 1
        try:
            try:
                body = json.loads(await request.body())
            except ValueError as exc:
                raise BadRequest("body", f"is not valid JSON ({exc})") from None
            parsed = parse(body, config.default_output_tokens)
        except BadRequest as exc:
            counters["invalid"] += 1
            return error_response(422, str(exc), type_="invalid_request_error", param=exc.param)
        if config.error_rate > 0 and rng.random() < config.error_rate:
            counters["rejected"] += 1
            return error_response(503, f"replica {config.name} is overloaded (simulated error)", type_="server_error")
        return parsed

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        chat = await admit(request, parse_chat_body)
        if isinstance(chat, JSONResponse):
            return chat
        engine: ReplicaEngine = request.app.state.engine
        rid = request.headers.get("x-request-id")
        completion_id = f"chatcmpl-{uuid.uuid4().hex[:24]}"
        created = int(time.time())
        if chat.stream:
            return event_stream(stream_chat(engine, chat, rid, completion_id, created))
        return await complete_chat(request, engine, chat, rid, completion_id, created)

    @app.post("/v1/responses")
    async def responses(request: Request) -> Any:
        wanted = await admit(request, parse_responses_body)
        if isinstance(wanted, JSONResponse):
            return wanted
        engine: ReplicaEngine = request.app.state.engine
        rid = request.headers.get("x-request-id")
        shape = ResponseShape(wanted)
        if wanted.stream:
            return event_stream(stream_response(engine, wanted, rid, shape))
        generated = await generate_all(request, engine, wanted.prompt_tokens, wanted.output_tokens, rid)
        if generated is None:
            return aborted()
        return shape.response("incomplete" if wanted.incomplete else "completed", generated)

    app.add_middleware(_RequestIdMiddleware, replica_name=config.name)
    return app


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
