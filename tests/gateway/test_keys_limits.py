"""Callers' keys and the gateway's limits, over real HTTP on loopback against scripted upstreams.

The tokens of ``HEDGEROW_TOKENS`` with the ``gateway`` scope are keys beside the keys file's; a
key's name is the caller's name in every record (``client``) and in the metrics (``key``); the
caller's key never reaches an upstream. Every refusal is an OpenAI-shaped error with its status
and headers: 401, 404, 413 (declared and streamed bodies), 429 for the total and the per-key
concurrency (``Retry-After``), 504 for a call past its total time.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from hedgerow.cli.gateway import _gateway_config
from hedgerow.client import CallRecord, HedgePolicy, Upstream
from hedgerow.gateway import GatewayApp, GatewayConfig
from tests.client.scripted_server import Script, ScriptedServer, Seen, chunk, sse
from tests.gateway.conftest import FAKE_UPSTREAM_KEY, GatewayServer, one_route

CHAT: dict[str, Any] = {"model": "gpt-fast", "messages": [{"role": "user", "content": "hi"}]}
STREAM: dict[str, Any] = {**CHAT, "stream": True}
POLICY = HedgePolicy(hedge_after_s=5.0, total_timeout_s=20.0)
ALICE = "gw-alice-key-0123456789abcdef"
BOB = "gw-bob-key-0123456789abcdef"
CAROL = "gw-carol-key-0123456789abcdef"
#: Tokens of HEDGEROW_TOKENS: a named and an unnamed one with the gateway scope, one without it.
TOKEN_NAMED = "tok-gateway-named-0123456789"
TOKEN_UNNAMED = "tok-gateway-unnamed-0123456789"
TOKEN_READ = "tok-read-only-0123456789abcd"
TOKENS = f"dana={TOKEN_NAMED}:gateway,{TOKEN_UNNAMED}:gateway+ingest,erin={TOKEN_READ}:read"


class Records:
    """A record sink that keeps every record it is handed (the next sink of the ``RecordLog``)."""

    def __init__(self) -> None:
        self.records: list[CallRecord] = []

    def submit(self, record: CallRecord) -> None:
        """Keep ``record``."""
        self.records.append(record)


def bearer(key: str) -> dict[str, str]:
    """The ``Authorization`` header of ``key``."""
    return {"Authorization": f"Bearer {key}"}


def assert_openai_error(answer: httpx.Response, status: int, type_: str, code: str) -> dict[str, Any]:
    """Check ``answer`` is the OpenAI-shaped error ``{"error": {message, type, param, code}}``
    with ``status``, ``type_`` and ``code``, as JSON with its length; returns the error object."""
    assert answer.status_code == status, answer.text
    assert answer.headers["content-type"] == "application/json"
    assert int(answer.headers["content-length"]) == len(answer.content)
    body = answer.json()
    assert list(body) == ["error"]
    error: dict[str, Any] = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == type_ and error["code"] == code
    assert error["message"].startswith(("hedgerow gateway: ", "The model "))
    return error


def first_token_then_silence() -> Script:
    """A stream that sends its first token, then nothing, keeping the connection open."""
    return Script(pieces=sse(chunk("hello", role="assistant"), done=False), close=False)


def answers(_index: int, seen: Seen) -> Script:
    """A streamed answer for a streamed request, else a whole one."""
    if seen.body is not None and seen.body.get("stream"):
        return Script(pieces=sse(chunk("ok", role="assistant"), chunk(finish="stop")))
    whole = {"id": "x", "object": "chat.completion", "model": "m", "choices": []}
    return Script(content_type="application/json", pieces=[(0.0, json.dumps(whole).encode())])


async def wait_for(predicate: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    """Poll ``predicate`` every 50 ms until it holds or ``timeout_s`` passed; returns the last value."""
    for _ in range(int(timeout_s / 0.05)):
        if predicate():
            return True
        await asyncio.sleep(0.05)
    return predicate()


@pytest.fixture
async def caller() -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client for the gateway (30 s timeout)."""
    async with httpx.AsyncClient(timeout=30) as client:
        yield client


def key_labels(scrape: str) -> dict[tuple[str, str, str], float]:
    """``hedgerow_gateway_requests_total`` by (key, outcome, status)."""
    found: dict[tuple[str, str, str], float] = {}
    for family in text_string_to_metric_families(scrape):
        for sample in family.samples:
            if sample.name == "hedgerow_gateway_requests_total":
                labels = sample.labels
                found[(labels["key"], labels["outcome"], labels["status"])] = sample.value
    return found


