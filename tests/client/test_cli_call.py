"""``hedgerow call`` as a subprocess against real upstreams on 127.0.0.1 (issue 3, item 5).

Upstreams are scripted servers running in the test's event loop (so the command is started
with ``asyncio.create_subprocess_exec`` and awaited, keeping the loop serving) or a simulated
replica in a background thread. Checks: the new flags act (``--stall-timeout``,
``--total-timeout``, ``--budget``), ``--json`` prints ``{text, reasoning_text, tool_calls,
finish_reason, record}`` on success and on failure (then with ``error``), exit 1 on failure and
exit 2 with one line naming the flag for bad values.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys

import pytest

from hedgerow.client import CallRecord
from hedgerow.sim import ReplicaConfig, ReplicaThread
from tests.client.scripted_server import Script, ScriptedServer, chunk, sse, usage_chunk

HEDGEROW = shutil.which("hedgerow", path=os.path.dirname(sys.executable)) or "hedgerow"
KEYS = {"text", "reasoning_text", "tool_calls", "finish_reason", "record"}


def answer(first_delay_s: float = 0.0, words: int = 3) -> Script:
    """A normal stream with reasoning first: "w0 w1 ...", finish ``stop``, usage."""
    chunks = [chunk(role="assistant", reasoning_content="think ")]
    chunks += [chunk(f"w{i} ") for i in range(words)] + [chunk(finish="stop"), usage_chunk(4, words + 1)]
    return Script(pieces=sse(*chunks, gap_s=0.01, first_delay_s=first_delay_s))


async def run_call(*args: str, timeout_s: float = 60.0) -> tuple[int, str, str]:
    """Run ``hedgerow call ARGS`` without blocking the event loop; returns (code, stdout, stderr)."""
    proc = await asyncio.create_subprocess_exec(
        HEDGEROW, "call", "--model", "m", "--prompt", "hi", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def parse(stdout: str) -> tuple[dict, CallRecord]:
    """The ``--json`` object and its record (validated by the wire format's own parser)."""
    lines = stdout.strip().splitlines()
    assert len(lines) == 1, stdout
    out = json.loads(lines[0])
    assert KEYS <= set(out), out
    return out, CallRecord.from_dict(out["record"])


async def test_json_success_against_a_sim_replica():
    replica = ReplicaThread(ReplicaConfig(name="r1", time_scale=0.01, seed=1), port=0).start()
    try:
        code, stdout, stderr = await run_call(
            "--upstream", f"r1={replica.base_url}", "--max-tokens", "5", "--json",
            "--stall-timeout", "5", "--total-timeout", "30", "--budget", "0.2")
    finally:
        replica.stop()
    assert code == 0, stderr
    out, record = parse(stdout)
    assert set(out) == KEYS  # no "error" on success
    assert out["text"] and out["finish_reason"] in ("stop", "length") and out["tool_calls"] == []
    assert record.status == "ok" and record.winner == "primary" and record.completion_tokens == 5


async def test_json_hedged_call_reports_reasoning_and_the_hedge():
    async with ScriptedServer(answer(first_delay_s=5.0)) as a, ScriptedServer(answer()) as b:
        code, stdout, stderr = await run_call(
            "--upstream", f"a={a.base_url}", "--upstream", f"b={b.base_url}", "--hedge-after", "0.3", "--json")
    assert code == 0, stderr
    out, record = parse(stdout)
    assert out["text"] == "w0 w1 w2 " and out["reasoning_text"] == "think " and out["finish_reason"] == "stop"
    assert record.hedged and record.hedge_reason == "ttft_timeout" and record.winner == "backup"
    assert record.hedge_after_s == 0.3 and len(b.requests) == 1


async def test_budget_zero_never_hedges():
    async with ScriptedServer(answer(first_delay_s=1.0)) as a, ScriptedServer(answer()) as b:
        code, stdout, stderr = await run_call(
            "--upstream", f"a={a.base_url}", "--upstream", f"b={b.base_url}",
            "--hedge-after", "0.2", "--budget", "0", "--json")
    assert code == 0, stderr
    _, record = parse(stdout)
    assert record.hedge_denied and not record.hedged and record.winner == "primary"
    assert b.requests == []


async def test_stall_timeout_fails_with_json_and_exit_1():
    pieces = sse(chunk("one ", role="assistant"), done=False) + sse(chunk("two "), first_delay_s=10.0)
    async with ScriptedServer(Script(pieces=pieces, close=False)) as a:
        code, stdout, stderr = await run_call("--upstream", f"a={a.base_url}", "--stall-timeout", "0.5", "--json")
    assert code == 1
    out, record = parse(stdout)
    assert out["text"] == "one " and out["finish_reason"] is None
    assert "stalled" in out["error"] and "\n" not in out["error"]
    assert record.status == "stalled" and record.error_type == "stall_timeout"
    assert stderr.strip().splitlines() == [f"hedgerow: {out['error']}"]


async def test_total_timeout_fails_with_json_and_exit_1():
    async with ScriptedServer(Script(header_delay_s=10.0, close=False)) as a:
        code, stdout, _ = await run_call("--upstream", f"a={a.base_url}", "--total-timeout", "0.8", "--json")
    assert code == 1
    out, record = parse(stdout)
    assert out["text"] == "" and "total_timeout_s=0.8" in out["error"]
    assert record.status == "timeout" and record.error_type == "total_timeout"


async def test_upstream_error_fails_with_json_and_exit_1():
    refusing = Script(status=401, content_type="application/json", pieces=[(0, b'{"error":"bad key"}')])
    async with ScriptedServer(refusing) as a, ScriptedServer(answer()) as b:
        code, stdout, _ = await run_call("--upstream", f"a={a.base_url}", "--upstream", f"b={b.base_url}", "--json")
    assert code == 1
    out, record = parse(stdout)
    assert "HTTP 401" in out["error"] and record.status == "error" and record.error_type == "http_401"
    assert b.requests == []


async def test_plain_output_streams_the_text_and_a_failure_is_one_line():
    async with ScriptedServer(answer()) as a:
        code, stdout, stderr = await run_call("--upstream", f"a={a.base_url}")
    assert code == 0 and stdout == "w0 w1 w2 \n", (stdout, stderr)
    cut = sse(chunk("one ", role="assistant"), done=False)  # closes without a finish_reason
    async with ScriptedServer(Script(pieces=cut)) as a:
        code, stdout, stderr = await run_call("--upstream", f"a={a.base_url}")
    assert code == 1 and stdout.startswith("one ")
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "truncated" in lines[0]


@pytest.mark.parametrize(("args", "flag"), [
    (["--stall-timeout", "0"], "--stall-timeout"),
    (["--stall-timeout", "soon"], "--stall-timeout"),
    (["--total-timeout", "-1"], "--total-timeout"),
    (["--total-timeout", "inf"], "--total-timeout"),
    (["--budget", "1.5"], "--budget"),
    (["--budget", "nan"], "--budget"),
    (["--budget", "ten percent"], "--budget"),
    (["--hedge-after", "-0.5"], "--hedge-after"),
    (["--upstream", "no-equals-sign"], "--upstream"),
])
def test_bad_flags_exit_2_with_one_line_naming_the_flag(args, flag):
    if "--upstream" not in args:
        args = ["--upstream", "a=http://127.0.0.1:9/v1", *args]
    proc = subprocess.run([HEDGEROW, "call", "--model", "m", "--prompt", "hi", *args],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"hedgerow: {flag}:"), proc.stderr
    assert proc.stdout == ""
