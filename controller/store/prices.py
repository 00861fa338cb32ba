"""Prices of tokens: USD per million input, cached input and output tokens, per model and upstream.

A price applies to one model, either on every upstream (``upstream`` empty) or on one upstream
(which then takes precedence over the model-wide price), from ``effective_from``, a whole UTC
hour, until the next price of the same (model, upstream) takes over. Spend is computed per hourly
rollup with the price in force at the hour's start (:meth:`PriceBook.lookup`), so a report of an
old week uses that week's prices, and a price change in the middle of a week splits it exactly at
the hour it names.

Prices are set through ``PUT /v1/prices/{model}`` (admin scope) or loaded from the price file
named by ``HEDGEROW_PRICE_FILE`` when the api starts (:func:`load_price_file`). Rows are only
ever added, with who set them (``actor``) and when (``created_at``): the table is the audit trail.
Setting a price identical to the one already stored for the same (model, upstream,
effective_from) adds nothing, so loading the same file at every start is harmless.

A model without a price has no spend: :meth:`PriceBook.cost_usd` returns ``None`` and the
report says "no price"; nothing is ever invented.

Price file (JSON, or TOML when the name ends in ``.toml``)::

    {"prices": [
      {"model": "llama2-70b", "effective_from": "2026-11-01",
       "input_usd_per_mtok": 0.9, "output_usd_per_mtok": 0.9},
      {"model": "gpt-4o", "upstream": "azure-east", "effective_from": "2026-11-23T12:00:00Z",
       "input_usd_per_mtok": 2.5, "cached_input_usd_per_mtok": 1.25, "output_usd_per_mtok": 10}
    ]}
"""

from __future__ import annotations

import json
import logging
import math
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from hedgerow.client.records import MAX_NAME_CHARS, control_character_error, parse_timestamp
from hedgerow.controller.store.models import Price as PriceRow
from hedgerow.controller.store.models import utc_now

log = logging.getLogger(__name__)

__all__ = [
    "MAX_USD_PER_MTOK",
    "PRICE_FIELDS",
    "Price",
    "PriceBook",
    "PriceInvalid",
    "PriceSpec",
    "list_prices",
    "load_price_book",
    "load_price_file",
    "parse_price",
    "read_price_file",
    "set_price",
    "store_price_file",
]

#: Largest accepted price, USD per million tokens (far above any listed price; catches unit slips).
MAX_USD_PER_MTOK = 100_000.0
#: The fields of a price body / file entry.
PRICE_FIELDS = (
    "model",
    "upstream",
    "effective_from",
    "input_usd_per_mtok",
    "output_usd_per_mtok",
    "cached_input_usd_per_mtok",
    "actor",
)


class PriceInvalid(ValueError):
    """A price that cannot be stored; ``field`` names the bad field, ``message`` says why."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass(frozen=True, slots=True)
class PriceSpec:
    """A validated price to store (see :func:`parse_price`).

    Attributes:
        model: the model; upstream: the upstream, or ``""`` for every upstream.
        effective_from: the whole UTC hour from which it applies (aware).
        input_usd_per_mtok, output_usd_per_mtok: USD per million prompt / completion tokens.
        cached_input_usd_per_mtok: USD per million cached prompt tokens, or None (input price).
        actor: who set it, or None when not given.
    """

    model: str
    upstream: str
    effective_from: datetime
    input_usd_per_mtok: float
    output_usd_per_mtok: float
    cached_input_usd_per_mtok: float | None = None
    actor: str | None = None


@dataclass(frozen=True, slots=True)
class Price:
    """A stored price (one ``prices`` row).

    Attributes: those of :class:`PriceSpec`, plus ``source`` (``api`` or ``file``), ``actor``
    (who set it) and ``created_at`` (when).
    """

    model: str
    upstream: str
    effective_from: datetime
    input_usd_per_mtok: float
    output_usd_per_mtok: float
    cached_input_usd_per_mtok: float | None
    source: str
    actor: str
    created_at: datetime

    def cost_usd(self, *, prompt: int, cached: int, completion: int) -> float:
        """USD of the given tokens at this price.

        Args:
            prompt: prompt tokens (cached ones included); cached: of those, read from a cache
                (priced at ``cached_input_usd_per_mtok`` when set, else the input price);
            completion: completion tokens.
        """
        cached = min(max(cached, 0), prompt)
        cached_price = (
            self.input_usd_per_mtok if self.cached_input_usd_per_mtok is None else self.cached_input_usd_per_mtok
        )
        return (
            (prompt - cached) * self.input_usd_per_mtok + cached * cached_price + completion * self.output_usd_per_mtok
        ) / 1e6

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (timestamps ISO 8601; ``upstream`` null for every upstream)."""
        return {
            "model": self.model,
            "upstream": self.upstream or None,
            "effective_from": self.effective_from.isoformat(),
            "input_usd_per_mtok": self.input_usd_per_mtok,
            "output_usd_per_mtok": self.output_usd_per_mtok,
            "cached_input_usd_per_mtok": self.cached_input_usd_per_mtok,
            "source": self.source,
            "actor": self.actor,
            "created_at": self.created_at.isoformat(),
        }


