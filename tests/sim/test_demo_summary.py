"""The demo's arithmetic and words on records built by hand: parts, figures, table, sentences.

These check what the end-to-end demo test cannot afford to check on a loaded machine: that the
split at the change, the quantiles, the token accounting, the manual-P90 threshold and the
verdict sentence follow from the records, including the verdict when adaptive does *not* win.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from rich.console import Console

from hedgerow.client import AttemptRecord, CallRecord
from hedgerow.client.records import AttemptRole, CallStatus
from hedgerow.sim.demo import (
    ChangeOfConditions,
    DemoConfig,
    ModeResult,
    best_way_sentence,
    conclusion_sentences,
    manual_p90,
    p99_difference_interval,
    results_table,
    summarize,
)
from hedgerow.sim.trace import TraceRequest

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
CHANGE = ChangeOfConditions("degrade", "replica-b", 1.0, 2.5, 5.0)


def call(
    i: int, ttft_s: float, *, hedged: bool = False, backup_won: bool = False, status: CallStatus = "ok"
) -> CallRecord:
    """Call ``i`` started ``i`` seconds after T0; each attempt cost 100 prompt and 10 completion tokens
    when it won, 100 prompt tokens and nothing else when it lost (cancelled before its first token)."""
    attempts: tuple[AttemptRecord, ...]
    winner: AttemptRole
    if not hedged:
        attempts = (AttemptRecord("a", "primary", 0.0, ttft_s, ttft_s + 1, "won", 200, None, 10, 100),)
        winner = "primary"
    elif backup_won:
        attempts = (
            AttemptRecord("a", "primary", 0.0, None, ttft_s, "cancelled", 200, None, 0, 100),
            AttemptRecord("b", "backup", 0.5, ttft_s, ttft_s + 1, "won", 200, None, 10, 100),
        )
        winner = "backup"
    else:
        attempts = (
            AttemptRecord("a", "primary", 0.0, ttft_s, ttft_s + 1, "won", 200, None, 10, 100),
            AttemptRecord("b", "backup", 0.5, None, ttft_s, "cancelled", 200, None, 0, 100),
        )
        winner = "primary"
    return CallRecord(
        request_id=f"r{i}",
        route="demo-x",
        model="m",
        started_at=T0 + timedelta(seconds=i),
        hedged=hedged,
        hedge_reason="ttft_timeout" if hedged else None,
        winner=winner,
        status=status,
        ttft_s=ttft_s,
        prompt_tokens=100,
        completion_tokens=10,
        attempts=attempts,
    )


def test_worked_number_of_the_module_docstring() -> None:
    records = [call(i, 0.1 * (i + 1), hedged=i in (3, 7), backup_won=i == 3) for i in range(10)]
    result = summarize("fixed", records, 0.0, (1.0, 1.0))
    assert result.calls == 10
    assert result.hedge_rate == pytest.approx(0.2) and result.backup_win_rate == pytest.approx(0.5)
    assert result.extra_prompt_tokens == 200 and result.extra_completion_tokens == 0
    # 12 attempts x 100 prompt tokens + 10 winners x 10 completion tokens = 1,300 tokens in all.
    assert result.extra_token_share == pytest.approx(200 / 1300)
    assert result.overhead_share == pytest.approx(200 / 1300)  # equal prices: the same share in USD
    assert result.ttft_p50_s == pytest.approx(0.55) and result.ttft_max_s == pytest.approx(1.0)


def test_warm_up_then_split_at_the_change() -> None:
    records = [call(i, 1.0 if i >= 6 else 0.1) for i in range(12)]
    result = summarize("none", list(reversed(records)), 0.25, None, change_at=T0 + timedelta(seconds=6))
    # 12 calls, the first 3 left out; 3..5 started before the change, 6..11 at or after it.
    assert result.calls == 9
    assert result.before_change is not None and result.after_change is not None
    assert (result.before_change.calls, result.after_change.calls) == (3, 6)
    assert result.before_change.ttft_p99_s == pytest.approx(0.1)
    assert result.after_change.ttft_p99_s == pytest.approx(1.0)
    whole = result.part("whole")
    assert whole is not None and whole.calls == 9 and result.part("after") is result.after_change
    with pytest.raises(ValueError, match="part must be"):
        result.part("middle")
    with pytest.raises(ValueError, match="warmup_fraction"):
        summarize("none", records, 1.0)


def test_quantiles_interpolate_and_failed_calls_count_as_errors() -> None:
    records = [call(i, float(i + 1)) for i in range(100)] + [replace(call(100, 0.0), ttft_s=None, status="error")]
    part = summarize("none", records).part("whole")
    assert part is not None
    assert part.calls == 101 and part.errors == 1
    # numpy's linear interpolation over the 100 first tokens 1..100 s: P99 = 99.01, P99.9 = 99.901.
    assert part.ttft_p99_s == pytest.approx(99.01) and part.ttft_p999_s == pytest.approx(99.901)


def test_manual_p90_is_the_none_way_before_the_change() -> None:
    records = [call(i, 0.1 * (i + 1)) for i in range(10)] + [call(10 + i, 9.0) for i in range(10)]
    none = summarize("none", records, 0.0, None, change_at=T0 + timedelta(seconds=10))
    assert manual_p90(none) == pytest.approx(0.91)  # the P90 of 0.1..1.0 s, not of the slow half
    with pytest.raises(ValueError, match="no P90"):
        manual_p90(summarize("none", [], 0.0, None, change_at=T0))


def way(mode: str, after_p99_s: float, hedge_rate: float, **fields: object) -> ModeResult:
    """A ModeResult whose parts carry the given after-change P99 and hedge rate."""
    records = [call(i, 0.1) for i in range(10)]
    base = summarize(mode, records, 0.0, None, change_at=T0 + timedelta(seconds=5))
    assert base.before_change is not None and base.after_change is not None
    return replace(
        base,
        hedge_rate=hedge_rate,
        after_change=replace(base.after_change, ttft_p99_s=after_p99_s, hedge_rate=hedge_rate),
        **fields,  # type: ignore[arg-type]
    )


def test_sentences_say_what_was_done_and_who_won() -> None:
    results = [
        way("none", 2.0, 0.0),
        way("fixed", 1.5, 0.12, hedge_after_s=0.3),
        way("adaptive", 1.0, 0.09, published_hedge_after_s=0.8),
    ]
    first, second, third = conclusion_sentences(results, CHANGE, 0.10, "p90_of_none")
    assert "backup" in first and "10%" in first
    assert "replica-b slowed down 2.5x" in second and "0.300 s, the none way's P90 before the change" in second
    assert "0.800 s at the end" in second
    best = "Best on TTFT P99 after the change: adaptive (none 2.000 s, fixed 1.500 s, adaptive 1.000 s)."
    assert third.startswith(best)
    assert " Measured beat guessed" in third and "1.000 s against 1.500 s" in third and "(-33%)" in third


def test_sentences_say_so_when_adaptive_does_not_win() -> None:
    results = [way("none", 2.0, 0.0), way("fixed", 1.0, 0.1, hedge_after_s=0.3), way("adaptive", 1.2, 0.09)]
    third = conclusion_sentences(results, CHANGE, 0.10, "--fixed-hedge-after")[2]
    assert third.startswith("Best on TTFT P99 after the change: fixed") and "(+20%)" in third
    assert " Adaptive did not win in this run" in third
    over = [way("fixed", 1.0, 0.1, hedge_after_s=0.3), way("adaptive", 0.8, 0.15)]
    assert " Adaptive did not win fairly" in conclusion_sentences(over, CHANGE, 0.10, "p90_of_none")[2]
    alone = conclusion_sentences([way("none", 1.0, 0.0)], CHANGE, 0.10, "p90_of_none")[2]
    assert alone.startswith("No conclusion")


def test_table_has_a_row_per_way_and_part_and_fits_the_console() -> None:
    results = [way("none", 2.0, 0.0), way("fixed", 1.5, 0.12, hedge_after_s=0.3), way("adaptive", 1.0, 0.09)]
    console = Console(width=120, record=True)
    console.print(results_table(results, 0.10))
    lines = console.export_text().splitlines()
    assert "P99.9" in "\n".join(lines) and "(bgt 10%)" in "\n".join(lines)
    rows = [line.split() for line in lines if line.split()[:1] in (["none"], ["fixed"], ["adaptive"])]
    assert [r[:2] for r in rows] == [["none", "before"], ["fixed", "before"], ["adaptive", "before"]]
    parts = [word for line in lines for word in line.split()[:2] if word in ("before", "after", "whole")]
    assert parts == ["before", "after", "whole"] * 3
    assert not [line for line in lines if "…" in line]  # nothing cut at the CLI's width


def test_config_checks_and_change_descriptions() -> None:
    with pytest.raises(ValueError, match="change must be one of"):
        DemoConfig(change="explode")
    with pytest.raises(ValueError, match="change_fraction"):
        DemoConfig(change_fraction=1.0)
    with pytest.raises(ValueError, match="warmup_fraction"):
        DemoConfig(warmup_fraction=0.6)
    with pytest.raises(ValueError, match="budget_burst"):
        DemoConfig(budget_burst=-1.0)
    assert DemoConfig.quick().duration_s == 22.0
    assert DemoConfig().change_of_conditions().describe() == "replica-b slowed down 2.5x as well"
    recover = DemoConfig(change="recover").change_of_conditions(3.0)
    assert (recover.replica, recover.slowdown_after, recover.at_s) == ("replica-c", 1.0, 3.0)
    assert DemoConfig(change="none").change_of_conditions().describe() == "nothing changed"
    assert DemoConfig().change_index(264) == 132 and DemoConfig().change_index(2) == 1
    workload = [TraceRequest(float(i), 10, 10) for i in range(4)]
    assert DemoConfig().change_index(len(workload)) == 2


def test_demo_help_quotes_the_real_durations() -> None:
    from typer.testing import CliRunner

    from hedgerow.cli import app

    text = " ".join(CliRunner().invoke(app, ["demo", "--help"], env={"COLUMNS": "200"}).output.split())
    default, quick = DemoConfig().duration_s, DemoConfig.quick().duration_s
    assert f"(default {default:g}, {quick:g} with --quick)" in text
    assert f"{quick:g} s of load per way" in text
    assert "P90 TTFT of the none way before the change" in text


def test_bootstrap_interval_of_the_p99_difference() -> None:
    import numpy as np

    rng = np.random.default_rng(1)
    fast: list[float] = rng.uniform(0.1, 0.2, 130).tolist()
    slow: list[float] = rng.uniform(1.0, 2.0, 130).tolist()
    low, high = p99_difference_interval(fast, slow)  # type: ignore[misc]  # 130 draws each: not None
    assert low < high < 0 and high < -0.7  # every resampled P99 of ``fast`` is ~1.6 s below ``slow``'s
    same = p99_difference_interval(slow, rng.uniform(1.0, 2.0, 130).tolist())
    assert same is not None and same[0] < 0 < same[1]
    assert p99_difference_interval(fast, slow) == (low, high)  # seeded: the same samples, the same interval
    assert p99_difference_interval(fast[:19], slow) is None


def test_a_lower_p99_within_the_noise_is_not_called_a_win() -> None:
    results = [way("fixed", 1.00, 0.1, hedge_after_s=0.3), way("adaptive", 0.99, 0.09)]
    tie = conclusion_sentences(results, CHANGE, 0.10, "p90_of_none", (-0.4, 0.3))[2]
    assert tie.startswith("No way was clearly best") and "-0.400 to +0.300 s" in tie
    assert " Adaptive was lower but not clearly" in tie
    clear = conclusion_sentences(results, CHANGE, 0.10, "p90_of_none", (-0.4, -0.01))[2]
    assert " Measured beat guessed" in clear and "-0.400 to -0.010 s" in clear


def test_the_verdict_names_the_best_way_on_p99() -> None:
    """The verdict compared adaptive with fixed only: a run where not hedging did best (none 0.340 s,
    fixed 0.406 s, adaptive 0.405 s) read "adaptive was lower but not clearly". It now starts by
    naming the best of the three on P99 after the change, and says plainly when that is none, why."""
    fixed = way("fixed", 0.406, 0.1, hedge_after_s=0.3)
    none_best = best_way_sentence([way("none", 0.340, 0.0), fixed, way("adaptive", 0.405, 0.09)])
    assert none_best.startswith(
        "Not hedging did best on TTFT P99 after the change (none 0.340 s, fixed 0.406 s, adaptive 0.405 s): "
    )
    # fixed's threshold 0.3 s + a fresh call's TTFT (the none way's P50, 0.1 s) > none's P99
    assert "at best 0.400 s (hedge_after_s 0.300 s + a fresh call's TTFT 0.100 s)" in none_best
    assert "not slow enough to pay for the backup's prefill" in none_best
    # none best although a backup could have come in time: the load of the backups is the why
    loaded = best_way_sentence([way("none", 0.9, 0.0), way("fixed", 1.2, 0.1, hedge_after_s=0.3)])
    assert loaded.startswith("Not hedging did best") and "slowed the primaries" in loaded
    adaptive_best = best_way_sentence([way("none", 2.0, 0.0), fixed, way("adaptive", 0.3, 0.09)])
    expected = "Best on TTFT P99 after the change: adaptive (none 2.000 s, fixed 0.406 s, adaptive 0.300 s)."
    assert adaptive_best == expected
    fixed_best = best_way_sentence([way("none", 2.0, 0.0), fixed, way("adaptive", 0.6, 0.09)])
    assert fixed_best.startswith("Best on TTFT P99 after the change: fixed (")
    assert best_way_sentence([way("none", 1.0, 0.0)]) == ""


def test_a_best_way_within_noise_is_called_a_tie() -> None:
    """Within 5% of each other without samples, or when the bootstrap interval of the P99
    difference reaches 0 with them, ways tie; a tie that includes none says hedging did not
    clearly help."""
    results = [way("none", 0.400, 0.0), way("fixed", 0.410, 0.1, hedge_after_s=0.3), way("adaptive", 0.9, 0.09)]
    tie = best_way_sentence(results)
    assert tie.startswith("No way was clearly best on TTFT P99 after the change (none 0.400 s, fixed 0.410 s")
    assert "none and fixed are within noise (hedging did not clearly help)." in tie
    # with samples: two draws of the same spread tie; a clearly slower third does not
    import numpy as np

    rng = np.random.default_rng(1)
    same = {m: list(rng.lognormal(np.log(0.3), 0.4, 150)) for m in ("fixed", "adaptive")}
    slow = {"none": [t * 3 for t in rng.lognormal(np.log(0.3), 0.4, 150)]}
    results = [way("none", 2.0, 0.0), way("fixed", 0.70, 0.1, hedge_after_s=0.3), way("adaptive", 0.60, 0.09)]
    sampled = best_way_sentence(results, same | slow)  # 0.60 vs 0.70 is > 5%, but the samples say noise
    assert "adaptive and fixed are within noise." in sampled and "did not clearly help" not in sampled
