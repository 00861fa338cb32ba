"""One test per row of the failure-mode table in ``hedgerow.client.hedging`` (issue 3, item 2).

Every upstream is a real HTTP server on 127.0.0.1 (``ScriptedServer``) or a real socket. Each test
asserts the row's whole outcome: the exception type, the record's ``status`` and ``error_type``,
each attempt's outcome and ``error_type``, and which upstreams were sent a request. Scripted delays
are hundreds of milliseconds to seconds apart so that the orderings hold on a loaded machine.

Connect timeout: an offline-deterministic way to make ``connect()`` hang is a listening socket on
127.0.0.1 whose accept queue is full (``listen(0)``, filled by plain sockets, never accepted): Linux
then drops further SYNs, so the client's connect neither succeeds nor is refused until
``connect_timeout_s`` expires. (An unroutable address such as 10.255.255.1 fails at once with
"network unreachable" on a machine without a default route, so it is not deterministic here.)
"""

from __future__ import annotations

import asyncio
import json
import select
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

import httpx
import pytest

from hedgerow.client import (
    AllAttemptsFailed,
    AttemptError,
    CallRecord,
    HedgePolicy,
    HedgingClient,
    StallTimeout,
    StreamError,
    TotalTimeout,
    Upstream,
    UpstreamError,
)
from tests.client.scripted_server import Script, ScriptedServer, chunk, sse
from tests.helpers import BODY, Sink, answer, free_port


@contextmanager
def full_backlog_listener() -> Iterator[int]:
    """A listening port whose accept queue is full, so that a new ``connect()`` hangs.

    Connects plain sockets until one does not complete within 0.3 s (the queue is full from
    then on, since nothing ever accepts); yields the port; closes everything afterwards.
    """
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    port = server.getsockname()[1]
    fillers: list[socket.socket] = []
    try:
        for _ in range(64):
            filler = socket.socket()
            filler.setblocking(False)
            fillers.append(filler)
            with suppress(BlockingIOError):
                filler.connect(("127.0.0.1", port))
            _, writable, _ = select.select([], [filler], [], 0.3)
            if not writable:
                break
        else:
            pytest.fail("could not fill the accept queue of a listen(0) socket")
        yield port
    finally:
        for filler in fillers:
            filler.close()
        server.close()


def attempts_of(record: CallRecord) -> list[tuple[str, str, str | None]]:
    """``(upstream, outcome, error_type)`` of each attempt, in start order."""
    return [(a.upstream, a.outcome, a.error_type) for a in record.attempts]


def two(a: ScriptedServer | str, b: ScriptedServer | str) -> list[Upstream]:
    """Upstreams "a" (primary) and "b" (backup) from servers or base URLs."""
    return [Upstream(name, s if isinstance(s, str) else s.base_url) for name, s in (("a", a), ("b", b))]


# -- connection refused / connect timeout -------------------------------------------------------


async def test_connection_refused_fails_over_at_once() -> None:
    dead = f"http://127.0.0.1:{free_port()}/v1"
    async with ScriptedServer(answer()) as b:
        sink = Sink()
        async with HedgingClient(two(dead, b), policy=HedgePolicy(hedge_after_s=5.0), telemetry=sink) as client:
            result = await client.chat(BODY)
    record = result.record
    assert result.text == "w0 w1 w2 "
    assert record.status == "ok" and record.error_type is None
    assert record.hedged and record.hedge_reason == "primary_error" and record.winner == "backup"
    assert attempts_of(record) == [("a", "failed", "ConnectError"), ("b", "won", None)]
    assert record.attempts[0].status_code is None
    # At once, not after hedge_after_s (5 s); up to 3 s leaves room for a loaded machine here and
    # in the fail-over tests below.
    assert record.attempts[1].start_s < 3.0
    assert len(b.requests) == 1 and sink.records == [record]


async def test_connect_timeout_fails_over_at_once() -> None:
    with full_backlog_listener() as port:
        async with ScriptedServer(answer()) as b:
            policy = HedgePolicy(hedge_after_s=5.0, connect_timeout_s=0.5)
            async with HedgingClient(two(f"http://127.0.0.1:{port}/v1", b), policy=policy) as client:
                result = await client.chat(BODY)
    record = result.record
    assert record.status == "ok" and record.winner == "backup" and record.hedge_reason == "primary_error"
    assert attempts_of(record) == [("a", "failed", "ConnectTimeout"), ("b", "won", None)]
    # Failed over when the connect timed out (0.5 s), not at hedge_after_s (5 s).
    assert 0.4 <= record.attempts[1].start_s < 2.5, record.attempts
    assert len(b.requests) == 1


