"""Benchmark: records/s through ``POST /v1/calls`` against the raw write paths of the same rows.

Methods, on one store per database (a SQLite file; PostgreSQL when ``HEDGEROW_TEST_DATABASE_URL``
or ``--pg`` names a server: a database of the bench's own is created on it and dropped after),
run interleaved in every round so that
the load of a shared machine falls on all of them alike:

- ``api x1`` / ``api x4``: a real ``hedgerow serve`` process (uvicorn, loopback HTTP) and 1 or 4
  concurrent posters, each posting pre-serialised batches of ``--batch`` records (JSON built
  before the clock starts); the figure is records stored per second of wall time;
- ``api x1 no-minutes`` / ``api x4 no-minutes``: the same, through a second ``serve`` process
  on the same store whose ingest skips the per-minute aggregates (``minute_store.add_records``
  replaced by a no-op in that process only): what keeping the tick's aggregates costs ingest,
  measured in the same rounds;
- ``core executemany``: SQLAlchemy Core ``executemany`` of the same rows from this process (one
  ``INSERT ... RETURNING id`` for the calls, one for the attempts, per batch, one transaction
  each) — the floor of any SQLAlchemy path;
- ``COPY`` (PostgreSQL): asyncpg's binary ``COPY`` of the calls (ids drawn from the sequence
  first) and of their attempts;
- ``sqlite3 executemany`` (SQLite): the standard library's ``executemany`` of the calls (ids
  given) and attempts, on its own connection with the store's pragmas
  (``hedgerow.controller.store.db.SQLITE_PRAGMAS``: WAL, ``synchronous=FULL``), a commit per batch.

Every method writes fresh ``request_id`` values (nothing is a duplicate) into the same tables,
so the store grows alike for all. Records are those of ``bench/controller_tick.py``'s generator
(~10% hedged, censored primaries included), over 10 routes.

Run: ``python bench/ingest.py [--records 10000] [--batch 1000] [--rounds 3] [--json
bench/results/ingest.json]``. Prints a table (median over rounds, min..max) and writes JSON.
Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import platform
import sqlite3
import statistics
import sys
import tempfile
import time
import zlib
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import text

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from controller_tick import synthetic_records

from hedgerow.client.records import CallRecord, estimate_prompt_tokens
from hedgerow.controller.store.db import SQLITE_PRAGMAS, make_engine, upgrade_database
from hedgerow.controller.store.ingest import ATTEMPT_COLUMNS, CALL_COLUMNS
from hedgerow.controller.store.models import Attempt, Call, utc_now
from tests.conftest import create_pg_database, drop_pg_database
from tests.helpers import stored_calls
from tests.serve_process import running_serve

ROUTES = 10
#: Run in the ``no-minutes`` server before its CLI: ingest without the per-minute aggregates.
_NO_MINUTES = (
    "import hedgerow.controller.store.ingest as _ingest\n"
    "async def _skip(*args, **kwargs):\n"
    "    return None\n"
    "_ingest.add_records = _skip"
)


def make_records(count: int, tag: str, now: datetime) -> list[CallRecord]:
    """``count`` realistic records over :data:`ROUTES` routes, with ids unique to ``tag``."""
    base = synthetic_records(count, now, seed=zlib.crc32(tag.encode()) % 1000)
    return [dataclasses.replace(r, request_id=f"{tag}-{i}", route=f"route-{i % ROUTES}") for i, r in enumerate(base)]


def call_tuple(record: CallRecord, route_id: int, received_at: datetime) -> tuple[Any, ...]:
    """A ``calls`` row of ``record`` in :data:`CALL_COLUMNS` order."""
    values = {
        **{name: getattr(record, name) for name in CALL_COLUMNS if hasattr(record, name)},
        "route_id": route_id,
        "received_at": received_at,
    }
    return tuple(values[name] for name in CALL_COLUMNS)


def attempt_tuples(record: CallRecord, call_id: int) -> list[tuple[Any, ...]]:
    """The ``attempts`` rows of ``record`` in :data:`ATTEMPT_COLUMNS` order."""
    rows = []
    for index, a in enumerate(record.attempts):
        tokens, estimated = estimate_prompt_tokens(
            a.prompt_tokens, a.prompt_tokens_estimated, a.status_code, record.prompt_tokens
        )
        rows.append(
            (call_id, index, a.upstream, a.role, a.start_s, a.first_token_s, a.end_s, a.outcome, a.status_code,
             a.error_type, a.completion_tokens, tokens, estimated, a.cached_prompt_tokens, record.started_at)
        )  # fmt: skip
    return rows


async def route_ids(url: str) -> dict[str, int]:
    """Create the bench's routes (through the api's own first ingest) and return ``{route: id}``."""
    engine = make_engine(url)
    try:
        async with engine.begin() as connection:
            rows = (await connection.execute(text("SELECT route, id FROM routes"))).all()
    finally:
        await engine.dispose()
    return {route: route_id for route, route_id in rows}


async def api_method(base: str, posters: int, bodies: list[bytes]) -> int:
    """Post ``bodies`` through ``posters`` concurrent clients; returns the records accepted."""
    queue: asyncio.Queue[bytes] = asyncio.Queue()
    for body in bodies:
        queue.put_nowait(body)
    accepted = 0

    async def poster() -> None:
        nonlocal accepted
        async with httpx.AsyncClient(base_url=base, timeout=120) as client:
            while not queue.empty():
                body = queue.get_nowait()
                response = await client.post("/v1/calls", content=body, headers={"content-type": "application/json"})
                response.raise_for_status()
                accepted += response.json()["accepted"]

    await asyncio.gather(*(poster() for _ in range(posters)))
    return accepted


async def core_method(url: str, batches: list[list[CallRecord]], ids: dict[str, int]) -> int:
    """SQLAlchemy Core executemany of the rows, a transaction per batch; returns the records written."""
    engine = make_engine(url)
    calls, attempts = Call.metadata.tables["calls"], Attempt.metadata.tables["attempts"]
    insert_calls = calls.insert().returning(calls.c.request_id, calls.c.id)
    written = 0
    try:
        for batch in batches:
            received_at = utc_now()
            async with engine.begin() as connection:
                params = [dict(zip(CALL_COLUMNS, call_tuple(r, ids[r.route], received_at), strict=True)) for r in batch]
                result = await connection.execute(insert_calls, params)
                call_ids: dict[str, int] = dict(result.all())
                rows = [row for r in batch for row in attempt_tuples(r, call_ids[r.request_id])]
                await connection.execute(
                    attempts.insert(), [dict(zip(ATTEMPT_COLUMNS, row, strict=True)) for row in rows]
                )
                written += len(call_ids)
    finally:
        await engine.dispose()
    return written


async def copy_method(url: str, batches: list[list[CallRecord]], ids: dict[str, int]) -> int:
    """asyncpg binary COPY of calls (ids from the sequence) and attempts, a transaction per batch."""
    import asyncpg
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    connection = await asyncpg.connect(
        user=parsed.username, password=parsed.password, host=parsed.host, port=parsed.port, database=parsed.database
    )
    written = 0
    try:
        for batch in batches:
            received_at = utc_now()
            async with connection.transaction():
                new_ids = [
                    row[0]
                    for row in await connection.fetch(
                        "SELECT nextval(pg_get_serial_sequence('calls', 'id')) FROM generate_series(1, $1)", len(batch)
                    )
                ]
                call_rows = [
                    (call_id, *call_tuple(r, ids[r.route], received_at))
                    for call_id, r in zip(new_ids, batch, strict=True)
                ]
                await connection.copy_records_to_table("calls", records=call_rows, columns=("id", *CALL_COLUMNS))
                rows = [row for call_id, r in zip(new_ids, batch, strict=True) for row in attempt_tuples(r, call_id)]
                await connection.copy_records_to_table("attempts", records=rows, columns=ATTEMPT_COLUMNS)
                written += len(batch)
    finally:
        await connection.close()
    return written


def sqlite3_method(path: str, batches: list[list[CallRecord]], ids: dict[str, int]) -> int:
    """The standard library's sqlite3 executemany of calls (ids given) and attempts, a transaction per batch."""
    connection = sqlite3.connect(path, timeout=30, isolation_level=None)
    for pragma in SQLITE_PRAGMAS:
        connection.execute(pragma)
    columns = ("id", *CALL_COLUMNS)
    insert_calls = f"INSERT INTO calls ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})"
    insert_attempts = (
        f"INSERT INTO attempts ({', '.join(ATTEMPT_COLUMNS)}) VALUES ({', '.join('?' * len(ATTEMPT_COLUMNS))})"
    )
    written = 0

    def naive(value: Any) -> Any:  # the store keeps naive UTC text on SQLite (UTCDateTime)
        return value.astimezone(UTC).replace(tzinfo=None).isoformat(sep=" ") if isinstance(value, datetime) else value

    try:
        for batch in batches:
            received_at = utc_now()
            connection.execute("BEGIN IMMEDIATE")
            first = (connection.execute("SELECT coalesce(max(id), 0) FROM calls").fetchone() or (0,))[0] + 1
            call_ids = range(first, first + len(batch))
            connection.executemany(
                insert_calls,
                [
                    (call_id, *map(naive, call_tuple(r, ids[r.route], received_at)))
                    for call_id, r in zip(call_ids, batch, strict=True)
                ],
            )
            connection.executemany(
                insert_attempts,
                [
                    tuple(map(naive, row))
                    for call_id, r in zip(call_ids, batch, strict=True)
                    for row in attempt_tuples(r, call_id)
                ],
            )
            connection.execute("COMMIT")
            written += len(batch)
    finally:
        connection.close()
    return written


