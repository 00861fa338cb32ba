"""``hedgerow demo``: the whole loop on loopback, three ways side by side.

What runs (all on 127.0.0.1, as separate processes, talking real HTTP and SSE):

- ``hedgerow serve`` on an embedded SQLite file in a temporary folder: ingest, thresholds, history,
  and the controller job ticking every few seconds (the interval is shortened to fit the run);
- three ``hedgerow replica`` processes (simulated LLM replicas whose service times follow the
  Splitwise perf model); the last one is degraded (every service time multiplied by
  ``degraded_slowdown``), the slow host that hedging exists for;
- in this process, a load generator of hedging clients replaying the workload: the Azure LLM
  inference trace given with ``--trace`` (arrival gaps and token counts, time-compressed to fit
  ``--duration``) or the built-in generator that follows that trace's statistics. Each call's
  primary is the next replica in turn (round robin); its backup the replica after it.

The same workload is replayed three ways, one after the other, on the same replicas:

- ``none``: no hedging (``max_backups=0``);
- ``fixed``: ``hedge_after_s`` = 2.0 s, the guess a team would start with;
- ``adaptive``: thresholds polled from the api (``ThresholdPoller``), set by the controller from
  the records this way's clients export (``TelemetryExporter``).

Each way hedges under the same budget (token bucket, 10% by default). Statistics leave out the
first ``warmup_fraction`` of each way's calls, so the replicas and the controller start warm and
every way is measured on the same part of the workload.

What hedging costs: before the load starts the demo sets a *demo price* for its model through
``PUT /v1/prices`` (``DemoConfig.price_usd_per_mtok``, USD per million input and output tokens;
an illustration, not a provider's list price). Each way's table row shows the extra prompt tokens
its losing attempts cost (a backup re-sends the whole prompt) and the overhead share, the cost of
every losing attempt over the cost of all attempts at that price. At the end the demo fetches the
weekly report of its run from the api (``GET /v1/reports/weekly``, the current week, so marked
partial; each way is one route, ``demo-<way>``) and writes it as HTML and JSON into
``DemoConfig.report_dir``.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import socket
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from hedgerow.client import (
    CallRecord,
    HedgeError,
    HedgePolicy,
    HedgingClient,
    TelemetryExporter,
    ThresholdPoller,
    Upstream,
)
from hedgerow.sim.trace import TraceRequest, compress, load_azure_trace, synthetic_trace

__all__ = ["MODES", "DemoConfig", "DemoError", "DemoRun", "ModeResult", "run_demo", "summarize"]

MODES = ("none", "fixed", "adaptive")
MODEL = "llama2-70b"


class DemoError(RuntimeError):
    """The demo could not start or finish (a process did not come up, a port was taken, ...)."""


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
        degraded_slowdown: service-time factor of the degraded replica.
        max_batch: the replicas' batch bound.
        tokens_per_chunk: tokens per SSE chunk sent by the replicas.
        max_output_tokens: cap on each request's output tokens (None = as in the trace).
        fixed_hedge_after_s: threshold of the ``fixed`` way, seconds.
        budget: hedge budget of every hedging way and of the route.
        controller_interval_s: seconds between controller ticks.
        warmup_fraction: leading fraction of each way's calls left out of the statistics.
        seed: seed of the built-in generator.
        json_path: where the caller should write the results as JSON (``write_json``), or None.
        report_dir: where the weekly report of the run is written (HTML and JSON), or None.
        price_usd_per_mtok: the demo price of the model, (input, output) USD per million tokens.
    """

    trace_path: Path | None = None
    duration_s: float = 120.0
    rate_per_s: float = 12.0
    time_scale: float = 0.25
    degraded_slowdown: float = 2.5
    max_batch: int = 32
    tokens_per_chunk: int = 4
    max_output_tokens: int | None = 256
    fixed_hedge_after_s: float = 2.0
    budget: float = 0.10
    controller_interval_s: float = 5.0
    warmup_fraction: float = 0.25
    seed: int = 0
    json_path: Path | None = None
    report_dir: Path | None = Path("hedgerow-demo-report")
    price_usd_per_mtok: tuple[float, float] = (0.60, 2.40)

    @classmethod
    def quick(cls, **overrides: Any) -> DemoConfig:
        """The ``--quick`` preset: about 30 s of load per way, under two minutes in all."""
        base: dict[str, Any] = {"duration_s": 22.0, "controller_interval_s": 2.0}
        base.update(overrides)
        return cls(**base)


