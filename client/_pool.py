"""httpcore's connection pool, cheaper per request: a linear bookkeeping pass, and each request
written to its socket at once.

``httpcore.AsyncConnectionPool`` runs ``_assign_requests_to_connections`` twice per request (when
it is queued and when its response is closed). In httpcore 1.0.9 that pass costs, per call:

* for every idle connection, a list over every connection (the keep-alive check), so
  O(connections²) calls once a pool holds many idle connections (after a burst of 64 concurrent
  streams a gateway's pool holds 64; the pass then took most of its CPU);
* for every idle connection, ``has_expired()``, which polls the socket (a system call);
* for every queued request, two lists over every connection.

``LinearPool`` keeps httpcore's rules and changes only the cost:

* closed connections are dropped, and connections past their keep-alive expiry time are closed,
  in one pass;
* idle connections beyond ``max_keepalive_connections`` (counting idle connections, which is
  what the limit means; httpcore 1.0.9 counts all of them) are closed, oldest first;
* the socket poll that finds an idle connection closed by the server runs for the connection
  about to be reused (always) and for every idle connection at most once per ``SWEEP_S``
  seconds, instead of for every idle connection on every pass;
* a queued request gets the first available connection for its origin (as httpcore does), else
  a new connection while under ``max_connections``, else an idle connection is closed to make
  room for a new one (as httpcore does);
* closing no connection costs nothing (httpcore enters a cancellation shield either way);
* with HTTP/2 off (every connection then serves one request at a time), an idle connection already
  given to a queued request that has not started on it yet is not given to a second one, nor
  closed as idle surplus. httpcore 1.0.9 gives it to every request that runs a pass meanwhile; all
  but the first then find it busy (``ConnectionNotAvailable``) and go round the pass again: at 16
  concurrent calls through a gateway, three extra passes per request.

Writes: httpcore writes a request's headers and its body with two socket writes, each a system
call that wakes the upstream (which reads the headers, then waits for the body). The pool's
network streams (``CoalescingStream``) hold writes back until the connection next reads (or until
``FLUSH_BYTES`` are held, or TLS starts), so a request whose body is in memory, as every request of
this package is, goes out in one write. httpcore reads the response right after writing the
request, so nothing waits on a held-back write. A write error then surfaces from that read.

The public interfaces are httpcore's (network backends and streams); the pool method replaced and
the pool's ``_network_backend`` are private to httpcore, whose version is pinned in
``pyproject.toml``. ``tests/client/test_pool.py`` checks the behaviour.
"""

from __future__ import annotations

import select
import ssl
import time
import typing
from collections.abc import Iterable
from typing import Any

import httpcore
import httpx

__all__ = ["FLUSH_BYTES", "SWEEP_S", "CoalescingBackend", "CoalescingStream", "LinearPool", "linear_pool_transport"]

#: Longest time (s) between two polls of every idle connection's socket.
SWEEP_S = 1.0
#: Held-back request bytes past which a ``CoalescingStream`` writes them without waiting for a read.
FLUSH_BYTES = 64 * 1024


