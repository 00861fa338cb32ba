"""Cancellation is exact (issue 3, item 3), against real servers on 127.0.0.1.

* The loser's connection is closed within 100 ms of the winner's first token, read on the
  winner's own schedule. The scripted server stamps (``time.monotonic``) when each body piece
  was written and when the client closed the connection; the winner writes a chunk every 20 ms
  on the client's own event loop, so the loser must be closed before the winner's chunk due
  100 ms after its first token. A stall of the test process (a loaded CI machine) delays those
  writes as it delays the close, so it stretches both sides of the comparison alike. The
  server's write time of the first token is checked as a lower bound (the loser is never closed
  before it).
* The winner's stream is never touched: every scripted chunk arrives, in order.
* Nothing is left open after a call, however it ends: the asyncio tasks are back to the ones
  from before the call (the test servers' own tasks aside), the httpx pool holds no connection,
  and every server saw its connection closed by the client (scripts keep connections open
  themselves, so only the client can close them).
* ``hedge_after_s`` runs from the primary's send, not from its headers; TTFT is measured from
  the primary's send even when that send is late.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import httpcore
import httpx
import pytest

from hedgerow.client import (
    AllAttemptsFailed,
    HedgeError,
    HedgePolicy,
    HedgingClient,
    StallTimeout,
    TotalTimeout,
    Upstream,
)
from hedgerow.client._transport import OwnedTransport
from hedgerow.client.hedging import attempt_request_id
from hedgerow.client.records import AttemptRole
from tests import helpers
from tests.client.scripted_server import Script, ScriptedServer, chunk, sse, usage_chunk
from tests.helpers import BODY

#: The issue's bound on loser cancellation.
CANCEL_WITHIN_S = 0.100
#: Seconds between the chunks of the winner's stream in the cancellation-latency test.
WINNER_GAP_S = 0.02


def stream_chunks(words: int) -> list[dict[str, Any]]:
    """A full answer: role + first word, more words, finish, usage."""
    chunks = [chunk("w0 ", role="assistant")] + [chunk(f"w{i} ") for i in range(1, words)]
    return [*chunks, chunk(finish="stop"), usage_chunk(5, words)]


def answer(first_delay_s: float = 0.0, gap_s: float = 0.01, words: int = 3) -> Script:
    """A normal stream (``stream_chunks(words)``) that keeps its connection open until the client closes it."""
    return helpers.answer(first_delay_s, gap_s, words, close=False, prompt_tokens=5)


def silent() -> Script:
    """No headers for 30 s (the connection stays open)."""
    return Script(header_delay_s=30.0, close=False)


def client_tasks() -> set[asyncio.Task[Any]]:
    """The running tasks that are not the test servers' own."""
    return {
        t
        for t in asyncio.all_tasks()
        if "ScriptedServer" not in getattr(t.get_coro(), "__qualname__", repr(t.get_coro()))
    }


async def assert_tasks_back_to(baseline: set[asyncio.Task[Any]]) -> None:
    """Assert that no task of the call outlives it.

    Right after the call, the only extra tasks allowed are the interpreter's async-generator
    finalizers (``agen.aclose()`` tasks that asyncio schedules when httpx's nested byte
    iterators, abandoned at ``[DONE]`` or on cancellation, are garbage-collected); they must
    finish on their own within a few loop iterations. No attempt task may remain.
    """
    extra = client_tasks() - baseline
    assert all(type(t.get_coro()).__name__ == "async_generator_athrow" for t in extra), extra
    for _ in range(100):
        if client_tasks() == baseline:
            return
        await asyncio.sleep(0.01)
    assert client_tasks() == baseline


def open_connections(client: HedgingClient) -> int:
    """Connections the client's httpx pool still holds."""
    return len(client_pool(client).connections)


