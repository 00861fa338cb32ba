"""``hedgerow demo``: the whole loop on loopback, three ways side by side, through a change.

What runs (all on 127.0.0.1, as separate processes, talking real HTTP and SSE):

- ``hedgerow serve`` on an embedded SQLite file in a temporary folder: ingest, thresholds, history,
  and the controller job ticking every few seconds (the interval is shortened to fit the run);
- three ``hedgerow replica`` processes (simulated LLM replicas whose service times follow the
  Splitwise perf model); the last one, ``replica-c``, is degraded (every service time multiplied
  by ``degraded_slowdown``), the slow host that hedging exists for. When the shared Splitwise CSV
  is absent the replicas fall back to their embedded table and the demo says so;
- in this process, a load generator of hedging clients replaying the workload: the Azure LLM
  inference trace given with ``--trace`` (arrival gaps and token counts, time-compressed to fit
  ``--duration``) or the built-in generator that follows that trace's statistics. Each call's
  primary is the next replica in turn (round robin); its backup the replica after it.

The same workload is replayed three ways, one after the other, on the same replicas, each as
a route of its own (``demo-<way>``; ``demo-none`` is disabled in the store and ``demo-fixed``
pinned at its threshold before its load starts, so the controller publishes for ``adaptive`` only
and the weekly report shows the thresholds each way's clients used):

- ``none``: no hedging (``max_backups=0``);
- ``fixed``: the manual recipe: observe TTFT without hedging and set ``hedge_after_s`` to its P90.
  The demo takes that P90 from its own ``none`` way, over the calls before the change (what a team
  tuning by hand yesterday would have measured); ``DemoConfig.fixed_hedge_after_s``
  (``--fixed-hedge-after``) overrides it;
- ``adaptive``: thresholds polled from the api (``ThresholdPoller``), set by the controller from
  the records this way's clients export (``TelemetryExporter``); it starts at
  ``default_hedge_after_s`` (2 s) like any new route.

**The change of conditions.** Halfway through each way's calls (just before the call at
``change_fraction`` of the workload is sent; with the trace's bursty arrivals that is not
half of ``duration_s``) the demo changes one replica's speed through its ``PUT /slowdown``:
``change="degrade"`` (the default) slows ``replica-b`` down by ``degraded_slowdown`` too, so two of
three replicas are slow; ``"recover"`` brings ``replica-c`` back to full speed; ``"none"`` changes
nothing. Before the next way starts the replicas are drained and set back. The table reports each
way's calls before the change, after it, and in all, so a threshold tuned on yesterday's traffic
is seen meeting today's.

Each way hedges under the same budget (token bucket, 10% by default, burst 3: over a way's n
calls at most ``budget * n + burst`` hedges, so the 264 calls of ``--quick`` may go at most 1.1
points over the budget; a burst of 10 would allow 3.8). Statistics leave
out the first ``warmup_fraction`` of each way's calls, so the replicas and the controller start
warm and every way is measured on the same part of the workload. The figures, the table and the
three sentences under it (what hedging is, what each way did, the conclusion the numbers support)
are computed in :mod:`hedgerow.sim._demo_summary`.

What hedging costs: before the load starts the demo sets a *demo price* for its model through
``PUT /v1/prices`` (``DemoConfig.price_usd_per_mtok``, USD per million input and output tokens;
an illustration, not a provider's list price). Each way's rows show the extra prompt and
completion tokens its losing attempts cost (a backup re-sends the whole prompt) and their share
of all tokens; the JSON also has the overhead share in USD. At the end the demo fetches the
weekly report of its run from the api (``GET /v1/reports/weekly``, the current week, so marked
partial; each way is one route, ``demo-<way>``) and writes it as HTML and JSON into
``DemoConfig.report_dir``.

**Keeping the store.** The store lives in a temporary folder deleted at the end; with
``DemoConfig.keep_store_path`` (``hedgerow demo --keep-store PATH``) a copy of it is written to
that path once ``serve`` has stopped (SQLite's online backup, so the WAL's pages are in it), and
``hedgerow serve --db sqlite:///PATH`` opens the console on the run's routes, history and report.
"""

