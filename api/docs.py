"""``/docs``: Swagger UI served from this machine, so the api's docs work offline.

The Swagger UI files (JavaScript, CSS, favicon) come from the ``fastapi-offline`` package, which
vendors them; they are served at ``/docs/static/`` and the page loads nothing from outside (the
online validator badge is off). FastAPI's own ``/docs`` and ``/redoc`` (which load from a CDN)
are turned off in :func:`hedgerow.api.app.create_app`.
"""

from __future__ import annotations

from pathlib import Path

import fastapi_offline
from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

__all__ = ["SWAGGER_STATIC", "install_docs"]

#: The folder of the vendored Swagger UI files.
SWAGGER_STATIC = Path(fastapi_offline.__file__).parent / "static"


def install_docs(app: FastAPI) -> None:
    """Serve Swagger UI at ``/docs`` from local files (``/docs/static/...``).

    Args:
        app: the api, created with ``docs_url=None`` and ``redoc_url=None``.
    """
    app.mount("/docs/static", StaticFiles(directory=SWAGGER_STATIC), name="docs-static")

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=app.openapi_url or "/openapi.json",
            title=f"{app.title}: API docs",
            swagger_js_url="/docs/static/swagger-ui-bundle.js",
            swagger_css_url="/docs/static/swagger-ui.css",
            swagger_favicon_url="/docs/static/favicon.png",
            swagger_ui_parameters={"validatorUrl": None},
        )
