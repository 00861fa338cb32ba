"""``GET /healthz`` (the process answers) and ``GET /readyz`` (database reachable, at head)."""

from __future__ import annotations

import logging

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from hedgerow.api._state import app_state
from hedgerow.api.schemas import HealthOut, ReadyOut
from hedgerow.controller.errors import StoreNotReady
from hedgerow.controller.store.db import check_ready

__all__ = ["router"]

router = APIRouter()

log = logging.getLogger(__name__)

#: The reason ``/readyz`` gives (it needs no token: the database's own error text stays in the log).
NOT_READY_REASON = "database unreachable or not migrated to the newest revision (details in the server log)"


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
    """200 ``{"status": "ready", "revision": ...}``, or 503 with a generic reason (the database's
    error, which may name hosts and users, is logged, not answered: this endpoint needs no token)."""
    try:
        revision = await check_ready(app_state(request.app).engine)
    except StoreNotReady as exc:
        log.warning("not ready: %s", exc)
        return JSONResponse({"status": "not ready", "reason": NOT_READY_REASON}, status_code=503)
    return JSONResponse({"status": "ready", "revision": revision})
