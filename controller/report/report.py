"""The weekly cost/latency report: every figure, computed from hourly rollups (pure; no I/O).

Inputs are the hourly :class:`~hedgerow.controller.store.rollups.Rollup` of each (route, model) in the
ISO week (folded rows, and raw calls of hours not yet folded, gathered by
:mod:`hedgerow.controller.report.report_store`), the same for the previous week, each route's threshold
decisions, its configuration, and the :class:`~hedgerow.controller.store.prices.PriceBook`. The output
is the JSON report (:func:`build_weekly_report`), whose schema is :data:`REPORT_SCHEMA`
(documented below); every other format is rendered from it (:mod:`hedgerow.controller.report.report_render`).

Figures and where they come from
--------------------------------
* ``calls``, ``calls_by_status``, ``hedges``, ``hedge_denied``, ``backup_wins``, ``failovers``:
  rollup counters (exact). ``hedge_rate = hedges / calls`` against the route's ``budget``;
  ``backup_win_rate = backup_wins / hedges``.
* ``ttft_s``: the delivered (with hedging) TTFT quantiles P50/P90/P99/P99.9 of the call-level
  histogram, within :data:`~hedgerow.controller.policy.ttft_histogram.MAX_RELATIVE_ERROR` (2.33 %).
* ``primary_ttft_s``: the primary's TTFT at the same levels, Kaplan-Meier over the censored
  primary histogram (:func:`~hedgerow.controller.policy.ttft_histogram.km_quantile`): what the same calls'
  primary upstreams took. It does not show what hedging did to the upstreams' load (cancelled
  primaries free capacity, backups add work), so ``p99_saved_s`` is the gain of the backups over
  the primaries of the same calls, not the gain over a week without hedging. Each is
  ``{"value_s", "low_s", "high_s"}``: the exact KM quantile lies in ``[low_s, high_s)``;
  ``value_s`` is null where censoring hides it (``low_s`` is then a lower bound).
  ``p99_saved_s = primary P99 - delivered P99`` (null unless both are known).
* ``tpot_s`` P50/P90 and ``e2e_s`` P50/P99: the TPOT and e2e histograms (same error).
* ``tokens``: prompt and completion tokens over every attempt, per role (primary, backup), those
  of the extra attempts (every attempt that did not win, in a call with more than one: losers
  of hedges and failed primaries of failovers), cached and estimated prompt tokens.
* ``cost``: ``spend_usd`` over every attempt and ``overhead_usd`` over the extra attempts, each
  hour at the price in force at its start for its (model, upstream); ``overhead_share =
  overhead / spend``. ``price_status`` is ``priced``, ``partial`` (some tokens had no price: the
  sums cover the priced ones), ``no price`` (``spend_usd`` and ``overhead_usd`` null) or ``no
  calls`` (nothing to price: ``spend_usd``, ``overhead_usd`` and ``overhead_share`` null, not 0).
* ``threshold``: the published ``hedge_after_s`` at the week's start and end, its range, the
  number of applied changes, the decisions (controller ticks, a repeated hold counted once per
  tick) and ``steps`` ``[[iso time, value], ...]`` (a step chart); ``flags``: how many history
  rows overlapping the week raised each flag (``backups_rarely_win``,
  ``hedges_did_not_lower_p99``; a flag held over many ticks is one row); ``enabled`` and
  ``pinned_hedge_after_s`` as configured now.
* ``daily``: per UTC day, calls, hedge rate, delivered and primary P50/P99.
* ``change``: each headline figure (:data:`HEADLINE_FIGURES`) of the previous week and the
  difference (this week minus previous; null where either is unknown).
* ``moved_most``: up to :data:`MOVED_MOST` routes with the largest change of delivered P99 and of
  overhead USD against the previous week.
* ``partial``: the week has not ended at ``generated_at`` (figures up to then).
* ``no_calls``: no call was recorded in the week (every figure is then a count of 0 or null:
  rates, quantiles and spend are not measured, and no format presents them as 0).

JSON schema ``hedgerow.weekly_report/1``: ``{"schema", "week", "since", "until", "generated_at",
"partial", "no_calls", "quantile_relative_error", "levels", "routes": [section...], "total": section,
"moved_most": {"p99": [...], "overhead": [...]}, "previous_week"}``, where a section is
``{"route", "model", "calls", "calls_by_status", "hedges", "hedge_denied", "hedge_rate",
"budget", "backup_wins", "backup_win_rate", "failovers", "ttft_s", "primary_ttft_s",
"p99_saved_s", "tpot_s", "e2e_s", "tokens", "cost", "threshold", "flags", "enabled",
"pinned_hedge_after_s", "daily", "change"}`` (``route``/``model`` are null in the total, and
``threshold`` and ``daily`` carry only what sums across routes there).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any

from hedgerow.client.records import format_timestamp
from hedgerow.controller.policy.ttft_histogram import MAX_RELATIVE_ERROR, km_quantile
from hedgerow.controller.store.prices import PriceBook
from hedgerow.controller.store.rollups import CALL_STATUSES, Rollup

__all__ = [
    "FLAG_CODES",
    "HEADLINE_FIGURES",
    "MOVED_MOST",
    "REPORT_SCHEMA",
    "HourRollup",
    "IsoWeek",
    "RouteState",
    "ThresholdEvent",
    "WeekData",
    "build_weekly_report",
    "cost_of_hours",
    "section_figures",
]

#: Identifier and version of the JSON report's schema.
REPORT_SCHEMA = "hedgerow.weekly_report/1"
#: Flags of the controller counted by the report (reason codes of history rows).
FLAG_CODES = ("backups_rarely_win", "hedges_did_not_lower_p99")
#: Figures compared with the previous week: key in ``change`` -> how to read it from a section.
HEADLINE_FIGURES = (
    "calls",
    "ttft_p99_s",
    "primary_ttft_p99_s",
    "p99_saved_s",
    "hedge_rate",
    "backup_win_rate",
    "spend_usd",
    "overhead_usd",
    "overhead_share",
)
#: How many routes ``moved_most`` lists per figure.
MOVED_MOST = 5
#: Quantile levels of the delivered and primary TTFT.
TTFT_LEVELS = (0.5, 0.9, 0.99, 0.999)

_WEEK = re.compile(r"^(\d{4})-W(\d{2})$")


@dataclass(frozen=True, slots=True, order=True)
class IsoWeek:
    """An ISO 8601 week (Monday to Sunday, UTC).

    Attributes:
        year, week: the ISO year and week number (1..52 or 53).
    """

    year: int
    week: int

    @classmethod
    def parse(cls, text: str) -> IsoWeek:
        """Parse ``2026-W48`` (``2026-w48`` too: the ``W`` in either case).

        Raises:
            ValueError: not ``YYYY-Www``, a week that year does not have, or a week whose report
                cannot be dated (the first week of year 1 has no previous week to compare with,
                the last of year 9999 no end): those raised OverflowError deep in the report.
        """
        match = _WEEK.match(text.strip().upper()) if isinstance(text, str) else None
        if match is None:
            raise ValueError(f"week {text!r} is not an ISO week such as 2026-W48")
        year, week = int(match.group(1)), int(match.group(2))
        try:
            date.fromisocalendar(year, week, 1)
        except ValueError:
            raise ValueError(f"week {text!r} does not exist (ISO year {year} has no week {week})") from None
        parsed = cls(year, week)
        try:
            parsed.previous()
            _ = parsed.until
        except (OverflowError, ValueError):
            raise ValueError(f"week {text!r} is out of range (weeks from 0001-W02 to 9999-W51)") from None
        return parsed

    @classmethod
    def of(cls, moment: datetime) -> IsoWeek:
        """The ISO week holding an aware moment (in UTC).

        Raises:
            ValueError: ``moment`` is naive.
        """
        if moment.tzinfo is None:
            raise ValueError("timestamps must be timezone-aware (UTC); got a naive datetime")
        year, week, _ = moment.astimezone(UTC).isocalendar()
        return cls(year, week)

    @property
    def since(self) -> datetime:
        """Monday 00:00 UTC, the week's first instant."""
        day = date.fromisocalendar(self.year, self.week, 1)
        return datetime(day.year, day.month, day.day, tzinfo=UTC)

    @property
    def until(self) -> datetime:
        """The next Monday 00:00 UTC (the week is ``[since, until)``)."""
        return self.since + timedelta(days=7)

    def previous(self) -> IsoWeek:
        """The week before."""
        return IsoWeek.of(self.since - timedelta(days=1))

    def __str__(self) -> str:
        return f"{self.year:04d}-W{self.week:02d}"