@dataclass(frozen=True, slots=True)
class ModeResult:
    """What one way measured (after warm-up). Times in seconds, rates as fractions.

    ``records_rejected`` counts this way's call records that the api refused (all of its calls,
    warm-up included); it should be 0. ``extra_prompt_tokens`` are the prompt tokens of the
    attempts that did not win (in calls with more than one attempt); ``overhead_share`` the cost
    of those attempts over the cost of all attempts at the demo price (None without a price).
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


@dataclass(frozen=True, slots=True)
class DemoRun:
    """A demo run: one result per way, and the weekly report the api gave at its end.

    Attributes:
        results: one :class:`ModeResult` per way (``MODES`` order).
        report_paths: the files written (HTML, then JSON), empty without ``report_dir``.
        report: the JSON weekly report (schema ``hedgerow.weekly_report/1``), or None when the
            api could not give it.
    """

    results: list[ModeResult]
    report_paths: tuple[Path, ...] = ()
    report: dict[str, Any] | None = None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def summarize(
    mode: str,
    records: Sequence[CallRecord],
    warmup_fraction: float = 0.0,
    price_usd_per_mtok: tuple[float, float] | None = None,
) -> ModeResult:
    """Reduce one way's records (in start order) to a ``ModeResult``.

    The first ``warmup_fraction`` of the records is left out. TTFT quantiles are over calls that
    produced a first token; hedge rate = calls with a ``ttft_timeout`` hedge / calls; backup win
    rate = hedged calls won by the backup / hedged calls. With ``price_usd_per_mtok`` (input,
    output USD per million tokens) the overhead share is computed (see :class:`ModeResult`).
    """
    ordered = sorted(records, key=lambda r: r.started_at)
    kept = ordered[int(len(ordered) * warmup_fraction) :]
    ttfts = np.array([r.ttft_s for r in kept if r.ttft_s is not None], dtype=float)
    hedged = [r for r in kept if r.hedge_reason == "ttft_timeout"]

    def q(p: float) -> float | None:
        return float(np.quantile(ttfts, p)) if ttfts.size else None

    spent = [0, 0]  # prompt, completion tokens of every attempt
    extra = [0, 0]  # the same of the attempts that did not win
    for record in kept:
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
        total = spent[0] * usd_in + spent[1] * usd_out
        share = (extra[0] * usd_in + extra[1] * usd_out) / total if total else None

    return ModeResult(
        mode=mode,
        calls=len(kept),
        ttft_p50_s=q(0.50),
        ttft_p90_s=q(0.90),
        ttft_p99_s=q(0.99),
        ttft_max_s=float(ttfts.max()) if ttfts.size else None,
        hedge_rate=len(hedged) / len(kept) if kept else 0.0,
        backup_win_rate=(sum(r.winner == "backup" for r in hedged) / len(hedged)) if hedged else None,
        wasted_completion_tokens=sum(r.wasted_completion_tokens for r in kept),
        errors=sum(r.status != "ok" for r in kept),
        extra_prompt_tokens=extra[0],
        overhead_share=share,
    )


class _Processes:
    """Child processes of the demo, all stopped on exit."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.procs: list[tuple[str, asyncio.subprocess.Process]] = []

    async def start(self, name: str, args: list[str], env: dict[str, str] | None = None) -> None:
        with open(self.workdir / f"{name}.log", "wb") as log:  # the child keeps its own descriptor
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "hedgerow.cli",
                *args,
                stdout=log,
                stderr=asyncio.subprocess.STDOUT,
                stdin=asyncio.subprocess.DEVNULL,
                env={**os.environ, **(env or {})},
                cwd=self.workdir,
            )
        self.procs.append((name, proc))

    def tail(self, name: str, lines: int = 5) -> str:
        path = self.workdir / f"{name}.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return " | ".join(text.strip().splitlines()[-lines:])

    async def stop(self) -> None:
        for _, proc in self.procs:
            if proc.returncode is None:
                proc.terminate()
        for _, proc in self.procs:
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                proc.kill()
                await proc.wait()


