"""ThresholdPoller and TelemetryExporter against scripted HTTP servers on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from typing import Any

import pytest

from hedgerow.client import CallRecord, TelemetryExporter, ThresholdPoller
from tests.client.scripted_server import Script, ScriptedServer, Seen

TABLE = {
    "thresholds": [
        {
            "route": "r",
            "model": "m",
            "hedge_after_s": 0.7,
            "enabled": True,
            "source": "controller",
            "version": 3,
            "budget": 0.1,
            "updated_at": "2026-11-29T08:00:00Z",
        }
    ]
}


def json_script(payload: object, status: int = 200, headers: dict[str, str] | None = None) -> Script:
    return Script(
        status=status,
        content_type="application/json",
        headers=headers or {},
        pieces=[(0.0, json.dumps(payload).encode())],
    )


def record(i: int) -> CallRecord:
    return CallRecord(request_id=f"r{i}", route="r", model="m", started_at=datetime.now(UTC))


async def test_poller_uses_etag_and_keeps_the_last_table_on_errors() -> None:
    def script(i: int, seen: Seen) -> Script:
        if i == 0:
            return json_script(TABLE, headers={"ETag": '"v3"'})
        if i == 1:
            assert seen.headers.get("if-none-match") == '"v3"'
            return Script(status=304, content_type="application/json")
        return json_script({"detail": "down"}, status=503)

    async with ScriptedServer(script) as api:
        # max_stale_s leaves a loaded machine 1.5 s between the last good poll and the lookups
        # that must still see its table.
        poller = ThresholdPoller(api.base_url.removesuffix("/v1"), interval_s=60, max_stale_s=1.5)
        try:
            assert await poller.refresh()
            assert poller.lookup("r", "m") == (0.7, 3, True)
            assert poller.lookup("r", "other") is None
            assert await poller.refresh() and poller.polls_unchanged == 1
            assert not await poller.refresh() and poller.polls_failed == 1
            assert poller.lookup("r", "m") == (0.7, 3, True)  # last good table still served
            await asyncio.sleep(1.6)
            assert poller.lookup("r", "m") is None  # stale: fall back to the policy's value
        finally:
            await poller.aclose()


async def test_poller_rejects_a_malformed_table_and_keeps_the_old_one() -> None:
    bad = {"thresholds": [{"route": "r", "model": "m", "hedge_after_s": "soon"}]}
    scripts = [json_script(TABLE), json_script(bad)]
    async with ScriptedServer(lambda i, seen: scripts[min(i, 1)]) as api:
        poller = ThresholdPoller(api.base_url.removesuffix("/v1"), interval_s=60)
        try:
            assert await poller.refresh()
            assert not await poller.refresh()
            assert poller.last_error is not None
            assert "row 0" in poller.last_error
            assert poller.lookup("r", "m") == (0.7, 3, True)
        finally:
            await poller.aclose()


async def test_exporter_retries_until_the_api_accepts() -> None:
    def script(i: int, seen: Seen) -> Script:
        if i == 0:
            return json_script({"detail": "starting"}, status=503)
        return json_script({"accepted": len(seen.json_body["calls"]), "duplicates": 0}, status=202)

    async with ScriptedServer(script) as api:
        exporter = TelemetryExporter(api.base_url.removesuffix("/v1"), batch_size=10, flush_interval_s=0.1)
        async with exporter:
            for i in range(5):
                exporter.submit(record(i))
            for _ in range(100):
                if exporter.sent == 5:
                    break
                await asyncio.sleep(0.05)
        assert exporter.sent == 5 and exporter.pending == 0 and exporter.dropped == 0
        posted = [r["request_id"] for seen in api.requests[1:] for r in seen.json_body["calls"]]
        assert posted == [f"r{i}" for i in range(5)]


async def test_exporter_drops_the_oldest_when_full_and_counts_it() -> None:
    exporter = TelemetryExporter("http://127.0.0.1:9", batch_size=2, max_queue=3)
    for i in range(5):
        exporter.submit(record(i))
    assert exporter.dropped == 2 and exporter.pending == 3
    assert not await exporter.flush(timeout_s=0.3)  # nothing listens on port 9
    await exporter.aclose(timeout_s=0.1)


async def test_exporter_drops_only_the_record_the_api_names_as_invalid() -> None:
    def script(i: int, seen: Seen) -> Script:
        ids = [r["request_id"] for r in seen.json_body["calls"]]
        if "r1" in ids:
            return json_script({"detail": {"index": ids.index("r1"), "field": "ttft_s"}}, status=422)
        return json_script({"accepted": len(ids), "duplicates": 0}, status=202)

    async with ScriptedServer(script) as api:
        exporter = TelemetryExporter(api.base_url.removesuffix("/v1"), batch_size=5)
        for i in range(3):
            exporter.submit(record(i))
        assert await exporter.flush(timeout_s=5)
        assert exporter.last_error is not None
        assert exporter.rejected == 1 and exporter.sent == 2 and "ttft_s" in exporter.last_error
        # The rest goes out again in two halves (a bisection, should either hold another bad one).
        assert [[r["request_id"] for r in seen.json_body["calls"]] for seen in api.requests[1:]] == [["r0"], ["r2"]]
        await exporter.aclose()


async def test_exporter_drops_a_batch_refused_as_a_whole() -> None:
    # A status no retry or split can cure (the url is wrong); 401/403 keep the records instead
    # (tests/client/test_telemetry_safety.py).
    async with ScriptedServer(json_script({"detail": "not found"}, status=404)) as api:
        exporter = TelemetryExporter(api.base_url.removesuffix("/v1"), batch_size=5)
        exporter.submit(record(0))
        exporter.submit(record(1))
        assert await exporter.flush(timeout_s=5)
        assert exporter.rejected == 2 and exporter.pending == 0
        await exporter.aclose()


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"batch_size": 0}, "batch_size"),
        ({"flush_interval_s": -1}, "flush_interval_s"),
        ({"api_url": "nope"}, "api_url"),
    ],
)
def test_exporter_validation_names_the_field(kwargs: dict[str, Any], field: str) -> None:
    args = {"api_url": "http://127.0.0.1:1", **kwargs}
    with pytest.raises(ValueError, match=field):
        TelemetryExporter(**args)


async def test_records_submitted_while_a_post_is_in_flight_are_neither_lost_nor_miscounted() -> None:
    # A slow api (0.5 s per POST) and a queue of 5: r0-r4 go out in one batch; r5-r7 arrive
    # while it is in flight and must be sent next, with nothing counted as dropped.
    def script(i: int, seen: Seen) -> Script:
        body = json.dumps({"accepted": len(seen.json_body["calls"]), "duplicates": 0}).encode()
        return Script(status=202, content_type="application/json", header_delay_s=0.5, pieces=[(0.0, body)])

    async with ScriptedServer(script) as api:
        exporter = TelemetryExporter(api.base_url.removesuffix("/v1"), batch_size=5, max_queue=5, flush_interval_s=0.05)
        async with exporter:
            for i in range(5):
                exporter.submit(record(i))
            await asyncio.sleep(0.2)  # the first batch is in flight
            assert exporter.pending == 5
            for i in range(5, 8):
                exporter.submit(record(i))
            assert await exporter.flush(timeout_s=10)
    posted = [r["request_id"] for seen in api.requests for r in seen.json_body["calls"]]
    assert posted == [f"r{i}" for i in range(8)]
    assert exporter.sent == 8 and exporter.dropped == 0 and exporter.pending == 0


async def test_a_full_queue_during_an_outage_drops_the_oldest_and_counts_each() -> None:
    exporter = TelemetryExporter("http://127.0.0.1:9", batch_size=2, max_queue=4)
    for i in range(4):
        exporter.submit(record(i))
    assert not await exporter.flush(timeout_s=0.3)  # nothing listens: the batch r0-r1 is held
    for i in range(4, 8):
        exporter.submit(record(i))
    # The queue holds max_queue records besides the held batch: r2 and r3 were pushed out.
    assert exporter.dropped == 2 and exporter.pending == 6
    assert [r["request_id"] for r in exporter._queue] == ["r4", "r5", "r6", "r7"]  # white-box: the order
    assert [r["request_id"] for part in exporter._held for r in part] == ["r0", "r1"]
    await exporter.aclose(timeout_s=0.1)
