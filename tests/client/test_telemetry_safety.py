"""TelemetryExporter under a refused token, invalid records, cut-off uploads and a full queue.

Scripted HTTP servers on 127.0.0.1 (tests/client/scripted_server.py, or a raw asyncio server for a
connection cut off before any answer) and a real ``serve`` on loopback.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from hedgerow.client import TelemetryExporter
from tests.client.scripted_server import Script, ScriptedServer, Seen
from tests.client.test_background import json_script, record
from tests.client.test_exporter_api import _until, api_on_loopback, stored_calls
from tests.conftest import CallFactory

LOGGER = "hedgerow.client.telemetry"
OLD_TOKEN = "old-token-0123456789abcdef"
NEW_TOKEN = "new-token-0123456789abcdef"


def accepted(seen: Seen) -> Script:
    assert seen.body is not None
    return json_script({"accepted": len(seen.body["calls"]), "duplicates": 0}, status=202)


def ids_of(seen: Seen) -> list[str]:
    assert seen.body is not None
    return [r["request_id"] for r in seen.body["calls"]]


class CountingTransport(httpx.AsyncHTTPTransport):
    """httpx's own transport (real HTTP), counting the POSTs it sends and their body bytes."""

    def __init__(self) -> None:
        super().__init__()
        self.posts = 0
        self.body_bytes: list[int] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.posts += 1
        self.body_bytes.append(len(request.content))
        return await super().handle_async_request(request)


@pytest.mark.parametrize("status", [401, 403])
async def test_a_token_rotated_mid_stream_loses_no_record_and_is_logged_once(
    status: int, caplog: pytest.LogCaptureFixture
) -> None:
    # The api takes only the new token; the exporter starts with the old one, keeps every record
    # through several refusals, and sends them all once the app gives it the new token.
    def script(i: int, seen: Seen) -> Script:
        if seen.headers.get("authorization") != f"Bearer {NEW_TOKEN}":
            return json_script({"detail": {"field": "authorization", "message": "bad token"}}, status=status)
        return accepted(seen)

    caplog.set_level(logging.INFO, logger=LOGGER)
    async with ScriptedServer(script) as api:
        exporter = TelemetryExporter(
            api.base_url.removesuffix("/v1"), token=OLD_TOKEN, batch_size=50, flush_interval_s=0.05
        )
        async with exporter:
            for i in range(150):
                exporter.submit(record(i))
            assert await _until(lambda: len(api.requests) >= 3, 30)  # three refusals at least
            assert exporter.token_refused and exporter.sent == 0
            for i in range(150, 300):
                exporter.submit(record(i))
            exporter.set_token(NEW_TOKEN)
            assert await _until(lambda: exporter.sent == 300, 30), exporter.last_error
        assert not exporter.token_refused
    with_new = [seen for seen in api.requests if seen.headers.get("authorization") == f"Bearer {NEW_TOKEN}"]
    taken = [i for seen in with_new for i in ids_of(seen)]
    assert sorted(taken) == sorted(f"r{i}" for i in range(300))
    assert exporter.dropped_by_reason == {"queue_full": 0, "refused": 0, "unsent": 0}
    lines = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len([line for line in lines if "does not accept the exporter's bearer token" in line]) == 1, lines
    assert len([line for line in lines if "accepts the exporter's token again" in line]) == 1, lines
    assert not any(OLD_TOKEN in line or NEW_TOKEN in line for line in lines)


async def test_a_token_provider_rotated_mid_stream_loses_no_record_on_a_real_api(database_url: str) -> None:
    # A real serve that knows only the new token; the app's token provider returns the old one
    # for a while (the api answers 401 meanwhile), then the new one: every record is stored.
    current = [OLD_TOKEN]
    async with api_on_loopback(database_url, tokens=f"exporter={NEW_TOKEN}:ingest") as url:
        exporter = TelemetryExporter(url, token=lambda: current[0], batch_size=50, flush_interval_s=0.05)
        async with exporter:
            for i in range(200):
                exporter.submit(record(i))
            assert await _until(lambda: exporter.token_refused, 30)
            await asyncio.sleep(1.0)  # refused for a while
            assert exporter.sent == 0 and exporter.pending == 200
            current[0] = NEW_TOKEN
            # No set_token: the next retry (at most 5 s away while the token is refused) reads it.
            assert await _until(lambda: exporter.sent == 200, 30), exporter.last_error
        assert exporter.dropped_by_reason == {"queue_full": 0, "refused": 0, "unsent": 0}
    assert await stored_calls(database_url) == 200


