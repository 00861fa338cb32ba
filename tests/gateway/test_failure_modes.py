"""Every row of the race's failure-mode table (``hedgerow.client.hedging``), through the gateway.

The library's rows are tested in ``tests/client/test_failure_modes.py``; here the same upstream
behaviours sit behind ``hedgerow gateway`` (served by uvicorn on loopback) and a plain HTTP
caller streams a chat completion. Each row checks what the caller sees (status, the
``X-Hedgerow-Winner`` header, the body's text or OpenAI error) and the call's record (status,
error type, each attempt's outcome and error type), so the gateway keeps every outcome of the
race: a failure before the first token is invisible to the caller, one after it ends the stream
with an error event.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from hedgerow.client import CallRecord, HedgePolicy, Upstream
from hedgerow.gateway import GatewayApp
from tests.client.scripted_server import Script, ScriptedServer, chunk, sse
from tests.client.test_failure_modes import ENDLESS_LINE, full_backlog_listener
from tests.gateway.conftest import GatewayServer, one_route
from tests.helpers import Sink, answer, free_port

STREAM = {"model": "gpt-fast", "messages": [{"role": "user", "content": "hi"}], "stream": True}


def error_body(status: int, message: str) -> Script:
    body = {"error": {"message": message, "type": "server_error", "param": None, "code": None}}
    return Script(status=status, content_type="application/json", pieces=[(0, json.dumps(body).encode())])


@dataclass(frozen=True)
class Row:
    """One row: the primary's and the backup's behaviour, the policy, and what must follow.

    ``primary``/``backup``: a ``Script``, ``"refused"`` (a closed port) or ``"hanging"`` (a
    connect that never completes); ``backup`` None for a single upstream.
    """

    primary: Any
    backup: Any
    status: int
    winner: str
    record_status: str
    record_error: str | None
    attempts: list[tuple[str, str, str | None]]
    text: str | None = "w0 w1 w2 "
    error_event: bool = False
    policy: dict[str, Any] = field(default_factory=dict)


ROWS: dict[str, Row] = {
    "connection_refused": Row(
        "refused", answer(), 200, "b", "ok", None, [("a", "failed", "ConnectError"), ("b", "won", None)]
    ),
    "connect_timeout": Row(
        "hanging",
        answer(),
        200,
        "b",
        "ok",
        None,
        [("a", "failed", "ConnectTimeout"), ("b", "won", None)],
        policy={"connect_timeout_s": 0.5},
    ),
    "no_headers_by_hedge_after": Row(
        Script(header_delay_s=10.0, pieces=answer().pieces, close=False),
        answer(first_delay_s=0.2),
        200,
        "b",
        "ok",
        None,
        [("a", "cancelled", None), ("b", "won", None)],
        policy={"hedge_after_s": 0.5},
    ),
    "no_headers_by_total_timeout": Row(
        Script(header_delay_s=30.0, pieces=answer().pieces, close=False),
        None,
        504,
        "",
        "timeout",
        "total_timeout",
        [("a", "cancelled", None)],
        text=None,
        policy={"total_timeout_s": 1.0},
    ),
    "http_503_fails_over": Row(
        error_body(503, "busy"), answer(), 200, "b", "ok", None, [("a", "failed", "http_503"), ("b", "won", None)]
    ),
    "http_400_passes_through": Row(
        error_body(400, "bad messages"),
        answer(),
        400,
        "",
        "error",
        "http_400",
        [("a", "failed", "http_400")],
        text=None,
    ),
    "http_200_not_sse": Row(
        Script(content_type="text/html", pieces=[(0, b"<html><body>upstream connect error</body></html>")]),
        answer(),
        200,
        "b",
        "ok",
        None,
        [("a", "failed", "malformed_stream"), ("b", "won", None)],
    ),
    "sse_error_before_first_token": Row(
        Script(pieces=sse({"error": {"message": "overloaded", "type": "server_error"}}, done=False)),
        answer(),
        200,
        "b",
        "ok",
        None,
        [("a", "failed", "sse_error"), ("b", "won", None)],
    ),
    "sse_error_after_first_token": Row(
        Script(pieces=sse(chunk("one ", role="assistant"), {"error": {"message": "boom"}}, done=False)),
        None,
        200,
        "a",
        "error",
        "sse_error",
        [("a", "won", "sse_error")],
        text="one ",
        error_event=True,
    ),
    "empty_stream": Row(
        Script(pieces=sse(chunk(role="assistant"), done=True)),
        answer(),
        200,
        "b",
        "ok",
        None,
        [("a", "failed", "empty_stream"), ("b", "won", None)],
    ),
    "cut_after_tokens": Row(
        Script(pieces=sse(chunk("one ", role="assistant"), chunk("two "), done=False)),
        None,
        200,
        "a",
        "error",
        "truncated",
        [("a", "won", "truncated")],
        text="one two ",
        error_event=True,
    ),
    "stall_after_first_token": Row(
        Script(pieces=sse(chunk("one ", role="assistant"), done=False), close=False),
        None,
        200,
        "a",
        "stalled",
        "stall_timeout",
        [("a", "won", "stall_timeout")],
        text="one ",
        error_event=True,
        policy={"stall_timeout_s": 0.8},
    ),
    "every_attempt_failing": Row(
        error_body(503, "a busy"),
        error_body(503, "b busy"),
        502,
        "",
        "error",
        "all_attempts_failed",
        [("a", "failed", "http_503"), ("b", "failed", "http_503")],
        text=None,
    ),
    "event_over_the_cap_before_first_token": Row(
        Script(pieces=[*sse(chunk(role="assistant"), done=False), (0.05, ENDLESS_LINE)], close=False),
        answer(first_delay_s=0.3),
        200,
        "b",
        "ok",
        None,
        [("a", "failed", "event_too_large"), ("b", "won", None)],
        policy={"max_event_bytes": 1024 * 1024},
    ),
}


def text_of(body: bytes) -> tuple[str, bool, bool]:
    """The streamed text, whether an error event came, and whether ``[DONE]`` came."""
    text, error, done = "", False, False
    for line in body.decode().splitlines():
        if not line.startswith("data: "):
            continue
        data = line[6:]
        if data == "[DONE]":
            done = True
            continue
        event = json.loads(data)
        if "error" in event:
            error = True
        for choice in event.get("choices") or []:
            text += (choice.get("delta") or {}).get("content") or ""
    return text, error, done


async def upstream_url(kind: Any, stack: list[Any]) -> str:
    """The base URL of one upstream of a row (servers entered on ``stack`` to be closed later)."""
    if kind == "refused":
        return f"http://127.0.0.1:{free_port()}/v1"
    if kind == "hanging":
        listener = full_backlog_listener()
        stack.append(listener)
        return f"http://127.0.0.1:{listener.__enter__()}/v1"
    server = ScriptedServer(kind)
    stack.append(server)
    await server.__aenter__()
    return server.base_url


@pytest.mark.parametrize("name", sorted(ROWS))
async def test_each_failure_mode_row_behaves_the_same_through_the_gateway(name: str) -> None:
    row = ROWS[name]
    stack: list[Any] = []
    try:
        upstreams = [Upstream("a", await upstream_url(row.primary, stack))]
        if row.backup is not None:
            upstreams.append(Upstream("b", await upstream_url(row.backup, stack)))
        policy = HedgePolicy(**{"hedge_after_s": 5.0, "budget": 1.0, "total_timeout_s": 20.0, **row.policy})
        sink = Sink()
        app = GatewayApp(one_route(upstreams, policy=policy), telemetry=sink)
        with GatewayServer(app) as server:
            async with httpx.AsyncClient(timeout=30) as caller:
                response = await caller.post(server.base_url + "/chat/completions", json=STREAM)
            for _ in range(100):
                if sink.records:
                    break
                await asyncio.sleep(0.05)
    finally:
        for entered in reversed(stack):
            if isinstance(entered, ScriptedServer):
                await entered.__aexit__(None, None, None)
            else:
                entered.__exit__(None, None, None)
    assert response.status_code == row.status, (name, response.text[:300])
    assert response.headers.get("x-hedgerow-winner", "") == row.winner
    if row.status == 200:
        text, error, done = text_of(response.content)
        assert text == row.text
        assert (error, done) == (row.error_event, not row.error_event)
    else:
        assert "error" in response.json()
    (record,) = sink.records
    assert isinstance(record, CallRecord)
    assert (record.status, record.error_type) == (row.record_status, row.record_error)
    assert [(a.upstream, a.outcome, a.error_type) for a in record.attempts] == row.attempts
