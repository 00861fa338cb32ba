"""How an attempt's request is built and sent (``hedgerow.client._attempt_io.AttemptSender``).

The attempts skip ``httpx.AsyncClient.send`` and build their requests from per-upstream header
templates; these tests pin what that must keep of httpx's ``build_request`` + ``send``: the
headers (each once, later sources replacing earlier ones case-insensitively), the cookie jar,
Basic auth from a URL's credentials, the request on a transport error, httpx's log line, and
the refusal of a closed client.
"""

from __future__ import annotations

import base64
import json
import logging
import uuid
from collections.abc import Callable, Mapping

import httpx
import pytest

from hedgerow.client import AllAttemptsFailed, HedgingClient, Upstream
from hedgerow.client._attempt_io import AttemptSender, attempt_request_id
from hedgerow.client._transport import OwnedTransport
from tests.client.scripted_server import chunk, sse
from tests.helpers import BODY

SSE_BODY = b"".join(data for _, data in sse(chunk("hi", role="assistant"), chunk(finish="stop")))


def recording(seen: list[httpx.Request], headers: Callable[[int], dict[str, str]] | None = None) -> httpx.MockTransport:
    """A transport that keeps every request and answers a short SSE stream (with ``headers(i)``)."""

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        extra = headers(len(seen) - 1) if headers else {}
        return httpx.Response(200, headers={"Content-Type": "text/event-stream", **extra}, content=SSE_BODY)

    return httpx.MockTransport(handle)


