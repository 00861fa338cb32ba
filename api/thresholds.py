"""``GET /v1/thresholds`` (the whole table, strong ETag, 304) and ``GET /v1/thresholds/{route}``.

``{route}`` may contain ``/`` (matched with Starlette's ``path`` converter, see
:mod:`hedgerow.api.routes`). ``model`` may be left out when the route has exactly one model (as in
``GET /v1/routes/{route}``): 422 naming ``model`` and listing them when it has several, 404 naming
the route when it has none.

The table's body is rendered deterministically from the stored rows (``generated_at`` is the
newest ``updated_at``), so its ETag, a SHA-256 of the body, changes exactly when the table does.
The rendered body and ETag are kept in memory (:class:`~hedgerow.api._threshold_cache.ThresholdCache`
on ``app.state.thresholds``): a poll within a second of the last check of the store's change
counter, 200 or 304, touches no database.
"""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request, Response
from pydantic import AfterValidator

from hedgerow.api._state import app_state
from hedgerow.api._threshold_cache import ThresholdCache
from hedgerow.api.auth import BEARER_SECURITY, authorize, require_scope
from hedgerow.api.routes import RoutePath, Session
from hedgerow.api.schemas import NAME_PATTERN, NAME_RULE, ThresholdOut, ThresholdTableOut, valid_model_name
from hedgerow.client.names import MAX_NAME_CHARS
from hedgerow.controller.store.queries import get_threshold, resolve_model

__all__ = ["etag_matches", "etag_of", "make_threshold_cache", "render_table", "router", "table_body"]

router = APIRouter()

#: Scopes that may read thresholds (``admin`` everywhere).
_READERS = frozenset({"ingest", "read", "admin"})
#: ``model`` of a threshold poll: a valid model name when given (:mod:`hedgerow.client.names`),
#: optional when the route has one model.
_PollModelQuery = Annotated[
    str | None,
    Query(
        min_length=1,
        max_length=MAX_NAME_CHARS,
        description=f"the model of the route ({NAME_RULE}); may be left out when the route has exactly one",
        json_schema_extra={"pattern": NAME_PATTERN},
    ),
    AfterValidator(lambda value: None if value is None else valid_model_name(value)),
]


def table_body(thresholds: list[dict[str, Any]]) -> bytes:
    """The JSON body of the threshold table (compact, deterministic)."""
    generated_at = max((t["updated_at"] for t in thresholds), default=None)
    payload = {"thresholds": thresholds, "generated_at": generated_at}
    return json.dumps(payload, separators=(",", ":"), allow_nan=False).encode()


def etag_of(body: bytes) -> str:
    """A strong ETag (quoted) of a response body."""
    return '"' + hashlib.sha256(body).hexdigest()[:32] + '"'


def render_table(thresholds: list[dict[str, Any]]) -> tuple[bytes, str]:
    """The table's body (:func:`table_body`) and its ETag (:func:`etag_of`)."""
    body = table_body(thresholds)
    return body, etag_of(body)


def make_threshold_cache(sessionmaker: Any, check_interval_s: float) -> ThresholdCache:
    """The app's cache of the rendered table (see :mod:`hedgerow.api._threshold_cache`).

    Args:
        sessionmaker: the app's ``async_sessionmaker``.
        check_interval_s: seconds between two reads of the store's change counter, >= 0.
    """
    return ThresholdCache(sessionmaker, render_table, check_interval_s=check_interval_s)


def etag_matches(if_none_match: str | None, etag: str) -> bool:
    """True when an ``If-None-Match`` header names ``etag`` (weak comparison, RFC 9110 13.1.2)."""
    if not if_none_match:
        return False
    if if_none_match.strip() == "*":
        return True
    wanted = etag.removeprefix("W/")
    return any(tag.strip().removeprefix("W/") == wanted for tag in if_none_match.split(","))


@router.get(
    "/v1/thresholds",
    response_model=ThresholdTableOut,
    responses={304: {"description": "the table is unchanged since the ETag given"}},
    openapi_extra={"security": BEARER_SECURITY},
    summary="Every published threshold",
)
async def get_thresholds(request: Request) -> Response:
    """The threshold table with a strong ETag; 304 when ``If-None-Match`` names it (from memory).

    The scope is checked inline (:func:`~hedgerow.api.auth.authorize`, the rule of
    ``require_scope``): this is the endpoint every client polls.
    """
    authorize(request, _READERS)
    cache: ThresholdCache = app_state(request.app).thresholds
    table = await cache.current()
    headers = {"ETag": table.etag, "Cache-Control": "no-cache"}
    if etag_matches(request.headers.get("if-none-match"), table.etag):
        return Response(status_code=304, headers=headers)
    return Response(content=table.body, media_type="application/json", headers=headers)


@router.get(
    "/v1/thresholds/{route:path}",
    response_model=ThresholdOut,
    responses={
        404: {"description": "unknown (route, model), or nothing published yet"},
        422: {"description": "a bad name, or model left out of a route with several models (listed)"},
    },
    dependencies=[Depends(require_scope("ingest", "read"))],
    summary="The published threshold of one (route, model)",
)
async def get_one_threshold(
    route: RoutePath,
    session: Session,
    model: _PollModelQuery = None,
) -> Any:
    """One published threshold (404 for an unknown route or before the first tick); without
    ``model``, that of the route's only model (422 listing them when it has several)."""
    return await get_threshold(session, route, await resolve_model(session, route, model))
