"""``GET /v1/upstreams?since=&until=&route=``: every upstream's figures over a window (read scope).

The table of :func:`hedgerow.controller.store.upstreams.upstream_stats` (see that module for each
figure's definition): per upstream, attempts, TTFT P50/P90/P99 (Kaplan-Meier, censored attempts
included), error/timeout/stall rates, win rate in races, hedges caused and the prompt (and output)
tokens spent by its losing attempts, over the calls started in ``[since, until)`` (default: the 24
hours before ``until``, itself defaulting to now), optionally of one route. A bad window (no zone, ``since`` not before
``until``, longer than 32 days) is 422 ``{"detail": {"field", "message"}}`` naming it; a ``route``
no stored route has (any model) is 404 naming ``route``.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query
from pydantic import AfterValidator, BaseModel

from hedgerow.api.auth import require_scope
from hedgerow.api.json_body import unprocessable
from hedgerow.api.routes import Session
from hedgerow.api.schemas import no_control_characters
from hedgerow.client.names import MAX_NAME_CHARS
from hedgerow.client.records import format_timestamp
from hedgerow.controller.store.upstreams import (
    MAX_UPSTREAMS,
    default_window,
    upstream_stats,
    window_error,
)

__all__ = ["QuantileOut", "UpstreamOut", "UpstreamTableOut", "router", "table_json"]

router = APIRouter()


class QuantileOut(BaseModel):
    """A TTFT quantile: the estimate (null when the data never reach the level) and the interval
    ``[low_s, high_s)`` holding the exact Kaplan-Meier quantile (``high_s`` null when unbounded)."""

    value_s: float | None
    low_s: float
    high_s: float | None


class UpstreamOut(BaseModel):
    """One upstream's figures (rates null when their denominator is 0; a quantile null without samples).

    ``ttft_samples`` counts attempts with a first token plus those cancelled before one
    (``ttft_censored``); failed attempts are no TTFT sample. ``raced``: attempts of calls hedged
    because the primary was slow; ``win_rate = wins / raced``. ``hedges_caused``: such hedges with
    this upstream as the primary (``hedge_share``: of every hedge in the window);
    ``failovers_caused``: backups started because it failed as the primary;
    ``loser_completion_tokens``: output tokens of its attempts that lost in a call with a backup
    (about 0 under first-token hedging: the loser is cancelled at the winner's first token);
    ``loser_prompt_tokens``: the prompt tokens of those losing attempts (what they cost: the
    upstream prefilled the prompt), of which ``loser_prompt_tokens_estimated`` were the call's
    prompt tokens standing in for an attempt without a usage chunk;
    ``loser_attempts_without_prompt_tokens``: losing attempts with no prompt tokens recorded.
    """

    upstream: str
    attempts: int
    primary_attempts: int
    backup_attempts: int
    ttft_samples: int
    ttft_censored: int
    ttft_s: dict[str, QuantileOut | None]
    errors: int
    timeouts: int
    stalls: int
    error_rate: float | None
    timeout_rate: float | None
    stall_rate: float | None
    raced: int
    wins: int
    win_rate: float | None
    hedges_caused: int
    hedge_share: float | None
    failovers_caused: int
    loser_completion_tokens: int
    loser_prompt_tokens: int
    loser_prompt_tokens_estimated: int
    loser_attempts_without_prompt_tokens: int


class UpstreamTableOut(BaseModel):
    """Body of ``GET /v1/upstreams``: the window, then one row per upstream, most attempts first.

    ``covered_from``: the oldest raw call the store keeps (raw calls are deleted after
    ``HEDGEROW_RETENTION_S``; a window before it finds nothing), null when there is none.
    ``truncated``: more than 500 upstreams, the rest left out. ``hedges`` and ``attempts``: totals
    of the window.
    """

    since: str
    until: str
    route: str | None
    covered_from: str | None
    upstreams: list[UpstreamOut]
    truncated: bool
    hedges: int
    attempts: int


def table_json(table: dict[str, Any]) -> dict[str, Any]:
    """``upstream_stats``'s answer with its times as ISO 8601 ``Z`` strings (the api's shape)."""
    out = dict(table)
    for name in ("since", "until", "covered_from"):
        if out[name] is not None:
            out[name] = format_timestamp(out[name])
    return out


def _moment(text: str | None) -> datetime | str | None:
    """A query time: None when absent, the aware UTC datetime, or what is wrong with it (a str).

    Only ISO 8601 with a zone is taken (a bare number is not read as a Unix time)."""
    if text is None:
        return None
    try:
        value = datetime.fromisoformat(text.strip())
    except ValueError:
        return f"not an ISO 8601 time (e.g. 2026-12-01T09:30:00Z), got {text!r}"
    if value.tzinfo is None:
        return "must carry a timezone (e.g. Z)"
    try:
        return value.astimezone(UTC)
    except OverflowError:
        return f"out of range: {text} is not within years 1..9999 in UTC"


@router.get(
    "/v1/upstreams",
    dependencies=[Depends(require_scope("read"))],
    response_model=UpstreamTableOut,
    summary="Every upstream's TTFT, failure rates, wins and hedges over a window",
    responses={404: {"description": "no stored route has this name (route)"}},
)
async def get_upstreams(
    session: Session,
    since: Annotated[
        str | None,
        Query(
            max_length=64,
            description="Calls started at or after this ISO 8601 time (with a zone); default: until - 24 h.",
            json_schema_extra={"format": "date-time"},
        ),
    ] = None,
    until: Annotated[
        str | None,
        Query(
            max_length=64,
            description="Calls started before this ISO 8601 time (with a zone); default: now.",
            json_schema_extra={"format": "date-time"},
        ),
    ] = None,
    route: Annotated[
        str | None,
        Query(min_length=1, max_length=MAX_NAME_CHARS, description="Only the calls of this route (every model)."),
        AfterValidator(lambda value: None if value is None else no_control_characters(value)),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_UPSTREAMS, description="Most upstreams (most attempts first).")] = (
        MAX_UPSTREAMS
    ),
) -> Any:
    """Per-upstream figures of the calls started in ``[since, until)`` (at most 32 days)."""
    moments: dict[str, datetime | None] = {}
    for name, text in (("since", since), ("until", until)):
        parsed = _moment(text)
        if isinstance(parsed, str):
            return unprocessable(name, parsed)
        moments[name] = parsed
    since_at, until_at = moments["since"], moments["until"]
    try:
        start, end = default_window(datetime.now(UTC), since_at, until_at)
    except OverflowError:
        return unprocessable("until" if since_at is None else "since", "the window reaches outside years 1..9999")
    problem = window_error(start, end)
    if problem is not None:
        return unprocessable(*problem)
    return table_json(await upstream_stats(session, since=start, until=end, route=route, limit=limit))