from __future__ import annotations

import json
import math
import sqlite3
import tempfile
from collections.abc import Callable, Sequence
from contextlib import closing
from dataclasses import asdict, dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from hedgerow.client import (
    Upstream,
)
from hedgerow.sim._demo_io import (
    DemoError,
    Processes,
    applied_history,
    configure_route,
    drain,
    free_port,
    perf_model_notice,
    published_at,
    published_now,
    set_demo_price,
    set_slowdown,
    wait_ready,
    write_report,
)
from hedgerow.sim._demo_replay import Replayed, replay_way
from hedgerow.sim._demo_summary import (
    ChangeOfConditions,
    ModeResult,
    PartResult,
    after_change_ttfts,
    best_way_sentence,
    conclusion_sentences,
    manual_p90,
    p99_difference_interval,
    results_table,
    summarize,
)
from hedgerow.sim.trace import TraceRequest, compress, load_azure_trace, synthetic_trace

__all__ = [
    "CHANGES",
    "MODES",
    "ChangeOfConditions",
    "DemoConfig",
    "DemoError",
    "DemoRun",
    "ModeResult",
    "PartResult",
    "best_way_sentence",
    "build_workload",
    "conclusion_sentences",
    "keep_store",
    "manual_p90",
    "p99_difference_interval",
    "results_table",
    "run_demo",
    "summarize",
    "write_json",
]

MODES = ("none", "fixed", "adaptive")
#: The changes of conditions ``DemoConfig.change`` may name.
CHANGES = ("degrade", "recover", "none")
#: ``duration_s`` of the ``--quick`` preset (the CLI's help quotes it; a test keeps them equal).
QUICK_DURATION_S = 22.0
#: The replicas' names; the last one starts degraded.
REPLICAS = ("replica-a", "replica-b", "replica-c")


