"""Benchmark: what the hedging client adds to a streamed call when no hedge fires.

The same streamed chat completion goes to one local upstream several ways, N rounds (default
1,000), each round calling every way once in an order shuffled per round (seeded), so that drift in
machine load hits every way alike and no way always follows another. Before each call the
benchmark lets the work of the previous call finish (``settle``): the loop's other tasks, the
portal thread's tasks (``--sdk``), a garbage collection. Without that, what one way left behind
(its closing tasks, the portal finishing a sync call) was timed as part of the next way's call,
which made the way measured after the hedged one (the baseline) look slow and the hedged one
cheap. Every way has an ``httpx`` client (connection pool) of its own: sharing one between
``plain`` and ``plain_close`` once raised plain's TTFT median from 0.53 to 0.83 ms (each
``plain_close`` call leaves the pool a connection to replace) and made hedging look free.

* ``naive``: the baseline of issue 12's target: a plain ``httpx`` stream whose lines are split
  by hand (``aiter_lines``, lines starting with ``data:``) and ``json.loads``-ed, the way most
  apps do it (``naive_call``, about 30 lines);
* ``plain``: ``httpx.AsyncClient.stream`` + ``httpx_sse.EventSource``, ``json.loads`` of every
  chunk, first token = first chunk with a non-empty ``delta.content`` (what an app does by hand);
* ``hedging``: ``HedgingClient.stream_chat`` with ``hedge_after_s=30`` (never fires) and a second
  upstream configured but unused: classification, the event queue, the attempt task, the record;
* ``plain_close``: ``plain`` stopping at ``[DONE]`` without reading the end of the body, which
  makes httpx close the connection, so each call connects anew. ``HedgingClient`` (as of this
  writing) stops at ``[DONE]`` too, so "hedging - plain_close" isolates the client's own
  machinery; "plain_close - plain" is what losing keep-alive costs here (next to nothing on
  loopback without TLS; a TCP and TLS handshake per call against a remote API).

With ``--sdk`` four more modes show what the drop-in costs an app that uses the openai SDK:
``sdk`` (``openai.AsyncOpenAI`` straight to the upstream) and ``sdk_transport`` (the same SDK
over ``HedgingTransport``, which also re-encodes the winner's chunks as SSE for the SDK), and
the synchronous pair ``sync_sdk`` (``openai.OpenAI`` straight) and ``sync_sdk_transport``
(``openai.OpenAI`` over ``HedgingTransport``, whose calls run on the portal thread; its CPU time
counts, ``process_time`` being the process's). The sync calls block the benchmark's event loop
while they run, which nothing else needs meanwhile.

Measured per way: TTFT (request sent to the first token in the caller's hands; median, P90 and
P99, ms), CPU time per chunk (the process's, ``time.process_time``, and the calling thread's,
``time.thread_time``, each summed over the way's calls and divided by the chunks delivered; they
differ for the sync transport, whose hedged call runs on the portal thread) and the median CPU
time from the call's start to its first token (``process_time``, us): the fixed cost behind the
added TTFT, which, unlike the wall-clock TTFT, a loaded machine does not inflate by its waits for
a core. Differences are hedging minus its baseline (of the medians, P90s, P99s, of the CPU to the
first token), and "paired" is the median of the per-round differences (both ways of a round ran
within milliseconds of each other); "ratio" is hedging CPU per chunk over the baseline's.
Issue 12's target, against ``naive`` in
the same run: at most +0.2 ms TTFT median and x1.3 CPU per chunk.

The upstream is a minimal asyncio SSE server in a **separate process** (this script with
``--serve``), not a simulated replica: the replica's engine, uvicorn and FastAPI add a millisecond
or more of their own per call and their jitter would hide a client overhead of tens of
microseconds; and a server in this process would put its CPU time into ``process_time`` and
compete for the GIL. The server answers each request at once on a keep-alive connection: headers,
the role chunk and the first token in one write, then the other content chunks, the
finish chunk, the usage chunk and ``[DONE]`` in a second write.

Run: ``python bench/client_overhead.py [--calls 1000] [--tokens 64] [--json bench/results/client_overhead.json]``.
Prints a table and writes JSON. Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
from httpx_sse import EventSource

from hedgerow.client import HedgePolicy, HedgingClient, Upstream

BODY = {"model": "bench", "messages": [{"role": "user", "content": "hello"}]}


# -- the upstream (runs in a child process) ----------------------------------------------------------


def sse_response(tokens: int) -> tuple[bytes, bytes]:
    """The two writes of one answer: (headers + role chunk + first token, the rest)."""
    base = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 1, "model": "bench"}

    def event(choices: list[dict[str, Any]], **extra: Any) -> bytes:
        return b"data: " + json.dumps({**base, "choices": choices, **extra}, separators=(",", ":")).encode() + b"\n\n"

    def content(text: str) -> bytes:
        return event([{"index": 0, "delta": {"content": text}, "finish_reason": None}])

    first = event([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]) + content("t0 ")
    rest = b"".join(content(f"t{i} ") for i in range(1, tokens))
    rest += event([{"index": 0, "delta": {}, "finish_reason": "stop"}])
    rest += event([], usage={"prompt_tokens": 2, "completion_tokens": tokens, "total_tokens": tokens + 2})
    rest += b"data: [DONE]\n\n"
    head = (
        f"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
        f"Content-Length: {len(first) + len(rest)}\r\n\r\n"
    ).encode()
    return head + first, rest


async def serve(tokens: int) -> None:
    """Serve the fixed answer on 127.0.0.1 (a free port, printed on stdout) until killed."""
    first, rest = sse_response(tokens)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                await reader.readexactly(length)
                writer.write(first)
                await writer.drain()
                writer.write(rest)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    async with server:
        await server.serve_forever()


# -- the two clients -----------------------------------------------------------------------------------


def _is_token(chunk: dict[str, Any]) -> bool:
    choices = chunk.get("choices") or []
    return bool(choices and (choices[0].get("delta") or {}).get("content"))


async def plain_call(http: httpx.AsyncClient, url: str, *, reuse: bool = True) -> tuple[float, float, int]:
    """One call by hand; returns (TTFT s, CPU s to the first token, chunks).

    With ``reuse`` the body is read to its end after ``[DONE]`` so that httpx keeps the
    connection for the next call; without it the loop stops at ``[DONE]`` and httpx closes the
    connection (its HTTP/1.1 message is unfinished), so every call connects anew.
    """
    start = time.perf_counter()
    cpu_start = time.process_time()
    ttft = cpu_first = None
    chunks = 0
    body = {**BODY, "stream": True, "stream_options": {"include_usage": True}}
    async with http.stream("POST", url, json=body, headers={"Accept": "text/event-stream"}) as response:
        response.raise_for_status()
        async for sse in EventSource(response).aiter_sse():
            if sse.data == "[DONE]":
                if not reuse:
                    break
                continue  # read on to the end of the body, so the connection is kept alive (as the SDK does)
            chunk = json.loads(sse.data)
            chunks += 1
            if ttft is None and _is_token(chunk):
                ttft = time.perf_counter() - start
                cpu_first = time.process_time() - cpu_start
    assert ttft is not None and cpu_first is not None
    return ttft, cpu_first, chunks


async def naive_call(http: httpx.AsyncClient, url: str) -> tuple[float, float, int]:
    """One call the way most apps stream by hand; returns (TTFT s, CPU s to the first token, chunks).

    A plain ``httpx`` stream; each line that starts with ``data:`` is a chunk (``[DONE]`` ends
    the loop, after which the body is read to its end so the connection is reused).
    """
    start = time.perf_counter()
    cpu_start = time.process_time()
    ttft = cpu_first = None
    chunks = 0
    body = {**BODY, "stream": True, "stream_options": {"include_usage": True}}
    async with http.stream("POST", url, json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                continue
            chunk = json.loads(data)
            chunks += 1
            if ttft is None:
                choices = chunk.get("choices") or []
                if choices and (choices[0].get("delta") or {}).get("content"):
                    ttft = time.perf_counter() - start
                    cpu_first = time.process_time() - cpu_start
    assert ttft is not None and cpu_first is not None
    return ttft, cpu_first, chunks


def sync_sdk_call(sdk: Any) -> tuple[float, float, int]:
    """One call through the sync openai SDK (``sdk`` is an ``openai.OpenAI``); (TTFT s, CPU s to
    the first token, chunks)."""
    start = time.perf_counter()
    cpu_start = time.process_time()
    ttft = cpu_first = None
    chunks = 0
    with sdk.chat.completions.create(**BODY, stream=True, stream_options={"include_usage": True}) as stream:
        for chunk in stream:
            chunks += 1
            if ttft is None and chunk.choices and chunk.choices[0].delta.content:
                ttft = time.perf_counter() - start
                cpu_first = time.process_time() - cpu_start
    assert ttft is not None and cpu_first is not None
    return ttft, cpu_first, chunks


async def sdk_call(sdk: Any) -> tuple[float, float, int]:
    """One call through the openai SDK (``sdk`` is an ``openai.AsyncOpenAI``); (TTFT s, CPU s to
    the first token, chunks)."""
    start = time.perf_counter()
    cpu_start = time.process_time()
    ttft = cpu_first = None
    chunks = 0
    stream = await sdk.chat.completions.create(**BODY, stream=True, stream_options={"include_usage": True})
    async with stream:
        async for chunk in stream:
            chunks += 1
            if ttft is None and chunk.choices and chunk.choices[0].delta.content:
                ttft = time.perf_counter() - start
                cpu_first = time.process_time() - cpu_start
    assert ttft is not None and cpu_first is not None
    return ttft, cpu_first, chunks


async def hedging_call(client: HedgingClient) -> tuple[float, float, int]:
    """One call through ``HedgingClient``; returns (TTFT s, CPU s to the first token, chunks)."""
    start = time.perf_counter()
    cpu_start = time.process_time()
    ttft = cpu_first = None
    chunks = 0
    async with client.stream_chat(BODY) as stream:
        async for chunk in stream:
            chunks += 1
            if ttft is None and _is_token(chunk):
                ttft = time.perf_counter() - start
                cpu_first = time.process_time() - cpu_start
    assert ttft is not None and cpu_first is not None and stream.record is not None and not stream.record.hedged
    return ttft, cpu_first, chunks


def _quantile(values: list[float], q: float) -> float:
    """The q-quantile (linear interpolation, as numpy's default)."""
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


#: Pairs (baseline, hedged) whose difference is reported.
PAIRS = (
    ("naive", "hedging"),
    ("plain", "hedging"),
    ("plain_close", "hedging"),
    ("sdk", "sdk_transport"),
    ("sync_sdk", "sync_sdk_transport"),
)

#: Longest wait (s) for other tasks of the benchmark's loop (or the portal's) to end between calls.
SETTLE_LIMIT_S = 1.0


async def _loop_idle(limit_s: float = SETTLE_LIMIT_S) -> None:
    """Yield to the running loop until no task but the caller is left (at most ``limit_s``)."""
    me = asyncio.current_task()
    deadline = time.monotonic() + limit_s
    while any(task is not me for task in asyncio.all_tasks()) and time.monotonic() < deadline:
        await asyncio.sleep(0.0005)


async def settle(portal: asyncio.AbstractEventLoop | None) -> None:
    """Let the work one way left behind finish before the next way is timed.

    A way's call can leave work queued on its way out (closing tasks, a close of the portal's
    body, the portal thread finishing the hedged call, garbage): without this it lands in the
    time of whichever way runs next, and makes the way measured after the hedged one look slow.
    Here: wait until the benchmark's loop has no other task, wait until the portal loop (when
    one runs) has no task either, collect garbage, and yield once more.
    """
    await _loop_idle()
    if portal is not None and portal.is_running():
        await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(_loop_idle(), portal))
    gc.collect()
    await asyncio.sleep(0)


