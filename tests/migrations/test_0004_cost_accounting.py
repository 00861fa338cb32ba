"""Migration 0004 on a store with data: old attempts get estimated prompt tokens, old rollups are refolded."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import select, text, update

from hedgerow.controller.report.report_store import weekly_report
from hedgerow.controller.store.db import downgrade_database, make_engine, make_sessionmaker, upgrade_database
from hedgerow.controller.store.models import Attempt, HourlyRollup
from hedgerow.controller.store.rollups import FOLD_VERSION, fold_hours

NOW = datetime(2026, 12, 1, tzinfo=UTC)


async def test_0004_upgrades_a_store_with_calls_and_rollups(database_url: str) -> None:
    upgrade_database(database_url, "0003")
    engine = make_engine(database_url)
    try:
        async with engine.begin() as connection:
            # a route, and a hedged call whose backup won, stored by a 0003 server
            await connection.execute(text(
                "INSERT INTO routes (id, route, model, enabled, budget, default_hedge_after_s, min_hedge_after_s, "
                "max_hedge_after_s, created_at, updated_at) VALUES (1, 'r', 'm', true, 0.1, 2.0, 0.05, 30.0, :t, :t)"
            ), {"t": datetime(2026, 11, 24, tzinfo=UTC)})  # fmt: skip
            await connection.execute(text(
                "INSERT INTO calls (id, request_id, route_id, started_at, received_at, hedged, hedge_reason, "
                "hedge_denied, winner, status, ttft_s, e2e_s, tpot_s, prompt_tokens, completion_tokens, "
                "wasted_completion_tokens) VALUES (1, 'c1', 1, :t, :t, true, 'ttft_timeout', false, 'backup', 'ok', "
                "1.2, 2.0, 0.1, 80, 9, 0)"
            ), {"t": datetime(2026, 11, 24, 10, 15, tzinfo=UTC)})  # fmt: skip
            await connection.execute(text(
                "INSERT INTO attempts (call_id, attempt_index, upstream, role, start_s, first_token_s, end_s, outcome, "
                "status_code, completion_tokens) VALUES (1, 0, 'a', 'primary', 0.0, NULL, 1.2, 'cancelled', 200, 0), "
                "(1, 1, 'b', 'backup', 1.0, 1.2, 2.0, 'won', 200, 9)"
            ))  # fmt: skip
    finally:
        await engine.dispose()
    upgrade_database(database_url)
    engine = make_engine(database_url)
    try:
        sessionmaker = make_sessionmaker(engine)
        async with sessionmaker() as session:
            rows = (await session.scalars(select(Attempt).order_by(Attempt.attempt_index))).all()
        assert [(r.prompt_tokens, r.prompt_tokens_estimated) for r in rows] == [(None, False), (None, False)]
        # the fold applies the estimate rule to attempts stored without prompt tokens
        [folded] = await fold_hours(sessionmaker, now=NOW)
        assert folded.kind == "new"
        report = await weekly_report(sessionmaker, "2026-W48", now=NOW)
        tokens = report["total"]["tokens"]
        assert (tokens["prompt"], tokens["extra_prompt"], tokens["estimated_prompt"]) == (160, 80, 160)
        # a rollup written by the older fold rules (fold_version 1) is recomputed by the next
        # process's first fold, which looks at every hour (new rules come with a new process)
        async with sessionmaker() as session, session.begin():
            await session.execute(update(HourlyRollup).values(fold_version=1, extra_prompt_tokens=0))
        assert await fold_hours(sessionmaker, now=NOW) == []  # this process has seen every call already
        sessionmaker = make_sessionmaker(engine)
        [refolded] = await fold_hours(sessionmaker, now=NOW)
        assert refolded.kind == "refolded"
        async with sessionmaker() as session:
            row = (await session.scalars(select(HourlyRollup))).one()
        assert (row.fold_version, row.extra_prompt_tokens) == (FOLD_VERSION, 80)
        assert await fold_hours(sessionmaker, now=NOW) == []  # up to date: nothing written again
    finally:
        await engine.dispose()
    downgrade_database(database_url, "0003")  # and back: the columns and tables of 0004 go
    upgrade_database(database_url)
