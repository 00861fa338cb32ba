"""Benchmark: what one controller tick costs as routes and calls per route grow.

The tick (``hedgerow.controller.jobs.run_tick``) reads every route's minute aggregates of the
window in one query (``jobs.observe_routes``), runs Kaplan-Meier, the drift tests and the policy
per route over the weighted (minute, bucket) entries and the window's latest
``replay_max_calls`` calls, and writes a threshold and a history row per route in one
transaction. This measures it for a grid of routes x calls per route (default 10, 100, 1,000
routes x 1,000 and 10,000 calls each, in the last 30 minutes; realistic hedged records: ~10%
hedged, censored primaries included), on a SQLite file and on PostgreSQL when
``HEDGEROW_TEST_DATABASE_URL`` (or ``--pg``) names a server (a database of the bench's own,
dropped after). Issue 14 part 2 asks for a tick at 1,000 routes x 1k calls within 1 s and at
10k calls within 1.3x that.

Beside each tick, interleaved with it, the same run times the floor of any raw-row tick: one
SQLAlchemy Core query fetching the window's primary attempts (route, TTFT or censoring time)
without ORM objects, estimation or writes (``read rows``); and the store side of the
histogram tick: every route's minute aggregates of the window read and decoded into per-route
numpy arrays (``hedgerow.controller.store._minute_window.read_minutes``, ``read minutes``), whose
cost grows with routes x minutes x non-empty buckets, not with calls.

Cells whose calls in all (routes x calls) pass ``--max-total-calls`` (default 1,000,000; the
1,000 x 10,000 cell is 10 million calls, ~10 minutes of seeding and, from the 100-route cell's
11-17 ms of CPU a route, a tick of 11-17 s of CPU on this machine) are listed as skipped, not run.

Each cell ticks every ``--observe`` mode in turn on the same store (``HEDGEROW_CONTROLLER_OBSERVE``:
``raw`` reads the last one to two minutes of calls one by one, ``bounded`` each route's latest 100
calls; default both) and reports each mode's median wall and CPU time, and the CPU ratio of each
cell to the one with a tenth of its calls per route (issue 30 asks <= 1.3 at 10x the calls).

Run: ``python bench/controller_tick.py [--routes 10,100,1000] [--calls 1000,10000] [--observe raw,bounded]
[--repeats 3] [--no-tick] [--max-total-calls 1000000] [--json bench/results/controller_tick.json]``.
Prints a table (median of ``--repeats``) and writes JSON. Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy import select, text

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hedgerow.client.records import AttemptRecord, AttemptRole, CallRecord, HedgeReason
from hedgerow.controller.jobs import run_tick
from hedgerow.controller.store._minute_window import read_minutes
from hedgerow.controller.store.db import make_engine, make_sessionmaker, upgrade_database
from hedgerow.controller.store.ingest import ingest_calls, route_defaults
from hedgerow.controller.store.models import Attempt, Call
from hedgerow.settings import Settings


def synthetic_records(n: int, now: datetime, seed: int = 0) -> list[CallRecord]:
    """``n`` call records of route ``bench`` spread over the last 30 minutes before ``now``.

    Primary TTFT is lognormal (median 0.3 s, sigma 0.8); a call whose primary is slower than
    1.0 s hedges; the backup's TTFT is lognormal too; the first token wins.
    """
    rng = np.random.default_rng(seed)
    primary = rng.lognormal(np.log(0.3), 0.8, n)
    backup = rng.lognormal(np.log(0.3), 0.8, n)
    offsets = np.sort(rng.uniform(0, 1800, n))
    records = []
    for i in range(n):
        started = now - timedelta(seconds=1800 - offsets[i])
        p = float(primary[i])
        attempts: tuple[AttemptRecord, ...]
        winner: AttemptRole
        hedged = False
        hedge_reason: HedgeReason | None = None
        if p <= 1.0:
            first = p
            attempts = (AttemptRecord("a", "primary", 0.0, first, first + 2.0, "won", 200, None, 50),)
            winner = "primary"
        else:
            b_first = 1.0 + float(backup[i])
            first = min(p, b_first)
            if p <= b_first:
                attempts = (
                    AttemptRecord("a", "primary", 0.0, p, p + 2.0, "won", 200, None, 50),
                    AttemptRecord("b", "backup", 1.0, None, p, "cancelled", 200, None, 0),
                )
                winner = "primary"
            else:
                attempts = (
                    AttemptRecord("a", "primary", 0.0, None, b_first, "cancelled", 200, None, 0),
                    AttemptRecord("b", "backup", 1.0, b_first, b_first + 2.0, "won", 200, None, 50),
                )
                winner = "backup"
            hedged, hedge_reason = True, "ttft_timeout"
        records.append(
            CallRecord(
                request_id=f"bench-{seed}-{i}",
                route="bench",
                model="m",
                started_at=started,
                hedge_after_s=1.0,
                ttft_s=round(first, 6),
                e2e_s=round(first + 2.0, 6),
                completion_tokens=50,
                attempts=attempts,
                winner=winner,
                hedged=hedged,
                hedge_reason=hedge_reason,
            )
        )
    return records


async def seed(url: str, routes: int, calls: int, now: datetime) -> float:
    """Fill a migrated store with about ``calls`` records for each of ``routes`` routes (route ``r``
    drawn with seed ``r``, ``calls`` +- 2%); returns seconds taken."""
    engine = make_engine(url)
    sessionmaker = make_sessionmaker(engine)
    defaults = route_defaults(Settings())
    started = time.perf_counter()
    try:
        batch: list[CallRecord] = []
        for r in range(routes):
            # each route its own draws and a call count within 2% of ``calls``: no two routes share
            # a curve, and few share a sample count (the policy caches what depends on that alone)
            batch.extend(
                dataclasses.replace(rec, request_id=f"{rec.request_id}-r{r}", route=f"route-{r}")
                for rec in synthetic_records(calls + (r % 41 - 20) * calls // 1000, now, seed=r)
            )
            if len(batch) >= 20_000 or r == routes - 1:
                async with sessionmaker() as session, session.begin():
                    await ingest_calls(session, batch, defaults=defaults)
                batch = []
    finally:
        await engine.dispose()
    return time.perf_counter() - started


async def read_rows(url: str, now: datetime, window_s: float) -> tuple[float, int]:
    """The floor of a raw-row tick: fetch the window's primary attempts with one Core query.

    Returns:
        ``(seconds, rows)``.
    """
    engine = make_engine(url)
    query = (
        select(Call.route_id, Attempt.start_s, Attempt.first_token_s, Attempt.end_s, Attempt.outcome)
        .join(Attempt, Attempt.call_id == Call.id)
        .where(Call.started_at >= now - timedelta(seconds=window_s), Call.started_at <= now)
        .where(Attempt.role == "primary")
    )
    try:
        started = time.perf_counter()
        async with engine.connect() as connection:
            rows = (await connection.execute(query)).all()
        return time.perf_counter() - started, len(rows)
    finally:
        await engine.dispose()


async def read_minute_window(url: str, now: datetime, window_s: float) -> tuple[float, int, int]:
    """The histogram tick's read: every route's minute aggregates of the window as numpy arrays.

    Returns:
        ``(seconds, minute rows, histogram entries)``.
    """
    engine = make_engine(url)
    try:
        started = time.perf_counter()
        async with engine.connect() as connection:
            minutes = await read_minutes(connection, now - timedelta(seconds=window_s), now)
        seconds = time.perf_counter() - started
        rows = sum(m.minutes.size for m in minutes.values())
        entries = sum(m.entry_count.size for m in minutes.values())
        return seconds, rows, entries
    finally:
        await engine.dispose()


async def measure(
    url: str, routes: int, calls: int, repeats: int, *, tick: bool = True, observe: Sequence[str] = ("raw",)
) -> dict[str, Any]:
    """Seed a fresh store at ``url``; time ``repeats`` ticks of each ``observe`` mode
    (``HEDGEROW_CONTROLLER_OBSERVE``) and the reads, interleaved (no tick: reads only).

    Each tick's wall time and the CPU time of this process during it (``time.process_time``:
    every thread, the store server's not counted) are kept per mode."""
    await asyncio.to_thread(upgrade_database, url)
    now = datetime.now(UTC)
    seed_s = await seed(url, routes, calls, now)
    settings = Settings(database_url=url, window_s=3600, max_routes=max(routes, 1))
    engine = make_engine(url)
    sessionmaker = make_sessionmaker(engine)
    ticks: list[float] = []
    by_mode: dict[str, dict[str, list[float]]] = {mode: {"wall": [], "cpu": []} for mode in observe}
    reads: list[float] = []
    minute_reads: list[float] = []
    minute_rows = entries = 0
    rows: list[dict[str, Any]] = []
    read_count = 0
    try:
        for _ in range(repeats):
            for mode in observe if tick else ():
                started, cpu = time.perf_counter(), time.process_time()
                rows = await run_tick(sessionmaker, settings.model_copy(update={"controller_observe": mode}), now=now)
                by_mode[mode]["wall"].append(time.perf_counter() - started)
                by_mode[mode]["cpu"].append(time.process_time() - cpu)
            ticks = by_mode[observe[0]]["wall"]
            seconds, read_count = await read_rows(url, now, settings.window_s)
            reads.append(seconds)
            seconds, minute_rows, entries = await read_minute_window(url, now, settings.window_s)
            minute_reads.append(seconds)
    finally:
        await engine.dispose()
    tick_s = statistics.median(ticks) if ticks else float("nan")
    return {
        "routes": routes,
        "calls_per_route": calls,
        "calls": routes * calls,
        "seed_s": seed_s,
        "tick_s_median": tick_s,
        "tick_s_runs": ticks,
        "tick_ms_per_route": tick_s / routes * 1e3,
        "tick_us_per_call": tick_s / (routes * calls) * 1e6,
        "read_rows_s_median": statistics.median(reads),
        "rows_read": read_count,
        "read_minutes_s_median": statistics.median(minute_reads),
        "read_minutes_s_runs": minute_reads,
        "minute_rows_read": minute_rows,
        "histogram_entries_read": entries,
        "decisions": len(rows),
        "samples_first_route": rows[0]["samples"] if rows else None,
        "observe": {
            mode: {
                "tick_s_median": statistics.median(runs["wall"]) if runs["wall"] else float("nan"),
                "tick_cpu_s_median": statistics.median(runs["cpu"]) if runs["cpu"] else float("nan"),
                "tick_s_runs": runs["wall"],
                "tick_cpu_s_runs": runs["cpu"],
            }
            for mode, runs in by_mode.items()
        },
    }


