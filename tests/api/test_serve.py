"""A real ``hedgerow serve`` subprocess on a free port, spoken to over real HTTP."""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from sqlalchemy import func, select

from hedgerow.controller.store.db import make_engine
from hedgerow.controller.store.models import Lease
from tests.conftest import CallFactory
from tests.serve_process import running_serve


async def _wait_for(predicate: Callable[[], Awaitable[bool]], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await predicate():
            return True
        await asyncio.sleep(0.25)
    return False


@pytest.mark.slow
async def test_serve_subprocess_over_http(database_url: str, call_factory: CallFactory, tmp_path: Path) -> None:
    async with running_serve(database_url, tmp_path, HEDGEROW_CONTROLLER_INTERVAL_S="1") as served:
        now = datetime.now(UTC)
        calls = [
            call_factory(
                f"s{i}", route="chat", started_at=now - timedelta(seconds=i), primary_ttft_s=0.2 + 0.01 * (i % 10)
            ).to_dict()
            for i in range(60)
        ]
        async with httpx.AsyncClient(base_url=served.base, timeout=30) as client:
            assert (await client.get("/healthz")).json() == {"status": "ok"}
            assert (await client.get("/readyz")).status_code == 200
            posted = await client.post("/v1/calls", json={"calls": calls})
            assert posted.status_code == 202 and posted.json() == {"accepted": 60, "duplicates": 0}
            again = await client.post("/v1/calls", json={"calls": calls[:10]})
            assert again.json() == {"accepted": 0, "duplicates": 10}

            async def published() -> bool:
                return bool((await client.get("/v1/thresholds")).json()["thresholds"])

            # the scheduler ticks every second under the lease and publishes the route
            assert await _wait_for(published, 60), "no threshold published by the scheduled job"
            table = await client.get("/v1/thresholds")
            [row] = table.json()["thresholds"]
            assert (row["route"], row["model"], row["enabled"]) == ("chat", "m1", True)
            assert row["source"] in ("controller", "default")
            history = (await client.get("/v1/routes/chat/history", params={"model": "m1"})).json()["history"]
            assert history and history[0]["samples"] == 60
    # running_serve sent SIGTERM and waited; uvicorn shuts down gracefully, then re-raises the
    # signal: the status is -SIGTERM (or 0)
    stderr = await served.stderr_text()
    assert served.process.returncode in (0, -signal.SIGTERM), stderr[-2000:]
    assert "Traceback" not in stderr, stderr[-2000:]
    # the lifespan ran its shutdown: the controller lease was released
    engine = make_engine(database_url)
    try:
        async with engine.connect() as connection:
            assert (await connection.execute(select(func.count()).select_from(Lease))).scalar() == 0
    finally:
        await engine.dispose()


async def test_serve_refuses_public_host_without_tokens(tmp_path: Path) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "hedgerow.cli",
        "serve",
        "--host",
        "0.0.0.0",
        "--port",
        "0",
        "--db",
        f"sqlite+aiosqlite:///{tmp_path / 'x.db'}",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=tmp_path,
    )
    _out, err = await asyncio.wait_for(process.communicate(), timeout=60)
    assert process.returncode == 2
    assert err.decode().strip().startswith("hedgerow: refusing to listen on '0.0.0.0' without auth")
    assert "Traceback" not in err.decode()


def test_serve_with_unreachable_database_is_one_line() -> None:
    from typer.testing import CliRunner

    from hedgerow.cli import app

    result = CliRunner().invoke(app, ["serve", "--db", "postgresql+asyncpg://postgres@127.0.0.1:1/x", "--port", "0"])
    assert result.exit_code == 1
    assert "cannot migrate database postgresql+asyncpg://postgres@127.0.0.1:1/x" in result.output
    assert "Traceback" not in result.output


async def test_serve_async_embedded_stops_on_event(tmp_path: Path) -> None:
    from hedgerow.api.server import serve_async
    from hedgerow.settings import Settings

    urls: list[str] = []
    stop = asyncio.Event()
    settings = Settings(database_url=f"sqlite+aiosqlite:///{tmp_path / 'e.db'}", port=0, controller_interval_s=3600)
    server = asyncio.create_task(serve_async(settings, announce=urls.append, stop=stop))
    assert await _wait_for(lambda: asyncio.sleep(0, result=bool(urls)), 60)
    async with httpx.AsyncClient(base_url=urls[0]) as client:
        assert (await client.get("/readyz")).json()["status"] == "ready"
    stop.set()
    await asyncio.wait_for(server, timeout=30)


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"HEDGEROW_DEFAULT_HEDGE_AFTER_S": "100"}, "HEDGEROW_DEFAULT_HEDGE_AFTER_S"),
        ({"HEDGEROW_MIN_HEDGE_AFTER_S": "40"}, "HEDGEROW_MIN_HEDGE_AFTER_S"),
        ({"HEDGEROW_MAX_HEDGE_AFTER_S": "100000", "HEDGEROW_DEFAULT_HEDGE_AFTER_S": "2"}, "HEDGEROW_MAX_HEDGE_AFTER_S"),
        ({"HEDGEROW_MAX_HEDGE_AFTER_S": "inf"}, "HEDGEROW_MAX_HEDGE_AFTER_S"),
        ({"HEDGEROW_WINDOW_S": "100000"}, "HEDGEROW_WINDOW_S"),
        ({"HEDGEROW_SHORT_WINDOW_S": "7200"}, "HEDGEROW_SHORT_WINDOW_S"),
    ],
)
async def test_serve_refuses_inconsistent_route_and_window_settings(
    tmp_path: Path, env: dict[str, str], named: str
) -> None:
    import os

    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "hedgerow.cli",
        "serve",
        "--port",
        "0",
        "--db",
        f"sqlite+aiosqlite:///{tmp_path / 's.db'}",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=tmp_path,
        env={**os.environ, **env},
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(), timeout=60)
    except TimeoutError:
        process.kill()
        await process.wait()
        pytest.fail(f"serve started with {env} instead of refusing the settings")
    assert process.returncode == 2, (out, err)
    text = err.decode().strip()
    assert named in text and "Traceback" not in text
    assert len(text.splitlines()) == 1, text
    assert not (tmp_path / "s.db").exists()  # refused before anything started


def test_settings_accept_consistent_bounds() -> None:
    from hedgerow.client.records import MAX_SECONDS
    from hedgerow.settings import Settings

    settings = Settings(
        default_hedge_after_s=5,
        min_hedge_after_s=5,
        max_hedge_after_s=MAX_SECONDS,
        window_s=600,
        short_window_s=600,
        max_window_s=600,
    )
    assert (settings.max_hedge_after_s, settings.short_window_s) == (MAX_SECONDS, 600)
