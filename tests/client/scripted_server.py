"""A small scripted HTTP/1.1 server on 127.0.0.1 for client tests.

Each request is answered by a ``Script``: an optional delay before the response headers, a status,
headers, then body pieces written at given delays (byte-exact, so SSE framing edge cases can be
reproduced). The server records every request (headers and JSON body), which accepted connection
carried it, and the moment that connection ended (a clean close *or* a reset by the client), so
tests can check that a loser was cancelled. By default every response ends its connection
(``Connection: close``); a ``keep_alive`` script sends a ``Content-Length`` instead and then
serves the next request on the same connection, so tests can check connection reuse.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Self


@dataclass
class Script:
    """How to answer one request.

    Attributes:
        pieces: ``(delay_s, bytes)`` pairs: wait ``delay_s`` after the previous write, then write.
        status: HTTP status code.
        content_type: the Content-Type header; None sends none.
        header_delay_s: wait before sending the status line and headers.
        close: close the connection after the last piece (end of body); when False the server
            keeps it open until the client closes it.
        headers: extra response headers.
        keep_alive: answer with ``Content-Length`` (the pieces' total) and no ``Connection:
            close``, then wait for the client's next request on the same connection (``close``
            is ignored).
    """

    pieces: list[tuple[float, bytes]] = field(default_factory=list)
    status: int = 200
    content_type: str | None = "text/event-stream"
    header_delay_s: float = 0.0
    close: bool = True
    headers: dict[str, str] = field(default_factory=dict)
    keep_alive: bool = False


def sse(
    *chunks: dict[str, Any] | str, done: bool = True, gap_s: float = 0.0, first_delay_s: float = 0.0
) -> list[tuple[float, bytes]]:
    """Pieces for SSE ``data:`` events (dicts are JSON-encoded); ``[DONE]`` at the end if asked."""
    pieces: list[tuple[float, bytes]] = []
    for i, chunk in enumerate(chunks):
        data = chunk if isinstance(chunk, str) else json.dumps(chunk)
        pieces.append((first_delay_s if i == 0 else gap_s, f"data: {data}\n\n".encode()))
    if done:
        pieces.append((gap_s, b"data: [DONE]\n\n"))
    return pieces


def chunk(
    content: str | list[dict[str, Any]] | None = None,
    *,
    role: str | None = None,
    finish: str | None = None,
    **delta_extra: Any,
) -> dict[str, Any]:
    """An OpenAI ``chat.completion.chunk`` with one choice.

    ``content`` is the delta's text, or a list of content parts; ``delta_extra`` adds delta fields.
    """
    delta: dict[str, Any] = {}
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


def usage_chunk(prompt: int, completion: int) -> dict[str, Any]:
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
    #: the JSON body, or None when the request had none (or it was not JSON)
    body: dict[str, Any] | None
    #: monotonic time the connection carrying this request ended (client close or reset)
    disconnected_at: float | None = None
    #: index of the accepted connection that carried it (0 = the server's first connection)
    connection: int = 0
    #: monotonic time of each body piece written (``Script.pieces`` order), for cancellation tests
    writes: list[float] = field(default_factory=list)

    @property
    def json_body(self) -> dict[str, Any]:
        """The JSON body.

        Raises:
            AssertionError: the request had no JSON body (naming its path).
        """
        if self.body is None:
            raise AssertionError(f"the request to {self.path} had no JSON body")
        return self.body


class ScriptedServer:
    """Serves ``script_for(request_index, Seen) -> Script`` on 127.0.0.1 (a free port)."""

    def __init__(self, script_for: Callable[[int, Seen], Script] | Script) -> None:
        self._script_for = script_for if callable(script_for) else (lambda i, seen: script_for)
        self.requests: list[Seen] = []
        self._server: asyncio.AbstractServer | None = None
        self._handlers: set[asyncio.Task[None]] = set()
        self.port = 0
        #: connections accepted so far
        self.connections = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def __aenter__(self) -> Self:
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
        connection = self.connections
        self.connections += 1
        inbox = _Inbox(reader)
        pump = asyncio.create_task(self._pump(inbox))
        try:
            while True:
                head = await inbox.read_until(b"\r\n\r\n")
                if head is None:
                    break
                lines = head.decode("latin-1").split("\r\n")
                path = lines[0].split(" ")[1]
                headers = {}
                for line in lines[1:]:
                    if ":" in line:
                        name, value = line.split(":", 1)
                        headers[name.strip().lower()] = value.strip()
                raw = await inbox.read_exactly(int(headers.get("content-length", "0")))
                if raw is None:
                    break
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    body = None
                seen = Seen(time.monotonic(), path, headers, body, connection=connection)
                index = len(self.requests)
                self.requests.append(seen)
                inbox.requests.append(seen)
                script = self._script_for(index, seen)
                if not await self._respond(writer, inbox, seen, script):
                    break
        except ConnectionError:
            pass
        except asyncio.CancelledError:
            # Cancelled by __aexit__: end quietly (asyncio's stream callback would otherwise log
            # the cancellation as an error on Python 3.11).
            pass
        finally:
            pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):  # cancelled by __aexit__ meanwhile
                await asyncio.gather(pump, return_exceptions=True)
            self._handlers.discard(task)
            writer.close()

    async def _pump(self, inbox: _Inbox) -> None:
        """The connection's reader task (named after the server, so tests can tell it apart)."""
        await inbox.pump()

    async def _respond(self, writer: asyncio.StreamWriter, inbox: _Inbox, seen: Seen, script: Script) -> bool:
        """Answer one request; True when the connection stays open for the next one."""
        try:
            await asyncio.sleep(script.header_delay_s)
            reason = {200: "OK", 400: "Bad Request", 503: "Service Unavailable"}.get(script.status, "X")
            extra = "".join(f"{name}: {value}\r\n" for name, value in script.headers.items())
            if script.keep_alive:
                framing = f"Content-Length: {sum(len(data) for _, data in script.pieces)}\r\n"
            else:
                framing = "Connection: close\r\n"
            labelled = "" if script.content_type is None else f"Content-Type: {script.content_type}\r\n"
            status_line = f"HTTP/1.1 {script.status} {reason}\r\n"
            writer.write(f"{status_line}{labelled}Cache-Control: no-cache\r\n{framing}{extra}\r\n".encode())
            await writer.drain()
            for delay, data in script.pieces:
                await asyncio.sleep(delay)
                if seen.disconnected_at is not None:
                    break
                writer.write(data)
                await writer.drain()
                seen.writes.append(time.monotonic())
        except OSError:  # the client reset the connection while we wrote
            inbox.mark_closed()
            return False
        if script.keep_alive:
            return seen.disconnected_at is None
        if script.close:
            writer.close()
            await asyncio.sleep(0)
            # Give the pump a moment to see the end, as a client close would be seen.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(inbox.wait_closed(), 0.5)
        else:
            await inbox.wait_closed()
        return False


