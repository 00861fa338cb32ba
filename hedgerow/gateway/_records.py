"""The gateway's record sink (``RecordLog``): every ``CallRecord`` of its calls is counted, logged
in one ``gateway_call`` line and handed on (to a ``TelemetryExporter`` or a store writer).

The caller's name (the name of its gateway key, :data:`CALLER`, set by the app around each
request) becomes the record's ``client``: the record is built inside the request's task or in
tasks it started, which see the request's context, so the race needs no parameter for it. The
calls explorer shows it per call; without keys ``client`` stays the transport's tag (the host).
The ``gateway_call`` line also names the caller's own ``X-Request-ID`` (``caller_request_id``,
None without one: :mod:`hedgerow.gateway._request_id`) beside the record's ``request_id``.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter
from contextvars import ContextVar

from hedgerow.client import CallRecord
from hedgerow.client.hedging import RecordSink
from hedgerow.gateway._request_id import CALLER_REQUEST_ID
from hedgerow.logs import event_line

__all__ = ["CALLER", "RecordLog"]

_log = logging.getLogger("hedgerow.gateway")

#: The name of the gateway key of the request being served in this context (None: no keys).
CALLER: ContextVar[str | None] = ContextVar("hedgerow_gateway_caller", default=None)


class RecordLog:
    """The gateway's record sink: counts each ``CallRecord`` by status, logs one line for it and
    hands it to ``inner`` (a ``TelemetryExporter``, or anything with ``submit``) when given.

    Args:
        inner: the next sink, or None (records are then only counted and logged).

    Attributes:
        counts: records per status (``ok``, ``failed``, ``cancelled``, ...).
        last: the most recent record, or None.
    """

    def __init__(self, inner: RecordSink | None = None) -> None:
        self.inner = inner
        self.counts: Counter[str] = Counter()
        self.last: CallRecord | None = None

    def submit(self, record: CallRecord) -> None:
        """Count, log and forward one record (never raises for the record's sake); with a
        :data:`CALLER` in this context, the record's ``client`` is set to it first."""
        caller = CALLER.get()
        if caller is not None and record.client != caller:
            record = dataclasses.replace(record, client=caller)
        self.counts[record.status] += 1
        self.last = record
        if self.inner is not None:
            self.inner.submit(record)
        if not _log.isEnabledFor(logging.INFO):
            return
        fields = {
            "request_id": record.request_id,
            "caller_request_id": CALLER_REQUEST_ID.get(),
            "route": record.route,
            "model": record.model,
            "client": record.client,
            "status": record.status,
            "winner": record.winner,
            "hedged": record.hedged,
            "ttft_s": None if record.ttft_s is None else round(record.ttft_s, 4),
        }
        _log.info(event_line("gateway_call", fields), extra={"event": "gateway_call", "fields": fields})