@dataclass(frozen=True, slots=True)
class DemoConfig:
    """Parameters of one demo run.

    Attributes:
        trace_path: an Azure LLM inference trace CSV, or None for the built-in generator.
        duration_s: wall seconds of load per way (three ways run one after the other).
        rate_per_s: arrival rate of the replayed workload, requests per wall second; the trace's
            first ``rate_per_s * duration_s`` requests are time-compressed to ``duration_s``.
        time_scale: factor applied by the replicas to every service time of the perf model
            (0.25 = four times faster than the measured GPU).
        degraded_slowdown: service-time factor of the degraded replica (and of the one that
            degrades at the change).
        max_batch: the replicas' batch bound.
        tokens_per_chunk: tokens per SSE chunk sent by the replicas.
        max_output_tokens: cap on each request's output tokens (None = as in the trace).
        fixed_hedge_after_s: threshold of the ``fixed`` way, seconds; None (the default) takes
            the P90 TTFT of the ``none`` way before the change (the manual recipe).
        default_hedge_after_s: the routes' default threshold, where the adaptive way starts.
        change: the change of conditions halfway: ``degrade``, ``recover`` or ``none``.
        change_fraction: when the change happens, as a fraction of each way's calls, in (0, 1).
        budget: hedge budget of every hedging way and of the route.
        budget_burst: the hedging ways' token-bucket capacity, in backups (``HedgePolicy.
            budget_burst``); over n calls a way hedges at most ``budget * n + budget_burst``.
        controller_interval_s: seconds between controller ticks.
        warmup_fraction: leading fraction of each way's calls left out of the statistics.
        seed: seed of the built-in generator.
        json_path: where the caller should write the results as JSON (``write_json``), or None.
        report_dir: where the weekly report of the run is written (HTML and JSON), or None.
        price_usd_per_mtok: the demo price of the model, (input, output) USD per million tokens.
        perf_model_path: the Splitwise speed table the replicas read (``hedgerow replica
            --perf-model``), or None: the shared copy the replicas look for themselves, else
            their embedded table.
        keep_store_path: where a copy of the run's SQLite store is written when it ends (an
            existing file there is replaced; the CLI refuses one without ``--force``), or None
            to let it go with the temporary folder.

    Raises:
        ValueError: ``change`` not one of ``CHANGES``, or ``change_fraction`` /
            ``warmup_fraction`` outside their ranges, or ``budget_burst`` below 0 (the message
            names the field).
    """

    trace_path: Path | None = None
    duration_s: float = 120.0
    rate_per_s: float = 12.0
    time_scale: float = 0.25
    degraded_slowdown: float = 2.5
    max_batch: int = 32
    tokens_per_chunk: int = 4
    max_output_tokens: int | None = 256
    fixed_hedge_after_s: float | None = None
    default_hedge_after_s: float = 2.0
    change: str = "degrade"
    change_fraction: float = 0.5
    budget: float = 0.10
    budget_burst: float = 3.0
    controller_interval_s: float = 5.0
    warmup_fraction: float = 0.25
    seed: int = 0
    json_path: Path | None = None
    report_dir: Path | None = Path("hedgerow-demo-report")
    price_usd_per_mtok: tuple[float, float] = (0.60, 2.40)
    perf_model_path: Path | None = None
    keep_store_path: Path | None = None

    def __post_init__(self) -> None:
        if self.change not in CHANGES:
            raise ValueError(f"change must be one of {', '.join(CHANGES)}, got {self.change!r}")
        if not 0 < self.change_fraction < 1:
            raise ValueError(f"change_fraction must be in (0, 1), got {self.change_fraction!r}")
        if not (math.isfinite(self.budget_burst) and self.budget_burst >= 0):
            raise ValueError(f"budget_burst must be a finite number >= 0, got {self.budget_burst!r}")
        if not 0 <= self.warmup_fraction < self.change_fraction:
            raise ValueError(
                f"warmup_fraction must be in [0, change_fraction={self.change_fraction:g}), "
                f"got {self.warmup_fraction!r}"
            )

    @classmethod
    def quick(cls, **overrides: Any) -> DemoConfig:
        """The ``--quick`` preset: 22 s of load per way, about 100 s in all on an idle 2-core machine."""
        base: dict[str, Any] = {"duration_s": QUICK_DURATION_S, "controller_interval_s": 2.0}
        base.update(overrides)
        return cls(**base)

    def change_index(self, calls: int) -> int:
        """Index of the first call sent after the change, in a workload of ``calls`` calls."""
        return min(calls - 1, max(1, int(calls * self.change_fraction)))

    def change_of_conditions(self, at_s: float | None = None) -> ChangeOfConditions:
        """The change this config asks for, as a :class:`ChangeOfConditions`.

        Args:
            at_s: seconds into each way's load when it happens (None while not known).
        """
        if self.change == "degrade":
            return ChangeOfConditions("degrade", REPLICAS[1], 1.0, self.degraded_slowdown, at_s)
        if self.change == "recover":
            return ChangeOfConditions("recover", REPLICAS[2], self.degraded_slowdown, 1.0, at_s)
        return ChangeOfConditions("none", None, 1.0, 1.0, at_s)


