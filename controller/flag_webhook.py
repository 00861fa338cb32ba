"""Flag changes pushed to a webhook: the ops team is told when a route's flags go up or down.

The controller marks a route worth a look with *flag* reason codes
(:data:`hedgerow.controller.store.overview.FLAG_CODES`: ``backups_rarely_win``,
``hedges_did_not_lower_p99``) and raises a value the last minutes show over budget
(``raise_over_budget``). After each tick the scheduler compares every route's flags with the
previous tick's (:func:`flag_changes`) and hands what changed to a :class:`FlagWebhook`, which
posts one message per tick to ``HEDGEROW_FLAG_WEBHOOK_URL`` with the weekly report's delivery
(:func:`hedgerow.controller.report.report_job.post_webhook`: its attempts, backoff and timeout
settings), in the report's format (``HEDGEROW_REPORT_WEBHOOK_FORMAT``: ``slack`` posts
``{"text": ...}``, ``json`` posts ``{"event": "hedgerow.flags", "changes": [...]}``).

Only the lease holder ticks, so each change is posted once across replicas. The posts run in a
task of their own, never inside the tick; at most :data:`MAX_PENDING_CHANGES` changes wait while
the webhook is slow or down (the oldest beyond that are dropped and counted in
:attr:`FlagWebhook.dropped`, with one warning); a message whose every attempt failed is logged
and dropped (flags are state: the next change, or the route page, shows the current one).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from hedgerow.client.names import visible
from hedgerow.controller.policy.reason_codes import REASON_MEANINGS
from hedgerow.controller.report.report_job import post_webhook
from hedgerow.controller.store.models import Route, ThresholdHistory
from hedgerow.controller.store.queries import newest_history_id

if TYPE_CHECKING:
    from hedgerow.settings import Settings

__all__ = [
    "MAX_PENDING_CHANGES",
    "NOTIFIED_CODES",
    "FlagChange",
    "FlagWebhook",
    "flag_changes",
    "latest_reasons",
    "slack_escape",
    "undecided_flags",
    "webhook_payload",
]

log = logging.getLogger(__name__)

#: The reason codes whose appearance and disappearance are posted.
NOTIFIED_CODES: tuple[str, ...] = ("backups_rarely_win", "hedges_did_not_lower_p99", "raise_over_budget")
#: The most changes that wait for the webhook; older ones are dropped beyond it.
MAX_PENDING_CHANGES = 1000


@dataclass(frozen=True, slots=True)
class FlagChange:
    """One flag of one (route, model) that went up (``raised``) or down, at a tick's time."""

    route: str
    model: str
    flag: str
    raised: bool
    at: datetime

    def as_dict(self) -> dict[str, Any]:
        """The JSON form: route, model, flag, ``raised`` or ``cleared``, ISO time, meaning."""
        return {
            "route": self.route,
            "model": self.model,
            "flag": self.flag,
            "change": "raised" if self.raised else "cleared",
            "at": self.at.isoformat(),
            "meaning": REASON_MEANINGS.get(self.flag, "?"),
        }

    def sentence(self) -> str:
        """One line for a chat message; names are escaped (:func:`slack_escape`) so that they
        cannot break the line or forge markup."""
        what = "raised" if self.raised else "cleared"
        meaning = REASON_MEANINGS.get(self.flag, "?").removeprefix("(flag) ")
        where = f"route {slack_escape(self.route)} (model {slack_escape(self.model)})"
        return f"{self.flag} {what} on {where}" + (f": {meaning}" if self.raised else "")


def slack_escape(name: str) -> str:
    """``name`` for Slack message text: control and format characters written as escapes
    (:func:`hedgerow.client.names.visible`), then ``&``, ``<``, ``>`` as the entities Slack's
    message formatting asks for (so a name cannot become a link or a mention)."""
    return visible(name).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def flag_changes(
    route: str,
    model: str,
    before: Sequence[str],
    after: Sequence[str],
    at: datetime,
    undecided: Collection[str] = (),
) -> list[FlagChange]:
    """The notified codes in ``after`` only (raised) and in ``before`` only (cleared).

    Args:
        route, model: the route.
        before, after: the reason codes of the route's previous and new history rows.
        at: the tick's time (aware UTC).
        undecided: codes whose check did not run on the new row (too little data, e.g. a
            window shrunk to the data since a detected change): they keep their state, so a
            check that could not run is not posted as a flag cleared (see :func:`undecided_flags`).

    Returns:
        Raised ones first, each group in :data:`NOTIFIED_CODES` order.
    """
    after = [code for code in after if code not in undecided] + [code for code in before if code in undecided]
    raised = [
        FlagChange(route, model, code, True, at) for code in NOTIFIED_CODES if code in after and code not in before
    ]
    cleared = [
        FlagChange(route, model, code, False, at) for code in NOTIFIED_CODES if code in before and code not in after
    ]
    return raised + cleared


