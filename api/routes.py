"""Routes: list, one, change (admin, audited) and threshold history.

``GET /v1/routes``, ``GET /v1/routes/{route}?model=``, ``PATCH /v1/routes/{route}?model=``
(admin scope; applied at once, the decision it causes is a history row with the actor) and
``GET /v1/routes/{route}/history?model=&limit=`` (newest first).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse
from sqlalchemy.ext.asyncio import AsyncSession

from hedgerow.api.auth import require_scope
from hedgerow.api.deps import get_session
from hedgerow.api.schemas import HistoryOut, RouteChangeOut, RouteListOut, RouteOut, RoutePatchIn
from hedgerow.controller.queries import get_history, get_route, list_routes
from hedgerow.controller.routes_admin import update_route

__all__ = ["router", "MAX_HISTORY_LIMIT"]

#: Largest ``limit`` of a history query.
MAX_HISTORY_LIMIT = 10_000

router = APIRouter()


@router.get("/v1/routes", dependencies=[Depends(require_scope("read"))], response_model=RouteListOut, summary="Every route and its threshold")
async def get_routes(session: AsyncSession = Depends(get_session)) -> Any:
    """Every (route, model) with its configuration and published threshold."""
    return {"routes": await list_routes(session)}


@router.get(
    "/v1/routes/{route}",
    dependencies=[Depends(require_scope("read"))],
    response_model=RouteOut,
    responses={404: {"description": "unknown (route, model)"}},
    summary="One route and its threshold",
)
async def get_one_route(
    route: str,
    model: str = Query(..., min_length=1),
    session: AsyncSession = Depends(get_session),
) -> Any:
    """One (route, model) with its configuration and published threshold."""
    return await get_route(session, route, model)


@router.get(
    "/v1/routes/{route}/history",
    dependencies=[Depends(require_scope("read"))],
    response_model=HistoryOut,
    responses={404: {"description": "unknown (route, model)"}},
    summary="Threshold decisions of one route, newest first",
)
async def get_route_history(
    route: str,
    model: str = Query(..., min_length=1),
    limit: int = Query(100, ge=1, le=MAX_HISTORY_LIMIT),
    since: datetime | None = Query(None, description="Only decisions at or after this ISO 8601 time (with a zone)."),
    session: AsyncSession = Depends(get_session),
) -> Any:
    """The newest ``limit`` decisions (applied or held) for (route, model), newest first."""
    if since is not None and since.tzinfo is None:
        return JSONResponse({"detail": {"field": "since", "message": "must carry a timezone (e.g. Z)"}},
                            status_code=422)
    return {"history": await get_history(session, route, model, limit=limit, since=since)}


@router.patch(
    "/v1/routes/{route}",
    dependencies=[Depends(require_scope("admin"))],
    response_model=RouteChangeOut,
    responses={404: {"description": "unknown (route, model)"}, 422: {"description": "bad value"}},
    summary="Change a route's configuration (admin; audited)",
)
async def patch_route(
    request: Request,
    body: RoutePatchIn,
    route: str,
    model: str = Query(..., min_length=1),
) -> Any:
    """Change the given settings; the threshold is re-decided at once and the history records it."""
    changes = body.model_dump(exclude_unset=True, exclude={"actor"})
    try:
        changed, history = await update_route(
            request.app.state.sessionmaker, request.app.state.settings, route, model, changes,
            actor=body.actor,
        )
    except ValueError as exc:
        return JSONResponse({"detail": {"message": str(exc)}}, status_code=422)
    return {"route": changed, "history": history}
