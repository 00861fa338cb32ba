"""Cost accounting per attempt: prompt tokens from the attempt's own usage, else estimated; record versions."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from hedgerow.client import HedgePolicy, HedgingClient, Upstream
from hedgerow.client.chunks import cached_prompt_tokens
from hedgerow.client.records import RECORD_VERSION, AttemptRecord, CallRecord, estimate_prompt_tokens
from tests.client.scripted_server import ScriptedServer
from tests.helpers import BODY, Sink, answer


async def test_a_hedged_call_records_what_each_attempt_cost() -> None:
    slow, fast = answer(first_delay_s=5.0, prompt_tokens=40), answer(first_delay_s=0.3, prompt_tokens=40)
    async with ScriptedServer(slow) as a, ScriptedServer(fast) as b:
        sink = Sink()
        async with HedgingClient(
            [Upstream("a", a.base_url), Upstream("b", b.base_url)],
            policy=HedgePolicy(hedge_after_s=0.5),
            telemetry=sink,
        ) as client:
            record = (await client.chat(BODY)).record
    primary, backup = record.attempts
    assert record.winner == "backup" and record.record_version == RECORD_VERSION == 2
    # the winner reported its own usage; the cancelled primary had its headers (200): estimated
    assert (backup.prompt_tokens, backup.prompt_tokens_estimated) == (40, False)
    assert (primary.prompt_tokens, primary.prompt_tokens_estimated, primary.status_code) == (40, True, 200)
    wire = record.to_dict()
    assert wire["record_version"] == 2 and wire["attempts"][0]["prompt_tokens_estimated"] is True
    assert CallRecord.from_dict(wire) == record


def test_the_estimate_rule() -> None:
    assert estimate_prompt_tokens(12, False, 200, 99) == (12, False)  # its own usage wins
    assert estimate_prompt_tokens(None, False, 200, 99) == (99, True)  # accepted: the prompt was prefilled
    assert estimate_prompt_tokens(None, False, 503, 99) == (0, False)  # refused: not billed
    assert estimate_prompt_tokens(None, False, None, 99) == (0, False)  # no response at all
    assert estimate_prompt_tokens(None, False, 200, None) == (0, False)  # nothing to estimate from


def test_cached_prompt_tokens_from_usage_shapes() -> None:
    assert cached_prompt_tokens({"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": 4}}) == 4
    assert cached_prompt_tokens({"prompt_cache_hit_tokens": 3}) == 3  # DeepSeek
    assert cached_prompt_tokens({"prompt_tokens": 10}) is None
    assert cached_prompt_tokens({"prompt_tokens_details": {"cached_tokens": -1}}) is None


def v1_dict() -> dict[str, Any]:
    """A hedged call in the version 1 wire format (no record_version, no attempt prompt fields)."""
    record = CallRecord(
        "r1", "route", "m", datetime(2026, 11, 23, 8, tzinfo=UTC), hedged=True, hedge_reason="ttft_timeout",
        winner="backup", ttft_s=1.2, prompt_tokens=50, completion_tokens=9,
        attempts=(AttemptRecord("a", "primary", 0.0, None, 1.2, "cancelled", 200, None, 0),
                  AttemptRecord("b", "backup", 1.0, 1.2, 2.0, "won", 200, None, 9)),
    )  # fmt: skip
    wire = record.to_dict()
    del wire["record_version"]
    for attempt in wire["attempts"]:
        for name in ("prompt_tokens", "prompt_tokens_estimated", "cached_prompt_tokens"):
            del attempt[name]
    return wire


def test_a_version_1_record_is_still_accepted_and_other_versions_are_not() -> None:
    record = CallRecord.from_dict(v1_dict())
    assert record.record_version == 1 and record.attempts[0].prompt_tokens is None
    with pytest.raises(ValueError, match="record_version"):
        CallRecord.from_dict({**v1_dict(), "record_version": 3})
    bad = v1_dict()
    bad["attempts"][1].update(prompt_tokens=5, cached_prompt_tokens=6)
    with pytest.raises(ValueError, match=r"attempts\[1\].cached_prompt_tokens"):
        CallRecord.from_dict(bad)
