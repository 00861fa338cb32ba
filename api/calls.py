"""``POST /v1/calls``: ingest a batch of call records (atomic, idempotent by ``request_id``).

- 202 ``{"accepted": n, "duplicates": k}``;
- 413 when the batch has more than ``max_batch_calls`` records (or its body is too large);
- 422 ``{"detail": {"index": i, "field": "attempts[0].start_s", "message": "..."}}`` for the first
  bad record, and nothing of the batch is written (``index`` null for the body as a whole: not
  JSON, nested too deeply for the parser, not ``{"calls": [...]}``).
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request, status
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from sqlalchemy.ext.asyncio import AsyncSession

from hedgerow.api.auth import require_scope
from hedgerow.api.deps import get_session, get_settings
from hedgerow.api.schemas import CallBatchIn, CallRecordIn, ErrorDetail, IngestOut
from hedgerow.client.records import CallRecord
from hedgerow.controller.events import log_rejected_batch
from hedgerow.controller.ingest import ingest_calls

__all__ = ["MAX_RECORD_BYTES", "field_path", "parse_record", "router"]

router = APIRouter()

#: Body bytes allowed per record of the batch limit (a generous bound on one record's JSON).
MAX_RECORD_BYTES = 16_384


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


def _too_large(message: str) -> JSONResponse:
    return JSONResponse({"detail": message}, status_code=status.HTTP_413_CONTENT_TOO_LARGE)


def parse_record(index: int, raw: Any) -> CallRecord | JSONResponse:
    """Validate one raw record with :class:`CallRecordIn`, then build the :class:`CallRecord`.

    ``CallRecord.from_dict`` adds the checks across fields that a per-field schema cannot make
    (``first_token_s`` between ``start_s`` and ``end_s``, a ``winner`` with a won attempt, ...).
    """
    try:
        CallRecordIn.model_validate(raw)
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        message = "unknown field" if error["type"] == "extra_forbidden" else error["msg"].removeprefix("Value error, ")
        return _unprocessable(index, field_path(tuple(error["loc"])), message)
    try:
        return CallRecord.from_dict(raw)
    except ValueError as exc:
        field, _, message = str(exc).partition(": ")
        return _unprocessable(index, field, message or str(exc))


@router.post(
    "/v1/calls",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=IngestOut,
    dependencies=[Depends(require_scope("ingest"))],
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {
                    "schema": CallBatchIn.model_json_schema(ref_template="#/components/schemas/{model}")
                }
            },
        }
    },
    summary="Ingest a batch of call records",
)
async def post_calls(
    request: Request,
    session: Annotated[AsyncSession, Depends(get_session)],
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
    try:
        payload = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        return _unprocessable(None, "body", f"not valid JSON: {exc}")
    except RecursionError:
        return _unprocessable(None, "body", "JSON nested too deeply")
    if not isinstance(payload, dict) or not isinstance(payload.get("calls"), list):
        return _unprocessable(None, "calls", 'body must be {"calls": [record, ...]}')
    extra = sorted(set(payload) - {"calls"})
    if extra:
        return _unprocessable(None, extra[0], "unknown field")
    raw_calls = payload["calls"]
    if len(raw_calls) > limit:
        answer = _too_large(f"batch of {len(raw_calls)} calls exceeds max_batch_calls={limit}")
        _rejected(request, len(raw_calls), answer)
        return answer
    records: list[CallRecord] = []
    for index, raw in enumerate(raw_calls):
        parsed = parse_record(index, raw)
        if isinstance(parsed, JSONResponse):
            _rejected(request, len(raw_calls), parsed)
            return parsed
        records.append(parsed)
    stored: list[CallRecord] = []
    async with session.begin():
        accepted, duplicates = await ingest_calls(
            session, records, defaults=request.app.state.route_defaults, stored=stored
        )
    metrics = request.app.state.metrics
    metrics.observe_records(stored)
    metrics.records_accepted.inc(accepted)
    metrics.records_duplicate.inc(duplicates)
    return IngestOut(accepted=accepted, duplicates=duplicates)


def _rejected(request: Request, count: int, answer: JSONResponse) -> None:
    """Count and log a refused batch of ``count`` records (one line: the count and the first error)."""
    request.app.state.metrics.records_rejected.inc(count)
    detail = json.loads(bytes(answer.body)).get("detail")
    log_rejected_batch(count, detail if isinstance(detail, dict) else {"message": str(detail)})
