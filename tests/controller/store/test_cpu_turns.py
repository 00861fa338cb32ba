"""CPU turns: at most ``slots`` holders at once, in arrival order; ingest within turns stores the same rows."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from hedgerow.client.records import CallRecord
from hedgerow.controller.store import ingest as ingest_module
from hedgerow.controller.store import minute_store
from hedgerow.controller.store.cpu_turns import CpuTurns, cpu_turn
from hedgerow.controller.store.ingest import ingest_calls, route_defaults
from hedgerow.controller.store.models import Attempt, Call, MinuteAggregate, Route
from hedgerow.settings import Settings
from tests.conftest import CallFactory


def test_turns_refuse_fewer_than_one_slot() -> None:
    with pytest.raises(ValueError, match="slots: must be >= 1, got 0"):
        CpuTurns(0)


async def test_one_slot_runs_holders_one_at_a_time_in_arrival_order() -> None:
    turns = CpuTurns(1)
    inside: list[int] = []
    order: list[str] = []

    async def holder(name: str) -> None:
        async with turns.turn():
            inside.append(1)
            assert len(inside) == 1, "two holders of one slot at once"
            order.append(name)
            for _ in range(3):
                await asyncio.sleep(0)  # a pause between slices keeps the turn
            inside.pop()

    await asyncio.gather(*(holder(name) for name in "abcd"))
    assert order == list("abcd")
    assert (turns.taken, turns.waited) == (4, 3)


async def test_no_turns_is_a_block_without_a_turn() -> None:
    async with cpu_turn(None):
        pass


async def _rows(
    sessionmaker: async_sessionmaker[AsyncSession], route: str
) -> tuple[list[tuple[object, ...]], list[tuple[object, ...]]]:
    """The attempts (by call's id suffix) and minute aggregates of ``route``, without its ids."""
    async with sessionmaker() as session:
        route_id = await session.scalar(select(Route.id).where(Route.route == route))
        attempts = (
            await session.execute(
                select(Call.request_id, Attempt.attempt_index, Attempt.role, Attempt.first_token_s, Attempt.end_s)
                .join(Attempt, Attempt.call_id == Call.id)
                .where(Call.route_id == route_id)
            )
        ).all()
        minutes = (
            await session.execute(
                select(
                    MinuteAggregate.minute_index,
                    MinuteAggregate.calls,
                    MinuteAggregate.hedged,
                    MinuteAggregate.backup_wins,
                    MinuteAggregate.histograms,
                ).where(MinuteAggregate.route_id == route_id)
            )
        ).all()
    return (
        sorted((r[0].split("-", 1)[1], *r[1:]) for r in attempts),
        sorted(tuple(bytes(v) if isinstance(v, memoryview) else v for v in r) for r in minutes),
    )


async def test_ingest_within_turns_stores_what_ingest_in_one_go_stores(
    sessionmaker: async_sessionmaker[AsyncSession], call_factory: CallFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ingest_module, "ROW_SLICE", 3)  # many slices, and a last short one
    monkeypatch.setattr(ingest_module, "COPY_SLICE", 4)  # PostgreSQL: COPYs that pause
    monkeypatch.setattr(minute_store, "SAMPLES_SLICE", 4)
    defaults = route_defaults(Settings())
    start = datetime.now(UTC) - timedelta(minutes=5)

    def batch(prefix: str, route: str, first: int) -> list[CallRecord]:
        return [
            call_factory(
                f"{prefix}-{i}",
                route=route,
                started_at=start + timedelta(seconds=17 * i),
                primary_ttft_s=0.2 + 0.01 * i,
                hedge_after_s=0.3 if i % 3 == 0 else None,
                backup_ttft_s=0.1 if i % 3 == 0 else None,
            )
            for i in range(first, first + 10)
        ]

    turns = CpuTurns(1)

    async def write(records: list[CallRecord], with_turns: CpuTurns | None) -> tuple[int, int]:
        async with sessionmaker() as session, session.begin():
            return await ingest_calls(session, records, defaults=defaults, turns=with_turns)

    # the same records under two routes: three batches at once within one turn, and in one go
    within = await asyncio.gather(*(write(batch("t", "turns", first), turns) for first in (0, 10, 20)))
    alone = [await write(batch("g", "one-go", first), None) for first in (0, 10, 20)]
    assert within == alone == [(10, 0)] * 3
    async with sessionmaker() as session:
        postgresql = (await session.connection()).dialect.name == "postgresql"
    if postgresql:  # rows, attempts, minute counts (whether one batch waited depends on timing)
        assert turns.taken == 3 * 3
    else:  # rows, minute counts (SQLite runs the three transactions one after the other)
        assert turns.taken == 2 * 3
    assert await _rows(sessionmaker, "turns") == await _rows(sessionmaker, "one-go")
    assert await write(batch("t", "turns", 0), turns) == (0, 10)  # re-posted: duplicates, nothing counted
    assert await _rows(sessionmaker, "turns") == await _rows(sessionmaker, "one-go")
