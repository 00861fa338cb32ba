"""Manual changes of a route's configuration, applied at once and audited in the history.

An operator may change ``enabled``, ``budget``, ``default_hedge_after_s``, the bounds
``min_hedge_after_s`` / ``max_hedge_after_s``, or pin a value (``pinned_hedge_after_s``; None
unpins). Two ways, both in :func:`configure_route`:

- **patch** (``PATCH /v1/routes/{route}?model=``): the given fields change, the others stay;
  the route must exist (:class:`~hedgerow.controller.errors.UnknownRoute` otherwise);
- **replace** (``PUT /v1/routes/{route}?model=``): the configuration becomes exactly the given
  fields, every omitted field taking the server's default for a new route
  (``HEDGEROW_DEFAULT_BUDGET``, ``HEDGEROW_DEFAULT_HEDGE_AFTER_S``, ..., unpinned, enabled). A
  missing route is **created** (so a route can be configured, e.g. disabled, before its first
  call arrives); its changes are then listed ``from`` null (settings left null, i.e. an unset
  pin, are not listed: ``changes`` holds only entries whose value moved).

Validation (:func:`validate_route_config`; :class:`RouteConfigInvalid` names the field):
``budget`` in (0, 1) (1 would mean "no budget", which the estimator cannot target), every
``*_hedge_after_s`` a finite number in (0, ``MAX_SECONDS``] (86400 s, the longest duration a
call record may carry, so records of the route are never refused for exceeding its threshold),
and ``min_hedge_after_s <= default_hedge_after_s <= max_hedge_after_s``; a pinned value must lie
within the bounds too (it is published as is, so a pin outside them is refused, naming
``pinned_hedge_after_s``).

Audit: a change is one ``threshold_history`` row with reason ``config,<decision codes>``
(``config`` first; the codes of the decision re-made at once with the new configuration follow,
e.g. ``config,pinned`` or ``config,disabled``), ``actor`` = who changed it, and
``details.changes = {"field": {"from": old, "to": new}}`` (plus ``details.created = true`` for
a route created by a replace). The threshold is re-decided and published in the same call, so a
pin, a disable or a tighter bound reaches the clients at once, with ``version + 1`` whenever the
published value or enabled flag changes. The row's ``applied`` says exactly that: true when the
published threshold (its value or its enabled flag) changed, or was published for the first time
(a created route, or one not yet ticked); false when the change left it as it was (e.g. a new
budget whose re-decision holds the value). A patch or replace that changes nothing writes **no**
row (and publishes nothing); the answer then says ``changes: {}``.

Archive (:func:`archive_route`, ``DELETE /v1/routes/{route}?model=``) retires a route without
deleting anything: ``routes.archived_at``/``archived_by`` are set and one history row with reason
``archived`` (``applied`` false: the value was not changed, the route left the table; ``details.
changes = {"archived_at": {"from": null, "to": time}}``, the actor) is written. From then on the
route is left out of ``GET /v1/routes`` (``?archived=true`` lists the archived ones), the
console's list, the threshold table (clients fall back to their own policy), the controller's
ticks (a tick deciding it at that moment publishes nothing: its publish lock is taken here) and
the ``max_routes`` / ``max_models_per_route`` counts; its calls, threshold and history are kept
and still read by ``GET /v1/routes/{route}`` and its history. Records naming it are refused
(422 naming the route as archived), so a client still sending it does not bring it back; a
change (``PUT``/``PATCH``) is refused (:class:`~hedgerow.controller.errors.RouteArchived`, 409)
until it is restored. Archiving an archived route changes nothing (same ``archived_at``, no row).
:func:`restore_route` (``PATCH /v1/routes/{route}?model=`` with ``{"archived": false}``) undoes it: the marks are
cleared, a history row with reason ``restored`` is written, the last published threshold is
served again and the next tick decides the route; a restore that would pass ``max_routes`` or
``max_models_per_route`` is refused (:class:`~hedgerow.controller.errors.RouteLimitExceeded`).

Atomicity: the configuration, the history row and the published threshold are written in **one**
transaction (the route row locked ``FOR UPDATE`` on PostgreSQL, SQLite's write lock held), so a
failure anywhere leaves the route, its threshold and its history as they were.
"""