async def test_one_bad_record_among_1000_costs_log_n_posts_when_the_api_does_not_name_it() -> None:
    def script(i: int, seen: Seen) -> Script:
        if "r500" in ids_of(seen):
            return json_script({"detail": "invalid record"}, status=422)
        return accepted(seen)

    async with ScriptedServer(script) as api:
        exporter = TelemetryExporter(api.base_url.removesuffix("/v1"), batch_size=1000, max_queue=1000)
        for i in range(1000):
            exporter.submit(record(i))
        assert await exporter.flush(timeout_s=60)
        await exporter.aclose()
    posts = len(api.requests)
    print(f"\none bad record among 1000, unnamed: {posts} posts")
    assert posts <= 2 * math.ceil(math.log2(1000)) + 1
    taken = [i for seen in api.requests if "r500" not in ids_of(seen) for i in ids_of(seen)]
    assert sorted(taken) == sorted(f"r{i}" for i in range(1000) if i != 500)
    assert exporter.sent == 999 and exporter.dropped_by_reason == {"queue_full": 0, "refused": 1, "unsent": 0}


async def test_one_bad_record_among_1000_on_a_real_api_stores_the_999_others(
    database_url: str, call_factory: CallFactory
) -> None:
    now = datetime.now(UTC)
    records = [call_factory(f"b{i}", started_at=now - timedelta(seconds=i % 600)) for i in range(1000)]
    records[637] = call_factory("b637", started_at=now + timedelta(days=2))  # a clock two days ahead
    counting = CountingTransport()
    async with api_on_loopback(database_url) as url:
        exporter = TelemetryExporter(url, batch_size=1000, max_queue=1000, transport=counting)
        for r in records:
            exporter.submit(r)
        assert await exporter.flush(timeout_s=60), exporter.last_error
        await exporter.aclose()
    print(f"\none bad record among 1000, named by the api: {counting.posts} posts")
    assert counting.posts <= 2 * math.ceil(math.log2(1000)) + 1
    assert exporter.sent == 999 and exporter.dropped_by_reason == {"queue_full": 0, "refused": 1, "unsent": 0}
    assert await stored_calls(database_url) == 999


@pytest.mark.slow
async def test_a_batch_whose_every_record_is_refused_uploads_each_about_log_n_times(
    tmp_path: Path, call_factory: CallFactory
) -> None:
    # Every record two days ahead of the api's clock: each is refused (422 naming its index).
    # Re-posting the rest of the batch after each refusal uploaded ~n/2 times the batch.
    ahead = datetime.now(UTC) + timedelta(days=2)
    counting = CountingTransport()
    async with api_on_loopback(f"sqlite+aiosqlite:///{tmp_path / 'ahead.db'}") as url:
        exporter = TelemetryExporter(url, batch_size=1000, max_queue=1000, transport=counting)
        for i in range(1000):
            exporter.submit(call_factory(f"a{i}", started_at=ahead))
        assert await exporter.flush(timeout_s=300), exporter.last_error
        await exporter.aclose()
    uploaded = sum(counting.body_bytes)
    batches = uploaded / counting.body_bytes[0]
    print(f"\n1000 refused records: {counting.posts} posts, {uploaded / 1e6:.1f} MB ({batches:.1f} batches)")
    assert exporter.sent == 0 and exporter.dropped_by_reason == {"queue_full": 0, "refused": 1000, "unsent": 0}
    assert counting.posts <= 1000
    assert uploaded <= (math.log2(1000) + 2) * counting.body_bytes[0]


@asynccontextmanager
async def cuts_the_first_post() -> AsyncIterator[tuple[str, list[int]]]:
    """A raw HTTP server on 127.0.0.1 that resets the connection of its first POST without an
    answer and takes every later one (202); yields its url and the batch sizes it took."""
    taken: list[int] = []
    seen = [0]

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.lower().split(b"\r\n")
            length = next(int(line.split(b":", 1)[1]) for line in lines if line.startswith(b"content-length:"))
            body = await reader.readexactly(length)
            seen[0] += 1
            if seen[0] == 1:
                writer.transport.abort()  # a crash mid-request: no answer, a reset
                return
            count = body.count(b'"request_id"')
            taken.append(count)
            answer = b'{"accepted": %d, "duplicates": 0}' % count
            writer.write(
                b"HTTP/1.1 202 Accepted\r\nContent-Type: application/json\r\nConnection: close\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(answer), answer)
            )
            await writer.drain()
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", taken
    finally:
        server.close()
        await server.wait_closed()


