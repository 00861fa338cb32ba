"""``hedgerow demo``: api, controller, three simulated replicas and hedging clients, three ways compared.

The work is done by :mod:`hedgerow.sim`; this module parses the flags and prints the outcome.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from hedgerow.cli._common import app, fail


@app.command()
def demo(
    trace: Path = typer.Option(
        None, "--trace", metavar="FILE", help="Azure LLM inference trace CSV (TIMESTAMP,ContextTokens,GeneratedTokens)."
    ),
    duration: float = typer.Option(
        None, "--duration", metavar="S", help="Seconds of load per way (default 120, 22 with --quick)."
    ),
    quick: bool = typer.Option(False, "--quick", help="A short run: 22 s of load per way, under two minutes in all."),
    json_path: Path = typer.Option(None, "--json", metavar="FILE", help="Write the results as JSON to this file."),
    rate: float = typer.Option(None, "--rate", metavar="R", help="Arrival rate, requests per second (default 12)."),
    fixed_hedge_after: float = typer.Option(
        None,
        "--fixed-hedge-after",
        metavar="S",
        help="Threshold of the fixed way, seconds (default: the P90 TTFT of the none way before the change).",
    ),
    change: str = typer.Option(
        "degrade",
        "--change",
        metavar="KIND",
        help="What changes halfway through each way: degrade (replica-b slows down too), "
        "recover (the degraded replica-c recovers) or none.",
    ),
    seed: int = typer.Option(0, "--seed", metavar="N", help="Seed of the built-in workload generator."),
    report_dir: Path = typer.Option(
        Path("hedgerow-demo-report"),
        "--report-dir",
        metavar="DIR",
        help="Where the run's weekly report (HTML, JSON) is written.",
    ),
    perf_model: Path = typer.Option(
        None,
        "--perf-model",
        metavar="FILE",
        help="The replicas' Splitwise speed table (default: ../shared/data/traces/splitwise_perf_model.csv, "
        "else the one beside --trace, else the embedded copy).",
    ),
    keep_store: Path = typer.Option(
        None,
        "--keep-store",
        metavar="PATH",
        help="Keep the run's SQLite store at PATH (it is deleted otherwise); open the console on it with "
        "`hedgerow serve --db sqlite:///PATH`.",
    ),
    force: bool = typer.Option(False, "--force", help="Let --keep-store replace an existing file."),
) -> None:
    """Run api, controller, three replicas (one degraded) and hedging clients; compare three ways."""
    import asyncio
    import math
    import os

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from hedgerow.sim.demo import (
        CHANGES,
        DemoConfig,
        DemoError,
        build_workload,
        results_table,
        run_demo,
        write_json,
    )
    from hedgerow.sim.perf_model import default_perf_model_path

    overrides: dict[str, Any] = {"trace_path": trace, "json_path": json_path, "seed": seed, "report_dir": report_dir}
    if duration is not None:
        if not math.isfinite(duration) or not 0 < duration <= 86_400:
            raise fail("--duration: must be a number of seconds in (0, 86400]", 2)
        overrides["duration_s"] = duration
    if rate is not None:
        if not math.isfinite(rate) or not 0 < rate <= 1000:
            raise fail("--rate: must be a number of requests per second in (0, 1000]", 2)
        overrides["rate_per_s"] = rate
    if fixed_hedge_after is not None:
        if not math.isfinite(fixed_hedge_after) or fixed_hedge_after <= 0:
            raise fail("--fixed-hedge-after: must be a number of seconds > 0", 2)
        overrides["fixed_hedge_after_s"] = fixed_hedge_after
    if change not in CHANGES:
        raise fail(f"--change: must be one of {', '.join(CHANGES)}, got {change!r}", 2)
    overrides["change"] = change
    if trace is not None and not trace.is_file():
        raise fail(f"--trace: not a file: {trace}", 2)
    if perf_model is not None and not perf_model.is_file():
        raise fail(f"--perf-model: not a file: {perf_model}", 2)
    if perf_model is None and trace is not None and default_perf_model_path() is None:
        beside = trace.resolve().parent / "splitwise_perf_model.csv"
        perf_model = beside if beside.is_file() else None
    overrides["perf_model_path"] = perf_model
    if keep_store is not None:  # checked now, not after minutes of load
        keep_store = keep_store.expanduser().resolve()
        if keep_store.is_dir():
            raise fail(f"--keep-store: {keep_store} is a folder; give a file path", 2)
        if keep_store.exists() and not force:
            raise fail(f"--keep-store: {keep_store} exists; give --force to replace it", 2)
        if not keep_store.parent.is_dir():
            raise fail(f"--keep-store: folder does not exist: {keep_store.parent}", 2)
        if not os.access(keep_store.parent, os.W_OK):
            raise fail(f"--keep-store: folder is not writable: {keep_store.parent}", 2)
        overrides["keep_store_path"] = keep_store
    elif force:
        raise fail("--force: only with --keep-store", 2)
    if json_path is not None:
        parent = json_path.resolve().parent
        if not parent.is_dir():
            raise fail(f"--json: folder does not exist: {parent}", 2)
        if not os.access(parent, os.W_OK):
            raise fail(f"--json: folder is not writable: {parent}", 2)
    if report_dir is not None:
        # made now, not after minutes of load: a folder that cannot be made fails the flag at once
        try:
            report_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise fail(f"--report-dir: cannot make the folder {report_dir}: {exc.strerror or exc}", 2) from None
        if not os.access(report_dir, os.W_OK):
            raise fail(f"--report-dir: folder is not writable: {report_dir}", 2)
    config = DemoConfig.quick(**overrides) if quick else DemoConfig(**overrides)
    if trace is not None:
        try:  # read now (the rows one way replays): a file that is not a trace fails the flag at once
            build_workload(config)
        except DemoError as exc:
            raise fail(str(exc), 2) from None
    console = Console(width=max(120, Console().width))
    shift = config.change_of_conditions()
    fixed = (
        f"{config.fixed_hedge_after_s:g} s (--fixed-hedge-after)"
        if config.fixed_hedge_after_s is not None
        else "the P90 TTFT of the none way before the change"
    )
    # One phrase per line, each short enough for an 80-column terminal: nothing wraps mid-phrase.
    for line in (
        "hedgerow demo: three ways (none, fixed, adaptive) replay the same calls",
        f"  workload: {f'trace {trace}' if trace else 'built-in generator (Azure conv trace statistics)'}",
        f"  load: {config.duration_s:g} s per way at {config.rate_per_s:g} req/s",
        f"  replicas: 3, replica-c {config.degraded_slowdown:g}x slower",
        f"  halfway through each way: {shift.describe()}",
        f"  budget: {config.budget:.0%} of calls may hedge",
        f"  fixed way's hedge_after_s: {fixed}",
    ):
        console.print(line, highlight=False, soft_wrap=True)
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    ) as progress:
        try:
            run = asyncio.run(run_demo(config, progress, notify=lambda text: progress.console.print(text)))
        except DemoError as exc:
            raise fail(str(exc), 1) from None
    results = run.results
    console.print(results_table(results, config.budget))
    for result in results:
        if result.threshold_path_s:
            path = " -> ".join(f"{value:g}" for value in result.threshold_path_s)
            console.print(f"{result.mode} thresholds published by the controller (s): {path}", highlight=False)
    console.print("")
    for sentence in run.sentences:
        console.print(sentence, highlight=False)
    console.print("")
    if run.report is not None:
        from hedgerow.controller.report.report_render import summary_text

        console.print(
            "The weekly report has one route per way (demo-none, demo-fixed, demo-adaptive); "
            "its totals pool the three ways:",
            highlight=False,
        )
        console.print(summary_text(run.report))
        console.print(f"weekly report of the run: {', '.join(str(p) for p in run.report_paths)}", soft_wrap=True)
    if json_path is not None:
        try:
            write_json(config, run)
        except OSError as exc:
            raise fail(f"--json: cannot write {json_path}: {exc}", 1) from None
        console.print(f"results written to {json_path}", soft_wrap=True)
    if run.store_path is not None:
        import shlex

        console.print(f"the run's store is kept at {run.store_path}; open the console on it with:", soft_wrap=True)
        console.print(f"  hedgerow serve --db {shlex.quote(f'sqlite:///{run.store_path}')}", soft_wrap=True)
        console.print("  then http://127.0.0.1:8400/ui/routes", soft_wrap=True, highlight=False)