from __future__ import annotations

import contextlib
import logging
import math
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, cast

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from hedgerow.client.names import model_name_error, route_name_error
from hedgerow.client.records import MAX_SECONDS, control_character_error, format_timestamp
from hedgerow.controller.errors import ControllerError, RouteArchived, RouteLimitExceeded, UnknownRoute
from hedgerow.controller.events import log_threshold_change
from hedgerow.controller.jobs import lock_route, tick_route
from hedgerow.controller.ops_bounds import budget_range_error
from hedgerow.controller.policy.policy import RouteConfig
from hedgerow.controller.store.db import dialect_insert
from hedgerow.controller.store.ingest import check_route_limits
from hedgerow.controller.store.models import Route, Threshold, ThresholdHistory, utc_now
from hedgerow.controller.store.queries import history_row_dict, route_dict

if TYPE_CHECKING:
    from hedgerow.settings import Settings

__all__ = [
    "ROUTE_CONFIG_FIELDS",
    "RouteArchive",
    "RouteChange",
    "RouteConfigInvalid",
    "archive_route",
    "configure_route",
    "restore_route",
    "update_route",
    "validate_route_config",
]

log = logging.getLogger(__name__)

#: The fields an operator may change.
ROUTE_CONFIG_FIELDS: tuple[str, ...] = (
    "enabled", "budget", "default_hedge_after_s", "min_hedge_after_s", "max_hedge_after_s",
    "pinned_hedge_after_s",
)  # fmt: skip

#: The history reason code (first code) of a configuration change.
CONFIG_REASON = "config"


class RouteConfigInvalid(ControllerError, ValueError):
    """A route configuration value is out of range.

    Args:
        field: the offending field (one of :data:`ROUTE_CONFIG_FIELDS`, or an unknown name).
        message: what is wrong with it.
    """

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}")


def _positive_seconds(name: str, value: Any) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or (not 0 < value <= MAX_SECONDS)
    ):
        raise RouteConfigInvalid(name, f"must be a finite number of seconds in (0, {MAX_SECONDS:g}], got {value!r}")
    return float(value)


def validate_route_config(values: dict[str, Any]) -> RouteConfig:
    """Check a complete route configuration; return it as a :class:`RouteConfig`.

    Args:
        values: every one of :data:`ROUTE_CONFIG_FIELDS` (seconds for ``*_hedge_after_s``,
            ``pinned_hedge_after_s`` may be None).

    Returns:
        The validated configuration.

    Raises:
        RouteConfigInvalid: an unknown or missing field, a wrong type, ``budget`` outside (0, 1),
            a duration not > 0, ``min_hedge_after_s > max_hedge_after_s``, or
            ``default_hedge_after_s`` or ``pinned_hedge_after_s`` outside ``[min_hedge_after_s,
            max_hedge_after_s]``; the
            error's ``field`` names the field.
    """
    unknown = sorted(set(values) - set(ROUTE_CONFIG_FIELDS))
    if unknown:
        raise RouteConfigInvalid(unknown[0], f"not a route setting ({', '.join(ROUTE_CONFIG_FIELDS)})")
    missing = [name for name in ROUTE_CONFIG_FIELDS if name not in values]
    if missing:
        raise RouteConfigInvalid(missing[0], "missing")
    if not isinstance(values["enabled"], bool):
        raise RouteConfigInvalid("enabled", f"must be true or false, got {values['enabled']!r}")
    budget = values["budget"]
    if isinstance(budget, bool) or not isinstance(budget, (int, float)):
        raise RouteConfigInvalid("budget", f"must be a fraction in (0, 1), got {budget!r}")
    out_of_range = budget_range_error(float(budget))
    if out_of_range is not None:
        raise RouteConfigInvalid("budget", out_of_range)
    default = _positive_seconds("default_hedge_after_s", values["default_hedge_after_s"])
    low = _positive_seconds("min_hedge_after_s", values["min_hedge_after_s"])
    high = _positive_seconds("max_hedge_after_s", values["max_hedge_after_s"])
    pinned = values["pinned_hedge_after_s"]
    if pinned is not None:
        pinned = _positive_seconds("pinned_hedge_after_s", pinned)
    if low > high:
        raise RouteConfigInvalid("min_hedge_after_s", f"{low} s exceeds max_hedge_after_s ({high} s)")
    if not low <= default <= high:
        raise RouteConfigInvalid(
            "default_hedge_after_s",
            f"{default} s is outside [min_hedge_after_s, max_hedge_after_s] = [{low}, {high}] s",
        )
    if pinned is not None and not low <= pinned <= high:
        raise RouteConfigInvalid(
            "pinned_hedge_after_s",
            f"{pinned} s is outside [min_hedge_after_s, max_hedge_after_s] = [{low}, {high}] s",
        )
    return RouteConfig(
        enabled=values["enabled"],
        budget=float(budget),
        default_hedge_after_s=default,
        min_hedge_after_s=low,
        max_hedge_after_s=high,
        pinned_hedge_after_s=pinned,
    )


