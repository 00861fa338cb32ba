"""The end of one hedged call, shared by the streamed driver (:mod:`hedgerow.client._call_stream`)
and the whole-response driver (:mod:`hedgerow.client.unary`): once every attempt task has ended
(each driver waits with :func:`~hedgerow.client._attempt_io.wait_tasks_shielded`), the call's one
record is built from the race and handed to the telemetry sink.

A sink that raises is logged (logger ``hedgerow.client``) and never becomes the call's error: the
caller's answer does not depend on telemetry.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hedgerow.client._race import Race
    from hedgerow.client.hedging import RecordSink
    from hedgerow.client.records import CallRecord

__all__ = ["submit_record"]

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
