"""A caller's ``X-Request-ID`` through the real gateway on loopback: echoed on every answer (a
winner's, streamed or not, in place of the upstream's own; a refusal; a failure), logged in the
``gateway_call`` line beside hedgerow's request id, which stays the record's; an unusable value
is ignored without a warning."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from hedgerow.client import HedgePolicy, Upstream
from hedgerow.gateway import GatewayApp, GatewayConfig, RouteSpec
from hedgerow.sim import ReplicaConfig, ReplicaThread
from tests.gateway.conftest import GATEWAY_KEY, GatewayServer, one_route
from tests.helpers import free_port

CHAT: dict[str, Any] = {"model": "gpt-fast", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
STREAM: dict[str, Any] = {**CHAT, "stream": True}
AUTH = {"Authorization": f"Bearer {GATEWAY_KEY}"}
AUTH_BYTES = AUTH["Authorization"].encode()
POLICY = HedgePolicy(hedge_after_s=5.0, total_timeout_s=20.0)


@pytest.fixture(scope="module")
def replica() -> Iterator[ReplicaThread]:
    """A fast simulated replica (it echoes each attempt's ``X-Request-ID``, hedgerow's)."""
    with ReplicaThread(ReplicaConfig(name="fast")) as fast:
        yield fast


@pytest.fixture
async def caller() -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client for the gateway (30 s timeout)."""
    async with httpx.AsyncClient(timeout=30) as client:
        yield client


def gateway(base_url: str) -> tuple[GatewayApp, GatewayServer]:
    """A gateway with the key ``alice`` over one upstream at ``base_url``."""
    app = GatewayApp(one_route([Upstream("a", base_url)], policy=POLICY, keys={GATEWAY_KEY: "alice"}))
    return app, GatewayServer(app)


def call_lines(caplog: pytest.LogCaptureFixture, event: str) -> list[dict[str, Any]]:
    """The fields of every ``event`` log line captured so far."""
    return [r.fields for r in caplog.records if getattr(r, "event", None) == event]  # type: ignore[attr-defined]


async def test_a_winners_answer_echoes_the_callers_id_and_the_record_keeps_hedgerows(
    replica: ReplicaThread, caller: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="hedgerow.gateway")
    app, server = gateway(replica.base_url)
    with server:
        url = server.base_url + "/chat/completions"
        # without one, the answering upstream's own x-request-id passes as before (hedgerow's attempt id)
        plain = await caller.post(url, json=CHAT, headers=AUTH)
        assert plain.status_code == 200
        assert plain.headers["x-request-id"] != "" and plain.headers.get_list("x-request-id") == [
            plain.headers["x-request-id"]
        ]
        record_ids = []
        for body in (CHAT, STREAM, CHAT):  # the same caller's id twice: two calls, two records
            answer = await caller.post(url, json=body, headers={**AUTH, "X-Request-ID": "trace 42/a"})
            assert answer.status_code == 200, answer.text
            assert answer.headers.get_list("x-request-id") == ["trace 42/a"]
            assert app.records.last is not None
            record_ids.append(app.records.last.request_id)
            assert answer.headers["x-hedgerow-request-id"] == app.records.last.request_id
    assert len(set(record_ids)) == 3 and "trace 42/a" not in record_ids
    lines = call_lines(caplog, "gateway_call")
    assert [line["caller_request_id"] for line in lines] == [None, "trace 42/a", "trace 42/a", "trace 42/a"]
    assert [line["request_id"] for line in lines[1:]] == record_ids
    assert {line["client"] for line in lines} == {"alice"}
    assert '"trace 42/a"' in caplog.text  # quoted in the text line: its space cannot start a field
    assert [line["caller_request_id"] for line in call_lines(caplog, "gateway_request")] == [
        None,
        "trace 42/a",
        "trace 42/a",
        "trace 42/a",
    ]


