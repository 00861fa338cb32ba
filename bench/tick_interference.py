"""Benchmark: how much a running controller tick slows the polls and ingests of its own ``serve``.

The controller tick runs inside ``hedgerow serve`` (``hedgerow.controller.scheduler``), beside
the api that answers clients' threshold polls and record batches. For each route count (default
100 and 1,000 routes x 1,000 calls each, ``bench/controller_tick.py``'s realistic records and
seeding), this builds a store (a SQLite file, or a PostgreSQL database of its own with ``--db``),
starts a real ``hedgerow serve`` on it with the scheduled tick an hour away
(``HEDGEROW_CONTROLLER_INTERVAL_S=3600``) and an admin token, runs one warm-up tick, then, round
after round, alternates two phases with the same probes:

- idle: for ``--idle-seconds``, nothing but the probes;
- tick: ``POST /v1/controller/run`` (one tick, answered when it is done) with the probes running
  until it returns.

Each mode of ``--tick-in`` (default ``loop,process``: ``HEDGEROW_CONTROLLER_TICK_IN``, the tick on
the api's event loop or in a worker process) gets a ``serve`` of its own on the same seeded store,
one after the other, so the rows of one route count compare the modes in the same run.

``--trigger scheduled`` (with ``admin``, the default) adds, for the process mode, a ``serve`` whose
scheduler ticks every ``--interval`` seconds, as in production: no admin call, so no answer of
1,000 decisions to write beside the polls. The probes run for ``--rounds`` + 1 intervals; a
tick's span is when the worker process used CPU (its ``/proc`` times sampled every 0.1 s), the
first tick is the warm-up, and a probe counts as idle only when it started over a second away
from every span.

Probe kinds are also reported apart (``list``: ``GET /v1/thresholds``; ``route``: one route's),
with each round's slowest probes and their start within the tick, and the times the bench's own
event loop ran over 20 ms late (a slow probe then may be the bench's, not the server's).

Probes are open loop (each fired on schedule as its own task, whether or not the earlier ones
have been answered, so a stalled server is not hidden by probes that wait their turn): polls at
``--poll-rate`` per second alternating ``GET /v1/thresholds`` and ``GET /v1/thresholds/{route}``,
and ingests at ``--ingest-rate`` per second, each ``POST /v1/calls`` of 10 new records, from a
second client. Latency is from send to the full answer. Per route count it reports the tick's
wall time (median over rounds), poll and ingest p50/p99 idle and during ticks (over all rounds),
their ratio, and the non-2xx answers.

Run: ``python bench/tick_interference.py [--routes 100,1000] [--calls-per-route 1000] [--rounds 3]
[--idle-seconds 5] [--poll-rate 20] [--ingest-rate 5] [--tick-in loop,process]
[--trigger admin,scheduled] [--interval 20]
[--db postgresql+asyncpg://...] [--quick]
[--json bench/results/tick_interference.json]``. ``--quick``: 20 routes x 50 calls, one round of
1 s idle, admin ticks only (a smoke run). Prints a table and writes JSON. Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Coroutine
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from controller_tick import seed, synthetic_records

from hedgerow.controller.store.db import upgrade_database
from tests.conftest import create_pg_database, drop_pg_database
from tests.serve_process import running_serve

#: The bench's admin bearer token (admin is accepted by every endpoint).
TOKEN = "bench-interference-admin-token"
#: Records in each probe's ingest batch.
INGEST_BATCH = 10


@dataclasses.dataclass
class Samples:
    """Latencies (seconds) and non-2xx/transport-error counts of one phase's probes."""

    poll_s: list[float] = dataclasses.field(default_factory=list)
    ingest_s: list[float] = dataclasses.field(default_factory=list)
    #: (probe kind: "list", "route" or "ingest"; its start in seconds after the phase began; latency s).
    probes: list[tuple[str, float, float]] = dataclasses.field(default_factory=list)
    began: float = dataclasses.field(default_factory=time.perf_counter)
    #: (start s after the phase began, lateness s) of the bench's own loop over 20 ms, from a task
    #: sleeping 5 ms at a time: a probe that looks slow while its own client stalled is not the server's.
    client_lags: list[tuple[float, float]] = dataclasses.field(default_factory=list)
    poll_errors: int = 0
    ingest_errors: int = 0