@dataclass(frozen=True, slots=True)
class HourRollup:
    """The rollup of one (route, model) and UTC hour (folded, or read from raw calls)."""

    route: str
    model: str
    hour_start: datetime
    rollup: Rollup


@dataclass(frozen=True, slots=True)
class RouteState:
    """A route's configuration as the report shows it.

    Attributes:
        enabled: hedging enabled; budget: the hedge budget (fraction);
        pinned_hedge_after_s: the pinned threshold, seconds, or None.
    """

    enabled: bool
    budget: float
    pinned_hedge_after_s: float | None


@dataclass(frozen=True, slots=True)
class ThresholdEvent:
    """One threshold decision (a history row).

    Attributes:
        at: when it was made; hedge_after_s: its value, seconds; applied: whether it was
        published; reason: its comma-separated reason codes; budget: the budget it used;
        previous_hedge_after_s: the value published before it (None for a route's first);
        repeats: how many controller ticks the row stands for (a repeated hold is one row).
    """

    at: datetime
    hedge_after_s: float
    applied: bool
    reason: str
    budget: float | None = None
    previous_hedge_after_s: float | None = None
    repeats: int = 1


@dataclass(frozen=True, slots=True)
class WeekData:
    """Everything the report of one week reads (see the module docstring).

    Attributes:
        week: the week; generated_at: the report's time (aware UTC).
        hours / previous_hours: the hourly rollups of the week and of the week before.
        routes: each (route, model)'s configuration.
        events: each (route, model)'s decisions during the week, oldest first.
        start_values: each (route, model)'s published threshold at the week's start (the value
            of its last applied decision before it; missing: the first decision's previous value).
        prices: the price book.
    """

    week: IsoWeek
    generated_at: datetime
    hours: Sequence[HourRollup]
    previous_hours: Sequence[HourRollup] = ()
    routes: Mapping[tuple[str, str], RouteState] = field(default_factory=dict)
    events: Mapping[tuple[str, str], Sequence[ThresholdEvent]] = field(default_factory=dict)
    start_values: Mapping[tuple[str, str], float | None] = field(default_factory=dict)
    prices: PriceBook = field(default_factory=lambda: PriceBook(()))


