"""``GET /metrics``: Prometheus text format, one registry per app (prometheus-client).

With ``HEDGEROW_TOKENS`` set the scrape needs a token with the ``read`` scope (Prometheus'
``authorization`` setting).

Counters count what **this process** ingested (each stored record once; duplicates and rejected
batches are not calls), so with several ``serve`` processes Prometheus sums them; gauges of the
published thresholds are read from the store at scrape time, so every process reports the same.
Labels stay low-cardinality: route, model, status, trigger, winner, token type (never request
ids, clients or users). No ``*_created`` series are served (prometheus-client's
``disable_created_metrics``: the creation time of each counter and histogram child is OpenMetrics
noise that Prometheus stores as one more series per child).

=====================================================  =========  ==================================
name                                                   type       labels
=====================================================  =========  ==================================
hedgerow_calls_total                                   counter    route, model, status
hedgerow_hedges_total                                  counter    route, model, trigger (delay: the
                                                                  first token was late, a hedge;
                                                                  error: the primary failed, a
                                                                  failover)
hedgerow_hedges_denied_total                           counter    route, model
hedgerow_hedge_wins_total                              counter    route, model, trigger, winner
                                                                  (calls with a backup: which
                                                                  attempt won; trigger as above, so
                                                                  delay alone is the hedges' wins)
hedgerow_failovers_total                               counter    route, model
hedgerow_failovers_denied_total                        counter    route, model (refused by the
                                                                  client's failover retry budget)
hedgerow_wasted_tokens_total                           counter    route, model, token_type (prompt:
                                                                  the prompts losing attempts were
                                                                  sent, estimated or reported;
                                                                  completion: what they generated)
gen_ai_client_operation_time_to_first_chunk_seconds    histogram  gen_ai_request_model, route (the
                                                                  TTFT the app saw)
hedgerow_records_accepted_total                        counter    (stored records)
hedgerow_records_duplicate_total                       counter    (already stored, not re-counted)
hedgerow_records_rejected_total                        counter    (records of refused batches)
hedgerow_controller_tick_duration_seconds              histogram  (ticks run by this process)
hedgerow_controller_last_success_timestamp_seconds     gauge      (Unix time of the last tick)
hedgerow_lease_held                                    gauge      lease (1 while this process
                                                                  holds it)
hedgerow_store_up                                      gauge      (1 when the scrape could read
                                                                  the store; at 0 the threshold
                                                                  series are left out)
hedgerow_hedge_after_seconds                           gauge      route, model (published value)
hedgerow_route_budget                                  gauge      route, model (the route's hedge
                                                                  budget, a fraction of calls)
hedgerow_threshold_info                                gauge      route, model, version, source
=====================================================  =========  ==================================

Per upstream (route, upstream: attempts by outcome, failures by kind, races won and lost, hedges
caused, loser tokens, each attempt's TTFT; at most 50 upstream names a process):
:mod:`hedgerow.api._upstream_metrics`.
"""

from __future__ import annotations

import logging
from collections import Counter as Tally
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from hedgerow.api._state import app_state
from hedgerow.api._upstream_metrics import UpstreamMetrics
from hedgerow.api.auth import require_scope
from hedgerow.api.store_errors import STORE_ERRORS, is_store_down
from hedgerow.client.records import estimate_prompt_tokens
from hedgerow.controller.lease import CONTROLLER_LEASE
from hedgerow.controller.store.ingest import RecordFields
from hedgerow.controller.store.queries import list_thresholds

__all__ = ["TTFT_BUCKETS_S", "Metrics", "metrics_response", "router"]

#: Bucket bounds of the TTFT histogram, seconds (the OTel GenAI advisory bounds, then to 60 s).
TTFT_BUCKETS_S: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 30.0, 60.0,
)  # fmt: skip
#: Bucket bounds of the controller tick duration, seconds.
TICK_BUCKETS_S: tuple[float, ...] = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
#: The ``trigger`` label of a record's ``hedge_reason``: a late first token (a hedge) or a
#: failed primary (a failover).
_TRIGGERS: dict[str, str] = {"ttft_timeout": "delay", "primary_error": "error"}

router = APIRouter()

log = logging.getLogger(__name__)