async def text_of(
    client: HedgingClient,
    *,
    primary: str | int | None = None,
    request_id: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> str:
    """The answer text of one ``stream_chat`` call of ``BODY`` (the arguments as ``stream_chat``'s)."""
    out: list[str] = []
    async with client.stream_chat(BODY, primary=primary, request_id=request_id, headers=headers) as stream:
        async for c in stream:
            out.extend(choice["delta"].get("content") or "" for choice in c["choices"])
    return "".join(out)


async def test_an_attempt_sends_each_header_once_the_later_source_winning_case_insensitively() -> None:
    # Sources, later replacing earlier: httpx's defaults, the caller's headers, the client's own
    # (Accept, Content-Type, Authorization), the upstream's headers; then the attempt's ids.
    seen: list[httpx.Request] = []
    upstream = Upstream(
        "a", "http://a.test/v1", api_key="sk-a", headers={"accept": "application/x-ndjson", "X-Tenant": "t1"}
    )
    caller = {"User-Agent": "OpenAI/Python", "x-request-id": "caller's", "X-App": "app", "content-type": "text/plain"}
    async with HedgingClient([upstream], transport=recording(seen)) as client:
        assert await text_of(client, request_id="r1", headers=caller) == "hi"
        assert await text_of(client, request_id="r2") == "hi"
    with_caller, plain = ([(k.lower(), v) for k, v in r.headers.multi_items()] for r in seen)
    for items in (with_caller, plain):
        names = [k for k, _ in items]
        assert len(names) == len(set(names)), items  # no header twice
    async with httpx.AsyncClient() as plain_client:  # httpx's default headers, for comparison
        defaults = plain_client.headers
    content_length = str(len(seen[0].content))
    assert dict(with_caller) == {
        "host": "a.test",
        "accept-encoding": defaults["accept-encoding"],
        "connection": "keep-alive",
        "user-agent": "OpenAI/Python",
        "x-app": "app",
        "accept": "application/x-ndjson",
        "content-type": "application/json",
        "authorization": "Bearer sk-a",
        "x-tenant": "t1",
        "x-request-id": attempt_request_id("r1", "primary"),
        "idempotency-key": "r1",
        "x-hedgerow-attempt": "primary",
        "content-length": content_length,
    }
    expected_plain = {
        **dict(with_caller),
        "user-agent": defaults["user-agent"],
        "x-request-id": attempt_request_id("r2", "primary"),
        "idempotency-key": "r2",
    }
    del expected_plain["x-app"]
    assert dict(plain) == expected_plain
    assert json.loads(seen[1].content)["stream"] is True
    assert seen[0].extensions["timeout"]["connect"] == client.policy.connect_timeout_s


async def test_an_upstream_header_named_like_an_attempt_id_or_host_is_sent_instead_of_it() -> None:
    seen: list[httpx.Request] = []
    fixed = "0f5e3b8c-0000-4000-8000-000000000000"
    upstream = Upstream("a", "http://a.test:8080/v1", headers={"X-Request-ID": fixed, "host": "api.internal"})
    async with HedgingClient([upstream, Upstream("b", "http://b.test:8081/v1")], transport=recording(seen)) as client:
        await text_of(client)
        await text_of(client, primary="b")
    assert seen[0].headers.get_list("x-request-id") == [fixed]
    assert seen[0].headers.get_list("host") == ["api.internal"]
    assert seen[1].headers.get_list("host") == ["b.test:8081"]  # as httpx sets it: host and port


async def test_the_default_call_id_is_a_random_version_4_uuid_in_hex() -> None:
    async with HedgingClient([Upstream("a", "http://a.test/v1")], transport=recording([])) as client:
        ids = [client.stream_chat(BODY).request_id for _ in range(50)]
    assert len(set(ids)) == 50
    assert all(len(i) == 32 and uuid.UUID(hex=i).hex == i and uuid.UUID(hex=i).version == 4 for i in ids)
    assert all(uuid.UUID(hex=i).variant == uuid.RFC_4122 for i in ids)


async def test_a_cookie_an_upstream_sets_is_sent_back_as_httpx_would() -> None:
    # A load balancer's sticky-session cookie: httpx's cookie jar keeps it for the next request.
    seen: list[httpx.Request] = []
    set_cookie = recording(seen, lambda i: {"Set-Cookie": "lb=node7; Path=/"} if i == 0 else {})
    async with HedgingClient([Upstream("a", "http://a.test/v1")], transport=set_cookie) as client:
        await text_of(client)
        await text_of(client)
    assert "cookie" not in seen[0].headers
    assert seen[1].headers["cookie"] == "lb=node7"


async def test_credentials_in_an_upstream_url_are_sent_as_basic_auth() -> None:
    seen: list[httpx.Request] = []
    async with HedgingClient([Upstream("a", "http://user:pw@a.test/v1")], transport=recording(seen)) as client:
        assert await text_of(client) == "hi"
    assert seen[0].headers["authorization"] == "Basic " + base64.b64encode(b"user:pw").decode()


async def test_a_transport_error_carries_its_request_and_httpx_logs_each_request(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        if request.url.host == "down.test":
            raise httpx.ConnectError("refused")  # raised without its request, as httpcore's mapping does
        return httpx.Response(200, headers={"Content-Type": "text/event-stream"}, content=SSE_BODY)

    upstreams = [Upstream("down", "http://down.test/v1"), Upstream("up", "http://up.test/v1")]
    caplog.set_level(logging.INFO, logger="httpx")
    async with HedgingClient(upstreams, transport=httpx.MockTransport(refuse)) as client:
        async with client.stream_chat(BODY) as stream:
            [c async for c in stream]
        record = stream.record
        assert record is not None and record.winner == "backup"
        async with HedgingClient(upstreams[:1], transport=httpx.MockTransport(refuse)) as alone:
            with pytest.raises(AllAttemptsFailed) as failed:
                await text_of(alone)
    ((name, error),) = failed.value.errors
    assert name == "down" and isinstance(error, httpx.ConnectError)
    assert error.request.url == "http://down.test/v1/chat/completions"
    lines = [r.getMessage() for r in caplog.records if r.name == "httpx"]
    assert lines == ['HTTP Request: POST http://up.test/v1/chat/completions "HTTP/1.1 200 OK"']


async def test_a_closed_client_refuses_to_send() -> None:
    transport = OwnedTransport(recording([]))
    http = httpx.AsyncClient(transport=transport)
    sender = AttemptSender(http, transport)
    request = httpx.Request("POST", "http://a.test/v1/chat/completions", content=b"{}")
    response = await sender.send(request)
    assert response.status_code == 200 and response.request is request
    await response.aclose()
    await http.aclose()
    with pytest.raises(RuntimeError, match="client has been closed"):
        await sender.send(request)
