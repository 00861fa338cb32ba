"""Benchmark: threshold-poll latency of a ``serve`` idle and under 64 concurrent ingest posters (PostgreSQL).

The figure of issue 31's "done when": poll p99 under 64 concurrent ``POST /v1/calls`` posters of
1,000-record batches, against the same server's idle p99, on PostgreSQL. For each variant (a
set of ``HEDGEROW_*`` variables, ``--variant NAME:KEY=VALUE,KEY=VALUE``; default: ``default``,
today's settings), round after round and interleaved with the other variants so that the load
of a shared machine falls on all of them alike, on a PostgreSQL database of the bench's own:

- a real ``hedgerow serve`` is started on it with the variant's variables (the scheduled tick an
  hour away, so no tick runs while measuring; an admin token), one small batch is posted (the
  routes exist) and one tick is run (``POST /v1/controller/run``: every route has a threshold);
- idle: for ``--idle-seconds`` the probes run alone;
- load: the same probes while a separate process (``tests/ingest_load.py``, so the posters' own
  CPU is not charged to this process's clock) runs ``--posters`` posters of ``--batch``-record
  batches for ``--load-seconds``.

Probes are closed loop per path, one request every ``--probe-interval`` seconds on each of
``GET /v1/thresholds``, ``GET /v1/thresholds/{route}`` and ``GET /readyz`` (as
``tests/e2e/test_ingest_isolation.py``); latency is from send to the whole answer. Reported per
variant: poll p50/p99 idle and under load (the two threshold paths; ``/readyz`` apart), their
ratio, ingest batches accepted per second under load (202s), the ``serve`` process's CPU
seconds per accepted batch and its share of a core during the load (on a shared machine these
say more than batches per second: a variant that leaves its loop idle has a lower share), 503
refusals, whether the server logged ``lease_lost``, and the probes not answered 200 (both phases).

Run: ``python bench/ingest_poll_interference.py [--db postgresql+asyncpg://postgres@127.0.0.1/x]
[--variant default: --variant NAME:HEDGEROW_X=1] [--rounds 2] [--idle-seconds 5]
[--load-seconds 20] [--posters 64] [--batch 1000] [--json bench/results/ingest_poll_interference.json]``.
``--db`` defaults to ``HEDGEROW_TEST_DATABASE_URL``. Prints a table and writes JSON. Not a
test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.conftest import create_pg_database, drop_pg_database
from tests.serve_process import running_serve

#: The paths probed; the first two are the threshold polls the figure is about.
POLLS = ("/v1/thresholds", "/v1/thresholds/load-1?model=m1")
READY = "/readyz"
ROOT = Path(__file__).resolve().parents[1]
#: The bench's admin bearer token (admin is accepted by every endpoint).
TOKEN = "bench-ingest-poll-admin-token"
HEADERS = {"authorization": f"Bearer {TOKEN}"}


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds the process ``pid`` has used so far (``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentile(values: list[float], q: float) -> float | None:
    """The ``q``-th percentile (0-100) of ``values``, or None when there are none."""
    return float(np.percentile(values, q)) if values else None


async def load(base: str, seconds: float, posters: int, batch: int) -> dict[str, Any]:
    """Run ``tests/ingest_load.py`` against ``base``; returns its counts (posts, statuses, records).

    Raises:
        RuntimeError: the load process failed.
    """
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.ingest_load", base, "--seconds", str(seconds), "--posters", str(posters),
        "--batch", str(batch), "--token", TOKEN, stdout=asyncio.subprocess.PIPE, cwd=str(ROOT),
    )  # fmt: skip
    out, _ = await process.communicate()
    if process.returncode != 0:
        raise RuntimeError(f"tests.ingest_load failed: {out.decode()[-500:]}")
    result: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    return result


async def probe(
    client: httpx.AsyncClient, path: str, interval_s: float, stop: asyncio.Event
) -> tuple[list[float], int]:
    """GET ``path`` every ``interval_s`` until ``stop``; returns (latencies in seconds, non-200 answers)."""
    latencies: list[float] = []
    errors = 0
    while not stop.is_set():
        started = time.perf_counter()
        try:
            errors += (await client.get(path)).status_code != 200
        except httpx.HTTPError:
            errors += 1
        latencies.append(time.perf_counter() - started)
        await asyncio.sleep(interval_s)
    return latencies, errors


async def probed(base: str, interval_s: float, work: Any) -> tuple[dict[str, tuple[list[float], int]], Any]:
    """Probe every path of :data:`POLLS` and :data:`READY` while ``work`` runs; returns (samples, its result)."""
    stop = asyncio.Event()
    async with httpx.AsyncClient(base_url=base, timeout=60, headers=HEADERS) as client:
        tasks = {path: asyncio.create_task(probe(client, path, interval_s, stop)) for path in (*POLLS, READY)}
        try:
            result = await work
        finally:
            stop.set()
        return {path: await task for path, task in tasks.items()}, result


def env_of(spec: str) -> tuple[str, dict[str, str]]:
    """``NAME:KEY=VALUE,KEY=VALUE`` as (name, variables).

    Raises:
        argparse.ArgumentTypeError: no ``:``, or a pair without ``=``.
    """
    name, sep, rest = spec.partition(":")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"--variant: want NAME:KEY=VALUE,..., got {spec!r}")
    env: dict[str, str] = {}
    for pair in filter(None, rest.split(",")):
        key, eq, value = pair.partition("=")
        if not eq:
            raise argparse.ArgumentTypeError(f"--variant {name}: {pair!r} is not KEY=VALUE")
        env[key] = value
    return name, env


async def one_round(
    url: str, workdir: Path, name: str, env: dict[str, str], args: argparse.Namespace
) -> dict[str, Any]:
    """One idle and one load phase on a fresh ``serve`` with the variant's variables."""
    settings = {"HEDGEROW_CONTROLLER_INTERVAL_S": "3600", "HEDGEROW_TOKENS": f"bench={TOKEN}:admin", **env}
    async with running_serve(url, workdir, logs=f"serve-{name}", **settings) as served:
        await load(served.base, 1.0, 1, 100)  # the routes exist before anything is measured
        async with httpx.AsyncClient(base_url=served.base, timeout=600, headers=HEADERS) as control:
            ran = await control.post("/v1/controller/run")  # one tick: every route has a threshold to poll
            if not ran.is_success or not ran.json()["ran"]:
                raise RuntimeError(f"POST /v1/controller/run: {ran.status_code} {ran.text[:300]}")
        idle, _ = await probed(served.base, args.probe_interval, asyncio.sleep(args.idle_seconds))
        started, cpu_before = time.perf_counter(), cpu_seconds(served.process.pid)
        busy, counts = await probed(served.base, args.probe_interval,
                                    load(served.base, args.load_seconds, args.posters, args.batch))  # fmt: skip
        load_s = time.perf_counter() - started
        cpu_s = cpu_seconds(served.process.pid) - cpu_before
        log = await served.stderr_text()
    return {"variant": name, "idle": idle, "load": busy, "counts": counts, "load_s": load_s, "cpu_s": cpu_s,
            "lease_lost": "lease_lost" in log, "load_1m": os.getloadavg()[0]}  # fmt: skip


