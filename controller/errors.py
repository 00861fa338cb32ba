"""Errors raised by the store and the controller job.

::

    ControllerError
    ├── StoreError       bad database url or unusable store
    │   └── StoreNotReady   database unreachable or not migrated to head
    ├── UnknownRoute     no such (route, model)
    └── AmbiguousModel   a route named without its model has several models
"""

from __future__ import annotations

__all__ = ["AmbiguousModel", "ControllerError", "StoreError", "StoreNotReady", "UnknownRoute"]


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
