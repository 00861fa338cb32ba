"""No key (an upstream's or a caller's) in any answer, log line, metric or record of the gateway,
after a run through every error path it has: upstream 5xx and 4xx bodies that echo the upstream's
key, an unreachable upstream, a stall after the first token, a call past its total time, a caller
that leaves, a bad body, an unknown model, a missing key, a body too large, both 429s, and the
``/metrics`` and ``/v1/models`` pages. Real HTTP on loopback against scripted upstreams."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import httpx
import pytest

from hedgerow.client import CallRecord, HedgePolicy, Upstream
from hedgerow.gateway import GatewayApp, GatewayConfig, RouteSpec
from tests.client.scripted_server import Script, ScriptedServer, chunk, sse
from tests.gateway.conftest import FAKE_UPSTREAM_KEY, GatewayServer
from tests.helpers import free_port

ALICE = "gw-alice-redact-0123456789abcdef"
BOB = "gw-bob-redact-0123456789abcdef"
CAROL = "gw-carol-redact-0123456789abcdef"
SECRETS = (FAKE_UPSTREAM_KEY, ALICE, BOB, CAROL)


class Records:
    """A record sink that keeps every record it is handed."""

    def __init__(self) -> None:
        self.records: list[CallRecord] = []

    def submit(self, record: CallRecord) -> None:
        """Keep ``record``."""
        self.records.append(record)


def echoing(status: int) -> Script:
    """An OpenAI-style error answer whose message quotes the upstream's key back."""
    body = {"error": {"message": f"Incorrect API key provided: {FAKE_UPSTREAM_KEY}", "type": "x", "code": None}}
    return Script(status=status, content_type="application/json", pieces=[(0, json.dumps(body).encode())])


def holding() -> Script:
    """A first token, then silence with the connection open."""
    return Script(pieces=sse(chunk("hello", role="assistant"), done=False), close=False)


def route(public: str, urls: list[str], policy: HedgePolicy) -> tuple[str, RouteSpec]:
    """A public model over ``urls``, each upstream holding the fake upstream key."""
    ups = tuple(Upstream(f"u{i}", url, api_key=FAKE_UPSTREAM_KEY) for i, url in enumerate(urls))
    return public, RouteSpec(public, f"r-{public}", ups, policy)


def chat(model: str, stream: bool = False) -> dict[str, Any]:
    """A chat body for ``model``."""
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": stream}


def bearer(key: str) -> dict[str, str]:
    """The ``Authorization`` header of ``key``."""
    return {"Authorization": f"Bearer {key}"}


def shown(answer: httpx.Response) -> str:
    """Everything a caller sees of ``answer``: status, headers, body."""
    return f"{answer.status_code} {dict(answer.headers)} {answer.text}"


async def test_no_key_in_any_answer_log_metric_or_record_after_every_error_path(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    sink = Records()
    seen: list[str] = []
    patient = HedgePolicy(hedge_after_s=5.0, total_timeout_s=20.0)
    async with (
        ScriptedServer(echoing(500)) as broken,
        ScriptedServer(echoing(401)) as refusing,
        ScriptedServer(holding()) as held,
        ScriptedServer(Script(pieces=sse(chunk("late")), header_delay_s=10.0)) as late,
    ):
        down = f"http://127.0.0.1:{free_port()}/v1"
        routes = dict(
            [
                route("broken", [broken.base_url, broken.base_url], patient),
                route("refusing", [refusing.base_url], patient),
                route("down", [down, down], patient),
                route("stalls", [held.base_url], HedgePolicy(stall_timeout_s=0.3, total_timeout_s=20.0)),
                route("late", [late.base_url], HedgePolicy(total_timeout_s=0.5)),
                route("held", [held.base_url], patient),
            ]
        )
        keys = {ALICE: "alice", BOB: "bob", CAROL: "carol"}
        config = GatewayConfig(
            routes=routes, keys=keys, max_body_bytes=4096, max_concurrent=2, max_concurrent_per_key=1
        )
        app = GatewayApp(config, telemetry=sink)
        with GatewayServer(app) as server:
            url = server.base_url + "/chat/completions"
            async with httpx.AsyncClient(timeout=30, headers=bearer(ALICE)) as caller:
                for model in ("broken", "refusing", "down", "stalls", "late", "nope"):
                    for stream in (False, True):
                        seen.append(shown(await caller.post(url, json=chat(model, stream))))
                seen.append(shown(await caller.post(url, content=b"{not json")))
                seen.append(shown(await caller.post(url, json=chat("broken"), headers={"Authorization": ""})))
                seen.append(shown(await caller.post(url, json=chat("broken"), headers=bearer("wrong-" + ALICE))))
                big = {**chat("broken"), "messages": [{"role": "user", "content": "x" * 8192}]}
                seen.append(shown(await caller.post(url, json=big)))
                async with caller.stream("POST", url, json=chat("held", True)) as first:
                    assert first.status_code == 200
                    seen.append(shown(await caller.post(url, json=chat("held", True))))  # alice: key_busy
                    async with caller.stream("POST", url, json=chat("held", True), headers=bearer(BOB)) as second:
                        assert second.status_code == 200
                        busy = await caller.post(url, json=chat("held", True), headers=bearer(CAROL))
                        seen.append(shown(busy))  # gateway_busy
                    async for _ in first.aiter_raw():
                        break  # alice leaves mid-stream: her call is cancelled
                for _ in range(200):  # the cancelled streams end on the gateway's side
                    if app.in_flight == 0:
                        break
                    await asyncio.sleep(0.05)
                models = await caller.get(server.base_url + "/models")
                assert models.status_code == 200
                seen.append(shown(models))
                seen.append(shown(await caller.get(f"http://127.0.0.1:{server.port}/metrics")))
    statuses = {int(s[:3]) for s in seen}
    assert statuses >= {200, 400, 401, 404, 413, 429, 502, 503, 504}, statuses
    everything = "\n".join(seen)
    assert "Incorrect API key provided: [redacted]" in everything  # the echoed key was there, and taken out
    assert '"code": "key_busy"' in everything and '"code": "gateway_busy"' in everything
    assert {r.status for r in sink.records} >= {"error", "timeout", "stalled", "cancelled"}
    records = "\n".join(json.dumps(r.to_dict()) for r in sink.records)
    metrics = app.metrics.render().decode()
    for text in (everything, caplog.text, records, metrics):
        for secret in SECRETS:
            assert secret not in text
