"""The CallRecord wire format: round trip and field-naming errors."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from hedgerow.client import AttemptRecord, CallRecord


def sample() -> CallRecord:
    return CallRecord(
        request_id="r1",
        route="summarize",
        model="llama2-70b",
        started_at=datetime(2026, 11, 29, 8, 0, 0, 123456, tzinfo=UTC),
        client="t",
        hedge_after_s=1.0,
        threshold_version=7,
        hedged=True,
        hedge_reason="ttft_timeout",
        winner="backup",
        ttft_s=1.21,
        ttfo_s=1.21,
        tpot_s=0.021,
        e2e_s=4.3,
        max_itl_s=0.2,
        prompt_tokens=120,
        completion_tokens=150,
        attempts=(
            AttemptRecord("a", "primary", 0.0, None, 1.21, "cancelled", 200),
            AttemptRecord("b", "backup", 1.0, 1.21, 4.3, "won", 200, None, 150),
        ),
    )


def test_round_trip_and_wire_shape() -> None:
    record = sample()
    wire = record.to_dict()
    assert wire["started_at"] == "2026-11-29T08:00:00.123456Z"
    assert wire["attempts"][0]["first_token_s"] is None
    assert CallRecord.from_dict(wire) == record
    assert record.attempts[0].censored and record.attempts[1].ttft_s == pytest.approx(0.21)


@pytest.mark.parametrize(
    "patch, field",
    [
        ({"ttft_s": -1}, "ttft_s"),
        ({"status": "weird"}, "status"),
        ({"started_at": "2026-11-29T08:00:00"}, "started_at"),
        ({"hedged": "yes"}, "hedged"),
        ({"extra": 1}, "extra"),
    ],
)
def test_bad_fields_are_named(patch: dict[str, object], field: str) -> None:
    wire = sample().to_dict()
    wire.update(patch)
    with pytest.raises(ValueError, match=field):
        CallRecord.from_dict(wire)


def test_bad_attempt_field_is_named_with_its_index() -> None:
    wire = sample().to_dict()
    wire["attempts"][1]["start_s"] = float("nan")
    with pytest.raises(ValueError, match=r"attempts\[1\]\.start_s"):
        CallRecord.from_dict(wire)


@pytest.mark.parametrize("bad", ["a\u0000b", "\u0000", "line\nbreak", "tab\t", "esc\u001b[0m", "del\u007f"])
@pytest.mark.parametrize(
    "field", ["request_id", "route", "model", "client", "error_type", "attempts[0].upstream", "attempts[1].error_type"]
)
def test_from_dict_refuses_control_characters_naming_the_field(field: str, bad: str) -> None:
    wire = sample().to_dict()
    if field.startswith("attempts["):
        index, name = int(field[9]), field.split(".", 1)[1]
        wire["attempts"][index][name] = bad
    else:
        wire[field] = bad
    with pytest.raises(ValueError, match="control characters") as caught:
        CallRecord.from_dict(wire)
    assert str(caught.value).startswith(f"{field}: ")


def test_from_dict_accepts_printable_unicode() -> None:
    wire = sample().to_dict() | {"route": "équipe/résumé ✓", "model": "模型-70b", "client": "host 1"}
    assert CallRecord.from_dict(wire).route == "équipe/résumé ✓"


def test_control_character_error_names_the_character_and_index() -> None:
    from hedgerow.client.records import control_character_error

    assert control_character_error("plain text é") is None
    assert control_character_error("ab\u0000") == (
        "must not contain control characters (U+0000-U+001F, U+007F): U+0000 at index 2"
    )