class Metrics:
    """The metrics of one app, in a registry of its own (so several apps in a process never clash).

    Attributes:
        registry: the ``CollectorRegistry`` that ``/metrics`` renders.
    """

    def __init__(self) -> None:
        # process-wide in prometheus-client (it has no per-registry switch); this process's
        # metrics are all the api's, so none of them should carry a ``_created`` series
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        route_model = ["route", "model"]
        self.calls = Counter("hedgerow_calls", "Calls ingested, by final status.", [*route_model, "status"], registry=r)
        self.hedges = Counter(
            "hedgerow_hedges",
            "Backup attempts started: delay = hedge, error = failover.",
            [*route_model, "trigger"],
            registry=r,
        )
        self.hedges_denied = Counter(
            "hedgerow_hedges_denied", "Hedges the client's budget refused.", route_model, registry=r
        )
        self.hedge_wins = Counter(
            "hedgerow_hedge_wins",
            "Calls with a backup attempt, by trigger (delay = hedge, error = failover) and winning attempt.",
            [*route_model, "trigger", "winner"],
            registry=r,
        )
        self.failovers = Counter(
            "hedgerow_failovers", "Backups started because the primary failed.", route_model, registry=r
        )
        self.failovers_denied = Counter(
            "hedgerow_failovers_denied",
            "Failovers the client's failover retry budget refused.",
            route_model,
            registry=r,
        )
        self.wasted_tokens = Counter(
            "hedgerow_wasted_tokens", "Tokens the losing attempts cost.", [*route_model, "token_type"], registry=r
        )
        self.ttft = Histogram(
            "gen_ai_client_operation_time_to_first_chunk_seconds",
            "Time to the first chunk of the answer the app received (TTFT), seconds.",
            ["gen_ai_request_model", "route"],
            buckets=TTFT_BUCKETS_S,
            registry=r,
        )
        self.records_accepted = Counter("hedgerow_records_accepted", "Call records stored.", registry=r)
        self.records_duplicate = Counter(
            "hedgerow_records_duplicate", "Call records already stored (not counted again).", registry=r
        )
        self.records_rejected = Counter("hedgerow_records_rejected", "Call records of refused batches.", registry=r)
        self.ingest_refused = Counter(
            "hedgerow_ingest_refused",
            "Ingest batches answered 503 before they were read, by reason (busy: every ingest slot stayed taken).",
            ["reason"],
            registry=r,
        )
        self.ingest_refused.labels(reason="busy")  # exported at 0 from the start
        self.tick_duration = Histogram(
            "hedgerow_controller_tick_duration_seconds",
            "Duration of the controller ticks this process ran, seconds.",
            buckets=TICK_BUCKETS_S,
            registry=r,
        )
        self.tick_last_success = Gauge(
            "hedgerow_controller_last_success_timestamp_seconds",
            "Unix time at which this process last finished a controller tick.",
            registry=r,
        )
        self.lease_held = Gauge(
            "hedgerow_lease_held", "1 while this process holds the lease, else 0.", ["lease"], registry=r
        )
        self.store_up = Gauge("hedgerow_store_up", "1 when the last scrape could read the store, else 0.", registry=r)
        self.hedge_after = Gauge(
            "hedgerow_hedge_after_seconds", "The published hedge_after_s, seconds.", route_model, registry=r
        )
        self.route_budget = Gauge(
            "hedgerow_route_budget",
            "The route's hedge budget: largest allowed fraction of calls that hedge (0.10 = 10 %).",
            route_model,
            registry=r,
        )
        self.threshold_info = Gauge(
            "hedgerow_threshold_info",
            "The published threshold's version and source (value 1).",
            [*route_model, "version", "source"],
            registry=r,
        )
        self.lease_held.labels(lease=CONTROLLER_LEASE).set(0)
        self.upstreams = UpstreamMetrics(r, TTFT_BUCKETS_S)

    def observe_records(self, records: Iterable[RecordFields]) -> None:
        """Count stored call records (each once: pass only the records written, not duplicates).

        Counts are summed per label set first and each counter child is incremented once per
        batch (a child lookup costs microseconds, a batch has up to 1,000 records); the TTFT
        histogram gets one observation per record. The prompts of losing attempts are counted
        with the one estimate rule (:func:`hedgerow.client.records.estimate_prompt_tokens`), as
        stored.
        """
        records = list(records)
        self.upstreams.observe(records)
        counts: Tally[tuple[Any, ...]] = Tally()
        ttfts: dict[tuple[str, str], list[float]] = defaultdict(list)
        for record in records:
            key = (record.route, record.model)
            counts[("calls", *key, record.status)] += 1
            trigger = _TRIGGERS.get(record.hedge_reason) if record.hedge_reason else None
            if trigger is not None:
                counts[("hedges", *key, trigger)] += 1
            if trigger == "error":
                counts[("failovers", *key)] += 1
            if record.hedge_denied:
                counts[("hedges_denied", *key)] += 1
            if record.hedged and trigger is not None and record.winner is not None:
                counts[("hedge_wins", *key, trigger, record.winner)] += 1
            if record.failover_denied:
                counts[("failovers_denied", *key)] += 1
            if record.wasted_completion_tokens:
                counts[("wasted_tokens", *key, "completion")] += record.wasted_completion_tokens
            if len(record.attempts) > 1:  # the prompts of losing attempts: the price of a hedge
                call_prompt = record.prompt_tokens
                wasted_prompt = sum(
                    estimate_prompt_tokens(a.prompt_tokens, a.prompt_tokens_estimated, a.status_code, call_prompt)[0]
                    for a in record.attempts
                    if a.outcome != "won"
                )
                if wasted_prompt:
                    counts[("wasted_tokens", *key, "prompt")] += wasted_prompt
            if record.ttft_s is not None:
                ttfts[key].append(record.ttft_s)
        for (name, route, model, *rest), amount in counts.items():
            counter: Any = getattr(self, name)
            child = counter.labels(route, model, *rest) if rest else counter.labels(route, model)
            child.inc(amount)
        for (route, model), values in ttfts.items():
            child = self.ttft.labels(gen_ai_request_model=model, route=route)
            for value in values:
                child.observe(value)

    def observe_tick(self, duration_s: float, finished_at_s: float) -> None:
        """Record one controller tick of ``duration_s`` seconds that finished at Unix time ``finished_at_s``."""
        self.tick_duration.observe(duration_s)
        self.tick_last_success.set(finished_at_s)

    def set_lease(self, held: bool) -> None:
        """Set ``hedgerow_lease_held`` of the controller lease."""
        self.lease_held.labels(lease=CONTROLLER_LEASE).set(1 if held else 0)

    def set_thresholds(self, thresholds: list[dict[str, Any]]) -> None:
        """Replace the threshold gauges (published ``hedge_after_s``, the route's budget, the
        threshold's version and source) by the published thresholds ``thresholds`` (as
        :func:`hedgerow.controller.store.queries.list_thresholds` gives them)."""
        self.hedge_after.clear()
        self.route_budget.clear()
        self.threshold_info.clear()
        for row in thresholds:
            self.hedge_after.labels(route=row["route"], model=row["model"]).set(row["hedge_after_s"])
            self.route_budget.labels(route=row["route"], model=row["model"]).set(row["budget"])
            self.threshold_info.labels(
                route=row["route"], model=row["model"], version=str(row["version"]), source=row["source"]
            ).set(1)

    def render(self) -> bytes:
        """The registry in the Prometheus text format."""
        return generate_latest(self.registry)


@router.get("/metrics", include_in_schema=False, dependencies=[Depends(require_scope("read"))])
async def metrics(request: Request) -> Response:
    """Prometheus text format: this process's counters, the store's published thresholds."""
    return await metrics_response(request)


async def metrics_response(request: Request) -> Response:
    """The ``/metrics`` answer for an authorized ``request`` (also served to the console's login)."""
    app_metrics: Metrics = app_state(request.app).metrics
    try:
        async with app_state(request.app).sessionmaker() as session:
            app_metrics.set_thresholds(await list_thresholds(session))
    except STORE_ERRORS as exc:
        reason = await is_store_down(request)
        if reason is None:
            raise
        # this process's own series still count; the threshold gauges are dropped, not stale
        log.warning("/metrics: %s (%s)", reason, type(exc).__name__)
        app_metrics.set_thresholds([])
        app_metrics.store_up.set(0)
    else:
        app_metrics.store_up.set(1)
    app_metrics.set_lease(app_state(request.app).scheduler.holding)
    return Response(app_metrics.render(), media_type=CONTENT_TYPE_LATEST)