async def _wait_ready(http: httpx.AsyncClient, url: str, procs: _Processes, name: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    proc = dict(procs.procs)[name]
    while time.monotonic() < deadline:
        if proc.returncode is not None:
            raise DemoError(f"{name} exited with status {proc.returncode}: {procs.tail(name)}")
        try:
            if (await http.get(url, timeout=2.0)).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        await asyncio.sleep(0.2)
    raise DemoError(f"{name} did not answer {url} within {timeout_s:g} s: {procs.tail(name)}")


class _Recorder:
    """Keeps this process's copy of each record and forwards it to the exporter."""

    def __init__(self, exporter: TelemetryExporter) -> None:
        self.exporter = exporter
        self.records: list[CallRecord] = []

    def submit(self, record: CallRecord) -> None:
        self.records.append(record)
        self.exporter.submit(record)


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


async def _replay(
    mode: str,
    workload: list[TraceRequest],
    upstreams: list[Upstream],
    config: DemoConfig,
    api_url: str,
    on_done: Any,
) -> tuple[list[CallRecord], float | None, int]:
    """Replay ``workload`` through one way's hedging client.

    Returns:
        The way's records, the threshold it last polled (adaptive way only), and how many
        records the api refused.
    """
    if mode == "none":
        policy = HedgePolicy(hedge_after_s=config.fixed_hedge_after_s, max_backups=0, total_timeout_s=300)
    else:
        policy = HedgePolicy(
            hedge_after_s=config.fixed_hedge_after_s, budget=config.budget, budget_burst=10, total_timeout_s=300
        )
    route = f"demo-{mode}"
    poller = ThresholdPoller(api_url, interval_s=1.0, max_stale_s=30.0) if mode == "adaptive" else None
    exporter = TelemetryExporter(api_url, batch_size=200, flush_interval_s=1.0)
    recorder = _Recorder(exporter)
    exporter.start()
    if poller is not None:
        await poller.start()
    final: float | None = None
    try:
        async with HedgingClient(
            upstreams, route=route, policy=policy, thresholds=poller, telemetry=recorder, client_tag=f"demo-{mode}"
        ) as client:

            async def one(i: int, req: TraceRequest) -> None:
                body = {
                    "model": MODEL,
                    "messages": [{"role": "user", "content": f"request {i}"}],
                    "max_tokens": req.output_tokens
                    if config.max_output_tokens is None
                    else min(req.output_tokens, config.max_output_tokens),
                    "hedgerow_prompt_tokens": req.prompt_tokens,
                }
                try:
                    async with client.stream_chat(body, primary=i % len(upstreams)) as stream:
                        async for _ in stream:
                            pass
                except HedgeError:
                    pass  # the record says what happened
                finally:
                    on_done()

            start = time.monotonic()
            tasks = []
            for i, req in enumerate(workload):
                delay = start + req.arrival_s - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.create_task(one(i, req)))
            await asyncio.gather(*tasks)
            if poller is not None:
                found = poller.lookup(route, MODEL)
                final = found[0] if found else None
    finally:
        if poller is not None:
            await poller.aclose()
        await exporter.aclose(timeout_s=30.0)
    return recorder.records, final, exporter.rejected


