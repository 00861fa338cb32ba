"""One way of the demo: its workload replayed through a hedging client, the records it made.

:func:`replay_way` sends the workload's calls at their arrival times through a
:class:`~hedgerow.client.HedgingClient` set up for the way (``none``: no backups; ``fixed`` and
``adaptive``: the budget bucket; ``adaptive`` polls the api's thresholds), applies the change of
conditions half way, and keeps a copy of every record it exports (:class:`Recorder`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from hedgerow.client import (
    CallRecord,
    HedgeError,
    HedgePolicy,
    HedgingClient,
    TelemetryExporter,
    ThresholdPoller,
    Upstream,
)
from hedgerow.sim._demo_io import MODEL
from hedgerow.sim.trace import TraceRequest

if TYPE_CHECKING:
    from hedgerow.sim.demo import DemoConfig

__all__ = ["Recorder", "Replayed", "replay_way"]


class Recorder:
    """Keeps this process's copy of each record and forwards it to the exporter."""

    def __init__(self, exporter: TelemetryExporter) -> None:
        self.exporter = exporter
        self.records: list[CallRecord] = []

    def submit(self, record: CallRecord) -> None:
        """Keep ``record`` and pass it on to the exporter."""
        self.records.append(record)
        self.exporter.submit(record)


@dataclass(frozen=True, slots=True)
class Replayed:
    """What one way's replay left: its records, the threshold it last polled (adaptive only), the
    records the api refused, and when the change of conditions was in force (aware UTC, or None)."""

    records: list[CallRecord]
    polled_hedge_after_s: float | None
    rejected: int
    change_at: datetime | None


async def replay_way(
    mode: str,
    workload: list[TraceRequest],
    upstreams: list[Upstream],
    config: DemoConfig,
    api_url: str,
    on_done: Callable[[], None],
    hedge_after_s: float,
    change: Callable[[], Any],
) -> Replayed:
    """Replay ``workload`` through one way's hedging client, calling ``change`` halfway.

    Args:
        hedge_after_s: the policy's threshold (the fixed way's value; the adaptive way's
            fallback until the poller has a table).
        change: an async callable that applies the change of conditions, awaited just before
            the call at ``config.change_index`` is sent.

    Returns:
        The way's records, the threshold it last polled (adaptive way only), how many records
        the api refused, and the moment the change was in force (aware UTC; None without one).
    """
    if mode == "none":
        policy = HedgePolicy(hedge_after_s=hedge_after_s, max_backups=0, total_timeout_s=300)
    else:
        policy = HedgePolicy(
            hedge_after_s=hedge_after_s, budget=config.budget, budget_burst=config.budget_burst, total_timeout_s=300
        )
    route = f"demo-{mode}"
    poller = ThresholdPoller(api_url, interval_s=1.0, max_stale_s=30.0) if mode == "adaptive" else None
    exporter = TelemetryExporter(api_url, batch_size=200, flush_interval_s=1.0)
    recorder = Recorder(exporter)
    exporter.start()
    if poller is not None:
        await poller.start()
    final: float | None = None
    change_at: datetime | None = None
    try:
        async with HedgingClient(
            upstreams, route=route, policy=policy, thresholds=poller, telemetry=recorder, client_tag=f"demo-{mode}"
        ) as client:

            async def one(i: int, req: TraceRequest) -> None:
                body = {
                    "model": MODEL,
                    "messages": [{"role": "user", "content": f"request {i}"}],
                    "max_tokens": req.output_tokens
                    if config.max_output_tokens is None
                    else min(req.output_tokens, config.max_output_tokens),
                    "hedgerow_prompt_tokens": req.prompt_tokens,
                }
                try:
                    async with client.stream_chat(body, primary=i % len(upstreams)) as stream:
                        async for _ in stream:
                            pass
                except HedgeError:
                    pass  # the record says what happened
                finally:
                    on_done()

            start = time.monotonic()
            tasks = []
            middle = config.change_index(len(workload))
            for i, req in enumerate(workload):
                delay = start + req.arrival_s - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                if i == middle:
                    await change()
                    change_at = datetime.now(UTC)
                tasks.append(asyncio.create_task(one(i, req)))
            await asyncio.gather(*tasks)
            if poller is not None:
                found = poller.lookup(route, MODEL)
                final = found[0] if found else None
    finally:
        if poller is not None:
            await poller.aclose()
        await exporter.aclose(timeout_s=30.0)
    return Replayed(recorder.records, final, exporter.rejected, change_at)