class Sample:
    """One measured call: wall TTFT (s), CPU to the first token and per call (s; the process's and
    the calling thread's), chunks delivered."""

    __slots__ = ("chunks", "cpu_first_s", "cpu_s", "thread_cpu_s", "ttft_s")

    def __init__(self, ttft_s: float, cpu_first_s: float, cpu_s: float, thread_cpu_s: float, chunks: int) -> None:
        self.ttft_s, self.cpu_first_s, self.cpu_s, self.thread_cpu_s, self.chunks = (
            ttft_s,
            cpu_first_s,
            cpu_s,
            thread_cpu_s,
            chunks,
        )


async def run(port: int, calls: int, warmup: int, with_sdk: bool = False, seed: int = 12) -> dict[str, Any]:
    """Run ``calls`` rounds after ``warmup`` unmeasured ones; summarise.

    Each round calls every way once, in an order shuffled per round (``random.Random(seed)``),
    and lets the loops settle (``settle``) before each call, so no way pays for another's
    leftovers and drift in machine load hits every way alike.
    """
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=100)
    upstreams = [Upstream("local", f"http://127.0.0.1:{port}/v1"), Upstream("unused", f"http://127.0.0.1:{port}/v1")]
    policy = HedgePolicy(hedge_after_s=30.0)
    timeout = httpx.Timeout(None, connect=5.0)
    portal: asyncio.AbstractEventLoop | None = None
    async with contextlib.AsyncExitStack() as stack:
        # One httpx client per way: a pool shared with plain_close's closed connections slows the others.
        naive_http, plain_http, close_http = [
            await stack.enter_async_context(httpx.AsyncClient(timeout=timeout, limits=limits)) for _ in range(3)
        ]
        client = await stack.enter_async_context(HedgingClient(upstreams, route="bench", policy=policy))
        modes: dict[str, Callable[[], Awaitable[tuple[float, float, int]]]] = {
            "naive": lambda: naive_call(naive_http, url),
            "plain": lambda: plain_call(plain_http, url),
            "hedging": lambda: hedging_call(client),
            "plain_close": lambda: plain_call(close_http, url, reuse=False),
        }
        if with_sdk:
            import openai  # the dev extra; only this mode needs it

            from hedgerow.client import HedgingTransport
            from hedgerow.client._portal import PORTAL

            direct = openai.AsyncOpenAI(
                base_url=upstreams[0].base_url,
                api_key="x",
                max_retries=0,
                http_client=httpx.AsyncClient(limits=limits),  # type: ignore[arg-type]  # openai annotates httpx2; takes httpx too
            )
            hedged = openai.AsyncOpenAI(
                base_url="http://hedgerow.invalid/v1",
                api_key="x",
                max_retries=0,
                http_client=httpx.AsyncClient(transport=HedgingTransport(upstreams, route="bench", policy=policy)),  # type: ignore[arg-type]  # openai annotates httpx2; takes httpx too
            )
            for sdk in (direct, hedged):
                stack.push_async_callback(sdk.close)
            modes["sdk"] = lambda: sdk_call(direct)
            modes["sdk_transport"] = lambda: sdk_call(hedged)
            sync_direct = openai.OpenAI(
                base_url=upstreams[0].base_url,
                api_key="x",
                max_retries=0,
                http_client=httpx.Client(limits=limits),  # type: ignore[arg-type]  # openai annotates httpx2; takes httpx too
            )
            sync_hedged = openai.OpenAI(
                base_url="http://hedgerow.invalid/v1",
                api_key="x",
                max_retries=0,
                http_client=httpx.Client(transport=HedgingTransport(upstreams, route="bench", policy=policy)),  # type: ignore[arg-type]  # openai annotates httpx2; takes httpx too
            )
            for sync_sdk in (sync_direct, sync_hedged):
                stack.callback(sync_sdk.close)
            portal = PORTAL.loop

            async def in_line(sdk: Any) -> tuple[float, float, int]:
                return sync_sdk_call(sdk)

            modes["sync_sdk"] = lambda: in_line(sync_direct)
            modes["sync_sdk_transport"] = lambda: in_line(sync_hedged)
        names = list(modes)
        samples: dict[str, list[Sample]] = {name: [] for name in names}
        rng = random.Random(seed)
        for _ in range(warmup):
            for call in modes.values():
                await call()
        gc.collect()
        gc.freeze()  # the clients and modules: collections between calls then scan only new objects
        try:
            for _ in range(calls):
                order = rng.sample(names, len(names))
                for name in order:
                    await settle(portal)
                    cpu_start = time.process_time()
                    thread_start = time.thread_time()
                    ttft, cpu_first, n = await modes[name]()
                    thread_cpu = time.thread_time() - thread_start
                    cpu = time.process_time() - cpu_start
                    samples[name].append(Sample(ttft, cpu_first, cpu, thread_cpu, n))
        finally:
            gc.unfreeze()
    return summarise(samples)


