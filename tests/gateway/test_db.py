"""``hedgerow gateway FILE --db URL`` as a subprocess: the calls' records go straight into the store
(a SQLite file, or a PostgreSQL database when ``HEDGEROW_TEST_DATABASE_URL`` is set; migrated on
start) and the threshold published there is the one the calls use, with no ``serve`` running;
``--db`` with ``--api`` and a bad ``--db`` exit 2 naming the flag."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from hedgerow.cli.gateway_store import migrate_store
from hedgerow.controller.report.report_store import weekly_report
from hedgerow.controller.store.calls_query import recent_calls
from hedgerow.controller.store.db import make_engine, make_sessionmaker
from hedgerow.controller.store.ingest import ingest_calls, route_defaults
from hedgerow.controller.store.models import Call, Route, Threshold, utc_now
from hedgerow.settings import Settings
from hedgerow.sim import ReplicaThread
from tests.conftest import PG_ENV, PG_SKIP, create_pg_database, drop_pg_database, make_call
from tests.gateway.conftest import FAKE_UPSTREAM_KEY
from tests.gateway.test_cli import Gateway, run, write_config

KEY = "gw-db-key-0123456789abcdef"
#: The version of the threshold published in the store before the gateway starts.
VERSION = 7


async def publish_threshold(url: str, hedge_after_s: float) -> None:
    """Migrate the store and publish a threshold for (cli-route, gpt-fast), as a tick would."""
    settings = Settings(database_url=url)
    await migrate_store(settings)
    engine = make_engine(url)
    try:
        async with make_sessionmaker(engine)() as session, session.begin():
            seed = make_call("seed-1", route="cli-route", model="gpt-fast")
            await ingest_calls(session, [seed], defaults=route_defaults(settings))
            route_id = await session.scalar(select(Route.id).where(Route.route == "cli-route"))
            assert route_id is not None
            session.add(
                Threshold(
                    route_id=route_id,
                    hedge_after_s=hedge_after_s,
                    enabled=True,
                    source="controller",
                    version=VERSION,
                    updated_at=utc_now(),
                )
            )
    finally:
        await engine.dispose()


async def stored_call(url: str, request_id: str) -> list[tuple[Any, ...]]:
    """(route, model, client, threshold_version, hedge_after_s, hedged) of the stored call ``request_id``."""
    engine = make_engine(url)
    try:
        async with make_sessionmaker(engine)() as session:
            rows = await session.execute(
                select(Route.route, Route.model, Call.client, Call.threshold_version, Call.hedge_after_s, Call.hedged)
                .join(Route, Route.id == Call.route_id)
                .where(Call.request_id == request_id)
            )
            return [tuple(row) for row in rows.all()]
    finally:
        await engine.dispose()


async def the_callers_calls(url: str, caller: str) -> tuple[list[str], list[dict[str, Any]], int]:
    """The calls explorer's request ids of ``caller``'s calls on (cli-route, gpt-fast), the weekly
    report's client rows and its count of calls without a client (the current week)."""
    engine = make_engine(url)
    try:
        sessionmaker = make_sessionmaker(engine)
        async with sessionmaker() as session:
            page = await recent_calls(session, "cli-route", "gpt-fast", client=caller)
        report = await weekly_report(sessionmaker)
        clients = report["clients"]
        return [c["request_id"] for c in page.calls], clients["rows"], clients["calls_without_client"]
    finally:
        await engine.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty store: a SQLite file, or a PostgreSQL database of its own (dropped after)."""
    if request.param == "sqlite":
        yield f"sqlite+aiosqlite:///{tmp_path / 'gateway.db'}"
        return
    base = os.environ.get(PG_ENV)
    if not base:
        pytest.skip(PG_SKIP)
    url = asyncio.run(create_pg_database(base, "hedgerow_gw"))
    try:
        yield url
    finally:
        asyncio.run(drop_pg_database(url))


def test_db_writes_records_into_the_store_and_reads_its_thresholds(
    tmp_path: Path, store_url: str, replicas: tuple[ReplicaThread, ReplicaThread]
) -> None:
    slow, fast = replicas
    config = write_config(tmp_path, slow.base_url, fast.base_url)
    # the file's own threshold would not hedge within the test: the store's (0.2 s) must
    config.write_text(config.read_text().replace("hedge_after_s = 0.3", "hedge_after_s = 60"))
    url = store_url
    asyncio.run(publish_threshold(url, 0.2))
    with Gateway(str(config), "--db", url, SLOW_KEY=FAKE_UPSTREAM_KEY, HEDGEROW_GATEWAY_KEYS=f"ci={KEY}") as gateway:
        chat = {"model": "gpt-fast", "messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": 5}
        headers = {"Authorization": f"Bearer {KEY}", "X-Request-ID": "ci-run-1"}
        answer = httpx.post(gateway.base_url + "/chat/completions", json=chat, headers=headers, timeout=30)
        assert answer.status_code == 200, answer.text
        assert answer.headers["x-hedgerow-winner"] == "fast" and answer.headers["x-hedgerow-hedged"] == "true"
        assert answer.headers["x-request-id"] == "ci-run-1"  # the caller's own id, echoed
        request_id = answer.headers["x-hedgerow-request-id"]
    assert gateway.proc.returncode == 130, gateway.stderr  # SIGINT; the queued record written on the way out
    rows = asyncio.run(stored_call(url, request_id))
    assert rows == [("cli-route", "gpt-fast", "ci", VERSION, 0.2, True)]
    assert f"request_id={request_id} caller_request_id=ci-run-1 " in gateway.stderr  # the gateway_call line
    # the key's name is a dimension: the calls explorer's client filter and the weekly report's table
    explored, client_rows, without_client = asyncio.run(the_callers_calls(url, "ci"))
    assert explored == [request_id]
    assert ("ci", 1, 1) in [(r["client"], r["calls"], r["hedges"]) for r in client_rows]  # beside the seed's
    assert without_client == 0
    for text in (gateway.stdout, gateway.stderr):
        assert FAKE_UPSTREAM_KEY not in text and KEY not in text


def test_db_and_api_together_or_a_bad_db_exit_2(tmp_path: Path) -> None:
    flags = ("--upstream", "a=http://127.0.0.1:9/v1")
    both = run(*flags, "--db", f"sqlite+aiosqlite:///{tmp_path / 'x.db'}", "--api", "http://127.0.0.1:8400")
    assert both.returncode == 2
    assert "--db and --api: give one" in both.stderr
    assert not (tmp_path / "x.db").exists()
    bad = run(*flags, "--db", "mysql://somewhere/db")
    assert bad.returncode == 2 and bad.stderr.startswith("hedgerow: --db: "), bad.stderr