async def test_the_batch_size_grows_back_after_an_upload_cut_off_once() -> None:
    async with cuts_the_first_post() as (url, taken):
        exporter = TelemetryExporter(url, batch_size=100, max_queue=1000)
        for i in range(100):
            exporter.submit(record(i))
        assert await exporter.flush(timeout_s=30), exporter.last_error
        assert exporter.batch_limit == 50 and taken == [50, 50]  # halved by the cut, nothing lost
        for round_ in range(3):
            for i in range(100):
                exporter.submit(record(100 * (round_ + 1) + i))
            assert await exporter.flush(timeout_s=30), exporter.last_error
        await exporter.aclose()
    assert exporter.batch_limit == 100 and taken[-1] == 100
    assert exporter.sent == 400 and exporter.dropped_by_reason == {"queue_full": 0, "refused": 0, "unsent": 0}


async def test_a_lasting_413_limit_is_found_and_not_probed_past_again() -> None:
    # The api takes at most 30 records a batch. The exporter halves to 25, grows back towards 50
    # (its last refused size) in a binary search, and settles between the two.
    def script(i: int, seen: Seen) -> Script:
        if len(ids_of(seen)) > 30:
            return json_script({"detail": "too many calls"}, status=413)
        return accepted(seen)

    async with ScriptedServer(script) as api:
        exporter = TelemetryExporter(api.base_url.removesuffix("/v1"), batch_size=100, max_queue=5000)
        for i in range(3000):
            exporter.submit(record(i))
        assert await exporter.flush(timeout_s=120), exporter.last_error
        await exporter.aclose()
    refused = [len(ids_of(seen)) for seen in api.requests if len(ids_of(seen)) > 30]
    print(f"\nrefused batch sizes: {refused}")
    assert exporter.sent == 3000 and exporter.rejected == 0
    assert len(refused) <= 2 + math.ceil(math.log2(50))  # 100 and 50, then the search
    assert exporter.batch_limit == 30  # found, and kept


async def test_every_dropped_record_is_counted_by_reason() -> None:
    def script(i: int, seen: Seen) -> Script:
        ids = ids_of(seen)
        if "r1" in ids:
            return json_script({"detail": {"index": ids.index("r1"), "field": "ttft_s", "message": "bad"}}, status=422)
        return accepted(seen)

    async with ScriptedServer(script) as api:
        exporter = TelemetryExporter(api.base_url.removesuffix("/v1"), batch_size=3, max_queue=3)
        for i in range(5):  # r0 and r1 pushed out of the full queue
            exporter.submit(record(i))
        assert exporter.dropped_by_reason == {"queue_full": 2, "refused": 0, "unsent": 0}
        assert await exporter.flush(timeout_s=10)
        await exporter.aclose()
    assert exporter.sent == 3

    async with ScriptedServer(script) as api:
        exporter = TelemetryExporter(api.base_url.removesuffix("/v1"), batch_size=3, max_queue=3)
        for i in range(3):  # r1 refused
            exporter.submit(record(i))
        assert await exporter.flush(timeout_s=10)
        await exporter.aclose()
    assert exporter.sent == 2 and exporter.dropped_by_reason == {"queue_full": 0, "refused": 1, "unsent": 0}

    exporter = TelemetryExporter("http://127.0.0.1:9", batch_size=2, max_queue=2)  # nothing listens
    for i in range(3):
        exporter.submit(record(i))
    await exporter.aclose(timeout_s=0.2)
    assert exporter.dropped_by_reason == {"queue_full": 1, "refused": 0, "unsent": 2}


def test_a_bad_token_is_refused_without_being_shown() -> None:
    with pytest.raises(ValueError, match="token") as info:
        TelemetryExporter("http://127.0.0.1:1", token="secret value\n")
    assert "secret" not in str(info.value)
    exporter = TelemetryExporter("http://127.0.0.1:1")
    with pytest.raises(ValueError, match="token"):
        exporter.set_token("")
