"""Bounds the api and the ops CLI share, importable without FastAPI, SQLAlchemy or scipy.

``hedgerow routes`` and ``hedgerow report`` check their flags against these before they send a
request or open the store, with the same bound the api enforces, so both give the same answer.
This module imports nothing beyond the standard library at run time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hedgerow.controller.report import IsoWeek

__all__ = ["MAX_HISTORY_LIMIT", "unstarted_week_message"]

#: Largest ``limit`` of a threshold-history query (``GET /v1/routes/{route}/history``,
#: ``hedgerow routes history --limit``).
MAX_HISTORY_LIMIT = 10_000


def unstarted_week_message(week: IsoWeek, current: IsoWeek) -> str | None:
    """Why the weekly report of ``week`` cannot be given yet, or None when it can.

    A week that has not started has no calls and no rollups; its report would be all zeros
    marked partial, which reads like an outage. The current week (started, not ended) is
    reported as partial, and every past week in full.

    Args:
        week: the ISO week asked for.
        current: the ISO week holding the present moment (``IsoWeek.of(now)``).

    Returns:
        A sentence naming the week, when it starts and the current week; None for a week up to
        the current one.
    """
    if (week.year, week.week) <= (current.year, current.week):
        return None
    return (
        f"week {week} has not started yet (it starts {week.since:%Y-%m-%d} 00:00 UTC); "
        f"the latest report is of the current week, {current}"
    )
