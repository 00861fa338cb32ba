"""The demo's arithmetic and words: records to per-way figures, the table, the three sentences.

Pure code (no I/O, no clock), so that what the demo claims is tested on records built by hand
(``tests/sim/test_demo_summary.py``) rather than only on a loaded machine's run.

Parts of a way: the calls left after the warm-up are split at the change of conditions (the wall
moment ``change_at`` when a replica was degraded or recovered) into ``before`` (started earlier)
and ``after`` (started at or after it); ``whole`` is both. Every figure is computed per part.

Figures (all over one part's calls):

- TTFT quantiles over the calls that produced a first token, ``numpy.quantile``'s default linear
  interpolation (P99.9 of 200 calls lies between the two largest);
- hedge rate = calls hedged for a late first token (``hedge_reason == "ttft_timeout"``) / calls;
  backup win rate = those calls won by the backup / those calls;
- extra tokens = the prompt and completion tokens of the attempts that did not win, in calls with
  more than one attempt (a backup re-sends the whole prompt: its prefill is the price of a hedge);
  ``extra_token_share`` = extra tokens / every attempt's tokens; ``overhead_share`` the same in USD
  at the demo price (the weekly report's cost accounting).

Worked number (checked by the tests): 10 calls, 2 hedged, one of them won by the backup; each
winning attempt cost 100 prompt and 10 completion tokens, each losing one 100 prompt tokens (it
was cancelled after its headers, before its first token): the
losing primary of the backup-won call costs 100 prompt tokens, the losing backup of the other
100 prompt tokens; the attempts spent 12 x 100 + 10 x 10 = 1,300 tokens, so the extra share is
200 / 1,300 = 15.4%; hedge rate 20%, backup win rate 50%.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
from scipy import stats

from hedgerow.client import CallRecord

__all__ = [
    "ChangeOfConditions",
    "ModeResult",
    "PartResult",
    "after_change_ttfts",
    "best_way_sentence",
    "conclusion_sentences",
    "manual_p90",
    "p99_difference_interval",
    "results_table",
    "split_parts",
    "summarize",
    "summarize_part",
]


@dataclass(frozen=True, slots=True)
class ChangeOfConditions:
    """What changed halfway through each way.

    Attributes:
        kind: ``"degrade"`` (one more replica slows down), ``"recover"`` (the degraded replica
            recovers) or ``"none"`` (nothing changes).
        replica: the replica whose speed changed (None for ``"none"``).
        slowdown_before / slowdown_after: its service-time factor before and after.
        at_s: seconds into each way's load when the change happened (None while not known).
    """

    kind: str
    replica: str | None
    slowdown_before: float
    slowdown_after: float
    at_s: float | None = None

    def describe(self) -> str:
        """A phrase naming the change, e.g. ``replica-b slowed down 2.5x (like replica-c)``."""
        if self.kind == "none" or self.replica is None:
            return "nothing changed"
        if self.kind == "degrade":
            return f"{self.replica} slowed down {self.slowdown_after:g}x as well"
        return f"the degraded {self.replica} recovered ({self.slowdown_before:g}x to {self.slowdown_after:g}x)"


@dataclass(frozen=True, slots=True)
class PartResult:
    """One part (``before``, ``after`` or ``whole``) of one way. Seconds, fractions, tokens.

    ``published_hedge_after_s`` is the value the api had published for the way's route by the
    end of the part (adaptive way; the fixed way's own threshold for the fixed way; None for
    ``none``).
    """

    part: str
    calls: int
    ttft_p50_s: float | None
    ttft_p90_s: float | None
    ttft_p99_s: float | None
    ttft_p999_s: float | None
    ttft_max_s: float | None
    hedge_rate: float
    backup_win_rate: float | None
    errors: int
    extra_prompt_tokens: int
    extra_completion_tokens: int
    extra_token_share: float | None
    overhead_share: float | None
    wasted_completion_tokens: int
    published_hedge_after_s: float | None = None


@dataclass(frozen=True, slots=True)
class ModeResult:
    """What one way measured (after warm-up). Times in seconds, rates as fractions.

    The flat fields are the whole run's (the ``--json`` keys of earlier versions keep their
    meaning: ``final_hedge_after_s`` is the client's last *polled* value); ``before_change`` and
    ``after_change`` hold the two parts. ``records_rejected`` counts this way's call records that
    the api refused (all of its calls, warm-up included); it should be 0. ``hedge_after_s`` is the
    threshold the way started with and ``hedge_after_source`` says where it came from (``none``,
    ``p90_of_none``, ``--fixed-hedge-after`` or ``controller``); ``published_hedge_after_s`` the
    value the api published last for the way's route (adaptive) or the fixed value.
    """

    mode: str
    calls: int
    ttft_p50_s: float | None
    ttft_p90_s: float | None
    ttft_p99_s: float | None
    ttft_max_s: float | None
    hedge_rate: float
    backup_win_rate: float | None
    wasted_completion_tokens: int
    errors: int
    final_hedge_after_s: float | None = None
    threshold_path_s: tuple[float, ...] = ()
    records_rejected: int = 0
    extra_prompt_tokens: int = 0
    overhead_share: float | None = None
    ttft_p999_s: float | None = None
    extra_completion_tokens: int = 0
    extra_token_share: float | None = None
    hedge_after_s: float | None = None
    hedge_after_source: str = "none"
    published_hedge_after_s: float | None = None
    before_change: PartResult | None = None
    after_change: PartResult | None = None

    def part(self, name: str) -> PartResult | None:
        """``"before"``, ``"after"`` or ``"whole"`` (the flat fields as a ``PartResult``)."""
        if name == "before":
            return self.before_change
        if name == "after":
            return self.after_change
        if name == "whole":
            return PartResult(
                "whole",
                self.calls,
                self.ttft_p50_s,
                self.ttft_p90_s,
                self.ttft_p99_s,
                self.ttft_p999_s,
                self.ttft_max_s,
                self.hedge_rate,
                self.backup_win_rate,
                self.errors,
                self.extra_prompt_tokens,
                self.extra_completion_tokens,
                self.extra_token_share,
                self.overhead_share,
                self.wasted_completion_tokens,
                self.published_hedge_after_s,
            )
        raise ValueError(f"part must be 'before', 'after' or 'whole', got {name!r}")


def split_parts(
    records: Sequence[CallRecord], warmup_fraction: float, change_at: datetime | None
) -> tuple[list[CallRecord], list[CallRecord]]:
    """The calls after warm-up, in start order, split at ``change_at`` into (before, after).

    Args:
        records: one way's records, any order.
        warmup_fraction: leading fraction of the calls (by start time) left out, in [0, 1).
        change_at: aware UTC moment of the change; None puts every call in ``before``.

    Raises:
        ValueError: ``warmup_fraction`` outside [0, 1).
    """
    if not 0 <= warmup_fraction < 1:
        raise ValueError(f"warmup_fraction must be in [0, 1), got {warmup_fraction!r}")
    ordered = sorted(records, key=lambda r: r.started_at)
    kept = ordered[int(len(ordered) * warmup_fraction) :]
    if change_at is None:
        return kept, []
    return [r for r in kept if r.started_at < change_at], [r for r in kept if r.started_at >= change_at]


def summarize_part(
    part: str,
    records: Sequence[CallRecord],
    price_usd_per_mtok: tuple[float, float] | None = None,
    published_hedge_after_s: float | None = None,
) -> PartResult:
    """The figures of one part's calls (see the module docstring for each definition).

    Args:
        part: its name (``before``, ``after``, ``whole``).
        records: the part's calls.
        price_usd_per_mtok: (input, output) USD per million tokens; None leaves
            ``overhead_share`` None.
        published_hedge_after_s: the value published by the end of the part, carried as is.
    """
    ttfts = np.array([r.ttft_s for r in records if r.ttft_s is not None], dtype=float)
    hedged = [r for r in records if r.hedge_reason == "ttft_timeout"]

    def q(p: float) -> float | None:
        return float(np.quantile(ttfts, p)) if ttfts.size else None

    spent = [0, 0]  # prompt, completion tokens of every attempt
    extra = [0, 0]  # the same of the attempts that did not win
    for record in records:
        for attempt in record.attempts:
            prompt = attempt.prompt_tokens or 0
            spent[0] += prompt
            spent[1] += attempt.completion_tokens
            if len(record.attempts) > 1 and attempt.outcome != "won":
                extra[0] += prompt
                extra[1] += attempt.completion_tokens
    share = None
    if price_usd_per_mtok is not None:
        usd_in, usd_out = price_usd_per_mtok
        total_usd = spent[0] * usd_in + spent[1] * usd_out
        share = (extra[0] * usd_in + extra[1] * usd_out) / total_usd if total_usd else None
    total_tokens = spent[0] + spent[1]
    return PartResult(
        part=part,
        calls=len(records),
        ttft_p50_s=q(0.50),
        ttft_p90_s=q(0.90),
        ttft_p99_s=q(0.99),
        ttft_p999_s=q(0.999),
        ttft_max_s=float(ttfts.max()) if ttfts.size else None,
        hedge_rate=len(hedged) / len(records) if records else 0.0,
        backup_win_rate=(sum(r.winner == "backup" for r in hedged) / len(hedged)) if hedged else None,
        errors=sum(r.status != "ok" for r in records),
        extra_prompt_tokens=extra[0],
        extra_completion_tokens=extra[1],
        extra_token_share=(extra[0] + extra[1]) / total_tokens if total_tokens else None,
        overhead_share=share,
        wasted_completion_tokens=sum(r.wasted_completion_tokens for r in records),
        published_hedge_after_s=published_hedge_after_s,
    )


def summarize(
    mode: str,
    records: Sequence[CallRecord],
    warmup_fraction: float = 0.0,
    price_usd_per_mtok: tuple[float, float] | None = None,
    change_at: datetime | None = None,
) -> ModeResult:
    """Reduce one way's records to a ``ModeResult``: the whole run and its two parts.

    Args:
        mode: the way (``none``, ``fixed``, ``adaptive``).
        records: its records, any order.
        warmup_fraction: leading fraction of the calls left out, in [0, 1).
        price_usd_per_mtok: the demo price, (input, output) USD per million tokens, or None.
        change_at: the change of conditions (aware UTC), or None (``after_change`` is then an
            empty part).

    Raises:
        ValueError: ``warmup_fraction`` outside [0, 1).
    """
    before, after = split_parts(records, warmup_fraction, change_at)
    whole = summarize_part("whole", before + after, price_usd_per_mtok)
    return ModeResult(
        mode=mode,
        calls=whole.calls,
        ttft_p50_s=whole.ttft_p50_s,
        ttft_p90_s=whole.ttft_p90_s,
        ttft_p99_s=whole.ttft_p99_s,
        ttft_max_s=whole.ttft_max_s,
        hedge_rate=whole.hedge_rate,
        backup_win_rate=whole.backup_win_rate,
        wasted_completion_tokens=whole.wasted_completion_tokens,
        errors=whole.errors,
        extra_prompt_tokens=whole.extra_prompt_tokens,
        overhead_share=whole.overhead_share,
        ttft_p999_s=whole.ttft_p999_s,
        extra_completion_tokens=whole.extra_completion_tokens,
        extra_token_share=whole.extra_token_share,
        before_change=summarize_part("before", before, price_usd_per_mtok),
        after_change=summarize_part("after", after, price_usd_per_mtok),
    )


def manual_p90(none_way: ModeResult) -> float:
    """The manual recipe's threshold: the P90 TTFT of the unhedged way *before* the change.

    That is what a team tuning by hand would measure (observe TTFT without hedging, take its
    P90) on yesterday's traffic; the change then makes it meet today's.

    Raises:
        ValueError: the ``none`` way has no first token before the change to take a P90 of.
    """
    before = none_way.before_change
    value = before.ttft_p90_s if before is not None else None
    if value is None or not math.isfinite(value) or value <= 0:
        raise ValueError("the none way measured no TTFT before the change: no P90 to set the fixed way from")
    return value


def after_change_ttfts(
    records: Sequence[CallRecord], warmup_fraction: float, change_at: datetime | None
) -> list[float]:
    """The TTFTs (s) of the calls started at or after the change (after warm-up), in start order."""
    return [r.ttft_s for r in split_parts(records, warmup_fraction, change_at)[1] if r.ttft_s is not None]


def p99_difference_interval(
    adaptive_s: Sequence[float],
    fixed_s: Sequence[float],
    confidence: float = 0.95,
    n_resamples: int = 2000,
    seed: int = 0,
) -> tuple[float, float] | None:
    """A bootstrap confidence interval of ``P99(adaptive_s) - P99(fixed_s)``, seconds.

    The two ways' calls are different calls, so each sample is resampled on its own
    (``scipy.stats.bootstrap`` with ``paired=False``); the interval is the percentile interval
    (Efron & Tibshirani, "An Introduction to the Bootstrap", 1993, ch. 13) of the difference of
    the two resampled P99s (``numpy.quantile``, linear). With ~130 calls a P99 rests on the two
    slowest calls, so the interval is wide: a difference of a few percent is noise.

    Args:
        adaptive_s, fixed_s: TTFTs in seconds, at least 20 each.
        confidence: the interval's confidence level, in (0, 1).
        n_resamples: bootstrap resamples.
        seed: seed of the resampling (the same samples give the same interval).

    Returns:
        (low, high) in seconds, or None when a sample has fewer than 20 values.
    """
    if len(adaptive_s) < 20 or len(fixed_s) < 20:
        return None

    def p99_difference(a: np.ndarray, f: np.ndarray, axis: int = -1) -> np.ndarray:
        return np.asarray(np.quantile(a, 0.99, axis=axis) - np.quantile(f, 0.99, axis=axis))

    result = stats.bootstrap(
        (np.asarray(adaptive_s, dtype=float), np.asarray(fixed_s, dtype=float)),
        p99_difference,
        vectorized=True,
        paired=False,
        confidence_level=confidence,
        n_resamples=n_resamples,
        method="percentile",
        rng=np.random.default_rng(seed),
    )
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def _s(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.3f}"


def _pct(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}%}"


def results_table(results: Sequence[ModeResult], budget: float) -> Any:
    """A rich Table: one row per way and part (before the change, after it, whole run).

    Columns: calls; TTFT P50/P90/P99/P99.9 (s); hedge rate (the budget in the header); backup win
    rate; prompt and completion tokens of the losing attempts and their share of all tokens;
    errors; ``hedge_after_s``: the fixed way's threshold, or the value the api had published for
    the adaptive way by the end of the part.
    """
    from rich import box
    from rich.table import Table

    table = Table(
        title="hedgerow demo: TTFT (s) by way, before and after the change (warm-up left out)",
        box=box.SIMPLE_HEAD,  # no vertical rules: the 14 columns fit the 120-column console
        pad_edge=False,
        padding=(0, 1, 0, 0),
    )
    for column in (
        "way",
        "part",
        "calls",
        "P50",
        "P90",
        "P99",
        "P99.9",
        f"hedged\n(bgt {budget:.0%})",
        "backup\nwins",
        "loser\nprompt",
        "loser\ncompl",
        "loser\nshare",
        "errors",
        "hedge_\nafter_s",
    ):
        if column in ("way", "part"):
            table.add_column(column, no_wrap=True)
        else:
            table.add_column(column, justify="right")
    for r in results:
        for name in ("before", "after", "whole"):
            p = r.part(name)
            if p is None:
                continue
            table.add_row(
                r.mode if name == "before" else "",
                name,
                str(p.calls),
                _s(p.ttft_p50_s),
                _s(p.ttft_p90_s),
                _s(p.ttft_p99_s),
                _s(p.ttft_p999_s),
                _pct(p.hedge_rate),
                _pct(p.backup_win_rate, 0),
                str(p.extra_prompt_tokens),
                str(p.extra_completion_tokens),
                _pct(p.extra_token_share),
                str(p.errors),
                _s(p.published_hedge_after_s),
                end_section=name == "whole",
            )
    return table


def _ratio(a: float, b: float) -> str:
    """``a`` relative to ``b`` as a signed percentage, e.g. ``-38%``."""
    return f"{(a - b) / b:+.0%}" if b > 0 else "n/a"


#: Without the TTFT samples, P99s within this share of the best one are called a tie (with ~130
#: calls after the change a P99 rests on the two slowest calls: a few percent is noise).
TIE_MARGIN = 0.05


def best_way_sentence(
    results: Sequence[ModeResult],
    after_ttfts_s: Mapping[str, Sequence[float]] | None = None,
    tie_margin: float = TIE_MARGIN,
) -> str:
    """Which way had the lowest TTFT P99 after the change, and, when it was ``none``, why hedging lost.

    Another way *ties* with the best when the 95% bootstrap interval of ``P99(best) - P99(other)``
    (:func:`p99_difference_interval`, from ``after_ttfts_s``) reaches 0; without samples (or with
    fewer than 20 of either) when its P99 is within ``tie_margin`` of the best one's.

    When ``none`` did best alone the sentence says so plainly with a one-line why: a backup starts
    from scratch, so its first token comes at best ``hedge_after_s`` plus a fresh call's TTFT
    (the fixed way's threshold plus the none way's P50 after the change); when that is later than
    the none way's P99, the slow replica was not slow enough to pay for the backup's prefill.
    Otherwise the hedges' extra prefill load on the replicas cost more than the backups saved.

    Args:
        results: the ways' results (any subset of ``none``, ``fixed``, ``adaptive``).
        after_ttfts_s: each way's TTFTs after the change, seconds (optional).
        tie_margin: the relative margin used without samples, a fraction.

    Returns:
        One sentence; ``""`` when fewer than two ways have a P99 after the change.
    """
    p99 = {
        r.mode: r.after_change.ttft_p99_s
        for r in results
        if r.after_change is not None and r.after_change.ttft_p99_s is not None
    }
    if len(p99) < 2:
        return ""
    best = min(p99, key=lambda mode: p99[mode])
    figures = ", ".join(f"{mode} {p99[mode]:.3f} s" for mode in p99)

    def tied(other: str) -> bool:
        samples = after_ttfts_s or {}
        interval = None
        if best in samples and other in samples:
            interval = p99_difference_interval(samples[best], samples[other])
        if interval is not None:
            return interval[1] >= 0
        return p99[other] <= p99[best] * (1 + tie_margin)

    ties = [mode for mode in p99 if mode != best and tied(mode)]
    if ties:
        group = " and ".join([best, *ties])
        tail = " (hedging did not clearly help)" if "none" in [best, *ties] else ""
        return f"No way was clearly best on TTFT P99 after the change ({figures}): {group} are within noise{tail}."
    if best != "none":
        return f"Best on TTFT P99 after the change: {best} ({figures})."
    by_mode = {r.mode: r for r in results}
    none_after = by_mode["none"].after_change
    fixed = by_mode.get("fixed")
    threshold = fixed.hedge_after_s if fixed is not None else None
    fresh = none_after.ttft_p50_s if none_after is not None else None
    if threshold is not None and fresh is not None and threshold + fresh > p99["none"]:
        why = (
            f"a backup starts from scratch, so its first token comes at best {threshold + fresh:.3f} s "
            f"(hedge_after_s {threshold:.3f} s + a fresh call's TTFT {fresh:.3f} s), later than the "
            f"unhedged P99: the slow replica was not slow enough to pay for the backup's prefill"
        )
    else:
        why = "the backups' prefill added load to the replicas and slowed the primaries more than the backups saved"
    return f"Not hedging did best on TTFT P99 after the change ({figures}): {why}."


def conclusion_sentences(
    results: Sequence[ModeResult],
    change: ChangeOfConditions,
    budget: float,
    fixed_source: str,
    p99_difference_s: tuple[float, float] | None = None,
    after_ttfts_s: Mapping[str, Sequence[float]] | None = None,
) -> list[str]:
    """Three plain sentences: what hedging is, what each way did, what the numbers support.

    The third is computed from the figures: the adaptive way *wins* when its TTFT P99 after the
    change is lower than the fixed way's and its whole-run hedge rate is within the budget (the
    budget is a long-run share: the client's token bucket lets its burst of hedges through, so
    one part alone may exceed it); otherwise the sentence says that it did not win, and by how
    much. With ``p99_difference_s`` (the bootstrap interval of adaptive's P99 minus fixed's after
    the change, :func:`p99_difference_interval`) a win whose interval reaches 0 or above is
    reported as lower *but not clearly*, and the interval is quoted either way. The third sentence
    starts with :func:`best_way_sentence`: the best of the three ways on P99, saying plainly when
    not hedging did best.

    Args:
        results: the ways' results (``none``, ``fixed``, ``adaptive``; any subset).
        change: the change of conditions.
        budget: the hedge budget, a fraction.
        fixed_source: how the fixed way's threshold was set (``p90_of_none`` or
            ``--fixed-hedge-after``).
        p99_difference_s: (low, high) seconds, the interval of adaptive's minus fixed's P99
            after the change, or None (the verdict then rests on the point figures alone).
        after_ttfts_s: each way's TTFTs after the change, seconds, for the best way's ties.

    Returns:
        The three sentences, in order.
    """
    by_mode = {r.mode: r for r in results}
    first = (
        "Hedging: when a call's first token is later than hedge_after_s, the client sends one backup "
        "request to another replica, keeps whichever answers first and cancels the other; a token "
        f"bucket caps backups at the budget, {budget:.0%} of calls over the run (its burst may add a few)."
    )
    did = []
    for r in results:
        after = r.after_change
        p99 = f"P99 {_s(r.before_change.ttft_p99_s if r.before_change else None)} s before the change, "
        p99 += f"{_s(after.ttft_p99_s if after else None)} s after"
        if r.mode == "none":
            did.append(f"none never hedged ({p99})")
        elif r.mode == "fixed":
            how = (
                "the none way's P90 before the change"
                if fixed_source == "p90_of_none"
                else "set by --fixed-hedge-after"
            )
            did.append(f"fixed hedged {r.hedge_rate:.1%} of calls at {_s(r.hedge_after_s)} s, {how} ({p99})")
        else:
            at_change = r.before_change.published_hedge_after_s if r.before_change else None
            did.append(
                f"adaptive hedged {r.hedge_rate:.1%} at the thresholds the controller published "
                f"({_s(at_change)} s at the change, {_s(r.published_hedge_after_s)} s at the end; {p99})"
            )
    second = f"Halfway through each way {change.describe()}; " + "; ".join(did) + "."
    best = best_way_sentence(results, after_ttfts_s)
    verdict = _verdict(by_mode, budget, p99_difference_s)
    return [first, second, f"{best} {verdict}" if best else verdict]


def _verdict(by_mode: dict[str, ModeResult], budget: float, interval: tuple[float, float] | None) -> str:
    adaptive, fixed = by_mode.get("adaptive"), by_mode.get("fixed")
    a = adaptive.after_change if adaptive else None
    f = fixed.after_change if fixed else None
    if adaptive is None or a is None or f is None or a.ttft_p99_s is None or f.ttft_p99_s is None:
        return "No conclusion: the run has no adaptive and fixed calls after the change to compare."
    figures = (
        f"after the change its TTFT P99 was {a.ttft_p99_s:.3f} s against {f.ttft_p99_s:.3f} s for the fixed way "
        f"({_ratio(a.ttft_p99_s, f.ttft_p99_s)}), hedging {adaptive.hedge_rate:.1%} of all its calls "
        f"({a.hedge_rate:.1%} after the change) against a {budget:.0%} budget"
    )
    noise = ""
    if interval is not None:
        noise = f"; the 95% bootstrap interval of the P99 difference is {interval[0]:+.3f} to {interval[1]:+.3f} s"
    if a.ttft_p99_s < f.ttft_p99_s and adaptive.hedge_rate <= budget:
        if interval is not None and interval[1] >= 0:
            return f"Adaptive was lower but not clearly: {figures}{noise}, which includes no difference."
        return f"Measured beat guessed in this run: {figures}{noise}."
    if a.ttft_p99_s < f.ttft_p99_s:
        return f"Adaptive did not win fairly: {figures}, over the budget{noise}."
    return f"Adaptive did not win in this run: {figures}{noise}."