class PriceBook:
    """Every stored price, for looking up the one in force for (model, upstream) at a moment.

    Args:
        prices: stored prices in any order.
    """

    def __init__(self, prices: Iterable[Price]) -> None:
        grouped: dict[tuple[str, str], list[Price]] = {}
        for price in prices:
            grouped.setdefault((price.model, price.upstream), []).append(price)
        # for equal effective_from the newest created_at wins: sort so it comes last
        self._prices = {
            key: sorted(rows, key=lambda p: (p.effective_from, p.created_at)) for key, rows in grouped.items()
        }

    def __bool__(self) -> bool:
        return bool(self._prices)

    def models(self) -> set[str]:
        """The models with at least one price."""
        return {model for model, _ in self._prices}

    def change_times(self, model: str) -> list[datetime]:
        """When any price of ``model`` (any upstream) takes effect, sorted, without repeats: two
        moments with as many of these at or before them have the same price in force for
        ``model`` on every upstream (so hours between two changes may be priced as one)."""
        return sorted({p.effective_from for (m, _), rows in self._prices.items() if m == model for p in rows})

    def _in_force(self, key: tuple[str, str], at: datetime) -> Price | None:
        found = None
        for price in self._prices.get(key, ()):
            if price.effective_from <= at:
                found = price
        return found

    def lookup(self, model: str, upstream: str, at: datetime) -> Price | None:
        """The price of ``model`` on ``upstream`` in force at ``at`` (aware UTC), or None.

        An upstream's own price in force at ``at`` wins over the model-wide one.
        """
        return self._in_force((model, upstream), at) or self._in_force((model, ""), at)

    def cost_usd(
        self, model: str, upstream: str, at: datetime, *, prompt: int, cached: int, completion: int
    ) -> float | None:
        """USD of the tokens at the price in force, or None when there is none (never invented)."""
        price = self.lookup(model, upstream, at)
        if price is None:
            return None
        return price.cost_usd(prompt=prompt, cached=cached, completion=completion)


def _name(data: Mapping[str, Any], field: str, *, required: bool) -> str:
    value = data.get(field)
    if value is None or value == "":
        if required:
            raise PriceInvalid(field, "field required")
        return ""
    if not isinstance(value, str):
        raise PriceInvalid(field, "must be a string")
    if len(value) > MAX_NAME_CHARS:
        raise PriceInvalid(field, f"longer than {MAX_NAME_CHARS} characters")
    problem = control_character_error(value)
    if problem is not None:
        raise PriceInvalid(field, problem)
    return value


