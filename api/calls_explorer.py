"""The calls explorer's api: ``GET /v1/routes/{route}/calls``, a route's recent calls and their attempts.

``GET /v1/routes/{route}/calls?model=&since=&until=&outcome=&winner=&upstream=&failed_upstream=&client=&cursor=&limit=``
(read scope): the calls of (route, model), newest first, each with its attempts
(:mod:`hedgerow.controller.store.calls_query`). ``model`` may be left out when the route has one
model. Paged by cursor: pass a page's ``next_cursor`` back as ``cursor`` for the next (older)
page; ``next_cursor`` is null on the last page. A filtered page (any filter but the times)
examines at most :data:`~hedgerow.controller.calls_filters.MAX_SCAN_CALLS` calls: when they hold
less than a page, the page is short, ``scan_stopped_at`` names the oldest call examined and
``next_cursor`` goes on from it. ``limit`` is 1 to
:data:`~hedgerow.controller.calls_filters.MAX_CALLS_LIMIT` (default 50). ``outcome`` is one of
:data:`~hedgerow.controller.calls_filters.CALL_OUTCOMES`; ``winner`` names the upstream whose
attempt won, ``upstream`` one any attempt went to, ``failed_upstream`` one an attempt on which
failed (the upstream behind a failover or a failed call), ``client`` the record's ``client``
exactly (an app's tag, or the name of the gateway key that made the call). A bad value is 422
``{"detail": {"field", "message"}}`` naming it; an unknown route 404.

Raw calls are deleted after ``retention_s``; when ``since`` is older than that, the answer's
``retention_note`` says so (the window's older part is empty because it was deleted, not
because nothing happened).

This path is matched before ``GET /v1/routes/{route}`` (the router is included first), so
``/v1/routes/a/calls`` is always the calls of route ``a``; a route name may therefore not end
in ``/calls`` (:data:`hedgerow.client.names.CALLS_SUFFIX`).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request, status
from fastapi.responses import JSONResponse
from pydantic import AfterValidator, BaseModel, Field

from hedgerow.api._state import app_state
from hedgerow.api.auth import require_scope
from hedgerow.api.json_body import error_response, unprocessable
from hedgerow.api.routes import OptionalModelQuery, Session, StoredRoutePath
from hedgerow.api.schemas import no_control_characters
from hedgerow.client.names import MAX_NAME_CHARS
from hedgerow.controller.calls_filters import (
    CALL_OUTCOMES,
    DEFAULT_CALLS_LIMIT,
    MAX_CALLS_LIMIT,
    calls_filter_error,
    decode_cursor,
)
from hedgerow.controller.store.calls_query import recent_calls, retention_note
from hedgerow.controller.store.models import utc_now
from hedgerow.controller.store.queries import resolve_model

__all__ = ["CallAttemptOut", "CallsPageOut", "ExploredCallOut", "router"]

router = APIRouter()

#: The rule of every name filter (an upstream's, a client's): no control characters.
_NAME_RULE = AfterValidator(lambda value: None if value is None else no_control_characters(value))


class CallAttemptOut(BaseModel):
    """One attempt of a call: which upstream, its role, when (seconds from the call's start), how it ended."""

    upstream: str
    role: str
    start_s: float
    first_token_s: float | None
    ttft_s: float | None
    end_s: float
    outcome: str
    censored: bool
    status_code: int | None
    error_type: str | None
    prompt_tokens: int | None
    cached_prompt_tokens: int | None
    completion_tokens: int


class ExploredCallOut(BaseModel):
    """One call of a route as the explorer shows it; ``outcome`` is one of ``primary_won``,
    ``hedge_won``, ``failover``, ``failed``, ``cancelled``."""

    request_id: str
    started_at: str
    outcome: str
    status: str
    winner: str | None
    winner_upstream: str | None
    hedged: bool
    hedge_reason: str | None
    hedge_denied: bool
    failover_denied: bool
    hedge_after_s: float | None
    threshold_version: int | None
    error_type: str | None
    ttft_s: float | None
    tpot_s: float | None
    e2e_s: float | None
    prompt_tokens: int | None
    completion_tokens: int | None
    wasted_completion_tokens: int
    client: str | None
    api: str
    attempts: list[CallAttemptOut]


class CallsPageOut(BaseModel):
    """Body of ``GET /v1/routes/{route}/calls``: one page, newest first."""

    route: str
    model: str
    calls: list[ExploredCallOut]
    next_cursor: str | None
    scan_stopped_at: str | None = Field(
        description="When a filtered page is short because the search examined its bound of calls: the start of"
        " the oldest call examined (the next page goes on from there); else null."
    )
    retention_note: str | None


def time_error(name: str, value: datetime | None) -> str | None:
    """Why a ``since``/``until`` cannot be used, or None: it needs a zone and a UTC equivalent
    within years 1..9999 (``0001-01-01T00:00+05:00`` has none)."""
    if value is None:
        return None
    if value.tzinfo is None:
        return "must carry a timezone (e.g. Z)"
    try:
        value.astimezone(UTC)
    except OverflowError:
        return f"out of range: {value.isoformat()} is not within years 1..9999 in UTC"
    return None


@router.get(
    "/v1/routes/{route:path}/calls",
    dependencies=[Depends(require_scope("read"))],
    response_model=CallsPageOut,
    responses={
        404: {"description": "unknown (route, model)"},
        422: {"description": '{"detail": {"field": ..., "message": ...}}: a bad filter or cursor, named'},
    },
    summary="A route's recent calls with their attempts, newest first (paged by cursor)",
)
async def get_route_calls(
    request: Request,
    route: StoredRoutePath,
    session: Session,
    model: OptionalModelQuery = None,
    since: Annotated[
        datetime | None, Query(description="Only calls started at or after this ISO 8601 time (with a zone).")
    ] = None,
    until: Annotated[
        datetime | None, Query(description="Only calls started at or before this ISO 8601 time (with a zone).")
    ] = None,
    outcome: Annotated[
        str | None,
        Query(
            min_length=1,
            max_length=32,
            description=f"Only calls of this outcome: {', '.join(CALL_OUTCOMES)}.",
            json_schema_extra={"enum": list(CALL_OUTCOMES)},
        ),
    ] = None,
    winner: Annotated[
        str | None,
        Query(
            min_length=1,
            max_length=MAX_NAME_CHARS,
            description="Only calls whose winning attempt went to this upstream.",
        ),
        _NAME_RULE,
    ] = None,
    upstream: Annotated[
        str | None,
        Query(min_length=1, max_length=MAX_NAME_CHARS, description="Only calls with an attempt sent to this upstream."),
        _NAME_RULE,
    ] = None,
    failed_upstream: Annotated[
        str | None,
        Query(
            min_length=1,
            max_length=MAX_NAME_CHARS,
            description="Only calls with an attempt on this upstream that failed (error, timeout or stall).",
        ),
        _NAME_RULE,
    ] = None,
    client: Annotated[
        str | None,
        Query(
            min_length=1,
            max_length=MAX_NAME_CHARS,
            description="Only calls whose client is exactly this (an app's tag, or the gateway key that made it).",
        ),
        _NAME_RULE,
    ] = None,
    cursor: Annotated[
        str | None,
        Query(min_length=1, max_length=200, description="The next_cursor of the previous page (older calls)."),
    ] = None,
    limit: Annotated[
        int, Query(ge=1, le=MAX_CALLS_LIMIT, description=f"Most calls in the page (1 to {MAX_CALLS_LIMIT}).")
    ] = DEFAULT_CALLS_LIMIT,
) -> Any:
    """The calls of (route, model), newest first, each with its attempts (upstream, role, start,
    TTFT, outcome, failure, tokens); ``model`` may be left out when the route has one model."""
    for name, value in (("since", since), ("until", until)):
        problem = time_error(name, value)
        if problem is not None:
            return unprocessable(name, problem)
    refused = calls_filter_error(outcome=outcome, since=since, until=until, limit=limit)
    if refused is not None:
        return unprocessable(*refused)
    try:
        after = None if cursor is None else decode_cursor(cursor)
    except ValueError as exc:
        return unprocessable("cursor", str(exc))
    chosen = await resolve_model(session, route, model)
    page = await recent_calls(
        session,
        route,
        chosen,
        limit=limit,
        after=after,
        since=since,
        until=until,
        outcome=outcome,
        winner=winner,
        upstream=upstream,
        failed_upstream=failed_upstream,
        client=client,
    )
    note = retention_note(since, utc_now(), app_state(request.app).settings.retention_s)
    return {
        "route": route,
        "model": chosen,
        "calls": page.calls,
        "next_cursor": page.next_cursor,
        "scan_stopped_at": page.scan_stopped_at,
        "retention_note": note,
    }


@router.api_route("/v1/routes/{route:path}/calls", methods=["PUT", "PATCH", "POST", "DELETE"], include_in_schema=False)
async def calls_are_read_only() -> JSONResponse:
    """405: a route's calls are read here, never changed (without this, ``DELETE
    /v1/routes/a/calls`` would archive a route named ``a/calls``)."""
    return error_response(
        status.HTTP_405_METHOD_NOT_ALLOWED, "method", "a route's calls are read-only here: use GET", {"Allow": "GET"}
    )
