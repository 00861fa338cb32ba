"""Weekly reports rendered once and kept for a while, shared by the api and the console.

Building a week's report reads the week's calls and rollups, and its HTML form draws charts
(matplotlib): seconds of CPU each time. :class:`ReportCache` keeps each ``(week, format)``
answer for ``ttl_s`` seconds (``Settings.report_cache_ttl_s``), at most ``max_entries`` of them
(least recently used out first), and runs one build at a time: concurrent requests for the
same answer wait for the one build in progress, and builds of different answers queue behind
one another, so a burst of report requests costs at most one build per distinct answer and
never more than one build's CPU at once. A cached report is at most ``ttl_s`` old (its
``generated_at`` says when it was made); records that arrive later are in the next build.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from cachetools import TTLCache
from fastapi import Request
from fastapi.concurrency import run_in_threadpool

from hedgerow.api._state import app_state
from hedgerow.controller.report.report_render import render
from hedgerow.controller.report.report_store import weekly_report

__all__ = ["ReportCache", "cached_report"]

#: A report answer: the JSON report (format ``json``) or its rendered text.
Answer = dict[str, Any] | str


class ReportCache:
    """Report answers by key, each kept ``ttl_s`` seconds, built one at a time.

    Args:
        ttl_s: seconds an answer is served from memory, >= 0 (0: never kept).
        max_entries: most answers kept (least recently used out first), >= 1.
        clock: monotonic seconds (a fake clock in tests).
    """

    def __init__(self, ttl_s: float, max_entries: int = 16, clock: Callable[[], float] = time.monotonic) -> None:
        if not ttl_s >= 0:
            raise ValueError(f"ttl_s: must be >= 0 seconds, got {ttl_s!r}")
        if max_entries < 1:
            raise ValueError(f"max_entries: must be >= 1, got {max_entries!r}")
        self.ttl_s = float(ttl_s)
        self._answers: TTLCache[tuple[str, str], Answer] = TTLCache(maxsize=max_entries, ttl=self.ttl_s, timer=clock)
        self._building: dict[tuple[str, str], asyncio.Future[Answer]] = {}
        self._one_build = asyncio.Lock()
        #: builds run so far (for tests and metrics)
        self.builds = 0

    async def get(self, week: str, fmt: str, build: Callable[[], Awaitable[Answer]]) -> Answer:
        """The answer for ``(week, fmt)``: from memory when fresh, else from ``build()``.

        Args:
            week: the ISO week (``2026-W48``).
            fmt: the format (``json``, ``html``, ``csv``, ``md``).
            build: makes the answer (awaited at most once at a time for all keys).

        Returns:
            The answer (treat it as read-only: it is shared with later requests).

        Raises:
            Whatever ``build`` raises (to every request waiting on that build; nothing is kept).
        """
        key = (week, fmt)
        while True:
            if key in self._answers:
                return self._answers[key]
            pending = self._building.get(key)
            if pending is None:
                break
            try:
                return await asyncio.shield(pending)
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if pending.cancelled() and (task is None or not task.cancelling()):
                    continue  # the request building it went away, not this one: build it here
                raise
        future: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        self._building[key] = future
        try:
            async with self._one_build:
                answer = await build()
            self.builds += 1
            if self.ttl_s > 0:
                self._answers[key] = answer
            future.set_result(answer)
            return answer
        except Exception as exc:
            future.set_exception(exc)
            future.exception()  # retrieved here: no "never retrieved" warning when none waits
            raise
        except BaseException:
            future.cancel()  # the builder was cancelled: a waiter builds it instead
            raise
        finally:
            del self._building[key]


async def cached_report(request: Request, week: str, fmt: str) -> Answer:
    """The report of ``week`` in ``fmt`` for an api or console request, through the app's cache.

    The JSON report is built from the store (:func:`~hedgerow.controller.report.report_store.weekly_report`)
    and the other formats rendered from it in a worker thread; both are kept in the app's
    :class:`ReportCache` (``state.report_cache``, made at the first request with
    ``Settings.report_cache_ttl_s``).

    Args:
        request: the request (its app holds the store and the settings).
        week: a valid, started ISO week (``2026-W48``).
        fmt: one of ``FORMATS``.

    Returns:
        The JSON report (``fmt == "json"``) or the rendered text.

    Raises:
        StoreError / SQLAlchemyError: the store could not be read.
    """
    state = app_state(request.app)
    cache: ReportCache | None = getattr(state, "report_cache", None)
    if cache is None:
        cache = state.report_cache = ReportCache(float(state.settings.report_cache_ttl_s))

    async def load() -> Answer:
        return await weekly_report(state.sessionmaker, week)

    report = await cache.get(week, "json", load)
    if fmt == "json":
        return report
    assert isinstance(report, dict)

    async def draw() -> Answer:
        text: str = await run_in_threadpool(render, report, fmt)
        return text

    return await cache.get(week, fmt, draw)
