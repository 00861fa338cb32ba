"""Per-upstream TTFT P90 per time slot (``upstream_ttft_series``) on SQLite and PostgreSQL.

Checked by hand on a few slots (a value, a slot with too few samples, a censored lower bound, a
slot whose curve reaches P90 on too few first tokens) and against a plain-Python recount of a
random day of calls (the same samples, slots and rule, with :func:`km_quantile` over histograms
of the raw samples).
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from hedgerow.client.records import AttemptRecord, CallRecord
from hedgerow.controller.errors import UnknownRoute
from hedgerow.controller.policy.samples import ttft_sample
from hedgerow.controller.policy.ttft_histogram import bucket_bounds, bucket_index, histogram_of, km_quantile
from hedgerow.controller.store.upstream_series import (
    SERIES_MIN_FIRST_TOKENS,
    SERIES_MIN_SAMPLES,
    slot_width_s,
    upstream_ttft_series,
)
from hedgerow.controller.store.upstreams import UpstreamWindowError
from tests.controller.test_upstreams import T0, _call, _store

A = AttemptRecord
DAY = (T0 - timedelta(hours=12), T0 + timedelta(hours=12))  # one-hour slots, T0 = 12:00 UTC


def _alone(rid: str, upstream: str, ttft_s: float, at: datetime, *, model: str = "m1") -> CallRecord:
    record = _call(rid, (A(upstream, "primary", 0.0, ttft_s, ttft_s + 1, "won", 200, None, 10),), at=at)
    return dataclasses.replace(record, model=model)


def _hand_calls() -> list[CallRecord]:
    at = T0 + timedelta(minutes=10)  # slot 12:00-13:00
    later = T0 + timedelta(hours=1, minutes=5)  # slot 13:00-14:00
    out = [_alone(f"a{i}", "a", 0.1 * i, at) for i in range(1, 11)]  # a: 0.1 .. 1.0 s
    out += [_alone(f"a-late{i}", "a", 0.2, later) for i in range(9)]  # 9 samples: too few
    # b: 0.1 and 0.2 s, then 8 primaries cancelled at 0.3 s when backup x (sent at 0.1 s) answers
    out += [_alone(f"b{i}", "b", 0.1 * i, at) for i in (1, 2)]
    for i in range(8):
        attempts = (
            A("b", "primary", 0.0, None, 0.3, "cancelled", 200, None, 0),
            A("x", "backup", 0.1, 0.3, 1.3, "won", 200, None, 10),
        )
        out.append(_call(f"bx{i}", attempts, at=at, reason="ttft_timeout"))
    # c: 6 backups cancelled 0.05 s after their send (primary y won), then 4 first tokens
    for i in range(6):
        attempts = (
            A("y", "primary", 0.0, 0.35, 1.35, "won", 200, None, 10),
            A("c", "backup", 0.3, None, 0.35, "cancelled", 200, None, 0),
        )
        out.append(_call(f"yc{i}", attempts, at=at, reason="ttft_timeout"))
    out += [_alone(f"c{i}", "c", 0.1 * i, at) for i in (5, 6, 7, 8)]
    # another model of the route, another route, and a call before the range: none of them count
    out += [_alone(f"m2-{i}", "a", 5.0, at, model="m2") for i in range(10)]
    elsewhere = (A("a", "primary", 0.0, 5.0, 6.0, "won", 200, None, 10),)
    out += [_call(f"o{i}", elsewhere, route="other", at=at) for i in range(10)]
    out += [_alone(f"old{i}", "a", 5.0, DAY[0] - timedelta(minutes=1)) for i in range(10)]
    return out


async def _series(sessionmaker: async_sessionmaker[AsyncSession], **kwargs: Any) -> dict[str, Any]:
    kwargs = {"route": "chat", "model": "m1", "since": DAY[0], "until": DAY[1], **kwargs}
    async with sessionmaker() as session:
        return await upstream_ttft_series(session, **kwargs)


async def test_hand_checked_slots(sessionmaker: async_sessionmaker[AsyncSession]) -> None:
    await _store(sessionmaker, _hand_calls())
    result = await _series(sessionmaker)
    assert result["slot_s"] == 3600 and not result["truncated"]
    by_name = {u["upstream"]: u for u in result["upstreams"]}
    # busiest first (most TTFT samples), ties by name
    assert [(u["upstream"], u["samples"]) for u in result["upstreams"]] == [
        ("a", 19), ("b", 10), ("c", 10), ("x", 8), ("y", 6)
    ]  # fmt: skip
    a_now, a_late = by_name["a"]["points"]
    assert (a_now["start"], a_now["end"]) == (T0, T0 + timedelta(hours=1))
    # a: 10 first tokens 0.1..1.0 s, none censored: P90 is the 9th, 0.9 s (its bucket's midpoint)
    assert a_now["samples"] == 10 and a_now["censored"] == 0
    assert a_now["p90"]["value_s"] == pytest.approx(0.9, rel=0.0234)
    assert a_now["p90"]["low_s"] <= 0.9 < a_now["p90"]["high_s"]
    assert a_late["samples"] == 9 and a_late["p90"] is None  # fewer than 10 samples: no point
    # b: F reaches only 0.2 (1/10, then 1/9 of the rest) before 8 censorings: P90 >= 0.3 s's bucket
    (b,) = by_name["b"]["points"]
    assert (b["samples"], b["censored"]) == (10, 8)
    assert b["p90"]["value_s"] is None and b["p90"]["low_s"] == bucket_bounds(bucket_index(0.3))[0]
    assert 0.3 / 1.05 < b["p90"]["low_s"] <= 0.3
    # c: after 6 early censorings 4 at risk; the curve reaches 0.9 on 4 first tokens: too few
    (c,) = by_name["c"]["points"]
    assert (c["samples"], c["censored"]) == (10, 6) and c["p90"] is None
    uncounted = km_quantile(histogram_of([0.5, 0.6, 0.7, 0.8]), histogram_of([0.05] * 6), 0.9)
    assert uncounted is not None and uncounted.value_s is not None
    assert by_name["x"]["points"][0]["p90"] is None and by_name["y"]["points"][0]["p90"] is None
    limited = await _series(sessionmaker, limit=2)
    assert [u["upstream"] for u in limited["upstreams"]] == ["a", "b"] and limited["truncated"]
    other = await _series(sessionmaker, model="m2")
    assert [(u["upstream"], u["samples"]) for u in other["upstreams"]] == [("a", 10)]


async def test_refusals(sessionmaker: async_sessionmaker[AsyncSession]) -> None:
    await _store(sessionmaker, _hand_calls()[:1])
    with pytest.raises(UnknownRoute, match="unknown route 'chat' with model 'nope'"):
        await _series(sessionmaker, model="nope")
    with pytest.raises(UpstreamWindowError) as caught:
        await _series(sessionmaker, since=DAY[1], until=DAY[0])
    assert caught.value.field == "since"
    with pytest.raises(UpstreamWindowError) as caught:
        await _series(sessionmaker, limit=0)
    assert caught.value.field == "limit"


def test_slot_widths_fit_at_most_30_slots_on_round_times() -> None:
    hour, day = 3600.0, 86_400.0
    assert [slot_width_s(s) for s in (600, hour, 6 * hour, day, 7 * day, 30 * day)] == [
        20, 120, 900, 3600, 21_600, 86_400
    ]  # fmt: skip
    for span in (1.0, 599.0, 601.0, 5000.0, 2 * day, 32 * day):
        width = slot_width_s(span)
        assert span / width <= 30 or width == 86_400
        assert 86_400 % width == 0


def _random_day(seed: int) -> list[CallRecord]:
    """A day of calls on four upstreams: "slow" gets hedged (censored) in the afternoon."""
    rng = random.Random(seed)
    names = ["east", "west", "slow", "<b>&tiny"]
    out = []
    for i in range(3000):
        at = DAY[0] + timedelta(seconds=rng.uniform(0, 86_400))
        weights = [5, 4, 3, 0.3]
        primary = rng.choices(names, weights)[0]
        backup = rng.choice([n for n in names if n != primary])
        afternoon = 14 <= at.hour < 18
        ttft = rng.lognormvariate(-1.2 + (1.2 if primary == "slow" and afternoon else 0.0), 0.6)
        hedge = 0.8
        if ttft <= hedge:
            out.append(_call(f"r{i}", (A(primary, "primary", 0.0, ttft, ttft + 1, "won", 200, None, 10),), at=at))
            continue
        b_ttft = rng.lognormvariate(-1.2, 0.6)
        if ttft <= hedge + b_ttft:
            atts = (
                A(primary, "primary", 0.0, ttft, ttft + 1, "won", 200, None, 10),
                A(backup, "backup", hedge, None, ttft, "cancelled", 200, None, 0),
            )
        else:
            first = hedge + b_ttft
            atts = (
                A(primary, "primary", 0.0, None, first, "cancelled", 200, None, 0),
                A(backup, "backup", hedge, first, first + 1, "won", 200, None, 10),
            )
        if rng.random() < 0.05:  # a failed primary: no sample
            atts = (A(primary, "primary", 0.0, None, 0.05, "failed", 503, "http_503", 0), atts[1])
        out.append(_call(f"r{i}", atts, at=at, reason="ttft_timeout"))
    return out


def _recount(
    records: list[CallRecord], since: datetime, until: datetime
) -> dict[str, dict[int, list[tuple[float, bool]]]]:
    width = slot_width_s((until - since).total_seconds())
    samples: dict[str, dict[int, list[tuple[float, bool]]]] = defaultdict(lambda: defaultdict(list))
    for record in records:
        if not since <= record.started_at < until:
            continue
        slot = math.floor(record.started_at.timestamp() / width)
        for a in record.attempts:
            sample = ttft_sample(a.start_s, a.first_token_s, a.end_s, a.outcome)
            if sample is not None:
                samples[a.upstream][slot].append(sample)
    return samples


def _expected_point(mine: list[tuple[float, bool]]) -> dict[str, float | None] | None:
    events = histogram_of(s for s, cut in mine if not cut)
    cut = histogram_of(s for s, cut in mine if cut)
    n_events = sum(events.values())
    if len(mine) < SERIES_MIN_SAMPLES:
        return None
    found = km_quantile(events, cut, 0.9)
    assert found is not None
    if found.value_s is None:
        return {"value_s": None, "low_s": found.low_s, "high_s": None}
    if n_events < SERIES_MIN_FIRST_TOKENS:
        return None
    return {"value_s": found.value_s, "low_s": found.low_s, "high_s": found.high_s}


@pytest.mark.parametrize("in_sql", [True, False], ids=["sql", "streamed"])
async def test_matches_a_plain_recount(
    sessionmaker: async_sessionmaker[AsyncSession], monkeypatch: pytest.MonkeyPatch, in_sql: bool
) -> None:
    """Every slot of every upstream, in the grouped statement and in the fallback of a SQLite
    without math functions, equals the recount; the afternoon's "slow" slots are lower bounds."""
    import hedgerow.controller.store.upstream_series as module

    records = _random_day(seed=5)
    await _store(sessionmaker, records)
    if not in_sql:

        async def no_log(_session: AsyncSession) -> bool:
            return False

        monkeypatch.setattr(module, "has_sql_log", no_log)
    for since, until in (DAY, (T0 - timedelta(hours=6, minutes=7), T0 + timedelta(minutes=3))):
        expected = _recount(records, since, until)
        result = await _series(sessionmaker, since=since, until=until)
        assert [u["upstream"] for u in result["upstreams"]] == sorted(
            expected, key=lambda n: (-sum(len(v) for v in expected[n].values()), n)
        )
        width = result["slot_s"]
        for upstream in result["upstreams"]:
            want = expected[upstream["upstream"]]
            slots = sorted(want)
            assert len(upstream["points"]) == len(slots)
            for point, slot in zip(upstream["points"], slots, strict=True):
                start = datetime.fromtimestamp(slot * width, UTC)
                assert point["start"] == max(since, start)
                assert point["end"] == min(until, start + timedelta(seconds=width))
                assert point["samples"] == len(want[slot])
                assert point["censored"] == sum(cut for _s, cut in want[slot])
                assert point["p90"] == _expected_point(want[slot]), (upstream["upstream"], slot)
    slow = next(u for u in (await _series(sessionmaker))["upstreams"] if u["upstream"] == "slow")
    bounds = [p for p in slow["points"] if p["p90"] is not None and p["p90"]["value_s"] is None]
    values = [p for p in slow["points"] if p["p90"] is not None and p["p90"]["value_s"] is not None]
    assert bounds and all(14 <= p["start"].hour < 18 for p in bounds), bounds
    assert len(values) >= 15
