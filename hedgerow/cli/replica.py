"""``hedgerow replica``: one simulated OpenAI-compatible LLM replica (:mod:`hedgerow.sim.replica`)."""

from __future__ import annotations

import typer

from hedgerow.cli._common import app, fail


@app.command()
def replica(
    port: int = typer.Option(..., "--port", metavar="P", help="TCP port to listen on (0 = pick a free one)."),
    host: str = typer.Option("127.0.0.1", "--host", metavar="HOST", help="Interface to bind."),
    time_scale: float = typer.Option(
        1.0, "--time-scale", metavar="X", help="Factor on every service time (0.1 = 10x faster than the GPU)."
    ),
    slowdown: float = typer.Option(1.0, "--slowdown", metavar="F", help="Degradation factor on every service time."),
    max_batch: int = typer.Option(64, "--max-batch", metavar="N", help="Largest running batch."),
    tokens_per_chunk: int = typer.Option(
        1, "--tokens-per-chunk", metavar="N", help="Tokens per SSE chunk after the first."
    ),
    name: str = typer.Option(
        "replica", "--name", metavar="NAME", help="Replica name (stats, logs, X-Hedgerow-Replica)."
    ),
    error_rate: float = typer.Option(0.0, "--error-rate", metavar="F", help="Fraction of requests answered HTTP 503."),
    stall_rate: float = typer.Option(
        0.0, "--stall-rate", metavar="F", help="Fraction of requests that stall once mid-stream."
    ),
    stall_s: float = typer.Option(0.0, "--stall-s", metavar="S", help="Length of such a stall, wall seconds."),
    seed: int = typer.Option(None, "--seed", metavar="N", help="Seed of the random choices."),
    perf_model: str = typer.Option(
        None,
        "--perf-model",
        metavar="FILE",
        help=(
            "Splitwise perf_model.csv (default: ../shared/data/traces/splitwise_perf_model.csv, "
            "else an embedded table)."
        ),
    ),
) -> None:
    """Serve one simulated OpenAI-compatible LLM replica: chat completions and the Responses API.

    Continuous batching with Splitwise service times; streamed or whole answers.
    """
    from pathlib import Path

    from hedgerow.sim.perf_model import PerfModelError
    from hedgerow.sim.replica import ReplicaConfig, serve_replica

    if not 0 <= port <= 65535:
        raise fail(f"--port must be in [0, 65535], got {port}", 2)
    if perf_model is not None and not Path(perf_model).is_file():
        raise fail(f"--perf-model: file not found: {perf_model}", 2)
    try:
        config = ReplicaConfig(
            name=name,
            time_scale=time_scale,
            slowdown=slowdown,
            max_batch=max_batch,
            tokens_per_chunk=tokens_per_chunk,
            error_rate=error_rate,
            stall_rate=stall_rate,
            stall_s=stall_s,
            seed=seed,
            perf_model_path=perf_model,
        )
    except ValueError as exc:
        raise fail(f"--{str(exc).split(' ', 1)[0].replace('_', '-')}: {str(exc).split(' ', 1)[1]}", 2) from None
    try:
        serve_replica(config, host, port)
    except PerfModelError as exc:
        raise fail(str(exc), 2) from None
    except OSError as exc:
        raise fail(str(exc), 1) from None
    except KeyboardInterrupt:
        pass