@pytest.mark.parametrize("winner", ["backup", "primary"])
async def test_loser_closed_within_100ms_of_winners_first_token_and_winner_untouched(winner: str) -> None:
    words = 20
    if winner == "backup":
        # Primary: headers at once, first token after 30 s. Backup (hedge at 0.3 s): 0.4 s.
        scripts = (answer(first_delay_s=30.0), answer(first_delay_s=0.4, gap_s=WINNER_GAP_S, words=words))
    else:
        # Primary: first token at 1.0 s. Backup (hedge at 0.3 s): headers at once, token at 30 s.
        scripts = (answer(first_delay_s=1.0, gap_s=WINNER_GAP_S, words=words), answer(first_delay_s=30.0))
    async with ScriptedServer(scripts[0]) as a, ScriptedServer(scripts[1]) as b:
        servers = {"primary": a, "backup": b}
        async with HedgingClient(
            [Upstream("a", a.base_url), Upstream("b", b.base_url)], policy=HedgePolicy(hedge_after_s=0.3)
        ) as client:
            received: list[dict[str, Any]] = []
            async with client.stream_chat(BODY) as stream:
                async for piece in stream:
                    received.append(piece)
        record = stream.record
        assert record is not None
        assert record.status == "ok" and record.winner == winner and record.hedged
        win = next(x for x in record.attempts if x.role == winner)
        lose = next(x for x in record.attempts if x.role != winner)
        assert win.outcome == "won" and lose.outcome == "cancelled" and lose.first_token_s is None

        loser_seen = servers[lose.role].requests[0]
        winner_seen = servers[winner].requests[0]
        closed_at = await servers[lose.role].wait_disconnect(0, timeout_s=2.0)
        assert closed_at is not None
        server_first_token_at = winner_seen.writes[0]  # the first piece carries the first token
        assert closed_at >= server_first_token_at
        # The bound is read on the winner's own schedule, not on the wall clock: its server writes
        # a chunk every WINNER_GAP_S on this event loop, so the loser must be closed before the
        # chunk due CANCEL_WITHIN_S after the first token. A stall of this process delays those
        # writes as much as it delays the close; a loser closed only at the end of the winner's
        # stream (0.44 s) fails it.
        within = round(CANCEL_WITHIN_S / WINNER_GAP_S)
        late = [round(t - closed_at, 3) for t in winner_seen.writes[: within + 1]]
        assert closed_at < winner_seen.writes[within], f"winner's writes relative to the loser's close: {late}"
        assert loser_seen.writes == []  # the loser never wrote a body byte

        # The winner: every chunk arrived, in order, and its connection was not closed early.
        assert received == stream_chunks(words)
        assert len(winner_seen.writes) == len(scripts[0 if winner == "primary" else 1].pieces)
        winner_closed = await servers[winner].wait_disconnect(0, timeout_s=2.0)
        assert winner_closed is not None and winner_closed >= winner_seen.writes[-1]


async def _succeed(client: HedgingClient) -> None:
    result = await client.chat(BODY)
    assert result.record.status == "ok"


async def _abandon(client: HedgingClient) -> None:
    async with client.stream_chat(BODY) as stream:
        async for _ in stream:
            break
    assert stream.record is not None
    assert stream.record.status == "cancelled"


async def _raise_in_loop(client: HedgingClient) -> None:
    with pytest.raises(KeyError):
        async with client.stream_chat(BODY) as stream:
            async for _ in stream:
                raise KeyError("the caller's own bug")
    assert stream.record is not None
    assert stream.record.status == "cancelled" and stream.record.error_type == "KeyError"


#: What the caller does in a leak scenario, given the client.
Act = Callable[[HedgingClient], Awaitable[None]]


def _expect(error: type[HedgeError], status: str) -> Act:
    async def run(client: HedgingClient) -> None:
        with pytest.raises(error) as info:
            await client.chat(BODY)
        assert info.value.record is not None
        assert info.value.record.status == status

    return run


def _failing(status: int, header_delay_s: float, close: bool = False) -> Script:
    return Script(
        status=status, header_delay_s=header_delay_s, content_type="text/plain", pieces=[(0, b"down")], close=close
    )


def _stalling() -> Script:
    pieces = sse(chunk("a", role="assistant"), done=False) + sse(chunk("b"), first_delay_s=30.0)
    return Script(pieces=pieces, close=False)


