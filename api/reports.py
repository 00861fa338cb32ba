"""``GET /v1/reports/weekly?week=2026-W48&format=json|csv|html|md`` (read scope): the weekly report.

``week`` defaults to the current ISO week (partial); a week that has not started is refused.
``format`` defaults to ``json`` (schema
``hedgerow.weekly_report/1``, :mod:`hedgerow.controller.report.report`). The figures are those of
``hedgerow report weekly`` and of the scheduled job: all three call
:func:`hedgerow.controller.report.report_store.weekly_report`. A bad ``week`` or ``format`` is 422
``{"detail": {"field": ..., "message": ...}}``.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response

from hedgerow.api._report_cache import cached_report
from hedgerow.api.auth import require_scope
from hedgerow.api.json_body import unprocessable
from hedgerow.controller.ops_bounds import unstarted_week_message
from hedgerow.controller.report.report import IsoWeek
from hedgerow.controller.report.report_render import FORMATS, MEDIA_TYPES
from hedgerow.controller.store.models import utc_now

__all__ = ["router"]

router = APIRouter()


def _bad_week(message: str) -> JSONResponse:
    return unprocessable("week", message)


@router.get(
    "/v1/reports/weekly",
    dependencies=[Depends(require_scope("read"))],
    summary="The weekly cost/latency report",
    responses={
        200: {"content": {media: {} for media in MEDIA_TYPES.values()}},
        422: {"description": '{"detail": {"field": "week"|"format", "message": ...}}'},
    },
)
async def get_weekly_report(request: Request, week: str | None = None, format: str = "json") -> Any:
    """The report of ``week`` (default: the current one) in ``format`` (default json); 422 for a
    malformed week, one out of the calendar's range or one that has not started."""
    if format not in FORMATS:
        return unprocessable("format", f"must be one of {', '.join(FORMATS)}")
    parsed = None
    if week is not None:
        try:
            parsed = IsoWeek.parse(week)
        except ValueError as exc:
            return _bad_week(str(exc))
        unstarted = unstarted_week_message(parsed, IsoWeek.of(utc_now()))
        if unstarted is not None:
            return _bad_week(unstarted)
    week_text = str(parsed if parsed is not None else IsoWeek.of(utc_now()))
    answer = await cached_report(request, week_text, format)
    if isinstance(answer, dict):
        return JSONResponse(answer)
    body = answer
    name = f"hedgerow-weekly-{week_text}.{format}"
    disposition = "inline" if format == "html" else f'attachment; filename="{name}"'
    return Response(body, media_type=MEDIA_TYPES[format], headers={"Content-Disposition": disposition})
