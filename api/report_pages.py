"""The weekly report in the ops console: ``/ui/reports`` (the weeks) and one week's report.

- ``GET /ui/reports``: every ISO week from the first with data (a raw call or an hourly rollup)
  to the current one, newest first (at most :data:`MAX_WEEKS`), the current one marked partial;
- ``GET /ui/reports/{week}``: the console page of one week (``2026-W48``): links to its four
  formats and the self-contained HTML report shown in a frame;
- ``GET /ui/reports/{week}/report.{html,json,csv,md}``: the report itself, as
  ``GET /v1/reports/weekly`` gives it (the same :func:`~hedgerow.controller.report.report_store.weekly_report`),
  under the page's cookie login instead of a bearer token.

Like every console page these need the ``read`` scope when tokens are configured.
"""

from __future__ import annotations

from datetime import UTC, datetime

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from sqlalchemy import func, select

from hedgerow.api._page_kit import error_page, page_user, render_page
from hedgerow.api._report_cache import cached_report
from hedgerow.api._state import app_state
from hedgerow.controller.ops_bounds import unstarted_week_message
from hedgerow.controller.report.report import IsoWeek
from hedgerow.controller.report.report_render import FORMATS, MEDIA_TYPES
from hedgerow.controller.store.models import Call, HourlyRollup, utc_now

__all__ = ["MAX_WEEKS", "router"]

router = APIRouter(prefix="/ui/reports", include_in_schema=False)

#: The most weeks the list shows (two years).
MAX_WEEKS = 104
#: Where an error page of a report leads back to.
_BACK = ("/ui/reports", "weekly reports")


def _aware(moment: datetime) -> datetime:
    """``moment`` as aware UTC (SQLite hands back naive UTC times from aggregates)."""
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


async def _first_moment(request: Request) -> datetime | None:
    """The earliest call or rollup hour in the store, or None in an empty store."""
    async with app_state(request.app).sessionmaker() as session:
        first_call = await session.scalar(select(func.min(Call.started_at)))
        first_hour = await session.scalar(select(func.min(HourlyRollup.hour_start)))
    found = [_aware(m) for m in (first_call, first_hour) if m is not None]
    return min(found) if found else None


@router.get("", response_class=HTMLResponse)
async def reports_page(request: Request) -> HTMLResponse:
    """The weeks that have a report, newest first."""
    user = page_user(request)
    now = utc_now()
    current = IsoWeek.of(now)
    first = await _first_moment(request)
    weeks: list[IsoWeek] = []
    if first is not None:
        oldest = IsoWeek.of(min(first, now))
        week = current
        while len(weeks) < MAX_WEEKS:
            weeks.append(week)
            if week == oldest:
                break
            week = week.previous()
    rows = [{"week": str(w), "since": w.since, "partial": w == current} for w in weeks]
    return render_page(request, "reports.html", user, title="Weekly reports", rows=rows)


def _parse_week(text: str) -> IsoWeek:
    """The week of a path segment, up to the current week.

    Raises:
        ValueError: malformed, out of the calendar's range, or not started; the message names
            the segment.
    """
    parsed = IsoWeek.parse(text)  # its errors name the week already
    unstarted = unstarted_week_message(parsed, IsoWeek.of(utc_now()))
    if unstarted is not None:
        raise ValueError(unstarted)
    return parsed


@router.get("/{week}", response_class=HTMLResponse)
async def report_page(request: Request, week: str) -> HTMLResponse:
    """One week's report inside the console."""
    user = page_user(request)
    try:
        parsed = _parse_week(week)
    except ValueError as exc:
        return error_page(request, user, 422, str(exc), back=_BACK)
    partial = parsed == IsoWeek.of(utc_now())
    return render_page(
        request, "report_week.html", user, title=f"Week {parsed}", week=str(parsed), partial=partial, formats=FORMATS
    )


@router.get("/{week}/report.{fmt}")
async def report_file(request: Request, week: str, fmt: str) -> Response:
    """The report of ``week`` in ``fmt`` (html, json, csv or md)."""
    user = page_user(request)
    if fmt not in FORMATS:
        return error_page(request, user, 404, f"no report format {fmt!r}; formats: {', '.join(FORMATS)}", back=_BACK)
    try:
        parsed = _parse_week(week)
    except ValueError as exc:
        return error_page(request, user, 422, str(exc), back=_BACK)
    answer = await cached_report(request, str(parsed), fmt)
    if isinstance(answer, dict):
        return JSONResponse(answer)
    body = answer
    disposition = "inline" if fmt == "html" else f'attachment; filename="hedgerow-weekly-{parsed}.{fmt}"'
    return Response(body, media_type=MEDIA_TYPES[fmt], headers={"Content-Disposition": disposition})
