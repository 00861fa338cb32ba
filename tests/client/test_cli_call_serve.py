"""``hedgerow call --serve URL --repeat N --concurrency C``: one command feeds a running serve.

There was no CLI way to send traffic to a running ``hedgerow serve``: ``call`` sent one request
and kept its record to itself. With ``--serve`` each call's record is posted to the server (its
``TelemetryExporter``), and ``--repeat``/``--concurrency`` make one command a stream of calls.
Real processes on loopback: ``hedgerow serve`` on SQLite, a simulated replica, the command.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
from pathlib import Path

import pytest

from hedgerow.sim import ReplicaConfig, ReplicaThread
from tests.client.test_cli_call import HEDGEROW
from tests.serve_process import ServeProcess


def _call(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [HEDGEROW, "call", "--model", "m1", "--prompt", "hi", "--max-tokens", "3", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.slow
def test_repeat_feeds_a_running_serve(tmp_path: Path) -> None:
    db = tmp_path / "fed.db"
    server = ServeProcess(f"sqlite:///{db}", tmp_path, {"HEDGEROW_CONTROLLER_INTERVAL_S": "3600"})
    configs = [ReplicaConfig(name=n, time_scale=0.01, seed=i) for i, n in enumerate("ab")]
    replicas = [ReplicaThread(config, port=0).start() for config in configs]
    try:
        ups = [arg for r in replicas for arg in ("--upstream", f"{r.config.name}={r.base_url}")]
        done = _call(*ups, "--route", "fed", "--serve", server.url, "--repeat", "25", "--concurrency", "4")
        assert done.returncode == 0, done.stdout + done.stderr
        assert done.stdout.startswith("25 calls: 25 ok, 0 failed, "), done.stdout
        assert "TTFT P50 " in done.stdout
        lines = _call(*ups, "--route", "fed", "--serve", server.url, "--repeat", "3", "--json")
        assert lines.returncode == 0, lines.stderr
        records = [json.loads(line)["record"] for line in lines.stdout.splitlines()]
        assert len(records) == 3 and all(r["route"] == "fed" and r["status"] == "ok" for r in records)
        assert lines.stderr.startswith("3 calls: 3 ok")  # the summary stays off stdout's JSON lines
        one = _call(*ups, "--route", "fed", "--serve", server.url)  # a single call is exported too
        assert one.returncode == 0, one.stderr
    finally:
        for replica in replicas:
            replica.stop()
        server.stop()
    with sqlite3.connect(db) as store:
        (count,) = store.execute(
            "SELECT count(*) FROM calls JOIN routes ON routes.id = calls.route_id WHERE routes.route = 'fed'"
        ).fetchone()
    assert count == 25 + 3 + 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--repeat", "0"], "--repeat: must be an integer from 1 to 100000, got '0'"),
        (["--repeat", "100001"], "--repeat: must be an integer from 1 to 100000, got '100001'"),
        (["--repeat", "2", "--concurrency", "65"], "--concurrency: must be an integer from 1 to 64, got '65'"),
        (["--repeat", "x"], "--repeat: must be an integer from 1 to 100000, got 'x'"),
        (["--concurrency", "4"], "--concurrency: only with --repeat N (N > 1)"),
        (["--serve", "ftp://127.0.0.1:1"], "--serve: "),
    ],
)
def test_bad_repeat_concurrency_or_serve_exit_2_naming_the_flag(args: list[str], message: str) -> None:
    done = _call("--upstream", "a=http://127.0.0.1:9/v1", *args)
    assert done.returncode == 2, done.stdout + done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr


@pytest.mark.slow
def test_records_the_serve_did_not_take_fail_the_command(tmp_path: Path) -> None:
    """A --serve URL where nothing listens: the call itself works, but its record is lost; the
    command says so (exit 1) instead of passing silently."""
    replica = ReplicaThread(ReplicaConfig(name="a", time_scale=0.01), port=0).start()
    try:
        done = _call("--upstream", f"a={replica.base_url}", "--serve", "http://127.0.0.1:9", "--json")
    finally:
        replica.stop()
    assert done.returncode == 1, done.stdout + done.stderr
    assert json.loads(done.stdout)["record"]["status"] == "ok"
    assert "--serve: http://127.0.0.1:9 did not take every record (1 unsent" in done.stderr
