"""The end of a call, the same in both drivers (client/_call_end.py): a telemetry sink that raises
is logged and never becomes the call's error, in the streamed driver (``HedgingClient.chat``) and
in the whole-response one (a non-streaming call through ``HedgingTransport``) alike.

Scripted HTTP upstreams on 127.0.0.1.
"""

from __future__ import annotations

import logging

import httpx
import pytest

from hedgerow.client import CallRecord, HedgePolicy, HedgingClient, HedgingTransport, Upstream
from tests.client.scripted_server import ScriptedServer
from tests.client.test_transport import completion_script
from tests.helpers import BODY, answer


class RefusingSink:
    """A telemetry sink that raises on every record after noting it."""

    def __init__(self) -> None:
        self.offered: list[CallRecord] = []

    def submit(self, record: CallRecord) -> None:
        """Note ``record``, then refuse it."""
        self.offered.append(record)
        raise RuntimeError("sink is full")


def _refusals(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "hedgerow.client" and "refused a record" in r.getMessage()]


async def test_a_refusing_sink_breaks_neither_a_streamed_call_nor_its_record(caplog: pytest.LogCaptureFixture) -> None:
    sink = RefusingSink()
    async with ScriptedServer(answer()) as upstream:
        upstreams = [Upstream("a", upstream.base_url)]
        async with HedgingClient(upstreams, policy=HedgePolicy(hedge_after_s=5.0), telemetry=sink) as client:
            result = await client.chat(BODY)
    assert result.text == "w0 w1 w2 " and result.record.status == "ok"
    assert sink.offered == [result.record]
    assert len(_refusals(caplog)) == 1


async def test_a_refusing_sink_breaks_neither_a_whole_response_call_nor_its_record(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sink = RefusingSink()
    async with ScriptedServer(completion_script("hello")) as upstream:
        transport = HedgingTransport(
            [Upstream("a", upstream.base_url)], policy=HedgePolicy(hedge_after_s=5.0), telemetry=sink
        )
        async with httpx.AsyncClient(transport=transport, base_url="http://hedgerow") as http:
            response = await http.post("/v1/chat/completions", json=BODY)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == "hello"
    assert len(sink.offered) == 1 and sink.offered[0].status == "ok"
    assert len(_refusals(caplog)) == 1
