"""The simulated replica's answers: chat completions and Responses API objects, streamed or whole.

Each answer runs one request through the :class:`~hedgerow.sim.engine.ReplicaEngine` and aborts it
in the engine however the answer ends (finished, client gone, replica stopping). The shapes are
in :mod:`hedgerow.sim.replica`'s docstring.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from hedgerow.sim._replica_requests import ChatRequest, ResponsesRequest
from hedgerow.sim.engine import EngineClosed, EngineRequest, ReplicaEngine

__all__ = [
    "ResponseShape",
    "aborted",
    "complete_chat",
    "error_response",
    "event_stream",
    "generate_all",
    "stream_chat",
    "stream_response",
]


def error_response(status: int, message: str, *, type_: str, param: str | None = None) -> JSONResponse:
    """An OpenAI-shaped error: ``{"error": {"message", "type", "param", "code"}}`` with ``status``."""
    return JSONResponse(
        {"error": {"message": message, "type": type_, "param": param, "code": None}}, status_code=status
    )


def event_stream(events: AsyncIterator[str]) -> StreamingResponse:
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


async def stream_chat(
    engine: ReplicaEngine, chat: ChatRequest, rid: str | None, completion_id: str, created: int
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


async def complete_chat(
    request: Request, engine: ReplicaEngine, chat: ChatRequest, rid: str | None, completion_id: str, created: int
) -> Any:
    """Non-streaming completion: wait for every token, aborting if the client goes away."""
    generated = await generate_all(request, engine, chat.prompt_tokens, chat.output_tokens, rid)
    if generated is None:
        return aborted()
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


def aborted() -> JSONResponse:
    """The 503 of a non-streaming request whose client left or whose replica is stopping."""
    return error_response(503, "request aborted (client disconnected or replica stopping)", type_="server_error")


async def generate_all(
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


class ResponseShape:
    """The JSON objects of one Responses API answer (ids, the response object, its output item)."""

    def __init__(self, wanted: ResponsesRequest) -> None:
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


async def stream_response(
    engine: ReplicaEngine, wanted: ResponsesRequest, rid: str | None, shape: ResponseShape
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
