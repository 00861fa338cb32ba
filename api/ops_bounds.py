"""Bounds the api and the ops CLI share, importable without FastAPI, SQLAlchemy or scipy.

``hedgerow routes`` and ``hedgerow report`` check their flags against these before they send a
request or open the store, with the same bound the api enforces, so both give the same answer.
This module imports nothing beyond the standard library at run time.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hedgerow.controller.report import IsoWeek

__all__ = ["MAX_HISTORY_LIMIT", "parse_budget", "unstarted_week_message"]

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


def parse_budget(text: str) -> float:
    """A hedge budget as typed by an operator: a fraction (``0.05``) or a percent (``5%``), as
    the console and ``hedgerow routes`` show budgets in percent.

    Only the number is read here; whether it lies in (0, 1) is the route's rule, checked where the
    change is applied.

    Args:
        text: the typed text; spaces around the number and before ``%`` are allowed.

    Returns:
        The budget as a fraction (``5%`` gives 0.05).

    Raises:
        ValueError: not a number (``not a number: '5%%'``) or not finite (``must be finite,
            got 'nan'``).
    """
    stripped = text.strip()
    percent = stripped.endswith("%")
    try:
        value = float(stripped.removesuffix("%").strip())
    except ValueError:
        raise ValueError(f"not a number: {text!r}") from None
    if not math.isfinite(value):
        raise ValueError(f"must be finite, got {text!r}")
    return value / 100 if percent else value
