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
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

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
        HEDGEROW,
        "call",
        "--model",
        "m",
        "--prompt",
        "hi",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def parse(stdout: str) -> tuple[dict[str, Any], CallRecord]:
    """The ``--json`` object and its record (validated by the wire format's own parser)."""
    lines = stdout.strip().splitlines()
    assert len(lines) == 1, stdout
    out = json.loads(lines[0])
    assert set(out) >= KEYS, out
    return out, CallRecord.from_dict(out["record"])


async def test_json_success_against_a_sim_replica() -> None:
    replica = ReplicaThread(ReplicaConfig(name="r1", time_scale=0.01, seed=1), port=0).start()
    try:
        code, stdout, stderr = await run_call(
            "--upstream",
            f"r1={replica.base_url}",
            "--max-tokens",
            "5",
            "--json",
            "--stall-timeout",
            "5",
            "--total-timeout",
            "30",
            "--budget",
            "0.2",
        )
    finally:
        replica.stop()
    assert code == 0, stderr
    out, record = parse(stdout)
    assert set(out) == KEYS  # no "error" on success
    assert out["text"] and out["finish_reason"] in ("stop", "length") and out["tool_calls"] == []
    assert record.status == "ok" and record.winner == "primary" and record.completion_tokens == 5


async def test_json_hedged_call_reports_reasoning_and_the_hedge() -> None:
    async with ScriptedServer(answer(first_delay_s=5.0)) as a, ScriptedServer(answer()) as b:
        code, stdout, stderr = await run_call(
            "--upstream", f"a={a.base_url}", "--upstream", f"b={b.base_url}", "--hedge-after", "0.3", "--json"
        )
    assert code == 0, stderr
    out, record = parse(stdout)
    assert out["text"] == "w0 w1 w2 " and out["reasoning_text"] == "think " and out["finish_reason"] == "stop"
    assert record.hedged and record.hedge_reason == "ttft_timeout" and record.winner == "backup"
    assert record.hedge_after_s == 0.3 and len(b.requests) == 1


async def test_budget_zero_never_hedges() -> None:
    async with ScriptedServer(answer(first_delay_s=1.0)) as a, ScriptedServer(answer()) as b:
        code, stdout, stderr = await run_call(
            "--upstream",
            f"a={a.base_url}",
            "--upstream",
            f"b={b.base_url}",
            "--hedge-after",
            "0.2",
            "--budget",
            "0",
            "--json",
        )
    assert code == 0, stderr
    _, record = parse(stdout)
    assert record.hedge_denied and not record.hedged and record.winner == "primary"
    assert b.requests == []


async def test_stall_timeout_fails_with_json_and_exit_1() -> None:
    pieces = sse(chunk("one ", role="assistant"), done=False) + sse(chunk("two "), first_delay_s=10.0)
    async with ScriptedServer(Script(pieces=pieces, close=False)) as a:
        code, stdout, stderr = await run_call("--upstream", f"a={a.base_url}", "--stall-timeout", "0.5", "--json")
    assert code == 1
    out, record = parse(stdout)
    assert out["text"] == "one " and out["finish_reason"] is None
    assert "stalled" in out["error"] and "\n" not in out["error"]
    assert record.status == "stalled" and record.error_type == "stall_timeout"
    assert stderr.strip().splitlines() == [f"hedgerow: {out['error']}"]


async def test_total_timeout_fails_with_json_and_exit_1() -> None:
    async with ScriptedServer(Script(header_delay_s=10.0, close=False)) as a:
        code, stdout, _ = await run_call("--upstream", f"a={a.base_url}", "--total-timeout", "0.8", "--json")
    assert code == 1
    out, record = parse(stdout)
    assert out["text"] == "" and "total_timeout_s=0.8" in out["error"]
    assert record.status == "timeout" and record.error_type == "total_timeout"