# Each scenario: (primary script, backup script, policy, what the caller does). Every one of them
# hedges at 0.3 s, so two connections are open at some point.
LEAK_SCENARIOS: dict[str, tuple[Script, Script, dict[str, Any], Act]] = {
    "success": (answer(first_delay_s=1.0), answer(first_delay_s=30.0), {}, _succeed),
    "failure": (_failing(503, 0.8), _failing(502, 0.2), {}, _expect(AllAttemptsFailed, "error")),
    "stall": (
        Script(pieces=[(0.6, b""), *_stalling().pieces], close=False),
        silent(),
        {"stall_timeout_s": 0.5},
        _expect(StallTimeout, "stalled"),
    ),
    "total_timeout": (silent(), silent(), {"total_timeout_s": 1.0}, _expect(TotalTimeout, "timeout")),
    "caller_abandon": (answer(first_delay_s=0.6, gap_s=1.0, words=10), silent(), {}, _abandon),
    "caller_exception": (answer(first_delay_s=0.6, gap_s=1.0, words=10), silent(), {}, _raise_in_loop),
}


@pytest.mark.parametrize("scenario", list(LEAK_SCENARIOS))
async def test_nothing_left_open_after_a_call(scenario: str) -> None:
    primary, backup, extra, act = LEAK_SCENARIOS[scenario]
    async with (
        ScriptedServer(primary) as a,
        ScriptedServer(backup) as b,
        HedgingClient(
            [Upstream("a", a.base_url), Upstream("b", b.base_url)], policy=HedgePolicy(hedge_after_s=0.3, **extra)
        ) as client,
    ):
        baseline = client_tasks()
        await act(client)
        await assert_tasks_back_to(baseline)
        assert open_connections(client) == 0
        assert len(a.requests) == 1 and len(b.requests) == 1  # both attempts were sent
        assert await a.wait_disconnect(0, timeout_s=2.0) is not None
        assert await b.wait_disconnect(0, timeout_s=2.0) is not None


@pytest.mark.parametrize("shape", ["headers_at_once_token_late", "headers_late"])
async def test_hedge_after_is_measured_from_the_primary_send(shape: str) -> None:
    if shape == "headers_at_once_token_late":
        primary = answer(first_delay_s=3.0)
    else:  # headers after 1.0 s, the first token 2.0 s later
        primary = Script(header_delay_s=1.0, pieces=answer(first_delay_s=2.0).pieces, close=False)
    async with (
        ScriptedServer(primary) as a,
        ScriptedServer(answer()) as b,
        HedgingClient(
            [Upstream("a", a.base_url), Upstream("b", b.base_url)], policy=HedgePolicy(hedge_after_s=0.5)
        ) as client,
    ):
        called_at = time.monotonic()
        result = await client.chat(BODY)
    record = result.record
    assert record.hedge_reason == "ttft_timeout" and record.winner == "backup"
    primary_attempt, backup_attempt = record.attempts
    # At hedge_after_s (0.5 s) after the send; with late headers not at headers + 0.5 = 1.5 s. The
    # upper bounds leave a loaded machine 0.9 s to be late and stay below that 1.5 s.
    assert 0.45 <= backup_attempt.start_s - primary_attempt.start_s < 1.4
    # As the servers saw it. The backup cannot reach its server before the primary's send plus
    # 0.5 s, and that send is at least primary.start_s after called_at; the primary's own arrival
    # is no reference for the lower bound, as a stall can hold it up until the hedge is due.
    assert b.requests[0].at - called_at >= primary_attempt.start_s + 0.5 - 0.005
    assert b.requests[0].at - a.requests[0].at < 1.4


