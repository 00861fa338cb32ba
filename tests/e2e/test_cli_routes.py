"""``hedgerow routes ...`` and ``hedgerow --version`` against a real ``hedgerow serve`` with tokens.

The served process logs JSON lines (``HEDGEROW_LOG_FORMAT=json``): the change made with ``routes
set`` must appear as one ``threshold_changed`` line under the token's name.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from hedgerow import __version__
from tests.conftest import make_call
from tests.serve_process import ServeProcess

pytestmark = pytest.mark.slow

ADMIN = "adm1n-token"
READ = "r3ad-token"


@pytest.fixture
def served(tmp_path: Path) -> Iterator[ServeProcess]:
    """A serve process with tokens and JSON logs; 200 calls of ``summarize`` ticked twice."""
    env = {
        "HEDGEROW_CONTROLLER_INTERVAL_S": "3600",
        "HEDGEROW_MIN_SAMPLES": "20",
        "HEDGEROW_TOKENS": f"ops={ADMIN}:admin,{READ}:read",
        "HEDGEROW_LOG_FORMAT": "json",
    }
    process = ServeProcess(f"sqlite:///{tmp_path / 'cli.db'}", tmp_path, env)  # a plain sqlite:/// url
    try:
        rng = random.Random(3)
        now = datetime.now(UTC)
        calls = [
            make_call(
                f"c{i}", started_at=now - timedelta(seconds=rng.uniform(1, 900)), primary_ttft_s=rng.uniform(0.2, 1.2)
            )
            for i in range(200)
        ]
        admin = {"Authorization": f"Bearer {ADMIN}"}
        body = {"calls": [c.to_dict() for c in calls]}
        assert httpx.post(f"{process.url}/v1/calls", json=body, headers=admin).status_code == 202
        for _ in range(2):
            assert httpx.post(f"{process.url}/v1/controller/run", headers=admin, timeout=120).json()["ran"] is True
        yield process
    finally:
        process.stop()


def _cli(*args: str, token: str | None = None, api: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HEDGEROW_")}
    env["COLUMNS"] = "200"
    if token is not None:
        env["HEDGEROW_TOKEN"] = token
    if api is not None:
        env["HEDGEROW_API_URL"] = api
    return subprocess.run(
        [sys.executable, "-m", "hedgerow.cli", *args], capture_output=True, text=True, env=env, timeout=120, check=False
    )


def test_version() -> None:
    result = _cli("--version")
    assert result.returncode == 0 and result.stdout.strip() == f"hedgerow {__version__}"


def test_list_show_history_and_set_against_a_real_serve(served: ServeProcess) -> None:
    listed = _cli("routes", "list", "--json", token=READ, api=served.url)
    assert listed.returncode == 0, listed.stderr
    [route] = json.loads(listed.stdout)["routes"]
    assert (route["route"], route["model"], route["threshold"]["source"]) == ("summarize", "m1", "controller")
    table = _cli("routes", "list", "--api", served.url, "--token", READ)
    assert table.returncode == 0 and "summarize" in table.stdout and "controller" in table.stdout

    shown = _cli("routes", "show", "summarize", "--json", token=READ, api=served.url)  # no --model: one model
    assert json.loads(shown.stdout)["model"] == "m1"
    assert "published hedge_after_s" in _cli("routes", "show", "summarize", token=READ, api=served.url).stdout

    history = json.loads(_cli("routes", "history", "summarize", "--json", token=READ, api=served.url).stdout)
    rows = history["history"]
    assert rows and rows[-1]["applied"] is True and all(row["route"] == "summarize" for row in rows)

    denied = _cli("routes", "set", "summarize", "--budget", "0.2", token=READ, api=served.url)
    assert denied.returncode == 1 and "403" in denied.stderr and "admin" in denied.stderr

    changed = _cli("routes", "set", "summarize", "--budget", "0.2", "--pin", "4", token=ADMIN, api=served.url)
    assert changed.returncode == 0, changed.stderr
    assert "budget" in changed.stdout and "pinned_hedge_after_s" in changed.stdout

    applied = json.loads(
        _cli("routes", "history", "summarize", "--applied", "--limit", "1", "--json", token=READ, api=served.url).stdout
    )["history"]
    assert applied[0]["reason"].startswith("config") and applied[0]["actor"] == "ops"
    assert applied[0]["hedge_after_s"] == 4.0

    unpinned = _cli("routes", "set", "summarize", "--unpin", "--disable", "--json", token=ADMIN, api=served.url)
    assert json.loads(unpinned.stdout)["route"]["enabled"] is False

    events = [json.loads(line) for line in served.log.read_text().splitlines() if line.startswith("{")]
    changes = [e for e in events if e.get("event") == "threshold_changed"]
    assert any(e["actor"] == "ops" and e["to_s"] == 4.0 and e["from_s"] is not None for e in changes), changes
    assert any(e.get("event") == "lease_acquired" for e in events)


def test_errors_are_one_line_with_the_right_exit_status(served: ServeProcess, tmp_path: Path) -> None:
    unknown = _cli("routes", "show", "nope", token=READ, api=served.url)
    assert unknown.returncode == 1 and "404" in unknown.stderr and "Traceback" not in unknown.stderr
    bad_pin = _cli("routes", "set", "summarize", "--pin", "100", token=ADMIN, api=served.url)  # max is 30 s
    assert bad_pin.returncode == 2 and "pinned_hedge_after_s" in bad_pin.stderr  # a value the api refused (422)
    both = _cli("routes", "set", "summarize", "--pin", "1", "--unpin", token=ADMIN, api=served.url)
    assert both.returncode == 2 and "--pin" in both.stderr
    nothing = _cli("routes", "set", "summarize", token=ADMIN, api=served.url)
    assert nothing.returncode == 2 and "nothing to change" in nothing.stderr
    no_token = _cli("routes", "list", api=served.url)
    assert no_token.returncode == 1 and "401" in no_token.stderr
    unreachable = _cli("routes", "list", api="http://127.0.0.1:9")
    assert unreachable.returncode == 1 and "cannot reach the api" in unreachable.stderr


def test_archive_and_restore_against_a_real_serve(served: ServeProcess) -> None:
    admin = {"Authorization": f"Bearer {ADMIN}"}
    extra = make_call("other-1", route="junk/route", started_at=datetime.now(UTC) - timedelta(seconds=5))
    assert httpx.post(f"{served.url}/v1/calls", json={"calls": [extra.to_dict()]}, headers=admin).status_code == 202

    denied = _cli("routes", "archive", "junk/route", token=READ, api=served.url)
    assert denied.returncode == 1 and "403" in denied.stderr and "admin" in denied.stderr
    archived = _cli("routes", "archive", "junk/route", token=ADMIN, api=served.url)  # no --model: one model
    assert archived.returncode == 0, archived.stderr
    assert "junk/route · m1: archived" in archived.stdout and "by ops" in archived.stdout
    again = _cli("routes", "archive", "junk/route", "--model", "m1", "--json", token=ADMIN, api=served.url)
    assert again.returncode == 0 and json.loads(again.stdout)["history"] is None

    listed = json.loads(_cli("routes", "list", "--json", token=READ, api=served.url).stdout)["routes"]
    assert [r["route"] for r in listed] == ["summarize"]
    table = _cli("routes", "list", "--archived", token=READ, api=served.url)
    assert table.returncode == 0 and "junk/route" in table.stdout and "ops" in table.stdout
    assert "summarize" not in table.stdout
    thresholds = httpx.get(f"{served.url}/v1/thresholds", headers={"Authorization": f"Bearer {READ}"}).json()
    assert [t["route"] for t in thresholds["thresholds"]] == ["summarize"]
    history = json.loads(_cli("routes", "history", "junk/route", "--json", token=READ, api=served.url).stdout)
    assert history["history"][0]["reason"] == "archived" and history["history"][0]["actor"] == "ops"
    by_reason = _cli("routes", "history", "junk/route", "--reason", "archived", token=READ, api=served.url)
    assert by_reason.returncode == 0 and "an operator archived the route" in by_reason.stdout

    late = make_call("other-2", route="junk/route", started_at=datetime.now(UTC) - timedelta(seconds=1))
    refused = httpx.post(f"{served.url}/v1/calls", json={"calls": [late.to_dict()]}, headers=admin)
    assert refused.status_code == 422 and "archived" in refused.json()["detail"]["message"]

    unknown = _cli("routes", "archive", "nope", "--model", "m1", token=ADMIN, api=served.url)
    assert unknown.returncode == 1 and "404" in unknown.stderr and "'nope'" in unknown.stderr
    restored = _cli("routes", "restore", "junk/route", token=ADMIN, api=served.url)
    assert restored.returncode == 0 and "restored" in restored.stdout, restored.stderr
    listed = json.loads(_cli("routes", "list", "--json", token=READ, api=served.url).stdout)["routes"]
    assert [r["route"] for r in listed] == ["junk/route", "summarize"]
