"""The api's JSON error answers and the reading of a JSON request body, one copy for every router.

- :func:`error_response`: ``{"detail": {"field": ..., "message": ...}}`` (the body of
  :func:`hedgerow.api.limits.error_detail`) with a status; :func:`unprocessable` is its 422.
- :func:`read_json_body`: the body of a ``PUT``/``PATCH`` whose endpoint has its own limit below
  the middleware's (``PUT``/``PATCH /v1/routes/...``, ``PUT /v1/prices/...``): a declared or read
  size over the limit is 413 (:func:`hedgerow.api.limits.too_large_response`), a body that is not
  JSON 422 ``not valid JSON: ...`` and one nested past the parser's depth 422 ``JSON nested too
  deeply``, each with field ``body``. An empty body reads as ``{}``.
- :func:`documented_body`: the OpenAPI ``requestBody`` of an endpoint that reads its body itself
  (FastAPI documents only the bodies it parses).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from fastapi import Request, status
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from hedgerow.api.limits import error_detail, too_large_response

__all__ = ["BodyRefused", "documented_body", "error_response", "read_json_body", "unprocessable"]


def error_response(
    status_code: int, field: str, message: str, headers: Mapping[str, str] | None = None
) -> JSONResponse:
    """The api's error answer: ``{"detail": {"field": field, "message": message}}``.

    Args:
        status_code: the HTTP status (404, 405, 409, 413, 422, 503, ...).
        field: what was wrong (``body``, ``route``, ``since``, ...).
        message: the explanation, one sentence.
        headers: extra response headers (``Allow``, ``Retry-After``), or None.
    """
    return JSONResponse(error_detail(field, message), status_code=status_code, headers=headers)


def unprocessable(field: str, message: str) -> JSONResponse:
    """:func:`error_response` with 422: a value the request gave is wrong; ``field`` names it."""
    return error_response(status.HTTP_422_UNPROCESSABLE_CONTENT, field, message)


class BodyRefused(Exception):
    """The request's body cannot be read as JSON; :attr:`answer` is the 413 or 422 to send."""

    def __init__(self, answer: JSONResponse) -> None:
        super().__init__(bytes(answer.body).decode())
        self.answer = answer


async def read_json_body(request: Request, limit_bytes: int) -> Any:
    """The request's body parsed as JSON (an empty body is ``{}``), within ``limit_bytes``.

    Args:
        request: the request.
        limit_bytes: the endpoint's body limit, bytes.

    Returns:
        What ``json.loads`` gives (any JSON value; the caller checks its shape).

    Raises:
        BodyRefused: 413 when the declared ``Content-Length`` or the body read is over
            ``limit_bytes`` (the declared size is checked before a byte is read); 422 field
            ``body`` when the bytes are not JSON or are nested too deeply to parse.
    """
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit_bytes:
        raise BodyRefused(too_large_response(limit_bytes, int(declared)))
    raw = await request.body()
    if len(raw) > limit_bytes:
        raise BodyRefused(too_large_response(limit_bytes, len(raw)))
    try:
        return json.loads(raw or b"{}")
    except ValueError as exc:  # UnicodeDecodeError and json.JSONDecodeError alike
        raise BodyRefused(unprocessable("body", f"not valid JSON: {exc}")) from None
    except RecursionError:
        raise BodyRefused(unprocessable("body", "JSON nested too deeply")) from None


def documented_body(model: type[BaseModel], *, required: bool) -> dict[str, Any]:
    """The ``openapi_extra`` of an endpoint that reads its JSON body itself: the body is ``model``.

    Args:
        model: the pydantic model whose JSON schema describes the body (it joins the document's
            ``components.schemas``, see :mod:`hedgerow.api.openapi`).
        required: whether the endpoint needs a body (a ``PUT`` of a route takes none).
    """
    schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
    return {"requestBody": {"required": required, "content": {"application/json": {"schema": schema}}}}
