"""Ingest of call records: a batch of :class:`CallRecord` becomes rows of ``calls`` and ``attempts``.

Idempotent by ``request_id``: a record whose id is already stored (or appears earlier in the same
batch) is counted as a duplicate and not written. Correct under concurrent batches on both SQLite
and PostgreSQL: every insert is ``INSERT ... ON CONFLICT DO NOTHING`` (the dialect's own insert),
so two batches racing on the same id or on a new route never fail and never double count. Rows are
written in a sorted order (routes by (route, model), calls by request_id) so that concurrent
PostgreSQL transactions wait on each other instead of deadlocking.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import select, tuple_
from sqlalchemy.ext.asyncio import AsyncSession

from hedgerow.client.records import CallRecord, with_prompt_estimates
from hedgerow.controller.db import dialect_insert
from hedgerow.controller.models import Attempt, Call, Route, utc_now
from hedgerow.controller.policy import RouteConfig

__all__ = ["ensure_routes", "ingest_calls", "route_defaults"]

#: Rows per INSERT statement (keeps SQLite under its bound-parameter limit).
_CHUNK_ROWS = 200


def route_defaults(settings: Any) -> RouteConfig:
    """The configuration a route gets when it is first seen, from ``hedgerow.settings.Settings``.

    Raises:
        ValueError: when a default is out of range (named in the message).
    """
    return RouteConfig(
        enabled=True,
        budget=settings.default_budget,
        default_hedge_after_s=settings.default_hedge_after_s,
        min_hedge_after_s=settings.min_hedge_after_s,
        max_hedge_after_s=settings.max_hedge_after_s,
        pinned_hedge_after_s=None,
    )


async def ensure_routes(
    session: AsyncSession, pairs: Sequence[tuple[str, str]], defaults: RouteConfig
) -> dict[tuple[str, str], int]:
    """Create the missing (route, model) rows with ``defaults``; return every pair's route id.

    Args:
        session: an open session; the caller commits.
        pairs: (route, model) pairs, in any order, repeats allowed.
        defaults: configuration of a newly created route.
    """
    wanted = sorted(set(pairs))
    if not wanted:
        return {}
    now = utc_now()
    rows = [
        {
            "route": route,
            "model": model,
            "enabled": defaults.enabled,
            "budget": defaults.budget,
            "default_hedge_after_s": defaults.default_hedge_after_s,
            "min_hedge_after_s": defaults.min_hedge_after_s,
            "max_hedge_after_s": defaults.max_hedge_after_s,
            "pinned_hedge_after_s": defaults.pinned_hedge_after_s,
            "created_at": now,
            "updated_at": now,
        }
        for route, model in wanted
    ]
    for start in range(0, len(rows), _CHUNK_ROWS):
        stmt = dialect_insert(session, Route).on_conflict_do_nothing(index_elements=["route", "model"])
        await session.execute(stmt, rows[start : start + _CHUNK_ROWS])
    ids: dict[tuple[str, str], int] = {}
    for start in range(0, len(wanted), _CHUNK_ROWS):
        chunk = wanted[start : start + _CHUNK_ROWS]
        result = await session.execute(
            select(Route.route, Route.model, Route.id).where(tuple_(Route.route, Route.model).in_(chunk))
        )
        ids.update({(r, m): i for r, m, i in result.all()})
    return ids


def _call_row(record: CallRecord, route_id: int, received_at: Any) -> dict[str, Any]:
    return {
        "request_id": record.request_id,
        "route_id": route_id,
        "started_at": record.started_at,
        "received_at": received_at,
        "client": record.client,
        "hedge_after_s": record.hedge_after_s,
        "threshold_version": record.threshold_version,
        "hedged": record.hedged,
        "hedge_reason": record.hedge_reason,
        "hedge_denied": record.hedge_denied,
        "winner": record.winner,
        "status": record.status,
        "error_type": record.error_type,
        "ttft_s": record.ttft_s,
        "ttfo_s": record.ttfo_s,
        "tpot_s": record.tpot_s,
        "e2e_s": record.e2e_s,
        "max_itl_s": record.max_itl_s,
        "prompt_tokens": record.prompt_tokens,
        "completion_tokens": record.completion_tokens,
        "wasted_completion_tokens": record.wasted_completion_tokens,
    }


async def ingest_calls(
    session: AsyncSession,
    records: list[CallRecord],
    *,
    defaults: RouteConfig,
    stored: list[CallRecord] | None = None,
) -> tuple[int, int]:
    """Write a batch of call records (and their attempts) into the store.

    Everything happens inside the session's transaction; the caller commits (or rolls back), so
    the batch is stored entirely or not at all. Routes seen for the first time are created with
    ``defaults``.

    Args:
        session: an open :class:`AsyncSession`.
        records: the batch, any length (0 is fine).
        defaults: configuration of routes created by this batch (see :func:`route_defaults`).
        stored: when given, the records written (not the duplicates) are appended to it (e.g. for
            the api's metrics, which count each record once).

    Returns:
        ``(accepted, duplicates)``: records written, and records skipped because their
        ``request_id`` was already stored or repeated earlier in the batch.
    """
    unique: dict[str, CallRecord] = {}
    for record in records:
        unique.setdefault(record.request_id, record)
    duplicates = len(records) - len(unique)
    if not unique:
        return 0, duplicates
    # version 1 records carry no per-attempt prompt tokens: the one estimate rule fills them
    batch = [with_prompt_estimates(unique[key]) for key in sorted(unique)]
    route_ids = await ensure_routes(session, [(r.route, r.model) for r in batch], defaults)
    received_at = utc_now()
    call_ids: dict[str, int] = {}
    for start in range(0, len(batch), _CHUNK_ROWS):
        chunk = batch[start : start + _CHUNK_ROWS]
        stmt = (
            dialect_insert(session, Call)
            .values([_call_row(r, route_ids[(r.route, r.model)], received_at) for r in chunk])
            .on_conflict_do_nothing(index_elements=["request_id"])
            .returning(Call.request_id, Call.id)
        )
        result = await session.execute(stmt)
        call_ids.update({request_id: call_id for request_id, call_id in result.all()})
    attempt_rows = [
        {
            "call_id": call_ids[record.request_id],
            "attempt_index": index,
            "upstream": attempt.upstream,
            "role": attempt.role,
            "start_s": attempt.start_s,
            "first_token_s": attempt.first_token_s,
            "end_s": attempt.end_s,
            "outcome": attempt.outcome,
            "status_code": attempt.status_code,
            "error_type": attempt.error_type,
            "completion_tokens": attempt.completion_tokens,
            "prompt_tokens": attempt.prompt_tokens,
            "prompt_tokens_estimated": attempt.prompt_tokens_estimated,
            "cached_prompt_tokens": attempt.cached_prompt_tokens,
        }
        for record in batch
        if record.request_id in call_ids
        for index, attempt in enumerate(record.attempts)
    ]
    for start in range(0, len(attempt_rows), _CHUNK_ROWS):
        await session.execute(dialect_insert(session, Attempt), attempt_rows[start : start + _CHUNK_ROWS])
    accepted = len(call_ids)
    if stored is not None:
        stored.extend(record for record in batch if record.request_id in call_ids)
    return accepted, duplicates + (len(batch) - accepted)