def _defaults(settings: Settings) -> dict[str, Any]:
    """A new route's configuration from ``hedgerow.settings.Settings``."""
    return {
        "enabled": True,
        "budget": settings.default_budget,
        "default_hedge_after_s": settings.default_hedge_after_s,
        "min_hedge_after_s": settings.min_hedge_after_s,
        "max_hedge_after_s": settings.max_hedge_after_s,
        "pinned_hedge_after_s": None,
    }


@dataclass(frozen=True, slots=True)
class RouteChange:
    """What :func:`configure_route` did.

    Attributes:
        route: the route as the api returns it (configuration and published threshold).
        history: the history row written (as the api returns it), or None when nothing changed.
        changes: ``{"field": {"from": old, "to": new}}`` for every field whose value changed.
        created: True when a replace created the route.
    """

    route: dict[str, Any]
    history: dict[str, Any] | None
    changes: dict[str, dict[str, Any]]
    created: bool


async def configure_route(
    sessionmaker: async_sessionmaker[AsyncSession],
    settings: Settings,
    route: str,
    model: str,
    fields: dict[str, Any],
    *,
    replace: bool,
    actor: str,
    now: datetime | None = None,
) -> RouteChange:
    """Patch or replace a route's configuration, re-decide its threshold at once, audit it.

    Args:
        sessionmaker: from :func:`hedgerow.controller.store.db.make_sessionmaker`.
        settings: a ``hedgerow.settings.Settings`` (defaults of a replace, policy knobs).
        route, model: which route.
        fields: a subset of :data:`ROUTE_CONFIG_FIELDS` with new values (seconds, fraction).
        replace: False to patch (only ``fields`` change; the route must exist), True to replace
            (omitted fields get the defaults; a missing route is created).
        actor: who makes the change (stored in ``threshold_history.actor``), 1..200 characters.
        now: the time of the change (aware UTC; default: the clock).

    Returns:
        A :class:`RouteChange`; ``history`` is None and nothing is written when no field's value
        changes (and the route existed).

    Raises:
        UnknownRoute: a patch of a missing (route, model).
        RouteArchived: the route is archived (restore it first).
        RouteLimitExceeded: a replace that would create a route past ``settings.max_routes`` or
            ``settings.max_models_per_route``.
        RouteConfigInvalid: an unknown field or a value out of range (``field`` names it).
        ValueError: ``route``/``model`` not a valid name (:mod:`hedgerow.client.names`; the
            message starts with the field), ``actor`` empty or longer than 200 characters or
            holding a control character, or ``now`` naive.
    """
    for name, problem in (("route", route_name_error(route)), ("model", model_name_error(model))):
        if problem is not None:  # the one name rule (hedgerow.client.names)
            raise ValueError(f"{name}: {problem}")
    _check_actor(actor)
    unknown = sorted(set(fields) - set(ROUTE_CONFIG_FIELDS))
    if unknown:
        raise RouteConfigInvalid(unknown[0], f"not a route setting ({', '.join(ROUTE_CONFIG_FIELDS)})")
    now = now or utc_now()
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware (UTC)")
    created = False
    history: dict[str, Any] | None = None
    async with sessionmaker() as session, session.begin():
        if replace:
            wanted = _defaults(settings) | fields
            validate_route_config(wanted)
            await check_route_limits(
                session,
                [(route, model)],
                max_routes=settings.max_routes,
                max_models_per_route=settings.max_models_per_route,
            )
            inserted = await session.execute(
                dialect_insert(session, Route)
                .values(route=route, model=model, created_at=now, updated_at=now, **wanted)
                .on_conflict_do_nothing(index_elements=["route", "model"])
                .returning(Route.id)
            )
            created = inserted.first() is not None
        row = await session.scalar(select(Route).where(Route.route == route, Route.model == model).with_for_update())
        if row is None:
            raise UnknownRoute(route, model)
        if row.archived_at is not None:
            raise RouteArchived(route, model, row.archived_at)
        # Take the route's publish lock before reading what the change is decided from, so a
        # controller tick cannot publish in between (see jobs.lock_route).
        row, threshold = await lock_route(session, row.id)
        if created:
            old: dict[str, Any] = dict.fromkeys(ROUTE_CONFIG_FIELDS)
        else:
            old = {name: getattr(row, name) for name in ROUTE_CONFIG_FIELDS}
            wanted = (_defaults(settings) if replace else old) | fields
            validate_route_config(wanted)
        changes = {
            name: {"from": old[name], "to": wanted[name]} for name in ROUTE_CONFIG_FIELDS if old[name] != wanted[name]
        }
        if changes or created:
            for name in changes:
                setattr(row, name, wanted[name])
            row.updated_at = now
            await session.flush()
            before = None if threshold is None else (threshold.hedge_after_s, threshold.enabled)
            current = None if threshold is None else threshold.hedge_after_s
            # an unpin hands the route back to the controller: the value in force was the pin's
            # (also when a disable kept it), not the controller's
            unpinned = "pinned_hedge_after_s" in changes and wanted["pinned_hedge_after_s"] is None
            source = "pinned" if unpinned else (None if threshold is None else threshold.source)
            extra: dict[str, Any] = {"changes": changes}
            if created:
                extra["created"] = True
            joined = _JoinedSessionmaker(session)
            history = await tick_route(
                cast("async_sessionmaker[AsyncSession]", joined),  # duck-typed: one open transaction
                settings,
                row,
                current,
                now=now,
                actor=actor,
                reason_prefix=CONFIG_REASON,
                extra_details=extra,
                current_source=source,
            )
            await session.flush()
            threshold = await session.get(Threshold, row.id)
            after = None if threshold is None else (threshold.hedge_after_s, threshold.enabled)
            applied = after != before
            for added in joined.added:
                if isinstance(added, ThresholdHistory):
                    added.applied = applied
            history["applied"] = applied
        answer = route_dict(row, threshold)
    if history is not None and history["applied"]:
        log_threshold_change(history)  # committed: the change is published
    return RouteChange(route=answer, history=history, changes=changes, created=created)