async def _drain(http: httpx.AsyncClient, upstreams: list[Upstream], timeout_s: float = 60.0) -> None:
    """Wait until no replica has a request queued or running."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        busy = 0
        for upstream in upstreams:
            try:
                stats = (await http.get(upstream.base_url.removesuffix("/v1") + "/stats")).json()
                busy += int(stats.get("waiting", 0)) + int(stats.get("running", 0))
            except (httpx.HTTPError, ValueError):
                pass
        if busy == 0:
            return
        await asyncio.sleep(0.2)


async def _set_demo_price(http: httpx.AsyncClient, api_url: str, config: DemoConfig) -> None:
    usd_in, usd_out = config.price_usd_per_mtok
    body = {"input_usd_per_mtok": usd_in, "output_usd_per_mtok": usd_out, "actor": "hedgerow demo"}
    response = await http.put(f"{api_url}/v1/prices/{MODEL}", json=body)
    if response.status_code not in (200, 201):
        raise DemoError(f"could not set the demo price: HTTP {response.status_code} {response.text[:200]}")


async def _write_report(http: httpx.AsyncClient, api_url: str, directory: Path) -> tuple[tuple[Path, ...], Any]:
    """Fetch the current week's report as JSON and HTML and write both; returns (paths, JSON report)."""
    url = f"{api_url}/v1/reports/weekly"
    as_json = await http.get(url, params={"format": "json"}, timeout=120)
    as_html = await http.get(url, params={"format": "html"}, timeout=120)
    if as_json.status_code != 200 or as_html.status_code != 200:
        raise DemoError(f"could not fetch the weekly report: HTTP {as_json.status_code}/{as_html.status_code}")
    report = as_json.json()
    directory.mkdir(parents=True, exist_ok=True)
    html_path = directory / f"hedgerow-weekly-{report['week']}.html"
    json_path = directory / f"hedgerow-weekly-{report['week']}.json"
    html_path.write_text(as_html.text, encoding="utf-8")
    json_path.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return (html_path, json_path), report


async def run_demo(config: DemoConfig, progress: Any = None) -> DemoRun:
    """Run the demo: one ``ModeResult`` per way (``none``, ``fixed``, ``adaptive``) and its weekly report.

    Args:
        config: the ``DemoConfig``.
        progress: optional ``rich.progress.Progress`` to show progress in.

    Raises:
        DemoError: when a process does not start, the trace cannot be read, or the report cannot
            be written.
    """
    workload = build_workload(config)
    results: list[ModeResult] = []
    report_paths: tuple[Path, ...] = ()
    report: Any = None
    with tempfile.TemporaryDirectory(prefix="hedgerow-demo-") as tmp:
        workdir = Path(tmp)
        procs = _Processes(workdir)
        api_port = _free_port()
        api_url = f"http://127.0.0.1:{api_port}"
        env = {
            "HEDGEROW_CONTROLLER_INTERVAL_S": str(config.controller_interval_s),
            "HEDGEROW_WINDOW_S": str(max(30.0, config.duration_s)),
            "HEDGEROW_SHORT_WINDOW_S": str(max(5.0, config.duration_s / 6)),
            "HEDGEROW_MIN_SAMPLES": "30",
            "HEDGEROW_MAX_STEP_DOWN": "0.5",
            "HEDGEROW_DEFAULT_BUDGET": str(config.budget),
            "HEDGEROW_DEFAULT_HEDGE_AFTER_S": str(config.fixed_hedge_after_s),
        }
        db_url = f"sqlite+aiosqlite:///{workdir / 'hedgerow.db'}"
        upstreams: list[Upstream] = []
        try:
            async with httpx.AsyncClient() as http:
                await procs.start("api", ["serve", "--db", db_url, "--port", str(api_port)], env)
                for i in range(3):
                    port = _free_port()
                    name = f"replica-{chr(ord('a') + i)}"
                    slowdown = config.degraded_slowdown if i == 2 else 1.0
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
                            str(slowdown),
                            "--max-batch",
                            str(config.max_batch),
                            "--tokens-per-chunk",
                            str(config.tokens_per_chunk),
                            "--seed",
                            str(config.seed + i),
                        ],
                    )
                    upstreams.append(Upstream(name, f"http://127.0.0.1:{port}/v1"))
                await _wait_ready(http, f"{api_url}/healthz", procs, "api")
                for upstream in upstreams:
                    await _wait_ready(http, upstream.base_url.removesuffix("/v1") + "/healthz", procs, upstream.name)
                await _set_demo_price(http, api_url, config)
                for mode in MODES:
                    task_id = None
                    if progress is not None:
                        task_id = progress.add_task(f"{mode:>8}", total=len(workload))

                    def done(task_id: Any = task_id) -> None:
                        if progress is not None:
                            progress.advance(task_id)

                    records, final, rejected = await _replay(mode, workload, upstreams, config, api_url, done)
                    result = summarize(mode, records, config.warmup_fraction, config.price_usd_per_mtok)
                    path = await _threshold_path(http, api_url, f"demo-{mode}") if mode == "adaptive" else ()
                    results.append(_with_controller(result, final, path, rejected))
                    await _drain(http, upstreams)
                if config.report_dir is not None:
                    try:
                        report_paths, report = await _write_report(http, api_url, config.report_dir)
                    except OSError as exc:
                        raise DemoError(f"cannot write the report into {config.report_dir}: {exc}") from None
        finally:
            await procs.stop()
    return DemoRun(results, report_paths, report)