def _rate(part: int, whole: int) -> float | None:
    return None if whole == 0 else part / whole


def _level(q: float) -> str:
    return "p" + f"{q * 100:g}".replace(".", "")


def _uncensored(histogram: Mapping[int, int], q: float) -> float | None:
    found = km_quantile(histogram, None, q)
    return None if found is None else found.value_s


def _primary(rollup: Rollup, q: float) -> dict[str, float | None] | None:
    found = rollup.primary_ttft_quantile(q)
    if found is None:
        return None
    return {"value_s": found.value_s, "low_s": found.low_s, "high_s": found.high_s}


def cost_of_hours(hours: Iterable[HourRollup], prices: PriceBook) -> dict[str, Any]:
    """Spend and hedging overhead of some hours, each hour at the prices in force at its start.

    Args:
        hours: hourly rollups (any routes); each upstream's tokens of an hour are priced with
            ``prices.lookup(model, upstream, hour_start)``.
        prices: the price book.

    Returns:
        ``{"spend_usd", "overhead_usd", "overhead_share", "price_status", "priced_tokens",
        "unpriced_tokens"}``; the sums cover the priced tokens; ``spend_usd``/``overhead_usd``
        are None when nothing was priced but there were tokens ("no price"), and when the hours
        hold no call ("no calls": a spend of $0 would read as a measured, priced week).
    """
    spend = overhead = 0.0
    priced = unpriced = calls = 0
    for hour in hours:
        calls += hour.rollup.calls
        tally = hour.rollup.upstream_tokens
        counted = 0
        for upstream, counts in tally.items():
            tokens = counts.get("prompt", 0) + counts.get("completion", 0)
            counted += tokens
            price = prices.lookup(hour.model, upstream, hour.hour_start)
            if price is None:
                unpriced += tokens
                continue
            priced += tokens
            spend += price.cost_usd(prompt=counts.get("prompt", 0), cached=counts.get("cached", 0),
                                    completion=counts.get("completion", 0))  # fmt: skip
            overhead += price.cost_usd(prompt=counts.get("extra_prompt", 0), cached=counts.get("extra_cached", 0),
                                       completion=counts.get("extra_completion", 0))  # fmt: skip
        # rollups folded before per-upstream tallies existed: their tokens cannot be priced
        r = hour.rollup
        unpriced += max(0, r.primary_prompt_tokens + r.primary_completion_tokens + r.backup_prompt_tokens
                        + r.backup_completion_tokens - counted)  # fmt: skip
    spend_usd: float | None
    overhead_usd: float | None
    if calls == 0:
        status, spend_usd, overhead_usd = "no calls", None, None
    elif priced == 0 and unpriced > 0:
        status, spend_usd, overhead_usd = "no price", None, None
    else:
        status = "partial" if unpriced else "priced"
        spend_usd, overhead_usd = spend, overhead
    share = None if not spend_usd or overhead_usd is None else overhead_usd / spend_usd
    return {
        "spend_usd": spend_usd,
        "overhead_usd": overhead_usd,
        "overhead_share": share,
        "price_status": status,
        "priced_tokens": priced,
        "unpriced_tokens": unpriced,
    }


