"""Scheduling behaviour of one replica: chunking, head-of-line blocking, aborts freeing slots."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from typing import Any

import httpx

from hedgerow.sim import EngineClosed, ReplicaEngine, TokenChunk, load_perf_model
from tests.sim.conftest import StartReplica

BODY = {"model": "m1", "messages": [{"role": "user", "content": "hello"}], "stream": True}


async def test_engine_chunks_tokens_in_groups() -> None:
    async with ReplicaEngine(load_perf_model(), time_scale=0.01, tokens_per_chunk=3) as engine:
        req = engine.submit(200, 8, "a")
        got: list[TokenChunk] = []
        while not got or not got[-1].finished:
            chunk = await asyncio.wait_for(req.chunks.get(), 10)
            assert isinstance(chunk, TokenChunk), chunk
            got.append(chunk)
        stats = engine.stats()
    assert [c.tokens for c in got] == [1, 3, 3, 1]
    assert [c.finished for c in got] == [False, False, False, True]
    assert req.state == "finished" and req.generated == 8
    assert stats["finished"] == 1 and stats["tokens_generated"] == 8 and stats["prefills"] == 1


async def test_engine_stop_closes_inflight_requests() -> None:
    engine = ReplicaEngine(load_perf_model(), time_scale=1.0, max_batch=1)
    await engine.start()
    running = engine.submit(100, 1000)
    waiting = engine.submit(100, 10)
    await asyncio.wait_for(running.chunks.get(), 10)
    await engine.stop()
    # Tokens decoded before stop() may still be queued (the test may resume late on a loaded
    # machine); after them comes EngineClosed, long before the 1000 tokens asked for.
    after: list[object] = []
    while not after or not isinstance(after[-1], EngineClosed):
        after.append(await asyncio.wait_for(running.chunks.get(), 10))
    assert all(isinstance(c, TokenChunk) and not c.finished for c in after[:-1])
    assert sum(c.tokens for c in after[:-1] if isinstance(c, TokenChunk)) < 1000
    assert running.chunks.empty()
    assert isinstance(await waiting.chunks.get(), EngineClosed)


async def test_abort_during_prefill_frees_the_slot_at_once() -> None:
    # time_scale 0.5: the 8,192-token prefill lasts ~0.47 s.
    async with ReplicaEngine(load_perf_model(), time_scale=0.5, max_batch=1) as engine:
        long = engine.submit(8192, 5)
        await asyncio.sleep(0.05)
        assert long.state == "prefill"
        assert engine.abort(long) is True and engine.abort(long) is False
        stats = engine.stats()
        assert stats["running"] == 0 and stats["aborted_running"] == 1
        short = engine.submit(10, 1)
        chunk = await asyncio.wait_for(short.chunks.get(), 10)
        assert chunk == TokenChunk(1, True)
        assert long.chunks.empty() and long.generated == 0
        assert engine.stats()["finished"] == 1


async def _ttft(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> float:
    start = time.monotonic()
    async with client.stream("POST", url, json=body) as resp:
        assert resp.status_code == 200
        async for _ in resp.aiter_text():
            return time.monotonic() - start
    raise AssertionError("no data")


async def _wait_stats(
    client: httpx.AsyncClient, url: str, cond: Callable[[dict[str, Any]], bool], timeout_s: float = 10.0
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        stats: dict[str, Any] = (await client.get(url)).json()
        if cond(stats) or time.monotonic() > deadline:
            return stats
        await asyncio.sleep(0.02)


async def test_head_of_line_blocking_in_prefill(start_replica: StartReplica) -> None:
    # time_scale 0.5: a 16,384-token prefill lasts ~0.95 s, a 128-token one ~25 ms.
    rep = start_replica(time_scale=0.5)
    url = f"{rep.base_url}/chat/completions"
    short = {**BODY, "max_tokens": 2, "hedgerow_prompt_tokens": 128}
    long = {**BODY, "max_tokens": 2, "hedgerow_prompt_tokens": 16384}
    async with httpx.AsyncClient(timeout=20) as client:
        alone = min([await _ttft(client, url, short) for _ in range(3)])
        long_task = asyncio.create_task(_ttft(client, url, long))
        # Send the short request only once the long prompt's prefill is under way.
        stats = await _wait_stats(client, f"{rep.url}/stats", lambda s: s["running"] == 1)
        assert stats["running"] == 1
        behind_long = await _ttft(client, url, short)
        long_ttft = await long_task
    assert long_ttft > 0.7
    assert behind_long > 0.5, (alone, behind_long)
    assert behind_long > alone + 0.3, (alone, behind_long)


async def test_disconnect_frees_slot(start_replica: StartReplica) -> None:
    # max_batch 1: the second request waits until the first leaves the batch.
    rep = start_replica(time_scale=1.0, max_batch=1)
    url = f"{rep.base_url}/chat/completions"
    stats_url = f"{rep.url}/stats"
    long = {**BODY, "max_tokens": 5000, "hedgerow_prompt_tokens": 100}
    async with httpx.AsyncClient(timeout=20) as client, httpx.AsyncClient(timeout=20) as other:
        # A: streams a long answer; disconnect mid-stream after two chunks.
        async with client.stream("POST", url, json=long) as resp_a:
            it = resp_a.aiter_text()
            await it.__anext__()
            await it.__anext__()
            # B: queued behind A; disconnect before its first token.
            async with other.stream("POST", url, json={**long, "max_tokens": 3}) as resp_b:
                assert resp_b.status_code == 200
                s = await _wait_stats(other, stats_url, lambda s: s["waiting"] == 1)
                assert s["running"] == 1 and s["waiting"] == 1
            s = await _wait_stats(client, stats_url, lambda s: s["aborted_waiting"] == 1)
            assert s["aborted_waiting"] == 1 and s["waiting"] == 0 and s["running"] == 1
        s = await _wait_stats(other, stats_url, lambda s: s["aborted_running"] == 1)
        assert s["aborted_running"] == 1 and s["running"] == 0 and s["waiting"] == 0
        # The slot is free: a new request is admitted at once and completes.
        resp = await other.post(url, json={**BODY, "stream": False, "max_tokens": 3})
        assert resp.status_code == 200
        s = (await other.get(stats_url)).json()
    assert s["finished"] == 1 and s["aborted"] == 2 and s["running"] == 0


async def test_non_streaming_disconnect_frees_slot(start_replica: StartReplica) -> None:
    rep = start_replica(time_scale=1.0)
    async with httpx.AsyncClient(timeout=httpx.Timeout(10, read=0.5)) as client:
        try:
            await client.post(f"{rep.base_url}/chat/completions", json={**BODY, "stream": False, "max_tokens": 5000})
        except httpx.ReadTimeout:
            pass
        else:
            raise AssertionError("expected the client to give up")
        s = await _wait_stats(client, f"{rep.url}/stats", lambda s: s["aborted"] == 1)
    assert s["aborted_running"] == 1 and s["running"] == 0


async def test_prefill_of_a_new_prompt_pauses_the_decoding_of_the_batch() -> None:
    # time_scale 0.5: a decode step lasts ~15 ms, a 16,384-token prefill ~0.95 s. A request that
    # is decoding gets no token while a newly admitted long prompt is being prefilled.
    async with ReplicaEngine(load_perf_model(), time_scale=0.5, max_batch=8) as engine:
        running = engine.submit(100, 400, "a")
        arrivals = []
        for _ in range(3):
            await asyncio.wait_for(running.chunks.get(), 10)
            arrivals.append(time.monotonic())
        engine.submit(16384, 2, "b")
        while True:
            chunk = await asyncio.wait_for(running.chunks.get(), 10)
            arrivals.append(time.monotonic())
            assert isinstance(chunk, TokenChunk), chunk
            if chunk.finished or len(arrivals) > 40:
                break
    gaps = [later - earlier for earlier, later in itertools.pairwise(arrivals)]
    # Decoding alone: steps of ~15 ms. The bound leaves a loaded machine ~0.5 s and stays below
    # the 0.7 s that marks the prefill's gap, so decode steps as long as a prefill fail it.
    assert max(gaps[:2]) < 0.6
    assert max(gaps) > 0.7, gaps  # one gap spans the long prefill


async def test_set_slowdown_checks_its_value() -> None:
    import pytest

    engine = ReplicaEngine(load_perf_model(), slowdown=2.0)
    engine.set_slowdown(1)
    assert engine.slowdown == 1.0 and isinstance(engine.slowdown, float)
    for bad in (0, -1.0, float("nan"), float("inf"), True, "2"):
        with pytest.raises(ValueError, match="slowdown must be a finite number > 0"):
            engine.set_slowdown(bad)  # type: ignore[arg-type]
    assert engine.slowdown == 1.0
