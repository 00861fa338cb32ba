"""``TelemetryExporter``: ships call records to the api in batches, in the background.

``submit`` only appends to a bounded in-memory queue, so a call never waits on the network.
A background task posts batches of up to ``batch_size`` records to ``POST {api_url}/v1/calls``
every ``flush_interval_s`` (sooner when a batch is full). A failed post is retried after an
exponential backoff with full jitter: a uniform random wait in ``[0, min(30 s, 0.5 s x 2^n)]``
after the n-th failure in a row, reset by the first success (Brooker, "Exponential Backoff And
Jitter", AWS Architecture Blog, 2015), so clients that failed together do not retry together and
the queue drains as soon as the api is back; the records stay queued meanwhile. When the queue
is full the oldest record is dropped and counted in ``dropped`` (and logged), so memory stays
bounded while the api is down.

A batch the api refuses as too large (413) is split: the batch size is halved (down to one
record) and the records are sent again, so a server limit below ``batch_size`` never costs a
record; only a single record refused alone is dropped (``rejected``). A batch the api rejects
as invalid (HTTP 4xx other than 408/413/429) is dropped, counted in ``rejected`` and logged:
retrying it would never succeed. When the api names the one bad record (a 422 with
``detail.index``), only that record is dropped and the rest of the batch is sent again, so one
bad record never costs its neighbours.

``aclose()`` flushes for at most ``close_timeout_s`` (each POST included); what it could not send
is counted in ``unsent`` and logged.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import random
import threading
from typing import Any

import httpx

from hedgerow.client.background import api_client, cancel_and_wait, check_api_url, check_seconds
from hedgerow.client.records import CallRecord

__all__ = ["TelemetryExporter"]

log = logging.getLogger("hedgerow.client.telemetry")

#: Cap and base of the exponential backoff between failed posts, seconds.
_MAX_BACKOFF_S = 30.0
_BASE_BACKOFF_S = 0.5


def _running_loop() -> asyncio.AbstractEventLoop | None:
    """The running event loop of this thread, or None."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def full_jitter_backoff_s(failures: int, *, base_s: float = _BASE_BACKOFF_S, cap_s: float = _MAX_BACKOFF_S) -> float:
    """The wait after ``failures`` failures in a row: uniform in ``[0, min(cap_s, base_s x 2^(failures-1))]``.

    "Full jitter" of Brooker, "Exponential Backoff And Jitter" (AWS Architecture Blog, 2015).

    Args:
        failures: failed attempts in a row, >= 1.
        base_s: the first ceiling, seconds.
        cap_s: the largest ceiling, seconds.

    Returns:
        Seconds to wait.
    """
    ceiling_s = min(cap_s, base_s * 2.0 ** min(max(failures - 1, 0), 32))
    return random.uniform(0.0, ceiling_s)


def _rejected_index(response: httpx.Response, batch_len: int) -> int | None:
    """The index of the one record a 422 names (``{"detail": {"index": i, ...}}``), else None."""
    if response.status_code != 422:
        return None
    try:
        index = response.json()["detail"]["index"]
    except (ValueError, KeyError, TypeError):
        return None
    return index if isinstance(index, int) and 0 <= index < batch_len else None