def summarise(name: str, env: dict[str, str], rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """One variant's figures over its rounds (latencies pooled; counts summed)."""
    out: dict[str, Any] = {"variant": name, "env": env, "rounds": len(rounds)}
    for phase in ("idle", "load"):
        polls = [s for r in rounds for path in POLLS for s in r[phase][path][0]]
        ready = [s for r in rounds for s in r[phase][READY][0]]
        out[f"{phase}_poll_p50_s"] = percentile(polls, 50)
        out[f"{phase}_poll_p99_s"] = percentile(polls, 99)
        out[f"{phase}_polls"] = len(polls)
        out[f"{phase}_ready_p99_s"] = percentile(ready, 99)
        out[f"{phase}_probe_errors"] = sum(r[phase][path][1] for r in rounds for path in (*POLLS, READY))
    for q in ("p50", "p99"):
        idle, busy = out[f"idle_poll_{q}_s"], out[f"load_poll_{q}_s"]
        out[f"poll_{q}_ratio"] = busy / idle if idle and busy is not None else None
    load_s = sum(r["load_s"] for r in rounds)
    accepted = sum(int(r["counts"]["statuses"].get("202", 0)) for r in rounds)
    out["batches_per_s"] = accepted / load_s if load_s else None
    out["records_per_s"] = sum(int(r["counts"]["records"]) for r in rounds) / load_s if load_s else None
    cpu_s = sum(r["cpu_s"] for r in rounds)
    out["serve_cpu_share"] = cpu_s / load_s if load_s else None
    out["serve_cpu_ms_per_batch"] = 1e3 * cpu_s / accepted if accepted else None
    out["refused_503"] = sum(int(r["counts"]["statuses"].get("503", 0)) for r in rounds)
    out["other_statuses"] = {
        k: v for r in rounds for k, v in r["counts"]["statuses"].items() if k not in ("202", "503")
    }
    out["lease_lost"] = any(r["lease_lost"] for r in rounds)
    out["per_round"] = [
        {"load_1m": r["load_1m"], "statuses": r["counts"]["statuses"], "load_s": r["load_s"],
         "idle_poll_p99_s": percentile([s for p in POLLS for s in r["idle"][p][0]], 99),
         "load_poll_p99_s": percentile([s for p in POLLS for s in r["load"][p][0]], 99)}
        for r in rounds
    ]  # fmt: skip
    return out


def ms(value: float | None) -> str:
    """Seconds as milliseconds, or ``-``."""
    return "-" if value is None else f"{value * 1e3:.0f}"


def table(results: list[dict[str, Any]]) -> str:
    """The results as a text table."""
    lines = [
        f"{'variant':<16} {'poll p50 ms':>13} {'poll p99 ms':>13} {'p99 x':>6} {'readyz p99':>11} "
        f"{'batch/s':>8} {'rec/s':>7} {'cpu ms/batch':>12} {'cpu share':>9} {'503':>5} {'lease':>6} {'errors':>6}",
        f"{'':<16} {'idle / load':>13} {'idle / load':>13} {'':>6} {'idle / load':>11}",
    ]
    for r in results:
        ratio = "-" if r["poll_p99_ratio"] is None else f"{r['poll_p99_ratio']:.1f}"
        lines.append(
            f"{r['variant']:<16} {ms(r['idle_poll_p50_s']) + ' / ' + ms(r['load_poll_p50_s']):>13} "
            f"{ms(r['idle_poll_p99_s']) + ' / ' + ms(r['load_poll_p99_s']):>13} {ratio:>6} "
            f"{ms(r['idle_ready_p99_s']) + ' / ' + ms(r['load_ready_p99_s']):>11} "
            f"{r['batches_per_s'] or 0:>8.1f} {r['records_per_s'] or 0:>7.0f} "
            f"{r['serve_cpu_ms_per_batch'] or 0:>12.0f} "
            f"{r['serve_cpu_share'] or 0:>9.2f} {r['refused_503']:>5} "
            f"{'LOST' if r['lease_lost'] else 'kept':>6} {r['idle_probe_errors'] + r['load_probe_errors']:>6}"
        )
    return "\n".join(lines)


async def main(args: argparse.Namespace) -> None:
    """Run every variant's rounds, interleaved; print the table and write the JSON."""
    base = args.db or os.environ.get("HEDGEROW_TEST_DATABASE_URL")
    if not base or not base.startswith("postgresql"):
        raise SystemExit("a PostgreSQL server is needed: --db or HEDGEROW_TEST_DATABASE_URL")
    variants: list[tuple[str, dict[str, str]]] = args.variant or [("default", {})]
    rounds: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in variants}
    url = await create_pg_database(base, "hedgerow_bench_ipi")
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for index in range(args.rounds):
                for name, env in variants:
                    result = await one_round(url, Path(tmp), name, env, args)
                    rounds[name].append(result)
                    print(f"  round {index} {name}: {result['counts']['statuses']} in {result['load_s']:.1f} s, "
                          f"load avg {result['load_1m']:.1f}", flush=True)  # fmt: skip
    finally:
        await drop_pg_database(url)
    results = [summarise(name, env, rounds[name]) for name, env in variants]
    print()
    print(table(results))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        document = {"benchmark": "ingest_poll_interference", "python": platform.python_version(),
                    "cpus": os.cpu_count(), "posters": args.posters, "batch": args.batch,
                    "load_seconds": args.load_seconds, "idle_seconds": args.idle_seconds,
                    "probe_interval_s": args.probe_interval, "rounds": args.rounds, "results": results}  # fmt: skip
        args.json.write_text(json.dumps(document, indent=2) + "\n")
        print(f"written to {args.json}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", default=None, help="PostgreSQL server url (a database of the bench's own is made)")
    parser.add_argument("--variant", type=env_of, action="append", help="NAME:KEY=VALUE,... (repeatable)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--idle-seconds", type=float, default=5.0)
    parser.add_argument("--load-seconds", type=float, default=20.0)
    parser.add_argument("--posters", type=int, default=64)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--probe-interval", type=float, default=0.1, help="seconds between one path's probes")
    parser.add_argument("--json", type=Path, default=Path("bench/results/ingest_poll_interference.json"))
    return parser.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
