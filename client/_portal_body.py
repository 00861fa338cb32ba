"""The body of a synchronous hedged response, read on the portal loop and handed over by a queue.

Behind :class:`hedgerow.client.transport.HedgingTransport`'s ``handle_request`` (``httpx.Client``,
``openai.OpenAI``): ``handle_on_portal`` runs the async answer on the portal loop
(:mod:`hedgerow.client._portal`) and makes its body a ``PortalBody``, whose reading task on the
portal puts each piece into a thread-safe queue that the calling thread reads.
"""

from __future__ import annotations

import asyncio
import queue
from collections.abc import Iterator
from dataclasses import dataclass

import httpx

from hedgerow.client._attempt_io import wait_tasks_shielded
from hedgerow.client._portal import PORTAL

__all__ = ["PortalBody", "handle_on_portal"]


async def handle_on_portal(transport: httpx.AsyncBaseTransport, request: httpx.Request) -> httpx.Response:
    """On the portal loop: the async answer to ``request``, its body made a ``PortalBody`` whose
    reading task starts at once (the first pieces are queued before the calling thread asks)."""
    response = await transport.handle_async_request(request)
    if isinstance(response.stream, httpx.AsyncByteStream):
        body = PortalBody(response.stream)
        body.start()
        response.stream = body
    return response


class PortalBody(httpx.SyncByteStream):
    """A sync response body fed by a task on the portal loop that reads an async one.

    One task on the portal (``_pump``, started by ``start`` on the portal, or else by the first
    iteration) reads the async body to its end and puts each piece into a thread-safe queue; the
    iterating thread takes the pieces from the queue. So a streamed answer costs no hop to the
    portal per chunk (a round trip per chunk doubled the sync SDK's CPU per chunk). An error of
    the body is raised in the iterating thread, after the pieces before it.

    ``close`` runs on the portal: it cancels the task if it still runs (which ends the hedged
    call: every attempt closed, the record ``cancelled``), waits for it to end, then closes the
    async body.
    """

    def __init__(self, inner: httpx.AsyncByteStream) -> None:
        self._inner = inner
        self._pieces: queue.SimpleQueue[bytes | _BodyEnd] = queue.SimpleQueue()
        self._iterated = False
        self._task: asyncio.Task[None] | None = None  # the pump; touched on the portal thread only

    def start(self) -> None:
        """On the portal loop: start the pump, once (a closed body is not read)."""
        if self._task is None:
            self._task = asyncio.ensure_future(self._pump())

    async def _pump(self) -> None:
        put = self._pieces.put
        try:
            async for piece in self._inner:
                put(piece)
        except BaseException as exc:  # handed to the reading thread (a cancellation included)
            put(_BodyEnd(exc))
            if not isinstance(exc, Exception):
                raise
        else:
            put(_BodyEnd(None))

    def __iter__(self) -> Iterator[bytes]:
        if self._iterated:
            raise RuntimeError("a hedged sync response body can be read only once")
        self._iterated = True
        if self._task is None:
            # Not started on the portal (``handle_on_portal`` starts it before handing the
            # response over, so normally it is): a wake-up of the portal here for nothing would
            # make its thread compete for the GIL with this one just as the first token arrives.
            PORTAL.loop.call_soon_threadsafe(self.start)
        get = self._pieces.get
        while True:
            piece = get()
            if isinstance(piece, _BodyEnd):
                if piece.error is not None:
                    raise piece.error
                return
            yield piece

    async def _stop(self) -> None:
        task = self._task
        self._task = asyncio.current_task()  # so that a pump not yet started never starts
        if task is not None and not task.done():
            task.cancel()
            await wait_tasks_shielded([task])
        await self._inner.aclose()

    def close(self) -> None:
        """Stop reading and close the async body on the portal (ends the hedged call, closes
        its connections); waits until that is done.

        On the portal's own thread, which cannot wait for its loop (the sync SDK's dropped stream
        is a generator in a reference cycle, whose finalizer closes the response in whichever
        thread the garbage collection runs, often the portal's), the stop is started there and
        not waited for.
        """
        if PORTAL.in_thread():
            PORTAL.start_soon(self._stop())
            return
        PORTAL.run(self._stop())


@dataclass(frozen=True, slots=True)
class _BodyEnd:
    """The end of a ``PortalBody``: ``error`` is what ended it, None for a clean end."""

    error: BaseException | None