async def test_ttft_and_hedge_are_measured_from_a_late_primary_send() -> None:
    # The app blocks its event loop for 0.4 s right after opening the call: the primary request
    # goes out late. TTFT and the hedge deadline run from that send, not from the call's start.
    async with (
        ScriptedServer(answer(first_delay_s=3.0)) as a,
        ScriptedServer(answer(first_delay_s=0.2)) as b,
        HedgingClient(
            [Upstream("a", a.base_url), Upstream("b", b.base_url)], policy=HedgePolicy(hedge_after_s=0.3)
        ) as client,
        client.stream_chat(BODY) as stream,
    ):
        time.sleep(0.4)
        async for _ in stream:
            pass
    record = stream.record
    assert record is not None
    primary_attempt, backup_attempt = record.attempts
    assert primary_attempt.start_s >= 0.35
    # Counted from the call's start, the hedge would have been due before the primary's send:
    # the backup would start right behind it, not 0.3 s later.
    # start_s is rounded to 1 µs; the upper bound is room for a loaded machine (the primary's token
    # comes at 3 s).
    assert 0.3 - 2e-6 <= backup_attempt.start_s - primary_attempt.start_s < 2.0
    assert backup_attempt.first_token_s is not None
    assert record.ttft_s is not None and record.e2e_s is not None
    assert record.ttft_s == pytest.approx(backup_attempt.first_token_s - primary_attempt.start_s, abs=1e-5)
    assert record.ttft_s >= 0.45  # 0.3 s hedge + 0.2 s backup, measured from the late send
    assert record.e2e_s == pytest.approx(record.ttft_s + (record.e2e_s - record.ttft_s))
    assert record.e2e_s <= backup_attempt.end_s - primary_attempt.start_s + 1e-5


async def test_max_backups_2_failover_then_hedge() -> None:
    # a: 503 at once -> failover to b (no token for 30 s) -> at hedge_after_s a hedge to c, which wins.
    async with (
        ScriptedServer(_failing(503, 0.0, close=True)) as a,
        ScriptedServer(answer(first_delay_s=30.0)) as b,
        ScriptedServer(answer(first_delay_s=0.1)) as c,
    ):
        upstreams = [Upstream("a", a.base_url), Upstream("b", b.base_url), Upstream("c", c.base_url)]
        policy = HedgePolicy(hedge_after_s=1.5, max_backups=2, budget=0.5, budget_burst=1.5)
        async with HedgingClient(upstreams, policy=policy) as client:
            result = await client.chat(BODY, request_id="r1")
            record = result.record
            assert [(x.upstream, x.role, x.outcome, x.error_type) for x in record.attempts] == [
                ("a", "primary", "failed", "http_503"),
                ("b", "backup", "cancelled", None),
                ("c", "backup", "won", None),
            ]
            assert record.hedge_reason == "primary_error" and record.winner == "backup"
            # The failover at once, not at the hedge timer (1.5 s; the 1.4 s bound leaves a loaded
            # machine room); the hedge not before its timer.
            assert record.attempts[1].start_s < 1.4 and record.attempts[2].start_s >= 1.5 - 0.005
            seen = [s.requests[0].headers for s in (a, b, c)]
            assert [h["x-hedgerow-attempt"] for h in seen] == ["primary", "backup", "backup2"]
            assert [h["x-request-id"] for h in seen] == [
                attempt_request_id("r1", role) for role in ("primary", "backup", "backup2")
            ]
            assert len({h["x-request-id"] for h in seen}) == 3
            assert all(str(uuid.UUID(h["x-request-id"])) == h["x-request-id"] for h in seen)
            assert [h["idempotency-key"] for h in seen] == ["r1", "r1", "r1"]
            assert await b.wait_disconnect(0) is not None
            assert client.budget.tokens < 1.0  # the hedge spent the budget; the failover did not


async def test_max_backups_2_a_failed_hedge_does_not_fail_over_while_the_primary_runs() -> None:
    # a: token at 1.2 s. Hedge at 0.3 s to b, which answers 503: a is still running, so no
    # failover to c; a wins.
    async with (
        ScriptedServer(answer(first_delay_s=1.2)) as a,
        ScriptedServer(_failing(503, 0.0)) as b,
        ScriptedServer(answer()) as c,
    ):
        upstreams = [Upstream("a", a.base_url), Upstream("b", b.base_url), Upstream("c", c.base_url)]
        async with HedgingClient(upstreams, policy=HedgePolicy(hedge_after_s=0.3, max_backups=2)) as client:
            result = await client.chat(BODY)
    record = result.record
    assert [(x.upstream, x.outcome, x.error_type) for x in record.attempts] == [
        ("a", "won", None),
        ("b", "failed", "http_503"),
    ]
    assert record.hedge_reason == "ttft_timeout" and record.winner == "primary" and c.requests == []
    assert json.loads(json.dumps(record.to_dict()))["attempts"][1]["status_code"] == 503


