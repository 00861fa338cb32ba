"""The rollup of calls, pure (no I/O): what one (route, model) hour holds and how raw rows fold into it.

:class:`Rollup` (the additive sums and histograms of one hour, or of any set of hours merged),
:class:`RouteRollup` and :class:`FoldedHour` (a rollup with its route, model and period),
:func:`fold_rows` (the fold rules over raw call and attempt rows) and the hour arithmetic. The
store side (which hours to fold, upserts, sealing, weekly merges) is
:mod:`hedgerow.controller.store.rollups`, the facade that re-exports these names; its module
docstring says what a rollup holds.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from hedgerow.client.records import estimate_prompt_tokens
from hedgerow.controller.policy.ttft_histogram import (
    BucketQuantile,
    histogram_of,
    km_quantile,
    merge_counts,
)

__all__ = [
    "ATTEMPT_TOKEN_FIELDS",
    "CALL_STATUSES",
    "COUNTER_FIELDS",
    "HISTOGRAM_COLUMNS",
    "HOUR_S",
    "UPSTREAM_TOKEN_KEYS",
    "FoldedHour",
    "Rollup",
    "RouteRollup",
    "floor_hour",
    "fold_rows",
    "hour_of_index",
    "merge_upstream_tokens",
]

#: Length of a rollup period, seconds.
HOUR_S = 3600
#: Call statuses of the wire format, each with its own counter (``<status>_calls``).
CALL_STATUSES = ("ok", "error", "timeout", "stalled", "cancelled")
#: The integer counters of a rollup (all additive).
COUNTER_FIELDS = (
    "calls", "ok_calls", "error_calls", "timeout_calls", "stalled_calls", "cancelled_calls",
    "hedges", "hedge_denied", "backup_wins", "failovers",
    "prompt_tokens", "completion_tokens", "wasted_completion_tokens",
)  # fmt: skip
#: Token sums over attempts (all additive; revision 0004).
ATTEMPT_TOKEN_FIELDS = (
    "primary_prompt_tokens", "primary_completion_tokens", "backup_prompt_tokens", "backup_completion_tokens",
    "extra_prompt_tokens", "extra_completion_tokens", "cached_prompt_tokens", "estimated_prompt_tokens",
)  # fmt: skip
#: Keys of one upstream's entry in ``upstream_tokens``.
UPSTREAM_TOKEN_KEYS = ("prompt", "cached", "completion", "extra_prompt", "extra_cached", "extra_completion")
#: The histograms of a rollup: ``Rollup`` attribute -> ``hourly_rollups`` column.
HISTOGRAM_COLUMNS = {
    "primary_ttft": "primary_ttft_hist",
    "primary_censored": "primary_censored_hist",
    "call_ttft": "call_ttft_hist",
    "tpot": "tpot_hist",
    "e2e": "e2e_hist",
}


def _rate(part: int, whole: int) -> float | None:
    return None if whole == 0 else part / whole


def _level_name(q: float) -> str:
    """0.5 -> "p50", 0.99 -> "p99", 0.999 -> "p999"."""
    return "p" + f"{q * 100:g}".replace(".", "")


@dataclass(frozen=True, slots=True)
class Rollup:
    """Additive figures of a set of calls (one hour, a week, one route or many).

    Attributes:
        calls: calls; ``ok_calls`` .. ``cancelled_calls`` split them by ``status`` (an unknown
            status counts as ``error``).
        hedges: calls hedged because the primary had no first token by ``hedge_after_s``.
        hedge_denied: calls whose hedge the budget refused.
        backup_wins: hedged calls whose backup won.
        failovers: calls whose backup started because the primary failed.
        prompt_tokens, completion_tokens, wasted_completion_tokens: token sums.
        primary_ttft: sparse histogram ``{bucket: count}`` of observed primary TTFTs.
        primary_censored: the same of censored primaries (durations until cancelled).
        call_ttft: the same of the calls' TTFT with hedging.
        primary_prompt_tokens .. estimated_prompt_tokens: token sums over attempts
            (:data:`ATTEMPT_TOKEN_FIELDS`; see the module docstring).
        tpot, e2e: sparse histograms of the calls' TPOT and e2e.
        upstream_tokens: ``{upstream: {key: tokens}}`` with :data:`UPSTREAM_TOKEN_KEYS`.
    """

    calls: int = 0
    ok_calls: int = 0
    error_calls: int = 0
    timeout_calls: int = 0
    stalled_calls: int = 0
    cancelled_calls: int = 0
    hedges: int = 0
    hedge_denied: int = 0
    backup_wins: int = 0
    failovers: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    wasted_completion_tokens: int = 0
    primary_ttft: Mapping[int, int] = field(default_factory=dict)
    primary_censored: Mapping[int, int] = field(default_factory=dict)
    call_ttft: Mapping[int, int] = field(default_factory=dict)
    primary_prompt_tokens: int = 0
    primary_completion_tokens: int = 0
    backup_prompt_tokens: int = 0
    backup_completion_tokens: int = 0
    extra_prompt_tokens: int = 0
    extra_completion_tokens: int = 0
    cached_prompt_tokens: int = 0
    estimated_prompt_tokens: int = 0
    tpot: Mapping[int, int] = field(default_factory=dict)
    e2e: Mapping[int, int] = field(default_factory=dict)
    upstream_tokens: Mapping[str, Mapping[str, int]] = field(default_factory=dict)

    @property
    def primary_samples(self) -> int:
        """Primary TTFT samples, censored ones included."""
        return sum(self.primary_ttft.values()) + sum(self.primary_censored.values())

    @property
    def primary_censored_count(self) -> int:
        """Censored primary TTFT samples."""
        return sum(self.primary_censored.values())

    @property
    def hedge_rate(self) -> float | None:
        """hedges / calls (None without calls)."""
        return _rate(self.hedges, self.calls)

    @property
    def backup_win_rate(self) -> float | None:
        """backup_wins / hedges (None without hedges)."""
        return _rate(self.backup_wins, self.hedges)

    @property
    def failover_rate(self) -> float | None:
        """failovers / calls (None without calls)."""
        return _rate(self.failovers, self.calls)

    def merged(self, *others: Rollup) -> Rollup:
        """The sum of this rollup and ``others`` (counters added, histograms summed per bucket)."""
        values: dict[str, Any] = {
            name: getattr(self, name) + sum(getattr(o, name) for o in others)
            for name in (*COUNTER_FIELDS, *ATTEMPT_TOKEN_FIELDS)
        }
        for name in HISTOGRAM_COLUMNS:
            values[name] = merge_counts(getattr(self, name), *(getattr(o, name) for o in others))
        values["upstream_tokens"] = merge_upstream_tokens(self.upstream_tokens, *(o.upstream_tokens for o in others))
        return Rollup(**values)

    def call_ttft_quantile(self, q: float) -> BucketQuantile | None:
        """Quantile ``q`` in (0, 1) of the call-level TTFT (uncensored); None without samples.

        The value is within 2.33 % of the exact sample quantile (bucket midpoint).

        Raises:
            ValueError: ``q`` outside (0, 1).
        """
        return km_quantile(self.call_ttft, None, q)

    def primary_ttft_quantile(self, q: float) -> BucketQuantile | None:
        """Kaplan-Meier quantile ``q`` in (0, 1) of the primary's censored TTFT; None without samples.

        ``value_s`` is None when the data cannot identify it; ``[low_s, high_s)`` holds the
        exact KM quantile (see :func:`hedgerow.controller.policy.ttft_histogram.km_quantile`).

        Raises:
            ValueError: ``q`` outside (0, 1).
        """
        return km_quantile(self.primary_ttft, self.primary_censored, q)

    def figures(self, levels: Sequence[float] = (0.5, 0.9, 0.99)) -> dict[str, Any]:
        """A flat, JSON-ready dict of every counter, rate and TTFT quantile.

        Args:
            levels: quantile levels in (0, 1); each gives ``ttft_<pXX>_s`` (call-level),
                ``primary_ttft_<pXX>_s`` and ``primary_ttft_<pXX>_bounds_s`` (``[low, high]``,
                high None when unbounded) keys, e.g. ``ttft_p99_s``.

        Raises:
            ValueError: a level outside (0, 1).
        """
        out: dict[str, Any] = {name: getattr(self, name) for name in COUNTER_FIELDS}
        out.update(
            primary_samples=self.primary_samples,
            primary_censored=self.primary_censored_count,
            hedge_rate=self.hedge_rate,
            backup_win_rate=self.backup_win_rate,
            failover_rate=self.failover_rate,
        )
        for q in levels:
            name = _level_name(q)
            call_q = self.call_ttft_quantile(q)
            primary_q = self.primary_ttft_quantile(q)
            out[f"ttft_{name}_s"] = None if call_q is None else call_q.value_s
            out[f"primary_ttft_{name}_s"] = None if primary_q is None else primary_q.value_s
            out[f"primary_ttft_{name}_bounds_s"] = None if primary_q is None else [primary_q.low_s, primary_q.high_s]
        return out


@dataclass(frozen=True, slots=True)
class RouteRollup:
    """The merged rollups of one (route, model) over ``[since, until)``.

    Attributes:
        route, model: the pair.
        since, until: the period (aware UTC, whole hours).
        hours: how many hourly rollups were merged (hours without calls have none).
        rollup: their sum.
    """

    route: str
    model: str
    since: datetime
    until: datetime
    hours: int
    rollup: Rollup

    def to_dict(self, levels: Sequence[float] = (0.5, 0.9, 0.99)) -> dict[str, Any]:
        """JSON-ready: route, model, since/until (ISO 8601), hours and :meth:`Rollup.figures`."""
        return {
            "route": self.route,
            "model": self.model,
            "since": self.since.isoformat(),
            "until": self.until.isoformat(),
            "hours": self.hours,
            **self.rollup.figures(levels),
        }


@dataclass(frozen=True, slots=True)
class FoldedHour:
    """One hour written by :func:`fold_hours`.

    Attributes:
        route, model: the pair.
        hour_start: start of the hour (aware UTC).
        kind: ``new`` (first fold), ``refolded`` (recomputed: raw rows changed) or ``late``
            (calls added to a sealed rollup).
        calls: calls in the rollup after the fold.
    """

    route: str
    model: str
    hour_start: datetime
    kind: str
    calls: int

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (``hour_start`` as ISO 8601)."""
        return {"route": self.route, "model": self.model, "hour_start": self.hour_start.isoformat(),
                "kind": self.kind, "calls": self.calls}  # fmt: skip