@dataclass(frozen=True, slots=True)
class DemoRun:
    """A demo run: one result per way, the change, the verdict and the weekly report.

    Attributes:
        results: one :class:`ModeResult` per way (``MODES`` order).
        report_paths: the files written (HTML, then JSON), empty without ``report_dir``.
        report: the JSON weekly report (schema ``hedgerow.weekly_report/1``), or None when the
            api could not give it.
        change: the change of conditions every way went through.
        fixed_hedge_after_s: the fixed way's threshold, seconds.
        fixed_source: ``p90_of_none`` (the manual recipe) or ``--fixed-hedge-after``.
        sentences: the three sentences printed under the table.
        notices: what the run fell back to (the embedded speed table), one line each.
        p99_difference_s: the 95% bootstrap interval of the adaptive way's TTFT P99 after the
            change minus the fixed way's, seconds (None with too few calls).
        store_path: where the run's store was kept (``DemoConfig.keep_store_path``), or None.
    """

    results: list[ModeResult]
    report_paths: tuple[Path, ...] = ()
    report: dict[str, Any] | None = None
    change: ChangeOfConditions | None = None
    fixed_hedge_after_s: float | None = None
    fixed_source: str = "p90_of_none"
    sentences: tuple[str, ...] = ()
    notices: tuple[str, ...] = ()
    p99_difference_s: tuple[float, float] | None = None
    store_path: Path | None = None


def keep_store(source: Path, destination: Path) -> None:
    """Copy the SQLite store ``source`` to ``destination`` (replaced if present), WAL included.

    Uses SQLite's online backup (``sqlite3.Connection.backup``), so pages still in the ``-wal``
    file are copied and the result is one self-contained database file.

    Raises:
        DemoError: the store cannot be read or the copy cannot be written (names the path).
    """
    try:
        destination.unlink(missing_ok=True)
        read_only = f"{source.resolve().as_uri()}?mode=ro"
        with closing(sqlite3.connect(read_only, uri=True)) as src, closing(sqlite3.connect(destination)) as dst:
            src.backup(dst)
    except (OSError, sqlite3.Error) as exc:
        raise DemoError(f"--keep-store: cannot write the store to {destination}: {exc}") from None


def build_workload(config: DemoConfig) -> list[TraceRequest]:
    """The requests of one way: from the trace (compressed) or the built-in generator.

    Raises:
        DemoError: when the trace cannot be read.
    """
    n = max(10, round(config.rate_per_s * config.duration_s))
    if config.trace_path is not None:
        try:
            trace = load_azure_trace(config.trace_path, limit=n)
        except (OSError, ValueError) as exc:
            raise DemoError(f"--trace {config.trace_path}: {exc}") from None
        if len(trace) < 2:
            raise DemoError(f"--trace {config.trace_path}: fewer than two requests")
        trace = compress(trace, config.duration_s)
    else:
        trace = synthetic_trace(n, config.rate_per_s, seed=config.seed)
    return trace