def _tokens(r: Rollup) -> dict[str, int]:
    return {
        "prompt": r.primary_prompt_tokens + r.backup_prompt_tokens,
        "completion": r.primary_completion_tokens + r.backup_completion_tokens,
        "primary_prompt": r.primary_prompt_tokens,
        "primary_completion": r.primary_completion_tokens,
        "backup_prompt": r.backup_prompt_tokens,
        "backup_completion": r.backup_completion_tokens,
        "extra_prompt": r.extra_prompt_tokens,
        "extra_completion": r.extra_completion_tokens,
        "cached_prompt": r.cached_prompt_tokens,
        "estimated_prompt": r.estimated_prompt_tokens,
        "delivered_prompt": r.prompt_tokens,
        "delivered_completion": r.completion_tokens,
    }


def section_figures(hours: Sequence[HourRollup], prices: PriceBook) -> dict[str, Any]:
    """The figures of a set of hours that do not depend on a route's history: those of a section
    (see the module docstring) but ``budget``, ``threshold``, ``flags``, ``enabled``,
    ``pinned_hedge_after_s``, ``daily`` and ``change``.

    Args:
        hours: hourly rollups (any routes and models: the report's total, or one client's calls).
        prices: the price book (each hour priced at its start, :func:`cost_of_hours`).
    """
    r = Rollup().merged(*(h.rollup for h in hours))
    ttft = {_level(q): _uncensored(r.call_ttft, q) for q in TTFT_LEVELS}
    primary = {_level(q): _primary(r, q) for q in TTFT_LEVELS}
    p99 = ttft["p99"]
    primary_p99 = primary["p99"]
    saved = None
    if p99 is not None and primary_p99 is not None and primary_p99["value_s"] is not None:
        saved = primary_p99["value_s"] - p99
    return {
        "calls": r.calls,
        "calls_by_status": {status: getattr(r, f"{status}_calls") for status in CALL_STATUSES},
        "hedges": r.hedges,
        "hedge_denied": r.hedge_denied,
        "hedge_rate": r.hedge_rate,
        "backup_wins": r.backup_wins,
        "backup_win_rate": r.backup_win_rate,
        "failovers": r.failovers,
        "ttft_s": ttft,
        "primary_ttft_s": primary,
        "primary_samples": r.primary_samples,
        "primary_censored": r.primary_censored_count,
        "p99_saved_s": saved,
        "tpot_s": {name: _uncensored(r.tpot, q) for name, q in (("p50", 0.5), ("p90", 0.9))},
        "e2e_s": {name: _uncensored(r.e2e, q) for name, q in (("p50", 0.5), ("p99", 0.99))},
        "tokens": _tokens(r),
        "cost": cost_of_hours(hours, prices),
    }