def _check_actor(actor: str) -> None:
    """Raise ValueError unless ``actor`` is 1..200 characters without a control character."""
    if not isinstance(actor, str) or not 1 <= len(actor) <= 200:
        raise ValueError(f"actor must be 1 to 200 characters, got {actor!r}")
    problem = control_character_error(actor)
    if problem is not None:
        raise ValueError(f"actor {problem}")


@dataclass(frozen=True, slots=True)
class RouteArchive:
    """What :func:`archive_route` or :func:`restore_route` did.

    Attributes:
        route: the route as the api returns it (``archived_at``/``archived_by`` included).
        history: the history row written (as the api returns it), or None when the route was
            already in the state asked for (nothing written).
    """

    route: dict[str, Any]
    history: dict[str, Any] | None


def _state_row(
    row: Route, threshold: Threshold | None, reason: str, actor: str, now: datetime, changes: dict[str, Any]
) -> ThresholdHistory:
    """The history row of an archive or a restore: the published value as it stands, not applied."""
    value = row.default_hedge_after_s if threshold is None else threshold.hedge_after_s
    return ThresholdHistory(
        route_id=row.id,
        computed_at=now,
        last_at=now,
        previous_hedge_after_s=None if threshold is None else threshold.hedge_after_s,
        hedge_after_s=value,
        applied=False,
        reason=reason,
        source="default" if threshold is None else threshold.source,
        window_s=None,
        samples=0,
        censored=0,
        budget=row.budget,
        actor=actor,
        details={"changes": changes},
        repeats=1,
    )


