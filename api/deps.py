"""FastAPI dependencies shared by the routers: the settings and a database session."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from sqlalchemy.ext.asyncio import AsyncSession

__all__ = ["get_session", "get_settings"]


async def get_session(request: Request) -> AsyncIterator[AsyncSession]:
    """A session of the app's store, closed after the request (the handler commits)."""
    async with request.app.state.sessionmaker() as session:
        yield session


def get_settings(request: Request) -> Any:
    """The app's ``hedgerow.settings.Settings``."""
    return request.app.state.settings
