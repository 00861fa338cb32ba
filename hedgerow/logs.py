"""Logging of the ``hedgerow serve`` process: level, text or JSON lines, and uvicorn's access log.

:func:`configure_logging` sets the root logger's level and a single stderr handler with
:class:`TextFormatter` (``2026-12-01T20:50:00.123Z INFO hedgerow.events threshold_changed
route=summarize ...``) or :class:`JsonFormatter` (one JSON object per line: ``ts``, ``level``,
``logger``, ``message``, and for events of :mod:`hedgerow.controller.events` ``event`` and its
fields). :func:`uvicorn_log_config` gives uvicorn the same handler, with its access log on or off.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any, Literal

__all__ = [
    "LOG_FORMATS",
    "JsonFormatter",
    "TextFormatter",
    "configure_logging",
    "event_line",
    "log_value",
    "uvicorn_log_config",
]

LogFormat = Literal["text", "json"]
#: The accepted ``--log-format`` values.
LOG_FORMATS: tuple[str, ...] = ("text", "json")


def _timestamp(record: logging.LogRecord) -> str:
    return datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


#: Characters that make a text log value need quotes: space, quote, ``=`` and backslash.
_NEEDS_QUOTES = frozenset(' "=\\')
_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escaped(char: str) -> str:
    if char in _ESCAPES:
        return _ESCAPES[char]
    if char.isprintable():
        return char
    code = ord(char)
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def log_value(value: Any) -> str:
    """One value of a text log line (``key=value``), quoted when it needs to be (logfmt style).

    Bare when non-empty and every character is printable and none is a space, ``"``, ``=`` or
    ``\\``; otherwise in double quotes with ``"`` and ``\\`` backslash-escaped, ``\\n``,
    ``\\r``, ``\\t``, and every other unprintable character (control, format, separator,
    non-ASCII space) as ``\\uXXXX``. So a value can neither end its field early, nor start a
    forged ``key=value``, nor break the line, nor reorder the text on screen.

    Args:
        value: the value (``str()`` of anything else: numbers, None, booleans).

    Returns:
        The text to put after ``key=``.
    """
    text = str(value)
    if text and text.isprintable() and not _NEEDS_QUOTES.intersection(text):
        return text
    return '"' + "".join(_escaped(char) for char in text) + '"'


def event_line(event: str, fields: dict[str, Any]) -> str:
    """``event key=value ...`` with each value through :func:`log_value` (the text of an event)."""
    return " ".join([event, *(f"{key}={log_value(value)}" for key, value in fields.items())])


def _message(record: logging.LogRecord) -> str:
    """The record's message as one safe line: an event's fields quoted (:func:`event_line`), any
    other message with its unprintable characters escaped (a newline in a name cannot start a
    forged line)."""
    event = getattr(record, "event", None)
    fields = getattr(record, "fields", None)
    if isinstance(event, str) and isinstance(fields, dict):
        return event_line(event, fields)
    text = record.getMessage()
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() or char == " " else _escaped(char) for char in text)


class TextFormatter(logging.Formatter):
    """``<UTC time> <LEVEL> <logger> <message>`` (plus the traceback, if any).

    The message is one line: an event's values are quoted where needed (:func:`log_value`), and
    any other message has its unprintable characters escaped; only a traceback adds lines.
    """

    def format(self, record: logging.LogRecord) -> str:
        """Render one record as a line."""
        line = f"{_timestamp(record)} {record.levelname} {record.name} {_message(record)}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        elif record.exc_text:  # a record forwarded from another process carries its traceback as text
            line += "\n" + record.exc_text
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ``ts``, ``level``, ``logger``, ``message``, ``event`` and fields."""

    def format(self, record: logging.LogRecord) -> str:
        """Render one record as a JSON line."""
        data: dict[str, Any] = {
            "ts": _timestamp(record),
            "level": record.levelname,
            "logger": record.name,
            "message": _message(record),
        }
        event = getattr(record, "event", None)
        if event is not None:
            data["event"] = event
            data.update(getattr(record, "fields", {}) or {})
        if record.exc_info:
            data["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:  # forwarded from another process (see TextFormatter)
            data["exception"] = record.exc_text
        return json.dumps(data, default=str)


def _formatter(fmt: str) -> logging.Formatter:
    if fmt not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}, got {fmt!r}")
    return JsonFormatter() if fmt == "json" else TextFormatter()


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """A stream handler that writes to whatever ``sys.stderr`` is when each record is emitted.

    A handler bound to the ``sys.stderr`` of the moment it was made keeps writing to that object
    after it is replaced and closed (a test runner's capture, a CLI runner); looking it up at
    emit time follows the replacement.
    """

    def __init__(self) -> None:
        logging.Handler.__init__(self)

    @property
    def stream(self) -> Any:
        """The current ``sys.stderr``."""
        return sys.stderr


def configure_logging(level: str = "info", fmt: str = "text") -> None:
    """Log at ``level`` and above to stderr in ``fmt`` (replaces the root logger's handlers).

    Args:
        level: ``debug``, ``info``, ``warning``, ``error`` or ``critical`` (any case).
        fmt: ``text`` or ``json``.

    Raises:
        ValueError: an unknown level or format (named in the message).
    """
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(f"log level must be one of debug, info, warning, error, critical, got {level!r}")
    handler = _StderrHandler()
    handler.setFormatter(_formatter(fmt))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(numeric)
    # their INFO lines say nothing an operator needs (httpx logs one line per request: every
    # upstream attempt of a gateway and every threshold poll)
    for noisy in ("apscheduler", "alembic", "httpx"):
        logging.getLogger(noisy).setLevel(max(numeric, logging.WARNING))


def uvicorn_log_config(level: str = "info", fmt: str = "text", *, access_log: bool = False) -> dict[str, Any]:
    """A ``logging.config.dictConfig`` for uvicorn: its loggers through our formatter.

    Args:
        level: as :func:`configure_logging`.
        fmt: ``text`` or ``json``.
        access_log: log one line per request (``uvicorn.access``).

    Returns:
        The configuration dict (``uvicorn.Config(log_config=...)``).
    """
    formatter = "hedgerow.logs.JsonFormatter" if fmt == "json" else "hedgerow.logs.TextFormatter"
    _formatter(fmt)
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"hedgerow": {"()": formatter}},
        "handlers": {
            "stderr": {"class": "logging.StreamHandler", "formatter": "hedgerow", "stream": "ext://sys.stderr"}
        },
        "loggers": {
            "uvicorn": {"handlers": ["stderr"], "level": level.upper(), "propagate": False},
            "uvicorn.error": {"handlers": ["stderr"], "level": level.upper(), "propagate": False},
            "uvicorn.access": {
                "handlers": ["stderr"] if access_log else [],
                "level": "INFO" if access_log else "CRITICAL",
                "propagate": False,
            },
        },
    }
