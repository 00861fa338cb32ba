"""hedgerow.api: the FastAPI service (ingest, thresholds with ETag, routes, history, health).

``create_app(settings)`` builds the app (its lifespan migrates the store and runs the controller
job under a lease); ``serve(settings)`` runs it with uvicorn.
"""

from hedgerow.api.app import create_app
from hedgerow.api.errors import ApiConfigError, ApiError
from hedgerow.api.server import serve, serve_async

__all__ = ["ApiConfigError", "ApiError", "create_app", "serve", "serve_async"]