# -- no response headers -----------------------------------------------------------------------


async def test_no_headers_by_hedge_after_hedges() -> None:
    silent = Script(header_delay_s=10.0, pieces=answer().pieces, close=False)
    async with ScriptedServer(silent) as a, ScriptedServer(answer(first_delay_s=0.2)) as b:
        async with HedgingClient(two(a, b), policy=HedgePolicy(hedge_after_s=0.5)) as client:
            result = await client.chat(BODY)
        record = result.record
        assert record.status == "ok" and record.error_type is None and result.text == "w0 w1 w2 "
        assert record.hedged and record.hedge_reason == "ttft_timeout" and record.winner == "backup"
        assert attempts_of(record) == [("a", "cancelled", None), ("b", "won", None)]
        primary, backup = record.attempts
        assert primary.status_code is None and primary.censored  # cancelled before its headers
        assert 0.5 <= backup.start_s < 2.0  # at the hedge timer, long before the primary's 10 s
        assert len(a.requests) == 1 and len(b.requests) == 1
        assert await a.wait_disconnect(0) is not None


async def test_no_headers_by_total_timeout_raises_total_timeout() -> None:
    silent = Script(header_delay_s=10.0, pieces=answer().pieces, close=False)
    async with ScriptedServer(silent) as a, ScriptedServer(silent) as b:
        sink = Sink()
        policy = HedgePolicy(hedge_after_s=0.3, total_timeout_s=1.2)
        async with HedgingClient(two(a, b), policy=policy, telemetry=sink) as client:
            started = time.monotonic()
            with pytest.raises(TotalTimeout) as info:
                await client.chat(BODY)
            elapsed = time.monotonic() - started
        record = sink.records[0]
        assert info.value.record is record and info.value.total_timeout_s == 1.2
        assert record.status == "timeout" and record.error_type == "total_timeout"
        assert record.hedged and record.winner is None and record.ttft_s is None
        assert attempts_of(record) == [("a", "cancelled", None), ("b", "cancelled", None)]
        assert 1.1 <= elapsed < 4.0
        assert await a.wait_disconnect(0) is not None and await b.wait_disconnect(0) is not None


# -- HTTP statuses -----------------------------------------------------------------------------


@pytest.mark.parametrize("status", [408, 409, 429, 500, 502, 503, 504])
async def test_http_408_409_429_5xx_fail_over(status: int) -> None:
    failing = Script(status=status, content_type="application/json", pieces=[(0, b'{"error":"nope"}')])
    async with ScriptedServer(failing) as a, ScriptedServer(answer()) as b:
        # budget 0: a failover must not need (nor spend) the hedge budget
        policy = HedgePolicy(hedge_after_s=5.0, budget=0.0, budget_burst=0)
        async with HedgingClient(two(a, b), policy=policy) as client:
            result = await client.chat(BODY)
    record = result.record
    assert record.status == "ok" and result.text == "w0 w1 w2 "
    assert record.hedge_reason == "primary_error" and record.winner == "backup" and not record.hedge_denied
    assert attempts_of(record) == [("a", "failed", f"http_{status}"), ("b", "won", None)]
    assert record.attempts[0].status_code == status and record.attempts[1].start_s < 3.0


@pytest.mark.parametrize("status", [400, 401, 403, 404, 422])
async def test_http_400_401_403_404_422_raise_upstream_error(status: int) -> None:
    refusing = Script(status=status, content_type="application/json", pieces=[(0, b'{"error":{"message":"bad"}}')])
    async with ScriptedServer(refusing) as a, ScriptedServer(answer()) as b:
        sink = Sink()
        async with HedgingClient(two(a, b), policy=HedgePolicy(hedge_after_s=5.0), telemetry=sink) as client:
            with pytest.raises(UpstreamError) as info:
                await client.chat(BODY)
    record = sink.records[0]
    assert info.value.status_code == status and info.value.upstream == "a" and "bad" in info.value.body_excerpt
    assert info.value.record is record
    assert record.status == "error" and record.error_type == f"http_{status}"
    assert not record.hedged and record.winner is None
    assert attempts_of(record) == [("a", "failed", f"http_{status}")]
    assert b.requests == []  # no failover


# -- bodies that are not a token stream ---------------------------------------------------------


