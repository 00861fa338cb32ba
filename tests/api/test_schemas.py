"""The api's call record schema accepts exactly the wire format of ``hedgerow.client.records``."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import ValidationError

from hedgerow.api.calls import field_path
from hedgerow.api.schemas import CallRecordIn
from hedgerow.client.records import CallRecord
from tests.conftest import CallFactory


def test_round_trip_through_schema(call_factory: CallFactory) -> None:
    started = datetime(2026, 11, 29, 8, 0, 0, 123456, tzinfo=UTC)
    for record in (
        call_factory("a", started_at=started),
        call_factory("b", started_at=started, hedge_after_s=1.0, primary_ttft_s=3.0, backup_ttft_s=0.2),
        call_factory("c", started_at=started, primary_ttft_s=None),
        CallRecord("d", "r", "m", started),
        CallRecord("e", "r", "m", started, api="responses"),
    ):
        wire = record.to_dict()
        dumped = CallRecordIn.model_validate(wire).model_dump(mode="json")
        # a chat record leaves ``api`` out of the wire format; the schema fills in its default
        assert dumped == {"api": "chat", **wire}
        assert CallRecord.from_dict(dumped) == record


def _good() -> dict[str, Any]:
    return {
        "request_id": "x",
        "route": "r",
        "model": "m",
        "started_at": "2026-11-29T08:00:00Z",
        "attempts": [
            {"upstream": "a", "role": "primary", "start_s": 0.0, "first_token_s": 0.5, "end_s": 1.0, "outcome": "won"}
        ],
    }


@pytest.mark.parametrize(
    "change, field",
    [
        ({"started_at": "2026-11-29T08:00:00"}, "started_at"),  # no timezone
        ({"started_at": 1764403200}, "started_at"),
        ({"route": ""}, "route"),
        ({"hedged": 1}, "hedged"),
        ({"hedge_after_s": -1.0}, "hedge_after_s"),
        ({"hedge_after_s": True}, "hedge_after_s"),
        ({"ttft_s": "1.0"}, "ttft_s"),
        ({"prompt_tokens": 1.5}, "prompt_tokens"),
        ({"status": "weird"}, "status"),
        ({"hedge_reason": "slow"}, "hedge_reason"),
        ({"surprise": 1}, "surprise"),
        ({"attempts": None}, "attempts"),
        (
            {"attempts": [{"upstream": "a", "role": "primary", "start_s": "0", "end_s": 1.0, "outcome": "won"}]},
            "attempts[0].start_s",
        ),
        (
            {
                "attempts": [
                    {"upstream": "a", "role": "primary", "start_s": 0.0, "end_s": 1.0, "outcome": "won", "extra": 1}
                ]
            },
            "attempts[0].extra",
        ),
        # control characters (PostgreSQL cannot store NUL; none belongs in a name)
        ({"route": "a\u0000b"}, "route"),
        ({"model": "m\n"}, "model"),
        ({"request_id": "\u0000"}, "request_id"),
        ({"client": "c\tx"}, "client"),
        ({"error_type": "e\u007f"}, "error_type"),
        (
            {"attempts": [{"upstream": "a\u0000", "role": "primary", "start_s": 0.0, "end_s": 1.0, "outcome": "won"}]},
            "attempts[0].upstream",
        ),
        (
            {
                "attempts": [
                    {
                        "upstream": "a",
                        "role": "primary",
                        "start_s": 0.0,
                        "end_s": 1.0,
                        "outcome": "failed",
                        "error_type": "x\u001b",
                    }
                ]
            },
            "attempts[0].error_type",
        ),
    ],
)
def test_schema_and_from_dict_refuse_the_same_input(change: dict[str, Any], field: str) -> None:
    raw = {**_good(), **change}
    with pytest.raises(ValidationError) as schema_error:
        CallRecordIn.model_validate(raw)
    assert field_path(tuple(schema_error.value.errors()[0]["loc"])) == field
    with pytest.raises(ValueError) as record_error:
        CallRecord.from_dict(raw)
    assert str(record_error.value).startswith(field)


def test_nulls_that_mean_defaults_are_accepted_by_both() -> None:
    raw = {**_good(), "status": None, "wasted_completion_tokens": None}
    raw["attempts"][0]["completion_tokens"] = None
    assert CallRecordIn.model_validate(raw).model_dump(mode="json")["status"] == "ok"
    assert CallRecord.from_dict(raw).wasted_completion_tokens == 0
