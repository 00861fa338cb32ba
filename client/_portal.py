"""One event loop in a daemon thread, for running the async client from synchronous code.

``openai.OpenAI`` (sync) calls ``HedgingTransport.handle_request`` from whatever thread the app
uses; the hedged call itself (tasks for the attempts, timers, cancellation) needs an event loop.
``PORTAL`` is that loop, one per process, started on first use: ``PORTAL.run(coro)`` runs a
coroutine there and blocks the calling thread until it ends, returning its result or raising its
exception. An interrupt of the waiting thread (``KeyboardInterrupt``) cancels the coroutine and
waits briefly (``CANCEL_WAIT_S``) for it to unwind, so its connections are closed.
``PORTAL.start_soon(coro)`` runs one there without waiting, from any thread, the portal's own
included: code that may run on the portal's thread without being of its loop (a finalizer that a
garbage collection runs there) cannot wait for that loop, which would wait for it in turn.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["CANCEL_WAIT_S", "PORTAL", "Portal"]

T = TypeVar("T")

#: How long (s) an interrupted ``run`` waits for the cancelled coroutine to finish unwinding.
CANCEL_WAIT_S = 5.0


class Portal:
    """An event loop running in a daemon thread (``hedgerow-portal``), started on first use."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._started: set[asyncio.Task[Any]] = set()  # start_soon's tasks (the loop keeps weak references)

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The portal's loop (started if needed)."""
        with self._lock:
            if self._loop is None or self._loop.is_closed():
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name="hedgerow-portal", daemon=True)
                thread.start()
                self._loop, self._thread = loop, thread
            return self._loop

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run ``coroutine`` on the portal's loop and return its result (blocking this thread).

        Raises:
            RuntimeError: when called from the portal's own thread (it would wait for itself).
            BaseException: whatever the coroutine raised.
        """
        if threading.current_thread() is self._thread:
            coroutine.close()
            raise RuntimeError("Portal.run: called from the portal's own thread")
        future = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        try:
            return future.result()
        except BaseException:
            if not future.done():
                future.cancel()
                with contextlib.suppress(BaseException):  # a second interrupt included
                    concurrent.futures.wait([future], timeout=CANCEL_WAIT_S)
            raise

    def in_thread(self) -> bool:
        """True when called from the portal's own thread (where ``run`` raises)."""
        return threading.current_thread() is self._thread

    def start_soon(self, coroutine: Coroutine[Any, Any, Any]) -> None:
        """Run ``coroutine`` on the portal's loop as a task, without waiting for it.

        Callable from any thread, the portal's own included (a finalizer run there by a garbage
        collection), where ``run`` cannot wait. The task is kept until it ends; an exception of
        it is logged by asyncio, nobody being there to receive it.
        """
        if self.in_thread():
            # The running loop, not ``self.loop``: a finalizer run here may have interrupted this
            # thread inside ``self.loop``, whose lock is held then.
            self._keep(asyncio.get_running_loop().create_task(coroutine))
            return
        loop = self.loop
        loop.call_soon_threadsafe(lambda: self._keep(loop.create_task(coroutine)))

    def _keep(self, task: asyncio.Task[Any]) -> None:
        self._started.add(task)
        task.add_done_callback(self._started.discard)

    def stop(self) -> None:
        """Stop the loop and its thread, then close the loop (at exit; a later ``run`` starts a
        new one). Tasks still on the loop are cancelled and given ``CANCEL_WAIT_S`` to unwind;
        a loop whose thread does not end in that time is left open rather than closed under it.
        """
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or loop.is_closed():
            return
        if loop.is_running():
            with contextlib.suppress(BaseException):
                asyncio.run_coroutine_threadsafe(_wind_down(), loop).result(timeout=CANCEL_WAIT_S)
            loop.call_soon_threadsafe(loop.stop)
        if thread is not None:
            thread.join(timeout=CANCEL_WAIT_S)
            if thread.is_alive():
                return
        loop.close()


async def _wind_down() -> None:
    """On the portal's loop: cancel its other tasks, wait for them, and close async generators."""
    loop = asyncio.get_running_loop()
    others = [t for t in asyncio.all_tasks(loop) if t is not asyncio.current_task()]
    for task in others:
        task.cancel()
    if others:
        await asyncio.wait(others, timeout=CANCEL_WAIT_S)
    await loop.shutdown_asyncgens()


PORTAL = Portal()
atexit.register(PORTAL.stop)
