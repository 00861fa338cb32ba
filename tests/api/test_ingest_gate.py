"""PostgreSQL: batches past the ingest slots are answered 503 with ``Retry-After``, nothing written."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest

from tests.conftest import fresh_pg_database
from tests.ingest_load import batch_template
from tests.serve_process import running_serve

pytestmark = pytest.mark.slow


async def test_batches_past_the_slots_are_503_with_retry_after(tmp_path: Path) -> None:
    template = batch_template(1000, 3)
    async with (
        fresh_pg_database("hedgerow_gate") as url,
        running_serve(url, tmp_path, HEDGEROW_DB_INGEST_POOL_SIZE="1", HEDGEROW_INGEST_WAIT_S="0") as served,
        httpx.AsyncClient(base_url=served.base, timeout=120) as client,
    ):
        bodies = [template.replace(b"@@@@@@@@@@", f"gate{i:06d}".encode()) for i in range(8)]
        answers = await asyncio.gather(
            *(client.post("/v1/calls", content=body, headers={"content-type": "application/json"}) for body in bodies)
        )
        statuses = sorted(answer.status_code for answer in answers)
        assert 202 in statuses and 503 in statuses, statuses
        busy = next(answer for answer in answers if answer.status_code == 503)
        assert busy.headers["retry-after"] == "1"
        assert busy.json()["detail"]["field"] == "calls"
        accepted = sum(answer.json()["accepted"] for answer in answers if answer.status_code == 202)
        assert accepted == 1000 * statuses.count(202)  # a refused batch wrote nothing: posted again, it is new
        again = await client.post(
            "/v1/calls", content=bodies[answers.index(busy)], headers={"content-type": "application/json"}
        )
        assert again.status_code == 202 and json.loads(again.content) == {"accepted": 1000, "duplicates": 0}