def percentile(values: list[float], q: float) -> float | None:
    """The ``q``-th percentile (0-100) of ``values``, or None when there are none."""
    return float(np.percentile(values, q)) if values else None


class Prober:
    """Fires polls and ingest batches at fixed rates against one server, open loop.

    Args:
        base: the server's root url.
        routes: route names to poll one by one (``GET /v1/thresholds/{route}``).
        poll_rate: polls per second (alternating the list and one route).
        ingest_rate: ingest batches per second.
    """

    def __init__(self, base: str, routes: list[str], poll_rate: float, ingest_rate: float) -> None:
        headers = {"authorization": f"Bearer {TOKEN}"}
        limits = httpx.Limits(max_connections=200, max_keepalive_connections=50)
        self.pollers = httpx.AsyncClient(base_url=base, headers=headers, timeout=300, limits=limits)
        self.ingesters = httpx.AsyncClient(base_url=base, headers=headers, timeout=300, limits=limits)
        self.routes = routes
        self.poll_rate = poll_rate
        self.ingest_rate = ingest_rate
        self._polls = 0
        self._batches = 0

    async def close(self) -> None:
        """Close both clients."""
        await self.pollers.aclose()
        await self.ingesters.aclose()

    async def _poll(self, samples: Samples) -> None:
        index = self._polls
        self._polls += 1
        path = "/v1/thresholds" if index % 2 == 0 else f"/v1/thresholds/{self.routes[index // 2 % len(self.routes)]}"
        started = time.perf_counter()
        try:
            answer = await self.pollers.get(path)
            ok = answer.is_success
        except httpx.TransportError:
            ok = False
        samples.poll_s.append(time.perf_counter() - started)
        samples.probes.append(("list" if index % 2 == 0 else "route", started - samples.began, samples.poll_s[-1]))
        samples.poll_errors += not ok

    async def _ingest(self, samples: Samples) -> None:
        index = self._batches
        self._batches += 1
        now = datetime.now(UTC)
        records = [
            dataclasses.replace(r, request_id=f"probe-{os.getpid()}-{index}-{i}",
                                route=self.routes[(index + i) % len(self.routes)], started_at=now)
            for i, r in enumerate(synthetic_records(INGEST_BATCH, now, seed=index))
        ]  # fmt: skip
        body = json.dumps({"calls": [r.to_dict() for r in records]}).encode()
        started = time.perf_counter()
        try:
            answer = await self.ingesters.post("/v1/calls", content=body, headers={"content-type": "application/json"})
            ok = answer.is_success
        except httpx.TransportError:
            ok = False
        samples.ingest_s.append(time.perf_counter() - started)
        samples.probes.append(("ingest", started - samples.began, samples.ingest_s[-1]))
        samples.ingest_errors += not ok

    async def _fire(self, rate: float, probe: Callable[[Samples], Coroutine[Any, Any, None]], samples: Samples,
                    stop: asyncio.Event, tasks: list[asyncio.Task[None]]) -> None:  # fmt: skip
        interval = 1.0 / rate
        next_at = time.perf_counter()
        while not stop.is_set():
            tasks.append(asyncio.create_task(probe(samples)))
            next_at += interval
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=max(0.0, next_at - time.perf_counter()))

    async def during(self, work: Awaitable[Any]) -> tuple[Samples, Any, float]:
        """Probe until ``work`` finishes, then wait for every probe fired to be answered.

        Returns:
            ``(samples, work's result, work's wall time in seconds)``.
        """
        samples = Samples()
        stop = asyncio.Event()
        tasks: list[asyncio.Task[None]] = []
        firing = [
            asyncio.create_task(self._fire(self.poll_rate, self._poll, samples, stop, tasks)),
            asyncio.create_task(self._fire(self.ingest_rate, self._ingest, samples, stop, tasks)),
        ]

        async def watch_lag() -> None:
            while not stop.is_set():
                before = time.perf_counter()
                await asyncio.sleep(0.005)
                late = time.perf_counter() - before - 0.005
                if late > 0.02:
                    samples.client_lags.append((before - samples.began, late))

        firing.append(asyncio.create_task(watch_lag()))
        started = time.perf_counter()
        try:
            result = await work
        finally:
            elapsed = time.perf_counter() - started
            stop.set()
            await asyncio.gather(*firing)
            await asyncio.gather(*tasks)
        return samples, result, elapsed


