"""Read side of the calls explorer: a route's recent calls, newest first, each with its attempts.

:func:`recent_calls` answers one page: the calls of one (route, model), ordered by
``(started_at, id)`` descending, keyset-paged (the page after a cursor starts strictly after
the call it names; no ``OFFSET``, so page 1,000 costs what page 1 does), at most
:data:`~hedgerow.controller.calls_filters.MAX_CALLS_LIMIT` a page, filtered by outcome
(:data:`~hedgerow.controller.calls_filters.CALL_OUTCOMES`), by the upstream whose attempt won,
by an upstream any attempt went to (``upstream``), by an upstream one of whose attempts failed
(``failed_upstream``: the upstream behind a failover or a failed call), by the calling app or
gateway key (``client``, exact), and by a time window.
A filtered page examines at most
:data:`~hedgerow.controller.calls_filters.MAX_SCAN_CALLS` calls (a rare outcome on a busy route
would otherwise read every call kept; the newest ``max_scan``-th call is found first, on the
index, and bounds the filtered read): when they hold less than a page, the page is short and
its cursor goes on from the oldest call examined. Each call comes with its attempts, read in one
more query for the whole page (bounded by the page's call ids and its time span, so PostgreSQL
reads only the days' partitions the page covers).

The read uses the ``calls`` index on ``(route_id, started_at)``; on PostgreSQL a ``since`` /
``until`` also prunes the day partitions. Raw calls are deleted after ``retention_s``
(:mod:`hedgerow.controller.store.retention`): a window older than that finds nothing, which
:func:`retention_note` says in words for the api and the console.

Shapes (timestamps ISO 8601 UTC with ``Z``; durations float seconds):

- call: :data:`CALL_FIELDS`; ``outcome`` is derived
  (:func:`~hedgerow.controller.calls_filters.call_outcome`), ``winner_upstream`` is the upstream
  of the attempt that won (None when none did), ``attempts`` the list below;
- attempt: :data:`ATTEMPT_FIELDS`; ``start_s`` / ``first_token_s`` / ``end_s`` are seconds from
  the call's start, ``ttft_s`` the attempt's own TTFT (from its send; None without a first
  token) and ``censored`` true for an attempt cancelled before its first token.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Select, and_, exists, or_, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.sql.elements import ColumnElement

from hedgerow.client.records import format_timestamp
from hedgerow.controller.calls_filters import (
    FAILED_STATUSES,
    MAX_SCAN_CALLS,
    call_outcome,
    calls_filter_error,
    encode_cursor,
)
from hedgerow.controller.store.models import Attempt, Call
from hedgerow.controller.store.queries import route_row

__all__ = [
    "ATTEMPT_FIELDS",
    "CALL_FIELDS",
    "UPSTREAM_CHOICE_CALLS",
    "CallsPage",
    "outcome_clause",
    "recent_calls",
    "retention_note",
    "route_upstreams",
]

#: The keys of a call in a page, in order.
CALL_FIELDS: tuple[str, ...] = (
    "request_id", "started_at", "outcome", "status", "winner", "winner_upstream", "hedged",
    "hedge_reason", "hedge_denied", "failover_denied", "hedge_after_s", "threshold_version",
    "error_type", "ttft_s", "tpot_s", "e2e_s", "prompt_tokens", "completion_tokens",
    "wasted_completion_tokens", "client", "api", "attempts",
)  # fmt: skip
#: The keys of an attempt of a call, in order.
ATTEMPT_FIELDS: tuple[str, ...] = (
    "upstream", "role", "start_s", "first_token_s", "ttft_s", "end_s", "outcome", "censored",
    "status_code", "error_type", "prompt_tokens", "cached_prompt_tokens", "completion_tokens",
)  # fmt: skip


@dataclass(frozen=True)
class CallsPage:
    """One page of a route's calls.

    Attributes:
        calls: the calls, newest first (dicts of :data:`CALL_FIELDS`).
        next_cursor: the cursor of the next (older) page, or None when this page is the last.
        scan_stopped_at: when a filtered page is short because the search examined its bound of
            calls (:data:`~hedgerow.controller.calls_filters.MAX_SCAN_CALLS`), the start time of
            the oldest call examined (ISO 8601 ``Z``); the next page goes on from there. None
            otherwise.
    """

    calls: list[dict[str, Any]]
    next_cursor: str | None
    scan_stopped_at: str | None = None


def outcome_clause(outcome: str) -> ColumnElement[bool]:
    """The SQL condition on ``calls`` of one outcome (the rule of
    :func:`~hedgerow.controller.calls_filters.call_outcome`, written for the database).

    Args:
        outcome: a key of :data:`~hedgerow.controller.calls_filters.CALL_OUTCOMES`.

    Raises:
        ValueError: an unknown outcome.
    """
    succeeded = Call.status == "ok"
    backup_won = and_(succeeded, Call.winner == "backup")
    clauses: dict[str, ColumnElement[bool]] = {
        "cancelled": Call.status == "cancelled",
        "failed": Call.status.in_(FAILED_STATUSES),
        "failover": and_(backup_won, Call.hedge_reason == "primary_error"),
        "hedge_won": and_(backup_won, or_(Call.hedge_reason.is_(None), Call.hedge_reason != "primary_error")),
        "primary_won": and_(succeeded, or_(Call.winner.is_(None), Call.winner != "backup")),
    }
    if outcome not in clauses:
        raise ValueError(f"unknown outcome {outcome!r}")
    return clauses[outcome]


def _attempt_on(upstream: str, outcome: str | None) -> ColumnElement[bool]:
    """The SQL condition on ``calls``: the call has an attempt on ``upstream`` (of ``outcome`` when given)."""
    condition = exists().where(
        Attempt.call_id == Call.id, Attempt.call_started_at == Call.started_at, Attempt.upstream == upstream
    )
    return condition.where(Attempt.outcome == outcome) if outcome is not None else condition


def _attempt_dict(attempt: Attempt) -> dict[str, Any]:
    first = attempt.first_token_s
    return {
        "upstream": attempt.upstream,
        "role": attempt.role,
        "start_s": attempt.start_s,
        "first_token_s": first,
        "ttft_s": None if first is None else max(first - attempt.start_s, 0.0),
        "end_s": attempt.end_s,
        "outcome": attempt.outcome,
        "censored": attempt.outcome == "cancelled" and first is None,
        "status_code": attempt.status_code,
        "error_type": attempt.error_type,
        "prompt_tokens": attempt.prompt_tokens,
        "cached_prompt_tokens": attempt.cached_prompt_tokens,
        "completion_tokens": attempt.completion_tokens,
    }


def _call_dict(call: Call, attempts: list[Attempt]) -> dict[str, Any]:
    won = next((a.upstream for a in attempts if a.outcome == "won"), None)
    return {
        "request_id": call.request_id,
        "started_at": format_timestamp(call.started_at),
        "outcome": call_outcome(call.status, call.winner, call.hedge_reason),
        "status": call.status,
        "winner": call.winner,
        "winner_upstream": won,
        "hedged": call.hedged,
        "hedge_reason": call.hedge_reason,
        "hedge_denied": call.hedge_denied,
        "failover_denied": call.failover_denied,
        "hedge_after_s": call.hedge_after_s,
        "threshold_version": call.threshold_version,
        "error_type": call.error_type,
        "ttft_s": call.ttft_s,
        "tpot_s": call.tpot_s,
        "e2e_s": call.e2e_s,
        "prompt_tokens": call.prompt_tokens,
        "completion_tokens": call.completion_tokens,
        "wasted_completion_tokens": call.wasted_completion_tokens,
        "client": call.client,
        "api": call.api,
        "attempts": [_attempt_dict(a) for a in attempts],
    }


async def _with_filters(
    session: AsyncSession, base: Select[Any], filters: dict[str, str | None], max_scan: int
) -> tuple[Select[Any], tuple[datetime, int] | None]:
    """``base`` narrowed by the filters of :func:`recent_calls` (``outcome``, ``winner``,
    ``upstream``, ``failed_upstream``, ``client``; None ones ignored) to its newest ``max_scan`` calls, and
    the ``(started_at, id)`` of the oldest call examined (None when the window holds fewer)."""
    if all(value is None for value in filters.values()):
        return base, None
    newest_first = (Call.started_at.desc(), Call.id.desc())
    # the filters see the newest max_scan calls only: a rare match costs no read of every call
    edge = (await session.execute(
        base.with_only_columns(Call.started_at, Call.id).order_by(*newest_first).offset(max_scan - 1).limit(1)
    )).first()  # fmt: skip
    query = base
    scan_edge: tuple[datetime, int] | None = None
    if edge is not None:
        scan_edge = (edge[0], edge[1])
        query = query.where(Call.started_at >= edge[0], or_(Call.started_at > edge[0], Call.id >= edge[1]))
    if filters["outcome"] is not None:
        query = query.where(outcome_clause(filters["outcome"]))
    if filters["client"] is not None:
        query = query.where(Call.client == filters["client"])
    for key, attempt_outcome in (("winner", "won"), ("upstream", None), ("failed_upstream", "failed")):
        name = filters[key]
        if name is not None:
            query = query.where(_attempt_on(name, attempt_outcome))
    return query, scan_edge


async def recent_calls(
    session: AsyncSession,
    route: str,
    model: str,
    *,
    limit: int = 50,
    after: tuple[datetime, int] | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    outcome: str | None = None,
    winner: str | None = None,
    upstream: str | None = None,
    failed_upstream: str | None = None,
    client: str | None = None,
    max_scan: int = MAX_SCAN_CALLS,
) -> CallsPage:
    """One page of the calls of (route, model), newest first, each with its attempts.

    Args:
        session: an open session.
        route, model: the route (archived routes too: their calls stay readable).
        limit: most calls in the page, 1 to :data:`~hedgerow.controller.calls_filters.MAX_CALLS_LIMIT`.
        after: the ``(started_at, id)`` of a cursor
            (:func:`~hedgerow.controller.calls_filters.decode_cursor`): only calls older than that
            one; None for the first page.
        since, until: when given (aware), only calls started at or after ``since`` and at or
            before ``until``.
        outcome: when given, only calls of this outcome (a key of
            :data:`~hedgerow.controller.calls_filters.CALL_OUTCOMES`).
        winner: when given, only calls whose winning attempt went to this upstream.
        upstream: when given, only calls with an attempt sent to this upstream.
        failed_upstream: when given, only calls with an attempt on this upstream that failed
            (attempt outcome ``failed``: an error, a timeout or a stall).
        client: when given, only calls whose record's ``client`` is exactly this (the app's
            tag, or the name of the gateway key that made the call).
        max_scan: with any of the filters above, the most calls examined (newest first from the
            cursor, within the window): when they hold fewer than ``limit`` matches the page is
            short, and its ``next_cursor`` and ``scan_stopped_at`` name where the search stopped.

    Returns:
        The page; its ``next_cursor`` is None when no older call of the window is left to examine.

    Raises:
        UnknownRoute: no such (route, model).
        ValueError: a filter :func:`~hedgerow.controller.calls_filters.calls_filter_error` refuses,
            or ``max_scan`` below ``limit``.
    """
    problem = calls_filter_error(outcome=outcome, since=since, until=until, limit=limit)
    if problem is not None:
        raise ValueError(f"{problem[0]}: {problem[1]}")
    if max_scan < limit:
        raise ValueError(f"max_scan: must be at least limit ({limit}), got {max_scan}")
    row = await route_row(session, route, model)
    base = select(Call).where(Call.route_id == row.id)
    if since is not None:
        base = base.where(Call.started_at >= since)
    if until is not None:
        base = base.where(Call.started_at <= until)
    if after is not None:  # older than the cursor's call; the first term is the index's range
        started, call_id = after
        base = base.where(Call.started_at <= started, or_(Call.started_at < started, Call.id < call_id))
    newest_first = (Call.started_at.desc(), Call.id.desc())
    filters = {
        "outcome": outcome,
        "winner": winner,
        "upstream": upstream,
        "failed_upstream": failed_upstream,
        "client": client,
    }
    query, scan_edge = await _with_filters(session, base, filters, max_scan)
    calls = list((await session.scalars(query.order_by(*newest_first).limit(limit + 1))).all())
    if len(calls) > limit:
        scan_edge = None  # a full page: the next one starts after its last call, not at the bound
    more = len(calls) > limit
    calls = calls[:limit]
    by_call: dict[int, list[Attempt]] = {call.id: [] for call in calls}
    if calls:
        lowest = min(call.started_at for call in calls)
        highest = max(call.started_at for call in calls)
        attempts = await session.scalars(
            select(Attempt)
            .where(
                Attempt.call_id.in_(list(by_call)),
                Attempt.call_started_at >= lowest,
                Attempt.call_started_at <= highest,
            )
            .order_by(Attempt.call_id, Attempt.attempt_index)
        )
        for attempt in attempts:
            by_call[attempt.call_id].append(attempt)
    last = calls[-1] if calls else None
    if more and last is not None:
        next_cursor: str | None = encode_cursor(last.started_at, last.id)
    elif scan_edge is not None:
        next_cursor = encode_cursor(*scan_edge)
    else:
        next_cursor = None
    return CallsPage(
        calls=[_call_dict(call, by_call[call.id]) for call in calls],
        next_cursor=next_cursor,
        scan_stopped_at=None if scan_edge is None else format_timestamp(scan_edge[0]),
    )


#: Calls whose attempts name the upstreams a route's calls page offers in its selects.
UPSTREAM_CHOICE_CALLS = 2000


async def route_upstreams(
    session: AsyncSession, route: str, model: str, *, newest: int = UPSTREAM_CHOICE_CALLS
) -> list[str]:
    """The upstreams the attempts of a route's newest ``newest`` calls went to, sorted by name
    (the choices of the console's upstream filters; a bounded read on the calls index).

    Raises:
        UnknownRoute: no such (route, model).
    """
    row = await route_row(session, route, model)
    newest_calls = (
        select(Call.id, Call.started_at)
        .where(Call.route_id == row.id)
        .order_by(Call.started_at.desc(), Call.id.desc())
        .limit(newest)
        .subquery()
    )
    names = await session.scalars(
        select(Attempt.upstream)
        .join(
            newest_calls,
            and_(Attempt.call_id == newest_calls.c.id, Attempt.call_started_at == newest_calls.c.started_at),
        )
        .distinct()
    )
    return sorted(names)


def retention_note(since: datetime | None, now: datetime, retention_s: float) -> str | None:
    """A sentence saying that part of the window asked for is older than the raw calls kept.

    Args:
        since: the window's start (aware), or None (no start: no note; the list simply ends at
            the oldest call kept).
        now: the present (aware UTC).
        retention_s: the age after which raw calls are deleted, seconds (``Settings.retention_s``).

    Returns:
        None when the whole window is kept; else e.g. ``"Raw calls are kept 14 days: calls
        started before 2026-11-22 10:00 UTC have been deleted (their hourly counts remain in
        the reports)."``
    """
    if since is None:
        return None
    try:
        kept_from = now - timedelta(seconds=retention_s)
    except OverflowError:  # a retention longer than the calendar: nothing was deleted
        return None
    if since >= kept_from:
        return None
    days = retention_s / 86_400
    span = f"{days:g} days" if days >= 1 else f"{retention_s / 3600:g} hours"
    return (
        f"Raw calls are kept {span}: calls started before {kept_from:%Y-%m-%d %H:%M} UTC have been deleted "
        "(their hourly counts remain in the reports)."
    )