NON_SSE_BODIES = {
    "html": ("text/html; charset=utf-8", b"<!doctype html><html><body><h1>502 Bad Gateway</h1></body></html>"),
    "json": (
        "application/json",
        json.dumps(
            {
                "id": "chatcmpl-x",
                "object": "chat.completion",
                "model": "m",
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": "hello"}, "finish_reason": "stop"}
                ],
            }
        ).encode(),
    ),
    # Unlabelled bodies are sniffed: these do not begin like SSE, so they fail over as before.
    "html_unlabelled": (None, b"\n<html><body>upstream connect error</body></html>"),
    "json_unlabelled": (None, b'{"data": "not an event stream"}'),
    "text_plain_cut_short": ("text/plain", b"dat"),
}


@pytest.mark.parametrize("kind", sorted(NON_SSE_BODIES))
async def test_http_200_non_sse_body_fails_over(kind: str) -> None:
    content_type, payload = NON_SSE_BODIES[kind]
    async with (
        ScriptedServer(Script(content_type=content_type, pieces=[(0, payload)])) as a,
        ScriptedServer(answer()) as b,
        HedgingClient(two(a, b), policy=HedgePolicy(hedge_after_s=5.0)) as client,
    ):
        result = await client.chat(BODY)
    record = result.record
    assert record.status == "ok" and result.text == "w0 w1 w2 "  # nothing of the bad body leaked
    assert record.hedge_reason == "primary_error" and record.winner == "backup"
    assert attempts_of(record) == [("a", "failed", "malformed_stream"), ("b", "won", None)]
    assert record.attempts[0].status_code == 200 and record.attempts[1].start_s < 3.0


SSE_ERRORS = {
    "data_error": b'data: {"error": {"message": "overloaded", "type": "server_error"}}\n\n',
    "event_error": b'event: error\ndata: {"message": "overloaded"}\n\n',
}


@pytest.mark.parametrize("kind", sorted(SSE_ERRORS))
async def test_sse_error_payload_before_first_token_fails_over(kind: str) -> None:
    pieces = [*sse(chunk(role="assistant", content=""), done=False), (0.05, SSE_ERRORS[kind])]
    async with (
        ScriptedServer(Script(pieces=pieces)) as a,
        ScriptedServer(answer()) as b,
        HedgingClient(two(a, b), policy=HedgePolicy(hedge_after_s=5.0)) as client,
    ):
        result = await client.chat(BODY)
    record = result.record
    assert record.status == "ok" and result.text == "w0 w1 w2 "
    assert record.hedge_reason == "primary_error" and record.winner == "backup"
    assert attempts_of(record) == [("a", "failed", "sse_error"), ("b", "won", None)]
    assert record.attempts[1].start_s < 3.0  # at once, not after hedge_after_s (5 s)


@pytest.mark.parametrize("kind", sorted(SSE_ERRORS))
async def test_sse_error_payload_after_first_token_fails_the_call(kind: str) -> None:
    pieces = [*sse(chunk("one ", role="assistant"), chunk("two "), done=False), (0.05, SSE_ERRORS[kind])]
    async with ScriptedServer(Script(pieces=pieces)) as a, ScriptedServer(answer()) as b:
        sink = Sink()
        async with HedgingClient(two(a, b), policy=HedgePolicy(hedge_after_s=5.0), telemetry=sink) as client:
            received = []
            with pytest.raises(StreamError) as info:
                async with client.stream_chat(BODY) as stream:
                    async for piece in stream:
                        received.append(piece["choices"][0]["delta"].get("content"))
    record = sink.records[0]
    assert received == ["one ", "two "]  # the tokens before the error reached the caller
    assert info.value.error_type == "sse_error" and info.value.record is record
    assert record.status == "error" and record.error_type == "sse_error"
    assert record.winner == "primary" and not record.hedged and record.ttft_s is not None
    assert attempts_of(record) == [("a", "won", "sse_error")]
    assert b.requests == []  # no failover after the first token


EMPTY_STREAMS = {
    "empty_body": [],
    "done_after_role_only": sse(chunk(role="assistant"), done=True),
}