def summarise(samples: dict[str, list[Sample]]) -> dict[str, Any]:
    """Per way: TTFT median/P90/P99 (ms), CPU per chunk (us; process and calling thread), median CPU
    to the first token (us); per pair: the differences, the ratio, and the median of the per-round
    TTFT differences (the two ways of a round ran next to each other)."""
    results: dict[str, Any] = {}
    for name, rows in samples.items():
        ttfts = [r.ttft_s for r in rows]
        chunks = sum(r.chunks for r in rows)
        results[name] = {
            "ttft_ms_median": statistics.median(ttfts) * 1e3,
            "ttft_ms_p90": _quantile(ttfts, 0.90) * 1e3,
            "ttft_ms_p99": _quantile(ttfts, 0.99) * 1e3,
            "cpu_us_per_chunk": sum(r.cpu_s for r in rows) / chunks * 1e6,
            "thread_cpu_us_per_chunk": sum(r.thread_cpu_s for r in rows) / chunks * 1e6,
            "cpu_us_to_first_token_median": statistics.median(r.cpu_first_s for r in rows) * 1e6,
            "cpu_s_total": sum(r.cpu_s for r in rows),
            "chunks": chunks,
        }
    added = {}
    for base, mode in PAIRS:
        if mode in results:
            b, m = results[base], results[mode]
            paired = [x.ttft_s - y.ttft_s for x, y in zip(samples[mode], samples[base], strict=True)]
            added[f"{mode} - {base}"] = {
                "added_ttft_ms_median": m["ttft_ms_median"] - b["ttft_ms_median"],
                "added_ttft_ms_p90": m["ttft_ms_p90"] - b["ttft_ms_p90"],
                "added_ttft_ms_p99": m["ttft_ms_p99"] - b["ttft_ms_p99"],
                "paired_ttft_ms_median": statistics.median(paired) * 1e3,
                "cpu_per_chunk_ratio": m["cpu_us_per_chunk"] / b["cpu_us_per_chunk"],
                "thread_cpu_per_chunk_ratio": m["thread_cpu_us_per_chunk"] / b["thread_cpu_us_per_chunk"],
                "added_cpu_us_to_first_token": m["cpu_us_to_first_token_median"] - b["cpu_us_to_first_token_median"],
            }
    return {"results": results, "added": added}


