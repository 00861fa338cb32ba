"""The OpenAPI document describes the api (issue 13 point 6); schemathesis runs it live."""

from __future__ import annotations

import json
import re
from typing import Any

from hedgerow.api.app import create_app
from hedgerow.settings import Settings


def _document() -> dict[str, Any]:
    return create_app(Settings(database_url="sqlite+aiosqlite:///:memory:")).openapi()


def test_every_referenced_schema_is_present_and_errors_have_our_shapes() -> None:
    doc = _document()
    schemas = doc["components"]["schemas"]
    referenced = set(re.findall(r"#/components/schemas/([\w.-]+)", json.dumps(doc)))
    assert referenced <= set(schemas), referenced - set(schemas)
    assert {"CallBatchIn", "CallRecordIn", "AttemptIn", "RoutePutIn", "RoutePatchIn"} <= set(schemas)
    assert "HTTPValidationError" not in schemas
    assert doc["components"]["securitySchemes"]["bearer"] == {
        "type": "http",
        "scheme": "bearer",
        "description": doc["components"]["securitySchemes"]["bearer"]["description"],
    }
    calls = doc["paths"]["/v1/calls"]["post"]
    assert calls["security"] == [{"bearer": []}]
    assert {"202", "401", "403", "408", "413", "422"} <= set(calls["responses"])
    assert calls["responses"]["422"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/RecordError"
    }
    put = doc["paths"]["/v1/routes/{route}"]["put"]["responses"]["422"]
    assert put["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/FieldError"}
    assert "security" not in doc["paths"]["/healthz"]["get"]
    # what the server accepts, the document says
    completion = schemas["AttemptIn"]["properties"]["completion_tokens"]
    assert {"type": "null"} in completion["anyOf"]
    assert "min_hedge_after_s <= default_hedge_after_s" in schemas["RoutePatchIn"]["description"]
    # every history row carries its plain-English sentences (read-only: derived from the row)
    explanation = schemas["HistoryRowOut"]["properties"]["explanation"]
    assert explanation["type"] == "array" and explanation["items"] == {"type": "string"} and explanation["readOnly"]
    assert "explanation" in schemas["HistoryRowOut"]["required"]
    assert "first_token_s" in schemas["CallRecordIn"]["description"]
