"""``GET /healthz`` (the process answers) and ``GET /readyz`` (database reachable, at head)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from hedgerow.api.schemas import HealthOut, ReadyOut
from hedgerow.controller.db import check_ready
from hedgerow.controller.errors import StoreNotReady

__all__ = ["router"]

router = APIRouter()


@router.get("/healthz", response_model=HealthOut, summary="Liveness")
async def healthz() -> dict[str, str]:
    """Always ``{"status": "ok"}`` while the process serves requests."""
    return {"status": "ok"}


@router.get(
    "/readyz",
    response_model=ReadyOut,
    responses={503: {"model": ReadyOut, "description": "database unreachable or not migrated"}},
    summary="Readiness",
)
async def readyz(request: Request) -> JSONResponse:
    """200 ``{"status": "ready", "revision": ...}``, or 503 with the reason."""
    try:
        revision = await check_ready(request.app.state.engine)
    except StoreNotReady as exc:
        return JSONResponse({"status": "not ready", "reason": str(exc)}, status_code=503)
    return JSONResponse({"status": "ready", "revision": revision})