def start_server(tokens: int) -> tuple[subprocess.Popen[str], int]:
    """Start the upstream in a child process; return it and its port."""
    child = subprocess.Popen(
        [sys.executable, __file__, "--serve", "--tokens", str(tokens)], stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    line = child.stdout.readline().strip()
    if not line.isdigit():
        child.kill()
        raise RuntimeError(f"the benchmark upstream did not start (it printed {line!r})")
    return child, int(line)


def main(calls: int, tokens: int, warmup: int, json_path: Path | None, with_sdk: bool = False) -> dict[str, Any]:
    """Run the benchmark, print the table, write the JSON; returns the JSON document."""
    child, port = start_server(tokens)
    try:
        summary = asyncio.run(run(port, calls, warmup, with_sdk))
    finally:
        child.terminate()
        child.wait(10)
    r = summary["results"]
    load = os.getloadavg()
    print(
        f"{calls} rounds (each way once per round, shuffled order, loops settled between calls), {tokens} "
        f"content chunks per call (+ role, finish, usage), local SSE server in a child process; "
        f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at the end"
    )
    head = ("TTFT p50 ms", "p90 ms", "p99 ms", "CPU us/chunk", "thread us/ch", "CPU us to 1st")
    print(f"{'way':<34}" + "".join(f"{h:>14}" for h in head))
    for name in r:
        x = r[name]
        print(
            f"{name:<34}{x['ttft_ms_median']:>14.3f}{x['ttft_ms_p90']:>14.3f}{x['ttft_ms_p99']:>14.3f}"
            f"{x['cpu_us_per_chunk']:>14.2f}{x['thread_cpu_us_per_chunk']:>14.2f}"
            f"{x['cpu_us_to_first_token_median']:>14.0f}"
        )
    added_head = ("+TTFT p50 ms", "+p90 ms", "+p99 ms", "paired p50 ms", "CPU ratio", "thread ratio", "+CPU us to 1st")
    print(f"{'difference':<34}" + "".join(f"{h:>14}" for h in added_head))
    for pair, a in summary["added"].items():
        print(
            f"{pair:<34}{a['added_ttft_ms_median']:>+14.3f}{a['added_ttft_ms_p90']:>+14.3f}"
            f"{a['added_ttft_ms_p99']:>+14.3f}{a['paired_ttft_ms_median']:>+14.3f}"
            f"{'x' + format(a['cpu_per_chunk_ratio'], '.2f'):>14}"
            f"{'x' + format(a['thread_cpu_per_chunk_ratio'], '.2f'):>14}"
            f"{a['added_cpu_us_to_first_token']:>+14.0f}"
        )
    document = {
        "benchmark": "client_overhead",
        "python": sys.version.split()[0],
        "httpx": httpx.__version__,
        "machine": platform.machine(),
        "calls": calls,
        "tokens": tokens,
        "warmup": warmup,
        "load_average": list(load),
        **summary,
    }
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(document, indent=2) + "\n")
        print(f"written to {json_path}")
    return document


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000, help="measured calls per mode (>= 1)")
    parser.add_argument("--tokens", type=int, default=64, help="content chunks per answer (>= 1)")
    parser.add_argument("--warmup", type=int, default=20, help="unmeasured calls per mode first (>= 0)")
    parser.add_argument("--json", type=Path, default=Path("bench/results/client_overhead.json"))
    parser.add_argument("--sdk", action="store_true", help="also measure the openai SDK direct vs HedgingTransport")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.calls < 1 or args.tokens < 1 or args.warmup < 0:
        parser.error("--calls and --tokens must be >= 1, --warmup >= 0")
    if args.serve:
        asyncio.run(serve(args.tokens))
    else:
        main(args.calls, args.tokens, args.warmup, args.json, args.sdk)
