"""``POST /v1/controller/run`` (admin): run one controller tick now, under the lease."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request

from hedgerow.api._state import app_state
from hedgerow.api.auth import require_scope
from hedgerow.api.schemas import ControllerRunOut

__all__ = ["router"]

router = APIRouter(dependencies=[Depends(require_scope("admin"))])


@router.post("/v1/controller/run", response_model=ControllerRunOut, summary="Run one tick now")
async def run_controller(request: Request) -> Any:
    """Tick now; ``ran`` is false (and nothing is written) when another process holds the lease."""
    rows = await app_state(request.app).scheduler.tick()
    return {"ran": rows is not None, "history": rows or []}
