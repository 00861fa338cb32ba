"""What the service answers while its store is unreachable (``hedgerow.api.store_errors``).

The store "goes away" by pointing the running app at a database that cannot be opened (a SQLite
file in a folder removed after the engine was made): every query then fails as it does when a server refuses
connections, and ``check_ready`` (``/readyz``'s check) fails too.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import NoReturn

import httpx
import pytest
from fastapi import FastAPI

from hedgerow.controller.store.db import make_engine, make_sessionmaker
from tests.api.conftest import MakeApi
from tests.conftest import CallFactory
from tests.helpers import recent_calls


def _store_goes_away(app: FastAPI, tmp_path: Path) -> None:
    folder = tmp_path / "gone"
    folder.mkdir()
    engine = make_engine(f"sqlite+aiosqlite:///{folder}/store.db")
    folder.rmdir()  # the file can no longer be opened
    app.state.engine = engine
    app.state.sessionmaker = make_sessionmaker(engine)
    app.state.thresholds._sessionmaker = app.state.sessionmaker  # the poll cache's own reads too


async def test_an_unreachable_store_is_a_503_naming_it_and_one_log_line(
    make_api: MakeApi, call_factory: CallFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with make_api(threshold_check_interval_s=0.0) as (app, client):
        calls = recent_calls(call_factory, "a", 300, 1.0)
        assert (await client.post("/v1/calls", json={"calls": calls})).status_code == 202
        assert (await client.post("/v1/controller/run")).status_code == 200
        table = await client.get("/v1/thresholds")
        assert table.status_code == 200 and table.json()["thresholds"]
        _store_goes_away(app, tmp_path)
        caplog.clear()
        caplog.set_level(logging.INFO)
        for path in ("/v1/routes", "/v1/routes/summarize/history", "/v1/reports/weekly"):
            answer = await client.get(path)
            assert answer.status_code == 503, path
            assert answer.headers["retry-after"] == "5"
            assert answer.json()["detail"]["field"] == "database"
            assert "store is unavailable" in answer.json()["detail"]["message"]
        page = await client.get("/ui/routes")
        assert page.status_code == 503 and "text/html" in page.headers["content-type"]
        assert "store is unavailable" in page.text
        # polls keep the table rendered last; metrics keep this process's own series
        stale = await client.get("/v1/thresholds")
        assert stale.status_code == 200 and stale.content == table.content
        metrics = await client.get("/metrics")
        assert metrics.status_code == 200
        assert "hedgerow_store_up 0.0" in metrics.text and "hedgerow_records_accepted_total" in metrics.text
        assert "hedgerow_hedge_after_seconds{" not in metrics.text
        assert (await client.get("/readyz")).status_code == 503
        assert not [r for r in caplog.records if r.exc_info], "no traceback while the store is down"
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert any(m.startswith("GET /v1/routes: database not reachable") for m in warnings), warnings


async def test_a_store_error_while_the_store_answers_is_still_a_500(
    make_api: MakeApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A driver error that is not an outage (the store answers ``check_ready``) stays a 500."""
    from sqlalchemy.exc import IntegrityError

    from hedgerow.api import routes as routes_api

    async def broken(*_args: object, **_kwargs: object) -> NoReturn:
        raise IntegrityError("INSERT ...", {}, Exception("a constraint"))

    async with make_api() as (_app, client):
        monkeypatch.setattr(routes_api, "list_routes", broken)
        with pytest.raises(IntegrityError):  # the ASGI transport re-raises what the app did not answer
            await client.get("/v1/routes")


async def test_a_postgresql_server_that_refuses_the_store_is_a_503_and_recovers(
    call_factory: CallFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """The outage as an operator makes it: the database stops taking connections and its
    sessions are terminated under a running app; then it takes them again."""
    import asyncpg
    from sqlalchemy.engine import make_url

    from hedgerow.api.app import create_app
    from hedgerow.settings import Settings
    from tests.conftest import _admin_params, fresh_pg_database

    async with fresh_pg_database("hedgerow_down") as url:
        name = make_url(url).database
        app = create_app(
            Settings(
                database_url=url,
                controller_interval_s=3600.0,
                threshold_check_interval_s=0.0,
                allowed_hosts="hedgerow.test",
            )
        )
        admin = await asyncpg.connect(**_admin_params(url))
        try:
            async with app.router.lifespan_context(app):
                transport = httpx.ASGITransport(app=app)
                async with httpx.AsyncClient(transport=transport, base_url="http://hedgerow.test") as client:
                    calls = recent_calls(call_factory, "a", 300, 1.0)
                    assert (await client.post("/v1/calls", json={"calls": calls})).status_code == 202
                    assert (await client.post("/v1/controller/run")).status_code == 200
                    table = await client.get("/v1/thresholds")
                    assert table.status_code == 200
                    await admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
                    await admin.execute(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1", name
                    )
                    caplog.clear()
                    down = await client.get("/v1/routes")
                    assert down.status_code == 503 and down.json()["detail"]["field"] == "database"
                    assert (await client.get("/v1/thresholds")).content == table.content
                    assert "hedgerow_store_up 0.0" in (await client.get("/metrics")).text
                    assert not [r for r in caplog.records if r.exc_info], "no traceback while the store is down"
                    await admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
                    back = await client.get("/v1/routes")
                    assert back.status_code == 200 and back.json()["routes"], back.text
        finally:
            await admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
            await admin.close()


async def test_a_connection_the_server_refuses_is_a_503_even_when_the_check_then_passes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """PostgreSQL out of connection slots ("too many clients", SQLSTATE 53300) refuses the
    request's connection; the readiness check a moment later may get a slot that freed. The
    request still answers 503 (retry later), not a 500 with a traceback."""
    import uuid

    import asyncpg
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import DBAPIError
    from starlette.requests import Request

    from hedgerow.api.app import create_app
    from hedgerow.api.store_errors import store_unavailable
    from hedgerow.settings import Settings
    from tests.conftest import _admin_params, fresh_pg_database

    async with fresh_pg_database("hedgerow_refused") as url:
        role = f"hedgerow_refused_{uuid.uuid4().hex[:8]}"
        admin = await asyncpg.connect(**_admin_params(url))
        await admin.execute(f'CREATE ROLE "{role}" LOGIN CONNECTION LIMIT 0')  # every connection refused: 53300
        refused_engine = make_engine(make_url(url).set(username=role).render_as_string(hide_password=False))
        try:
            with pytest.raises(DBAPIError) as refused:
                async with refused_engine.connect():
                    pass
            app = create_app(Settings(database_url=url, controller_interval_s=3600.0))
            async with app.router.lifespan_context(app):
                scope = {"type": "http", "app": app, "method": "GET", "path": "/v1/routes", "headers": [],
                         "query_string": b"", "scheme": "http", "server": ("127.0.0.1", 8400)}  # fmt: skip
                caplog.clear()
                answer = await store_unavailable(Request(scope), refused.value)  # the store itself answers
                assert answer.status_code == 503 and answer.headers["retry-after"] == "5"
                assert b'"field":"database"' in answer.body
                assert [r.getMessage() for r in caplog.records if "SQLSTATE 53300" in r.getMessage()]
        finally:
            await refused_engine.dispose()
            await admin.execute(f'DROP ROLE "{role}"')
            await admin.close()
