"""Benchmark: TTFT, sustained request rate and CPU per request of ``hedgerow gateway``.

Streamed chat completions go, over real HTTP on loopback, to a fast local upstream three ways:

* ``direct``: straight to upstream ``a``;
* ``gateway``: through ``hedgerow gateway --upstream a=... --upstream b=...`` (a real subprocess,
  ``--log-level warning`` so that its per-call ``gateway_call`` info line is not counted; hedge
  after the default 2 s, which never fires here: the ``hedged`` column counts any that did);
* ``relay``: through a process that copies bytes both ways between the caller's connection and
  one of its own to upstream ``a`` (``--relay``; asyncio streams, uvloop when installed), parsing
  nothing: the floor of what any proxy process adds to TTFT on this machine (the "relay +p50/p99"
  columns), mostly the two more wake-ups of a sleeping process per call;
* ``passthrough``: through a minimal ASGI app on the gateway's own stack (uvicorn with uvloop and
  httptools, one shared ``httpx.AsyncClient`` to upstream ``a``) that passes bytes on and does
  nothing else (``--passthrough``): the floor of that stack, so that "passthru +p50/p99" is what
  the stack adds and the gateway's difference to it what hedgerow's own work adds;
* ``litellm`` (only with ``--litellm``): LiteLLM's proxy with the same two upstreams as two
  ``openai/bench`` deployments of one model (``api_base`` each; its router spreads the calls over
  both, it does not hedge). LiteLLM is installed into its own venv, ``bench/.litellm-venv``
  (gitignored), never into the project's environment; when the install fails the reason is printed
  and the column is skipped.

The upstreams are two minimal asyncio SSE servers (this script with ``--serve``, uvloop when
installed), each in a process of its own, so their CPU time is not the benchmark's: each answers
at once with a fixed short stream (role chunk and first token in one write, then the other
content chunks, the finish chunk and ``[DONE]``) on a keep-alive connection.

Each cell is a closed loop: C concurrent streams (C in 1, 16, 64 by default), each sending its
next call as soon as its previous one ended, for a fixed duration. Rounds interleave the ways:
every round runs every (C, way) cell once, the ways in an order shuffled per round (seeded), so
drift in machine load falls on every way alike. Per way and C:

* TTFT p50/p99 (ms): from sending the request to the first chunk with non-empty
  ``delta.content`` in the caller's hands, pooled over the rounds. Under a closed loop this
  includes the queueing of C callers for the cores: at C=16 or 64 it measures saturation, not an
  idle proxy's overhead;
* rate (requests/s): completed calls over the cell's wall time, the median over the rounds;
* CPU per request (ms): utime+stime (``/proc/<pid>/stat``, clock ticks) of the proxy's process
  tree, of the two upstreams, and of the benchmark process (the load generator, httpx), each
  summed over the rounds and divided by the calls completed;
* proxy requests/s per core: calls completed per CPU second of the proxy, that is the rate one
  fully busy core would sustain; the done-when compares the gateway's with LiteLLM's.

The load generator is httpx in this process (one ``AsyncClient`` per stream, lines split by hand
as most apps do) and shares the machine's cores with the proxy and the upstreams, so the absolute
rates are those of this machine; the CPU per request of the proxy is what compares across
machines. Issue targets: at C=16 the gateway adds <= 1 ms TTFT p50 and <= 3 ms p99 over direct,
and sustains >= 3x LiteLLM's requests/s per core.

Run: ``python bench/gateway.py [--quick] [--litellm] [--streams 1,16,64] [--seconds 5]
[--rounds 3] [--tokens 16] [--json bench/results/gateway.json]``. Prints a table and writes
JSON. Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import re
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
LITELLM_VENV = ROOT / "bench" / ".litellm-venv"
BODY = {
    "model": "bench",
    "messages": [{"role": "user", "content": "hello"}],
    "stream": True,
}
#: The master key LiteLLM's proxy is started with (it refuses to start without one); callers send it.
LITELLM_KEY = "sk-bench-" + secrets.token_hex(16)
CLOCK_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
#: Longest wait (s) for a child (upstream, gateway, LiteLLM) to start answering.
START_LIMIT_S = 120.0


# -- the upstream (runs in a child process) ----------------------------------------------------------


def sse_answer(tokens: int) -> tuple[bytes, bytes]:
    """The two writes of one streamed answer: (headers + role chunk + first token, the rest)."""
    base = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 1, "model": "bench"}

    def event(choices: list[dict[str, Any]]) -> bytes:
        return b"data: " + json.dumps({**base, "choices": choices}, separators=(",", ":")).encode() + b"\n\n"

    def content(text: str) -> bytes:
        return event([{"index": 0, "delta": {"content": text}, "finish_reason": None}])

    first = event([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]) + content("t0 ")
    rest = b"".join(content(f"t{i} ") for i in range(1, tokens))
    rest += event([{"index": 0, "delta": {}, "finish_reason": "stop"}]) + b"data: [DONE]\n\n"
    head = (
        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
        f"Content-Length: {len(first) + len(rest)}\r\n\r\n"
    ).encode()
    return head + first, rest


def json_answer(document: dict[str, Any]) -> bytes:
    """A whole ``200 application/json`` response of ``document``."""
    body = json.dumps(document).encode()
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body


async def read_body(reader: asyncio.StreamReader, head: bytes) -> bytes:
    """The request body after ``head``: by ``Content-Length`` or chunked transfer coding."""
    length = 0
    chunked = False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
        elif name.strip().lower() == b"transfer-encoding" and b"chunked" in value.lower():
            chunked = True
    if not chunked:
        return await reader.readexactly(length)
    parts = []
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
        parts.append(await reader.readexactly(size + 2))
        if size == 0:
            return b"".join(parts)


async def serve(tokens: int) -> None:
    """Serve the fixed answer on 127.0.0.1 (a free port, printed on stdout) until killed.

    ``POST`` with ``"stream": true``: the SSE stream of ``tokens`` content chunks; other ``POST``:
    a non-streamed chat completion; ``GET``: a model list (for proxies' health checks).
    """
    first, rest = sse_answer(tokens)
    completion = json_answer({
        "id": "chatcmpl-bench", "object": "chat.completion", "created": 1, "model": "bench",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "t0"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3},
    })  # fmt: skip
    models = json_answer({"object": "list", "data": [{"id": "bench", "object": "model", "owned_by": "bench"}]})

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                body = await read_body(reader, head)
                if not head.startswith(b"POST"):
                    writer.write(models)
                elif b'"stream":true' in body.replace(b" ", b""):
                    writer.write(first)
                    await writer.drain()
                    writer.write(rest)
                else:
                    writer.write(completion)
                await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, ValueError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=1024)
    print(server.sockets[0].getsockname()[1], flush=True)
    async with server:
        await server.serve_forever()


async def relay(upstream_port: int) -> None:
    """Copy bytes both ways between each accepted connection and one of its own to the upstream on
    ``upstream_port`` (127.0.0.1), until killed; prints ``listening on http://.../v1``.

    The ``relay`` way: a process hop that parses nothing (no HTTP, no JSON), the floor of the TTFT
    any proxy process adds on this machine (two more socket wake-ups per call).
    """

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", upstream_port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=1024)
    print(f"listening on http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1", flush=True)
    async with server:
        await server.serve_forever()


def passthrough(port: int, upstream: str) -> None:
    """Serve, on 127.0.0.1:``port`` until killed, an ASGI app under uvicorn (uvloop, httptools, as
    ``hedgerow gateway`` runs) that sends each ``POST`` body to ``upstream``'s chat completions
    with one shared ``httpx.AsyncClient`` and passes the answer's bytes back as they arrive;
    prints ``listening on http://.../v1``.

    The ``passthrough`` way: the gateway's own server and client stack with nothing of hedgerow's
    (no route, no race, no record, no parsing), so the gateway's difference to it is what
    hedgerow's work adds on that stack.
    """
    import uvicorn

    limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
    client = httpx.AsyncClient(base_url=upstream, timeout=30.0, limits=limits)
    headers = {"content-type": "application/json"}

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        body = b""
        more = True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        request = client.build_request("POST", "/chat/completions", content=body, headers=headers)
        response = await client.send(request, stream=True)
        try:
            kind = response.headers.get("content-type", "application/json").encode()
            await send({"type": "http.response.start", "status": response.status_code,
                        "headers": [(b"content-type", kind)]})  # fmt: skip
            async for piece in response.aiter_raw():
                await send({"type": "http.response.body", "body": piece, "more_body": True})
        finally:
            await response.aclose()
        await send({"type": "http.response.body", "body": b""})

    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", loop="auto", http="auto")
    print(f"listening on http://127.0.0.1:{port}/v1", flush=True)
    uvicorn.Server(config).run()


# -- children: start, wait, CPU ---------------------------------------------------------------------------


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def process_tree(pid: int) -> list[int]:
    """``pid`` and its live descendants (from ``/proc/*/stat``'s parent field)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                stat = (entry / "stat").read_text()
                ppid = int(stat.rsplit(")", 1)[1].split()[1])
                parents.setdefault(ppid, []).append(int(entry.name))
    tree, todo = [], [pid]
    while todo:
        current = todo.pop()
        tree.append(current)
        todo.extend(parents.get(current, []))
    return tree


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds of the processes ``pids`` and their live descendants so far."""
    total = 0
    for pid in {p for root in pids for p in process_tree(root)}:
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat(5))
    return total * CLOCK_TICK_S


@dataclass
class Child:
    """A child process whose output goes to ``log``; ``url`` is its base URL (ends in ``/v1``)."""

    process: subprocess.Popen[bytes]
    log: Path
    url: str = ""

    def wait_for(self, pattern: str, limit_s: float = START_LIMIT_S) -> re.Match[str]:
        """Wait until the log has a line matching ``pattern``; raises RuntimeError (with the log's tail)
        when the child exits or ``limit_s`` passes first."""
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            match = re.search(pattern, self.log.read_text(errors="replace"), re.MULTILINE)
            if match:
                return match
            if self.process.poll() is not None:
                break
            time.sleep(0.05)
        tail = self.log.read_text(errors="replace")[-2000:]
        raise RuntimeError(
            f"{self.process.args!r} did not start (exit {self.process.poll()}); its output ends:\n{tail}"
        )

    def stop(self) -> None:
        """Terminate the child (and kill it after 10 s)."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


def spawn(command: list[str], log: Path, env: dict[str, str] | None = None, cwd: Path = ROOT) -> Child:
    """Start ``command`` in ``cwd`` with stdout and stderr to ``log``."""
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd)
    return Child(process, log)


def start_upstream(tokens: int, work: Path, name: str) -> Child:
    """One upstream (``--serve``) in a child process."""
    child = spawn([sys.executable, __file__, "--serve", "--tokens", str(tokens)], work / f"upstream-{name}.log")
    port = child.wait_for(r"^(\d+)$").group(1)
    child.url = f"http://127.0.0.1:{port}/v1"
    return child


def start_relay(upstream: str, work: Path) -> Child:
    """The ``relay`` way (:func:`relay`) in front of ``upstream`` (a base URL), in a child process."""
    port = upstream.rsplit(":", 1)[1].split("/")[0]
    child = spawn([sys.executable, __file__, "--relay", port], work / "relay.log")
    child.url = child.wait_for(r"listening on (http://\S+/v1)").group(1)
    return child


def start_passthrough(upstream: str, work: Path) -> Child:
    """The ``passthrough`` way (:func:`passthrough`) in front of ``upstream`` (a base URL), in a child process."""
    command = [sys.executable, __file__, "--passthrough", str(free_port()), "--upstream-url", upstream]
    child = spawn(command, work / "passthrough.log")
    child.url = child.wait_for(r"listening on (http://\S+/v1)").group(1)
    return child


def start_gateway(upstreams: list[str], work: Path, root: Path = ROOT, name: str = "gateway") -> Child:
    """``hedgerow gateway`` of the source tree ``root`` over ``upstreams`` (named a, b, ...) on a free port."""
    command = [sys.executable, "-m", "hedgerow.cli", "gateway", "--port", "0", "--log-level", "warning"]
    for upstream, url in zip("abcdefgh", upstreams, strict=False):
        command += ["--upstream", f"{upstream}={url}"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    child = spawn(command, work / f"{name}.log", env, cwd=root)
    child.url = child.wait_for(r"listening on (http://\S+/v1)").group(1)
    return child


def litellm_executable(quiet: bool = False) -> tuple[Path | None, str]:
    """The ``litellm`` command of ``bench/.litellm-venv``, installing ``litellm[proxy]`` there first
    when missing; returns (path, "") or (None, why it could not be had)."""
    exe = LITELLM_VENV / "bin" / "litellm"
    if exe.exists():
        return exe, ""
    print(f"installing litellm[proxy] into {LITELLM_VENV} (once; several minutes) ...", flush=True)
    try:
        if not (LITELLM_VENV / "bin" / "python").exists():
            subprocess.run([sys.executable, "-m", "venv", str(LITELLM_VENV)], check=True, capture_output=True)
        done = subprocess.run(
            [str(LITELLM_VENV / "bin" / "pip"), "install", "-q", "litellm[proxy]"],
            capture_output=True,
            text=True,
            timeout=1800,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"could not make the venv or run pip: {exc}"
    if done.returncode != 0 or not exe.exists():
        return None, f"pip install litellm[proxy] failed (exit {done.returncode}): {done.stderr.strip()[-1500:]}"
    return exe, ""


def start_litellm(exe: Path, upstreams: list[str], work: Path) -> Child:
    """LiteLLM's proxy with ``upstreams`` as deployments of the model ``bench`` on a free port."""
    config = work / "litellm.yaml"
    lines = ["model_list:"]
    for url in upstreams:
        lines += [
            "  - model_name: bench",
            "    litellm_params:",
            "      model: openai/bench",
            f"      api_base: {url}",
            "      api_key: bench-key",
        ]
    lines += ["litellm_settings:", "  set_verbose: false", "  turn_off_message_logging: true"]
    lines += ["general_settings:", f"  master_key: {LITELLM_KEY}"]
    config.write_text("\n".join(lines) + "\n")
    port = free_port()
    env = {
        **os.environ,
        "LITELLM_LOG": "ERROR",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # no fetch of the price list from the internet
        "LITELLM_TELEMETRY": "False",
        "PYTHONPATH": "",
    }
    command = [str(exe), "--config", str(config), "--host", "127.0.0.1", "--port", str(port), "--telemetry", "False"]
    child = spawn(command, work / "litellm.log", env)
    deadline = time.monotonic() + START_LIMIT_S
    while True:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"http://127.0.0.1:{port}/health/liveliness", timeout=2).status_code == 200:
                break
        if child.process.poll() is not None or time.monotonic() > deadline:
            tail = child.log.read_text(errors="replace")[-2000:]
            child.stop()
            raise RuntimeError(f"LiteLLM's proxy did not start; its output ends:\n{tail}")
        time.sleep(0.5)
    child.url = f"http://127.0.0.1:{port}/v1"
    return child


# -- the load ------------------------------------------------------------------------------------------------


@dataclass
class Cell:
    """What one closed-loop run of one way at one concurrency measured (CPU in seconds)."""

    way: str
    streams: int
    wall_s: float = 0.0
    ttfts_s: list[float] = field(default_factory=list)
    errors: int = 0
    #: the failed calls by exception type (``ReadTimeout``, ``HTTPStatusError``, ...)
    error_kinds: dict[str, int] = field(default_factory=dict)
    hedged: int = 0
    proxy_cpu_s: float = 0.0
    upstream_cpu_s: float = 0.0
    client_cpu_s: float = 0.0
    load: float = 0.0


async def one_call(http: httpx.AsyncClient, url: str) -> tuple[float, bool]:
    """One streamed call read to its end; returns (TTFT s, whether the gateway said it hedged).

    Raises RuntimeError when the stream has no content chunk, httpx errors as they come.
    """
    start = time.perf_counter()
    ttft = None
    async with http.stream("POST", url, json=BODY) as response:
        response.raise_for_status()
        hedged = response.headers.get("x-hedgerow-hedged", "").lower() == "true"
        async for line in response.aiter_lines():
            if ttft is None and line.startswith("data:") and line[5:].strip() != "[DONE]":
                choices = json.loads(line[5:]).get("choices") or []
                if choices and (choices[0].get("delta") or {}).get("content"):
                    ttft = time.perf_counter() - start
    if ttft is None:
        raise RuntimeError("the stream ended without a content chunk")
    return ttft, hedged


async def closed_loop(
    clients: list[httpx.AsyncClient], url: str, cell: Cell, seconds: float, think_s: float = 0.0
) -> None:
    """``cell.streams`` callers, each calling again after its call ended, until ``seconds`` pass.

    With ``think_s == 0`` a caller calls again at once (saturation). With ``think_s > 0`` each pause
    is drawn from an exponential distribution of mean ``think_s`` and each caller starts after a
    uniform offset in [0, think_s): callers that all paused exactly ``think_s`` would stay in
    phase and send their calls in bursts of C, so TTFT would measure the burst's queue, not the
    proxy. Caller i uses ``clients[i]`` (a pool of one keep-alive connection of its own).
    """
    deadline = time.perf_counter() + seconds
    rng = random.Random(cell.streams)

    async def caller(http: httpx.AsyncClient) -> None:
        if think_s > 0:
            await asyncio.sleep(rng.uniform(0.0, think_s))
        while time.perf_counter() < deadline:
            try:
                ttft, hedged = await one_call(http, url)
            except (httpx.HTTPError, RuntimeError, ValueError) as exc:
                cell.errors += 1
                kind = type(exc).__name__
                cell.error_kinds[kind] = cell.error_kinds.get(kind, 0) + 1
                await asyncio.sleep(0.01)  # an erroring proxy must not turn the loop into a spin
                continue
            cell.ttfts_s.append(ttft)
            cell.hedged += hedged
            if think_s > 0:
                await asyncio.sleep(rng.expovariate(1.0 / think_s))

    start = time.perf_counter()
    await asyncio.gather(*(caller(clients[i]) for i in range(cell.streams)))
    cell.wall_s = time.perf_counter() - start


async def measure(
    ways: dict[str, tuple[str, list[int], dict[str, str]]],
    upstream_pids: list[int],
    streams: list[int],
    seconds: float,
    rounds: int,
    warmup_s: float,
    seed: int = 16,
    think_s: float = 0.0,
) -> list[Cell]:
    """Run every (way, C) cell once per round, ways shuffled per round; returns every cell.

    ``ways`` maps a way's name to (chat completions URL, pids of its proxy (none for direct),
    headers of every request).
    """
    # One client (pool) per stream: one pool shared by 64 streams cost the load generator 7 ms of CPU
    # per call (against 0.8 ms at one stream), which made it, not the proxy, the bottleneck.
    # An idle connection is closed by the caller after 4 s, before the proxy's server would close it
    # (uvicorn's default: 5 s, LiteLLM's proxy): a call sent on a connection as the server ends it
    # fails with ReadError, which a loaded machine (the proxy without CPU at that moment) made happen.
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1, keepalive_expiry=4.0)
    timeout = httpx.Timeout(30.0, connect=5.0)
    cells: list[Cell] = []
    rng = random.Random(seed)
    async with contextlib.AsyncExitStack() as stack:
        clients = {
            name: [
                await stack.enter_async_context(httpx.AsyncClient(timeout=timeout, limits=limits, headers=headers))
                for _ in range(max(streams))
            ]
            for name, (_, _, headers) in ways.items()
        }
        for name, (url, _, _) in ways.items():  # warm up: connections, imports, caches of every proxy
            await closed_loop(clients[name], url, Cell(name, max(streams)), warmup_s)
        for _ in range(rounds):
            for count in streams:
                for name in rng.sample(list(ways), len(ways)):
                    url, proxy_pids, _ = ways[name]
                    cell = Cell(name, count)
                    proxy_before = cpu_seconds(proxy_pids) if proxy_pids else 0.0
                    upstream_before = cpu_seconds(upstream_pids)
                    client_before = time.process_time()
                    await closed_loop(clients[name], url, cell, seconds, think_s)
                    cell.client_cpu_s = time.process_time() - client_before
                    cell.upstream_cpu_s = cpu_seconds(upstream_pids) - upstream_before
                    cell.proxy_cpu_s = cpu_seconds(proxy_pids) - proxy_before if proxy_pids else 0.0
                    cell.load = os.getloadavg()[0]
                    cells.append(cell)
                    await asyncio.sleep(0.2)  # let the proxy's leftovers of this cell end before the next
    return cells


def quantile(values: list[float], q: float) -> float:
    """The q-quantile (linear interpolation, as numpy's default); NaN of no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def summarise(cells: list[Cell], ways: list[str], streams: list[int]) -> dict[str, Any]:
    """One row per (way, C) over the rounds, the gateway's differences to direct and its ratio to LiteLLM."""
    rows: list[dict[str, Any]] = []
    for count in streams:
        for name in ways:
            mine = [c for c in cells if c.way == name and c.streams == count]
            ttfts = [t for c in mine for t in c.ttfts_s]
            done = len(ttfts)
            proxy_cpu = sum(c.proxy_cpu_s for c in mine)
            rows.append({
                "way": name,
                "streams": count,
                "requests": done,
                "errors": sum(c.errors for c in mine),
                "error_kinds": {k: sum(c.error_kinds.get(k, 0) for c in mine) for c in mine for k in c.error_kinds},
                "hedged": sum(c.hedged for c in mine),
                "rate_per_s": statistics.median(len(c.ttfts_s) / c.wall_s for c in mine),
                "rate_per_s_range": [min(len(c.ttfts_s) / c.wall_s for c in mine),
                                     max(len(c.ttfts_s) / c.wall_s for c in mine)],
                "ttft_ms_p50": quantile(ttfts, 0.50) * 1e3,
                "ttft_ms_p99": quantile(ttfts, 0.99) * 1e3,
                "proxy_cpu_ms_per_request": proxy_cpu / done * 1e3 if name != "direct" and done else None,
                "proxy_requests_per_cpu_s": done / proxy_cpu if name != "direct" and proxy_cpu > 0 else None,
                "upstream_cpu_ms_per_request": sum(c.upstream_cpu_s for c in mine) / done * 1e3 if done else None,
                "client_cpu_ms_per_request": sum(c.client_cpu_s for c in mine) / done * 1e3 if done else None,
                "load_average_range": [min(c.load for c in mine), max(c.load for c in mine)],
            })  # fmt: skip
    by = {(r["way"], r["streams"]): r for r in rows}
    compared = []
    for count in streams:
        gateway, direct = by[("gateway", count)], by[("direct", count)]
        entry: dict[str, Any] = {
            "streams": count,
            "added_ttft_ms_p50": gateway["ttft_ms_p50"] - direct["ttft_ms_p50"],
            "added_ttft_ms_p99": gateway["ttft_ms_p99"] - direct["ttft_ms_p99"],
            "rate_share_of_direct": gateway["rate_per_s"] / direct["rate_per_s"],
        }
        hop = by.get(("relay", count))
        if hop is not None:  # what a process hop alone adds, and the gateway over it
            entry["relay_added_ttft_ms_p50"] = hop["ttft_ms_p50"] - direct["ttft_ms_p50"]
            entry["relay_added_ttft_ms_p99"] = hop["ttft_ms_p99"] - direct["ttft_ms_p99"]
            entry["over_relay_ttft_ms_p50"] = gateway["ttft_ms_p50"] - hop["ttft_ms_p50"]
            entry["over_relay_ttft_ms_p99"] = gateway["ttft_ms_p99"] - hop["ttft_ms_p99"]
        plain = by.get(("passthrough", count))
        if plain is not None:  # what the server and client stack alone adds, and hedgerow's work over it
            entry["passthrough_added_ttft_ms_p50"] = plain["ttft_ms_p50"] - direct["ttft_ms_p50"]
            entry["passthrough_added_ttft_ms_p99"] = plain["ttft_ms_p99"] - direct["ttft_ms_p99"]
            entry["over_passthrough_ttft_ms_p50"] = gateway["ttft_ms_p50"] - plain["ttft_ms_p50"]
            entry["over_passthrough_ttft_ms_p99"] = gateway["ttft_ms_p99"] - plain["ttft_ms_p99"]
        litellm = by.get(("litellm", count))
        if litellm and litellm["proxy_requests_per_cpu_s"] and gateway["proxy_requests_per_cpu_s"]:
            entry["per_core_vs_litellm"] = gateway["proxy_requests_per_cpu_s"] / litellm["proxy_requests_per_cpu_s"]
            entry["rate_vs_litellm"] = gateway["rate_per_s"] / litellm["rate_per_s"]
        compared.append(entry)
    return {"rows": rows, "gateway_vs": compared}


def fmt(value: float | None, spec: str) -> str:
    """``value`` formatted by ``spec``, or ``-`` for None."""
    return "-" if value is None else format(value, spec)


def print_table(summary: dict[str, Any]) -> None:
    """The rows, then the gateway's differences to direct (and ratios to LiteLLM when measured)."""
    head: tuple[str, ...] = ("req/s", "TTFT p50 ms", "p99 ms", "proxy CPU ms/req", "proxy req/s/core",
                             "upstr ms/req", "client ms/req", "errors", "hedged")  # fmt: skip
    print(f"{'way':<10}{'C':>4}" + "".join(f"{h:>17}" for h in head))
    for r in summary["rows"]:
        print(
            f"{r['way']:<10}{r['streams']:>4}{r['rate_per_s']:>17.0f}{r['ttft_ms_p50']:>17.2f}{r['ttft_ms_p99']:>17.2f}"
            f"{fmt(r['proxy_cpu_ms_per_request'], '.3f'):>17}{fmt(r['proxy_requests_per_cpu_s'], '.0f'):>17}"
            f"{fmt(r['upstream_cpu_ms_per_request'], '.3f'):>17}{fmt(r['client_cpu_ms_per_request'], '.3f'):>17}"
            f"{r['errors']:>17}{r['hedged']:>17}"
        )
    head = ("+TTFT p50 ms", "+TTFT p99 ms", "relay +p50", "relay +p99", "passthru +p50", "passthru +p99",
            "rate/direct", "per core/LiteLLM", "rate/LiteLLM")  # fmt: skip
    print(f"{'gateway vs':<14}" + "".join(f"{h:>17}" for h in head))
    for g in summary["gateway_vs"]:
        print(
            f"{'C=' + str(g['streams']):<14}{g['added_ttft_ms_p50']:>+17.2f}{g['added_ttft_ms_p99']:>+17.2f}"
            f"{fmt(g.get('relay_added_ttft_ms_p50'), '+.2f'):>17}{fmt(g.get('relay_added_ttft_ms_p99'), '+.2f'):>17}"
            f"{fmt(g.get('passthrough_added_ttft_ms_p50'), '+.2f'):>17}"
            f"{fmt(g.get('passthrough_added_ttft_ms_p99'), '+.2f'):>17}"
            f"{g['rate_share_of_direct']:>17.2f}{fmt(g.get('per_core_vs_litellm'), '.2f'):>17}"
            f"{fmt(g.get('rate_vs_litellm'), '.2f'):>17}"
        )


@contextlib.contextmanager
def children() -> Iterator[list[Child]]:
    """A list to append started children to; every one is stopped on the way out."""
    started: list[Child] = []
    try:
        yield started
    finally:
        for child in reversed(started):
            child.stop()


def main(args: argparse.Namespace) -> dict[str, Any]:
    """Start the upstreams and proxies, measure, print the table, write the JSON; returns the document."""
    streams = [int(x) for x in args.streams.split(",")]
    litellm_skipped = None
    with tempfile.TemporaryDirectory() as tmp, children() as started:
        work = Path(tmp)
        upstreams = [start_upstream(args.tokens, work, name) for name in ("a", "b")]
        started += upstreams
        urls = [u.url for u in upstreams]
        gateway = start_gateway(urls, work)
        started.append(gateway)
        hop = start_relay(urls[0], work)
        started.append(hop)
        plain = start_passthrough(urls[0], work)
        started.append(plain)
        ways: dict[str, tuple[str, list[int], dict[str, str]]] = {
            "direct": (f"{urls[0]}/chat/completions", [], {}),
            "relay": (f"{hop.url}/chat/completions", [hop.process.pid], {}),
            "passthrough": (f"{plain.url}/chat/completions", [plain.process.pid], {}),
            "gateway": (f"{gateway.url}/chat/completions", [gateway.process.pid], {}),
        }
        if args.compare is not None:  # the gateway of another source tree, e.g. the previous commit's
            other = start_gateway(urls, work, root=args.compare.resolve(), name="gateway-compare")
            started.append(other)
            ways["gw-other"] = (f"{other.url}/chat/completions", [other.process.pid], {})
        if args.litellm:
            exe, why = litellm_executable()
            if exe is not None:
                try:
                    proxy = start_litellm(exe, urls, work)
                    started.append(proxy)
                    auth = {"Authorization": f"Bearer {LITELLM_KEY}"}
                    ways["litellm"] = (f"{proxy.url}/chat/completions", [proxy.process.pid], auth)
                except RuntimeError as exc:
                    why = str(exc)
            if "litellm" not in ways:
                litellm_skipped = why
                print(f"LiteLLM skipped: {why}", flush=True)
        cells = asyncio.run(
            measure(
                ways,
                [u.process.pid for u in upstreams],
                streams,
                args.seconds,
                args.rounds,
                args.warmup,
                think_s=args.think_ms / 1e3,
            )
        )
    summary = summarise(cells, list(ways), streams)
    load = os.getloadavg()
    print(
        f"{args.rounds} round(s) x {args.seconds:g} s per cell (closed loop, C concurrent streams"
        + (f", {args.think_ms:g} ms between a stream's calls" if args.think_ms else "")
        + f"; ways shuffled per round), {args.tokens} content chunks per call, 2 upstreams in child processes, "
        f"{os.cpu_count()} CPU(s); load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at the end"
    )
    print_table(summary)
    document = {
        "benchmark": "gateway",
        "python": sys.version.split()[0],
        "httpx": httpx.__version__,
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "streams": streams,
        "seconds": args.seconds,
        "rounds": args.rounds,
        "tokens": args.tokens,
        "think_ms": args.think_ms,
        "compare": None if args.compare is None else str(args.compare),
        "ways": list(ways),
        "litellm_skipped": litellm_skipped,
        "load_average": list(load),
        **summary,
    }
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(document, indent=2) + "\n")
        print(f"written to {args.json}")
    return document


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line; exits 2 naming a bad value."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short run: 1 round of 1.5 s per cell, 1 s warm-up")
    parser.add_argument(
        "--litellm", action="store_true", help="also LiteLLM's proxy (installed in bench/.litellm-venv)"
    )
    parser.add_argument("--streams", default="1,16,64", help="concurrent streams per cell, comma-separated (>= 1)")
    parser.add_argument("--seconds", type=float, default=None, help="seconds per cell (default 5; 1.5 with --quick)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds (default 3; 1 with --quick)")
    parser.add_argument(
        "--warmup", type=float, default=None, help="warm-up seconds per way (default 3; 1 with --quick)"
    )
    parser.add_argument("--tokens", type=int, default=16, help="content chunks per answer (>= 1)")
    parser.add_argument(
        "--think-ms",
        type=float,
        default=0.0,
        help="pause of each stream between its calls, ms (default 0: saturating; > 0 measures below saturation)",
    )
    parser.add_argument(
        "--compare",
        type=Path,
        default=None,
        metavar="DIR",
        help="also the gateway of the source tree DIR (way gw-other), e.g. a `git worktree` of the previous commit",
    )
    parser.add_argument("--json", type=Path, default=Path("bench/results/gateway.json"))
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--relay", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--passthrough", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--upstream-url", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    quick = args.quick
    args.seconds = args.seconds if args.seconds is not None else (1.5 if quick else 5.0)
    args.rounds = args.rounds if args.rounds is not None else (1 if quick else 3)
    args.warmup = args.warmup if args.warmup is not None else (1.0 if quick else 3.0)
    try:
        counts = [int(x) for x in args.streams.split(",")]
    except ValueError:
        parser.error(f"--streams: comma-separated integers, got {args.streams!r}")
    if not counts or min(counts) < 1:
        parser.error(f"--streams: every count must be >= 1, got {args.streams!r}")
    if args.seconds <= 0 or args.rounds < 1 or args.tokens < 1 or args.warmup < 0 or args.think_ms < 0:
        parser.error("--seconds must be > 0, --rounds and --tokens >= 1, --warmup and --think-ms >= 0")
    if args.compare is not None and not (args.compare / "hedgerow" / "cli").is_dir():
        parser.error(f"--compare: {args.compare} is not a hedgerow source tree (no hedgerow/cli in it)")
    return args


if __name__ == "__main__":
    arguments = parse_arguments()
    if arguments.passthrough is not None:
        passthrough(arguments.passthrough, arguments.upstream_url)
    elif arguments.relay is not None:
        try:
            import uvloop
        except ImportError:
            asyncio.run(relay(arguments.relay))
        else:
            uvloop.run(relay(arguments.relay))
    elif arguments.serve:
        try:
            import uvloop
        except ImportError:
            asyncio.run(serve(arguments.tokens))
        else:
            uvloop.run(serve(arguments.tokens))
    else:
        main(arguments)
