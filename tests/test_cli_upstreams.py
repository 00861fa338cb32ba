"""``hedgerow upstreams list`` against a real ``hedgerow serve`` fed over HTTP: the table, its
escaping, ``--json``, ``--route`` and the flags it refuses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from hedgerow.client.records import AttemptRecord, CallRecord
from tests.serve_process import ServeProcess


def _cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("HEDGEROW_")} | {"COLUMNS": "200"} | env
    return subprocess.run(
        [sys.executable, "-m", "hedgerow.cli", *args], capture_output=True, text=True, env=clean, timeout=120,
        check=False,
    )  # fmt: skip


def _records() -> list[dict[str, Any]]:
    now = datetime.now(UTC)
    out: list[CallRecord] = []
    atts: tuple[AttemptRecord, ...]
    for i in range(4):  # "[bold]a[/]" is the slow primary, "b|c" wins; 3 loser tokens each
        atts = (
            AttemptRecord("[bold]a[/]", "primary", 0.0, None, 0.9, "cancelled", 200, None, 3),
            AttemptRecord("b|c", "backup", 0.5, 0.9, 2.0, "won", 200, None, 20),
        )
        out.append(CallRecord(f"h{i}", "chat", "m1", now - timedelta(minutes=2), hedged=True, prompt_tokens=250,
                              hedge_reason="ttft_timeout", winner="backup", ttft_s=0.9, attempts=atts))  # fmt: skip
    atts = (AttemptRecord("b|c", "primary", 0.0, None, 9.0, "failed", None, "total_timeout", 0),)
    out.append(CallRecord("t1", "other", "m1", now - timedelta(minutes=1), status="timeout",
                          error_type="total_timeout", attempts=atts))  # fmt: skip
    return [r.to_dict() for r in out]


@pytest.mark.slow
def test_upstreams_list_against_a_running_serve(tmp_path: Path) -> None:
    env = {"HEDGEROW_CONTROLLER_INTERVAL_S": "3600", "HEDGEROW_TOKENS": "ing:ingest,r3ad:read"}
    served = ServeProcess(f"sqlite:///{tmp_path / 'u.db'}", tmp_path, env)
    try:
        posted = httpx.post(
            f"{served.url}/v1/calls", json={"calls": _records()}, headers={"Authorization": "Bearer ing"}, timeout=60
        )
        assert posted.status_code == 202, posted.text
        table = _cli("upstreams", "list", "--api", served.url, "--token", "r3ad")
        as_json = _cli("upstreams", "list", "--api", served.url, "--token", "r3ad", "--json", "--route", "chat")
        no_token = _cli("upstreams", "list", "--api", served.url)
        window = _cli(
            "upstreams", "list", "--api", served.url, "--token", "r3ad",
            "--since", (datetime.now(UTC) - timedelta(hours=1)).isoformat(), "--until", datetime.now(UTC).isoformat(),
        )  # fmt: skip
        before = _cli(
            "upstreams", "list", "--api", served.url, "--token", "r3ad",
            "--since", "2020-01-01T00:00:00Z", "--until", "2020-01-02T00:00:00Z",
        )  # fmt: skip
    finally:
        served.stop()
    assert table.returncode == 0, table.stderr
    assert "[bold]a[/]" in table.stdout and "b|c" in table.stdout, table.stdout  # shown as text, not markup
    assert "2 upstream(s), every route" in table.stdout
    assert "100.0% of 4" in table.stdout and "20.0%" in table.stdout  # b|c: wins, and 1 timeout of 5
    assert as_json.returncode == 0, as_json.stderr
    data = json.loads(as_json.stdout)
    rows = {row["upstream"]: row for row in data["upstreams"]}
    assert data["route"] == "chat" and set(rows) == {"[bold]a[/]", "b|c"}
    assert rows["[bold]a[/]"]["hedges_caused"] == 4 and rows["[bold]a[/]"]["loser_completion_tokens"] == 12
    # the cancelled primaries each prefilled the call's 250-token prompt: 1000, in the table too
    assert rows["[bold]a[/]"]["loser_prompt_tokens"] == 1000 and "loser_prompt_tokens" in table.stdout
    assert "1000" in table.stdout
    # a window before the stored data: an empty table, and a note saying why
    assert before.returncode == 0 and "0 upstream(s)" in before.stdout, before.stderr
    assert "The window ends before the oldest raw call stored" in before.stdout
    assert no_token.returncode == 1 and "--token" in no_token.stderr
    assert window.returncode == 0 and "2 upstream(s)" in window.stdout, window.stderr


def test_bad_flags_exit_2_naming_them() -> None:
    api = ("--api", "http://127.0.0.1:9")  # never reached: the flags are refused first
    cases = [
        (("--since", "yesterday"), "--since: not an ISO 8601"),
        (("--since", "2026-12-02", "--until", "2026-12-01"), "--since: must be before until"),
        (("--since", "2026-10-01", "--until", "2026-12-01"), "--since: the window is 61.0 days; at most 32 days"),
        (("--route", "a\x01b"), "--route: must not contain control characters"),
    ]
    for flags, message in cases:
        done = _cli("upstreams", "list", *api, *flags)
        assert done.returncode == 2 and message in done.stderr, (flags, done.stderr)
        assert "Traceback" not in done.stderr
