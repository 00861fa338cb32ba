"""The end of one hedged call, shared by the streamed driver (:mod:`hedgerow.client._call_stream`)
and the whole-response driver (:mod:`hedgerow.client.unary`): once every attempt task has ended
(:func:`~hedgerow.client._attempt_io.wait_tasks_shielded`: never ``gather``), the call's one record
is built from the race and handed to the telemetry sink (:func:`end_call`), even when the caller is
cancelled during the wait.

A sink that raises is logged (logger ``hedgerow.client``) and never becomes the call's error: the
caller's answer does not depend on telemetry.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from hedgerow.client._attempt_io import wait_tasks_shielded

if TYPE_CHECKING:
    from hedgerow.client._race import Race
    from hedgerow.client.hedging import RecordSink
    from hedgerow.client.records import CallRecord

__all__ = ["end_call", "submit_record"]

log = logging.getLogger("hedgerow.client")


def submit_record(race: Race, telemetry: RecordSink | None) -> CallRecord:
    """Build the call's record (:meth:`Race.record`) and hand it to ``telemetry``.

    Args:
        race: the call's race, abandoned or over.
        telemetry: the sink of finished records, or None for none.

    Returns:
        The record, whether or not the sink took it.
    """
    record = race.record()
    if telemetry is not None:
        try:
            telemetry.submit(record)
        except Exception:  # telemetry must never break a call
            log.exception("telemetry sink refused a record")
    return record


async def end_call(
    tasks: Sequence[asyncio.Future[Any]],
    race: Race,
    telemetry: RecordSink | None,
    keep: Callable[[CallRecord], None],
) -> None:
    """Wait for every attempt task to end, then :func:`submit_record` and give the record to ``keep``.

    Never ``gather``: a cancellation of the caller would cancel the attempts a second time, which
    can abort httpcore's close of a connection half-way (see ``wait_tasks_shielded``). The record
    is built and kept even when the wait is cancelled; the cancellation then goes on.

    Args:
        tasks: the call's attempt tasks, each already cancelled where it had to stop.
        race: the call's race, abandoned or over.
        telemetry: the sink of finished records, or None.
        keep: stores the record on the driver (called once).

    Raises:
        asyncio.CancelledError: the caller was cancelled while the tasks ended.
    """
    try:
        await wait_tasks_shielded(tasks)
    finally:
        keep(submit_record(race, telemetry))