class _Inbox:
    """Everything the client sends on one connection, read by one pump task.

    One reader per connection: the request parser takes bytes from ``buffer`` while the pump
    notices the end of the connection at any time (a clean close *or* a reset), even in the
    middle of a response, and stamps ``disconnected_at`` on every request the connection carried.
    """

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self._reader = reader
        self.buffer = bytearray()
        self.closed_at: float | None = None
        self.requests: list[Seen] = []
        self._changed = asyncio.Event()

    async def pump(self) -> None:
        """Read until the client closes or resets the connection, then mark it closed."""
        try:
            while True:
                data = await self._reader.read(65536)
                if not data:
                    break
                self.buffer += data
                self._changed.set()
        except OSError:  # ConnectionResetError, BrokenPipeError...: a reset is a close too
            pass
        self.mark_closed()

    def mark_closed(self) -> None:
        """The connection is gone: stamp its requests (once) and wake whoever waits for bytes."""
        if self.closed_at is None:
            self.closed_at = time.monotonic()
        for seen in self.requests:
            if seen.disconnected_at is None:
                seen.disconnected_at = self.closed_at
        self._changed.set()

    async def wait_closed(self) -> None:
        """Wait until the connection is closed (by the client, a reset or the server)."""
        while self.closed_at is None:
            self._changed.clear()
            await self._changed.wait()

    async def read_until(self, separator: bytes) -> bytes | None:
        """Bytes up to and including ``separator``, or None when the connection ends first."""
        while True:
            index = self.buffer.find(separator)
            if index >= 0:
                end = index + len(separator)
                data = bytes(self.buffer[:end])
                del self.buffer[:end]
                return data
            if self.closed_at is not None:
                return None
            self._changed.clear()
            await self._changed.wait()

    async def read_exactly(self, size: int) -> bytes | None:
        """Exactly ``size`` bytes, or None when the connection ends first."""
        while len(self.buffer) < size:
            if self.closed_at is not None:
                return None
            self._changed.clear()
            await self._changed.wait()
        data = bytes(self.buffer[:size])
        del self.buffer[:size]
        return data