async def test_upstream_error_fails_with_json_and_exit_1() -> None:
    refusing = Script(status=401, content_type="application/json", pieces=[(0, b'{"error":"bad key"}')])
    async with ScriptedServer(refusing) as a, ScriptedServer(answer()) as b:
        code, stdout, _ = await run_call("--upstream", f"a={a.base_url}", "--upstream", f"b={b.base_url}", "--json")
    assert code == 1
    out, record = parse(stdout)
    assert "HTTP 401" in out["error"] and record.status == "error" and record.error_type == "http_401"
    assert b.requests == []


async def test_plain_output_streams_the_text_and_a_failure_is_one_line() -> None:
    async with ScriptedServer(answer()) as a:
        code, stdout, stderr = await run_call("--upstream", f"a={a.base_url}")
    assert code == 0 and stdout == "w0 w1 w2 \n", (stdout, stderr)
    cut = sse(chunk("one ", role="assistant"), done=False)  # closes without a finish_reason
    async with ScriptedServer(Script(pieces=cut)) as a:
        code, stdout, stderr = await run_call("--upstream", f"a={a.base_url}")
    assert code == 1 and stdout.startswith("one ")
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "truncated" in lines[0]


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--stall-timeout", "0"], "--stall-timeout"),
        (["--stall-timeout", "soon"], "--stall-timeout"),
        (["--total-timeout", "-1"], "--total-timeout"),
        (["--total-timeout", "inf"], "--total-timeout"),
        (["--budget", "1.5"], "--budget"),
        (["--budget", "nan"], "--budget"),
        (["--budget", "ten percent"], "--budget"),
        (["--budget", "150%"], "--budget"),
        (["--hedge-after", "-0.5"], "--hedge-after"),
        (["--upstream", "no-equals-sign"], "--upstream"),
    ],
)
def test_bad_flags_exit_2_with_one_line_naming_the_flag(args: list[str], flag: str) -> None:
    if "--upstream" not in args:
        args = ["--upstream", "a=http://127.0.0.1:9/v1", *args]
    proc = subprocess.run(
        [HEDGEROW, "call", "--model", "m", "--prompt", "hi", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"hedgerow: {flag}:"), proc.stderr
    assert proc.stdout == ""


LONG_NAME = "r" * 201  # records hold names of at most MAX_NAME_CHARS = 200 characters


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--route", ""], "--route"),
        (["--route", "   "], "--route"),
        (["--route", LONG_NAME], "--route"),
        (["--model", ""], "--model"),
        (["--model", "  "], "--model"),
        (["--model", LONG_NAME], "--model"),
        (["--upstream", f"{LONG_NAME}=http://127.0.0.1:9/v1"], "--upstream"),
        (["--max-tokens", "-5"], "--max-tokens"),
        (["--max-tokens", "0"], "--max-tokens"),
        (["--max-tokens", "1.5"], "--max-tokens"),
        (["--max-tokens", "many"], "--max-tokens"),
    ],
)
def test_names_and_max_tokens_are_checked_before_the_call(args: list[str], flag: str) -> None:
    """Values the library or the records would reject are flag errors (exit 2), sent nowhere."""
    base = {"--upstream": "a=http://127.0.0.1:9/v1", "--model": "m"}
    for name, value in base.items():
        if name not in args:
            args = [name, value, *args]
    proc = subprocess.run(
        [HEDGEROW, "call", "--prompt", "hi", *args], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"hedgerow: {flag}:"), proc.stderr
    assert proc.stdout == ""


