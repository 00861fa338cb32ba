"""Probe p1 of ``bench/safety_probes.py``: concurrent migrations leave no half-migrated store.

For each mode and pair, a fresh store gets two migrations at once: two ``hedgerow db upgrade``
processes (mode ``upgrade``) or two ``hedgerow serve`` processes starting together (mode
``serve``, each must announce its address and stop cleanly on SIGTERM). Then a third
``hedgerow db upgrade`` must succeed and the store must answer at head
(``hedgerow.controller.store.db.check_ready``); a store failing that is half-migrated.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

from safety_probes_common import ProbeResult, Serve, fresh_store, run_cli, store_kind

from tests.helpers import store_revision


def usable(url: str) -> tuple[bool, str]:
    """Whether a third ``db upgrade`` succeeds on the store at ``url`` and it then answers at head.

    Returns:
        (usable, what went wrong or the head revision).
    """
    code, output = run_cli(["db", "upgrade", "--db", url])
    if code != 0:
        return False, f"third db upgrade exited {code}: {output[-600:]}"
    try:
        return True, asyncio.run(store_revision(url))
    except Exception as exc:  # any failure here means the store is not usable; it is reported
        return False, f"{type(exc).__name__}: {exc}"[-600:]


def upgrade_pair(url: str) -> list[str]:
    """Two ``hedgerow db upgrade`` at once on ``url``; returns what went wrong in each (empty when both succeeded)."""
    command = [sys.executable, "-m", "hedgerow.cli", "db", "upgrade", "--db", url]
    procs = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    failures = []
    for proc in procs:
        output, _ = proc.communicate(timeout=600)
        if proc.returncode != 0:
            failures.append(f"exit {proc.returncode}: {output.strip()[-600:]}")
    return failures


def serve_pair(url: str, workdir: Path, tag: str) -> list[str]:
    """Two ``hedgerow serve`` starting at once on ``url``; returns what went wrong (empty: both came up and stopped)."""
    serves = [Serve(url, workdir, f"{tag}_{i}") for i in range(2)]
    ups = [serve.wait_up() for serve in serves]
    failures = []
    for serve, up in zip(serves, ups, strict=True):
        code = serve.stop()
        if up is None or code not in (0, -15):
            failures.append(f"up={up is not None} exit {code}: {serve.stderr()[-600:]}")
    return failures


def probe_migrations(args: argparse.Namespace, workdir: Path) -> list[ProbeResult]:
    """Run ``args.pairs`` pairs for each of ``args.mode_list`` on the store of ``args.db``; one result per mode."""
    store = store_kind(args.db)
    results = []
    for mode in args.mode_list:
        failed_runs, half_migrated = 0, 0
        failures: list[dict[str, Any]] = []
        for pair in range(args.pairs):
            with fresh_store(args.db, workdir, "p1") as url:
                runs = upgrade_pair(url) if mode == "upgrade" else serve_pair(url, workdir, f"p1_{pair}")
                failed_runs += len(runs)
                failures += [{"pair": pair, "run": text} for text in runs]
                ok, note = usable(url)
                if not ok:
                    half_migrated += 1
                    failures.append({"pair": pair, "store": note})
        results.append(
            ProbeResult(
                probe=f"p1 {mode} pairs",
                store=store,
                figure=f"{half_migrated} half-migrated / {args.pairs} ({failed_runs} failed runs)",
                target="0 half-migrated",
                passed=half_migrated == 0,
                detail={
                    "pairs": args.pairs,
                    "half_migrated": half_migrated,
                    "failed_runs": failed_runs,
                    "failures": failures[:10],
                },
            )
        )
    return results
