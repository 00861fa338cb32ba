"""Call records of every outcome, for the calls explorer's tests (store, api, CLI, console).

:func:`explorer_records` makes one call a minute back from ``end``, cycling through the five
outcomes: ``primary_won`` (upstream ``a``), ``hedge_won`` (backup ``b`` beats a slow primary on
``a``), ``failover`` (``a`` answers 503, backup ``c`` wins), ``failed`` (``a`` times out) and
``cancelled``. Every record passes :func:`hedgerow.client.records.check_consistency`.
:func:`with_clients` gives records the clients (apps, gateway keys) of a cycle.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import datetime, timedelta

from hedgerow.client.records import AttemptRecord, CallRecord, check_consistency

__all__ = ["OUTCOME_CYCLE", "WINNER_OF", "explorer_records", "record_of", "with_clients"]

#: The outcomes in the order :func:`explorer_records` makes them (newest first).
OUTCOME_CYCLE: tuple[str, ...] = ("primary_won", "hedge_won", "failover", "failed", "cancelled")
#: The upstream whose attempt wins in each outcome (None: no attempt wins).
WINNER_OF: dict[str, str | None] = {
    "primary_won": "a",
    "hedge_won": "b",
    "failover": "c",
    "failed": None,
    "cancelled": None,
}


def record_of(
    outcome: str, request_id: str, started_at: datetime, *, route: str = "r", model: str = "m1"
) -> CallRecord:
    """One consistent record of ``outcome`` (a key of ``CALL_OUTCOMES``)."""
    common = {"client": "seed", "prompt_tokens": 100}
    if outcome == "primary_won":
        attempts: tuple[AttemptRecord, ...] = (AttemptRecord("a", "primary", 0.0, 0.4, 1.4, "won", 200, None, 20),)
        fields = {"winner": "primary", "ttft_s": 0.4, "e2e_s": 1.4, "completion_tokens": 20}
    elif outcome == "hedge_won":
        attempts = (
            AttemptRecord("a", "primary", 0.0, None, 1.3, "cancelled", 200, None, 0),
            AttemptRecord("b", "backup", 1.0, 1.3, 2.3, "won", 200, None, 20),
        )
        fields = {
            "winner": "backup", "hedged": True, "hedge_reason": "ttft_timeout", "hedge_after_s": 1.0,
            "ttft_s": 1.3, "e2e_s": 2.3, "completion_tokens": 20,
        }  # fmt: skip
    elif outcome == "failover":
        attempts = (
            AttemptRecord("a", "primary", 0.0, None, 0.05, "failed", 503, "http_503", 0),
            AttemptRecord("c", "backup", 0.05, 0.6, 1.6, "won", 200, None, 20),
        )
        fields = {
            "winner": "backup", "hedged": True, "hedge_reason": "primary_error",
            "ttft_s": 0.6, "e2e_s": 1.6, "completion_tokens": 20,
        }  # fmt: skip
    elif outcome == "failed":
        attempts = (AttemptRecord("a", "primary", 0.0, None, 30.0, "failed", None, "ReadTimeout", 0),)
        fields = {"status": "timeout", "error_type": "ReadTimeout"}
    elif outcome == "cancelled":
        attempts = (AttemptRecord("a", "primary", 0.0, None, 0.2, "cancelled", 200, None, 0),)
        fields = {"status": "cancelled"}
    else:
        raise ValueError(f"unknown outcome {outcome!r}")
    record = CallRecord(request_id, route, model, started_at, attempts=attempts, **common, **fields)  # type: ignore[arg-type]
    check_consistency(record)
    return record


def explorer_records(end: datetime, count: int, *, route: str = "r", model: str = "m1") -> list[CallRecord]:
    """``count`` records one minute apart ending at ``end`` (newest first), outcomes cycling
    through :data:`OUTCOME_CYCLE`; request ids ``c0000`` (newest) upwards."""
    return [
        record_of(
            OUTCOME_CYCLE[i % len(OUTCOME_CYCLE)], f"c{i:04d}", end - timedelta(minutes=i), route=route, model=model
        )
        for i in range(count)
    ]


def with_clients(records: Sequence[CallRecord], clients: Sequence[str | None]) -> list[CallRecord]:
    """``records`` with their ``client`` cycling through ``clients`` (the first record gets
    ``clients[0]``; None: a record without a client)."""
    return [dataclasses.replace(r, client=clients[i % len(clients)]) for i, r in enumerate(records)]
