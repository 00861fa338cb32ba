"""Benchmark: how long the rollup + retention job takes on a backlog of raw calls.

Fills a fresh store (SQLite file by default, or ``--db`` PostgreSQL) with ``--calls`` call records
spread evenly over ``--days`` days and ``--routes`` (route, model) pairs, ingested in time order
in batches of 1,000 (the workload of ``tests/controller/rollup_workload.py``: hedges, failovers,
errors, censored primaries). Then times, with the default 14-day retention:

* ``fold (backlog)``: the first :func:`fold_hours` over every complete hour;
* ``fold (no change, full)`` and ``fold (no change)``: the same again, which must write nothing,
  looking at every hour (``full=True``: what every fold did before folds became incremental) and
  looking only at the calls since the last fold (the hourly steady state);
* ``fold (new hour, full)`` and ``fold (new hour)``: after ``--new`` more calls of the last
  complete hour (late records: that hour is refolded), each way in turn on its own new calls;
* ``delete``: :func:`delete_folded_raw` of the hours older than the retention age;
* ``merge week``: :func:`merge_rollups` of the last 7 days plus :meth:`Rollup.figures`.

Run from the repository root: ``python bench/rollup_retention.py [--calls 50000] [--days 16]
[--routes 3] [--new 1000] [--db URL] [--json bench/results/rollup_retention.json]``. Prints a table and writes
JSON. Not a test: nothing is asserted. PostgreSQL: the database given is emptied first.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hedgerow.controller.store.db import make_engine, make_sessionmaker, upgrade_database
from hedgerow.controller.store.ingest import ingest_calls, route_defaults
from hedgerow.controller.store.models import utc_now
from hedgerow.controller.store.retention import delete_folded_raw
from hedgerow.controller.store.rollups import Rollup, floor_hour, fold_hours, merge_rollups
from hedgerow.settings import Settings
from tests.controller.rollup_workload import workload


async def _reset_postgres(url: str) -> None:
    from sqlalchemy import text
    from sqlalchemy.ext.asyncio import create_async_engine

    engine = create_async_engine(url)
    try:
        async with engine.begin() as connection:
            await connection.execute(text("DROP SCHEMA IF EXISTS public CASCADE"))
            await connection.execute(text("CREATE SCHEMA public"))
    finally:
        await engine.dispose()


async def run(url: str, calls: int, days: float, routes: int, new: int = 1000) -> dict[str, Any]:
    """Fill the store, time each step; returns the JSON result."""
    if url.startswith("postgresql"):
        await _reset_postgres(url)
    await asyncio.to_thread(upgrade_database, url)
    engine = make_engine(url)
    sessionmaker = make_sessionmaker(engine)
    settings = Settings()
    now = utc_now()
    start = now - timedelta(days=days)
    pairs = [(f"route{i}", "m1") for i in range(routes)]
    records = sorted(workload(calls, seed=1, start=start, span_s=days * 86400, pairs=pairs),
                     key=lambda r: r.started_at)  # fmt: skip
    t0 = time.perf_counter()
    for i in range(0, len(records), 1000):
        async with sessionmaker() as session, session.begin():
            await ingest_calls(session, records[i : i + 1000], defaults=route_defaults(settings))
    ingest_s = time.perf_counter() - t0
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    folded = await fold_hours(sessionmaker, now=now)
    timings["fold (backlog)"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    refolded_full = await fold_hours(sessionmaker, now=now, full=True)
    timings["fold (no change, full)"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    refolded = await fold_hours(sessionmaker, now=now)
    timings["fold (no change)"] = time.perf_counter() - t0
    last_hour = floor_hour(now) - timedelta(hours=1)
    new_hours: dict[str, int] = {}
    for way, full in (("fold (new hour, full)", True), ("fold (new hour)", False)):
        late = workload(new, seed=2 if full else 3, start=last_hour, span_s=3599, pairs=pairs,
                        prefix="full" if full else "incr")  # fmt: skip
        async with sessionmaker() as session, session.begin():
            await ingest_calls(session, late, defaults=route_defaults(settings))
        t0 = time.perf_counter()
        new_hours[way] = len(await fold_hours(sessionmaker, now=now, full=full))
        timings[way] = time.perf_counter() - t0
    cutoff = floor_hour(now - timedelta(seconds=settings.retention_s))
    t0 = time.perf_counter()
    deleted = await delete_folded_raw(sessionmaker, cutoff=cutoff, batch_rows=settings.retention_batch_rows, now=now)
    timings["delete"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    until = floor_hour(now)
    async with sessionmaker() as session:
        week = await merge_rollups(session, since=until - timedelta(days=7), until=until)
    figures = Rollup().merged(*(r.rollup for r in week)).figures()
    timings["merge week"] = time.perf_counter() - t0
    await engine.dispose()
    return {
        "database": url.split(":")[0],
        "calls": calls, "days": days, "routes": routes, "ingest_s": ingest_s,
        "hours_folded": len(folded), "hours_refolded": len(refolded) + len(refolded_full),
        "new_hour_hours_written": new_hours, "new_calls": new,
        "hours_deleted": sum(1 for h in deleted if h.skipped is None),
        "calls_deleted": sum(h.calls for h in deleted),
        "timings_s": timings,
        "week_ttft_p99_s": figures["ttft_p99_s"], "week_calls": figures["calls"],
        "python": platform.python_version(),
    }  # fmt: skip


def main() -> None:
    """Parse flags, run, print a table, write JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=50_000)
    parser.add_argument("--days", type=float, default=16.0)
    parser.add_argument("--routes", type=int, default=3)
    parser.add_argument("--new", type=int, default=1000, help="late calls added before each 'new hour' fold")
    parser.add_argument("--db", default=None, help="database URL (default: a temporary SQLite file)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        url = args.db or f"sqlite+aiosqlite:///{Path(tmp) / 'bench.db'}"
        result = asyncio.run(run(url, args.calls, args.days, args.routes, args.new))
    print(f"{result['database']}: {result['calls']} calls over {result['days']:g} days, {result['routes']} routes "
          f"(ingest {result['ingest_s']:.1f} s); {result['hours_folded']} hours folded, "
          f"{result['hours_deleted']} hours / {result['calls_deleted']} calls deleted")  # fmt: skip
    print(f"{'step':<24}{'seconds':>10}")
    for step, seconds in result["timings_s"].items():
        print(f"{step:<24}{seconds:>10.2f}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