async def run_demo(config: DemoConfig, progress: Any = None, notify: Callable[[str], None] | None = None) -> DemoRun:
    """Run the demo: one ``ModeResult`` per way (``none``, ``fixed``, ``adaptive``) and its weekly report.

    Args:
        config: the ``DemoConfig``.
        progress: optional ``rich.progress.Progress`` to show progress in.
        notify: called with each notice (a fallback the run took) as soon as it is known.

    Raises:
        DemoError: when a process does not start, the trace cannot be read, a replica refuses
            the change of speed, the none way gives no TTFT to take the fixed way's P90 from, or
            the report cannot be written.
    """
    workload = build_workload(config)
    change = config.change_of_conditions(workload[config.change_index(len(workload))].arrival_s)
    results: list[ModeResult] = []
    report_paths: tuple[Path, ...] = ()
    report: Any = None
    notices: list[str] = []
    after: dict[str, list[float]] = {}  # each way's TTFTs after the change
    fixed_s = config.fixed_hedge_after_s
    fixed_source = "p90_of_none" if fixed_s is None else "--fixed-hedge-after"
    with tempfile.TemporaryDirectory(prefix="hedgerow-demo-") as tmp:
        workdir = Path(tmp)
        procs = Processes(workdir)
        api_port = free_port()
        api_url = f"http://127.0.0.1:{api_port}"
        env = {
            "HEDGEROW_CONTROLLER_INTERVAL_S": str(config.controller_interval_s),
            "HEDGEROW_WINDOW_S": str(max(30.0, config.duration_s)),
            "HEDGEROW_SHORT_WINDOW_S": str(max(5.0, config.duration_s / 6)),
            "HEDGEROW_MIN_SAMPLES": "30",
            "HEDGEROW_MAX_STEP_DOWN": "0.5",
            "HEDGEROW_DEFAULT_BUDGET": str(config.budget),
            "HEDGEROW_DEFAULT_HEDGE_AFTER_S": str(config.default_hedge_after_s),
        }
        db_url = f"sqlite+aiosqlite:///{workdir / 'hedgerow.db'}"
        upstreams: list[Upstream] = []
        initial = {name: (config.degraded_slowdown if i == 2 else 1.0) for i, name in enumerate(REPLICAS)}
        try:
            async with httpx.AsyncClient() as http:
                await procs.start("api", ["serve", "--db", db_url, "--port", str(api_port)], env)
                for i, name in enumerate(REPLICAS):
                    port = free_port()
                    await procs.start(
                        name,
                        [
                            "replica",
                            "--port",
                            str(port),
                            "--name",
                            name,
                            "--time-scale",
                            str(config.time_scale),
                            "--slowdown",
                            str(initial[name]),
                            "--max-batch",
                            str(config.max_batch),
                            "--tokens-per-chunk",
                            str(config.tokens_per_chunk),
                            "--seed",
                            str(config.seed + i),
                            *(["--perf-model", str(config.perf_model_path)] if config.perf_model_path else []),
                        ],
                    )
                    upstreams.append(Upstream(name, f"http://127.0.0.1:{port}/v1"))
                by_name = {u.name: u for u in upstreams}
                await wait_ready(http, f"{api_url}/healthz", procs, "api")
                for upstream in upstreams:
                    await wait_ready(http, upstream.base_url.removesuffix("/v1") + "/healthz", procs, upstream.name)
                notice = await perf_model_notice(http, upstreams)
                if notice is not None:
                    notices.append(notice)
                    if notify is not None:
                        notify(notice)
                await set_demo_price(http, api_url, config)

                async def apply_change() -> None:
                    if change.replica is not None:
                        await set_slowdown(http, by_name[change.replica], change.slowdown_after)

                for mode in MODES:
                    task_id = None
                    if progress is not None:
                        task_id = progress.add_task(f"{mode:>8}", total=len(workload))

                    def done(task_id: Any = task_id) -> None:
                        if progress is not None:
                            progress.advance(task_id)

                    if change.replica is not None:  # every way starts in the same conditions
                        await set_slowdown(http, by_name[change.replica], change.slowdown_before)
                    hedge_after = config.default_hedge_after_s
                    if mode == "fixed":
                        if fixed_s is None:  # the manual recipe: the none way's P90 before the change
                            try:
                                fixed_s = round(manual_p90(results[0]), 3)
                            except ValueError as exc:
                                raise DemoError(str(exc)) from None
                        hedge_after = fixed_s
                    await configure_route(http, api_url, mode, hedge_after, config)
                    replayed = await replay_way(
                        mode, workload, upstreams, config, api_url, done, hedge_after, apply_change
                    )
                    result = summarize(
                        mode, replayed.records, config.warmup_fraction, config.price_usd_per_mtok, replayed.change_at
                    )
                    after[mode] = after_change_ttfts(replayed.records, config.warmup_fraction, replayed.change_at)
                    if mode == "adaptive":
                        # The published value first: the controller keeps ticking, and a value
                        # published after this read still leaves this one in the history.
                        published = await published_now(http, api_url, f"demo-{mode}")
                        history = await applied_history(http, api_url, f"demo-{mode}")
                        result = _with_controller(result, replayed, history, published, config.default_hedge_after_s)
                    else:
                        result = _with_threshold(result, mode, replayed, hedge_after, fixed_source)
                    results.append(result)
                    await drain(http, upstreams)
                if change.replica is not None:
                    await set_slowdown(http, by_name[change.replica], change.slowdown_before)
                if config.report_dir is not None:
                    try:
                        report_paths, report = await write_report(http, api_url, config.report_dir)
                    except OSError as exc:
                        raise DemoError(f"cannot write the report into {config.report_dir}: {exc}") from None
        finally:
            await procs.stop()
        if config.keep_store_path is not None:  # serve has stopped: nothing writes to it any more
            keep_store(workdir / "hedgerow.db", config.keep_store_path)
    interval = p99_difference_interval(after["adaptive"], after["fixed"]) if len(after) == len(MODES) else None
    sentences = conclusion_sentences(results, change, config.budget, fixed_source, interval, after)
    return DemoRun(
        results,
        report_paths,
        report,
        change,
        fixed_s,
        fixed_source,
        tuple(sentences),
        tuple(notices),
        interval,
        config.keep_store_path,
    )


