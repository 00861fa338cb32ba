"""Errors raised by the store and the controller job.

::

    ControllerError
    ├── StoreError       bad database url or unusable store
    │   └── StoreNotReady   database unreachable or not migrated to head
    ├── UnknownRoute     no such (route, model)
    ├── AmbiguousModel   a route named without its model has several models
    ├── LeaseHeld        another process holds the lease a one-off job needs
    ├── RouteLimitExceeded   a new (route, model) past ``max_routes`` or ``max_models_per_route``
    └── RouteArchived    the (route, model) was archived: records refused, changes need a restore
"""

from __future__ import annotations

from datetime import datetime

__all__ = [
    "AmbiguousModel",
    "ControllerError",
    "LeaseHeld",
    "RouteArchived",
    "RouteLimitExceeded",
    "StoreError",
    "StoreNotReady",
    "UnknownRoute",
]


class ControllerError(Exception):
    """Root of the errors raised on purpose by ``hedgerow.controller``."""


class StoreError(ControllerError):
    """The database url is malformed or unsupported, or the store cannot be used."""


class StoreNotReady(StoreError):
    """The database cannot be reached or is not migrated to the newest revision."""


class UnknownRoute(ControllerError, LookupError):
    """No route row exists for the (route, model) asked for.

    Args:
        route: the route name.
        model: the model name.
        message: a more precise message (e.g. the route exists but has no threshold yet).
    """

    def __init__(self, route: str, model: str, message: str | None = None) -> None:
        self.route = route
        self.model = model
        super().__init__(message or f"unknown route {route!r} with model {model!r}")


class AmbiguousModel(ControllerError, ValueError):
    """A route was named without ``model`` but has several models, so the model must be given.

    Args:
        route: the route name.
        models: the route's models, sorted.
    """

    def __init__(self, route: str, models: list[str]) -> None:
        self.route = route
        self.models = models
        super().__init__(f"route {route!r} has {len(models)} models ({', '.join(models)}): give model")


class RouteLimitExceeded(ControllerError, ValueError):
    """Creating (route, model) would pass a configured bound on the number of routes.

    Args:
        route: the route name that would be created.
        model: its model.
        field: ``route`` (the store holds ``max_routes`` (route, model) rows) or ``model`` (the
            route has ``max_models_per_route`` models).
        limit: the bound that would be passed.
        action: what was not done, for the message (``created``, or ``restored`` for an
            archived route brought back).
    """

    def __init__(self, route: str, model: str, field: str, limit: int, action: str = "created") -> None:
        self.route = route
        self.model = model
        self.field = field
        self.limit = limit
        if field == "model":
            text = f"route {route!r} already has {limit} models (max_models_per_route): model {model!r} not {action}"
        else:
            text = (
                f"the store already has {limit} routes (max_routes): route {route!r} with model {model!r} not {action}"
            )
        super().__init__(text)


class RouteArchived(ControllerError, ValueError):
    """The (route, model) was archived by an operator: its records and changes are refused.

    Args:
        route: the route name.
        model: its model.
        archived_at: when it was archived (aware UTC).
        field: the field the api's answer names (``route``).
    """

    def __init__(self, route: str, model: str, archived_at: datetime, field: str = "route") -> None:
        self.route = route
        self.model = model
        self.archived_at = archived_at
        self.field = field
        super().__init__(
            f"route {route!r} with model {model!r} is archived (since {archived_at:%Y-%m-%d %H:%M:%S} UTC):"
            f" its records and changes are refused; restore it first (`hedgerow routes restore {route} --model {model}`"
            f' or PATCH /v1/routes/{route}?model={model} with {{"archived": false}})'
        )


class LeaseHeld(ControllerError):
    """Another process holds the lease a one-off job needs (``hedgerow controller run-once``).

    Attributes:
        lease: the lease's name (``controller``).
        holder: who holds it (``host:pid:random``), or None when it was released meanwhile.
        expires_at: when its hold ends unless renewed (aware UTC), or None.
    """

    def __init__(self, lease: str, holder: str | None, expires_at: datetime | None) -> None:
        self.lease = lease
        self.holder = holder
        self.expires_at = expires_at
        who = f"held by {holder} until {expires_at:%Y-%m-%d %H:%M:%S} UTC" if holder and expires_at else "held"
        super().__init__(
            f"the {lease} lease is {who}: a running `hedgerow serve` ticks every interval itself;"
            " nothing was ticked (POST /v1/controller/run ticks on that process now)"
        )
