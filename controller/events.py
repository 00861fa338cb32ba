"""Structured log lines of the events the ops team reads: one line per event, logger ``hedgerow.events``.

Each helper logs one INFO (or WARNING) record whose ``event`` names it and whose ``fields`` carry
its values; :mod:`hedgerow.logs` renders them as ``event key=value ...`` (text) or one JSON object
per line (json). Events:

=========================  ==============================================================
event                      fields
=========================  ==============================================================
threshold_changed          route, model, from_s, to_s, reason, source, version?, actor
flag_raised / flag_cleared route, model, flag
lease_acquired / lost      lease, holder
ingest_rejected            records, index, field, message (the first error)
report_delivered / failed  week, destination, detail
=========================  ==============================================================
"""

from __future__ import annotations

import logging
from typing import Any

__all__ = [
    "EVENT_LOGGER",
    "log_event",
    "log_flag_changes",
    "log_lease_change",
    "log_rejected_batch",
    "log_report_delivery",
    "log_threshold_change",
]

#: The name of the events' logger.
EVENT_LOGGER = "hedgerow.events"
_log = logging.getLogger(EVENT_LOGGER)


def log_event(event: str, level: int = logging.INFO, **fields: Any) -> None:
    """Log one structured line: ``event`` and its ``fields`` (JSON-serialisable values)."""
    text = " ".join([event, *(f"{key}={value}" for key, value in fields.items())])
    _log.log(level, text, extra={"event": event, "fields": fields})


def log_threshold_change(row: dict[str, Any]) -> None:
    """Log an applied threshold change from its history row (as the api returns it)."""
    log_event(
        "threshold_changed",
        route=row["route"],
        model=row["model"],
        from_s=row["previous_hedge_after_s"],
        to_s=row["hedge_after_s"],
        reason=row["reason"],
        source=row["source"],
        actor=row.get("actor") or "controller",
    )


def log_flag_changes(route: str, model: str, before: list[str], after: list[str]) -> None:
    """Log each flag raised (in ``after`` only) or cleared (in ``before`` only) for (route, model)."""
    for flag in after:
        if flag not in before:
            log_event("flag_raised", logging.WARNING, route=route, model=model, flag=flag)
    for flag in before:
        if flag not in after:
            log_event("flag_cleared", route=route, model=model, flag=flag)


def log_lease_change(lease: str, holder: str, held: bool, *, released: bool = False) -> None:
    """Log that this process (``holder``) acquired (``held``), lost or gave up the lease ``lease``.

    ``lease_lost`` (a renewal failed or another process took it over: worth an alert) and
    ``lease_released`` (``released``: this process handed it back on a clean shutdown, as every
    deploy does) are separate events.
    """
    event = "lease_acquired" if held else ("lease_released" if released else "lease_lost")
    log_event(event, lease=lease, holder=holder)


def log_rejected_batch(records: int, first_error: dict[str, Any]) -> None:
    """Log a refused ingest batch: how many records it held and its first error."""
    log_event(
        "ingest_rejected",
        logging.WARNING,
        records=records,
        index=first_error.get("index"),
        field=first_error.get("field"),
        message=first_error.get("message"),
    )


def log_report_delivery(week: str, destination: str, *, ok: bool, detail: str = "") -> None:
    """Log a report delivery (file written or webhook posted) or its failure.

    Args:
        week: the ISO week, e.g. ``2026-W48``.
        destination: the file path or webhook url (without credentials).
        ok: whether it was delivered.
        detail: e.g. the HTTP status or the error.
    """
    log_event(
        "report_delivered" if ok else "report_failed",
        logging.INFO if ok else logging.WARNING,
        week=week,
        destination=destination,
        detail=detail,
    )