@pytest.mark.parametrize("kind", sorted(EMPTY_STREAMS))
async def test_stream_ending_before_any_token_fails_over(kind: str) -> None:
    async with (
        ScriptedServer(Script(pieces=EMPTY_STREAMS[kind])) as a,
        ScriptedServer(answer()) as b,
        HedgingClient(two(a, b), policy=HedgePolicy(hedge_after_s=5.0)) as client,
    ):
        result = await client.chat(BODY)
    record = result.record
    assert record.status == "ok" and result.text == "w0 w1 w2 "
    assert record.hedge_reason == "primary_error" and record.winner == "backup"
    assert attempts_of(record) == [("a", "failed", "empty_stream"), ("b", "won", None)]
    assert record.attempts[1].start_s < 3.0  # at once, not after hedge_after_s (5 s)


CUTS = {
    # the server closes the connection cleanly (EOF) after two tokens: no finish_reason, no [DONE]
    "eof": ({}, sse(chunk("one ", role="assistant"), chunk("two "), done=False)),
    # the server announced a longer body than it sends, then closes: a protocol-level cut
    "mid_body": ({"Content-Length": "100000"}, sse(chunk("one ", role="assistant"), chunk("two "), done=False)),
}


@pytest.mark.parametrize("kind", sorted(CUTS))
async def test_connection_cut_after_tokens_is_truncated(kind: str) -> None:
    headers, pieces = CUTS[kind]
    async with ScriptedServer(Script(pieces=pieces, headers=headers)) as a, ScriptedServer(answer()) as b:
        sink = Sink()
        async with HedgingClient(two(a, b), policy=HedgePolicy(hedge_after_s=5.0), telemetry=sink) as client:
            with pytest.raises(StreamError) as info:
                await client.chat(BODY)
    record = sink.records[0]
    assert info.value.error_type == "truncated" and info.value.record is record
    assert record.status == "error" and record.error_type == "truncated"
    assert record.winner == "primary" and record.completion_tokens == 2
    assert attempts_of(record) == [("a", "won", "truncated")]
    assert b.requests == []


async def test_stall_after_first_token_raises_stall_timeout() -> None:
    pieces = sse(chunk("a", role="assistant"), done=False) + sse(chunk("b"), chunk(finish="stop"), first_delay_s=5.0)
    async with ScriptedServer(Script(pieces=pieces, close=False)) as a, ScriptedServer(answer()) as b:
        sink = Sink()
        policy = HedgePolicy(hedge_after_s=5.0, stall_timeout_s=0.6)
        async with HedgingClient(two(a, b), policy=policy, telemetry=sink) as client:
            started = time.monotonic()
            with pytest.raises(StallTimeout) as info:
                await client.chat(BODY)
            elapsed = time.monotonic() - started
        record = sink.records[0]
        assert info.value.upstream == "a" and info.value.gap_s >= 0.6 and info.value.record is record
        assert record.status == "stalled" and record.error_type == "stall_timeout"
        assert record.winner == "primary" and record.completion_tokens == 1
        # The stall that ended the call is in the record: as the winner's error_type, and as the
        # largest inter-token gap (the gap up to giving up counts; there was no second token).
        assert attempts_of(record) == [("a", "won", "stall_timeout")]
        assert record.max_itl_s is not None and record.max_itl_s >= 0.6
        assert elapsed < 3.0 and b.requests == []
        assert await a.wait_disconnect(0) is not None  # the stalled stream was closed


# -- the caller abandons the stream ------------------------------------------------------------


class Boom(Exception):
    """An error of the caller's own, raised inside its loop."""


@pytest.mark.parametrize("how", ["break", "exception", "task_cancelled"])
async def test_caller_abandoning_the_stream_closes_every_attempt(how: str) -> None:
    # Primary: headers at once, first token at 1.0 s, then a token a second. Backup: silent.
    # hedge_after_s 0.3, so both attempts are running when the caller leaves.
    slow = answer(first_delay_s=1.0, gap_s=1.0, words=10, close=False)
    silent = Script(header_delay_s=10.0, close=False)
    async with ScriptedServer(slow) as a, ScriptedServer(silent) as b:
        sink = Sink()
        async with HedgingClient(two(a, b), policy=HedgePolicy(hedge_after_s=0.3), telemetry=sink) as client:

            async def consume() -> None:
                async with client.stream_chat(BODY) as stream:
                    async for _ in stream:
                        if how == "break":
                            break
                        if how == "exception":
                            raise Boom("caller failed")

            if how == "task_cancelled":
                task = asyncio.create_task(consume())
                # Cancelled once the hedge reached its server (due at 0.3 s), well before the
                # primary's first token (1.0 s after its request): polled, as a stall of this
                # process can hold the hedge's send past any fixed sleep.
                async with asyncio.timeout(10):
                    while not b.requests:
                        await asyncio.sleep(0.01)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
            elif how == "exception":
                with pytest.raises(Boom):
                    await consume()
            else:
                await consume()
        record = sink.records[0]
        assert record.status == "cancelled"
        assert (
            record.error_type
            == {"break": "caller_cancelled", "exception": "Boom", "task_cancelled": "caller_cancelled"}[how]
        )
        assert record.hedged and len(a.requests) == 1 and len(b.requests) == 1
        if how == "task_cancelled":
            assert attempts_of(record) == [("a", "cancelled", None), ("b", "cancelled", None)]
        else:  # the primary won at 1.0 s (the backup was cancelled then) and was dropped by the caller
            assert record.winner == "primary"
            assert attempts_of(record) == [("a", "won", None), ("b", "cancelled", None)]
        # Both servers would hold their connections for seconds more: only the client closed them.
        assert await a.wait_disconnect(0, timeout_s=2.0) is not None
        assert await b.wait_disconnect(0, timeout_s=2.0) is not None


