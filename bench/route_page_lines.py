"""Benchmark: what the per-upstream P90 lines cost the route page (``/ui/routes/{route}``).

Builds a store (a SQLite file, or the PostgreSQL database of ``--db``, whose ``public`` schema is
dropped first) with ``--calls`` calls over the last 24 hours on ``--routes`` routes and four
upstreams (the workload of ``bench/upstreams_query.py``), then times, ``--repeat`` times each and
in the same run: the route page of ``route-0`` over ``24h`` through the app (lifespan running,
httpx in process) with its lines read from the store, the same page again within a minute (the
lines kept), the page with the lines left out (the store function replaced by an empty answer),
the store function alone, and a plain ``count(*)`` of the route's attempts with a TTFT sample in
the range, joined to their calls (what the database needs just to visit them)
(:func:`~hedgerow.controller.store.upstream_series.upstream_ttft_series`). Prints the medians.

Run: ``python bench/route_page_lines.py [--calls 100000] [--routes 1] [--repeat 7]
[--db postgresql+asyncpg://...]``. Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from unittest.mock import patch

import httpx
from sqlalchemy import and_, func, or_, select, text
from sqlalchemy.ext.asyncio import create_async_engine

import hedgerow.api.pages as pages
from hedgerow.api.app import create_app
from hedgerow.controller.store.db import make_engine, make_sessionmaker, upgrade_database
from hedgerow.controller.store.ingest import ingest_calls, route_defaults
from hedgerow.controller.store.models import Attempt, Call, Route
from hedgerow.controller.store.upstream_series import upstream_ttft_series
from hedgerow.settings import Settings

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the bench scripts import each other by file name

from upstreams_query import _records


async def _median_s(repeat: int, run: Any) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        await run()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


async def _no_lines(_session: Any, *, since: datetime, until: datetime, **_: Any) -> dict[str, Any]:
    return {"since": since, "until": until, "slot_s": 3600, "upstreams": [], "truncated": False}


async def main() -> None:
    """Build the store, time the page with and without the lines, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=100_000)
    parser.add_argument("--routes", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--db", default=None, help="PostgreSQL URL (default: a SQLite file)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        url = args.db or f"sqlite+aiosqlite:///{Path(tmp) / 'bench.db'}"
        if args.db:
            reset = create_async_engine(url)
            async with reset.begin() as connection:
                await connection.execute(text("DROP SCHEMA IF EXISTS public CASCADE"))
                await connection.execute(text("CREATE SCHEMA public"))
            await reset.dispose()
        upgrade_database(url)
        engine = make_engine(url)
        sessions = make_sessionmaker(engine)
        now = datetime.now(UTC)
        records = _records(args.calls, args.routes, now)
        defaults = route_defaults(Settings(max_routes=max(1000, args.routes)))
        for start in range(0, len(records), 1000):
            async with sessions() as session, session.begin():
                await ingest_calls(session, records[start : start + 1000], defaults=defaults)
        if engine.dialect.name == "postgresql":
            async with engine.connect() as connection:
                await connection.execute(text("ANALYZE"))
        print(f"{args.calls} calls on {args.routes} route(s) ({engine.dialect.name})")

        async def store_only() -> None:
            async with sessions() as session:
                await upstream_ttft_series(
                    session, route="route-0", model="m1", since=now - timedelta(days=1), until=datetime.now(UTC)
                )

        app = create_app(Settings(database_url=url, controller_interval_s=3600.0, allowed_hosts="bench.test"))
        rows = []
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://bench.test") as client:

                async def page() -> None:
                    answer = await client.get("/ui/routes/route-0", params={"model": "m1", "range": "24h"})
                    assert answer.status_code == 200, answer.text

                async def cold_page() -> None:  # the lines read again (none kept from a view before)
                    app.state.upstream_lines_cache = None
                    await page()

                await page()  # warm the database's caches
                cold = await _median_s(args.repeat, cold_page)
                warm = await _median_s(args.repeat, page)
                with patch.object(pages, "upstream_ttft_series", _no_lines):
                    without = await _median_s(args.repeat, cold_page)
                cold_again = await _median_s(args.repeat, cold_page)
        rows.append(("route page, 24h, without the lines", without))
        rows.append(("route page, 24h, lines read", statistics.median([cold, cold_again])))
        rows.append(("route page, 24h, lines kept (< 60 s)", warm))
        rows.append(("upstream_ttft_series alone, 24h", await _median_s(args.repeat, store_only)))

        async def baseline() -> None:  # what the database needs just to visit the route's attempts
            join = and_(Call.id == Attempt.call_id, Call.started_at == Attempt.call_started_at)
            since = now - timedelta(days=1)
            query = select(func.count()).select_from(Attempt).join(Call, join)
            query = query.where(
                Call.route_id == select(Route.id).where(Route.route == "route-0").scalar_subquery(),
                Call.started_at >= since,
                Attempt.call_started_at >= since,
                or_(Attempt.first_token_s.is_not(None), Attempt.outcome == "cancelled"),
            )
            async with sessions() as session:
                await session.scalar(query)

        rows.append(("count(*) of the range's attempts (baseline)", await _median_s(args.repeat, baseline)))
        print(f"{'what':<45} {'median ms':>10}")
        for name, value in rows:
            print(f"{name:<45} {value * 1000:>10.1f}")
        await engine.dispose()


if __name__ == "__main__":
    asyncio.run(main())