def _with_controller(
    result: ModeResult,
    replayed: Replayed,
    history: Sequence[tuple[datetime, float]],
    published: float | None,
    default: float,
) -> ModeResult:
    """The adaptive way's result with what the controller published (from the api)."""
    last = published if published is not None else published_at(history, None, default)
    assert result.before_change is not None and result.after_change is not None
    return replace(
        result,
        final_hedge_after_s=replayed.polled_hedge_after_s,
        threshold_path_s=tuple(round(v, 3) for _, v in history),
        records_rejected=replayed.rejected,
        hedge_after_s=default,
        hedge_after_source="controller",
        published_hedge_after_s=last,
        before_change=replace(
            result.before_change, published_hedge_after_s=published_at(history, replayed.change_at, default)
        ),
        after_change=replace(result.after_change, published_hedge_after_s=last),
    )


def _with_threshold(
    result: ModeResult, mode: str, replayed: Replayed, hedge_after_s: float, fixed_source: str
) -> ModeResult:
    """The none or fixed way's result with its own threshold (None for ``none``)."""
    value = hedge_after_s if mode == "fixed" else None
    assert result.before_change is not None and result.after_change is not None
    return replace(
        result,
        records_rejected=replayed.rejected,
        hedge_after_s=value,
        hedge_after_source=fixed_source if mode == "fixed" else "none",
        published_hedge_after_s=value,
        before_change=replace(result.before_change, published_hedge_after_s=value),
        after_change=replace(result.after_change, published_hedge_after_s=value),
    )


def _jsonable(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, tuple):
        return list(value)
    return value


def write_json(config: DemoConfig, run: DemoRun) -> None:
    """Write the run as JSON to ``config.json_path``.

    Keys: ``modes`` (one object per way: the ``ModeResult`` fields, with ``before_change`` and
    ``after_change`` objects), ``config``, ``report_files``, and ``change`` (kind, replica,
    slowdown_before, slowdown_after, at_s), ``fixed_hedge_after_s``, ``fixed_source``,
    ``sentences``, ``notices``, ``after_change_p99_difference_s`` (the bootstrap interval of
    adaptive's P99 minus fixed's after the change, seconds, or null).

    Raises:
        ValueError: ``config.json_path`` is None.
        OSError: when the file cannot be written.
    """
    if config.json_path is None:
        raise ValueError("write_json: config.json_path is None")
    payload = {
        "modes": [{k: _jsonable(v) for k, v in asdict(r).items()} for r in run.results],
        "config": {k: _jsonable(v) for k, v in asdict(config).items()},
        "report_files": [str(p) for p in run.report_paths],
        "change": asdict(run.change) if run.change is not None else None,
        "fixed_hedge_after_s": run.fixed_hedge_after_s,
        "fixed_source": run.fixed_source,
        "sentences": list(run.sentences),
        "notices": list(run.notices),
        "after_change_p99_difference_s": list(run.p99_difference_s) if run.p99_difference_s else None,
    }
    config.json_path.write_text(json.dumps(payload, indent=2) + "\n")