# -- nothing left -----------------------------------------------------------------------------


async def test_every_attempt_failing_raises_all_attempts_failed() -> None:
    dead = f"http://127.0.0.1:{free_port()}/v1"
    down = Script(status=503, content_type="text/plain", pieces=[(0, b"down for maintenance")])
    async with ScriptedServer(down) as b:
        sink = Sink()
        async with HedgingClient(two(dead, b), policy=HedgePolicy(hedge_after_s=5.0), telemetry=sink) as client:
            with pytest.raises(AllAttemptsFailed) as info:
                await client.chat(BODY)
    record = sink.records[0]
    errors = info.value.errors
    assert [name for name, _ in errors] == ["a", "b"]
    assert isinstance(errors[0][1], httpx.ConnectError)
    assert isinstance(errors[1][1], AttemptError) and errors[1][1].error_type == "http_503"
    assert "down for maintenance" in str(info.value) and info.value.record is record
    assert record.status == "error" and record.error_type == "all_attempts_failed"
    assert record.hedge_reason == "primary_error" and record.winner is None
    assert attempts_of(record) == [("a", "failed", "ConnectError"), ("b", "failed", "http_503")]
    assert len(b.requests) == 1


# -- one enormous SSE event or line ------------------------------------------------------------

#: 20 MB of a JSON string that never ends: no line break, so no SSE event boundary either.
ENDLESS_LINE = b'data: {"choices":[{"index":0,"delta":{"content":"' + b"x" * 20_000_000
#: 3 MB of short ``data:`` lines with no blank line between them: one endless event.
ENDLESS_EVENT = b'data: {"x": 1}\n' * 200_000
CAP = 1024 * 1024


@pytest.mark.parametrize("shape", ["line", "event"])
async def test_event_larger_than_the_cap_before_first_token_fails_over(shape: str) -> None:
    huge = ENDLESS_LINE if shape == "line" else ENDLESS_EVENT
    pieces = [*sse(chunk(role="assistant"), done=False), (0.05, huge)]
    async with ScriptedServer(Script(pieces=pieces, close=False)) as a, ScriptedServer(answer(first_delay_s=0.3)) as b:
        sink = Sink()
        async with HedgingClient(
            two(a, b), policy=HedgePolicy(hedge_after_s=30.0, max_event_bytes=CAP), telemetry=sink
        ) as client:
            result = await asyncio.wait_for(client.chat(BODY), 20.0)
        record = sink.records[0]
        assert result.text == "w0 w1 w2 " and record.status == "ok" and record.winner == "backup"
        assert record.hedge_reason == "primary_error"
        assert attempts_of(record) == [("a", "failed", "event_too_large"), ("b", "won", None)]
        assert await a.wait_disconnect(0) is not None


async def test_event_larger_than_the_cap_after_first_token_fails_the_call() -> None:
    pieces = [*sse(chunk("a", role="assistant"), done=False), (0.05, ENDLESS_LINE)]
    async with ScriptedServer(Script(pieces=pieces, close=False)) as a, ScriptedServer(answer()) as b:
        sink = Sink()
        async with HedgingClient(
            two(a, b), policy=HedgePolicy(hedge_after_s=30.0, max_event_bytes=CAP), telemetry=sink
        ) as client:
            with pytest.raises(StreamError) as info:
                await asyncio.wait_for(client.chat(BODY), 20.0)
        record = sink.records[0]
        assert info.value.error_type == "event_too_large" and info.value.record is record
        assert record.status == "error" and record.error_type == "event_too_large"
        assert attempts_of(record) == [("a", "won", "event_too_large")]
        assert b.requests == [] and await a.wait_disconnect(0) is not None


