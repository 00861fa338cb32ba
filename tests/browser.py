"""A real headless Chromium for page tests (Debian's ``chromium`` package driven by Playwright).

``open_page()`` starts Chromium (``/usr/bin/chromium``, or ``$HEDGEROW_CHROMIUM``) through
Playwright's async API with the flags that keep it off the network (no background networking,
component updates or sync), opens a page and records every request the page makes, so a test can
assert that no request left 127.0.0.1. Playwright's own browser download is never used. Where
Chromium or Playwright is missing the test is skipped with a one-line reason (``.ci/run``
installs both).

Usage::

    async with open_page(viewport=(1280, 800)) as (page, requests):
        await page.goto(url)
        assert_local_only(requests)
"""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import pytest

if TYPE_CHECKING:
    from playwright.async_api import Page

__all__ = ["CHROMIUM_FLAGS", "assert_local_only", "chromium_path", "open_page"]

#: Flags that keep the browser from reaching out on its own (this machine has no internet).
CHROMIUM_FLAGS = (
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
)
#: Schemes of requests that never leave the machine.
LOCAL_SCHEMES = {"data", "blob", "about"}
LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1"}


def chromium_path() -> Path | None:
    """The Chromium binary: ``$HEDGEROW_CHROMIUM``, else ``chromium`` on PATH; None when absent."""
    configured = os.environ.get("HEDGEROW_CHROMIUM", "").strip()
    found = configured or shutil.which("chromium") or shutil.which("chromium-browser")
    return Path(found) if found and Path(found).exists() else None


@asynccontextmanager
async def open_page(viewport: tuple[int, int] = (1280, 800), **context: Any) -> AsyncIterator[tuple[Page, list[str]]]:
    """A new page in a fresh headless Chromium, and the list of every URL it requested.

    Args:
        viewport: width and height in CSS pixels (1280x800 desktop; e.g. 390x844 for a phone).
        context: more ``browser.new_context`` arguments (``is_mobile=True``, ``extra_http_headers``).

    Yields:
        ``(page, requests)``: a Playwright ``Page`` and the URLs requested so far (appended live).
    """
    binary = chromium_path()
    if binary is None:
        pytest.skip("Chromium not found (apt-get install chromium, or set HEDGEROW_CHROMIUM)")
    try:
        from playwright.async_api import async_playwright
    except ImportError:
        pytest.skip("playwright is not installed (pip install -e '.[dev]')")
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=str(binary), args=list(CHROMIUM_FLAGS))
        try:
            ctx = await browser.new_context(viewport={"width": viewport[0], "height": viewport[1]}, **context)
            page = await ctx.new_page()
            requests: list[str] = []
            page.on("request", lambda request: requests.append(request.url))
            yield page, requests
        finally:
            await browser.close()


def assert_local_only(requests: list[str]) -> None:
    """Fail when any URL in ``requests`` would leave the machine (not loopback, data:, blob:, about:)."""
    outside = []
    for url in requests:
        parts = urlsplit(url)
        if parts.scheme in LOCAL_SCHEMES:
            continue
        if parts.hostname not in LOCAL_HOSTS:
            outside.append(url)
    assert not outside, f"requests left the machine: {outside}"