# -- the scripted server itself: a disconnect is seen however the client leaves -----------------


async def _raw_request(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Open a raw connection and send one chat request; return once the response headers came."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    payload = json.dumps(BODY).encode()
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: " + str(len(payload)).encode() + b"\r\n\r\n" + payload
    )
    await writer.drain()
    return reader, writer


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with SO_LINGER 0: the kernel sends a TCP reset (RST) instead of a clean FIN."""
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


@pytest.mark.parametrize("when", ["during_body", "before_headers"])
async def test_scripted_server_records_a_reset_as_a_disconnect(when: str) -> None:
    # Body pieces every 0.2 s for 4 s (or headers only after 30 s); the client resets the
    # connection after the first piece (or while the server still waits to send headers).
    header_delay_s = 30.0 if when == "before_headers" else 0.0
    script = Script(
        pieces=[(0.2, f"data: {i}\n\n".encode()) for i in range(20)], close=False, header_delay_s=header_delay_s
    )
    async with ScriptedServer(script) as server:
        reader, writer = await _raw_request(server.port)
        if when == "during_body":
            await asyncio.wait_for(reader.readuntil(b"data: 0\n\n"), 5.0)
        else:
            for _ in range(500):
                if server.requests:
                    break
                await asyncio.sleep(0.01)
        reset_at = time.monotonic()
        _reset(writer)
        closed_at = await server.wait_disconnect(0, timeout_s=3.0)
        assert closed_at is not None, "the reset was not recorded"
        assert closed_at >= reset_at
        if when == "during_body":
            await asyncio.sleep(0.5)
            assert len(server.requests[0].writes) < 5  # the server stopped writing soon after the reset


async def test_scripted_server_keep_alive_serves_two_requests_on_one_connection() -> None:
    script = Script(pieces=sse(*stream_chunks(2)), keep_alive=True)
    async with ScriptedServer(script) as server:
        async with httpx.AsyncClient() as http:
            for _ in range(2):
                response = await http.post(f"{server.base_url}/chat/completions", json=BODY)
                assert response.status_code == 200 and response.text.endswith("data: [DONE]\n\n")
            assert server.connections == 1
            assert [seen.connection for seen in server.requests] == [0, 0]
            assert [seen.disconnected_at for seen in server.requests] == [None, None]
        # The client closed its pool: both requests the connection carried are stamped.
        assert await server.wait_disconnect(1, timeout_s=2.0) is not None
        assert server.requests[0].disconnected_at == server.requests[1].disconnected_at


# -- connections: none left active by a cancellation; reused between calls ------------------------


def pool_state(pool: httpcore.AsyncConnectionPool) -> tuple[int, int]:
    """``(active, idle)`` connections of an httpcore connection pool (``connections`` is public).

    Active = neither idle nor closed: in use by a request, or (the leak of encode/httpcore#1115)
    stuck as in use after its response was closed.
    """
    connections = pool.connections
    idle = sum(1 for c in connections if c.is_idle())
    active = sum(1 for c in connections if not c.is_idle() and not c.is_closed())
    return active, idle


def client_pool(client: HedgingClient) -> httpcore.AsyncConnectionPool:
    """The httpcore pool behind a ``HedgingClient`` (``_pool`` of the httpx transport that its
    ``OwnedTransport`` wraps)."""
    assert client._http is not None
    owned = client._http._transport
    assert isinstance(owned, OwnedTransport)
    inner = owned._inner
    assert isinstance(inner, httpx.AsyncHTTPTransport)
    return inner._pool


def whole_answer_at_once(words: int = 40) -> Script:
    """The whole answer in one write on a keep-alive connection (Content-Length framing)."""
    return Script(pieces=[(0.0, b"".join(data for _, data in sse(*stream_chunks(words))))], keep_alive=True)


async def test_early_exits_leave_no_connection_active_and_a_small_pool_keeps_working() -> None:
    # The app leaves each call at its first token while the upstream has already sent the whole
    # answer: the winner's task is cancelled while httpx closes the finished response, which used
    # to leave the connection ACTIVE for good (20 exits: 20 ACTIVE connections). With a pool of
    # 2, a call after those exits must still complete, not wait forever for a connection.
    async with (
        ScriptedServer(whole_answer_at_once()) as a,
        HedgingClient([Upstream("a", a.base_url)], max_connections=2, policy=HedgePolicy(hedge_after_s=30.0)) as client,
    ):

        async def exit_early() -> str:
            async with client.stream_chat(BODY) as stream:
                async for _ in stream:
                    break
            assert stream.record is not None
            return stream.record.status

        for _ in range(5):  # each bounded: with the leak, the third one waits for a connection forever
            assert await asyncio.wait_for(exit_early(), 10.0) == "cancelled"
            assert pool_state(client_pool(client))[0] == 0
        result = await asyncio.wait_for(client.chat(BODY), 10.0)
        assert result.record.status == "ok" and result.text == "".join(f"w{i} " for i in range(40))
        assert pool_state(client_pool(client))[0] == 0


async def test_cancelling_the_caller_at_any_moment_leaves_no_connection_active() -> None:
    # The caller's task is cancelled after 0, 1, 2, ... event-loop turns: the cancellation lands
    # at every stage of a call (connect, headers, body, the close of a finished response).
    async def call(client: HedgingClient) -> None:
        async with client.stream_chat(BODY) as stream:
            async for _ in stream:
                pass

    async with (
        ScriptedServer(whole_answer_at_once(words=5)) as a,
        ScriptedServer(whole_answer_at_once(words=5)) as b,
        HedgingClient(
            [Upstream("a", a.base_url), Upstream("b", b.base_url)],
            max_connections=2,
            policy=HedgePolicy(hedge_after_s=0.0, budget=1.0, budget_burst=100.0),
        ) as client,
    ):
        for turns in range(60):
            task = asyncio.create_task(call(client))
            for _ in range(turns):
                await asyncio.sleep(0)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            assert pool_state(client_pool(client))[0] == 0, f"a connection left active (cancelled after {turns} turns)"
        result = await asyncio.wait_for(client.chat(BODY), 10.0)
        assert result.record.status == "ok"


async def test_hedged_losers_leave_no_connection_active() -> None:
    # Each call hedges at 0.2 s; the loser is cancelled before its headers (a) or mid-body (b).
    scripts = {
        "before_headers": Script(header_delay_s=30.0, close=False),
        "mid_body": Script(pieces=sse(*stream_chunks(3), first_delay_s=30.0), keep_alive=True),
    }
    for loser in scripts.values():
        async with (
            ScriptedServer(loser) as a,
            ScriptedServer(whole_answer_at_once(words=3)) as b,
            HedgingClient(
                [Upstream("a", a.base_url), Upstream("b", b.base_url)],
                max_connections=2,
                policy=HedgePolicy(hedge_after_s=0.2, budget=1.0, budget_burst=100.0),
            ) as client,
        ):
            for _ in range(4):
                result = await asyncio.wait_for(client.chat(BODY), 10.0)
                assert result.record.winner == "backup"
                assert pool_state(client_pool(client))[0] == 0


async def test_sequential_calls_reuse_one_connection() -> None:
    # The client reads past [DONE] to the end of the body, so the connection goes back to the
    # pool and the next call to the same upstream reuses it (no new TCP/TLS handshake).
    async with ScriptedServer(whole_answer_at_once(words=5)) as a, HedgingClient([Upstream("a", a.base_url)]) as client:
        for _ in range(3):
            result = await client.chat(BODY)
            assert result.record.status == "ok" and result.text == "w0 w1 w2 w3 w4 "
        assert a.connections == 1
        assert [seen.connection for seen in a.requests] == [0, 0, 0]
        assert pool_state(client_pool(client)) == (0, 1)


# -- a break right at the first token of a hedged call: the loser is closed all the same ----------
#
# The earlier tests read hedged calls to the end (the loser had long finished closing when the
# call ended) or left early without a hedge (no loser). The leak needed both: the win cancelled
# the loser, the caller left before the loser's task had run, and the call's end cancelled that
# task a second time, in the middle of httpcore's own close of the connection.


def established_to(port: int) -> int:
    """ESTABLISHED TCP sockets of this machine whose remote end is 127.0.0.1:``port`` (Linux
    ``/proc/net/tcp``; state ``01``); -1 when that file cannot be read."""
    try:
        with open("/proc/net/tcp") as table:
            rows = table.read().splitlines()[1:]
    except OSError:
        return -1
    want = f"0100007F:{port:04X}"
    return sum(1 for row in rows if row.split()[2] == want and row.split()[3] == "01")


def loser_scripts(loser: str) -> tuple[Script, Script]:
    """(primary, backup) scripts with hedge_after_s=0.3: the loser sends its headers at once
    and is mid-body (no token for 30 s, connection held open) when the winner's token comes."""
    winner_stream = answer(first_delay_s=0.4 if loser == "primary" else 1.0, gap_s=0.05, words=40)
    return (silent_body(), winner_stream) if loser == "primary" else (winner_stream, silent_body())


def silent_body() -> Script:
    """Headers at once, then a role-only chunk and no token for 30 s; the connection stays open."""
    return Script(pieces=sse(chunk(role="assistant"), chunk("late"), done=False, gap_s=30.0), close=False)


@pytest.mark.parametrize("loser", ["primary", "backup"])
async def test_break_at_the_first_token_closes_the_loser_at_once(loser: AttemptRole) -> None:
    async with ScriptedServer(loser_scripts(loser)[0]) as a, ScriptedServer(loser_scripts(loser)[1]) as b:
        servers = {"primary": a, "backup": b}
        async with HedgingClient(
            [Upstream("a", a.base_url), Upstream("b", b.base_url)], policy=HedgePolicy(hedge_after_s=0.3, budget=1.0)
        ) as client:
            async with client.stream_chat(BODY) as stream:
                async for _ in stream:
                    break  # no await between the first token and leaving the block
            left_at = time.monotonic()
            record = stream.record
            assert record is not None
            assert record.status == "cancelled" and record.hedged
            assert {a.role: a.outcome for a in record.attempts}[loser] == "cancelled"
            closed_at = await servers[loser].wait_disconnect(0, timeout_s=3.0)
            assert closed_at is not None, f"the {loser}'s connection is still open"
            assert closed_at - left_at < 1.0
            assert pool_state(client_pool(client))[0] == 0


async def test_twenty_breaks_at_the_first_token_leave_nothing_open_and_hedges_keep_working() -> None:
    # With the leak, each call left one connection to the slow upstream ACTIVE: with a pool of
    # 10, the 11th call's hedge waited for a connection forever (each call is bounded here).
    async with (
        ScriptedServer(silent_body()) as slow,
        ScriptedServer(answer(first_delay_s=0.3, gap_s=0.05, words=40)) as fast,
        HedgingClient(
            [Upstream("slow", slow.base_url), Upstream("fast", fast.base_url)],
            max_connections=10,
            policy=HedgePolicy(hedge_after_s=0.1, budget=1.0, budget_burst=100.0),
        ) as client,
    ):

        async def break_at_first_token() -> str | None:
            async with client.stream_chat(BODY) as stream:
                async for _ in stream:
                    break
            assert stream.record is not None
            return stream.record.winner

        for _ in range(20):
            assert await asyncio.wait_for(break_at_first_token(), 10.0) == "backup"
        for index in range(20):
            assert await slow.wait_disconnect(index, timeout_s=2.0) is not None, f"call {index} leaked"
        assert pool_state(client_pool(client))[0] == 0
        assert established_to(slow.port) in (0, -1)
