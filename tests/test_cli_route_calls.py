"""``hedgerow routes calls`` (and the failed calls of ``routes list``) against a real ``hedgerow serve``."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from tests.controller.calls_seed import explorer_records
from tests.serve_process import ServeProcess


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HEDGEROW_")} | {"COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "hedgerow.cli", *args], capture_output=True, text=True, env=env, timeout=120, check=False
    )


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    """A serve process holding 12 calls of route ``r`` (every outcome); the newest call's backup
    upstream is named ``[red]b`` (rich markup, shown as typed); calls ``c0003`` and ``c0008`` were
    made with the gateway key ``alice`` (the others' client is ``seed``)."""
    tmp = tmp_path_factory.mktemp("cli-calls")
    process = ServeProcess(f"sqlite:///{tmp / 'calls.db'}", tmp, {"HEDGEROW_CONTROLLER_INTERVAL_S": "3600"})
    try:
        records = explorer_records(datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=1), 12)
        hedge = records[1]
        marked = dataclasses.replace(hedge.attempts[1], upstream="[red]b")
        records[1] = dataclasses.replace(hedge, attempts=(hedge.attempts[0], marked))
        for index in (3, 8):
            records[index] = dataclasses.replace(records[index], client="alice")
        answer = httpx.post(f"{process.url}/v1/calls", json={"calls": [r.to_dict() for r in records]}, timeout=60)
        assert answer.status_code == 202, answer.text
        yield process
    finally:
        process.stop()


@pytest.mark.slow
def test_the_table_shows_each_call_with_its_attempts_and_pages_on(served: ServeProcess) -> None:
    first = _cli("routes", "calls", "r", "--limit", "5", "--api", served.url)
    assert first.returncode == 0, first.stderr
    assert "r · m1: 5 call(s)" in first.stdout
    assert "hedge_won" in first.stdout and "[red]b backup won ttft 0.3 s" in first.stdout
    assert "a primary cancelled censored >1.3 s" in first.stdout
    assert "a primary failed http_503" in first.stdout and "c backup won" in first.stdout
    more = [line for line in first.stdout.splitlines() if line.startswith("more: --cursor ")]
    assert len(more) == 1
    cursor = more[0].removeprefix("more: --cursor ")
    second = _cli("routes", "calls", "r", "--limit", "5", "--cursor", cursor, "--json", "--api", served.url)
    assert second.returncode == 0, second.stderr
    page = json.loads(second.stdout)
    assert [c["request_id"] for c in page["calls"]] == [f"c{i:04d}" for i in range(5, 10)]


@pytest.mark.slow
def test_filters_reach_the_api(served: ServeProcess) -> None:
    done = _cli("routes", "calls", "r", "--outcome", "failover", "--winner", "c", "--json", "--api", served.url)
    assert done.returncode == 0, done.stderr
    calls = json.loads(done.stdout)["calls"]
    assert [c["request_id"] for c in calls] == ["c0002", "c0007"]
    failed_on_a = _cli("routes", "calls", "r", "--failed-upstream", "a", "--json", "--api", served.url)
    assert failed_on_a.returncode == 0, failed_on_a.stderr
    assert {c["outcome"] for c in json.loads(failed_on_a.stdout)["calls"]} == {"failover", "failed"}
    on_c = _cli("routes", "calls", "r", "--upstream", "c", "--json", "--api", served.url)
    assert {c["outcome"] for c in json.loads(on_c.stdout)["calls"]} == {"failover"}
    today = datetime.now(UTC).date().isoformat()
    tomorrow = (datetime.now(UTC) + timedelta(days=1)).date().isoformat()
    assert (
        _cli("routes", "calls", "r", "--since", tomorrow, "--json", "--api", served.url).stdout.count("request_id") == 0
    )
    assert json.loads(_cli("routes", "calls", "r", "--since", today, "--json", "--api", served.url).stdout)["calls"]


@pytest.mark.slow
def test_the_client_flag_keeps_one_callers_calls_and_the_table_shows_the_client(served: ServeProcess) -> None:
    done = _cli("routes", "calls", "r", "--client", "alice", "--json", "--api", served.url)
    assert done.returncode == 0, done.stderr
    assert [c["request_id"] for c in json.loads(done.stdout)["calls"]] == ["c0003", "c0008"]
    table = _cli("routes", "calls", "r", "--client", "alice", "--outcome", "failed", "--api", served.url)
    assert table.returncode == 0, table.stderr
    assert "r · m1: 2 call(s)" in table.stdout and "client" in table.stdout and "alice" in table.stdout
    assert "seed" not in table.stdout


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--outcome", "won"], "--outcome: unknown outcome 'won'"),
        (["--limit", "0"], "--limit: must be from 1 to 500"),
        (["--since", "soon"], "--since: not an ISO 8601 date or time"),
        (["--since", "2026-12-02", "--until", "2026-12-01"], "--since: must not be after until"),
        (["--winner", "a\tb"], "--winner: must not contain control characters"),
        (["--failed-upstream", "a\tb"], "--failed-upstream: must not contain control characters"),
        (["--client", "a\tb"], "--client: must not contain control characters"),
    ],
)
def test_bad_flags_exit_2_naming_the_flag_before_any_request(args: list[str], words: str) -> None:
    done = _cli("routes", "calls", "r", *args, "--api", "http://127.0.0.1:9")  # nothing listens there
    assert done.returncode == 2 and words in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_a_route_ending_in_calls_is_refused_with_the_command_to_use() -> None:
    done = _cli("routes", "calls", "team/calls", "--api", "http://127.0.0.1:9")
    assert done.returncode == 2 and "use `hedgerow routes calls R`" in done.stderr, done.stderr


@pytest.mark.slow
def test_an_unknown_route_is_one_line_exit_1(served: ServeProcess) -> None:
    done = _cli("routes", "calls", "nope", "--api", served.url)
    assert done.returncode == 1 and "404" in done.stderr and "no route 'nope'" in done.stderr, done.stderr


def test_the_command_is_listed() -> None:
    assert "calls" in _cli("routes", "--help").stdout


@pytest.mark.slow
def test_routes_list_shows_the_failed_calls_and_the_command_listing_them(served: ServeProcess) -> None:
    done = _cli("routes", "list", "--api", served.url)
    assert done.returncode == 0, done.stderr
    assert "failed (1 h)" in done.stdout and "16.7% (2)" in done.stdout, done.stdout  # 2 of the 12 calls
    [line] = [line for line in done.stdout.splitlines() if "failed call(s)" in line]
    assert line.startswith("r · m1: 2 failed call(s): hedgerow routes calls r --model m1 --outcome failed --since ")
    command = line.split("): ", 1)[1].split()[1:]  # the command as printed, after "hedgerow"
    listed = _cli(*command, "--json", "--api", served.url)
    assert listed.returncode == 0, listed.stderr
    assert [c["outcome"] for c in json.loads(listed.stdout)["calls"]] == ["failed", "failed"]
