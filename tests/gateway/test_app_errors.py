"""The gateway's own rules, against scripted upstreams on loopback (which record what they were
sent and when their connection ended): a caller that leaves cancels every attempt, a 4xx passes
through, failures become OpenAI-shaped 502/503/504, auth, limits, and no key in any answer or log."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator

import httpx
import pytest

from hedgerow.client import HedgePolicy, Upstream
from hedgerow.gateway import GatewayApp
from tests.client.scripted_server import Script, ScriptedServer, chunk, sse
from tests.gateway.conftest import FAKE_UPSTREAM_KEY, GATEWAY_KEY, GatewayServer, one_route
from tests.helpers import free_port

CHAT = {"model": "gpt-fast", "messages": [{"role": "user", "content": "hi"}]}
STREAM = {**CHAT, "stream": True}
POLICY = HedgePolicy(hedge_after_s=5.0, total_timeout_s=20.0)


def first_token_then_silence() -> Script:
    """A stream that sends its first token, then nothing, keeping the connection open."""
    return Script(pieces=sse(chunk("hello", role="assistant"), done=False), close=False)


def error_script(status: int, message: str) -> Script:
    body = {"error": {"message": message, "type": "server_error", "param": None, "code": None}}
    return Script(status=status, content_type="application/json", pieces=[(0, json.dumps(body).encode())])


@pytest.fixture
async def caller() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=30) as client:
        yield client


def serve(upstreams: list[Upstream], **kwargs: object) -> tuple[GatewayApp, GatewayServer]:
    app = GatewayApp(one_route(upstreams, policy=kwargs.pop("policy", POLICY), **kwargs))  # type: ignore[arg-type]
    return app, GatewayServer(app)


async def wait_for(predicate, timeout_s: float = 10.0) -> bool:  # type: ignore[no-untyped-def]
    for _ in range(int(timeout_s / 0.05)):
        if predicate():
            return True
        await asyncio.sleep(0.05)
    return bool(predicate())


async def test_a_caller_leaving_mid_stream_closes_the_upstream_and_records_cancelled(caller) -> None:  # type: ignore[no-untyped-def]
    async with ScriptedServer(first_token_then_silence()) as upstream:
        app, server = serve([Upstream("a", upstream.base_url, api_key=FAKE_UPSTREAM_KEY)])
        with server:
            async with caller.stream("POST", server.base_url + "/chat/completions", json=STREAM) as response:
                assert response.status_code == 200
                async for piece in response.aiter_raw():
                    assert b"hello" in piece
                    break  # leave: the response is closed, and so is the connection
            assert await upstream.wait_disconnect(0, timeout_s=5.0) is not None
            assert await wait_for(lambda: app.records.counts["cancelled"] == 1)


async def test_a_caller_leaving_before_the_first_token_cancels_every_attempt(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="hedgerow.gateway")
    silent = Script(pieces=sse(chunk("late", role="assistant")), header_delay_s=30.0)
    async with ScriptedServer(silent) as primary, ScriptedServer(silent) as backup:
        policy = HedgePolicy(hedge_after_s=0.2, budget=1.0, total_timeout_s=60.0)
        app, server = serve([Upstream("a", primary.base_url), Upstream("b", backup.base_url)], policy=policy)
        with server:
            async with httpx.AsyncClient(timeout=httpx.Timeout(1.5)) as short:
                with pytest.raises(httpx.ReadTimeout):
                    await short.post(server.base_url + "/chat/completions", json=STREAM)
            assert await primary.wait_disconnect(0, timeout_s=5.0) is not None
            assert await backup.wait_disconnect(0, timeout_s=5.0) is not None
            assert await wait_for(lambda: app.records.counts["cancelled"] == 1)
            assert await wait_for(lambda: any(getattr(r, "event", None) == "gateway_request" for r in caplog.records))
    lines = [r.fields for r in caplog.records if getattr(r, "event", None) == "gateway_request"]  # type: ignore[attr-defined]
    assert [(line["status"], line["outcome"]) for line in lines] == [(499, "cancelled")]
    assert "status=499" in caplog.text and "status=None" not in caplog.text


async def test_upstream_4xx_passes_through_unchanged(caller) -> None:  # type: ignore[no-untyped-def]
    body = {"error": {"message": "bad messages", "type": "invalid_request_error", "param": "messages", "code": None}}
    script = Script(status=400, content_type="application/json", pieces=[(0, json.dumps(body).encode())])
    async with ScriptedServer(script) as upstream:
        _, server = serve([Upstream("a", upstream.base_url)])
        with server:
            for request in (CHAT, STREAM):
                answer = await caller.post(server.base_url + "/chat/completions", json=request)
                assert answer.status_code == 400
                assert answer.json() == body


async def test_failures_are_openai_shaped_502_503_504(caller) -> None:  # type: ignore[no-untyped-def]
    async with (
        ScriptedServer(error_script(500, "boom")) as broken,
        ScriptedServer(Script(pieces=sse(chunk("x")), header_delay_s=10.0)) as slow,
    ):
        cases = [
            ([Upstream("a", broken.base_url), Upstream("b", broken.base_url)], POLICY, 502, "upstream_error"),
            ([Upstream("a", f"http://127.0.0.1:{free_port()}/v1")], POLICY, 503, "upstream_unreachable"),
            ([Upstream("a", slow.base_url)], HedgePolicy(total_timeout_s=1.0), 504, "upstream_timeout"),
        ]
        for upstreams, policy, status, code in cases:
            _, server = serve(upstreams, policy=policy)
            with server:
                for request in (CHAT, STREAM):
                    answer = await caller.post(server.base_url + "/chat/completions", json=request)
                    assert answer.status_code == status, (code, answer.text)
                    error = answer.json()["error"]
                    assert error["code"] == code and error["type"] == "api_error"
                    assert error["message"].startswith("hedgerow gateway: ")
                    # the caller can find the failed call's record: its id, no winner, hedged or not
                    assert answer.headers["x-hedgerow-request-id"], (code, dict(answer.headers))
                    assert answer.headers["x-hedgerow-winner"] == ""
                    assert answer.headers["x-hedgerow-hedged"] in ("true", "false")


async def test_an_error_after_the_first_token_ends_the_stream_with_an_error_event(caller) -> None:  # type: ignore[no-untyped-def]
    async with ScriptedServer(first_token_then_silence()) as upstream:
        policy = HedgePolicy(hedge_after_s=5.0, stall_timeout_s=0.5, total_timeout_s=20.0)
        _, server = serve([Upstream("a", upstream.base_url)], policy=policy)
        with server:
            answer = await caller.post(server.base_url + "/chat/completions", json=STREAM)
    assert answer.status_code == 200
    events = [line[6:] for line in answer.text.splitlines() if line.startswith("data: ")]
    assert json.loads(events[0])["choices"][0]["delta"]["content"] == "hello"
    assert json.loads(events[-1])["error"]["code"] == "upstream_timeout"
    assert "[DONE]" not in events


async def test_auth_refuses_a_missing_or_wrong_key_and_never_forwards_the_callers(caller) -> None:  # type: ignore[no-untyped-def]
    async with ScriptedServer(Script(pieces=sse(chunk("ok", role="assistant")))) as upstream:
        _, server = serve([Upstream("a", upstream.base_url, api_key=FAKE_UPSTREAM_KEY)], keys={GATEWAY_KEY: "tests"})
        with server:
            url = server.base_url + "/chat/completions"
            for headers in ({}, {"Authorization": "Bearer wrong-key-0123456789"}, {"Authorization": GATEWAY_KEY}):
                answer = await caller.post(url, json=STREAM, headers=headers)
                assert answer.status_code == 401
                assert answer.json()["error"]["code"] == "invalid_api_key"
            models = await caller.get(server.base_url + "/models")
            assert models.status_code == 401
            assert upstream.requests == []
            answer = await caller.post(url, json=STREAM, headers={"Authorization": f"Bearer {GATEWAY_KEY}"})
            assert answer.status_code == 200
    sent = upstream.requests[0].headers
    assert sent["authorization"] == f"Bearer {FAKE_UPSTREAM_KEY}"
    assert GATEWAY_KEY not in json.dumps(sent)


async def test_limits_body_size_413_and_concurrency_429(caller) -> None:  # type: ignore[no-untyped-def]
    async with ScriptedServer(first_token_then_silence()) as upstream:
        _, server = serve([Upstream("a", upstream.base_url)], max_body_bytes=2048, max_concurrent=1)
        with server:
            url = server.base_url + "/chat/completions"
            big = {**CHAT, "messages": [{"role": "user", "content": "x" * 4096}]}
            answer = await caller.post(url, json=big)
            assert answer.status_code == 413
            assert answer.json()["error"]["code"] == "request_too_large"
            async with caller.stream("POST", url, json=STREAM) as first:
                assert first.status_code == 200
                busy = await caller.post(url, json=STREAM)
                assert busy.status_code == 429
                assert busy.headers["retry-after"] == "1"
                assert busy.json()["error"]["code"] == "gateway_busy"
        assert len(upstream.requests) == 1


async def test_no_upstream_key_in_any_answer_or_log_line(caller, caplog) -> None:  # type: ignore[no-untyped-def]
    caplog.set_level(logging.DEBUG)
    echo = error_script(500, f"Incorrect API key provided: {FAKE_UPSTREAM_KEY}")
    echo_4xx = error_script(401, f"Incorrect API key provided: {FAKE_UPSTREAM_KEY}")
    seen: list[str] = []
    async with (
        ScriptedServer(echo) as echoing,
        ScriptedServer(echo_4xx) as refusing,
        ScriptedServer(first_token_then_silence()) as stalling,
    ):
        down = f"http://127.0.0.1:{free_port()}/v1"
        setups = [
            ([echoing.base_url, echoing.base_url], POLICY),
            ([refusing.base_url], POLICY),
            ([down, down], POLICY),
            ([stalling.base_url], HedgePolicy(stall_timeout_s=0.3, total_timeout_s=20.0)),
            ([stalling.base_url], HedgePolicy(total_timeout_s=0.5)),
        ]
        for urls, policy in setups:
            ups = [Upstream(f"u{i}", url, api_key=FAKE_UPSTREAM_KEY) for i, url in enumerate(urls)]
            _, server = serve(ups, policy=policy)
            with server:
                for request in (CHAT, STREAM, {"model": "nope"}, b"{not json"):
                    kwargs = {"content": request} if isinstance(request, bytes) else {"json": request}
                    answer = await caller.post(server.base_url + "/chat/completions", **kwargs)
                    seen.append(f"{answer.status_code} {answer.headers} {answer.text}")
                seen.append((await caller.get(server.base_url + "/models")).text)
    assert {s[:3] for s in seen} >= {"502", "401", "503", "504", "400", "404", "200"}
    assert "Incorrect API key provided: [redacted]" in "\n".join(seen)
    for text in [*seen, caplog.text]:
        assert FAKE_UPSTREAM_KEY not in text


async def test_a_known_path_with_another_method_is_405_with_allow(caller: httpx.AsyncClient) -> None:
    async with ScriptedServer(Script(pieces=sse(chunk("x")))) as upstream:
        _, server = serve([Upstream("a", upstream.base_url)], policy=POLICY)
        with server:
            cases = [("GET", "/chat/completions", "POST"), ("GET", "/responses/", "POST")]
            cases += [("PUT", "/chat/completions", "POST"), ("POST", "/models", "GET"), ("DELETE", "/models", "GET")]
            for method, path, allowed in cases:
                answer = await caller.request(method, server.base_url + path)
                assert answer.status_code == 405, (method, path, answer.text)
                assert answer.headers["allow"] == allowed
                error = answer.json()["error"]
                assert error["code"] == "method_not_allowed" and error["type"] == "invalid_request_error"
                assert allowed in error["message"] and method in error["message"]
            unknown = await caller.get(server.base_url + "/chat/nowhere")
            assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "unknown_url"
        assert upstream.requests == []