def floor_hour(moment: datetime) -> datetime:
    """The start of the UTC hour holding ``moment``.

    Raises:
        ValueError: ``moment`` is naive.
    """
    if moment.tzinfo is None:
        raise ValueError("timestamps must be timezone-aware (UTC); got a naive datetime")
    return moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def hour_of_index(index: int) -> datetime:
    """The start (aware UTC) of the hour numbered ``index`` (hours since the epoch, :func:`hour_index_sql`)."""
    return datetime.fromtimestamp(int(index) * HOUR_S, tz=UTC)


def merge_upstream_tokens(*tallies: Mapping[str, Mapping[str, int]]) -> dict[str, dict[str, int]]:
    """Sum ``{upstream: {key: tokens}}`` tallies key by key (exact and associative)."""
    total: dict[str, dict[str, int]] = {}
    for tally in tallies:
        for upstream, counts in tally.items():
            entry = total.setdefault(upstream, dict.fromkeys(UPSTREAM_TOKEN_KEYS, 0))
            for key, value in counts.items():
                entry[key] = entry.get(key, 0) + int(value)
    return {name: total[name] for name in sorted(total)}


def fold_rows(call_rows: Iterable[Sequence[Any]], attempt_rows: Iterable[Sequence[Any]]) -> tuple[Rollup, int | None]:
    """Fold raw rows into a :class:`Rollup` (pure; no database).

    Args:
        call_rows: one per call: ``(id, status, hedge_reason, hedge_denied, winner, ttft_s,
            prompt_tokens, completion_tokens, wasted_completion_tokens, tpot_s, e2e_s)``;
            tokens and latencies may be None.
        attempt_rows: the calls' attempts ordered by (call id, attempt index): ``(call_id, role,
            upstream, start_s, first_token_s, end_s, outcome, status_code, completion_tokens,
            prompt_tokens, prompt_tokens_estimated, cached_prompt_tokens)``. The TTFT sample is a
            call's first ``primary`` attempt; prompt tokens left None (rows stored before
            revision 0004) follow :func:`hedgerow.client.records.estimate_prompt_tokens`.

    Returns:
        The rollup, and the largest call id (None without calls).
    """
    counts = dict.fromkeys((*COUNTER_FIELDS, *ATTEMPT_TOKEN_FIELDS), 0)
    call_ttfts: list[float] = []
    tpots: list[float] = []
    e2es: list[float] = []
    call_prompt: dict[int, int | None] = {}
    max_id: int | None = None
    for (call_id, status, hedge_reason, hedge_denied, winner, ttft_s, prompt, completion,
         wasted, tpot_s, e2e_s) in call_rows:  # fmt: skip
        max_id = call_id if max_id is None else max(max_id, call_id)
        call_prompt[call_id] = prompt
        counts["calls"] += 1
        key = f"{status}_calls" if status in CALL_STATUSES else "error_calls"
        counts[key] += 1
        if hedge_reason == "ttft_timeout":
            counts["hedges"] += 1
            if winner == "backup":
                counts["backup_wins"] += 1
        elif hedge_reason == "primary_error":
            counts["failovers"] += 1
        counts["hedge_denied"] += bool(hedge_denied)
        counts["prompt_tokens"] += prompt or 0
        counts["completion_tokens"] += completion or 0
        counts["wasted_completion_tokens"] += wasted or 0
        if ttft_s is not None:
            call_ttfts.append(max(0.0, ttft_s))
        if tpot_s is not None:
            tpots.append(max(0.0, tpot_s))
        if e2e_s is not None:
            e2es.append(max(0.0, e2e_s))
    by_call: dict[int, list[Sequence[Any]]] = {}
    for row in attempt_rows:
        by_call.setdefault(row[0], []).append(row)
    observed: list[float] = []
    censored: list[float] = []
    upstreams: dict[str, dict[str, int]] = {}
    for call_id, attempts in by_call.items():
        sampled = False
        for (_cid, role, upstream, start_s, first_token_s, end_s, outcome, status_code, completion,
             prompt, estimated, cached) in attempts:  # fmt: skip
            if role == "primary" and not sampled:
                sampled = True  # only the call's first primary attempt is a TTFT sample
                if first_token_s is not None:
                    observed.append(max(0.0, first_token_s - start_s))
                elif outcome == "cancelled":
                    censored.append(max(0.0, end_s - start_s))
            prompt_tokens, is_estimate = estimate_prompt_tokens(
                prompt, bool(estimated), status_code, call_prompt.get(call_id)
            )
            completion = completion or 0
            cached = min(cached or 0, prompt_tokens)
            side = "backup" if role == "backup" else "primary"
            counts[f"{side}_prompt_tokens"] += prompt_tokens
            counts[f"{side}_completion_tokens"] += completion
            counts["cached_prompt_tokens"] += cached
            counts["estimated_prompt_tokens"] += prompt_tokens if is_estimate else 0
            entry = upstreams.setdefault(upstream, dict.fromkeys(UPSTREAM_TOKEN_KEYS, 0))
            entry["prompt"] += prompt_tokens
            entry["cached"] += cached
            entry["completion"] += completion
            if len(attempts) > 1 and outcome != "won":
                counts["extra_prompt_tokens"] += prompt_tokens
                counts["extra_completion_tokens"] += completion
                entry["extra_prompt"] += prompt_tokens
                entry["extra_cached"] += cached
                entry["extra_completion"] += completion
    rollup = Rollup(
        **counts,
        primary_ttft=histogram_of(observed),
        primary_censored=histogram_of(censored),
        call_ttft=histogram_of(call_ttfts),
        tpot=histogram_of(tpots),
        e2e=histogram_of(e2es),
        upstream_tokens=merge_upstream_tokens(upstreams),
    )
    return rollup, max_id
