"""``POST /v1/controller/run``: the answer streamed in batches equals the response model's JSON.

Every test that touches a store runs on SQLite and PostgreSQL (the ``database_url`` fixture).
"""

from __future__ import annotations

import asyncio
from typing import Any

from hedgerow.api.controller import ROWS_PER_CHUNK, run_body
from hedgerow.api.json_response import api_json_bytes, clean_floats
from hedgerow.api.schemas import ControllerRunOut
from tests.api.conftest import MakeApi
from tests.conftest import CallFactory
from tests.helpers import recent_calls


async def test_the_streamed_answer_is_the_response_models_json(make_api: MakeApi, call_factory: CallFactory) -> None:
    """Three routes ticked: the answer parses to what ``ControllerRunOut`` makes of the tick's rows."""
    async with make_api() as (app, api):
        calls = [c for route in ("a", "b", "c") for c in recent_calls(call_factory, route, 200, 1.0, route=route)]
        assert (await api.post("/v1/calls", json={"calls": calls})).status_code == 202
        answer = await api.post("/v1/controller/run")
        assert answer.status_code == 200 and answer.headers["content-type"] == "application/json"
        rows = app.state.scheduler.last_tick
        assert len(rows) == 3
        expected = ControllerRunOut.model_validate({"ran": True, "history": rows}).model_dump(mode="json")
        assert answer.json() == clean_floats(expected)  # floats as every api answer writes them
        assert all(row["explanation"] for row in answer.json()["history"])


async def _drain(rows: list[dict[str, Any]] | None, ticks: list[int]) -> list[bytes]:
    """The chunks of ``run_body(rows)``, noting how many loop turns a concurrent task got by each."""
    turns = 0

    async def spin() -> None:
        nonlocal turns
        while True:
            turns += 1
            await asyncio.sleep(0)

    spinner = asyncio.create_task(spin())
    await asyncio.sleep(0)
    chunks = []
    try:
        async for chunk in run_body(rows):
            chunks.append(chunk)
            ticks.append(turns)
    finally:
        spinner.cancel()
    return chunks


async def test_the_loop_runs_other_tasks_between_batches(make_api: MakeApi, call_factory: CallFactory) -> None:
    """A tick of more rows than one batch: other tasks run between the batches; the body is whole."""
    async with make_api() as (app, api):
        await api.post("/v1/calls", json={"calls": recent_calls(call_factory, "u", 200, 1.0, route="r")})
        await api.post("/v1/controller/run")
        [row] = app.state.scheduler.last_tick
    rows = [row] * (2 * ROWS_PER_CHUNK + 1)
    ticks: list[int] = []
    chunks = await _drain(rows, ticks)
    assert len(chunks) == 5  # opening, three batches, closing
    assert ticks[1] < ticks[2] < ticks[3], ticks  # the concurrent task ran between the batches
    expected = ControllerRunOut.model_validate({"ran": True, "history": rows}).model_dump(mode="json")
    assert b"".join(chunks) == api_json_bytes(expected)


async def test_not_run_is_an_empty_history() -> None:
    """Another process holds the lease: ``{"ran": false, "history": []}``."""
    chunks = await _drain(None, [])
    assert b"".join(chunks) == api_json_bytes(ControllerRunOut(ran=False, history=[]).model_dump(mode="json"))
