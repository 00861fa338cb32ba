"""Prices: ``GET /v1/prices``, ``GET /v1/prices/{model}`` (read scope) and ``PUT /v1/prices/{model}`` (admin).

``PUT`` body (:class:`PricePutIn`, the document's schema; the values are checked by
:func:`hedgerow.controller.store.prices.parse_price`): ``{"input_usd_per_mtok": 3.0, "output_usd_per_mtok": 15.0,
"cached_input_usd_per_mtok": 0.3, "upstream": "east", "effective_from": "2026-11-23", "actor":
"alice"}`` (only the two prices are required; ``upstream`` absent: every upstream;
``effective_from`` absent: the start of the current UTC hour). It adds a price row with who set it
(the actor, as for route changes: :func:`hedgerow.api.routes.request_actor`) and when; 201 with
the price, 200 when the identical price was already stored (nothing added). A bad value is 422
``{"detail": {"field": ..., "message": ...}}``; a body over :data:`MAX_PRICE_BODY_BYTES` is 413 in the
same shape (field ``body``). ``{model}`` may contain ``/``
(``meta-llama/Llama-3-70b``). Prices never overwrite each other: see
:mod:`hedgerow.controller.store.prices`.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request, status
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from hedgerow.api.auth import require_scope
from hedgerow.api.json_body import BodyRefused, documented_body, read_json_body, unprocessable
from hedgerow.api.routes import Session, request_actor
from hedgerow.api.schemas import PRINTABLE_PATTERN
from hedgerow.client.names import MAX_NAME_CHARS
from hedgerow.client.records import control_character_error
from hedgerow.controller.store.prices import MAX_USD_PER_MTOK, PriceInvalid, list_prices, parse_price, set_price

__all__ = ["MAX_PRICE_BODY_BYTES", "PricePutIn", "router"]

router = APIRouter()

#: Largest body of a PUT of a price, bytes.
MAX_PRICE_BODY_BYTES = 4096


_Usd = Annotated[float, Field(ge=0, le=MAX_USD_PER_MTOK, description="USD per million tokens")]
_Name = Annotated[str, Field(max_length=MAX_NAME_CHARS, pattern=PRINTABLE_PATTERN)]


class PricePutIn(BaseModel):
    """Body of ``PUT /v1/prices/{model}``: a price of the model from a date (rows are only added).

    Describes the body for the OpenAPI document; the server checks it with
    :func:`hedgerow.controller.store.prices.parse_price` (422 naming the first bad field; an unknown
    field is refused).
    """

    model_config = ConfigDict(extra="forbid", title="PricePutIn")

    input_usd_per_mtok: _Usd
    output_usd_per_mtok: _Usd
    cached_input_usd_per_mtok: _Usd | None = Field(
        None, description="USD per million cached prompt tokens (absent: priced as input)"
    )
    upstream: _Name | None = Field(None, description="the upstream this price is for (absent or empty: every upstream)")
    effective_from: str | None = Field(
        None,
        description=(
            "from when: an ISO 8601 date (2026-11-23, midnight UTC) or a timestamp with a zone on a whole "
            "hour (absent: the start of the current UTC hour)"
        ),
    )
    actor: _Name | None = Field(None, description="who sets it (a note; a named token's name is the audited actor)")
    model: _Name | None = Field(None, description="the model; may repeat the path's, not differ from it")


@router.get("/v1/prices", dependencies=[Depends(require_scope("read"))], summary="Every price")
async def get_prices(session: Session) -> Any:
    """Every stored price, by (model, upstream, effective_from): ``{"prices": [...]}``."""
    return {"prices": [p.to_dict() for p in await list_prices(session)]}


@router.get("/v1/prices/{model:path}", dependencies=[Depends(require_scope("read"))], summary="A model's prices")
async def get_model_prices(model: str, session: Session) -> Any:
    """The prices of one model (empty when it has none: the report says "no price")."""
    problem = control_character_error(model)
    if problem is not None:
        return unprocessable("model", problem)
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
    openapi_extra=documented_body(PricePutIn, required=True),
)
async def put_price(model: str, request: Request, session: Session) -> Any:
    """Add a price of ``model`` (see the module docstring); audited with actor and time."""
    try:
        payload = await read_json_body(request, MAX_PRICE_BODY_BYTES)
    except BodyRefused as refused:
        return refused.answer
    try:
        spec = parse_price(payload, model=model)
    except PriceInvalid as exc:
        return unprocessable(exc.field, exc.message)
    actor = request_actor(request, spec.actor)
    async with session.begin():
        price, added = await set_price(session, spec, source="api", actor=actor)
    return JSONResponse(
        {"price": price.to_dict(), "added": added},
        status_code=status.HTTP_201_CREATED if added else status.HTTP_200_OK,
    )
