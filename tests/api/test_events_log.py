"""One structured log line per applied change, flag, lease change and rejected batch; text and JSON."""

from __future__ import annotations

import json
import logging
import random
from datetime import UTC, datetime, timedelta

import pytest

from hedgerow.controller.events import EVENT_LOGGER, log_flag_changes, log_report_delivery
from hedgerow.logs import JsonFormatter, TextFormatter, configure_logging, uvicorn_log_config
from tests.api.conftest import MakeApi
from tests.conftest import CallFactory

M = {"model": "m1"}


def _events(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == EVENT_LOGGER]


async def test_changes_leases_and_rejected_batches_are_logged(
    make_api: MakeApi, call_factory: CallFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=EVENT_LOGGER)
    rng = random.Random(2)
    now = datetime.now(UTC)
    calls = [
        call_factory(f"c{i}", route="r", started_at=now - timedelta(seconds=rng.uniform(1, 600))).to_dict()
        for i in range(80)
    ]
    async with make_api() as (_app, api):
        await api.post("/v1/calls", json={"calls": calls})
        await api.post("/v1/controller/run")
        await api.patch("/v1/routes/r", params=M, json={"pinned_hedge_after_s": 3.0, "actor": "alice"})
        await api.post("/v1/calls", json={"calls": [calls[0], {"request_id": 7}]})
    events = _events(caplog)
    kinds = [vars(r)["event"] for r in events]
    assert kinds.count("lease_acquired") == 1 and kinds.count("lease_released") == 1  # at shutdown
    assert "lease_lost" not in kinds
    changes = [vars(r)["fields"] for r in events if vars(r)["event"] == "threshold_changed"]
    assert changes[0]["from_s"] is None and changes[0]["actor"] == "controller"  # the first publish
    assert changes[1] | {"reason": None} == {
        "route": "r", "model": "m1", "from_s": changes[0]["to_s"], "to_s": 3.0, "reason": None,
        "source": "pinned", "actor": "alice",
    }  # fmt: skip
    [rejected] = [vars(r)["fields"] for r in events if vars(r)["event"] == "ingest_rejected"]
    assert rejected["records"] == 2 and rejected["index"] == 1 and rejected["field"] == "request_id"


def test_flags_raised_and_cleared_and_report_deliveries(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=EVENT_LOGGER)
    log_flag_changes("r", "m", [], ["backups_rarely_win"])
    log_flag_changes("r", "m", ["backups_rarely_win"], ["backups_rarely_win"])  # unchanged: no line
    log_flag_changes("r", "m", ["backups_rarely_win"], [])
    log_report_delivery("2026-W48", "/tmp/report.html", ok=True)
    assert [(vars(r)["event"], r.levelname) for r in _events(caplog)] == [
        ("flag_raised", "WARNING"),
        ("flag_cleared", "INFO"),
        ("report_delivered", "INFO"),
    ]


def test_text_and_json_formats() -> None:
    record = logging.LogRecord(EVENT_LOGGER, logging.INFO, __file__, 1, "flag_raised route=r flag=x", None, None)
    record.event, record.fields = "flag_raised", {"route": "r", "flag": "x", "to_s": 1.5}
    assert TextFormatter().format(record).endswith(" INFO hedgerow.events flag_raised route=r flag=x to_s=1.5")
    data = json.loads(JsonFormatter().format(record))
    assert data["event"] == "flag_raised" and data["route"] == "r" and data["to_s"] == 1.5 and data["ts"].endswith("Z")
    with pytest.raises(ValueError, match="log format"):
        configure_logging("info", "xml")
    with pytest.raises(ValueError, match="log level"):
        configure_logging("loud", "text")
    assert uvicorn_log_config(access_log=True)["loggers"]["uvicorn.access"]["handlers"] == ["stderr"]
    assert uvicorn_log_config(access_log=False)["loggers"]["uvicorn.access"]["handlers"] == []


def test_api_floats_carry_no_binary_noise() -> None:
    from hedgerow.api.json_response import ApiJSONResponse, clean_floats

    assert clean_floats({"a": [0.30147399999999996, None, 2], "b": 0.1 + 0.2}) == {"a": [0.301474, None, 2], "b": 0.3}
    assert clean_floats(1.8051614906573685) == 1.80516149065737 and clean_floats(1e-9) == 1e-9
    assert ApiJSONResponse({"rate": 0.1 + 0.2}).body == b'{"rate":0.3}'


async def test_answers_of_the_api_are_clean(make_api: MakeApi) -> None:
    async with make_api() as (_app, api):
        response = await api.put("/v1/routes/r", params=M, json={"budget": 0.1 + 0.2})
        assert b'"budget":0.3' in response.content  # not 0.30000000000000004
        assert b"0.30000000000000004" not in (await api.get("/v1/routes")).content
