"""Pieces shared by the client's background tasks (``ThresholdPoller``, ``TelemetryExporter``).

Both talk to the hedgerow api over their own ``httpx.AsyncClient``, run one asyncio task, and
must stop cleanly. Kept here once so that both validate and shut down the same way.
"""

from __future__ import annotations

import asyncio
import math

import httpx

__all__ = ["api_client", "cancel_and_wait", "check_api_url", "check_seconds"]


def check_api_url(api_url: object) -> str:
    """Return ``api_url`` without a trailing slash.

    Raises:
        ValueError: when it is not an http(s) URL.
    """
    if not isinstance(api_url, str) or not api_url.startswith(("http://", "https://")):
        raise ValueError(f"api_url: must be an http(s) URL, got {api_url!r}")
    return api_url.rstrip("/")


def check_seconds(name: str, value: object) -> float:
    """Return ``value`` as float seconds.

    Raises:
        ValueError: naming ``name`` unless ``value`` is a finite number > 0.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name}: must be a finite number of seconds > 0, got {value!r}")
    return float(value)


def api_client(token: str | None, timeout_s: float, transport: httpx.AsyncBaseTransport | None) -> httpx.AsyncClient:
    """An ``httpx.AsyncClient`` for the api: bearer ``token`` if given, one timeout of ``timeout_s`` s."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.AsyncClient(headers=headers, timeout=timeout_s, transport=transport)


async def cancel_and_wait(task: asyncio.Task[None] | None) -> None:
    """Cancel ``task`` (if any) and wait until it has ended.

    The task's own ``CancelledError`` is absorbed; any other exception it ended with is raised.
    A cancellation of the *caller* while it waits is not absorbed: it propagates at once (the
    task, already cancelled, finishes on its own).
    """
    if task is None:
        return
    task.cancel()
    await asyncio.wait({task})
    if not task.cancelled():
        task.result()