async def tick(client: httpx.AsyncClient) -> bytes:
    """Run one tick through ``POST /v1/controller/run``; returns the answer's body, unparsed
    (:func:`decisions_of` reads it after the probes stopped, so that parsing it does not delay
    the bench's own probes).

    Raises:
        RuntimeError: the server refused.
    """
    answer = await client.post("/v1/controller/run", headers={"authorization": f"Bearer {TOKEN}"})
    if not answer.is_success:
        raise RuntimeError(f"POST /v1/controller/run: {answer.status_code} {answer.text[:300]}")
    return answer.content


def decisions_of(body: bytes) -> int | None:
    """The decisions a ``POST /v1/controller/run`` answer says were written.

    Returns:
        Their count, or None when the tick was not published (``ran`` false: the serve lost the
        lease, e.g. its renewals starved while the tick ran; the round still counts).
    """
    document = json.loads(body)
    return len(document["history"]) if document["ran"] else None


def summary(phase: str, samples: Samples) -> dict[str, Any]:
    """p50/p99 (seconds), counts and errors of one phase's polls and ingests, merged over rounds;
    also p99 per probe kind (``list``: ``GET /v1/thresholds``, ``route``: one route's)."""
    kinds = {kind: [lat for k, _, lat in samples.probes if k == kind] for kind in ("list", "route")}
    return {
        f"{phase}_list_p99_s": percentile(kinds["list"], 99),
        f"{phase}_route_p99_s": percentile(kinds["route"], 99),
        f"{phase}_poll_p50_s": percentile(samples.poll_s, 50),
        f"{phase}_poll_p99_s": percentile(samples.poll_s, 99),
        f"{phase}_polls": len(samples.poll_s),
        f"{phase}_poll_errors": samples.poll_errors,
        f"{phase}_ingest_p50_s": percentile(samples.ingest_s, 50),
        f"{phase}_ingest_p99_s": percentile(samples.ingest_s, 99),
        f"{phase}_ingests": len(samples.ingest_s),
        f"{phase}_ingest_errors": samples.ingest_errors,
    }


def add_ratios(result: dict[str, Any]) -> None:
    """Set ``{poll,ingest}_{p50,p99}_ratio`` of ``result`` (its :func:`summary` of both phases):
    the tick's quantile over the idle one, None when either is missing."""
    for probe in ("poll", "ingest"):
        for q in ("p50", "p99"):
            a, b = result[f"idle_{probe}_{q}_s"], result[f"tick_{probe}_{q}_s"]
            result[f"{probe}_{q}_ratio"] = b / a if a and b is not None else None


def merge(into: Samples, part: Samples) -> None:
    """Add ``part``'s latencies and errors to ``into``."""
    into.poll_s += part.poll_s
    into.ingest_s += part.ingest_s
    into.probes += part.probes
    into.poll_errors += part.poll_errors
    into.ingest_errors += part.ingest_errors


async def measure(url: str, workdir: Path, routes: int, calls: int, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Seed a fresh store at ``url``; for each ``--tick-in`` mode, serve it and probe it idle and
    during ticks, interleaved. Returns one result per mode."""
    await asyncio.to_thread(upgrade_database, url)
    seed_s = await seed(url, routes, calls, datetime.now(UTC))
    results = []
    for mode in args.tick_in:
        for trigger in args.trigger:
            if trigger == "scheduled" and mode != "process":
                continue  # the tick's span is told by its worker's CPU: process mode only
            print(f"  {routes:>5} routes, tick in {mode}, {trigger}:", flush=True)
            result = await measure_mode(url, workdir, routes, calls, mode, trigger, args)
            results.append({"tick_in": mode, "trigger": trigger, **result, "seed_s": seed_s})
    return results


def children_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of the child processes of ``pid`` (Linux ``/proc``; 0 elsewhere)."""
    total = 0
    for children in Path(f"/proc/{pid}/task").glob("*/children"):
        for child in children.read_text().split():
            with contextlib.suppress(OSError):
                fields = Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()
                total += int(fields[11]) + int(fields[12])  # utime, stime: fields 14 and 15 of stat(5)
    return total / os.sysconf("SC_CLK_TCK")


async def tick_spans(pid: int, stop: asyncio.Event, began: float) -> list[tuple[float, float]]:
    """The spans (seconds after ``began``) in which the tick worker of serve ``pid`` computed: its
    children's CPU sampled every 0.1 s, busy when a sample used over 30 ms, busy samples less than
    2 s apart merged (a tick waits for the store at times), spans under 0.2 s dropped."""
    spans: list[tuple[float, float]] = []
    before, at = children_cpu_s(pid), time.perf_counter()
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=0.1)
        now_cpu, now = children_cpu_s(pid), time.perf_counter()
        if now_cpu - before > 0.03:
            if spans and at - began - spans[-1][1] < 2.0:
                spans[-1] = (spans[-1][0], now - began)
            else:
                spans.append((at - began, now - began))
        before, at = now_cpu, now
    return [(a, b) for a, b in spans if b - a >= 0.2]


