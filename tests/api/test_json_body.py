"""One reading of a JSON body and one error shape for every router (api/json_body.py).

The route and the price endpoints each read their body with their own copy of the size check and
the JSON parse; they now share :func:`hedgerow.api.json_body.read_json_body`, and every module of
the api builds ``{"detail": {"field", "message"}}`` through :func:`hedgerow.api.limits.error_detail`
only (the 413 of ``PUT /v1/prices/{model}`` was once a bare string).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from hedgerow.api.prices import MAX_PRICE_BODY_BYTES
from hedgerow.api.routes import MAX_ROUTE_BODY_BYTES
from tests.api.conftest import MakeApi

API = Path(__file__).resolve().parents[2] / "api"
#: (method, path, params, the endpoint's own body limit in bytes)
ENDPOINTS = [
    ("PUT", "/v1/routes/r", {"model": "m1"}, MAX_ROUTE_BODY_BYTES),
    ("PATCH", "/v1/routes/r", {"model": "m1"}, MAX_ROUTE_BODY_BYTES),
    ("PUT", "/v1/prices/m1", {}, MAX_PRICE_BODY_BYTES),
]


@pytest.mark.parametrize(
    ("method", "path", "params", "limit_bytes"), ENDPOINTS, ids=["put-route", "patch-route", "put-price"]
)
async def test_every_json_body_endpoint_refuses_the_same_bodies_with_the_same_answers(
    make_api: MakeApi, method: str, path: str, params: dict[str, str], limit_bytes: int
) -> None:
    headers = {"content-type": "application/json"}
    async with make_api() as (_app, api):
        assert (await api.put("/v1/routes/r", params={"model": "m1"}, json={})).status_code == 201
        broken = await api.request(method, path, params=params, content=b'{"budget": ', headers=headers)
        assert broken.status_code == 422, broken.text
        detail = broken.json()["detail"]
        assert detail["field"] == "body" and detail["message"].startswith("not valid JSON: "), detail

        nested = b"[" * (limit_bytes // 2) + b"]" * (limit_bytes // 2)  # 2,048 levels or more, within the limit
        too_deep = await api.request(method, path, params=params, content=nested, headers=headers)
        assert too_deep.status_code == 422, too_deep.text
        assert too_deep.json() == {"detail": {"field": "body", "message": "JSON nested too deeply"}}

        size = limit_bytes + 1
        big = await api.request(method, path, params=params, content=b" " * size, headers=headers)
        assert big.status_code == 413, big.text
        assert big.json() == {
            "detail": {"field": "body", "message": f"body of {size} bytes exceeds the limit of {limit_bytes} bytes"}
        }


def _error_dicts(tree: ast.AST) -> list[int]:
    """Lines of dict displays ``{"detail": {"field": ...}}`` in ``tree``."""
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Dict):
            continue
        for key, value in zip(node.keys, node.values, strict=True):
            if (
                isinstance(key, ast.Constant)
                and key.value == "detail"
                and isinstance(value, ast.Dict)
                and any(isinstance(k, ast.Constant) and k.value == "field" for k in value.keys)
            ):
                lines.append(node.lineno)
    return lines


def test_the_error_shape_is_built_in_one_place() -> None:
    found = {
        path.name: lines for path in sorted(API.glob("*.py")) if (lines := _error_dicts(ast.parse(path.read_text())))
    }
    assert list(found) == ["limits.py"], f"build errors with hedgerow.api.json_body.error_response: {found}"
    assert len(found["limits.py"]) == 1  # error_detail
