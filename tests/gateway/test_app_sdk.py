"""The gateway in front of a slow primary and a fast backup, called with the real openai SDK
(async and sync, streamed and not) and with curl: the backup's text arrives and
``X-Hedgerow-Winner`` names it, which only a hedged race can give."""

from __future__ import annotations

import json
import shutil
import subprocess

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.gateway.conftest import GatewayServer

MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "say something"}]


def _sdk_async(server: GatewayServer) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.base_url, api_key="caller-key", max_retries=0)


async def test_async_sdk_streamed_chat_is_won_by_the_backup(hedging_gateway: GatewayServer) -> None:
    client = _sdk_async(hedging_gateway)
    async with client:
        raw = await client.chat.completions.with_raw_response.create(
            model="gpt-fast", messages=MESSAGES, stream=True, max_tokens=8
        )
        assert raw.headers["x-hedgerow-winner"] == "fast"
        assert raw.headers["x-hedgerow-hedged"] == "true"
        assert raw.headers["content-type"].startswith("text/event-stream")
        text = ""
        stream = raw.parse()
        assert isinstance(stream, openai.AsyncStream)  # stream=True; the SDK's type does not say so
        async for chunk in stream:
            for choice in chunk.choices:
                text += choice.delta.content or ""
    assert text  # the fast replica's answer


async def test_async_sdk_whole_chat_is_won_by_the_backup(hedging_gateway: GatewayServer) -> None:
    client = _sdk_async(hedging_gateway)
    async with client:
        raw = await client.chat.completions.with_raw_response.create(model="gpt-fast", messages=MESSAGES, max_tokens=8)
    assert raw.headers["x-hedgerow-winner"] == "fast"
    completion = raw.parse()
    assert completion.choices[0].message.content


def test_sync_sdk_streamed_and_whole_chat(hedging_gateway: GatewayServer) -> None:
    with openai.OpenAI(base_url=hedging_gateway.base_url, api_key="caller-key", max_retries=0) as client:
        raw = client.chat.completions.with_raw_response.create(
            model="gpt-fast", messages=MESSAGES, stream=True, max_tokens=8
        )
        assert raw.headers["x-hedgerow-winner"] == "fast"
        stream = raw.parse()
        assert isinstance(stream, openai.Stream)  # stream=True; the SDK's type does not say so
        pieces = [c.choices[0].delta.content or "" for c in stream if c.choices]
        assert "".join(pieces)
        whole = client.chat.completions.with_raw_response.create(model="gpt-fast", messages=MESSAGES, max_tokens=8)
        assert whole.headers["x-hedgerow-winner"] == "fast"
        assert whole.parse().choices[0].message.content


def test_models_lists_the_public_names(hedging_gateway: GatewayServer) -> None:
    with openai.OpenAI(base_url=hedging_gateway.base_url, api_key="caller-key", max_retries=0) as client:
        assert [m.id for m in client.models.list()] == ["gpt-fast"]
        with pytest.raises(openai.NotFoundError) as raised:
            client.chat.completions.create(model="gpt-nope", messages=MESSAGES)
    assert raised.value.code == "model_not_found"
    answer = httpx.post(hedging_gateway.base_url + "/chat/completions", json={"model": "gpt-nope", "messages": []})
    assert answer.status_code == 404
    assert answer.json()["error"] == {
        "message": answer.json()["error"]["message"],
        "type": "invalid_request_error",
        "param": "model",
        "code": "model_not_found",
    }


def test_curl_streamed(hedging_gateway: GatewayServer) -> None:
    curl = shutil.which("curl")
    if curl is None:
        pytest.skip("curl is not installed")
    body = json.dumps({"model": "gpt-fast", "messages": MESSAGES, "stream": True, "max_tokens": 5})
    done = subprocess.run(
        [
            curl,
            "-sS",
            "-N",
            "-i",
            "-H",
            "Content-Type: application/json",
            "-d",
            body,
            hedging_gateway.base_url + "/chat/completions",
        ],
        capture_output=True,
        timeout=60,
        check=True,
    )
    head, _, events = done.stdout.decode().partition("\r\n\r\n")
    assert "x-hedgerow-winner: fast" in head.lower()
    assert events.rstrip().endswith("data: [DONE]")
    chunks = [json.loads(line[6:]) for line in events.splitlines() if line.startswith("data: {")]
    assert any(c["choices"] and c["choices"][0]["delta"].get("content") for c in chunks)
