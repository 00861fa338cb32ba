"""History rows in plain English (``hedgerow.controller.policy.explain``).

The worked examples are rows written by the real controller (``run_tick``) and by the real
operator paths (``routes_admin``) on a store of recorded calls, on SQLite and PostgreSQL; the
sentences are checked word for word, numbers and units included. The other tests cover every
reason code and rows whose details are missing or malformed.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from hedgerow.client.records import CallRecord
from hedgerow.controller.jobs import run_tick
from hedgerow.controller.policy.explain import EXPLAINED_CODES, explain_history_row
from hedgerow.controller.policy.reason_codes import REASON_CODES, REASON_MEANINGS
from hedgerow.controller.routes_admin import archive_route, configure_route, restore_route
from hedgerow.controller.store.ingest import ingest_calls, route_defaults
from hedgerow.controller.store.models import Route, Threshold
from hedgerow.settings import Settings
from tests.conftest import CallFactory

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


async def _store(sessionmaker: async_sessionmaker[AsyncSession], records: list[CallRecord], settings: Settings) -> None:
    async with sessionmaker() as session, session.begin():
        await ingest_calls(session, records, defaults=route_defaults(settings))


async def _publish(sessionmaker: async_sessionmaker[AsyncSession], value_s: float) -> None:
    """A value the objective published earlier (source ``controller``)."""
    async with sessionmaker() as session, session.begin():
        route = await session.scalar(select(Route))
        assert route is not None
        session.add(
            Threshold(
                route_id=route.id,
                hedge_after_s=value_s,
                enabled=True,
                source="controller",
                version=1,
                updated_at=NOW - timedelta(seconds=600),
            )
        )


def _fallback(code: str) -> str:
    """The sentence a code gets when its own explainer could not read the row."""
    return f"{code}: {REASON_MEANINGS[code]}."


# --- every code, any row -----------------------------------------------------------------------


def test_every_reason_code_has_a_sentence_of_its_own() -> None:
    assert EXPLAINED_CODES == REASON_CODES
    base = {"previous_hedge_after_s": 2.0, "hedge_after_s": 1.5, "applied": True, "budget": 0.1, "samples": 80}
    seen: dict[str, str] = {}
    for code in sorted(REASON_CODES):
        for details in (None, {}, {"binding": "looks"}):
            sentences = explain_history_row(base | {"reason": code, "details": details})
            if code not in ("archived", "restored"):  # an operator's state change leaves the value
                assert sentences.pop(0) == "The value went down from 2 s to 1.5 s (-25%).", (code, sentences)
            own = [s for s in sentences if not s.startswith("Samples:")]
            assert len(own) == 1, (code, details, sentences)
            assert own[0] != _fallback(code) and "does not know" not in own[0], (code, own)
            assert own[0].endswith("."), own
        seen[code] = own[0]
    assert len(set(seen.values())) == len(seen), seen  # no two codes read alike


def test_unknown_codes_and_empty_rows_get_a_sentence_not_an_error() -> None:
    assert explain_history_row({"reason": "tail_min,sideways", "hedge_after_s": 1.0, "applied": False})[-1] == (
        "sideways: a reason code this version does not know."
    )
    assert explain_history_row({}) == ["No reason was recorded."]
    assert explain_history_row({"reason": "", "details": [1, 2], "hedge_after_s": "x"}) == ["No reason was recorded."]
    tiny = {"reason": "cold_start_supported,clamped_max", "budget": 1e-300, "samples": 3, "hedge_after_s": 30.0}
    tiny["details"] = {"small_sample_test": {"samples": 3, "look_confidence": 0.975}}
    assert "samples are needed" not in " ".join(explain_history_row(tiny))  # no overflow, no absurd count
    held = explain_history_row({"reason": "pinned", "hedge_after_s": 0.8, "previous_hedge_after_s": 0.8, "repeats": 4})
    assert held[0] == "The value was held at 0.8 s. This hold stands for 4 ticks."


_DETAIL_KEYS = (
    "binding", "objective", "small_sample_test", "over_budget_test", "censored", "drift", "p99_check",
    "short_window", "changes", "created", "target_s",
)  # fmt: skip
_INNER_KEYS = (
    "chosen_s", "predicted_min_tail_s", "predicted_tail_at_chosen_s", "predicted_tail_at_current_s",
    "budget_target_s", "looks_target_s", "tolerance", "tail_levels", "predicted_tail_at_current_by_level_s",
    "predicted_tail_at_chosen_by_level_s", "current_within_budget", "quantile", "samples", "known", "known_over",
    "lower_bound", "raised_to_s", "cold_start", "look_confidence", "lowest_supported_s", "max_censored_s", "test",
    "since_s", "median_ratio", "p_value", "recent_over", "recent_known", "older_over", "older_known", "fresh",
    "call_p99_s", "primary_p99_s", "limit_s", "hedges", "window_s", "calls", "from", "to", "budget",
)  # fmt: skip
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 10**6),
    st.integers(min_value=10**308, max_value=10**400),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=5),
)
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(_INNER_KEYS), inner, max_size=6)
    ),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(
    codes=st.lists(st.sampled_from(sorted(REASON_CODES)), min_size=1, max_size=4),
    details=st.one_of(st.none(), _values, st.dictionaries(st.sampled_from(_DETAIL_KEYS), _values, max_size=6)),
    previous=_scalars,
    value=_scalars,
    row_extra=st.dictionaries(
        st.sampled_from(["applied", "repeats", "budget", "samples", "censored", "window_s", "actor"]), _scalars
    ),
)
def test_malformed_details_never_break_an_explanation(
    codes: list[str], details: object, previous: object, value: object, row_extra: dict[str, object]
) -> None:
    """Values of any type, NaN, negative counts, lists where objects belong: each code still reads
    its own sentence (never the fallback that a failing explainer would give)."""
    row = row_extra | {
        "reason": ",".join(codes),
        "details": details,
        "previous_hedge_after_s": previous,
        "hedge_after_s": value,
    }
    sentences = explain_history_row(row)
    assert sentences and all(isinstance(s, str) and s for s in sentences)
    for code in codes:
        assert _fallback(code) not in sentences, (code, row)
    assert not any("nan" in s.split() or "inf" in s.split() for s in sentences), sentences


# --- worked examples: rows of the real controller --------------------------------------------


async def test_a_cold_route_says_what_its_few_samples_support(
    sessionmaker: async_sessionmaker[AsyncSession], call_factory: CallFactory
) -> None:
    """30 fast calls support no value below the maximum at 97.5% per look (36 are needed); 10
    more, one of them 5.0 s, support the bucket of that slowest sample."""
    settings = Settings()
    rng = random.Random(3)
    fast = [
        call_factory(
            f"a{i}", started_at=NOW - timedelta(seconds=rng.uniform(60, 3000)), primary_ttft_s=rng.uniform(0.2, 0.6)
        )
        for i in range(30)
    ]
    await _store(sessionmaker, fast, settings)
    [row] = await run_tick(sessionmaker, settings, now=NOW)
    assert row["reason"] == "cold_start_supported,clamped_max"
    assert explain_history_row(row) == [
        "First published value: 30 s.",
        "A new route with too few samples (30 primary samples) for a confident quantile: no value below the route's"
        " maximum is shown within the 10% budget at 97.5% confidence yet (with none slow, about 36 samples are"
        " needed), so the maximum, 30 s, is published.",
        "The value is at the route's maximum (max_hedge_after_s), 30 s: at that bound hedging is in effect off.",
        "Samples: 30 primary TTFTs over the last 24 h; hedge rate 0%; 1 call in the last 5 min.",
    ]
    more = [
        call_factory(
            f"b{i}",
            started_at=NOW - timedelta(seconds=rng.uniform(60, 3000)),
            primary_ttft_s=rng.uniform(0.2, 0.6) if i else 5.0,
        )
        for i in range(10)
    ]
    await _store(sessionmaker, more, settings)
    [row] = await run_tick(sessionmaker, settings, now=NOW + timedelta(minutes=1))
    assert row["reason"] == "cold_start_supported"
    assert explain_history_row(row) == [
        "The value went down from 30 s to 5.012 s (-83.3%).",
        "A new route with too few samples (40 primary samples) for a confident quantile: the default is not shown"
        " within the 10% budget; the lowest value the samples support at 97.5% confidence, 5.012 s, is published.",
        "Samples: 40 primary TTFTs over the last 24 h; hedge rate 0%; 3 calls in the last 5 min.",
    ]


async def test_a_decrease_from_the_maximum_names_the_window_looks_bound_and_both_predictions(
    sessionmaker: async_sessionmaker[AsyncSession], call_factory: CallFactory
) -> None:
    """600 primaries, TTFT ~ Exp(mean 0.4 s), under a published 30 s: the objective chooses 1.129 s
    (cost tie), the window-looks bound cuts the decrease at 1.148 s; the next tick holds it."""
    settings = Settings()
    rng = random.Random(5)
    records = [
        call_factory(
            f"o{i}", started_at=NOW - timedelta(seconds=rng.uniform(60, 3300)), primary_ttft_s=rng.expovariate(2.5)
        )
        for i in range(600)
    ]
    await _store(sessionmaker, records, settings)
    await _publish(sessionmaker, 30.0)
    [row] = await run_tick(sessionmaker, settings, now=NOW)
    assert (row["reason"], row["details"]["binding"]) == ("cost_tie,step_down_limited", "looks")
    assert explain_history_row(row) == [
        "The value went down from 30 s to 1.148 s (-96.2%).",
        "Binding constraint: cost. The lowest predicted P99 TTFT is 1.396 s; 1.129 s predicts 1.423 s, within the 2%"
        " tolerance of it, with fewer hedges, so the objective takes that higher value.",
        "The decrease was cut to 1.148 s, the window-looks bound: the lowest value whose hedge rate stays within the"
        " 10% budget over the tick's repeated looks at its window, not only at one (the objective chose 1.129 s).",
        "Predicted P99 TTFT: 1.738 s at 30 s, 1.423 s at the objective's choice 1.129 s, lowest 1.396 s.",
        "Budget 10%: the budget target, the lowest value whose hedge rate is within it with confidence, is 1.047 s;"
        " hedge rate read off the curve: 0% at 30 s (upper bound 0.878%), 7.33% at 1.129 s (upper bound 9.6%).",
        "Samples: 600 primary TTFTs over the last 60 min; hedge rate 0%; 49 calls in the last 5 min.",
    ]
    [held] = await run_tick(sessionmaker, settings, now=NOW + timedelta(minutes=1))
    assert (held["reason"], held["details"]["binding"]) == ("hysteresis_hold", "hysteresis")
    assert explain_history_row(held)[:3] == [
        "The value was held at 1.148 s.",
        "The objective proposed 1.129 s (predicted P99 1.423 s, against 1.429 s at the current value); the current"
        " value is within the 10% budget (hedge rate upper bound 7.92%) and the data do not show it worse by more"
        " than the 2% tolerance at every level of P98.33, P99 and P99.67, so it is held at 1.148 s.",
        "Predicted P99 TTFT: 1.429 s at 1.148 s, 1.423 s at the objective's choice 1.129 s, lowest 1.396 s.",
    ]


async def test_a_detected_change_gives_its_evidence_and_the_flags(
    sessionmaker: async_sessionmaker[AsyncSession], call_factory: CallFactory
) -> None:
    """1,500 fast primaries, then 60 at 2.5-3.5 s in the last 4 minutes, all hedged at 1.0 s with a
    slower backup: the log-rank test shrinks the window to the change; no backup won."""
    settings = Settings()
    rng = random.Random(21)
    old = [
        call_factory(
            f"o{i}", started_at=NOW - timedelta(seconds=rng.uniform(400, 3300)), primary_ttft_s=rng.uniform(0.2, 0.6)
        )
        for i in range(1500)
    ]
    slow = [
        call_factory(
            f"s{i}",
            started_at=NOW - timedelta(seconds=rng.uniform(1, 240)),
            primary_ttft_s=rng.uniform(2.5, 3.5),
            hedge_after_s=1.0,
            backup_ttft_s=5.0,
        )
        for i in range(60)
    ]
    await _store(sessionmaker, old + slow, settings)
    await _publish(sessionmaker, 1.0)
    [row] = await run_tick(sessionmaker, settings, now=NOW)
    assert row["reason"] == "budget_bound,drift_window,backups_rarely_win,hedges_did_not_lower_p99"
    assert explain_history_row(row) == [
        "The value went up from 1 s to 3.631 s (3.63 times as high).",
        "Binding constraint: the 10% budget. The value with the lowest predicted P99 TTFT is at the budget target,"
        " 3.631 s, the lowest value whose hedge rate stays within the budget with confidence: a lower one would risk"
        " the budget.",
        "Predicted P99 TTFT: 3.61 s at 1 s, 3.61 s at the objective's choice 3.631 s.",
        "Budget 10%: the budget target, the lowest value whose hedge rate is within it with confidence, is 3.631 s;"
        " hedge rate read off the curve: 100% at 1 s (upper bound 100%), 0% at 3.631 s (upper bound 8.9%).",
        "A change of the primary's TTFT was detected 5 min ago: the median TTFT since then is 7.24 times the median"
        " before (log-rank p = 4.4e-59; 60 samples since, 1,500 before); the window was shrunk to the data since the"
        " change. The change is recent (within the short window), so the hold and the step limits do not apply: the"
        " old value belonged to the regime before it.",
        "Samples: 60 primary TTFTs over the last 5 min; hedge rate 100%; 60 calls in the last 5 min.",
        "Flag: backups won only 0% of 60 hedges; the backup probably shares the primary's queue.",
        "Flag: the calls' P99 TTFT, 3.631 s, is not 5% below the primary's P99, 3.631 s (it would need to be under"
        " 3.449 s): hedging is not lowering the tail.",
    ]


async def test_censored_and_small_sample_rows_give_their_counts(
    sessionmaker: async_sessionmaker[AsyncSession], call_factory: CallFactory
) -> None:
    """Hedging at 1.0 s with a fast backup censors the tail (the default is above every censoring
    time: kept); 40 samples, 10 of them past a published 0.5 s, show that value over budget."""
    settings = Settings()
    rng = random.Random(11)
    records = []
    for i in range(400):
        started = NOW - timedelta(seconds=rng.uniform(1.0, 3000.0))
        primary = rng.expovariate(1.0)
        hedged = primary > 1.0
        records.append(
            call_factory(
                f"u{i}",
                started_at=started,
                primary_ttft_s=primary,
                hedge_after_s=1.0 if hedged else None,
                backup_ttft_s=rng.expovariate(10.0) if hedged else None,
            )
        )
    await _store(sessionmaker, records, settings)
    [row] = await run_tick(sessionmaker, settings, now=NOW)
    assert row["reason"] == "censored_hold"
    assert explain_history_row(row) == [
        "First published value: 2 s.",
        "The budget's quantile lies where primaries were cancelled up to 1.585 s, and the value lies above every"
        " censoring time, where the data cannot show a better one: kept.",
        "Samples: 400 primary TTFTs (140 censored: cancelled before a first token) over the last 60 min; hedge rate"
        " 37.8%; 41 calls in the last 5 min.",
    ]


async def test_few_samples_over_budget_raise_the_value_with_their_counts(
    sessionmaker: async_sessionmaker[AsyncSession], call_factory: CallFactory
) -> None:
    settings = Settings()
    rng = random.Random(7)
    records = [
        call_factory(
            f"r{i}",
            started_at=NOW - timedelta(seconds=rng.uniform(60, 3000)),
            primary_ttft_s=rng.uniform(0.1, 0.4) if i % 4 else rng.uniform(1.0, 2.0),
        )
        for i in range(40)
    ]
    await _store(sessionmaker, records, settings)
    await _publish(sessionmaker, 0.5)
    [row] = await run_tick(sessionmaker, settings, now=NOW)
    assert row["reason"] == "small_sample_raise"
    assert explain_history_row(row)[:2] == [
        "The value went up from 0.5 s to 1.995 s (3.99 times as high).",
        "Too few samples for a confident quantile, but they show the 10% budget exceeded: 10 of the 40 primaries"
        " whose wait is known waited past 0.5 s, and the confidence lower bound on that share, 14.2%, exceeds it;"
        " the value was raised to 1.995 s.",
    ]


async def test_operator_changes_say_who_changed_what(
    sessionmaker: async_sessionmaker[AsyncSession], call_factory: CallFactory
) -> None:
    settings = Settings()
    await _store(
        sessionmaker, [call_factory(f"c{i}", started_at=NOW - timedelta(seconds=60 + i)) for i in range(5)], settings
    )
    await run_tick(sessionmaker, settings, now=NOW)
    later = NOW + timedelta(minutes=1)
    pin = await configure_route(
        sessionmaker, settings, "summarize", "m1", {"pinned_hedge_after_s": 1.5}, replace=False, actor="ops", now=later
    )
    assert pin.history is not None and pin.history["reason"] == "config,pinned"
    assert explain_history_row(pin.history)[:3] == [
        "The value went down from 30 s to 1.5 s (-95%).",
        "ops changed the route's configuration (pinned_hedge_after_s none → 1.5 s); the value was decided again at"
        " once.",
        "An operator pinned the value at 1.5 s: it is published as is, and the controller's rules do not apply while"
        " the pin stands.",
    ]
    off = await configure_route(
        sessionmaker,
        settings,
        "summarize",
        "m1",
        {"pinned_hedge_after_s": None, "enabled": False, "budget": 0.05},
        replace=False,
        actor="ops",
        now=later + timedelta(minutes=1),
    )
    assert off.history is not None and off.history["reason"] == "config,disabled"
    assert explain_history_row(off.history)[1:3] == [
        "ops changed the route's configuration (enabled yes → no; budget 10% → 5%; pinned_hedge_after_s 1.5 s →"
        " none); the value was decided again at once.",
        "The route is disabled: clients do not hedge, and the controller keeps its value (2 s) without deciding.",
    ]
    archived = await archive_route(sessionmaker, "summarize", "m1", actor="ops", now=later + timedelta(minutes=2))
    assert archived.history is not None
    assert explain_history_row(archived.history) == [
        "ops archived the route: it is no longer ticked nor published, and records naming it are refused; its"
        " history is kept."
    ]
    restored = await restore_route(
        sessionmaker, settings, "summarize", "m1", actor="ops", now=later + timedelta(minutes=3)
    )
    assert restored.history is not None
    assert explain_history_row(restored.history) == [
        "ops restored the archived route: it is ticked and published again."
    ]


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        (  # rule 4 with the short window's counts (inputs as the tick records them)
            {
                "reason": "raise_over_budget",
                "previous_hedge_after_s": 1.0,
                "hedge_after_s": 2.2,
                "applied": True,
                "budget": 0.1,
                "details": {
                    "binding": "evidence",
                    "short_window": {"window_s": 300.0, "calls": 60},
                    "over_budget_test": {
                        "value_s": 1.0,
                        "samples": 60,
                        "known": 60,
                        "known_over": 18,
                        "lower_bound": 0.2,
                        "over_budget": True,
                        "raised_to_s": 2.2,
                    },
                },
            },
            "Binding constraint: evidence of over budget. The last 5 min show the proposed value 1 s over budget: 18"
            " of the 60 primaries whose wait is known waited past it, and the confidence lower bound on that share,"
            " 20%, exceeds the 10% budget; it was raised to 2.2 s, the lowest value that test accepts.",
        ),
        (  # a step limit (not the window-looks bound)
            {
                "reason": "tail_min,step_down_limited",
                "previous_hedge_after_s": 2.0,
                "hedge_after_s": 1.5,
                "applied": True,
                "budget": 0.1,
                "details": {"binding": "step_down", "objective": {"chosen_s": 0.9, "looks_target_s": 0.95}},
            },
            "The decrease was cut to 1.5 s, the largest step down allowed per tick, 25% below 2 s (the objective chose"
            " 0.9 s); the window-looks bound is 0.95 s.",
        ),
    ],
)
def test_rows_of_rules_the_examples_above_do_not_reach(row: dict[str, Any], expected: str) -> None:
    assert expected in explain_history_row(row)
