"""``hedgerow.client._pool``: httpcore's pool with a linear bookkeeping pass and coalesced request
writes, over real HTTP on loopback (a raw asyncio server that records each read it gets)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpcore
import httpx
import pytest
from httpcore._async.connection_pool import AsyncPoolRequest

from hedgerow.client import _pool
from hedgerow.client._pool import CoalescingStream, LinearPool, linear_pool_transport

ANSWER = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok"


class KeepAliveServer:
    """Answers every request with ``ANSWER`` on a keep-alive connection; records the reads."""

    def __init__(self) -> None:
        self.reads: list[bytes] = []
        self.connections = 0
        self.writers: list[asyncio.StreamWriter] = []
        self.port = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.writers.append(writer)
        buffer = b""
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    return
                self.reads.append(data)
                buffer += data
                while b"\r\n\r\n" in buffer:
                    head, _, rest = buffer.partition(b"\r\n\r\n")
                    length = 0
                    for line in head.split(b"\r\n")[1:]:
                        name, _, value = line.partition(b":")
                        if name.strip().lower() == b"content-length":
                            length = int(value)
                    if len(rest) < length:
                        break
                    buffer = rest[length:]
                    writer.write(ANSWER)
                    await writer.drain()
        except ConnectionError:
            return
        finally:
            writer.close()


@asynccontextmanager
async def keep_alive_server() -> AsyncIterator[KeepAliveServer]:
    server = KeepAliveServer()
    listening = await asyncio.start_server(server.handle, "127.0.0.1", 0)
    server.port = listening.sockets[0].getsockname()[1]
    try:
        yield server
    finally:
        for writer in server.writers:
            writer.close()
        listening.close()
        await listening.wait_closed()


def pool_of(transport: httpx.AsyncBaseTransport) -> LinearPool:
    assert isinstance(transport, httpx.AsyncHTTPTransport)
    pool = transport._pool
    assert isinstance(pool, LinearPool)
    return pool


async def test_a_request_with_a_body_reaches_the_server_in_one_write() -> None:
    async with (
        keep_alive_server() as server,
        httpx.AsyncClient(transport=linear_pool_transport(httpx.Limits())) as http,
    ):
        body = b'{"model": "m", "stream": true}'
        response = await http.post(f"http://127.0.0.1:{server.port}/v1/chat/completions", content=body)
        assert response.status_code == 200 and response.text == "ok"
    assert len(server.reads) == 1  # headers and body in one read: one write (httpcore alone writes twice)
    assert server.reads[0].startswith(b"POST /v1/chat/completions ") and server.reads[0].endswith(body)


async def test_a_large_body_is_written_without_waiting_for_a_read() -> None:
    body = b"x" * (3 * _pool.FLUSH_BYTES)
    async with (
        keep_alive_server() as server,
        httpx.AsyncClient(transport=linear_pool_transport(httpx.Limits())) as http,
    ):
        response = await http.post(f"http://127.0.0.1:{server.port}/upload", content=body)
        assert response.status_code == 200
    assert sum(len(read) for read in server.reads) > len(body)


async def test_connections_are_reused_and_idle_ones_beyond_keepalive_are_closed() -> None:
    limits = httpx.Limits(max_connections=100, max_keepalive_connections=3)
    async with keep_alive_server() as server, httpx.AsyncClient(transport=linear_pool_transport(limits)) as http:
        url = f"http://127.0.0.1:{server.port}/x"
        for _ in range(5):  # one after another: one connection, reused
            assert (await http.get(url)).status_code == 200
        assert server.connections == 1
        responses = await asyncio.gather(*(http.get(url) for _ in range(10)))  # concurrent: more connections
        assert all(r.status_code == 200 for r in responses)
        pool = pool_of(http._transport)
        idle = [c for c in pool.connections if c.is_idle()]
        assert len(idle) <= 3
        assert (await http.get(url)).status_code == 200
        assert len(pool.connections) <= 3


async def test_a_connection_the_server_closed_is_not_reused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_pool, "SWEEP_S", 3600.0)  # only the check of the connection about to be reused
    async with (
        keep_alive_server() as server,
        httpx.AsyncClient(transport=linear_pool_transport(httpx.Limits())) as http,
    ):
        url = f"http://127.0.0.1:{server.port}/x"
        assert (await http.get(url)).status_code == 200
        pool = pool_of(http._transport)
        pool._swept_at = time.monotonic()
        for writer in server.writers:  # the server ends the idle keep-alive connection
            writer.close()
        await asyncio.sleep(0.2)
        assert (await http.get(url)).status_code == 200  # on a new connection, not a failed reuse
        assert server.connections == 2


async def test_the_pass_is_linear_in_idle_connections() -> None:
    """With many idle connections, a request costs about as much as with few (httpcore 1.0.9's
    pass grows with their square); measured by counting ``is_idle`` calls, not by a clock."""
    calls = 0
    original = httpcore.AsyncHTTPConnection.is_idle

    def counting(self: httpcore.AsyncHTTPConnection) -> bool:
        nonlocal calls
        calls += 1
        return original(self)

    limits = httpx.Limits(max_connections=200, max_keepalive_connections=200)
    async with keep_alive_server() as server, httpx.AsyncClient(transport=linear_pool_transport(limits)) as http:
        url = f"http://127.0.0.1:{server.port}/x"
        await asyncio.gather(*(http.get(url) for _ in range(64)))
        pool = pool_of(http._transport)
        connections = len(pool.connections)
        assert connections >= 16
        with pytest.MonkeyPatch.context() as patch:  # only around this one request
            patch.setattr(httpcore.AsyncHTTPConnection, "is_idle", counting)
            await http.get(url)
    assert calls <= 6 * connections  # quadratic would be connections**2 (>= 256)


async def test_an_idle_connection_given_to_a_waiting_request_is_not_given_to_another() -> None:
    """Concurrent requests over idle keep-alive connections each get a connection of their own at
    the first pass: none is handed back as busy (``ConnectionNotAvailable``) to go round again,
    counted by the pool requests whose connection was taken back."""
    taken_back = 0
    original = AsyncPoolRequest.clear_connection

    def counting(self: AsyncPoolRequest) -> None:
        nonlocal taken_back
        taken_back += 1
        original(self)

    limits = httpx.Limits(max_connections=100, max_keepalive_connections=100)
    async with keep_alive_server() as server, httpx.AsyncClient(transport=linear_pool_transport(limits)) as http:
        url = f"http://127.0.0.1:{server.port}/x"
        await asyncio.gather(*(http.get(url) for _ in range(16)))  # connections to reuse
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(AsyncPoolRequest, "clear_connection", counting)
            for _ in range(5):
                responses = await asyncio.gather(*(http.get(url) for _ in range(16)))
                assert all(r.status_code == 200 for r in responses)
        assert len(pool_of(http._transport).connections) <= 16
    assert taken_back == 0


async def test_linear_pool_transport_keeps_httpx_settings_and_wraps_the_backend() -> None:
    transport = linear_pool_transport(httpx.Limits(max_connections=7, max_keepalive_connections=2))
    pool = pool_of(transport)
    assert pool._max_connections == 7 and pool._max_keepalive_connections == 2
    assert isinstance(pool._network_backend, _pool.CoalescingBackend)
    assert issubclass(CoalescingStream, httpcore.AsyncNetworkStream)
    await transport.aclose()