def _headline(section: Mapping[str, Any]) -> dict[str, float | None]:
    primary_p99 = section["primary_ttft_s"]["p99"]
    return {
        "calls": section["calls"],
        "ttft_p99_s": section["ttft_s"]["p99"],
        "primary_ttft_p99_s": None if primary_p99 is None else primary_p99["value_s"],
        "p99_saved_s": section["p99_saved_s"],
        "hedge_rate": section["hedge_rate"],
        "backup_win_rate": section["backup_win_rate"],
        "spend_usd": section["cost"]["spend_usd"],
        "overhead_usd": section["cost"]["overhead_usd"],
        "overhead_share": section["cost"]["overhead_share"],
    }


def _change(current: Mapping[str, Any], previous: Mapping[str, Any] | None) -> dict[str, dict[str, float | None]]:
    now = _headline(current)
    before = _headline(previous) if previous is not None else dict.fromkeys(HEADLINE_FIGURES)
    out = {}
    for name in HEADLINE_FIGURES:
        a, b = now[name], before[name]
        out[name] = {"previous": b, "delta": None if a is None or b is None else a - b}
    return out


def _daily(hours: Sequence[HourRollup], week: IsoWeek) -> list[dict[str, Any]]:
    days: dict[date, list[Rollup]] = {}
    for hour in hours:
        days.setdefault(hour.hour_start.date(), []).append(hour.rollup)
    out = []
    for offset in range(7):
        day = (week.since + timedelta(days=offset)).date()
        r = Rollup().merged(*days.get(day, []))
        p50, p99 = _primary(r, 0.5), _primary(r, 0.99)
        out.append(
            {
                "date": day.isoformat(),
                "calls": r.calls,
                "hedge_rate": r.hedge_rate,
                "ttft_p50_s": _uncensored(r.call_ttft, 0.5),
                "ttft_p99_s": _uncensored(r.call_ttft, 0.99),
                "primary_ttft_p50_s": None if p50 is None else p50["value_s"],
                "primary_ttft_p99_s": None if p99 is None else p99["value_s"],
            }
        )
    return out


def _threshold(
    events: Sequence[ThresholdEvent], start: float | None, week: IsoWeek, end_at: datetime
) -> tuple[dict[str, Any], dict[str, int]]:
    applied = [e for e in events if e.applied]
    if start is None and events:
        start = events[0].previous_hedge_after_s  # no applied decision before the week
    end = applied[-1].hedge_after_s if applied else start
    values = [v for v in (start, *(e.hedge_after_s for e in applied)) if v is not None]
    steps: list[list[Any]] = []
    if start is not None:
        steps.append([format_timestamp(week.since), start])
    steps.extend([format_timestamp(e.at), e.hedge_after_s] for e in applied)
    if end is not None:
        steps.append([format_timestamp(end_at), end])
    flags = dict.fromkeys(FLAG_CODES, 0)
    for event in events:
        for code in event.reason.split(","):
            if code in flags:
                flags[code] += 1
    threshold = {
        "start_s": start,
        "end_s": end,
        "min_s": min(values) if values else None,
        "max_s": max(values) if values else None,
        "applied_changes": len(applied),
        "decisions": sum(e.repeats for e in events),
        "steps": steps,
    }
    return threshold, flags


