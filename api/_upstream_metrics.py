"""The per-upstream series of ``/metrics`` (counted at ingest, like the per-route counters).

=====================================================  =========  ==================================
name                                                   type       labels
=====================================================  =========  ==================================
hedgerow_upstream_attempts_total                       counter    route, upstream, outcome (won,
                                                                  cancelled, failed)
hedgerow_upstream_failures_total                       counter    route, upstream, kind (error,
                                                                  timeout, stall: the classes of
                                                                  ``controller.store.upstreams``)
hedgerow_upstream_races_total                          counter    route, upstream, result (won,
                                                                  lost: attempts of calls hedged
                                                                  because the primary was slow)
hedgerow_upstream_hedges_caused_total                  counter    route, upstream (hedges while it
                                                                  was the slow primary)
hedgerow_upstream_loser_tokens_total                   counter    route, upstream (output tokens of
                                                                  its attempts that lost, in calls
                                                                  with a backup)
hedgerow_upstream_ttft_seconds                         histogram  route, upstream (each attempt's
                                                                  own TTFT from its send)
=====================================================  =========  ==================================

The TTFT histogram holds observed first tokens only: an attempt cancelled before its first token
(a primary that lost a race) has no TTFT to observe, so an upstream that is often hedged looks
faster here than it is; ``GET /v1/upstreams`` and the console count those attempts as censored
(Kaplan-Meier) and are the figures to trust for its tail.

Cardinality: route (bounded by ``HEDGEROW_MAX_ROUTES``) times upstream times a few fixed label
values. Upstream names come from the records, so a process labels at most
:data:`MAX_UPSTREAM_LABELS` distinct ones (the first it sees); attempts of any other upstream
are counted under ``upstream="_other"``, and the model is not a label (the per-route series
have it).
"""

from __future__ import annotations

from collections import Counter as Tally
from collections import defaultdict
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram

from hedgerow.controller.policy.attempt_kinds import failure_kind
from hedgerow.controller.store.ingest import RecordFields

__all__ = ["MAX_UPSTREAM_LABELS", "OTHER_UPSTREAM", "UpstreamMetrics"]

#: Most distinct upstream label values one process exports.
MAX_UPSTREAM_LABELS = 50
#: The label of every upstream past :data:`MAX_UPSTREAM_LABELS`.
OTHER_UPSTREAM = "_other"


class UpstreamMetrics:
    """The per-upstream counters and TTFT histogram, in the app's registry.

    Args:
        registry: the app's ``CollectorRegistry``.
        buckets_s: the TTFT histogram's bucket bounds, seconds (the per-route histogram's).
    """

    def __init__(self, registry: CollectorRegistry, buckets_s: tuple[float, ...]) -> None:
        labels = ["route", "upstream"]
        self.attempts = Counter(
            "hedgerow_upstream_attempts", "Attempts sent to each upstream, by outcome.", [*labels, "outcome"],
            registry=registry,
        )  # fmt: skip
        self.failures = Counter(
            "hedgerow_upstream_failures",
            "Failed attempts of each upstream: error, timeout or stall (a gap after the first token).",
            [*labels, "kind"],
            registry=registry,
        )
        self.races = Counter(
            "hedgerow_upstream_races",
            "Attempts of each upstream in a race (a call hedged because its primary was slow), won or lost.",
            [*labels, "result"],
            registry=registry,
        )
        self.hedges_caused = Counter(
            "hedgerow_upstream_hedges_caused",
            "Hedges started because this upstream, as the primary, gave no first token in time.",
            labels,
            registry=registry,
        )
        self.loser_tokens = Counter(
            "hedgerow_upstream_loser_tokens",
            "Output tokens of this upstream's attempts that lost, in calls with a backup.",
            labels,
            registry=registry,
        )
        self.ttft = Histogram(
            "hedgerow_upstream_ttft_seconds",
            "Each attempt's time to first token from its own send, seconds (observed first tokens only).",
            labels,
            buckets=buckets_s,
            registry=registry,
        )
        self._named: set[str] = set()

    def label(self, upstream: str) -> str:
        """The label value of ``upstream``: itself while fewer than :data:`MAX_UPSTREAM_LABELS` names
        are in use (or it already is one), else :data:`OTHER_UPSTREAM`."""
        if upstream in self._named:
            return upstream
        if len(self._named) < MAX_UPSTREAM_LABELS:
            self._named.add(upstream)
            return upstream
        return OTHER_UPSTREAM

    def observe(self, records: list[RecordFields]) -> None:
        """Count the attempts of stored records (each record once: pass only those written).

        Args:
            records: the records a batch stored.
        """
        counts: Tally[tuple[Any, ...]] = Tally()
        ttfts: dict[tuple[str, str], list[float]] = defaultdict(list)
        for record in records:
            raced = record.hedge_reason == "ttft_timeout"
            for attempt in record.attempts:
                key = (record.route, self.label(attempt.upstream))
                counts[("attempts", *key, attempt.outcome)] += 1
                kind = failure_kind(attempt.outcome, attempt.error_type)
                if kind is not None:
                    counts[("failures", *key, kind)] += 1
                if raced:
                    counts[("races", *key, "won" if attempt.outcome == "won" else "lost")] += 1
                    if attempt.role == "primary":
                        counts[("hedges_caused", *key)] += 1
                if record.hedged and attempt.outcome != "won":  # a 0 still makes the series
                    counts[("loser_tokens", *key)] += attempt.completion_tokens
                if attempt.first_token_s is not None:
                    ttfts[key].append(max(0.0, attempt.first_token_s - attempt.start_s))
        for (name, *values), amount in counts.items():
            counter: Any = getattr(self, name)
            counter.labels(*values).inc(amount)
        for (route, upstream), observed in ttfts.items():
            child = self.ttft.labels(route, upstream)
            for value in observed:
                child.observe(value)