def undecided_flags(row: Mapping[str, Any]) -> set[str]:
    """The flags a history row (as the api returns it) did not decide: ``hedges_did_not_lower_p99``
    when its ``details`` hold no ``p99_check`` (the check lacked its inputs), and
    ``backups_rarely_win`` when it has no ``backup_win_rate`` (no hedged calls in its window)."""
    undecided: set[str] = set()
    details = row.get("details") or {}
    if not (isinstance(details, Mapping) and details.get("p99_check")):
        undecided.add("hedges_did_not_lower_p99")
    if row.get("backup_win_rate") is None:
        undecided.add("backups_rarely_win")
    return undecided


async def latest_reasons(session: AsyncSession) -> dict[tuple[str, str], list[str]]:
    """The reason codes of each route's newest history row (routes not archived), one query.

    What the scheduler compares a tick's rows with: taken from the store, not from the process,
    so a process that has just taken the lease over sees the previous holder's last flags.

    Returns:
        ``{(route, model): [code, ...]}`` for the routes with any history.
    """
    result = await session.execute(
        select(Route.route, Route.model, ThresholdHistory.reason)
        .join(ThresholdHistory, ThresholdHistory.id == newest_history_id())
        .where(Route.archived_at.is_(None))
    )
    return {(route, model): reason.split(",") for route, model, reason in result.all()}


def webhook_payload(changes: Sequence[FlagChange], fmt: Literal["slack", "json"] | str) -> dict[str, Any]:
    """The body posted for ``changes``: ``{"text": ...}`` (slack) or ``{"event", "changes"}`` (json)."""
    if fmt == "json":
        return {"event": "hedgerow.flags", "changes": [change.as_dict() for change in changes]}
    lines = [f"hedgerow: {len(changes)} flag change{'s' if len(changes) != 1 else ''}"]
    lines += [f"• {change.sentence()}" for change in changes]
    return {"text": "\n".join(lines)}


class FlagWebhook:
    """Posts flag changes to a webhook from a task of its own (see the module docstring).

    Args:
        url: the webhook.
        fmt: ``slack`` or ``json``.
        attempts, backoff_s, timeout_s: as :func:`~hedgerow.controller.report.report_job.post_webhook`.
        max_pending: the most changes kept while waiting (default :data:`MAX_PENDING_CHANGES`).

    Attributes:
        posted: messages delivered (a 2xx answer); failed: messages whose every attempt failed;
        dropped: changes dropped because ``max_pending`` were already waiting.
    """

    def __init__(
        self,
        url: str,
        fmt: str = "slack",
        *,
        attempts: int = 5,
        backoff_s: float = 2.0,
        timeout_s: float = 10.0,
        max_pending: int = MAX_PENDING_CHANGES,
    ) -> None:
        self.url = url
        self.fmt = fmt
        self.attempts = attempts
        self.backoff_s = backoff_s
        self.timeout_s = timeout_s
        self._pending: deque[FlagChange] = deque()
        self._max_pending = max_pending
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._busy = False  # a post is under way
        self.posted = 0
        self.failed = 0
        self.dropped = 0

    @classmethod
    def from_settings(cls, settings: Settings) -> FlagWebhook | None:
        """The webhook of ``settings.flag_webhook_url`` with the report's delivery settings, or None."""
        if not settings.flag_webhook_url:
            return None
        return cls(
            settings.flag_webhook_url,
            settings.report_webhook_format,
            attempts=settings.report_webhook_attempts,
            backoff_s=settings.report_webhook_backoff_s,
            timeout_s=settings.report_webhook_timeout_s,
        )

    def submit(self, changes: Sequence[FlagChange]) -> None:
        """Queue ``changes`` for the next post (never blocks; starts the task on first use)."""
        if not changes:
            return
        self._pending.extend(changes)
        over = len(self._pending) - self._max_pending
        if over > 0:
            for _ in range(over):
                self._pending.popleft()
            if self.dropped == 0:
                log.warning("flag webhook: more than %d changes waiting; dropping the oldest", self._max_pending)
            self.dropped += over
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="flag-webhook")
        self._wake.set()

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._pending:
                batch = list(self._pending)
                self._pending.clear()
                self._busy = True
                try:
                    await self._post(batch)
                finally:
                    self._busy = False

    async def _post(self, batch: list[FlagChange]) -> None:
        sent, attempts, error = await post_webhook(
            self.url,
            webhook_payload(batch, self.fmt),
            what="flag webhook",
            attempts=self.attempts,
            backoff_s=self.backoff_s,
            timeout_s=self.timeout_s,
        )
        if sent:
            self.posted += 1
        else:
            self.failed += 1
            log.warning("flag webhook: %d change(s) not delivered after %d attempt(s): %s", len(batch), attempts, error)

    async def drain(self, timeout_s: float = 5.0) -> None:
        """Wait (up to ``timeout_s``) until every queued change has been posted or given up."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while (self._pending or self._busy) and loop.time() < deadline:
            await asyncio.sleep(0.02)

    async def aclose(self, timeout_s: float = 5.0) -> None:
        """Post what is queued (up to ``timeout_s``), then stop the task."""
        await self.drain(timeout_s)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