def split_by_spans(
    samples: Samples, spans: list[tuple[float, float]], margin_s: float = 1.0, after_s: float = 0.0
) -> tuple[Samples, Samples]:
    """``samples``' probes split into (idle, tick): tick when a probe started within a span, idle
    when it started over ``margin_s`` away from every span; those started before ``after_s`` and
    the others are left out."""
    idle, busy = Samples(), Samples()
    for kind, at, latency in samples.probes:
        if at < after_s:
            continue
        inside = any(a <= at <= b for a, b in spans)
        near = any(a - margin_s <= at <= b + margin_s for a, b in spans)
        target = busy if inside else idle if not near else None
        if target is None:
            continue
        target.probes.append((kind, at, latency))
        (target.ingest_s if kind == "ingest" else target.poll_s).append(latency)
    return idle, busy


async def measure_scheduled(
    url: str, workdir: Path, routes: int, calls: int, names: list[str], env: dict[str, str], args: argparse.Namespace
) -> dict[str, Any]:
    """Serve the store with ticks every ``args.interval`` s run by the scheduler (no admin call, so
    no answer to write) and probe it for ``args.rounds`` + 1 intervals; the probes are split by
    the spans in which the tick worker used CPU (:func:`tick_spans`), from the end of the first."""
    async with running_serve(url, workdir, logs="serve-scheduled", **env) as served:
        prober = Prober(served.base, names, args.poll_rate, args.ingest_rate)
        stop = asyncio.Event()
        try:
            began = time.perf_counter()
            watching = asyncio.create_task(tick_spans(served.process.pid, stop, began))
            samples, _, _ = await prober.during(asyncio.sleep(args.interval * (args.rounds + 1)))
            stop.set()
            spans = await watching
        finally:
            await prober.close()
    offset = samples.began - began
    spans = [(a - offset, b - offset) for a, b in spans]  # seconds after the probes began
    # the first tick is the warm-up (the worker's first store reads), as in admin mode
    idle, busy = split_by_spans(samples, spans[1:], after_s=spans[0][1] + 1.0 if spans else 0.0)
    for a, b in spans:
        print(f"  {routes:>5} routes: scheduled tick computed {a:.1f}-{b:.1f} s ({b - a:.2f} s)", flush=True)
    result: dict[str, Any] = {
        "routes": routes,
        "calls_per_route": calls,
        "tick_s_median": statistics.median([b - a for a, b in spans]) if spans else None,
        "tick_s_runs": [b - a for a, b in spans],
        "tick_spans_s": spans,
        "ticks_not_published": None,
        **summary("idle", idle),
        **summary("tick", busy),
    }
    add_ratios(result)
    return result