async def run_store(store: str, url: str, records: int, batch: int, rounds: int, workdir: Path) -> list[dict[str, Any]]:
    """Every method on one store, ``rounds`` interleaved rounds; returns one result per (method, round)."""
    await asyncio.to_thread(upgrade_database, url)
    now = datetime.now(UTC)
    results: list[dict[str, Any]] = []
    async with (
        running_serve(url, workdir) as served,
        running_serve(url, workdir, prelude=_NO_MINUTES, logs="serve-no-minutes") as plain,
    ):
        # create the routes through the api itself (and warm it up)
        warm = make_records(ROUTES * 10, "warm", now)
        await api_method(served.base, 1, [json.dumps({"calls": [r.to_dict() for r in warm]}).encode()])
        ids = await route_ids(url)
        methods: dict[str, Callable[[list[list[CallRecord]]], Awaitable[int]]] = {}

        await api_method(plain.base, 1, [json.dumps({"calls": [r.to_dict() for r in warm]}).encode()])

        def api(posters: int, base: str = served.base) -> Callable[[list[list[CallRecord]]], Awaitable[int]]:
            async def run(batches: list[list[CallRecord]]) -> int:
                bodies = [json.dumps({"calls": [r.to_dict() for r in b]}).encode() for b in batches]
                start = time.perf_counter()
                accepted = await api_method(base, posters, bodies)
                run.elapsed = time.perf_counter() - start  # type: ignore[attr-defined]
                return accepted

            return run

        methods["api x1"] = api(1)
        methods["api x4"] = api(4)
        methods["api x1 no-minutes"] = api(1, plain.base)
        methods["api x4 no-minutes"] = api(4, plain.base)

        async def core(batches: list[list[CallRecord]]) -> int:
            start = time.perf_counter()
            written = await core_method(url, batches, ids)
            core.elapsed = time.perf_counter() - start  # type: ignore[attr-defined]
            return written

        methods["core executemany"] = core
        if store == "postgresql":

            async def copy(batches: list[list[CallRecord]]) -> int:
                start = time.perf_counter()
                written = await copy_method(url, batches, ids)
                copy.elapsed = time.perf_counter() - start  # type: ignore[attr-defined]
                return written

            methods["COPY"] = copy
        else:
            path = url.split(":///", 1)[1]

            async def raw(batches: list[list[CallRecord]]) -> int:
                start = time.perf_counter()
                written = await asyncio.to_thread(sqlite3_method, path, batches, ids)
                raw.elapsed = time.perf_counter() - start  # type: ignore[attr-defined]
                return written

            methods["sqlite3 executemany"] = raw
        for round_index in range(rounds):
            for name, method in methods.items():
                tag = f"{name.replace(' ', '')}-{round_index}"
                rows = make_records(records, tag, now)
                batches = [rows[i : i + batch] for i in range(0, len(rows), batch)]
                before = await stored_calls(url)
                written = await method(batches)
                elapsed = method.elapsed  # type: ignore[attr-defined]
                stored = await stored_calls(url) - before
                results.append(
                    {"store": store, "method": name, "round": round_index, "records": written, "stored": stored,
                     "seconds": elapsed, "records_per_s": written / elapsed, "load_1m": os.getloadavg()[0]}
                )  # fmt: skip
                print(f"  {store:<10} round {round_index} {name:<20} {written / elapsed:>9.0f} records/s "
                      f"(load {os.getloadavg()[0]:.1f})", flush=True)  # fmt: skip
    return results


