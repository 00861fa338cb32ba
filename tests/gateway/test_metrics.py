"""The ``hedgerow_gateway_*`` family at the gateway's ``GET /metrics``, over real HTTP on loopback:
each request counted once by route, public model, outcome, status and the caller's key name, the
in-flight gauge, the latency histograms, the key needed to scrape, and no key in the text."""

from __future__ import annotations

import json

import httpx
from prometheus_client.parser import text_string_to_metric_families

from hedgerow.client import HedgePolicy, Upstream
from hedgerow.gateway import GatewayApp
from tests.client.scripted_server import Script, ScriptedServer, chunk, sse
from tests.gateway.conftest import FAKE_UPSTREAM_KEY, GATEWAY_KEY, GatewayServer, one_route

POLICY = HedgePolicy(hedge_after_s=5.0, total_timeout_s=20.0)
CHAT = {"model": "gpt-fast", "messages": [{"role": "user", "content": "hi"}]}
AUTH = {"Authorization": f"Bearer {GATEWAY_KEY}"}


def samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Every sample of the text format by sample name."""
    found: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return found


def value(found: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: str) -> float:
    """The value of the one sample ``name`` with exactly ``labels`` (0 when there is none)."""
    matching = [v for got, v in found.get(name, []) if got == labels]
    assert len(matching) <= 1, (name, labels)
    return matching[0] if matching else 0.0


def by_call(request_index: int, _seen: object) -> Script:
    """First request: a stream; second: a non-streamed answer; then 503s."""
    if request_index == 0:
        return Script(pieces=sse(chunk("hi", role="assistant"), chunk(finish="stop")))
    if request_index == 1:
        answer = {"id": "x", "object": "chat.completion", "model": "m", "choices": []}
        return Script(content_type="application/json", pieces=[(0.0, json.dumps(answer).encode())])
    error = {"error": {"message": "down", "type": "server_error", "param": None, "code": None}}
    return Script(status=503, content_type="application/json", pieces=[(0.0, json.dumps(error).encode())])


async def test_every_request_is_counted_once_by_route_model_outcome_status_and_key_name() -> None:
    async with ScriptedServer(by_call) as upstream:
        upstreams = [Upstream("a", upstream.base_url, api_key=FAKE_UPSTREAM_KEY)]
        app = GatewayApp(one_route(upstreams, policy=POLICY, keys={GATEWAY_KEY: "team"}))
        with GatewayServer(app) as server:
            base = server.base_url
            async with httpx.AsyncClient(timeout=30, headers=AUTH) as caller:
                async with caller.stream("POST", base + "/chat/completions", json={**CHAT, "stream": True}) as r:
                    assert r.status_code == 200
                    await r.aread()
                assert (await caller.post(base + "/chat/completions", json=CHAT)).status_code == 200
                assert (await caller.post(base + "/chat/completions", json=CHAT)).status_code == 502
                unknown = {**CHAT, "model": "made-up-" + "x" * 20}
                assert (await caller.post(base + "/chat/completions", json=unknown)).status_code == 404
                no_key = await caller.post(base + "/chat/completions", json=CHAT, headers={"Authorization": ""})
                assert no_key.status_code == 401
                refused_scrape = await caller.get(
                    f"http://127.0.0.1:{server.port}/metrics", headers={"Authorization": ""}
                )
                assert refused_scrape.status_code == 401
                scrape = await caller.get(f"http://127.0.0.1:{server.port}/metrics")
    assert scrape.status_code == 200
    assert scrape.headers["content-type"].startswith("text/plain")
    text = scrape.text
    assert FAKE_UPSTREAM_KEY not in text and GATEWAY_KEY not in text
    assert "made-up" not in text  # a model name a caller made up is never a label
    found = samples(text)
    routed = {"route": "gw-route", "model": "gpt-fast"}
    total = "hedgerow_gateway_requests_total"
    # the key's name is the caller's label; a request refused for its key has none
    assert value(found, total, **routed, outcome="ok", status="200", key="team") == 2
    assert value(found, total, **routed, outcome="failed", status="502", key="team") == 1
    assert value(found, total, route="", model="", outcome="refused", status="404", key="team") == 1
    assert value(found, total, route="", model="", outcome="refused", status="401", key="") == 1  # scrapes: not counted
    assert value(found, "hedgerow_gateway_requests_in_flight") == 0
    assert value(found, "hedgerow_gateway_response_start_seconds_count", **routed) == 3
    assert value(found, "hedgerow_gateway_request_duration_seconds_count", **routed) == 3
    assert 0 < value(found, "hedgerow_gateway_request_duration_seconds_sum", **routed) < 30
    assert not any(name.endswith("_created") for name in found)


async def test_a_caller_that_leaves_is_counted_cancelled() -> None:
    silent = Script(pieces=sse(chunk("hi", role="assistant"), done=False), close=False)
    async with ScriptedServer(silent) as upstream:
        app = GatewayApp(one_route([Upstream("a", upstream.base_url)], policy=POLICY))
        with GatewayServer(app) as server:
            async with httpx.AsyncClient(timeout=30) as caller:
                async with caller.stream(
                    "POST", server.base_url + "/chat/completions", json={**CHAT, "stream": True}
                ) as r:
                    assert r.status_code == 200
                    async for _ in r.aiter_raw():
                        break  # leave after the first token
                await upstream.wait_disconnect(0)
                for _ in range(100):
                    found = samples((await caller.get(f"http://127.0.0.1:{server.port}/metrics")).text)
                    if value(found, "hedgerow_gateway_requests_total", route="gw-route", model="gpt-fast",
                             outcome="cancelled", status="200", key=""):  # fmt: skip
                        break
    assert value(found, "hedgerow_gateway_requests_total", route="gw-route", model="gpt-fast",
                 outcome="cancelled", status="200", key="") == 1  # fmt: skip