def _check_stored_names(route: str, model: str) -> None:
    """Raise ValueError for an empty name or one with a control character (archive and restore
    take any name stored, also one from before the name rule, so that it can be retired)."""
    for name, value in (("route", route), ("model", model)):
        if not isinstance(value, str) or not value:
            raise ValueError(f"{name}: must not be empty")
        problem = control_character_error(value)
        if problem is not None:
            raise ValueError(f"{name} {problem}")


def _state_change_time(route: str, model: str, actor: str, now: datetime | None) -> datetime:
    """Check an archive or restore's arguments; return its time (``now``, default the clock).

    Raises:
        ValueError: an empty name or one with a control character, a bad ``actor``, or a naive ``now``.
    """
    _check_stored_names(route, model)
    _check_actor(actor)
    now = now or utc_now()
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware (UTC)")
    return now


async def _lock_named_route(session: AsyncSession, route: str, model: str) -> tuple[Route, Threshold | None]:
    """The (route, model) row and its threshold, locked for a change (:func:`lock_route`).

    Raises:
        UnknownRoute: no such (route, model).
    """
    found = await session.scalar(select(Route.id).where(Route.route == route, Route.model == model))
    if found is None:
        raise UnknownRoute(route, model)
    return await lock_route(session, found)


async def archive_route(
    sessionmaker: async_sessionmaker[AsyncSession],
    route: str,
    model: str,
    *,
    actor: str,
    now: datetime | None = None,
) -> RouteArchive:
    """Archive (route, model): set ``archived_at``/``archived_by`` and write an ``archived`` history row.

    One transaction, holding the route's publish lock (:func:`~hedgerow.controller.jobs.lock_route`),
    so a tick deciding the route at that moment publishes nothing for it afterwards. The calls,
    the threshold and the history are kept. See the module docstring for what archiving changes.

    Args:
        sessionmaker: from :func:`hedgerow.controller.store.db.make_sessionmaker`.
        route, model: which route (any name stored; no control characters).
        actor: who archives it (``archived_by`` and the row's ``actor``), 1..200 characters.
        now: the time of the change (aware UTC; default: the clock).

    Returns:
        A :class:`RouteArchive`; ``history`` is None when the route was already archived (its
        ``archived_at`` and ``archived_by`` are left as they were).

    Raises:
        UnknownRoute: no such (route, model).
        ValueError: an empty name or one with a control character, a bad ``actor``, or a naive ``now``.
    """
    now = _state_change_time(route, model, actor, now)
    history: dict[str, Any] | None = None
    async with sessionmaker() as session, session.begin():
        row, threshold = await _lock_named_route(session, route, model)
        if row.archived_at is None:
            row.archived_at = now
            row.archived_by = actor
            row.updated_at = now
            added = _state_row(
                row, threshold, "archived", actor, now, {"archived_at": {"from": None, "to": format_timestamp(now)}}
            )
            session.add(added)
            await session.flush()
            history = history_row_dict(added, row)
        answer = route_dict(row, threshold)
    if history is not None:
        log.info("route %r model %r archived by %s", route, model, actor)
    return RouteArchive(route=answer, history=history)


