"""The gateway's own Prometheus metrics: the ``hedgerow_gateway_*`` family (prometheus-client).

Served by the gateway's process at ``GET /metrics`` (Prometheus text format; with gateway keys
configured the scrape needs one, as any request; scrapes are not counted). Counts what **this
gateway process** served, so with several replicas Prometheus sums them. The calls' own series
(``hedgerow_calls_total``, TTFT, hedges) come from the records, at the api's ``/metrics``.

==========================================  =========  ===============================================
name                                        type       labels
==========================================  =========  ===============================================
hedgerow_gateway_requests_total             counter    route, model, outcome, status, key
hedgerow_gateway_requests_in_flight         gauge      (requests being served now)
hedgerow_gateway_response_start_seconds     histogram  route, model (arrival to status line: for a
                                                       streamed call, the winner's first token)
hedgerow_gateway_request_duration_seconds   histogram  route, model (arrival to the answer's end)
==========================================  =========  ===============================================

Labels stay low-cardinality and hold no secret: ``route`` is the route's name and ``model`` the
public model name of the configuration (``*`` for a gateway that passes any model), both empty
for a request refused before it was routed (bad key, unknown model or path, too large, busy);
``key`` the *name* of the caller's gateway key (a configured name, so bounded by the keys file
and ``HEDGEROW_TOKENS``; empty without keys or for a request refused for its key); never a key,
a request id or a model name a caller made up. ``outcome`` is one of ``OUTCOMES``; ``status``
the HTTP status sent to the caller. Under ``hedgerow serve --gateway`` the same series are also
served at the api's ``/metrics`` (:meth:`GatewayMetrics.collect`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.metrics_core import Metric

__all__ = ["CONTENT_TYPE", "LATENCY_BUCKETS_S", "OUTCOMES", "GatewayMetrics"]

#: ``Content-Type`` of the ``/metrics`` answer.
CONTENT_TYPE: Final = CONTENT_TYPE_LATEST

#: What became of a request (the ``outcome`` label):
#: ``ok`` an answer (2xx) sent whole; ``client_error`` a 4xx of an upstream or of hedgerow's own
#: checks handed back; ``refused`` refused by the gateway before routing (401, 404, 413, 429);
#: ``failed`` every attempt failed (502, 503, 504); ``stream_failed`` the winner failed after the
#: first token (the stream ends with an error event); ``cancelled`` the caller left first.
OUTCOMES: Final = ("ok", "client_error", "refused", "failed", "stream_failed", "cancelled")

#: Bucket bounds of the gateway's latency histograms, seconds (1 ms up to a minute).
LATENCY_BUCKETS_S: Final = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip


class GatewayMetrics:
    """The ``hedgerow_gateway_*`` series of one ``GatewayApp``, in a registry of their own.

    Attributes:
        registry: the ``CollectorRegistry`` that ``render`` serves.
    """

    def __init__(self) -> None:
        # process-wide in prometheus-client: no ``*_created`` series (as the api's /metrics)
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self._requests = Counter(
            "hedgerow_gateway_requests",
            "Requests the gateway answered, by route, public model, outcome, HTTP status and key name.",
            ["route", "model", "outcome", "status", "key"],
            registry=r,
        )
        self.in_flight = Gauge("hedgerow_gateway_requests_in_flight", "Requests being served now.", registry=r)
        self._response_start = Histogram(
            "hedgerow_gateway_response_start_seconds",
            "Time from a request's arrival to its status line (streamed calls: the winner's first token), seconds.",
            ["route", "model"],
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self._duration = Histogram(
            "hedgerow_gateway_request_duration_seconds",
            "Time from a request's arrival to the end of its answer, seconds.",
            ["route", "model"],
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        # label lookups cost microseconds each: the children are kept per label set
        self._counters: dict[tuple[str, str, str, int, str], Counter] = {}
        self._timers: dict[tuple[str, str], tuple[Histogram, Histogram]] = {}

    def observe(
        self,
        route: str,
        model: str,
        outcome: str,
        status: int,
        response_start_s: float | None,
        duration_s: float,
        key: str = "",
    ) -> None:
        """Count one answered request.

        Args:
            route / model: the route's name and public model name (``""`` when not routed).
            outcome: one of ``OUTCOMES``.
            status: the HTTP status sent (0 when none was: the caller left first).
            response_start_s: arrival to status line, seconds; None when no status was sent.
            duration_s: arrival to the end of the answer, seconds.
            key: the name of the caller's gateway key (``""`` without one).
        """
        labels = (route, model, outcome, status, key)
        counter = self._counters.get(labels)
        if counter is None:
            counter = self._requests.labels(route=route, model=model, outcome=outcome, status=str(status), key=key)
            self._counters[labels] = counter
        counter.inc()
        timers = self._timers.get((route, model))
        if timers is None:
            timers = (
                self._response_start.labels(route=route, model=model),
                self._duration.labels(route=route, model=model),
            )
            self._timers[(route, model)] = timers
        if response_start_s is not None:
            timers[0].observe(response_start_s)
        timers[1].observe(duration_s)

    def render(self) -> bytes:
        """The registry in the Prometheus text format."""
        return generate_latest(self.registry)

    def collect(self) -> Iterable[Metric]:
        """The family's current samples (a prometheus-client collector: register this object in
        another ``CollectorRegistry`` to serve the family there too, as ``serve --gateway`` does)."""
        return self.registry.collect()
