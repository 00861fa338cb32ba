"""FastAPI dependencies shared by the routers: the settings and a database session."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.ext.asyncio import AsyncSession

from hedgerow.api._state import app_state
from hedgerow.settings import Settings

__all__ = ["SessionDep", "SettingsDep", "get_session", "get_settings"]


async def get_session(request: Request) -> AsyncIterator[AsyncSession]:
    """A session of the app's store, closed after the request (the handler commits)."""
    async with app_state(request.app).sessionmaker() as session:
        yield session


def get_settings(request: Request) -> Settings:
    """The app's ``hedgerow.settings.Settings``."""
    return app_state(request.app).settings


#: A handler's database session (``session: SessionDep``), as :func:`get_session` gives it.
SessionDep = Annotated[AsyncSession, Depends(get_session)]
#: A handler's settings (``settings: SettingsDep``), as :func:`get_settings` gives them.
SettingsDep = Annotated[Settings, Depends(get_settings)]
