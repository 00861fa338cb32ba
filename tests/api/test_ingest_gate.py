"""PostgreSQL: batches past the ingest slots are answered 503 with ``Retry-After``, nothing written,
and counted in ``/metrics``; the gate's CPU turns."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from hedgerow.api.ingest_gate import IngestGate, make_ingest_gate
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
        exported = (await client.get("/metrics")).text
        refused = {
            sample.labels["reason"]: sample.value
            for family in text_string_to_metric_families(exported)
            for sample in family.samples
            if sample.name == "hedgerow_ingest_refused_total"
        }
        assert refused == {"busy": statuses.count(503)}


def test_the_gate_has_cpu_turns_only_when_asked() -> None:
    assert make_ingest_gate("sqlite", 4, 1.0, 1) is None
    unbounded = make_ingest_gate("postgresql", 4, 1.0)
    assert unbounded is not None and unbounded.cpu is None  # 0: no bound
    gate = make_ingest_gate("postgresql", 4, 1.0, 2)
    assert gate is not None and gate.cpu is not None and gate.cpu.slots == 2
    with pytest.raises(ValueError, match="cpu_slots: must be >= 0, got -1"):
        IngestGate(4, 1.0, -1)