async def measure_mode(
    url: str, workdir: Path, routes: int, calls: int, mode: str, trigger: str, args: argparse.Namespace
) -> dict[str, Any]:
    """Serve the seeded store at ``url`` with the tick in ``mode`` and probe it idle and during
    ticks (run through the admin endpoint, or ``trigger == "scheduled"``: by the scheduler)."""
    env = {
        "HEDGEROW_CONTROLLER_TICK_IN": mode,
        "HEDGEROW_CONTROLLER_INTERVAL_S": "3600",
        "HEDGEROW_TOKENS": f"bench={TOKEN}:admin",
        "HEDGEROW_MAX_ROUTES": str(max(routes, 1000)),
        "HEDGEROW_WINDOW_S": "3600",
    }
    names = [f"route-{r}" for r in range(routes)]
    if trigger == "scheduled":
        env["HEDGEROW_CONTROLLER_INTERVAL_S"] = str(args.interval)
        return await measure_scheduled(url, workdir, routes, calls, names, env, args)
    idle, busy = Samples(), Samples()
    ticks: list[float] = []
    rounds: list[dict[str, Any]] = []
    async with running_serve(url, workdir, logs=f"serve-{mode}", **env) as served:
        prober = Prober(served.base, names, args.poll_rate, args.ingest_rate)
        try:
            async with httpx.AsyncClient(base_url=served.base, timeout=3600) as control:
                started = time.perf_counter()
                decisions = decisions_of(await tick(control))  # warm-up: publishes thresholds, warms caches
                warmup_s = time.perf_counter() - started
                for index in range(args.rounds):
                    part, _, _ = await prober.during(asyncio.sleep(args.idle_seconds))
                    merge(idle, part)
                    load_idle = os.getloadavg()[0]
                    part_busy, body, tick_s = await prober.during(tick(control))
                    decisions = decisions_of(body)
                    merge(busy, part_busy)
                    ticks.append(tick_s)
                    slowest = sorted(part_busy.probes, key=lambda p: -p[2])[:8]
                    rounds.append({"round": index, "tick_s": tick_s, "slowest": slowest, "decisions": decisions,
                                   "load_1m_idle": load_idle, "load_1m_tick": os.getloadavg()[0],
                                   **summary("idle", part), **summary("tick", part_busy)})  # fmt: skip
                    print(
                        f"  {routes:>5} routes round {index}: tick {tick_s:.2f} s "
                        f"({'not published: lease lost' if decisions is None else f'{decisions} decisions'}); "
                        f"polls {len(part.poll_s)} idle / {len(part_busy.poll_s)} during "
                        f"(load {os.getloadavg()[0]:.1f}); slowest during: "
                        + ", ".join(f"{k}@{at:.2f}s={lat * 1e3:.0f}ms" for k, at, lat in slowest)
                        + "; bench loop late: "
                        + (", ".join(f"@{at:.2f}s={lat * 1e3:.0f}ms" for at, lat in part_busy.client_lags) or "never"),
                        flush=True,
                    )
        finally:
            await prober.close()
    result: dict[str, Any] = {
        "routes": routes,
        "calls_per_route": calls,
        "warmup_tick_s": warmup_s,
        "tick_s_median": statistics.median(ticks),
        "tick_s_runs": ticks,
        "ticks_not_published": sum(r["decisions"] is None for r in rounds),
        **summary("idle", idle),
        **summary("tick", busy),
    }
    add_ratios(result)
    result["rounds"] = rounds
    return result


def fmt_ms(value: float | None) -> str:
    """Seconds as milliseconds with one decimal, or ``-``."""
    return "-" if value is None else f"{value * 1e3:.1f}"


def fmt_ratio(value: float | None) -> str:
    """A ratio as ``12.3x``, or ``-``."""
    return "-" if value is None else f"{value:.1f}x"


