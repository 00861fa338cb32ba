"""Benchmark: what one controller tick costs per route, as the number of routes grows.

Each route gets ``--calls`` realistic hedged records (``bench/controller_tick.py``'s generator:
~10% hedged, censored primaries included) in the last 30 minutes; one tick then decides every
route. Wall time per tick and per route, on a SQLite file and on PostgreSQL when
``HEDGEROW_TEST_DATABASE_URL`` is set. The per-route figure times ``HEDGEROW_MAX_ROUTES`` must
stay under ``HEDGEROW_CONTROLLER_INTERVAL_S`` (the tick runs once per interval).

Run: ``python bench/tick_per_route.py [--routes 10,100,1000] [--calls 100] [--json bench/results/tick_per_route.json]``.
Prints a table and writes JSON. Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from controller_tick import reset_postgres, synthetic_records

from hedgerow.client.records import CallRecord
from hedgerow.controller.jobs import run_tick
from hedgerow.controller.store.db import make_engine, make_sessionmaker, upgrade_database
from hedgerow.controller.store.ingest import ingest_calls, route_defaults
from hedgerow.settings import Settings


async def measure(url: str, routes: int, calls: int) -> dict[str, float | int]:
    """Ingest ``calls`` records for each of ``routes`` routes into a fresh store; time one tick.

    Returns:
        ``routes``, ``calls_per_route``, ``tick_s`` and ``tick_ms_per_route``.
    """
    upgrade_database(url)
    engine = make_engine(url)
    sessionmaker = make_sessionmaker(engine)
    settings = Settings(database_url=url, window_s=3600, max_routes=max(routes, 1))
    now = datetime.now(UTC)
    base = synthetic_records(calls, now)
    defaults = route_defaults(settings)
    batch: list[CallRecord] = []
    for r in range(routes):
        batch.extend(dataclasses.replace(rec, request_id=f"{rec.request_id}-r{r}", route=f"route-{r}") for rec in base)
        if len(batch) >= 1000 or r == routes - 1:
            async with sessionmaker() as session, session.begin():
                await ingest_calls(session, batch, defaults=defaults)
            batch = []
    start = time.perf_counter()
    rows = await run_tick(sessionmaker, settings, now=now)
    tick_s = time.perf_counter() - start
    await engine.dispose()
    assert len(rows) == routes
    return {"routes": routes, "calls_per_route": calls, "tick_s": tick_s, "tick_ms_per_route": 1000 * tick_s / routes}


async def main(route_counts: list[int], calls: int, json_path: Path | None) -> None:
    """Run every route count on SQLite (and PostgreSQL if configured); print and save the results."""
    results = []
    pg = os.environ.get("HEDGEROW_TEST_DATABASE_URL")
    for routes in route_counts:
        with tempfile.TemporaryDirectory() as tmp:
            results.append({"store": "sqlite", **await measure(f"sqlite+aiosqlite:///{tmp}/bench.db", routes, calls)})
        if pg:
            await reset_postgres(pg)
            results.append({"store": "postgresql", **await measure(pg, routes, calls)})
    print(f"{'store':<11} {'routes':>7} {'calls/route':>12} {'tick s':>8} {'ms per route':>13}")
    for r in results:
        print(
            f"{r['store']:<11} {r['routes']:>7} {r['calls_per_route']:>12} {r['tick_s']:>8.2f} "
            f"{r['tick_ms_per_route']:>13.2f}"
        )
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        document = {"benchmark": "tick_per_route", "python": sys.version.split()[0], "results": results}
        json_path.write_text(json.dumps(document, indent=2) + "\n")
        print(f"written to {json_path}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--routes", default="10,100,1000", help="comma-separated route counts")
    parser.add_argument("--calls", type=int, default=100, help="calls per route")
    parser.add_argument("--json", type=Path, default=Path("bench/results/tick_per_route.json"))
    args = parser.parse_args()
    asyncio.run(main([int(s) for s in args.routes.split(",")], args.calls, args.json))