@pytest.mark.parametrize(
    ("content", "words"),
    [
        ('{"model": "", "messages": []}', "'model'"),
        (json.dumps({"model": LONG_NAME, "messages": []}), "200"),
        ("[1, 2]", "JSON object"),
        (None, "cannot read"),
    ],
)
def test_bad_body_is_one_line_exit_2(tmp_path: Path, content: str | None, words: str) -> None:
    path = tmp_path / "body.json"
    if content is not None:
        path.write_text(content)
    proc = subprocess.run(
        [HEDGEROW, "call", "--upstream", "a=http://127.0.0.1:9/v1", "--body", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hedgerow: --body:") and words in lines[0], proc.stderr
    assert proc.stdout == ""


async def test_max_tokens_is_sent_upstream() -> None:
    async with ScriptedServer(answer()) as a:
        code, _, stderr = await run_call("--upstream", f"a={a.base_url}", "--max-tokens", "7")
    assert code == 0, stderr
    assert a.requests[0].json_body["max_tokens"] == 7


def test_help_documents_the_exit_codes() -> None:
    proc = subprocess.run(
        [HEDGEROW, "call", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert proc.returncode == 0
    text = " ".join(proc.stdout.split())
    for phrase in ("0 when the call succeeded", "1 when the call failed", "2 for bad flags", "130 when interrupted"):
        assert phrase in text, text


def _default_sigint() -> None:
    """In the child: SIGINT back to its default (a non-interactive parent may have it ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


async def start_call(*args: str) -> asyncio.subprocess.Process:
    """Start ``hedgerow call ARGS`` with SIGINT at its default, stdout and stderr piped."""
    return await asyncio.create_subprocess_exec(
        HEDGEROW,
        "call",
        "--model",
        "m",
        "--prompt",
        "hi",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        preexec_fn=_default_sigint,
    )


@pytest.mark.parametrize("as_json", [True, False])
async def test_sigint_during_the_call_exits_130_with_the_cancelled_record(as_json: bool) -> None:
    pieces = sse(chunk("one ", role="assistant"), done=False) + sse(chunk("two "), first_delay_s=60.0)
    async with ScriptedServer(Script(pieces=pieces, close=False)) as a:
        proc = await start_call("--upstream", f"a={a.base_url}", *(["--json"] if as_json else []))
        try:
            for _ in range(600):  # until the request has arrived and its first token was written
                if a.requests and a.requests[0].writes:
                    break
                await asyncio.sleep(0.05)
            assert a.requests and a.requests[0].writes, "the call never reached the upstream"
            # Time for the process to read the token written; its answer checks below need it. A
            # subprocess on a loaded machine can wait that long for a core (nothing shows the read).
            await asyncio.sleep(1.0)
            proc.send_signal(signal.SIGINT)
            out, err = await asyncio.wait_for(proc.communicate(), 30)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        assert await a.wait_disconnect(0) is not None  # the upstream connection was closed
    stdout, stderr = out.decode(), err.decode()
    assert proc.returncode == 130, (proc.returncode, stderr)
    assert stderr.strip().splitlines() == ["hedgerow: interrupted"], stderr
    if as_json:
        result, record = parse(stdout)
        assert result["error"] == "interrupted" and result["text"] == "one "
        assert record.status == "cancelled" and record.winner == "primary" and len(record.attempts) == 1
        assert record.ttft_s is not None
    else:
        assert stdout == "one \n"


async def test_early_sigint_never_leaves_noise() -> None:
    """SIGINT at several moments from process start to the call; each gives one clean outcome.

    A signal that lands while Python is still starting up (exit 1, ``Fatal Python error:
    init_import_site``), importing the console script, or typer is still parsing the flags (before
    ``call`` runs) ends the process the interpreter's or typer's way (``KeyboardInterrupt``, or
    typer's silent exit 130); every later one, from the start of
    ``call`` through event-loop start-up to the request, must give exit 130, the one line
    ``hedgerow: interrupted`` and the ``--json`` object with ``error``. None may leave
    ``Exception ignored ...`` noise.
    """
    async with ScriptedServer(Script(header_delay_s=60.0, close=False)) as a:
        handled = []
        for delay_s in (0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0, 1.5, None):  # None: once the request arrived
            proc = await start_call("--upstream", f"a={a.base_url}", "--json")
            seen = len(a.requests)
            try:
                if delay_s is None:
                    for _ in range(600):
                        if len(a.requests) > seen:
                            break
                        await asyncio.sleep(0.05)
                else:
                    await asyncio.sleep(delay_s)
                proc.send_signal(signal.SIGINT)
                out, err = await asyncio.wait_for(proc.communicate(), 30)
            finally:
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
            stderr = err.decode()
            assert "Exception ignored" not in stderr, (delay_s, stderr)
            if "hedgerow: interrupted" in stderr:
                handled.append(delay_s)
                assert proc.returncode == 130, (delay_s, proc.returncode, stderr)
                assert stderr.strip().splitlines() == ["hedgerow: interrupted"], (delay_s, stderr)
                result = json.loads(out.decode())
                assert result["error"] == "interrupted", (delay_s, out)
                if result["record"] is not None:
                    assert CallRecord.from_dict(result["record"]).status == "cancelled"
            else:  # before ``call`` ran: the interpreter's KeyboardInterrupt or typer's own exit 130
                assert out == b"", (delay_s, out)
                assert (
                    (proc.returncode == -signal.SIGINT and "KeyboardInterrupt" in stderr)
                    or (proc.returncode == 130 and stderr.strip() == "")
                    # during the interpreter's own start-up (site import, on a slow machine)
                    or (proc.returncode == 1 and "init_import_site" in stderr and "KeyboardInterrupt" in stderr)
                ), (delay_s, proc.returncode, stderr)
    assert None in handled, handled  # the request was on its way: hedgerow's handler must have run


async def test_body_from_stdin_with_model_override() -> None:
    body = json.dumps({"model": "from-body", "messages": [{"role": "user", "content": "hi"}]}).encode()
    async with ScriptedServer(answer()) as a:
        proc = await asyncio.create_subprocess_exec(
            HEDGEROW,
            "call",
            "--upstream",
            f"a={a.base_url}",
            "--body",
            "-",
            "--model",
            "m2",
            "--json",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(body), 60)
    assert proc.returncode == 0, err.decode()
    _, record = parse(out.decode())
    assert record.model == "m2" and a.requests[0].json_body["model"] == "m2"
    assert a.requests[0].json_body["messages"] == [{"role": "user", "content": "hi"}]


async def test_api_responses_streams_a_responses_call_and_records_its_api() -> None:
    from tests.client.test_responses import events, timed

    async with (
        ScriptedServer(timed(events("text"), first_delta_s=5.0)) as a,
        ScriptedServer(timed(events("text"), first_delta_s=0.0)) as b,
    ):
        code, stdout, stderr = await run_call(
            "--api",
            "responses",
            "--upstream",
            f"a={a.base_url}",
            "--upstream",
            f"b={b.base_url}",
            "--hedge-after",
            "0.3",
            "--max-tokens",
            "7",
            "--json",
        )
    assert code == 0, stderr
    out, record = parse(stdout)
    assert out["text"] == "Grüße, Welt!" and out["finish_reason"] == "completed" and out["arguments"] == {}
    assert record.api == "responses" and record.winner == "backup" and record.completion_tokens == 4
    assert b.requests[0].path == "/v1/responses"
    assert b.requests[0].body == {"model": "m", "input": "hi", "max_output_tokens": 7, "stream": True}


async def test_api_must_be_chat_or_responses() -> None:
    code, _, stderr = await run_call("--api", "completions", "--upstream", "a=http://127.0.0.1:9/v1")
    assert code == 2 and "--api: must be chat or responses" in stderr


def test_a_budget_in_percent_is_taken_as_routes_set_takes_it() -> None:
    """``--budget 5%`` was refused ("must be a fraction") where ``routes set --budget 5%`` is taken."""
    proc = subprocess.run(
        [HEDGEROW, "call", "--upstream", "a=http://127.0.0.1:9/v1", "--model", "m", "--prompt", "hi", "--budget", "5%"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 1, proc.stderr  # the flags are fine; nothing listens on port 9
    assert "--budget" not in proc.stderr
