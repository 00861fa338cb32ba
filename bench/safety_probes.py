"""Benchmark: issue 31's "Safe by default" probes, run from outside against real ``hedgerow serve`` processes.

Each probe makes its own store (a SQLite file, or with ``--db`` a PostgreSQL database of its own)
and talks to ``serve`` over TCP, or runs the command line, the way an operator or an attacker would:

- ``p1`` (``bench/safety_probes_migrate.py``): ``--pairs`` pairs of concurrent migrations per mode
  on fresh stores, two ``hedgerow db upgrade`` at once and two ``hedgerow serve`` starting at once;
  a store is half-migrated when a third ``db upgrade`` then fails or the store is not at head.
  Target: no half-migrated store.
- ``p3`` (``bench/safety_probes_memory.py``): peak RSS of ``serve`` above its idle RSS while it
  answers one ``--body-mb`` body of empty JSON objects (admin token), then ``--uploads``
  unauthenticated uploads of that size at once. Target: each within 100 MB of idle.
- ``p4`` (``bench/safety_probes_rotation.py``): records lost by a ``TelemetryExporter`` sending at
  ``--rate`` records/s for ``--send-seconds`` while ``serve`` restarts on the same port with a new
  token and the client learns the new token a few seconds later. Target: none lost.
- ``p5`` (``bench/safety_probes_xsite.py``): cross-site and DNS-rebinding writes against a
  tokenless ``serve`` (foreign or null Origin, forged Host, ``Sec-Fetch-Site: cross-site``, form and
  text/plain bodies); the store's visible state is compared before and after each, and the same
  write sent same-origin must change it. Target: no forged write changes state.
- ``p6`` (``bench/safety_probes_sweep.py``): every GET of the OpenAPI document and the console
  pages with calendar-edge and malformed query values. Target: no answer of 500 or above.

Run: ``python bench/safety_probes.py [--probe p1,p3,p4,p5,p6] [--db postgresql+asyncpg://...]
[--pairs 50] [--body-mb 16] [--uploads 40] [--send-seconds 30] [--rate 200] [--quick]
[--json bench/results/safety_probes.json]``. ``--quick``: 2 pairs, a 1 MB body, 4 uploads, 8 s of
sending and a shorter sweep (a smoke run). Prints a table (probe | store | figure | target | pass)
and writes JSON; exits 1 when a probe misses its target.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the bench scripts import each other by file name

from safety_probes_common import ProbeResult
from safety_probes_memory import probe_memory
from safety_probes_migrate import probe_migrations
from safety_probes_rotation import probe_rotation
from safety_probes_sweep import probe_sweep
from safety_probes_xsite import probe_xsite

#: Each probe by name: a function of the parsed arguments and a work folder.
PROBES: dict[str, Callable[[argparse.Namespace, Path], list[ProbeResult]]] = {
    "p1": probe_migrations,
    "p3": probe_memory,
    "p4": probe_rotation,
    "p5": probe_xsite,
    "p6": probe_sweep,
}


def print_table(rows: list[ProbeResult]) -> None:
    """Print one line per result: probe, store, figure, target, pass or FAIL."""
    header = ("probe", "store", "figure", "target", "pass")
    lines = [(row.probe, row.store, row.figure, row.target, "pass" if row.passed else "FAIL") for row in rows]
    widths = [max(len(str(line[i])) for line in [header, *lines]) for i in range(len(header))]
    for line in [header, tuple("-" * width for width in widths), *lines]:
        print(" | ".join(str(cell).ljust(width) for cell, width in zip(line, widths, strict=True)))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line (see the module docstring); ``--quick`` fills in the smoke-run sizes.

    Raises:
        SystemExit: an unknown probe name, or a size below 1.
    """
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--probe", default=",".join(PROBES), help="comma-separated probes to run (p1,p3,p4,p5,p6)")
    parser.add_argument("--db", default=None, help="PostgreSQL server url (each probe makes a database of its own)")
    parser.add_argument("--pairs", type=int, default=None, help="p1: concurrent-migration pairs per mode (50)")
    parser.add_argument("--modes", default="upgrade,serve", help="p1: modes to run (upgrade,serve)")
    parser.add_argument("--body-mb", type=int, default=None, help="p3: size of the body and of each upload, MB (16)")
    parser.add_argument("--uploads", type=int, default=None, help="p3: unauthenticated uploads at once (40)")
    parser.add_argument("--send-seconds", type=float, default=None, help="p4: seconds of sending (30)")
    parser.add_argument("--rate", type=int, default=200, help="p4: records submitted per second (200)")
    parser.add_argument("--quick", action="store_true", help="a smoke run (small sizes)")
    parser.add_argument("--json", default="bench/results/safety_probes.json", help="where to write the JSON")
    args = parser.parse_args(argv)
    names = [name.strip() for name in args.probe.split(",") if name.strip()]
    unknown = [name for name in names if name not in PROBES]
    if unknown or not names:
        parser.error(f"--probe: unknown probe(s) {unknown or names}; choose from {', '.join(PROBES)}")
    args.probes = names
    modes = [mode.strip() for mode in args.modes.split(",") if mode.strip()]
    if not modes or any(mode not in ("upgrade", "serve") for mode in modes):
        parser.error(f"--modes: expected upgrade and/or serve, got {args.modes!r}")
    args.mode_list = modes
    quick = args.quick
    args.pairs = args.pairs if args.pairs is not None else (2 if quick else 50)
    args.body_mb = args.body_mb if args.body_mb is not None else (1 if quick else 16)
    args.uploads = args.uploads if args.uploads is not None else (4 if quick else 40)
    args.send_seconds = args.send_seconds if args.send_seconds is not None else (8.0 if quick else 30.0)
    for name in ("pairs", "body_mb", "uploads", "rate"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')}: must be at least 1, got {getattr(args, name)}")
    if args.send_seconds < 4:
        parser.error(f"--send-seconds: must be at least 4 (the restart happens inside it), got {args.send_seconds}")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the chosen probes, print the table, write the JSON; returns 0 when every probe passed, else 1."""
    args = parse_args(argv)
    rows: list[ProbeResult] = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="safety_probes_") as tmp:
        for name in args.probes:
            workdir = Path(tmp) / name
            workdir.mkdir()
            rows += PROBES[name](args, workdir)
    print_table(rows)
    document = {
        "benchmark": "safety_probes",
        "store": "postgresql" if args.db else "sqlite",
        "quick": args.quick,
        "load_average": list(os.getloadavg()),
        "seconds": round(time.monotonic() - started, 1),
        "results": [
            {"probe": r.probe, "store": r.store, "figure": r.figure, "target": r.target, "passed": r.passed, **r.detail}
            for r in rows
        ],
    }
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(document, indent=1, default=str))
    print(f"wrote {out}")
    return 0 if all(row.passed for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
