"""A small scripted HTTP/1.1 server on 127.0.0.1 for client tests.

Each request is answered by a ``Script``: an optional delay before the response headers, a status,
headers, then body pieces written at given delays (byte-exact, so SSE framing edge cases can be
reproduced). The server records every request (headers and JSON body) and the moment each
client connection was closed by the client, so tests can check that a loser was cancelled.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Callable


@dataclass
class Script:
    """How to answer one request.

    Attributes:
        pieces: ``(delay_s, bytes)`` pairs: wait ``delay_s`` after the previous write, then write.
        status: HTTP status code.
        content_type: the Content-Type header.
        header_delay_s: wait before sending the status line and headers.
        close: close the connection after the last piece (end of body).
        headers: extra response headers.
    """

    pieces: list[tuple[float, bytes]] = field(default_factory=list)
    status: int = 200
    content_type: str = "text/event-stream"
    header_delay_s: float = 0.0
    close: bool = True
    headers: dict[str, str] = field(default_factory=dict)


def sse(*chunks: dict | str, done: bool = True, gap_s: float = 0.0, first_delay_s: float = 0.0) -> list[tuple[float, bytes]]:
    """Pieces for SSE ``data:`` events (dicts are JSON-encoded); ``[DONE]`` at the end if asked."""
    pieces = []
    for i, chunk in enumerate(chunks):
        data = chunk if isinstance(chunk, str) else json.dumps(chunk)
        pieces.append((first_delay_s if i == 0 else gap_s, f"data: {data}\n\n".encode()))
    if done:
        pieces.append((gap_s, b"data: [DONE]\n\n"))
    return pieces


def chunk(content: str | None = None, *, role: str | None = None, finish: str | None = None, **delta_extra) -> dict:
    """An OpenAI ``chat.completion.chunk`` with one choice."""
    delta: dict = {}
    if role is not None:
        delta["role"] = role
    if content is not None:
        delta["content"] = content
    delta.update(delta_extra)
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def usage_chunk(prompt: int, completion: int) -> dict:
    """The final usage-only chunk (``choices: []``)."""
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
    }


@dataclass
class Seen:
    """One request as the server saw it."""

    at: float
    path: str
    headers: dict[str, str]
    body: dict | None
    disconnected_at: float | None = None
    #: monotonic time of each body piece written (``Script.pieces`` order), for cancellation tests
    writes: list[float] = field(default_factory=list)


class ScriptedServer:
    """Serves ``script_for(request_index, Seen) -> Script`` on 127.0.0.1 (a free port)."""

    def __init__(self, script_for: Callable[[int, Seen], Script] | Script) -> None:
        self._script_for = script_for if callable(script_for) else (lambda i, seen: script_for)
        self.requests: list[Seen] = []
        self._server: asyncio.AbstractServer | None = None
        self._handlers: set[asyncio.Task] = set()
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def __aenter__(self) -> "ScriptedServer":
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._handlers):
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        await self._server.wait_closed()

    async def wait_disconnect(self, index: int, timeout_s: float = 5.0) -> float | None:
        """Wait until request ``index``'s client closed its connection; return when (monotonic)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if len(self.requests) > index and self.requests[index].disconnected_at is not None:
                return self.requests[index].disconnected_at
            await asyncio.sleep(0.005)
        return None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            path = lines[0].split(" ")[1]
            headers = {}
            for line in lines[1:]:
                if ":" in line:
                    name, value = line.split(":", 1)
                    headers[name.strip().lower()] = value.strip()
            raw = await reader.readexactly(int(headers.get("content-length", "0")))
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                body = None
            seen = Seen(time.monotonic(), path, headers, body)
            index = len(self.requests)
            self.requests.append(seen)
            script = self._script_for(index, seen)

            async def watch_eof() -> None:
                await reader.read()  # returns b"" when the client closes
                seen.disconnected_at = time.monotonic()

            watcher = asyncio.create_task(watch_eof())
            try:
                await asyncio.sleep(script.header_delay_s)
                reason = {200: "OK", 400: "Bad Request", 503: "Service Unavailable"}.get(script.status, "X")
                extra = "".join(f"{name}: {value}\r\n" for name, value in script.headers.items())
                writer.write(
                    f"HTTP/1.1 {script.status} {reason}\r\nContent-Type: {script.content_type}\r\n"
                    f"Cache-Control: no-cache\r\nConnection: close\r\n{extra}\r\n".encode()
                )
                await writer.drain()
                for delay, data in script.pieces:
                    await asyncio.sleep(delay)
                    if seen.disconnected_at is not None:
                        break
                    writer.write(data)
                    await writer.drain()
                    seen.writes.append(time.monotonic())
                if script.close:
                    writer.close()
                    await asyncio.sleep(0)
                else:
                    await watcher
            finally:
                if not script.close:
                    watcher.cancel()
                else:
                    try:
                        await asyncio.wait_for(asyncio.shield(watcher), 0.5)
                    except (asyncio.TimeoutError, Exception):
                        watcher.cancel()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:
            # Cancelled by __aexit__: end quietly (asyncio's stream callback would otherwise log
            # the cancellation as an error on Python 3.11).
            pass
        finally:
            self._handlers.discard(task)
            writer.close()
