"""``TelemetryExporter``: ships call records to the api in batches, in the background.

``submit`` only appends to a bounded in-memory queue, so a call never waits on the network.
A background task takes batches of up to ``batch_limit`` records from the head of the queue and
posts them to ``POST {api_url}/v1/calls`` every ``flush_interval_s`` (sooner when a batch is
full). The batch being sent is *held* apart from the queue until the api has answered for every
one of its records, and is always sent before anything newer.

What the exporter holds: at most ``max_queue`` queued records plus the held batch (at most
``batch_size`` records). While the api cannot take records (down, overloaded, or refusing the
token) they stay there; once the queue is full, each new record pushes out the oldest queued
one, counted in ``dropped`` (reason ``queue_full``) and logged. So the exporter rides out an
outage of ``max_queue`` / (records submitted per second) seconds without a loss.

Failures and what they cost:

- The api unreachable, 5xx, 408 or 429: the held batch is posted again after an exponential
  backoff with full jitter, a uniform random wait in ``[0, min(cap, 0.5 s x 2^(n-1))]`` after the
  n-th failure in a row, reset by the first success (Brooker, "Exponential Backoff And Jitter",
  AWS Architecture Blog, 2015), so clients that failed together do not retry together. The cap is
  30 s, and 5 s while the queue is at least half full or the token is refused (records are at
  risk then, so the api is asked more often).
- 401 or 403 (a token that expired, was rotated or lacks the ``ingest`` scope): the same, and one
  warning line says so (the token itself is never logged); one more line when a post succeeds
  again. A new token given with :meth:`TelemetryExporter.set_token`, or returned by the token
  provider callable (called before each POST), is used by the next post; ``set_token`` also
  cuts the wait short.
- 413 (a batch larger than the api takes) or a connection cut off mid-upload (a server refusing a
  body over its byte limit may answer 413 and close at once, and the reset can overtake the
  answer): the batch is split in two halves, sent one after the other, and ``batch_limit`` is
  halved (down to one record). A single record refused alone with 413 is dropped.
- 400 or 422 (a record the api refuses as invalid): the batch is bisected. When the 422 names the
  bad record (``detail.index``) that record is dropped and the rest is split in two halves; else
  the batch is split in two halves; each half is posted again and split the same way if it is
  refused. A single record refused alone is dropped. One bad record among ``n`` costs 3 posts when
  the api names it, at most about ``2 log2 n`` when it does not, and a batch whose every record is
  refused (a client clock far ahead) uploads each record about ``log2 n`` times, not ``n / 2``.
  Refused records are counted in ``rejected`` (reason ``refused``).
- Any other 4xx (the URL is wrong: 404, 405): the batch is dropped and counted in ``rejected``.

``batch_limit`` grows back after it was cut: after 4 batches in a row posted whole at the
current limit it doubles, up to ``batch_size``, but for 5 minutes after a 413 at a size ``s`` it
only grows half way towards ``s`` (a binary search for the api's limit), so a lasting server
limit costs a few refused posts, not one in every few.

``aclose()`` flushes for at most ``close_timeout_s`` (each POST included); what it could not send
is counted in ``unsent`` and logged. :attr:`TelemetryExporter.dropped_by_reason` reads every
drop counter at once.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any, TypeAlias

import httpx

from hedgerow.client.background import api_client, cancel_and_wait, check_api_url, check_seconds
from hedgerow.client.records import CallRecord

__all__ = ["TelemetryExporter", "TokenSource"]

log = logging.getLogger("hedgerow.client.telemetry")

#: A bearer token, a callable returning one (or None for no token), or None.
TokenSource: TypeAlias = str | Callable[[], str | None] | None

#: Cap and base of the exponential backoff between failed posts, seconds.
_MAX_BACKOFF_S = 30.0
_BASE_BACKOFF_S = 0.5
#: The cap while records are at risk: the queue at least half full, or the token refused.
_SHORT_BACKOFF_S = 5.0
#: Batches in a row posted whole at ``batch_limit`` before it doubles.
_GROW_AFTER = 4
#: How long a 413 at a size keeps ``batch_limit`` below that size, seconds.
_TOO_LARGE_MEMORY_S = 300.0
#: Statuses that mean "this token is not accepted" (missing, expired, rotated, lacking a scope).
_AUTH_STATUSES = (401, 403)


class _TokenUnavailable(Exception):
    """The token provider raised or returned something that is not a token."""


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


def _is_token(value: object) -> bool:
    """True for a non-empty string of visible ASCII characters (what a bearer header can carry)."""
    return isinstance(value, str) and bool(value) and all(33 <= ord(c) <= 126 for c in value)


def _check_token(token: object) -> TokenSource:
    """Return ``token`` when it is a usable :data:`TokenSource`.

    Raises:
        ValueError: naming ``token`` (never showing it) otherwise.
    """
    if token is None or callable(token) or _is_token(token):
        return token  # type: ignore[return-value]  # narrowed by the checks above
    shown = f"a string of {len(token)} character(s)" if isinstance(token, str) else type(token).__name__
    raise ValueError(
        "token: must be a non-empty string of visible ASCII characters (no spaces), a callable "
        f"returning one or None, or None; got {shown}"
    )


def _rejected_index(response: httpx.Response, batch_len: int) -> int | None:
    """The index of the one record a 422 names (``{"detail": {"index": i, ...}}``), else None."""
    if response.status_code != 422:
        return None
    try:
        index = response.json()["detail"]["index"]
    except (ValueError, KeyError, TypeError):
        return None
    return index if isinstance(index, int) and not isinstance(index, bool) and 0 <= index < batch_len else None


def _halves(records: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """``records`` in two halves (the first the smaller), one part for one record, none for none."""
    if len(records) <= 1:
        return [records] if records else []
    middle = len(records) // 2
    return [records[:middle], records[middle:]]


class TelemetryExporter:
    """Batches ``CallRecord``s to the api (see the module docstring for every failure's handling).

    Args:
        api_url: the api's root URL.
        token: bearer token with the ``ingest`` scope, if the api needs one; or a callable
            returning the current token (or None), called before each POST on the exporter's
            event loop, so it must be quick (e.g. read a variable the app refreshes). Replace it
            later with :meth:`set_token`.
        batch_size: records per POST (1..1000, default 200).
        flush_interval_s: largest delay before queued records are sent (default 2 s).
        max_queue: records queued while the api cannot take them (>= ``batch_size``, default
            10,000); the batch being sent is held on top of these.
        timeout_s: timeout of one POST (default 10 s).
        close_timeout_s: longest flush at ``aclose()`` / the end of ``async with`` (default 5 s).
        transport: optional httpx transport.

    Attributes:
        sent, duplicates: records the api accepted, and of those, reported as already stored.
        dropped: records pushed out of a full queue (oldest first).
        rejected: records the api refused as invalid (or with a 4xx that no retry can cure).
        unsent: records still held when the exporter closed.
        batch_limit: records per POST now (``batch_size``, halved by a 413 or an upload cut off,
            grown back after batches posted whole).
        last_error: the last failure, for logs and tests (never the token).

    Raises:
        ValueError: for out-of-range arguments, naming the argument.
    """

    def __init__(
        self,
        api_url: str,
        token: TokenSource = None,
        batch_size: int = 200,
        flush_interval_s: float = 2.0,
        max_queue: int = 10_000,
        *,
        timeout_s: float = 10.0,
        close_timeout_s: float = 5.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.api_url = check_api_url(api_url)
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or not 1 <= batch_size <= 1000:
            raise ValueError(f"batch_size: must be an integer in 1..1000, got {batch_size!r}")
        if isinstance(max_queue, bool) or not isinstance(max_queue, int) or max_queue < batch_size:
            raise ValueError(f"max_queue: must be an integer >= batch_size, got {max_queue!r}")
        self._token = _check_token(token)
        self.batch_size = batch_size
        self.batch_limit = batch_size
        self.close_timeout_s = check_seconds("close_timeout_s", close_timeout_s)
        self.flush_interval_s = check_seconds("flush_interval_s", flush_interval_s)
        self.max_queue = max_queue
        # No default Authorization header: each POST carries the token of that moment.
        self._http = api_client(None, check_seconds("timeout_s", timeout_s), transport)
        self._queue: collections.deque[dict[str, Any]] = collections.deque()
        # The batch taken from the queue, or its parts once split, in sending order.
        self._held: collections.deque[list[dict[str, Any]]] = collections.deque()
        self._held_count = 0
        self._wake = asyncio.Event()
        self._retry_now = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._loop_of_task: asyncio.AbstractEventLoop | None = None
        self._submit_lock = threading.Lock()
        self._send_lock = asyncio.Lock()
        self._in_flight = 0
        self._failures = 0
        self._token_refused = False
        # batch_limit's recovery: whole posts in a row at the limit, the largest batch the api
        # took, and the smallest it refused as too large (with when).
        self._whole_posts = 0
        self._largest_taken = 0
        self._too_large: int | None = None
        self._too_large_at = 0.0
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
        """Records not yet taken by the api: queued, plus the held batch (in flight or not)."""
        return len(self._queue) + self._held_count + self._in_flight

    @property
    def dropped_by_reason(self) -> dict[str, int]:
        """Every record lost so far, by reason: ``queue_full`` (pushed out of a full queue),
        ``refused`` (refused by the api as invalid) and ``unsent`` (still held at close)."""
        return {"queue_full": self.dropped, "refused": self.rejected, "unsent": self.unsent}

    @property
    def token_refused(self) -> bool:
        """True from a 401/403 (or a token provider failing) until a post succeeds again."""
        return self._token_refused

    def set_token(self, token: TokenSource) -> None:
        """Use ``token`` (a bearer token, a callable returning one, or None) from the next POST on.

        Safe to call from any thread. When posts are waiting out a backoff (after a refused
        token, say) the next one goes out at once.

        Raises:
            ValueError: when ``token`` is not a :data:`TokenSource` (the message never shows it).
        """
        self._token = _check_token(token)
        self._set_threadsafe(self._retry_now)

    def submit(self, record: CallRecord) -> None:
        """Queue one record without blocking; drops the oldest queued record when the queue is full.

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
            self._set_threadsafe(self._wake)

    def _set_threadsafe(self, event: asyncio.Event) -> None:
        """Set ``event`` of the sender's loop from this thread, whichever it is."""
        loop = self._loop_of_task
        if loop is None or _running_loop() is loop:
            event.set()
        elif not loop.is_closed():
            loop.call_soon_threadsafe(event.set)

    async def _loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.flush_interval_s)
            self._wake.clear()
            while self._held_count or self._queue:
                if not await self._send_batch():
                    await self._backoff()
                    continue
                if not self._held_count and len(self._queue) < self.batch_limit:
                    break

    async def _backoff(self, most_s: float | None = None) -> None:
        """Wait after a failed post (full jitter; see the module docstring), or until ``set_token``.

        Args:
            most_s: a further cap on the wait, seconds.
        """
        at_risk = self._token_refused or len(self._queue) >= self.max_queue // 2
        wait_s = full_jitter_backoff_s(self._failures, cap_s=_SHORT_BACKOFF_S if at_risk else _MAX_BACKOFF_S)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._retry_now.wait(), wait_s if most_s is None else min(most_s, wait_s))
        self._retry_now.clear()

    async def _send_batch(self) -> bool:
        """Post the held batch, or a new one from the head of the queue; True unless it must be
        retried after a backoff (the api unreachable, overloaded or refusing the token).

        A new batch leaves the queue before the POST, so records submitted meanwhile (and drops
        of the oldest while the queue is full) never shift what this batch removes.
        """
        async with self._send_lock:
            ok = await self._post_batch()
            self._failures = 0 if ok else self._failures + 1
            return ok

    def _next_batch(self) -> list[dict[str, Any]]:
        """The first held part, else up to ``batch_limit`` records from the queue (maybe none)."""
        if self._held:
            batch = self._held.popleft()
            self._held_count -= len(batch)
            return batch
        count = min(self.batch_limit, len(self._queue))
        return [self._queue.popleft() for _ in range(count)]

    def _hold(self, *parts: list[dict[str, Any]]) -> None:
        """Put ``parts`` back in front of the held ones, to be sent next, in this order."""
        self._held.extendleft(reversed(parts))
        self._held_count += sum(len(part) for part in parts)

    def _authorization(self) -> dict[str, str]:
        """The Authorization header of the token of this moment (none without a token).

        Raises:
            _TokenUnavailable: the token provider raised or returned something else than a token.
        """
        source = self._token
        if callable(source):
            try:
                token = source()
            except Exception as exc:  # the app's callable: any failure means "no token now"
                raise _TokenUnavailable(f"the token provider raised {type(exc).__name__}") from exc
            if token is not None and not _is_token(token):
                raise _TokenUnavailable(f"the token provider returned {type(token).__name__}, not a token")
        else:
            token = source
        return {"Authorization": f"Bearer {token}"} if token else {}

    async def _post_batch(self) -> bool:
        """One POST of :meth:`_send_batch` (under its lock)."""
        batch = self._next_batch()
        if not batch:
            return True
        self._in_flight = len(batch)
        try:
            headers = self._authorization()
            response = await self._http.post(f"{self.api_url}/v1/calls", json={"calls": batch}, headers=headers)
        except _TokenUnavailable as exc:
            self._hold(batch)
            self._token_problem(str(exc))
            return False
        except httpx.HTTPError as exc:
            self.last_error = f"{type(exc).__name__}: {exc}"
            if len(batch) > 1 and isinstance(exc, (httpx.WriteError, httpx.ReadError, httpx.RemoteProtocolError)):
                # Cut off mid-upload: maybe a body over the server's byte limit (see the module
                # docstring). Smaller batches are harmless if that was not the cause, and grow back.
                self._shrink(len(batch), too_large=False)
                self._hold(*_halves(batch))
            else:
                self._hold(batch)
            log.warning("telemetry post failed (%s); will retry", self.last_error)
            return False
        except asyncio.CancelledError:
            # Stopped mid-post (aclose): keep the batch; a resend is idempotent by request_id.
            self._hold(batch)
            raise
        finally:
            self._in_flight = 0
        return self._settle(batch, response)

    def _settle(self, batch: list[dict[str, Any]], response: httpx.Response) -> bool:
        """Act on the api's answer to ``batch``; the return value of :meth:`_send_batch`."""
        status = response.status_code
        if status in _AUTH_STATUSES:
            self._hold(batch)
            self._token_problem(f"HTTP {status}")
            return False
        if status >= 500 or status in (408, 429):
            self.last_error = f"HTTP {status}"
            log.warning("telemetry post answered HTTP %d; will retry", status)
            self._hold(batch)
            return False
        if status == 413 and len(batch) > 1:
            self._shrink(len(batch), too_large=True)
            log.warning(
                "api refused a batch of %d record(s) as too large; sending batches of %d",
                len(batch),
                self.batch_limit,
            )
            self._hold(*_halves(batch))
            return True
        if status in (400, 413, 422):
            self._bisect(batch, response)
            return True
        if status >= 400:
            self.last_error = f"HTTP {status}: {response.text[:300]}"
            self.rejected += len(batch)
            log.error("api rejected a batch of %d record(s): %s", len(batch), self.last_error)
            return True
        try:
            body = response.json() if response.content else {}
        except ValueError:
            body = {}
        self.sent += int(body.get("accepted", len(batch)))
        self.duplicates += int(body.get("duplicates", 0))
        if self._token_refused:
            self._token_refused = False
            log.warning("telemetry: the api accepts the exporter's token again; sending the held records")
        self._taken(len(batch))
        return True

    def _bisect(self, batch: list[dict[str, Any]], response: httpx.Response) -> None:
        """A batch refused as invalid: drop the record the api names (or the only one), hold the
        rest in two halves."""
        self.last_error = f"HTTP {response.status_code}: {response.text[:300]}"
        index = 0 if len(batch) == 1 else _rejected_index(response, len(batch))
        if index is None:
            self._hold(*_halves(batch))
            return
        bad = batch[index]
        self.rejected += 1
        if self.rejected == 1 or self.rejected % 100 == 0:
            log.error(
                "api rejected record %s (%d refused so far): %s", bad.get("request_id"), self.rejected, self.last_error
            )
        self._hold(*_halves(batch[:index] + batch[index + 1 :]))

    def _token_problem(self, reason: str) -> None:
        """A post failed for its token: log it once, until a post succeeds again."""
        self.last_error = f"token refused or unavailable ({reason})"
        if not self._token_refused:
            self._token_refused = True
            log.warning(
                "telemetry: the api does not accept the exporter's bearer token (%s): records are kept "
                "(up to %d queued, the oldest dropped past that) and sent again every few seconds; "
                "give it a valid token with the ingest scope (TelemetryExporter.set_token or a token provider)",
                reason,
                self.max_queue,
            )

    def _shrink(self, size: int, *, too_large: bool) -> None:
        """A batch of ``size`` records was refused as too large (413) or cut off mid-upload: lower
        ``batch_limit`` to half of it (after a 413, not below the largest batch the api took)."""
        self._whole_posts = 0
        limit = max(1, size // 2)
        if too_large:
            now = time.monotonic()
            if self._too_large is None or now - self._too_large_at > _TOO_LARGE_MEMORY_S:
                self._too_large = size
            self._too_large = min(self._too_large, size)
            self._too_large_at = now
            if self._largest_taken >= size:
                self._largest_taken = 0  # the api's limit came down: what it took before is no guide
            limit = max(limit, self._largest_taken)
        self.batch_limit = min(self.batch_limit, limit)

    def _taken(self, size: int) -> None:
        """A batch of ``size`` records was taken: after ``_GROW_AFTER`` such batches in a row at
        ``batch_limit``, grow it (see the module docstring)."""
        self._largest_taken = max(self._largest_taken, size)
        if self._too_large is not None and time.monotonic() - self._too_large_at > _TOO_LARGE_MEMORY_S:
            self._too_large = None
        if size < self.batch_limit or self.batch_limit >= self.batch_size:
            return
        self._whole_posts += 1
        if self._whole_posts < _GROW_AFTER:
            return
        self._whole_posts = 0
        target = min(self.batch_size, 2 * self.batch_limit)
        if self._too_large is not None:
            target = min(target, (self.batch_limit + self._too_large) // 2)
        if target > self.batch_limit:
            log.info("telemetry batches grow from %d to %d record(s)", self.batch_limit, target)
            self.batch_limit = target

    async def flush(self, timeout_s: float = 30.0) -> bool:
        """Send everything queued now, for at most ``timeout_s`` seconds (a POST in flight at the
        deadline is abandoned and its batch stays held).

        Returns:
            True when nothing is left to send in time.
        """
        try:
            async with asyncio.timeout(timeout_s):
                while self.pending:
                    if not await self._send_batch():
                        await self._backoff(most_s=1.0)
        except TimeoutError:
            return not self.pending
        return True

    async def aclose(self, timeout_s: float | None = None) -> None:
        """Flush for at most ``timeout_s`` (default ``close_timeout_s``), stop the sender and close
        the connection pool; records still held are counted in ``unsent`` and logged."""
        await cancel_and_wait(self._task)
        self._task = None
        limit_s = self.close_timeout_s if timeout_s is None else check_seconds("timeout_s", timeout_s)
        if self.pending and not await self.flush(limit_s):
            left = len(self._queue) + self._held_count
            self.unsent += left
            log.warning(
                "telemetry closed after %.1f s with %d unsent record(s) (api: %s)", limit_s, left, self.last_error
            )
            self._queue.clear()
            self._held.clear()
            self._held_count = 0
        await self._http.aclose()