async def test_events_just_under_the_cap_pass_in_any_line_ending() -> None:
    # A 900 KB content chunk under a 1 MiB cap, with LF, CRLF and CR endings, split across writes.
    big = "y" * 900_000
    body = json.dumps(chunk(big, role="assistant"))
    for ending in ("\n", "\r\n", "\r"):
        event = f"data: {body}{ending}{ending}".encode()
        tail = "".join(f"data: {json.dumps(c)}{ending}{ending}" for c in (chunk(big), chunk(finish="stop")))
        pieces = [(0.0, event[:500_000]), (0.01, event[500_000:]), (0.01, tail.encode()), (0.01, b"data: [DONE]\n\n")]
        policy = HedgePolicy(hedge_after_s=30.0, max_event_bytes=CAP)
        async with (
            ScriptedServer(Script(pieces=pieces)) as a,
            ScriptedServer(answer()) as b,
            HedgingClient(two(a, b), policy=policy) as client,
        ):
            result = await asyncio.wait_for(client.chat(BODY), 20.0)
        assert result.text == big * 2 and result.record.status == "ok", ending
        assert b.requests == []


def test_max_event_bytes_is_validated() -> None:
    bad: Any  # each of them wrong (a type or a value)
    for bad in (0, -1, 1.5, True, None):
        with pytest.raises(ValueError, match="max_event_bytes"):
            HedgePolicy(max_event_bytes=bad)


async def test_total_timeout_after_first_token_records_the_gap_and_error_type() -> None:
    pieces = [*sse(chunk("a", role="assistant"), chunk("b"), done=False, gap_s=0.05), (30.0, b"data: [DONE]\n\n")]
    async with ScriptedServer(Script(pieces=pieces, close=False)) as a, ScriptedServer(answer()) as b:
        sink = Sink()
        policy = HedgePolicy(hedge_after_s=5.0, total_timeout_s=1.5)
        async with HedgingClient(two(a, b), policy=policy, telemetry=sink) as client:
            with pytest.raises(TotalTimeout) as info:
                await client.chat(BODY)
        record = sink.records[0]
        assert info.value.record is record and record.status == "timeout" and record.error_type == "total_timeout"
        assert attempts_of(record) == [("a", "won", "total_timeout")]
        assert record.completion_tokens == 2
        # Tokens at ~0 s and ~0.05 s, then nothing until the 1.5 s bound: a gap of over a second.
        assert record.max_itl_s is not None and record.max_itl_s >= 1.0
        assert record.attempts[0].end_s >= 1.4


# -- HTTP 404 from an upstream whose base_url lacks /v1 -------------------------------------------


@pytest.mark.parametrize("suffix", ["", "/api", "/v1"])
async def test_404_names_a_base_url_without_v1(suffix: str) -> None:
    not_found = Script(status=404, content_type="application/json", pieces=[(0, b'{"detail":"Not Found"}')])
    async with ScriptedServer(not_found) as a:
        base_url = f"http://127.0.0.1:{a.port}{suffix}"
        async with HedgingClient([Upstream("a", base_url)], policy=HedgePolicy(hedge_after_s=5.0)) as client:
            with pytest.raises(UpstreamError) as info:
                await client.chat(BODY)
    assert info.value.status_code == 404 and a.requests[0].path == f"{suffix}/chat/completions"
    if suffix == "/v1":
        assert info.value.hint is None and "hint" not in str(info.value)
    else:
        assert "does not end in '/v1'" in str(info.value) and base_url in str(info.value)
        assert f"{suffix}/v1/chat/completions" in str(info.value)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "body['model']: missing"),
        ({"model": 3, "messages": []}, "body['model']: must be a string, got int"),
        ([{"model": "m"}], "body: must be a dict"),
        ("model", "body: must be a dict"),
    ],
)
async def test_bad_body_raises_value_error_naming_the_field_before_any_request(body: Any, field: str) -> None:
    async with ScriptedServer(answer()) as a, HedgingClient([Upstream("a", a.base_url)]) as client:
        with pytest.raises(ValueError) as info:
            await client.chat(body)
        assert field in str(info.value)
        with pytest.raises(ValueError, match=field.replace("[", r"\[").replace("]", r"\]")):
            client.stream_chat(body)
    assert a.requests == []
