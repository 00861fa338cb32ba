"""Benchmark: polls/s of ``GET /v1/thresholds`` (200 and 304) against a minimal FastAPI app.

For 10 and 1,000 routes (each with a published threshold, on a SQLite file) a real ``hedgerow
serve`` process answers the polls; beside it a minimal FastAPI app, run by the same uvicorn
(uvloop, httptools), returns the very same bytes and ETag from a constant (the ceiling of any
FastAPI handler). The load comes from ``wrk`` (Debian's ``wrk`` package: ``apt-get install
wrk``) with 1, 16 and 64 connections ("pollers"), with and without ``If-None-Match`` naming
the current ETag, every combination run against both servers one after the other, round after
round (interleaved, so the load of a shared machine falls on both alike).

Run: ``python bench/poll.py [--routes 10,1000] [--pollers 1,16,64] [--seconds 2] [--rounds 2]
[--json bench/results/poll.json]``. Prints a table (median polls/s over rounds, hedgerow's share
of the minimal app's rate, the range of the 1-minute load average over its runs) and writes
JSON. Not a test: nothing is asserted; a run with any non-2xx/3xx answer or socket error is
reported in its ``errors`` column.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI, Request, Response

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hedgerow.controller.store.db import make_engine, make_sessionmaker, upgrade_database
from hedgerow.controller.store.models import Route, Threshold
from tests.helpers import free_port
from tests.serve_process import running_serve


async def seed(url: str, routes: int) -> None:
    """``routes`` routes, each with a published threshold (as ticks would leave them)."""
    await asyncio.to_thread(upgrade_database, url)
    engine = make_engine(url)
    sessionmaker = make_sessionmaker(engine)
    now = datetime.now(UTC)
    try:
        async with sessionmaker() as session, session.begin():
            rows = [
                Route(route=f"team-{i // 50}/route-{i}", model="llama2-70b", enabled=True, budget=0.1,
                      default_hedge_after_s=2.0, min_hedge_after_s=0.05, max_hedge_after_s=30.0,
                      pinned_hedge_after_s=None, created_at=now, updated_at=now)
                for i in range(routes)
            ]  # fmt: skip
            session.add_all(rows)
            await session.flush()
            session.add_all(
                Threshold(route_id=r.id, hedge_after_s=0.5 + (i % 97) / 100, enabled=True, source="controller",
                          version=1 + i % 7, updated_at=now)
                for i, r in enumerate(rows)
            )  # fmt: skip
    finally:
        await engine.dispose()


def serve_minimal(body_path: Path, etag: str, port: int) -> None:
    """Run the minimal app (the same body and ETag from memory) under uvicorn with uvloop and httptools."""
    body = body_path.read_bytes()
    headers = {"ETag": etag, "Cache-Control": "no-cache"}
    app = FastAPI()

    @app.get("/v1/thresholds")
    async def thresholds(request: Request) -> Response:
        if request.headers.get("if-none-match") == etag:
            return Response(status_code=304, headers=headers)
        return Response(content=body, media_type="application/json", headers=headers)

    uvicorn.run(app, host="127.0.0.1", port=port, loop="uvloop", http="httptools", log_level="warning",
                access_log=False)  # fmt: skip


def run_wrk(url: str, connections: int, seconds: float, etag: str | None) -> dict[str, Any]:
    """One ``wrk`` run; returns requests/s, latency figures and error counts parsed from its report."""
    command = ["wrk", "-t1", f"-c{connections}", f"-d{seconds:g}s", "--latency"]
    if etag is not None:
        command += ["-H", f"If-None-Match: {etag}"]
    output = subprocess.run([*command, url], capture_output=True, text=True, check=True, timeout=seconds + 60).stdout
    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", output).group(1))  # type: ignore[union-attr]
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", output)
    socket_errors = re.search(r"Socket errors: (.*)", output)
    p50 = re.search(r"50%\s+([\d.]+)(us|ms|s)", output)
    p99 = re.search(r"99%\s+([\d.]+)(us|ms|s)", output)

    def seconds_of(match: re.Match[str] | None) -> float | None:
        if match is None:
            return None
        return float(match.group(1)) * {"us": 1e-6, "ms": 1e-3, "s": 1.0}[match.group(2)]

    return {
        "polls_per_s": rate,
        "latency_p50_s": seconds_of(p50),
        "latency_p99_s": seconds_of(p99),
        "errors": (int(bad.group(1)) if bad else 0) + (1 if socket_errors else 0),
    }


async def main(args: argparse.Namespace) -> None:
    """Start the servers, run every combination interleaved, print the table, write JSON."""
    if shutil.which("wrk") is None:
        sys.exit("bench/poll.py needs wrk (apt-get install wrk)")
    route_counts = [int(x) for x in args.routes.split(",")]
    pollers = [int(x) for x in args.pollers.split(",")]
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        targets: dict[int, dict[str, Any]] = {}
        minimal_processes: list[subprocess.Popen[bytes]] = []
        async with contexts(work, route_counts) as served:
            try:
                for routes, base in served.items():
                    async with httpx.AsyncClient(base_url=base) as client:
                        answer = await client.get("/v1/thresholds")
                    answer.raise_for_status()
                    assert len(answer.json()["thresholds"]) == routes
                    body_path = work / f"body-{routes}.json"
                    body_path.write_bytes(answer.content)
                    port = free_port()
                    command = [sys.executable, __file__, "--serve-minimal", str(body_path)]
                    command += ["--etag", answer.headers["etag"], "--port", str(port)]
                    minimal_processes.append(subprocess.Popen(command))
                    minimal = f"http://127.0.0.1:{port}"
                    await wait_for(minimal, answer.content)
                    targets[routes] = {"etag": answer.headers["etag"], "bytes": len(answer.content),
                                       "servers": {"hedgerow": base, "minimal FastAPI": minimal}}  # fmt: skip
                for round_index in range(args.rounds):
                    for routes, target in targets.items():
                        for count in pollers:
                            for status in (200, 304):
                                for server, base in target["servers"].items():
                                    etag = target["etag"] if status == 304 else None
                                    measured = await asyncio.to_thread(
                                        run_wrk, f"{base}/v1/thresholds", count, args.seconds, etag
                                    )
                                    load = os.getloadavg()[0]
                                    results.append({"routes": routes, "bytes": target["bytes"], "pollers": count,
                                                    "status": status, "server": server, "round": round_index,
                                                    "load_1m": load, **measured})  # fmt: skip
                                    print(f"  round {round_index} routes {routes:>5} pollers {count:>3} {status} "
                                          f"{server:<16} {measured['polls_per_s']:>9.0f}/s (load {load:.1f})",
                                          flush=True)  # fmt: skip
            finally:
                for process in minimal_processes:
                    process.terminate()
                    process.wait(timeout=30)
    rows = summarise(results)
    print()
    print(f"{'routes':>6} {'bytes':>7} {'pollers':>7} {'status':>6} {'hedgerow polls/s':>17} "
          f"{'minimal polls/s':>16} {'share':>6} {'p99 ms (hedgerow)':>18} {'errors':>6} {'load':>9}")  # fmt: skip
    for row in rows:
        p99 = row["hedgerow_latency_p99_s"]
        print(f"{row['routes']:>6} {row['bytes']:>7} {row['pollers']:>7} {row['status']:>6} "
              f"{row['hedgerow_polls_per_s']:>17.0f} {row['minimal_polls_per_s']:>16.0f} {row['share']:>6.0%} "
              f"{(p99 or 0) * 1e3:>18.1f} {row['errors']:>6} "
              f"{row['load_1m_min']:>4.1f}-{row['load_1m_max']:<4.1f}")  # fmt: skip
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps({"benchmark": "poll", "python": platform.python_version(), "seconds_per_run": args.seconds,
                        "rounds": args.rounds, "summary": rows, "runs": results}, indent=2) + "\n"
        )  # fmt: skip
        print(f"written to {args.json}")


def summarise(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Median polls/s over rounds per (routes, pollers, status) for both servers, and their ratio."""
    rows = []
    keys = sorted({(r["routes"], r["pollers"], r["status"]) for r in results})
    for routes, pollers, status in keys:
        runs = [r for r in results if (r["routes"], r["pollers"], r["status"]) == (routes, pollers, status)]
        ours = [r for r in runs if r["server"] == "hedgerow"]
        theirs = [r for r in runs if r["server"] != "hedgerow"]
        ours_rate = statistics.median(r["polls_per_s"] for r in ours)
        theirs_rate = statistics.median(r["polls_per_s"] for r in theirs)
        p99s = [r["latency_p99_s"] for r in ours if r["latency_p99_s"] is not None]
        rows.append({"routes": routes, "bytes": runs[0]["bytes"], "pollers": pollers, "status": status,
                     "hedgerow_polls_per_s": ours_rate, "minimal_polls_per_s": theirs_rate,
                     "share": ours_rate / theirs_rate if theirs_rate else 0.0,
                     "hedgerow_latency_p99_s": statistics.median(p99s) if p99s else None,
                     "errors": sum(r["errors"] for r in runs),
                     "load_1m_min": min(r["load_1m"] for r in runs),
                     "load_1m_max": max(r["load_1m"] for r in runs)})  # fmt: skip
    return rows


