"""The failover retry budget (issue 13 point 7): an outage never multiplies the requests."""

from __future__ import annotations

import httpx
import pytest

from hedgerow.client import (
    AllAttemptsFailed,
    CallRecord,
    FailoverBudget,
    HedgePolicy,
    HedgingClient,
    HedgingTransport,
    Upstream,
)
from tests.client.scripted_server import Script, ScriptedServer, Seen
from tests.helpers import BODY, Sink, answer

DOWN = Script(status=503, content_type="application/json", pieces=[(0, b'{"error": "overloaded"}')])


def test_failover_budget_follows_grpc_retry_throttling() -> None:
    budget = FailoverBudget(max_tokens=10, token_ratio=0.1)
    assert budget.allows_failover()
    for _ in range(5):
        budget.record_failure()
    assert budget.tokens == 5 and not budget.allows_failover()  # at half: cut off
    for _ in range(10):
        budget.record_success()
    assert budget.allows_failover() and budget.tokens == pytest.approx(6.0)
    for _ in range(200):
        budget.record_success()
    assert budget.tokens == 10  # capped
    with pytest.raises(ValueError, match=r"FailoverBudget\.max_tokens"):
        FailoverBudget(max_tokens=0)
    with pytest.raises(ValueError, match=r"FailoverBudget\.token_ratio"):
        FailoverBudget(token_ratio=1.5)
    with pytest.raises(ValueError, match=r"HedgePolicy\.failover_token_ratio"):
        HedgePolicy(failover_token_ratio=0.0)


@pytest.mark.parametrize("max_backups", [1, 2])
async def test_every_upstream_answering_503_costs_at_most_1_2_requests_per_call(max_backups: int) -> None:
    calls = 200
    async with ScriptedServer(DOWN) as a, ScriptedServer(DOWN) as b, ScriptedServer(DOWN) as c:
        sink = Sink()
        upstreams = [Upstream(n, s.base_url) for n, s in (("a", a), ("b", b), ("c", c))]
        policy = HedgePolicy(hedge_after_s=5.0, max_backups=max_backups, budget=0.0)
        async with HedgingClient(upstreams, policy=policy, telemetry=sink) as client:
            for _ in range(calls):
                with pytest.raises(AllAttemptsFailed):
                    await client.chat(BODY)
        sent = len(a.requests) + len(b.requests) + len(c.requests)
    records: list[CallRecord] = sink.records
    assert len(records) == calls
    steady = records[calls // 2 :]
    steady_per_call = sum(len(r.attempts) for r in steady) / len(steady)
    print(
        f"\nmax_backups={max_backups}: {sent / calls:.3f} requests per call overall, "
        f"{steady_per_call:.3f} in steady state"
    )
    assert steady_per_call <= 1.2
    assert sent / calls <= 1.2
    assert all(r.failover_denied for r in steady) and all(r.status == "error" for r in records)
    assert all(r.hedge_reason is None and not r.hedged for r in steady)
    assert CallRecord.from_dict(steady[0].to_dict()).failover_denied


async def test_failovers_still_flow_while_failures_are_rare() -> None:
    # Every 20th primary fails (5% of attempts): each of those calls fails over and succeeds.
    def primary(i: int, _seen: Seen) -> Script:
        return DOWN if i % 20 == 0 else answer()

    async with ScriptedServer(primary) as a, ScriptedServer(answer()) as b:
        sink = Sink()
        upstreams = [Upstream("a", a.base_url), Upstream("b", b.base_url)]
        async with HedgingClient(upstreams, policy=HedgePolicy(hedge_after_s=5.0), telemetry=sink) as client:
            for _ in range(200):
                await client.chat(BODY)
    failed_over = [r for r in sink.records if r.hedge_reason == "primary_error"]
    assert len(failed_over) == 10 and all(r.status == "ok" and r.winner == "backup" for r in failed_over)
    assert not any(r.failover_denied for r in sink.records)


async def test_unary_calls_through_the_transport_share_the_failover_budget() -> None:
    async with ScriptedServer(DOWN) as a, ScriptedServer(DOWN) as b:
        sink = Sink()
        transport = HedgingTransport(
            [Upstream("a", a.base_url), Upstream("b", b.base_url)],
            policy=HedgePolicy(hedge_after_s=5.0),
            telemetry=sink,
        )
        async with httpx.AsyncClient(transport=transport, base_url="http://hedgerow") as http:
            for _ in range(100):
                response = await http.post("/v1/chat/completions", json=BODY)
                assert response.status_code >= 500
        sent = len(a.requests) + len(b.requests)
    assert sent / 100 <= 1.2
    assert sink.records[-1].failover_denied