async def restore_route(
    sessionmaker: async_sessionmaker[AsyncSession],
    settings: Settings,
    route: str,
    model: str,
    *,
    actor: str,
    now: datetime | None = None,
) -> RouteArchive:
    """Undo :func:`archive_route`: clear the marks and write a ``restored`` history row.

    The route counts against ``settings.max_routes`` and ``settings.max_models_per_route``
    again, so a restore that would pass either is refused. Its last published threshold is
    served again at once; the next tick decides it.

    Args:
        sessionmaker: from :func:`hedgerow.controller.store.db.make_sessionmaker`.
        settings: a ``hedgerow.settings.Settings`` (the route bounds).
        route, model: which route (any name stored; no control characters).
        actor: who restores it (the row's ``actor``), 1..200 characters.
        now: the time of the change (aware UTC; default: the clock).

    Returns:
        A :class:`RouteArchive`; ``history`` is None when the route was not archived.

    Raises:
        UnknownRoute: no such (route, model).
        RouteLimitExceeded: the store already holds ``max_routes`` routes in use, or the route
            name ``max_models_per_route`` models in use.
        ValueError: an empty name or one with a control character, a bad ``actor``, or a naive ``now``.
    """
    now = _state_change_time(route, model, actor, now)
    history: dict[str, Any] | None = None
    async with sessionmaker() as session, session.begin():
        row, threshold = await _lock_named_route(session, route, model)
        if row.archived_at is not None:
            active = Route.archived_at.is_(None)
            total = int(await session.scalar(select(func.count()).select_from(Route).where(active)) or 0)
            if total >= settings.max_routes:
                raise RouteLimitExceeded(route, model, "route", settings.max_routes, action="restored")
            models = int(
                await session.scalar(select(func.count()).select_from(Route).where(active, Route.route == route)) or 0
            )
            if models >= settings.max_models_per_route:
                raise RouteLimitExceeded(route, model, "model", settings.max_models_per_route, action="restored")
            changes = {"archived_at": {"from": format_timestamp(row.archived_at), "to": None}}
            row.archived_at = None
            row.archived_by = None
            row.updated_at = now
            added = _state_row(row, threshold, "restored", actor, now, changes)
            session.add(added)
            await session.flush()
            history = history_row_dict(added, row)
        answer = route_dict(row, threshold)
    if history is not None:
        log.info("route %r model %r restored by %s", route, model, actor)
    return RouteArchive(route=answer, history=history)


class _JoinedSession:
    """A session handle that runs "open a session, begin a transaction" code inside the
    transaction of an already open session (see :class:`_JoinedSessionmaker`)."""

    def __init__(self, session: AsyncSession, added: list[Any]) -> None:
        self._session = session
        self._added = added

    def begin(self) -> contextlib.nullcontext[None]:
        """The enclosing transaction is already begun: nothing to begin, nothing to commit."""
        return contextlib.nullcontext()

    def add(self, instance: Any) -> None:
        """Add ``instance`` to the enclosing session and remember it."""
        self._added.append(instance)
        self._session.add(instance)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)


class _JoinedSessionmaker:
    """Stands in for an ``async_sessionmaker`` so that :func:`tick_route` (which opens its own
    sessions to observe and to publish) reads and writes in the caller's open transaction:
    the configuration change, the history row and the threshold then commit or roll back
    together. ``added`` lists the objects it added (the history row, a new threshold)."""

    def __init__(self, session: AsyncSession) -> None:
        self._session = session
        self.added: list[Any] = []

    def __call__(self) -> _JoinedSessionmaker:
        return self

    async def __aenter__(self) -> _JoinedSession:
        return _JoinedSession(self._session, self.added)

    async def __aexit__(self, *exc_info: object) -> None:
        return None


async def update_route(
    sessionmaker: async_sessionmaker[AsyncSession],
    settings: Settings,
    route: str,
    model: str,
    changes: dict[str, Any],
    *,
    actor: str,
    now: datetime | None = None,
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Patch a route's configuration (see :func:`configure_route` with ``replace=False``).

    Returns:
        ``(route, history_row)`` as the api returns them; ``history_row`` is None when nothing
        changed.

    Raises:
        UnknownRoute: no such (route, model).
        RouteConfigInvalid: an unknown field, or a value out of range (named in the message).
    """
    result = await configure_route(sessionmaker, settings, route, model, changes, replace=False, actor=actor, now=now)
    return result.route, result.history
