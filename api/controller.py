"""``POST /v1/controller/run`` (admin): run one controller tick now, under the lease.

The answer (:class:`~hedgerow.api.schemas.ControllerRunOut`) holds one history row per route,
each with its plain-English explanation: at 1,000 routes that is about 1.4 MB of JSON and some
50 ms of CPU to build. It is streamed in batches of :data:`ROWS_PER_CHUNK` rows with the event
loop free between batches, so the threshold polls and record batches this process answers at
the same time wait for one batch at most, not for the whole body.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import StreamingResponse

from hedgerow.api._state import app_state
from hedgerow.api.auth import require_scope
from hedgerow.api.json_response import api_json_bytes
from hedgerow.api.schemas import ControllerRunOut, HistoryRowOut

__all__ = ["ROWS_PER_CHUNK", "router", "run_body"]

router = APIRouter(dependencies=[Depends(require_scope("admin"))])

#: History rows serialised per chunk of the answer (about 1.4 KB and 50-230 µs of CPU each, the
#: second figure on a 2-core machine during a tick): between two chunks the loop serves polls, so
#: a poll waits for at most one chunk (at 50 rows, polls during a 1,000-route answer took 150-250 ms).
ROWS_PER_CHUNK = 10


@router.post("/v1/controller/run", response_model=ControllerRunOut, summary="Run one tick now")
async def run_controller(request: Request) -> StreamingResponse:
    """Tick now; ``ran`` is false (and nothing is written) when another process holds the lease."""
    rows = await app_state(request.app).scheduler.tick()
    return StreamingResponse(run_body(rows), media_type="application/json")


async def run_body(rows: Sequence[dict[str, Any]] | None) -> AsyncIterator[bytes]:
    """The JSON of ``ControllerRunOut`` for a tick's ``rows`` (None: not run), in chunks.

    Each chunk holds at most :data:`ROWS_PER_CHUNK` rows, validated by :class:`HistoryRowOut` as
    the response model would and written as every api answer is
    (:func:`~hedgerow.api.json_response.api_json_bytes`: floats without binary noise); the loop
    runs other tasks between chunks. The chunks joined are one JSON document equal to the api's
    rendering of ``ControllerRunOut(ran=..., history=rows)``.
    """
    yield b'{"ran":true,"history":[' if rows is not None else b'{"ran":false,"history":['
    history = rows or ()
    for start in range(0, len(history), ROWS_PER_CHUNK):
        if start:
            await asyncio.sleep(0)  # let polls and ingest run between two batches
        batch = history[start : start + ROWS_PER_CHUNK]
        parts = [api_json_bytes(HistoryRowOut.model_validate(row).model_dump(mode="json")) for row in batch]
        yield (b"," if start else b"") + b",".join(parts)
    yield b"]}"
