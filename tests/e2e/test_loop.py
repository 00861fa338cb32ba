"""The whole loop on loopback: replicas → hedging client → exporter → api → controller → poller.

Real processes and real HTTP: ``hedgerow serve`` (api + APScheduler controller job, SQLite) as a
subprocess, two simulated replicas (one degraded) on 127.0.0.1, and a ``HedgingClient`` with a
``TelemetryExporter`` and a ``ThresholdPoller``.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys

import httpx
import pytest

from hedgerow.client import HedgePolicy, HedgingClient, TelemetryExporter, ThresholdPoller, Upstream
from hedgerow.sim import ReplicaConfig, ReplicaThread
from tests.serve_process import ServeProcess

ROUTE, MODEL = "e2e", "llama2-70b"


@pytest.mark.slow
async def test_records_reach_the_store_and_the_controller_publishes_a_threshold(serve: ServeProcess) -> None:
    fast = ReplicaThread(ReplicaConfig(name="fast", time_scale=0.05, max_batch=32, tokens_per_chunk=4)).start()
    # The slow replica prefills the ~30 prompts it is sent in ~8 s (slowdown 100 at time scale
    # 0.05), the fast one in ~0.08 s: a backup sent at 0.5 s wins by seconds even on a loaded
    # machine, so hedged primaries are cancelled before their first token (censored).
    slow = ReplicaThread(
        ReplicaConfig(name="slow", time_scale=0.05, slowdown=100.0, max_batch=32, tokens_per_chunk=4)
    ).start()
    try:
        upstreams = [Upstream("slow", slow.base_url), Upstream("fast", fast.base_url)]
        policy = HedgePolicy(hedge_after_s=0.5, budget=0.5, budget_burst=5)
        async with (
            ThresholdPoller(serve.url, interval_s=0.5) as poller,
            TelemetryExporter(serve.url, batch_size=20, flush_interval_s=0.5) as exporter,
            HedgingClient(upstreams, route=ROUTE, policy=policy, thresholds=poller, telemetry=exporter) as client,
        ):

            async def one(i: int) -> None:
                body = {
                    "model": MODEL,
                    "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 8,
                    "hedgerow_prompt_tokens": 500,
                }
                await client.chat(body, primary=i % 2)

            await asyncio.gather(*(one(i) for i in range(60)))
            assert await exporter.flush()
            assert exporter.sent == 60 and exporter.dropped == 0 and exporter.rejected == 0

            # The controller job (every second) publishes a measured threshold for the route.
            found = None
            for _ in range(100):
                await poller.refresh()
                found = poller.lookup(ROUTE, MODEL)
                if found is not None and found[1] is not None and found[0] != 0.5:
                    break
                await asyncio.sleep(0.2)
            assert found is not None, "no threshold published for the route"
            hedge_after_s, version, enabled = found
            assert enabled and version is not None and version >= 1
            assert 0.05 <= hedge_after_s <= 30.0

            # A call made now carries the polled threshold and its version.
            result = await client.chat(
                {
                    "model": MODEL,
                    "messages": [{"role": "user", "content": "x"}],
                    "max_tokens": 4,
                    "hedgerow_prompt_tokens": 100,
                },
                primary="fast",
            )
            assert result.record.threshold_version == version
            assert result.record.hedge_after_s == hedge_after_s
    finally:
        fast.stop()
        slow.stop()

    async with httpx.AsyncClient(base_url=serve.url) as http:
        history = (await http.get(f"/v1/routes/{ROUTE}/history", params={"model": MODEL, "limit": 5})).json()
        rows = history["history"]
        assert rows, "the controller wrote no history row"
        newest = rows[0]
        assert newest["route"] == ROUTE and newest["samples"] >= 20
        assert newest["censored"] >= 1  # hedged primaries were cancelled before their first token

    # A tick from the CLI against the same store while the server runs and holds the lease:
    # refused (exit 75, naming the holder), nothing written beside the scheduled ticks.
    out = subprocess.run(
        [sys.executable, "-m", "hedgerow.cli", "controller", "run-once", "--db", serve.db_url, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 75, out.stderr
    assert "the controller lease is held by" in out.stderr and out.stdout == ""