def _moved(current: Sequence[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    moved = [
        {"route": s["route"], "model": s["model"], "previous": s["change"][key]["previous"],
         "current": _headline(s)[key], "delta": s["change"][key]["delta"]}
        for s in current
        if s["change"][key]["delta"] is not None
    ]  # fmt: skip
    moved.sort(key=lambda m: (-abs(m["delta"]), m["route"], m["model"]))
    return moved[:MOVED_MOST]


def build_weekly_report(data: WeekData) -> dict[str, Any]:
    """The weekly report as a JSON-ready dict of schema :data:`REPORT_SCHEMA` (see the module docstring).

    Args:
        data: the week's rollups, decisions, configurations and prices (:class:`WeekData`).

    Returns:
        The report; routes ordered by (route, model). A route appears when it had calls in the
        week (a route with decisions but no calls appears too, with zero calls).
    """
    week = data.week
    end_at = min(data.generated_at, week.until)
    grouped: dict[tuple[str, str], list[HourRollup]] = {}
    for hour in data.hours:
        grouped.setdefault((hour.route, hour.model), []).append(hour)
    previous: dict[tuple[str, str], list[HourRollup]] = {}
    for hour in data.previous_hours:
        previous.setdefault((hour.route, hour.model), []).append(hour)
    keys = sorted(set(grouped) | {k for k, events in data.events.items() if events})
    sections = []
    for key in keys:
        hours = sorted(grouped.get(key, []), key=lambda h: h.hour_start)
        section: dict[str, Any] = {"route": key[0], "model": key[1], **section_figures(hours, data.prices)}
        state = data.routes.get(key)
        events = data.events.get(key, ())
        budgets = [e.budget for e in events if e.budget is not None]
        section["budget"] = budgets[-1] if budgets else (None if state is None else state.budget)
        section["threshold"], section["flags"] = _threshold(events, data.start_values.get(key), week, end_at)
        section["enabled"] = None if state is None else state.enabled
        section["pinned_hedge_after_s"] = None if state is None else state.pinned_hedge_after_s
        section["daily"] = _daily(hours, week)
        before = previous.get(key)
        section["change"] = _change(section, section_figures(before, data.prices) if before else None)
        sections.append(section)
    total: dict[str, Any] = {"route": None, "model": None, **section_figures(list(data.hours), data.prices)}
    hedged_calls = [s for s in sections if s["budget"] is not None]
    weight = sum(s["calls"] for s in hedged_calls)
    total["budget"] = sum(s["budget"] * s["calls"] for s in hedged_calls) / weight if weight else None
    total["threshold"] = {"applied_changes": sum(s["threshold"]["applied_changes"] for s in sections)}
    total["flags"] = {code: sum(s["flags"][code] for s in sections) for code in FLAG_CODES}
    total["enabled"] = None
    total["pinned_hedge_after_s"] = None
    total["daily"] = _daily(list(data.hours), week)
    total["change"] = _change(
        total, section_figures(list(data.previous_hours), data.prices) if data.previous_hours else None
    )
    return {
        "schema": REPORT_SCHEMA,
        "week": str(week),
        "since": format_timestamp(week.since),
        "until": format_timestamp(week.until),
        "generated_at": format_timestamp(data.generated_at),
        "partial": data.generated_at < week.until,
        "no_calls": total["calls"] == 0,
        "quantile_relative_error": MAX_RELATIVE_ERROR,
        "levels": [_level(q) for q in TTFT_LEVELS],
        "previous_week": str(week.previous()),
        "routes": sections,
        "total": total,
        "moved_most": {"p99": _moved(sections, "ttft_p99_s"), "overhead": _moved(sections, "overhead_usd")},
    }
