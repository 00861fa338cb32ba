"""Helpers shared by several test modules: free ports, a telemetry sink, a normal answer stream.

Fixtures live in the ``conftest.py`` files; plain functions and classes that more than one test
module needs live here, once.
"""

from __future__ import annotations

import random
import socket
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta
from typing import Any

from sqlalchemy import URL, text
from sqlalchemy.ext.asyncio import create_async_engine

from hedgerow.client import CallRecord
from tests.client.scripted_server import Script, chunk, sse, usage_chunk

__all__ = ["BODY", "Sink", "answer", "free_port", "recent_calls"]

#: The smallest chat-completions body the client accepts.
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (bound to port 0, then released).

    Nothing listens on it afterwards, so it also serves as a "connection refused" upstream.
    """
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Sink:
    """A telemetry sink that keeps every record it is given (``records``, in submission order)."""

    def __init__(self) -> None:
        self.records: list[CallRecord] = []

    def submit(self, record: CallRecord) -> None:
        """Keep ``record``."""
        self.records.append(record)


def answer(
    first_delay_s: float = 0.0,
    gap_s: float = 0.01,
    words: int = 3,
    *,
    close: bool = True,
    prompt_tokens: int = 7,
) -> Script:
    """A normal OpenAI-style stream: ``words`` tokens ``"w0 w1 ..."``, finish ``stop``, usage, ``[DONE]``.

    Args:
        first_delay_s: seconds before the first token (the role chunk carries it).
        gap_s: seconds between consecutive chunks.
        words: completion tokens (one word each).
        close: close the connection after ``[DONE]`` (False: keep it open until the client closes).
        prompt_tokens: the usage chunk's ``prompt_tokens``.
    """
    chunks = [chunk("w0 ", role="assistant")] + [chunk(f"w{i} ") for i in range(1, words)]
    chunks += [chunk(finish="stop"), usage_chunk(prompt_tokens, words)]
    return Script(pieces=sse(*chunks, gap_s=gap_s, first_delay_s=first_delay_s), close=close)


def recent_calls(
    call_factory: Callable[..., CallRecord], prefix: str, n: int, ttft_s: float, route: str = "summarize"
) -> list[dict[str, Any]]:
    """``n`` wire-format records of unhedged calls in the last 10 minutes, request ids ``<prefix><i>``.

    Each primary's TTFT is ``ttft_s`` times a factor drawn uniformly from [0.5, 1.5] (seeded by
    ``prefix``, so the same arguments give the same records).
    """
    rng = random.Random(prefix)
    now = datetime.now(UTC)
    return [
        call_factory(
            f"{prefix}{i}",
            route=route,
            started_at=now - timedelta(seconds=rng.uniform(1, 600)),
            primary_ttft_s=ttft_s * rng.uniform(0.5, 1.5),
        ).to_dict()
        for i in range(n)
    ]


async def drop_day_partitions(url: URL, day: date) -> None:
    """Drop one day's ``attempts`` and ``calls`` partitions from a connection of its own.

    Stands for another process (an operator, another ``serve``) dropping a day that this
    process's caches still hold; PostgreSQL only.

    Args:
        url: the store's SQLAlchemy URL (``engine.url``); day: the UTC day whose partitions go.
    """
    from hedgerow.controller.store.partitions import partition_name

    other = create_async_engine(url)
    try:
        async with other.begin() as connection:
            await connection.execute(text(f"DROP TABLE {partition_name('attempts', day)}"))
            await connection.execute(text(f"DROP TABLE {partition_name('calls', day)}"))
    finally:
        await other.dispose()


async def stored_calls(url: str) -> int:
    """How many calls the store at ``url`` (a SQLAlchemy async URL) holds, read on an engine of its own."""
    from hedgerow.controller.store.db import make_engine

    engine = make_engine(url)
    try:
        async with engine.connect() as connection:
            return int((await connection.execute(text("SELECT count(*) FROM calls"))).scalar_one())
    finally:
        await engine.dispose()


async def store_revision(url: str) -> str:
    """The revision of the store at ``url`` once ``check_ready`` finds it at head, read on an
    engine of its own.

    Raises:
        hedgerow.controller.errors.StoreNotReady: as ``check_ready`` (unreachable, or at another
            revision than head).
    """
    from hedgerow.controller.store.db import check_ready, make_engine

    engine = make_engine(url)
    try:
        return await check_ready(engine)
    finally:
        await engine.dispose()
