"""The parts every probe of ``bench/safety_probes.py`` shares: a fresh store, a ``serve`` process, a result row.

A store is a SQLite file in the run's work folder, or, with a PostgreSQL server url, a database
of its own on that server (dropped afterwards). ``serve`` runs as a real subprocess
(``python -m hedgerow.cli serve --port 0`` unless a port is given), its logs in files, its address
read from the line it prints once listening, so every probe talks to it from outside over TCP.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from tests.conftest import create_pg_database, drop_pg_database
from tests.helpers import stored_calls

#: The line ``hedgerow serve`` prints once its socket listens.
ANNOUNCEMENT = re.compile(r"hedgerow: api listening on (http://127\.0\.0\.1:(\d+)) ")


@dataclasses.dataclass
class ProbeResult:
    """One row of the report: what a probe measured on one store against its target.

    Attributes:
        probe: the probe's name (``p1`` ... ``p6``) and case.
        store: ``sqlite`` or ``postgresql``.
        figure: the measured figure, as printed.
        target: what issue 31 asks of it, as printed.
        passed: whether the figure meets the target.
        detail: the numbers behind the figure (written to the JSON).
    """

    probe: str
    store: str
    figure: str
    target: str
    passed: bool
    detail: dict[str, Any] = dataclasses.field(default_factory=dict)


def store_kind(db: str | None) -> str:
    """``postgresql`` when ``db`` (a server url or None) names a PostgreSQL server, else ``sqlite``."""
    return "postgresql" if db else "sqlite"


@contextlib.contextmanager
def fresh_store(db: str | None, workdir: Path, prefix: str) -> Iterator[str]:
    """An empty store for one probe; yields its SQLAlchemy async url.

    Args:
        db: a PostgreSQL server url (a database of its own is made there and dropped at exit), or
            None for a new SQLite file in ``workdir`` (deleted at exit with its WAL files).
        workdir: the folder for SQLite files.
        prefix: the start of the database or file name.
    """
    if db:
        url = asyncio.run(create_pg_database(db, f"safety_{prefix}"))
        try:
            yield url
        finally:
            asyncio.run(drop_pg_database(url))
        return
    path = workdir / f"{prefix}_{uuid.uuid4().hex[:8]}.db"
    try:
        yield f"sqlite+aiosqlite:///{path}"
    finally:
        for suffix in ("", "-wal", "-shm", "-journal"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)


def count_calls(url: str) -> int:
    """How many calls the store at ``url`` (SQLAlchemy async url) holds (from a synchronous probe)."""
    return asyncio.run(stored_calls(url))


class Serve:
    """A ``hedgerow serve`` subprocess with its stdout and stderr in ``workdir/<stem>.{out,err}.log``.

    Args:
        db_url: the store's SQLAlchemy url (``--db``).
        workdir: the folder for its log files.
        stem: the log files' name stem (two servers at once need two).
        env: ``HEDGEROW_*`` variables added to this process's environment; the scheduled tick is
            put an hour away unless ``HEDGEROW_CONTROLLER_INTERVAL_S`` is given.
        port: the TCP port to listen on; 0 picks a free one.
    """

    def __init__(
        self, db_url: str, workdir: Path, stem: str, env: Mapping[str, str] | None = None, port: int = 0
    ) -> None:
        self.out_path = workdir / f"{stem}.out.log"
        self.err_path = workdir / f"{stem}.err.log"
        command = [sys.executable, "-m", "hedgerow.cli", "serve", "--db", db_url, "--port", str(port)]
        environment = {**os.environ, "HEDGEROW_CONTROLLER_INTERVAL_S": "3600", **(env or {})}
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            self.proc = subprocess.Popen(command, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=environment)
        self.url: str | None = None

    def wait_up(self, timeout_s: float = 120.0) -> str | None:
        """Wait for the listening line; returns the root url, or None if it exited or ``timeout_s`` passed."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            match = ANNOUNCEMENT.search(self.out_path.read_text(errors="replace"))
            if match:
                self.url = match.group(1)
                return self.url
            if self.proc.poll() is not None:
                return None
            time.sleep(0.05)
        return None

    def started(self) -> str:
        """Wait for the listening line and return the root url.

        Raises:
            RuntimeError: the server exited or did not announce its address within 120 s.
        """
        url = self.wait_up()
        if url is None:
            self.stop()
            raise RuntimeError(f"hedgerow serve did not come up; stderr: {self.stderr()[-2000:]}")
        return url

    def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM, then kill after ``timeout_s`` seconds; returns the exit code. Safe to call twice."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def stderr(self) -> str:
        """Everything the process has written to stderr so far."""
        return self.err_path.read_text(errors="replace")


def run_cli(args: Sequence[str], timeout_s: float = 300.0) -> tuple[int, str]:
    """Run ``python -m hedgerow.cli ARGS`` to the end; returns its exit code and the tail of its output."""
    done = subprocess.run(
        [sys.executable, "-m", "hedgerow.cli", *args], capture_output=True, text=True, timeout=timeout_s, check=False
    )
    return done.returncode, (done.stdout + done.stderr).strip()[-1500:]


def rss_bytes(pid: int) -> int:
    """The resident set size of process ``pid`` now (``VmRSS``), bytes; 0 once it is gone."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0