async def main(args: argparse.Namespace) -> None:
    """Measure every route count on SQLite (or PostgreSQL with ``--db``); print and save the results."""
    store = "postgresql" if args.db else "sqlite"
    results: list[dict[str, Any]] = []
    for routes in [int(x) for x in args.routes.split(",")]:
        with tempfile.TemporaryDirectory() as tmp:
            if args.db:
                url = await create_pg_database(args.db, "hedgerow_bench")
                try:
                    measured = await measure(url, Path(tmp), routes, args.calls_per_route, args)
                finally:
                    await drop_pg_database(url)
            else:
                measured = await measure(f"sqlite+aiosqlite:///{tmp}/bench.db", Path(tmp), routes,
                                         args.calls_per_route, args)  # fmt: skip
        results += [{"store": store, **result} for result in measured]
    print()
    print(f"{'store':<10} {'tick in':<8} {'trigger':<9} {'routes':>6} {'calls/rt':>8} {'tick s':>7} | "
          f"{'poll p50 ms':>17} {'poll p99 ms':>19} | {'ingest p50 ms':>17} {'ingest p99 ms':>19} "
          "| errors")  # fmt: skip
    print(f"{'':<10} {'':<8} {'':<9} {'':>6} {'':>8} {'':>7} | {'idle / tick (x)':>17} {'idle / tick (x)':>19} | "
          f"{'idle / tick (x)':>17} {'idle / tick (x)':>19} |")  # fmt: skip
    for r in results:
        cells = []
        for probe in ("poll", "ingest"):
            for q in ("p50", "p99"):
                cells.append(f"{fmt_ms(r[f'idle_{probe}_{q}_s'])} / {fmt_ms(r[f'tick_{probe}_{q}_s'])} "
                             f"({fmt_ratio(r[f'{probe}_{q}_ratio'])})")  # fmt: skip
        errors = sum(r[f"{phase}_{probe}_errors"] for phase in ("idle", "tick") for probe in ("poll", "ingest"))
        print(f"{r['store']:<10} {r['tick_in']:<8} {r['trigger']:<9} {r['routes']:>6} {r['calls_per_route']:>8} "
              f"{r['tick_s_median']:>7.2f} | "
              f"{cells[0]:>17} {cells[1]:>19} | {cells[2]:>17} {cells[3]:>19} | {errors}")  # fmt: skip
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        document = {"benchmark": "tick_interference", "python": platform.python_version(), "store": store,
                    "rounds": args.rounds, "idle_seconds": args.idle_seconds, "poll_rate": args.poll_rate,
                    "ingest_rate": args.ingest_rate, "ingest_batch": INGEST_BATCH, "cpus": os.cpu_count(),
                    "tick_in": args.tick_in, "load_1m_end": os.getloadavg()[0],
                    "results": results}  # fmt: skip
        args.json.write_text(json.dumps(document, indent=2) + "\n")
        print(f"written to {args.json}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line; ``--quick`` sets small defaults for what was not given."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--routes", default=None, help="comma-separated route counts (default 100,1000)")
    parser.add_argument("--calls-per-route", type=int, default=None, help="calls per route (default 1000)")
    parser.add_argument("--rounds", type=int, default=None, help="idle + tick rounds per route count (default 3)")
    parser.add_argument("--idle-seconds", type=float, default=None, help="seconds of each idle phase (default 5)")
    parser.add_argument("--poll-rate", type=float, default=20.0, help="polls per second")
    parser.add_argument("--ingest-rate", type=float, default=5.0, help="ingest batches (10 records) per second")
    parser.add_argument(
        "--tick-in",
        default="loop,process",
        help="HEDGEROW_CONTROLLER_TICK_IN modes, comma-separated (default loop,process)",
    )
    parser.add_argument(
        "--trigger",
        default=None,
        help="how ticks run: admin (POST /v1/controller/run, answered with every decision) and/or "
        "scheduled (by the scheduler every --interval s; process mode only); default both (admin with --quick)",
    )
    parser.add_argument("--interval", type=float, default=20.0, help="seconds between scheduled ticks (default 20)")
    parser.add_argument("--db", default=None, help="PostgreSQL server url (a database of the bench's own is made)")
    parser.add_argument("--quick", action="store_true", help="20 routes x 50 calls, 1 round of 1 s idle")
    parser.add_argument("--json", type=Path, default=Path("bench/results/tick_interference.json"))
    args = parser.parse_args(argv)
    small = {"routes": "20", "calls_per_route": 50, "rounds": 1, "idle_seconds": 1.0, "trigger": "admin"}
    full = {"routes": "100,1000", "calls_per_route": 1000, "rounds": 3, "idle_seconds": 5.0}
    full["trigger"] = "admin,scheduled"
    for name, value in (small if args.quick else full).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    for name in ("poll_rate", "ingest_rate", "idle_seconds"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    args.tick_in = [mode.strip() for mode in args.tick_in.split(",") if mode.strip()]
    if not args.tick_in or any(mode not in ("loop", "process") for mode in args.tick_in):
        parser.error(f"--tick-in takes loop and/or process, got {','.join(args.tick_in) or 'nothing'}")
    args.trigger = [trigger.strip() for trigger in args.trigger.split(",") if trigger.strip()]
    if not args.trigger or any(trigger not in ("admin", "scheduled") for trigger in args.trigger):
        parser.error(f"--trigger takes admin and/or scheduled, got {','.join(args.trigger) or 'nothing'}")
    if args.interval <= 0:
        parser.error(f"--interval must be positive, got {args.interval}")
    if args.rounds < 1 or args.calls_per_route < 1:
        parser.error("--rounds and --calls-per-route must be at least 1")
    return args


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