async def test_error_answers_echo_the_callers_id(caller: httpx.AsyncClient) -> None:
    app, server = gateway(f"http://127.0.0.1:{free_port()}/v1")  # nothing listens there
    with server:
        url = server.base_url + "/chat/completions"
        cases = [
            ({}, CHAT, 401),  # no key
            (AUTH, {**CHAT, "model": "nope"}, 404),  # unknown model
            (AUTH, CHAT, 503),  # no upstream reachable
            (AUTH, STREAM, 503),
        ]
        for headers, body, status in cases:
            answer = await caller.post(url, json=body, headers={**headers, "X-Request-ID": "req-7"})
            assert answer.status_code == status, answer.text
            assert answer.headers.get_list("x-request-id") == ["req-7"]
            assert "error" in answer.json()
        assert app.records.last is not None and app.records.last.request_id != "req-7"


@pytest.mark.parametrize(
    "value",
    [b"x" * 201, b"caf\xc3\xa9", b"tab\there"],
    ids=["201-characters", "non-ascii", "control-character"],
)
async def test_an_unusable_id_is_ignored_without_a_warning(
    value: bytes, replica: ReplicaThread, caller: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    _, server = gateway(replica.base_url)
    with server:
        url = server.base_url + "/chat/completions"
        refused = await caller.post(url, json=CHAT, headers={b"X-Request-ID": value})
        assert refused.status_code == 401 and "x-request-id" not in refused.headers
        answer = await caller.post(url, json=CHAT, headers={b"Authorization": AUTH_BYTES, b"X-Request-ID": value})
        assert answer.status_code == 200
        assert answer.headers.get_list("x-request-id") != [value.decode("latin-1")]  # the upstream's, as without one
    assert [line["caller_request_id"] for line in call_lines(caplog, "gateway_call")] == [None]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


async def test_an_id_of_200_characters_is_echoed(replica: ReplicaThread, caller: httpx.AsyncClient) -> None:
    value = "~" + "a" * 198 + "!"
    assert len(value) == 200
    _, server = gateway(replica.base_url)
    with server:
        answer = await caller.post(
            server.base_url + "/chat/completions", json=CHAT, headers={**AUTH, "X-Request-ID": value}
        )
    assert answer.headers.get_list("x-request-id") == [value]


def hedgerow_id(answer: httpx.Response) -> str:
    """The one ``X-Hedgerow-Request-Id`` of ``answer``, asserted present once and not empty."""
    ids = answer.headers.get_list("x-hedgerow-request-id")
    assert len(ids) == 1 and ids[0] != "", (answer.status_code, answer.headers.multi_items())
    return ids[0]


async def test_every_answer_names_a_hedgerow_request_id(
    replica: ReplicaThread, caller: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="hedgerow.gateway")
    app, server = gateway(replica.base_url)
    with server:
        url = server.base_url + "/chat/completions"
        answers = [
            await caller.post(url, json=CHAT),  # 401: no key
            await caller.post(url, json={**CHAT, "model": "nope"}, headers=AUTH),  # 404 model_not_found
            await caller.post(url, content=b"{not json", headers=AUTH),  # 400 from hedgerow, no call
            await caller.get(server.base_url + "/nowhere", headers=AUTH),  # 404 unknown_url
            await caller.post(url, json=CHAT, headers=AUTH),  # a call: the record's id
        ]
    assert [a.status_code for a in answers] == [401, 404, 400, 404, 200]
    ids = [hedgerow_id(a) for a in answers]
    assert len(set(ids)) == len(ids)
    assert app.records.last is not None and ids[-1] == app.records.last.request_id
    assert [line["request_id"] for line in call_lines(caplog, "gateway_request")] == ids
    # pass-through paths of a gateway that passes any model: the primary's answer, with an id
    spec = RouteSpec(None, "r-any", (Upstream("a", replica.base_url),), POLICY)
    with GatewayServer(GatewayApp(GatewayConfig(routes={}, any_model=spec))) as passing:
        models = await caller.get(passing.base_url + "/models")
        embeddings = await caller.post(passing.base_url + "/embeddings", json={"model": "m", "input": "hi"})
    for answer in (models, embeddings):
        assert answer.headers["x-hedgerow-winner"] == "a"
        hedgerow_id(answer)