async def _threshold_path(http: httpx.AsyncClient, api_url: str, route: str) -> tuple[float, ...]:
    """The values the controller published for ``route``, oldest first (from the api's history)."""
    try:
        response = await http.get(f"{api_url}/v1/routes/{route}/history", params={"model": MODEL, "limit": 10_000})
        rows = response.json()["history"] if response.status_code == 200 else []
    except (httpx.HTTPError, ValueError, KeyError):
        return ()
    return tuple(round(float(row["hedge_after_s"]), 3) for row in reversed(rows) if row["applied"])


def _with_controller(result: ModeResult, final: float | None, path: tuple[float, ...], rejected: int) -> ModeResult:
    values = asdict(result)
    values["final_hedge_after_s"] = final
    values["threshold_path_s"] = path
    values["records_rejected"] = rejected
    return ModeResult(**values)


def write_json(config: DemoConfig, results: Sequence[ModeResult], report_paths: Sequence[Path] = ()) -> None:
    """Write ``{"modes": [...], "config": {...}, "report_files": [...]}`` to ``config.json_path``.

    Raises:
        OSError: when the file cannot be written.
    """
    assert config.json_path is not None
    payload = {
        "modes": [{**asdict(r), "threshold_path_s": list(r.threshold_path_s)} for r in results],
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(config).items()},
        "report_files": [str(p) for p in report_paths],
    }
    config.json_path.write_text(json.dumps(payload, indent=2) + "\n")


def results_table(results: Sequence[ModeResult]) -> Any:
    """A rich Table of the results (seconds shown with 3 decimals)."""
    from rich.table import Table

    def s(value: float | None) -> str:
        return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.3f}"

    table = Table(title="hedgerow demo: TTFT by way (seconds, after warm-up)")
    for column in (
        "way",
        "calls",
        "P50 s",
        "P90 s",
        "P99 s",
        "max s",
        "hedged",
        "backup wins",
        "wasted tok",
        "extra prompt tok",
        "overhead",
        "errors",
        "last hedge_after_s",
    ):
        table.add_column(column, justify="right")
    for r in results:
        table.add_row(
            r.mode,
            str(r.calls),
            s(r.ttft_p50_s),
            s(r.ttft_p90_s),
            s(r.ttft_p99_s),
            s(r.ttft_max_s),
            f"{r.hedge_rate:.1%}",
            "-" if r.backup_win_rate is None else f"{r.backup_win_rate:.0%}",
            str(r.wasted_completion_tokens),
            str(r.extra_prompt_tokens),
            "-" if r.overhead_share is None else f"{r.overhead_share:.1%}",
            str(r.errors),
            s(r.final_hedge_after_s),
        )
    return table