async def test_gateway_tokens_are_keys_named_in_records_and_metrics(
    caller: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HEDGEROW_GATEWAY_KEYS", f"alice={ALICE}")
    sink = Records()
    async with ScriptedServer(answers) as upstream:
        config: GatewayConfig = _gateway_config(
            None, [f"up={upstream.base_url}"], "gpt-fast", None, None, tokens=TOKENS
        )
        # the upstream's key: --upstream takes none, so the one route gets it here
        spec = config.routes["gpt-fast"]
        keyed = (Upstream("up", upstream.base_url, api_key=FAKE_UPSTREAM_KEY),)
        config = GatewayConfig(
            routes={"gpt-fast": type(spec)(spec.public_model, spec.route, keyed, spec.policy)}, keys=config.keys
        )
        app = GatewayApp(config, telemetry=sink)
        with GatewayServer(app) as server:
            url = server.base_url + "/chat/completions"
            for key in (ALICE, TOKEN_NAMED, TOKEN_UNNAMED):
                for request in (CHAT, STREAM):
                    answer = await caller.post(url, json=request, headers=bearer(key))
                    assert answer.status_code == 200, answer.text
            refused = await caller.post(url, json=CHAT, headers=bearer(TOKEN_READ))  # no gateway scope
            assert_openai_error(refused, 401, "invalid_request_error", "invalid_api_key")
            assert await wait_for(lambda: len(sink.records) == 6)
            scrape = (await caller.get(f"http://127.0.0.1:{server.port}/metrics", headers=bearer(ALICE))).text
    clients = [r.client for r in sink.records]
    assert clients[:4] == ["alice", "alice", "dana", "dana"]
    assert clients[4] == clients[5] and str(clients[4]).startswith("token:")  # an unnamed token's fingerprint
    assert TOKEN_UNNAMED not in str(clients[4])
    counted = key_labels(scrape)
    assert counted[("alice", "ok", "200")] == 2 and counted[("dana", "ok", "200")] == 2
    assert counted[(str(clients[4]), "ok", "200")] == 2 and counted[("", "refused", "401")] == 1
    # no caller's key went upstream: each request carried the upstream's own
    assert len(upstream.requests) == 6
    for seen in upstream.requests:
        assert seen.headers["authorization"] == f"Bearer {FAKE_UPSTREAM_KEY}"
        sent = json.dumps(seen.headers)
        assert all(key not in sent for key in (ALICE, TOKEN_NAMED, TOKEN_UNNAMED))
    for secret in (ALICE, TOKEN_NAMED, TOKEN_UNNAMED, FAKE_UPSTREAM_KEY):
        assert secret not in scrape
        assert all(secret not in json.dumps(r.to_dict()) for r in sink.records)


async def test_every_record_of_a_keyed_call_names_its_caller(caller: httpx.AsyncClient) -> None:
    """Whole, streamed, failed and cancelled calls: each record's ``client`` is the key's name."""
    sink = Records()
    broken = Script(status=500, content_type="application/json", pieces=[(0, b'{"error": {"message": "x"}}')])
    async with ScriptedServer(first_token_then_silence()) as holding, ScriptedServer(broken) as failing:
        config = GatewayConfig(
            routes={
                **one_route([Upstream("a", holding.base_url)], public="held").routes,
                **one_route([Upstream("b", failing.base_url)], public="broken").routes,
            },
            keys={ALICE: "alice", BOB: "bob"},
        )
        app = GatewayApp(config, telemetry=sink)
        with GatewayServer(app) as server:
            url = server.base_url + "/chat/completions"
            failed = await caller.post(url, json={**CHAT, "model": "broken"}, headers=bearer(BOB))
            assert_openai_error(failed, 502, "api_error", "upstream_error")
            async with caller.stream("POST", url, json={**STREAM, "model": "held"}, headers=bearer(ALICE)) as r:
                assert r.status_code == 200
                async for _ in r.aiter_raw():
                    break  # leave after the first token: the call is cancelled
            assert await wait_for(lambda: len(sink.records) == 2)
    by_status = {r.status: r.client for r in sink.records}
    assert by_status == {"error": "bob", "cancelled": "alice"}


async def test_concurrency_per_key_and_in_all_are_429_with_retry_after(caller: httpx.AsyncClient) -> None:
    async with ScriptedServer(first_token_then_silence()) as upstream:
        keys = {ALICE: "alice", BOB: "bob", CAROL: "carol"}
        config = one_route([Upstream("a", upstream.base_url)], keys=keys, max_concurrent=2, max_concurrent_per_key=1)
        app = GatewayApp(config)
        with GatewayServer(app) as server:
            url = server.base_url + "/chat/completions"
            async with caller.stream("POST", url, json=STREAM, headers=bearer(ALICE)) as first:
                assert first.status_code == 200
                again = await caller.post(url, json=STREAM, headers=bearer(ALICE))
                error = assert_openai_error(again, 429, "rate_limit_error", "key_busy")
                assert again.headers["retry-after"] == "1"
                assert "'alice'" in error["message"] and ALICE not in again.text
                async with caller.stream("POST", url, json=STREAM, headers=bearer(BOB)) as other:
                    assert other.status_code == 200  # another key's stream is let in
                    busy = await caller.post(url, json=STREAM, headers=bearer(CAROL))
                    assert_openai_error(busy, 429, "rate_limit_error", "gateway_busy")
                    assert busy.headers["retry-after"] == "1"
                    assert app.in_flight_by_key == {"alice": 1, "bob": 1}
            # both streams closed: their slots are free again
            assert await wait_for(lambda: app.in_flight == 0 and not app.in_flight_by_key)
            async with caller.stream("POST", url, json=STREAM, headers=bearer(ALICE)) as later:
                assert later.status_code == 200
            scrape = (await caller.get(f"http://127.0.0.1:{server.port}/metrics", headers=bearer(BOB))).text
    counted = key_labels(scrape)
    assert counted[("alice", "refused", "429")] == 1 and counted[("carol", "refused", "429")] == 1
    assert len(upstream.requests) == 3


async def test_a_body_too_large_is_413_declared_or_streamed(caller: httpx.AsyncClient) -> None:
    async with ScriptedServer(Script(pieces=sse(chunk("ok", role="assistant")))) as upstream:
        app = GatewayApp(one_route([Upstream("a", upstream.base_url)], policy=POLICY, max_body_bytes=2048))
        with GatewayServer(app) as server:
            url = server.base_url + "/chat/completions"
            big = json.dumps({**CHAT, "messages": [{"role": "user", "content": "x" * 4096}]}).encode()
            declared = await caller.post(url, content=big, headers={"content-type": "application/json"})
            error = assert_openai_error(declared, 413, "invalid_request_error", "request_too_large")
            assert "2048 bytes" in error["message"]

            async def pieces() -> AsyncIterator[bytes]:  # no Content-Length: the gateway counts as it reads
                for start in range(0, len(big), 512):
                    yield big[start : start + 512]

            streamed = await caller.post(url, content=pieces(), headers={"content-type": "application/json"})
            assert "content-length" not in streamed.request.headers
            assert_openai_error(streamed, 413, "invalid_request_error", "request_too_large")
            small = await caller.post(url, json=STREAM)
            assert small.status_code == 200
    assert len(upstream.requests) == 1


async def test_unknown_model_is_404_and_a_call_past_its_total_time_is_504(caller: httpx.AsyncClient) -> None:
    late = Script(pieces=sse(chunk("late", role="assistant")), header_delay_s=10.0)
    async with ScriptedServer(late) as upstream:
        policy = HedgePolicy(hedge_after_s=5.0, total_timeout_s=0.5)
        app = GatewayApp(one_route([Upstream("a", upstream.base_url)], policy=policy))
        with GatewayServer(app) as server:
            url = server.base_url + "/chat/completions"
            unknown = await caller.post(url, json={**CHAT, "model": "nope"})
            error = assert_openai_error(unknown, 404, "invalid_request_error", "model_not_found")
            assert error["param"] == "model"
            for request in (CHAT, STREAM):
                started = asyncio.get_running_loop().time()
                timed_out = await caller.post(url, json=request)
                waited_s = asyncio.get_running_loop().time() - started
                assert_openai_error(timed_out, 504, "api_error", "upstream_timeout")
                assert waited_s < 8.0  # the total time (0.5 s), not the upstream's 10 s
                assert timed_out.headers["x-hedgerow-request-id"]
