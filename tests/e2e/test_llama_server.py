"""End to end against two real OpenAI-compatible LLM servers: llama-cpp-python serving Gemma 3 270M.

Two ``python -m llama_cpp.server`` processes on 127.0.0.1 serve the same GGUF (built once per
machine into a cached venv by ``tests/e2e/llama_env.py``; the tests are skipped, with the reason
and the build log's tail, where it cannot be built). Each server runs one generation at a time
and, with ``--interrupt_requests False``, queues the others first come first served: it sends the
response headers of a queued request at once, and its role-only chunk, followed at once by the
first token, only when the generation ahead has finished. So:

* the *busy* server is handed a long generation first (a long prompt, ``min_tokens`` =
  ``max_tokens`` so it cannot stop early), and the hedged call's primary queues behind it;
* the *idle* server answers at once;
* the call through ``HedgingClient`` hedges after ``hedge_after_s`` and the backup on the idle
  server wins; the queued primary is cancelled and its connection closed.

Figures measured on the 2-core machine this was written on, one thread per server, with other
jobs loading it (load average ~5): the busy prompt (~170 tokens) gives its first token after
~2.5 s and then ~20 tokens/s, so its 600 tokens would last ~30 s; the hedge fires at 1.0 s and
the idle server's first token follows 0.5-0.8 s later, so the call is over ~3 s after it
started, a tenth of the busy generation. The assertions do not depend on speeds: the premise
(the busy generation is still running when the hedged call ends) is checked in the test itself.

The openai SDK (``openai.AsyncOpenAI`` and ``openai.OpenAI``) hedges chat completions, streamed
and whole, through ``HedgingTransport`` against the same pair. llama-cpp-python serves no
``POST /v1/responses`` (the Responses API; it answers 404), so the Responses API is not tested
here: the SDK's Responses calls hedge against the simulated replicas in
``tests/sim/test_sdk_over_replicas.py``.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any, Self

import httpx
import openai
import pytest
from httpx_sse import aconnect_sse

from hedgerow.client import HedgePolicy, HedgingClient, HedgingTransport, Upstream
from tests.e2e.llama_env import LlamaEnv, LlamaEnvUnavailable, ensure_llama_env
from tests.e2e.processes import stop_process
from tests.helpers import Sink, free_port

# One worker runs the whole module (`--dist loadgroup`): one pair of servers per run, not one per
# worker, so four model copies do not compete for the two cores with the rest of the suite.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500), pytest.mark.xdist_group("llama-servers")]

MODEL = "gemma-3-270m"
#: Seconds without a first token before the client hedges.
HEDGE_AFTER_S = 1.0
#: Tokens of the busy server's long generation (min_tokens = max_tokens: no early stop).
BUSY_TOKENS = 600
#: A prompt of ~170 tokens: its prefill alone keeps a 1-thread server busy for a few seconds.
BUSY_PROMPT = (
    "Write a long, detailed essay about hedgerows: their history in the English countryside, "
    "the birds and insects that live in them, how they are laid and trimmed, and why farmers "
    "keep them. " * 4
)
N_CTX = 1024
SERVER_START_DEADLINE_S = 180.0


@pytest.fixture(scope="session")
def llama_env() -> LlamaEnv:
    """The cached venv with llama-cpp-python and the GGUF; skips the tests where it cannot be built."""
    try:
        return ensure_llama_env()
    except LlamaEnvUnavailable as exc:
        pytest.skip(f"llama-cpp-python environment unavailable: {str(exc).splitlines()[0]}")


class LlamaServer:
    """One ``python -m llama_cpp.server`` subprocess on 127.0.0.1 with its log in a file.

    Args:
        env: the ready ``LlamaEnv``; name: used in the log file's name; workdir: where logs go.

    Raises:
        RuntimeError: with the log's tail, when the server exits or is not ready in time.
    """

    def __init__(self, env: LlamaEnv, name: str, workdir: Path) -> None:
        self.name = name
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.log = workdir / f"llama-{name}.log"
        args = [
            str(env.python),
            "-m",
            "llama_cpp.server",
            "--model",
            str(env.model_path),
            "--model_alias",
            MODEL,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--n_ctx",
            str(N_CTX),
            "--n_threads",
            "1",
            "--n_threads_batch",
            "1",
            "--chat_format",
            "gemma",
            "--interrupt_requests",
            "False",
        ]
        env_vars = {**os.environ, "OMP_NUM_THREADS": "1"}
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=workdir, env=env_vars
            )

    def log_tail(self, chars: int = 3000) -> str:
        """The last ``chars`` characters of the server's log."""
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    def wait_ready(self, deadline: float) -> None:
        """Poll GET /v1/models until it answers 200 or ``deadline`` (monotonic s) passes."""
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama server {self.name} exited {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(f"{self.base_url}/models", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise RuntimeError(f"llama server {self.name} not ready in time:\n{self.log_tail()}")

    def stop(self) -> None:
        """Terminate the process (kill after 15 s)."""
        stop_process(self.proc)

    def exit_report(self) -> str | None:
        """None while the process runs; else how it ended (signal or status) and its log's tail."""
        code = self.proc.poll()
        if code is None:
            return None
        how = f"killed by signal {-code}" if code < 0 else f"exited with status {code}"
        return f"llama server {self.name} (port {self.port}) {how}; log tail:\n{self.log_tail()}"


@pytest.fixture(scope="module")
def servers(llama_env: LlamaEnv, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LlamaServer, LlamaServer]]:
    """Two llama servers (busy, idle) on free ports; both stopped at the end of the module."""
    workdir = tmp_path_factory.mktemp("llama")
    started = [LlamaServer(llama_env, "busy", workdir), LlamaServer(llama_env, "idle", workdir)]
    try:
        deadline = time.monotonic() + SERVER_START_DEADLINE_S
        for server in started:
            try:
                server.wait_ready(deadline)
            except RuntimeError as exc:
                pytest.fail(str(exc))
        yield started[0], started[1]
    finally:
        for server in started:
            server.stop()


@pytest.fixture(autouse=True)
def _servers_outlive_each_test(request: pytest.FixtureRequest) -> Iterator[None]:
    """After each test that used the servers, fail it (at teardown) if one of them is gone.

    A server that dies mid-test shows up in the test as a bare connection error; this names the
    server, how it ended (a signal number says killed, crashed or out of memory) and its log.
    """
    yield
    if "servers" not in request.fixturenames:
        return
    pair: tuple[LlamaServer, LlamaServer] = request.getfixturevalue("servers")
    reports = [r for r in (server.exit_report() for server in pair) if r is not None]
    if reports:
        pytest.fail("\n\n".join(reports), pytrace=False)


def _established(port: int, *, local: bool) -> int:
    """Count ESTABLISHED IPv4 TCP sockets on this host whose local (or remote) port is ``port``.

    Reads ``/proc/net/tcp`` (state 01 is ESTABLISHED). With ``local=False`` it counts client
    ends connected to a server on ``port``; with ``local=True`` the server's accepted ends.
    """
    count = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local_port = int(fields[1].rsplit(":", 1)[1], 16)
        remote_port = int(fields[2].rsplit(":", 1)[1], 16)
        if fields[3] == "01" and (local_port if local else remote_port) == port:
            count += 1
    return count


async def _until(predicate: Callable[[], bool], timeout_s: float) -> bool:
    """Poll ``predicate()`` every 50 ms until it holds or ``timeout_s`` passes; its last value."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() >= deadline:
            return predicate()
        await asyncio.sleep(0.05)
    return True


class BusyGeneration:
    """A long streamed generation on one server, held open until ``close()``.

    ``started`` is set at its first content chunk: from then on the server is generating it and
    queues every other request. ``tokens`` counts the content chunks received so far.
    """

    def __init__(self, server: LlamaServer) -> None:
        self.server = server
        self.started = asyncio.Event()
        self.tokens = 0
        self.first_token_s: float | None = None
        self.sent_at = 0.0
        self.task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Self:
        self.task = asyncio.create_task(self._run(), name=f"busy-{self.server.name}")
        waiter = asyncio.create_task(self.started.wait(), name="busy-started")
        try:
            done, _ = await asyncio.wait({waiter, self.task}, timeout=120, return_when=asyncio.FIRST_COMPLETED)
            if waiter not in done:
                if self.task.done():
                    self.task.result()  # raises the generation's own error, if it had one
                    raise AssertionError(f"the busy generation ended before its first token:\n{self.server.log_tail()}")
                raise AssertionError(f"no first token from the busy generation in 120 s:\n{self.server.log_tail()}")
        except BaseException:
            await self.close()
            raise
        finally:
            waiter.cancel()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def _run(self) -> None:
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": BUSY_PROMPT}],
            "max_tokens": BUSY_TOKENS,
            "min_tokens": BUSY_TOKENS,
            "stream": True,
        }
        self.sent_at = time.monotonic()
        url = f"{self.server.base_url}/chat/completions"
        async with (
            httpx.AsyncClient(timeout=httpx.Timeout(300, connect=5)) as http,
            aconnect_sse(http, "POST", url, json=body) as source,
        ):
            source.response.raise_for_status()
            async for sse in source.aiter_sse():
                if sse.data.strip() == "[DONE]":
                    break
                chunk = json.loads(sse.data)
                for choice in chunk.get("choices") or []:
                    if (choice.get("delta") or {}).get("content"):
                        self.tokens += 1
                        if self.first_token_s is None:
                            self.first_token_s = time.monotonic() - self.sent_at
                        self.started.set()

    @property
    def running(self) -> bool:
        """Whether the generation is still streaming."""
        return self.task is not None and not self.task.done()

    async def close(self) -> None:
        """Stop reading and close the connection (the server stops at its next token)."""
        if self.task is not None and not self.task.done():
            self.task.cancel()
        if self.task is not None:
            await asyncio.gather(self.task, return_exceptions=True)


def _hedged_body() -> dict[str, Any]:
    """A short chat request; ``min_tokens`` so that the winner surely sends a token."""
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Name three birds that nest in hedgerows."}],
        "max_tokens": 16,
        "min_tokens": 4,
    }


@pytest.fixture
async def busy(servers: tuple[LlamaServer, LlamaServer]) -> AsyncIterator[BusyGeneration]:
    """The busy server generating its long answer (first token already out)."""
    async with BusyGeneration(servers[0]) as generation:
        yield generation


async def test_call_hedges_to_the_idle_llama_server_and_the_backup_wins(
    servers: tuple[LlamaServer, LlamaServer], busy: BusyGeneration
) -> None:
    busy_server, idle_server = servers
    upstreams = [
        Upstream("busy", busy_server.base_url),
        Upstream("idle", idle_server.base_url),
    ]
    policy = HedgePolicy(hedge_after_s=HEDGE_AFTER_S, total_timeout_s=120.0)
    assert _established(busy_server.port, local=False) == 1  # only the busy generation so far
    async with HedgingClient(upstreams, route="e2e-llama", policy=policy) as client:
        result = await client.chat(_hedged_body())
        # The loser's connection to the busy server is closed on our side, and the server drops
        # the queued request too: only the busy generation's connection is left on either end.
        assert await _until(lambda: _established(busy_server.port, local=False) == 1, 2.0)
        assert await _until(lambda: _established(busy_server.port, local=True) == 1, 10.0), busy_server.log_tail()
    # The premise: the primary really was queued behind a generation that had not finished.
    assert busy.running, f"the busy generation ended too early ({busy.tokens} tokens)"

    record = result.record
    print(
        f"\nhedged call: {record.to_dict()}\nbusy generation: first token {busy.first_token_s:.2f} s, "
        f"{busy.tokens} tokens by the call's end"
    )
    assert record.status == "ok" and record.error_type is None
    assert record.hedged is True and record.hedge_reason == "ttft_timeout" and record.hedge_denied is False
    assert record.winner == "backup"
    primary, backup = record.attempts
    assert (primary.upstream, primary.role, primary.outcome) == ("busy", "primary", "cancelled")
    assert primary.first_token_s is None and primary.completion_tokens == 0
    assert primary.status_code == 200  # headers came at once although the request was queued
    assert (backup.upstream, backup.role, backup.outcome) == ("idle", "backup", "won")
    assert backup.start_s >= HEDGE_AFTER_S - 0.01  # the hedge fired at hedge_after_s, not before
    assert primary.end_s == pytest.approx(backup.first_token_s, abs=0.5)  # cancelled at the win
    assert result.text.strip(), "the winner's text is empty"
    # TTFT runs from the primary's send, first_token_s from the call's start: they differ by the
    # primary's start_s, which a loaded machine can make longer than any small tolerance.
    assert record.ttft_s is not None and backup.first_token_s is not None
    assert record.ttft_s == pytest.approx(backup.first_token_s - primary.start_s, abs=1e-5)
    assert record.ttft_s > backup.start_s
    assert record.completion_tokens is not None and 1 <= record.completion_tokens <= 16
    assert record.wasted_completion_tokens == 0
    assert result.finish_reason in ("stop", "length")
    # After the client is closed nothing of the call is left: no task, no connection.
    leftover = [t for t in asyncio.all_tasks() if t.get_name().startswith("hedgerow-")]
    assert leftover == []
    assert await _until(lambda: _established(idle_server.port, local=False) == 0, 2.0)


async def test_default_hedgerow_headers_are_accepted_by_llama_server(servers: tuple[LlamaServer, LlamaServer]) -> None:
    _, idle_server = servers
    async with HedgingClient([Upstream("idle", idle_server.base_url)], route="e2e-llama") as client:
        result = await client.chat(_hedged_body())
    assert result.record.status == "ok" and result.text.strip()


async def test_hedgerow_call_json_against_the_pair(
    servers: tuple[LlamaServer, LlamaServer], busy: BusyGeneration, tmp_path: Path
) -> None:
    busy_server, idle_server = servers
    body_file = tmp_path / "body.json"
    body_file.write_text(json.dumps(_hedged_body()))
    args = [
        sys.executable,
        "-m",
        "hedgerow.cli",
        "call",
        "--json",
        "--upstream",
        f"busy={busy_server.base_url}",
        "--upstream",
        f"idle={idle_server.base_url}",
        "--body",
        str(body_file),
        "--hedge-after",
        str(HEDGE_AFTER_S),
    ]
    done = await asyncio.to_thread(subprocess.run, args, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert busy.running, f"the busy generation ended too early ({busy.tokens} tokens)"
    out = json.loads(done.stdout)
    assert out["text"].strip()
    assert "error" not in out
    record = out["record"]
    assert record["hedged"] is True and record["hedge_reason"] == "ttft_timeout"
    assert record["winner"] == "backup" and record["status"] == "ok"
    outcomes = {a["upstream"]: a["outcome"] for a in record["attempts"]}
    assert outcomes == {"busy": "cancelled", "idle": "won"}
    assert record["ttft_s"] is not None and record["ttft_s"] > HEDGE_AFTER_S


def _sdk_chat(base_url: str, transport: HedgingTransport, *, use_async: bool, stream: bool) -> str:
    """One chat completion of ``_hedged_body`` through the openai SDK over ``transport``; the text.

    ``use_async``: ``openai.AsyncOpenAI`` on an event loop of its own (this runs in a worker
    thread), else ``openai.OpenAI``; ``stream``: streamed, else a whole response.
    """
    body = _hedged_body()
    extra = {"min_tokens": body.pop("min_tokens")}
    if not use_async:
        with openai.OpenAI(
            base_url=base_url,
            api_key="unused",
            max_retries=0,
            http_client=httpx.Client(transport=transport),  # type: ignore[arg-type]  # openai annotates httpx2; takes httpx too
        ) as sdk:
            if not stream:
                return sdk.chat.completions.create(**body, extra_body=extra).choices[0].message.content or ""
            with sdk.chat.completions.create(**body, stream=True, extra_body=extra) as chunks:
                return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

    async def call() -> str:
        async with openai.AsyncOpenAI(
            base_url=base_url,
            api_key="unused",
            max_retries=0,
            http_client=httpx.AsyncClient(transport=transport),  # type: ignore[arg-type]  # openai annotates httpx2; takes httpx too
        ) as sdk:
            if not stream:
                completion = await sdk.chat.completions.create(**body, extra_body=extra)
                return completion.choices[0].message.content or ""
            chunks = await sdk.chat.completions.create(**body, stream=True, extra_body=extra)
            async with chunks:
                return "".join([c.choices[0].delta.content or "" async for c in chunks if c.choices])

    return asyncio.run(call())


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
@pytest.mark.parametrize("use_async", [True, False], ids=["AsyncOpenAI", "OpenAI"])
async def test_the_openai_sdk_hedges_chat_to_the_idle_llama_server(
    servers: tuple[LlamaServer, LlamaServer], busy: BusyGeneration, use_async: bool, stream: bool
) -> None:
    # The SDK call runs in a worker thread (the sync client blocks), so this loop keeps reading
    # the busy generation meanwhile. A whole response is hedged on its arrival (route .unary).
    busy_server, idle_server = servers
    sink = Sink()
    upstreams = [Upstream("busy", busy_server.base_url), Upstream("idle", idle_server.base_url)]
    policy = HedgePolicy(hedge_after_s=HEDGE_AFTER_S, total_timeout_s=120.0)
    transport = HedgingTransport(upstreams, route="e2e-sdk", policy=policy, telemetry=sink)
    text = await asyncio.to_thread(
        _sdk_chat, "http://hedgerow.invalid/v1", transport, use_async=use_async, stream=stream
    )
    assert busy.running, f"the busy generation ended too early ({busy.tokens} tokens)"
    assert text.strip(), "the winner's text is empty"
    (record,) = sink.records  # one record for the call
    print(f"\nSDK call ({'async' if use_async else 'sync'}, {'stream' if stream else 'whole'}): {record.to_dict()}")
    assert record.route == ("e2e-sdk" if stream else "e2e-sdk.unary") and record.api == "chat"
    assert record.status == "ok" and record.hedged is True and record.hedge_reason == "ttft_timeout"
    assert record.winner == "backup"
    primary, backup = record.attempts
    assert (primary.upstream, primary.outcome, primary.first_token_s) == ("busy", "cancelled", None)
    assert (backup.upstream, backup.outcome) == ("idle", "won")
    assert backup.start_s >= HEDGE_AFTER_S - 0.01
    assert record.completion_tokens is not None and 1 <= record.completion_tokens <= 16
    # Our connection to the busy server for the loser is closed: only the busy generation's is left.
    assert await _until(lambda: _established(busy_server.port, local=False) == 1, 2.0)
