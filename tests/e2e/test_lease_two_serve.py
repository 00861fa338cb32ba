"""Two ``hedgerow serve`` processes on one PostgreSQL database: one tick per period, hand-over.

Each test gets its own database (``hedgerow_lease_<random>``), created through asyncpg on the
server's ``postgres`` database and dropped afterwards, so it neither sees nor disturbs the shared
test database that ``tests/conftest.py`` resets. Skipped, with the reason, without
``HEDGEROW_TEST_DATABASE_URL``.

Timing: the controller ticks every ``INTERVAL_S`` = 2 s and the lease lives ``LEASE_TTL_S`` = 4 s
(renewed every third of it). While both processes run, their ``/metrics`` must show one tick per
period in all (about ``T / interval`` ticks in ``T`` seconds, all by one process: the history merges
identical holds, so ticks are counted by ``hedgerow_controller_tick_duration_seconds_count``). After
the holder is killed with SIGKILL (no release), the other process must take the lease and tick
within two lease periods plus one interval.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import fresh_pg_database, make_call
from tests.serve_process import ServeProcess

INTERVAL_S = 2.0
LEASE_TTL_S = 4.0
ROUTE, MODEL = "lease", "m1"

pytestmark = pytest.mark.slow


@pytest.fixture
async def fresh_pg_url() -> AsyncIterator[str]:
    """The SQLAlchemy URL of a new, empty PostgreSQL database, dropped after the test."""
    async with fresh_pg_database("hedgerow_lease") as url:
        yield url


def _parse(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp)


async def _history(http: httpx.AsyncClient) -> list[datetime]:
    """The computed_at of every history row of the route, oldest first."""
    response = await http.get(f"/v1/routes/{ROUTE}/history", params={"model": MODEL, "limit": 10_000})
    assert response.status_code == 200, response.text
    return sorted(_parse(row["computed_at"]) for row in response.json()["history"])


async def _lease_holder_pid(db_url: str) -> int | None:
    """The pid in the unexpired controller lease's holder id (``host:pid:random``), or None."""
    from hedgerow.controller.lease import CONTROLLER_LEASE
    from hedgerow.controller.store.db import make_engine, make_sessionmaker
    from hedgerow.controller.store.models import Lease

    engine = make_engine(db_url)
    try:
        async with make_sessionmaker(engine)() as session:
            lease = await session.get(Lease, CONTROLLER_LEASE)
            if lease is None or lease.expires_at < datetime.now(UTC):
                return None
            return int(lease.holder.split(":")[-2])
    finally:
        await engine.dispose()


async def _ticks(server: ServeProcess) -> int:
    """The controller ticks ``server`` ran so far (its ``/metrics``)."""
    async with httpx.AsyncClient(timeout=30) as http:
        text = (await http.get(f"{server.url}/metrics")).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "hedgerow_controller_tick_duration_seconds_count":
                return int(sample.value)
    return 0


def _assert_one_tick_per_period(ticks: list[int], span_s: float, what: str) -> None:
    """About ``span_s / INTERVAL_S`` ticks in all, all by one of the processes (``ticks``: each one's count)."""
    expected = span_s / INTERVAL_S
    total = sum(ticks)
    # one process ticks: about `expected` ticks; two processes would give about twice as many
    assert 0.5 * expected <= total <= 1.3 * expected + 1, (
        f"{what}: {total} ticks in {span_s:.1f} s at one per {INTERVAL_S} s ({ticks} per process)"
    )
    assert sorted(ticks)[:-1] == [0] * (len(ticks) - 1), f"{what}: more than one process ticked: {ticks}"


async def test_two_serve_processes_tick_once_per_period_and_hand_over(fresh_pg_url: str, tmp_path: Path) -> None:
    env = {"HEDGEROW_CONTROLLER_INTERVAL_S": str(INTERVAL_S), "HEDGEROW_LEASE_TTL_S": str(LEASE_TTL_S)}
    dirs = [tmp_path / "a", tmp_path / "b"]
    for d in dirs:
        d.mkdir()
    # one after the other: the first migrates the new database, the second finds it at head
    servers = [ServeProcess(fresh_pg_url, dirs[0], env)]
    try:
        servers.append(ServeProcess(fresh_pg_url, dirs[1], env))
        by_pid = {s.proc.pid: s for s in servers}
        async with httpx.AsyncClient(base_url=servers[0].url, timeout=30) as http:
            now = datetime.now(UTC)
            calls = [
                make_call(
                    f"c{i}",
                    route=ROUTE,
                    model=MODEL,
                    started_at=now - timedelta(seconds=i),
                    primary_ttft_s=0.2 + i / 100,
                ).to_dict()
                for i in range(30)
            ]
            posted = await http.post("/v1/calls", json={"calls": calls})
            assert posted.status_code == 202 and posted.json()["accepted"] == 30

            # wait for the first row, then watch both processes for a while
            deadline = time.monotonic() + 30
            while not await _history(http) and time.monotonic() < deadline:
                await asyncio.sleep(0.5)
            assert await _history(http), "no controller tick within 30 s"
            start = datetime.now(UTC)
            before = [await _ticks(server) for server in servers]
            await asyncio.sleep(7 * INTERVAL_S)
            both = [await _ticks(server) - was for server, was in zip(servers, before, strict=True)]
            end = datetime.now(UTC)
            _assert_one_tick_per_period(both, (end - start).total_seconds(), "two processes")

            holder_pid = await _lease_holder_pid(fresh_pg_url)
            assert holder_pid in by_pid, f"lease holder pid {holder_pid} is neither serve process {list(by_pid)}"
            holder = by_pid[holder_pid]
            survivor = next(s for s in servers if s is not holder)

        # kill -9 the holder: no shutdown, no release; its lease must expire and move over
        os.kill(holder.proc.pid, signal.SIGKILL)
        holder.proc.wait(10)
        killed_at = datetime.now(UTC)
        at_kill = await _ticks(survivor)
        async with httpx.AsyncClient(base_url=survivor.url, timeout=30) as http:
            limit_s = 2 * LEASE_TTL_S + INTERVAL_S
            resumed: datetime | None = None
            deadline = time.monotonic() + limit_s + 20  # wait longer than allowed, to report the figure
            while time.monotonic() < deadline:
                if await _ticks(survivor) > at_kill:
                    resumed = datetime.now(UTC)
                    break
                await asyncio.sleep(0.2)
            assert resumed is not None, "no tick after the holder was killed"
            takeover_s = (resumed - killed_at).total_seconds()
            assert takeover_s <= limit_s, f"hand-over took {takeover_s:.1f} s > {limit_s} s"
            assert await _lease_holder_pid(fresh_pg_url) == survivor.proc.pid

            resumed_ticks = await _ticks(survivor)
            await asyncio.sleep(5 * INTERVAL_S)
            end = datetime.now(UTC)
            after = [await _ticks(survivor) - resumed_ticks + 1]
            _assert_one_tick_per_period(after, (end - resumed).total_seconds() + INTERVAL_S, "survivor")
            print(
                f"takeover after SIGKILL: {takeover_s:.2f} s (limit {limit_s} s); "
                f"ticks with two processes: {sum(both)}, survivor: {after[0]}"
            )
    finally:
        for server in servers:
            server.stop()
