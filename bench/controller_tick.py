"""Benchmark: what one controller tick costs as the number of calls in its window grows.

A tick reads every primary attempt of the window into Python, runs Kaplan-Meier and the policy,
and writes a threshold and a history row per route. This measures its wall time on a real store
(a SQLite file, and PostgreSQL when ``HEDGEROW_TEST_DATABASE_URL`` is set) for 1,000 to 100,000
calls of one route (realistic hedged records: ~10% hedged, censored primaries included), and the
ingest rate of ``POST /v1/calls``-sized batches for comparison.

Run: ``python bench/controller_tick.py [--sizes 1000,10000,100000] [--json bench/results/controller_tick.json]``.
Prints a table and writes JSON. Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
from sqlalchemy import text

from hedgerow.client.records import AttemptRecord, CallRecord
from hedgerow.controller.db import make_engine, make_sessionmaker, upgrade_database
from hedgerow.controller.ingest import ingest_calls, route_defaults
from hedgerow.controller.jobs import run_tick
from hedgerow.settings import Settings


def synthetic_records(n: int, now: datetime, seed: int = 0) -> list[CallRecord]:
    """``n`` call records of route ``bench`` spread over the last 30 minutes before ``now``.

    Primary TTFT is lognormal (median 0.3 s, sigma 0.8); a call whose primary is slower than
    1.0 s hedges; the backup's TTFT is lognormal too; the first token wins.
    """
    rng = np.random.default_rng(seed)
    primary = rng.lognormal(np.log(0.3), 0.8, n)
    backup = rng.lognormal(np.log(0.3), 0.8, n)
    offsets = np.sort(rng.uniform(0, 1800, n))
    records = []
    for i in range(n):
        started = now - timedelta(seconds=1800 - offsets[i])
        p = float(primary[i])
        if p <= 1.0:
            first = p
            attempts = (AttemptRecord("a", "primary", 0.0, first, first + 2.0, "won", 200, None, 50),)
            fields = dict(winner="primary")
        else:
            b_first = 1.0 + float(backup[i])
            first = min(p, b_first)
            if p <= b_first:
                attempts = (
                    AttemptRecord("a", "primary", 0.0, p, p + 2.0, "won", 200, None, 50),
                    AttemptRecord("b", "backup", 1.0, None, p, "cancelled", 200, None, 0),
                )
                fields = dict(winner="primary")
            else:
                attempts = (
                    AttemptRecord("a", "primary", 0.0, None, b_first, "cancelled", 200, None, 0),
                    AttemptRecord("b", "backup", 1.0, b_first, b_first + 2.0, "won", 200, None, 50),
                )
                fields = dict(winner="backup")
            fields.update(hedged=True, hedge_reason="ttft_timeout")
        records.append(
            CallRecord(
                request_id=f"bench-{seed}-{i}",
                route="bench",
                model="m",
                started_at=started,
                hedge_after_s=1.0,
                ttft_s=round(first, 6),
                e2e_s=round(first + 2.0, 6),
                completion_tokens=50,
                attempts=attempts,
                **fields,
            )
        )
    return records


async def measure(url: str, size: int) -> dict:
    """Ingest ``size`` records into a fresh store at ``url``; time the ingest and one tick."""
    upgrade_database(url)
    engine = make_engine(url)
    sessionmaker = make_sessionmaker(engine)
    settings = Settings(database_url=url, window_s=3600)
    now = datetime.now(UTC)
    records = synthetic_records(size, now)
    defaults = route_defaults(settings)
    start = time.perf_counter()
    for i in range(0, size, 1000):
        async with sessionmaker() as session, session.begin():
            await ingest_calls(session, records[i : i + 1000], defaults=defaults)
    ingest_s = time.perf_counter() - start
    ticks = []
    for _ in range(3):
        start = time.perf_counter()
        rows = await run_tick(sessionmaker, settings, now=now)
        ticks.append(time.perf_counter() - start)
    await engine.dispose()
    row = rows[0]
    return {
        "calls": size,
        "ingest_calls_per_s": size / ingest_s,
        "tick_s_median": float(np.median(ticks)),
        "samples": row["samples"],
        "censored": row["censored"],
        "hedge_after_s": row["hedge_after_s"],
    }


async def reset_postgres(url: str) -> None:
    """Empty the ``public`` schema of the PostgreSQL database at ``url``."""
    engine = make_engine(url)
    async with engine.begin() as connection:
        await connection.execute(text("DROP SCHEMA IF EXISTS public CASCADE"))
        await connection.execute(text("CREATE SCHEMA public"))
    await engine.dispose()


async def main(sizes: list[int], json_path: Path | None) -> None:
    """Run every size on SQLite (and PostgreSQL if configured); print and save the results."""
    results = []
    pg = os.environ.get("HEDGEROW_TEST_DATABASE_URL")
    for size in sizes:
        with tempfile.TemporaryDirectory() as tmp:
            results.append({"store": "sqlite", **await measure(f"sqlite+aiosqlite:///{tmp}/bench.db", size)})
        if pg:
            await reset_postgres(pg)
            results.append({"store": "postgresql", **await measure(pg, size)})
    print(
        f"{'store':<11} {'calls':>8} {'ingest calls/s':>15} {'tick s (median of 3)':>21} {'samples':>8} "
        f"{'censored':>9} {'hedge_after_s':>14}"
    )
    for r in results:
        print(
            f"{r['store']:<11} {r['calls']:>8} {r['ingest_calls_per_s']:>15.0f} {r['tick_s_median']:>21.3f} "
            f"{r['samples']:>8} {r['censored']:>9} {r['hedge_after_s']:>14.3f}"
        )
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(
            json.dumps({"benchmark": "controller_tick", "python": sys.version.split()[0], "results": results}, indent=2)
            + "\n"
        )
        print(f"written to {json_path}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,100000", help="comma-separated call counts")
    parser.add_argument("--json", type=Path, default=Path("bench/results/controller_tick.json"))
    args = parser.parse_args()
    asyncio.run(main([int(s) for s in args.sizes.split(",")], args.json))