class TelemetryExporter:
    """Batches ``CallRecord``s to the api.

    Args:
        api_url: the api's root URL.
        token: bearer token with the ``ingest`` scope, if the api needs one.
        batch_size: records per POST (1..1000, default 200).
        flush_interval_s: largest delay before queued records are sent (default 2 s).
        max_queue: records kept while the api is unreachable (default 10,000).
        timeout_s: timeout of one POST (default 10 s).
        close_timeout_s: longest flush at ``aclose()`` / the end of ``async with`` (default 5 s).
        transport: optional httpx transport.

    Attributes:
        sent, duplicates, dropped, rejected, unsent: counters of records accepted by the api,
        reported as already stored, dropped from a full queue, refused as invalid, and still
        queued when the exporter closed.
        batch_limit: records per POST now (``batch_size``, halved by each 413).

    Raises:
        ValueError: for out-of-range arguments.
    """

    def __init__(
        self,
        api_url: str,
        token: str | None = None,
        batch_size: int = 200,
        flush_interval_s: float = 2.0,
        max_queue: int = 10_000,
        *,
        timeout_s: float = 10.0,
        close_timeout_s: float = 5.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.api_url = check_api_url(api_url)
        if not isinstance(batch_size, int) or not 1 <= batch_size <= 1000:
            raise ValueError(f"batch_size: must be an integer in 1..1000, got {batch_size!r}")
        if not isinstance(max_queue, int) or max_queue < batch_size:
            raise ValueError(f"max_queue: must be an integer >= batch_size, got {max_queue!r}")
        self.batch_size = batch_size
        self.batch_limit = batch_size
        self.close_timeout_s = check_seconds("close_timeout_s", close_timeout_s)
        self.flush_interval_s = check_seconds("flush_interval_s", flush_interval_s)
        self.max_queue = max_queue
        self._http = api_client(token, check_seconds("timeout_s", timeout_s), transport)
        self._queue: collections.deque[dict[str, Any]] = collections.deque()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._loop_of_task: asyncio.AbstractEventLoop | None = None
        self._submit_lock = threading.Lock()
        self._send_lock = asyncio.Lock()
        self._in_flight = 0
        self._failures = 0
        self.sent = 0
        self.duplicates = 0
        self.dropped = 0
        self.rejected = 0
        self.unsent = 0
        self.last_error: str | None = None

    async def __aenter__(self) -> TelemetryExporter:
        self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def start(self) -> None:
        """Start the background sender (idempotent)."""
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="hedgerow-telemetry")
            self._loop_of_task = self._task.get_loop()

    @property
    def pending(self) -> int:
        """Records not yet taken by the api: queued, plus the batch being posted."""
        return len(self._queue) + self._in_flight

    def submit(self, record: CallRecord) -> None:
        """Queue one record without blocking; drops the oldest record when the queue is full.

        Safe to call from any thread (``HedgingTransport``'s sync calls submit from the portal
        thread): the sender, on its own loop, is woken through ``call_soon_threadsafe``.
        """
        with self._submit_lock:
            if len(self._queue) >= self.max_queue:
                self._queue.popleft()
                self.dropped += 1
                if self.dropped == 1 or self.dropped % 1000 == 0:
                    log.warning("telemetry queue full (%d): dropped %d record(s) so far", self.max_queue, self.dropped)
            self._queue.append(record.to_dict())
            full = len(self._queue) >= self.batch_size
        if full:
            loop = self._loop_of_task
            if loop is None or _running_loop() is loop:
                self._wake.set()
            elif not loop.is_closed():
                loop.call_soon_threadsafe(self._wake.set)

    async def _loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.flush_interval_s)
            self._wake.clear()
            while self._queue:
                if not await self._send_batch():
                    await asyncio.sleep(full_jitter_backoff_s(self._failures))
                    break
                if len(self._queue) < self.batch_limit:
                    break

    async def _send_batch(self) -> bool:
        """Post one batch from the head of the queue; True when the api took (or refused) it.

        The batch leaves the queue before the POST, so records submitted meanwhile (and drops
        of the oldest while the queue is full) never shift what this batch removes; a batch that
        must be retried goes back to the front.
        """
        async with self._send_lock:
            ok = await self._post_batch()
            self._failures = 0 if ok else self._failures + 1
            return ok

    async def _post_batch(self) -> bool:
        """One POST of :meth:`_send_batch` (under its lock)."""
        count = min(self.batch_limit, len(self._queue))
        if count == 0:
            return True
        batch = [self._queue.popleft() for _ in range(count)]
        self._in_flight = count
        try:
            response = await self._http.post(f"{self.api_url}/v1/calls", json={"calls": batch})
        except httpx.HTTPError as exc:
            self.last_error = f"{type(exc).__name__}: {exc}"
            if len(batch) > 1 and isinstance(exc, (httpx.WriteError, httpx.ReadError, httpx.RemoteProtocolError)):
                # Cut off mid-upload: a server refusing a body over its byte limit answers 413 and
                # closes at once, and the reset can overtake the answer. Smaller batches are
                # harmless if that was not the cause.
                self.batch_limit = max(1, len(batch) // 2)
            log.warning("telemetry post failed (%s); will retry", self.last_error)
            self._requeue(batch)
            return False
        except asyncio.CancelledError:
            # Stopped mid-post (aclose): keep the batch; a resend is idempotent by request_id.
            self._requeue(batch)
            raise
        finally:
            self._in_flight = 0
        status = response.status_code
        if status >= 500 or status in (408, 429):
            self.last_error = f"HTTP {status}"
            log.warning("telemetry post answered HTTP %d; will retry", status)
            self._requeue(batch)
            return False
        if status == 413 and len(batch) > 1:
            # Too large for the server: halve the batches and send these records again.
            self.batch_limit = max(1, len(batch) // 2)
            log.warning(
                "api refused a batch of %d record(s) as too large; sending batches of %d",
                len(batch),
                self.batch_limit,
            )
            self._requeue(batch)
            return True
        if status >= 400:
            self.last_error = f"HTTP {status}: {response.text[:300]}"
            index = _rejected_index(response, len(batch))
            if index is not None:
                # One bad record: drop it alone; the rest of the batch goes out next round.
                bad = batch.pop(index)
                self.rejected += 1
                log.error("api rejected record %s: %s", bad.get("request_id"), self.last_error)
                self._requeue(batch)
                return True
            self.rejected += len(batch)
            log.error("api rejected a batch of %d record(s): %s", len(batch), self.last_error)
            return True
        try:
            body = response.json() if response.content else {}
        except ValueError:
            body = {}
        self.sent += int(body.get("accepted", len(batch)))
        self.duplicates += int(body.get("duplicates", 0))
        return True

    def _requeue(self, batch: list[dict[str, Any]]) -> None:
        """Put ``batch`` back at the front; past ``max_queue`` the oldest records are dropped."""
        self._queue.extendleft(reversed(batch))
        while len(self._queue) > self.max_queue:
            self._queue.popleft()
            self.dropped += 1

    async def flush(self, timeout_s: float = 30.0) -> bool:
        """Send everything queued now, for at most ``timeout_s`` seconds (a POST in flight at the
        deadline is abandoned and its batch stays queued).

        Returns:
            True when the queue emptied in time.
        """
        try:
            async with asyncio.timeout(timeout_s):
                while self._queue or self._in_flight:
                    if not await self._send_batch():
                        await asyncio.sleep(min(1.0, full_jitter_backoff_s(self._failures)))
        except TimeoutError:
            return not (self._queue or self._in_flight)
        return True

    async def aclose(self, timeout_s: float | None = None) -> None:
        """Flush for at most ``timeout_s`` (default ``close_timeout_s``), stop the sender and close
        the connection pool; records still queued are counted in ``unsent`` and logged."""
        await cancel_and_wait(self._task)
        self._task = None
        limit_s = self.close_timeout_s if timeout_s is None else check_seconds("timeout_s", timeout_s)
        if self._queue and not await self.flush(limit_s):
            self.unsent += len(self._queue)
            log.warning(
                "telemetry closed after %.1f s with %d unsent record(s) (api: %s)",
                limit_s,
                len(self._queue),
                self.last_error,
            )
            self._queue.clear()
        await self._http.aclose()
