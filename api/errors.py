"""Errors of the api package.

::

    ApiError
    └── ApiConfigError   settings that make the server unsafe or impossible to start
"""

from __future__ import annotations

__all__ = ["ApiConfigError", "ApiError"]


class ApiError(Exception):
    """Root of the errors raised on purpose by ``hedgerow.api``."""


class ApiConfigError(ApiError, ValueError):
    """Bad server settings (malformed tokens, no tokens on a non-loopback host, ...)."""