def _usd(data: Mapping[str, Any], field: str, *, required: bool) -> float | None:
    value = data.get(field)
    if value is None:
        if required:
            raise PriceInvalid(field, "field required")
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise PriceInvalid(field, "must be a finite number of USD per million tokens")
    if not 0 <= value <= MAX_USD_PER_MTOK:
        raise PriceInvalid(field, f"must be in [0, {MAX_USD_PER_MTOK:g}] USD per million tokens")
    return float(value)


def _effective_from(value: Any, now: datetime) -> datetime:
    if value is None:
        return now.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    if not isinstance(value, str):
        raise PriceInvalid("effective_from", "must be an ISO 8601 date (2026-11-23) or a whole UTC hour")
    if len(value) == 10:
        try:
            day = date.fromisoformat(value)
        except ValueError:
            raise PriceInvalid("effective_from", f"{value!r} is not an ISO 8601 date (YYYY-MM-DD)") from None
        return datetime(day.year, day.month, day.day, tzinfo=UTC)
    try:
        moment = parse_timestamp(value)
    except ValueError as exc:
        raise PriceInvalid("effective_from", str(exc)) from None
    if moment != moment.replace(minute=0, second=0, microsecond=0):
        raise PriceInvalid("effective_from", "must be a whole UTC hour (spend is priced per hourly rollup)")
    return moment


def parse_price(data: Any, *, model: str | None = None, now: datetime | None = None) -> PriceSpec:
    """Validate a price given as a JSON object (an api body or a price file entry).

    Args:
        data: ``{"input_usd_per_mtok": x, "output_usd_per_mtok": y, "cached_input_usd_per_mtok":
            z?, "upstream": name?, "effective_from": date-or-hour?, "actor": name?}`` and, unless
            ``model`` is given, ``"model"``. ``effective_from`` is an ISO date (midnight UTC) or
            an ISO timestamp with a zone on a whole hour; default: the start of the current hour.
        model: the model (from the api path); when given, ``data`` may repeat it but not differ.
        now: the current time (aware UTC), for the default ``effective_from``.

    Returns:
        The :class:`PriceSpec`.

    Raises:
        PriceInvalid: naming the first bad field (unknown fields are refused).
    """
    if not isinstance(data, Mapping):
        raise PriceInvalid("body", "must be a JSON object of a price")
    unknown = sorted(set(data) - set(PRICE_FIELDS))
    if unknown:
        raise PriceInvalid(unknown[0], "unknown field")
    if model is not None:
        _name({"model": model}, "model", required=True)
        if data.get("model") not in (None, model):
            raise PriceInvalid("model", f"differs from the model of the path ({model!r})")
        name = model
    else:
        name = _name(data, "model", required=True)
    input_usd = _usd(data, "input_usd_per_mtok", required=True)
    output_usd = _usd(data, "output_usd_per_mtok", required=True)
    assert input_usd is not None and output_usd is not None
    actor = _name(data, "actor", required=False) or None
    return PriceSpec(
        model=name,
        upstream=_name(data, "upstream", required=False),
        effective_from=_effective_from(data.get("effective_from"), now or utc_now()),
        input_usd_per_mtok=input_usd,
        output_usd_per_mtok=output_usd,
        cached_input_usd_per_mtok=_usd(data, "cached_input_usd_per_mtok", required=False),
        actor=actor,
    )


def _from_row(row: PriceRow) -> Price:
    return Price(
        model=row.model,
        upstream=row.upstream,
        effective_from=row.effective_from,
        input_usd_per_mtok=row.input_usd_per_mtok,
        output_usd_per_mtok=row.output_usd_per_mtok,
        cached_input_usd_per_mtok=row.cached_input_usd_per_mtok,
        source=row.source,
        actor=row.actor,
        created_at=row.created_at,
    )


async def list_prices(session: AsyncSession, *, model: str | None = None) -> list[Price]:
    """Every stored price (of one model when given), by (model, upstream, effective_from, created_at)."""
    query = select(PriceRow).order_by(PriceRow.model, PriceRow.upstream, PriceRow.effective_from, PriceRow.created_at)
    if model is not None:
        query = query.where(PriceRow.model == model)
    return [_from_row(row) for row in (await session.scalars(query)).all()]


