"""Bounds the api and the ops CLI share, importable without FastAPI, SQLAlchemy or scipy.

``hedgerow routes`` and ``hedgerow report`` check their flags against these before they send a
request or open the store, with the same bound the api enforces, so both give the same answer.
This module imports nothing beyond the standard library at run time (and the stdlib-only
:mod:`hedgerow.controller.policy.reason_codes`), so the store's own check of a route's budget
(:mod:`hedgerow.controller.routes_admin`) applies :func:`budget_range_error` too.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import TYPE_CHECKING

from hedgerow.controller.policy.reason_codes import REASON_CODES

if TYPE_CHECKING:
    from hedgerow.controller.report.report import IsoWeek

__all__ = [
    "MAX_HISTORY_LIMIT",
    "budget_range_error",
    "history_filter_error",
    "parse_budget",
    "unstarted_week_message",
]

#: Largest ``limit`` of a threshold-history query (``GET /v1/routes/{route}/history``,
#: ``hedgerow routes history --limit``).
MAX_HISTORY_LIMIT = 10_000


def history_filter_error(
    *, reason: str | None = None, since: datetime | None = None, until: datetime | None = None
) -> tuple[str, str] | None:
    """What is wrong with a threshold-history filter, or None when the store can answer it.

    The rule of ``GET /v1/routes/{route}/history``, the console's route page and ``hedgerow
    routes history``: a filter that could only give an empty history (a misspelt reason code, a
    ``since`` after ``until``) is refused, since an empty table reads as "no such decisions".

    Args:
        reason: the ``reason`` filter as given (no spaces around it), or None; it must be one of
            :data:`hedgerow.controller.policy.reason_codes.REASON_CODES`.
        since, until: the time filters (aware), or None.

    Returns:
        ``(parameter, message)``, e.g. ``("reason", "unknown code 'budget_bond'; codes: ...")`` or
        ``("since", "must not be after until (2026-12-02T10:00:00+00:00 > ...)")``; None when the
        filter is fine.
    """
    if reason is not None and reason not in REASON_CODES:
        return "reason", f"unknown code {reason!r}; codes: {', '.join(sorted(REASON_CODES))}"
    if since is not None and until is not None and since > until:
        return "since", f"must not be after until ({since.isoformat()} > {until.isoformat()})"
    return None


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

    Only the number is read here; whether it lies in (0, 1) is :func:`budget_range_error`'s rule.

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


def budget_range_error(budget: float, typed: str | None = None) -> str | None:
    """Why ``budget`` is not a hedge budget, or None when it is one (0 < budget < 1).

    The rule of every route's budget (the api, the console's form and ``hedgerow routes set``):
    the share of calls that may hedge, more than none and less than all.

    Args:
        budget: the budget as a fraction (``parse_budget`` of what was typed).
        typed: the text the operator typed (``150%``), quoted back as typed; None to quote the
            fraction (a JSON body's number).

    Returns:
        A sentence saying what is wrong with the value and which range is allowed, e.g. ``150% is
        over 100%: a budget is the share of calls that may hedge and must be a fraction in (0, 1)
        or a percent in (0%, 100%), e.g. 0.05 or 5%``; None for a budget in range.
    """
    if 0 < budget < 1:
        return None
    shown = typed.strip() if typed is not None else f"{budget!r}"
    if not math.isfinite(budget):
        why = f"{shown} is not a finite number"
    elif budget > 1:
        why = f"{shown} is over 100%"
    elif budget == 1:
        why = f"{shown} would let every call hedge"
    elif budget == 0:
        why = f"{shown} would let no call hedge (to stop hedging, disable the route)"
    else:
        why = f"{shown} is below 0%"
    return (
        f"{why}: a budget is the share of calls that may hedge and must be a fraction in (0, 1) "
        "or a percent in (0%, 100%), e.g. 0.05 or 5%"
    )
