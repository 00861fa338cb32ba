"""A store with a day of history for the console's tests: real ingest, real controller ticks.

:func:`seed_store` migrates a database, then for each of the last ``hours`` hours ingests calls
of two routes (``summarize``: primary TTFT that slows down in the middle of the day, with hedges;
``team/chat``: steady, no hedges) and runs controller ticks at that hour's end
(:func:`hedgerow.controller.jobs.run_tick` with ``now`` in the past), so the history spans a day
with applied changes and merged holds.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

from hedgerow.controller.jobs import run_tick
from hedgerow.controller.store.db import make_engine, make_sessionmaker, migrate_engine
from hedgerow.controller.store.ingest import ingest_calls, route_defaults
from hedgerow.settings import Settings
from tests.conftest import make_call

__all__ = ["SEED_SETTINGS", "seed_store"]

#: Settings of the seeding ticks and of the served api (so both decide alike).
SEED_SETTINGS = {"HEDGEROW_MIN_SAMPLES": "20", "HEDGEROW_MAX_STEP_DOWN": "0.5"}


async def seed_store(
    database_url: str, *, hours: int = 24, calls_per_hour: int = 60, now: datetime | None = None
) -> int:
    """Fill ``database_url`` (migrated here) with ``hours`` hours of calls and decisions.

    Args:
        database_url: the store.
        hours: hours of history, ending at ``now``.
        calls_per_hour: calls per route and hour.
        now: the end of the seeded range (default: the clock).

    Returns:
        The number of calls ingested.
    """
    now = now or datetime.now(UTC)
    settings = Settings(database_url=database_url, min_samples=20, max_step_down=0.5)
    engine = make_engine(database_url)
    rng = random.Random(10)
    total = 0
    try:
        await migrate_engine(engine)
        sessionmaker = make_sessionmaker(engine)
        for hour in range(hours, 0, -1):
            end = now - timedelta(hours=hour - 1)
            slow = 1.0 + (1.5 if hours // 3 <= hour <= hours // 2 else 0.0)
            records = []
            for i in range(calls_per_hour):
                started = end - timedelta(seconds=rng.uniform(60, 3599))
                ttft = rng.expovariate(1.0 / (0.4 * slow))
                if ttft > 1.0 * slow and i % 2 == 0:
                    records.append(
                        make_call(
                            f"s{hour}-{i}",
                            started_at=started,
                            primary_ttft_s=ttft,
                            hedge_after_s=1.0 * slow,
                            backup_ttft_s=rng.uniform(0.1, 0.6),
                        )
                    )
                else:
                    records.append(make_call(f"s{hour}-{i}", started_at=started, primary_ttft_s=ttft))
                records.append(
                    make_call(f"c{hour}-{i}", route="team/chat", model="small", started_at=started, primary_ttft_s=0.2)
                )
            async with sessionmaker() as session, session.begin():
                accepted, _ = await ingest_calls(session, records, defaults=route_defaults(settings))
            total += accepted
            for tick in range(3):
                await run_tick(sessionmaker, settings, now=end - timedelta(minutes=2 - tick))
    finally:
        await engine.dispose()
    return total
