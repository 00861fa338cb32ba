"""POST /v1/calls: 202 with counts, idempotent re-posts, 413 over the limit, 422 with nothing written."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi import FastAPI
from sqlalchemy import func, select

from hedgerow.controller.store.models import Call, Route
from tests.api.conftest import MakeApi
from tests.conftest import CallFactory
from tests.helpers import drop_day_partitions


async def _calls_stored(app: FastAPI) -> int:
    async with app.state.sessionmaker() as session:
        count: int = await session.scalar(select(func.count()).select_from(Call))
        return count


async def test_ingest_and_repost_is_not_double_counted(make_api: MakeApi, call_factory: CallFactory) -> None:
    batch = [call_factory(f"r{i}").to_dict() for i in range(20)]
    async with make_api() as (app, api):
        first = await api.post("/v1/calls", json={"calls": batch})
        assert first.status_code == 202 and first.json() == {"accepted": 20, "duplicates": 0}
        again = await api.post("/v1/calls", json={"calls": [*batch[:5], call_factory("new").to_dict()]})
        assert again.status_code == 202 and again.json() == {"accepted": 1, "duplicates": 5}
        assert await _calls_stored(app) == 21
        routes = (await api.get("/v1/routes")).json()["routes"]
        assert [(r["route"], r["model"], r["budget"], r["threshold"]) for r in routes] == [
            ("summarize", "m1", 0.10, None)
        ]


async def test_batch_over_the_limit_is_413(make_api: MakeApi, call_factory: CallFactory) -> None:
    async with make_api(max_batch_calls=5) as (_app, api):
        response = await api.post("/v1/calls", json={"calls": [call_factory(f"r{i}").to_dict() for i in range(6)]})
        assert response.status_code == 413
        assert response.json()["detail"]["field"] == "calls"
        assert "max_batch_calls=5" in response.json()["detail"]["message"]
        ok = await api.post("/v1/calls", json={"calls": [call_factory(f"r{i}").to_dict() for i in range(5)]})
        assert ok.status_code == 202
    async with make_api() as (_app, api):  # the default limit is 1000
        minimal = [
            {"request_id": f"m{i}", "route": "r", "model": "m", "started_at": datetime.now(UTC).isoformat()}
            for i in range(1001)
        ]
        assert (await api.post("/v1/calls", json={"calls": minimal})).status_code == 413
        assert (await api.post("/v1/calls", json={"calls": minimal[:1000]})).json() == {
            "accepted": 1000,
            "duplicates": 0,
        }


async def test_bad_record_is_422_naming_index_and_field_and_nothing_is_written(
    make_api: MakeApi, call_factory: CallFactory
) -> None:
    batch = [call_factory(f"r{i}").to_dict() for i in range(4)]
    batch[2]["attempts"][0]["start_s"] = -0.5
    async with make_api() as (app, api):
        response = await api.post("/v1/calls", json={"calls": batch})
        assert response.status_code == 422
        detail = response.json()["detail"]
        assert detail["index"] == 2 and detail["field"] == "attempts[0].start_s"
        assert "greater than or equal to 0" in detail["message"]
        batch[2]["attempts"][0]["start_s"] = 0.0
        batch[3]["started_at"] = "yesterday"
        detail = (await api.post("/v1/calls", json={"calls": batch})).json()["detail"]
        assert (detail["index"], detail["field"]) == (3, "started_at")
        assert await _calls_stored(app) == 0
        async with app.state.sessionmaker() as session:
            assert await session.scalar(select(func.count()).select_from(Route)) == 0
        for body, field in ((b"not json", "body"), (b'{"records": []}', "calls"), (b'{"calls": {}}', "calls")):
            response = await api.post("/v1/calls", content=body, headers={"content-type": "application/json"})
            assert response.status_code == 422 and response.json()["detail"]["field"] == field


async def test_concurrent_posts_of_overlapping_batches(make_api: MakeApi, call_factory: CallFactory) -> None:
    import asyncio

    records = [call_factory(f"c{i}", route=f"r{i % 4}").to_dict() for i in range(120)]
    batches = [records[i : i + 40] for i in range(0, 100, 20)]  # overlapping windows
    async with make_api() as (app, api):
        answers = await asyncio.gather(*(api.post("/v1/calls", json={"calls": b}) for b in batches))
        assert all(a.status_code == 202 for a in answers)
        assert sum(a.json()["accepted"] for a in answers) == 120
        assert sum(a.json()["duplicates"] for a in answers) == 5 * 40 - 120
        assert await _calls_stored(app) == 120


# --- values the store could not hold, and records that contradict themselves -------------------

BAD_VALUES = [
    ({"started_at": "0001-01-01T00:00:00+14:00"}, "started_at"),
    ({"started_at": "9999-12-31T23:59:59-05:00"}, "started_at"),
    ({"completion_tokens": 10**30}, "completion_tokens"),
    ({"completion_tokens": 2**31}, "completion_tokens"),
    ({"threshold_version": 2**63}, "threshold_version"),
    ({"route": "r" * 201}, "route"),
    ({"request_id": "x" * 5000}, "request_id"),
    ({"ttft_s": 1e12}, "ttft_s"),
]


@pytest.mark.parametrize("patch, field", BAD_VALUES, ids=[f for _, f in BAD_VALUES])
async def test_out_of_range_values_are_422_not_500(
    make_api: MakeApi, call_factory: CallFactory, patch: dict[str, object], field: str
) -> None:
    raw = call_factory("ok-0").to_dict()
    raw.update(patch)
    async with make_api() as (app, api):
        response = await api.post("/v1/calls", json={"calls": [call_factory("ok-1").to_dict(), raw]})
        assert response.status_code == 422, response.text
        detail = response.json()["detail"]
        assert detail["index"] == 1 and detail["field"] == field
        assert await _calls_stored(app) == 0
        again = await api.post("/v1/calls", json={"calls": [call_factory("ok-1").to_dict()]})
        assert again.json()["accepted"] == 1


@pytest.mark.parametrize(
    "mutate, field",
    [
        (lambda r: r["attempts"][0].update(start_s=2.0, first_token_s=1.0, end_s=0.5), "attempts[0].end_s"),
        (lambda r: r["attempts"][0].update(first_token_s=9.0), "attempts[0].first_token_s"),
        (lambda r: r.update(hedged=True, hedge_reason="ttft_timeout"), "hedged"),
        (lambda r: r.update(winner="backup"), "winner"),
        (lambda r: r["attempts"][0].update(status_code=10**12), "attempts[0].status_code"),
    ],
    ids=["end_before_start", "first_token_after_end", "hedged_without_backup", "winner_without_attempt", "status_code"],
)
async def test_self_contradicting_records_are_refused(
    make_api: MakeApi, call_factory: CallFactory, mutate: Callable[[dict[str, Any]], None], field: str
) -> None:
    raw = call_factory("c-0").to_dict()
    mutate(raw)
    async with make_api() as (_app, api):
        response = await api.post("/v1/calls", json={"calls": [raw]})
        assert response.status_code == 422, response.text
        assert response.json()["detail"]["field"] == field


async def test_responses_records_keep_their_api_and_chat_records_read_chat(
    make_api: MakeApi, call_factory: CallFactory
) -> None:
    from dataclasses import replace

    chat = call_factory("chat-1")
    responses = replace(call_factory("resp-1"), api="responses")
    assert "api" not in chat.to_dict() and responses.to_dict()["api"] == "responses"
    async with make_api() as (app, api):
        posted = await api.post("/v1/calls", json={"calls": [chat.to_dict(), responses.to_dict()]})
        assert posted.status_code == 202 and posted.json() == {"accepted": 2, "duplicates": 0}
        bad = responses.to_dict() | {"request_id": "resp-2", "api": "completions"}
        refused = await api.post("/v1/calls", json={"calls": [bad]})
        assert refused.status_code == 422 and refused.json()["detail"]["field"] == "api"
        async with app.state.sessionmaker() as session:
            stored = dict((await session.execute(select(Call.request_id, Call.api))).all())
    assert stored == {"chat-1": "chat", "resp-1": "responses"}


async def test_records_older_than_retention_are_refused_and_late_ones_within_it_get_their_day(
    make_api: MakeApi, call_factory: CallFactory
) -> None:
    from hedgerow.controller.store.partitions import partition_days

    now = datetime.now(UTC)
    async with make_api(retention_s=3 * 86400.0) as (app, api):
        late = call_factory("late", started_at=now - timedelta(days=2, hours=20))  # a day without a partition
        too_old = call_factory("old", started_at=now - timedelta(days=3, minutes=1))
        refused = await api.post("/v1/calls", json={"calls": [late.to_dict(), too_old.to_dict()]})
        assert refused.status_code == 422
        detail = refused.json()["detail"]
        assert (detail["index"], detail["field"]) == (1, "started_at")
        assert "more than 259200 s (3 days, HEDGEROW_RETENTION_S)" in detail["message"], detail
        accepted = await api.post("/v1/calls", json={"calls": [late.to_dict()]})
        assert accepted.json() == {"accepted": 1, "duplicates": 0}
        async with app.state.sessionmaker() as session:
            assert await session.scalar(select(func.count()).select_from(Call)) == 1
            if session.get_bind().dialect.name == "postgresql":
                days = await partition_days(await session.connection())
                assert late.started_at.date() in days


async def test_a_cached_day_dropped_by_another_connection_is_made_again_and_the_batch_stored(
    make_api: MakeApi, call_factory: CallFactory
) -> None:
    from sqlalchemy import text

    from hedgerow.controller.store.partitions import day_of, partition_name

    started = datetime.now(UTC) - timedelta(days=2)
    day = day_of(started)
    async with make_api() as (app, api):
        engine = app.state.sessionmaker.kw["bind"]
        if engine.dialect.name != "postgresql":
            pytest.skip("SQLite keeps plain tables")
        first = await api.post("/v1/calls", json={"calls": [call_factory("a", started_at=started).to_dict()]})
        assert first.json() == {"accepted": 1, "duplicates": 0}
        assert app.state.partition_days.unknown([day], now=datetime.now(UTC)) == []  # learnt
        await drop_day_partitions(engine.url, day)
        again = await api.post("/v1/calls", json={"calls": [call_factory("b", started_at=started).to_dict()]})
        assert again.status_code == 202 and again.json() == {"accepted": 1, "duplicates": 0}
        assert await _calls_stored(app) == 1  # "a" went with its day; "b" is in the day made again
        async with app.state.sessionmaker() as session:
            assert await session.scalar(text(f"SELECT request_id FROM {partition_name('calls', day)}")) == "b"
