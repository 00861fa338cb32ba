"""Migration 0010 on a store with rows: every call and attempt kept, in day partitions on PostgreSQL.

A 0009 store with calls on several days (one of them years off: an odd clock) is upgraded; every
row must come through with its id, each attempt with its call's ``started_at``; on PostgreSQL each
day has its partitions, ``call_request_ids`` knows every stored id, ids keep growing from where
they were, and a re-post of a stored record is a duplicate. Downgrading to 0009 keeps every row.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

from sqlalchemy import func, select, text

from hedgerow.controller.store.db import downgrade_database, make_engine, make_sessionmaker, upgrade_database
from hedgerow.controller.store.ingest import ingest_calls, route_defaults
from hedgerow.controller.store.models import Attempt, Call
from hedgerow.controller.store.partitions import partition_days
from hedgerow.settings import Settings
from tests.conftest import make_call

#: (id, request_id, started_at) of the calls stored by a 0009 server.
CALLS = [
    (1, "a", datetime(2026, 11, 24, 10, 15, tzinfo=UTC)),
    (2, "b", datetime(2026, 11, 24, 23, 59, 59, tzinfo=UTC)),
    (3, "c", datetime(2026, 11, 25, 0, 0, tzinfo=UTC)),
    (7, "d", datetime(2011, 3, 1, 8, 0, tzinfo=UTC)),
]


async def _seed(url: str) -> None:
    engine = make_engine(url)
    try:
        async with engine.begin() as connection:
            await connection.execute(text(
                "INSERT INTO routes (id, route, model, enabled, budget, default_hedge_after_s, min_hedge_after_s, "
                "max_hedge_after_s, created_at, updated_at) VALUES (1, 'r', 'm', true, 0.1, 2.0, 0.05, 30.0, :t, :t)"
            ), {"t": datetime(2026, 11, 24, tzinfo=UTC)})  # fmt: skip
            for call_id, request_id, started_at in CALLS:
                await connection.execute(text(
                    "INSERT INTO calls (id, request_id, route_id, started_at, received_at, hedged, hedge_denied, "
                    "status, wasted_completion_tokens) VALUES (:id, :rid, 1, :t, :t, false, false, 'ok', 0)"
                ), {"id": call_id, "rid": request_id, "t": started_at})  # fmt: skip
                for index in range(2):
                    await connection.execute(text(
                        "INSERT INTO attempts (call_id, attempt_index, upstream, role, start_s, end_s, outcome, "
                        "completion_tokens) VALUES (:id, :i, 'a', :role, 0.0, 1.0, 'won', 3)"
                    ), {"id": call_id, "i": index, "role": "primary" if index == 0 else "backup"})  # fmt: skip
            if connection.dialect.name == "postgresql":  # the sequence where a 0009 server left it
                await connection.execute(text("SELECT setval('calls_id_seq', 7)"))
    finally:
        await engine.dispose()


async def test_0010_keeps_every_row_and_partitions_them_by_day(database_url: str) -> None:
    upgrade_database(database_url, "0009")
    await _seed(database_url)
    upgrade_database(database_url)
    engine = make_engine(database_url)
    postgresql = database_url.startswith("postgresql")
    try:
        sessionmaker = make_sessionmaker(engine)
        async with sessionmaker() as session:
            calls = {(c.id, c.request_id, c.started_at) for c in (await session.scalars(select(Call))).all()}
            attempts = (await session.execute(select(Attempt.call_id, Attempt.call_started_at))).all()
            if postgresql:
                days = await partition_days(await session.connection())
                known = set((await session.execute(text("SELECT request_id FROM call_request_ids"))).scalars())
        assert calls == set(CALLS)
        started = {call_id: started_at for call_id, _rid, started_at in CALLS}
        assert sorted(attempts) == sorted((call_id, started[call_id]) for call_id in started for _ in range(2))
        if postgresql:
            assert {date(2026, 11, 24), date(2026, 11, 25), date(2011, 3, 1)} <= set(days)
            assert datetime.now(UTC).date() + timedelta(days=3) in days
            assert known == {"a", "b", "c", "d"}
        # ingest goes on: a stored id (even with another started_at) is a duplicate, new ids grow
        again = make_call("a", route="r", model="m", started_at=datetime.now(UTC))
        fresh = make_call("e", route="r", model="m", started_at=datetime.now(UTC))
        async with sessionmaker() as session, session.begin():
            assert await ingest_calls(session, [again, fresh], defaults=route_defaults(Settings())) == (1, 1)
        async with sessionmaker() as session:
            new_id = await session.scalar(select(Call.id).where(Call.request_id == "e"))
            assert new_id is not None and new_id > 7
            assert await session.scalar(select(func.count()).select_from(Call)) == 5
    finally:
        await engine.dispose()
    downgrade_database(database_url, "0009")  # and back to plain tables, every row kept
    engine = make_engine(database_url)
    try:
        async with engine.connect() as connection:
            back = (await connection.execute(text("SELECT id, request_id FROM calls ORDER BY id"))).all()
            attempts_back = (await connection.execute(text("SELECT count(*) FROM attempts"))).scalar_one()
    finally:
        await engine.dispose()
    assert [row[1] for row in back] == ["a", "b", "c", "d", "e"]
    assert attempts_back == 2 * 4 + 1
    upgrade_database(database_url)