async def wait_for(base: str, expected: bytes) -> None:
    """Wait (up to 30 s) until the minimal app answers with ``expected``."""
    async with httpx.AsyncClient(base_url=base) as client:
        for _ in range(300):
            try:
                if (await client.get("/v1/thresholds")).content == expected:
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.1)
    raise RuntimeError(f"the minimal app at {base} did not start")


class contexts:
    """One seeded SQLite store and ``hedgerow serve`` per route count (async context manager)."""

    def __init__(self, work: Path, route_counts: list[int]) -> None:
        self.work = work
        self.route_counts = route_counts
        self._stack: Any = None

    async def __aenter__(self) -> dict[int, str]:
        from contextlib import AsyncExitStack

        self._stack = AsyncExitStack()
        served: dict[int, str] = {}
        for routes in self.route_counts:
            directory = self.work / f"store-{routes}"
            directory.mkdir()
            url = f"sqlite+aiosqlite:///{directory / 'bench.db'}"
            await seed(url, routes)
            process = await self._stack.enter_async_context(
                running_serve(url, directory, HEDGEROW_MAX_ROUTES=str(max(routes, 1000)))
            )
            served[routes] = process.base
        return served

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.aclose()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--routes", default="10,1000", help="comma-separated route counts")
    parser.add_argument("--pollers", default="1,16,64", help="comma-separated wrk connection counts")
    parser.add_argument("--seconds", type=float, default=2.0, help="seconds of each wrk run")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", type=Path, default=Path("bench/results/poll.json"))
    parser.add_argument("--serve-minimal", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--etag", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=None, help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.serve_minimal is not None:
        serve_minimal(arguments.serve_minimal, arguments.etag, arguments.port)
    else:
        asyncio.run(main(arguments))
