"""What a request answers when the store cannot be reached: 503 naming the store, one log line.

A database that goes away (stopped, refusing connections, its connections terminated) makes every
query raise an error of the driver or of the connection pool: SQLAlchemy's ``DBAPIError`` family,
its pool ``TimeoutError``, or a bare ``OSError`` from the socket. Not every such error means the
store is down (a constraint violation is a ``DBAPIError`` too), so :func:`store_unavailable`
first reads the error's SQLSTATE: a server that refused or dropped the connection, or ran out of
a resource (class ``08``, class ``53`` such as ``53300`` "too many clients already", ``57P01``-
``57P03``: shut down or starting) is unavailable for this request, whatever a check made a moment
later finds (a connection slot may have freed meanwhile). For any other error it asks the store
itself, as ``GET /readyz`` does (``controller.db.check_ready``, bounded by
:data:`CHECK_TIMEOUT_S`). A refused connection, or an error the check confirms (it fails too),
answers

- ``503`` with ``{"detail": {"field": "database", "message": ...}}`` and ``Retry-After: 5``
  (the api's error shape), or the console's error page for a page under ``/ui``;
- one warning line in the log (the method, the path and the check's reason), not a traceback
  per request;

and otherwise the error goes on as the bug it is (a 500 with its traceback). ``GET
/v1/thresholds`` keeps serving the table it rendered last (``_threshold_cache``) and ``/metrics``
keeps serving this process's own series (``metrics``), each with ``hedgerow_store_up`` at 0.
"""

from __future__ import annotations

import asyncio
import logging

from fastapi import Request
from fastapi.responses import Response
from sqlalchemy.exc import SQLAlchemyError

from hedgerow.api._page_kit import error_page
from hedgerow.api._state import app_state
from hedgerow.api.json_body import error_response
from hedgerow.client.errors import describe
from hedgerow.controller.errors import StoreNotReady
from hedgerow.controller.store.db import check_ready

__all__ = [
    "CHECK_TIMEOUT_S",
    "REFUSED_SQLSTATES",
    "STORE_ERRORS",
    "UNAVAILABLE_MESSAGE",
    "is_store_down",
    "refused_by_server",
    "store_unavailable",
]

log = logging.getLogger(__name__)

#: The exceptions a query raises when the store may be down (checked before answering 503).
STORE_ERRORS: tuple[type[Exception], ...] = (SQLAlchemyError, OSError)
#: SQLSTATE prefixes of a PostgreSQL server that refused or lost the request's connection, or ran
#: out of a resource (connections, memory, disk): the request could not be served, retry later.
REFUSED_SQLSTATES: tuple[str, ...] = ("08", "53", "57P01", "57P02", "57P03")
#: Seconds the readiness check may take before the store counts as down.
CHECK_TIMEOUT_S = 2.0
#: What a client is told (the database's own error, which may name hosts and users, is logged).
UNAVAILABLE_MESSAGE = "the store is unavailable: database unreachable or not migrated (details in the server log)"


async def is_store_down(request: Request) -> str | None:
    """Why the app's store cannot serve now (``check_ready``'s reason), or None when it can."""
    try:
        await asyncio.wait_for(check_ready(app_state(request.app).engine), CHECK_TIMEOUT_S)
    except StoreNotReady as exc:
        return str(exc)
    except TimeoutError:
        return f"database did not answer within {CHECK_TIMEOUT_S:g} s"
    return None


def refused_by_server(exc: Exception) -> str | None:
    """Why the server refused or lost ``exc``'s connection (its SQLSTATE is one of
    :data:`REFUSED_SQLSTATES`), or None for any other error."""
    state = getattr(getattr(exc, "orig", None), "sqlstate", None)
    if isinstance(state, str) and state.startswith(REFUSED_SQLSTATES):
        return f"the database server refused or lost the connection (SQLSTATE {state})"
    return None


async def store_unavailable(request: Request, exc: Exception) -> Response:
    """The app's handler of :data:`STORE_ERRORS` (see the module docstring).

    Raises:
        Exception: ``exc`` again when the store answers (the error is not an outage).
    """
    reason = refused_by_server(exc) or await is_store_down(request)
    if reason is None:
        raise exc
    log.warning("%s %s: %s (%s)", request.method, request.url.path, reason, describe(exc))
    if request.url.path.startswith("/ui"):
        return error_page(request, None, 503, UNAVAILABLE_MESSAGE)
    return error_response(503, "database", UNAVAILABLE_MESSAGE, {"Retry-After": "5"})