def summarise(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Median, min and max records/s per (store, method), and the api's share of the store's baselines."""
    rows: list[dict[str, Any]] = []
    keys = sorted({(r["store"], r["method"]) for r in results}, key=lambda k: (k[0], k[1]))
    for store, method in keys:
        rates = [r["records_per_s"] for r in results if (r["store"], r["method"]) == (store, method)]
        rows.append(
            {"store": store, "method": method, "median_records_per_s": statistics.median(rates),
             "min_records_per_s": min(rates), "max_records_per_s": max(rates), "rounds": len(rates)}
        )  # fmt: skip
    for row in rows:
        for baseline in ("COPY", "sqlite3 executemany", "core executemany"):
            base = next((b for b in rows if b["store"] == row["store"] and b["method"] == baseline), None)
            if base is not None and row["method"].startswith("api"):
                share = row["median_records_per_s"] / base["median_records_per_s"]
                row[f"share_of_{baseline.replace(' ', '_')}"] = share
        plain = next(
            (b for b in rows if b["store"] == row["store"] and b["method"] == f"{row['method']} no-minutes"), None
        )
        if plain is not None:
            row["share_of_no_minutes"] = row["median_records_per_s"] / plain["median_records_per_s"]
    return rows


async def main(args: argparse.Namespace) -> None:
    """Run SQLite (and PostgreSQL when configured), print the table, write JSON."""
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite+aiosqlite:///{Path(tmp) / 'bench.db'}"
        results += await run_store("sqlite", url, args.records, args.batch, args.rounds, Path(tmp))
    pg = args.pg or os.environ.get("HEDGEROW_TEST_DATABASE_URL")
    if pg:
        url = await create_pg_database(pg, "hedgerow_bench")
        try:
            with tempfile.TemporaryDirectory() as tmp:
                results += await run_store("postgresql", url, args.records, args.batch, args.rounds, Path(tmp))
        finally:
            await drop_pg_database(url)
    rows = summarise(results)
    print()
    print(f"{'store':<11} {'method':<20} {'records/s (median)':>19} {'min..max':>17} {'vs baseline':>36}")
    for row in rows:
        shares = [f"{k.removeprefix('share_of_')} {v:.0%}" for k, v in row.items() if k.startswith("share_of_")]
        spread = f"{row['min_records_per_s']:.0f}..{row['max_records_per_s']:.0f}"
        print(
            f"{row['store']:<11} {row['method']:<20} {row['median_records_per_s']:>19.0f} {spread:>17} "
            f"{', '.join(s for s in shares if not s.startswith('core')) or '':>36}"
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(
                {"benchmark": "ingest", "python": platform.python_version(), "records_per_run": args.records,
                 "batch": args.batch, "rounds": args.rounds, "summary": rows, "runs": results},
                indent=2,
            ) + "\n"
        )  # fmt: skip
        print(f"written to {args.json}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=10_000, help="records per method and round")
    parser.add_argument("--batch", type=int, default=1000, help="records per POST (and per transaction)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pg", default=None, help="PostgreSQL server url (default: HEDGEROW_TEST_DATABASE_URL)")
    parser.add_argument("--json", type=Path, default=Path("bench/results/ingest.json"))
    asyncio.run(main(parser.parse_args()))
