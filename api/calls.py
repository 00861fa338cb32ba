"""``POST /v1/calls``: ingest a batch of call records (atomic, idempotent by ``request_id``).

- 202 ``{"accepted": n, "duplicates": k}``;
- 413 when the batch has more than ``max_batch_calls`` records (or its body is too large, or
  it may hold more JSON values than ``max_batch_calls`` x :data:`MAX_RECORD_VALUES`: counted on
  the bytes, before the body is parsed; see :func:`json_values_bound`);
- 422 ``{"detail": {"index": i, "field": "attempts[0].start_s", "message": "..."}}`` for the first
  bad record, and nothing of the batch is written (``index`` null for the body as a whole: not
  JSON, nested too deeply for the parser, not ``{"calls": [...]}``);
- 422 also for the first record that started more than ``retention_s`` before the server's
  clock (field ``started_at``), nothing written: the store would delete it at its next
  retention run, and on PostgreSQL it would need a partition for a day retention has dropped
  (see :mod:`hedgerow.controller.store.partitions`); with the schema's own rule (at most a day
  ahead) this bounds the days a batch can write to;
- 422 also for the first record whose new route would pass ``max_routes`` (field ``route``) or
  ``max_models_per_route`` (field ``model``), nothing written: the routes a store holds are
  bounded, and no client can create more (an operator raises the settings); records of routes
  that exist are never refused by these bounds;
- 422 also for the first record naming an archived route (field ``route``, the message says
  it is archived and how to restore it), nothing written: a client still sending it does not
  bring it back (:mod:`hedgerow.controller.routes_admin`).

The body is validated once, straight from its bytes, by pydantic's JSON parser
(:func:`batch_model` ``.model_validate_json``: fields, the rules across fields and the batch
size, which fails as soon as the list passes it); the validated records go to the store as they
are (:func:`hedgerow.controller.store.ingest.ingest_calls`). Route ids are kept between batches in the
app's :class:`~hedgerow.controller.store.ingest.RouteIdCache`, and on PostgreSQL the days that have
partitions in a :class:`~hedgerow.controller.store.partitions.DayPartitionCache`; a batch that meets a
cached day dropped meanwhile (:class:`~hedgerow.controller.store.partitions.DayPartitionMissing`,
nothing written) is run once more with the cache emptied.

On PostgreSQL each batch is written in a transaction of its own. On SQLite the batches go to the
app's group commit writer (:func:`make_ingest_writer`): the batches waiting together share one
transaction, each in its own savepoint, so a batch refused there (a route past a bound: its 422)
rolls back alone; every answer goes out after the group's commit.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from functools import lru_cache
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Depends, Request, status
from fastapi.responses import JSONResponse
from pydantic import Field, TypeAdapter, ValidationError, create_model
from pydantic_core import ErrorDetails
from sqlalchemy.ext.asyncio import AsyncSession

from hedgerow.api._state import AppState, app_state
from hedgerow.api.auth import require_scope
from hedgerow.api.deps import get_settings
from hedgerow.api.ingest_gate import ingest_session
from hedgerow.api.json_body import documented_body, error_response
from hedgerow.api.schemas import CallBatchIn, CallRecordIn, ErrorDetail, IngestOut
from hedgerow.controller.errors import RouteArchived, RouteLimitExceeded
from hedgerow.controller.events import log_rejected_batch
from hedgerow.controller.store.cpu_turns import CpuTurns, cpu_turn, pause
from hedgerow.controller.store.db import make_engine, make_sessionmaker
from hedgerow.controller.store.group_commit import GroupCommitWriter
from hedgerow.controller.store.ingest import ingest_calls
from hedgerow.controller.store.partitions import DayPartitionMissing

__all__ = [
    "MAX_RECORD_BYTES",
    "MAX_RECORD_VALUES",
    "StoredBatch",
    "batch_model",
    "field_path",
    "json_values_bound",
    "learn_batch",
    "make_ingest_writer",
    "parse_batch",
    "parse_batch_yielding",
    "router",
    "store_batch",
    "too_many_values",
]

router = APIRouter()

#: Body bytes allowed per record of the batch limit (a generous bound on one record's JSON).
MAX_RECORD_BYTES = 16_384
#: JSON values allowed per record of the batch limit, counted by :func:`json_values_bound` (a
#: record with one attempt has about 40, each further attempt about 13 more). The parser builds
#: every value of a body before the batch size can be checked (an empty object costs ~140
#: bytes): this bounds what a body of the byte limit may make it build.
MAX_RECORD_VALUES = 256
#: The answer for a body that is JSON but not ``{"calls": [...]}``.
_SHAPE_MESSAGE = 'body must be {"calls": [record, ...]}'


def field_path(loc: tuple[Any, ...]) -> str:
    """Render a pydantic error location ``("attempts", 0, "start_s")`` as ``attempts[0].start_s``."""
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else str(part)
    return text or "record"


def _unprocessable(index: int | None, field: str, message: str) -> JSONResponse:
    return JSONResponse(
        {"detail": ErrorDetail(index=index, field=field, message=message).model_dump()},
        status_code=status.HTTP_422_UNPROCESSABLE_CONTENT,
    )


def _too_large(message: str, field: str = "body") -> JSONResponse:
    return error_response(status.HTTP_413_CONTENT_TOO_LARGE, field, message)


@lru_cache(maxsize=8)
def batch_model(max_calls: int) -> type[CallBatchIn]:
    """:class:`CallBatchIn` with its list bounded by ``max_calls`` (one class per limit, built once).

    pydantic's list validator stops at the first record past the bound (``too_long``), so an
    oversized batch is refused without validating its records.

    Args:
        max_calls: most records of a batch, >= 1.
    """
    return create_model(
        "CallBatchIn",
        __base__=CallBatchIn,
        calls=(list[CallRecordIn], Field(max_length=max_calls)),
    )


def _error_answer(error: ErrorDetails, max_calls: int) -> JSONResponse:
    """The 413 or 422 for the first validation error of a batch (see the module docstring)."""
    loc = tuple(error["loc"])
    kind = error["type"]
    if loc == ("calls",) and kind == "too_long":
        actual = (error.get("ctx") or {}).get("actual_length")
        size = f"batch of {actual} calls" if actual is not None else "batch"
        return _too_large(f"{size} exceeds max_batch_calls={max_calls}", "calls")
    if kind == "json_invalid":
        message = error["msg"].removeprefix("Invalid JSON: ")
        if "recursion limit" in message:
            return _unprocessable(None, "body", "JSON nested too deeply")
        return _unprocessable(None, "body", f"not valid JSON: {message}")
    if len(loc) < 2 or loc[0] != "calls" or not isinstance(loc[1], int):
        if kind == "extra_forbidden" and len(loc) == 1:
            return _unprocessable(None, str(loc[0]), "unknown field")
        return _unprocessable(None, "calls", _SHAPE_MESSAGE)
    index, inner = loc[1], loc[2:]
    message = "unknown field" if kind == "extra_forbidden" else error["msg"].removeprefix("Value error, ")
    if not inner and kind == "value_error":
        # a rule across fields (check_consistency): its message starts with the field's path
        field, sep, rest = message.partition(": ")
        if sep:
            return _unprocessable(index, field, rest)
    return _unprocessable(index, field_path(inner), message)


def json_values_bound(body: bytes) -> int:
    """An upper bound on the number of JSON values (objects, arrays, scalars) in ``body``, from its bytes.

    Every value but the document itself is the first member of its array or object, or follows a
    comma; so there are at most (commas + ``[`` + ``{`` + 1) of them, whether the body is valid
    JSON or not (a parser stops at the first value it cannot take). Commas and brackets inside
    strings are counted too, which only raises the bound. Three passes of ``bytes.count``: a few
    milliseconds for 16 MB, nothing built.

    Args:
        body: the request body.

    Returns:
        The bound, >= 1.
    """
    return body.count(b",") + body.count(b"[") + body.count(b"{") + 1


def too_many_values(body: bytes, max_calls: int) -> JSONResponse | None:
    """The 413 for a body that may hold more JSON values than a batch of ``max_calls`` records,
    else None.

    The budget is ``max_calls`` x :data:`MAX_RECORD_VALUES` plus the 2 of ``{"calls": [...]}``.

    Args:
        body: the request body.
        max_calls: ``max_batch_calls``.
    """
    budget = max_calls * MAX_RECORD_VALUES + 2
    values = json_values_bound(body)
    if values <= budget:
        return None
    return _too_large(
        f"batch too large: up to {values} JSON values, more than max_batch_calls={max_calls} records of at most"
        f" {MAX_RECORD_VALUES} values each allow ({budget})",
        "calls",
    )


#: Records validated between two yields to the event loop (:func:`parse_batch_yielding`): about
#: 1-3 ms of validation, so a threshold poll waits at most that long behind a batch's parse.
VALIDATE_SLICE = 50
_RECORDS = TypeAdapter(list[CallRecordIn])


async def parse_batch_yielding(
    body: bytes, max_calls: int, turns: CpuTurns | None = None
) -> CallBatchIn | JSONResponse:
    """:func:`parse_batch`, yielding to the event loop every :data:`VALIDATE_SLICE` records.

    Validating a 1,000-record batch takes 20-50 ms of CPU in one call that holds the interpreter
    lock (a worker thread would not free the loop), so every request of the process waited that
    long behind each batch. The body is parsed by ``orjson``, then its records are validated a
    slice at a time with the same record model, the loop running other requests in between.
    Whatever is not a plain ``{"calls": [...]}`` within the batch limit (invalid JSON, another
    shape, too many records), and any batch with a record refused in a slice, goes to
    :func:`parse_batch`, so every refusal reads exactly as before; only a batch that is taken is
    validated in slices.

    With ``turns``, the whole parse is done within a CPU turn
    (:class:`~hedgerow.controller.store.cpu_turns.CpuTurns`): other batches' CPU-heavy steps wait
    meanwhile, so a pass of the loop runs fewer slices of ingest.

    Args:
        body: the request body (already bounded in size and in values).
        max_calls: ``max_batch_calls``.
        turns: the ingest gate's CPU turns, or None (no turn to take).

    Returns:
        The validated batch, or the 413/422 answer for its first error.
    """
    async with cpu_turn(turns):
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError:
            return parse_batch(body, max_calls)
        calls = data.get("calls") if type(data) is dict and len(data) == 1 else None
        if type(calls) is not list or len(calls) > max_calls:
            return parse_batch(body, max_calls)
        records: list[CallRecordIn] = []
        for start in range(0, len(calls), VALIDATE_SLICE):
            await pause()
            try:
                records.extend(_RECORDS.validate_python(calls[start : start + VALIDATE_SLICE]))
            except ValidationError:
                return parse_batch(body, max_calls)  # the refusal, worded as for a whole body
        return CallBatchIn.model_construct(calls=records)


def parse_batch(body: bytes, max_calls: int) -> CallBatchIn | JSONResponse:
    """Validate a ``POST /v1/calls`` body, straight from its bytes.

    Args:
        body: the request body (already bounded in size by the body limit middleware).
        max_calls: ``max_batch_calls``.

    Returns:
        The validated batch, or the 413/422 answer for its first error.
    """
    try:
        return batch_model(max_calls).model_validate_json(body)
    except ValidationError as exc:
        return _error_answer(exc.errors(include_url=False, include_input=False)[0], max_calls)


@router.post(
    "/v1/calls",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=IngestOut,
    dependencies=[Depends(require_scope("ingest"))],
    openapi_extra=documented_body(CallBatchIn, required=True),
    summary="Ingest a batch of call records",
)
async def post_calls(
    request: Request,
    session: Annotated[AsyncSession, Depends(ingest_session)],
    settings: Annotated[Any, Depends(get_settings)],
) -> Any:
    """Store a batch of call records; see the module docstring for the answers."""
    limit = settings.max_batch_calls
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit * MAX_RECORD_BYTES:
        return _too_large(f"body of {declared} bytes exceeds {limit * MAX_RECORD_BYTES} bytes")
    body = await request.body()
    if len(body) > limit * MAX_RECORD_BYTES:
        return _too_large(f"body of {len(body)} bytes exceeds {limit * MAX_RECORD_BYTES} bytes")
    crowded = too_many_values(body, limit)
    if crowded is not None:  # not counted in records_rejected: the records are not known
        return crowded
    gate = getattr(app_state(request.app), "ingest_gate", None)
    turns: CpuTurns | None = None if gate is None else gate.cpu
    parsed = await parse_batch_yielding(body, limit, turns)
    if isinstance(parsed, JSONResponse):
        _rejected(request, body, parsed)
        return parsed
    records = parsed.calls
    too_old = _first_too_old(records, settings.retention_s)
    if too_old is not None:
        answer = _unprocessable(
            too_old,
            "started_at",
            f"more than {settings.retention_s:.0f} s ({settings.retention_s / 86400:g} days, HEDGEROW_RETENTION_S)"
            " before the server's clock: "
            "older than the store keeps calls",
        )
        _rejected(request, body, answer)
        return answer
    state = app_state(request.app)
    try:
        writer: GroupCommitWriter[list[CallRecordIn], StoredBatch] | None = state.ingest_writer
        if writer is not None:  # SQLite: this process's batches go through its one writer
            batch = await writer.submit(records)
        else:
            batch = await _store_alone(state, session, records, turns)
    except (RouteLimitExceeded, RouteArchived) as exc:
        index = next(i for i, r in enumerate(records) if (r.route, r.model) == (exc.route, exc.model))
        return _unprocessable(index, exc.field, str(exc))
    if writer is None:
        learn_batch(state, batch)
    return IngestOut(accepted=batch.accepted, duplicates=batch.duplicates)


@dataclass(frozen=True, slots=True)
class StoredBatch:
    """What one batch's transaction wrote: counts, the records written, what the caches may learn.

    Attributes:
        accepted: records written.
        duplicates: records skipped (``request_id`` already stored or repeated in the batch).
        stored: the records written.
        resolved: ``{(route, model): route id}`` of every pair of the batch.
        checked_days: PostgreSQL: the days whose partitions were looked up (or made).
    """

    accepted: int
    duplicates: int
    stored: list[CallRecordIn]
    resolved: dict[tuple[str, str], int]
    checked_days: set[date]


async def store_batch(
    state: AppState, session: AsyncSession, records: list[CallRecordIn], turns: CpuTurns | None = None
) -> StoredBatch:
    """Write a validated batch inside the session's open transaction (the caller commits).

    Args:
        state: the app's ``state`` (settings, route defaults, the route id and partition caches).
        session: a session whose transaction is open.
        records: the validated records.
        turns: the ingest gate's CPU turns for the batch's CPU-heavy steps, or None.

    Raises:
        RouteLimitExceeded: a new route past a bound; roll back.
        RouteArchived: a record names an archived route; roll back.
        DayPartitionMissing: PostgreSQL: a cached day was dropped meanwhile; roll back, forget the
            cached days and run the batch again.
    """
    settings = state.settings
    stored: list[CallRecordIn] = []
    resolved: dict[tuple[str, str], int] = {}
    checked_days: set[date] = set()
    accepted, duplicates = await ingest_calls(
        session,
        records,
        defaults=state.route_defaults,
        max_routes=settings.max_routes,
        max_models_per_route=settings.max_models_per_route,
        stored=stored,
        route_ids=state.route_ids,
        resolved=resolved,
        partition_days=state.partition_days,
        checked_days=checked_days,
        turns=turns,
    )
    return StoredBatch(accepted, duplicates, stored, resolved, checked_days)


def learn_batch(state: AppState, batch: StoredBatch) -> None:
    """After a batch committed: the caches learn its routes and days, the metrics count it."""
    if len(batch.resolved) > len(state.route_ids):  # maybe new pairs
        state.route_ids.add(batch.resolved)
    if batch.checked_days:
        state.partition_days.add(batch.checked_days)
    metrics = state.metrics
    metrics.observe_records(batch.stored)
    metrics.records_accepted.inc(batch.accepted)
    metrics.records_duplicate.inc(batch.duplicates)


def make_ingest_writer(state: AppState) -> GroupCommitWriter[list[CallRecordIn], StoredBatch] | None:
    """On SQLite, the group commit writer of ``POST /v1/calls`` (not started); elsewhere None.

    SQLite has one writer: concurrent batches of one process written in transactions of their
    own take turns on its lock and each pay a commit. The writer runs the batches waiting
    together in one transaction, each in a savepoint of its own
    (:class:`~hedgerow.controller.store.group_commit.GroupCommitWriter`), on an engine of its own whose
    connection runs the statements of its transactions on the event loop's thread
    (:mod:`hedgerow.controller.store.sqlite_inline`; disposed when the writer closes). PostgreSQL
    writes batches concurrently, each in its own transaction.

    Args:
        state: the app's ``state``, with ``engine`` set.
    """
    if state.engine.dialect.name != "sqlite":
        return None
    engine = make_engine(state.settings.database_url, inline_in_transaction=True)

    async def work(session: AsyncSession, records: list[CallRecordIn]) -> StoredBatch:
        return await store_batch(state, session, records)

    return GroupCommitWriter(
        make_sessionmaker(engine),
        work,
        on_commit=lambda batch: learn_batch(state, batch),
        on_close=engine.dispose,
    )


async def _store_alone(
    state: AppState, session: AsyncSession, records: list[CallRecordIn], turns: CpuTurns | None
) -> StoredBatch:
    """Write a batch in a transaction of its own; run once more with the day cache emptied when
    a cached day was dropped meanwhile (PostgreSQL)."""
    try:
        async with session.begin():
            return await store_batch(state, session, records, turns)
    except DayPartitionMissing:
        state.partition_days.forget()  # a cached day was dropped: look every day up this time
    async with session.begin():
        return await store_batch(state, session, records, turns)


def _first_too_old(records: list[CallRecordIn], retention_s: float) -> int | None:
    """The index of the first record that started more than ``retention_s`` ago, else None."""
    oldest = datetime.now(UTC) - timedelta(seconds=retention_s)
    for index, record in enumerate(records):
        if record.started_at < oldest:
            return index
    return None


def _rejected(request: Request, body: bytes, answer: JSONResponse) -> None:
    """Count and log a refused batch of records (one line: the count and the first error).

    Only a batch whose records were refused counts (413 for its size, or a 422 naming a record);
    a body that is not a batch at all has no records to count. The count is read by parsing the
    body again with :func:`json.loads`: this is the refusal path, not the one to keep fast.
    """
    detail = json.loads(bytes(answer.body)).get("detail")
    if answer.status_code != status.HTTP_413_CONTENT_TOO_LARGE and not (
        isinstance(detail, dict) and detail.get("index") is not None
    ):
        return
    try:
        count = len(json.loads(body)["calls"])
    except (ValueError, TypeError, KeyError, RecursionError):  # pragma: no cover - pydantic parsed it already
        count = 0
    app_state(request.app).metrics.records_rejected.inc(count)
    log_rejected_batch(count, detail if isinstance(detail, dict) else {"message": str(detail)})