async def reset_postgres(url: str) -> None:
    """Empty the ``public`` schema of the PostgreSQL database at ``url``."""
    engine = make_engine(url)
    async with engine.begin() as connection:
        await connection.execute(text("DROP SCHEMA IF EXISTS public CASCADE"))
        await connection.execute(text("CREATE SCHEMA public"))
    await engine.dispose()


async def main(args: argparse.Namespace) -> None:
    """Run every cell of the grid on SQLite (and PostgreSQL if configured); print and save the results."""
    from tests.conftest import create_pg_database, drop_pg_database

    routes_grid = [int(x) for x in args.routes.split(",")]
    observe = [x.strip() for x in args.observe.split(",")]
    for mode in observe:
        if mode not in ("raw", "bounded"):
            raise SystemExit(f"controller_tick: --observe takes raw and bounded, got {mode!r}")
    calls_grid = [int(x) for x in args.calls.split(",")]
    stores = ["sqlite"] + (["postgresql"] if (args.pg or os.environ.get("HEDGEROW_TEST_DATABASE_URL")) else [])
    pg_server = args.pg or os.environ.get("HEDGEROW_TEST_DATABASE_URL")
    results: list[dict[str, Any]] = []
    for routes in routes_grid:
        for calls in calls_grid:
            for store in stores:
                if routes * calls > args.max_total_calls:
                    skipped = f"> --max-total-calls {args.max_total_calls}"
                    results.append(
                        {"store": store, "routes": routes, "calls_per_route": calls, "calls": routes * calls,
                         "skipped": skipped}
                    )  # fmt: skip
                    continue
                if store == "sqlite":
                    with tempfile.TemporaryDirectory() as tmp:
                        result = await measure(
                            f"sqlite+aiosqlite:///{tmp}/bench.db",
                            routes,
                            calls,
                            args.repeats,
                            tick=not args.no_tick,
                            observe=observe,
                        )
                else:
                    assert pg_server is not None
                    url = await create_pg_database(pg_server, "hedgerow_bench")
                    try:
                        result = await measure(url, routes, calls, args.repeats, tick=not args.no_tick, observe=observe)
                    finally:
                        await drop_pg_database(url)
                results.append({"store": store, **result})
                modes = ", ".join(
                    f"{mode} {m['tick_s_median']:.2f} s ({m['tick_cpu_s_median']:.2f} s cpu)"
                    for mode, m in result["observe"].items()
                )
                print(
                    f"  {store:<10} {routes:>5} routes x {calls:>6} calls: tick {modes}, "
                    f"read rows {result['read_rows_s_median']:.2f} s, "
                    f"read minutes {result['read_minutes_s_median']:.3f} s (seeded in {result['seed_s']:.0f} s)",
                    flush=True,
                )
    print()
    print(f"{'store':<11} {'routes':>6} {'calls/route':>11} {'calls':>9} {'tick s':>8} {'ms/route':>9} "
          f"{'us/call':>8} {'read rows s':>12} {'tick/read':>9} {'read min s':>10} {'min rows':>8} "
          f"{'entries':>9}")  # fmt: skip
    for r in results:
        cell = f"{r['store']:<11} {r['routes']:>6} {r['calls_per_route']:>11} {r['calls']:>9}"
        if "skipped" in r:
            print(f"{cell} skipped ({r['skipped']})")
            continue
        ratio = r["tick_s_median"] / max(r["read_rows_s_median"], 1e-9)
        print(
            f"{cell} {r['tick_s_median']:>8.2f} {r['tick_ms_per_route']:>9.1f} {r['tick_us_per_call']:>8.1f} "
            f"{r['read_rows_s_median']:>12.2f} {ratio:>9.1f} {r['read_minutes_s_median']:>10.3f} "
            f"{r['minute_rows_read']:>8} {r['histogram_entries_read']:>9}"
        )
    print()
    print("tick per observe mode (median wall and cpu s); x10 = this cell / the cell of 1/10 the calls per route")
    print(f"{'store':<11} {'routes':>6} {'calls/route':>11} {'observe':>8} {'wall s':>8} {'cpu s':>8} {'x10 cpu':>8}")
    done = [r for r in results if "skipped" not in r]
    for r in done:
        for mode, m in r["observe"].items():
            base = [
                b
                for b in done
                if (b["store"], b["routes"], b["calls_per_route"] * 10)
                == (r["store"], r["routes"], r["calls_per_route"])
            ]
            ratio = m["tick_cpu_s_median"] / base[0]["observe"][mode]["tick_cpu_s_median"] if base else float("nan")
            print(
                f"{r['store']:<11} {r['routes']:>6} {r['calls_per_route']:>11} {mode:>8} "
                f"{m['tick_s_median']:>8.2f} {m['tick_cpu_s_median']:>8.2f} {ratio:>8.2f}"
            )
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps({"benchmark": "controller_tick", "python": platform.python_version(), "repeats": args.repeats,
                        "observe": observe, "load_average": os.getloadavg(), "results": results}, indent=2) + "\n"
        )  # fmt: skip
        print(f"written to {args.json}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--routes", default="10,100,1000", help="comma-separated route counts")
    parser.add_argument("--calls", default="1000,10000", help="comma-separated calls per route")
    parser.add_argument("--repeats", type=int, default=3, help="ticks (and row reads) per cell")
    parser.add_argument("--no-tick", action="store_true", help="time the reads only (tick columns nan)")
    parser.add_argument("--max-total-calls", type=int, default=1_000_000, help="skip cells with more calls in all")
    parser.add_argument(
        "--observe", default="raw,bounded", help="comma-separated HEDGEROW_CONTROLLER_OBSERVE modes, ticked in turn"
    )
    parser.add_argument("--pg", default=None, help="PostgreSQL server url (default: HEDGEROW_TEST_DATABASE_URL)")
    parser.add_argument("--json", type=Path, default=Path("bench/results/controller_tick.json"))
    asyncio.run(main(parser.parse_args()))
