"""The per-upstream series of ``/metrics`` agree with ``GET /v1/upstreams`` over the same records,
and a flood of upstream names is folded into ``upstream="_other"`` past the label cap.

Every test runs on SQLite and PostgreSQL (the ``database_url`` fixture).
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

from prometheus_client.parser import text_string_to_metric_families

from hedgerow.api._upstream_metrics import MAX_UPSTREAM_LABELS, OTHER_UPSTREAM
from hedgerow.client.records import AttemptRecord, CallRecord
from tests.api.conftest import MakeApi

#: ``{sample name: [(labels, value), ...]}``.
_Samples = dict[str, list[tuple[dict[str, str], float]]]


def _samples(text: str) -> _Samples:
    found: _Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append((sample.labels, sample.value))
    return found


def _value(samples: _Samples, name: str, **labels: str) -> float:
    return sum(v for found, v in samples.get(name, []) if all(found.get(k) == w for k, w in labels.items()))


def _records(now: datetime) -> list[CallRecord]:
    rng = random.Random(11)
    A = AttemptRecord
    out = []
    for i in range(200):
        at = now - timedelta(seconds=rng.uniform(1, 600))
        kind = i % 5
        if kind == 0:  # a hedge: the slow primary "slow" loses to "fast", which wrote 3 tokens... or not
            atts: tuple[AttemptRecord, ...] = (
                A("slow", "primary", 0.0, None, 0.7, "cancelled", 200, None, 0),
                A("fast", "backup", 0.5, 0.7, 1.5, "won", 200, None, 20),
            )
            out.append(CallRecord(f"h{i}", "chat", "m1", at, hedged=True, hedge_reason="ttft_timeout",
                                  winner="backup", ttft_s=0.7, attempts=atts))  # fmt: skip
        elif kind == 1:  # a hedge the primary wins; the backup had generated 4 tokens
            atts = (
                A("slow", "primary", 0.0, 0.6, 1.5, "won", 200, None, 20),
                A("fast", "backup", 0.5, 0.55, 0.6, "cancelled", 200, None, 4),
            )
            out.append(CallRecord(f"w{i}", "chat", "m1", at, hedged=True, hedge_reason="ttft_timeout",
                                  winner="primary", ttft_s=0.6, attempts=atts))  # fmt: skip
        elif kind == 2:  # a timeout of "slow" alone
            atts = (A("slow", "primary", 0.0, None, 30.0, "failed", None, "ReadTimeout", 0),)
            out.append(CallRecord(f"t{i}", "chat", "m1", at, status="error", error_type="all_attempts_failed",
                                  attempts=atts))  # fmt: skip
        else:
            ttft = rng.uniform(0.1, 0.3)
            atts = (A("fast", "primary", 0.0, ttft, ttft + 1, "won", 200, None, 20),)
            out.append(CallRecord(f"p{i}", "chat", "m1", at, winner="primary", ttft_s=ttft, attempts=atts))
    return out


async def test_the_series_agree_with_the_table(make_api: MakeApi) -> None:
    now = datetime.now(UTC)
    records = _records(now)
    async with make_api() as (_app, api):
        posted = await api.post("/v1/calls", json={"calls": [r.to_dict() for r in records]})
        assert posted.status_code == 202
        # the same batch again: duplicates are not counted twice
        assert (await api.post("/v1/calls", json={"calls": [r.to_dict() for r in records[:20]]})).status_code == 202
        samples = _samples((await api.get("/metrics")).text)
        table = {row["upstream"]: row for row in (await api.get("/v1/upstreams")).json()["upstreams"]}
    for name, row in table.items():
        labels = {"route": "chat", "upstream": name}
        assert _value(samples, "hedgerow_upstream_attempts_total", **labels) == row["attempts"]
        for kind, count in (("error", row["errors"]), ("timeout", row["timeouts"]), ("stall", row["stalls"])):
            assert _value(samples, "hedgerow_upstream_failures_total", kind=kind, **labels) == count
        assert _value(samples, "hedgerow_upstream_races_total", **labels) == row["raced"]
        assert _value(samples, "hedgerow_upstream_races_total", result="won", **labels) == row["wins"]
        assert _value(samples, "hedgerow_upstream_hedges_caused_total", **labels) == row["hedges_caused"]
        assert _value(samples, "hedgerow_upstream_loser_tokens_total", **labels) == row["loser_completion_tokens"]
        observed = row["ttft_samples"] - row["ttft_censored"]
        assert _value(samples, "hedgerow_upstream_ttft_seconds_count", **labels) == observed
    assert table["slow"]["timeouts"] == 40 and table["slow"]["hedges_caused"] == 80
    assert table["fast"]["loser_completion_tokens"] == 160
    assert _value(samples, "hedgerow_upstream_attempts_total", upstream="fast", outcome="won") == 40 + 80


async def test_upstream_labels_are_capped(make_api: MakeApi) -> None:
    now = datetime.now(UTC)
    names = [f"u{i:03d}" for i in range(MAX_UPSTREAM_LABELS + 10)]
    records = [
        CallRecord(f"c{i}", "chat", "m1", now - timedelta(seconds=1), winner="primary", ttft_s=0.2,
                   attempts=(AttemptRecord(name, "primary", 0.0, 0.2, 1.0, "won", 200, None, 5),))
        for i, name in enumerate(names)
    ]  # fmt: skip
    async with make_api() as (_app, api):
        for record in records:  # one batch each, in order: the first names seen get labels
            assert (await api.post("/v1/calls", json={"calls": [record.to_dict()]})).status_code == 202
        samples = _samples((await api.get("/metrics")).text)
    labelled = {labels["upstream"] for labels, _v in samples["hedgerow_upstream_attempts_total"]}
    assert labelled == set(names[:MAX_UPSTREAM_LABELS]) | {OTHER_UPSTREAM}
    assert _value(samples, "hedgerow_upstream_attempts_total", upstream=OTHER_UPSTREAM) == 10
    assert _value(samples, "hedgerow_upstream_attempts_total") == len(names)
