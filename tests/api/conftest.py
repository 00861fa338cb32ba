"""Fixtures of the api tests: the app with its lifespan running, and an httpx client on it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from hedgerow.api.app import create_app
from hedgerow.settings import Settings

#: The ``make_api`` fixture: ``make_api(**settings overrides)`` is an async context of ``(app, client)``.
MakeApi = Callable[..., AbstractAsyncContextManager[tuple[FastAPI, httpx.AsyncClient]]]


@pytest.fixture
def make_api(database_url: str) -> MakeApi:
    """A factory of (app, client) contexts on ``database_url``; the lifespan runs for real.

    The controller's scheduled tick is far away (1 h) so tests tick explicitly through
    ``POST /v1/controller/run``.
    """
    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def factory(**overrides: Any) -> AsyncIterator[tuple[FastAPI, httpx.AsyncClient]]:
        values = {
            "database_url": database_url,
            "controller_interval_s": 3600.0,
            "allowed_hosts": "hedgerow.test",
            **overrides,
        }
        app = create_app(Settings(**values))
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://hedgerow.test") as client:
                yield app, client

    return factory


@pytest.fixture
async def api(make_api: MakeApi) -> AsyncIterator[httpx.AsyncClient]:
    """An httpx client on a running app with default settings (no auth)."""
    async with make_api() as (_app, client):
        yield client
