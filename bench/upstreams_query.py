"""Benchmark: the per-upstream query (:func:`hedgerow.controller.store.upstreams.upstream_stats`).

Builds a store (a SQLite file, or the PostgreSQL database of ``--db``, whose ``public`` schema is
dropped first) with ``--calls`` calls spread over the last 24 hours on ``--routes`` routes and
four upstreams (60 % single attempts, 10 % failovers, 30 % hedged races), then times, ``--repeat``
times each: the query over the whole 24 hours, the same for one route, and as a baseline a plain
``SELECT count(*)`` of the same join (what the database needs just to visit the window's rows).
Prints the medians and the ratio to the baseline. On PostgreSQL the store is ``ANALYZE``d first (a
store in use has statistics from autovacuum; without them the planner sorts the join on disk).

Run: ``python bench/upstreams_query.py [--calls 100000] [--routes 10] [--repeat 5]
[--db postgresql+asyncpg://...]``. Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import and_, func, select, text
from sqlalchemy.ext.asyncio import create_async_engine

from hedgerow.client.records import AttemptRecord, CallRecord
from hedgerow.controller.store.db import make_engine, make_sessionmaker, upgrade_database
from hedgerow.controller.store.ingest import ingest_calls, route_defaults
from hedgerow.controller.store.models import Attempt, Call
from hedgerow.controller.store.upstreams import upstream_stats
from hedgerow.settings import Settings

UPSTREAMS = ("east", "west", "north", "south")


def _records(n: int, routes: int, now: datetime, seed: int = 1) -> list[CallRecord]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        at = now - timedelta(seconds=rng.uniform(1, 86_000))
        primary, backup = rng.sample(UPSTREAMS, 2)
        ttft = rng.lognormvariate(-1.0, 0.8)
        kind = rng.random()
        route = f"route-{i % routes}"
        attempts: tuple[AttemptRecord, ...]
        if kind < 0.6:
            attempts = (AttemptRecord(primary, "primary", 0.0, ttft, ttft + 1, "won", 200, None, 20),)
            reason = None
        elif kind < 0.7:
            b = rng.lognormvariate(-1.0, 0.8)
            attempts = (
                AttemptRecord(primary, "primary", 0.0, None, 0.1, "failed", 503, "http_503", 0),
                AttemptRecord(backup, "backup", 0.1, 0.1 + b, 1.1 + b, "won", 200, None, 20),
            )
            reason = "primary_error"
        else:
            b = rng.lognormvariate(-1.0, 0.8)
            ttft = max(ttft, 0.41)
            if ttft <= 0.4 + b:
                attempts = (
                    AttemptRecord(primary, "primary", 0.0, ttft, ttft + 1, "won", 200, None, 20),
                    AttemptRecord(backup, "backup", 0.4, None, ttft, "cancelled", 200, None, 3),
                )
            else:
                attempts = (
                    AttemptRecord(primary, "primary", 0.0, None, 0.4 + b, "cancelled", 200, None, 0),
                    AttemptRecord(backup, "backup", 0.4, 0.4 + b, 1.4 + b, "won", 200, None, 20),
                )
            reason = "ttft_timeout"
        winner = next(a.role for a in attempts if a.outcome == "won")
        out.append(
            CallRecord(
                f"c{i}", route, "m1", at, hedged=len(attempts) > 1, hedge_reason=reason, winner=winner,  # type: ignore[arg-type]
                ttft_s=ttft, prompt_tokens=10, completion_tokens=20, attempts=attempts,
            )
        )  # fmt: skip
    return out


async def _median_s(repeat: int, run: Callable[[], Awaitable[object]]) -> float:
    times: list[float] = []
    for _ in range(repeat):
        started = time.perf_counter()
        await run()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


async def main() -> None:
    """Build the store, time the queries, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=100_000)
    parser.add_argument("--routes", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=5)
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
        started = time.perf_counter()
        for start in range(0, len(records), 1000):
            async with sessions() as session, session.begin():
                await ingest_calls(session, records[start : start + 1000], defaults=defaults)
        print(f"ingested {args.calls} calls in {time.perf_counter() - started:.1f} s ({engine.dialect.name})")
        if engine.dialect.name == "postgresql":  # the planner's statistics, as autovacuum keeps them
            async with engine.connect() as connection:
                await connection.execute(text("ANALYZE"))
        since, until = now - timedelta(days=1), now + timedelta(seconds=1)

        async def everything() -> None:
            async with sessions() as session:
                await upstream_stats(session, since=since, until=until)

        async def one_route() -> None:
            async with sessions() as session:
                await upstream_stats(session, since=since, until=until, route="route-0")

        async def baseline() -> None:
            join = and_(Call.id == Attempt.call_id, Call.started_at == Attempt.call_started_at)
            query = select(func.count()).select_from(Attempt).join(Call, join)
            async with sessions() as session:
                await session.scalar(query.where(Call.started_at >= since, Call.started_at < until))

        await everything()  # warm the caches
        base = await _median_s(args.repeat, baseline)
        rows = [("count(*) of the join (baseline)", base)]
        rows.append(("upstream_stats, every route", await _median_s(args.repeat, everything)))
        rows.append((f"upstream_stats, one route of {args.routes}", await _median_s(args.repeat, one_route)))
        print(f"{'query':<40} {'median s':>9} {'x baseline':>11}")
        for name, value in rows:
            print(f"{name:<40} {value:>9.3f} {value / base:>11.1f}")
        await engine.dispose()


if __name__ == "__main__":
    asyncio.run(main())
