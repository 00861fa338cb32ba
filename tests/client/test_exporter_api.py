"""TelemetryExporter and ThresholdPoller against a real api on loopback (issue 13, points 2 and 8)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from hedgerow.api.server import serve_async
from hedgerow.client import TelemetryExporter, ThresholdPoller
from hedgerow.client.telemetry import full_jitter_backoff_s
from hedgerow.controller.store.db import make_engine
from hedgerow.controller.store.models import Call
from hedgerow.settings import Settings
from tests.client.test_background import record
from tests.conftest import CallFactory
from tests.helpers import free_port


@asynccontextmanager
async def api_on_loopback(database_url: str, port: int = 0, **settings: Any) -> AsyncIterator[str]:
    """``serve_async`` in this process on 127.0.0.1; yields its url."""
    urls: list[str] = []
    stop = asyncio.Event()
    values = {"database_url": database_url, "port": port, "controller_interval_s": 3600.0, **settings}
    task = asyncio.create_task(serve_async(Settings(**values), announce=urls.append, stop=stop))
    try:
        async with asyncio.timeout(60):
            while not urls:
                assert not task.done(), task.exception()
                await asyncio.sleep(0.05)
        yield urls[0]
    finally:
        stop.set()
        await asyncio.wait_for(task, 60)


async def stored_calls(database_url: str) -> int:
    engine = make_engine(database_url)
    try:
        async with engine.connect() as connection:
            return int((await connection.execute(select(func.count()).select_from(Call))).scalar() or 0)
    finally:
        await engine.dispose()


async def _until(predicate: Any, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        await asyncio.sleep(0.05)
    return bool(predicate())


@pytest.mark.slow
async def test_batches_the_api_refuses_as_too_large_are_split_and_nothing_is_lost(
    database_url: str, call_factory: CallFactory
) -> None:
    now = datetime.now(UTC)
    records = [call_factory(f"big{i}", started_at=now - timedelta(seconds=i % 600)) for i in range(1000)]
    # A batch limit (50 calls) and a byte limit (64 KiB, ~100 records) both below the exporter's 200.
    async with api_on_loopback(database_url, max_batch_calls=50, max_body_bytes=65_536) as url:
        exporter = TelemetryExporter(url, batch_size=200, flush_interval_s=0.05)
        async with exporter:
            for record in records:
                exporter.submit(record)
            assert await _until(lambda: exporter.sent == 1000, 120), (exporter.sent, exporter.last_error)
        assert exporter.rejected == 0 and exporter.dropped == 0 and exporter.unsent == 0
        # Below the smallest size refused (100): it grows back only in a search between 50 and that.
        assert exporter.batch_limit < 100
    assert await stored_calls(database_url) == 1000


async def _silent_server() -> tuple[asyncio.Server, int, list[asyncio.StreamWriter]]:
    """A TCP server that accepts connections and never answers."""
    held: list[asyncio.StreamWriter] = []

    async def hold(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1], held


async def test_poller_start_never_blocks_and_close_is_bounded_when_the_api_never_answers() -> None:
    server, port, held = await _silent_server()
    try:
        url = f"http://127.0.0.1:{port}"
        # Only start() is timed: the constructor builds an httpx client, whose TLS context loads
        # the CA bundle (over a second on a loaded machine). A start that waited for the first
        # poll would take the poll's 30 s timeout; the bound is a sixth of that.
        poller = ThresholdPoller(url, interval_s=60, timeout_s=30)
        begun = time.monotonic()
        await poller.start()
        started_s = time.monotonic() - begun
        assert poller.lookup("r", "m") is None  # calls use their policy's value meanwhile
        assert not await poller.wait_ready(0.2)

        exporter = TelemetryExporter(url, batch_size=10, flush_interval_s=0.05, timeout_s=30, close_timeout_s=1.0)
        exporter.start()
        for i in range(25):
            exporter.submit(record(i))
        await asyncio.sleep(0.2)
        begun = time.monotonic()
        await exporter.aclose()
        closed_s = time.monotonic() - begun
        await poller.aclose()
        print(f"\npoller start {started_s * 1000:.1f} ms; exporter close {closed_s:.2f} s, unsent {exporter.unsent}")
        assert started_s < 5.0
        assert closed_s < 1.0 + 4.0
        assert exporter.unsent == 25 and exporter.pending == 0
    finally:
        for writer in held:
            writer.close()
        server.close()


async def test_close_with_the_api_down_is_bounded_and_counts_what_it_could_not_send() -> None:
    exporter = TelemetryExporter(f"http://127.0.0.1:{free_port()}", batch_size=10, close_timeout_s=0.5)
    exporter.start()
    for i in range(30):
        exporter.submit(record(i))
    begun = time.monotonic()
    await exporter.aclose()
    assert time.monotonic() - begun < 0.5 + 4.0
    assert exporter.unsent == 30 and exporter.sent == 0


def test_full_jitter_backoff_is_bounded_by_its_doubling_ceiling() -> None:
    for failures, ceiling_s in ((1, 0.5), (2, 1.0), (4, 4.0), (7, 30.0), (1000, 30.0)):
        waits = [full_jitter_backoff_s(failures) for _ in range(2000)]
        assert min(waits) >= 0.0 and max(waits) <= ceiling_s
        assert max(waits) > 0.8 * ceiling_s and min(waits) < 0.2 * ceiling_s  # spread over the whole range


@pytest.mark.slow
async def test_exporter_resumes_at_once_after_an_outage_and_resets_its_backoff(
    tmp_path: Path, call_factory: CallFactory
) -> None:
    database_url = f"sqlite+aiosqlite:///{tmp_path / 'outage.db'}"
    port = free_port()
    exporter = TelemetryExporter(f"http://127.0.0.1:{port}", batch_size=50, flush_interval_s=0.05)
    async with exporter:
        for i in range(100):
            exporter.submit(call_factory(f"o{i}", started_at=datetime.now(UTC)))
        assert await _until(lambda: exporter._failures >= 3, 30)
        async with api_on_loopback(database_url, port=port):
            # Three failures: the next wait is at most 4 s (full jitter), then the queue drains.
            assert await _until(lambda: exporter.sent == 100, 30), exporter.last_error
            assert exporter._failures == 0
    assert await stored_calls(database_url) == 100