class CoalescingStream(httpcore.AsyncNetworkStream):
    """A network stream whose writes are held back until the next read (module docstring).

    Args:
        inner: the stream of the network backend (anyio's, for httpx on asyncio).
    """

    __slots__ = ("_held", "_inner", "_size", "_socket", "_timeout")

    def __init__(self, inner: httpcore.AsyncNetworkStream) -> None:
        self._inner = inner
        self._held: list[bytes] = []
        self._size = 0
        self._timeout: float | None = None
        self._socket: typing.Any = inner.get_extra_info("socket")

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        """Hold ``buffer`` back (written with the next read, or now past ``FLUSH_BYTES``)."""
        if not buffer:
            return
        self._held.append(buffer)
        self._size += len(buffer)
        self._timeout = timeout
        if self._size >= FLUSH_BYTES:
            await self.flush()

    async def flush(self) -> None:
        """Write what is held back, in one write."""
        held = self._held
        if not held:
            return
        data = held[0] if len(held) == 1 else b"".join(held)
        held.clear()
        self._size = 0
        await self._inner.write(data, self._timeout)

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        """Write what is held back, then read (httpcore's errors, ``WriteError`` for the write)."""
        if self._held:
            await self.flush()
        return await self._inner.read(max_bytes, timeout)

    async def aclose(self) -> None:
        """Drop what is held back and close the inner stream."""
        self._held.clear()
        await self._inner.aclose()

    async def start_tls(
        self, ssl_context: ssl.SSLContext, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.AsyncNetworkStream:
        """Write what is held back, then start TLS; the TLS stream coalesces its writes too."""
        await self.flush()
        return CoalescingStream(await self._inner.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> typing.Any:
        """The inner stream's ``get_extra_info``; ``is_readable`` (the pool asks it of every
        connection it reuses) polls the socket found at the start, as httpcore does, without the
        backend's lookup of the socket on each call."""
        if info == "is_readable" and self._socket is not None and hasattr(select, "poll"):
            descriptor = self._socket.fileno()
            if descriptor == -1:  # closed: reading it would give the end of the stream at once
                return True
            poller = select.poll()
            poller.register(descriptor, select.POLLIN)
            return bool(poller.poll(0))
        return self._inner.get_extra_info(info)


class CoalescingBackend(httpcore.AsyncNetworkBackend):
    """A network backend whose streams are ``CoalescingStream``s over ``inner``'s."""

    def __init__(self, inner: httpcore.AsyncNetworkBackend) -> None:
        self._inner = inner

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[typing.Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        """``inner.connect_tcp``, its stream coalescing."""
        stream = await self._inner.connect_tcp(host, port, timeout, local_address, socket_options)
        return CoalescingStream(stream)

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[typing.Any] | None = None
    ) -> httpcore.AsyncNetworkStream:
        """``inner.connect_unix_socket``, its stream coalescing."""
        return CoalescingStream(await self._inner.connect_unix_socket(path, timeout, socket_options))

    async def sleep(self, seconds: float) -> None:
        """``inner.sleep``."""
        await self._inner.sleep(seconds)


class LinearPool(httpcore.AsyncConnectionPool):
    """``httpcore.AsyncConnectionPool`` whose bookkeeping pass is linear (module docstring)."""

    _swept_at: float = 0.0

    def _assign_requests_to_connections(self) -> list[httpcore.AsyncConnectionInterface]:
        closing: list[httpcore.AsyncConnectionInterface] = []
        now = time.monotonic()
        sweep = now - self._swept_at >= SWEEP_S
        if sweep:
            self._swept_at = now
        # ids of connections given to a request still in the pool (HTTP/1.1 only: one request each)
        taken: set[int] | None = None if self._http2 else set()
        queued = False
        for pool_request in self._requests:
            if pool_request.is_queued():
                queued = True
            elif taken is not None:
                taken.add(id(pool_request.connection))
        idle = self._prune(sweep, closing, taken)
        if queued:
            for pool_request in self._requests:
                if pool_request.is_queued():
                    idle = self._assign(pool_request, idle, sweep, closing, taken)
        return closing

    def _prune(
        self, sweep: bool, closing: list[httpcore.AsyncConnectionInterface], taken: set[int] | None = None
    ) -> list[httpcore.AsyncConnectionInterface]:
        """Drop closed connections, expired idle ones (on a sweep) and idle ones beyond the
        keep-alive limit (oldest first) into ``closing``; returns the idle connections kept.

        Idle connections whose ids are in ``taken`` (given to a queued request that has not
        started on them) are kept and left out of the idle list."""
        kept: list[httpcore.AsyncConnectionInterface] = []
        idle: list[httpcore.AsyncConnectionInterface] = []
        for connection in self._connections:
            if connection.is_closed():
                continue
            if connection.is_idle():
                if sweep and connection.has_expired():
                    closing.append(connection)
                    continue
                if taken is None or id(connection) not in taken:
                    idle.append(connection)
            kept.append(connection)
        surplus = len(idle) - self._max_keepalive_connections
        if surplus > 0:
            dropped = idle[:surplus]
            del idle[:surplus]
            closing.extend(dropped)
            gone = set(map(id, dropped))
            kept = [c for c in kept if id(c) not in gone]
        self._connections[:] = kept
        return idle

    def _assign(
        self,
        pool_request: Any,
        idle: list[httpcore.AsyncConnectionInterface],
        sweep: bool,
        closing: list[httpcore.AsyncConnectionInterface],
        taken: set[int] | None = None,
    ) -> list[httpcore.AsyncConnectionInterface]:
        """Give one queued request an available connection to its origin that ``taken`` does not
        hold, or a new one (closing an idle connection when the pool is full); the connection's id
        goes into ``taken``. Returns the idle list as it now stands."""
        origin = pool_request.request.url.origin
        chosen = None
        for connection in list(self._connections):
            if taken is not None and id(connection) in taken:
                continue
            if connection.can_handle_request(origin) and connection.is_available():
                if connection.is_idle() and not sweep and connection.has_expired():
                    self._connections.remove(connection)
                    closing.append(connection)
                    if connection in idle:
                        idle.remove(connection)
                    continue
                chosen = connection
                break
        if chosen is None:
            if len(self._connections) >= self._max_connections:
                idle = [c for c in idle if c in self._connections and c.is_idle()]
                if not idle:
                    return idle
                victim = idle.pop(0)
                self._connections.remove(victim)
                closing.append(victim)
            chosen = self.create_connection(origin)
            self._connections.append(chosen)
        if taken is not None:
            taken.add(id(chosen))
        pool_request.assign_to_connection(chosen)
        return idle

    async def _close_connections(self, closing: list[httpcore.AsyncConnectionInterface]) -> None:
        # httpcore enters a cancellation shield (an anyio cancel scope) even to close nothing:
        # twice per request, for nothing nearly always
        if closing:
            await super()._close_connections(closing)


def linear_pool_transport(limits: httpx.Limits) -> httpx.AsyncHTTPTransport:
    """``httpx.AsyncHTTPTransport(limits=limits)`` whose connection pool is a ``LinearPool`` over a
    ``CoalescingBackend``.

    The pool httpx made is re-classed in place (``LinearPool`` adds no state of its own), so it
    keeps every setting httpx gave it (TLS context, limits, retries), and its network backend is
    wrapped. When httpx's pool is not exactly an ``httpcore.AsyncConnectionPool`` (another httpx
    version), the transport is returned unchanged.
    """
    transport = httpx.AsyncHTTPTransport(limits=limits)
    pool = getattr(transport, "_pool", None)
    if type(pool) is httpcore.AsyncConnectionPool and hasattr(pool, "_network_backend"):
        pool.__class__ = LinearPool
        pool._network_backend = CoalescingBackend(pool._network_backend)
    return transport
