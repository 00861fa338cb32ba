"""503 ``upstream_unreachable`` only when no upstream could be connected to; an upstream that was
reached but answered something that is not an answer (a 200 that is not a stream or not JSON)
is 502 ``upstream_error``; a backup the failover budget refused is named in the message. Real
HTTP on loopback: the gateway under uvicorn in front of scripted upstreams."""

from __future__ import annotations

from typing import Any

import httpx

from hedgerow.client import HedgePolicy, Upstream
from hedgerow.gateway import GatewayApp
from tests.client.scripted_server import Script, ScriptedServer
from tests.gateway.conftest import GatewayServer, one_route
from tests.helpers import free_port

PATIENT = HedgePolicy(hedge_after_s=5.0, total_timeout_s=20.0)
#: One token: the first failed attempt spends it, so the failover to the backup is refused.
SPENT = HedgePolicy(hedge_after_s=5.0, total_timeout_s=20.0, failover_budget_tokens=1.0)
NOT_SSE = Script(content_type="text/plain", pieces=[(0, b"hello, I am not a stream\n")])
BUSY = Script(status=503, content_type="application/json", pieces=[(0, b'{"error": {"message": "busy"}}')])


def chat(stream: bool) -> dict[str, Any]:
    """A chat body for the model ``gpt-fast``."""
    return {"model": "gpt-fast", "messages": [{"role": "user", "content": "hi"}], "stream": stream}


async def ask(upstreams: list[Upstream], policy: HedgePolicy, stream: bool) -> httpx.Response:
    """One chat call through a fresh gateway over ``upstreams``."""
    with GatewayServer(GatewayApp(one_route(upstreams, policy=policy))) as server:
        async with httpx.AsyncClient(timeout=30) as caller:
            return await caller.post(server.base_url + "/chat/completions", json=chat(stream))


def error_of(response: httpx.Response) -> dict[str, Any]:
    """The ``error`` object of an OpenAI-shaped error answer."""
    error = response.json()["error"]
    assert isinstance(error, dict)
    return error


async def test_a_reached_upstream_that_sends_no_answer_is_502_not_503() -> None:
    async with ScriptedServer(NOT_SSE) as broken:
        for stream in (True, False):
            answer = await ask([Upstream("e1", broken.base_url)], PATIENT, stream)
            assert answer.status_code == 502, answer.text
            error = error_of(answer)
            assert error["code"] == "upstream_error"
            assert "could be reached" not in error["message"] and "e1" in error["message"]
            assert "failover budget" not in error["message"]


async def test_no_upstream_to_connect_to_is_503() -> None:
    down = f"http://127.0.0.1:{free_port()}/v1"
    answer = await ask([Upstream("d1", down), Upstream("d2", down)], PATIENT, True)
    assert answer.status_code == 503, answer.text
    assert error_of(answer)["code"] == "upstream_unreachable"


async def test_a_backup_refused_by_the_failover_budget_is_named_in_the_message() -> None:
    async with ScriptedServer(NOT_SSE) as broken, ScriptedServer(BUSY) as busy, ScriptedServer(NOT_SSE) as backup:
        for primary in (broken, busy):  # no HTTP answer; an HTTP 503
            answer = await ask([Upstream("e1", primary.base_url), Upstream("e2", backup.base_url)], SPENT, True)
            assert answer.status_code == 502, answer.text
            error = error_of(answer)
            assert error["code"] == "upstream_error"
            assert "the backup was not tried because the failover budget was spent" in error["message"]
        assert backup.requests == []
