"""``GET /metrics`` parsed by prometheus-client's own parser: counts equal the ingested records.

Every test runs on SQLite and PostgreSQL (the ``database_url`` fixture).
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

from prometheus_client.parser import text_string_to_metric_families

from hedgerow.client.records import AttemptRecord, CallRecord, with_prompt_estimates
from tests.api.conftest import MakeApi
from tests.conftest import CallFactory

M = {"model": "m1"}


#: ``{sample name: [(labels, value), ...]}``.
_Samples = dict[str, list[tuple[dict[str, str], float]]]


def _samples(text: str) -> _Samples:
    """``{sample name: [(labels, value), ...]}`` of a Prometheus text exposition."""
    found: _Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append((sample.labels, sample.value))
    return found


def _value(samples: _Samples, name: str, **labels: str) -> float:
    return sum(v for found, v in samples.get(name, []) if all(found.get(k) == w for k, w in labels.items()))


def _failover(request_id: str, started_at: datetime) -> CallRecord:
    attempts = (
        AttemptRecord("a", "primary", 0.0, None, 0.1, "failed", 503, "http_503", 0),
        AttemptRecord("b", "backup", 0.1, 0.5, 1.5, "won", 200, None, 20),
    )
    return CallRecord(
        request_id, "summarize", "m1", started_at, hedged=True, hedge_reason="primary_error", winner="backup",
        ttft_s=0.5, ttfo_s=0.5, tpot_s=0.05, e2e_s=1.5, prompt_tokens=100, completion_tokens=20, attempts=attempts,
    )  # fmt: skip


def _batch(call_factory: CallFactory) -> list[CallRecord]:
    rng = random.Random(5)
    now = datetime.now(UTC)
    records: list[CallRecord] = []
    for i in range(120):
        started = now - timedelta(seconds=rng.uniform(1, 900))
        if i % 10 == 0:  # a hedge the backup wins
            records.append(
                call_factory(f"h{i}", started_at=started, primary_ttft_s=3.0, hedge_after_s=1.0, backup_ttft_s=0.3)
            )
        elif i % 10 == 1:  # a hedge the primary wins
            records.append(
                call_factory(f"h{i}", started_at=started, primary_ttft_s=1.1, hedge_after_s=1.0, backup_ttft_s=0.9)
            )
        elif i % 10 == 2:
            records.append(call_factory(f"e{i}", started_at=started, primary_ttft_s=None))  # failed
        elif i % 10 == 3:
            records.append(_failover(f"f{i}", started))
        else:
            records.append(
                call_factory(f"p{i}", route="team/chat", model="small", started_at=started, primary_ttft_s=0.4)
            )
    return records


async def test_metrics_count_exactly_the_ingested_records(make_api: MakeApi, call_factory: CallFactory) -> None:
    records = _batch(call_factory)
    async with make_api() as (_app, api):
        body = {"calls": [r.to_dict() for r in records]}
        assert (await api.post("/v1/calls", json=body)).json() == {"accepted": 120, "duplicates": 0}
        assert (await api.post("/v1/calls", json=body)).json() == {"accepted": 0, "duplicates": 120}  # not re-counted
        bad = {"calls": [records[0].to_dict(), {"request_id": "x"}]}
        assert (await api.post("/v1/calls", json=bad)).status_code == 422
        assert (await api.post("/v1/controller/run")).json()["ran"] is True
        response = await api.get("/metrics")
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
        samples = _samples(response.text)

    assert _value(samples, "hedgerow_calls_total") == len(records)
    for status in ("ok", "error"):
        assert _value(samples, "hedgerow_calls_total", status=status) == sum(r.status == status for r in records)
    assert _value(samples, "hedgerow_calls_total", route="team/chat", model="small") == 72
    delay = sum(r.hedge_reason == "ttft_timeout" for r in records)
    failovers = sum(r.hedge_reason == "primary_error" for r in records)
    assert (delay, failovers) == (24, 12)
    assert _value(samples, "hedgerow_hedges_total", trigger="delay") == delay
    assert _value(samples, "hedgerow_hedges_total", trigger="error") == failovers
    assert _value(samples, "hedgerow_failovers_total") == failovers
    for winner in ("primary", "backup"):
        expected = sum(r.hedged and r.winner == winner for r in records)
        assert _value(samples, "hedgerow_hedge_wins_total", winner=winner) == expected
        # the hedges' wins apart from the failovers', whose backup wins by construction
        for trigger, reason in (("delay", "ttft_timeout"), ("error", "primary_error")):
            expected = sum(r.hedge_reason == reason and r.winner == winner for r in records)
            assert _value(samples, "hedgerow_hedge_wins_total", trigger=trigger, winner=winner) == expected
    assert _value(samples, "hedgerow_hedge_wins_total", trigger="error", winner="backup") > 0
    wasted = sum(r.wasted_completion_tokens for r in records)
    assert _value(samples, "hedgerow_wasted_tokens_total", token_type="completion") == wasted
    # the prompts of losing attempts, after the one estimate rule (a 2xx attempt without usage
    # cost the call's prompt tokens)
    estimated = [with_prompt_estimates(r) for r in records]
    wasted_prompt = sum(
        a.prompt_tokens or 0 for r in estimated if len(r.attempts) > 1 for a in r.attempts if a.outcome != "won"
    )
    assert wasted_prompt > 0
    assert _value(samples, "hedgerow_wasted_tokens_total", token_type="prompt") == wasted_prompt
    assert _value(samples, "hedgerow_failovers_denied_total") == sum(r.failover_denied for r in records)
    with_ttft = [r for r in records if r.ttft_s is not None]
    assert _value(samples, "gen_ai_client_operation_time_to_first_chunk_seconds_count") == len(with_ttft)
    assert _value(
        samples, "gen_ai_client_operation_time_to_first_chunk_seconds_sum", gen_ai_request_model="small"
    ) == sum(r.ttft_s or 0.0 for r in with_ttft if r.model == "small")  # none is None
    le_half = _value(samples, "gen_ai_client_operation_time_to_first_chunk_seconds_bucket", le="0.5")
    assert le_half == sum((r.ttft_s or 0.0) <= 0.5 for r in with_ttft)
    assert _value(samples, "hedgerow_records_accepted_total") == 120
    assert _value(samples, "hedgerow_records_duplicate_total") == 120
    assert _value(samples, "hedgerow_records_rejected_total") == 2
    assert _value(samples, "hedgerow_controller_tick_duration_seconds_count") == 1
    assert _value(samples, "hedgerow_controller_last_success_timestamp_seconds") > 0
    assert _value(samples, "hedgerow_lease_held", lease="controller") == 1
    gauges = {(labels["route"], labels["model"]): v for labels, v in samples["hedgerow_hedge_after_seconds"]}
    assert set(gauges) == {("summarize", "m1"), ("team/chat", "small")}
    info = {(labels["route"], labels["version"], labels["source"]) for labels, _v in samples["hedgerow_threshold_info"]}
    # summarize: too few samples, none supporting its default (a cold route)
    assert info == {("summarize", "1", "cold_start"), ("team/chat", "1", "controller")}


async def test_gauges_come_from_the_store_and_apps_do_not_share_counters(
    make_api: MakeApi, call_factory: CallFactory
) -> None:
    async with make_api() as (_first, api):
        await api.put("/v1/routes/r", params=M, json={"pinned_hedge_after_s": 2.5})
        one = {"calls": [call_factory("a1", route="r").to_dict()]}
        await api.post("/v1/calls", json=one)
        async with make_api() as (_second, other):  # a second app (a second process's view)
            samples = _samples((await other.get("/metrics")).text)
            assert _value(samples, "hedgerow_calls_total") == 0  # counters: what this app ingested
            assert _value(samples, "hedgerow_hedge_after_seconds", route="r") == 2.5  # gauges: the store
            pinned = [labels for labels, _v in samples["hedgerow_threshold_info"] if labels["route"] == "r"]
            assert pinned == [{"route": "r", "model": "m1", "version": "1", "source": "pinned"}]
            assert _value(samples, "hedgerow_lease_held") == 0
        assert _value(_samples((await api.get("/metrics")).text), "hedgerow_calls_total") == 1


async def test_metrics_need_the_read_scope_when_tokens_are_set(make_api: MakeApi) -> None:
    async with make_api(tokens="r3ad:read,in:ingest") as (_app, api):
        assert (await api.get("/metrics")).status_code == 401
        assert (await api.get("/metrics", headers={"Authorization": "Bearer in"})).status_code == 403
        assert (await api.get("/metrics", headers={"Authorization": "Bearer r3ad"})).status_code == 200


async def test_no_created_series_is_served(make_api: MakeApi, call_factory: CallFactory) -> None:
    """prometheus-client adds a ``<name>_created`` gauge to every counter and histogram child (the
    OpenMetrics creation time): one useless series per child for a Prometheus user. The app turns
    them off where it builds its metrics, whatever the process's default was."""
    from prometheus_client import enable_created_metrics

    enable_created_metrics()  # type: ignore[no-untyped-call]  # unannotated in prometheus_client; the library's default
    async with make_api() as (_app, api):
        records = _batch(call_factory)
        assert (await api.post("/v1/calls", json={"calls": [r.to_dict() for r in records]})).status_code == 202
        assert (await api.post("/v1/controller/run")).json()["ran"] is True
        text = (await api.get("/metrics")).text
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert any(line.startswith("hedgerow_calls_total{") for line in lines)  # counters are there
    assert any(line.startswith("gen_ai_client_operation_time_to_first_chunk_seconds_bucket") for line in lines)
    created = [line for line in text.splitlines() if "_created" in line]
    assert created == [], created[:5]
