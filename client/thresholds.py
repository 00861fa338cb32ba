"""``ThresholdPoller``: keeps the per-(route, model) thresholds published by the api fresh.

A background task polls ``GET {api_url}/v1/thresholds`` every ``interval_s`` with
``If-None-Match`` (so an unchanged table costs a 304 and no body), and keeps the last good table
in memory. ``lookup`` is a dictionary read: it never waits on the network, so a call is never
blocked by the poller. On errors the last good table keeps being served; once it is older than
``max_stale_s`` the poller answers None and calls fall back to their policy's ``hedge_after_s``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from typing import Any

import httpx

from hedgerow.client.background import api_client, cancel_and_wait, check_api_url, check_seconds

__all__ = ["ThresholdPoller"]

log = logging.getLogger("hedgerow.client.thresholds")


class ThresholdPoller:
    """Polls the api for thresholds in the background.

    Args:
        api_url: the api's root URL (``http://127.0.0.1:8400``).
        token: bearer token with the ``ingest`` or ``read`` scope, if the api needs one.
        interval_s: seconds between polls (default 15).
        max_stale_s: after this many seconds without a successful poll, ``lookup`` returns None
            (default 300).
        timeout_s: timeout of one poll request (default 5).
        transport: optional httpx transport.

    Use as an async context manager (``async with ThresholdPoller(url) as poller``) or call
    ``start()`` / ``aclose()``. Raises ValueError for a bad interval or URL.
    """

    def __init__(
        self,
        api_url: str,
        token: str | None = None,
        interval_s: float = 15.0,
        *,
        max_stale_s: float = 300.0,
        timeout_s: float = 5.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.api_url = check_api_url(api_url)
        self.interval_s = check_seconds("interval_s", interval_s)
        self.max_stale_s = check_seconds("max_stale_s", max_stale_s)
        self._http = api_client(token, check_seconds("timeout_s", timeout_s), transport)
        self._table: dict[tuple[str, str], dict[str, Any]] = {}
        self._etag: str | None = None
        self._fetched_at: float | None = None
        self._task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()
        #: Counters: successful polls (200), unchanged polls (304), failed polls.
        self.polls_ok = 0
        self.polls_unchanged = 0
        self.polls_failed = 0
        self.last_error: str | None = None

    async def __aenter__(self) -> ThresholdPoller:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def start(self) -> None:
        """Start the background task and return at once (idempotent).

        The first table is fetched in the background; until it arrives ``lookup`` answers None
        and calls use their policy's ``hedge_after_s``, so an api that is down or never answers
        never delays an app's start-up. :meth:`wait_ready` waits for it when a caller wants to.
        """
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="hedgerow-threshold-poller")

    async def wait_ready(self, timeout_s: float) -> bool:
        """Wait at most ``timeout_s`` seconds for a first usable table; returns whether there is one."""
        try:
            async with asyncio.timeout(check_seconds("timeout_s", timeout_s)):
                await self._ready.wait()
        except TimeoutError:
            pass
        return self._ready.is_set()

    async def aclose(self) -> None:
        """Stop polling and close the connection pool."""
        await cancel_and_wait(self._task)
        self._task = None
        await self._http.aclose()

    async def _loop(self) -> None:
        while True:
            await self.refresh()
            await asyncio.sleep(self.interval_s)

    async def refresh(self) -> bool:
        """Poll once now. Returns True if the table is usable (200 or 304), False on error."""
        headers = {"If-None-Match": self._etag} if self._etag else {}
        try:
            response = await self._http.get(f"{self.api_url}/v1/thresholds", headers=headers)
            if response.status_code == 304:
                self.polls_unchanged += 1
                self._fetched_at = time.monotonic()
                self._ready.set()
                return True
            response.raise_for_status()
            table = self._parse(response.json())
        except (httpx.HTTPError, ValueError) as exc:
            self.polls_failed += 1
            self.last_error = f"{type(exc).__name__}: {exc}"
            log.warning("threshold poll failed (%s); keeping the last table", self.last_error)
            return False
        self._table = table
        self._etag = response.headers.get("ETag")
        self._fetched_at = time.monotonic()
        self.polls_ok += 1
        self._ready.set()
        return True

    @staticmethod
    def _parse(payload: Any) -> dict[tuple[str, str], dict[str, Any]]:
        if not isinstance(payload, dict) or not isinstance(payload.get("thresholds"), list):
            raise ValueError("threshold table: expected {'thresholds': [...]}")
        table: dict[tuple[str, str], dict[str, Any]] = {}
        for i, row in enumerate(payload["thresholds"]):
            try:
                key = (str(row["route"]), str(row["model"]))
                value = float(row["hedge_after_s"])
                if not math.isfinite(value) or value < 0:
                    raise ValueError("hedge_after_s out of range")
                table[key] = {
                    "hedge_after_s": value,
                    "version": row.get("version"),
                    "enabled": bool(row.get("enabled", True)),
                }
            except (KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"threshold table: row {i} is malformed ({exc})") from None
        return table

    @property
    def age_s(self) -> float | None:
        """Seconds since the last successful poll, or None if there never was one."""
        return None if self._fetched_at is None else time.monotonic() - self._fetched_at

    def lookup(self, route: str, model: str) -> tuple[float, int | None, bool] | None:
        """The threshold for (route, model): ``(hedge_after_s, version, enabled)``, or None.

        None when the route is unknown to the api or the table is older than ``max_stale_s``.
        """
        age = self.age_s
        if age is None or age > self.max_stale_s:
            return None
        row = self._table.get((route, model))
        if row is None:
            return None
        return row["hedge_after_s"], row["version"], row["enabled"]
