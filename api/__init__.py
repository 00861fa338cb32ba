"""hedgerow.api: the FastAPI service (ingest, thresholds with ETag, routes, history, health).

``create_app(settings)`` builds the app (its lifespan migrates the store and runs the controller
job under a lease); ``serve(settings)`` runs it with uvicorn.

The names are loaded on first use (PEP 562), so that importing a light submodule such as
``hedgerow.api.errors`` (the CLI does, to check its flags) does not import FastAPI, SQLAlchemy
and scipy with the app.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hedgerow._lazy import lazy_getattr

if TYPE_CHECKING:
    from hedgerow.api.app import create_app
    from hedgerow.api.errors import ApiConfigError, ApiError
    from hedgerow.api.server import serve, serve_async

__all__ = ["ApiConfigError", "ApiError", "create_app", "serve", "serve_async"]

_HOMES = {
    "ApiConfigError": "hedgerow.api.errors",
    "ApiError": "hedgerow.api.errors",
    "create_app": "hedgerow.api.app",
    "serve": "hedgerow.api.server",
    "serve_async": "hedgerow.api.server",
}


#: Imports the public name from its module on first access (PEP 562).
__getattr__ = lazy_getattr(globals(), _HOMES)


def __dir__() -> list[str]:
    return sorted(__all__)
