"""Prices: ``GET /v1/prices``, ``GET /v1/prices/{model}`` (read scope) and ``PUT /v1/prices/{model}`` (admin).

``PUT`` body: ``{"input_usd_per_mtok": 3.0, "output_usd_per_mtok": 15.0,
"cached_input_usd_per_mtok": 0.3, "upstream": "east", "effective_from": "2026-11-23", "actor":
"alice"}`` (only the two prices are required; ``upstream`` absent: every upstream;
``effective_from`` absent: the start of the current UTC hour). It adds a price row with who set it
(the actor, as for route changes: :func:`hedgerow.api.routes.request_actor`) and when; 201 with
the price, 200 when the identical price was already stored (nothing added). A bad value is 422
``{"detail": {"field": ..., "message": ...}}``. ``{model}`` may contain ``/``
(``meta-llama/Llama-3-70b``). Prices never overwrite each other: see
:mod:`hedgerow.controller.prices`.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Depends, Request, status
from fastapi.responses import JSONResponse

from hedgerow.api.auth import require_scope
from hedgerow.api.routes import Session, request_actor
from hedgerow.client.records import control_character_error
from hedgerow.controller.prices import PriceInvalid, list_prices, parse_price, set_price

__all__ = ["MAX_PRICE_BODY_BYTES", "router"]

router = APIRouter()

#: Largest body of a PUT of a price, bytes.
MAX_PRICE_BODY_BYTES = 4096


def _unprocessable(field: str, message: str) -> JSONResponse:
    return JSONResponse(
        {"detail": {"field": field, "message": message}}, status_code=status.HTTP_422_UNPROCESSABLE_CONTENT
    )


@router.get("/v1/prices", dependencies=[Depends(require_scope("read"))], summary="Every price")
async def get_prices(session: Session) -> Any:
    """Every stored price, by (model, upstream, effective_from): ``{"prices": [...]}``."""
    return {"prices": [p.to_dict() for p in await list_prices(session)]}


@router.get("/v1/prices/{model:path}", dependencies=[Depends(require_scope("read"))], summary="A model's prices")
async def get_model_prices(model: str, session: Session) -> Any:
    """The prices of one model (empty when it has none: the report says "no price")."""
    problem = control_character_error(model)
    if problem is not None:
        return _unprocessable("model", problem)
    return {"model": model, "prices": [p.to_dict() for p in await list_prices(session, model=model)]}


@router.put(
    "/v1/prices/{model:path}",
    dependencies=[Depends(require_scope("admin"))],
    summary="Set a model's price from a date",
    responses={
        201: {"description": "the price was added"},
        200: {"description": "the identical price was already stored"},
        422: {"description": '{"detail": {"field": ..., "message": ...}}: a bad value, named'},
    },
)
async def put_price(model: str, request: Request, session: Session) -> Any:
    """Add a price of ``model`` (see the module docstring); audited with actor and time."""
    raw = await request.body()
    if len(raw) > MAX_PRICE_BODY_BYTES:
        return JSONResponse(
            {"detail": f"body of {len(raw)} bytes exceeds {MAX_PRICE_BODY_BYTES} bytes"},
            status_code=status.HTTP_413_CONTENT_TOO_LARGE,
        )
    try:
        payload = json.loads(raw or b"{}")
    except (ValueError, UnicodeDecodeError) as exc:
        return _unprocessable("body", f"not valid JSON: {exc}")
    except RecursionError:
        return _unprocessable("body", "JSON nested too deeply")
    try:
        spec = parse_price(payload, model=model)
    except PriceInvalid as exc:
        return _unprocessable(exc.field, exc.message)
    actor = request_actor(request, spec.actor)
    async with session.begin():
        price, added = await set_price(session, spec, source="api", actor=actor)
    return JSONResponse(
        {"price": price.to_dict(), "added": added},
        status_code=status.HTTP_201_CREATED if added else status.HTTP_200_OK,
    )