async def load_price_book(session: AsyncSession) -> PriceBook:
    """A :class:`PriceBook` of every stored price."""
    return PriceBook(await list_prices(session))


async def set_price(session: AsyncSession, spec: PriceSpec, *, source: str, actor: str) -> tuple[Price, bool]:
    """Store a price (the caller commits); adds nothing when the same price is already in force there.

    Args:
        session: an open session.
        spec: from :func:`parse_price`.
        source: ``api`` or ``file``; actor: who sets it (at most 400 characters are kept).

    Returns:
        ``(price, added)``: the stored price, and False when an identical price (same values,
        same (model, upstream, effective_from)) was already the newest one for that key.
    """
    query = (
        select(PriceRow)
        .where(
            PriceRow.model == spec.model,
            PriceRow.upstream == spec.upstream,
            PriceRow.effective_from == spec.effective_from,
        )
        .order_by(PriceRow.created_at.desc(), PriceRow.id.desc())
        .limit(1)
    )
    latest = (await session.scalars(query)).first()
    values = (spec.input_usd_per_mtok, spec.output_usd_per_mtok, spec.cached_input_usd_per_mtok)
    if (
        latest is not None
        and (
            latest.input_usd_per_mtok,
            latest.output_usd_per_mtok,
            latest.cached_input_usd_per_mtok,
        )
        == values
    ):
        return _from_row(latest), False
    row = PriceRow(
        model=spec.model,
        upstream=spec.upstream,
        effective_from=spec.effective_from,
        input_usd_per_mtok=spec.input_usd_per_mtok,
        output_usd_per_mtok=spec.output_usd_per_mtok,
        cached_input_usd_per_mtok=spec.cached_input_usd_per_mtok,
        source=source,
        actor=actor[:400],
        created_at=utc_now(),
    )
    session.add(row)
    await session.flush()
    return _from_row(row), True


def read_price_file(path: str | Path) -> list[PriceSpec]:
    """Read and validate a price file (JSON, or TOML by its ``.toml`` suffix; see the module docstring).

    Raises:
        PriceInvalid: the file cannot be read or parsed, or an entry is bad; the field is named
            ``prices[i].<field>``.
    """
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
        data = tomllib.loads(text) if file.suffix == ".toml" else json.loads(text)
    except (OSError, ValueError) as exc:
        raise PriceInvalid("price_file", f"cannot read {file}: {exc}") from None
    entries = data.get("prices") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise PriceInvalid("price_file", f'{file} must hold {{"prices": [price, ...]}}')
    specs = []
    for i, entry in enumerate(entries):
        try:
            specs.append(parse_price(entry))
        except PriceInvalid as exc:
            raise PriceInvalid(f"prices[{i}].{exc.field}", exc.message) from None
    return specs


async def load_price_file(session: AsyncSession, path: str | Path) -> list[tuple[Price, bool]]:
    """Store every price of a price file (the caller commits); re-loading the same file adds nothing.

    Returns:
        ``(price, added)`` per entry (see :func:`set_price`).

    Raises:
        PriceInvalid: as :func:`read_price_file`; nothing is stored then.
    """
    specs: Sequence[PriceSpec] = read_price_file(path)
    out = []
    for spec in specs:
        out.append(await set_price(session, spec, source="file", actor=spec.actor or f"file:{Path(path).name}"))
    return out


async def store_price_file(
    sessionmaker: async_sessionmaker[AsyncSession], path: str | Path
) -> list[tuple[Price, bool]]:
    """:func:`load_price_file` in a transaction of its own (what the api does at start); logs what it added.

    Raises:
        PriceInvalid: as :func:`read_price_file`; nothing is stored then.
    """
    async with sessionmaker() as session, session.begin():
        loaded = await load_price_file(session, path)
    added = sum(1 for _, was_added in loaded if was_added)
    log.info("price file %s: %d price(s), %d added", path, len(loaded), added)
    return loaded
