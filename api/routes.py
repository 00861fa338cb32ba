"""Routes: list, one, change (admin, audited) and threshold history.

``GET /v1/routes``, ``GET /v1/routes/{route}?model=``, ``PUT /v1/routes/{route}?model=`` (replace
the whole configuration; creates a missing route, 201), ``PATCH /v1/routes/{route}?model=`` (change
some settings); both admin scope, applied at once, and audited as one history row with reason
``config,...``, the actor and ``details.changes`` (see :mod:`hedgerow.controller.routes_admin`); and
``GET /v1/routes/{route}/history?model=&since=&until=&applied=&reason=&limit=&offset=`` (newest
first; ``model`` may be left out when the route has one model, as in ``GET /v1/routes/{route}``). A bad value (in the
body, the path or the query) is 422 ``{"detail": {"field": ..., "message": ...}}``; a body over
:data:`MAX_ROUTE_BODY_BYTES` is 413.

Archive: ``DELETE /v1/routes/{route}?model=`` (admin) archives the route, history kept; 200 in
the shape of a change (``{"route", "changes": {"archived_at": {"from": null, "to": t}},
"created": false, "history": row}``; ``changes`` empty and ``history`` null when it was already
archived: the same ``archived_at``, nothing written), 404 naming an unknown route. ``PATCH
/v1/routes/{route}?model=`` with ``{"archived": false}`` (alone) restores it (422 when the
restore would pass ``max_routes``). ``GET /v1/routes`` lists the routes in use;
``?archived=true`` the archived ones. Any other ``PUT``/``PATCH`` of an archived route is 409
naming it as archived. What archiving does: :mod:`hedgerow.controller.routes_admin`. ``DELETE``
takes any stored name (only control characters refused, as the reads), so a route stored before
the name rule can be retired; the model must be given. (A restore is a ``PATCH``, so it takes
valid names only; the console's Restore button takes any.)

Route names may contain ``/`` (``team/summarize``): ``{route}`` is matched with Starlette's
``path`` converter, so ``/v1/routes/team/summarize?model=m`` (or ``team%2Fsummarize``) names the
route ``team/summarize``. The history path is matched first, so ``GET
/v1/routes/a/history?model=m`` is always the history of route ``a``, and any other method on it
is 405 (the history is read-only); a route name may therefore not end in ``/history`` (422 from
ingest and from a route change).

A change (``PUT``/``PATCH``) and a threshold poll take only valid names (:data:`RoutePath`,
:data:`ModelQuery`: the rule of :mod:`hedgerow.client.names`; 422 naming ``route`` or ``model``
and what is wrong). The reads (``GET /v1/routes/{route}`` and its history) refuse only control
characters, so a route stored before that rule can still be read.
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Request, status
from fastapi.responses import JSONResponse
from pydantic import AfterValidator, ValidationError
from sqlalchemy.ext.asyncio import AsyncSession

from hedgerow.api import route_changes
from hedgerow.api._state import app_state
from hedgerow.api.auth import bearer_token, require_scope, token_actor
from hedgerow.api.calls import field_path
from hedgerow.api.deps import get_session
from hedgerow.api.json_body import BodyRefused, documented_body, error_response, read_json_body, unprocessable
from hedgerow.api.json_response import ApiJSONResponse
from hedgerow.api.schemas import (
    NAME_PATTERN,
    NAME_RULE,
    PRINTABLE_PATTERN,
    HistoryOut,
    RouteChangeOut,
    RouteListOut,
    RouteOut,
    RoutePatchIn,
    RoutePutIn,
    no_control_characters,
    valid_model_name,
    valid_route_name,
)
from hedgerow.client.names import MAX_NAME_CHARS
from hedgerow.client.records import format_timestamp
from hedgerow.controller.errors import RouteArchived, RouteLimitExceeded
from hedgerow.controller.ops_bounds import MAX_HISTORY_LIMIT, history_filter_error
from hedgerow.controller.routes_admin import RouteArchive, RouteConfigInvalid
from hedgerow.controller.store.call_failures import failed_calls_by_route
from hedgerow.controller.store.models import utc_now
from hedgerow.controller.store.queries import get_history, get_route, list_routes, resolve_model

__all__ = [
    "MAX_ROUTE_BODY_BYTES",
    "ModelQuery",
    "OptionalModelQuery",
    "RoutePath",
    "Session",
    "StoredModelQuery",
    "StoredRoutePath",
    "request_actor",
    "router",
]

#: Largest body of a PUT/PATCH of a route, bytes (a full configuration is about 300).
MAX_ROUTE_BODY_BYTES = 16_384

router = APIRouter()

#: A database session of the request.
Session = Annotated[AsyncSession, Depends(get_session)]
#: The ``model`` query parameter naming the route's model, where it must be a valid model name
#: (a change, a threshold poll): :mod:`hedgerow.client.names`.
ModelQuery = Annotated[
    str,
    Query(
        min_length=1,
        max_length=MAX_NAME_CHARS,
        description=f"the model of the route ({NAME_RULE})",
        json_schema_extra={"pattern": NAME_PATTERN},
    ),
    AfterValidator(valid_model_name),
]
#: The ``model`` query parameter of a read, where it may be left out (the route's only model).
#: Only control characters are refused: a name stored before the name rule stays readable.
OptionalModelQuery = Annotated[
    str | None,
    Query(min_length=1, max_length=MAX_NAME_CHARS, description="the model of the route (optional when it has one)"),
    AfterValidator(lambda value: None if value is None else no_control_characters(value)),
]
#: The ``{route}`` path parameter where it must be a valid route name (a change, a threshold
#: poll): :mod:`hedgerow.client.names`. May contain ``/`` (matched with the ``path`` converter).
RoutePath = Annotated[
    str,
    Path(
        min_length=1,
        max_length=MAX_NAME_CHARS,
        description=f"the route's name (may contain /; {NAME_RULE}; not ending in /history)",
        json_schema_extra={"pattern": NAME_PATTERN},
    ),
    AfterValidator(valid_route_name),
]
#: The ``{route}`` path parameter of a read: only control characters are refused, so that a
#: route stored before the name rule can still be read (``GET /v1/routes/{route}``, its history).
StoredRoutePath = Annotated[
    str,
    Path(
        min_length=1,
        max_length=MAX_NAME_CHARS,
        description="the route's name (may contain /; no control characters)",
        json_schema_extra={"pattern": PRINTABLE_PATTERN},
    ),
    AfterValidator(no_control_characters),
]
#: The ``model`` query parameter of an archive or restore: required, any stored name (only
#: control characters refused, as the reads).
StoredModelQuery = Annotated[
    str,
    Query(min_length=1, max_length=MAX_NAME_CHARS, description="the model of the route (no control characters)"),
    AfterValidator(no_control_characters),
]


@router.get(
    "/v1/routes",
    dependencies=[Depends(require_scope("read"))],
    response_model=RouteListOut,
    summary="Every route and its threshold",
)
async def get_routes(
    session: Session,
    archived: Annotated[
        bool, Query(description="false (default): the routes in use; true: the archived routes only.")
    ] = False,
) -> Any:
    """Every (route, model) in use (or archived, with ``archived=true``) with its configuration and
    published threshold, and (in use) its calls and failed calls of the last hour."""
    routes = await list_routes(session, archived=archived)
    if archived:
        return {"routes": routes}
    until = utc_now()
    since = until - timedelta(hours=1)
    counts = await failed_calls_by_route(session, since, until)
    for route in routes:
        route["recent_calls"], route["recent_failed_calls"] = counts.get((route["route"], route["model"]), (0, 0))
    return {"routes": routes, "recent_since": format_timestamp(since), "recent_until": format_timestamp(until)}


@router.get(
    "/v1/routes/{route:path}/history",
    dependencies=[Depends(require_scope("read"))],
    response_model=HistoryOut,
    responses={404: {"description": "unknown (route, model)"}},
    summary="Threshold decisions of one route, newest first",
)
async def get_route_history(
    route: StoredRoutePath,
    session: Session,
    model: OptionalModelQuery = None,
    limit: Annotated[int, Query(ge=1, le=MAX_HISTORY_LIMIT)] = 100,
    offset: Annotated[int, Query(ge=0, le=10_000_000, description="Rows skipped first (paging).")] = 0,
    since: Annotated[
        datetime | None, Query(description="Only decisions seen at or after this ISO 8601 time (with a zone).")
    ] = None,
    until: Annotated[
        datetime | None, Query(description="Only decisions first made at or before this ISO 8601 time (with a zone).")
    ] = None,
    applied: Annotated[bool | None, Query(description="true: only applied changes; false: only holds.")] = None,
    reason: Annotated[
        str | None,
        Query(
            min_length=1,
            max_length=64,
            description="Only rows with this reason code (e.g. tail_min); an unknown code is 422.",
        ),
        AfterValidator(no_control_characters),
    ] = None,
) -> Any:
    """Decisions (applied or held) for (route, model), newest first; ``model`` may be left out when
    the route has one model. A hold repeated tick after tick is one row (``repeats``, ``last_at``)."""
    for name, value in (("since", since), ("until", until)):
        if value is not None and value.tzinfo is None:
            return unprocessable(name, "must carry a timezone (e.g. Z)")
        if value is not None and _utc_overflows(value):
            return unprocessable(name, f"out of range: {value.isoformat()} is not within years 1..9999 in UTC")
    problem = history_filter_error(reason=reason, since=since, until=until)
    if problem is not None:
        return unprocessable(*problem)
    chosen = await resolve_model(session, route, model)
    rows = await get_history(
        session, route, chosen, limit=limit, offset=offset, since=since, until=until, applied=applied, reason=reason
    )
    return {"history": rows}


@router.api_route(
    "/v1/routes/{route:path}/history", methods=["PUT", "PATCH", "POST", "DELETE"], include_in_schema=False
)
async def history_is_read_only() -> JSONResponse:
    """405: the history is read-only (without this, ``PUT /v1/routes/a/history`` would change a
    route named ``a/history``)."""
    return error_response(
        status.HTTP_405_METHOD_NOT_ALLOWED, "method", "the threshold history is read-only: use GET", {"Allow": "GET"}
    )


@router.get(
    "/v1/routes/{route:path}",
    dependencies=[Depends(require_scope("read"))],
    response_model=RouteOut,
    responses={404: {"description": "unknown (route, model)"}},
    summary="One route and its threshold",
)
async def get_one_route(
    route: StoredRoutePath,
    session: Session,
    model: OptionalModelQuery = None,
) -> Any:
    """One (route, model) with its configuration and published threshold (``model`` may be left out
    when the route has one model)."""
    return await get_route(session, route, await resolve_model(session, route, model))


def request_actor(request: Request, claimed: str | None) -> str:
    """Who makes a configuration change, for the audit trail (``threshold_history.actor``).

    With bearer tokens configured the caller is identified by its token: the token's name
    (``HEDGEROW_TOKENS`` entry ``name=token:scopes``), else its fingerprint (``token:<12 hex
    digits of an HMAC keyed by every configured token>``, :func:`~hedgerow.api.auth.token_actor`;
    the token itself is never stored). A name given in the body cannot replace that identity: it
    is kept after it as a note, ``alice (note: bob)``. Without tokens (loopback only) the name
    given in the body, or ``api``.

    Args:
        request: the request (its ``Authorization`` header has passed ``require_scope``).
        claimed: the ``actor`` of the body, or None when it was not given.

    Returns:
        At most 200 characters.
    """
    if not app_state(request.app).tokens:
        return claimed or "api"
    identity = token_actor(
        app_state(request.app).tokens, app_state(request.app).token_names, bearer_token(request) or ""
    )
    if not claimed or claimed == identity:
        return identity
    return f"{identity} (note: {claimed})"[:200]


def _utc_overflows(value: datetime) -> bool:
    """True when the aware ``value`` has no UTC equivalent within years 1..9999 (a time at the
    calendar's edge, e.g. ``0001-01-01T00:00+05:00``; the store compares in UTC)."""
    try:
        value.astimezone(UTC)
    except OverflowError:
        return True
    return False


async def _configure(request: Request, route: str, model: str, *, replace: bool) -> Any:
    """Parse and validate the body, apply it; see :func:`put_route` and :func:`patch_route`."""
    schema = RoutePutIn if replace else RoutePatchIn
    try:
        payload = await read_json_body(request, MAX_ROUTE_BODY_BYTES)
    except BodyRefused as refused:
        return refused.answer
    if not isinstance(payload, dict):
        return unprocessable("body", "must be a JSON object of route settings")
    for name, value in payload.items():  # json.loads reads NaN and Infinity, which JSON itself has not
        if name in schema.model_fields and isinstance(value, float) and not math.isfinite(value):
            return unprocessable(name, f"must be finite, got {json.dumps(value)}")
    try:
        body = schema.model_validate(payload)
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        message = "unknown field" if error["type"] == "extra_forbidden" else error["msg"].removeprefix("Value error, ")
        return unprocessable(field_path(tuple(error["loc"])) if error["loc"] else "body", message)
    fields = body.model_dump(exclude_unset=True, exclude={"actor"})
    actor = request_actor(request, body.actor if "actor" in body.model_fields_set else None)
    if "archived" in fields:
        return await _archive_or_restore(request, route, model, fields, actor)
    try:
        result = await route_changes.change_settings(
            app_state(request.app), route, model, fields, replace=replace, actor=actor
        )
    except RouteConfigInvalid as exc:
        return unprocessable(exc.field, exc.message)
    except RouteLimitExceeded as exc:
        return unprocessable(exc.field, str(exc))
    except RouteArchived as exc:
        return error_response(status.HTTP_409_CONFLICT, "route", str(exc))
    except ValueError as exc:
        return unprocessable("route", str(exc))
    answer = RouteChangeOut(route=result.route, changes=result.changes, created=result.created, history=result.history)
    return ApiJSONResponse(
        answer.model_dump(mode="json"), status_code=status.HTTP_201_CREATED if result.created else status.HTTP_200_OK
    )


async def _archive_or_restore(request: Request, route: str, model: str, fields: dict[str, Any], actor: str) -> Any:
    """``PATCH`` with ``archived`` (alone): archive (true) or restore (false) the route; the answer
    is a :class:`RouteChangeOut` whose ``changes`` holds ``archived_at`` (empty when the route was
    already in that state)."""
    if set(fields) != {"archived"}:
        return unprocessable("archived", "give archived alone (actor aside): not with a change of settings")
    if not isinstance(fields["archived"], bool):
        return unprocessable("archived", "must be true (archive) or false (restore), got null")
    change = route_changes.archive if fields["archived"] else route_changes.restore
    try:
        result = await change(app_state(request.app), route, model, actor=actor)
    except RouteLimitExceeded as exc:
        return unprocessable(exc.field, str(exc))
    except ValueError as exc:
        return unprocessable("route", str(exc))
    return _state_answer(result)


def _state_answer(result: RouteArchive) -> ApiJSONResponse:
    """The answer of an archive or a restore, in the shape of a change (:class:`RouteChangeOut`)."""
    changes = {} if result.history is None else result.history["details"]["changes"]
    answer = RouteChangeOut(route=result.route, changes=changes, created=False, history=result.history)
    return ApiJSONResponse(answer.model_dump(mode="json"))


def _field_error(description: str) -> dict[str, Any]:
    """A documented error answer with the ``FieldError`` body."""
    return {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/FieldError"}}},
    }


_CHANGE_RESPONSES: dict[int | str, dict[str, Any]] = {
    409: _field_error("the route is archived: restore it first (PATCH with archived false); field: route"),
    422: {"description": '{"detail": {"field": ..., "message": ...}}: a bad value, named'},
}


@router.put(
    "/v1/routes/{route:path}",
    dependencies=[Depends(require_scope("admin"))],
    response_model=RouteChangeOut,
    responses={201: {"description": "the route was created", "model": RouteChangeOut}, **_CHANGE_RESPONSES},
    openapi_extra=documented_body(RoutePutIn, required=False),
    summary="Replace a route's configuration, creating the route if absent (admin; audited)",
)
async def put_route(request: Request, route: RoutePath, model: ModelQuery) -> Any:
    """Replace the configuration: omitted fields take the defaults of a new route.

    A missing (route, model) is created (201). The threshold is re-decided at once; the change
    is a history row with reason ``config,...``, the actor and ``details.changes``; a replace
    that changes nothing writes no row (``changes: {}``, ``history: null``).
    """
    return await _configure(request, route, model, replace=True)


@router.patch(
    "/v1/routes/{route:path}",
    dependencies=[Depends(require_scope("admin"))],
    response_model=RouteChangeOut,
    responses={404: {"description": "unknown (route, model)"}, **_CHANGE_RESPONSES},
    openapi_extra=documented_body(RoutePatchIn, required=False),
    summary="Change some of a route's settings (admin; audited)",
)
async def patch_route(request: Request, route: RoutePath, model: ModelQuery) -> Any:
    """Change the given settings; the threshold is re-decided at once and the history records it
    (reason ``config,...``, actor, ``details.changes``); a patch that changes nothing writes no row.
    ``{"archived": false}`` restores an archived route (``true`` archives it, as ``DELETE``): a
    history row with reason ``restored`` (``archived``), ``changes.archived_at``; a restore past
    ``max_routes`` or ``max_models_per_route`` is 422."""
    return await _configure(request, route, model, replace=False)


@router.delete(
    "/v1/routes/{route:path}",
    dependencies=[Depends(require_scope("admin"))],
    response_model=RouteChangeOut,
    responses={404: {"description": "unknown (route, model)"}},
    summary="Archive a route: out of lists, thresholds, ticks and the route cap; history kept (admin; audited)",
)
async def delete_route(request: Request, route: StoredRoutePath, model: StoredModelQuery) -> Any:
    """Archive (route, model): nothing is deleted. It leaves ``GET /v1/routes``, the threshold table
    and the controller's ticks, stops counting against ``max_routes``, and records naming it are
    refused; its calls and history stay readable. A history row with reason ``archived`` records
    who did it (``changes.archived_at``). Archiving it again changes nothing (same
    ``archived_at``, ``changes: {}``, ``history: null``). ``PATCH`` with ``{"archived": false}``
    restores it."""
    try:
        result = await route_changes.archive(app_state(request.app), route, model, actor=request_actor(request, None))
    except ValueError as exc:
        return unprocessable("route", str(exc))
    return _state_answer(result)
