"""Fill a store with the report workload: records, prices and a few threshold decisions."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from hedgerow.client.records import CallRecord
from hedgerow.controller.store.ingest import ingest_calls, route_defaults
from hedgerow.controller.store.models import Route, ThresholdHistory
from hedgerow.controller.store.prices import parse_price, set_price
from hedgerow.settings import Settings
from tests.controller.report_workload import MONDAY, PRICES, week_records

__all__ = ["fill_store"]

#: Decisions of ``chat``/``m-priced`` during W48: (hours after Monday 00:00, value, applied, reason).
DECISIONS = (
    (-30, 1.0, True, "target"),
    (10, 0.8, True, "target"),
    (30, 0.8, False, "hysteresis_hold"),
    (60, 1.2, True, "raise_over_budget,backups_rarely_win"),
    (100, 0.9, True, "target"),
)


async def fill_store(
    sessionmaker: async_sessionmaker[AsyncSession], *, per_route: int = 900, records: list[CallRecord] | None = None
) -> None:
    """Ingest :func:`week_records` (or ``records``, e.g. those with other clients), set :data:`PRICES`
    and add :data:`DECISIONS` to the history."""
    records = week_records(per_route=per_route) if records is None else records
    async with sessionmaker() as session, session.begin():
        await ingest_calls(session, records, defaults=route_defaults(Settings()))
        for price in PRICES:
            body = {
                "upstream": price.upstream or None,
                "effective_from": price.since.isoformat(),
                "input_usd_per_mtok": price.input_usd,
                "output_usd_per_mtok": price.output_usd,
                "cached_input_usd_per_mtok": price.cached_usd,
            }
            await set_price(session, parse_price(body, model="m-priced"), source="api", actor="test")
        route_id = await session.scalar(select(Route.id).where(Route.route == "chat", Route.model == "m-priced"))
        previous = None
        for hours, value, applied, reason in DECISIONS:
            session.add(
                ThresholdHistory(
                    route_id=route_id, computed_at=MONDAY + timedelta(hours=hours),
                    last_at=MONDAY + timedelta(hours=hours), previous_hedge_after_s=previous,
                    hedge_after_s=value, applied=applied, reason=reason, source="controller", window_s=3600.0,
                    samples=500, censored=20, budget=0.1,
                )
            )  # fmt: skip
            if applied:
                previous = value
