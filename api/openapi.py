"""The OpenAPI document of the api, completed where FastAPI's generated one falls short.

:func:`build_openapi` starts from FastAPI's document and makes it describe what the server does:

- every schema a request body refers to is in ``components.schemas`` (the bodies of
  ``POST /v1/calls`` and ``PUT``/``PATCH /v1/routes/...`` are validated from the raw bytes, so
  FastAPI never registers their models; their ``$defs`` are lifted into the components);
- 422 answers carry our error shapes (:data:`ERROR_SCHEMAS`), not FastAPI's default
  ``HTTPValidationError`` (which the server never sends);
- 401 and 403 on each operation protected by the bearer scheme (declared by
  :data:`hedgerow.api.auth.BEARER_SCHEME`);
- 413 (body over its limit) and 408 (body too slow) on operations with a body, and 503 on every
  operation but the health checks: the store is unavailable (``store_errors``), or the server
  shuts down before a body arrived.
"""

from __future__ import annotations

import copy
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

__all__ = ["ERROR_SCHEMAS", "build_openapi"]

_REF = "#/components/schemas/"

#: The error bodies of the api.
ERROR_SCHEMAS: dict[str, dict[str, Any]] = {
    "Error": {
        "title": "Error",
        "description": "An error named in one sentence.",
        "type": "object",
        "properties": {"detail": {"type": "string"}},
        "required": ["detail"],
    },
    "FieldError": {
        "title": "FieldError",
        "description": "A bad value in the body, the path or the query: which field, what is wrong.",
        "type": "object",
        "properties": {
            "detail": {
                "type": "object",
                "properties": {"field": {"type": "string"}, "message": {"type": "string"}},
                "required": ["field", "message"],
            }
        },
        "required": ["detail"],
    },
    "RecordError": {
        "title": "RecordError",
        "description": (
            "A bad record of a batch: its index (null for the body as a whole), the field and what is "
            "wrong. Nothing of the batch was written."
        ),
        "type": "object",
        "properties": {
            "detail": {
                "type": "object",
                "properties": {
                    "index": {"anyOf": [{"type": "integer", "minimum": 0}, {"type": "null"}]},
                    "field": {"type": "string"},
                    "message": {"type": "string"},
                },
                "required": ["index", "field", "message"],
            }
        },
        "required": ["detail"],
    },
}


def _error(description: str, schema: str = "Error") -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": {"$ref": _REF + schema}}}}


def _lift_body_schema(doc: dict[str, Any], operation: dict[str, Any]) -> None:
    """Move an inline request-body schema (and its ``$defs``) into the components, by title."""
    body = operation.get("requestBody", {}).get("content", {}).get("application/json")
    if not body or "$ref" in body.get("schema", {}):
        return
    schema = copy.deepcopy(body["schema"])
    components = doc.setdefault("components", {}).setdefault("schemas", {})
    for name, definition in schema.pop("$defs", {}).items():
        components.setdefault(name, definition)
    title = schema.get("title")
    if title:
        components.setdefault(title, schema)
        body["schema"] = {"$ref": _REF + title}
    else:
        body["schema"] = schema


def build_openapi(app: FastAPI) -> dict[str, Any]:
    """The api's OpenAPI document (cached on ``app.openapi_schema``).

    Args:
        app: the app made by :func:`hedgerow.api.app.create_app`.

    Returns:
        The document as a dict (OpenAPI 3.1).
    """
    if app.openapi_schema:
        return app.openapi_schema
    doc = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
    components = doc.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    schemas.pop("HTTPValidationError", None)
    schemas.pop("ValidationError", None)
    schemas.update(copy.deepcopy(ERROR_SCHEMAS))
    for path, operations in doc.get("paths", {}).items():
        for operation in operations.values():
            _lift_body_schema(doc, operation)
            responses = operation.setdefault("responses", {})
            if "422" in responses or "requestBody" in operation or operation.get("parameters"):
                shape = "RecordError" if path == "/v1/calls" else "FieldError"
                description = responses.get("422", {}).get("description") or "a bad value, named"
                if description == "Validation Error":
                    description = "a bad value, named"
                responses["422"] = _error(description, shape)
            if "404" in responses or any(p.get("in") == "path" for p in operation.get("parameters", [])):
                # an unknown (route, model), in the path or a query, is a FieldError naming
                # ``route``; a path that matches no operation is the framework's plain Error (a path
                # parameter with a control character is a 422 FieldError naming it:
                # hedgerow.api.path_check)
                described = responses.get("404", {}).get("description")
                responses["404"] = {
                    "description": (described + "; " if described else "") + "no such path",
                    "content": {
                        "application/json": {
                            "schema": {"oneOf": [{"$ref": _REF + "FieldError"}, {"$ref": _REF + "Error"}]}
                        }
                    },
                }
            if "requestBody" in operation:
                responses["413"] = _error(
                    "the body is over its limit (refused while it streams); field: body", "FieldError"
                )
                responses["408"] = _error(
                    "the body did not arrive within HEDGEROW_BODY_READ_TIMEOUT_S; field: body", "FieldError"
                )
            if path not in ("/healthz", "/readyz") and "503" not in responses:
                responses["503"] = _error(
                    "the store is unavailable (field: database; with Retry-After), or the server is shutting"
                    " down before a body arrived (field: body)",
                    "FieldError",
                )
            if operation.get("security"):  # declared by require_scope's bearer scheme
                responses["401"] = _error(
                    "missing or invalid bearer token (when tokens are configured); field: authorization", "FieldError"
                )
                responses["403"] = _error(
                    "the token lacks the operation's scope (see its summary); field: authorization", "FieldError"
                )
            for code, answer in responses.items():
                if code.startswith(("4", "5")) and "content" not in answer:
                    answer["content"] = _error(answer.get("description", "an error"))["content"]
    app.openapi_schema = doc
    return doc
