"""A real HTTP webhook receiver on 127.0.0.1 for the report delivery tests.

``WebhookReceiver(fail_first=2)`` answers 503 to its first two POSTs and 200 afterwards; every
request body is kept (``bodies``), in arrival order, with the status it was answered with
(``statuses``). Runs a ``ThreadingHTTPServer`` in a thread; use it as a context manager.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["WebhookReceiver"]


class WebhookReceiver:
    """A webhook on ``url`` that fails ``fail_first`` times (HTTP ``fail_status``), then accepts."""

    def __init__(self, fail_first: int = 0, fail_status: int = 503) -> None:
        self.fail_first = fail_first
        self.fail_status = fail_status
        self.bodies: list[Any] = []
        self.statuses: list[int] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", "0"))
                body = json.loads(self.rfile.read(length) or b"null")
                with receiver._lock:
                    status = receiver.fail_status if len(receiver.bodies) < receiver.fail_first else 200
                    receiver.bodies.append(body)
                    receiver.statuses.append(status)
                self.send_response(status)
                self.send_header("content-length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, format: str, *args: Any) -> None:
                return None

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/hook"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def delivered(self) -> list[Any]:
        """The bodies answered with a 2xx."""
        with self._lock:
            return [b for b, s in zip(self.bodies, self.statuses, strict=True) if 200 <= s < 300]

    def __enter__(self) -> WebhookReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
